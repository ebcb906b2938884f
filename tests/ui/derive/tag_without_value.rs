use mmobject::MMObject;

#[derive(MMObject)]
#[mm(tag)]
struct Texture {
    pixels: Vec<u8>,
}

fn main() {}
