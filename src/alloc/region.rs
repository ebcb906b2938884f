//! The one preallocated block of memory every allocator carves up, plus alignment math and
//! the debug fill pattern.

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::Error;

/// The largest alignment any allocator in this module honours.
pub const MAX_ALIGN: usize = 4096;

/// The byte written over freed memory in debug builds.
pub(crate) const FREED_PATTERN: u8 = 0xDD;

/// How many bytes of a block the debug fill check reads when it is handed out again.
/// Kept small under Miri, where byte loops are slow.
pub(crate) const CHECK_LIMIT: usize = if cfg!(miri) { 64 } else { 4096 };

/// The pointer `System` returned for a block, kept by an allocator's ledger so that the
/// block is reused and freed through it: the caller's pointer may carry less provenance (one
/// narrowed to part of the block, or rebuilt from the address).
#[derive(Debug)]
pub(crate) struct SystemBlock(pub(crate) NonNull<u8>);

// SAFETY: no type parameter, so no bound: the pointer is to untyped bytes (no value, so no
// `Rc`, lives behind it), like a `Box<[u8]>`; ledgers hold it behind their locks.
unsafe impl Send for SystemBlock {}

/// One owned, preallocated, `MAX_ALIGN`-aligned block of memory.
///
/// Invariants:
/// 1. `ptr` is valid for reads and writes of `len` bytes for the life of the `Region`
///    (when `len == 0`, `ptr` is a dangling pointer aligned to `MAX_ALIGN` and is never read).
/// 2. `ptr` is aligned to `MAX_ALIGN`.
/// 3. The memory was allocated with `Layout::from_size_align(len, MAX_ALIGN)` through the
///    global allocator, and is freed in `Drop` with that same layout.
/// 4. In debug builds every byte starts as [`FREED_PATTERN`] (so the first hand-out passes
///    the use-after-free check); in release builds the memory starts uninitialised and is
///    never read before the user writes it.
pub(crate) struct Region {
    ptr: NonNull<u8>,
    len: usize,
}

// A `Region` hands out no references itself; the allocators that own one synchronise
// every access to its bytes.
// SAFETY: uniquely owned raw bytes, like a `Box<[u8]>`, never a value (so no `Rc` lives
// in it), and no type parameter, so no bound is needed.
unsafe impl Send for Region {}
// SAFETY: as above (no type parameter, no bound): `&Region` only exposes the address and
// the length.
unsafe impl Sync for Region {}

impl Region {
    /// Allocates a region of `len` bytes aligned to [`MAX_ALIGN`].
    ///
    /// # Panics
    ///
    /// Panics if `len` is larger than `isize::MAX - MAX_ALIGN`; aborts through
    /// [`std::alloc::handle_alloc_error`] if the system has no memory.
    pub(crate) fn new(len: usize) -> Region {
        if len == 0 {
            // Invariant 1: a zero-length region never dereferences its pointer.
            let ptr = NonNull::new(std::ptr::without_provenance_mut::<u8>(MAX_ALIGN)).expect("MAX_ALIGN is not zero");
            return Region { ptr, len };
        }
        let layout =
            Layout::from_size_align(len, MAX_ALIGN).unwrap_or_else(|_| panic!("region of {len} bytes is too large"));
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        if cfg!(debug_assertions) {
            // SAFETY: `ptr` was just allocated for `len` bytes.
            unsafe { ptr.as_ptr().write_bytes(FREED_PATTERN, len) };
        }
        Region { ptr, len }
    }

    /// The region's length in bytes.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The address of the region's first byte.
    #[inline]
    pub(crate) fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// Whether `addr` lies inside the region.
    #[inline]
    pub(crate) fn contains(&self, addr: usize) -> bool {
        addr.wrapping_sub(self.addr()) < self.len
    }

    /// A pointer to the byte at `offset`, carrying the region's provenance.
    ///
    /// # Safety
    ///
    /// `offset <= len()` (it may be one past the end). Checked in debug builds only: the
    /// allocators call this on their fast paths with offsets their own invariants bound.
    #[inline]
    pub(crate) unsafe fn at(&self, offset: usize) -> NonNull<u8> {
        debug_assert!(offset <= self.len, "offset {offset} is past the region's end {}", self.len);
        // SAFETY: `offset <= len` (the caller's contract), so the result stays inside (or
        // one past) the allocation (invariant 1), and it is not null because the base is not
        // null and nothing wraps.
        unsafe { self.ptr.add(offset) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: invariant 3: allocated with exactly this layout, and freed only here.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Layout::from_size_align_unchecked(self.len, MAX_ALIGN)) };
    }
}

impl std::fmt::Debug for Region {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region").field("addr", &format_args!("{:#x}", self.addr())).field("len", &self.len).finish()
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two). `n + align` must not overflow.
#[inline]
pub(crate) const fn align_up(n: usize, align: usize) -> usize {
    debug_assert!(align.is_power_of_two(), "alignment must be a power of two");
    (n + align - 1) & !(align - 1)
}

/// A dangling, well-aligned pointer for zero-size requests: its address is `align`.
#[inline]
pub(crate) fn dangling(align: usize) -> NonNull<u8> {
    NonNull::new(std::ptr::without_provenance_mut::<u8>(align)).expect("alignment is never zero")
}

/// Whether `ptr` may be a [`dangling`] zero-size block (its address is at most
/// [`MAX_ALIGN`], where no region lies). The stacks accept these in `free`, which touches
/// no memory.
#[inline]
pub(crate) fn is_dangling(ptr: NonNull<u8>) -> bool {
    ptr.as_ptr() as usize <= MAX_ALIGN
}

/// Fills `len` bytes at `ptr` with [`FREED_PATTERN`] (debug builds only).
///
/// # Safety
///
/// `ptr` must be valid for writes of `len` bytes, and nobody may hold a reference to them.
#[inline]
pub(crate) unsafe fn fill_freed(ptr: NonNull<u8>, len: usize) {
    if cfg!(debug_assertions) {
        // SAFETY: the caller guarantees `ptr` is writable for `len` bytes.
        unsafe { ptr.as_ptr().write_bytes(FREED_PATTERN, len) };
    }
}

/// Checks that the first `min(len, CHECK_LIMIT)` bytes at `ptr` still hold
/// [`FREED_PATTERN`] (debug builds only; always `true` in release builds).
///
/// # Safety
///
/// `ptr` must be valid for reads of `len` bytes, and in debug builds those bytes must be
/// initialised (they are: the region starts filled and every free refills).
#[inline]
pub(crate) unsafe fn freed_intact(ptr: NonNull<u8>, len: usize) -> bool {
    if !cfg!(debug_assertions) {
        return true;
    }
    let n = len.min(CHECK_LIMIT);
    // SAFETY: the caller guarantees `n <= len` initialised, readable bytes at `ptr`.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), n) };
    bytes.iter().all(|&b| b == FREED_PATTERN)
}

/// Logs and builds the error for a freed block whose fill pattern was overwritten.
#[cold]
#[inline(never)]
pub(crate) fn use_after_free(allocator: &str, addr: usize) -> Error {
    let error = Error::UseAfterFree { addr };
    log::error!("{allocator}: {error}");
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_is_aligned_and_contains() {
        let r = Region::new(100);
        assert_eq!(r.addr() % MAX_ALIGN, 0);
        assert!(r.contains(r.addr()));
        assert!(r.contains(r.addr() + 99));
        assert!(!r.contains(r.addr() + 100));
        assert!(!r.contains(r.addr().wrapping_sub(1)));
        let empty = Region::new(0);
        assert_eq!(empty.len(), 0);
        assert!(!empty.contains(empty.addr()));
    }

    #[test]
    fn alignment_math() {
        assert_eq!(align_up(0, 8), 0);
        assert_eq!(align_up(1, 8), 8);
        assert_eq!(align_up(8, 8), 8);
    }

    #[test]
    fn fill_and_check() {
        let r = Region::new(64);
        // SAFETY: the region is 64 bytes (every offset is inside) and nobody else uses it.
        unsafe {
            assert!(freed_intact(r.at(0), 64));
            r.at(3).as_ptr().write(1);
            assert_eq!(freed_intact(r.at(0), 64), !cfg!(debug_assertions));
            fill_freed(r.at(0), 64);
            assert!(freed_intact(r.at(0), 64));
        }
    }
}
