use mmobject::MMObject;

#[derive(MMObject)]
struct Texture {
    #[mm(tag = "Textures")]
    pixels: Vec<u8>,
}

fn main() {}
