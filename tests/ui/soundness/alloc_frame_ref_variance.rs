//! Issue 8, item 4: a `FrameRef<T>` gives mutable access (`try_get_mut`), so it must be
//! invariant in `T`. Were it covariant, a copy coerced to `FrameRef<&'short str>` could
//! write a short-lived reference that the original then reads back as `&'static str`.
use mmobject::alloc::{DoubleBufferedAllocator, FrameRef};

fn shorten<'short>(r: FrameRef<&'static str>) -> FrameRef<&'short str> {
    r
}

fn main() {
    let mut buffers = DoubleBufferedAllocator::with_capacity(64);
    let long: FrameRef<&'static str> = buffers.alloc("static");
    {
        let local = String::from("gone soon");
        *buffers.try_get_mut(shorten(long)).unwrap() = local.as_str();
    }
    println!("{}", buffers.get(long));
}
