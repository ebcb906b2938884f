use mmobject::alloc::StackAllocator;

fn main() {
    let mut stack = StackAllocator::with_capacity(1024);
    let mark = stack.marker();
    let mut v = allocator_api2::vec::Vec::new_in(&stack);
    v.push(1u8);
    stack.free_to_marker(mark); // the Vec still borrows the stack
    v.push(2);
}
