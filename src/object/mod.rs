//! Objects: the manager, its generational stores, handles, collection and reports.

mod key;
mod traits;

pub use key::ObjectKey;
#[doc(hidden)]
pub use traits::probe;
pub use traits::{HeapSize, MMObject, VisitHandles};
