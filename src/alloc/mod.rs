//! Engine allocators: pools, small objects, stacks, frames and alignment.

mod aligned;
mod double_buffered;
mod double_ended_stack;
mod frame;
mod pool;
mod region;
mod size_class_pool;
mod small_object;
mod stack;
mod stats;

pub use aligned::{AlignedAlloc, RawAlloc, SystemRaw, HEADER as ALIGNED_HEADER};
pub use double_buffered::{DoubleBufferedAllocator, FrameRef};
pub use double_ended_stack::{DoubleEndedStack, End};
pub use frame::FrameAllocator;
pub use pool::{Pool, PoolBox};
pub use region::MAX_ALIGN;
pub use size_class_pool::{SizeClassPool, SizeClassStats, DEFAULT_CLASSES};
pub use small_object::{
    ClassFootprint, SizeHistogram, SmallObjectAllocator, SmallObjectConfig, SMALL_OBJECT_CLASSES,
};
pub use stack::{Marker, StackAllocator};
pub use stats::AllocStats;
