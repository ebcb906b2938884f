//! [`SegmentAlloc`]: large, long-lived blocks from the system allocator, at any alignment,
//! counted and checked. The default source of object-store memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::ptr::NonNull;

use parking_lot::Mutex;

use super::region::{self, SystemBlock};
use super::shell::{self, Shell};
use super::AllocStats;
use crate::{Error, Result};

/// How many freed addresses are remembered to tell a double free from a foreign pointer.
const FREED_MEMORY: usize = 256;

/// Freed blocks kept for reuse, at most this many bytes and [`CACHE_BLOCKS`] blocks.
const CACHE_BYTES: usize = 64 << 20;
const CACHE_BLOCKS: usize = 32;

/// Large blocks straight from the system allocator ([`std::alloc::System`], not the global
/// allocator), at any power-of-two alignment, with a ledger that checks every free.
///
/// It is what an [`ObjectManager`](crate::ObjectManager)'s stores take their segments and
/// side tables from when the builder is given no
/// [`allocator`](crate::object::ObjectManagerBuilder::allocator): [`SegmentAlloc::global`], whose
/// [`stats`](Self::stats) therefore show the memory of every such store in the process.
/// Give a manager its own `SegmentAlloc` with a [limit](Self::with_limit) to put its objects
/// under a hard memory cap, as a console memory map does.
///
/// - **Cost**: one system allocation and one ledger entry (behind a lock) per block. Meant
///   for few, large blocks (a store allocates about `log2(objects)` segments), not for
///   small objects: use [`SizeClassPool`](super::SizeClassPool) or
///   [`SmallObjectAllocator`](super::SmallObjectAllocator) for those.
/// - **Alignment**: any power of two, beyond [`MAX_ALIGN`](super::MAX_ALIGN) too. A
///   zero-size request gets a real one-byte block.
/// - **Bad frees**: a pointer it never handed out ([`Error::ForeignPointer`]), one inside
///   a block ([`Error::NotBlockStart`]) and a recent double free ([`Error::DoubleFree`]) are
///   reported before any memory is touched.
/// - **When full** (past its limit, or when the system refuses):
///   [`Error::OutOfMemory`], counted as a failure.
/// - **Reuse**: a freed block is kept (up to 64 MiB and 32 blocks in all) and handed out
///   again for the same layout, as `malloc` reuses its heap: a store that loads and
///   unloads a level every few seconds does not map, fault in and unmap its segments each
///   time. Kept blocks count against the limit, are not in [`stats`](Self::stats)'s
///   `in_use`, and are given back to the system when the limit needs the room, by
///   [`release_cached`](Self::release_cached), or when the allocator is dropped.
/// - **Threads**: `Send + Sync`; its ledger holds addresses, and the kept blocks.
///
/// Invariants: `ledger.live` maps the address of every block handed out and not yet freed
/// to the pointer `System` returned for it and the layout it was allocated with (the free
/// goes through that pointer, never the caller's, whose provenance may be narrower); `ledger.cached` holds blocks
/// allocated from `System` with their layouts, handed out to nobody; `ledger.in_use` is
/// the sum of the live layouts' sizes, `ledger.cached_bytes` that of the cached ones, and
/// their sum never exceeds `limit`.
///
/// # Examples
///
/// ```
/// use std::alloc::Layout;
/// use mmobject::alloc::SegmentAlloc;
///
/// let segments = SegmentAlloc::with_limit(1 << 20);
/// let layout = Layout::from_size_align(64 << 10, 64 << 10).unwrap();
/// let block = segments.alloc(layout);
/// assert_eq!(block.as_ptr() as usize % (64 << 10), 0);
/// assert_eq!(segments.stats().in_use, 64 << 10);
/// assert!(segments.try_alloc(Layout::from_size_align(1 << 20, 8).unwrap()).is_err());
/// // SAFETY: `block` came from `segments` and is not used after this.
/// unsafe { segments.free(block) };
/// assert_eq!(segments.stats().in_use, 0);
/// ```
pub struct SegmentAlloc {
    limit: usize,
    ledger: Mutex<SegmentLedger>,
}

#[derive(Debug)]
struct SegmentLedger {
    live: BTreeMap<usize, (SystemBlock, Layout)>,
    freed: VecDeque<usize>,
    cached: Vec<(SystemBlock, Layout)>,
    cached_bytes: usize,
    in_use: usize,
    peak: usize,
    allocations: u64,
    failures: u64,
}

static GLOBAL: SegmentAlloc = SegmentAlloc::new();

impl SegmentAlloc {
    /// An allocator with no limit of its own.
    pub const fn new() -> SegmentAlloc {
        SegmentAlloc::with_limit(usize::MAX)
    }

    /// An allocator that refuses to hold more than `bytes` at once.
    pub const fn with_limit(bytes: usize) -> SegmentAlloc {
        SegmentAlloc {
            limit: bytes,
            ledger: Mutex::new(SegmentLedger {
                live: BTreeMap::new(),
                freed: VecDeque::new(),
                cached: Vec::new(),
                cached_bytes: 0,
                in_use: 0,
                peak: 0,
                allocations: 0,
                failures: 0,
            }),
        }
    }

    /// The process-wide instance object stores use by default.
    pub fn global() -> &'static SegmentAlloc {
        &GLOBAL
    }

    /// Allocates a block for `layout`.
    ///
    /// # Panics
    ///
    /// Panics with the [`try_alloc`](Self::try_alloc) error's message.
    #[track_caller]
    pub fn alloc(&self, layout: Layout) -> NonNull<u8> {
        Shell::alloc(self, layout)
    }

    /// Allocates a block for `layout`: uninitialised, aligned to `layout.align()`.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`] when the block would take the allocator past its limit, or
    /// the system refuses it.
    pub fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        // A real block for a zero-size request, so that every pointer handed out is in the
        // ledger and every free is checked the same way.
        let layout = Layout::from_size_align(layout.size().max(1), layout.align())
            .map_err(|_| Error::OutOfMemory { requested: layout.size(), available: self.limit })?;
        let mut ledger = self.ledger.lock();
        let available = self.limit.saturating_sub(ledger.in_use);
        let refused = Error::OutOfMemory { requested: layout.size(), available };
        if layout.size() > available {
            ledger.failures += 1;
            return Err(refused);
        }
        let block = match ledger.cached.iter().rposition(|(_, cached)| *cached == layout) {
            Some(at) => {
                let (block, _) = ledger.cached.swap_remove(at);
                ledger.cached_bytes -= layout.size();
                block.0
            }
            None => {
                // Room under the limit for the new block: give kept blocks back first.
                while ledger.cached_bytes > available - layout.size() {
                    ledger.release_oldest();
                }
                // SAFETY: the layout has a non-zero size (checked above).
                let Some(block) = NonNull::new(unsafe { System.alloc(layout) }) else {
                    ledger.failures += 1;
                    return Err(refused);
                };
                block
            }
        };
        let addr = block.as_ptr() as usize;
        ledger.live.insert(addr, (SystemBlock(block), layout));
        ledger.freed.retain(|&freed| freed != addr);
        ledger.in_use += layout.size();
        ledger.peak = ledger.peak.max(ledger.in_use);
        ledger.allocations += 1;
        Ok(block)
    }

    /// Frees a block.
    ///
    /// # Safety
    ///
    /// If `ptr` is a live block of this allocator, nothing may use it afterwards. (Every
    /// other pointer is refused without being touched.)
    ///
    /// # Panics
    ///
    /// Panics with the [`try_free`](Self::try_free) error's message.
    #[track_caller]
    pub unsafe fn free(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded from the caller.
        unsafe { Shell::free(self, ptr) }
    }

    /// Frees a block, or says why it cannot be this allocator's.
    ///
    /// # Safety
    ///
    /// As for [`free`](Self::free).
    ///
    /// # Errors
    ///
    /// [`Error::DoubleFree`] for a block freed recently, [`Error::NotBlockStart`] for a
    /// pointer inside a live block, [`Error::ForeignPointer`] for anything else. Nothing is
    /// freed then. (A dangling zero-size pointer, at an address no block can have, is
    /// accepted and ignored, as the other allocators do.)
    pub unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        let mut ledger = self.ledger.lock();
        // The block is reached through the ledger's own pointer: the caller's may carry
        // less provenance (a narrowed or rebuilt pointer with the same address).
        let Some((block, layout)) = ledger.live.remove(&addr) else {
            if region::is_dangling(ptr) {
                // A zero-size block a collection made up without asking (no real block
                // lies this low): nothing to free.
                return Ok(());
            }
            return Err(ledger.bad_free(addr));
        };
        ledger.in_use -= layout.size();
        if ledger.freed.len() == FREED_MEMORY {
            ledger.freed.pop_front();
        }
        ledger.freed.push_back(addr);
        if layout.size() <= CACHE_BYTES {
            // The caller gives up every use of the block: it is ours to keep.
            ledger.cached.push((block, layout));
            ledger.cached_bytes += layout.size();
            while ledger.cached_bytes > CACHE_BYTES || ledger.cached.len() > CACHE_BLOCKS {
                ledger.release_oldest();
            }
        } else {
            // SAFETY: the ledger's pointer came from `System.alloc(layout)` and the block is
            // live; the caller gives up every use of it.
            unsafe { System.dealloc(block.0.as_ptr(), layout) };
        }
        Ok(())
    }

    /// Bytes of freed blocks kept for reuse (see the type docs).
    pub fn cached_bytes(&self) -> usize {
        self.ledger.lock().cached_bytes
    }

    /// Gives every kept block back to the system.
    pub fn release_cached(&self) {
        let mut ledger = self.ledger.lock();
        while !ledger.cached.is_empty() {
            ledger.release_oldest();
        }
    }

    /// Usage counters. `capacity` is the limit (`usize::MAX` when there is none).
    pub fn stats(&self) -> AllocStats {
        let ledger = self.ledger.lock();
        AllocStats {
            capacity: self.limit,
            in_use: ledger.in_use,
            peak: ledger.peak,
            live: ledger.live.len(),
            allocations: ledger.allocations,
            failures: ledger.failures,
            fallbacks: 0,
        }
    }
}

impl SegmentLedger {
    /// Gives the oldest kept block back to the system.
    fn release_oldest(&mut self) {
        let (block, layout) = self.cached.remove(0);
        self.cached_bytes -= layout.size();
        // SAFETY: a kept block came from `System.alloc(layout)` and nobody holds it (type
        // invariant); it leaves the cache here.
        unsafe { System.dealloc(block.0.as_ptr(), layout) };
    }

    #[cold]
    fn bad_free(&self, addr: usize) -> Error {
        let below = self.live.range(..addr).next_back().map(|(&start, (_, layout))| (start, layout.size()));
        shell::bad_free(addr, self.freed.contains(&addr), below)
    }
}

impl Drop for SegmentAlloc {
    fn drop(&mut self) {
        self.release_cached();
    }
}

impl Default for SegmentAlloc {
    fn default() -> Self {
        SegmentAlloc::new()
    }
}

impl fmt::Debug for SegmentAlloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SegmentAlloc").field("limit", &self.limit).field("stats", &self.stats()).finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` returns a fresh block from `System` for (at least) `layout`, so it is valid,
//    aligned and shared with nobody.
// 2. A block is freed only by `try_free` (or never: the allocator does not free live blocks
//    on drop; it then gives back only the kept ones, which nobody holds).
// 3. `try_free` looks the pointer up in the ledger before touching anything, and frees only
//    a live block, with the layout it was allocated with.
unsafe impl Shell for SegmentAlloc {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        SegmentAlloc::try_alloc(self, layout)
    }

    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { SegmentAlloc::try_free(self, ptr) }
    }
}

shell::impl_allocator!(SegmentAlloc);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_alignments_and_limits() {
        let segments = SegmentAlloc::with_limit(3 << 16);
        let layout = Layout::from_size_align(1 << 16, 1 << 16).unwrap();
        let a = segments.alloc(layout);
        let b = segments.alloc(layout);
        assert_eq!(a.as_ptr() as usize % (1 << 16), 0);
        assert!(matches!(
            segments.try_alloc(Layout::from_size_align(2 << 16, 8).unwrap()),
            Err(Error::OutOfMemory { available, .. }) if available == 1 << 16
        ));
        let stats = segments.stats();
        assert_eq!((stats.in_use, stats.live, stats.allocations, stats.failures), (2 << 16, 2, 2, 1));
        // SAFETY: both blocks are ours and unused from here on.
        unsafe {
            segments.free(a);
            segments.free(b);
        }
        assert_eq!(segments.stats().in_use, 0);
        assert_eq!(segments.stats().peak, 2 << 16);
    }

    #[test]
    fn bad_frees_are_reported() {
        let segments = SegmentAlloc::new();
        let block = segments.alloc(Layout::from_size_align(256, 16).unwrap());
        let inside = NonNull::new(block.as_ptr().wrapping_add(8)).unwrap();
        let mut local = 0u8;
        // SAFETY: each call is refused before it touches memory.
        unsafe {
            assert!(matches!(segments.try_free(inside), Err(Error::NotBlockStart { .. })));
            assert!(matches!(segments.try_free(NonNull::from(&mut local)), Err(Error::ForeignPointer { .. })));
            segments.free(block);
            assert!(matches!(segments.try_free(block), Err(Error::DoubleFree { .. })));
        }
        assert_eq!(segments.stats().live, 0);
    }

    #[test]
    fn freed_blocks_are_reused_within_the_limit() {
        let layout = Layout::from_size_align(1 << 16, 1 << 16).unwrap();
        let segments = SegmentAlloc::with_limit(3 << 16);
        let a = segments.alloc(layout);
        // SAFETY: ours, unused from here on.
        unsafe { segments.free(a) };
        assert_eq!((segments.stats().in_use, segments.cached_bytes()), (0, 1 << 16));
        let b = segments.alloc(layout);
        assert_eq!(b, a, "the kept block comes back for the same layout");
        assert_eq!(segments.cached_bytes(), 0);
        // SAFETY: as above.
        unsafe { segments.free(b) };
        // SAFETY: as above: a kept block is not live, so a second free is refused.
        assert!(matches!(unsafe { segments.try_free(b) }, Err(Error::DoubleFree { .. })));
        // Another layout that needs the whole limit: the kept block goes back to the system.
        let whole = segments.alloc(Layout::from_size_align(3 << 16, 8).unwrap());
        assert_eq!((segments.stats().in_use, segments.cached_bytes()), (3 << 16, 0));
        // SAFETY: as above.
        unsafe { segments.free(whole) };
        segments.release_cached();
        assert_eq!(segments.cached_bytes(), 0);
    }

    #[test]
    fn zero_size_gets_a_real_block() {
        let segments = SegmentAlloc::new();
        let block = segments.alloc(Layout::from_size_align(0, 1 << 16).unwrap());
        assert_eq!(block.as_ptr() as usize % (1 << 16), 0);
        assert_eq!(segments.stats().live, 1);
        // SAFETY: ours, unused.
        unsafe { segments.free(block) };
        assert_eq!(segments.stats().live, 0);
    }
}
