// A field whose type names `Handle` but cannot be visited is an error at the
// field, never a silent blind spot in leak forensics.
use mmobject::{Handle, MMObject};

/// A container from another crate that does not implement `VisitHandles`.
struct ForeignMap<K, V>(Vec<(K, V)>);

#[derive(MMObject)]
struct Texture {
    pixels: Vec<u8>,
}

#[derive(MMObject)]
struct Cache {
    hits: u64,
    by_name: ForeignMap<String, Handle<Texture>>,
}

fn main() {}
