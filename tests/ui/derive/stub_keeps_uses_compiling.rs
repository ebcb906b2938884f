// A bad attribute gives one error, not a second one wherever the type is
// used as an `MMObject`: the derive still emits a stub impl.
use mmobject::MMObject;

#[derive(MMObject)]
#[mm(tag = 7)]
struct Texture {
    pixels: Vec<u8>,
}

fn needs_object<T: MMObject>(object: &T) -> usize {
    object.size()
}

fn main() {
    let t = Texture { pixels: Vec::new() };
    assert_eq!(Texture::TYPE_NAME, "Texture");
    needs_object(&t);
}
