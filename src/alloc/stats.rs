//! Usage counters shared by every allocator.

use std::fmt;

// Plain std atomics, not `crate::sync`: these are statistics, not part of a lock-free
// protocol, and allocators must keep working in `--cfg loom` builds outside a loom model.
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A snapshot of an allocator's usage.
///
/// Byte figures count what the allocator actually reserves: for the block allocators
/// ([`SizeClassPool`](super::SizeClassPool), [`SmallObjectAllocator`](super::SmallObjectAllocator),
/// [`Pool`](super::Pool)) the whole block, for the stacks the bytes up to the top including
/// alignment padding.
///
/// # Examples
///
/// ```
/// use std::alloc::Layout;
/// use mmobject::alloc::SizeClassPool;
///
/// let pool = SizeClassPool::new(&[(64, 16)]);
/// let block = pool.alloc(Layout::new::<u64>());
/// let stats = pool.stats();
/// assert_eq!(stats.capacity, 1024);
/// assert_eq!(stats.in_use, 64);
/// assert_eq!(stats.allocations, 1);
/// println!("{stats}");
/// // SAFETY: `block` is ours, freed once.
/// unsafe { pool.free(block) };
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes the allocator can hand out (its preallocated region, without metadata).
    pub capacity: usize,
    /// Bytes in use now.
    pub in_use: usize,
    /// The most bytes ever in use at once (for the stacks: updated on each free/reset and
    /// when the stats are read). For [`SmallObjectAllocator`](super::SmallObjectAllocator)
    /// it is the sum of each class's own peak, and for [`SizeClassPool`](super::SizeClassPool)
    /// the sum of each page's: an upper bound of the simultaneous peak, counted where the
    /// allocation happens (under a class lock, or by a page's owner thread), which saves a
    /// shared atomic on every call (per-class peaks are also what sizing a class needs).
    pub peak: usize,
    /// Blocks live now. [`StackAllocator`](super::StackAllocator),
    /// [`DoubleEndedStack`](super::DoubleEndedStack),
    /// [`FrameAllocator`](super::FrameAllocator) and
    /// [`DoubleBufferedAllocator`](super::DoubleBufferedAllocator) derive everything from
    /// their tops and do not count blocks (0).
    pub live: usize,
    /// Successful allocations over the allocator's life (0 for the bump allocators that do
    /// not count blocks, see `live`). A refused request counts in `failures` instead, and
    /// changes no other figure: a block the use-after-free check refused was never handed
    /// out, so it raises neither `live` nor `peak`.
    pub allocations: u64,
    /// Requests that failed (out of memory, unsupported alignment, use-after-free detected),
    /// and for [`SizeClassPool`](super::SizeClassPool) and
    /// [`SmallObjectAllocator`](super::SmallObjectAllocator) double frees that raced on two
    /// threads (found later by the block's owner).
    pub failures: u64,
    /// Requests served somewhere other than the first choice: by a larger class
    /// ([`SizeClassPool`](super::SizeClassPool)) or by the system allocator
    /// ([`SmallObjectAllocator`](super::SmallObjectAllocator)).
    pub fallbacks: u64,
}

impl AllocStats {
    /// Bytes still free (`capacity - in_use`).
    #[inline]
    pub fn available(&self) -> usize {
        self.capacity.saturating_sub(self.in_use)
    }
}

impl fmt::Display for AllocStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "| capacity | in use | peak | live | allocations | failures | fallbacks |")?;
        writeln!(f, "|---:|---:|---:|---:|---:|---:|---:|")?;
        write!(
            f,
            "| {} | {} | {} | {} | {} | {} | {} |",
            self.capacity, self.in_use, self.peak, self.live, self.allocations, self.failures, self.fallbacks
        )
    }
}

/// Byte counters for the thread-safe allocators: one atomic add per alloc or free, plus a
/// plain load (and rarely a `fetch_max`) for the peak.
#[derive(Debug, Default)]
pub(crate) struct SharedCounters {
    in_use: AtomicUsize,
    peak: AtomicUsize,
    failures: AtomicU64,
    fallbacks: AtomicU64,
}

impl SharedCounters {
    #[inline]
    pub(crate) fn add(&self, bytes: usize) {
        let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
        if now > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(now, Ordering::Relaxed);
        }
    }

    #[inline]
    pub(crate) fn sub(&self, bytes: usize) {
        let before = self.in_use.fetch_sub(bytes, Ordering::Relaxed);
        debug_assert!(before >= bytes, "in-use counter underflow: {before} - {bytes}");
    }

    #[cold]
    pub(crate) fn failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    #[cold]
    pub(crate) fn fallback(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// A snapshot whose byte figures the caller computed (from per-class counters kept under
    /// the class locks), with this counter's failures and fallbacks.
    pub(crate) fn snapshot_with(
        &self,
        capacity: usize,
        in_use: usize,
        peak: usize,
        live: usize,
        allocations: u64,
    ) -> AllocStats {
        AllocStats { in_use, peak, ..self.snapshot(capacity, live, allocations) }
    }

    /// Fills the byte and failure fields of a snapshot.
    pub(crate) fn snapshot(&self, capacity: usize, live: usize, allocations: u64) -> AllocStats {
        AllocStats {
            capacity,
            in_use: self.in_use.load(Ordering::Relaxed),
            peak: self.peak.load(Ordering::Relaxed),
            live,
            allocations,
            failures: self.failures.load(Ordering::Relaxed),
            fallbacks: self.fallbacks.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_counters_track_peak() {
        let c = SharedCounters::default();
        c.add(10);
        c.add(5);
        c.sub(10);
        c.failure();
        c.fallback();
        let s = c.snapshot(100, 1, 2);
        assert_eq!(
            s,
            AllocStats { capacity: 100, in_use: 5, peak: 15, live: 1, allocations: 2, failures: 1, fallbacks: 1 }
        );
        assert_eq!(s.available(), 95);
        assert!(s.to_string().contains("| 100 | 5 | 15 | 1 | 2 | 1 | 1 |"));
    }
}
