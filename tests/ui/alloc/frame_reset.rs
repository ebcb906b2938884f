use mmobject::alloc::FrameAllocator;

fn main() {
    let mut frame = FrameAllocator::with_capacity(64);
    let name = frame.alloc_str("player");
    frame.reset();
    println!("{name}"); // frame data cannot outlive the reset
}
