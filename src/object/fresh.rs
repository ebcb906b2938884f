//! Fresh slots for the store's owner thread: a run of never-used local
//! indices taken from the store's `len` with one compare-exchange, then
//! handed out one per `create` with plain loads and stores.
//!
//! A `create` that finds no free slot takes a never-used one by raising
//! `len`. Any thread may create, so that is an atomic read-modify-write per
//! object, on which a level load's profile put most of `try_insert`'s
//! samples (taking it away saved 9 %; see `BENCHMARKS.md`, O1b). The
//! *owner* (the thread that made the store, and then whichever thread last
//! collected) instead raises `len` by a run of up to [`RUN`] slots at once
//! and keeps the run here. Other threads, and the owner while an iterator is
//! alive, take slots as before.
//!
//! The run's slots are below `len` but vacant and on no list, so every count
//! that derives objects from `len` subtracts [`FreshRun::left`], and a
//! collection or shutdown puts what is left on the free list (under
//! `&mut ObjectManager`, like every other push onto it).

use crate::sync::{thread_token, AtomicU32, AtomicU64, Ordering, UnsafeCell};

/// Slots taken from `len` at once.
pub(crate) const RUN: u32 = 64;

/// The owner's run of fresh slots.
///
/// # Invariants
///
/// - `run`, the pair `(next, end)`, is read and written only by the thread
///   whose [`thread_token`] is `owner`, in `take` and `refill` (which run no
///   code of the user's), or under `&mut ObjectManager` (in `release`, which
///   also moves `owner`): so never by two threads at once.
/// - `next..end` are local indices below the store's `len`, in published
///   segments, whose slots are vacant, never used, and on no list; `left` is
///   `end - next`, stored by whoever changes them, for counts on any thread.
#[derive(Debug)]
pub(crate) struct FreshRun {
    owner: AtomicU64,
    run: UnsafeCell<(u32, u32)>,
    left: AtomicU32,
}

impl FreshRun {
    /// A run owned by the calling thread, empty.
    pub(crate) fn new() -> Self {
        FreshRun { owner: AtomicU64::new(thread_token()), run: UnsafeCell::new((0, 0)), left: AtomicU32::new(0) }
    }

    /// True if the calling thread owns the run.
    #[inline]
    pub(crate) fn is_owner(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == thread_token()
    }

    /// Fresh slots held in the run (not objects yet).
    #[inline]
    pub(crate) fn left(&self) -> u32 {
        self.left.load(Ordering::Relaxed)
    }

    /// The next slot of the run, if it has one. Only the owner calls it.
    #[inline]
    pub(crate) fn take(&self) -> Option<u32> {
        debug_assert!(self.is_owner());
        // SAFETY: only the owner thread reaches here (caller), and it runs
        // nothing else while it holds the pointer (type invariants).
        self.run.with_mut(|run| unsafe {
            let (next, end) = *run;
            if next == end {
                return None;
            }
            *run = (next + 1, end);
            self.left.store(end - next - 1, Ordering::Relaxed);
            Some(next)
        })
    }

    /// Makes `start..end` the run. Only the owner calls it, with an empty run.
    #[inline]
    pub(crate) fn refill(&self, start: u32, end: u32) {
        debug_assert!(self.is_owner() && start < end);
        // SAFETY: as in `take`.
        self.run.with_mut(|run| unsafe {
            debug_assert!((*run).0 == (*run).1, "only an empty run is refilled");
            *run = (start, end);
        });
        self.left.store(end - start, Ordering::Relaxed);
    }

    /// Empties the run, returning what it held, and gives it to the calling
    /// thread if `adopt`.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of the store's manager, so no
    /// `create` through the manager runs on any thread.
    pub(crate) unsafe fn release(&self, adopt: bool) -> (u32, u32) {
        // SAFETY: no owner's `take` or `refill` runs (caller), and `&mut
        // ObjectManager` reached this thread through a synchronising hand-over.
        let held = self.run.with_mut(|run| unsafe { std::mem::take(&mut *run) });
        self.left.store(0, Ordering::Relaxed);
        if adopt {
            self.owner.store(thread_token(), Ordering::Relaxed);
        }
        held
    }
}

// SAFETY: no type parameter, so no bound: the run is two indices behind an
// owner check. `run` is only touched by the owner thread or under
// `&mut ObjectManager` (type invariants), and the rest is atomic.
unsafe impl Sync for FreshRun {}
