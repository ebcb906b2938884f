//! Engine allocators: pools, small objects, stacks, frames and alignment.
//!
//! Every allocator here starts from **one preallocated region** and never grows: when it
//! is full it fails cleanly ([`Error::OutOfMemory`](crate::Error::OutOfMemory) from the
//! `try_` calls, a panic with the same message from the plain ones), or falls back where
//! its docs say so. Each one:
//!
//! - implements [`allocator_api2::alloc::Allocator`] for `&A`, so
//!   `allocator_api2::vec::Vec::new_in(&a)` and `hashbrown::HashMap::new_in(&a)` work;
//! - honours any power-of-two alignment up to [`MAX_ALIGN`] (4096), and zero-size requests;
//! - detects bad frees (a pointer from elsewhere, into the middle of a block, or freed
//!   twice) and reports them as errors, never as undefined behaviour;
//! - counts its use in an [`AllocStats`] (capacity, in use, peak, live, allocations,
//!   failures, fallbacks), which prints as a small table;
//! - in debug builds fills freed memory with `0xDD` and checks the fill when handing it out
//!   again, reporting writes after free as [`Error::UseAfterFree`](crate::Error::UseAfterFree).
//!
//! # Quick start
//!
//! ```
//! use mmobject::alloc::{FrameAllocator, SizeClassPool};
//!
//! // Per-frame scratch memory: allocate freely, reset once a frame.
//! let mut frame = FrameAllocator::with_capacity(1 << 20);
//! let visible: &mut [u32] = frame.alloc_slice(&[3, 1, 4]);
//! visible.sort();
//! frame.reset();
//!
//! // Long-lived collections out of a fixed budget.
//! let pool = SizeClassPool::new(&[(64, 1024), (256, 256), (4096, 16)]);
//! let mut names = hashbrown::HashMap::new_in(&pool);
//! names.insert(1u32, "player");
//! assert_eq!(names[&1], "player");
//! ```
//!
//! # Choosing an allocator
//!
//! | allocator | for | alloc / free cost | per-block overhead | threads | when full |
//! |---|---|---|---|---|---|
//! | [`SizeClassPool`] | general-purpose blocks 8 B – 1 MiB out of a fixed budget | class lookup + lock + free-list pop / push | 1 bit (+ up to 2× rounding) | `Sync` (lock per class; no lock via `&mut self`) | next larger class (a *fallback*), then `OutOfMemory` |
//! | [`SmallObjectAllocator`] | many small objects (8–128 B): parsers, scripts, nodes | lock + bitmap scan, 64 slots per step / clear a bit | exactly 1 bit | `Sync` (lock per class) | the system allocator (a *fallback*), counted |
//! | [`StackAllocator`] | nested lifetimes: level data, loading | bump / free everything above a [`Marker`] | alignment padding only | `Send` | `OutOfMemory` |
//! | [`DoubleEndedStack`] | two stacks sharing one budget (e.g. level + temp) | bump at either end | padding only | `Send` | `OutOfMemory` when the ends would meet |
//! | [`FrameAllocator`] | scratch data for one frame | bump / `reset` once per frame | padding only | `Send` | `OutOfMemory` |
//! | [`DoubleBufferedAllocator`] | results produced in frame *i*, read in frame *i + 1* | bump / `swap` per frame; [`FrameRef`] reads check the frame | padding only | `Send` | `OutOfMemory` |
//! | [`AlignedAlloc`] | alignment over a raw allocator that has none | raw alloc + header write; ledger lookup on free | `2 + align − 1` bytes + a ledger entry | `Sync` if the raw allocator is | the raw allocator's failure, as `OutOfMemory` |
//! | [`Pool<T>`] | many values of one type with stable addresses | free-list pop / push | 1 bit (+ padding to 4 bytes) | `Send` | `OutOfMemory` |
//!
//! Values moved into the stacks and frames are **never dropped** (as with bumpalo): their
//! memory is reclaimed without running destructors. [`Pool<T>`] drops its values.
//!
//! # Performance characteristics
//!
//! `BENCHMARKS.md` at the repository root holds the measured table (benches A1–A4 in
//! `benches/allocators.rs`, each against System, mimalloc, bumpalo or a free-list limit in
//! the same run).
//!
//! # Safety and correctness
//!
//! - The stacks and frames tie every reference to a `&self` borrow and release memory only
//!   through `&mut self` calls (`free_to_marker`, `reset`, `swap`), so the borrow checker
//!   rules out use after release; `tests/ui/alloc/` holds the compile-fail cases.
//! - The block allocators' `free` functions are `unsafe` only because the allocator cannot
//!   know who owns a live block; everything it *can* check (foreign pointer, not a block
//!   start, double free) it checks before touching memory.
//! - Unsafe code is confined to these modules; every block has a `// SAFETY:` comment and
//!   the invariants are documented on the types. The tests run under Miri.

mod aligned;
mod double_buffered;
mod double_ended_stack;
mod frame;
mod pool;
mod region;
mod segment;
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
pub use segment::SegmentAlloc;
pub use size_class_pool::{SizeClassPool, SizeClassStats, DEFAULT_CLASSES};
pub use small_object::{ClassFootprint, SizeHistogram, SmallObjectAllocator, SmallObjectConfig, SMALL_OBJECT_CLASSES};
pub use stack::{Marker, StackAllocator};
pub use stats::AllocStats;
