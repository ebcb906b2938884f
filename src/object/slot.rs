//! One object slot: a 16-byte header and the value.

use std::mem::MaybeUninit;

use crate::sync::{self, AtomicU32, Ordering};

use super::owner_counts::{Released, PENDING, RESERVE_COUNT};

/// Set in [`SlotHeader::word`] when the word holds a list link instead of a count.
pub(crate) const LINK_FLAG: u32 = 1 << 31;
/// The end of a dead list or free list.
pub(crate) const NIL: u32 = LINK_FLAG - 1;
/// Set in a count word while the object is a *candidate root* for cycle
/// collection: its count fell and stayed above zero since the cycle
/// collector last looked at it, and its store's candidate buffer names it
/// (see `candidates.rs`). Only stores of types that may hold handles set it.
pub(crate) const PURPLE: u32 = 1 << 30;
/// The count bits of a count word.
pub(crate) const COUNT_MASK: u32 = PURPLE - 1;
/// Clones past this count panic: far above any real use, and far enough
/// below [`PURPLE`] that the racing clones that pass it before one of them
/// undoes its add (one per thread) never carry into the flag.
pub(crate) const MAX_REFS: u32 = 1 << 29;

/// True if `word` is a live count (in `1..=COUNT_MASK`, with or without
/// [`PURPLE`]): neither 0 nor a link. Masking the flag and one wrapping
/// subtract and compare tell them apart (a link keeps its [`LINK_FLAG`]).
#[inline]
pub(crate) fn is_count(word: u32) -> bool {
    (word & !PURPLE).wrapping_sub(1) < LINK_FLAG - 1
}
/// Generations stay below this, so keys work with `slotmap::SecondaryMap`
/// (which takes versions at or above 2^31 for older than an empty slot). A
/// slot whose next occupied generation would reach it is *retired*: it keeps
/// this (even, vacant) generation, which no key carries, and is never reused.
/// So a stale key can never validate again, however often a slot is reused.
pub(crate) const GENERATION_LIMIT: u32 = 1 << 31;
/// Set in an occupied slot's `generation` by whoever takes the object's
/// count to zero (see [`SlotHeader::mark_dead`]): the generation then
/// matches no key, so a weak read tells a dead object from a live one with
/// the one load it makes anyway (the word's load was a second one on every
/// read, see `BENCHMARKS.md`, O4). It never appears on an even (vacant)
/// generation: [`GENERATION_LIMIT`] is the same bit, alone.
pub(crate) const DEAD_MARK: u32 = 1 << 31;

/// The generation in a `generation` word, without [`DEAD_MARK`]: the bit
/// is cleared from odd (occupied) values only, so a retired slot's
/// [`GENERATION_LIMIT`] stays as it is.
#[inline]
pub(crate) fn unmarked(generation: u32) -> u32 {
    generation & !((generation & 1) * DEAD_MARK)
}

/// The per-object metadata in the slot: 16 bytes, aligned to 8 so that slot
/// addresses leave three low bits free for a [`Handle`](super::Handle)'s tag
/// (see its layout).
///
/// # Invariants
///
/// - `generation` is even while the slot is vacant and odd while it is occupied.
///   It only ever grows, and never past [`GENERATION_LIMIT`] (a retired slot);
///   vacant → occupied happens in `create`
///   (`&ObjectManager`), occupied → vacant only in collection or shutdown
///   (`&mut ObjectManager`).
/// - While occupied, `generation` carries [`DEAD_MARK`] exactly once the
///   object's count has reached zero: the thread that took it there stores
///   the mark (with no other write to `generation` possible until
///   collection, which its push onto a dead list happens before), and the
///   count never rises from zero. Readers that need the generation itself
///   (keys, the next generation) take it through [`unmarked`]. The word
///   may read zero a moment before the mark is seen: a weak read then still
///   finds the object alive, as it would have a moment earlier (the value
///   stays initialised until collection, which needs `&mut ObjectManager`).
/// - `word`, while the slot is occupied and referenced, is the strong count
///   (no [`LINK_FLAG`]), with [`PURPLE`] set while the object is a candidate
///   root. The count includes the owner thread's reservation, `reserve`'s
///   count bits (see `owner_counts.rs`): so handles number `count -
///   reservation`. It is 0 only between the last release (a drop, or the
///   owner's give-back of its reservation) and the slot's push onto its
///   store's dead list (while it waits in a ring of last drops, see
///   `last_drops.rs`); then only the ring's drainer writes it. Once the slot is on the dead list, or vacant on
///   the free list, it is `LINK_FLAG | next`, where `next` is the local index of
///   the next slot in that list (or [`NIL`]).
/// - `reserve` is written only by the manager's owner thread (loads and
///   stores, never a read-modify-write), or with no handle to the object
///   left (collection, shutdown, a vacant slot): its count bits never exceed
///   the word's, and are 0 while the slot is vacant. It holds a count of at
///   most `RESERVE_MAX` and the flags `PENDING`, `LEASED` and `USED`, no
///   other bit (see `owner_counts.rs`).
/// - `site` is the number of the object's creation site in its store's
///   table (`creation_sites.rs`), written before the generation is
///   published, like the value.
#[repr(C, align(8))]
pub(crate) struct SlotHeader {
    pub(crate) word: AtomicU32,
    pub(crate) generation: AtomicU32,
    pub(crate) reserve: AtomicU32,
    pub(crate) site: AtomicU32,
}

/// A slot: the header, then the value, initialised exactly while the generation is odd.
#[repr(C)]
pub(crate) struct Slot<T> {
    pub(crate) header: SlotHeader,
    value: sync::UnsafeCell<MaybeUninit<T>>,
}

impl<T> Slot<T> {
    /// The empty value cell, for a new segment (only loom's cell has state to set up).
    #[cfg(loom)]
    pub(crate) fn empty_value() -> sync::UnsafeCell<MaybeUninit<T>> {
        sync::UnsafeCell::new(MaybeUninit::uninit())
    }

    /// Where a new segment's value cell goes, to set it up in place.
    ///
    /// # Safety
    ///
    /// `slot` points to a slot of a segment's allocation.
    #[cfg(loom)]
    pub(crate) unsafe fn value_ptr(slot: *mut Self) -> *mut sync::UnsafeCell<MaybeUninit<T>> {
        // SAFETY: only computes the field's address, inside the slot the
        // caller's pointer is to.
        unsafe { std::ptr::addr_of_mut!((*slot).value) }
    }

    /// The value, for reading, for as long as the caller chooses (`'v`).
    ///
    /// # Safety
    ///
    /// The value is initialised (the generation was read odd with `Acquire`),
    /// and the slot's memory stays, and nothing writes or drops the value,
    /// for `'v`.
    #[inline]
    pub(crate) unsafe fn value_ref<'v>(&self) -> &'v T {
        // SAFETY: initialised and not written meanwhile (caller).
        self.value.with(|value| unsafe { (*value).assume_init_ref() })
    }

    /// The value, for writing, for as long as the caller chooses (`'v`).
    ///
    /// # Safety
    ///
    /// The value is initialised, the slot's memory stays for `'v`, and
    /// nothing else reads, writes or drops the value for `'v` (the caller
    /// holds the exclusive access).
    #[inline]
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn value_mut<'v>(&self) -> &'v mut T {
        // SAFETY: initialised and exclusively ours (caller).
        self.value.with_mut(|value| unsafe { (*value).assume_init_mut() })
    }

    /// Moves `value` in.
    ///
    /// # Safety
    ///
    /// The slot is vacant and owned by this thread until it publishes the
    /// generation (a value already there would be leaked).
    #[inline]
    pub(crate) unsafe fn write_value(&self, value: T) {
        // SAFETY: nobody else touches a vacant slot this thread owns (caller).
        self.value.with_mut(|cell| unsafe {
            (*cell).write(value);
        });
    }

    /// Drops the value in place.
    ///
    /// # Safety
    ///
    /// The value is initialised, nothing else uses it, and the slot is
    /// already marked vacant so nothing drops it again.
    #[inline]
    pub(crate) unsafe fn drop_value(&self) {
        // SAFETY: initialised, exclusively ours, dropped once (caller).
        self.value.with_mut(|value| unsafe { (*value).assume_init_drop() });
    }
}

/// What a slot holds, read through its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Never used, or on the free list.
    Vacant,
    /// Occupied with the given strong count (> 0).
    Live(u32),
    /// Occupied, but released: waiting for collection.
    Dead,
}

impl SlotHeader {
    pub(crate) fn vacant(generation: u32) -> Self {
        debug_assert!(generation & 1 == 0, "a vacant generation is even");
        SlotHeader {
            word: AtomicU32::new(LINK_FLAG | NIL),
            generation: AtomicU32::new(generation),
            reserve: AtomicU32::new(0),
            site: AtomicU32::new(0),
        }
    }

    /// Reads the slot's state. `Acquire` on the generation pairs with the
    /// `Release` store that publishes a new object in `create`.
    ///
    /// An object whose count is all the owner thread's reservation has no
    /// handle left: it is dead, waiting for the check that collection makes
    /// (exact on the owner thread; on others the reservation is read as it
    /// stands, which may be behind, see `owner_counts.rs`).
    pub(crate) fn state(&self) -> SlotState {
        if self.generation.load(Ordering::Acquire) & 1 == 0 {
            return SlotState::Vacant;
        }
        let word = self.word.load(Ordering::Acquire);
        if !is_count(word) {
            return SlotState::Dead;
        }
        let reserve = self.reserve.load(Ordering::Relaxed);
        match (word & COUNT_MASK).saturating_sub(reserve & RESERVE_COUNT) {
            n if n > 0 && reserve & PENDING == 0 => SlotState::Live(n),
            _ => SlotState::Dead,
        }
    }

    /// True if the slot is occupied by the object with this generation, it
    /// is referenced, and its owner thread has not seen its last handle go.
    ///
    /// See [`is_count`] for the word's test. (Only the owner thread can tell
    /// an object whose count is all its reservation from a live one; other
    /// threads see it live until collection, see `owner_counts.rs`.)
    #[inline]
    pub(crate) fn is_live(&self, generation: u32) -> bool {
        self.is_live_in(generation, true)
    }

    /// [`is_live`](Self::is_live) for a store whose manager has an owner
    /// thread (`owned`) or not. Without an owner the generation alone
    /// answers ([`DEAD_MARK`] makes a dead object's differ from every
    /// key's), so neither the word nor the reservation is loaded: in a loop
    /// of weak reads that miss the cache, every load of the read costs (see
    /// `BENCHMARKS.md`, O4). With one, an object whose count is all the
    /// owner's reservation, or [`PENDING`], has no handle left but no mark
    /// either (its count is not zero), so both are read too.
    #[inline]
    pub(crate) fn is_live_in(&self, generation: u32, owned: bool) -> bool {
        self.generation.load(Ordering::Acquire) == generation
            && (!owned
                || is_count(self.word.load(Ordering::Acquire)) && self.reserve.load(Ordering::Relaxed) & PENDING == 0)
    }

    /// The slot's generation without [`DEAD_MARK`] (see [`unmarked`]).
    #[inline]
    pub(crate) fn generation(&self, order: Ordering) -> u32 {
        unmarked(self.generation.load(order))
    }

    /// Stores [`DEAD_MARK`] in the generation: the caller just took the
    /// object's count to zero (the header's invariants). A plain store: no
    /// other thread writes `generation` until collection, which happens
    /// after the caller's push onto a dead list. A vacant generation stays
    /// as it is: shutdown destroyed the object in place, and the last of
    /// its outliving handles went since (no key matches it either way).
    #[inline]
    pub(crate) fn mark_dead(&self) {
        let generation = self.generation.load(Ordering::Relaxed);
        self.generation.store(generation | ((generation & 1) * DEAD_MARK), Ordering::Relaxed);
    }

    /// [`mark_dead`](Self::mark_dead) through a pointer to the header's
    /// word (its first field).
    ///
    /// # Safety
    ///
    /// `word` points to the `word` of an initialised `SlotHeader`, with
    /// provenance over the whole header (a slot's or its segment's, not a
    /// reference to the word alone).
    #[inline]
    pub(crate) unsafe fn mark_dead_at(word: std::ptr::NonNull<AtomicU32>) {
        // SAFETY: `word` is the first field of a `repr(C)` header that is
        // initialised and reachable through its provenance (caller).
        unsafe { word.cast::<SlotHeader>().as_ref() }.mark_dead();
    }

    /// The second half of [`is_live`](Self::is_live), for a generation
    /// already read odd: a count, and not [`PENDING`]. On the manager's owner
    /// thread (`owner_here`) also not a count that is all the owner's
    /// reservation: its last handle went on another thread, and the check
    /// queued for it will find it dead (so `dead_count` counts it dead).
    ///
    /// `owned`: the manager has an owner thread (`owner_here` implies it).
    /// Without one, `reserve` stays 0 and is not read: an iterator's step
    /// is then one load and one test fewer.
    #[inline]
    pub(crate) fn is_referenced(&self, owned: bool, owner_here: bool) -> bool {
        let word = self.word.load(Ordering::Acquire);
        if !owned {
            return is_count(word);
        }
        let reserve = self.reserve.load(Ordering::Relaxed);
        is_count(word) && reserve & PENDING == 0 && !(owner_here && word & COUNT_MASK == reserve & RESERVE_COUNT)
    }

    /// Adds a reference if the object with `generation` is live: the count only
    /// rises from a non-zero value, so a dead object is never revived; nor
    /// is one whose owner thread saw its last handle go ([`PENDING`]).
    pub(crate) fn try_add_ref(&self, generation: u32) -> Result<(), AddRefError> {
        if self.generation.load(Ordering::Acquire) != generation || self.reserve.load(Ordering::Relaxed) & PENDING != 0
        {
            return Err(AddRefError::Stale);
        }
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if !is_count(word) {
                return Err(AddRefError::Stale);
            }
            if word & COUNT_MASK >= MAX_REFS {
                return Err(AddRefError::Overflow);
            }
            match self.word.compare_exchange_weak(word, word + 1, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(actual) => word = actual,
            }
        }
    }

    /// Drops a reference taken through a raw handle, refusing to go below
    /// zero. With `note_candidate`, marks a candidate root as
    /// [`release_marking`](Self::release_marking) does; else, in a manager
    /// with an owner thread (`owner_thread`), releases as a handle drop on
    /// the calling thread does (see `owner_counts.rs`).
    pub(crate) fn try_release(
        &self,
        generation: u32,
        note_candidate: Option<&dyn Fn() -> bool>,
        owner_thread: u64,
    ) -> Result<Released, ReleaseError> {
        if self.generation(Ordering::Acquire) != generation {
            return Err(ReleaseError::Stale);
        }
        if !is_count(self.word.load(Ordering::Relaxed)) {
            return Err(ReleaseError::NoReferences);
        }
        let released = match note_candidate {
            Some(_) if self.release_marking(note_candidate) & COUNT_MASK == 1 => Released::Last,
            Some(_) => Released::Kept,
            None if owner_thread == crate::sync::thread_token() => self.owner_release(),
            None if self.word.fetch_sub(1, Ordering::Release) & COUNT_MASK == 1 => Released::Last,
            None => Released::Kept,
        };
        if released == Released::Last {
            self.mark_dead();
        }
        Ok(released)
    }

    /// Drops one reference the caller holds, and returns the word before.
    /// `Release`, as in `Arc`'s drop: the last releaser's `Acquire` fence
    /// (`last_drops::record`, or `StoreShared::release_last` for raw handles)
    /// pairs with it.
    ///
    /// With `note_candidate` (stores whose objects may hold handles), a drop
    /// that leaves the count above zero makes the object a candidate root:
    /// unless [`PURPLE`] is already set, `note_candidate` queues the slot in
    /// its store's candidate buffer, and the decrement sets `PURPLE` in the
    /// same compare-exchange. Both happen while the caller still holds its
    /// reference (afterwards the store may be gone), so the queue comes
    /// first: an entry whose slot has no `PURPLE` is skipped when read. The
    /// flag and the decrement are one atomic step, so a collector that
    /// clears the flag either sees this decrement, or clears the flag after
    /// it and reads a count that includes it. `note_candidate` returns false
    /// if it could not queue the slot (no memory): the flag is then left clear.
    #[inline]
    pub(crate) fn release_marking(&self, note_candidate: Option<&dyn Fn() -> bool>) -> u32 {
        let Some(note) = note_candidate else {
            return self.word.fetch_sub(1, Ordering::Release);
        };
        let mut word = self.word.load(Ordering::Relaxed);
        let mut queued = false;
        loop {
            debug_assert!(is_count(word), "the caller holds a reference");
            let mut next = word - 1;
            if word & PURPLE == 0 && word & COUNT_MASK > 1 {
                queued = queued || note();
                if queued {
                    next |= PURPLE;
                }
            }
            match self.word.compare_exchange_weak(word, next, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return word,
                Err(actual) => word = actual,
            }
        }
    }

    /// Clears [`PURPLE`] if the slot holds a live count with it set. Returns
    /// true if it did (the caller then looks at the object as a candidate).
    pub(crate) fn take_purple(&self) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        // A compare-exchange, never a `fetch_and`: the word may turn into a
        // dead-list link meanwhile, whose bits must not change.
        while is_count(word) && word & PURPLE != 0 {
            match self.word.compare_exchange_weak(word, word & !PURPLE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
        false
    }

    /// True if the slot holds a live count with [`PURPLE`] set.
    pub(crate) fn is_purple(&self) -> bool {
        let word = self.word.load(Ordering::Relaxed);
        is_count(word) && word & PURPLE != 0
    }

    /// The strong count (handles and raw handles), or 0 for a dead or
    /// vacant slot: the word's count less the owner thread's reservation
    /// (exact on the owner thread; on others the reservation may be read
    /// behind while the owner clones or drops).
    pub(crate) fn ref_count(&self) -> u32 {
        match self.word.load(Ordering::Relaxed) {
            w if is_count(w) => (w & COUNT_MASK).saturating_sub(self.reserve.load(Ordering::Relaxed) & RESERVE_COUNT),
            _ => 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddRefError {
    Stale,
    Overflow,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseError {
    Stale,
    NoReferences,
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;

    #[test]
    fn header_is_16_bytes() {
        assert_eq!(std::mem::size_of::<SlotHeader>(), 16);
        assert_eq!(std::mem::size_of::<Slot<[u64; 8]>>(), 16 + 64);
    }

    #[test]
    fn add_ref_never_revives() {
        let h = SlotHeader::vacant(2);
        h.generation.store(3, Ordering::Relaxed);
        h.word.store(1, Ordering::Relaxed);
        assert_eq!(h.try_add_ref(3), Ok(()));
        assert_eq!(h.ref_count(), 2);
        assert_eq!(h.try_add_ref(5), Err(AddRefError::Stale));
        assert_eq!(h.try_release(3, None, 0), Ok(Released::Kept));
        assert_eq!(h.try_release(3, None, 0), Ok(Released::Last));
        assert_eq!(h.try_release(3, None, 0), Err(ReleaseError::NoReferences));
        assert_eq!(h.try_add_ref(3), Err(AddRefError::Stale));
        h.word.store(LINK_FLAG | 7, Ordering::Relaxed);
        assert_eq!(h.state(), SlotState::Dead);
        assert_eq!(h.try_add_ref(3), Err(AddRefError::Stale));
    }

    #[test]
    fn only_an_owned_store_reads_pending() {
        let h = SlotHeader::vacant(2);
        h.generation.store(3, Ordering::Relaxed);
        h.word.store(1, Ordering::Relaxed);
        assert!(h.is_live_in(3, true) && h.is_live_in(3, false));
        h.reserve.store(1 | PENDING, Ordering::Relaxed);
        assert!(!h.is_live_in(3, true) && !h.is_live(3), "pending is dead to readers");
        assert!(h.is_live_in(3, false), "without an owner the reservation is not read");
        assert!(!h.is_live_in(5, false) && !h.is_live_in(5, true));
        h.word.store(0, Ordering::Relaxed);
        assert!(!h.is_live_in(3, true), "an owned store reads the word");
        h.mark_dead();
        assert!(!h.is_live_in(3, false), "the mark alone tells the others");
    }

    #[test]
    fn the_dead_mark_hides_the_generation_from_keys_only() {
        let h = SlotHeader::vacant(2);
        h.generation.store(3, Ordering::Relaxed);
        h.word.store(1, Ordering::Relaxed);
        assert_eq!(h.try_release(3, None, 0), Ok(Released::Last));
        assert_eq!(h.generation.load(Ordering::Relaxed), 3 | DEAD_MARK, "the last release marks it");
        assert!(!h.is_live_in(3, false) && !h.is_live_in(3, true) && !h.is_live(3));
        assert_eq!(h.try_add_ref(3), Err(AddRefError::Stale));
        assert_eq!(h.generation(Ordering::Relaxed), 3, "keys and the next generation see it unmarked");
        assert_eq!(h.try_release(3, None, 0), Err(ReleaseError::NoReferences), "a double release, not a stale key");
        assert_eq!(h.state(), SlotState::Dead);
        // The largest generation, marked, and the retired value, unmarked.
        assert_eq!(unmarked((GENERATION_LIMIT - 1) | DEAD_MARK), GENERATION_LIMIT - 1);
        assert_eq!(unmarked(GENERATION_LIMIT), GENERATION_LIMIT, "a retired slot stays retired");
        // A slot destroyed in place (even) keeps its generation.
        let h = SlotHeader::vacant(4);
        h.mark_dead();
        assert_eq!(h.generation.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn is_live_is_one_range_check() {
        let h = SlotHeader::vacant(2);
        h.generation.store(3, Ordering::Relaxed);
        let cases = [
            (0, false),
            (1, true),
            (MAX_REFS, true),
            (PURPLE, false),
            (PURPLE | 1, true),
            (LINK_FLAG - 1, true),
            (LINK_FLAG, false),
            (LINK_FLAG | NIL, false),
        ];
        for (word, live) in cases {
            h.word.store(word, Ordering::Relaxed);
            assert_eq!(h.is_live(3), live, "word {word:#x}");
            assert!(!h.is_live(5), "another generation is never live");
        }
        h.word.store(LINK_FLAG | NIL, Ordering::Relaxed);
        assert!(!h.is_live(3));
    }

    #[test]
    fn a_drop_that_leaves_references_marks_the_object_once() {
        let h = SlotHeader::vacant(2);
        h.generation.store(3, Ordering::Relaxed);
        h.word.store(3, Ordering::Relaxed);
        let queued = std::cell::Cell::new(0);
        let note = || {
            queued.set(queued.get() + 1);
            true
        };
        assert_eq!(h.release_marking(Some(&note)), 3);
        assert_eq!((h.ref_count(), h.is_purple(), queued.get()), (2, true, 1));
        assert_eq!(h.try_release(3, Some(&note), 0), Ok(Released::Kept));
        assert_eq!((h.ref_count(), h.is_purple(), queued.get()), (1, true, 1), "queued once");
        assert!(h.take_purple());
        assert!(!h.take_purple(), "taken once");
        // The last reference never marks: the object dies instead.
        assert_eq!(h.try_release(3, Some(&note), 0), Ok(Released::Last));
        assert_eq!((h.ref_count(), h.is_purple(), queued.get()), (0, false, 1));
        // A full candidate buffer leaves the flag clear.
        h.word.store(2, Ordering::Relaxed);
        assert_eq!(h.release_marking(Some(&|| false)), 2);
        assert_eq!((h.ref_count(), h.is_purple()), (1, false));
        // A link is never taken for a purple count.
        h.word.store(LINK_FLAG | NIL, Ordering::Relaxed);
        assert!(!h.take_purple());
        assert_eq!(h.word.load(Ordering::Relaxed), LINK_FLAG | NIL);
    }
}
