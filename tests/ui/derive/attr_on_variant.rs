use mmobject::MMObject;

#[derive(MMObject)]
enum Shape {
    #[mm(skip)]
    Mesh(Vec<u8>),
    Point,
}

fn main() {}
