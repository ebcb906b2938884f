use mmobject::alloc::DoubleBufferedAllocator;

fn main() {
    let mut buffers = DoubleBufferedAllocator::with_capacity(64);
    let direct = buffers.alloc_mut(5u32);
    buffers.swap();
    buffers.swap();
    *direct += 1; // a plain reference ends at the swap; use FrameRef to keep data a frame
}
