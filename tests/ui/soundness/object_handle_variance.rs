// A `Handle` is invariant in its type: a handle to a store of
// `Callback<for<'a> fn(&'a str)>` must not become a handle to
// `Callback<fn(&'static str)>`, or `get_mut` could store a function that
// only takes `'static` strings where any string is passed.
use mmobject::{Handle, MMObject};

#[derive(MMObject)]
struct Callback<F: Send + Sync + 'static> {
    #[mm(skip)]
    f: F,
}

fn widen(h: Handle<Callback<for<'a> fn(&'a str)>>) -> Handle<Callback<fn(&'static str)>> {
    h
}

fn main() {}
