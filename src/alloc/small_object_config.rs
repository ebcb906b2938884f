//! How a [`SmallObjectAllocator`](super::SmallObjectAllocator) is sized: its classes, the
//! slots each gets ([`SmallObjectConfig`]), what a run asked for ([`SizeHistogram`]) and what
//! a class costs ([`ClassFootprint`]).

/// The slot sizes of the seven classes, in bytes.
pub const SMALL_OBJECT_CLASSES: [usize; 7] = [8, 16, 32, 48, 64, 96, 128];

/// The default region size.
const DEFAULT_REGION: usize = 2 << 20;

/// How many slots each class gets.
///
/// # Examples
///
/// ```
/// use mmobject::alloc::SmallObjectConfig;
///
/// // Mostly 48-byte objects, as in the seed's level loader.
/// let config = SmallObjectConfig { slots: [1024, 1024, 1024, 12_800, 1024, 512, 512] };
/// assert_eq!(config.data_bytes(), 8 * 1024 + 16 * 1024 + 32 * 1024 + 48 * 12_800 + 64 * 1024 + 96 * 512 + 128 * 512);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallObjectConfig {
    /// Slots per class, in the order of [`SMALL_OBJECT_CLASSES`].
    pub slots: [usize; 7],
}

impl SmallObjectConfig {
    /// Bytes of slots (without the bitmaps and the alignment padding between classes).
    pub fn data_bytes(&self) -> usize {
        self.slots.iter().zip(SMALL_OBJECT_CLASSES).map(|(n, s)| n * s).sum()
    }

    /// Splits `budget_bytes` between the classes in proportion to the bytes each needed at its
    /// busiest moment (`peak_live × slot size`), as recorded by
    /// [`SmallObjectAllocator::histogram`](super::SmallObjectAllocator::histogram) during a representative run. If no peaks were
    /// recorded, the request counts are used instead; if none either, the default split.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// use mmobject::alloc::{SmallObjectAllocator, SmallObjectConfig};
    ///
    /// // Record a run with the default config...
    /// let probe = SmallObjectAllocator::default();
    /// let blocks: Vec<_> = (0..300).map(|_| probe.alloc(Layout::new::<[u8; 40]>())).collect();
    /// let histogram = probe.histogram();
    /// assert_eq!(histogram.peak_live[3], 300); // 40 bytes go to the 48-byte class
    /// // SAFETY: each block is ours and freed once.
    /// for p in blocks { unsafe { probe.free(p) } }
    ///
    /// // ...then size the real allocator from it.
    /// let config = SmallObjectConfig::from_histogram(&histogram, 48 * 1000);
    /// assert_eq!(config.slots, [0, 0, 0, 1000, 0, 0, 0]);
    /// ```
    pub fn from_histogram(histogram: &SizeHistogram, budget_bytes: usize) -> SmallObjectConfig {
        let weights = |counts: &[u64; 7]| -> [u128; 7] {
            std::array::from_fn(|i| counts[i] as u128 * SMALL_OBJECT_CLASSES[i] as u128)
        };
        let mut w = weights(&histogram.peak_live);
        if w.iter().all(|&x| x == 0) {
            w = weights(&histogram.requests);
        }
        let total: u128 = w.iter().sum();
        if total == 0 {
            return SmallObjectConfig::default();
        }
        let slots =
            std::array::from_fn(|i| (budget_bytes as u128 * w[i] / total / SMALL_OBJECT_CLASSES[i] as u128) as usize);
        SmallObjectConfig { slots }
    }
}

impl Default for SmallObjectConfig {
    /// A 2 MiB budget split equally (in bytes) between the classes, each count rounded down
    /// to a multiple of 64: slots `[37440, 18688, 9344, 6208, 4672, 3072, 2304]`,
    /// 2,084,352 bytes of slots plus 10,216 bytes of bitmap.
    fn default() -> Self {
        let per_class = DEFAULT_REGION / SMALL_OBJECT_CLASSES.len();
        SmallObjectConfig { slots: SMALL_OBJECT_CLASSES.map(|s| per_class / s / 64 * 64) }
    }
}

/// Recorded request statistics, per class, from [`SmallObjectAllocator::histogram`](super::SmallObjectAllocator::histogram).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SizeHistogram {
    /// Requests per class (by the class the size rounds up to), including those that fell
    /// back to the system because the class was full. A request the debug use-after-free
    /// check refused is not counted (its retry is).
    pub requests: [u64; 7],
    /// The most slots live at once per class, counting requests the full class pushed to the
    /// system (so it shows how many slots *would* have been needed). An upper bound, the sum
    /// of peaks kept apart so that no allocation updates a shared counter: each thread's,
    /// the unowned lanes' and the fallback blocks', which may have come at different times.
    /// A slot counts in one of them only: the live slots of a lane a thread takes over (left
    /// by a thread that exited, or by a thread without a cache) were counted where they were
    /// allocated, and not again. And a thread's peak is counted without a compare on every
    /// allocation, so it can include slots the thread freed while it allocated from the same
    /// bitmap word (at most 63 per thread and class). Exact when no slot is freed between
    /// two allocations that raise it.
    pub peak_live: [u64; 7],
    /// Requests too large (over 128 bytes) or too aligned for any class.
    pub larger: u64,
}

/// What one class costs: its slots and its bitmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassFootprint {
    /// The slot size in bytes.
    pub slot_size: usize,
    /// The number of slots.
    pub slots: usize,
    /// `slots × slot_size`.
    pub data_bytes: usize,
    /// One bit per slot, rounded up to whole bytes: `ceil(slots / 8)`.
    pub bitmap_bytes: usize,
}

impl ClassFootprint {
    /// Data plus bitmap bytes.
    pub fn total(&self) -> usize {
        self.data_bytes + self.bitmap_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_histogram_splits_by_peak_bytes() {
        let h = SizeHistogram { requests: [9; 7], peak_live: [100, 0, 0, 200, 0, 0, 0], larger: 0 };
        let c = SmallObjectConfig::from_histogram(&h, 800 + 9600);
        assert_eq!(c.slots, [100, 0, 0, 200, 0, 0, 0]);
        let by_requests = SizeHistogram { requests: [1, 0, 0, 0, 0, 0, 1], ..Default::default() };
        assert_eq!(SmallObjectConfig::from_histogram(&by_requests, 272).slots, [2, 0, 0, 0, 0, 0, 2]);
        assert_eq!(SmallObjectConfig::from_histogram(&SizeHistogram::default(), 1), SmallObjectConfig::default());
    }
}
