//! [`PageMap`]: from a region offset to the [`Page`] of a size-class pool it falls in, in
//! one masked table load: the first step of every free.

use std::ptr::NonNull;
use std::sync::Arc;

use super::page::Page;

/// Bytes of the region one table entry covers: every page starts on a granule boundary and
/// spans at least one (or is the last of its class), so each granule belongs to one page or
/// to none.
pub(crate) const GRANULE_SHIFT: u32 = 9;
pub(crate) const GRANULE: usize = 1 << GRANULE_SHIFT;

/// For each [`GRANULE`] of a pool's region, a pointer to its page; for the padding between
/// classes, and for every entry past the region (the table's length is a power of two), a
/// pointer to [`empty`](Self::empty), a page of no blocks.
///
/// A lookup masks the granule number to the table instead of checking it, so an offset past
/// the region (or below it: the offset wraps) finds *some* page. Callers must therefore
/// check that the offset lies in the page they get, which a block check does anyway: see
/// `SizeClassPool::find_block`.
///
/// Invariants:
/// 1. `granules.len()` is a power of two and `mask == granules.len() - 1`.
/// 2. Every entry points into `pages` or to `*empty`, which the map keeps alive (the `Arc`s
///    are never replaced) and which never move: the pointers are valid for the map's life.
/// 3. The pointers were made from shared references and are only turned back into shared
///    references (a `Page` is atomics and plain fields set at creation).
pub(crate) struct PageMap {
    granules: Box<[NonNull<Page>]>,
    mask: usize,
    pages: Arc<[Page]>,
    empty: Arc<Page>,
}

// SAFETY: the map holds shared pointers to `Page`s it owns through `Arc`s (invariant 2), and
// only hands out `&Page`; `Page` is `Send + Sync` (atomics and plain data), so sending or
// sharing the map is sending or sharing those `Arc`s.
unsafe impl Send for PageMap {}
// SAFETY: as above.
unsafe impl Sync for PageMap {}

impl PageMap {
    /// A map of a region of `len` bytes over `pages`, whose page `p` covers the region bytes
    /// of `spans[p]` (granule-aligned starts; the last granule may be partly covered).
    pub(crate) fn new(len: usize, pages: Arc<[Page]>, spans: impl Iterator<Item = std::ops::Range<usize>>) -> PageMap {
        let empty = Arc::new(Page::empty());
        let entries = len.div_ceil(GRANULE).next_power_of_two();
        let mut granules = vec![NonNull::from(&*empty); entries].into_boxed_slice();
        for (page, span) in pages.iter().zip(spans) {
            debug_assert!(span.start % GRANULE == 0 && span.end <= len, "page span {span:?} of a {len}-byte region");
            granules[span.start / GRANULE..span.end.div_ceil(GRANULE)].fill(NonNull::from(page));
        }
        PageMap { mask: entries - 1, granules, pages, empty }
    }

    /// The page of the granule of region offset `offset`, or the page of the granule the
    /// masked number lands on: `offset` need not be inside the region (see the type's docs).
    #[inline(always)]
    pub(crate) fn page_at(&self, offset: usize) -> &Page {
        let i = (offset >> GRANULE_SHIFT) & self.mask;
        // SAFETY: `i <= mask < granules.len()` (invariant 1), and the entry is valid for
        // `self`'s life and only shared (invariants 2 and 3).
        unsafe { self.granules.get_unchecked(i).as_ref() }
    }

    /// The page of no blocks that stands for "no page" (the table's padding entries, and a
    /// thread cache's empty entries).
    #[inline]
    pub(crate) fn empty(&self) -> &Page {
        &self.empty
    }

    /// Bytes of the region the table would cover without wrapping (what an address must be
    /// off by to land on the same entry).
    #[cfg(test)]
    pub(crate) fn span(&self) -> usize {
        self.granules.len() << GRANULE_SHIFT
    }

    /// Bytes of the table.
    pub(crate) fn table_bytes(&self) -> usize {
        self.granules.len() * size_of::<NonNull<Page>>()
    }
}

impl std::fmt::Debug for PageMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageMap").field("granules", &self.granules.len()).field("pages", &self.pages.len()).finish()
    }
}
