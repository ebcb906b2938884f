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
    CollectStats, CycleCollector, CycleStep, Destroyed, Handle, HandleOrigin, HandleSite, HeapSize, Holder, Iter,
    IterMut, LeakEntry, LeakRoot, LeakTally, Loader, MMObject, MemoryTimeline, ObjectKey, ObjectLeakReport,
    ObjectManager, ObjectManagerBuilder, ObjectMemoryReport, ObjectName, ObjectView, ObjectViewMut, RawHandle,
    ReferenceCycle, ReleaseHandles, RetentionPath, RetentionRoot, Snapshot, TryCreateError, Views, VisitHandles,
    WeakHandle,
};
#[doc(hidden)]
pub use object::{LeakReport, MemoryReport};

/// Implements [`MMObject`] for a struct or enum.
///
/// - `#[mm(tag = "Textures")]` on the type sets its memory category (default: the type name).
/// - `#[mm(skip)]` on a field leaves it out of `size()`, `visit_handles()` and `release_handles()`.
/// - `#[mm(visit_with = path)]` on a field visits its handles with `path(&field, visitor)`.
/// - A field whose type names `Handle` must implement [`VisitHandles`]: a
///   compile error otherwise, never a silent blind spot.
pub use mmobject_macros::MMObject;

/// Implements [`VisitHandles`] and [`ReleaseHandles`] for a struct or enum
/// that is not an object but holds handles inside one (a cache, a table).
///
/// `#[mm(skip)]` and `#[mm(visit_with = path)]` work as on `MMObject`.
pub use mmobject_macros::VisitHandles;

/// Paths the derive's generated code uses. Not public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::object::probe::{
        NoHeapSize, NoMayHoldHandles, NoVisitHandles, Probe, TypeProbe, ViaHeapSize, ViaMayHoldHandles, ViaVisitHandles,
    };
    pub use crate::object::release_probe::{NoReleaseHandles, ProbeMut, ViaReleaseHandles};
    pub use crate::object::{MMObject, ObjectKey, ReleaseHandles, VisitHandles};
    pub use core::mem::size_of;
}
