//! The manager-wide index space that makes [`ObjectKey`](super::ObjectKey)s unique across types.
//!
//! Each store reserves a contiguous range of manager-wide indices whenever it
//! allocates a segment, so the indices of all live objects stay dense (good
//! for `slotmap::SecondaryMap`) and a key alone names its store.

use allocator_api2::vec::Vec;
use parking_lot::RwLock;

use super::store_alloc::StoreAlloc;
use crate::Error;

/// Indices are 24 bits wide: raw handles pack a manager tag into the other 8 bits.
pub(crate) const INDEX_BITS: u32 = 24;
/// One past the largest index.
pub(crate) const MAX_INDEX: u32 = 1 << INDEX_BITS;

#[derive(Debug, Clone, Copy)]
struct Range {
    start: u32,
    len: u32,
    store: u32,
    local_start: u32,
}

/// The reserved ranges, in increasing order of `start`, in the manager's store allocator.
#[derive(Debug)]
pub(crate) struct IndexSpace {
    inner: RwLock<Inner>,
}

#[derive(Debug)]
struct Inner {
    next: u32,
    ranges: Vec<Range, StoreAlloc>,
}

impl IndexSpace {
    pub(crate) fn new(alloc: StoreAlloc) -> Self {
        IndexSpace { inner: RwLock::new(Inner { next: 0, ranges: Vec::new_in(alloc) }) }
    }

    /// Reserves `len` indices for the slots `local_start..local_start + len`
    /// of `store`, whose objects are `type_name`s (for errors).
    pub(crate) fn reserve(
        &self,
        len: u32,
        store: u32,
        local_start: u32,
        type_name: &'static str,
    ) -> Result<u32, Error> {
        loop {
            let mut inner = self.inner.write();
            let start = inner.next;
            if u64::from(start) + u64::from(len) > u64::from(MAX_INDEX) {
                return Err(Error::CapacityExceeded { what: "object slots in one manager", limit: MAX_INDEX as usize });
            }
            if inner.ranges.len() < inner.ranges.capacity() {
                inner.next = start + len;
                inner.ranges.push(Range { start, len, store, local_start });
                return Ok(start);
            }
            // Room is made with the lock released: the allocator is user
            // code, which may grow another store (and so come here) on this
            // thread. Whoever swaps first wins; the other buffer is freed.
            let want = (inner.ranges.len() * 2).max(4);
            let alloc = inner.ranges.allocator().clone();
            drop(inner);
            let mut bigger = Vec::new_in(alloc);
            if bigger.try_reserve_exact(want).is_err() {
                return Err(Error::StoreOutOfMemory {
                    type_name,
                    part: "the manager's index table",
                    bytes: want * std::mem::size_of::<Range>(),
                    allocator: bigger.allocator().name(),
                });
            }
            let mut inner = self.inner.write();
            let spare = if inner.ranges.len() == inner.ranges.capacity() && inner.ranges.len() < bigger.capacity() {
                bigger.extend_from_slice(&inner.ranges);
                std::mem::replace(&mut inner.ranges, bigger)
            } else {
                bigger
            };
            // Freed with the lock released too.
            drop(inner);
            drop(spare);
        }
    }

    /// Finds the store and local slot index of a manager-wide index.
    pub(crate) fn resolve(&self, index: u32) -> Option<(u32, u32)> {
        let inner = self.inner.read();
        let at = inner.ranges.partition_point(|r| r.start <= index).checked_sub(1)?;
        let r = inner.ranges[at];
        (index - r.start < r.len).then(|| (r.store, r.local_start + (index - r.start)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_interleaved_ranges() {
        let space = IndexSpace::new(StoreAlloc::default_segments());
        assert_eq!(space.reserve(4, 0, 0, "T"), Ok(0));
        assert_eq!(space.reserve(4, 1, 0, "T"), Ok(4));
        assert_eq!(space.reserve(8, 0, 4, "T"), Ok(8));
        assert_eq!(space.resolve(0), Some((0, 0)));
        assert_eq!(space.resolve(5), Some((1, 1)));
        assert_eq!(space.resolve(9), Some((0, 5)));
        assert_eq!(space.resolve(16), None);
    }

    #[test]
    fn refuses_past_the_limit() {
        let space = IndexSpace::new(StoreAlloc::default_segments());
        assert!(space.reserve(MAX_INDEX, 0, 0, "T").is_ok());
        assert!(matches!(space.reserve(1, 0, 0, "T"), Err(Error::CapacityExceeded { .. })));
    }
}
