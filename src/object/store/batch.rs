//! Many objects of one type at once.
//!
//! [`ObjectManager::create_many`] and [`Loader::create_many`] (a level
//! load): the creation site is numbered once, and never-used slots are
//! taken from `len` a run at a time, then filled by stepping through each
//! chunk, instead of one compare-exchange (or one owner's-run step) per
//! object.
//!
//! [`ObjectManager::release_many`] (an unload): under `&mut ObjectManager`,
//! the objects the handles alone hold are given up with a plain load each
//! and destroyed at once, through collection's per-object step (see
//! `implementation.rs`).
//!
//! [`ObjectManager::create_many`]: crate::ObjectManager::create_many
//! [`Loader::create_many`]: crate::Loader::create_many
//! [`ObjectManager::release_many`]: crate::ObjectManager::release_many

use std::panic::Location;
use std::ptr::NonNull;

use crate::sync::Ordering;
use crate::Error;

use super::super::handle::ManagerTagged;
use super::super::layout::{locate, segment_len, Chunks};
use super::super::owner_slots::Chain;
use super::super::shared::DEAD_LANES;
use super::super::slot::{Slot, LINK_FLAG, NIL};
use super::super::{CollectStats, Destroyed};
use super::super::{Handle, HandleOrigin, MMObject};
use super::collect::Requeue;
use super::{DestroyHook, SlotSource, Store};

/// The most never-used slots one step of a batch takes from `len`.
const MAX_TAKE: u32 = 1 << 12;

/// Never-used slots a batch took from `len` and has not filled yet; what is
/// left when it drops (an iterator that yielded fewer values than its
/// `size_hint` promised, or panicked) goes back (see [`Store::give_back`]).
///
/// # Invariants
///
/// - `next..end` are local indices below the store's `len`, in one
///   published segment, whose slots are vacant, never used and on no list,
///   known to no other thread. (Until they are filled or given back, the
///   store's counts take them for objects: a report made meanwhile on
///   another thread counts at most [`MAX_TAKE`] too many.)
/// - `slot` is slot `next` (with its segment's provenance) while
///   `in_chunk > 0`, and `in_chunk` slots lie contiguously from it.
struct Taken<'s, T: MMObject> {
    store: &'s Store<T>,
    /// Whether the rest may refill the owner's run (a batch through the
    /// manager on its owner thread; never a loader's, which may run inside
    /// a collection). True only on the owner thread: a `Taken` is made and
    /// dropped on one thread (it is not `Send`).
    owner: bool,
    next: u32,
    end: u32,
    slot: NonNull<Slot<T>>,
    in_chunk: u32,
}

impl<T: MMObject> Taken<'_, T> {
    /// The next never-used slot, taking a run of up to `want()` more from
    /// `len` (growing the store) when the last one is used up.
    #[inline]
    fn next_slot(&mut self, want: impl FnOnce() -> usize) -> Result<NonNull<Slot<T>>, Error> {
        if self.next == self.end {
            let want = want().clamp(1, MAX_TAKE as usize) as u32;
            let (start, end) = self.store.raise_len(want, true)?.expect("a grown segment has room");
            (self.next, self.end, self.in_chunk) = (start, end, 0);
        }
        if self.in_chunk == 0 {
            (self.slot, self.in_chunk) = self.store.chunk_run(self.next, self.end);
        }
        let slot = self.slot;
        self.next += 1;
        self.in_chunk -= 1;
        if self.in_chunk > 0 {
            // SAFETY: `in_chunk` more slots lie contiguously from `slot`
            // (invariant), so the next one is in the same allocation.
            self.slot = unsafe { slot.add(1) };
        }
        Ok(slot)
    }
}

impl<T: MMObject> Drop for Taken<'_, T> {
    fn drop(&mut self) {
        if self.next < self.end {
            // SAFETY: `owner` is true only on the owner thread (the field).
            unsafe { self.store.give_back(self.next, self.end, self.owner) };
        }
    }
}

impl<T: MMObject> Store<T> {
    /// Creates an object from each of `values`, in order, pushing its handle
    /// onto `handles`, all created at `site`; on the first error, returns the
    /// value it refused (the objects made before it keep their handles in
    /// `handles`, the values after it stay in the iterator).
    ///
    /// Each object takes the path `create` would: with a tracker, or while an
    /// iterator runs, [`try_insert`](Self::try_insert)'s general path; else a
    /// free slot (for a loader, from its thread's shard or the free list, as
    /// its `create` takes one), or a never-used one from the batch's run.
    pub(crate) fn insert_many(
        &self,
        mut values: impl Iterator<Item = T>,
        site: &'static Location<'static>,
        strict: bool,
        source: SlotSource,
        handles: &mut Vec<Handle<T>>,
    ) -> Result<(), (T, Error)> {
        let site_number = self.sites.number(site);
        // The owner changes only under `&mut ObjectManager`, never during a
        // batch through the manager. A loader's batch never takes the owner's
        // slots: it may run inside the owner's collection.
        let owner = source == SlotSource::Manager && self.owner_slots.is_owner();
        let mut taken = Taken { store: self, owner, next: 0, end: 0, slot: NonNull::dangling(), in_chunk: 0 };
        while let Some(value) = values.next() {
            let slot = if self.tracking.is_none() && self.iterating.load(Ordering::Relaxed) == 0 {
                let reused = match source {
                    // SAFETY: `owner` is whether this thread is the owner.
                    SlotSource::Manager => unsafe { self.pop_reused(owner) },
                    SlotSource::Loader => self.pop_for_loader(),
                };
                match reused {
                    // SAFETY: a `VacantSlot` is a slot of this store's published
                    // segment that this thread took (its invariants).
                    Some(vacant) => unsafe { self.place_at(vacant.slot, value, site_number) },
                    // The hint only sizes the next run: a wrong one wastes or
                    // costs a step, never a slot (`Taken` gives the rest back).
                    None => match taken.next_slot(|| values.size_hint().0.saturating_add(1)) {
                        // SAFETY: a never-used slot of a published segment of
                        // this store, taken from `len` for this batch alone.
                        Ok(slot) => unsafe { self.place_at(slot, value, site_number) },
                        Err(error) => return Err((value, error)),
                    },
                }
            } else {
                self.try_insert(value, site, strict, source)?
            };
            // SAFETY: `place_at` and `try_insert` return an occupied slot of
            // this store (a published segment's) with a count of one, which
            // the new handle takes over; `tag` is this store's.
            handles.push(unsafe { Handle::from_counted_tagged(slot, self.tag, HandleOrigin::Created, site) });
        }
        Ok(())
    }

    /// Drops `handles`, destroying at once the objects whose only reference
    /// they held (as a collection would, recording events in `events`), with
    /// no atomic read-modify-write per handle; other handles (shared objects,
    /// another manager's, types whose objects may hold handles) drop as
    /// usual. Returns what it destroyed.
    ///
    /// If a value's `Drop`, `size()` or the destroy hook panics, that object
    /// is destroyed all the same, the panic propagates, and the handles not
    /// reached yet drop as usual during the unwind.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager.
    pub(crate) unsafe fn release_many(
        &self,
        handles: impl Iterator<Item = Handle<T>>,
        mut events: Option<&mut Vec<Destroyed>>,
    ) -> CollectStats {
        self.note_peak();
        let mut hook = self.on_destroy.lock();
        let mut requeue = Requeue::new(self, [NIL; DEAD_LANES]);
        let owner_here = self.reads_reservations_here();
        let mut bytes = 0;
        // Unswitched as a collection's walk is (see `Store::collect`).
        if self.destroys_plainly(&hook, &events) {
            // SAFETY: the caller's contract; none of the three is there.
            unsafe { self.release_each::<true>(handles, owner_here, &mut requeue, &mut hook, &mut events, &mut bytes) };
        } else {
            // SAFETY: the caller's contract.
            unsafe {
                self.release_each::<false>(handles, owner_here, &mut requeue, &mut hook, &mut events, &mut bytes)
            };
        }
        // Each step counts its object in `destroyed`.
        let objects = requeue.freed.destroyed as usize;
        CollectStats { objects, bytes, rounds: usize::from(objects > 0) }
    }

    /// The loop of [`release_many`](Self::release_many) over `handles`.
    /// `PLAIN`: there is no hook, no events and no tracker.
    ///
    /// # Safety
    ///
    /// As for `release_many`, and with `PLAIN`, `hook` and `events` are
    /// `None` and the store has no tracker.
    #[inline(always)]
    unsafe fn release_each<const PLAIN: bool>(
        &self,
        handles: impl Iterator<Item = Handle<T>>,
        owner_here: bool,
        requeue: &mut Requeue<'_, T>,
        hook: &mut Option<DestroyHook<T>>,
        events: &mut Option<&mut Vec<Destroyed>>,
        bytes: &mut usize,
    ) {
        for handle in handles {
            if !handle.belongs_to(self.config.manager_id) {
                drop(handle);
                continue;
            }
            if owner_here {
                // An object the owner holds a lease on (renewed by a
                // collection) whose only handle this is: the lease goes first.
                handle.slot().header.yield_to_sole_handle();
            }
            // SAFETY: the caller holds `&mut ObjectManager` of the handle's
            // manager (this store's); the object is destroyed below.
            if let Ok(slot) = unsafe { handle.release_last() } {
                // SAFETY: a handle's slot lies in a published segment of its
                // store, which lives as long as the store.
                let (local, slot) = unsafe { (Chunks::local(slot), slot.as_ref()) };
                // Dead from here, as on the dead list: the word holds no count.
                slot.header.word.store(LINK_FLAG | NIL, Ordering::Relaxed);
                // SAFETY: the object is dead (its last reference was the
                // handle just given up) and on no list; the caller holds
                // `&mut ObjectManager` (and the caller's `PLAIN` contract).
                unsafe { self.destroy_dead::<PLAIN>(local, slot, requeue, hook, events.as_deref_mut(), bytes) };
            }
        }
    }

    /// The slots from `local` to the end of its chunk (or `end`, if sooner):
    /// the first, and how many.
    ///
    /// `local..end` lies in one published segment, as a run from
    /// `raise_len` does (checked: a run that does not is a bug, and panics).
    /// Out of line: it runs once a chunk, for batches and for the owner's run.
    #[inline(never)]
    pub(super) fn chunk_run(&self, local: u32, end: u32) -> (NonNull<Slot<T>>, u32) {
        let (segment, offset) = locate(local, self.config.base_bits);
        let base = NonNull::new(self.segments[segment].load(Ordering::Acquire)).expect("taken slots are published");
        let run_end = end.checked_sub(local).and_then(|len| offset.checked_add(len));
        let in_segment = run_end.is_some_and(|run_end| run_end <= segment_len(segment, self.config.base_bits));
        assert!(local < end && in_segment, "the run {local}..{end} lies in one segment");
        // SAFETY: the segment is published, so it holds `segment_len` slots,
        // and `offset < offset + (end - local) <=` that (just checked).
        unsafe { Chunks::run(base, offset, offset + (end - local)) }
    }

    /// Takes back never-used slots `start..end` a batch did not fill (an
    /// iterator that yielded less than its `size_hint`, or panicked, as a
    /// level file found corrupt halfway does): as the owner's run of fresh
    /// slots if `owner` (a batch through the manager on its owner thread)
    /// and that run is empty, else onto the store's
    /// stack of returned slots, which the next collection puts on the free
    /// list. (Not onto the free list at once: only collection pushes there,
    /// which the free list's lock-free pops rely on.) Until then the counts
    /// leave them out, as free slots.
    ///
    /// # Safety
    ///
    /// If `owner`, the calling thread is the owner.
    #[cold]
    unsafe fn give_back(&self, start: u32, end: u32, owner: bool) {
        // SAFETY: the caller's contract (for `refill` below too).
        if owner && unsafe { self.owner_slots.run_left() } == 0 {
            // SAFETY: as above.
            unsafe { self.owner_slots.refill(start, end) };
            return;
        }
        for local in start..end - 1 {
            let slot = self.slot(local).expect("taken slots live in published segments");
            slot.header.word.store(LINK_FLAG | (local + 1), Ordering::Relaxed);
        }
        let last = self.slot(end - 1).expect("taken slots live in published segments");
        // Counted first: the collection that takes them subtracts after.
        self.returned.fetch_add(u64::from(end - start), Ordering::Relaxed);
        let mut head = self.returned_head.load(Ordering::Relaxed);
        loop {
            last.header.word.store(LINK_FLAG | head, Ordering::Relaxed);
            // Release: the collection that swaps the stack out sees the links.
            match self.returned_head.compare_exchange_weak(head, start, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(now) => head = now,
            }
        }
    }

    /// Puts the slots batches returned on the free list.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager (no
    /// batch through the manager runs, and collection may push onto the free
    /// list). A loader's batch may run, and push onto the returned stack
    /// meanwhile: the swap below takes the stack whole, so a push lands
    /// either in what it takes or in the next stack.
    pub(crate) unsafe fn free_returned(&self) {
        if self.returned_head.load(Ordering::Relaxed) == NIL {
            return;
        }
        let head = self.returned_head.swap(NIL, Ordering::Acquire);
        // Already linked: the free list takes the chain as it is.
        let mut chain = Chain { head, tail: NIL, len: 0 };
        self.walk_chain(head, |local, _| {
            chain.tail = local;
            chain.len += 1;
        });
        self.push_free_chain(chain);
        self.returned.fetch_sub(u64::from(chain.len), Ordering::Relaxed);
    }
}
