//! [`SizeClassPool`]: one preallocated region split into power-of-two size classes, each
//! split into pages that threads own while they allocate from them.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::page::{self, Page, UNOWNED};
use super::page_map::{PageMap, GRANULE};
use super::page_table::PageTable;
use super::region::{self, Region, MAX_ALIGN};
use super::shell::{self, Shell};
use super::stats::SharedCounters;
use super::thread_cache::{self, PoolCache, NO_TOKEN};
use super::AllocStats;
use crate::{Error, Result};

/// The default classes, as `(block size, block count)` pairs: 8 B to 1 MiB, 18 classes,
/// 8,716,288 bytes (8.3 MiB) in all. Small classes get many blocks, classes from 256 B to
/// 256 KiB 512 KiB each, and 512 KiB / 1 MiB 1 MiB each.
pub const DEFAULT_CLASSES: [(usize, usize); 18] = [
    (8, 8192),
    (16, 8192),
    (32, 4096),
    (64, 4096),
    (128, 2048),
    (256, 2048),
    (512, 1024),
    (1024, 512),
    (2048, 256),
    (4096, 128),
    (8192, 64),
    (16 << 10, 32),
    (32 << 10, 16),
    (64 << 10, 8),
    (128 << 10, 4),
    (256 << 10, 2),
    (512 << 10, 2),
    (1 << 20, 1),
];

/// A scan of a thread's pages that finds fewer free blocks than 1 / `SCARCE` of their blocks
/// takes a fresh page too (see `SizeClassPool::scan_owned`). With 200k live 64-byte blocks
/// replaced at random, 1 / 64 took 25 % more instructions per step than 1 / 32.
const SCARCE: usize = 32;

/// "No class is large enough" in the size lookup table.
const NO_CLASS: u8 = u8::MAX;

/// One size class: `count` blocks of `block_size` bytes at `start` in the region, in pages
/// of `1 << page_shift` blocks (the last page may hold fewer).
struct Class {
    /// Offset of the class's first block in the region; a multiple of [`GRANULE`] and of
    /// `min(block_size, 4096)`.
    start: usize,
    block_size: usize,
    /// `block_size == 1 << shift`.
    shift: u32,
    count: u32,
    /// Blocks per page: `1 << page_shift`, at most 64, and small enough that the class has
    /// about 16 pages (so a few threads each owning a page leave the rest to others), but at
    /// least a [`GRANULE`] of bytes.
    page_shift: u32,
    /// The class's first page in the pool's page table, and how many it has.
    first_page: u32,
    pages: u32,

    /// Where the next search for an unowned page starts (a hint, so searches spread out).
    cursor: AtomicU32,
}

impl Class {
    /// Blocks in page `p` of this class (`p` relative to the class).
    #[inline]
    fn page_blocks(&self, p: u32) -> u32 {
        (self.count - (p << self.page_shift)).min(1 << self.page_shift)
    }

    /// Region offset of the first block of page `p` (an index into the pool's page table).
    #[inline]
    fn page_offset(&self, p: u32) -> usize {
        self.start + (((p - self.first_page) as usize) << (self.page_shift + self.shift))
    }
}

/// Per-class figures from [`SizeClassPool::class_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizeClassStats {
    /// The class's block size in bytes.
    pub block_size: usize,
    /// Blocks in the class.
    pub blocks: usize,
    /// Blocks free now.
    pub free: usize,
    /// The most blocks in use at once (an upper bound: the sum of the per-page peaks).
    pub peak: usize,
    /// Blocks handed out from the class's pages over the pool's life (the pool's
    /// [`AllocStats::allocations`] also counts blocks claimed from other threads' frees).
    pub allocations: u64,
}

/// A general-purpose pool: one preallocated region split into power-of-two size classes,
/// with a per-thread fast path.
///
/// - **Allocate**: the smallest class whose block size is at least `max(size, align, 8)`.
///   Each class is cut into pages of up to 64 blocks (and at least 512 bytes, unless the
///   class is smaller); a thread takes pages for itself and
///   allocates from them with no atomic read-modify-write and no lock (a bit scan of the
///   page's free mask). If the class has no page this thread can use, the next larger class
///   serves the request and it counts as a *fallback*; if every larger class is empty too,
///   the request fails with [`Error::OutOfMemory`]. The pool never grows. A thread that
///   found a class empty passes it over for as many requests as the class has pages (a
///   full class's spilled requests cost a few page visits each, not a visit to every page),
///   and always looks at it again before a request fails.
/// - **Free**: the address alone finds the page: one load from a table with an entry per
///   512 bytes of region (every page starts on such a boundary; the table's length is a
///   power of two, so the granule number is masked, not bounds-checked, and the block check
///   refuses an address the mask wrapped), and the page's one cache line says where its
///   blocks are and who owns it. On the page's owner thread a free sets a bit with a plain store; on any other
///   thread it sets a bit in the page's *remote* mask with one atomic `fetch_or`, and the
///   owner collects those with one swap when its page runs out. A pointer that is not a
///   block start gives [`Error::NotBlockStart`], one outside the region
///   [`Error::ForeignPointer`], and a block that is not handed out [`Error::DoubleFree`].
/// - **Double frees across threads** are caught at the call: a second free on another
///   thread finds the bit already set in the remote mask (atomically) or in the owner's
///   mask. Only two frees of one block racing on two threads at the same moment can both
///   pass their checks; the owner then finds the block free twice when it next hands out a
///   block of that page or collects its remote frees, logs the double free
///   (`log::error!`), counts it in [`AllocStats::failures`] and keeps the block free once.
///   (If the late free of such a race lands only after the block was handed out again, or
///   after a starving thread took the block from the remote mask, it looks exactly like
///   freeing a block someone else holds, which `try_free`'s safety contract rules out and
///   no allocator can tell apart: the block can then be handed out twice. Racing frees of
///   one block are that contract broken; the pool catches them when it can.)
/// - **Pages and threads**: a thread keeps the pages it has allocated from (their blocks
///   are most likely freed by the same thread, cheaply) until they are entirely free;
///   then any thread may take them over. When its page runs dry, the thread moves on to
///   the next of its pages that its last scan of them found with a free block; only when
///   those are used up does it scan its pages again (collecting their remote frees and
///   handing back the entirely free ones). A scan that finds free blocks scarce (under
///   1/32 of the blocks on its pages) also takes a fresh page, so scattered free blocks
///   stay cheap to find, for at most 1/32 of a thread's blocks held free. When a thread
///   exits, all its pages go back. When a thread finds no block in a class (nor in any
///   larger one), it claims a block freed on another thread from any page's remote mask,
///   and if there is none it marks the class *under pressure* and fails with
///   [`Error::OutOfMemory`]: from then on owners free into their pages through the remote
///   masks too (so the next attempt can claim those blocks) and hand back every page with
///   a free block when they run dry, until a thread takes over an unowned page again. So
///   under a tight budget shared by threads, an allocation can fail while other threads'
///   pages hold free blocks, and succeed when retried after those threads have freed or
///   allocated; size shared pools with some slack. A thread that lives on claimed blocks
///   (another thread owns every page and idles, as a loader that took a level's blocks
///   does) finds them through hints: threads that free into a class under pressure mark
///   the page in a bitmap with a summary word, and a count of each class's unowned pages
///   spares the search for one when there is none. Such a request costs a few atomic
///   operations (100–170 ns with 3,125 pages; 8–13 µs before the hints, when each one
///   visited every page three times).
/// - **Alignment**: classes are laid out largest first from a 4096-aligned base, each
///   starting on a 512-byte boundary, so each block is aligned to `min(block size, 4096)`;
///   a request for alignment `a` simply uses a class of at least `a` bytes.
/// - **Overhead**: 64 bytes per page (one cache line: owner, local and remote free masks,
///   counts, and where its blocks are): one byte per block for full pages; 8 bytes per 512
///   bytes of region for the address-to-page table (a pointer an entry, the entries
///   rounded up to a power of two); under 512 bytes of padding before each
///   class (address space in the region, not in [`capacity`](Self::capacity)). The
///   allocator never writes into a handed-out or free block (except the debug fill), so no
///   link can be corrupted. Internal fragmentation is up to half a block (power-of-two
///   rounding). Each thread that uses the pool keeps a cache (a page pointer per request
///   size, 2 KiB, and the list of its pages) in a thread-local.
/// - **Debug builds** fill freed blocks with `0xDD` and check the fill on allocation
///   ([`Error::UseAfterFree`]).
/// - **Drop** logs blocks still handed out as leaks (`log::warn!`). Dropping the pool while
///   other threads' caches still name it is fine: they hold its id, a `Weak` to its page
///   table, and pointers to its pages that only the pool reads (ids never repeat, so no
///   later pool reads them).
///
/// # Examples
///
/// ```
/// use std::alloc::Layout;
/// use mmobject::alloc::SizeClassPool;
///
/// let pool = SizeClassPool::new(&[(16, 4), (64, 4)]);
/// let p = pool.alloc(Layout::new::<[u32; 3]>()); // a 16-byte block
/// // Blocks may be freed on any thread.
/// let addr = p.as_ptr() as usize;
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         let p = std::ptr::NonNull::new(addr as *mut u8).unwrap();
///         // SAFETY: `p` is a live 16-byte block from `pool`, freed once.
///         unsafe { pool.free(p) };
///     });
/// });
/// assert_eq!(pool.stats().in_use, 0);
/// ```
pub struct SizeClassPool {
    region: Region,
    /// Classes in ascending block size (so descending start offset).
    classes: Box<[Class]>,
    /// Every class's pages, class after class.
    pages: Arc<[Page]>,
    /// The same pages with the hints that spare searches a visit to each; shared (as a
    /// `Weak`) with the thread caches so an exiting thread can hand its pages back.
    table: Arc<PageTable>,
    /// Keys this pool's thread caches; never repeats.
    id: u64,
    /// `by_log2[k]`: index of the first class with `block_size >= 1 << k`, or `NO_CLASS`.
    by_log2: [u8; 65],
    /// The page of each granule of the region: the free path's page lookup.
    map: PageMap,
    /// Bit `i` is set by a thread that found no block in class `i` (or any larger one), and
    /// cleared when a thread takes over an unowned page of the class again. While it is set,
    /// owners free into their own pages of the class through the remote mask too (where a
    /// starving thread can claim the block) and hand back every page with a free block when
    /// they run dry.
    pressure: AtomicU64,
    /// Bytes in all blocks (the region also holds the padding between classes).
    capacity: usize,
    counters: SharedCounters,
    /// Blocks handed out by [`steal`](Self::steal) (not counted by any page).
    stolen: AtomicU64,
}

impl SizeClassPool {
    /// Creates a pool with the given `(block size, block count)` classes, in any order.
    /// Classes with no blocks are ignored.
    ///
    /// # Panics
    ///
    /// Panics if a block size is not a power of two of at least 8 bytes, if two classes
    /// share a block size, if a count exceeds `u32::MAX - 1`, if there are more than 64
    /// classes, or if the total overflows.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = mmobject::alloc::SizeClassPool::new(&[(32, 100), (8, 1000)]);
    /// assert_eq!(pool.capacity(), 32 * 100 + 8 * 1000);
    /// ```
    pub fn new(classes: &[(usize, usize)]) -> SizeClassPool {
        let mut spec: Vec<(usize, usize)> = classes.iter().copied().filter(|c| c.1 > 0).collect();
        spec.sort_unstable_by_key(|c| std::cmp::Reverse(c.0)); // largest first in memory
        assert!(spec.len() <= 64, "at most 64 size classes");
        for w in spec.windows(2) {
            assert!(w[0].0 != w[1].0, "two size classes of {} bytes", w[0].0);
        }
        let mut offset = 0usize;
        let mut capacity = 0usize;
        let mut built = Vec::with_capacity(spec.len());
        for &(block_size, count) in &spec {
            assert!(
                block_size.is_power_of_two() && block_size >= 8,
                "size class block size {block_size} must be a power of two >= 8"
            );
            assert!(count < u32::MAX as usize, "size class count {count} is too large");
            // Classes start on granules (so one table entry names one class), aligned to their
            // blocks (so every block is aligned to `min(block_size, 4096)`).
            offset = offset
                .checked_next_multiple_of(GRANULE.max(block_size.min(MAX_ALIGN)))
                .expect("size class pool too large");
            let bytes = block_size.checked_mul(count).expect("size class pool too large");
            capacity += bytes;
            // About 16 pages per class, 1 to 64 blocks each, and at least a granule a page.
            let per_page = (count / 16).max(GRANULE >> block_size.trailing_zeros()).clamp(1, 64);
            let page_shift = usize::BITS - 1 - per_page.leading_zeros();
            built.push(Class {
                start: offset,
                block_size,
                shift: block_size.trailing_zeros(),
                count: count as u32,
                page_shift,
                first_page: 0,
                pages: count.div_ceil(1 << page_shift) as u32,
                cursor: AtomicU32::new(0),
            });
            offset = offset.checked_add(bytes).expect("size class pool too large");
        }
        built.reverse(); // ascending block size
        let mut pages = Vec::new();
        let mut spans = Vec::new();
        for (i, class) in built.iter_mut().enumerate() {
            class.first_page = u32::try_from(pages.len()).expect("too many pages");
            for rel in 0..class.pages {
                let p = class.first_page + rel;
                let start = class.page_offset(p);
                let blocks = class.page_blocks(rel);
                spans.push(start..start + ((blocks as usize) << class.shift));
                pages.push(Page::new(blocks, start, class.shift, i));
            }
        }
        let classes = built.len();
        let pages: Arc<[Page]> = pages.into();
        let mut by_log2 = [NO_CLASS; 65];
        for (k, slot) in by_log2.iter_mut().enumerate() {
            if let Some(i) = built.iter().position(|c| c.shift as usize >= k) {
                *slot = i as u8;
            }
        }
        SizeClassPool {
            region: Region::new(offset),
            map: PageMap::new(offset, Arc::clone(&pages), spans.into_iter()),
            pressure: AtomicU64::new(0),
            capacity,
            classes: built.into_boxed_slice(),
            table: Arc::new(PageTable::new(Arc::clone(&pages), classes)),
            pages,
            id: thread_cache::next_allocator_id(),
            by_log2,
            counters: SharedCounters::default(),
            stolen: AtomicU64::new(0),
        }
    }

    /// Bytes in all blocks of all classes.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Allocates a block for `layout`.
    ///
    /// # Panics
    ///
    /// Panics with the message of the error [`try_alloc`](Self::try_alloc) would return.
    #[inline]
    #[track_caller]
    pub fn alloc(&self, layout: Layout) -> NonNull<u8> {
        Shell::alloc(self, layout)
    }

    /// Allocates a block for `layout` (a zero-size request gets a real 8-byte block).
    ///
    /// # Errors
    ///
    /// - [`Error::OutOfMemory`] if the class and every larger class have no block this
    ///   thread can take (`available` is the free bytes in classes large enough for the
    ///   request, including blocks in other threads' pages);
    /// - [`Error::UnsupportedAlignment`] if the alignment is above 4096;
    /// - [`Error::UseAfterFree`] (debug builds) if the block about to be handed out was
    ///   written after it was freed (its fill pattern changed). The block is refilled and
    ///   logged; try again to get it.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// use mmobject::{alloc::SizeClassPool, Error};
    ///
    /// let pool = SizeClassPool::new(&[(64, 1)]);
    /// let p = pool.try_alloc(Layout::from_size_align(40, 64).unwrap()).unwrap();
    /// assert_eq!(p.as_ptr() as usize % 64, 0);
    /// assert!(matches!(pool.try_alloc(Layout::new::<u8>()), Err(Error::OutOfMemory { .. })));
    /// ```
    #[inline(always)]
    pub fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        let align = layout.align();
        if align > MAX_ALIGN {
            return Err(self.failed(Error::UnsupportedAlignment { align, max: MAX_ALIGN }));
        }
        // `k = log2` of `max(size, align, 8)` rounded up to a power of two; `align >= 1`, so
        // the subtraction cannot wrap, and `k <= 64`.
        let k = (usize::BITS - ((layout.size().max(align) - 1) | 7).leading_zeros()) as usize;
        // SAFETY: the closure only reads the cache: it calls nothing that could reach the
        // thread cache again.
        let active = unsafe {
            // Indexed by `k` itself (no class lookup on the way) as a `u8`, so no bounds
            // check; a `k` no class serves holds the empty page, which has no block.
            thread_cache::with_last_cache(self.id, |cache: &mut PoolCache| Some(cache.active[usize::from(k as u8)]))
        };
        if let Some(active) = active {
            // SAFETY: the cache is this pool's (`with_last_cache` matched the id), so the
            // entry points to one of its pages or its empty page (`PoolCache::active`), alive
            // with `self`.
            let page = unsafe { active.as_ref() };
            if let Some(bit) = page.take_clean() {
                // SAFETY: this thread just took block `bit` of the pool's page.
                return unsafe { self.hand_out(page, bit) };
            }
        }
        self.alloc_slow(layout, k)
    }

    /// The rest of [`try_alloc`](Self::try_alloc): a refill of this thread's page, larger
    /// classes, the uncached path, claiming a remote free, and the error.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout, k: usize) -> Result<NonNull<u8>> {
        let first = self.by_log2[k];
        if first == NO_CLASS {
            return Err(self.out_of_memory(layout.size(), k));
        }
        let first = usize::from(first);
        let make = || PoolCache::new(self.id, &self.table, self.classes.len(), self.map.empty());
        let cached = thread_cache::with_cache(self.id, make, |cache: &mut PoolCache| {
            // Classes this thread found dry lately are passed over (see `PoolCache::dry`),
            // but looked at for real before the request fails: their blocks may have been
            // freed since, and a request fails only when every class it may use is empty.
            let mut passed_over = 0u64;
            for i in first..self.classes.len() {
                if cache.dry[i] > 0 {
                    cache.dry[i] -= 1;
                    passed_over |= 1 << i;
                    continue;
                }
                // SAFETY: `with_cache` gives this thread's cache of this pool (keyed by its id).
                if let Some(ptr) = unsafe { self.alloc_cached(i, cache) }? {
                    return Ok(Some(self.counted(ptr, i, first)));
                }
            }
            for i in (first..self.classes.len()).filter(|&i| passed_over & 1 << i != 0) {
                // SAFETY: as above.
                if let Some(ptr) = unsafe { self.alloc_cached(i, cache) }? {
                    return Ok(Some(self.counted(ptr, i, first)));
                }
            }
            Ok(None)
        });
        let found = match cached {
            Some(found) => found?,
            None => self.alloc_uncached(first)?,
        };
        found.or_else(|| self.steal(first)).ok_or_else(|| self.out_of_memory(layout.size(), k))
    }

    /// `ptr`, from class `i` for a request whose first class is `first`: counted as a
    /// fallback if they differ.
    #[inline]
    fn counted(&self, ptr: NonNull<u8>, i: usize, first: usize) -> NonNull<u8> {
        if i != first {
            self.counters.fallback();
        }
        ptr
    }

    /// The last resort before running out: a block freed on another thread into a page some
    /// other thread owns, claimed from the page's remote mask. First from the pages whose
    /// remote hint is set (see [`PageTable`]), then by a walk of every page of the classes
    /// the request may use, which hints each page it finds with such a block.
    #[cold]
    #[inline(never)]
    fn steal(&self, first: usize) -> Option<NonNull<u8>> {
        // Ask the owners to free through the remote masks, where this (or a later) call can
        // claim their blocks, and the freeing threads to hint the pages.
        // A load first: a thread that lives on such blocks calls this for every request.
        if self.pressure.load(Ordering::Relaxed) & 1 << first == 0 {
            self.pressure.fetch_or(1 << first, Ordering::Relaxed);
        }
        for (i, class) in self.classes.iter().enumerate().skip(first) {
            let pages = class.first_page..class.first_page + class.pages;
            if let Some((p, bit)) =
                self.table.claim_hinted(pages, |p| self.pages[p as usize].steal_remote().map(|bit| (p, bit)))
            {
                self.table.unhint_if_empty(p, || self.pages[p as usize].has_stealable());
                // SAFETY: `p` is a page of class `i` (from its range), and this thread just
                // claimed its block `bit`.
                return Some(unsafe { self.stolen(first, i, p, bit) });
            }
        }
        // Blocks freed before the pressure, or while a claim cleared their page's hint,
        // carry none. The walk goes on past the page it claims from, so the next calls find
        // the others through their hints.
        let mut found = None;
        for (i, class) in self.classes.iter().enumerate().skip(first) {
            for p in class.first_page..class.first_page + class.pages {
                let page = &self.pages[p as usize];
                if !page.has_stealable() {
                    continue;
                }
                self.table.hint_remote(p);
                if found.is_none() {
                    found = page.steal_remote().map(|bit| (i, p, bit));
                }
            }
        }
        // SAFETY: as above.
        found.map(|(i, p, bit)| unsafe { self.stolen(first, i, p, bit) })
    }

    /// Block `bit` of page `p` of class `i`, just claimed by [`steal`](Self::steal) for a
    /// request whose first class is `first`: counted.
    ///
    /// # Safety
    ///
    /// `p` is a page of class `i`, and `bit` one of its blocks.
    unsafe fn stolen(&self, first: usize, i: usize, p: u32, bit: u32) -> NonNull<u8> {
        self.stolen.fetch_add(1, Ordering::Relaxed);
        if i != first {
            self.counters.fallback();
        }
        let class = &self.classes[i];
        // SAFETY: the caller's contract: block `bit` of a page of the class.
        unsafe { self.block(class, ((p - class.first_page) << class.page_shift) + bit) }
    }

    /// Takes a block of class `i` through this thread's cache for the class, or `None` if no
    /// page of the class has a free block this thread can take.
    ///
    /// # Safety
    ///
    /// `cache` is the calling thread's cache of this pool.
    #[inline(always)]
    unsafe fn alloc_cached(&self, i: usize, cache: &mut PoolCache) -> Result<Option<NonNull<u8>>> {
        let class = &self.classes[i];
        // A class's own `k` is its shift.
        // SAFETY: the cache is this pool's (the caller's contract), so the entry
        // points to one of its pages (`PoolCache::active`), alive with `self`.
        let active = unsafe { cache.active[class.shift as usize].as_ref() };
        if let Some(taken) = active.take() {
            // SAFETY: this thread just took the block, of a page of `class`.
            return unsafe { self.hand_out_taken(class, active, taken) }.map(Some);
        }
        match self.refill(i, cache) {
            Some(p) => {
                let page = &self.pages[p as usize];
                let taken = page.take().expect("refill returns a page with a free block");
                // SAFETY: as above.
                unsafe { self.hand_out_taken(class, page, taken) }.map(Some)
            }
            None => {
                // The refill visited every page of the class (its own, then the others for
                // an unowned one): pass the class over for as many requests.
                cache.dry[i] = class.pages;
                Ok(None)
            }
        }
    }

    /// Finds this thread a page of `class` with a free block and makes it the active one:
    /// the next page the last scan of its own pages found with a free block, else what a new
    /// scan finds ([`scan_owned`](Self::scan_owned)). Under pressure it always scans, which
    /// hands pages back.
    ///
    /// A refill used to scan every page the thread owns of the class and keep only the best.
    /// With 200k live 64-byte blocks freed at random, each scan of some 3,000 pages found one
    /// or two free blocks, and an allocation took 24 µs (glibc: 0.13 µs). Now a scan's finds
    /// last until they are used up, and a scan that finds too few takes a fresh page as well.
    ///
    /// `cache` must be the calling thread's cache of this pool (a cache is the thread's own:
    /// `PoolCache` is not `Send`, and only thread-locals hold one); its pool is checked.
    #[cold]
    #[inline(never)]
    fn refill(&self, class_index: usize, cache: &mut PoolCache) -> Option<u32> {
        assert_eq!(cache.pool, self.id, "a refill through another pool's cache");
        let class = &self.classes[class_index];
        let pressure = self.pressure.load(Ordering::Relaxed) & 1 << class_index != 0;
        let mut found = None;
        if !pressure {
            let ready = &mut cache.ready[class_index];
            while let Some(p) = ready.pop() {
                // A ready page is still this thread's and still has the free blocks the scan
                // saw (only the active page is taken from; see `PoolCache::ready`). The test
                // is one load, and should that ever change it only sends us to a scan.
                // SAFETY: the cache is this thread's of this pool (checked above), so its
                // ready list holds this thread's pages of the class.
                unsafe { self.collect(class, p) };
                if self.pages[p as usize].has_local_free() {
                    found = Some(p);
                    break;
                }
            }
        }
        // SAFETY: the cache is this thread's cache of this pool (checked above).
        let found = found.or_else(|| unsafe { self.scan_owned(class_index, pressure, cache) });
        // Every `k` the class serves first: those above the previous class's shift, up to
        // its own.
        let lowest = class_index.checked_sub(1).map_or(0, |below| self.classes[below].shift as usize + 1);
        let active = found.map_or(self.map.empty(), |p| &self.pages[p as usize]);
        cache.active[lowest..=class.shift as usize].fill(NonNull::from(active));
        found
    }

    /// Scans this thread's pages of class `class_index` (collecting their remote frees) and
    /// returns the one to make active: the page with the most free blocks, so the next refill
    /// is as far off as it can be. Of the others, those entirely free go back to the pool,
    /// and those with a free block become the class's ready list. Under `pressure` every page
    /// with a free block goes back instead, but the first one found.
    ///
    /// If the free blocks it found are scarce (under 1 / [`SCARCE`] of the blocks on the pages
    /// it visited: 2 a page of 64), it also takes over an unowned page, which becomes the
    /// active one. So a scan costs about one page visit per two blocks it finds, however
    /// scattered they are, for a slack of at most 1 / `SCARCE` of the thread's blocks.
    ///
    /// # Safety
    ///
    /// `cache` is the calling thread's cache of this pool.
    unsafe fn scan_owned(&self, class_index: usize, pressure: bool, cache: &mut PoolCache) -> Option<u32> {
        let class = &self.classes[class_index];
        let owned = &mut cache.owned[class_index];
        let ready = &mut cache.ready[class_index];
        ready.clear();
        let visited = owned.len();
        let mut total = 0usize;
        let mut found: Option<(u32, u32)> = None;
        let mut i = 0;
        while i < owned.len() {
            let p = owned[i];
            let page = &self.pages[p as usize];
            // SAFETY: the cache is this thread's of this pool (the caller), so `owned` holds
            // this thread's pages of the class.
            unsafe { self.collect(class, p) };
            let free = page.local_free_count();
            if free > 0 {
                match found {
                    Some((_, most)) if pressure || free <= most => {
                        if pressure || page.all_free(page::full_mask(class.page_blocks(p - class.first_page))) {
                            self.table.release(p);
                            owned.swap_remove(i);
                            continue;
                        }
                        ready.push(p);
                    }
                    Some((best, _)) => {
                        ready.push(best);
                        found = Some((p, free));
                    }
                    None => found = Some((p, free)),
                }
                total += free as usize;
            }
            i += 1;
        }
        let mut found = found.map(|(p, _)| p);
        if found.is_none() || (!pressure && total < (visited << class.page_shift) / SCARCE) {
            if let Some(fresh) = self.acquire(class_index, thread_cache::token()) {
                owned.push(fresh);
                ready.extend(found);
                found = Some(fresh);
            }
        }
        found
    }

    /// Takes over an unowned page of `class` that has a free block (after collecting its
    /// remote frees), or returns `None`.
    fn acquire(&self, class_index: usize, token: u64) -> Option<u32> {
        if token == NO_TOKEN {
            return None; // a thread without a token cannot tell its pages from others'
        }
        if !self.table.has_unowned(class_index) {
            return None; // every page has an owner: nothing to search
        }
        let class = &self.classes[class_index];
        let start = class.cursor.load(Ordering::Relaxed) % class.pages;
        for n in 0..class.pages {
            let rel = (start + n) % class.pages;
            let p = class.first_page + rel;
            let page = &self.pages[p as usize];
            if page.owner() == UNOWNED && page.may_have_free() && self.table.try_acquire(p, token) {
                // SAFETY: a page of the class, which this thread just acquired.
                unsafe { self.collect(class, p) };
                if page.has_local_free() {
                    class.cursor.store(rel + 1, Ordering::Relaxed);
                    let bit = 1 << self.pages[p as usize].class();
                    if self.pressure.load(Ordering::Relaxed) & bit != 0 {
                        self.pressure.fetch_and(!bit, Ordering::Relaxed);
                    }
                    return Some(p);
                }
                self.table.release(p);
            }
        }
        None
    }

    /// The path without a thread cache (a nested call, or a thread whose locals are gone):
    /// takes over a page for one allocation and hands it back.
    #[cold]
    #[inline(never)]
    fn alloc_uncached(&self, first: usize) -> Result<Option<NonNull<u8>>> {
        let token = thread_cache::token();
        for (i, class) in self.classes.iter().enumerate().skip(first) {
            if let Some(p) = self.acquire(i, token) {
                let page = &self.pages[p as usize];
                let taken = page.take().expect("acquire returns a page with a free block");
                // SAFETY: this thread just took the block, of a page of `class`.
                let result = unsafe { self.hand_out_taken(class, page, taken) };
                self.table.release(p);
                if i != first {
                    self.counters.fallback();
                }
                return result.map(Some);
            }
        }
        Ok(None)
    }

    /// Moves page `p`'s remote frees to its local mask, filling the blocks in debug builds
    /// and reporting blocks freed twice.
    ///
    /// # Safety
    ///
    /// `p` is a page of `class`, and the calling thread owns it.
    unsafe fn collect(&self, class: &Class, p: u32) {
        let base = (p - class.first_page) << class.page_shift;
        let doubles = self.pages[p as usize].collect(|bit| {
            // SAFETY: `bit` came from the page's remote mask, so the block is one of the
            // page's, a page of `class` (the caller), and it was just freed by another
            // thread (its `Release` free happened before our `Acquire` swap) and is not yet
            // free to hand out: nobody references it.
            unsafe { region::fill_freed(self.block(class, base + bit), class.block_size) };
        });
        if doubles != 0 {
            // SAFETY: `base` is the class's index of the page's first block, and `doubles`
            // holds bits of the page's masks.
            unsafe { self.double_free_raced(class, base, doubles) };
        }
    }

    /// [`hand_out`](Self::hand_out) for block `bit` of `page` of `class`, just taken;
    /// reports the page's blocks found freed twice (`doubles`, see [`Page::take`]).
    ///
    /// # Safety
    ///
    /// As for `hand_out`, and `page` is one of `class`'s.
    #[inline(always)]
    unsafe fn hand_out_taken(&self, class: &Class, page: &Page, (bit, doubles): (u32, u64)) -> Result<NonNull<u8>> {
        if doubles != 0 {
            // The class's index of the page's first block.
            let base = (page.start() - class.start) >> class.shift;
            // SAFETY: `page` is one of `class`'s (the caller), and `doubles` holds bits of its
            // masks.
            unsafe { self.double_free_raced(class, base as u32, doubles) };
        }
        // SAFETY: the caller's contract.
        unsafe { self.hand_out(page, bit) }
    }

    /// Returns block `bit` of `page`, just taken, after the use-after-free check.
    ///
    /// # Safety
    ///
    /// The calling thread just took block `bit` of `page`, one of `self.pages`, and hands
    /// it to nobody else.
    #[inline(always)]
    unsafe fn hand_out(&self, page: &Page, bit: u32) -> Result<NonNull<u8>> {
        let block_size = 1 << page.shift();
        // SAFETY: `page` had block `bit` to take (the caller), so it is one of `self.pages`
        // (the empty page has none), and its blocks lie inside the region.
        let block = unsafe { self.region.at(page.block_offset(bit)) };
        // SAFETY: the block was free until `take` just now: `block_size` bytes nobody else
        // references, initialised by the region's fill or the last free's.
        if !unsafe { region::freed_intact(block, block_size) } {
            // SAFETY: just taken, not handed out yet.
            return Err(unsafe { self.corrupted(page, bit, block, block_size) });
        }
        Ok(block)
    }

    /// Block `index` of `class` (one of `self.classes`).
    ///
    /// # Safety
    ///
    /// `index < class.count`: a block of one of the class's pages (a page's masks hold no
    /// bit past its blocks, `Page`'s invariant 3).
    #[inline]
    unsafe fn block(&self, class: &Class, index: u32) -> NonNull<u8> {
        debug_assert!(index < class.count, "block index {index} out of range");
        // SAFETY: the class's `count` blocks lie inside the region, and `index` is one.
        unsafe { self.region.at(class.start + ((index as usize) << class.shift)) }
    }

    /// Returns a block to its class.
    ///
    /// # Panics
    ///
    /// Panics with the message of the error [`try_free`](Self::try_free) would return.
    ///
    /// # Safety
    ///
    /// As [`try_free`](Self::try_free).
    #[inline]
    #[track_caller]
    pub unsafe fn free(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded contract.
        unsafe { Shell::free(self, ptr) }
    }

    /// Returns a block to its class, from any thread.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignPointer`] if `ptr` is outside the pool, [`Error::NotBlockStart`] if it
    /// points inside a block, [`Error::DoubleFree`] if the block is not handed out. The pool
    /// is unchanged on error. (Two frees of one block racing on two threads at once are
    /// reported later by the page's owner instead: see the type's docs.)
    ///
    /// # Safety
    ///
    /// Bad pointers of those three kinds are caught without touching memory. What the pool
    /// cannot tell is *who* owns a handed-out block: if `ptr` is a live block, the caller must
    /// own it and must not use it (or any copy of the pointer) afterwards, because the pool
    /// hands it out again.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// use mmobject::{alloc::SizeClassPool, Error};
    ///
    /// let pool = SizeClassPool::new(&[(32, 2)]);
    /// let p = pool.alloc(Layout::new::<u64>());
    /// // SAFETY: `p` is ours and unused after the free; the bad frees are caught.
    /// unsafe {
    ///     assert!(matches!(pool.try_free(p.add(8)), Err(Error::NotBlockStart { .. })));
    ///     pool.free(p);
    ///     assert_eq!(pool.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
    /// }
    /// ```
    #[inline(always)]
    pub unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { shell::try_free_fast_first(self, ptr) }
    }

    /// The common case of [`try_free`](Self::try_free), inlined into its callers: `ptr` is a
    /// handed-out block. Frees it (on the owner's path, or as a remote free) and returns
    /// `true`; otherwise returns `false` having changed nothing, and
    /// [`free_checked`](Self::free_checked) does the whole free. Kept apart so that the
    /// caller's fast path builds no error and needs no stack frame.
    ///
    /// # Safety
    ///
    /// As `try_free`.
    #[inline(always)]
    unsafe fn free_block(&self, ptr: NonNull<u8>) -> bool {
        let Some((page, offset, bit)) = self.find_block(ptr.as_ptr() as usize) else { return false };
        if page.owner() != thread_cache::token_if_any() {
            self.free_remote(page, bit).is_ok()
        } else if self.pressure.load(Ordering::Relaxed) == 0 {
            // SAFETY: forwarded contract; `page` is this thread's and its class under no
            // pressure (as `is_local`, with one test for every class).
            unsafe { self.free_here(page, offset, bit) }.is_ok()
        } else {
            false // some class is under pressure: `free_checked` tests the page's
        }
    }

    /// [`try_free`](Self::try_free) from the start, for every case the fast path leaves:
    /// every bad free, a double free included.
    ///
    /// # Safety
    ///
    /// As `try_free`.
    #[cold]
    #[inline(never)]
    unsafe fn free_checked(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        let (page, offset, bit) = self.locate(addr)?;
        let freed = if self.is_local(page) {
            // SAFETY: forwarded contract; `page` is this thread's (just checked).
            unsafe { self.free_here(page, offset, bit) }
        } else {
            self.free_remote(page, bit)
        };
        freed.map_err(|()| Error::DoubleFree { addr })
    }

    /// Whether a free in `page` takes the owner's path: the page is this thread's, and its
    /// class is under no pressure. No page is owned by `NO_TOKEN` (see `acquire`), so a
    /// thread without a token frees remotely.
    #[inline(always)]
    fn is_local(&self, page: &Page) -> bool {
        page.owner() == thread_cache::token_if_any() && self.pressure.load(Ordering::Relaxed) & 1 << page.class() == 0
    }

    /// Frees block `bit` of `page` into its remote mask, for its owner to collect or a
    /// starving thread to claim: `Err` if it is free already. While the page's class is
    /// under pressure (a thread is claiming such blocks), hints the page for that thread.
    /// Only a test of the pressure as a whole is inline: no class is under pressure in the
    /// common case.
    #[inline(always)]
    fn free_remote(&self, page: &Page, bit: u32) -> std::result::Result<(), ()> {
        page.free_remote(bit)?;
        if self.pressure.load(Ordering::Relaxed) != 0 {
            self.hint_remote(page);
        }
        Ok(())
    }

    /// The rest of [`free_remote`](Self::free_remote) under pressure: hints the page (see
    /// [`PageTable::hint_remote`]) if its class is under pressure.
    #[cold]
    #[inline(never)]
    fn hint_remote(&self, page: &Page) {
        if self.pressure.load(Ordering::Relaxed) & 1 << page.class() != 0 {
            let p = (page as *const Page as usize - self.pages.as_ptr() as usize) / std::mem::size_of::<Page>();
            self.table.hint_remote(p as u32);
        }
    }

    /// Frees block `bit` of `page`, at `offset` in the region, on the page owner's path:
    /// `Err` if it is free already.
    ///
    /// # Safety
    ///
    /// As `try_free`, and `page` is this thread's ([`is_local`](Self::is_local)).
    #[inline(always)]
    unsafe fn free_here(&self, page: &Page, offset: usize, bit: u32) -> std::result::Result<(), ()> {
        page.free_local(bit, || {
            // SAFETY: the block was handed out and, by the caller's contract, is no longer
            // used; it starts at `offset` in the region (`find_block`), and the pool's own
            // pointer covers its `1 << shift` bytes.
            unsafe { region::fill_freed(self.region.at(offset), 1 << page.shift()) }
        })
    }

    /// [`try_alloc`](Self::try_alloc) through an exclusive borrow. Kept for callers that own
    /// their pool: the shared path takes no lock any more, so this is the same call.
    ///
    /// # Errors
    ///
    /// As [`try_alloc`](Self::try_alloc).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let mut pool = mmobject::alloc::SizeClassPool::new(&[(32, 8)]);
    /// let p = pool.try_alloc_mut(Layout::new::<[u8; 20]>()).unwrap();
    /// // SAFETY: `p` is ours, freed once.
    /// unsafe { pool.try_free_mut(p).unwrap() };
    /// ```
    #[inline]
    pub fn try_alloc_mut(&mut self, layout: Layout) -> Result<NonNull<u8>> {
        self.try_alloc(layout)
    }

    /// [`try_free`](Self::try_free) through an exclusive borrow (the same call).
    ///
    /// # Errors
    ///
    /// As [`try_free`](Self::try_free).
    ///
    /// # Safety
    ///
    /// As [`try_free`](Self::try_free).
    #[inline]
    pub unsafe fn try_free_mut(&mut self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.try_free(ptr) }
    }

    /// Finds the page of `addr`, its region offset and its bit in the page, checking it
    /// starts a block.
    #[inline(always)]
    fn locate(&self, addr: usize) -> Result<(&Page, usize, u32)> {
        self.find_block(addr).ok_or_else(|| self.not_a_block(addr))
    }

    /// [`locate`](Self::locate) without the error: `None` if `addr` starts no block.
    #[inline(always)]
    fn find_block(&self, addr: usize) -> Option<(&Page, usize, u32)> {
        let (page, offset, rel) = self.page_of(addr);
        // The block index if `rel` is a block's start; otherwise the rotation moves the low
        // bits to the top, and the index is far above any block count. One compare checks
        // both "a block's start" and "before the page's end".
        let bit = rel.rotate_right(page.shift());
        if bit >= page.blocks() as usize {
            return None;
        }
        Some((page, offset, bit as u32))
    }

    /// The page the table gives for `addr`, `addr`'s region offset, and its offset from the
    /// page's first block. Below the region, the region offset wraps to far past it. Outside
    /// the region, the masked lookup lands on some page (or on the empty page): the offset
    /// from it is then at or past the page's end, or wraps to far past it.
    #[inline(always)]
    fn page_of(&self, addr: usize) -> (&Page, usize, usize) {
        let offset = addr.wrapping_sub(self.region.addr());
        let page = self.map.page_at(offset);
        (page, offset, offset.wrapping_sub(page.start()))
    }

    /// The error for a free at `addr`, which starts no block: outside the region or in the
    /// padding between classes, inside a block, or in the padding after a class's end.
    #[cold]
    #[inline(never)]
    fn not_a_block(&self, addr: usize) -> Error {
        let (page, _, rel) = self.page_of(addr);
        let bit = rel >> page.shift();
        if bit >= page.blocks() as usize {
            Error::ForeignPointer { addr }
        } else {
            Error::NotBlockStart { addr, block_start: addr - (rel - (bit << page.shift())) }
        }
    }

    /// Whether `ptr` lies inside the pool's region.
    #[inline]
    pub fn contains(&self, ptr: NonNull<u8>) -> bool {
        self.region.contains(ptr.as_ptr() as usize)
    }

    /// Per-class block counts, ascending by block size. Blocks in pages other threads own
    /// are read as they stand (a snapshot, exact when no other thread is inside the pool).
    pub fn class_stats(&self) -> Vec<SizeClassStats> {
        self.classes
            .iter()
            .map(|c| {
                let (mut free, mut peak, mut allocations) = (0, 0, 0);
                for rel in 0..c.pages {
                    let page = &self.pages[(c.first_page + rel) as usize];
                    let (allocs, page_peak) = page.counts();
                    free += page.free_count() as usize;
                    peak += page_peak as usize;
                    allocations += allocs;
                }
                SizeClassStats { block_size: c.block_size, blocks: c.count as usize, free, peak, allocations }
            })
            .collect()
    }

    /// Bytes of bookkeeping outside the blocks: the page table and the class tables (each
    /// thread that uses the pool adds a few words per class in its thread-local cache).
    pub fn metadata_bytes(&self) -> usize {
        self.pages.len() * size_of::<Page>()
            + self.classes.len() * size_of::<Class>()
            + self.map.table_bytes()
            + size_of::<Self>()
    }

    /// A snapshot of the pool's usage (`in_use` counts whole blocks; `peak` is the sum of
    /// the per-page peaks, see [`AllocStats::peak`]).
    pub fn stats(&self) -> AllocStats {
        let per_class = self.class_stats();
        let live = per_class.iter().map(|c| c.blocks - c.free).sum();
        let in_use = per_class.iter().map(|c| (c.blocks - c.free) * c.block_size).sum();
        let peak = per_class.iter().map(|c| c.peak * c.block_size).sum();
        let allocations = per_class.iter().map(|c| c.allocations).sum::<u64>() + self.stolen.load(Ordering::Relaxed);
        self.counters.snapshot_with(self.capacity, in_use, peak, live, allocations)
    }

    #[cold]
    #[inline(never)]
    fn failed(&self, error: Error) -> Error {
        self.counters.failure();
        error
    }

    #[cold]
    #[inline(never)]
    fn out_of_memory(&self, requested: usize, k: usize) -> Error {
        let available = self
            .class_stats()
            .iter()
            .filter(|c| c.block_size.trailing_zeros() as usize >= k)
            .map(|c| c.free * c.block_size)
            .sum();
        self.failed(Error::OutOfMemory { requested, available })
    }

    /// Reports blocks of a page found freed twice when their two frees raced on two threads.
    /// The second free is ignored (the block is free once).
    ///
    /// # Safety
    ///
    /// `base` is `class`'s index of the first block of one of its pages, and `doubles` holds
    /// only bits of that page's blocks.
    #[cold]
    #[inline(never)]
    unsafe fn double_free_raced(&self, class: &Class, base: u32, mut doubles: u64) {
        while doubles != 0 {
            // SAFETY: the caller's contract: a block of one of the class's pages.
            let addr = unsafe { self.block(class, base + doubles.trailing_zeros()) }.as_ptr() as usize;
            log::error!(
                "SizeClassPool: {} (two frees raced on two threads; the second is ignored)",
                Error::DoubleFree { addr }
            );
            self.counters.failure();
            doubles &= doubles - 1;
        }
    }

    /// Reports a free block whose fill was overwritten: it is refilled and put back, so the
    /// next call hands it out.
    ///
    /// # Safety
    ///
    /// `block` is block `bit` of `page`, `block_size` bytes, just taken and handed to nobody.
    #[cold]
    #[inline(never)]
    unsafe fn corrupted(&self, page: &Page, bit: u32, block: NonNull<u8>, block_size: usize) -> Error {
        // SAFETY: the caller's contract: nobody references the block.
        unsafe { region::fill_freed(block, block_size) };
        page.untake(bit);
        self.failed(region::use_after_free("SizeClassPool", block.as_ptr() as usize))
    }
}

impl Default for SizeClassPool {
    /// A pool with [`DEFAULT_CLASSES`] (8.3 MiB).
    fn default() -> Self {
        SizeClassPool::new(&DEFAULT_CLASSES)
    }
}

impl Drop for SizeClassPool {
    fn drop(&mut self) {
        for c in self.class_stats() {
            let live = c.blocks - c.free;
            if live > 0 {
                log::warn!("SizeClassPool dropped with {live} block(s) of {} B still in use (leaked)", c.block_size);
            }
        }
    }
}

impl fmt::Debug for SizeClassPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SizeClassPool")
            .field("capacity", &self.capacity)
            .field("pages", &self.pages.len())
            .field("classes", &self.class_stats())
            .finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` returns a whole block of a class whose size and alignment (`min(block
//    size, 4096)`) cover the layout, from the region's pointer. Its bit was cleared in the
//    page's free mask by the page's one owner (page invariant 1), so nobody else is handed
//    it until it is freed.
// 2. Blocks stay valid until `try_free` or the pool's drop (which needs it unborrowed).
// 3. `try_free` checks range, block start and the free bits before touching memory; a
//    remote free touches no block memory at all, a local one writes only the debug fill,
//    through the region's pointer.
// 4, 5. `grow_in_place` and `shrink_in_place` return the block itself, through the
//    region's pointer (whose provenance covers all of it), only when the new layout fits
//    the block (size up to the block's, alignment dividing its address).
// 6. `try_free` frees a block by its address.
unsafe impl Shell for SizeClassPool {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        SizeClassPool::try_alloc(self, layout)
    }

    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.free_checked(ptr) }
    }

    #[inline(always)]
    unsafe fn free_fast(&self, ptr: NonNull<u8>) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.free_block(ptr) }
    }

    /// A block grows within itself when the new layout fits it.
    #[inline]
    unsafe fn grow_in_place(&self, ptr: NonNull<u8>, _old: Layout, new: Layout) -> Option<NonNull<u8>> {
        self.resize_in_place(ptr, new, |page| new.size() <= 1 << page.shift())
    }

    /// A block stays where it is when its class is the one the new layout would be served
    /// from first: moving it would take a second block of the same size.
    #[inline]
    unsafe fn shrink_in_place(&self, ptr: NonNull<u8>, _old: Layout, new: Layout) -> Option<NonNull<u8>> {
        self.resize_in_place(ptr, new, |page| self.first_class(new) == Some(page.class()))
    }
}

impl SizeClassPool {
    /// The class a request for `layout` is served from first, as in
    /// [`try_alloc`](Self::try_alloc), or `None` if no class is large enough.
    fn first_class(&self, layout: Layout) -> Option<usize> {
        let k = (usize::BITS - ((layout.size().max(layout.align()) - 1) | 7).leading_zeros()) as usize;
        let first = self.by_log2[k];
        (first != NO_CLASS).then_some(usize::from(first))
    }

    /// `ptr`'s block, through the region's pointer, if `new`'s alignment divides its address
    /// and `keep` accepts its page; otherwise `None`.
    #[cold]
    #[inline(never)]
    fn resize_in_place(&self, ptr: NonNull<u8>, new: Layout, keep: impl FnOnce(&Page) -> bool) -> Option<NonNull<u8>> {
        let addr = ptr.as_ptr() as usize;
        let (page, offset, _) = self.find_block(addr)?;
        // SAFETY: `find_block` found a block starting at `offset`, inside the region.
        (addr % new.align() == 0 && keep(page)).then(|| unsafe { self.region.at(offset) })
    }
}

shell::impl_allocator!(SizeClassPool);

#[cfg(test)]
mod tests;
