//! The stacks and frames keep their top in a `Cell`: they are `Send` but not `Sync`, so two
//! threads cannot bump the same stack.
use mmobject::alloc::StackAllocator;

fn main() {
    let stack = StackAllocator::with_capacity(64);
    std::thread::scope(|s| {
        s.spawn(|| stack.alloc(1u8));
        s.spawn(|| stack.alloc(2u8));
    });
}
