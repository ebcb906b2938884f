//! Owner-thread counts: handle clones and drops on the thread that owns the
//! manager cost plain loads and stores, not a locked read-modify-write.
//!
//! Every handle is counted in its slot's atomic word, as `Arc` counts. The
//! owner thread (the one that built the manager, see
//! [`owner_thread`](crate::object::ObjectManagerBuilder::owner_thread)) also
//! keeps a *reservation* per object: counts it added to the word ahead of
//! need, or kept when one of its handles dropped, so `count - reservation`
//! handles exist. The reservation lives in the slot's `reserve` word, which
//! only the owner writes, with plain stores. It is a *lease*, which the
//! owner's collections renew while the owner counts on it and end when it
//! does not (or when no handle is left):
//!
//! - **A clone on the owner** takes one count from the reservation; with
//!   none left it adds [`RESERVE_BATCH`] to the word at once (one locked add
//!   per batch) and queues a *check* of the object in its ring of last drops
//!   (the lease's end), unless the check of an earlier lease is still
//!   queued ([`LEASED`]: it ends this one too, so the queue holds at most
//!   one check per object however often clones spend a batch before a
//!   collection on the owner). Should the check find no room, the
//!   reservation goes straight back to the word.
//! - **A drop on the owner** of an object it holds a reservation on puts
//!   its count in the reservation (returning all but a batch once it passes
//!   [`RESERVE_MAX`]). If the word then holds nothing but the reservation, no
//!   handle is left: the owner marks the object [`PENDING`] (dead for
//!   `upgrade` and weak reads). With no reservation (an object the owner
//!   never cloned, as most objects of a level or a frame) the drop
//!   decrements the word, as a drop elsewhere does: one locked subtract, and
//!   the last drop is known at once.
//! - **A drop on any other thread** decrements the word with one
//!   `fetch_sub`, as `Arc`'s drop does. To zero, it is the last drop (the
//!   owner holds no reservation then). Else nothing more: while the owner
//!   holds counts on the object, its lease's check is queued.
//! - **Collection on the owner thread** decides each queued check. A lease
//!   the owner counted on since the previous collection ([`USED`]: a clone
//!   or `upgrade` there) is renewed while handles are left (the word
//!   holds more than the reservation): the check stays queued, and nothing
//!   is written but the cleared flag. Any other lease ends: the whole
//!   reservation goes back to the word with one subtract. If that takes the
//!   count to zero, no handle is left anywhere (the subtract is the last
//!   drop, exactly as a handle's would be), and the object goes on the dead
//!   list and is destroyed in the same call. Either way it clears
//!   `PENDING`; the next clone on the owner takes a new lease. Only a
//!   collection's first look at its checks ends unused leases: its later
//!   rounds (cascades), batches (`collect_garbage_for`) and passes
//!   (`collect_cycles`) only find the objects that died meanwhile, and keep
//!   the leases the first renewed.
//! - **`release_many` on the owner** gives back the lease of an object whose
//!   only handle it gives up (the word holds that handle and the
//!   reservation), and destroys the object at once, as without a lease.
//!
//! **Why renew.** An object the owner clones in every frame (into a render
//! list, say) would otherwise pay a locked add, a queued check and a locked
//! subtract per frame, more than `Arc`'s two locked operations. Renewed, it
//! pays one visit of its check per collection. A collection still costs in
//! proportion to what happened since the previous one: its checks are the
//! objects the owner counted on in the last two frames. And an object dies
//! at the first owner collection after its last drop, as before, except
//! when that drop (on another thread) races the collection's look at the
//! word: then at the next one.
//!
//! **Why it is exact.** The reservation's counts are in the word, so while
//! the owner holds one the word never reaches zero by anyone else's drop,
//! and the object cannot die behind the owner's back; the give-back is a
//! decrement like any other, and whichever decrement takes the count to
//! zero is the last, on whatever thread. No drop needs to know what the
//! owner reserves, so a drop elsewhere touches nothing after its
//! `fetch_sub` but for a last drop, whose zero count keeps the slot held
//! (see `last_drops.rs`), as without an owner.
//!
//! **What readers see.** Other threads cannot read the reservation exactly
//! (it changes without synchronisation), so a weak read counts an object
//! live while its word holds any count and it is not `PENDING`. When the
//! last handle goes on the owner thread, the object is `PENDING` at once:
//! `upgrade` and weak reads fail everywhere, as without reservations (an
//! `upgrade` racing that drop either wins, and the give-back finds the
//! object alive, or fails). When the last handle of an object the owner
//! holds a reservation on goes on another thread, weak reads still succeed
//! until the owner's next collection, and so does `upgrade` on threads other
//! than the owner (the object then stays alive); `upgrade` on the owner
//! thread, which reads its own reservation, fails at once.
//!
//! A collection on another thread than the owner cannot give the
//! reservations back (the owner may be using them), so it leaves the queued
//! checks for the owner's next collection (and says so once in the log).
//! Objects whose count is all a reservation are then reclaimed only there,
//! or at shutdown.
//!
//! Shutdown on another thread (the manager is `Send`) cannot read them
//! either, and the owner may go on cloning and dropping meanwhile. It
//! destroys every value once, and counts a slot as held while its word
//! holds anything but its raw references, a reservation included, so the
//! store's memory outlives the owner's handles: a leak, never an early free
//! (see [`SlotHeader::held_only_by_raw`]).
//!
//! A check can be lost: the store's queue had no room for it when a ring
//! was drained, or queueing it unwound (the store allocator or a logger
//! panicked). Its reservation then stays, and the object waits for shutdown:
//! a leak, logged, never an early destroy.
//!
//! Stores whose objects may hold handles count every handle in the word, as
//! before: their drops mark candidate roots for the cycle collector.

use crate::sync::{thread_token, Ordering};

use super::slot::{is_count, AddRefError, SlotHeader, COUNT_MASK, MAX_REFS};

/// The reservation's count bits in [`SlotHeader::reserve`].
pub(crate) const RESERVE_COUNT: u32 = 0xff;
/// Set in [`SlotHeader::reserve`] once the owner thread saw the object's
/// last handle go: `upgrade` and weak reads fail from then on, until the
/// lease's check gives the reservation back.
pub(crate) const PENDING: u32 = 1 << 31;
/// Set in [`SlotHeader::reserve`] while a lease's check is queued (or was
/// lost): a new batch taken meanwhile queues no other check, since that one
/// gives the whole reservation back. Cleared by the give-back, by
/// [`end_lease`](SlotHeader::end_lease), and when the slot is freed (the
/// object may die with its reservation spent but its check still queued).
pub(crate) const LEASED: u32 = 1 << 30;
/// Set in [`SlotHeader::reserve`] by every clone and `upgrade` on the owner
/// that takes a count from the reservation (not by drops: a frame that uses
/// an object clones it, and the drop's store stays as short as it was);
/// cleared by the collection that renews the lease (see the module docs),
/// which a lease without it does not survive.
pub(crate) const USED: u32 = 1 << 29;
/// The most counts a reservation keeps.
pub(crate) const RESERVE_MAX: u32 = 16;
/// Counts added to the word at once when the owner clones with an empty
/// reservation, and kept when a full one gives the rest back.
pub(crate) const RESERVE_BATCH: u32 = 8;

const _: () = assert!(RESERVE_BATCH <= RESERVE_MAX && RESERVE_MAX < RESERVE_COUNT && RESERVE_BATCH < MAX_REFS);
// `reserve` is its count in the low bits and these flags above them, and
// nothing else: the owner's fast clone and drop add to and subtract from the
// whole word (see `owner_release`).
const _: () = assert!(
    (PENDING | LEASED | USED) & RESERVE_COUNT == 0
        && PENDING & (LEASED | USED) == 0
        && LEASED & USED == 0
        && USED > RESERVE_COUNT
);

// The calling thread's owner key: the id of the manager it owns (the last
// one it built with an owner) with [`OWNER_KEY_FLAG`] set, or `NO_OWNER`.
// Handles test it against their own low bits (no load of their chunk
// header): a thread that built several owned managers counts the others'
// handles as any other thread does (correct, only slower: it still owns
// their reservations, which nobody else writes).
#[cfg(not(loom))]
std::thread_local!(static OWNED: std::cell::Cell<u32> = const { std::cell::Cell::new(NO_OWNER) });
#[cfg(loom)]
loom::thread_local!(static OWNED: std::cell::Cell<u32> = std::cell::Cell::new(NO_OWNER));

/// The owner key of a thread that owns no manager: above every key's bits,
/// so no handle's low bits equal it.
const NO_OWNER: u32 = u32::MAX;

/// Set in every owner key, above the 16-bit manager id: a handle's tag bit
/// for "counts through the owner" sits there too (see `handle.rs`), so a
/// handle's id and tags equal the key exactly when the calling thread
/// counts it through its reservations.
pub(crate) const OWNER_KEY_FLAG: u32 = 1 << 16;

/// True if `key` (a manager id with [`OWNER_KEY_FLAG`], or anything else
/// a handle's low bits hold) is the calling thread's owner key.
#[inline]
pub(crate) fn owns_key(key: u32) -> bool {
    OWNED.with(|owned| owned.get() == key)
}

/// Makes the calling thread the owner of the manager with id `manager_id`
/// (it is the thread that builds it).
pub(crate) fn claim(manager_id: u32) {
    debug_assert!(manager_id < OWNER_KEY_FLAG, "manager ids are 16 bits");
    OWNED.with(|owned| owned.set(manager_id | OWNER_KEY_FLAG));
}

/// A queued check, which renews or ends a lease: the slot's local index and the
/// generation of the object it is about, so that a check that arrives after
/// its object was destroyed and the slot reused decides nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Check {
    pub(crate) local: u32,
    pub(crate) generation: u32,
}

/// What a collection did with a lease's check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decided {
    /// The lease goes on: the check stays queued.
    Renewed,
    /// The lease ended (or the check was about an object gone since); the
    /// object, if it is still there, is alive.
    Ended,
    /// The give-back took the count to zero: the caller lists the object as dead.
    Dead,
}

/// What a release did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// Handles (or the owner's reservation) are left.
    Kept,
    /// The count reached zero: the caller queues the slot as dead.
    Last,
}

impl SlotHeader {
    /// A clone on the owner thread, of a handle it holds. A handle is held,
    /// so the object is live: this also clears a [`PENDING`] left by an
    /// owner's last drop that an `upgrade` on another thread raced (the
    /// give-back then finds the object alive).
    ///
    /// True if the clone took a new lease with no check queued yet: the
    /// caller queues its check (see the module docs), or gives it back with
    /// [`end_lease`](Self::end_lease).
    #[inline]
    #[must_use]
    pub(crate) fn owner_clone(&self) -> bool {
        let reserve = self.reserve.load(Ordering::Relaxed);
        // The common case: a count to spend from a lease already `USED`, not
        // `PENDING`: masked to those bits, `USED` plus a count of 1 to 255,
        // one range test. The stored value is one subtract from the load, so
        // the next drop's load, which this store forwards to, waits as
        // little as it can (see `owner_release`).
        if (reserve & (PENDING | USED | RESERVE_COUNT)).wrapping_sub(USED + 1) < RESERVE_COUNT {
            self.reserve.store(reserve - 1, Ordering::Relaxed);
            return false;
        }
        self.owner_clone_flagging(reserve)
    }

    /// [`owner_clone`](Self::owner_clone) when the lease is not yet `USED`
    /// since the last collection, is `PENDING`, or has no count left: the
    /// general form, right for every `reserve` (a test holds the fast path
    /// to it).
    #[cold]
    #[inline(never)]
    fn owner_clone_flagging(&self, reserve: u32) -> bool {
        if reserve & RESERVE_COUNT != 0 {
            self.reserve.store((reserve - 1) & !PENDING | USED, Ordering::Relaxed);
            false
        } else {
            self.reserve_batch(reserve & LEASED)
        }
    }

    /// Adds a batch of counts to the word and keeps all but one, and returns
    /// true (a new lease) unless `leased` (the earlier lease's check is
    /// still queued, and ends this one too). Near the count limit, where a
    /// batch does not fit, it adds just the one, as a clone on another
    /// thread does (no lease), and panics past the limit.
    ///
    /// The caller holds a handle, so the word is a count that cannot reach
    /// zero meanwhile: a plain add suffices.
    #[inline(never)]
    fn reserve_batch(&self, leased: u32) -> bool {
        let old = self.word.fetch_add(RESERVE_BATCH, Ordering::Relaxed);
        if old & COUNT_MASK <= MAX_REFS - RESERVE_BATCH {
            // Keeps no `PENDING`: a handle is held.
            self.reserve.store((RESERVE_BATCH - 1) | LEASED | USED, Ordering::Relaxed);
            return leased == 0;
        }
        self.word.fetch_sub(RESERVE_BATCH - 1, Ordering::Relaxed);
        if old & COUNT_MASK >= MAX_REFS {
            self.word.fetch_sub(1, Ordering::Relaxed);
            panic!("mmobject: reference count overflow (more than {MAX_REFS} handles to one object)");
        }
        self.reserve.store(leased, Ordering::Relaxed);
        false
    }

    /// Gives a lease back at once, on the owner thread, while it holds a
    /// handle to the object: its check found no room. The handle's count
    /// keeps the word above zero.
    #[cold]
    pub(crate) fn end_lease(&self) {
        let reserve = self.reserve.load(Ordering::Relaxed);
        self.word.fetch_sub(reserve & RESERVE_COUNT, Ordering::Release);
        self.reserve.store(0, Ordering::Relaxed);
    }

    /// A drop on the owner thread. With no reservation (the owner never
    /// cloned the object: it was made, passed on and dropped, as most are),
    /// the count goes from the word, and the drop that takes it to zero is
    /// the last, as with `Arc`. Else the handle's count joins the
    /// reservation; if no handle is left, the object is now [`PENDING`] (its
    /// lease's check is queued already).
    #[inline]
    pub(crate) fn owner_release(&self) -> Released {
        if self.owner_release_kept() {
            return Released::Kept;
        }
        self.owner_release_rest()
    }

    /// [`owner_release`](Self::owner_release)'s common case, inline where
    /// handles drop: true if the reservation had room and a handle is left,
    /// and the handle's count joined it; false, with nothing done, for
    /// [`owner_release_rest`](Self::owner_release_rest) to finish.
    #[inline]
    pub(crate) fn owner_release_kept(&self) -> bool {
        let reserve = self.reserve.load(Ordering::Relaxed);
        let count = reserve & RESERVE_COUNT;
        // `reserve` holds nothing between its count and its flags, and the
        // count stays below `RESERVE_MAX`, so the new value is one add from
        // the load: the test of the word is a predicted branch beside it, not
        // a step between the load and the store. A clone followed by a drop
        // on the owner is a chain of store-to-load forwards through
        // `reserve`; each ALU step on it adds its latency to every pair.
        if count != 0 && count < RESERVE_MAX && self.word.load(Ordering::Relaxed) & COUNT_MASK != count + 1 {
            self.reserve.store(reserve + 1, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// [`owner_release`](Self::owner_release) where
    /// [`owner_release_kept`](Self::owner_release_kept) did nothing: an
    /// object the owner holds no reservation on (one locked subtract, as a
    /// drop elsewhere), a full reservation, or the last handle. Handles call
    /// it out of line, so that their drop stays small enough to inline.
    #[inline]
    pub(crate) fn owner_release_rest(&self) -> Released {
        let reserve = self.reserve.load(Ordering::Relaxed);
        if reserve & RESERVE_COUNT == 0 {
            return match self.word.fetch_sub(1, Ordering::Release) & COUNT_MASK {
                1 => Released::Last,
                _ => Released::Kept,
            };
        }
        self.owner_release_full_or_last(reserve)
    }

    /// [`owner_release`](Self::owner_release) into a reservation that is
    /// full, or of the object's last handle (it becomes [`PENDING`]): the
    /// general form, right for every `reserve` with a count (a test holds
    /// the fast path to it).
    #[cold]
    #[inline(never)]
    fn owner_release_full_or_last(&self, reserve: u32) -> Released {
        let mut kept = (reserve & RESERVE_COUNT) + 1;
        if kept > RESERVE_MAX {
            kept = self.return_reserve(kept);
        }
        let last = self.word.load(Ordering::Relaxed) & COUNT_MASK == kept;
        self.reserve
            .store(kept | reserve & (PENDING | LEASED | USED) | if last { PENDING } else { 0 }, Ordering::Relaxed);
        if last {
            super::last_drops::note_here();
        }
        Released::Kept
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
        self.reserve.store((reserve - 1) | USED, Ordering::Relaxed);
        Ok(())
    }

    /// Decides a queued check, if the slot still holds the object the check
    /// is about: renews a lease the owner used since the previous
    /// collection while handles are left, else gives the reservation back
    /// (see [`give_back`](Self::give_back)). A check that arrives after its
    /// object was destroyed and the slot reused decides nothing.
    ///
    /// `ends_unused`: this is the collection's first look at its checks.
    /// Its later rounds (cascades), batches (`collect_garbage_for`) and
    /// passes (`collect_cycles`) look again only for the objects that died
    /// meanwhile: a lease with handles left stays, its `USED` as it is. (They
    /// used to decide as the first look does, and since that one cleared
    /// `USED`, ended every lease it had just renewed, in every collection
    /// that destroyed anything.)
    ///
    /// Only on the owner thread, under `&mut ObjectManager`, so the
    /// reservation read here is exact.
    #[inline]
    pub(crate) fn decide_check(&self, check: Check, ends_unused: bool) -> Decided {
        if self.generation(Ordering::Acquire) != check.generation {
            return Decided::Ended;
        }
        let reserve = self.reserve.load(Ordering::Relaxed);
        let kept = reserve & RESERVE_COUNT;
        // Handles are the count less the reservation. Relaxed: renewing
        // touches nothing but `reserve`. A drop elsewhere may take the last
        // handle right after this load; then the next collection (which
        // finds the lease unused: the owner cannot count on an object it
        // holds no handle to) gives it back, and the object dies there.
        let word = self.word.load(Ordering::Relaxed);
        if (reserve & USED != 0 || !ends_unused) && kept != 0 && is_count(word) && word & COUNT_MASK > kept {
            // Alive: a `PENDING` left by the owner's last drop was raced by
            // an `upgrade` elsewhere, which won. `USED` is cleared only by
            // the look that ends unused leases.
            let cleared = if ends_unused { USED | PENDING } else { PENDING };
            self.reserve.store(reserve & !cleared, Ordering::Relaxed);
            return Decided::Renewed;
        }
        if self.give_back() {
            Decided::Dead
        } else {
            Decided::Ended
        }
    }

    /// `release_many`'s look at a handle it gives up, on the owner thread
    /// under `&mut ObjectManager`: if that handle is the object's only one
    /// (the word holds it and the reservation, and with the manager
    /// borrowed nothing can add a count), gives the reservation back, so
    /// that the handle's count is the word's only one and `release_many`
    /// destroys the object at once, as it did before leases outlived a
    /// collection. `LEASED` stays: a queued check then decides a spent lease
    /// (or nothing, once the object is gone and its slot freed).
    pub(crate) fn yield_to_sole_handle(&self) {
        let reserve = self.reserve.load(Ordering::Relaxed);
        let kept = reserve & RESERVE_COUNT;
        if kept != 0 && self.word.load(Ordering::Relaxed) & COUNT_MASK == kept + 1 {
            // `Release`, as a drop; never to zero (the handle's count stays).
            self.word.fetch_sub(kept, Ordering::Release);
            self.reserve.store(reserve & LEASED, Ordering::Relaxed);
        }
    }

    /// Gives the owner's whole reservation back to the word. Returns true if
    /// that took the count to zero: no handle is left, and the caller links
    /// the slot into a dead list. With nothing reserved (given back already,
    /// as when a second lease was taken before the collection, which queued a
    /// second check; or a vacant slot), nothing changes.
    ///
    /// Only on the owner thread, under `&mut ObjectManager` (collection, or
    /// shutdown's settling, which gives back every reservation, also those
    /// of objects it destroyed in place: their words still hold the counts
    /// left). The subtract is a drop like any other (the reservation's counts
    /// are in the word), so taking the count to zero makes it the last one:
    /// `AcqRel`, as a last drop's decrement and fence, so every use of the
    /// object, here and on other threads, happens before it is destroyed.
    pub(crate) fn give_back(&self) -> bool {
        let reserve = self.reserve.load(Ordering::Relaxed);
        let kept = reserve & RESERVE_COUNT;
        if kept == 0 {
            debug_assert_eq!(reserve & PENDING, 0, "`PENDING` only on a reservation");
            if reserve != 0 {
                // A lease spent by clones: its check is decided now.
                self.reserve.store(0, Ordering::Relaxed);
            }
            return false;
        }
        let old = self.word.fetch_sub(kept, Ordering::AcqRel);
        debug_assert!(is_count(old) && old & COUNT_MASK >= kept, "the reservation's counts are in the word");
        self.reserve.store(0, Ordering::Relaxed);
        let last = old & COUNT_MASK == kept;
        if last {
            self.mark_dead();
        }
        last
    }

    /// True if the object's only counts are its `raw` raw references (at
    /// least one), none of them mid-release: shutdown may then free its
    /// slot, as a raw handle is a plain number that needs the (gone)
    /// manager to be used. `reads_reservation`: the caller is the owner
    /// thread, or the store keeps no reservations (no owner, or `cyclable`).
    pub(crate) fn held_only_by_raw(&self, raw: u32, reads_reservation: bool) -> bool {
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
            // reserved. One load, and exact whatever the owner does: every
            // reserved count is in the word, so such a word means that no
            // handle and no reservation is left, and none can come back (a
            // count is only added through a handle, a reservation, or the
            // manager, which shutdown holds). `Acquire`: the counts went with
            // `Release` decrements, whose release sequences this load reads,
            // so every use of the slot (the owner's plain stores to `reserve`
            // among them) happens before its memory is freed. The price: a
            // slot the owner still reserves counts on keeps its store's
            // memory, a leak.
            return self.word.load(Ordering::Acquire) == raw;
        }
        // Exact: the count less the owner's reservation is the handles and
        // raw references. None is mid-drop either: a drop that took the
        // count to zero leaves the slot unlisted, so held.
        self.ref_count() == raw
    }

    /// True if the slot holds an object whose lease's check would find it
    /// dead (for `dead_count`: exact on the owner thread).
    ///
    /// With `reads_reservation` false, only an object the owner marked
    /// [`PENDING`]: what the other threads' weak reads and iterators take
    /// for dead (see [`is_referenced`](SlotHeader::is_referenced)), so that
    /// an iterator there counts what it yields.
    pub(crate) fn awaits_check(&self, reads_reservation: bool) -> bool {
        let word = self.word.load(Ordering::Acquire);
        let reserve = self.reserve.load(Ordering::Relaxed);
        self.generation.load(Ordering::Relaxed) & 1 == 1
            && is_count(word)
            && (reserve & PENDING != 0 || reads_reservation && word & COUNT_MASK == reserve & RESERVE_COUNT)
    }
}

#[cfg(test)]
mod tests {
    use super::super::slot::DEAD_MARK;
    use super::*;

    /// An occupied header with generation 3, `count` in its word and `reserve` reserved.
    fn header(count: u32, reserve: u32) -> SlotHeader {
        let header = SlotHeader::vacant(2);
        header.generation.store(3, Ordering::Relaxed);
        header.word.store(count, Ordering::Relaxed);
        header.reserve.store(reserve, Ordering::Relaxed);
        header
    }

    const CHECK_3: Check = Check { local: 0, generation: 3 };

    #[test]
    fn the_owner_counts_through_its_reservation() {
        let h = header(1, 0);
        // No reservation: a drop is a plain decrement, and the last is known.
        assert_eq!(h.owner_release(), Released::Last);
        let h = header(1, 0);
        assert!(h.owner_clone(), "a batch: a new lease");
        assert_eq!(
            (h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)),
            (1 + RESERVE_BATCH, (RESERVE_BATCH - 1) | LEASED | USED)
        );
        assert!(!h.owner_clone(), "from the reservation");
        assert_eq!(h.ref_count(), 3);
        assert_eq!(h.owner_release(), Released::Kept);
        assert_eq!(h.owner_release(), Released::Kept);
        assert_eq!(h.reserve.load(Ordering::Relaxed) & PENDING, 0, "a handle is left");
        assert_eq!(h.owner_release(), Released::Kept, "the reservation keeps the count");
        assert_eq!(h.ref_count(), 0);
        assert!(h.reserve.load(Ordering::Relaxed) & PENDING != 0);
        assert!(h.awaits_check(true) && h.awaits_check(false));
        assert!(h.try_add_ref(3).is_err(), "a pending object is not revived");
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Dead, "the give-back is the last drop, used or not");
        assert_eq!((h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)), (0, 0));
    }

    #[test]
    fn a_collection_renews_a_lease_the_owner_used_while_handles_are_left() {
        let h = header(1, 0);
        assert!(h.owner_clone(), "a new lease");
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Renewed, "used, and two handles");
        assert_eq!(
            (h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)),
            (1 + RESERVE_BATCH, (RESERVE_BATCH - 1) | LEASED),
            "renewing writes nothing but the cleared flag"
        );
        // A frame's clone and drop: plain counts, and the lease is used again.
        assert!(!h.owner_clone(), "the lease goes on: no new check");
        assert_eq!(h.owner_release(), Released::Kept);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Renewed);
        // A frame without the owner counting on it: the lease ends.
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Ended);
        assert_eq!((h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)), (2, 0));
        assert_eq!(h.ref_count(), 2);
        assert!(h.owner_clone(), "the next clone takes a new lease");
    }

    #[test]
    fn a_used_lease_ends_once_no_handle_is_left() {
        // The owner's clone and drop, then the last handle goes elsewhere.
        let h = header(1, 0);
        assert!(h.owner_clone());
        assert_eq!(h.owner_release(), Released::Kept);
        assert_eq!(h.try_release(3, None, 0), Ok(Released::Kept), "the reservation holds the count");
        assert_eq!(h.reserve.load(Ordering::Relaxed) & USED, USED);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Dead, "used, but nothing else holds it");
        // An `upgrade` elsewhere won the race with the owner's last drop:
        // the renewal finds it alive, and clears `PENDING`.
        let h = header(1 + RESERVE_BATCH, RESERVE_BATCH | LEASED | USED | PENDING);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Renewed);
        assert_eq!(h.reserve.load(Ordering::Relaxed), RESERVE_BATCH | LEASED);
        assert_eq!(h.ref_count(), 1);
    }

    #[test]
    fn a_collections_later_looks_keep_the_leases_its_first_renewed() {
        let h = header(1, 0);
        assert!(h.owner_clone());
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Renewed, "the first look: used");
        assert_eq!(h.decide_check(CHECK_3, false), Decided::Renewed, "a later round: handles are left");
        assert_eq!(h.reserve.load(Ordering::Relaxed), (RESERVE_BATCH - 1) | LEASED, "nothing given back");
        // A cascade's drop in the first round takes the last handle: the
        // later round finds it dead.
        assert_eq!((h.owner_release(), h.owner_release()), (Released::Kept, Released::Kept));
        assert_eq!(h.decide_check(CHECK_3, false), Decided::Dead);
        // A later look keeps `USED` for the next collection's first.
        let h = header(1, 0);
        assert!(h.owner_clone());
        assert_eq!(h.decide_check(CHECK_3, false), Decided::Renewed);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Renewed);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Ended);
    }

    #[test]
    fn a_batch_spent_before_the_collection_queues_no_second_check() {
        let h = header(1, 0);
        assert!(h.owner_clone(), "a new lease: its check is queued");
        for _ in 1..RESERVE_BATCH {
            assert!(!h.owner_clone());
        }
        assert!(!h.owner_clone(), "a second batch: the first check ends it too");
        assert_eq!(h.ref_count(), 1 + RESERVE_BATCH + 1);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Renewed, "used, and handles are left");
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Ended, "unused since");
        assert_eq!((h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)), (1 + RESERVE_BATCH + 1, 0));
        assert!(h.owner_clone(), "after the give-back, a new lease");
    }

    /// Runs `fast` and `general` on two headers holding `word` and `reserve`,
    /// and asserts that they return the same and leave the same counts.
    fn agree<R: PartialEq + std::fmt::Debug>(
        what: &str,
        (word, reserve): (u32, u32),
        fast: impl Fn(&SlotHeader) -> R,
        general: impl Fn(&SlotHeader) -> R,
    ) {
        let state = |h: &SlotHeader| (h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed));
        let (f, g) = (header(word, reserve), header(word, reserve));
        assert_eq!(fast(&f), general(&g), "{what} of {word}, {reserve:#x}");
        assert_eq!(state(&f), state(&g), "{what} of {word}, {reserve:#x}");
    }

    #[test]
    fn the_fast_clone_and_drop_agree_with_the_general_ones() {
        let flags =
            [0, PENDING, LEASED, USED, PENDING | LEASED, PENDING | USED, LEASED | USED, PENDING | LEASED | USED];
        for count in 0..=RESERVE_MAX {
            for flag in flags {
                // The word holds the reservation and at least the handle being
                // cloned or dropped, and a few more.
                for handles in 1..=RESERVE_MAX + 2 {
                    let reserve = count | flag;
                    let counts = (count + handles, reserve);
                    agree("clone", counts, SlotHeader::owner_clone, |h| h.owner_clone_flagging(reserve));
                    // With no reservation, the drop has one path (the word's).
                    if count > 0 {
                        agree("drop", counts, SlotHeader::owner_release, |h| h.owner_release_full_or_last(reserve));
                    }
                }
            }
        }
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
    fn a_lease_given_back_at_once_keeps_the_clone() {
        let h = header(1, 0);
        assert!(h.owner_clone());
        h.end_lease();
        assert_eq!((h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)), (2, 0));
        assert_eq!(h.ref_count(), 2);
    }

    #[test]
    fn the_give_back_leaves_live_objects_alive() {
        // The owner reserves 3 and a handle is left elsewhere.
        let h = header(4, 3 | PENDING);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Ended);
        assert_eq!((h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)), (1, 0));
        assert_eq!(h.ref_count(), 1);
        // Given back already (a second lease's check): nothing to decide.
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Ended);
        assert_eq!(h.word.load(Ordering::Relaxed), 1);
        // The last handle then goes as without an owner.
        assert_eq!(h.try_release(3, None, 0), Ok(Released::Last));
    }

    #[test]
    fn only_the_owner_subtracts_its_reservation_from_raw_references() {
        // One raw reference and 8 reserved counts: no handle is left, but
        // only the owner can tell (elsewhere the reservation counts as held).
        let h = header(9, 8);
        assert!(h.held_only_by_raw(1, true));
        assert!(!h.held_only_by_raw(1, false));
        // Nothing reserved: the word alone tells, on any thread.
        let h = header(1, 0);
        assert!(h.held_only_by_raw(1, true) && h.held_only_by_raw(1, false));
        assert!(!h.held_only_by_raw(2, false), "a handle is left");
    }

    #[test]
    fn a_check_decides_only_its_own_object() {
        let h = header(2, 2);
        // Another generation: the slot was reused; nothing is decided or given back.
        assert_eq!(h.decide_check(Check { local: 0, generation: 5 }, true), Decided::Ended);
        assert_eq!((h.word.load(Ordering::Relaxed), h.reserve.load(Ordering::Relaxed)), (2, 2));
        // Its own: the count is all the reservation.
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Dead);
        assert_eq!(h.generation.load(Ordering::Relaxed), 3 | DEAD_MARK, "the give-back to zero marks it dead");
        // Shutdown destroyed the object in place (generation 4) and its last
        // handle went since: shutdown's give-back finds it dead.
        let h = header(2, 2 | PENDING);
        h.generation.store(4, Ordering::Relaxed);
        assert_eq!(h.decide_check(CHECK_3, true), Decided::Ended);
        assert!(h.give_back());
        // A vacant slot holds no reservation: nothing to give back.
        assert!(!SlotHeader::vacant(4).give_back());
    }
}
