//! The manager-wide index space that makes [`ObjectKey`](super::ObjectKey)s unique across types.
//!
//! Each store reserves a contiguous range of manager-wide indices whenever it
//! allocates a segment, so the indices of all live objects stay dense (good
//! for `slotmap::SecondaryMap`) and a key alone names its store.

use parking_lot::RwLock;

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

/// The reserved ranges, in increasing order of `start`.
#[derive(Debug, Default)]
pub(crate) struct IndexSpace {
    inner: RwLock<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    next: u32,
    ranges: Vec<Range>,
}

impl IndexSpace {
    /// Reserves `len` indices for the slots `local_start..local_start + len` of `store`.
    pub(crate) fn reserve(&self, len: u32, store: u32, local_start: u32) -> Result<u32, Error> {
        let mut inner = self.inner.write();
        let start = inner.next;
        if u64::from(start) + u64::from(len) > u64::from(MAX_INDEX) {
            return Err(Error::CapacityExceeded { what: "object slots in one manager", limit: MAX_INDEX as usize });
        }
        inner.next = start + len;
        inner.ranges.push(Range { start, len, store, local_start });
        Ok(start)
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
        let space = IndexSpace::default();
        assert_eq!(space.reserve(4, 0, 0), Ok(0));
        assert_eq!(space.reserve(4, 1, 0), Ok(4));
        assert_eq!(space.reserve(8, 0, 4), Ok(8));
        assert_eq!(space.resolve(0), Some((0, 0)));
        assert_eq!(space.resolve(5), Some((1, 1)));
        assert_eq!(space.resolve(9), Some((0, 5)));
        assert_eq!(space.resolve(16), None);
    }

    #[test]
    fn refuses_past_the_limit() {
        let space = IndexSpace::default();
        assert!(space.reserve(MAX_INDEX, 0, 0).is_ok());
        assert!(matches!(space.reserve(1, 0, 0), Err(Error::CapacityExceeded { .. })));
    }
}
