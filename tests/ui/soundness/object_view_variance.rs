// An `ObjectView` (and its `Iter`) is invariant in its type, like the store it reads.
use mmobject::object::Iter;
use mmobject::{MMObject, ObjectView};

#[derive(MMObject)]
struct Callback<F: Send + Sync + 'static> {
    #[mm(skip)]
    f: F,
}

fn widen_view<'m>(v: ObjectView<'m, Callback<for<'a> fn(&'a str)>>) -> ObjectView<'m, Callback<fn(&'static str)>> {
    v
}

fn widen_iter<'m>(i: Iter<'m, Callback<for<'a> fn(&'a str)>>) -> Iter<'m, Callback<fn(&'static str)>> {
    i
}

fn main() {}
