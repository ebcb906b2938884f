use mmobject::MMObject;

#[derive(MMObject)]
#[mm(bogus)]
struct Texture {
    pixels: Vec<u8>,
}

fn main() {}
