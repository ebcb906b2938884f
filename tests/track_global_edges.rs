//! `TrackingAllocator<System>` as the `#[global_allocator]`, at its edges: thread exit with
//! a pending record and counted deltas in the thread's slot, other thread-locals that free
//! and allocate in their destructors, mode switches and budgets changed while other
//! threads allocate, `realloc` across modes, and tag scopes left by a panic or forgotten.
//!
//! Every check measures tags only this binary uses, and the steps run from one `#[test]`
//! function, since they change the global tracker's mode. Under Miri, run it with
//! `MIRIFLAGS=-Zmiri-tree-borrows` (see `track_global.rs`).

use std::alloc::System;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering};
use std::sync::Arc;

use mmobject::track::{current_tag, Mode, Sampling, Tag, TagId, Tracker, TrackingAllocator};

#[global_allocator]
static ALLOC: TrackingAllocator<System> = TrackingAllocator::new(System);

static EXIT: Tag = Tag::new("edges-Exit");
static DTOR: Tag = Tag::new("edges-Dtor");
static LATE: Tag = Tag::new("edges-Late");
static SWITCH: Tag = Tag::new("edges-Switch");
static GROW: Tag = Tag::new("edges-Grow");
static BUDGET: Tag = Tag::new("edges-Budget");
static CROWD: Tag = Tag::new("edges-Crowd");
static OUTER: Tag = Tag::new("edges-Outer");
static INNER: Tag = Tag::new("edges-Inner");

fn t() -> &'static Tracker {
    Tracker::global()
}

/// `(bytes, count)` of `tag` now.
fn live(tag: &Tag) -> (usize, usize) {
    let s = t().tag_stats(tag);
    (s.bytes, s.count)
}

/// Live records of `tag` (from the leak report).
fn records_of(tag: &Tag) -> usize {
    t().leak_report().groups.iter().filter(|g| g.tag == tag.id()).map(|g| g.count).sum()
}

const ROUNDS: usize = if cfg!(miri) { 3 } else { 200 };

#[test]
fn global_allocator_edges() {
    a_thread_exits_with_a_pending_record_and_deltas_in_its_slot();
    more_threads_than_slots_count_on_the_shared_counters();
    thread_local_destructors_free_and_allocate_around_the_exit_flush();
    mode_switches_while_other_threads_allocate_and_free();
    realloc_across_modes_and_sizes();
    budgets_set_and_cleared_while_other_threads_allocate();
    a_panic_inside_a_scope_restores_the_tag();
    a_forgotten_guard_keeps_its_tag_until_the_enclosing_guard_drops();
    assert_eq!(t().error_counts(), Default::default());
}

fn a_thread_exits_with_a_pending_record_and_deltas_in_its_slot() {
    t().set_mode(Mode::Records);
    // Two blocks kept past the thread's exit: the newer one is its pending record; a few
    // freed ones leave deltas in its slot that are never flushed.
    let kept: [Box<[u8; 100]>; 2] = std::thread::spawn(|| {
        let _g = EXIT.enter();
        for _ in 0..5 {
            drop(vec![0u8; 48]);
        }
        [Box::new([1u8; 100]), Box::new([2u8; 100])]
    })
    .join()
    .unwrap();
    assert_eq!(live(&EXIT), (200, 2), "both blocks, counted once each");
    assert_eq!(records_of(&EXIT), 2, "the pending record is reported after the thread's exit");
    t().set_mode(Mode::Counting);
    drop(kept);
    assert_eq!(live(&EXIT), (0, 0));
    assert_eq!(records_of(&EXIT), 0);
}

/// More threads alive at once than a tracker has slots (64; 4 under Miri): the last ones
/// count on the shared counters, in records mode too, and the totals stay exact.
fn more_threads_than_slots_count_on_the_shared_counters() {
    const THREADS: usize = if cfg!(miri) { 6 } else { 70 };
    for mode in [Mode::Counting, Mode::Records] {
        t().set_mode(mode);
        let barrier = Arc::new(std::sync::Barrier::new(THREADS));
        let threads: Vec<_> = (0..THREADS)
            .map(|i| {
                let barrier = Arc::clone(&barrier);
                std::thread::spawn(move || {
                    let _g = CROWD.enter();
                    let kept = vec![0u8; 10 + i];
                    drop(vec![0u8; 5]);
                    barrier.wait(); // all alive at once
                    kept
                })
            })
            .collect();
        let kept: Vec<Vec<u8>> = threads.into_iter().map(|h| h.join().unwrap()).collect();
        let bytes: usize = kept.iter().map(Vec::capacity).sum();
        assert_eq!(live(&CROWD), (bytes, THREADS), "{mode:?}");
        if mode.keeps_records() {
            assert_eq!(records_of(&CROWD), THREADS, "{mode:?}");
        }
        t().set_mode(Mode::Counting);
        drop(kept);
        assert_eq!(live(&CROWD), (0, 0), "{mode:?}");
        assert_eq!(records_of(&CROWD), 0, "{mode:?}");
    }
}

struct AllocatesOnDrop;

impl Drop for AllocatesOnDrop {
    fn drop(&mut self) {
        // A block allocated by a destructor at thread exit, after the tracker's own
        // thread-local may be gone: leaked on purpose, freed by the test afterwards.
        let _g = LATE.enter();
        LATE_BLOCK.store(Box::into_raw(Box::new([3u8; 64])), Ordering::SeqCst);
    }
}

static LATE_BLOCK: AtomicPtr<[u8; 64]> = AtomicPtr::new(std::ptr::null_mut());

thread_local! {
    static BEFORE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
    static LATE_ALLOC: RefCell<Option<AllocatesOnDrop>> = const { RefCell::new(None) };
}

fn thread_local_destructors_free_and_allocate_around_the_exit_flush() {
    for mode in [Mode::Records, Mode::Counting, Mode::Stacks { depth: 2 }] {
        t().set_mode(mode);
        std::thread::spawn(|| {
            // Registered before and after the tracker's exit flush (its first recorded
            // allocation registers it), so one destructor runs on each side of it.
            BEFORE.with(|v| {
                let _g = DTOR.enter();
                v.borrow_mut().push(vec![0; 40]);
            });
            let _g = DTOR.enter();
            let pending = Box::new([9u8; 24]);
            BEFORE.with(|v| v.borrow_mut().push(vec![1; 40]));
            LATE_ALLOC.with(|l| *l.borrow_mut() = Some(AllocatesOnDrop));
            // Still pending in the slot at exit.
            KEPT_BLOCK.store(Box::into_raw(pending), Ordering::SeqCst);
        })
        .join()
        .unwrap();
        assert_eq!(live(&DTOR), (24, 1), "{mode:?}: the two vectors freed at exit, the kept box live");
        assert_eq!(live(&LATE), (64, 1), "{mode:?}: the destructor's block");
        if mode.keeps_records() {
            assert_eq!(records_of(&DTOR), 1, "{mode:?}");
            assert_eq!(records_of(&LATE), 1, "{mode:?}");
        }
        let late = LATE_BLOCK.swap(std::ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: from `Box::into_raw` of a `Box<[u8; 64]>`, freed once.
        drop(unsafe { Box::from_raw(late) });
        assert_eq!(live(&LATE), (0, 0));
        let kept = KEPT_BLOCK.swap(std::ptr::null_mut(), Ordering::SeqCst);
        // SAFETY: from `Box::into_raw` of a `Box<[u8; 24]>`, freed once.
        drop(unsafe { Box::from_raw(kept) });
        assert_eq!(live(&DTOR), (0, 0), "{mode:?}");
        assert_eq!(records_of(&DTOR), 0, "{mode:?}");
        assert_eq!(records_of(&LATE), 0, "{mode:?}");
    }
    t().set_mode(Mode::Counting);
}

static KEPT_BLOCK: AtomicPtr<[u8; 24]> = AtomicPtr::new(std::ptr::null_mut());

fn mode_switches_while_other_threads_allocate_and_free() {
    let modes = [
        Mode::Counting,
        Mode::Records,
        Mode::Sampled(Sampling::new(0, 64, 512, 2)),
        Mode::Stacks { depth: 1 },
        Mode::Counting,
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let _g = SWITCH.enter();
                let mut held: Vec<Vec<u8>> = Vec::new();
                let mut i = 0usize;
                while !stop.load(Ordering::Relaxed) || i < ROUNDS {
                    let size = [16, 100, 700, 3000][(i + w) % 4];
                    held.push(vec![w as u8; size]);
                    if held.len() > 8 {
                        // Freed and grown in whatever mode is current now.
                        let mut v = held.remove(i % 8);
                        v.reserve(size);
                        v.shrink_to_fit();
                        drop(v);
                    }
                    i += 1;
                }
                held
            })
        })
        .collect();
    for _ in 0..if cfg!(miri) { 1 } else { 20 } {
        for mode in modes {
            t().set_mode(mode);
            std::thread::yield_now();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let held: Vec<Vec<Vec<u8>>> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    // The workers' `held` vectors were allocated under the tag too.
    let outer = held.iter().map(|h| h.capacity() * std::mem::size_of::<Vec<u8>>());
    let bytes: usize = held.iter().flatten().map(|v| v.capacity()).sum::<usize>() + outer.sum::<usize>();
    let count: usize = held.iter().flatten().count() + held.len();
    assert_eq!(live(&SWITCH), (bytes, count));
    t().set_mode(Mode::Records);
    drop(held);
    assert_eq!(live(&SWITCH), (0, 0));
    assert_eq!(records_of(&SWITCH), 0);
    t().set_mode(Mode::Counting);
}

fn realloc_across_modes_and_sizes() {
    let _g = GROW.enter();
    let sampled = Mode::Sampled(Sampling::new(0, 64, 1024, 1_000_000));
    let steps: [(Mode, usize); 6] = [
        (Mode::Counting, 32),
        (sampled, 2000), // grows into a recorded size: moved, gets a record
        (Mode::Counting, 4000),
        (sampled, 100), // shrinks below it
        (Mode::Records, 5000),
        (Mode::Counting, 8),
    ];
    let mut v: Vec<u8> = Vec::with_capacity(1);
    v.push(7);
    for (mode, cap) in steps {
        t().set_mode(mode);
        if cap > v.capacity() {
            v.reserve_exact(cap - v.len());
        } else {
            v.shrink_to(cap);
        }
        assert_eq!(v[0], 7);
        assert_eq!(live(&GROW), (v.capacity(), 1), "{mode:?} {cap}");
        let recorded = records_of(&GROW);
        assert!(recorded <= 1, "{mode:?} {cap}: one block, at most one record");
    }
    drop(v);
    assert_eq!(live(&GROW), (0, 0));
    assert_eq!(records_of(&GROW), 0);
    t().set_mode(Mode::Counting);
}

fn budgets_set_and_cleared_while_other_threads_allocate() {
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let _g = BUDGET.enter();
                let mut i = 0usize;
                let mut keep = Vec::new();
                while !stop.load(Ordering::Relaxed) || i < ROUNDS {
                    let mut v: Vec<u8> = Vec::with_capacity(8 + i % 64);
                    v.reserve(200);
                    keep.push(v);
                    if keep.len() > 4 {
                        keep.remove(0);
                    }
                    i += 1;
                }
            })
        })
        .collect();
    for _ in 0..if cfg!(miri) { 2 } else { 200 } {
        t().set_budget(&BUDGET, usize::MAX / 2);
        std::thread::yield_now();
        t().clear_budget(&BUDGET);
        t().watch(&BUDGET, true);
        t().watch(&BUDGET, false);
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(live(&BUDGET), (0, 0));
}

fn a_panic_inside_a_scope_restores_the_tag() {
    let _o = OUTER.enter();
    let r = std::panic::catch_unwind(|| {
        let _i = INNER.enter();
        let v = vec![0u8; 10];
        std::hint::black_box(&v);
        // Unwinds without the panic hook, whose backtrace caches (kept for the process)
        // would land on the tag in scope.
        std::panic::resume_unwind(Box::new(()));
    });
    assert!(r.is_err());
    assert_eq!(current_tag(), OUTER.id());
    assert_eq!(live(&INNER), (0, 0), "the unwound Vec was freed under its own tag");
}

fn a_forgotten_guard_keeps_its_tag_until_the_enclosing_guard_drops() {
    {
        let _o = OUTER.enter();
        std::mem::forget(INNER.enter());
        assert_eq!(current_tag(), INNER.id());
        // `black_box`: a release build may otherwise elide the unused allocation.
        let v = std::hint::black_box(vec![0u8; 10]);
        assert_eq!(live(&INNER), (10, 1));
        drop(v);
    }
    assert_eq!(current_tag(), TagId::UNTAGGED);
    assert_eq!(live(&INNER), (0, 0));
}
