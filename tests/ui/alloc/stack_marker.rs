use mmobject::alloc::StackAllocator;

fn main() {
    let mut stack = StackAllocator::with_capacity(64);
    let level = stack.marker();
    let x = stack.alloc(1u32);
    stack.free_to_marker(level);
    *x += 1; // the memory under `x` was released
}
