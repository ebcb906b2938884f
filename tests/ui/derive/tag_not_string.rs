use mmobject::MMObject;

#[derive(MMObject)]
#[mm(tag = Textures)]
struct Texture {
    pixels: Vec<u8>,
}

fn main() {}
