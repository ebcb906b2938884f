//! Per-tag counters (atomics, updated on every allocation) and their snapshot.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::tag::TagId;

/// No budget set.
pub(crate) const NO_BUDGET: usize = usize::MAX;

/// One tag's live counters. Padded to a cache line so tags used by different threads do
/// not share lines.
///
/// Invariants: `peak_bytes >= bytes` and `peak_count >= count` at every quiescent point
/// (updated with relaxed `fetch_max` right after the add, so a concurrent reader can see
/// the add before the peak catches up).
#[repr(align(64))]
#[derive(Debug)]
pub(crate) struct TagCounters {
    pub(crate) bytes: AtomicUsize,
    pub(crate) peak_bytes: AtomicUsize,
    pub(crate) count: AtomicUsize,
    pub(crate) peak_count: AtomicUsize,
    /// Allocations ever counted (never decreases).
    pub(crate) total_count: AtomicU64,
    /// The budget in bytes, or `NO_BUDGET`.
    pub(crate) budget: AtomicUsize,
    /// `true` once a Log-policy warning went out, until use drops back under the budget.
    pub(crate) warned: AtomicBool,
    /// Log every allocation and free of this tag.
    pub(crate) watch: AtomicBool,
    /// `budget` is set or `watch` is on: the allocator must take the exact (shared) path.
    pub(crate) slow: AtomicBool,
}

impl TagCounters {
    pub(crate) const fn new() -> Self {
        Self {
            bytes: AtomicUsize::new(0),
            peak_bytes: AtomicUsize::new(0),
            count: AtomicUsize::new(0),
            peak_count: AtomicUsize::new(0),
            total_count: AtomicU64::new(0),
            budget: AtomicUsize::new(NO_BUDGET),
            warned: AtomicBool::new(false),
            watch: AtomicBool::new(false),
            slow: AtomicBool::new(false),
        }
    }

    /// Counts `size` bytes (no budget check), and one allocation if `one_more`; returns the
    /// shared `(bytes, count)` right after, for [`raise_peaks`](Self::raise_peaks).
    #[inline]
    pub(crate) fn add(&self, size: usize, one_more: bool) -> (usize, usize) {
        let bytes = self.bytes.fetch_add(size, Ordering::Relaxed).wrapping_add(size);
        (bytes, self.counted(one_more))
    }

    /// Takes `size` bytes off, counting no free. Back under the budget, the next overrun
    /// warns again (as after [`sub`](Self::sub)).
    pub(crate) fn sub_bytes(&self, size: usize) {
        let before = self.bytes.fetch_sub(size, Ordering::Relaxed);
        self.rearm_warning(before.wrapping_sub(size));
    }

    /// Lets the next overrun warn again once `bytes` is back within the budget. `bytes` may
    /// sit below zero (wrapped) for a while, which is within any budget; the budget is any
    /// `usize`, so it is not compared as an `isize`.
    fn rearm_warning(&self, bytes: usize) {
        if self.warned.load(Ordering::Relaxed) && ((bytes as isize) < 0 || bytes <= self.budget.load(Ordering::Relaxed))
        {
            self.warned.store(false, Ordering::Relaxed);
        }
    }

    /// Counts one allocation if `one_more`; returns the shared live count right after.
    #[inline]
    pub(crate) fn counted(&self, one_more: bool) -> usize {
        if !one_more {
            return self.count.load(Ordering::Relaxed);
        }
        self.total_count.fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed).wrapping_add(1)
    }

    /// Raises the peaks to the shared totals `shared` plus the deltas still pending in thread
    /// slots (`pending`, bytes and count): the shared counters alone may hold a block whose
    /// credit waits in another thread's slot (it was freed there), so they are not the total.
    #[inline]
    pub(crate) fn raise_peaks(&self, shared: (usize, usize), pending: (isize, isize)) {
        // Both totals may sit below zero (wrapped) for a while, like `sub` leaves them: a
        // peak is only raised from a non-negative value.
        let bytes = (shared.0 as isize).wrapping_add(pending.0);
        if bytes >= 0 && bytes as usize > self.peak_bytes.load(Ordering::Relaxed) {
            self.peak_bytes.fetch_max(bytes as usize, Ordering::Relaxed);
        }
        let count = (shared.1 as isize).wrapping_add(pending.1);
        if count >= 0 && count as usize > self.peak_count.load(Ordering::Relaxed) {
            self.peak_count.fetch_max(count as usize, Ordering::Relaxed);
        }
    }

    /// Counts one free of `size` bytes.
    #[inline]
    pub(crate) fn sub(&self, size: usize) {
        // May wrap below zero for a while: the matching allocation can still be pending in
        // another thread's slot.
        let before = self.bytes.fetch_sub(size, Ordering::Relaxed);
        self.count.fetch_sub(1, Ordering::Relaxed);
        self.rearm_warning(before.wrapping_sub(size));
    }

    /// Folds deltas from a thread slot into the shared counters. Raises no peak: the
    /// shared counters alone are not the total (other slots may hold the credit of a block
    /// this slot counted), so the caller raises them from [`current`](Self::current).
    pub(crate) fn fold(&self, bytes: isize, count: isize, allocs: isize) {
        self.bytes.fetch_add(bytes as usize, Ordering::Relaxed);
        self.count.fetch_add(count as usize, Ordering::Relaxed);
        self.total_count.fetch_add(allocs as u64, Ordering::Relaxed);
    }

    /// Current `(bytes, count)` including the deltas still pending in thread slots, which
    /// `pending` sums; also raises the peaks to them. The shared counters are read first,
    /// then the slots: a slot folded in between is missed, never counted twice, so a peak
    /// may miss a spike but never shows more than was in use.
    pub(crate) fn current(&self, pending: impl FnOnce() -> (isize, isize, isize)) -> (usize, usize, isize) {
        let shared = (self.bytes.load(Ordering::Relaxed), self.count.load(Ordering::Relaxed));
        let (pending_bytes, pending_count, pending_allocs) = pending();
        self.raise_peaks(shared, (pending_bytes, pending_count));
        let b = (shared.0 as isize).wrapping_add(pending_bytes).max(0) as usize;
        let n = (shared.1 as isize).wrapping_add(pending_count).max(0) as usize;
        (b, n, pending_allocs)
    }

    pub(crate) fn snapshot(
        &self,
        tag: TagId,
        name: &'static str,
        pending: impl FnOnce() -> (isize, isize, isize),
    ) -> TagStats {
        let budget = self.budget.load(Ordering::Relaxed);
        // Read before the slots, as `current` reads the shared bytes and count: a slot
        // folded in between is missed, never counted twice (it was in both).
        let total_count = self.total_count.load(Ordering::Relaxed);
        let (bytes, count, pending_allocs) = self.current(pending);
        TagStats {
            id: tag.0,
            name,
            bytes,
            peak_bytes: self.peak_bytes.load(Ordering::Relaxed),
            count,
            peak_count: self.peak_count.load(Ordering::Relaxed),
            total_count: total_count.wrapping_add(pending_allocs as u64),
            budget: (budget != NO_BUDGET).then_some(budget),
            watched: self.watch.load(Ordering::Relaxed),
        }
    }

    pub(crate) fn reset_peaks(&self, pending: impl FnOnce() -> (isize, isize, isize)) {
        self.peak_bytes.store(0, Ordering::Relaxed);
        self.peak_count.store(0, Ordering::Relaxed);
        self.current(pending);
    }
}

/// One tag's numbers at the moment of a [`Tracker::snapshot`](super::Tracker::snapshot).
///
/// Each field is read atomically, but the fields are not read as one transaction: a
/// snapshot taken while other threads allocate can pair a count with a slightly newer byte
/// total.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TagStats {
    /// The tag's dense id ([`TagId::index`]).
    pub id: u32,
    /// The tag's name.
    pub name: &'static str,
    /// Bytes in use now.
    pub bytes: usize,
    /// The most bytes ever in use at once (since the last peak reset).
    pub peak_bytes: usize,
    /// Live allocations now.
    pub count: usize,
    /// The most live allocations ever at once.
    pub peak_count: usize,
    /// Allocations ever counted.
    pub total_count: u64,
    /// The budget in bytes, if one is set.
    pub budget: Option<usize>,
    /// Whether allocations of this tag are logged.
    pub watched: bool,
}

impl TagStats {
    /// The tag's id.
    pub fn tag(&self) -> TagId {
        TagId(self.id)
    }

    /// Current use as a percentage of the budget, if one is set.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tracker, Tag};
    ///
    /// static SOUNDS: Tag = Tag::new("Sounds");
    /// let tracker = Tracker::new();
    /// tracker.set_budget(&SOUNDS, 200);
    /// tracker.try_charge(SOUNDS.id(), 50)?;
    /// assert_eq!(tracker.tag_stats(&SOUNDS).budget_percent(), Some(25.0));
    /// # Ok::<(), mmobject::Error>(())
    /// ```
    pub fn budget_percent(&self) -> Option<f64> {
        self.budget.map(|b| {
            if b == 0 {
                if self.bytes == 0 {
                    0.0
                } else {
                    f64::INFINITY
                }
            } else {
                self.bytes as f64 * 100.0 / b as f64
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_sub_tracks_peaks() {
        let c = TagCounters::new();
        c.raise_peaks(c.add(10, true), (0, 0));
        c.raise_peaks(c.add(30, true), (0, 0));
        c.sub(10);
        let s = c.snapshot(TagId(0), "x", || (0, 0, 0));
        assert_eq!((s.bytes, s.peak_bytes, s.count, s.peak_count, s.total_count), (30, 40, 1, 2, 2));
        c.reset_peaks(|| (0, 0, 0));
        let s = c.snapshot(TagId(0), "x", || (5, 1, 1));
        assert_eq!((s.bytes, s.count, s.total_count), (35, 2, 3));
        assert_eq!((s.peak_bytes, s.peak_count), (35, 2));
    }

    /// A slot folded between a snapshot's look at the slots and its look at the total:
    /// the allocations it held are counted once. The total was read after the slots, and
    /// showed them twice.
    #[test]
    fn a_fold_during_a_snapshot_counts_its_allocations_once() {
        let c = TagCounters::new();
        c.fold(0, 0, 3);
        let s = c.snapshot(TagId(0), "x", || {
            // The slot's deltas as read, then folded by their owner at once.
            c.fold(64, 1, 1);
            (64, 1, 1)
        });
        assert!(s.total_count <= 4, "{s:?}");
        assert_eq!(c.snapshot(TagId(0), "x", || (0, 0, 0)).total_count, 4);
    }

    /// Back under a budget larger than `isize::MAX` (`set_budget` takes any `usize`), the
    /// next overrun warns again: the budget was compared as an `isize`, negative, so the
    /// warning never rearmed.
    #[test]
    fn the_warning_rearms_under_a_budget_past_isize_max() {
        let c = TagCounters::new();
        c.budget.store(NO_BUDGET - 1, Ordering::Relaxed);
        c.bytes.store(100, Ordering::Relaxed);
        c.warned.store(true, Ordering::Relaxed);
        c.sub_bytes(50);
        assert!(!c.warned.load(Ordering::Relaxed));
        // Below zero for a while (the matching charge still pending in a slot): under too.
        c.warned.store(true, Ordering::Relaxed);
        c.budget.store(10, Ordering::Relaxed);
        c.sub(60);
        assert!(!c.warned.load(Ordering::Relaxed));
    }

    #[test]
    fn fold_applies_slot_deltas_and_current_raises_the_peaks() {
        let c = TagCounters::new();
        c.fold(100, 2, 2);
        assert_eq!(c.peak_bytes.load(Ordering::Relaxed), 0, "folding raises no peak");
        // Another slot holds the credit of 60 of those bytes: the peak is the total.
        assert_eq!(c.current(|| (-60, -1, 0)), (40, 1, 0));
        c.fold(-60, -1, 0);
        let s = c.snapshot(TagId(0), "x", || (0, 0, 0));
        assert_eq!((s.bytes, s.peak_bytes, s.count, s.peak_count, s.total_count), (40, 40, 1, 1, 2));
    }
}
