//! Slots held for the store's owner thread: a run of never-used local
//! indices, and the slots the last collection freed.
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
//! The same goes for reused slots. Popping the shared free list is a
//! compare-exchange per `create`, which waits for the slot's link to load
//! (a frame's profile put 43 % of `create` there). So a collection *keeps*
//! the slots it freed for the owner, who pops them with plain loads and
//! stores, and the next `collect_garbage` first puts the ones the owner did
//! not use on the shared free list: another thread's `create` waits at most
//! one collection for a slot the owner left, and a store whose objects are
//! made on other threads stops growing after two frames (tested).
//!
//! The run's and the kept chain's slots are below `len` but vacant and on no
//! shared list, so every count that derives objects from `len` subtracts
//! [`OwnerSlots::left`], and a collection by another thread, or shutdown,
//! puts them on the free list (under `&mut ObjectManager`, like every other
//! push onto it).
//!
//! A store with a [capacity](crate::ObjectManagerBuilder::max_objects_per_type)
//! below the index space's holds nothing for any thread: there, slots held
//! for the owner would be slots another thread's `create` is refused while
//! fewer objects than the limit exist.

use std::ptr::NonNull;

use crate::sync::{thread_token, AtomicU32, AtomicU64, Ordering, UnsafeCell};

use super::slot::NIL;

/// Slots taken from `len` at once.
pub(crate) const RUN: u32 = 64;

/// The owner of a store that holds nothing for any thread: no thread's token
/// (they count up from 1).
const NOBODY: u64 = 0;

/// The slots held for a store's owner thread: a run of fresh ones and a
/// chain of kept ones.
///
/// # Invariants
///
/// - `run`, the pair `(next, end)`, `cursor` and `kept` are read and
///   written only by the thread whose [`thread_token`] is `owner`, in
///   `take`, `refill`, `run_left` and `take_kept` (which run no code of the
///   user's), or under `&mut ObjectManager` (in `kept`, `set_kept` and
///   `release`, which also moves `owner`): so never by two threads at once.
/// - `next..end` are local indices below the store's `len`, in one
///   published segment, whose slots are vacant, never used, and on no list.
/// - `cursor`, the pair `(at, in_chunk)`: while `in_chunk > 0`, `at` is
///   slot `next`'s address (with its segment's provenance) and `in_chunk`
///   slots of the run lie contiguously from it, in one chunk; so
///   `in_chunk <= end - next`, and an empty run's cursor is used up.
/// - `kept` is a chain of vacant slots linked through their words
///   (`LINK_FLAG | next`; the last one's `next` is not read), on no other
///   list.
/// - `left` is `end - next + kept.len`, stored by whoever changes them, for
///   counts on any thread.
#[derive(Debug)]
pub(crate) struct OwnerSlots {
    /// False for a store that holds nothing for its owner: `owner` is then
    /// [`NOBODY`] for good.
    holds: bool,
    owner: AtomicU64,
    run: UnsafeCell<(u32, u32)>,
    cursor: UnsafeCell<(*mut u8, u32)>,
    kept: UnsafeCell<Chain>,
    left: AtomicU32,
}

/// A chain of vacant slots linked through their words: its first and last
/// slots and its length (`NIL`, `NIL`, 0 when empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chain {
    pub(crate) head: u32,
    pub(crate) tail: u32,
    pub(crate) len: u32,
}

impl Chain {
    pub(crate) const EMPTY: Chain = Chain { head: NIL, tail: NIL, len: 0 };

    /// This chain, then `rest`: `link(tail, head)` links this chain's last
    /// slot to the first of `rest`.
    pub(crate) fn then(self, rest: Chain, link: impl FnOnce(u32, u32)) -> Chain {
        if self.len == 0 {
            return rest;
        }
        if rest.len == 0 {
            return self;
        }
        link(self.tail, rest.head);
        Chain { head: self.head, tail: rest.tail, len: self.len + rest.len }
    }
}

impl OwnerSlots {
    /// Nothing held yet, for the calling thread, or for no thread at all if
    /// not `holds` (see the module docs).
    pub(crate) fn new(holds: bool) -> Self {
        OwnerSlots {
            holds,
            owner: AtomicU64::new(if holds { thread_token() } else { NOBODY }),
            run: UnsafeCell::new((0, 0)),
            cursor: UnsafeCell::new((std::ptr::null_mut(), 0)),
            kept: UnsafeCell::new(Chain::EMPTY),
            left: AtomicU32::new(0),
        }
    }

    /// True if slots are held for an owner at all (see the module docs).
    #[inline]
    pub(crate) fn holds(&self) -> bool {
        self.holds
    }

    /// True if the calling thread is the owner.
    #[inline]
    pub(crate) fn is_owner(&self) -> bool {
        self.owner.load(Ordering::Relaxed) == thread_token()
    }

    /// Slots held for the owner, in the run and the kept chain (not objects).
    #[inline]
    pub(crate) fn left(&self) -> u32 {
        self.left.load(Ordering::Relaxed)
    }

    /// Adds `added - removed` to `left`, which only the owner thread or a
    /// holder of `&mut ObjectManager` stores (type invariants): a load and
    /// a store, no read-modify-write.
    #[inline]
    fn adjust_left(&self, added: u32, removed: u32) {
        self.left.store(self.left.load(Ordering::Relaxed) + added - removed, Ordering::Relaxed);
    }

    /// Fresh slots in the run alone.
    ///
    /// # Safety
    ///
    /// The calling thread is the owner ([`is_owner`](Self::is_owner)), or
    /// holds `&mut ObjectManager` (the type's first invariant).
    #[inline]
    pub(crate) unsafe fn run_left(&self) -> u32 {
        // SAFETY: the caller's contract, and it only reads.
        self.run.with(|run| unsafe { (*run).1 - (*run).0 })
    }

    /// The next slot of the run and its address, if it has one. Only the
    /// owner calls it.
    ///
    /// Inside a chunk the address is the last one plus `stride` (a slot's
    /// size): finding it from the index costs a dozen instructions, which a
    /// level load paid on every `create`. On entering a chunk,
    /// `chunk_run(next, end)` gives slot `next`'s address and how many slots
    /// of `next..end` lie contiguously from it (at least one), as
    /// `Store::chunk_run` does.
    ///
    /// # Safety
    ///
    /// The calling thread is the owner ([`is_owner`](Self::is_owner)).
    #[inline]
    pub(crate) unsafe fn take(
        &self,
        stride: usize,
        chunk_run: impl FnOnce(u32, u32) -> (NonNull<u8>, u32),
    ) -> Option<(u32, NonNull<u8>)> {
        debug_assert!(self.is_owner());
        // SAFETY: only the owner thread reaches here (the caller's contract),
        // and it runs nothing else while it holds the pointers (type
        // invariants; `chunk_run` only computes an address).
        self.run.with_mut(|run| unsafe {
            let (next, end) = *run;
            if next == end {
                return None;
            }
            let slot = self.cursor.with_mut(|cursor| {
                let (mut at, mut in_chunk) = *cursor;
                if in_chunk == 0 {
                    let (first, contiguous) = chunk_run(next, end);
                    debug_assert!(contiguous > 0, "a chunk run holds slot `next`");
                    (at, in_chunk) = (first.as_ptr(), contiguous);
                }
                let slot = at;
                in_chunk -= 1;
                if in_chunk > 0 {
                    // SAFETY: `in_chunk` more slots lie contiguously from
                    // `slot` (invariant), so the next one is in the same allocation.
                    at = at.add(stride);
                }
                *cursor = (at, in_chunk);
                slot
            });
            *run = (next + 1, end);
            self.adjust_left(0, 1);
            // SAFETY: a slot's address (invariant), never null.
            Some((next, NonNull::new_unchecked(slot)))
        })
    }

    /// Makes `start..end` the run. Only the owner calls it, with an empty run.
    ///
    /// # Safety
    ///
    /// As for [`run_left`](Self::run_left).
    #[inline]
    pub(crate) unsafe fn refill(&self, start: u32, end: u32) {
        debug_assert!(self.is_owner() && start < end);
        // SAFETY: as in `take`.
        self.run.with_mut(|run| unsafe {
            debug_assert!((*run).0 == (*run).1, "only an empty run is refilled");
            *run = (start, end);
        });
        // SAFETY: as in `take`.
        debug_assert!(self.cursor.with(|cursor| unsafe { (*cursor).1 }) == 0, "an empty run's cursor is used up");
        self.adjust_left(end - start, 0);
    }

    /// The first slot of the kept chain, if it has one, with what `read`
    /// found there. `read` loads a kept slot's link (and may return its
    /// address with it); it is called on every slot taken, the last one too,
    /// whose link is not used.
    ///
    /// # Safety
    ///
    /// As for [`take`](Self::take).
    #[inline]
    pub(crate) unsafe fn take_kept<R>(&self, read: impl FnOnce(u32) -> (u32, R)) -> Option<(u32, R)> {
        debug_assert!(self.is_owner());
        // SAFETY: as in `take`; `read` only loads a slot's word.
        self.kept.with_mut(|kept| unsafe {
            let Chain { head, tail, len } = *kept;
            if len == 0 {
                return None;
            }
            let (next, found) = read(head);
            *kept = if len == 1 { Chain::EMPTY } else { Chain { head: next, tail, len: len - 1 } };
            self.adjust_left(0, 1);
            Some((head, found))
        })
    }

    /// The kept chain (which a collection adds to, see [`set_kept`](Self::set_kept)).
    ///
    /// # Safety
    ///
    /// As for [`set_kept`](Self::set_kept).
    pub(crate) unsafe fn kept(&self) -> Chain {
        // SAFETY: no owner's `take_kept` runs (caller), and `&mut
        // ObjectManager` reached this thread through a synchronising hand-over.
        self.kept.with(|kept| unsafe { *kept })
    }

    /// Makes `chain` the kept chain and returns the one it replaces.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of the store's manager, so no
    /// `create` through the manager runs on any thread, and `chain` is a
    /// chain of vacant slots on no other list (the type's invariants).
    pub(crate) unsafe fn set_kept(&self, chain: Chain) -> Chain {
        // SAFETY: as in `kept`.
        let old = self.kept.with_mut(|kept| unsafe { std::mem::replace(&mut *kept, chain) });
        self.adjust_left(chain.len, old.len);
        old
    }

    /// Empties the run and the kept chain, returning what they held, and
    /// makes the calling thread the owner if `adopt`.
    ///
    /// # Safety
    ///
    /// As for [`set_kept`](Self::set_kept).
    pub(crate) unsafe fn release(&self, adopt: bool) -> ((u32, u32), Chain) {
        // SAFETY: no owner's `take` or `refill` runs (caller), and `&mut
        // ObjectManager` reached this thread through a synchronising hand-over.
        let held = self.run.with_mut(|run| unsafe { std::mem::take(&mut *run) });
        // SAFETY: as above.
        self.cursor.with_mut(|cursor| unsafe { *cursor = (std::ptr::null_mut(), 0) });
        // SAFETY: as above.
        let kept = unsafe { self.set_kept(Chain::EMPTY) };
        self.left.store(0, Ordering::Relaxed);
        if adopt && self.holds {
            self.owner.store(thread_token(), Ordering::Relaxed);
        }
        (held, kept)
    }
}

// `run`, `cursor` and `kept` are only touched by the owner thread or under
// `&mut ObjectManager` (type invariants), and the rest is atomic.
// SAFETY: no type parameter, so no bound: it holds only slot indices and a
// slot's address (no `Rc`, no value), and its cells are never touched by two
// threads at once.
unsafe impl Sync for OwnerSlots {}
// SAFETY: no type parameter, so no bound. Only the cursor's pointer keeps
// the type from being `Send` on its own; it points into the store's
// segments, which belong to no thread.
unsafe impl Send for OwnerSlots {}
