//! [`SizeClassPool`]: one preallocated region split into power-of-two size classes, each a
//! pool with its free list threaded through its free blocks.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use super::shell::{self, Shell};
use parking_lot::Mutex;

use super::region::{self, Region, MAX_ALIGN};
use super::stats::SharedCounters;
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

/// End of a free list.
const NIL: u32 = u32::MAX;
/// "No class is large enough" in the size lookup table.
const NO_CLASS: u8 = u8::MAX;
/// Bytes at the start of a free block that hold the next free block's index.
const LINK: usize = size_of::<u32>();

/// One size class: `count` blocks of `block_size` bytes at `start` in the region.
struct Class {
    block_size: usize,
    /// `block_size == 1 << shift`.
    shift: u32,
    /// Offset of the class's first block in the region; a multiple of `min(block_size, 4096)`.
    start: usize,
    count: u32,
    state: Mutex<ClassState>,
}

/// A class's mutable state, behind its lock.
///
/// Invariants:
/// 1. Blocks `fresh..count` have never been handed out; they are not on the free list.
/// 2. The free list starts at `head` and links through the first 4 bytes (a `u32` index,
///    `NIL` at the end) of each free block below `fresh`.
/// 3. `allocated` has bit `i` set exactly when block `i` is handed out (one bit per block).
/// 4. `free == count - (number of set bits)`.
struct ClassState {
    head: u32,
    fresh: u32,
    free: u32,
    /// The lowest `free` has been (so `count - min_free` is the peak in use).
    min_free: u32,
    allocated: Box<[u64]>,
    allocations: u64,
}

impl ClassState {
    #[inline]
    fn is_allocated(&self, i: u32) -> bool {
        self.allocated[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    #[inline]
    fn flip(&mut self, i: u32) {
        self.allocated[(i / 64) as usize] ^= 1 << (i % 64);
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
    /// The most blocks in use at once.
    pub peak: usize,
    /// Blocks handed out over the pool's life.
    pub allocations: u64,
}

/// A general-purpose pool: one preallocated region split into power-of-two size classes.
///
/// - **Allocate**: the smallest class whose block size is at least
///   `max(size, align, 8)`; pop its free list (or take its next never-used block). If that
///   class is empty the next larger class serves the request and it counts as a *fallback*;
///   if every larger class is empty the request fails with [`Error::OutOfMemory`]. The pool
///   never grows.
/// - **Free**: the address alone finds the class (classes are contiguous address ranges);
///   a pointer that is not a block start gives [`Error::NotBlockStart`], one outside the
///   region [`Error::ForeignPointer`], and a block that is not handed out
///   [`Error::DoubleFree`].
/// - **Alignment**: classes are laid out largest first from a 4096-aligned base, so each
///   block is aligned to `min(block size, 4096)`; a request for alignment `a` simply uses a
///   class of at least `a` bytes.
/// - **Overhead**: one bit per block (the "handed out" bitmap that catches double frees),
///   rounded up to 64 bits per class, plus one lock and a few words per class. The free-list
///   links live inside the free blocks and cost nothing. Internal fragmentation is up to
///   half a block (power-of-two rounding).
/// - **Threads**: `Sync`, with one short `parking_lot::Mutex` per class around the free list,
///   bitmap and counters (no other atomic on the fast path). A lock-free class (tagged head
///   against ABA) was measured against it (bench A1b, `BENCHMARKS.md`): the lock-free pop
///   was about 25–35% faster on one thread, but it cannot read the link *inside* a free
///   block without racing the writes of a thread that has just taken that block (a data
///   race, so undefined behaviour in Rust), so it needs a side array of links (4 bytes per
///   block). The lock keeps the free list inside the blocks, as designed, and is what this
///   type uses.
/// - **Exclusive access**: a pool owned by one system can skip the lock entirely with
///   [`try_alloc_mut`](Self::try_alloc_mut) / [`try_free_mut`](Self::try_free_mut), which take
///   `&mut self` and make the same checks.
/// - **Debug builds** fill freed blocks with `0xDD` and check the fill on allocation
///   ([`Error::UseAfterFree`]); in release builds the free list is still validated (a
///   corrupt link is reported, never followed).
/// - **Drop** logs blocks still handed out as leaks (`log::warn!`).
///
/// # Examples
///
/// ```
/// use std::alloc::Layout;
/// use mmobject::alloc::SizeClassPool;
///
/// let pool = SizeClassPool::new(&[(16, 4), (64, 4)]);
/// let p = pool.alloc(Layout::new::<[u32; 3]>()); // a 16-byte block
/// // SAFETY: `p` is a live 16-byte block from `pool`, freed once.
/// unsafe { pool.free(p) };
/// assert_eq!(pool.stats().in_use, 0);
/// ```
pub struct SizeClassPool {
    region: Region,
    /// Classes in ascending block size (so descending start offset).
    classes: Box<[Class]>,
    /// `by_log2[k]`: index of the first class with `block_size >= 1 << k`, or `NO_CLASS`.
    by_log2: [u8; 64],
    counters: SharedCounters,
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
        let mut built = Vec::with_capacity(spec.len());
        for &(block_size, count) in &spec {
            assert!(
                block_size.is_power_of_two() && block_size >= 8,
                "size class block size {block_size} must be a power of two >= 8"
            );
            assert!(count < NIL as usize, "size class count {count} is too large");
            debug_assert_eq!(offset % block_size.min(MAX_ALIGN), 0, "class start misaligned");
            let bytes = block_size.checked_mul(count).expect("size class pool too large");
            built.push(Class {
                block_size,
                shift: block_size.trailing_zeros(),
                start: offset,
                count: count as u32,
                state: Mutex::new(ClassState {
                    head: NIL,
                    fresh: 0,
                    free: count as u32,
                    min_free: count as u32,
                    allocated: vec![0u64; count.div_ceil(64)].into_boxed_slice(),
                    allocations: 0,
                }),
            });
            offset = offset.checked_add(bytes).expect("size class pool too large");
        }
        built.reverse(); // ascending block size
        let mut by_log2 = [NO_CLASS; 64];
        for (k, slot) in by_log2.iter_mut().enumerate() {
            if let Some(i) = built.iter().position(|c| c.shift as usize >= k) {
                *slot = i as u8;
            }
        }
        SizeClassPool {
            region: Region::new(offset),
            classes: built.into_boxed_slice(),
            by_log2,
            counters: SharedCounters::default(),
        }
    }

    /// Bytes in all blocks of all classes.
    pub fn capacity(&self) -> usize {
        self.region.len()
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
    /// - [`Error::OutOfMemory`] if the class and every larger class are empty
    ///   (`available` is the free bytes in classes large enough for the request);
    /// - [`Error::UnsupportedAlignment`] if the alignment is above 4096;
    /// - [`Error::UseAfterFree`] if the block about to be handed out was written after it was
    ///   freed (detected by the debug fill pattern, or in any build by a corrupt free-list
    ///   link). The error is logged; try again to get another block.
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
    #[inline]
    pub fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        let align = layout.align();
        if align > MAX_ALIGN {
            return Err(self.failed(Error::UnsupportedAlignment { align, max: MAX_ALIGN }));
        }
        let need = layout.size().max(align).max(8);
        let k = need.next_power_of_two().trailing_zeros() as usize;
        let first = self.by_log2[k];
        if first == NO_CLASS {
            return Err(self.out_of_memory(layout.size(), k));
        }
        let first = first as usize;
        for (i, class) in self.classes.iter().enumerate().skip(first) {
            if let Some(ptr) = self.pop(class)? {
                if i != first {
                    self.counters.fallback();
                }
                return Ok(ptr);
            }
        }
        Err(self.out_of_memory(layout.size(), k))
    }

    /// Takes a block from `class`, or `None` if it has none free.
    #[inline]
    fn pop(&self, class: &Class) -> Result<Option<NonNull<u8>>> {
        self.pop_in(class, &mut class.state.lock())
    }

    /// [`pop`](Self::pop) with the class state already in hand (locked, or exclusively
    /// borrowed).
    #[inline(always)]
    fn pop_in(&self, class: &Class, st: &mut ClassState) -> Result<Option<NonNull<u8>>> {
        let index = if st.head != NIL {
            let index = st.head;
            let block = self.block(class, index);
            // SAFETY: invariant 2: a free block's first 4 bytes hold its link, written by
            // `try_free` under this lock (blocks are at least 8-aligned).
            let next = unsafe { block.cast::<u32>().as_ptr().read() };
            let link_ok = next == NIL || next < st.fresh;
            // SAFETY: the block is free (on the list), so nobody references it.
            if !link_ok || st.is_allocated(index) || !unsafe { Self::fill_intact(block, class) } {
                return Err(self.corrupted(class, st, index, link_ok));
            }
            st.head = next;
            index
        } else if st.fresh < class.count {
            st.fresh += 1;
            st.fresh - 1
        } else {
            return Ok(None);
        };
        debug_assert!(!st.is_allocated(index), "handing out block {index} twice");
        st.flip(index);
        st.free -= 1;
        st.min_free = st.min_free.min(st.free);
        st.allocations += 1;
        Ok(Some(self.block(class, index)))
    }

    /// # Safety
    ///
    /// `block` must be a free block of `class`.
    #[inline]
    unsafe fn fill_intact(block: NonNull<u8>, class: &Class) -> bool {
        // SAFETY: the caller guarantees the block is free: `block_size` readable bytes that
        // nobody references; the bytes after the link are initialised (debug fill).
        unsafe { region::freed_intact(block.add(LINK), class.block_size - LINK) }
    }

    #[inline]
    fn block(&self, class: &Class, index: u32) -> NonNull<u8> {
        debug_assert!(index < class.count, "block index {index} out of range");
        self.region.at(class.start + ((index as usize) << class.shift))
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

    /// Returns a block to its class.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignPointer`] if `ptr` is outside the pool, [`Error::NotBlockStart`] if it
    /// points inside a block, [`Error::DoubleFree`] if the block is not handed out. The pool
    /// is unchanged on error.
    ///
    /// # Safety
    ///
    /// Bad pointers of those three kinds are caught without touching memory. What the pool
    /// cannot tell is *who* owns a handed-out block: if `ptr` is a live block, the caller must
    /// own it and must not use it (or any copy of the pointer) afterwards, because the pool
    /// writes its free-list link into it and hands it out again.
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
    pub unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        let (class, index) = self.locate(ptr.as_ptr() as usize)?;
        // SAFETY: forwarded contract.
        unsafe { self.free_in(class, &mut class.state.lock(), index, ptr) }
    }

    /// Frees block `index` of `class` with the class state in hand.
    ///
    /// # Safety
    ///
    /// As `try_free`; `ptr` is block `index` of `class`.
    #[inline(always)]
    unsafe fn free_in(&self, class: &Class, st: &mut ClassState, index: u32, ptr: NonNull<u8>) -> Result<()> {
        if !st.is_allocated(index) {
            return Err(Error::DoubleFree { addr: ptr.as_ptr() as usize });
        }
        st.flip(index);
        let block = self.block(class, index);
        // SAFETY: the block was handed out and, by the caller's contract, is no longer used;
        // it is `block_size >= 8` bytes, aligned to at least 8.
        unsafe {
            region::fill_freed(block.add(LINK), class.block_size - LINK);
            block.cast::<u32>().as_ptr().write(st.head);
        }
        st.head = index;
        st.free += 1;
        Ok(())
    }

    /// [`try_alloc`](Self::try_alloc) through an exclusive borrow: the same checks and
    /// results, but no locking (the `&mut` proves no other thread is inside the pool). For a
    /// pool owned by one system or thread.
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
        let align = layout.align();
        let need = layout.size().max(align).max(8);
        let k = need.next_power_of_two().trailing_zeros() as usize;
        let first = self.by_log2[k];
        if align > MAX_ALIGN || first == NO_CLASS {
            return self.try_alloc(layout); // the error path
        }
        let first = first as usize;
        for i in first..self.classes.len() {
            let class = &self.classes[i];
            // SAFETY: `&mut self` guarantees no other reference to the pool exists, so no
            // lock guard does either and this is the only access to the state.
            let st = unsafe { &mut *class.state.data_ptr() };
            if let Some(ptr) = self.pop_in(class, st)? {
                if i != first {
                    self.counters.fallback();
                }
                return Ok(ptr);
            }
        }
        self.try_alloc(layout) // every class is empty: the error path
    }

    /// [`try_free`](Self::try_free) through an exclusive borrow, without locking.
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
        let (class, index) = self.locate(ptr.as_ptr() as usize)?;
        // SAFETY: `&mut self`: no other access to the state (see `try_alloc_mut`).
        let st = unsafe { &mut *class.state.data_ptr() };
        // SAFETY: forwarded contract.
        unsafe { self.free_in(class, st, index, ptr) }
    }

    /// Finds the class and block index of `addr`, checking it starts a block.
    fn locate(&self, addr: usize) -> Result<(&Class, u32)> {
        if !self.region.contains(addr) {
            return Err(Error::ForeignPointer { addr });
        }
        let offset = addr - self.region.addr();
        // Starts descend with the class index: find the first class starting at or below.
        let i = self.classes.partition_point(|c| c.start > offset);
        let class = &self.classes[i];
        let rel = offset - class.start;
        let index = rel >> class.shift;
        debug_assert!(index < class.count as usize, "class ranges cover the region");
        if rel & (class.block_size - 1) != 0 {
            let block_start = self.region.addr() + class.start + (index << class.shift);
            return Err(Error::NotBlockStart { addr, block_start });
        }
        Ok((class, index as u32))
    }

    /// Whether `ptr` lies inside the pool's region.
    #[inline]
    pub fn contains(&self, ptr: NonNull<u8>) -> bool {
        self.region.contains(ptr.as_ptr() as usize)
    }

    /// Per-class block counts, ascending by block size.
    pub fn class_stats(&self) -> Vec<SizeClassStats> {
        self.classes
            .iter()
            .map(|c| {
                let st = c.state.lock();
                SizeClassStats {
                    block_size: c.block_size,
                    blocks: c.count as usize,
                    free: st.free as usize,
                    peak: (c.count - st.min_free) as usize,
                    allocations: st.allocations,
                }
            })
            .collect()
    }

    /// Bytes of bookkeeping outside the blocks: the bitmaps and the class table.
    pub fn metadata_bytes(&self) -> usize {
        self.classes.iter().map(|c| c.count.div_ceil(64) as usize * 8 + size_of::<Class>()).sum::<usize>()
            + size_of::<Self>()
    }

    /// A snapshot of the pool's usage (`in_use` counts whole blocks; `peak` is the sum of
    /// the per-class peaks, see [`AllocStats::peak`]).
    pub fn stats(&self) -> AllocStats {
        let per_class = self.class_stats();
        let live = per_class.iter().map(|c| c.blocks - c.free).sum();
        let in_use = per_class.iter().map(|c| (c.blocks - c.free) * c.block_size).sum();
        let peak = per_class.iter().map(|c| c.peak * c.block_size).sum();
        let allocations = per_class.iter().map(|c| c.allocations).sum();
        self.counters.snapshot_with(self.region.len(), in_use, peak, live, allocations)
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
            .classes
            .iter()
            .filter(|c| c.shift as usize >= k)
            .map(|c| c.state.lock().free as usize * c.block_size)
            .sum();
        self.failed(Error::OutOfMemory { requested, available })
    }

    /// Reports a damaged free block. If its link is sound the block is refilled and stays at
    /// the head (the next call succeeds); otherwise the list is cut there, and the blocks on
    /// it are lost (reported as leaks at drop).
    #[cold]
    #[inline(never)]
    fn corrupted(&self, class: &Class, st: &mut ClassState, index: u32, link_ok: bool) -> Error {
        let block = self.block(class, index);
        if link_ok && !st.is_allocated(index) {
            // SAFETY: the block is free; refill everything after its link.
            unsafe { region::fill_freed(block.add(LINK), class.block_size - LINK) };
        } else {
            st.head = NIL;
        }
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
        for class in self.classes.iter_mut() {
            let st = class.state.get_mut();
            let live: u32 = st.allocated.iter().map(|w| w.count_ones()).sum();
            if live > 0 {
                log::warn!(
                    "SizeClassPool dropped with {live} block(s) of {} B still in use (leaked)",
                    class.block_size
                );
            }
        }
    }
}

impl fmt::Debug for SizeClassPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SizeClassPool")
            .field("capacity", &self.region.len())
            .field("classes", &self.class_stats())
            .finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` returns a whole free block of a class whose size and alignment (`min(block
//    size, 4096)`) cover the layout, from the region's pointer, handed to nobody else.
// 2. Blocks stay valid until `try_free` or the pool's drop (which needs it unborrowed).
// 3. `try_free` checks range, block start and the allocated bit before touching memory, and
//    then writes only through the region's pointer.
unsafe impl Shell for SizeClassPool {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        SizeClassPool::try_alloc(self, layout)
    }

    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { SizeClassPool::try_free(self, ptr) }
    }
}

shell::impl_allocator!(SizeClassPool);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn small() -> SizeClassPool {
        SizeClassPool::new(&[(8, 16), (16, 8), (64, 4), (256, 2), (4096, 2), (8192, 1)])
    }

    #[test]
    fn default_total() {
        let total: usize = DEFAULT_CLASSES.iter().map(|(s, c)| s * c).sum();
        assert_eq!(total, 8_716_288);
        if !cfg!(miri) {
            let pool = SizeClassPool::default();
            assert_eq!(pool.capacity(), total);
            assert_eq!(pool.class_stats().len(), 18);
        }
    }

    #[test]
    fn classes_alignment_and_zero_size() {
        let pool = small();
        for (size, align) in [(0, 1), (1, 1), (9, 8), (8, 64), (10, 4096), (5000, 4096)] {
            let p = pool.alloc(Layout::from_size_align(size, align).unwrap());
            assert_eq!(p.as_ptr() as usize % align, 0);
        }
        assert_eq!(
            pool.try_alloc(Layout::from_size_align(8, 8192).unwrap()),
            Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
        );
        assert!(matches!(
            pool.try_alloc(Layout::from_size_align(9000, 8).unwrap()),
            Err(Error::OutOfMemory { requested: 9000, available: 0 })
        ));
    }

    #[test]
    fn falls_back_to_larger_class_then_fails() {
        let pool = SizeClassPool::new(&[(8, 1), (16, 1)]);
        let a = pool.alloc(Layout::new::<u8>());
        let b = pool.alloc(Layout::new::<u8>());
        assert_eq!(pool.stats().fallbacks, 1);
        assert_eq!(pool.try_alloc(Layout::new::<u8>()), Err(Error::OutOfMemory { requested: 1, available: 0 }));
        let st = pool.stats();
        assert_eq!((st.in_use, st.peak, st.live, st.failures), (24, 24, 2, 1));
        // SAFETY: both blocks are ours and unused afterwards.
        unsafe {
            pool.free(a);
            pool.free(b);
        }
        assert_eq!(pool.stats().in_use, 0);
    }

    #[test]
    fn bad_frees() {
        let pool = small();
        let p = pool.alloc(Layout::new::<[u8; 64]>());
        let mut outside = 0u64;
        let outside = NonNull::from(&mut outside).cast::<u8>();
        // SAFETY: each bad free is detected before memory is touched; `p` is ours.
        unsafe {
            assert_eq!(pool.try_free(outside), Err(Error::ForeignPointer { addr: outside.as_ptr() as usize }));
            assert_eq!(
                pool.try_free(p.add(3)),
                Err(Error::NotBlockStart { addr: p.as_ptr() as usize + 3, block_start: p.as_ptr() as usize })
            );
            pool.free(p);
            assert_eq!(pool.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
            // A never-used block is "not handed out" too.
            let q = pool.alloc(Layout::new::<[u8; 64]>());
            assert_eq!(q, p, "LIFO reuse");
            assert_eq!(pool.try_free(q.add(64)), Err(Error::DoubleFree { addr: q.as_ptr() as usize + 64 }));
            pool.free(q);
        }
    }

    #[test]
    fn exclusive_paths_match_shared_ones() {
        let mut pool = small();
        let a = pool.try_alloc_mut(Layout::new::<[u8; 60]>()).unwrap();
        let b = pool.alloc(Layout::new::<[u8; 60]>());
        assert_ne!(a, b);
        // SAFETY: ours; the bad frees are caught.
        unsafe {
            assert!(matches!(pool.try_free_mut(a.add(1)), Err(Error::NotBlockStart { .. })));
            pool.try_free_mut(a).unwrap();
            assert_eq!(pool.try_free_mut(a), Err(Error::DoubleFree { addr: a.as_ptr() as usize }));
            pool.free(b);
        }
        assert_eq!(
            pool.try_alloc_mut(Layout::from_size_align(1, 8192).unwrap()),
            Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
        );
        let mut one = SizeClassPool::new(&[(8, 1)]);
        let _p = one.try_alloc_mut(Layout::new::<u8>()).unwrap();
        assert!(matches!(one.try_alloc_mut(Layout::new::<u8>()), Err(Error::OutOfMemory { .. })));
        assert_eq!(one.stats().failures, 1);
    }

    #[test]
    #[should_panic(expected = "double free of")]
    fn double_free_panics() {
        let pool = small();
        let p = pool.alloc(Layout::new::<u8>());
        // SAFETY: the second free is the bug under test; it is detected.
        unsafe {
            pool.free(p);
            pool.free(p);
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    fn use_after_free_is_caught() {
        let pool = SizeClassPool::new(&[(16, 2)]);
        let p = pool.alloc(Layout::new::<u64>());
        // SAFETY: freed, then written through the stale pointer (the bug under test); the
        // memory is still the pool's, so this is not UB, only wrong.
        unsafe {
            pool.free(p);
            p.add(8).as_ptr().write(1);
        }
        assert_eq!(pool.try_alloc(Layout::new::<u64>()), Err(Error::UseAfterFree { addr: p.as_ptr() as usize }));
        assert_eq!(pool.try_alloc(Layout::new::<u64>()), Ok(p), "refilled and handed out");
    }

    #[test]
    fn corrupt_link_is_reported_not_followed() {
        let pool = SizeClassPool::new(&[(16, 4)]);
        let p = pool.alloc(Layout::new::<u64>());
        // SAFETY: as above; this time the link itself is overwritten.
        unsafe {
            pool.free(p);
            p.cast::<u32>().as_ptr().write(1000);
        }
        assert_eq!(pool.try_alloc(Layout::new::<u64>()), Err(Error::UseAfterFree { addr: p.as_ptr() as usize }));
        assert!(pool.try_alloc(Layout::new::<u64>()).is_ok(), "fresh blocks still served");
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        #[test]
        fn model(ops in proptest::collection::vec((any::<bool>(), 0usize..300, 0u32..8, any::<usize>()),
                                                  0..if cfg!(miri) { 30 } else { 200 })) {
            let pool = SizeClassPool::new(&[(8, 8), (16, 8), (32, 4), (64, 4), (128, 2), (256, 2)]);
            let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
            for (n, (alloc, size, a, pick)) in ops.into_iter().enumerate() {
                if alloc || live.is_empty() {
                    let align = 1usize << a;
                    match pool.try_alloc(Layout::from_size_align(size, align).unwrap()) {
                        Ok(p) => {
                            let addr = p.as_ptr() as usize;
                            prop_assert_eq!(addr % align, 0);
                            for &(q, l, _) in &live {
                                let b = q.as_ptr() as usize;
                                prop_assert!(addr >= b + l.max(1) || addr + size.max(1) <= b, "overlap");
                            }
                            // SAFETY: a fresh block of at least `size` bytes.
                            unsafe { p.as_ptr().write_bytes(n as u8, size) };
                            live.push((p, size, n as u8));
                        }
                        Err(Error::OutOfMemory { .. }) => {}
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                } else {
                    let (p, size, fill) = live.swap_remove(pick % live.len());
                    // SAFETY: a live block from the model, read then freed once.
                    unsafe {
                        prop_assert!(std::slice::from_raw_parts(p.as_ptr(), size).iter().all(|&b| b == fill));
                        prop_assert_eq!(pool.try_free(p), Ok(()));
                        prop_assert_eq!(pool.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
                    }
                }
                let st = pool.stats();
                prop_assert_eq!(st.live, live.len());
                prop_assert!(st.in_use <= st.peak && st.peak <= st.capacity);
            }
            for (p, _, _) in live {
                // SAFETY: live blocks from the model, freed once.
                unsafe { pool.free(p) };
            }
            prop_assert_eq!(pool.stats().in_use, 0);
        }
    }
}
