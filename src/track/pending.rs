//! A thread's pending record: the record of the newest block a
//! [`TrackingAllocator`](super::TrackingAllocator) placed on this thread, kept in the thread's
//! own slot instead of the shared record table.
//!
//! Most blocks die young, and most on the thread that made them: a block allocated and freed
//! before the thread's next recorded allocation never touches the table (no shard lock, no
//! hash). The protocol, for one slot (see `BENCHMARKS.md`, T2):
//!
//! - **Publish** (owner, slot empty): the fields are written inside a sequence-counter window
//!   (odd while writing), so readers on other threads get a consistent copy without a lock.
//! - **Cancel** (owner frees its pending block): a relaxed load and a relaxed store of the
//!   address, no read-modify-write.
//! - **Move** (owner, when the next allocation needs the slot, and at thread exit): under the
//!   lock of the record's shard, the record goes into the table and the slot empties.
//! - **Claim** (another thread frees the pending block): under the lock of the block's shard,
//!   after a table miss, the claimer reads the record, checks the sequence, and takes the
//!   address out with a compare-and-swap. Claim and move hold the same lock, so a record is
//!   moved or claimed, never both.
//! - **Read** (reports): under the shard's lock, a sequence-checked copy; a record is moved
//!   only under that lock, so a report sees it once, in the slot or in the table.
//! - **Look** (the explicit API, asking whether an address has the tracker's own record):
//!   under the shard's lock, the table and then every slot's address (no copy of the
//!   fields); a record pending when the lock was taken is in one or the other.
//!
//! One race is not decided: a block freed at the same moment by its owner (cancel) and by
//! another thread (claim) — a double free racing itself — may pass both checks, since the
//! cancel uses no read-modify-write. A double free whose frees are ordered (the usual bug) is
//! caught as before: the second free finds no record anywhere.

use std::cell::Cell;
use std::panic::Location;

use crate::sync::{fence, spin, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

use super::record::Record;
use super::scope::Reentry;
use super::tag::TagId;
use super::thread_stats::ThreadSlot;
use super::tracker::Tracker;

/// One thread's pending record.
///
/// # Invariants
///
/// - Only the owning thread stores to `seq`, `size`, `tag_flags`, `site` and `stack`, and
///   only between the odd and the even store of `seq` ([`PendingRecord::publish`]).
/// - `addr` is 0 (empty) or the address of a live block whose record the fields hold; only
///   the owner makes it non-zero (inside the `seq` window, when it was 0). It goes back to 0
///   by the owner's cancel or move, or by a claim; moves and claims happen under the lock of
///   the record's shard (the caller's duty).
/// - `site` always holds a `&'static Location` (it starts with one), so a copy read at any
///   time can be turned back into a reference.
#[derive(Debug)]
pub struct PendingRecord {
    seq: AtomicU64,
    addr: AtomicUsize,
    size: AtomicUsize,
    /// The tag id (low 32 bits) and the record's flags (high 32 bits).
    tag_flags: AtomicU64,
    site: AtomicPtr<Location<'static>>,
    stack: AtomicU32,
}

impl Default for PendingRecord {
    fn default() -> Self {
        Self::new()
    }
}

impl PendingRecord {
    /// An empty slot.
    pub fn new() -> Self {
        let site: &'static Location<'static> = Location::caller();
        Self {
            seq: AtomicU64::new(0),
            addr: AtomicUsize::new(0),
            size: AtomicUsize::new(0),
            tag_flags: AtomicU64::new(0),
            site: AtomicPtr::new(site as *const Location<'static> as *mut Location<'static>),
            stack: AtomicU32::new(0),
        }
    }

    /// The address pending, or 0. Owner only: another thread's claim may have emptied the
    /// slot since, so a non-zero answer is confirmed under the shard lock
    /// ([`PendingRecord::move_out`]); a 0 is final until the owner publishes.
    #[inline(always)]
    pub fn held(&self) -> usize {
        self.addr.load(Ordering::Relaxed)
    }

    /// Makes `(addr, record)` the pending record. Owner only, with the slot empty
    /// (`held() == 0`); `addr` is non-zero.
    #[inline(always)]
    pub(crate) fn publish(&self, addr: usize, record: Record) {
        debug_assert!(addr != 0 && self.held() == 0, "publish into an empty slot");
        let seq = self.seq.load(Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(1), Ordering::Relaxed);
        // Orders the odd `seq` before the field stores, for readers that see a new field.
        fence(Ordering::Release);
        self.size.store(record.size, Ordering::Relaxed);
        self.tag_flags.store(u64::from(record.tag.0) | u64::from(record.flags) << 32, Ordering::Relaxed);
        self.site.store(record.site as *const Location<'static> as *mut Location<'static>, Ordering::Relaxed);
        self.stack.store(record.stack, Ordering::Relaxed);
        self.addr.store(addr, Ordering::Relaxed);
        // Readers that see the even `seq` with `Acquire` see every store above.
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The fields as a record (a copy; consistent when the caller validates `seq` around it,
    /// or is the owner).
    #[inline(always)]
    fn fields(&self) -> Record {
        let tag_flags = self.tag_flags.load(Ordering::Relaxed);
        let site = self.site.load(Ordering::Relaxed);
        Record {
            size: self.size.load(Ordering::Relaxed),
            tag: TagId(tag_flags as u32),
            flags: (tag_flags >> 32) as u32,
            // SAFETY: `site` only ever holds pointers made from `&'static Location`s (type
            // invariant), whichever store this load saw.
            site: unsafe { &*site },
            stack: self.stack.load(Ordering::Relaxed),
        }
    }

    /// Takes `addr`'s record out if it is the pending one: the owner's free. No
    /// read-modify-write (see the module docs for the one race this leaves open).
    #[inline(always)]
    pub(crate) fn cancel(&self, addr: usize) -> Option<Record> {
        if self.addr.load(Ordering::Relaxed) != addr {
            return None;
        }
        let record = self.fields();
        self.addr.store(0, Ordering::Relaxed);
        Some(record)
    }

    /// Whether `addr` is the pending record: a check from any thread. Only meaningful under
    /// the lock of `addr`'s shard, which keeps the record from being moved or claimed
    /// meanwhile (see `Tracker::pending_anywhere`); no copy of the fields, so no sequence
    /// check.
    #[inline]
    pub(crate) fn holds(&self, addr: usize) -> bool {
        self.addr.load(Ordering::Relaxed) == addr
    }

    /// Offers the pending record to `put` (which stores it in the table) and empties the slot
    /// if `put` returns `true`. Returns `false` only if `put` refused. Owner only, holding the
    /// lock of the shard of the address [`PendingRecord::held`] returned.
    pub(crate) fn move_out(&self, put: impl FnOnce(usize, Record) -> bool) -> bool {
        // The lock orders this after any claim, so a claimed slot reads 0 here.
        let addr = self.addr.load(Ordering::Relaxed);
        if addr == 0 {
            return true;
        }
        if !put(addr, self.fields()) {
            return false;
        }
        self.addr.store(0, Ordering::Relaxed);
        true
    }

    /// Takes `addr`'s record out if it is pending here: a free on another thread than the
    /// owner. The caller holds the lock of `addr`'s shard (so the owner cannot move it
    /// meanwhile) and found no record for `addr` in the table.
    pub(crate) fn claim(&self, addr: usize) -> Option<Record> {
        let seq = self.seq.load(Ordering::Acquire);
        // Odd: the owner is publishing, so the slot was empty and `addr` is not in it.
        if seq & 1 != 0 || self.addr.load(Ordering::Relaxed) != addr {
            return None;
        }
        let record = self.fields();
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != seq {
            return None; // republished meanwhile: only after a cancel of `addr`
        }
        // Fails if the owner cancelled `addr` meanwhile, and never empties a newer record.
        self.addr.compare_exchange(addr, 0, Ordering::Relaxed, Ordering::Relaxed).ok()?;
        Some(record)
    }

    /// A consistent copy of the pending record, if any. Any thread; a report calls it under
    /// the shard lock of the records it collects, so a record being moved into the table is
    /// seen in exactly one place.
    pub(crate) fn read(&self) -> Option<(usize, Record)> {
        loop {
            let seq = self.seq.load(Ordering::Acquire);
            if seq & 1 == 0 {
                let addr = self.addr.load(Ordering::Relaxed);
                let record = self.fields();
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == seq {
                    return (addr != 0).then_some((addr, record));
                }
            }
            spin();
        }
    }
}

/// How many trackers' pending records one thread flushes when it exits; a thread that
/// records into more trackers puts the others' records straight into their tables.
const EXIT_HOOKS: usize = 8;

/// The thread's pending records to move into their tables when the thread exits.
///
/// Invariant: each entry is a tracker and the slot this thread owns in it; both are
/// `'static` (a slot lives as long as its tracker).
struct ExitFlush {
    hooks: Cell<[Option<(&'static Tracker, &'static ThreadSlot)>; EXIT_HOOKS]>,
}

impl Drop for ExitFlush {
    fn drop(&mut self) {
        for (tracker, slot) in self.hooks.get().into_iter().flatten() {
            let held = slot.pending.held();
            // A record the table has no room for stays pending, where reports and frees on
            // other threads still find it.
            if held != 0 {
                let _ = tracker.move_pending(slot, held);
            }
            // This thread's later allocations (in other thread-locals' destructors) cannot
            // hook again, so they go to the table; a thread adopting the slot hooks anew.
            slot.exit_hooked.store(false, Ordering::Relaxed);
        }
    }
}

std::thread_local! {
    static EXIT_FLUSH: ExitFlush = const { ExitFlush { hooks: Cell::new([None; EXIT_HOOKS]) } };
}

/// Registers the move of `slot`'s pending record into `tracker`'s table at this thread's
/// exit, and marks the slot hooked. `false` if it cannot (the thread is exiting, or hooks
/// too many trackers): the thread's records then go to the table. `slot` is the calling
/// thread's slot in `tracker`.
#[cold]
#[inline(never)]
pub(crate) fn hook_thread_exit(tracker: &'static Tracker, slot: &'static ThreadSlot) -> bool {
    // Registering a thread-local destructor may allocate on some platforms: untracked.
    let _reentry = Reentry::enter();
    EXIT_FLUSH
        .try_with(|exit| {
            let mut hooks = exit.hooks.get();
            let Some(free) = hooks.iter_mut().find(|h| h.is_none()) else {
                return false;
            };
            *free = Some((tracker, slot));
            exit.hooks.set(hooks);
            slot.exit_hooked.store(true, Ordering::Relaxed);
            true
        })
        .unwrap_or(false)
}

/// The protocol with a plain record, for the loom models in `tests/loom.rs`: a record is
/// `size` with the tag `size + 1` and the stack `size + 2`, so a torn copy shows.
#[cfg(loom)]
mod model {
    use super::{PendingRecord, Record, TagId};
    use std::panic::Location;

    fn record(size: usize) -> Record {
        Record { size, tag: TagId(size as u32 + 1), flags: 16, site: Location::caller(), stack: size as u32 + 2 }
    }

    fn size_of(r: Record) -> usize {
        assert_eq!((r.tag.0, r.flags, r.stack), (r.size as u32 + 1, 16, r.size as u32 + 2), "torn record");
        r.size
    }

    impl PendingRecord {
        /// [`PendingRecord::publish`] of the record of `size`.
        pub fn model_publish(&self, addr: usize, size: usize) {
            self.publish(addr, record(size));
        }

        /// [`PendingRecord::cancel`].
        pub fn model_cancel(&self, addr: usize) -> Option<usize> {
            self.cancel(addr).map(size_of)
        }

        /// [`PendingRecord::move_out`], into `table`.
        pub fn model_move_out(&self, table: &mut Vec<(usize, usize)>) {
            assert!(self.move_out(|addr, r| {
                table.push((addr, size_of(r)));
                true
            }));
        }

        /// [`PendingRecord::claim`].
        pub fn model_claim(&self, addr: usize) -> Option<usize> {
            self.claim(addr).map(size_of)
        }

        /// [`PendingRecord::holds`].
        pub fn model_holds(&self, addr: usize) -> bool {
            self.holds(addr)
        }

        /// [`PendingRecord::read`].
        pub fn model_read(&self) -> Option<(usize, usize)> {
            self.read().map(|(addr, r)| (addr, size_of(r)))
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::alloc::{GlobalAlloc, Layout, System};

    use crate::track::{Mode, Tag, Tracker, TrackingAllocator};

    const L: Layout = Layout::new::<[u64; 8]>();

    /// Allocates one block through `a` (a non-zero layout; the caller frees it once).
    fn alloc(a: &TrackingAllocator) -> usize {
        // SAFETY: a non-zero layout.
        let p = unsafe { a.alloc(L) };
        assert!(!p.is_null());
        p as usize
    }

    /// Frees a block `alloc` returned.
    ///
    /// # Safety
    ///
    /// `p` came from `alloc(a)` and is live, or diagnostics are on and it was freed in the
    /// current epoch (a double free the tracker catches before touching the memory).
    unsafe fn free(a: &TrackingAllocator, p: usize) {
        // SAFETY: the caller's contract.
        unsafe { a.dealloc(p as *mut u8, L) };
    }

    /// Whether `addr`'s record sits in the table (rather than pending in a slot).
    fn in_table(t: &Tracker, addr: usize) -> bool {
        t.records.with_shard(addr, |map| map.get_mut(addr).is_some())
    }

    /// An allocator on `t` whose calling thread has its slot: the thread's first recorded
    /// allocation goes to the table (its slot is not cached yet).
    fn warmed(t: &'static Tracker) -> TrackingAllocator {
        let a = TrackingAllocator::with_tracker(System, t);
        // SAFETY: a block from `alloc`, freed once.
        unsafe { free(&a, alloc(&a)) };
        a
    }

    #[test]
    fn the_newest_record_is_pending_and_seen_by_reports_on_other_threads() {
        static T: Tracker = Tracker::with_mode(Mode::Records);
        static TAG: Tag = Tag::new("pending-seen");
        let _g = TAG.enter();
        let a = warmed(&T);
        let (p, q) = (alloc(&a), alloc(&a));
        assert!(in_table(&T, p) && !in_table(&T, q), "q pending, p moved into the table");
        std::thread::spawn(move || {
            assert_eq!(T.live_records(), 2);
            assert_eq!(T.find_record(q).map(|r| r.size), Some(64));
            let leaks = T.leak_report();
            assert_eq!((leaks.total_count, leaks.total_bytes), (2, 128));
            assert_eq!(T.snapshot().live_records, 2);
        })
        .join()
        .unwrap();
        // SAFETY: live blocks from `alloc`, each freed once.
        unsafe {
            free(&a, q);
            free(&a, p);
        }
        assert_eq!(T.live_records(), 0);
        assert_eq!((T.tag_stats(&TAG).bytes, T.tag_stats(&TAG).count), (0, 0));
        assert_eq!(T.error_counts(), Default::default());
    }

    #[test]
    fn a_pending_record_freed_on_another_thread_is_claimed() {
        static T: Tracker = Tracker::with_mode(Mode::Records);
        static TAG: Tag = Tag::new("pending-claimed");
        let _g = TAG.enter();
        let a = warmed(&T);
        let p = alloc(&a);
        assert!(!in_table(&T, p));
        // SAFETY: `p` is live; freed once, on the other thread.
        std::thread::spawn(move || unsafe { free(&TrackingAllocator::with_tracker(System, &T), p) }).join().unwrap();
        assert_eq!(T.live_records(), 0);
        // The owner's slot was emptied by the claim: its next allocation publishes afresh.
        let q = alloc(&a);
        assert_eq!(T.live_records(), 1);
        // SAFETY: live, freed once.
        unsafe { free(&a, q) };
        assert_eq!((T.tag_stats(&TAG).bytes, T.tag_stats(&TAG).count), (0, 0));
        assert_eq!(T.error_counts(), Default::default());
    }

    #[test]
    fn thread_exit_moves_the_pending_record_into_the_table() {
        static T: Tracker = Tracker::with_mode(Mode::Records);
        static TAG: Tag = Tag::new("pending-exit");
        let p = std::thread::spawn(|| {
            let _g = TAG.enter();
            let a = warmed(&T);
            let p = alloc(&a);
            assert!(!in_table(&T, p));
            p
        })
        .join()
        .unwrap();
        // `join` returns once the thread's destructors ran.
        assert!(in_table(&T, p), "flushed at exit");
        assert_eq!(T.live_records(), 1);
        // SAFETY: live, freed once.
        unsafe { free(&TrackingAllocator::with_tracker(System, &T), p) };
        assert_eq!(T.live_records(), 0);
        assert_eq!((T.tag_stats(&TAG).bytes, T.tag_stats(&TAG).count), (0, 0));
        assert_eq!(T.error_counts(), Default::default());
    }

    #[test]
    fn a_second_free_of_a_pending_record_finds_no_record() {
        static T: Tracker = Tracker::with_mode(Mode::Records);
        let a = warmed(&T);
        let p = alloc(&a);
        let record = T.remove_record_anywhere(p).expect("pending");
        assert_eq!(record.size, 64);
        assert!(T.remove_record_anywhere(p).is_none(), "the free path reports a double free then");
        T.record_removed(p, record, false);
        // SAFETY: the block is live (only its record went), freed once, with its layout.
        unsafe { System.dealloc((p as *mut u8).sub(8), Layout::from_size_align(72, 8).unwrap()) };
    }

    #[test]
    fn double_frees_of_pending_records_are_caught_in_diagnostic_mode() {
        static T: Tracker = Tracker::with_mode(Mode::Records);
        let a = warmed(&T);
        let (p, q) = (alloc(&a), alloc(&a));
        assert!(!in_table(&T, q));
        T.set_diagnostics(true);
        // SAFETY: `q` is live: its first free (the owner's cancel); the second is caught
        // before the memory is touched (diagnostics, same epoch).
        unsafe {
            free(&a, q);
            free(&a, q);
        }
        assert_eq!(T.error_counts().double_frees, 1);
        T.set_diagnostics(false);
        let r = alloc(&a);
        assert!(!in_table(&T, r));
        T.set_diagnostics(true);
        // SAFETY: `r` is live: freed (claimed) on another thread, then again here, caught.
        unsafe {
            std::thread::spawn(move || free(&TrackingAllocator::with_tracker(System, &T), r)).join().unwrap();
            free(&a, r);
        }
        assert_eq!(T.error_counts().double_frees, 2);
        // SAFETY: live, freed once.
        unsafe { free(&a, p) };
        assert_eq!(T.live_records(), 0);
    }
}
