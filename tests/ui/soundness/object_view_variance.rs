// Views and iterators are invariant in their type, like the store they read
// (and `ObjectViewMut` and `IterMut` write).
use mmobject::object::Iter;
use mmobject::{IterMut, MMObject, ObjectView, ObjectViewMut};

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

fn widen_view_mut<'m>(
    v: ObjectViewMut<'m, Callback<for<'a> fn(&'a str)>>,
) -> ObjectViewMut<'m, Callback<fn(&'static str)>> {
    v
}

fn widen_iter_mut<'m>(i: IterMut<'m, Callback<for<'a> fn(&'a str)>>) -> IterMut<'m, Callback<fn(&'static str)>> {
    i
}

fn main() {}
