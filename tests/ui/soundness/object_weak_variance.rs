// A `WeakHandle` is invariant in its type: coerced to a supertype it would
// name a slot of another type's store, and views trust its location.
use mmobject::{MMObject, WeakHandle};

#[derive(MMObject)]
struct Callback<F: Send + Sync + 'static> {
    #[mm(skip)]
    f: F,
}

fn widen(w: WeakHandle<Callback<for<'a> fn(&'a str)>>) -> WeakHandle<Callback<fn(&'static str)>> {
    w
}

fn main() {}
