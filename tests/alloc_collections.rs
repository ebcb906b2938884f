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

/// Shrinks `p` (a live block of `old`, filled with 7s) to `new` in an allocator that has no
/// room left, and checks the block it gets back keeps the bytes.
///
/// # Safety
///
/// `p` is a live block of `alloc` allocated for `old`; it is not used afterwards.
unsafe fn shrink_when_full<A: Allocator + Copy>(alloc: A, p: std::ptr::NonNull<u8>, old: Layout, new: Layout) {
    // SAFETY: forwarded: `p` is live for `old`, and `new` is no larger.
    let shrunk = unsafe { alloc.shrink(p, old, new) }.expect("a shrink never needs room").cast::<u8>();
    assert_eq!(shrunk.as_ptr() as usize % new.align(), 0);
    // SAFETY: `shrunk` is a live block of `new.size()` bytes holding the first bytes of `p`.
    unsafe {
        assert!(std::slice::from_raw_parts(shrunk.as_ptr(), new.size()).iter().all(|&b| b == 7));
        alloc.deallocate(shrunk, new);
    }
}

/// A shrink asked of a full allocator used to fail (the default `shrink` allocates the
/// smaller block first and copies), so `Vec::shrink_to_fit` on a full allocator aborted the
/// process through `handle_alloc_error`. A block keeps its bytes when it shrinks in place,
/// so a shrink now never fails for want of room; the stacks always shrink in place.
#[test]
fn shrink_succeeds_in_a_full_allocator() {
    let old = Layout::from_size_align(64, 8).unwrap();
    let new = Layout::from_size_align(16, 8).unwrap();
    fn filled<A: Allocator + Copy>(alloc: A, old: Layout) -> std::ptr::NonNull<u8> {
        let p = alloc.allocate(old).unwrap().cast::<u8>();
        // SAFETY: `p` is a fresh block of `old.size()` bytes.
        unsafe { p.as_ptr().write_bytes(7, old.size()) };
        p
    }
    fn fill_up<A: Allocator + Copy>(alloc: A) {
        while alloc.allocate(Layout::new::<u8>()).is_ok() {}
    }

    let stack = StackAllocator::with_capacity(128);
    let p = filled(&stack, old);
    // SAFETY: `p` is the stack's live (and last) block of `old`.
    unsafe { shrink_when_full(&stack, p, old, new) };
    assert_eq!(stack.allocated_bytes(), 64, "the block shrinks in place; the top stays");
    let p = filled(&stack, old);
    fill_up(&stack);
    // SAFETY: `p` is the stack's live block of `old` (not the last one any more).
    unsafe { shrink_when_full(&stack, p, old, new) };

    let frame = FrameAllocator::with_capacity(128);
    let p = filled(&frame, old);
    fill_up(&frame);
    // SAFETY: `p` is the frame's live block of `old`.
    unsafe { shrink_when_full(&frame, p, old, new) };

    let ends = DoubleEndedStack::with_capacity(128);
    let p = filled(&ends, old);
    // SAFETY: `p` is the lower stack's live (and last) block of `old`.
    unsafe { shrink_when_full(&ends, p, old, new) };
    assert_eq!(ends.allocated_bytes(mmobject::alloc::End::Lower), 64);
    let p = filled(&ends, old);
    fill_up(&ends);
    // SAFETY: `p` is the lower stack's live block of `old`.
    unsafe { shrink_when_full(&ends, p, old, new) };

    let buffers = DoubleBufferedAllocator::with_capacity(128);
    let p = filled(&buffers, old);
    fill_up(&buffers);
    // SAFETY: `p` is the current buffer's live block of `old`.
    unsafe { shrink_when_full(&buffers, p, old, new) };

    let pool = SizeClassPool::new(&[(16, 1), (64, 1)]);
    let p = filled(&pool, old);
    fill_up(&pool);
    // SAFETY: `p` is the pool's live block of `old`.
    unsafe { shrink_when_full(&pool, p, old, new) };
    assert_eq!(pool.stats().in_use, 16, "only the filler is left");

    let slots: Pool<[u64; 8]> = Pool::with_capacity(1);
    let p = filled(&slots, old);
    // SAFETY: `p` is the pool's only, live slot, allocated for `old`.
    unsafe { shrink_when_full(&slots, p, old, new) };
    assert!(slots.is_empty());

    let aligned = AlignedAlloc::new(StackAllocator::with_capacity(256));
    let p = filled(&aligned, old);
    fill_up(&aligned);
    // SAFETY: `p` is a live block of `old`.
    unsafe { shrink_when_full(&aligned, p, old, new) };
    assert_eq!(aligned.stats().live, aligned.stats().allocations as usize - 1);

    // The collection-level case: `shrink_to_fit` in a full stack.
    let stack = StackAllocator::with_capacity(256);
    let mut v: Vec<u64, _> = Vec::with_capacity_in(16, &stack);
    v.extend(0..4);
    fill_up(&stack);
    v.shrink_to_fit();
    assert_eq!((v.capacity(), v.iter().sum::<u64>()), (4, 6));
}

/// A block in a `Pool` grows within its slot: a `Vec` growing up to the slot size in a
/// pool with one slot used to need a second slot for each growth, and failed.
#[test]
fn pool_blocks_grow_within_their_slot() {
    let pool: Pool<[u64; 8]> = Pool::with_capacity(1);
    let mut v: Vec<u8, _> = Vec::new_in(&pool);
    for i in 0..64u8 {
        v.try_reserve(1).expect("room in the slot");
        v.push(i);
    }
    assert!(v.iter().enumerate().all(|(i, &b)| b == i as u8));
    assert!(v.try_reserve(1).is_err(), "past the slot");
    assert_eq!(pool.stats().live, 1);
    drop(v);
    assert!(pool.is_empty());
}

/// `grow_zeroed` and `grow` across size classes and to a larger alignment: the bytes are
/// kept, the new ones are zero, the old block is freed once (the counters say exactly one
/// block is live after each step), and a growth that finds no room fails with the old
/// block intact and one failure counted.
#[test]
fn grow_across_classes_keeps_bytes_and_counts() {
    let pool = SizeClassPool::new(&[(16, 4), (128, 2)]);
    let a = &pool;
    let small = Layout::from_size_align(10, 8).unwrap();
    let page = Layout::from_size_align(100, 64).unwrap();
    let p = a.allocate(small).unwrap().cast::<u8>();
    // SAFETY: `p` is live for `small`, and then `g` for `page`; each layout is at least as
    // large as the last, and each block is used only until it is grown or freed.
    unsafe {
        p.as_ptr().write_bytes(3, 10);
        let g = a.grow_zeroed(p, small, page).unwrap().cast::<u8>();
        assert_eq!(g.as_ptr() as usize % 64, 0);
        assert!((0..100).all(|i| *g.as_ptr().add(i) == if i < 10 { 3 } else { 0 }));
        let s = pool.stats();
        assert_eq!((s.in_use, s.live, s.allocations, s.peak, s.failures), (128, 1, 2, 144, 0));
        assert!(a.grow(g, page, Layout::from_size_align(1000, 8).unwrap()).is_err());
        assert!((0..100).all(|i| *g.as_ptr().add(i) == if i < 10 { 3 } else { 0 }), "the old block is intact");
        let s = pool.stats();
        assert_eq!((s.in_use, s.live, s.allocations, s.failures), (128, 1, 2, 1));
        a.deallocate(g, page);
    }
    assert_eq!((pool.stats().in_use, pool.stats().live), (0, 0));

    let small_objects = SmallObjectAllocator::new(SmallObjectConfig { slots: [4; 7] });
    let a = &small_objects;
    let p = a.allocate(small).unwrap().cast::<u8>();
    // SAFETY: as above; the last growth goes past every class, to a system block.
    unsafe {
        p.as_ptr().write_bytes(3, 10);
        let g = a.grow_zeroed(p, small, page).unwrap().cast::<u8>();
        assert!((0..100).all(|i| *g.as_ptr().add(i) == if i < 10 { 3 } else { 0 }));
        let big = Layout::from_size_align(1000, 8).unwrap();
        let h = a.grow(g, page, big).unwrap().cast::<u8>();
        assert!((0..100).all(|i| *h.as_ptr().add(i) == if i < 10 { 3 } else { 0 }));
        let s = small_objects.stats();
        assert_eq!((s.live, s.allocations, s.fallbacks), (1, 3, 1));
        a.deallocate(h, big);
    }
    assert_eq!(small_objects.stats().live, 0);
}

/// Layouts no allocator can serve are errors, never overflow in the rounding: sizes near
/// `isize::MAX`, alignments above 4096 (except for `SegmentAlloc`, which takes any), and a
/// growth to such a size.
#[test]
fn huge_and_over_aligned_layouts_are_errors() {
    fn refuse<A: Allocator + Copy>(alloc: A, any_alignment: bool) {
        let max = isize::MAX as usize;
        for layout in [
            Layout::from_size_align(max - 4095, 4096).unwrap(),
            Layout::from_size_align(max, 1).unwrap(),
            Layout::from_size_align(max - 7, 8).unwrap(),
        ] {
            assert!(alloc.allocate(layout).is_err(), "{layout:?}");
        }
        for layout in [Layout::from_size_align(0, 8192).unwrap(), Layout::from_size_align(8, 8192).unwrap()] {
            match alloc.allocate(layout) {
                Err(_) => assert!(!any_alignment, "{layout:?}"),
                Ok(block) => {
                    assert!(any_alignment && block.cast::<u8>().as_ptr() as usize % 8192 == 0);
                    // SAFETY: a live block of `layout`, freed once.
                    unsafe { alloc.deallocate(block.cast(), layout) };
                }
            }
        }
        let small = Layout::new::<u64>();
        let p = alloc.allocate(small).unwrap().cast::<u8>();
        let huge = Layout::from_size_align(isize::MAX as usize - 4095, 4096).unwrap();
        // SAFETY: `p` is live for `small`; the failed growths leave it live, and it is freed once.
        unsafe {
            assert!(alloc.grow(p, small, huge).is_err());
            assert!(alloc.grow_zeroed(p, small, huge).is_err());
            alloc.deallocate(p, small);
        }
    }
    refuse(&StackAllocator::with_capacity(128), false);
    refuse(&DoubleEndedStack::with_capacity(128), false);
    refuse(&FrameAllocator::with_capacity(128), false);
    refuse(&DoubleBufferedAllocator::with_capacity(128), false);
    refuse(&SizeClassPool::new(&[(16, 4)]), false);
    refuse(&Pool::<u64>::with_capacity(4), false);
    refuse(&AlignedAlloc::new(SystemRaw), false);
    // These two pass large requests on to the system, which Miri cannot ask for
    // `isize::MAX` bytes (it stops with "resource exhaustion" instead of returning null).
    if !cfg!(miri) {
        refuse(&SmallObjectAllocator::new(SmallObjectConfig { slots: [4; 7] }), false);
        refuse(&SegmentAlloc::new(), true);
    }
}

/// A `SizeClassPool` block that still suits the new size stays where it is: a growth
/// within the block, or a shrink that the same class would serve, used to take a second
/// block of the class and copy (and failed when the class was full).
#[test]
fn size_class_pool_resizes_within_a_block_in_place() {
    let pool = SizeClassPool::new(&[(16, 1), (128, 1)]);
    let a = &pool;
    let (l100, l120, l70) = (
        Layout::from_size_align(100, 8).unwrap(),
        Layout::from_size_align(120, 8).unwrap(),
        Layout::from_size_align(70, 8).unwrap(),
    );
    let p = a.allocate(l100).unwrap().cast::<u8>();
    // SAFETY: `p` is live for `l100`, then for each layout it is resized to, and freed once.
    unsafe {
        p.as_ptr().write_bytes(9, 100);
        let g = a.grow(p, l100, l120).unwrap().cast::<u8>();
        assert_eq!(g, p, "grown within its 128-byte block");
        let s = a.shrink(g, l120, l70).unwrap().cast::<u8>();
        assert_eq!(s, p, "70 bytes are served by the same class");
        assert!((0..70).all(|i| *s.as_ptr().add(i) == 9));
        let st = pool.stats();
        assert_eq!((st.allocations, st.live, st.failures, st.peak), (1, 1, 0, 128));
        // A shrink to a smaller class moves the block and frees the old one.
        let tiny = Layout::from_size_align(8, 8).unwrap();
        let t = a.shrink(s, l70, tiny).unwrap().cast::<u8>();
        assert_ne!(t, p);
        assert!((0..8).all(|i| *t.as_ptr().add(i) == 9));
        assert_eq!((pool.stats().in_use, pool.stats().live), (16, 1));
        a.deallocate(t, tiny);
    }
    assert_eq!(pool.stats().live, 0);
}

/// A shrink in a stack keeps the block where it is and leaves the top alone: a marker taken
/// above a shrinking `Vec` stays valid. (Moving the top down to the shrunk block's end would
/// put such a marker above the top, and `free_to_marker` would refuse it.)
#[test]
fn a_shrink_in_a_stack_keeps_markers_valid() {
    let mut stack = StackAllocator::with_capacity(256);
    let marker = {
        let mut v: Vec<u64, _> = Vec::with_capacity_in(8, &stack);
        v.push(1);
        let above = stack.marker();
        v.shrink_to_fit();
        assert_eq!(v[0], 1);
        above
    };
    stack.free_to_marker(marker);
    assert_eq!(stack.allocated_bytes(), 64);

    let mut ends = DoubleEndedStack::with_capacity(256);
    let marker = {
        let mut v: Vec<u64, _> = Vec::with_capacity_in(8, &ends);
        v.push(1);
        let above = ends.marker(mmobject::alloc::End::Lower);
        v.shrink_to_fit();
        above
    };
    ends.free_to_marker(marker);
    assert_eq!(ends.allocated_bytes(mmobject::alloc::End::Lower), 64);
}

/// A zero-size value aligned above 4096 takes no block: `Box` and `Vec` make up a dangling
/// pointer at its alignment, and still give it to `deallocate`. That free panicked as a
/// foreign pointer in every allocator (only addresses up to 4096 were known as dangling);
/// a zero-size free that no allocator knows is now ignored when it is exactly such a
/// pointer.
#[test]
fn zero_size_values_aligned_above_4096_drop_quietly() {
    #[repr(align(8192))]
    struct Big;
    fn drop_big<A: Allocator + Copy>(alloc: A) {
        drop(Box::new_in(Big, alloc));
        let mut v = Vec::new_in(alloc);
        v.push(Big);
        v.push(Big);
        let boxed: Box<[Big], A> = v.into_boxed_slice();
        assert_eq!(boxed.len(), 2);
    }
    drop_big(&StackAllocator::with_capacity(64));
    drop_big(&DoubleEndedStack::with_capacity(64));
    drop_big(&FrameAllocator::with_capacity(64));
    drop_big(&DoubleBufferedAllocator::with_capacity(64));
    drop_big(&SizeClassPool::new(&[(16, 1)]));
    drop_big(&SmallObjectAllocator::new(SmallObjectConfig { slots: [1; 7] }));
    drop_big(&Pool::<u64>::with_capacity(1));
    drop_big(&AlignedAlloc::new(SystemRaw));
    let segments = SegmentAlloc::new();
    drop_big(&segments);
    // A real zero-size block (`SegmentAlloc` serves any alignment) is still freed.
    let layout = Layout::from_size_align(0, 8192).unwrap();
    let block = (&segments).allocate(layout).unwrap();
    // SAFETY: a live block of `layout`, freed once.
    unsafe { (&segments).deallocate(block.cast(), layout) };
    assert_eq!(segments.stats().live, 0);
}
