//! [`AlignedAlloc`]: any alignment over a raw allocator that has none, by over-allocating and
//! storing the adjustment just before the block.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fmt;
use std::ptr::NonNull;

use super::shell::{self, Shell};
use parking_lot::Mutex;

use super::region::{self, MAX_ALIGN};
use super::stats::SharedCounters;
use super::{AllocStats, StackAllocator};
use crate::{Error, Result};

/// Width of the adjustment header stored just before each aligned block.
///
/// The seed's scheme stores the adjustment in one byte, which only works up to alignment
/// 256 (the adjustment is at most the alignment). Alignments up to 4096 need adjustments up
/// to `4096 + 1`, so the header is a `u16` (2 bytes, written unaligned). Every block costs
/// `HEADER + align - 1` extra bytes of the raw allocator's memory.
pub const HEADER: usize = size_of::<u16>();

/// How many freed addresses are remembered to tell a double free from a foreign pointer.
const FREED_MEMORY: usize = 4096;

/// A raw allocator with no alignment guarantee: the kind [`AlignedAlloc`] wraps.
///
/// # Safety
///
/// The trait is `unsafe` because [`AlignedAlloc`] writes its header into, and hands out,
/// whatever `alloc` returns; it cannot check a pointer's validity, so a lying implementation
/// would turn safe calls into out-of-bounds writes. An implementation must guarantee:
///
/// 1. `alloc(size)` returns `None`, or a pointer valid for reads and writes of `size` bytes
///    (any address, no alignment needed), whose provenance covers those `size` bytes.
/// 2. Those bytes are used by nobody else (no other live block overlaps them) until the
///    block is given back with `free`, or the allocator is dropped.
/// 3. The block stays valid while `&self` is borrowed: it is not reclaimed by anything
///    other than `free`, drop, or a call that takes the allocator by `&mut self`.
///
/// What an implementation may get wrong without undefined behaviour: `capacity` (only used
/// for statistics and error messages), failing when it has room, or doing nothing in `free`
/// (the memory then leaks, or, as for [`StackAllocator`], comes back another way).
pub unsafe trait RawAlloc {
    /// Allocates `size` bytes (`size > 0`) at any address, or returns `None` when out of
    /// memory.
    fn alloc(&self, size: usize) -> Option<NonNull<u8>>;

    /// Frees a block.
    ///
    /// # Safety
    ///
    /// `ptr` must have come from `self.alloc(size)` with this `size`, and must not have been
    /// freed already. The implementation may reuse the memory at once.
    unsafe fn free(&self, ptr: NonNull<u8>, size: usize);

    /// The most bytes this allocator can hold (`usize::MAX` when unbounded).
    fn capacity(&self) -> usize {
        usize::MAX
    }
}

/// [`RawAlloc`] over [`std::alloc::System`], asking for alignment 1. A request for 0 bytes
/// gets `None` (the system allocator takes no zero-size request; [`AlignedAlloc`] never makes
/// one).
///
/// ```
/// use mmobject::alloc::{RawAlloc, SystemRaw};
///
/// assert!(SystemRaw.alloc(0).is_none());
/// let p = SystemRaw.alloc(16).unwrap();
/// // SAFETY: from `alloc(16)`, freed once.
/// unsafe { SystemRaw.free(p, 16) };
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemRaw;

// SAFETY: blocks come from `System.alloc` with a layout of `size` bytes (1), are owned by the
// caller until `free` (2), and `System` never reclaims them on its own (3).
unsafe impl RawAlloc for SystemRaw {
    fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
        if size == 0 {
            return None;
        }
        let layout = Layout::from_size_align(size, 1).ok()?;
        // SAFETY: `layout` has a non-zero size (checked above).
        NonNull::new(unsafe { System.alloc(layout) })
    }

    unsafe fn free(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: the caller guarantees `ptr` came from `alloc(size)`, i.e. from
        // `System.alloc` with this exact layout, and is freed once.
        unsafe { System.dealloc(ptr.as_ptr(), Layout::from_size_align_unchecked(size, 1)) }
    }
}

/// A [`StackAllocator`] is a raw allocator too: byte-aligned bumps out of its region, and
/// `free` does nothing (memory comes back with `free_to_marker`/`reset`).
// SAFETY: `try_alloc_layout` returns `size` fresh bytes above the top, from the region's own
// pointer (1, 2); they are reclaimed only by `free_to_marker`/`reset`, which take
// `&mut self` (3).
unsafe impl RawAlloc for StackAllocator {
    fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
        self.try_alloc_layout(Layout::from_size_align(size, 1).ok()?).ok()
    }

    unsafe fn free(&self, _ptr: NonNull<u8>, _size: usize) {}

    fn capacity(&self) -> usize {
        StackAllocator::capacity(self)
    }
}

/// A live block: what the caller asked for, and the raw block holding it.
#[derive(Debug)]
struct LiveBlock {
    layout: Layout,
    /// The pointer the raw allocator returned, with its provenance over the whole raw block
    /// (header included). Frees go through it, never through the caller's pointer, whose
    /// provenance may cover only the caller's bytes (see [`AlignedAlloc::try_free`]).
    raw: NonNull<u8>,
}

// `raw` is only an address with provenance, kept to free the block later; the ledger never
// reads or writes through it while the block is live, and frees happen under the ledger's
// lock, from whichever thread owns the block.
// SAFETY: no type parameter, so no bound (no `Rc` lives in the block's record); whether the
// raw allocator may be used from several threads is `A`'s bound on `AlignedAlloc<A>`.
unsafe impl Send for LiveBlock {}

/// Live and recently freed blocks, to check frees.
#[derive(Debug, Default)]
struct Ledger {
    /// Aligned address → the block.
    live: BTreeMap<usize, LiveBlock>,
    freed: HashSet<usize>,
    freed_order: VecDeque<usize>,
    allocations: u64,
}

/// Aligned allocation over a [`RawAlloc`] that lacks alignment (Game Engine Architecture's
/// scheme).
///
/// To allocate `size` bytes aligned to `align`, it asks the raw allocator for
/// `size + HEADER + align - 1` bytes at `raw`, returns `aligned = align_up(raw + HEADER,
/// align)`, and writes the adjustment `aligned - raw` (2 ..= 4097) as a `u16` in the
/// [`HEADER`] bytes just before `aligned`.
///
/// A header alone cannot tell a bad pointer from a good one (reading "the header" of a
/// foreign pointer is itself out of bounds), so the wrapper also keeps a ledger of live
/// blocks (and the last 4,096 freed addresses) behind a mutex: bad frees are reported as
/// [`Error::ForeignPointer`], [`Error::NotBlockStart`] or [`Error::DoubleFree`] before any
/// memory is read. The ledger entry also keeps the raw pointer, so a free reaches the raw
/// block (and reads the header back, as a check) through the raw allocator's own pointer,
/// never through the pointer the caller hands back. The ledger costs one ordered-map entry
/// per live block.
///
/// **Variance and threads.** Covariant in `A`, which it owns like a field of a struct (no
/// `A` is ever written through `&self`). `Send`/`Sync` exactly when `A` is.
///
/// # Examples
///
/// ```
/// use std::alloc::Layout;
/// use mmobject::alloc::{AlignedAlloc, SystemRaw};
///
/// let aligned = AlignedAlloc::new(SystemRaw);
/// let page = aligned.alloc(Layout::from_size_align(100, 4096).unwrap());
/// assert_eq!(page.as_ptr() as usize % 4096, 0);
/// // SAFETY: `page` is ours, freed once.
/// unsafe { aligned.free(page) };
/// ```
pub struct AlignedAlloc<A> {
    inner: A,
    ledger: Mutex<Ledger>,
    counters: SharedCounters,
}

impl<A: RawAlloc> AlignedAlloc<A> {
    /// Wraps a raw allocator.
    pub fn new(inner: A) -> AlignedAlloc<A> {
        AlignedAlloc { inner, ledger: Mutex::new(Ledger::default()), counters: SharedCounters::default() }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Bytes asked of the raw allocator for `layout`: `size + HEADER + align - 1`.
    pub fn raw_size(layout: Layout) -> usize {
        layout.size() + HEADER + layout.align() - 1
    }

    /// Allocates a block for `layout`.
    ///
    /// # Panics
    ///
    /// Panics with the message of the error [`try_alloc`](Self::try_alloc) would return.
    #[track_caller]
    pub fn alloc(&self, layout: Layout) -> NonNull<u8> {
        Shell::alloc(self, layout)
    }

    /// Allocates a block for `layout` (zero-size requests get a real block).
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedAlignment`] above 4096; [`Error::OutOfMemory`] if the raw allocator
    /// returns nothing (`requested` is the raw size).
    pub fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        let align = layout.align();
        if align > MAX_ALIGN {
            self.counters.failure();
            return Err(Error::UnsupportedAlignment { align, max: MAX_ALIGN });
        }
        let raw_size = Self::raw_size(layout);
        let Some(raw) = self.inner.alloc(raw_size) else {
            return Err(self.out_of_memory(raw_size));
        };
        let raw_addr = raw.as_ptr() as usize;
        let adjustment = region::align_up(raw_addr + HEADER, align) - raw_addr;
        debug_assert!((HEADER..HEADER + align).contains(&adjustment), "adjustment {adjustment} out of range");
        // SAFETY: `adjustment + layout.size() <= raw_size`, so the block and its header
        // (`adjustment - HEADER ..adjustment`) are inside the raw allocation; the header is
        // written unaligned.
        let aligned = unsafe {
            let aligned = raw.add(adjustment);
            aligned.sub(HEADER).cast::<u16>().as_ptr().write_unaligned(adjustment as u16);
            aligned
        };
        let addr = aligned.as_ptr() as usize;
        let mut ledger = self.ledger.lock();
        ledger.live.insert(addr, LiveBlock { layout, raw });
        if ledger.freed.remove(&addr) {
            ledger.freed_order.retain(|&a| a != addr);
        }
        ledger.allocations += 1;
        drop(ledger);
        self.counters.add(raw_size);
        Ok(aligned)
    }

    /// Frees a block.
    ///
    /// # Panics
    ///
    /// Panics with the message of the error [`try_free`](Self::try_free) would return.
    ///
    /// # Safety
    ///
    /// As [`try_free`](Self::try_free).
    #[track_caller]
    pub unsafe fn free(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded contract.
        unsafe { Shell::free(self, ptr) }
    }

    /// Frees a block: finds its raw block in the ledger and frees it.
    ///
    /// # Errors
    ///
    /// [`Error::DoubleFree`] for a recently freed block, [`Error::NotBlockStart`] for an
    /// address inside a live block, [`Error::ForeignPointer`] otherwise. Checked against the
    /// ledger before any memory is read.
    ///
    /// # Safety
    ///
    /// If `ptr` is a live block, the caller must own it and not use it afterwards.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// use mmobject::{alloc::{AlignedAlloc, SystemRaw}, Error};
    ///
    /// let aligned = AlignedAlloc::new(SystemRaw);
    /// let p = aligned.alloc(Layout::from_size_align(64, 64).unwrap());
    /// // SAFETY: `p` is ours; the bad frees are caught.
    /// unsafe {
    ///     assert!(matches!(aligned.try_free(p.add(1)), Err(Error::NotBlockStart { .. })));
    ///     aligned.free(p);
    ///     assert!(matches!(aligned.try_free(p), Err(Error::DoubleFree { .. })));
    /// }
    /// ```
    pub unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        let mut ledger = self.ledger.lock();
        let Some(LiveBlock { layout, raw }) = ledger.live.remove(&addr) else {
            return Err(Self::bad_free(&ledger, addr));
        };
        ledger.freed.insert(addr);
        ledger.freed_order.push_back(addr);
        if ledger.freed_order.len() > FREED_MEMORY {
            let old = ledger.freed_order.pop_front().expect("non-empty");
            ledger.freed.remove(&old);
        }
        drop(ledger);
        let raw_size = Self::raw_size(layout);
        let adjustment = addr - raw.as_ptr() as usize;
        // SAFETY: the ledger says `ptr` is a live block from `try_alloc`, whose raw block of
        // `raw_size` bytes starts at `raw`; it is freed once (its ledger entry is gone).
        // 1. The header is read through `raw`, not `ptr`: `raw` carries the raw allocator's
        //    provenance over the whole raw block (`RawAlloc` contract 1), while `ptr` may
        //    have been retagged by the caller (an `allocator_api2::boxed::Box` narrows it to
        //    the block's contents), so under Stacked Borrows a read before `ptr` through it
        //    would be undefined behaviour.
        // 2. `adjustment - HEADER .. adjustment` lies inside the raw block (see `try_alloc`).
        unsafe {
            let header = raw.add(adjustment - HEADER).cast::<u16>().as_ptr().read_unaligned() as usize;
            debug_assert_eq!(header, adjustment, "the header before {addr:#x} was overwritten");
            self.inner.free(raw, raw_size);
        }
        self.counters.sub(raw_size);
        Ok(())
    }

    #[cold]
    fn bad_free(ledger: &Ledger, addr: usize) -> Error {
        let below = ledger.live.range(..addr).next_back().map(|(&start, block)| (start, block.layout.size()));
        shell::bad_free(addr, ledger.freed.contains(&addr), below)
    }

    /// A snapshot of the usage; `in_use` counts raw bytes (with header and padding).
    pub fn stats(&self) -> AllocStats {
        let ledger = self.ledger.lock();
        let (live, allocations) = (ledger.live.len(), ledger.allocations);
        drop(ledger);
        self.counters.snapshot(self.inner.capacity(), live, allocations)
    }

    #[cold]
    #[inline(never)]
    fn out_of_memory(&self, requested: usize) -> Error {
        self.counters.failure();
        let in_use = self.counters.snapshot(0, 0, 0).in_use;
        Error::OutOfMemory { requested, available: self.inner.capacity().saturating_sub(in_use) }
    }
}

impl<A> Drop for AlignedAlloc<A> {
    fn drop(&mut self) {
        let live = self.ledger.get_mut().live.len();
        if live > 0 {
            log::warn!("AlignedAlloc dropped with {live} block(s) still in use (leaked)");
        }
    }
}

impl<A: fmt::Debug> fmt::Debug for AlignedAlloc<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedAlloc")
            .field("inner", &self.inner)
            .field("live", &self.ledger.lock().live.len())
            .finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` returns `layout.size()` bytes aligned to `layout.align()` inside a raw block
//    that `RawAlloc` contracts 1 and 2 make valid and owned by nobody else until freed.
// 2. The block stays valid until `try_free` (`RawAlloc` contract 3; the wrapper can only be
//    dropped when unborrowed).
// 3. `try_free` checks the ledger before touching memory, and then touches only the raw
//    block, through the raw allocator's pointer.
unsafe impl<A: RawAlloc> Shell for AlignedAlloc<A> {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        AlignedAlloc::try_alloc(self, layout)
    }

    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { AlignedAlloc::try_free(self, ptr) }
    }
}

shell::impl_allocator!(<A: RawAlloc> AlignedAlloc<A>);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;

    /// A raw allocator that returns odd addresses on purpose, and counts its bytes.
    #[derive(Debug, Default)]
    struct Misaligned {
        bytes: Cell<usize>,
    }

    // SAFETY: blocks are one byte into `SystemRaw` blocks of `size + 1` bytes, derived from
    // their pointer, and freed only by `free`.
    unsafe impl RawAlloc for Misaligned {
        fn alloc(&self, size: usize) -> Option<NonNull<u8>> {
            let p = SystemRaw.alloc(size + 1)?;
            self.bytes.set(self.bytes.get() + size);
            // SAFETY: one byte into a block of `size + 1` bytes.
            Some(unsafe { p.add(1) })
        }

        unsafe fn free(&self, ptr: NonNull<u8>, size: usize) {
            self.bytes.set(self.bytes.get() - size);
            // SAFETY: undoes `alloc`: the real block starts one byte earlier.
            unsafe { SystemRaw.free(ptr.sub(1), size + 1) }
        }
    }

    #[test]
    fn system_raw_refuses_zero_bytes() {
        // A safe call: it must not reach `System.alloc` with a zero-size layout (undefined
        // behaviour, which Miri reports).
        assert_eq!(SystemRaw.alloc(0), None);
        let p = SystemRaw.alloc(1).unwrap();
        // SAFETY: from `alloc(1)`, freed once.
        unsafe { SystemRaw.free(p, 1) };
    }

    #[test]
    fn every_alignment_over_a_misaligned_source() {
        let a = AlignedAlloc::new(Misaligned::default());
        let mut blocks = Vec::new();
        for shift in 0..=12 {
            let align = 1usize << shift;
            for size in [0, 1, 7, 100] {
                let layout = Layout::from_size_align(size, align).unwrap();
                let p = a.alloc(layout);
                assert_eq!(p.as_ptr() as usize % align, 0);
                // SAFETY: `size` fresh bytes.
                unsafe { p.as_ptr().write_bytes(0xAB, size) };
                blocks.push(p);
            }
        }
        assert!(a.inner().bytes.get() > 0);
        for p in blocks {
            // SAFETY: ours, freed once.
            unsafe { a.free(p) };
        }
        assert_eq!(a.inner().bytes.get(), 0, "every raw block returned");
        assert_eq!(a.stats().in_use, 0);
        assert_eq!(
            a.try_alloc(Layout::from_size_align(1, 8192).unwrap()),
            Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
        );
    }

    #[test]
    fn bad_frees() {
        let a = AlignedAlloc::new(SystemRaw);
        let p = a.alloc(Layout::from_size_align(32, 16).unwrap());
        let mut local = 0u64;
        let local = NonNull::from(&mut local).cast::<u8>();
        // SAFETY: bad frees are caught before memory is read; `p` is ours.
        unsafe {
            assert_eq!(a.try_free(local), Err(Error::ForeignPointer { addr: local.as_ptr() as usize }));
            assert_eq!(
                a.try_free(p.add(31)),
                Err(Error::NotBlockStart { addr: p.as_ptr() as usize + 31, block_start: p.as_ptr() as usize })
            );
            a.free(p);
            assert_eq!(a.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
        }
    }

    #[test]
    fn over_a_stack_region() {
        let a = AlignedAlloc::new(StackAllocator::with_capacity(256));
        let p = a.alloc(Layout::from_size_align(64, 128).unwrap());
        assert_eq!(p.as_ptr() as usize % 128, 0);
        assert!(matches!(a.try_alloc(Layout::from_size_align(200, 8).unwrap()), Err(Error::OutOfMemory { .. })));
        assert_eq!(a.stats().capacity, 256);
        // SAFETY: ours, freed once.
        unsafe { a.free(p) };
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 128 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        #[test]
        fn model(ops in proptest::collection::vec((any::<bool>(), 0usize..100, 0u32..13, any::<usize>()),
                                                  0..if cfg!(miri) { 20 } else { 100 })) {
            let a = AlignedAlloc::new(Misaligned::default());
            let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
            for (n, (alloc, size, shift, pick)) in ops.into_iter().enumerate() {
                if alloc || live.is_empty() {
                    let align = 1usize << shift;
                    let p = a.alloc(Layout::from_size_align(size, align).unwrap());
                    prop_assert_eq!(p.as_ptr() as usize % align, 0);
                    // SAFETY: `size` fresh bytes.
                    unsafe { p.as_ptr().write_bytes(n as u8, size) };
                    live.push((p, size, n as u8));
                } else {
                    let (p, size, fill) = live.swap_remove(pick % live.len());
                    // SAFETY: a live block of the model, checked then freed once.
                    unsafe {
                        prop_assert!(std::slice::from_raw_parts(p.as_ptr(), size).iter().all(|&b| b == fill));
                        a.free(p);
                    }
                }
                prop_assert_eq!(a.stats().live, live.len());
            }
            for (p, _, _) in live {
                // SAFETY: freed once.
                unsafe { a.free(p) };
            }
            prop_assert_eq!(a.inner().bytes.get(), 0);
        }
    }
}
