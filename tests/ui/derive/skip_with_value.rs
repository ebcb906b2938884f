use mmobject::MMObject;

#[derive(MMObject)]
struct Texture {
    #[mm(skip = true)]
    pixels: Vec<u8>,
}

fn main() {}
