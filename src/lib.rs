#![doc = include_str!("../README.md")]
#![deny(missing_docs, missing_debug_implementations)]
#![cfg_attr(docsrs, feature(doc_auto_cfg))]

// Lets the derive's `::mmobject::…` paths resolve inside this crate's own tests.
extern crate self as mmobject;

pub mod alloc;
mod error;
pub mod implementation;
pub mod object;
mod sync;
pub mod track;

/// The `allocator_api2` crate every allocator in [`alloc`] implements `Allocator` from, and
/// whose `Allocator` [`ObjectManagerBuilder::allocator`](object::ObjectManagerBuilder::allocator)
/// takes, so `mmobject::allocator_api2::vec::Vec::new_in(&frame)` needs no dependency line
/// of its own.
pub use allocator_api2;
pub use error::{Error, Result};
pub use object::{
    CollectStats, Handle, HandleOrigin, HandleSite, HeapSize, LeakEntry, LeakReport, MMObject, MemoryReport,
    MemoryTimeline, ObjectKey, ObjectManager, ObjectName, ObjectView, RawHandle, ReferenceCycle, ReleaseHandles,
    RetentionPath, RetentionRoot, Snapshot, VisitHandles, WeakHandle,
};

/// Implements [`MMObject`] for a struct or enum.
///
/// - `#[mm(tag = "Textures")]` on the type sets its memory category (default: the type name).
/// - `#[mm(skip)]` on a field leaves it out of `size()`, `visit_handles()` and `release_handles()`.
pub use mmobject_macros::MMObject;

/// Paths the derive's generated code uses. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::object::probe::{NoHeapSize, NoVisitHandles, Probe, ViaHeapSize, ViaVisitHandles};
    pub use crate::object::release_probe::{NoReleaseHandles, ProbeMut, ViaReleaseHandles};
    pub use crate::object::{MMObject, ObjectKey};
    pub use core::mem::size_of;
}
