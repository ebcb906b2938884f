//! Objects: the manager, its generational stores, handles, collection and reports.
//!
//! # How it works
//!
//! Each [`MMObject`] type gets one store inside the [`ObjectManager`]: a
//! generational slot map whose slots live in segments that never move (segment
//! `k` holds `base << k` slots). A slot is a 16-byte header (count or list
//! link, generation, the owner thread's reservation, the number of the
//! creation site in the store's table of sites) followed by the value.
//!
//! - A [`Handle`] is one word: its slot's address, with its manager's id
//!   beside it (so a read checks the id without a load); the slot's address
//!   finds its store (segments are cut into aligned chunks with a header each). Clone
//!   is one relaxed atomic add; drop is one atomic sub, and the last drop
//!   pushes the slot onto its store's lock-free dead list. On a manager's
//!   [owner thread](ObjectManagerBuilder::owner_thread) they are plain loads
//!   and stores against a per-object reservation of counts.
//! - [`ObjectManager::collect_garbage`] swaps each dead list empty and destroys
//!   what it held, looping until cascades settle: O(dead), never O(live).
//! - A [`WeakHandle`] is a key, a manager id and its slot's address, in 16
//!   bytes; every use checks the manager id before it follows the address,
//!   and the generation, so a reused slot never validates an old weak or raw handle.

mod access;
mod builder;
mod candidates;
mod collect;
mod creation_sites;
mod deferred_drops;
mod forensics;
mod forensics_budget;
mod forensics_graph;
mod handle;
mod handle_sites;
mod index_space;
mod iter;
mod key;
mod last_drops;
mod layout;
mod leak;
mod leak_render;
mod loader;
mod loader_slots;
mod manager;
mod open_gate;
mod owner_counts;
mod owner_slots;
mod raw;
mod reentry;
mod registry;
mod release;
mod report;
mod shared;
mod shutdown;
mod slot;
mod snapshot;
mod store;
mod store_alloc;
mod timeline;
mod tracking;
mod traits;
mod view;

#[doc(hidden)]
pub use builder::skip_manager_ids_for_tests;
pub use builder::ObjectManagerBuilder;
pub use collect::{CollectStats, Destroyed};
pub use forensics::{Holder, ObjectName, ReferenceCycle, RetentionPath, RetentionRoot};
pub use forensics_budget::{CycleCollector, CycleStep};
pub use handle::{Handle, RawHandle, WeakHandle};
pub use handle_sites::{HandleOrigin, HandleSite};
pub use iter::{Iter, IterMut};
pub use key::ObjectKey;
#[doc(hidden)]
pub use leak::LeakReport;
pub use leak::{LeakEntry, LeakRoot, LeakTally, ObjectLeakReport};
pub use loader::Loader;
pub use manager::{ObjectManager, TryCreateError};
pub use registry::MAX_TYPES;
#[doc(hidden)]
pub use release::probe as release_probe;
pub use release::ReleaseHandles;
#[doc(hidden)]
pub use report::MemoryReport;
pub use report::{ObjectMemoryReport, TypeReport};
pub use snapshot::Snapshot;
pub use timeline::MemoryTimeline;
#[doc(hidden)]
pub use traits::probe;
pub use traits::{HeapSize, MMObject, VisitHandles};
pub use view::{ObjectView, ObjectViewMut, Views};
