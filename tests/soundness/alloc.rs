//! Adversarial cases for `mmobject::alloc`.
//!
//! Each case is safe code (or `unsafe` code that keeps every documented contract) trying to
//! reach undefined behaviour. It must end in an `Err`, a clear panic, a leak, or a clean
//! Miri run under Stacked Borrows. The cases the type system refuses (variance, `Send`,
//! `unsafe trait`) are compile-fail tests in `tests/ui/soundness/alloc_*.rs`. Counter
//! wrap-around needs a process of its own (the hook moves a global counter): see
//! `tests/alloc_ids.rs`.

use std::alloc::Layout;
use std::cell::Cell;
use std::mem;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use allocator_api2::alloc::Allocator;
use allocator_api2::boxed::Box as ApiBox;
use allocator_api2::vec::Vec as ApiVec;
use mmobject::alloc::{
    AlignedAlloc, DoubleBufferedAllocator, DoubleEndedStack, End, FrameAllocator, FrameRef, Pool, PoolBox, RawAlloc,
    SegmentAlloc, SizeClassPool, SmallObjectAllocator, SmallObjectConfig, StackAllocator, SystemRaw,
};
use mmobject::Error;

// ---- mem::forget of every guard and box -------------------------------------------------

/// Counts its drops in a static, so the count survives the pool.
struct CountsDrops(&'static AtomicUsize, #[allow(dead_code)] [u8; 24]);

impl Drop for CountsDrops {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Issue 8, item 1: a slot handed out through the `Allocator` impl holds raw bytes, not a
/// `T`. Leaking its owner with `mem::forget` must not make the pool's drop run `T`'s
/// destructor on those bytes (before the fix it did: here that counted a drop; with a `T`
/// holding a pointer, Miri reported "constructing invalid value").
#[test]
fn pool_forgotten_raw_allocations_are_not_dropped_as_values() {
    static DROPS: AtomicUsize = AtomicUsize::new(0);
    let pool: Pool<CountsDrops> = Pool::with_capacity(4);
    let raw_slot = ApiBox::into_raw(ApiBox::new_in([0xA5u8; 16], &pool));
    let mut v = ApiVec::with_capacity_in(8, &pool);
    v.extend_from_slice(&[7u16; 8]);
    mem::forget(v);
    let leaked = PoolBox::into_raw(pool.alloc(CountsDrops(&DROPS, [1; 24])));
    mem::forget(pool.alloc(CountsDrops(&DROPS, [2; 24])));
    assert_eq!(pool.len(), 4);
    // A raw slot is not a value: `try_free` refuses it rather than reading a `T` there.
    // SAFETY: the bad free is caught before the slot is read.
    unsafe {
        let raw_slot = NonNull::new(raw_slot).unwrap().cast::<CountsDrops>();
        assert!(matches!(pool.try_free(raw_slot), Err(Error::ForeignPointer { .. })));
    }
    assert_eq!(pool.len(), 4);
    let _ = leaked; // leaked on purpose: the pool drops it
    drop(pool);
    assert_eq!(DROPS.load(Ordering::Relaxed), 2, "exactly the two leaked values are dropped");
}

/// A forgotten `PoolBox` leaves its value to the pool, which drops it once.
#[test]
fn pool_forgotten_box_is_dropped_once_by_the_pool() {
    let counter = Rc::new(());
    let pool = Pool::with_capacity(2);
    mem::forget(pool.alloc(Rc::clone(&counter)));
    assert_eq!(Rc::strong_count(&counter), 2);
    drop(pool);
    assert_eq!(Rc::strong_count(&counter), 1);
}

/// `FrameRef` and `Marker` are `Copy` tokens, not guards: there is nothing to forget (the
/// compiler warns that `mem::forget` of a `Copy` value does nothing), and a stale copy is
/// still caught.
#[test]
fn forgotten_tokens_stay_checked() {
    let mut d = DoubleBufferedAllocator::with_capacity(64);
    let r = d.alloc(5u32);
    d.swap();
    d.swap();
    assert!(matches!(d.try_get(r), Err(Error::StaleFrameRef { .. })));

    let mut s = StackAllocator::with_capacity(64);
    s.alloc(1u64);
    let m = s.marker();
    s.reset();
    assert!(matches!(s.try_free_to_marker(m), Err(Error::InvalidMarker { .. })));
}

/// Forgets a `Box` and a `Vec` in `alloc`, then keeps allocating.
fn forget_collections<A: Allocator + Copy>(alloc: A) {
    mem::forget(ApiBox::new_in(0x1234_5678u64, alloc));
    let mut v = ApiVec::new_in(alloc);
    v.extend(0..6u32);
    mem::forget(v);
    let b = ApiBox::new_in([3u8; 5], alloc);
    assert_eq!(*b, [3; 5]);
}

/// Leaked collections in every allocator, then the allocator is dropped: leaks at most,
/// never a read or a drop of the leaked bytes as something else. (The raw allocator under
/// `AlignedAlloc` is a stack, so Miri's leak check sees nothing lost.)
#[test]
fn forgotten_collections_in_every_allocator() {
    forget_collections(&SizeClassPool::new(&[(8, 8), (64, 8), (256, 4)]));
    forget_collections(&SmallObjectAllocator::new(SmallObjectConfig { slots: [8; 7] }));
    forget_collections(&StackAllocator::with_capacity(1024));
    forget_collections(&DoubleEndedStack::with_capacity(1024));
    forget_collections(&FrameAllocator::with_capacity(1024));
    forget_collections(&DoubleBufferedAllocator::with_capacity(1024));
    forget_collections(&AlignedAlloc::new(StackAllocator::with_capacity(1024)));
    forget_collections(&Pool::<[u64; 8]>::with_capacity(8));
    forget_collections(&Pool::<CountsDrops>::with_capacity(8));
}

// ---- Stacked Borrows: frees through the allocator's own pointer --------------------------

/// A boxed slice from `Vec::into_boxed_slice`: the pointer it hands back to `deallocate`
/// was retagged to the slice's bytes only (under Stacked Borrows, anything before or after
/// them is out of its reach).
fn narrowed<T, A: Allocator>(value: T, alloc: A) -> ApiBox<[T], A> {
    let mut v = ApiVec::with_capacity_in(1, alloc);
    v.push(value);
    v.into_boxed_slice()
}

/// Issue 8, item 7: `AlignedAlloc` used to read its header through the pointer the caller
/// handed back. A boxed slice narrows that pointer's provenance to its contents, so under
/// Stacked Borrows the read before it was undefined behaviour (`cargo +nightly miri test
/// --test soundness`).
#[test]
fn aligned_alloc_frees_boxes_under_stacked_borrows() {
    let aligned = AlignedAlloc::new(SystemRaw);
    for _ in 0..3 {
        let one = narrowed(7u8, &aligned);
        let page = narrowed([1u8; 64], &aligned);
        assert_eq!((one[0], page[0][63]), (7, 1));
    }
    let over_stack = AlignedAlloc::new(StackAllocator::with_capacity(512));
    let b = narrowed(9u16, &over_stack);
    assert_eq!(b[0], 9);
    assert_eq!(aligned.stats().live, 0);
}

/// Issue 8, item 8: `SmallObjectAllocator` refilled a freed slot (8 bytes for a 1-byte box)
/// through the caller's pointer in debug builds: undefined behaviour under Stacked Borrows.
#[test]
fn small_object_frees_one_byte_boxes_under_stacked_borrows() {
    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [4, 4, 0, 0, 0, 0, 1] });
    for i in 0..6u8 {
        let b = narrowed(i, &small);
        let pair = narrowed([i; 3], &small);
        assert_eq!((b[0], pair[0][2]), (i, i));
    }
    assert_eq!(small.stats().live, 0);
}

/// `SmallObjectAllocator::try_free` asks only that a live block is not used after the free,
/// and the module promises that a pointer handed back is used only as an address. Its
/// system-fallback blocks were nonetheless given back to the system through the caller's
/// pointer: a pointer rebuilt from the address (or narrowed to part of the block) has no
/// provenance over the block, so the `dealloc` was undefined behaviour under Miri. The
/// fallback table now keeps the pointer the system returned, and frees (also on drop)
/// through it.
#[test]
fn small_object_fallback_frees_through_its_own_pointer() {
    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [0; 7] });
    let layout = Layout::from_size_align(24, 8).unwrap();
    for _ in 0..3 {
        let block = small.alloc(layout);
        // SAFETY: `block` is a live fallback block of 24 bytes, ours alone.
        unsafe { block.as_ptr().write_bytes(0x5A, layout.size()) };
        let addr_only = NonNull::new(std::ptr::without_provenance_mut::<u8>(block.as_ptr() as usize)).unwrap();
        // SAFETY: `block` is live and unused from here on; the pointer names it by address.
        unsafe { small.try_free(addr_only) }.expect("a live fallback block, named by its address");
    }
    // A boxed array freed through a pointer narrowed to its first byte.
    let boxed = ApiBox::new_in([7u8; 4], &small);
    let raw = ApiBox::into_raw(boxed);
    // SAFETY: `raw` is the live block of the box; the narrowed pointer names it by address
    // and nothing uses the block afterwards.
    unsafe {
        let first = NonNull::from(&mut (*raw)[0]);
        small.free(first);
    }
    // A block still live when the allocator goes: freed by the drop, through the table.
    let _kept = small.alloc(layout);
    assert_eq!(small.stats().live, 1);
    drop(small);
}

/// `SegmentAlloc::try_free` is `unsafe`, but its contract asks only that a live block is not
/// used after the free: the pointer may be rebuilt from the address alone. The ledger used to
/// keep that pointer for reuse, so the next allocation of the same layout, and the final
/// `release_cached`, went through a pointer with no provenance (undefined behaviour under
/// Miri). It now keeps the pointer it got from the system.
#[test]
fn segment_alloc_frees_and_reuses_through_its_own_pointer() {
    let segments = SegmentAlloc::new();
    let layout = Layout::from_size_align(256, 64).unwrap();
    let block = segments.alloc(layout);
    let addr_only = NonNull::new(std::ptr::without_provenance_mut::<u8>(block.as_ptr() as usize)).unwrap();
    // SAFETY: `block` is live and unused from here on; the pointer names it by address.
    unsafe { segments.try_free(addr_only) }.expect("a live block, named by its address");
    let again = segments.alloc(layout);
    assert_eq!(again.as_ptr() as usize, block.as_ptr() as usize, "the kept block is reused");
    // SAFETY: `again` is a live block of 256 bytes, ours alone.
    unsafe {
        again.as_ptr().write_bytes(0xAB, layout.size());
        assert_eq!(*again.as_ptr().add(255), 0xAB);
        segments.free(again);
    }
    segments.release_cached();
    assert_eq!((segments.stats().live, segments.cached_bytes()), (0, 0));
}

// ---- lying or unhelpful safe trait implementations ---------------------------------------

/// A raw allocator that keeps the (unsafe) `RawAlloc` contract for the blocks it returns but
/// lies everywhere the contract allows: its capacity, failing with room to spare, and a
/// `free` that does nothing. `AlignedAlloc` must stay sound: errors and leaks only.
#[derive(Debug)]
struct Unhelpful {
    stack: StackAllocator,
    calls: Cell<u32>,
}

// SAFETY: every block comes from the stack's `RawAlloc` impl (contract 1–3 hold there);
// refusing, lying about capacity and not freeing are all allowed by the contract.
unsafe impl RawAlloc for Unhelpful {
    fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
        self.calls.set(self.calls.get() + 1);
        if self.calls.get() % 2 == 0 {
            return None;
        }
        RawAlloc::alloc(&self.stack, size)
    }

    unsafe fn free(&self, _ptr: NonNull<u8>, _size: usize) {}

    fn capacity(&self) -> usize {
        3 // a lie: the stack holds far more
    }
}

#[test]
fn unhelpful_raw_allocator_gives_errors_not_ub() {
    let a = AlignedAlloc::new(Unhelpful { stack: StackAllocator::with_capacity(4096), calls: Cell::new(0) });
    let layout = Layout::from_size_align(100, 64).unwrap();
    let p = a.try_alloc(layout).expect("the first call succeeds");
    assert_eq!(p.as_ptr() as usize % 64, 0);
    assert!(matches!(a.try_alloc(layout), Err(Error::OutOfMemory { .. })));
    let stats = a.stats();
    assert_eq!((stats.capacity, stats.available(), stats.failures), (3, 0, 1));
    // SAFETY: `p` is ours, freed once; the raw allocator's `free` does nothing (a leak).
    unsafe { a.free(p) };
    assert_eq!(a.stats().live, 0);
    let mut v: ApiVec<u64, _> = ApiVec::new_in(&a);
    assert!(v.try_reserve(10_000).is_err(), "a refusal reaches the collection as an error");
}

// ---- !Send / !Sync payloads and threads --------------------------------------------------

/// Values from `alloc_mut` (and the stacks' `alloc`) need no `Send` bound: once the borrow
/// ends they can never be reached again, so moving the allocator moves only bytes. (Storing
/// an `Rc` behind a `FrameRef` is refused at compile time:
/// `tests/ui/soundness/alloc_double_buffered_rc.rs`.)
#[test]
fn unreachable_non_send_values_may_cross_threads() {
    let local = Rc::new(1u32);
    let d = DoubleBufferedAllocator::with_capacity(256);
    let stored: &mut Rc<u32> = d.alloc_mut(Rc::clone(&local));
    assert_eq!(**stored, 1);
    let frame = FrameAllocator::with_capacity(256);
    frame.alloc(Rc::clone(&local));
    let r = d.alloc(10u64);
    let (d, frame) = std::thread::spawn(move || {
        assert_eq!(*d.get(r), 10);
        assert_eq!(frame.allocated_bytes(), size_of::<Rc<u32>>());
        (d, frame)
    })
    .join()
    .unwrap();
    drop((d, frame));
    assert_eq!(Rc::strong_count(&local), 3, "values in frames are never dropped");
    // SAFETY: the two clones stored in the (now dropped) frames were leaked and are never used
    // again; giving their counts back lets Miri's leak check see the `Rc` freed.
    unsafe {
        Rc::decrement_strong_count(Rc::as_ptr(&local));
        Rc::decrement_strong_count(Rc::as_ptr(&local));
    }
}

/// A `FrameRef` is a token (`Send + Sync`): sent alone it reaches nothing, and used with
/// another allocator it is refused.
#[test]
fn frame_ref_alone_reaches_nothing() {
    let d = DoubleBufferedAllocator::with_capacity(64);
    let r: FrameRef<u64> = d.alloc(3);
    let other = std::thread::spawn(move || {
        let other = DoubleBufferedAllocator::with_capacity(64);
        other.alloc(0u64);
        assert!(matches!(other.try_get(r), Err(Error::StaleFrameRef { .. })));
    });
    other.join().unwrap();
    assert_eq!(*d.get(r), 3);
}

/// The thread-safe block allocators under contention from scoped threads, boxes freed on
/// another thread than the one that allocated them.
/// `SegmentAlloc` keeps only addresses in its ledger and frees through the pointer the
/// system gave it back, so narrowed boxes free cleanly under Stacked Borrows; bad frees
/// through `deallocate` are refused before any memory is touched.
#[test]
fn segment_alloc_frees_narrowed_boxes_and_refuses_bad_frees() {
    let segments = SegmentAlloc::with_limit(1 << 16);
    for i in 0..3u8 {
        let one = narrowed(i, &segments);
        let zero_sized = narrowed((), &segments);
        assert_eq!(one[0], i);
        drop(zero_sized);
    }
    assert_eq!(segments.stats().live, 0);
    let block = segments.alloc(Layout::from_size_align(64, 64).unwrap());
    let inside = NonNull::new(block.as_ptr().wrapping_add(1)).unwrap();
    // SAFETY: each bad free is refused before it touches memory; then the block is freed once.
    unsafe {
        assert!(matches!(segments.try_free(inside), Err(Error::NotBlockStart { .. })));
        segments.free(block);
        assert!(matches!(segments.try_free(block), Err(Error::DoubleFree { .. })));
    }
    // The limit is a hard cap that no request sequence can pass.
    assert!(segments.try_alloc(Layout::from_size_align(usize::MAX / 2, 1).unwrap()).is_err());
    assert_eq!(segments.stats().in_use, 0);
}

#[test]
fn sync_allocators_free_on_other_threads() {
    let n = if cfg!(miri) { 4 } else { 200 };
    let pool = SizeClassPool::new(&[(8, 64), (64, 64)]);
    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [64; 7] });
    let aligned = AlignedAlloc::new(SystemRaw);
    let segments = SegmentAlloc::new();
    std::thread::scope(|s| {
        let (tx, rx) = std::sync::mpsc::sync_channel(4);
        let (pool, small, aligned, segments) = (&pool, &small, &aligned, &segments);
        s.spawn(move || {
            for i in 0..n {
                let boxes = (
                    ApiBox::new_in(i as u8, pool),
                    ApiBox::new_in(i, small),
                    ApiBox::new_in(i, aligned),
                    ApiBox::new_in(i, segments),
                );
                tx.send(boxes).unwrap();
            }
        });
        s.spawn(move || {
            for (i, (a, b, c, d)) in rx.into_iter().enumerate() {
                assert_eq!((*a as usize, *b, *c, *d), (i % 256, i, i, i));
            }
        });
    });
    assert_eq!((pool.stats().live, small.stats().live, aligned.stats().live, segments.stats().live), (0, 0, 0, 0));
}

// ---- variance that is kept on purpose ----------------------------------------------------

/// A raw allocator borrowing a stack: a type with a lifetime, to try covariance on.
#[derive(Debug)]
struct Borrowed<'s>(&'s StackAllocator);

// SAFETY: forwards to the stack's `RawAlloc` impl, which keeps the contract while the
// borrow lives.
unsafe impl RawAlloc for Borrowed<'_> {
    fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
        RawAlloc::alloc(self.0, size)
    }

    unsafe fn free(&self, _ptr: NonNull<u8>, _size: usize) {}
}

/// Covariance that is sound and useful stays: `AlignedAlloc<A>` owns its raw allocator like
/// any struct field, and a `PoolBox` may be held for a shorter borrow of its pool. (The
/// invariant types are checked in `tests/ui/soundness/alloc_*_variance.rs`.)
#[test]
fn covariance_kept_where_sound() {
    fn shorter_raw<'short, 'long: 'short>(a: AlignedAlloc<Borrowed<'long>>) -> AlignedAlloc<Borrowed<'short>> {
        a
    }
    fn shorter_pool_borrow<'short, 'long: 'short>(b: PoolBox<'long, u8>) -> PoolBox<'short, u8> {
        b
    }
    let stack = StackAllocator::with_capacity(64);
    let a = shorter_raw(AlignedAlloc::new(Borrowed(&stack)));
    let p = a.alloc(Layout::new::<u64>());
    // SAFETY: ours, freed once.
    unsafe { a.free(p) };
    let pool = Pool::with_capacity(1);
    assert_eq!(*shorter_pool_borrow(pool.alloc(4u8)), 4);
}

/// Every end of a double-ended stack serves boxes; freeing them is a no-op checked for
/// foreign pointers.
#[test]
fn double_ended_stack_boxes_at_both_ends() {
    let stack = DoubleEndedStack::with_capacity(256);
    let low = stack.alloc(End::Lower, 1u64);
    let b = ApiBox::new_in(2u64, &stack);
    let high = stack.alloc(End::Upper, 3u64);
    assert_eq!((*low, *b, *high), (1, 2, 3));
}

// ---- a block freed into another instance of the same type -------------------------------

/// A block from one allocator given to `deallocate` of another of the same type (same
/// configuration, so the same classes and slot sizes) is refused with a panic naming the
/// foreign pointer, before any memory is touched; the block stays live in its own allocator
/// and is freed there afterwards.
#[test]
fn blocks_freed_into_another_instance_are_refused() {
    fn refuse<A: Allocator + Copy>(owner: A, other: A, layout: Layout) {
        let block = owner.allocate(layout).expect("room").cast::<u8>();
        // SAFETY: `block` is a live block of `owner`, and it is not used while `other`
        // looks at it; `other` must refuse it without touching it.
        let refused =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| unsafe { other.deallocate(block, layout) }));
        let message = refused.expect_err("a foreign block must be refused");
        let message = message.downcast_ref::<String>().expect("a formatted panic message");
        assert!(message.contains("foreign free"), "{message}");
        // SAFETY: the block is still `owner`'s, live, and freed once.
        unsafe {
            block.as_ptr().write_bytes(1, layout.size());
            owner.deallocate(block, layout);
        }
    }
    let layout = Layout::new::<[u64; 2]>();
    refuse(&SizeClassPool::new(&[(16, 4)]), &SizeClassPool::new(&[(16, 4)]), layout);
    let config = SmallObjectConfig { slots: [4; 7] };
    refuse(&SmallObjectAllocator::new(config.clone()), &SmallObjectAllocator::new(config), layout);
    // System-fallback blocks, looked up in the other allocator's table.
    let none = SmallObjectConfig { slots: [0; 7] };
    refuse(&SmallObjectAllocator::new(none.clone()), &SmallObjectAllocator::new(none), layout);
    refuse(&Pool::<[u64; 2]>::with_capacity(2), &Pool::<[u64; 2]>::with_capacity(2), layout);
    refuse(&StackAllocator::with_capacity(64), &StackAllocator::with_capacity(64), layout);
    refuse(&DoubleEndedStack::with_capacity(64), &DoubleEndedStack::with_capacity(64), layout);
    refuse(&FrameAllocator::with_capacity(64), &FrameAllocator::with_capacity(64), layout);
    refuse(&DoubleBufferedAllocator::with_capacity(64), &DoubleBufferedAllocator::with_capacity(64), layout);
    refuse(&AlignedAlloc::new(SystemRaw), &AlignedAlloc::new(SystemRaw), layout);
    refuse(&SegmentAlloc::new(), &SegmentAlloc::new(), layout);
}
