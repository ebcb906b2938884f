//! Per-thread state of the size-class pools: a token per thread (what a [`Page`] records as
//! its owner) and, per (pool, thread), the pages the thread owns in each class.
//!
//! A pool is a value, so the cache is keyed by the pool's id in a thread-local list, with a
//! one-entry check for the pool used last. The cache holds page *indices* and a `Weak` to
//! the pool's page table, never a pointer into the pool: a pool dropped (or forgotten, or
//! moved to another thread) while caches still name it leaves only stale numbers behind,
//! and ids never repeat, so a stale entry is never used for another pool. When a thread
//! exits, its caches give their pages back ([`Page::release`]) if the pool is still alive;
//! other threads then take them over.

use std::cell::{Cell, UnsafeCell};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use super::page::Page;

/// "No page" in a class cache.
pub(crate) const NO_PAGE: u32 = u32::MAX;

/// The token of a thread whose thread-locals are gone: it owns no page, so every free it
/// makes takes the remote path.
pub(crate) const NO_TOKEN: u64 = u64::MAX;

/// Thread tokens, from 1 (0 is `page::UNOWNED`); they never repeat.
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

/// Pool ids, from 1 (0 marks an empty one-entry cache); they never repeat.
static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// A fresh pool id.
///
/// # Panics
///
/// Panics when every id has been used (2^64 − 2 pools), rather than repeat one.
pub(crate) fn next_pool_id() -> u64 {
    NEXT_POOL_ID
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| id.checked_add(1).filter(|&n| n != u64::MAX))
        .unwrap_or_else(|_| panic!("size-class pool ids exhausted"))
}

/// The pages one thread owns in one size class of one pool.
#[derive(Debug)]
pub(crate) struct ClassCache {
    /// The page allocations come from first, or [`NO_PAGE`]. It is in `owned`.
    pub(crate) active: u32,
    /// Every page of the class this thread owns (indices into the pool's page table).
    pub(crate) owned: Vec<u32>,
}

/// One thread's cache for one pool.
pub(crate) struct PoolCache {
    pool: u64,
    /// The pool's page table, to give the pages back when the thread exits.
    pages: Weak<[Page]>,
    pub(crate) classes: Box<[ClassCache]>,
}

impl Drop for PoolCache {
    fn drop(&mut self) {
        // The pool may be gone (its pages with it), or alive on another thread: hand the
        // pages back so other threads can take them over.
        if let Some(pages) = self.pages.upgrade() {
            for class in self.classes.iter() {
                for &p in &class.owned {
                    pages[p as usize].release();
                }
            }
        }
    }
}

impl fmt::Debug for PoolCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolCache").field("pool", &self.pool).field("classes", &self.classes).finish()
    }
}

/// A thread's caches, one per pool it has used.
///
/// Invariants:
/// 1. `entries` holds pointers from `Box::into_raw`, owned by this list and freed (with
///    `Box::from_raw`) only when removed from it or when the list drops.
/// 2. `last` is null or one of `entries`, the one for pool `last_pool`.
/// 3. While `busy` is set, exactly one `&mut PoolCache` derived from `entries` is live (the
///    one handed to [`with_cache`]'s closure); nothing else touches `entries` meanwhile.
struct Caches {
    busy: Cell<bool>,
    last_pool: Cell<u64>,
    last: Cell<*mut PoolCache>,
    entries: UnsafeCell<Vec<NonNull<PoolCache>>>,
}

impl Caches {
    const fn new() -> Caches {
        Caches {
            busy: Cell::new(false),
            last_pool: Cell::new(0),
            last: Cell::new(std::ptr::null_mut()),
            entries: UnsafeCell::new(Vec::new()),
        }
    }

    /// The cache for `pool`, created if missing; drops the caches of pools that are gone.
    ///
    /// # Safety
    ///
    /// `busy` is set by the caller (invariant 3), so nothing else uses `entries`.
    #[cold]
    #[inline(never)]
    unsafe fn find_or_insert(&self, pool: u64, pages: &Arc<[Page]>, classes: usize) -> *mut PoolCache {
        // SAFETY: the caller holds `busy`, so this is the only access to the list.
        let entries = unsafe { &mut *self.entries.get() };
        entries.retain(|&entry| {
            // SAFETY: invariant 1: a live, uniquely owned box; no `&mut` to it is live.
            let cache = unsafe { entry.as_ref() };
            let alive = cache.pages.strong_count() > 0;
            if !alive {
                // SAFETY: invariant 1: removed from the list here, freed once.
                drop(unsafe { Box::from_raw(entry.as_ptr()) });
            }
            alive
        });
        // SAFETY: invariant 1, as above.
        let found = entries.iter().copied().find(|entry| unsafe { entry.as_ref() }.pool == pool);
        let entry = found.unwrap_or_else(|| {
            let cache = Box::new(PoolCache {
                pool,
                pages: Arc::downgrade(pages),
                classes: (0..classes).map(|_| ClassCache { active: NO_PAGE, owned: Vec::new() }).collect(),
            });
            let entry = NonNull::from(Box::leak(cache));
            entries.push(entry);
            entry
        });
        self.last_pool.set(pool);
        self.last.set(entry.as_ptr());
        entry.as_ptr()
    }
}

impl Drop for Caches {
    fn drop(&mut self) {
        for entry in self.entries.get_mut().drain(..) {
            // SAFETY: invariant 1: each entry is freed once, here.
            drop(unsafe { Box::from_raw(entry.as_ptr()) });
        }
    }
}

/// Clears `busy` when the closure returns or unwinds.
struct Unbusy<'a>(&'a Cell<bool>);

impl Drop for Unbusy<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

#[cfg(not(loom))]
std::thread_local! {
    static TOKEN: Cell<u64> = const { Cell::new(0) };
    static CACHES: Caches = const { Caches::new() };
}

#[cfg(loom)]
loom::thread_local! {
    static TOKEN: Cell<u64> = Cell::new(0);
    static CACHES: Caches = Caches::new();
}

/// This thread's token (assigned on first use), or [`NO_TOKEN`] once its thread-locals are
/// gone.
#[inline]
pub(crate) fn token() -> u64 {
    TOKEN
        .try_with(|t| match t.get() {
            0 => {
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

/// The fast path: runs `f` on this thread's cache for `pool` if it is the pool used last
/// and no other call is inside a cache; `None` otherwise (take [`with_cache`] then).
///
/// # Safety
///
/// `f` must not call anything that could reach this module again (no allocation through
/// the global allocator, no logging, no user code): it runs without setting `busy`.
#[inline(always)]
pub(crate) unsafe fn with_last_cache<R>(pool: u64, f: impl FnOnce(&mut PoolCache) -> Option<R>) -> Option<R> {
    CACHES
        .try_with(|caches| {
            if caches.busy.get() || caches.last_pool.get() != pool {
                return None;
            }
            // SAFETY: invariants 1–3: `last` is the live entry for `pool`; `busy` is clear, so
            // no other reference to it exists, and `f` cannot create one (the caller's
            // contract) before this one ends.
            f(unsafe { &mut *caches.last.get() })
        })
        .ok()
        .flatten()
}

/// Runs `f` on this thread's cache for pool `pool`, or returns `None` when there is none to
/// use: the thread's locals are being destroyed, or this is a nested call (the pool used as
/// the global allocator while the cache list itself allocates). The caller then takes the
/// uncached path.
#[inline]
pub(crate) fn with_cache<R>(
    pool: u64,
    pages: &Arc<[Page]>,
    classes: usize,
    f: impl FnOnce(&mut PoolCache) -> R,
) -> Option<R> {
    CACHES
        .try_with(|caches| {
            if caches.busy.replace(true) {
                return None;
            }
            let _unbusy = Unbusy(&caches.busy);
            let cache = if caches.last_pool.get() == pool {
                caches.last.get()
            } else {
                // SAFETY: `busy` is set (just above).
                unsafe { caches.find_or_insert(pool, pages, classes) }
            };
            // SAFETY: invariants 1–3: `cache` is a live entry, and `busy` makes this the only
            // reference to it until the closure returns.
            Some(f(unsafe { &mut *cache }))
        })
        .ok()
        .flatten()
}
