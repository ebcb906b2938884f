//! Per-thread counter slots: the allocator's fast path.
//!
//! An atomic read-modify-write costs several times a `malloc` on the machines we measure,
//! so the [`TrackingAllocator`](super::TrackingAllocator)'s counting goes to a slot owned
//! by the allocating thread: a relaxed load and store (plain moves), no lock prefix. The
//! owner folds its slot's deltas into the tag's shared counters once they exceed
//! `FLUSH_BYTES` or `FLUSH_COUNT`; readers add the shared counters and every slot, so a
//! quiescent total is exact.
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
/// Fold a slot's byte delta for a tag into the shared counter beyond this.
pub(crate) const FLUSH_BYTES: isize = 64 << 10;
/// Fold a slot's count delta for a tag into the shared counter beyond this.
pub(crate) const FLUSH_COUNT: isize = 64;

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
#[repr(align(32))]
struct TagDelta {
    bytes: AtomicIsize,
    count: AtomicIsize,
    /// Allocations counted here (only grows; folded into `total_count` on flush).
    allocs: AtomicIsize,
}

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
                // is written here before the slot is read as a whole.
                unsafe {
                    ptr::addr_of_mut!((*fresh).pending).write(PendingRecord::new());
                    (*fresh).owner.store(token, Ordering::Relaxed);
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
            let d = &s.tags[tag];
            b = b.wrapping_add(d.bytes.load(Ordering::Relaxed));
            n = n.wrapping_add(d.count.load(Ordering::Relaxed));
            a = a.wrapping_add(d.allocs.load(Ordering::Relaxed));
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
    /// Counts one allocation of `bytes`; returns whether the deltas should be flushed.
    #[inline(always)]
    pub(crate) fn alloc(&self, tag: usize, bytes: isize) -> bool {
        // Only the owner stores (type invariant), so load + store loses nothing.
        let d = &self.tags[tag];
        let b = d.bytes.load(Ordering::Relaxed).wrapping_add(bytes);
        d.bytes.store(b, Ordering::Relaxed);
        let n = d.count.load(Ordering::Relaxed).wrapping_add(1);
        d.count.store(n, Ordering::Relaxed);
        let a = d.allocs.load(Ordering::Relaxed).wrapping_add(1);
        d.allocs.store(a, Ordering::Relaxed);
        b > FLUSH_BYTES || n > FLUSH_COUNT
    }

    /// Counts one free of `bytes`; returns whether the deltas should be flushed.
    #[inline(always)]
    pub(crate) fn free(&self, tag: usize, bytes: isize) -> bool {
        // Only the owner stores (type invariant), so load + store loses nothing.
        let d = &self.tags[tag];
        let b = d.bytes.load(Ordering::Relaxed).wrapping_sub(bytes);
        d.bytes.store(b, Ordering::Relaxed);
        let n = d.count.load(Ordering::Relaxed).wrapping_sub(1);
        d.count.store(n, Ordering::Relaxed);
        b < -FLUSH_BYTES || n < -FLUSH_COUNT
    }

    /// Counts a block's change of size by `delta` bytes (no allocation, no free); returns
    /// whether the deltas should be flushed.
    #[inline]
    pub(crate) fn resize(&self, tag: usize, delta: isize) -> bool {
        // Only the owner stores (type invariant), so load + store loses nothing.
        let d = &self.tags[tag];
        let b = d.bytes.load(Ordering::Relaxed).wrapping_add(delta);
        d.bytes.store(b, Ordering::Relaxed);
        !(-FLUSH_BYTES..=FLUSH_BYTES).contains(&b)
    }

    /// Takes this thread's `(bytes, count, allocs)` deltas for `tag`, to fold them into the
    /// shared counters.
    pub(crate) fn take(&self, tag: usize) -> (isize, isize, isize) {
        let d = &self.tags[tag];
        let b = d.bytes.swap(0, Ordering::Relaxed);
        let n = d.count.swap(0, Ordering::Relaxed);
        let a = d.allocs.swap(0, Ordering::Relaxed);
        (b, n, a)
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
    fn a_second_tracker_does_not_reuse_the_cache() {
        let one = ThreadSlots::new();
        let two = ThreadSlots::new();
        let a = one.slot().unwrap() as *const ThreadSlot;
        let b = two.slot().unwrap() as *const ThreadSlot;
        assert_ne!(a, b);
        assert_eq!(one.slot().unwrap() as *const _, a);
    }
}
