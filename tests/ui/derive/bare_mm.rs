use mmobject::MMObject;

#[derive(MMObject)]
#[mm]
struct Texture {
    pixels: Vec<u8>,
}

fn main() {}
