//! Adversarial cases for `mmobject::track`.
//!
//! `TrackingAllocator`'s `GlobalAlloc` methods are called directly here (this binary's
//! global allocator is `System`), each case on a tracker of its own.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::marker::PhantomData;

use mmobject::track::{current_tag, scope, Mode, Tag, TagId, Tracker, TrackingAllocator};

/// The blocks of the false-double-free cases: unguarded (16 B of header), so a block placed
/// at a freed block's memory gets the same user address.
const LAYOUT: Layout = match Layout::from_size_align(80, 8) {
    Ok(l) => l,
    Err(_) => panic!("valid layout"),
};
/// A block with guards in diagnostic mode.
const GUARDED: Layout = match Layout::from_size_align(48, 8) {
    Ok(l) => l,
    Err(_) => panic!("valid layout"),
};

/// Allocates `layout` through `a` a few times, looking for a block at `addr` (the inner
/// allocator reuses freed memory: natively at once, under Miri only sometimes). Frees the
/// misses; returns the block at `addr`, if one came.
fn allocate_at(a: &TrackingAllocator<System>, layout: Layout, addr: usize) -> Option<*mut u8> {
    let mut misses = Vec::new();
    let mut found = None;
    for _ in 0..8 {
        // SAFETY: a non-zero layout.
        let p = unsafe { a.alloc(layout) };
        assert!(!p.is_null());
        if p as usize == addr {
            found = Some(p);
            break;
        }
        misses.push(p);
    }
    for p in misses {
        // SAFETY: each miss is live, from `a`, with `layout`, and freed once here.
        unsafe { a.dealloc(p, layout) };
    }
    found
}

/// Issue 8's false double free: a block with a record (records mode), freed in diagnostic
/// mode, leaves its address in the freed ring; a block later placed at that address without
/// a record (diagnostics off, counting mode), freed once diagnostics are back on, was
/// reported as a double free and leaked. It must be freed normally: no error counted, the
/// tag back to zero.
///
/// Miri puts a freed address up for reuse only some of the time, so the scenario is tried
/// until the address comes back (natively, the first time).
fn no_false_double_free_after(tracker: &'static Tracker, switch_off: impl Fn(&Tracker), tag: &Tag) {
    let a = TrackingAllocator::with_tracker(System, tracker);
    let _g = tag.enter();
    for _attempt in 0..32 {
        tracker.set_mode(Mode::Records);
        // SAFETY: a non-zero layout; freed once, below.
        let first = unsafe { a.alloc(LAYOUT) };
        tracker.set_diagnostics(true);
        // SAFETY: `first` is live, from `a`, with `LAYOUT`.
        unsafe { a.dealloc(first, LAYOUT) };

        switch_off(tracker);
        assert!(!tracker.diagnostics() && tracker.mode() == Mode::Counting);
        let Some(second) = allocate_at(&a, LAYOUT, first as usize) else {
            continue;
        };
        tracker.set_diagnostics(true);
        // SAFETY: `second` is live, from `a`, with `LAYOUT`, and freed once.
        unsafe { a.dealloc(second, LAYOUT) };

        assert_eq!(tracker.error_counts().double_frees, 0, "a legitimate free reported as a double free");
        assert_eq!(tracker.error_counts().untracked_frees, 0);
        let stats = tracker.tag_stats(tag);
        assert_eq!((stats.bytes, stats.count), (0, 0), "the block was leaked, not freed");
        return;
    }
    panic!("the inner allocator never reused a freed block's address");
}

#[test]
fn diagnostics_off_and_on_again_gives_no_false_double_free() {
    static TRACKER: Tracker = Tracker::new();
    static TAG: Tag = Tag::new("soundness-track-diag-switch");
    no_false_double_free_after(
        &TRACKER,
        |t| {
            t.set_diagnostics(false);
            t.set_mode(Mode::Counting);
        },
        &TAG,
    );
}

#[test]
fn records_to_counting_and_back_gives_no_false_double_free() {
    static TRACKER: Tracker = Tracker::with_mode(Mode::Stacks { depth: 3 });
    static TAG: Tag = Tag::new("soundness-track-mode-switch");
    no_false_double_free_after(
        &TRACKER,
        |t| {
            t.set_mode(Mode::Counting);
            t.set_diagnostics(false);
            t.set_mode(Mode::Stacks { depth: 2 });
            t.set_mode(Mode::Counting);
        },
        &TAG,
    );
}

#[test]
fn a_saturated_epoch_still_gives_no_false_double_free() {
    static TRACKER: Tracker = Tracker::new();
    static TAG: Tag = Tag::new("soundness-track-epoch-saturated");
    // Start the configuration epoch at its limit: every later switch saturates there, so
    // epochs no longer tell configurations apart, and the ring must not be trusted.
    TRACKER.__set_config_epoch_for_tests(u64::MAX);
    no_false_double_free_after(
        &TRACKER,
        |t| {
            t.set_diagnostics(false);
            t.set_mode(Mode::Counting);
        },
        &TAG,
    );
}

#[test]
fn a_real_double_free_is_still_caught_in_diagnostic_mode() {
    static TRACKER: Tracker = Tracker::new();
    static TAG: Tag = Tag::new("soundness-track-real-double");
    let a = TrackingAllocator::with_tracker(System, &TRACKER);
    let _g = TAG.enter();
    TRACKER.set_diagnostics(true);
    // SAFETY: a non-zero layout. The second free is a real double free, on purpose: in
    // diagnostic mode the tracker finds it in its freed ring (same configuration epoch)
    // before touching the memory, so it is reported and nothing is freed twice (Miri
    // checks that no freed memory is read).
    unsafe {
        let p = a.alloc(GUARDED);
        a.dealloc(p, GUARDED);
        a.dealloc(p, GUARDED);
    }
    assert_eq!(TRACKER.error_counts().double_frees, 1);
    assert_eq!(TRACKER.tag_stats(&TAG).bytes, 0);
}

#[test]
fn the_explicit_api_catches_double_frees_across_switches() {
    let tracker = Tracker::new();
    let tag = tracker.tag_named("soundness-track-explicit");
    let p = tracker.alloc(GUARDED, tag);
    tracker.set_diagnostics(true);
    tracker.try_dealloc(p).unwrap();
    tracker.set_diagnostics(false);
    tracker.set_mode(Mode::Records);
    assert!(tracker.try_dealloc(p).is_err(), "never freed twice, whatever the switches");
    assert_eq!(tracker.tag_stats(tag).bytes, 0);
}

/// `try_dealloc` is safe and takes any `NonNull`: one made from the block's address alone
/// (no provenance, as `NonNull::new(addr as *mut u8)` under strict provenance gives) or
/// narrowed to a part of the block must still free it cleanly. The tracker reaches the
/// block (its guards, the `System` free) through the provenance it exposed when it
/// recorded the address, never through the caller's pointer: that was undefined behaviour
/// under Miri (pointer arithmetic and a free through a pointer with no provenance).
#[test]
fn the_explicit_api_frees_through_its_own_pointer() {
    let tracker = Tracker::new();
    let tag = tracker.tag_named("soundness-track-own-pointer");
    for diagnostics in [false, true] {
        tracker.set_diagnostics(diagnostics);
        let p = tracker.alloc(GUARDED, tag);
        let forged = std::ptr::NonNull::new(std::ptr::without_provenance_mut::<u8>(p.as_ptr() as usize)).unwrap();
        tracker.try_dealloc(forged).unwrap();
        let p = tracker.alloc(GUARDED, tag);
        // SAFETY: a pointer to the block's first byte, with provenance over that byte only.
        let narrowed = std::ptr::NonNull::from(unsafe { &mut *p.as_ptr() });
        tracker.try_dealloc(narrowed).unwrap();
    }
    assert_eq!(tracker.tag_stats(tag).bytes, 0);
    assert_eq!(tracker.error_counts(), Default::default());
}

/// `mem::forget` of a guard from `enter()` leaves its tag current until an enclosing guard
/// drops, which restores the tag from before it; nothing panics (a `Drop` must not), and
/// nothing else is corrupted.
#[test]
fn forgotten_tag_guards_are_safe() {
    static OUTER: Tag = Tag::new("soundness-track-outer");
    static INNER: Tag = Tag::new("soundness-track-inner");
    assert_eq!(current_tag(), TagId::UNTAGGED);
    {
        let _outer = OUTER.enter();
        std::mem::forget(INNER.enter());
        assert_eq!(current_tag(), INNER.id());
    } // the outer guard drops over a forgotten inner one
    assert_eq!(current_tag(), TagId::UNTAGGED);

    // Out-of-order drops: each guard restores what it replaced.
    let a = OUTER.enter();
    let b = INNER.enter();
    drop(a);
    assert_eq!(current_tag(), TagId::UNTAGGED);
    drop(b);
    assert_eq!(current_tag(), OUTER.id(), "b restores what it replaced");
    std::mem::forget(TagId::UNTAGGED.enter());
    assert_eq!(current_tag(), TagId::UNTAGGED);

    // A forgotten guard inside `scope` is undone when `scope` returns.
    scope(&OUTER, || std::mem::forget(INNER.enter()));
    assert_eq!(current_tag(), TagId::UNTAGGED);

    // Allocation still works and is attributed to whatever is current.
    static TRACKER: Tracker = Tracker::new();
    let tracker = &TRACKER;
    let a = TrackingAllocator::with_tracker(System, tracker);
    std::mem::forget(INNER.enter());
    // SAFETY: a non-zero layout, freed once with it.
    unsafe {
        let p = a.alloc(GUARDED);
        a.dealloc(p, GUARDED);
    }
    std::mem::forget(TagId::UNTAGGED.enter());
    assert_eq!(tracker.tag_stats(&INNER).count, 0);
    assert_eq!(tracker.tag_stats(&INNER).total_count, 1);
}

/// What the type system allows for `TrackingAllocator<A>` and `TagGuard`.
mod auto_traits {
    use super::*;

    /// `Probe::<T>::SEND` / `SYNC` are `true` when `T` is `Send` / `Sync`: the inherent
    /// constant wins over the trait's default when its bound holds.
    struct Probe<T: ?Sized>(PhantomData<T>);
    trait Fallback {
        const SEND: bool = false;
        const SYNC: bool = false;
    }
    impl<T: ?Sized> Fallback for Probe<T> {}
    impl<T: ?Sized + Send> Probe<T> {
        const SEND: bool = true;
    }
    struct SyncProbe<T: ?Sized>(PhantomData<T>);
    impl<T: ?Sized> Fallback for SyncProbe<T> {}
    impl<T: ?Sized + Sync> SyncProbe<T> {
        const SYNC: bool = true;
    }

    /// A `Send` but `!Sync` inner allocator.
    struct CellAlloc(Cell<u8>);
    // SAFETY: forwards to `System`; the cell is only counted in, on one thread.
    unsafe impl GlobalAlloc for CellAlloc {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            self.0.set(self.0.get().wrapping_add(1));
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    #[test]
    fn tracking_allocator_is_send_and_sync_exactly_when_its_inner_allocator_is() {
        const { assert!(Probe::<TrackingAllocator<System>>::SEND) };
        const { assert!(SyncProbe::<TrackingAllocator<System>>::SYNC) };
        const { assert!(Probe::<TrackingAllocator<CellAlloc>>::SEND) };
        const { assert!(!SyncProbe::<TrackingAllocator<CellAlloc>>::SYNC, "a `!Sync` inner allocator cannot be shared") };
        const { assert!(SyncProbe::<Tracker>::SYNC) };
    }

    #[test]
    fn tag_guards_stay_on_their_thread() {
        const { assert!(!Probe::<mmobject::track::TagGuard>::SEND) };
        const { assert!(!SyncProbe::<mmobject::track::TagGuard>::SYNC) };
    }

    /// A `GlobalAlloc` behind a reference, with a lifetime to vary.
    struct Forward;
    // SAFETY: forwards to `System`.
    unsafe impl GlobalAlloc for &Forward {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: the caller's contract, passed on.
            unsafe { System.dealloc(ptr, layout) }
        }
    }

    /// `TrackingAllocator<A>` owns its `A` by value and only lends `&A` to the inner calls,
    /// so covariance in `A` is sound (as for `Box<A>`): shortening the lifetime inside `A`
    /// cannot make a block outlive the allocator that made it. This compiles only while it
    /// stays covariant, which is on purpose.
    fn shorten<'short>(a: TrackingAllocator<&'static Forward>) -> TrackingAllocator<&'short Forward> {
        a
    }

    #[test]
    fn covariance_in_the_inner_allocator_is_harmless() {
        static FORWARD: Forward = Forward;
        static TRACKER: Tracker = Tracker::new();
        let a = shorten(TrackingAllocator::with_tracker(&FORWARD, &TRACKER));
        // SAFETY: a non-zero layout, freed once with it.
        unsafe {
            let p = a.alloc(GUARDED);
            assert!(!p.is_null());
            a.dealloc(p, GUARDED);
        }
    }

    #[test]
    fn a_non_sync_inner_allocator_still_works_on_one_thread() {
        static TRACKER: Tracker = Tracker::new();
        let a = TrackingAllocator::with_tracker(CellAlloc(Cell::new(0)), &TRACKER);
        // SAFETY: a non-zero layout, freed once with it.
        unsafe {
            let p = a.alloc(GUARDED);
            assert!(!p.is_null());
            a.dealloc(p, GUARDED);
        }
        assert_eq!(a.inner().0.get(), 1);
    }
}

/// Counters near their limits: the configuration epoch saturates rather than wraps (see
/// also `a_saturated_epoch_still_gives_no_false_double_free`), and a tag's counters driven
/// below zero by an unmatched credit neither overflow nor read as huge.
#[test]
fn counters_at_their_limits() {
    let tracker = Tracker::new();
    let tag = tracker.tag_named("soundness-track-wrap");
    tracker.charge(tag, 10);
    tracker.credit(tag, 10);
    tracker.credit(tag, 10); // unmatched: the counters sit below zero
    assert_eq!(tracker.tag_stats(tag).bytes, 0);
    tracker.charge(tag, 10); // must not overflow
    assert_eq!(tracker.tag_stats(tag).bytes, 0);
    assert_eq!(tracker.tag_stats(tag).peak_bytes, 10, "no peak from a wrapped counter");

    tracker.__set_config_epoch_for_tests(u64::MAX - 1);
    for _ in 0..4 {
        tracker.set_diagnostics(true);
        tracker.set_mode(Mode::Records);
        tracker.set_diagnostics(false);
        tracker.set_mode(Mode::Counting);
    }
    assert!(!tracker.diagnostics(), "the flag survives the epoch's saturation");
    assert_eq!(tracker.mode(), Mode::Counting, "the mode survives it too");
}
