// `visit_with` needs a function path, goes on fields only, and not with `skip`.
use mmobject::{MMObject, ObjectKey, VisitHandles};

fn visit(_: &u32, _: &mut dyn FnMut(ObjectKey)) {}

#[derive(MMObject)]
#[mm(visit_with = visit)]
struct A {
    #[mm(skip, visit_with = visit)]
    a: u32,
    #[mm(visit_with = 3)]
    b: u32,
}

#[derive(VisitHandles)]
#[mm(tag = "Caches")]
struct B {
    b: u32,
}

fn main() {}
