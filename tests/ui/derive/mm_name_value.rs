use mmobject::MMObject;

#[derive(MMObject)]
struct Texture {
    #[mm = "skip"]
    pixels: Vec<u8>,
}

fn main() {}
