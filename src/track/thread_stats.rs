//! Per-thread counter slots: the allocator's fast path.
//!
//! An atomic read-modify-write costs several times a `malloc` on the machines we measure,
//! so the [`TrackingAllocator`](super::TrackingAllocator)'s counting goes to a slot owned
//! by the allocating thread: relaxed loads and stores (plain moves), no lock prefix. Readers
//! add the shared counters and every slot, so a quiescent total is exact.
//!
//! The owner folds a tag's deltas into the tag's shared counters (raising its peaks) when
//! an allocation finds their *weight*, the bytes plus `FLUSH_WEIGHT` per live block,
//! outside `-FLUSH_BYTES..=FLUSH_BYTES`: while bytes and blocks both grow, that is at the
//! latest when `FLUSH_BYTES` bytes or `FLUSH_COUNT` blocks are pending, as with two
//! separate tests, and a weight that frees took below the range (blocks allocated on other
//! threads) is folded before it can delay that. Frees test nothing: the peaks only rise on
//! allocations, and readers add every slot. The weight is kept as a countdown
//! (`TagDelta::countdown`), tested with one unsigned compare, and it stands for the bytes
//! too: with the blocks counted in and out, it gives them back (`TagDelta::read`).
//!
//! A slot is owned by the thread whose token (the address of a thread-local) it holds.
//! Addresses of thread-locals are unique among live threads, and a new thread can only get
//! a dead thread's address after that thread is gone, so adopting a slot with our token
//! never races with its previous owner. Slots are allocated from `System` on first use and
//! freed with the tracker. A thread that finds no slot (more than `MAX_SLOTS` threads)
//! uses the shared atomics.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, AtomicIsize, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

use super::pending::PendingRecord;
use super::tag::MAX_TAGS;

/// The most thread slots per tracker.
pub(crate) const MAX_SLOTS: usize = if cfg!(miri) { 4 } else { 64 };
/// Fold a slot's deltas for a tag into the shared counters once their weight (see the
/// module docs) is beyond this either way.
pub(crate) const FLUSH_BYTES: isize = 64 << 10;
/// Pending blocks that weigh as much as `FLUSH_BYTES`.
pub(crate) const FLUSH_COUNT: isize = 64;
/// What one pending block weighs, in bytes.
const FLUSH_WEIGHT: isize = FLUSH_BYTES / FLUSH_COUNT;
/// A countdown above this is a weight below `-FLUSH_BYTES`; below zero, one above
/// `FLUSH_BYTES`. Both are above it as unsigned numbers.
const COUNTDOWN_MAX: usize = 2 * FLUSH_BYTES as usize;

/// One thread's pending deltas, per tag, and its pending record. Invariant: only the owning
/// thread (`owner`) stores to `tags` (except `take`, by the owner too) and to `exit_hooked`;
/// anyone may load them. `pending` follows its own protocol (see `PendingRecord`).
pub(crate) struct ThreadSlot {
    owner: AtomicUsize,
    /// Whether the owner registered the thread-exit flush of `pending` (see `pending.rs`);
    /// until it has, its records go to the table.
    pub(crate) exit_hooked: AtomicBool,
    pub(crate) pending: PendingRecord,
    tags: [TagDelta; MAX_TAGS],
}

/// One tag's pending deltas in a thread slot, side by side so a count touches one cache line.
///
/// Three words, of which an allocation updates two and a free two: the blocks counted in
/// and out, and a countdown that holds the bytes. Invariant: `countdown == FLUSH_BYTES -
/// (bytes + FLUSH_WEIGHT * (allocs - frees))` (wrapping), where `bytes` is the pending byte
/// delta; [`TagDelta::read`] solves it for `bytes`. `ThreadSlots::slot_slow` and
/// [`ThreadSlot::take`] set it with every delta zero, and every update keeps it.
#[repr(align(32))]
pub(crate) struct TagDelta {
    /// Allocations counted here (only grows until taken; folded into `total_count`).
    allocs: AtomicIsize,
    /// Frees counted here (only grows until taken).
    frees: AtomicIsize,
    /// `FLUSH_BYTES` minus the weight: above `COUNTDOWN_MAX` as unsigned, flush.
    countdown: AtomicIsize,
}

const _: () = assert!(std::mem::size_of::<TagDelta>() == 32, "a tag's deltas fill half a cache line");

static NEXT_TRACKER_ID: AtomicU64 = AtomicU64::new(1);

/// The cache's id before this thread counted anywhere: no tracker has it (ids count up
/// from 1), so a match always comes with a slot.
const NO_TRACKER: u64 = u64::MAX;

thread_local! {
    /// `(tracker id, slot)` of the last tracker this thread counted into; the slot is
    /// dangling while the id is `NO_TRACKER` (never dereferenced then).
    static CACHE: Cell<(u64, NonNull<ThreadSlot>)> = const { Cell::new((NO_TRACKER, NonNull::dangling())) };
    /// Its address is this thread's token.
    static TOKEN: u8 = const { 0 };
}

/// A tracker's thread slots.
///
/// Invariants: `slots[i]` is null or points to a `ThreadSlot` allocated by `System` (zeroed,
/// its `pending` written), set once and freed only in `Drop`; `id` is 0 or a process-unique id, so a
/// thread's cached slot pointer can never be matched to another tracker.
pub(crate) struct ThreadSlots {
    id: AtomicU64,
    slots: [AtomicPtr<ThreadSlot>; MAX_SLOTS],
}

impl ThreadSlots {
    pub(crate) const fn new() -> Self {
        Self { id: AtomicU64::new(0), slots: [const { AtomicPtr::new(ptr::null_mut()) }; MAX_SLOTS] }
    }

    /// This thread's slot if it is cached (the fast path: one load, one thread-local read
    /// and one compare); `None` sends the caller to [`ThreadSlots::slot`].
    #[inline(always)]
    pub(crate) fn cached_slot(&self) -> Option<&ThreadSlot> {
        let id = self.id.load(Ordering::Relaxed);
        let (cached_id, p) = CACHE.try_with(Cell::get).ok()?;
        // A tracker without slots has id 0, which the cache never holds.
        if cached_id == id {
            // SAFETY: the cache holds a slot of the tracker with this unique id, which is
            // alive (we borrow it); its slots live as long as it does.
            return Some(unsafe { p.as_ref() });
        }
        None
    }

    /// This thread's slot, if it has or can get one.
    #[inline]
    pub(crate) fn slot(&self) -> Option<&ThreadSlot> {
        let id = self.id.load(Ordering::Relaxed);
        if id != 0 {
            if let Ok((cached_id, p)) = CACHE.try_with(Cell::get) {
                if cached_id == id {
                    // SAFETY: the cache holds a slot of the tracker with this unique id, which
                    // is alive (we borrow it); its slots live as long as it does.
                    return Some(unsafe { p.as_ref() });
                }
            }
        }
        self.slot_slow()
    }

    #[cold]
    #[inline(never)]
    fn slot_slow(&self) -> Option<&ThreadSlot> {
        let mut id = self.id.load(Ordering::Relaxed);
        if id == 0 {
            let fresh = NEXT_TRACKER_ID.fetch_add(1, Ordering::Relaxed);
            id = match self.id.compare_exchange(0, fresh, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => fresh,
                Err(existing) => existing,
            };
        }
        let token = TOKEN.try_with(|t| t as *const u8 as usize).ok()?;
        let layout = Layout::new::<ThreadSlot>();
        for cell in &self.slots {
            let mut p = cell.load(Ordering::Acquire);
            if p.is_null() {
                // SAFETY: `ThreadSlot` has a non-zero size.
                let fresh = unsafe { System.alloc_zeroed(layout) }.cast::<ThreadSlot>();
                if fresh.is_null() {
                    return None;
                }
                // SAFETY: `fresh` is unshared and valid for writes of a `ThreadSlot`; all-zero
                // bytes are valid for every field but `pending` (std atomics of zero), which
                // is written here before the slot is read as a whole. The countdowns start
                // at `FLUSH_BYTES` (`TagDelta`'s invariant with every delta zero).
                unsafe {
                    ptr::addr_of_mut!((*fresh).pending).write(PendingRecord::new());
                    (*fresh).owner.store(token, Ordering::Relaxed);
                    for d in &(*fresh).tags {
                        d.countdown.store(FLUSH_BYTES, Ordering::Relaxed);
                    }
                }
                match cell.compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => p = fresh,
                    Err(other) => {
                        // SAFETY: `fresh` was never shared; it came from `System` with `layout`.
                        unsafe { System.dealloc(fresh.cast(), layout) };
                        p = other;
                    }
                }
            }
            // SAFETY: non-null slot pointers stay valid while the tracker lives.
            let slot = unsafe { &*p };
            if slot.owner.load(Ordering::Relaxed) == token {
                let _ = CACHE.try_with(|c| c.set((id, NonNull::from(slot))));
                return Some(slot);
            }
        }
        None
    }

    /// Whether any thread got a slot (slots are taken in order, so the first is set then).
    pub(crate) fn used(&self) -> bool {
        !self.slots[0].load(Ordering::Relaxed).is_null()
    }

    /// Calls `f` on every allocated slot.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&ThreadSlot)) {
        for cell in &self.slots {
            let p = cell.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: non-null slot pointers stay valid while the tracker lives.
                f(unsafe { &*p });
            }
        }
    }

    /// The pending `(bytes, count, allocs)` deltas of `tag` over all slots.
    pub(crate) fn pending(&self, tag: usize) -> (isize, isize, isize) {
        let (mut b, mut n, mut a) = (0isize, 0isize, 0isize);
        self.for_each(|s| {
            let (bytes, count, allocs) = s.tags[tag].read();
            b = b.wrapping_add(bytes);
            n = n.wrapping_add(count);
            a = a.wrapping_add(allocs);
        });
        (b, n, a)
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        let mut n = 0;
        self.for_each(|_| n += 1);
        n * std::mem::size_of::<ThreadSlot>()
    }
}

impl Drop for ThreadSlots {
    fn drop(&mut self) {
        for cell in &self.slots {
            let p = cell.load(Ordering::Acquire);
            if !p.is_null() {
                // SAFETY: allocated by `System` with this layout in `slot_slow`, and the
                // tracker is being dropped, so no thread uses the slot any more. Its fields
                // are dropped first (a no-op outside loom).
                unsafe {
                    ptr::drop_in_place(p);
                    System.dealloc(p.cast(), Layout::new::<ThreadSlot>());
                }
            }
        }
    }
}

impl fmt::Debug for ThreadSlots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut n = 0;
        self.for_each(|_| n += 1);
        f.debug_struct("ThreadSlots").field("slots", &n).finish()
    }
}

impl ThreadSlot {
    /// The address of this slot's first `TagDelta` (tag 0); tag `i`'s is `i` further.
    #[inline]
    pub(crate) fn tags_ptr(&self) -> *const TagDelta {
        self.tags.as_ptr()
    }

    /// Counts one allocation of `bytes` under `tag`; returns whether the deltas should be
    /// flushed.
    #[inline(always)]
    pub(crate) fn alloc(&self, tag: usize, bytes: isize) -> bool {
        self.tags[tag].alloc(bytes)
    }

    /// Counts one free of `bytes` under `tag` (a free never flushes; see the module docs).
    #[inline(always)]
    pub(crate) fn free(&self, tag: usize, bytes: isize) {
        self.tags[tag].free(bytes);
    }

    /// Counts a block's change of size by `delta` bytes (no allocation, no free); returns
    /// whether the deltas should be flushed.
    #[inline]
    pub(crate) fn resize(&self, tag: usize, delta: isize) -> bool {
        // Only the owner stores (type invariant), so load + store loses nothing.
        let d = &self.tags[tag];
        let left = d.countdown.load(Ordering::Relaxed).wrapping_sub(delta);
        d.countdown.store(left, Ordering::Relaxed);
        left as usize > COUNTDOWN_MAX
    }

    /// Takes this thread's `(bytes, count, allocs)` deltas for `tag`, to fold them into the
    /// shared counters. Only the owner calls it.
    pub(crate) fn take(&self, tag: usize) -> (isize, isize, isize) {
        let d = &self.tags[tag];
        let taken = d.read();
        d.allocs.store(0, Ordering::Relaxed);
        d.frees.store(0, Ordering::Relaxed);
        d.countdown.store(FLUSH_BYTES, Ordering::Relaxed);
        taken
    }
}

impl TagDelta {
    /// Counts one allocation of `bytes`; returns whether the deltas should be flushed. Only
    /// the owner of the slot calls it (`ThreadSlot`'s invariant), so a load and a store lose
    /// nothing (and the count compiles to one add to memory).
    #[inline(always)]
    pub(crate) fn alloc(&self, bytes: isize) -> bool {
        self.allocs.store(self.allocs.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        let left = self.countdown.load(Ordering::Relaxed).wrapping_sub(bytes.wrapping_add(FLUSH_WEIGHT));
        self.countdown.store(left, Ordering::Relaxed);
        left as usize > COUNTDOWN_MAX
    }

    /// Counts one free of `bytes`. As for [`alloc`](Self::alloc), only the owner calls it.
    #[inline(always)]
    pub(crate) fn free(&self, bytes: isize) {
        self.frees.store(self.frees.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        let left = self.countdown.load(Ordering::Relaxed).wrapping_add(bytes.wrapping_add(FLUSH_WEIGHT));
        self.countdown.store(left, Ordering::Relaxed);
    }

    /// The pending `(bytes, count, allocs)`. Exact when the owner is not counting (it is the
    /// owner, or the owner is between calls); a read racing with it may pair its newest
    /// count with an older countdown, and so be off by `FLUSH_WEIGHT` bytes per block it
    /// counted meanwhile.
    fn read(&self) -> (isize, isize, isize) {
        let allocs = self.allocs.load(Ordering::Relaxed);
        let count = allocs.wrapping_sub(self.frees.load(Ordering::Relaxed));
        let weight = FLUSH_BYTES.wrapping_sub(self.countdown.load(Ordering::Relaxed));
        (weight.wrapping_sub(count.wrapping_mul(FLUSH_WEIGHT)), count, allocs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_thread_gets_its_own_slot() {
        let slots = ThreadSlots::new();
        let a = slots.slot().unwrap() as *const ThreadSlot as usize;
        assert_eq!(slots.slot().unwrap() as *const ThreadSlot as usize, a);
        slots.slot().unwrap().alloc(3, 100);
        std::thread::scope(|s| {
            s.spawn(|| {
                let b = slots.slot().unwrap();
                assert_ne!(b as *const ThreadSlot as usize, a);
                b.free(3, 40);
            });
        });
        assert_eq!(slots.pending(3), (60, 0, 1));
        assert_eq!(slots.slot().unwrap().take(3), (100, 1, 1));
        assert!(slots.heap_bytes() >= std::mem::size_of::<ThreadSlot>());
    }

    #[test]
    fn the_weight_decides_the_flush_and_gives_the_bytes_back() {
        let slots = ThreadSlots::new();
        let s = slots.slot().unwrap();
        for _ in 0..10_000 {
            assert!(!s.alloc(1, 64), "an allocation freed at once never flushes");
            s.free(1, 64);
        }
        assert_eq!(s.take(1), (0, 0, 10_000));
        for _ in 1..FLUSH_COUNT {
            assert!(!s.alloc(2, 1));
        }
        assert!(s.alloc(2, 1), "FLUSH_COUNT small blocks weigh more than FLUSH_BYTES");
        assert_eq!(s.take(2), (FLUSH_COUNT, FLUSH_COUNT, FLUSH_COUNT));
        assert!(s.alloc(3, FLUSH_BYTES + 1), "one block over FLUSH_BYTES");
        s.take(3);
        // Frees of blocks counted elsewhere take the weight down; the next allocation sees it.
        s.free(3, FLUSH_BYTES + 1);
        assert!(!s.alloc(3, 1), "a weight of -FLUSH_BYTES is in range");
        s.free(3, 2);
        assert!(s.alloc(3, 1), "a weight below -FLUSH_BYTES is folded");
        s.take(3);
        assert!(s.alloc(4, 1 << 40));
        s.free(4, 3);
        assert!(s.resize(4, -(1 << 39)));
        assert_eq!(slots.pending(4), ((1 << 40) - 3 - (1 << 39), 0, 1), "the bytes, solved from the countdown");
        s.free(5, 100);
        assert_eq!(s.take(5), (-100, -1, 0), "a free of a block counted elsewhere");
    }

    #[test]
    fn a_second_tracker_does_not_reuse_the_cache() {
        let one = ThreadSlots::new();
        let two = ThreadSlots::new();
        let a = one.slot().unwrap() as *const ThreadSlot;
        let b = two.slot().unwrap() as *const ThreadSlot;
        assert_ne!(a, b);
        assert_eq!(one.slot().unwrap() as *const _, a);
    }
}
