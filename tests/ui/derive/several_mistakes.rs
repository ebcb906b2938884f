// Every mistake is reported, each once, and nothing else.
use mmobject::MMObject;

#[derive(MMObject)]
#[mm(tag = "")]
enum Shape {
    Mesh(#[mm(skip, bogus)] Vec<u8>),
    #[mm(tag = "Points")]
    Point,
}

fn main() {}
