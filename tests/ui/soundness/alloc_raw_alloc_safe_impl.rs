//! Issue 8, item 2: `AlignedAlloc` writes its header through whatever `RawAlloc::alloc`
//! returns, so implementing `RawAlloc` is a promise the compiler cannot check: the trait is
//! `unsafe`, and a safe `impl` (here one that returns too small a block) is refused.
use std::ptr::NonNull;

use mmobject::alloc::RawAlloc;

struct Liar;

impl RawAlloc for Liar {
    fn alloc(&self, _size: usize) -> Option<NonNull<u8>> {
        Some(NonNull::from(Box::leak(Box::new(0u8))))
    }

    unsafe fn free(&self, _ptr: NonNull<u8>, _size: usize) {}
}

fn main() {}
