use mmobject::MMObject;

#[derive(MMObject)]
struct Texture {
    #[mm(skip, ignore)]
    pixels: Vec<u8>,
}

fn main() {}
