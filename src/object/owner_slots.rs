//! Slots for the store's owner thread: a run of never-used local indices
//! taken from the store's `len`, and a chain of free slots taken off the free
//! list, each with one compare-exchange and then handed out one per `create`
//! with plain loads and stores.
//!
//! Any thread may create, so taking one slot is an atomic read-modify-write:
//! a pop of the free list, or a raise of `len` when the list is empty. A level
//! load's profile put most of `try_insert`'s samples on the raise (taking it
//! away saved 9 %), and a frame's on the pop (see `BENCHMARKS.md`, O1 and
//! O1b). The *owner* (the thread that made the store, and then whichever
//! thread last collected) instead takes up to [`RUN`] slots at once, keeps
//! them here, and takes them one by one without atomics. Other threads, and
//! the owner while an iterator is alive, take slots as before.
//!
//! The slots held here are below `len` but vacant and on no list, so every
//! count that derives objects from `len` subtracts [`OwnerSlots::left`], and a
//! collection on another thread or shutdown puts them back on the free list
//! (under `&mut ObjectManager`, like every other push onto it). At most
//! [`RUN`] of each kind are held, so loaders never miss more than that many
//! free slots.

use crate::sync::{thread_token, AtomicU32, AtomicU64, Ordering, UnsafeCell};

use super::slot::NIL;

/// Slots taken at once.
pub(crate) const RUN: u32 = 64;

/// The owner's run of fresh slots and chain of reused ones.
///
/// # Invariants
///
/// - `run`, the pair `(next, end)`, and `reused`, the pair `(head, count)`,
///   are read and written only by the thread whose [`thread_token`] is
///   `owner`, in the methods below that say so (which run no code of the
///   user's), or under `&mut ObjectManager` (in `release`, which also moves
///   `owner`): so never by two threads at once.
/// - `next..end` are local indices below the store's `len`, in published
///   segments, whose slots are vacant, never used, and on no list.
/// - `reused` is a chain of `count` vacant slots of published segments,
///   starting at `head` and linked through their header words as on the
///   free list (the last one's link is stale); they are on no list.
/// - `left` is `end - next + count`, stored by whoever changes them, for
///   counts on any thread.
#[derive(Debug)]
pub(crate) struct OwnerSlots {
    owner: AtomicU64,
    run: UnsafeCell<(u32, u32)>,
    reused: UnsafeCell<(u32, u32)>,
    left: AtomicU32,
}

/// What [`OwnerSlots::release`] hands back: the fresh run `start..end`, and
/// the chain of `count` reused slots from `head`.
pub(crate) struct Released {
    pub(crate) fresh: (u32, u32),
    pub(crate) reused: (u32, u32),
}

impl OwnerSlots {
    /// Slots owned by the calling thread, none held.
    pub(crate) fn new() -> Self {
        OwnerSlots {
            owner: AtomicU64::new(thread_token()),
            run: UnsafeCell::new((0, 0)),
            reused: UnsafeCell::new((NIL, 0)),
            left: AtomicU32::new(0),
        }
    }

    /// True if the calling thread owns the slots.
    #[inline]
    pub(crate) fn is_owner(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == thread_token()
    }

    /// Slots held (not objects yet).
    #[inline]
    pub(crate) fn left(&self) -> u32 {
        self.left.load(Ordering::Relaxed)
    }

    /// Stores `left` from both pairs. Only the owner, or `release`, calls it.
    ///
    /// # Safety
    ///
    /// As for the methods that change the pairs (type invariants).
    #[inline]
    unsafe fn store_left(&self) {
        // SAFETY: the caller's contract.
        let fresh = self.run.with(|run| unsafe { (*run).1 - (*run).0 });
        // SAFETY: as above.
        let reused = self.reused.with(|reused| unsafe { (*reused).1 });
        self.left.store(fresh + reused, Ordering::Relaxed);
    }

    /// The next fresh slot of the run, if it has one. Only the owner calls it.
    #[inline]
    pub(crate) fn take_fresh(&self) -> Option<u32> {
        debug_assert!(self.is_owner());
        // SAFETY: only the owner thread reaches here (caller), and it runs
        // nothing else while it holds the pointer (type invariants).
        let taken = self.run.with_mut(|run| unsafe {
            let (next, end) = *run;
            if next == end {
                return None;
            }
            *run = (next + 1, end);
            Some(next)
        });
        // SAFETY: as above.
        unsafe { self.store_left() };
        taken
    }

    /// Makes `start..end` the run. Only the owner calls it, with an empty run.
    #[inline]
    pub(crate) fn refill_fresh(&self, start: u32, end: u32) {
        debug_assert!(self.is_owner() && start < end);
        // SAFETY: as in `take_fresh`.
        self.run.with_mut(|run| unsafe {
            debug_assert!((*run).0 == (*run).1, "only an empty run is refilled");
            *run = (start, end);
        });
        // SAFETY: as above.
        unsafe { self.store_left() };
    }

    /// The next reused slot, if the chain has one; `link` reads a slot's link
    /// (only called while more than one is held). Only the owner calls it.
    #[inline]
    pub(crate) fn take_reused(&self, link: impl FnOnce(u32) -> u32) -> Option<u32> {
        debug_assert!(self.is_owner());
        // SAFETY: as in `take_fresh`; `link` reads a header word, no user code.
        let taken = self.reused.with_mut(|reused| unsafe {
            let (head, count) = *reused;
            if count == 0 {
                return None;
            }
            *reused = (if count > 1 { link(head) } else { NIL }, count - 1);
            Some(head)
        });
        if taken.is_some() {
            // SAFETY: as above.
            unsafe { self.store_left() };
        }
        taken
    }

    /// Makes the chain of `count` slots from `head` the reused chain. Only
    /// the owner calls it, with an empty chain.
    #[inline]
    pub(crate) fn refill_reused(&self, head: u32, count: u32) {
        debug_assert!(self.is_owner() && count > 0);
        // SAFETY: as in `take_fresh`.
        self.reused.with_mut(|reused| unsafe {
            debug_assert!((*reused).1 == 0, "only an empty chain is refilled");
            *reused = (head, count);
        });
        // SAFETY: as above.
        unsafe { self.store_left() };
    }

    /// Empties the run and the chain, returning what they held, and gives
    /// the slots to the calling thread if `adopt`.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of the store's manager, so no
    /// `create` through the manager runs on any thread.
    pub(crate) unsafe fn release(&self, adopt: bool) -> Released {
        // SAFETY: no owner's take or refill runs (caller), and `&mut
        // ObjectManager` reached this thread through a synchronising hand-over.
        let fresh = self.run.with_mut(|run| unsafe { std::mem::take(&mut *run) });
        // SAFETY: as above.
        let reused = self.reused.with_mut(|reused| unsafe { std::mem::replace(&mut *reused, (NIL, 0)) });
        self.left.store(0, Ordering::Relaxed);
        if adopt {
            self.owner.store(thread_token(), Ordering::Relaxed);
        }
        Released { fresh, reused }
    }
}

// SAFETY: no type parameter, so no bound: the run and the chain are indices
// behind an owner check. They are only touched by the owner thread or under
// `&mut ObjectManager` (type invariants), and the rest is atomic.
unsafe impl Sync for OwnerSlots {}
