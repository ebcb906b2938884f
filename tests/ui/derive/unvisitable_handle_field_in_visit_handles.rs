// The same rule holds for `#[derive(VisitHandles)]` on a plain struct.
use mmobject::{Handle, MMObject, VisitHandles};

struct ForeignList<T>(Vec<T>);

#[derive(MMObject)]
struct Mesh {
    vertices: Vec<[f32; 3]>,
}

#[derive(VisitHandles)]
struct Slots(ForeignList<Handle<Mesh>>);

fn main() {}
