//! Owner-thread counts: handle clones and drops on the thread that owns the
//! manager cost plain loads and stores, not a locked read-modify-write.
//!
//! Every handle is counted in its slot's atomic word, as `Arc` counts. The
//! owner thread (the one that built the manager, see
//! [`owner_thread`](crate::object::ObjectManagerBuilder::owner_thread)) also
//! keeps a *reservation* per object: counts it added to the word ahead of
//! need, or kept when one of its handles dropped, so `count - reservation`
//! handles exist. The reservation lives in the slot's `reserve` word, which
//! only the owner writes, with plain stores:
//!
//! - **A clone on the owner** takes one count from the reservation; with
//!   none left it adds [`RESERVE_BATCH`] to the word at once (one locked add
//!   per batch).
//! - **A drop on the owner** of an object it holds a reservation on puts
//!   its count in the reservation (returning all but a batch once it passes
//!   [`RESERVE_MAX`]). If the word then holds nothing but the reservation, no
//!   handle is left: the owner marks the object [`PENDING`] (dead for
//!   `upgrade` and weak reads) and queues a *check* of it in its ring of last
//!   drops. With no reservation (an object the owner never cloned, as most
//!   objects of a level or a frame) the drop decrements the word, as a drop
//!   elsewhere does: one locked subtract, and the last drop is known at once.
//! - **A drop on any other thread** decrements the word with one
//!   compare-exchange. To zero, it is the last drop, as with `Arc` (the
//!   owner holds no reservation then). If what is left could be the owner's
//!   reservation alone (at most `RESERVE_MAX`), the same exchange sets
//!   [`CHECK`], unless already set, and the thread queues a check. A last
//!   drop (on any thread) that finds `CHECK` set leaves the object to that
//!   check instead, which may still be on its way.
//! - **Collection on the owner thread** decides each queued check: the
//!   object is dead if its count equals the reservation. It clears `CHECK`
//!   and `PENDING`, and a dead object goes on the dead list and is destroyed
//!   in the same call.
//!
//! **Why the check is exact.** Under `&mut ObjectManager` no `upgrade` runs,
//! and the owner's reservation is its own. A handle made on another thread
//! came from a handle that thread held, whose count is in the word; every
//! drop the owner can see follows the clone or creation it undoes. So a
//! word read by the owner counts every handle it can know of, and if it
//! equals the reservation no handle is left anywhere: none can be made
//! without one. The same argument makes the owner's test at a drop exact,
//! up to an `upgrade` racing it (see below).
//!
//! **What readers see.** Other threads cannot read the reservation exactly
//! (it changes without synchronisation), so a weak read counts an object
//! live while its word holds any count and it is not `PENDING`. When the
//! last handle goes on the owner thread, the object is `PENDING` at once:
//! `upgrade` and weak reads fail everywhere, as without reservations (an
//! `upgrade` racing that drop either wins, and the check finds the object
//! alive, or fails). When the last handle of an object the owner holds a
//! reservation on goes on another thread, weak reads still succeed until the
//! owner's next collection, and so does `upgrade` on threads other than the
//! owner (the object then stays alive); `upgrade` on the owner thread, which
//! reads its own reservation, fails at once.
//!
//! A collection on another thread than the owner cannot read the
//! reservations, so it leaves the queued checks for the owner's next
//! collection (and says so once in the log). Objects whose count is all a
//! reservation are then reclaimed only there, or at shutdown. It decides
//! only the checks of objects whose last count went while their flagged
//! check was on its way (a word of bare `CHECK`: no count, so no
//! reservation), see [`SlotHeader::decide_unreserved`].
//!
//! Shutdown on another thread (the manager is `Send`) cannot read them
//! either, and the owner may go on cloning and dropping meanwhile. It
//! destroys every value once, and counts a slot as held while its word
//! holds anything but its raw references, a reservation included, so the
//! store's memory outlives the owner's handles: a leak, never an early free
//! (see [`SlotHeader::held_only_by_raw`]).
//!
//! Stores whose objects may hold handles count every handle in the word, as
//! before: their drops mark candidate roots for the cycle collector (with
//! the bit that is `CHECK` elsewhere).

use crate::sync::{thread_token, Ordering};

use super::slot::{is_count, AddRefError, SlotHeader, CHECK, COUNT_MASK, MAX_REFS};

/// The reservation's count bits in [`SlotHeader::reserve`].
pub(crate) const RESERVE_COUNT: u32 = 0xff;
/// Set in [`SlotHeader::reserve`] once the owner thread saw the object's
/// last handle go: `upgrade` and weak reads fail from then on, and a check
/// is queued for collection.
pub(crate) const PENDING: u32 = 1 << 31;
/// The most counts a reservation keeps. A drop on another thread that
/// leaves at most this many queues a check.
pub(crate) const RESERVE_MAX: u32 = 16;
/// Counts added to the word at once when the owner clones with an empty
/// reservation, and kept when a full one gives the rest back.
pub(crate) const RESERVE_BATCH: u32 = 8;

const _: () = assert!(RESERVE_BATCH <= RESERVE_MAX && RESERVE_MAX < RESERVE_COUNT && RESERVE_BATCH < MAX_REFS);

// The id of the manager the calling thread owns, the last one it built
// with an owner (0 for none). Handles test it against the id they carry
// (no load of their chunk header): a thread that built several owned
// managers counts the others' handles as any other thread does (correct,
// only slower: it still owns their reservations, which nobody else writes).
#[cfg(not(loom))]
std::thread_local!(static OWNED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) });
#[cfg(loom)]
loom::thread_local!(static OWNED: std::cell::Cell<u32> = std::cell::Cell::new(0));

/// True if the calling thread owns the manager with id `manager_id`.
#[inline]
pub(crate) fn owns(manager_id: u32) -> bool {
    OWNED.with(|owned| owned.get() == manager_id)
}

/// Makes the calling thread the owner of the manager with id `manager_id`
/// (it is the thread that builds it).
pub(crate) fn claim(manager_id: u32) {
    OWNED.with(|owned| owned.set(manager_id));
}

/// Set in a queued check's local index when the drop that queued it set
/// [`CHECK`]: that check, and only that one, clears the flag.
pub(crate) const FLAGGED: u32 = 1 << 31;

/// A queued check: the slot's local index (with [`FLAGGED`] if its drop
/// set `CHECK`) and the generation of the object it is about, so that a
/// check that arrives after its object was destroyed and the slot reused
/// decides nothing (nor clears the new object's `CHECK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Check {
    pub(crate) local: u32,
    pub(crate) generation: u32,
}

impl Check {
    /// The slot's local index, without the flag.
    #[inline]
    pub(crate) fn slot(self) -> u32 {
        self.local & !FLAGGED
    }

    /// True if the drop that queued this check set `CHECK`.
    #[inline]
    pub(crate) fn flagged(self) -> bool {
        self.local & FLAGGED != 0
    }
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// Handles are left.
    Kept,
    /// The count reached zero: the caller queues the slot as dead.
    Last,
    /// The owner saw its last handle go and set [`PENDING`]: the caller
    /// queues a check.
    Pending,
    /// What is left may be the owner's reservation alone, and this drop set
    /// [`CHECK`]: the caller queues a check, [`FLAGGED`].
    Check,
}

impl Released {
    /// The check to queue for the object with `generation` in slot `local`,
    /// if the release asks for one.
    #[inline]
    pub(crate) fn check(self, local: u32, generation: u32) -> Option<Check> {
        match self {
            Released::Kept | Released::Last => None,
            Released::Pending => Some(Check { local, generation }),
            Released::Check => Some(Check { local: local | FLAGGED, generation }),
        }
    }
}

impl SlotHeader {
    /// A clone on the owner thread, of a handle it holds. A handle is held,
    /// so the object is live: this also clears a [`PENDING`] left by an
    /// owner's last drop that an `upgrade` on another thread raced (the
    /// queued check then finds the object alive).
    #[inline]
    pub(crate) fn owner_clone(&self) {
        let reserve = self.reserve.load(Ordering::Relaxed);
        if reserve & RESERVE_COUNT != 0 {
            self.reserve.store((reserve - 1) & !PENDING, Ordering::Relaxed);
        } else {
            self.reserve_batch();
        }
    }

    /// Adds a batch of counts to the word and keeps all but one. Near the
    /// count limit, where a batch does not fit, it adds just the one, as a
    /// clone on another thread does, and panics past the limit.
    ///
    /// The caller holds a handle, so the word is a count that cannot reach
    /// zero meanwhile: a plain add suffices.
    #[inline(never)]
    fn reserve_batch(&self) {
        let old = self.word.fetch_add(RESERVE_BATCH, Ordering::Relaxed);
        if old & COUNT_MASK <= MAX_REFS - RESERVE_BATCH {
            // Keeps no `PENDING`: a handle is held.
            self.reserve.store(RESERVE_BATCH - 1, Ordering::Relaxed);
            return;
        }
        self.word.fetch_sub(RESERVE_BATCH - 1, Ordering::Relaxed);
        if old & COUNT_MASK >= MAX_REFS {
            self.word.fetch_sub(1, Ordering::Relaxed);
            panic!("mmobject: reference count overflow (more than {MAX_REFS} handles to one object)");
        }
        self.reserve.store(0, Ordering::Relaxed);
    }

    /// A drop on the owner thread. With no reservation (the owner never
    /// cloned the object: it was made, passed on and dropped, as most are),
    /// the count goes from the word, and the drop that takes it to zero is
    /// the last, as with `Arc`. Else the handle's count joins the reservation;
    /// if no handle is left and the object was not pending already, it is
    /// now, and the caller queues a check.
    #[inline]
    pub(crate) fn owner_release(&self) -> Released {
        let reserve = self.reserve.load(Ordering::Relaxed);
        if reserve & RESERVE_COUNT == 0 {
            // The whole word: a last count with `CHECK` set goes to the
            // flagged check on its way (see `release_remote`).
            return match self.word.fetch_sub(1, Ordering::Release) {
                1 => Released::Last,
                _ => Released::Kept,
            };
        }
        let mut kept = (reserve & RESERVE_COUNT) + 1;
        if kept > RESERVE_MAX {
            kept = self.return_reserve(kept);
        }
        let last = self.word.load(Ordering::Relaxed) & COUNT_MASK == kept && reserve & PENDING == 0;
        self.reserve.store(kept | reserve & PENDING | if last { PENDING } else { 0 }, Ordering::Relaxed);
        if last {
            Released::Pending
        } else {
            Released::Kept
        }
    }

    /// Gives all but a batch of a full reservation back to the word.
    /// `Release`, as a drop: another thread's last drop then sees the
    /// owner's uses of the object (the word keeps a batch, so it is never
    /// this that reaches zero).
    #[cold]
    fn return_reserve(&self, kept: u32) -> u32 {
        self.word.fetch_sub(kept - RESERVE_BATCH, Ordering::Release);
        RESERVE_BATCH
    }

    /// Counts a new reference to the object with `generation`, if it is
    /// live (an `upgrade`, a raw `add_ref`): on the manager's owner thread
    /// (`owner_thread`, in a store that is not `cyclable`) from the
    /// reservation, else as [`try_add_ref`](Self::try_add_ref) does.
    pub(crate) fn add_ref(&self, generation: u32, owner_thread: u64, cyclable: bool) -> Result<(), AddRefError> {
        if !cyclable && owner_thread == thread_token() {
            self.owner_add_ref(generation)
        } else {
            self.try_add_ref(generation)
        }
    }

    /// An `upgrade` on the owner thread: from the reservation if it has a
    /// count, else a count added to the word as [`try_add_ref`](Self::try_add_ref) does.
    /// Exact: an object whose count is all the reservation has no handle
    /// left (see the module docs), and is not revived.
    fn owner_add_ref(&self, generation: u32) -> Result<(), AddRefError> {
        let reserve = self.reserve.load(Ordering::Relaxed);
        let word = self.word.load(Ordering::Acquire);
        if self.generation.load(Ordering::Acquire) != generation
            || reserve & PENDING != 0
            || !is_count(word)
            || word & COUNT_MASK == reserve & RESERVE_COUNT
        {
            return Err(AddRefError::Stale);
        }
        if reserve & RESERVE_COUNT == 0 {
            return self.try_add_ref(generation);
        }
        self.reserve.store(reserve - 1, Ordering::Relaxed);
        Ok(())
    }

    /// A drop on a thread other than the owner (or a raw handle's release):
    /// one compare-exchange, which also sets [`CHECK`] if the count left
    /// could be the owner's reservation alone. `Release`, as in `Arc`'s drop:
    /// the last releaser's `Acquire` fence (`last_drops::record`, or
    /// `StoreShared::release_last`) pairs with it, and so does collection's
    /// `Acquire` load of the word when it decides a check.
    ///
    /// The flag goes in the same exchange as the decrement: once the
    /// caller's count is gone, the slot may be freed (if the manager is
    /// gone), so nothing may touch it after. Shutdown counts a slot whose
    /// `CHECK` is still set as held from outside (its check may still be on
    /// its way to the store), so the store's shared part outlives it.
    ///
    /// So the last drop of an object whose `CHECK` is set (here, or on the
    /// owner with no reservation) is not `Last`: it leaves the flag on a
    /// count of zero, and the flagged check finds the object dead. Were it
    /// `Last`, the object would go on the dead list, its link would wipe the
    /// flag, and a shutdown could free the store while the drop that set
    /// the flag still had to read the slot and queue its check (tested in
    /// `tests/soundness_owner_shutdown.rs`).
    #[inline]
    pub(crate) fn release_remote(&self) -> Released {
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            debug_assert!(is_count(word), "the caller holds a reference");
            let count = word & COUNT_MASK;
            let check = word & CHECK == 0 && count > 1 && count <= RESERVE_MAX + 1;
            let next = (word - 1) | if check { CHECK } else { 0 };
            match self.word.compare_exchange_weak(word, next, Ordering::Release, Ordering::Relaxed) {
                Ok(_) if word == 1 => return Released::Last,
                Ok(_) if check => return Released::Check,
                Ok(_) => return Released::Kept,
                Err(actual) => word = actual,
            }
        }
    }

    /// Decides a queued check. Returns true if the object is dead: its word
    /// then holds no count (the caller links it into a dead list).
    ///
    /// Only on the owner thread, under `&mut ObjectManager` (see the module
    /// docs for why the test is then exact). The word is read with `Acquire`,
    /// so every other thread's use of the object happens before it is destroyed.
    ///
    /// A check of an object the slot no longer holds (another generation)
    /// decides nothing. A [`FLAGGED`] check clears [`CHECK`]. While `CHECK`
    /// is set, the check that set it is queued or still on its way (its drop
    /// may be racing shutdown, and the store's shared part must outlive it):
    /// then only that check may find the object dead.
    ///
    /// With `destroyed_in_place` (shutdown's settling, after `destroy_all`,
    /// with loaders shut out) the check also decides an object that shutdown
    /// destroyed in place: its slot is one generation on (even), and its word
    /// still holds the counts left, which drops inside `destroy_all` (of the
    /// handles other objects held) took down to the owner's reservation. A
    /// vacant slot holds a count only then: elsewhere its word is a list link
    /// (while a loader places an object, its count shows before its
    /// generation, which is why only shutdown may look past the generation).
    pub(crate) fn decide_check(&self, check: Check, destroyed_in_place: bool) -> bool {
        if !self.holds_checked(check, destroyed_in_place) {
            return false;
        }
        // `CHECK` is set on a count, or on no count at all (the word is
        // exactly `CHECK`): the last drop went while the drop that set the
        // flag was still on its way to queue its check, and left the object
        // to it (see `release_remote`). Either way only that check decides.
        let flagged = |word: u32| word & CHECK != 0 && (is_count(word) || word == CHECK);
        let mut word = self.word.load(Ordering::Acquire);
        if !check.flagged() && flagged(word) {
            return false;
        }
        // A compare-exchange, never a `fetch_and`: the word may turn into a
        // dead-list link meanwhile (a last drop elsewhere), whose bits must
        // not change; and the last count may go meanwhile, leaving `CHECK`
        // alone (a drop elsewhere).
        let mut took_last = false;
        while flagged(word) {
            match self.word.compare_exchange_weak(word, word & !CHECK, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => {
                    took_last = word == CHECK;
                    word &= !CHECK;
                }
                Err(actual) => word = actual,
            }
        }
        if took_last {
            // No handle and no reservation is left (a reservation's counts
            // are in the word), and no count can come back to a word of 0:
            // dead. Only this check writes the word now. (`Acquire` read the
            // last decrement, in the release sequence of every drop before it.)
            self.reserve.store(0, Ordering::Relaxed);
            return true;
        }
        // Vacant, or dead and listed already (a check queued twice).
        if !is_count(word) {
            return false;
        }
        let reserve = self.reserve.load(Ordering::Relaxed);
        if word & COUNT_MASK == reserve & RESERVE_COUNT {
            self.reserve.store(0, Ordering::Relaxed);
            return true;
        }
        if reserve & PENDING != 0 {
            // Revived by an `upgrade` on another thread: live again.
            self.reserve.store(reserve & !PENDING, Ordering::Relaxed);
        }
        false
    }

    /// True if the slot still holds the object `check` is about (with
    /// `destroyed_in_place`, also once shutdown destroyed it in place: its
    /// generation is then one on, even, and `(g - 1) | 1` is the object's).
    fn holds_checked(&self, check: Check, destroyed_in_place: bool) -> bool {
        let generation = self.generation.load(Ordering::Acquire);
        let object = if destroyed_in_place { generation.wrapping_sub(1) | 1 } else { generation };
        object == check.generation
    }

    /// [`decide_check`](Self::decide_check) on another thread than the
    /// owner, which cannot read the reservation: decides only a [`FLAGGED`]
    /// check of an object whose word is exactly [`CHECK`] (its last count
    /// went while the check was on its way, see `release_remote`). No count
    /// is left, so no reservation either (a reservation's counts are in the
    /// word, and with none `reserve` holds neither count nor `PENDING`), and
    /// none can come back: the object is dead whatever the owner does. Left
    /// to the owner's collection, it would never be reclaimed in a manager
    /// moved off its owner thread, and a shutdown there would keep the
    /// store's memory for it and report a handle outliving it.
    ///
    /// True if so: the word is then 0 (the caller links it into a dead
    /// list). Else nothing changes and the check stays queued for the owner;
    /// a set `CHECK` on a count stays too (only the owner may clear it).
    ///
    /// The caller holds `&mut ObjectManager`. A check in the queue was
    /// recorded by a drop that is done with the slot and the store's shared
    /// part; the last drop was done with them at its decrement, which the
    /// `Acquire` exchange reads (in the release sequence of every drop
    /// before it): every use of the object happens before it is destroyed,
    /// and before its memory is freed at shutdown. `destroyed_in_place` as
    /// for `decide_check`.
    pub(crate) fn decide_unreserved(&self, check: Check, destroyed_in_place: bool) -> bool {
        if !check.flagged() {
            return false;
        }
        if !self.holds_checked(check, destroyed_in_place)
            || self.word.compare_exchange(CHECK, 0, Ordering::Acquire, Ordering::Relaxed).is_err()
        {
            return false;
        }
        debug_assert_eq!(self.reserve.load(Ordering::Relaxed), 0, "no count, so no reservation");
        true
    }

    /// True if the object's only counts are its `raw` raw references (at
    /// least one), none of them mid-release: shutdown may then free its
    /// slot, as a raw handle is a plain number that needs the (gone)
    /// manager to be used. `reads_reservation`: the caller is the owner
    /// thread, or the store keeps no reservations (no owner, or `cyclable`).
    pub(crate) fn held_only_by_raw(&self, raw: u32, reads_reservation: bool, cyclable: bool) -> bool {
        if !reads_reservation {
            // Another thread than the owner cannot read the reservation: the
            // owner changes it with plain stores, and a look at the word and
            // one at the reservation can straddle an owner's clone or drop.
            // A drop past `RESERVE_MAX` gives 9 counts back to the word, then
            // lowers the reservation from 16 to 8: the word read after the
            // first step, less the reservation read before the second, took
            // eight live handles for none, and shutdown freed the store under
            // them (loom model). So here the reservation counts as held, and
            // only a word of exactly `raw` qualifies: a count, nothing
            // reserved, no `CHECK` of a drop still on its way. One load, and
            // exact whatever the owner does: every reserved count is in the
            // word, so such a word means that no handle and no reservation
            // is left, and none can come back (a count is only added through
            // a handle, a reservation, or the manager, which shutdown holds).
            // `Acquire`: the counts went with `Release` decrements, whose
            // release sequences this load reads, so every use of the slot
            // (the owner's plain stores to `reserve` among them) happens
            // before its memory is freed. The price: a slot the owner still
            // reserves counts on keeps its store's memory, a leak.
            return self.word.load(Ordering::Acquire) == raw;
        }
        // Exact: the count less the owner's reservation is the handles and
        // raw references. None is mid-drop either: none took the count to
        // zero, and a drop on another thread than the owner that set `CHECK`
        // still has its check to record (it names the store's shared part),
        // so a set `CHECK` keeps the slot held. (The word is loaded after the
        // count: a drop that the count saw has its flag in this load.)
        self.ref_count() == raw && (cyclable || self.word.load(Ordering::Acquire) & CHECK == 0)
    }

    /// True if the slot holds an object whose queued check would find it
    /// dead (for `dead_count`: exact on the owner thread), or whose last
    /// drop left it to its flagged check (dead on every thread).
    ///
    /// With `reads_reservation` false, only an object the owner marked
    /// [`PENDING`]: what the other threads' weak reads and iterators take
    /// for dead (see [`is_referenced`](SlotHeader::is_referenced)), so that
    /// an iterator there counts what it yields.
    pub(crate) fn awaits_check(&self, reads_reservation: bool) -> bool {
        let word = self.word.load(Ordering::Acquire);
        let reserve = self.reserve.load(Ordering::Relaxed);
        self.generation.load(Ordering::Relaxed) & 1 == 1
            && (word == CHECK
                || is_count(word)
                    && (reserve & PENDING != 0 || reads_reservation && word & COUNT_MASK == reserve & RESERVE_COUNT))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An occupied header with generation 3, `count` in its word and `reserve` reserved.
    fn header(count: u32, reserve: u32) -> SlotHeader {
        let header = SlotHeader::vacant(2);
        header.generation.store(3, Ordering::Relaxed);
        header.word.store(count, Ordering::Relaxed);
        header.reserve.store(reserve, Ordering::Relaxed);
        header
    }

    #[test]
    fn the_owner_counts_through_its_reservation() {
        let h = header(1, 0);
        // No reservation: a drop is a plain decrement, and the last is known.
        assert_eq!(h.owner_release(), Released::Last);
        let h = header(1, 0);
        h.owner_clone(); // a batch
        assert_eq!(
            (h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)),
            (1 + RESERVE_BATCH, RESERVE_BATCH - 1)
        );
        assert_eq!(h.ref_count(), 2);
        assert_eq!(h.owner_release(), Released::Kept);
        assert_eq!(h.owner_release(), Released::Pending, "the word holds only the reservation");
        assert_eq!(h.ref_count(), 0);
        assert!(h.reserve.load(Ordering::Relaxed) & PENDING != 0);
        assert!(h.try_add_ref(3).is_err(), "a pending object is not revived");
        assert!(h.decide_check(Check { local: 0, generation: 3 }, false));
        assert_eq!(h.reserve.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_full_reservation_gives_all_but_a_batch_back() {
        let h = header(1 + RESERVE_MAX + 1, RESERVE_MAX);
        assert_eq!(h.owner_release(), Released::Kept);
        assert_eq!(h.reserve.load(Ordering::Relaxed), RESERVE_BATCH);
        assert_eq!(h.word.load(Ordering::Relaxed), 1 + RESERVE_BATCH);
        assert_eq!(h.ref_count(), 1);
    }

    #[test]
    fn a_remote_drop_flags_a_check_only_where_the_reservation_could_be_all() {
        let h = header(RESERVE_MAX + 2, 0);
        assert_eq!(h.release_remote(), Released::Kept, "more than a reservation can hold is left");
        assert_eq!(h.release_remote(), Released::Check);
        assert_eq!(h.word.load(Ordering::Relaxed), CHECK | RESERVE_MAX);
        assert_eq!(h.release_remote(), Released::Kept, "flagged once");
        let h = header(1, 0);
        assert_eq!(h.release_remote(), Released::Last);
    }

    #[test]
    fn only_the_owner_subtracts_its_reservation_from_raw_references() {
        // One raw reference and 8 reserved counts: no handle is left, but
        // only the owner can tell (elsewhere the reservation counts as held).
        let h = header(9, 8);
        assert!(h.held_only_by_raw(1, true, false));
        assert!(!h.held_only_by_raw(1, false, false));
        // Nothing reserved: the word alone tells, on any thread.
        let h = header(1, 0);
        assert!(h.held_only_by_raw(1, true, false) && h.held_only_by_raw(1, false, false));
        assert!(!h.held_only_by_raw(2, false, false), "a handle is left");
        // A drop that set `CHECK` still has its check to record.
        h.word.store(CHECK | 1, Ordering::Relaxed);
        assert!(!h.held_only_by_raw(1, true, false) && !h.held_only_by_raw(1, false, false));
    }

    #[test]
    fn a_last_drop_leaves_a_flagged_object_to_its_check() {
        for owner_drops_last in [true, false] {
            let h = header(2, 0);
            assert_eq!(h.release_remote(), Released::Check);
            // The last count goes while the flagged check is on its way.
            let last = if owner_drops_last { h.owner_release() } else { h.release_remote() };
            assert_eq!(last, Released::Kept, "not `Last`: the check decides");
            assert_eq!(h.word.load(Ordering::Relaxed), CHECK);
            assert_eq!(h.ref_count(), 0);
            assert!(h.try_add_ref(3).is_err(), "dead for everyone");
            assert!(h.awaits_check(false));
            assert!(!h.decide_check(Check { local: 0, generation: 3 }, false), "only the flagged check");
            assert!(h.decide_check(Check { local: FLAGGED, generation: 3 }, false));
            assert_eq!(h.word.load(Ordering::Relaxed), 0, "the caller links it");
        }
    }

    #[test]
    fn a_check_decides_only_its_own_object() {
        let h = header(CHECK | 2, 2);
        // Another generation: the slot was reused; nothing is decided or cleared.
        assert!(!h.decide_check(Check { local: FLAGGED, generation: 5 }, false));
        assert_eq!(h.word.load(Ordering::Relaxed), CHECK | 2);
        // An unflagged check leaves a set `CHECK` to the check that set it.
        assert!(!h.decide_check(Check { local: 0, generation: 3 }, false));
        assert_eq!(h.word.load(Ordering::Relaxed), CHECK | 2);
        // The flagged one clears it and decides: the count is all the reservation.
        assert!(h.decide_check(Check { local: FLAGGED, generation: 3 }, false));
        assert_eq!(h.word.load(Ordering::Relaxed), 2);
        // A live object stays, and loses a stale `PENDING`.
        let h = header(3, 2 | PENDING);
        assert!(!h.decide_check(Check { local: 0, generation: 3 }, false));
        assert_eq!(h.reserve.load(Ordering::Relaxed), 2);
        // Shutdown destroyed the object in place (generation 4) and its last
        // handle went since: only shutdown's settling decides it.
        let h = header(2, 2 | PENDING);
        h.generation.store(4, Ordering::Relaxed);
        assert!(!h.decide_check(Check { local: 0, generation: 3 }, false));
        assert!(h.decide_check(Check { local: 0, generation: 3 }, true));
        // A vacant slot's word is a link: nothing to decide, even then.
        let h = SlotHeader::vacant(4);
        assert!(!h.decide_check(Check { local: FLAGGED, generation: 3 }, true));
    }
}
