//! The allocator a store takes its memory from, shared by its parts.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::Arc;

use allocator_api2::alloc::{AllocError, Allocator};

use crate::alloc::SegmentAlloc;
use crate::track::Reentry;

/// A cloneable, type-erased handle to the allocator behind a store's segments
/// and side tables: the one given to
/// [`ObjectManagerBuilder::allocator`](crate::object::ObjectManagerBuilder::allocator)
/// (or `allocator_for`), or [`SegmentAlloc::global`].
///
/// Every clone is the same allocator, so memory taken through one clone may
/// be given back through another.
///
/// Every call runs outside memory tracking ([`Reentry`]): an allocator that
/// itself goes through a [`TrackingAllocator`](crate::track::TrackingAllocator)
/// counts nothing, so store memory is never counted twice (the manager
/// counts objects under their type's tag; see `object/tracking.rs`).
#[derive(Clone)]
pub(crate) struct StoreAlloc {
    inner: Arc<dyn Allocator + Send + Sync>,
    /// The allocator's type, for error messages.
    name: &'static str,
}

impl StoreAlloc {
    pub(crate) fn new<A: Allocator + Send + Sync + 'static>(allocator: A) -> StoreAlloc {
        StoreAlloc { inner: Arc::new(allocator), name: std::any::type_name::<A>() }
    }

    /// The default: the process-wide [`SegmentAlloc`].
    pub(crate) fn default_segments() -> StoreAlloc {
        StoreAlloc::new(SegmentAlloc::global())
    }

    pub(crate) fn name(&self) -> &'static str {
        self.name
    }
}

impl fmt::Debug for StoreAlloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

// SAFETY: every method forwards to the one shared allocator, whose own
// `Allocator` impl upholds the contract; clones share it (see the type docs).
unsafe impl Allocator for StoreAlloc {
    #[inline]
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let _untracked = Reentry::enter();
        self.inner.allocate(layout)
    }

    #[inline]
    fn allocate_zeroed(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let _untracked = Reentry::enter();
        self.inner.allocate_zeroed(layout)
    }

    #[inline]
    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let _untracked = Reentry::enter();
        // SAFETY: forwarded; the caller's contract is the inner allocator's.
        unsafe { self.inner.deallocate(ptr, layout) }
    }

    #[inline]
    unsafe fn grow(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let _untracked = Reentry::enter();
        // SAFETY: forwarded, as above.
        unsafe { self.inner.grow(ptr, old, new) }
    }

    #[inline]
    unsafe fn grow_zeroed(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let _untracked = Reentry::enter();
        // SAFETY: forwarded, as above.
        unsafe { self.inner.grow_zeroed(ptr, old, new) }
    }

    #[inline]
    unsafe fn shrink(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let _untracked = Reentry::enter();
        // SAFETY: forwarded, as above.
        unsafe { self.inner.shrink(ptr, old, new) }
    }
}
