use mmobject::MMObject;

#[derive(MMObject)]
#[mm(tag = "Textures")]
#[mm(tag = "Images")]
struct Texture {
    pixels: Vec<u8>,
}

fn main() {}
