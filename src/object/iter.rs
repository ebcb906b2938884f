//! Iterators over the live objects of one type: [`Iter`] and [`IterMut`].
//!
//! Both walk the store a run of contiguous slots at a time (a segment's chunk,
//! see `layout.rs`), up to the slots used when they were made, so an object
//! created during the iteration is never yielded (the store gives new objects
//! fresh slots while an iterator is alive; see `store.rs`). Keys come from the
//! run's first index plus the offset, so a step is a generation load, a count
//! load and an add.

use std::iter::FusedIterator;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::sync::Ordering;

use super::layout::{segment_first, segment_len, Chunks, MAX_SEGMENTS};
use super::slot::Slot;
use super::store::Store;
use super::{MMObject, ObjectKey, WeakHandle};

/// The walk over one store's used slots, shared by [`Iter`] and [`IterMut`].
///
/// The fields a step reads sit apart from [`Runs`], which the cold move to
/// the next run takes and returns by value: no reference to the cursor
/// leaves the loop, so its fields can live in registers while the loop body
/// writes through the `&mut T` it was given (−33 % on O7's `iter_mut`).
///
/// # Invariants
///
/// - While `offset < len`, `base` points to a run of `len` contiguous slots
///   of the published segment `runs.segment` of `store`, starting at segment
///   offset `runs.run_start`; its slot `offset` has manager-wide index
///   `first_index + offset`.
/// - With a store, the cursor counted itself in the store's `iterating`
///   (`begin_iteration`) and uncounts itself when dropped. Without one it is
///   at its end from the start.
struct Cursor<'a, T> {
    /// `None` for a type with no store: the cursor is then at its end.
    store: Option<&'a Store<T>>,
    base: NonNull<Slot<T>>,
    offset: u32,
    len: u32,
    first_index: u32,
    /// Live objects when the cursor began (see `Iter`'s `len`).
    total: usize,
    /// Objects yielded so far.
    yielded: usize,
    manager: u32,
    /// The manager has an owner thread, so slots' `reserve` words may say
    /// [`PENDING`](super::owner_counts::PENDING).
    owned: bool,
    /// On the manager's owner thread: skips objects that only the owner's
    /// reservation counts (dead, as `total` counts them).
    owner_here: bool,
    runs: Runs,
}

/// Where a [`Cursor`]'s runs come from: the segment walked and the run's
/// place in it.
///
/// # Invariants
///
/// `segment_end` (the slots of the segment to walk) never passes the
/// segment's length; `segment` is `MAX_SEGMENTS` once the walk ended.
#[derive(Clone, Copy)]
struct Runs {
    segment: usize,
    segment_base: NonNull<u8>,
    segment_end: u32,
    run_start: u32,
    /// One past the last local index to visit: the slots used at the start.
    end: u32,
}

// A cursor is a shared borrow of the store plus a position: `base` points into
// the store's segment, which the borrow keeps alive, and the cursor only reads
// atomics through it.
// SAFETY: `T: Send + Sync`, the bounds under which `&Store<T>` crosses threads.
unsafe impl<T: Send + Sync> Send for Cursor<'_, T> {}
// SAFETY: as for `Send`; `&Cursor` allows no access at all beyond `&Store<T>`'s.
unsafe impl<T: Send + Sync> Sync for Cursor<'_, T> {}

impl<'a, T: MMObject> Cursor<'a, T> {
    #[inline]
    fn new(store: Option<&'a Store<T>>, manager: u32) -> Self {
        if let Some(store) = store {
            store.begin_iteration();
        }
        let owned = store.is_some_and(Store::has_owner);
        let owner_here = store.is_some_and(Store::reads_reservations_here);
        Cursor {
            store,
            base: NonNull::dangling(),
            offset: 0,
            len: 0,
            first_index: 0,
            runs: Runs {
                segment: usize::MAX,
                segment_base: NonNull::dangling(),
                segment_end: 0,
                run_start: 0,
                end: store.map_or(0, Store::used),
            },
            // As the walk will see them: on another thread than the owner, an
            // object whose count is all the owner's reservation is yielded.
            total: store.map_or(0, |store| store.live_count_read(owner_here)),
            yielded: 0,
            manager,
            owned,
            owner_here,
        }
    }

    /// The next live slot, with its weak handle.
    #[inline]
    fn next_live(&mut self) -> Option<(WeakHandle<T>, &'a Slot<T>)> {
        loop {
            while self.offset < self.len {
                let offset = self.offset;
                self.offset += 1;
                // SAFETY: `offset < len`, so the slot lies in the published
                // segment `base` points to (type invariant), which lives as
                // long as the store.
                let slot_ptr = unsafe { self.base.add(offset as usize) };
                // SAFETY: as above: an initialised slot of a live segment.
                let slot = unsafe { slot_ptr.as_ref() };
                // Live: an odd generation, then a count (see `SlotHeader::is_live`).
                let generation = slot.header.generation(Ordering::Acquire);
                if generation & 1 == 0 || !slot.header.is_referenced(self.owned, self.owner_here) {
                    continue;
                }
                self.yielded += 1;
                let key = ObjectKey::new(self.first_index + offset, generation);
                // SAFETY: `slot_ptr` is slot `key.index()` of the manager's
                // store, from the segment's base (type invariant).
                return Some((unsafe { WeakHandle::new(slot_ptr, key, self.manager) }, slot));
            }
            if !self.next_run() {
                return None;
            }
        }
    }

    /// Folds `f` over the live slots left, a segment at a time with the walk
    /// in locals (what `Iterator::fold`, `for_each`, `sum` and `count` use).
    #[inline]
    fn fold_live<B>(&mut self, init: B, mut f: impl FnMut(B, WeakHandle<T>, &'a Slot<T>) -> B) -> B {
        let mut acc = init;
        loop {
            let (base, len, first_index, owned, owner_here) =
                (self.base, self.len, self.first_index, self.owned, self.owner_here);
            let mut offset = self.offset;
            let mut yielded = 0;
            while offset < len {
                // SAFETY: as in `next_live`: `offset < len`, inside the
                // published segment `base` points to.
                let slot_ptr = unsafe { base.add(offset as usize) };
                // SAFETY: as above: an initialised slot of a live segment.
                let slot = unsafe { slot_ptr.as_ref() };
                let generation = slot.header.generation(Ordering::Acquire);
                if generation & 1 == 1 && slot.header.is_referenced(owned, owner_here) {
                    let key = ObjectKey::new(first_index + offset, generation);
                    yielded += 1;
                    // SAFETY: as in `next_live`.
                    let weak = unsafe { WeakHandle::new(slot_ptr, key, self.manager) };
                    acc = f(acc, weak, slot);
                }
                offset += 1;
            }
            self.offset = offset;
            self.yielded += yielded;
            if !self.next_run() {
                return acc;
            }
        }
    }

    /// Moves to the next run of slots: the next chunk of this segment, or
    /// the first of the next published segment below `end`; false at the end.
    #[inline]
    fn next_run(&mut self) -> bool {
        // By value: a reference to `runs` would let the cursor's address out
        // of the loop, and keep its fields in memory.
        let (runs, next) = self.runs.next(self.store, self.len, self.first_index);
        self.runs = runs;
        match next {
            Some(Run { base, len, first_index }) => {
                (self.base, self.len, self.first_index, self.offset) = (base, len, first_index, 0);
                true
            }
            None => {
                (self.len, self.offset) = (0, 0);
                false
            }
        }
    }
}

impl Runs {
    /// The runs moved on past the run of `len` slots just walked (whose first
    /// slot has manager-wide index `first_index`), with the next run (`None`
    /// at the end).
    #[cold]
    fn next<T: MMObject>(mut self, store: Option<&Store<T>>, len: u32, mut first_index: u32) -> (Self, Option<Run<T>>) {
        let Some(store) = store.filter(|_| self.segment != MAX_SEGMENTS) else {
            self.segment = MAX_SEGMENTS;
            return (self, None);
        };
        let base_bits = store.base_bits();
        let mut next = self.run_start + len;
        while next >= self.segment_end {
            self.segment = self.segment.wrapping_add(1);
            let first = segment_first(self.segment.min(MAX_SEGMENTS - 1), base_bits);
            if self.segment >= MAX_SEGMENTS || first >= self.end {
                self.segment = MAX_SEGMENTS;
                return (self, None);
            }
            if let Some((base, segment_index)) = store.segment(self.segment) {
                self.segment_base = base;
                self.segment_end = segment_len(self.segment, base_bits).min(self.end - first);
                first_index = segment_index;
                self.run_start = 0;
                next = 0;
            }
        }
        // SAFETY: `next < segment_end`, within the published segment at `segment_base`.
        let (run, len) = unsafe { Chunks::<T>::run(self.segment_base, next, self.segment_end) };
        // Keys count from the segment's first slot: move them to the run's.
        first_index += next - self.run_start;
        self.run_start = next;
        (self, Some(Run { base: run, len, first_index }))
    }
}

/// A run of contiguous slots: its first slot, its length, and its first
/// slot's manager-wide index.
struct Run<T> {
    base: NonNull<Slot<T>>,
    len: u32,
    first_index: u32,
}

impl<T> Cursor<'_, T> {
    /// Live objects not yet yielded, as counted at the start.
    fn remaining(&self) -> usize {
        if self.runs.segment == MAX_SEGMENTS {
            0
        } else {
            self.total.saturating_sub(self.yielded)
        }
    }
}

impl<T> Clone for Cursor<'_, T> {
    fn clone(&self) -> Self {
        if let Some(store) = self.store {
            store.begin_iteration();
        }
        Cursor { ..*self }
    }
}

impl<T> Drop for Cursor<'_, T> {
    fn drop(&mut self) {
        if let Some(store) = self.store {
            store.end_iteration();
        }
    }
}

/// Iterator over the live objects of one type, in key order: see
/// [`ObjectManager::iter`](crate::ObjectManager::iter).
///
/// It yields each object live when it is reached, with a weak handle to it.
/// It never yields an object created after the iterator was made, on any
/// thread that saw it made (so creating inside the loop terminates), and it
/// skips objects released before it reaches them.
///
/// [`len`](ExactSizeIterator::len) counts the live objects not yet yielded.
/// It is exact unless another thread creates or releases objects of `T`
/// while the iterator runs (handles are `Send`): then the iterator may end
/// with `len` still above zero, or yield more than `len` said.
pub struct Iter<'a, T> {
    cursor: Cursor<'a, T>,
}

impl<'a, T: MMObject> Iter<'a, T> {
    #[inline]
    pub(crate) fn new(store: Option<&'a Store<T>>, manager: u32) -> Self {
        Iter { cursor: Cursor::new(store, manager) }
    }
}

impl<'a, T: MMObject> Iterator for Iter<'a, T> {
    type Item = (WeakHandle<T>, &'a T);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let (weak, slot) = self.cursor.next_live()?;
        // SAFETY: `next_live` saw the slot live with `Acquire`, so the value
        // is initialised; the iterator borrows the manager shared for `'a`,
        // which keeps collection and `&mut` access away.
        Some((weak, unsafe { Store::value_unchecked(slot) }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.len();
        (n, Some(n))
    }

    #[inline]
    fn fold<B, F: FnMut(B, Self::Item) -> B>(mut self, init: B, mut f: F) -> B {
        // SAFETY: as in `next`.
        self.cursor.fold_live(init, |acc, weak, slot| f(acc, (weak, unsafe { Store::value_unchecked(slot) })))
    }
}

impl<T: MMObject> ExactSizeIterator for Iter<'_, T> {
    fn len(&self) -> usize {
        self.cursor.remaining()
    }
}

impl<T: MMObject> FusedIterator for Iter<'_, T> {}

impl<T> Clone for Iter<'_, T> {
    fn clone(&self) -> Self {
        Iter { cursor: self.cursor.clone() }
    }
}

impl<T> std::fmt::Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let remaining = self.cursor.remaining();
        f.debug_struct("Iter").field("remaining", &remaining).finish()
    }
}

/// Iterator over the live objects of one type, for writing: see
/// [`ObjectManager::iter_mut`](crate::ObjectManager::iter_mut).
///
/// The same walk as [`Iter`], yielding `&mut T`. It borrows the manager (or
/// an [`ObjectViewMut`](crate::ObjectViewMut)) exclusively, so nothing
/// else reads or writes objects of `T` meanwhile; a [`Loader`](crate::Loader)
/// may create some on another thread, and those are never yielded once the
/// iterator has started.
pub struct IterMut<'a, T> {
    cursor: Cursor<'a, T>,
    /// Hands out `&'a mut T`: invariant in `T`, like `std::slice::IterMut`.
    _values: PhantomData<&'a mut T>,
}

impl<'a, T: MMObject> IterMut<'a, T> {
    /// # Safety
    ///
    /// The caller gives the iterator exclusive access to the values of
    /// `store` for `'a` (it holds `&'a mut ObjectManager`, or a view that
    /// stands for it).
    #[inline]
    pub(crate) unsafe fn new(store: Option<&'a Store<T>>, manager: u32) -> Self {
        IterMut { cursor: Cursor::new(store, manager), _values: PhantomData }
    }
}

impl<'a, T: MMObject> Iterator for IterMut<'a, T> {
    type Item = (WeakHandle<T>, &'a mut T);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let (weak, slot) = self.cursor.next_live()?;
        // SAFETY: `next_live` saw the slot live with `Acquire`, so the value
        // is initialised; the iterator has exclusive access to the store's
        // values for `'a` (constructor), and yields each slot once.
        Some((weak, unsafe { slot.value_mut() }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.len();
        (n, Some(n))
    }

    #[inline]
    fn fold<B, F: FnMut(B, Self::Item) -> B>(mut self, init: B, mut f: F) -> B {
        // SAFETY: as in `next`; the walk visits each slot once.
        self.cursor.fold_live(init, |acc, weak, slot| f(acc, (weak, unsafe { slot.value_mut() })))
    }
}

impl<T: MMObject> ExactSizeIterator for IterMut<'_, T> {
    fn len(&self) -> usize {
        self.cursor.remaining()
    }
}

impl<T: MMObject> FusedIterator for IterMut<'_, T> {}

impl<T> std::fmt::Debug for IterMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let remaining = self.cursor.remaining();
        f.debug_struct("IterMut").field("remaining", &remaining).finish()
    }
}
