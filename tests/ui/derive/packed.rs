use mmobject::MMObject;

#[derive(MMObject)]
#[repr(C, packed)]
struct Vertex {
    tag: u8,
    position: [f32; 3],
}

fn main() {}
