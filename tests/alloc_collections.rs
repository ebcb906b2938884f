//! Every allocator serves `allocator_api2::boxed::Box`, `allocator_api2::vec::Vec` and
//! `hashbrown::HashMap`, as a user would write it. These run under Miri's default Stacked
//! Borrows: a boxed slice from `Vec::into_boxed_slice` hands back a pointer whose provenance
//! covers only its contents, so an allocator that touches anything else through the pointer
//! it gets back (a header before the block, the rest of a slot) is caught here.

use std::alloc::Layout;

use allocator_api2::alloc::Allocator;
use allocator_api2::boxed::Box;
use allocator_api2::vec::Vec;
use hashbrown::HashMap;
use mmobject::alloc::{
    AlignedAlloc, DoubleBufferedAllocator, DoubleEndedStack, FrameAllocator, Pool, SegmentAlloc, SizeClassPool,
    SmallObjectAllocator, SmallObjectConfig, StackAllocator, SystemRaw,
};

fn exercise<A: Allocator + Copy>(alloc: A) {
    let n: usize = if cfg!(miri) { 20 } else { 200 };
    for i in 0..3u8 {
        // `Box::leak` then `Box::from_raw_in`, the round trip `leak`'s docs suggest.
        let byte = Box::new_in(i, alloc);
        // SAFETY: the reference came from `Box::leak` of a box in the same allocator.
        let byte = unsafe { Box::from_raw_in(Box::leak(byte), alloc) };
        let words = Box::new_in([u64::from(i); 3], alloc);
        let mut v = Vec::with_capacity_in(5, alloc);
        v.extend([u16::from(i); 5]);
        // The pointer this box hands back to `deallocate` was retagged by `into_boxed_slice`
        // to the slice's 10 bytes: before the fixes, Miri reported `AlignedAlloc` reading its
        // header and `SmallObjectAllocator` refilling its slot through it.
        let slice: Box<[u16], A> = v.into_boxed_slice();
        assert_eq!((*byte, words[2], slice[4]), (i, u64::from(i), u16::from(i)));
    }
    let mut v = Vec::new_in(alloc);
    for i in 0..n {
        v.push(i as u64);
    }
    v.shrink_to_fit();
    assert_eq!(v.iter().sum::<u64>(), (n * (n - 1) / 2) as u64);
    let mut m = HashMap::new_in(alloc);
    for i in 0..n / 4 {
        m.insert(i, format!("entity {i}"));
    }
    assert_eq!(m[&3], "entity 3");
    m.retain(|k, _| k % 2 == 0);
    assert_eq!(m.len(), (n / 4).div_ceil(2));
    // Zero-size values and empty slices take no block, and `Box` frees them all the same
    // (that free panicked in four allocators as a foreign pointer).
    drop(Box::new_in((), alloc));
    drop(Vec::<u32, A>::new_in(alloc).into_boxed_slice());
    // A `Vec` shrunk to nothing gives its block back (`Vec` never frees what a shrink to
    // zero returns, so a real block there leaked, and a full pool then aborted).
    for _ in 0..100 {
        let mut emptied = Vec::with_capacity_in(4, alloc);
        emptied.push(1u8);
        emptied.clear();
        emptied.shrink_to_fit();
        assert_eq!(emptied.capacity(), 0);
    }
}

#[test]
fn size_class_pool() {
    let pool = SizeClassPool::new(&[(8, 16), (64, 64), (256, 32), (1024, 16), (4096, 8)]);
    exercise(&pool);
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn small_object_allocator() {
    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [64; 7] });
    exercise(&small);
    assert_eq!(small.stats().live, 0);
}

#[test]
fn stacks_and_frames() {
    exercise(&StackAllocator::with_capacity(64 * 1024));
    exercise(&DoubleEndedStack::with_capacity(64 * 1024));
    exercise(&FrameAllocator::with_capacity(64 * 1024));
    exercise(&DoubleBufferedAllocator::with_capacity(64 * 1024));
}

#[test]
fn segments() {
    let segments = SegmentAlloc::new();
    exercise(&segments);
    assert_eq!(segments.stats().live, 0);
}

#[test]
fn aligned_and_pool() {
    let aligned = AlignedAlloc::new(SystemRaw);
    exercise(&aligned);
    assert_eq!(aligned.stats().live, 0);
    #[repr(align(64))]
    struct Page(#[allow(dead_code)] [u8; 4096]);
    let pool: Pool<Page> = Pool::with_capacity(8);
    exercise(&pool);
    assert!(pool.is_empty());
    let mut too_big: Vec<u8, _> = Vec::new_in(&pool);
    assert!(too_big.try_reserve(4097).is_err(), "a block larger than a slot is refused");
    assert!(too_big.try_reserve(4096).is_ok());
}

/// Issue 10, A5: a `Vec` growing to 4 KB in a stack or frame allocator grows in place while
/// it is the last block, so the allocator holds at most 1.1× its final size (it held 2×
/// when every growth copied to a new block).
#[test]
fn vec_grows_in_place_while_it_is_the_last_block() {
    fn grow_to_4k<A: Allocator + Copy>(alloc: A, used: impl Fn() -> usize) {
        let before = used();
        let mut v = Vec::new_in(alloc);
        for i in 0..4096u32 {
            v.push(i as u8);
        }
        assert_eq!(v.capacity(), 4096);
        let grown = used() - before;
        assert!(grown * 10 <= 4096 * 11, "a 4 KB Vec took {grown} bytes");
        // Another block on top: the next growth must copy, and keep the contents.
        let mut other = Vec::new_in(alloc);
        other.push(1u8);
        v.push(0);
        assert!(v.iter().take(4096).enumerate().all(|(i, &b)| b == i as u8));
    }
    let stack = StackAllocator::with_capacity(16 * 1024);
    stack.alloc(1u8); // an odd top below the Vec
    grow_to_4k(&stack, || stack.allocated_bytes());
    let frame = FrameAllocator::with_capacity(16 * 1024);
    grow_to_4k(&frame, || frame.allocated_bytes());
    let buffers = DoubleBufferedAllocator::with_capacity(16 * 1024);
    grow_to_4k(&buffers, || buffers.allocated_bytes());
}

/// Growing the last block to a larger alignment keeps it in place only when its address
/// already has that alignment; otherwise (and above 4096) the block moves or the growth fails.
#[test]
fn grow_to_a_larger_alignment() {
    let stack = StackAllocator::with_capacity(3 * 4096);
    let a = &stack;
    let small = Layout::from_size_align(8, 8).unwrap();
    let p = a.allocate(small).unwrap().cast::<u8>();
    // SAFETY: `p` is a live block of 8 bytes; each layout is at least as large as the last.
    unsafe {
        p.as_ptr().write(42);
        let page = a.grow(p, small, Layout::from_size_align(64, 4096).unwrap()).unwrap().cast::<u8>();
        assert_eq!((page.as_ptr() as usize % 4096, page.as_ptr().read()), (0, 42));
        let huge = Layout::from_size_align(128, 8192).unwrap();
        assert!(a.grow(page, Layout::from_size_align(64, 4096).unwrap(), huge).is_err());
    }
}
