//! The memory tracker: tags, per-tag stats and budgets, records and reports.
//!
//! Attribute memory to user-defined [`Tag`]s, watch each tag's current and peak use against
//! a budget, find leaks grouped by call stack, catch double frees and buffer overruns, and
//! plot use per frame.
//!
//! # Quick start
//!
//! ```
//! use mmobject::track::{scope, BudgetPolicy, Mode, Tag, Tracker, TrackingAllocator};
//! use std::alloc::System;
//!
//! // Every heap allocation is attributed to the tag in scope on its thread.
//! #[global_allocator]
//! static ALLOC: TrackingAllocator<System> = TrackingAllocator::new(System);
//!
//! static TEXTURES: Tag = Tag::new("Textures");
//! static AUDIO: Tag = Tag::new("Audio");
//!
//! let tracker = Tracker::global();
//! tracker.set_budget(&TEXTURES, 64 << 20);
//! tracker.set_budget_policy(&AUDIO, BudgetPolicy::Log);
//!
//! let pixels: Vec<u8> = {
//!     let _g = TEXTURES.enter();
//!     vec![0; 4096]
//! };
//! let clip: Vec<i16> = scope(&AUDIO, || vec![0; 1024]);
//!
//! let report = tracker.snapshot();
//! assert!(report.tag(&TEXTURES).unwrap().bytes >= 4096);
//! println!("{report}");
//! tracker.frame_mark(); // once a frame, for the CSV timeline
//! # drop((pixels, clip));
//! ```
//!
//! # Pieces
//!
//! - [`Tag`] (a `static`), [`TagId`] (its dense id), [`scope`] / [`Tag::enter`] (the
//!   thread-local tag stack), [`current_tag`].
//! - [`Tracker`] (`tracker.rs`): counters per tag ([`TagStats`]), [`Mode`] (counting,
//!   records, stacks, [`Sampling`]), [`Tracker::watch`], the object manager's hooks
//!   [`Tracker::tag_named`] and [`Tracker::counts_allocations`].
//! - Budgets (`budget.rs`): [`Tracker::set_budget`], a [`BudgetPolicy`] per tag, and the one
//!   budget check every charge goes through ([`Tracker::try_charge`], the object manager,
//!   the allocator).
//! - Diagnostics (`diagnostics.rs`): guard bytes, the freed-record ring, bad frees
//!   ([`ErrorCounts`], [`Tracker::check_guards`]).
//! - The explicit API (`explicit.rs`): [`Tracker::track`] / [`Tracker::untrack`] and
//!   [`Tracker::alloc`] / [`Tracker::dealloc`]; its blocks are placed by the same function as
//!   the global allocator's (`block.rs`).
//! - [`TrackingAllocator`]: the `#[global_allocator]` wrapper.
//! - [`StackTrace`]: raw return addresses (by frame pointers, cached unwind-table rules or
//!   DWARF unwinding, see [`StackWalker`]), resolved only when displayed.
//! - Reports: [`MemoryReport`] (text table, JSON with the `serde` feature),
//!   [`LeakReport`] (live allocations by call stack), and the CSV timeline
//!   ([`Tracker::frame_mark`], [`Tracker::write_csv`]).
//!
//! # Objects and the global allocator
//!
//! Given a tracker ([`ObjectManagerBuilder::tracker`](crate::object::ObjectManagerBuilder::tracker)),
//! the object manager counts each type's bytes under its `#[mm(tag)]`, and each byte is
//! counted once:
//!
//! - **Tracker alone.** The manager charges an object's `size()` when it is created,
//!   remembers the amount per object, and credits exactly that amount when the object is
//!   destroyed: every tag returns to its starting value once its objects are gone. An
//!   object whose size changed is brought up to date with
//!   [`ObjectManager::remeasure`](crate::ObjectManager::remeasure) or
//!   [`remeasure_all`](crate::ObjectManager::remeasure_all) (one `size()` call per
//!   object).
//! - **Tracker fed by a [`TrackingAllocator`]** ([`Tracker::counts_allocations`]). The
//!   allocator counts every heap byte, once, under the tag in scope when it was allocated,
//!   and a `realloc` keeps its block's tag and counts only the change of size (a growth
//!   that fits the budget is never refused for the old bytes it replaces; a block with a
//!   record or guards, in `Records`, `Stacks` or diagnostic mode, is moved instead, and
//!   counts as two blocks until the old one is freed, and so is a block that `Sampled`
//!   mode records at its new size, which gets its record as an allocation of that size
//!   would); the manager then charges nothing of its own.
//!   Build objects inside their tag's scope to have their heap bytes under it:
//!   [`ObjectManager::create_with`](crate::ObjectManager::create_with) does that. Growth
//!   and frees while the object lives are exact with no re-measuring.
//!
//! # File and line in release builds
//!
//! Stacks are resolved from debug info, so a release build without it shows function
//! names only. Line tables are enough, and cost no speed:
//!
//! ```toml
//! [profile.release]
//! debug = "line-tables-only"
//! ```
//!
//! (or `CARGO_PROFILE_RELEASE_DEBUG=line-tables-only cargo build --release`). Stripping
//! (`strip = true` / `"debuginfo"`) removes them again. This crate's own examples are
//! built that way.
//!
//! # Performance characteristics
//!
//! - Counting: an 8-byte header per block (its tag and how it was tracked; the size comes
//!   from the `Layout` every free is given), and the allocating thread's own counter slot
//!   (relaxed loads and stores, no atomic read-modify-write), folded into the tag's shared
//!   counters every 64 KiB / 64 allocations (a fold also reads the other threads' slots
//!   to raise the peaks, so a block freed on another thread never shows in a peak). No
//!   lock. A 64-byte block stays in the `malloc` size class it would have untracked.
//!   Budgeted or watched tags, and the explicit API, update the shared counters directly
//!   (exact peaks and budgets). The counting path reads one thread-local block, which
//!   caches the current tag's header, counters and size limit for one tracker while it
//!   holds that tracker's key (replaced whenever the configuration, a budget or a watch
//!   changes): about 30 instructions per allocation and free beyond `malloc`'s, with or
//!   without budgets on other tags.
//! - Records: plus a record per block, on a path of its own that skips the general
//!   placement's checks. Each thread keeps its newest block's record in its own slot
//!   (plain stores; a free on the same thread takes it back with no lock and no atomic
//!   read-modify-write); older records live in a 64-way sharded open-addressing table (spin
//!   lock per shard), where the next allocation moves the slot's record. Reports and frees
//!   on other threads see both (`pending.rs`).
//! - Stacks: plus a raw stack walk (no symbol lookup) and a stack intern. The walk follows
//!   frame pointers when the build keeps them (`-C force-frame-pointers=yes`), else (x86-64
//!   Linux) the unwind tables' rule for each return address, cached after its first use
//!   (`stack_walk/`), else it unwinds with DWARF through `backtrace` (about 10× slower).
//! - Sampled: counting's cost below the sampling size; records and stacks for one in N
//!   middle-sized allocations and every large one.
//! - Diagnostics: plus 32 guard bytes per block, a free stack and a ring entry per free.
//!
//! Measured overheads are in `BENCHMARKS.md`. Peaks of tags counted through the per-thread
//! slots are sampled (at flushes, snapshots and frame marks), so they can miss a short spike
//! of under 64 KiB per thread.
//!
//! # Safety and correctness
//!
//! The tracker never allocates through the global allocator while it holds a lock, and
//! its tables come from [`std::alloc::System`], so it cannot re-enter itself; while it runs
//! code that does allocate (logging, callbacks, symbol resolution) a const-initialised
//! thread-local flag sends those allocations to the inner allocator untracked. A free is
//! looked up (in diagnostic mode, before the block's memory is touched), and a bad one is
//! reported and the block leaked rather than freed twice.
//!
//! Switching [`Mode`] or diagnostics is safe at any time. Each switch starts a new
//! configuration epoch; the ring of freed records proves a double free only for entries of
//! the current epoch, and a block placed without a record while records are kept forgets
//! its address in the ring. So a legitimate free is never taken for a double free, whatever
//! the switches; a free the ring cannot decide is checked through the block's header, as
//! outside diagnostic mode.

mod block;
mod budget;
mod caller_frames;
mod config_key;
mod diagnostics;
mod explicit;
mod global;
mod mode;
mod pending;
mod record;
mod report;
mod scope;
mod stack_trace;
mod stack_walk;
mod stats;
mod table;
mod tag;
mod thread_stats;
mod timeline;
mod tracker;

pub use budget::{BudgetOverrun, BudgetPolicy};
pub use caller_frames::ResolvedFrame;
/// The configuration's fast-key protocol, for the loom models. Not public API.
#[cfg(loom)]
#[doc(hidden)]
pub use config_key::{ConfigKey, Word, FIRST_KEY, KEY_NONE};
pub use diagnostics::ErrorCounts;
pub use global::TrackingAllocator;
pub use mode::{Mode, Sampling};
/// The pending-record protocol, for the loom models. Not public API.
#[cfg(loom)]
#[doc(hidden)]
pub use pending::PendingRecord;
pub use report::{LeakGroup, LeakReport, MemoryReport};
pub(crate) use scope::Reentry;
pub use scope::{current_tag, scope, scope_id, TagGuard};
pub use stack_trace::{StackTrace, StackWalker, MAX_STACK_DEPTH};
/// The stack walk's rule cache, for the loom models. Not public API.
#[cfg(loom)]
#[doc(hidden)]
pub use stack_walk::rule_cache::RuleCache;
pub use stats::TagStats;
pub use tag::{Tag, TagId, MAX_TAGS};
pub use tracker::Tracker;
