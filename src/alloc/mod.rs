//! Engine allocators: pools, small objects, stacks, frames and alignment.

mod region;
mod stack;
mod stats;

pub use region::MAX_ALIGN;
pub use stack::{Marker, StackAllocator};
pub use stats::AllocStats;
