//! Per-thread state of the allocators with a per-thread fast path ([`SizeClassPool`] and
//! [`SmallObjectAllocator`]): a token per thread (what a [`Page`](super::page::Page)
//! records as its owner) and, per (allocator, thread), a cache entry holding what the
//! thread owns in that allocator.
//!
//! An allocator is a value, so the caches are keyed by the allocator's id in a thread-local
//! list, with a one-entry check for the allocator used last. An entry holds indices, a
//! `Weak` to the allocator's shared state, and (a pool's) pointers to the pool's pages,
//! which live in the pool's heap state, not in the value: an allocator dropped (or
//! forgotten, or moved to another thread) while caches still name it leaves stale entries
//! behind, and ids never repeat, so a stale entry is never read again, by its allocator or
//! any other. When a thread exits, its entries drop, and each gives back what the thread
//! owned if the allocator is still alive; other threads then take it over.
//!
//! [`SizeClassPool`]: super::SizeClassPool
//! [`SmallObjectAllocator`]: super::SmallObjectAllocator

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::page::Page;
use super::page_table::PageTable;
use super::small_object::SmallCache;

/// The token of a thread whose thread-locals are gone: it owns no page, so every free it
/// makes takes the remote path.
pub(crate) const NO_TOKEN: u64 = u64::MAX;

/// Thread tokens, from 1 (0 is `page::UNOWNED`); they never repeat.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// Allocator ids, from 1 (0 marks an empty one-entry cache); they never repeat, and one
/// sequence serves every allocator kind.
static NEXT_ALLOCATOR_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh allocator id.
///
/// # Panics
///
/// Panics when every id has been used (2^64 − 2 allocators), rather than repeat one.
pub(crate) fn next_allocator_id() -> u64 {
    NEXT_ALLOCATOR_ID
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| id.checked_add(1).filter(|&n| n != u64::MAX))
        .unwrap_or_else(|_| panic!("allocator ids exhausted"))
}

/// What a thread keeps for one allocator. Dropping an entry gives back what the thread owns
/// in the allocator (if it is still alive).
///
/// # Safety
///
/// The `u64` at byte [`ID_OFFSET`](Self::ID_OFFSET) of `Self` is the id that
/// [`id`](Self::id) returns, never changed after the entry is made, and `ID_OFFSET + 8` is
/// at most [`Closed`]'s size: the fast path reads the id through a pointer to the entry,
/// or to [`CLOSED`] (see [`Fast`]).
pub(crate) unsafe trait CacheEntry: Sized + 'static {
    /// Where the id lies in the entry (from `offset_of!`).
    const ID_OFFSET: usize;
    /// The allocator's id.
    fn id(&self) -> u64;
    /// Whether the allocator still exists (entries of dropped allocators are removed).
    fn is_alive(&self) -> bool;
    /// This thread's list of entries of this kind.
    fn caches() -> &'static LocalKey<Caches<Self>>;
    /// This thread's fast check for entries of this kind.
    fn fast() -> &'static LocalKey<Fast<Self>>;
}

/// One thread's cache for one size-class pool.
///
/// `repr(C)` keeps the id first, where [`Closed`] covers it, ahead of the 2 KiB `active`.
#[repr(C)]
pub(crate) struct PoolCache {
    /// The id of the pool the cache is for.
    pub(crate) pool: u64,
    /// The pool's page table, to give the pages back when the thread exits.
    table: Weak<PageTable>,
    /// Per `k` (the log2 of a request's rounded-up size, as the pool's `by_log2` index, at
    /// most 64): the page of class `by_log2[k]` that allocations come from first (one of
    /// `owned`), or the pool's empty page (see `PageMap`), which has no block to take; all
    /// the `k` of one class hold the same entry, and a class's entry sits at least at `k` =
    /// its shift. Keyed by `k`, so the fast path goes from a request's size to its page
    /// without the class lookup; inline, so it reads it with no pointer to follow; one entry
    /// per `u8`, so `k` needs no bounds check (the entries no class serves stay empty).
    ///
    /// Invariant: every entry was made from a shared reference to one of pool `pool`'s pages
    /// or to its empty page, which live as long as that pool. Only that pool's own calls
    /// read the entries (the caches are keyed by its id, which never repeats), so an entry
    /// is never read after its pool is gone.
    pub(crate) active: [NonNull<Page>; 256],
    /// Per class: every page of the class this thread owns (indices into the page table).
    pub(crate) owned: Box<[Vec<u32>]>,
    /// Per class: pages of `owned` that the last scan of them found with a free block and
    /// that no refill has made active since, for the next refills to take in turn (see
    /// `SizeClassPool::refill`). A subset of `owned`: pages leave `owned` only in a scan,
    /// which rebuilds this list, or when the cache drops.
    pub(crate) ready: Box<[Vec<u32>]>,
    /// Per class: requests still to pass the class over, set when a refill found no free
    /// block in any page of the class (its scan and its search for an unowned page each
    /// visited up to all of them). A request that finds no block elsewhere looks at the class
    /// again before it fails (see `SizeClassPool::alloc_slow`). So a full class whose
    /// requests spill to the next costs a few page visits per request, not a visit to every
    /// page (13 µs a request with 3,125 pages), and blocks freed into it wait at most one
    /// request per page of the class before they are used again.
    pub(crate) dry: Box<[u32]>,
}

impl PoolCache {
    /// An empty cache for pool `pool` with `classes` classes.
    pub(crate) fn new(pool: u64, table: &Arc<PageTable>, classes: usize, empty: &Page) -> PoolCache {
        PoolCache {
            pool,
            table: Arc::downgrade(table),
            active: [NonNull::from(empty); 256],
            owned: (0..classes).map(|_| Vec::new()).collect(),
            ready: (0..classes).map(|_| Vec::new()).collect(),
            dry: vec![0; classes].into_boxed_slice(),
        }
    }
}

// SAFETY: `ID_OFFSET` is `pool`'s, the id, which nothing changes after `new`; the
// assertion keeps it inside `Closed`.
unsafe impl CacheEntry for PoolCache {
    const ID_OFFSET: usize = {
        let offset = std::mem::offset_of!(PoolCache, pool);
        assert!(offset + 8 <= size_of::<Closed>());
        offset
    };

    fn id(&self) -> u64 {
        self.pool
    }

    fn is_alive(&self) -> bool {
        self.table.strong_count() > 0
    }

    fn caches() -> &'static LocalKey<Caches<Self>> {
        &POOL_CACHES
    }

    fn fast() -> &'static LocalKey<Fast<Self>> {
        &POOL_FAST
    }
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        // The pool may be gone (its pages with it), or alive on another thread: hand the
        // pages back so other threads can take them over.
        if let Some(table) = self.table.upgrade() {
            for owned in self.owned.iter() {
                for &p in owned {
                    table.release(p);
                }
            }
        }
    }
}

impl fmt::Debug for PoolCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCache")
            .field("pool", &self.pool)
            .field("owned", &self.owned)
            .field("ready", &self.ready)
            .field("dry", &self.dry)
            .finish()
    }
}

/// A thread's caches of one kind, one per allocator it has used.
///
/// Invariants:
/// 1. `entries` holds pointers from `Box::into_raw`, owned by this list and freed (with
///    `Box::from_raw`) only when removed from it or when the list drops.
/// 2. `last` is null or one of `entries`, the one for allocator `last_pool`.
/// 3. While `busy` is set, exactly one `&mut E` derived from `entries` is live (the one
///    handed to [`with_cache`]'s closure); nothing else touches `entries` meanwhile.
/// 4. The thread's [`Fast`] of this kind points to `last` (whose id is `last_pool`) while
///    `busy` is clear and `last` is not null, and to [`CLOSED`] (whose "id" is 0, no
///    allocator's) otherwise and once the list has dropped, so the fast path needs one
///    compare for all three conditions.
pub(crate) struct Caches<E: CacheEntry> {
    busy: Cell<bool>,
    last_pool: Cell<u64>,
    last: Cell<*mut E>,
    entries: UnsafeCell<Vec<NonNull<E>>>,
}

/// Zeroed bytes that stand in for an entry when there is none: deep enough to hold any
/// entry's id (each [`CacheEntry`] asserts that its [`ID_OFFSET`](CacheEntry::ID_OFFSET)
/// fits).
#[repr(C, align(8))]
pub(crate) struct Closed([u8; 512]);

/// What [`Fast`] points to when the fast path is closed: whatever an entry's
/// [`ID_OFFSET`](CacheEntry::ID_OFFSET), the id read there is 0, no allocator's.
static CLOSED: Closed = Closed([0; 512]);

/// The fast path's pointer to a [`Caches`]' last entry (its invariant 4), or to [`CLOSED`].
/// One pointer, so the fast path loads it, compares the id behind it and has the entry,
/// with one thread-local load. A thread-local of its own with no destructor, so reading it
/// is a plain thread-local load, with no check that the thread's locals are still alive.
pub(crate) struct Fast<E> {
    /// An entry (from its `Box`, so with the whole entry's provenance), or [`CLOSED`] cast
    /// (never dereferenced as an `E`).
    entry: Cell<*mut E>,
}

impl<E> Fast<E> {
    const fn new() -> Fast<E> {
        Fast { entry: Cell::new(Self::closed()) }
    }

    /// [`CLOSED`], as the pointer type.
    const fn closed() -> *mut E {
        (&raw const CLOSED).cast_mut().cast()
    }

    /// Points the fast path at `entry`, or closes it if `entry` is null.
    fn set(&self, entry: *mut E) {
        self.entry.set(if entry.is_null() { Self::closed() } else { entry });
    }
}

/// Sets the thread's [`Fast`] of kind `E` (if its thread-local is still there).
fn set_fast<E: CacheEntry>(entry: *mut E) {
    let _ = E::fast().try_with(|fast| fast.set(entry));
}

impl<E: CacheEntry> Caches<E> {
    const fn new() -> Caches<E> {
        Caches {
            busy: Cell::new(false),
            last_pool: Cell::new(0),
            last: Cell::new(std::ptr::null_mut()),
            entries: UnsafeCell::new(Vec::new()),
        }
    }

    /// The cache for `pool`, created by `make` if missing; drops the caches of allocators
    /// that are gone.
    ///
    /// # Safety
    ///
    /// `busy` is set by the caller (invariant 3), so nothing else uses `entries`.
    #[cold]
    #[inline(never)]
    unsafe fn find_or_insert(&self, pool: u64, make: impl FnOnce() -> E) -> *mut E {
        // SAFETY: the caller holds `busy`, so this is the only access to the list.
        let entries = unsafe { &mut *self.entries.get() };
        entries.retain(|&entry| {
            // SAFETY: invariant 1: a live, uniquely owned box; no `&mut` to it is live.
            let cache = unsafe { entry.as_ref() };
            let alive = cache.is_alive();
            if !alive {
                // SAFETY: invariant 1: removed from the list here, freed once.
                drop(unsafe { Box::from_raw(entry.as_ptr()) });
            }
            alive
        });
        // SAFETY: invariant 1, as above.
        let found = entries.iter().copied().find(|entry| unsafe { entry.as_ref() }.id() == pool);
        let entry = found.unwrap_or_else(|| {
            let entry = NonNull::from(Box::leak(Box::new(make())));
            entries.push(entry);
            entry
        });
        self.last_pool.set(pool);
        self.last.set(entry.as_ptr());
        entry.as_ptr()
    }
}

impl<E: CacheEntry> Drop for Caches<E> {
    fn drop(&mut self) {
        // Invariant 4: the fast path must not reach the entries freed below.
        set_fast::<E>(std::ptr::null_mut());
        for entry in self.entries.get_mut().drain(..) {
            // SAFETY: invariant 1: each entry is freed once, here.
            drop(unsafe { Box::from_raw(entry.as_ptr()) });
        }
    }
}

/// Clears `busy` (and opens the fast path again, invariant 4) when the closure returns or
/// unwinds.
struct Unbusy<'a, E: CacheEntry>(&'a Caches<E>);

impl<E: CacheEntry> Drop for Unbusy<'_, E> {
    fn drop(&mut self) {
        self.0.busy.set(false);
        set_fast(self.0.last.get());
    }
}

/// The key of a thread-local (loom's under `--cfg loom`).
#[cfg(not(loom))]
pub(crate) type LocalKey<T> = std::thread::LocalKey<T>;
/// The key of a thread-local (loom's under `--cfg loom`).
#[cfg(loom)]
pub(crate) type LocalKey<T> = loom::thread::LocalKey<T>;

#[cfg(not(loom))]
std::thread_local! {
    /// This thread's token, [`NO_TOKEN`] until it is first needed.
    static TOKEN: Cell<u64> = const { Cell::new(NO_TOKEN) };
    /// This thread's size-class pool caches.
    pub(crate) static POOL_CACHES: Caches<PoolCache> = const { Caches::new() };
    /// This thread's small-object allocator caches.
    pub(crate) static SMALL_CACHES: Caches<SmallCache> = const { Caches::new() };
    /// The fast checks of those two.
    pub(crate) static POOL_FAST: Fast<PoolCache> = const { Fast::new() };
    pub(crate) static SMALL_FAST: Fast<SmallCache> = const { Fast::new() };
}

#[cfg(loom)]
loom::thread_local! {
    static TOKEN: Cell<u64> = Cell::new(NO_TOKEN);
    pub(crate) static POOL_CACHES: Caches<PoolCache> = Caches::new();
    pub(crate) static SMALL_CACHES: Caches<SmallCache> = Caches::new();
    pub(crate) static POOL_FAST: Fast<PoolCache> = Fast::new();
    pub(crate) static SMALL_FAST: Fast<SmallCache> = Fast::new();
}

/// This thread's token (assigned on first use), or [`NO_TOKEN`] once its thread-locals are
/// gone.
#[inline]
pub(crate) fn token() -> u64 {
    TOKEN
        .try_with(|t| match t.get() {
            NO_TOKEN => {
                let token = NEXT_TOKEN
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1).filter(|&n| n != NO_TOKEN))
                    .unwrap_or_else(|_| panic!("thread tokens exhausted"));
                t.set(token);
                token
            }
            token => token,
        })
        .unwrap_or(NO_TOKEN)
}

/// This thread's token if it has one, else [`NO_TOKEN`], without assigning one: enough to
/// ask "does this thread own that page?", since a thread owns pages only after [`token`]
/// gave it a token, and no page is owned by `NO_TOKEN`.
#[inline(always)]
pub(crate) fn token_if_any() -> u64 {
    TOKEN.try_with(Cell::get).unwrap_or(NO_TOKEN)
}

/// The fast path: runs `f` on this thread's cache of kind `E` for allocator `pool` if it is
/// the allocator used last and no other call is inside a cache of that kind; `None`
/// otherwise (take [`with_cache`] then).
///
/// # Safety
///
/// `f` must not call anything that could reach this module again (no allocation through
/// the global allocator, no logging, no user code): it runs without setting `busy`.
#[inline(always)]
pub(crate) unsafe fn with_last_cache<E: CacheEntry, R>(pool: u64, f: impl FnOnce(&mut E) -> Option<R>) -> Option<R> {
    E::fast()
        .try_with(|fast| {
            let entry = fast.entry.get();
            // SAFETY: invariant 4: `entry` is a live entry, whose id lies at `ID_OFFSET`, or
            // `CLOSED`, whose bytes there are 0 (`CacheEntry`'s contract); both 8-aligned,
            // and nothing writes either.
            let id = unsafe { entry.byte_add(E::ID_OFFSET).cast::<u64>().read() };
            // Equal only when `busy` is clear, the list is alive and `pool` was used last.
            if id != pool {
                return None;
            }
            // SAFETY: invariants 1–4: `entry` is the live entry for `pool` (ids are never 0,
            // so not `CLOSED`), with its box's provenance; `busy` is clear, so no other
            // reference to it exists, and `f` cannot create one (the caller's contract)
            // before this one ends.
            f(unsafe { &mut *entry })
        })
        .ok()
        .flatten()
}

/// Runs `f` on this thread's cache of kind `E` for allocator `pool`, made by `make` if
/// missing, or returns `None` when there is none to use: the thread's locals are being
/// destroyed, or this is a nested call (the allocator used as the global allocator while the
/// cache list itself allocates). The caller then takes the uncached path.
#[inline]
pub(crate) fn with_cache<E: CacheEntry, R>(
    pool: u64,
    make: impl FnOnce() -> E,
    f: impl FnOnce(&mut E) -> R,
) -> Option<R> {
    E::caches()
        .try_with(|caches| {
            if caches.busy.replace(true) {
                return None;
            }
            set_fast::<E>(std::ptr::null_mut());
            let _unbusy = Unbusy(caches);
            let cache = if caches.last_pool.get() == pool {
                caches.last.get()
            } else {
                // SAFETY: `busy` is set (just above).
                unsafe { caches.find_or_insert(pool, make) }
            };
            // SAFETY: invariants 1–3: `cache` is a live entry, and `busy` makes this the only
            // reference to it until the closure returns.
            Some(f(unsafe { &mut *cache }))
        })
        .ok()
        .flatten()
}
