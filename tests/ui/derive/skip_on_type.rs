use mmobject::MMObject;

#[derive(MMObject)]
#[mm(skip)]
struct Texture {
    pixels: Vec<u8>,
}

fn main() {}
