//! Engine allocators: pools, small objects, stacks, frames and alignment.
//!
//! Every allocator here starts from **one preallocated region** and never grows: when it
//! is full it fails cleanly ([`Error::OutOfMemory`](crate::Error::OutOfMemory) from the
//! `try_` calls, a panic with the same message from the plain ones), or falls back where
//! its docs say so. Each one:
//!
//! - implements [`allocator_api2::alloc::Allocator`] for `&A` (the crate is re-exported as
//!   [`mmobject::allocator_api2`](crate::allocator_api2)), so
//!   `allocator_api2::vec::Vec::new_in(&a)` and `hashbrown::HashMap::new_in(&a)` work (see
//!   "When an allocator is full" below for what a collection does when the allocator is);
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
//! let visible: &mut [u32] = frame.alloc_slice_copy(&[3, 1, 4]);
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
//! | allocator | for | alloc / free cost | per-block overhead | threads | when full (`try_` calls) |
//! |---|---|---|---|---|---|
//! | [`SizeClassPool`] | general-purpose blocks 8 B – 1 MiB out of a fixed budget, from any thread | thread-cache lookup + bit scan of the thread's own page / a page lookup (one table load) + a plain bit set on the page's owner thread, one atomic `fetch_or` on any other | 64 B per page of up to 64 blocks, 1 byte per block, + 4 B per 512 B of region (+ up to 2× rounding) | `Sync` (per-thread pages, no lock) | next larger class (a *fallback*), then `OutOfMemory` |
//! | [`SmallObjectAllocator`] | many small objects (8–128 B): parsers, scripts, nodes | thread-cache lookup + bit scan of the thread's own bitmap word / a plain bit clear in a lane the thread owns, a lock on any other | exactly 1 bit | `Sync` (per-thread lanes, no lock on the owner's path) | the system allocator (a *fallback*), counted |
//! | [`StackAllocator`] | nested lifetimes: level data, loading | bump / free everything above a [`Marker`] | alignment padding; each block rounded up to 8 bytes | `Send` | `OutOfMemory` |
//! | [`DoubleEndedStack`] | two stacks sharing one budget (e.g. level + temp) | bump at either end; the lower end's last block grows in place | padding only | `Send` | `OutOfMemory` when the ends would meet |
//! | [`FrameAllocator`] | scratch data for one frame | bump / `reset` once per frame | alignment padding; each block rounded up to 8 bytes | `Send` | `OutOfMemory` |
//! | [`DoubleBufferedAllocator`] | results produced in frame *i*, read in frame *i + 1* | bump / `swap` per frame; [`FrameRef`] reads check the frame | alignment padding; each block rounded up to 8 bytes | `Send` (values behind a `FrameRef` must be `Send`) | `OutOfMemory` |
//! | [`AlignedAlloc`] | alignment over a raw allocator that has none | raw alloc + header write; ledger lookup on free | `2 + align − 1` bytes + a ledger entry | `Sync` if the raw allocator is | the raw allocator's failure, as `OutOfMemory` |
//! | [`SegmentAlloc`] | few large blocks at any alignment: object-store segments (its default) | a system allocation (or a kept freed block of the same layout) + a ledger entry under a lock | a ledger entry | `Sync` | `OutOfMemory` past its limit or when the system refuses |
//! | [`Pool<T>`] | many values of one type with stable addresses | free-list pop / push | 1 bit (+ padding to 4 bytes) | `Send` when `T` is | `OutOfMemory` |
//!
//! **When an allocator is full.** The "when full" column is what the `try_` calls
//! return. A collection sees only `AllocError`: an `allocator_api2` (or
//! `hashbrown`) collection that outgrows its allocator in `push`, `insert` or
//! `reserve` aborts the process through `handle_alloc_error`, as `std`'s
//! collections do. Reserve with `try_reserve` where running out is possible:
//!
//! ```rust
//! use mmobject::alloc::FrameAllocator;
//! use mmobject::allocator_api2::vec::Vec;
//!
//! let frame = FrameAllocator::with_capacity(64);
//! let mut v: Vec<u8, _> = Vec::new_in(&frame);
//! // `v.extend([0; 1024])` would abort the process here; `try_reserve` reports it.
//! assert!(v.try_reserve(1024).is_err());
//! v.try_reserve(32).expect("fits");
//! v.extend([7; 32]); // within the reserved capacity: no allocation
//! assert_eq!(frame.allocated_bytes(), 32);
//! ```
//!
//! Values moved into the stacks and frames are **never dropped** (as with bumpalo): their
//! memory is reclaimed without running destructors. [`Pool<T>`] drops its values.
//!
//! # Performance characteristics
//!
//! `BENCHMARKS.md` at the repository root holds the measured table (benches A1–A5, A1t and A1x in
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
//!
//! # Soundness
//!
//! Safe code cannot reach undefined behaviour through these types. What holds that promise
//! up, type by type:
//!
//! | type | variance | `Send` | `Sync` | why |
//! |---|---|---|---|---|
//! | [`Pool<T>`] | **invariant** in `T` | when `T: Send` | no | values go in through `&self`: a covariant pool would accept a `T<'short>` and drop it later as `T<'static>`. It owns its `T`s, so it moves only with them. The free list lives in `Cell`s. |
//! | [`PoolBox<'p, T>`] | covariant in `'p`, invariant in `T` | no | no | it borrows an (invariant, `!Sync`) `Pool<T>`; holding it for a shorter borrow of the pool is sound and useful. |
//! | [`FrameRef<T>`] | **invariant** in `T` | yes | yes | it gives mutable access ([`DoubleBufferedAllocator::try_get_mut`]), so it must not be relabelled with a shorter lifetime. It is a token (no pointer, no `T`): reading through it needs the allocator. |
//! | [`DoubleBufferedAllocator`] | — | yes | no | a `FrameRef` is not tied to a borrow, so its value is reachable again after the allocator moves to another thread: [`alloc`](DoubleBufferedAllocator::alloc) requires `T: Send`. Values from `alloc_mut` and the `Allocator` impl are reachable only through borrows, which end before a move, so they need no bound. |
//! | [`StackAllocator`], [`DoubleEndedStack`], [`FrameAllocator`] | — | yes | no | the top is a `Cell`. Stored values need no `Send` bound: references to them borrow the allocator, and values are never dropped, so after a move they are unreachable bytes. |
//! | [`SizeClassPool`] | — | yes | yes | untyped bytes. A page's masks are atomics: stored only by the page's one owner thread (relaxed load + store), or set by one `fetch_or` from other threads and taken by the owner with a swap. Thread caches hold pool ids (never reused) and page indices, never pointers into a pool, so dropping, forgetting or moving a pool leaves them harmless. |
//! | [`SmallObjectAllocator`] | — | yes | yes | untyped bytes. A lane's bitmap words are atomics, stored only by the thread that owns the lane (relaxed load + store) or, while nobody owns it, under the class's lock; a free from any other thread is queued under that lock for the owner. Thread caches hold allocator ids (never reused) and lane masks, and a `Weak` to the bitmaps, never pointers into the region. |
//! | [`AlignedAlloc<A>`] | covariant in `A` | when `A: Send` | when `A: Sync` | it owns `A` like a plain field and never writes an `A` through `&self`. |
//! | [`SegmentAlloc`] | — | yes | yes | untyped bytes from `System`; its ledger sits behind a lock and holds addresses, and the freed blocks it keeps for reuse (which nobody else holds). |
//!
//! **Trait implementations.** [`RawAlloc`] is an `unsafe trait`: [`AlignedAlloc`] writes its
//! header into, and hands out, whatever `RawAlloc::alloc` returns, and no check could tell
//! a good pointer from a bad one. Its contract (in the trait's docs) covers only the blocks
//! it returns; an implementation may still, without undefined behaviour, report any
//! `capacity` (used only for statistics and error messages), refuse requests it has room
//! for (they become [`Error::OutOfMemory`](crate::Error::OutOfMemory)), or do nothing in
//! `free` (the memory leaks, or comes back another way, as with [`StackAllocator`]). No
//! other trait here is implemented by users.
//!
//! **Pointers handed back.** A pointer given to `free`, `try_free` or
//! `Allocator::deallocate` is used only as an address: every read or write of allocator
//! metadata (free-list links, debug fill, [`AlignedAlloc`]'s header) goes through the
//! allocator's own pointer (its region's, or for [`AlignedAlloc`] the raw allocator's,
//! kept in the ledger). The caller's pointer may carry provenance over only the bytes it
//! asked for, as an `allocator_api2::boxed::Box` does, so touching anything else through it
//! would be undefined behaviour under Stacked Borrows.
//!
//! **Leaks.** Forgetting a guard or a collection (`mem::forget` of a [`PoolBox`], a `Box` or
//! a `Vec` in any allocator) leaks its memory and nothing else. [`Pool<T>`] tracks which
//! slots hold a `T` in a bitmap of its own, so its drop never runs `T`'s destructor on raw
//! bytes handed out through its `Allocator` impl.
//!
//! **Counters.** Allocator ids (checked by [`Marker`]s and [`FrameRef`]s) are `u64`s that
//! never repeat: once exhausted, creating a stack panics. Frame numbers are `u64`s (2^64
//! frames is out of reach). Statistics counters only count.
//!
//! **Tests.** `tests/soundness/alloc.rs` is the adversarial suite (forgotten guards,
//! unhelpful `RawAlloc`s, frees on other threads, boxes under Stacked Borrows);
//! `tests/ui/soundness/alloc_*.rs` are the compile-fail cases for variance, `Send`/`Sync`
//! and the `unsafe trait`; `tests/alloc_ids.rs` drives the id counter to its end. All of
//! them, and this module's unit tests, run under Miri with its default Stacked Borrows.

mod aligned;
mod double_buffered;
mod double_ended_stack;
mod frame;
mod lane;
mod page;
mod page_map;
mod page_table;
mod pool;
mod region;
mod segment;
mod shell;
mod size_class_pool;
mod small_object;
mod small_object_config;
mod stack;
mod stats;
mod thread_cache;

/// The settings of every allocator's proptest model: 256 cases, 4 under Miri, and no
/// failure files written into the source tree.
#[cfg(test)]
fn model_config() -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    }
}

pub use aligned::{AlignedAlloc, RawAlloc, SystemRaw, HEADER as ALIGNED_HEADER};
pub use double_buffered::{DoubleBufferedAllocator, FrameRef};
pub use double_ended_stack::{DoubleEndedStack, End};
pub use frame::FrameAllocator;
pub use pool::{Pool, PoolBox};
pub use region::MAX_ALIGN;
pub use segment::SegmentAlloc;
pub use size_class_pool::{SizeClassPool, SizeClassStats, DEFAULT_CLASSES};
pub use small_object::SmallObjectAllocator;
pub use small_object_config::{ClassFootprint, SizeHistogram, SmallObjectConfig, SMALL_OBJECT_CLASSES};
#[doc(hidden)]
pub use stack::__advance_allocator_ids;
pub use stack::{Marker, StackAllocator};
pub use stats::AllocStats;
