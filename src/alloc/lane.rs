//! [`Lanes`]: one small-object class's slots, tracked by one bit each, split into *lanes* of
//! consecutive bitmap words that threads own while they allocate from them.
//!
//! The owner of a lane allocates and frees in it with plain (relaxed load + store) updates of
//! the bitmap words: no lock and no atomic read-modify-write. Every other change goes through
//! the class's lock: a thread freeing a slot in a lane it does not own queues the slot when
//! another thread owns the lane (the owner applies the queued frees later) or clears the bit
//! itself when nobody does, and lanes change hands under the lock.
//!
//! Unlike a [`Page`](super::page::Page), a lane has no metadata of its own: the one bit per
//! slot is all the state kept per slot. Who owns a lane is known to the owner (its thread
//! cache, [`LaneCache`]) and to the lock holder (the `owned` mask); other threads never need
//! to know *who* owns it, only *whether* someone does, and they ask under the lock.

use std::collections::HashSet;

#[cfg(loom)]
use loom::sync::atomic::AtomicU8;
#[cfg(not(loom))]
use std::sync::atomic::AtomicU8;

use crate::sync::{AtomicU64, Mutex, Ordering};

/// "No word" for a thread's active word.
const NO_WORD: u32 = u32::MAX;

/// One bit per slot in `ceil(slots / 8)` bytes: the whole 64-slot words, then the bytes of
/// the last, partial word.
///
/// Invariants:
/// 1. Bit `i` (word `i / 64`, bit `i % 64`) is set exactly when slot `i` is not free: handed
///    out, or freed by a thread that does not own its lane and queued for the owner.
/// 2. The bits past the last slot in the last byte are always set, and a word's missing
///    bytes read as set, so no scan finds them free.
/// 3. Each word has one writer at a time (see [`Lanes`]); others only read single bits.
struct Bitmap {
    words: Box<[AtomicU64]>,
    tail: Box<[AtomicU8]>,
}

impl Bitmap {
    fn new(slots: usize) -> Bitmap {
        let rest = slots % 64;
        let tail = (0..rest.div_ceil(8))
            .map(|b| {
                let valid = (rest - b * 8).min(8) as u32;
                AtomicU8::new(u8::MAX.checked_shl(valid).unwrap_or(0))
            })
            .collect();
        Bitmap { words: (0..slots / 64).map(|_| AtomicU64::new(0)).collect(), tail }
    }

    /// Words, counting the partial one.
    fn len(&self) -> usize {
        self.words.len() + usize::from(!self.tail.is_empty())
    }

    fn bytes(&self) -> usize {
        self.words.len() * 8 + self.tail.len()
    }

    /// Word `w` (a relaxed load; exact for the word's writer). Words past the end read as
    /// full.
    #[inline(always)]
    fn load(&self, w: usize) -> u64 {
        match self.words.get(w) {
            Some(word) => word.load(Ordering::Relaxed),
            None if w == self.words.len() => self.load_tail(),
            None => u64::MAX,
        }
    }

    #[cold]
    #[inline(never)]
    fn load_tail(&self) -> u64 {
        self.tail.iter().enumerate().fold(u64::MAX, |word, (i, byte)| {
            word & !(0xFF << (8 * i)) | u64::from(byte.load(Ordering::Relaxed)) << (8 * i)
        })
    }

    /// Stores word `w` (its one writer only, invariant 3).
    #[inline(always)]
    fn store(&self, w: usize, value: u64) {
        match self.words.get(w) {
            Some(word) => word.store(value, Ordering::Relaxed),
            None => self.store_tail(value),
        }
    }

    /// Stores the partial last word (its one writer only); bits past the tail are dropped.
    #[cold]
    #[inline(never)]
    fn store_tail(&self, value: u64) {
        for (i, byte) in self.tail.iter().enumerate() {
            byte.store((value >> (8 * i)) as u8, Ordering::Relaxed);
        }
    }

    /// Whether slot `slot`'s bit is set (any thread; one atomic load).
    fn is_set(&self, slot: usize) -> bool {
        match self.words.get(slot / 64) {
            Some(word) => word.load(Ordering::Relaxed) >> (slot % 64) & 1 != 0,
            None => self.tail[slot % 64 / 8].load(Ordering::Relaxed) >> (slot % 8) & 1 != 0,
        }
    }
}

/// One class's slots: the bitmap, split into at most 64 lanes of `1 << lane_shift` words.
///
/// Invariants:
/// 1. A lane is *owned* while its bit in `owned` is set; `owned` changes only under `shared`,
///    so the lock holder knows exactly which lanes are owned. The owning thread records the
///    lane in its [`LaneCache::mine`]; no other thread's cache has it.
/// 2. The words of an owned lane are written only by its owner (relaxed load + store, no
///    lock); the words of an unowned lane only under `shared`. A lane changes hands under
///    `shared`, whose release and acquire order the last writer's stores before the next's.
/// 3. `shared.queued` holds the slots freed by threads that do not own the slot's lane, while
///    another thread owns it; their bits are still set, their debug fill already written.
///    `quiet` has the bit of every lane with no queued slot (clear while the lane has one:
///    the complement, so the fast paths test it with no `not`), and changes only under
///    `shared`.
///    An owner applies its lanes' queued frees (under the lock) before any free of its own in
///    such a lane, so a double free whose first free was queued is seen at the second call.
/// 4. `held` of a thread's [`LaneCounts`] is the number of set bits (slots not free) in the
///    lanes it owns, and `shared.loose` the number in unowned lanes.
pub(crate) struct Lanes {
    bits: Bitmap,
    slots: usize,
    /// Where the slots lie, in bytes into the allocator's region: slot `s` at
    /// `start + s × slot_size`. The lanes never touch the slots; they keep this so that a
    /// thread's active word carries the offset of its first slot (`LaneCache::active_at`),
    /// and the alloc's fast path finds its slot with one multiply and one add.
    start: usize,
    slot_size: usize,
    lane_shift: u32,
    lanes: u32,
    owned: AtomicU64,
    quiet: AtomicU64,
    shared: Mutex<Shared>,
    /// Never repeats: a [`LaneCache`] is bound to the `Lanes` it owns lanes of (see there).
    id: u32,
    /// How many times the lock was taken, so tests can check the fast paths take none.
    #[cfg(test)]
    locks: std::sync::atomic::AtomicU64,
}

/// The part of a class behind its lock.
#[derive(Default)]
struct Shared {
    /// Slots freed into lanes other threads own, for their owners to apply.
    queued: HashSet<u32>,
    /// Where the next search for an unowned lane starts.
    cursor: u32,
    /// Slots not free in unowned lanes.
    loose: u64,
    /// How many of `loose` are counted in `peaks` already: left by threads that exited
    /// holding them, or in the unowned lanes when a thread last took one over. Frees count
    /// against these first, so this never overstates how many of them are still live, and
    /// `loose - inherited` never understates the rest.
    inherited: u64,
    /// The most slots there have been in unowned lanes, without the inherited ones, since a
    /// thread last took one over.
    loose_peak: u64,
    /// Slots handed out under the lock, plus those counted by threads that have exited.
    allocations: u64,
    /// Peaks that no longer grow: those of threads that have exited, and those of the
    /// unowned lanes up to each take-over.
    peaks: u64,
}

/// One thread's counts in one class: written only by that thread (relaxed load + store),
/// read by anyone.
///
/// `held`, the number of slots not free in the thread's lanes (invariant 4 of [`Lanes`]), is
/// `allocations + offset` (wrapping): an allocation only bumps `allocations`, and only frees
/// and lanes changing hands touch `offset`. Only the owner reads `held`, so `offset` lives
/// in its [`LaneCache`], and a free touches no shared count.
///
/// The peak counts only the thread's *own* slots, `held - carried`: `carried` are the live
/// slots of the lanes it took over, which the peaks of the class (of the thread that left
/// them, or of the unowned lanes) counted already, so counting them again would count a slot
/// twice just because it changed threads. Frees count against `carried` first (which slot
/// was freed is not known), so it never overstates how many of them are still live.
///
/// The peak is not updated on every allocation, and nor is `carried` on every free: between
/// two refills `held` grows only by allocations (a lane is taken over only in a refill), so
/// `mark + allocations`, with `mark` the own count at the last refill, bounds the own count
/// from above until the next one; frees in between lower it, first by lowering `carried`,
/// which the next refill works out from how far `offset` fell. A refill folds the bound into
/// `peak`, and readers fold in the current one. With no frees in between the bound is exact;
/// otherwise it overstates the peak by at most the slots freed since the last refill beyond
/// `carried`.
///
/// These are statistics, not part of the lane protocol (the bitmap is the state), so they
/// are `std`'s atomics even under loom, which then need not explore their orderings.
#[derive(Debug, Default)]
pub(crate) struct LaneCounts {
    allocations: std::sync::atomic::AtomicU64,
    mark: std::sync::atomic::AtomicU64,
    /// Written and read by the owner only, at refills (readers need only `mark`).
    carried: std::sync::atomic::AtomicU64,
    peak: std::sync::atomic::AtomicU64,
}

impl LaneCounts {
    #[inline(always)]
    fn take(&self) {
        self.allocations.store(self.allocations.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }

    /// Takes back the count of a slot just taken and put back (owner only): it was never
    /// handed out, so it is in neither `held` nor the bound.
    fn untake(&self) {
        self.allocations.store(self.allocations.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
    }

    /// The upper bound of `held` since the last refill (0 if a reader's loads were torn).
    fn bound(&self) -> u64 {
        let bound = self.mark.load(Ordering::Relaxed).wrapping_add(self.allocations.load(Ordering::Relaxed));
        if bound > u64::MAX / 2 {
            0
        } else {
            bound
        }
    }

    /// At a refill (owner only, `offset` its cache's): folds the bound since the last refill
    /// into the peak, counts the frees since then against `carried` first, and starts the
    /// next bound from the own count of now.
    fn refilled(&self, offset: u64) {
        let peak = self.peak.load(Ordering::Relaxed).max(self.bound());
        self.peak.store(peak, Ordering::Relaxed);
        let (mark, carried) = (self.mark.load(Ordering::Relaxed), self.carried.load(Ordering::Relaxed));
        // `offset` fell by the frees since the last refill, from `mark + carried` then.
        let freed = mark.wrapping_add(carried).wrapping_sub(offset);
        let carried = carried.saturating_sub(freed);
        self.carried.store(carried, Ordering::Relaxed);
        self.mark.store(offset.wrapping_sub(carried), Ordering::Relaxed);
    }

    /// At a refill that takes over a lane with `held` slots not free, all counted in the
    /// class's peaks already (owner only): they join `held` but not the own count.
    fn take_over(&self, cache: &mut LaneCache, held: u64) {
        self.refilled(cache.offset);
        cache.add_held(held);
        self.carried.store(self.carried.load(Ordering::Relaxed) + held, Ordering::Relaxed);
    }

    /// Allocations and the most held at once (an upper bound, see the type's docs).
    fn read(&self) -> (u64, u64) {
        (self.allocations.load(Ordering::Relaxed), self.peak.load(Ordering::Relaxed).max(self.bound()))
    }

    /// Slots held now (the owner, with its cache).
    fn held(&self, cache: &LaneCache) -> u64 {
        self.allocations.load(Ordering::Relaxed).wrapping_add(cache.offset)
    }

    /// Starts over (owner only, when its lanes go back).
    fn clear(&self) {
        for counter in [&self.allocations, &self.mark, &self.carried, &self.peak] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// What one thread keeps for one class in its thread cache.
///
/// Invariants: a cache is used with one [`Lanes`] only, by the one thread whose thread cache
/// holds it (`mine` names lanes of that `Lanes` this thread owns, whose bitmap words it
/// updates with plain loads and stores; the cache keeps that `Lanes`' id, which every path
/// that acts on `mine` checks, but the two fast ones, `unsafe fn`s with that contract); and
/// a non-zero `active_lane` means `active` is a whole word of the bitmap of the [`Lanes`]
/// that set it (only [`Lanes::set_active`] makes it non-zero), so the alloc's fast path
/// indexes the word without a bounds check, and `active_at` is the region offset of that
/// word's first slot.
#[derive(Debug)]
pub(crate) struct LaneCache {
    /// Bit `l` set while this thread owns lane `l`.
    mine: u64,
    /// The word allocations come from first (in a lane of `mine`), or [`NO_WORD`].
    active: u32,
    /// The bit of the active word's lane if it is a whole word; 0 with no active word or
    /// with the partial last word active (those take the out-of-line path).
    active_lane: u64,
    /// Where the active word's first slot lies, in bytes into the region.
    active_at: usize,
    /// `held - allocations` of this thread's [`LaneCounts`] (wrapping; see there).
    offset: u64,
    /// The id of the [`Lanes`] whose lanes `mine` names (0 before the first). 32 bits, so
    /// that it fills the padding after `active` and the cache stays 40 bytes (a wider one
    /// cost the small-object loop two instructions a pair).
    lanes: u32,
}

impl Default for LaneCache {
    fn default() -> Self {
        LaneCache { lanes: 0, mine: 0, active: NO_WORD, active_lane: 0, active_at: 0, offset: 0 }
    }
}

/// A slot the alloc's fast path took: its index, and where it lies in bytes into the
/// region (from the active word's `active_at`, with no multiply by the index).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Taken {
    pub(crate) slot: usize,
    pub(crate) at: usize,
}

impl LaneCache {
    /// Leaves the cache with no active word; its lanes and their count stay the thread's.
    fn clear_active(&mut self) {
        (self.active, self.active_lane) = (NO_WORD, 0);
    }

    #[inline(always)]
    fn add_held(&mut self, n: u64) {
        self.offset = self.offset.wrapping_add(n);
    }

    #[inline(always)]
    fn sub_held(&mut self, n: u64) {
        self.offset = self.offset.wrapping_sub(n);
    }
}

#[cold]
#[inline(never)]
fn wrong_cache() -> ! {
    panic!("a lane cache used with another class's lanes");
}

/// The id of a new [`Lanes`]: never 0 (an unbound cache's) and never repeated.
fn next_lanes_id() -> u32 {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| id.checked_add(1))
        .unwrap_or_else(|_| panic!("lane ids exhausted: 2^32 - 1 small-object classes were made"))
}

impl Lanes {
    /// Panics unless `cache` names no lanes or this `Lanes`' (`LaneCache`'s invariant: its
    /// plain stores to the words of the lanes in `mine` are right only for their `Lanes`).
    /// The paths that act on `mine` call it, but the two fast ones, which are `unsafe fn`s
    /// with that contract.
    #[inline(always)]
    fn check_cache(&self, cache: &LaneCache) {
        if cache.mine != 0 && cache.lanes != self.id {
            wrong_cache();
        }
    }

    /// Bitmap words of the class, counting the partial last one: what a refill that finds
    /// nothing has visited.
    pub(crate) fn words(&self) -> usize {
        self.bits.len()
    }

    /// Whole bitmap words of the class: all but the partial last one, if any.
    pub(crate) fn whole_words(&self) -> usize {
        self.bits.words.len()
    }

    /// Whether other threads' frees wait queued for this thread's lanes (`cache` is its
    /// cache of the class), for its next refill to apply. A queued free that happened
    /// before this call cleared its lane's `quiet` bit before it (invariant 3), so a relaxed
    /// load sees it.
    #[inline]
    pub(crate) fn has_queued_for(&self, cache: &LaneCache) -> bool {
        cache.mine & !self.quiet.load(Ordering::Relaxed) != 0
    }

    /// A class of `slots` free slots of `slot_size` bytes from `start` bytes into the
    /// region, every lane unowned.
    ///
    /// # Panics
    ///
    /// Panics if `slots` is `2^32` or more, or if the slots would end past `usize::MAX`.
    pub(crate) fn new(slots: usize, start: usize, slot_size: usize) -> Lanes {
        assert!(slots < 1 << 32, "a small-object class holds fewer than 2^32 slots");
        // So that every offset `set_active` and the fast path compute fits.
        let end = slots.checked_next_multiple_of(64).and_then(|s| s.checked_mul(slot_size));
        assert!(end.and_then(|e| e.checked_add(start)).is_some(), "the slots end past usize::MAX");
        let bits = Bitmap::new(slots);
        let words = bits.len();
        let mut lane_shift = 0;
        while words.div_ceil(1 << lane_shift) > 64 {
            lane_shift += 1;
        }
        Lanes {
            id: next_lanes_id(),
            lanes: words.div_ceil(1 << lane_shift) as u32,
            bits,
            slots,
            start,
            slot_size,
            lane_shift,
            owned: AtomicU64::new(0),
            quiet: AtomicU64::new(u64::MAX),
            shared: Mutex::new(Shared::default()),
            #[cfg(test)]
            locks: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Takes the class's lock.
    fn lock(&self) -> impl std::ops::DerefMut<Target = Shared> + '_ {
        #[cfg(test)]
        self.locks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.shared.lock()
    }

    /// How many times the lock has been taken.
    #[cfg(test)]
    pub(crate) fn locks_taken(&self) -> u64 {
        self.locks.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bytes of the bitmap: exactly `ceil(slots / 8)`.
    pub(crate) fn bitmap_bytes(&self) -> usize {
        self.bits.bytes()
    }

    #[inline(always)]
    fn lane_bit(&self, w: usize) -> u64 {
        1 << (w >> self.lane_shift)
    }

    /// The bits of word `w` that stand for slots.
    fn valid(&self, w: usize) -> u64 {
        let end = self.slots - w * 64;
        if end >= 64 {
            u64::MAX
        } else {
            (1 << end) - 1
        }
    }

    /// The words of lane `l`.
    fn lane_words(&self, l: u32) -> std::ops::Range<usize> {
        let first = (l as usize) << self.lane_shift;
        first..(first + (1 << self.lane_shift)).min(self.bits.len())
    }

    /// The owner's path: takes the lowest free slot of the active word (or, when it is
    /// full, of the next word of this thread's lanes with one), unless its lane has queued
    /// frees (they are applied first, by [`refill`](Self::refill): a queued free of a slot
    /// that is free already is a raced double free, and must be seen before the slot is
    /// handed out again).
    ///
    /// # Safety
    ///
    /// `cache`'s active word was last set by this `Lanes` (or never: a default cache), as
    /// `LaneCache`'s invariant asks.
    #[inline]
    pub(crate) unsafe fn take_active(&self, cache: &mut LaneCache, counts: &LaneCounts) -> Option<usize> {
        // SAFETY: forwarded contract.
        if let Some(taken) = unsafe { self.take_active_fast(cache, counts) } {
            return Some(taken.slot);
        }
        // No active word, the partial last word and queued frees take the out-of-line path.
        if cache.active_lane & self.quiet.load(Ordering::Relaxed) == 0 {
            return self.take_in(cache, counts);
        }
        self.take_next(cache, counts)
    }

    /// [`take_active`](Self::take_active)'s common case, with no call in it: the lowest free
    /// slot of a whole active word whose lane has no queued frees; `None`, having changed
    /// nothing, in every other case (then `take_active` decides).
    ///
    /// # Safety
    ///
    /// As `take_active`.
    #[inline(always)]
    pub(crate) unsafe fn take_active_fast(&self, cache: &mut LaneCache, counts: &LaneCounts) -> Option<Taken> {
        // One test for "a whole word, with no queued frees in its lane".
        if cache.active_lane & self.quiet.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let w = cache.active as usize;
        // SAFETY: `LaneCache`'s invariant (the caller's contract): with a non-zero
        // `active_lane`, `w` is one of `words`.
        let cell = unsafe { self.bits.words.get_unchecked(w) };
        // Invariant 2: `w` is in a lane this thread owns, so this thread is its one writer.
        let word = cell.load(Ordering::Relaxed);
        if word == u64::MAX {
            return None;
        }
        let bit = (!word).trailing_zeros() as usize;
        cell.store(word | 1 << bit, Ordering::Relaxed);
        counts.take();
        // No overflow: `new` checked that every slot's offset fits.
        let taken = Taken { slot: w * 64 + bit, at: cache.active_at + bit * self.slot_size };
        debug_assert_eq!(taken.at, self.start + taken.slot * self.slot_size, "active_at of word {w}");
        Some(taken)
    }

    /// [`take_active`](Self::take_active) with the active word full: makes the next word of
    /// this thread's lanes with a free slot the active one and takes its lowest, with no lock.
    /// `None` (take `take_active`, then [`refill`](Self::refill)) if no whole word is active
    /// (no word, or the partial last one), or the thread's lanes have queued frees or no free
    /// slot.
    #[cold]
    #[inline(never)]
    fn take_next(&self, cache: &mut LaneCache, counts: &LaneCounts) -> Option<usize> {
        self.take_next_inline(cache, counts).ok()
    }

    /// [`take_next`](Self::take_next), inlined into the allocator's slow path (whose common
    /// case it is), so that moving to the next word takes no call. `Err(true)` if it searched
    /// every word of the thread's lanes and found no free slot, so a refill need not search
    /// them again; `Err(false)` if it did not search.
    #[inline(always)]
    pub(crate) fn take_next_inline(&self, cache: &mut LaneCache, counts: &LaneCounts) -> Result<usize, bool> {
        self.check_cache(cache);
        if cache.active_lane == 0 || self.has_queued_for(cache) {
            return Err(false);
        }
        self.next_own_word(cache, counts).ok_or(true)?;
        // SAFETY: `next_own_word` just set the active word, through `set_active`.
        unsafe { self.take_active(cache, counts) }.ok_or(false)
    }

    /// Makes word `w` of this thread's lanes the active one (`LaneCache`'s invariant).
    fn set_active(&self, cache: &mut LaneCache, w: usize) {
        cache.active = w as u32;
        cache.active_at = self.start + w * 64 * self.slot_size;
        cache.active_lane = if w < self.bits.words.len() { self.lane_bit(w) } else { 0 };
    }

    /// Makes the next word after the active one, in this thread's lanes, that has a free slot
    /// the active one, or `None` if there is none.
    #[inline(always)]
    fn next_own_word(&self, cache: &mut LaneCache, counts: &LaneCounts) -> Option<()> {
        if cache.mine == 0 {
            return None;
        }
        let words = self.bits.len();
        let start = if cache.active == NO_WORD { 0 } else { cache.active as usize + 1 };
        let start = start.min(words);
        let w = (start..words)
            .chain(0..start)
            .find(|&w| cache.mine & self.lane_bit(w) != 0 && self.bits.load(w) != u64::MAX)?;
        self.set_active(cache, w);
        counts.refilled(cache.offset);
        Some(())
    }

    /// [`take_active`](Self::take_active) when the active word is not a whole one (the
    /// partial last word, or `NO_WORD`) or its lane has queued frees (`None` then).
    #[cold]
    #[inline(never)]
    fn take_in(&self, cache: &LaneCache, counts: &LaneCounts) -> Option<usize> {
        let w = cache.active as usize;
        if cache.active_lane != 0 || cache.active == NO_WORD {
            return None;
        }
        if self.quiet.load(Ordering::Relaxed) & self.lane_bit(w) == 0 {
            return None;
        }
        let word = self.bits.load(w);
        if word == u64::MAX {
            return None;
        }
        let bit = (!word).trailing_zeros();
        self.bits.store(w, word | 1 << bit);
        counts.take();
        Some(w * 64 + bit as usize)
    }

    /// The owner's path of a free: `None` if the slot's lane is not this thread's or has
    /// queued frees (take [`free_shared`](Self::free_shared) then); `Err` if the slot is free
    /// already. `fill` runs after the check, before the slot becomes free.
    #[inline(always)]
    pub(crate) fn free_owned(&self, cache: &mut LaneCache, slot: usize, fill: impl FnOnce()) -> Option<Result<(), ()>> {
        self.check_cache(cache);
        if !self.is_quiet_own_lane(cache, slot) {
            return None;
        }
        let freed = self.clear(slot, fill);
        if freed.is_ok() {
            cache.sub_held(1);
        }
        Some(freed)
    }

    /// [`free_owned`](Self::free_owned)'s common case, with no call in it: frees a handed-out
    /// slot in a quiet lane of this thread's and returns `true`; otherwise returns `false`
    /// having changed nothing, and `free_owned` decides.
    ///
    /// # Safety
    ///
    /// `slot` is in one of the bitmap's whole words (below [`whole_words`](Self::whole_words)
    /// times 64), so its word is indexed without a bounds check.
    #[inline(always)]
    pub(crate) unsafe fn free_owned_fast(&self, cache: &mut LaneCache, slot: usize, fill: impl FnOnce()) -> bool {
        if !self.is_quiet_own_lane(cache, slot) {
            return false;
        }
        debug_assert!(slot / 64 < self.bits.words.len(), "slot {slot} past the whole words");
        // SAFETY: the caller's contract.
        let cell = unsafe { self.bits.words.get_unchecked(slot / 64) };
        let word = cell.load(Ordering::Relaxed);
        // Cleared first and compared, so x86 clears and tests with one `btr` and a compare.
        let cleared = word & !(1u64 << (slot % 64));
        if cleared == word {
            return false;
        }
        fill();
        cell.store(cleared, Ordering::Relaxed);
        cache.sub_held(1);
        true
    }

    /// Whether slot `slot` lies in a lane this thread owns with no queued frees. A queued
    /// free that happened before this call cleared its lane's `quiet` bit before it
    /// (invariant 3), so a relaxed load sees it.
    #[inline(always)]
    fn is_quiet_own_lane(&self, cache: &LaneCache, slot: usize) -> bool {
        let lane = (slot / 64) >> self.lane_shift;
        (cache.mine & self.quiet.load(Ordering::Relaxed)) >> lane & 1 != 0
    }

    /// Clears slot `slot`'s bit (its word's writer only), or `Err` if it is clear.
    #[inline(always)]
    fn clear(&self, slot: usize, fill: impl FnOnce()) -> Result<(), ()> {
        // The shift takes the slot's low six bits, as `slot % 64` would.
        let (w, bit) = (slot / 64, 1u64.wrapping_shl(slot as u32));
        // One bounds check for the load and the store; the partial last word takes the
        // out-of-line path.
        let cell = self.bits.words.get(w);
        let word = match cell {
            Some(cell) => cell.load(Ordering::Relaxed),
            None => self.bits.load_tail(),
        };
        if word & bit == 0 {
            return Err(());
        }
        fill();
        let word = word ^ bit;
        match cell {
            Some(cell) => cell.store(word, Ordering::Relaxed),
            None => self.bits.store_tail(word),
        }
        Ok(())
    }

    /// Finds this thread a free slot and takes it: in its own lanes (after applying their
    /// queued frees), else in an unowned lane it takes over. Also returns the slots found
    /// freed twice while applying queued frees (see [`apply_queued`](Self::apply_queued)).
    ///
    /// `own_searched`: the caller has just searched every word of the thread's lanes and
    /// found none free ([`take_next_inline`](Self::take_next_inline)'s `Err(true)`); they are
    /// then searched again only if queued frees were applied to them since.
    #[cold]
    #[inline(never)]
    pub(crate) fn refill(
        &self,
        cache: &mut LaneCache,
        counts: &LaneCounts,
        own_searched: bool,
    ) -> (Option<usize>, Vec<usize>) {
        self.check_cache(cache);
        let mut raced = Vec::new();
        let mut search_own = !own_searched;
        if self.has_queued_for(cache) {
            let mut shared = self.lock();
            raced = self.apply_queued(&mut shared, cache);
            search_own = true;
        }
        if search_own && self.next_own_word(cache, counts).is_some() {
            // SAFETY: `next_own_word` just set the active word, through `set_active`.
            return (unsafe { self.take_active(cache, counts) }, raced);
        }
        let mut shared = self.lock();
        let owned = self.owned.load(Ordering::Relaxed);
        for n in 0..self.lanes {
            let l = (shared.cursor + n) % self.lanes;
            if owned & 1 << l != 0 {
                continue;
            }
            let Some(w) = self.lane_words(l).find(|&w| self.bits.load(w) != u64::MAX) else { continue };
            // Invariants 1, 2 and 4: the lane becomes this thread's, with its slots not free.
            self.owned.store(owned | 1 << l, Ordering::Relaxed);
            let held: u64 =
                self.lane_words(l).map(|w| u64::from((self.bits.load(w) & self.valid(w)).count_ones())).sum();
            shared.loose -= held;
            // The unowned lanes' peak so far counts every slot in them now that is not
            // inherited: it stops growing, so all of them count as inherited from here on,
            // and this thread's peak need not count the ones it takes.
            shared.peaks += shared.loose_peak;
            shared.loose_peak = 0;
            shared.inherited = shared.loose;
            shared.cursor = l + 1;
            drop(shared);
            cache.lanes = self.id;
            cache.mine |= 1 << l;
            self.set_active(cache, w);
            counts.take_over(cache, held);
            // SAFETY: the active word was just set, through `set_active`.
            return (unsafe { self.take_active(cache, counts) }, raced);
        }
        cache.clear_active();
        (None, raced)
    }

    /// Applies the queued frees of the lanes in `mine` (their owner, holding the lock) and
    /// returns the slots among them already free: a double free whose two frees raced (the
    /// owner's own free passed its check before the other thread's was queued). Those are
    /// dropped, so each slot is free once.
    fn apply_queued(&self, shared: &mut Shared, cache: &mut LaneCache) -> Vec<usize> {
        let mine = cache.mine;
        let mut raced = Vec::new();
        let mut applied = 0;
        shared.queued.retain(|&slot| {
            let slot = slot as usize;
            if mine & self.lane_bit(slot / 64) == 0 {
                return true;
            }
            // The fill was written when the slot was queued.
            match self.clear(slot, || {}) {
                Ok(()) => applied += 1,
                Err(()) => raced.push(slot),
            }
            false
        });
        cache.sub_held(applied);
        self.quiet.store(self.quiet.load(Ordering::Relaxed) | mine, Ordering::Relaxed);
        raced
    }

    /// A free the owner's fast path did not take: the owner's own, in a lane with queued
    /// frees (`cache` is this thread's, when it has one), or another thread's. `fill` runs
    /// after the checks, before the slot becomes free (or is queued). `Err` if the slot is
    /// free already or queued already. Also returns the slots found freed twice while
    /// applying queued frees.
    #[cold]
    #[inline(never)]
    pub(crate) fn free_shared(
        &self,
        cache: Option<&mut LaneCache>,
        slot: usize,
        fill: impl FnOnce(),
    ) -> (Result<(), ()>, Vec<usize>) {
        let lane = self.lane_bit(slot / 64);
        if let Some(cache) = &cache {
            self.check_cache(cache);
        }
        let mut shared = self.lock();
        if let Some(cache) = cache.filter(|cache| cache.mine & lane != 0) {
            let raced = self.apply_queued(&mut shared, cache);
            let freed = self.clear(slot, fill);
            if freed.is_ok() {
                cache.sub_held(1);
            }
            return (freed, raced);
        }
        if self.owned.load(Ordering::Relaxed) & lane != 0 {
            // Another thread owns the lane: queue the slot for it. The bit is read without
            // the owner's ordering; a free of this slot that happened before this call
            // cleared it before, so a clear bit is a double free (and a set one that is
            // really free can only come from two frees racing: see `apply_queued`).
            if !self.bits.is_set(slot) || shared.queued.contains(&(slot as u32)) {
                return (Err(()), Vec::new());
            }
            fill();
            shared.queued.insert(slot as u32);
            self.quiet.store(self.quiet.load(Ordering::Relaxed) & !lane, Ordering::Relaxed);
            return (Ok(()), Vec::new());
        }
        // Nobody owns the lane: the lock holder is its words' writer (invariant 2).
        let freed = self.clear(slot, fill);
        if freed.is_ok() {
            shared.loose -= 1;
            shared.inherited = shared.inherited.saturating_sub(1);
        }
        (freed, Vec::new())
    }

    /// Puts back slot `slot` of this thread's lanes, just taken by
    /// [`take_active`](Self::take_active) or [`refill`](Self::refill) and never handed out
    /// (debug builds' use-after-free check refused it), and takes back its count: the
    /// thread's allocations and peak are as if it had not been taken. `false` if the slot's
    /// lane is not this thread's.
    #[cold]
    #[inline(never)]
    pub(crate) fn untake(&self, cache: &LaneCache, counts: &LaneCounts, slot: usize) -> bool {
        self.check_cache(cache);
        if cache.mine & self.lane_bit(slot / 64) == 0 {
            return false;
        }
        // Invariant 2: this thread is the word's one writer; the bit was set just now.
        let cleared = self.clear(slot, || {});
        debug_assert!(cleared.is_ok(), "slot {slot} was just taken");
        counts.untake();
        true
    }

    /// Takes a free slot from an unowned lane under the lock, for a thread without a cache:
    /// `Ok(None)` if there is none, `Err(slot)` if `intact(slot)` (debug builds' use-after-free
    /// check, run under the lock, before the slot can be taken) refused the lowest free one,
    /// which stays free and counts nowhere.
    #[cold]
    #[inline(never)]
    pub(crate) fn take_unowned(&self, intact: impl FnOnce(usize) -> bool) -> Result<Option<usize>, usize> {
        let mut shared = self.lock();
        let owned = self.owned.load(Ordering::Relaxed);
        for l in (0..self.lanes).filter(|l| owned & 1 << l == 0) {
            for w in self.lane_words(l) {
                let word = self.bits.load(w);
                if word != u64::MAX {
                    let bit = (!word).trailing_zeros();
                    let slot = w * 64 + bit as usize;
                    if !intact(slot) {
                        return Err(slot);
                    }
                    self.bits.store(w, word | 1 << bit);
                    shared.loose += 1;
                    shared.loose_peak = shared.loose_peak.max(shared.loose - shared.inherited);
                    shared.allocations += 1;
                    return Ok(Some(slot));
                }
            }
        }
        Ok(None)
    }

    /// Gives back every lane of `cache` (a thread leaving), after applying their queued
    /// frees, and moves its counts into the class's. Returns the slots found freed twice.
    pub(crate) fn release(&self, cache: &mut LaneCache, counts: &LaneCounts) -> Vec<usize> {
        self.check_cache(cache);
        let mut shared = self.lock();
        let raced = self.apply_queued(&mut shared, cache);
        let ((allocations, peak), held) = (counts.read(), counts.held(cache));
        self.owned.store(self.owned.load(Ordering::Relaxed) & !cache.mine, Ordering::Relaxed);
        // The thread's peak counts its held slots already: as loose ones they are inherited,
        // so they do not raise `loose_peak` a second time.
        shared.loose += held;
        shared.inherited += held;
        shared.allocations += allocations;
        shared.peaks += peak;
        counts.clear();
        *cache = LaneCache::default();
        raced
    }

    /// Slots not free now, without the queued ones (a snapshot; exact when no other thread
    /// is allocating or freeing in the class). The bits are read under the lock, so a thread
    /// applying queued frees as it exits is seen before or after, never halfway.
    pub(crate) fn live(&self) -> usize {
        let shared = self.lock();
        let set: usize = (0..self.bits.len()).map(|w| (self.bits.load(w) & self.valid(w)).count_ones() as usize).sum();
        set - shared.queued.len()
    }

    /// Allocations and the most slots in use at once (an upper bound: the sum of each
    /// thread's peak, and of the unowned lanes', each counting a slot only while it has not
    /// changed threads), given the counts of the threads using the class now.
    pub(crate) fn totals<'a>(&self, threads: impl Iterator<Item = &'a LaneCounts>) -> (u64, usize) {
        let shared = self.lock();
        let (mut allocations, mut peak) = (shared.allocations, shared.peaks + shared.loose_peak);
        for counts in threads {
            let (a, p) = counts.read();
            allocations += a;
            peak += p;
        }
        (allocations, (peak as usize).min(self.slots))
    }
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes")
            .field("slots", &self.slots)
            .field("lanes", &self.lanes)
            .field("owned", &format_args!("{:#x}", self.owned.load(Ordering::Relaxed)))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// [`Lanes::take_active`] for a cache only `lanes` has changed.
    fn take(lanes: &Lanes, cache: &mut LaneCache, counts: &LaneCounts) -> Option<usize> {
        // SAFETY: each test keeps its cache with one `Lanes`.
        unsafe { lanes.take_active(cache, counts) }
    }

    /// Allocations, slots held and the peak of `counts`, the counts of the thread of `cache`.
    fn read(counts: &LaneCounts, cache: &LaneCache) -> (u64, u64, u64) {
        let (allocations, peak) = counts.read();
        (allocations, counts.held(cache), peak)
    }

    #[test]
    fn bitmap_is_one_bit_per_slot() {
        for (slots, bytes) in [(0, 0), (1, 1), (8, 1), (9, 2), (64, 8), (1000, 125), (4096, 512)] {
            let lanes = Lanes::new(slots, 0, 8);
            assert_eq!(lanes.bitmap_bytes(), bytes, "{slots} slots");
            assert_eq!(lanes.live(), 0);
        }
        let bits = Bitmap::new(70);
        assert_eq!(bits.load(1), !0b11_1111, "bits past the last slot read as set");
        bits.store(1, !0b11_1110);
        assert!(bits.is_set(64) && !bits.is_set(65) && bits.is_set(70));
    }

    #[test]
    fn lanes_cover_the_words() {
        let lanes = Lanes::new(37_440, 0, 8); // 585 words: lanes of 16 words
        assert_eq!((lanes.lane_shift, lanes.lanes), (4, 37));
        assert_eq!(lanes.lane_words(36), 576..585);
        let lanes = Lanes::new(4096, 0, 8);
        assert_eq!((lanes.lane_shift, lanes.lanes), (0, 64));
    }

    /// A cache holding lanes of one class, used with another's, would have its thread store
    /// to words of lanes it does not own there.
    #[test]
    fn a_cache_is_refused_by_another_class_lanes() {
        let (a, b) = (Lanes::new(128, 0, 8), Lanes::new(128, 0, 8));
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        assert_eq!(a.refill(&mut mine, &counts, false).0, Some(0));
        let refused = |f: &dyn Fn(&mut LaneCache)| {
            let mut cache = LaneCache { ..mine };
            let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut cache))).err();
            panic.and_then(|p| p.downcast_ref::<&str>().map(|m| m.contains("another class's lanes"))) == Some(true)
        };
        assert!(refused(&|cache| {
            let _ = b.refill(cache, &counts, false);
        }));
        assert!(refused(&|cache| {
            let _ = b.free_owned(cache, 0, || {});
        }));
        assert!(refused(&|cache| {
            let _ = b.take_next_inline(cache, &counts);
        }));
        assert!(refused(&|cache| {
            let _ = b.free_shared(Some(cache), 0, || {});
        }));
        assert!(refused(&|cache| {
            let _ = b.untake(cache, &counts, 0);
        }));
        assert!(refused(&|cache| {
            let _ = b.release(cache, &counts);
        }));
        // Its own class takes it as before.
        assert_eq!(a.free_owned(&mut mine, 0, || {}), Some(Ok(())));
    }

    /// A refill that finds no slot anywhere leaves the thread its lanes, and its count of
    /// the slots they hold (the cache's `offset`) with them.
    #[test]
    fn a_refill_that_finds_nothing_keeps_the_held_count() {
        let lanes = Lanes::new(64, 0, 8); // one word, one lane
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, Some(0));
        for _ in 1..64 {
            take(&lanes, &mut mine, &counts).unwrap();
        }
        assert_eq!(lanes.free_owned(&mut mine, 5, || {}), Some(Ok(())));
        assert_eq!(take(&lanes, &mut mine, &counts), Some(5));
        assert_eq!(take(&lanes, &mut mine, &counts), None, "full");
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, None, "no free slot anywhere");
        assert_eq!(read(&counts, &mine).1, 64, "every slot held, each counted once");
        assert_eq!(lanes.free_owned(&mut mine, 7, || {}), Some(Ok(())), "the lane is still this thread's");
        assert_eq!(read(&counts, &mine).1, 63);
    }

    /// A refill told that the thread's words were just searched in vain skips them, and goes
    /// back to them when it applies a free another thread queued there meanwhile.
    #[test]
    fn a_refill_after_a_search_looks_again_only_at_queued_frees() {
        let lanes = Lanes::new(128, 0, 8); // 2 words, one lane each
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, Some(0));
        for slot in 1..64 {
            assert_eq!(take(&lanes, &mut mine, &counts), Some(slot));
        }
        assert_eq!(lanes.take_next_inline(&mut mine, &counts), Err(true), "lane 0 searched: full");
        // Another thread frees slot 9 into this thread's lane: queued.
        assert_eq!(lanes.free_shared(None, 9, || {}), (Ok(()), vec![]));
        assert_eq!(lanes.take_next_inline(&mut mine, &counts), Err(false), "queued frees: no search");
        assert_eq!(lanes.refill(&mut mine, &counts, true).0, Some(9), "the queued free, in lane 0");
        assert_eq!(lanes.take_next_inline(&mut mine, &counts), Err(true));
        assert_eq!(lanes.refill(&mut mine, &counts, true).0, Some(64), "lane 1, taken over");
        assert_eq!(read(&counts, &mine).1, 65);
    }

    #[test]
    fn owner_queue_and_unowned_frees() {
        let lanes = Lanes::new(130, 0, 8); // 3 words, one lane each
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        assert_eq!(take(&lanes, &mut mine, &counts), None, "no lane yet");
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, Some(0));
        assert_eq!(take(&lanes, &mut mine, &counts), Some(1));
        assert_eq!(lanes.free_owned(&mut mine, 0, || {}), Some(Ok(())));
        assert_eq!(lanes.free_owned(&mut mine, 0, || {}), Some(Err(())), "double free");
        // Another thread frees slot 1: queued, since this thread owns the lane.
        assert_eq!(lanes.free_shared(None, 1, || {}), (Ok(()), vec![]));
        assert_eq!(lanes.free_shared(None, 1, || {}), (Err(()), vec![]), "queued twice");
        assert_eq!(lanes.free_owned(&mut mine, 1, || {}), None, "queued frees go first");
        assert_eq!(lanes.free_shared(Some(&mut mine), 1, || {}), (Err(()), vec![]));
        assert_eq!(lanes.live(), 0);
        assert_eq!(read(&counts, &mine), (2, 0, 2));
        // A thread without a cache allocates from an unowned lane and frees there.
        let slot = lanes.take_unowned(|_| true).unwrap().unwrap();
        assert_eq!(slot, 64);
        assert_eq!(lanes.free_shared(None, slot, || {}), (Ok(()), vec![]));
        assert_eq!(lanes.free_shared(None, slot, || {}), (Err(()), vec![]));
        lanes.release(&mut mine, &counts);
        assert_eq!(lanes.totals([&counts].into_iter()), (3, 3));
    }

    /// Slots a thread without a cache put in an unowned lane count in the unowned lanes'
    /// peak; a thread that takes the lane over does not count them again.
    #[test]
    fn unowned_slots_taken_over_count_once() {
        let lanes = Lanes::new(128, 0, 8); // two lanes of one word
        for _ in 0..50 {
            lanes.take_unowned(|_| true).unwrap().unwrap();
        }
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, Some(50), "the lane with the 50 slots");
        assert_eq!(lanes.totals([&counts].into_iter()), (51, 51));
        // More slots without a cache, in the other lane: 65 live, never more.
        for _ in 0..14 {
            assert!(lanes.take_unowned(|_| true).unwrap().unwrap() >= 64);
        }
        assert_eq!(lanes.totals([&counts].into_iter()), (65, 65));
    }

    /// A thread's own peak leaves out the slots it took over, also once it freed some of
    /// them: frees count against those first.
    #[test]
    fn frees_of_taken_over_slots_count_against_them_first() {
        let lanes = Lanes::new(128, 0, 8); // two lanes of one word
        let slots: Vec<_> = (0..40).map(|_| lanes.take_unowned(|_| true).unwrap().unwrap()).collect();
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, Some(40), "the lane with the 40 slots");
        for &slot in &slots[..10] {
            assert_eq!(lanes.free_owned(&mut mine, slot, || {}), Some(Ok(())));
        }
        for _ in 0..33 {
            take(&lanes, &mut mine, &counts).unwrap();
        }
        // 30 taken over and 34 of its own fill the word: the next one takes the other lane,
        // and the refill finds 30 of the 40 still live.
        assert_eq!(read(&counts, &mine).2, 34);
        assert_eq!(take(&lanes, &mut mine, &counts), None);
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, Some(64));
        assert_eq!(read(&counts, &mine), (35, 65, 35));
        // The 40 the unowned lanes' peak counted, and 35 of the thread's own: 10 were freed
        // between, so the true peak (65, now) is exceeded by those 10 only.
        assert_eq!(lanes.totals([&counts].into_iter()), (75, 75));
    }

    /// A slot refused after it was taken (by its owner) or before (without a cache) counts
    /// nowhere: not in the allocations, not in a peak, and it stays free.
    #[test]
    fn refused_slots_count_nowhere() {
        let lanes = Lanes::new(128, 0, 8); // two lanes of one word
        assert_eq!(lanes.take_unowned(|slot| slot != 0), Err(0), "checked before it is taken");
        assert_eq!((lanes.live(), lanes.totals(std::iter::empty())), (0, (0, 0)));
        assert_eq!(lanes.take_unowned(|_| true), Ok(Some(0)));
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        assert_eq!(lanes.refill(&mut mine, &counts, false).0, Some(1), "the lane of slot 0, taken over");
        let slot = take(&lanes, &mut mine, &counts).unwrap();
        assert!(lanes.untake(&mine, &counts, slot));
        assert_eq!(read(&counts, &mine), (1, 2, 1), "one allocation of its own, and slot 0 taken over");
        assert!(!lanes.untake(&mine, &counts, 64), "not this thread's lane");
        assert_eq!(take(&lanes, &mut mine, &counts), Some(slot), "free again");
        assert_eq!(lanes.totals([&counts].into_iter()), (3, 3));
    }

    #[test]
    fn racing_double_free_shows_when_applied() {
        let lanes = Lanes::new(64, 0, 8);
        let (mut mine, counts) = (LaneCache::default(), LaneCounts::default());
        let slot = lanes.refill(&mut mine, &counts, false).0.unwrap();
        // The other thread's free is queued after the owner's passed its check (the race).
        assert_eq!(lanes.free_shared(None, slot, || {}), (Ok(()), vec![]));
        assert_eq!(lanes.clear(slot, || {}), Ok(()));
        mine.sub_held(1);
        assert_eq!(take(&lanes, &mut mine, &counts), None, "queued frees are applied first");
        let (again, raced) = lanes.refill(&mut mine, &counts, false);
        assert_eq!((again, raced), (Some(slot), vec![slot]), "found, dropped, and the slot is free once");
    }
}
