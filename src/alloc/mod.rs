//! Engine allocators: pools, small objects, stacks, frames and alignment.
