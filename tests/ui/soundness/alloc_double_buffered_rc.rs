//! Issue 8, item 3: a value behind a `FrameRef` can be reached again after the allocator
//! moves to another thread, so it must be `Send`. An `Rc` is refused.
use std::rc::Rc;

use mmobject::alloc::DoubleBufferedAllocator;

fn main() {
    let buffers = DoubleBufferedAllocator::with_capacity(64);
    let shared = Rc::new(1u32);
    let r = buffers.alloc(Rc::clone(&shared));
    std::thread::spawn(move || {
        let _racing = Rc::clone(buffers.get(r));
    });
}
