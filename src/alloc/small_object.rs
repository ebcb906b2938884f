//! [`SmallObjectAllocator`]: a fixed region of small slots tracked by one bit each, sized from
//! recorded statistics, with the system allocator as the fallback.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;

use super::shell::{self, Shell};
use parking_lot::Mutex;

use super::region::{self, Region, MAX_ALIGN};
use super::stats::SharedCounters;
use super::AllocStats;
use crate::{Error, Result};

/// The slot sizes of the seven classes, in bytes.
pub const SMALL_OBJECT_CLASSES: [usize; 7] = [8, 16, 32, 48, 64, 96, 128];

/// Each class starts on a multiple of this, so slot `i` of a class of size `s` is aligned to
/// the lowest set bit of `s` (8, 16, 32, 16, 64, 32, 128).
const CLASS_ALIGN: usize = 128;

/// The default region size.
const DEFAULT_REGION: usize = 2 << 20;

/// How many slots each class gets.
///
/// # Examples
///
/// ```
/// use mmobject::alloc::SmallObjectConfig;
///
/// // Mostly 48-byte objects, as in the seed's level loader.
/// let config = SmallObjectConfig { slots: [1024, 1024, 1024, 12_800, 1024, 512, 512] };
/// assert_eq!(config.data_bytes(), 8 * 1024 + 16 * 1024 + 32 * 1024 + 48 * 12_800 + 64 * 1024 + 96 * 512 + 128 * 512);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmallObjectConfig {
    /// Slots per class, in the order of [`SMALL_OBJECT_CLASSES`].
    pub slots: [usize; 7],
}

impl SmallObjectConfig {
    /// Bytes of slots (without the bitmaps and the alignment padding between classes).
    pub fn data_bytes(&self) -> usize {
        self.slots.iter().zip(SMALL_OBJECT_CLASSES).map(|(n, s)| n * s).sum()
    }

    /// Splits `budget_bytes` between the classes in proportion to the bytes each needed at its
    /// busiest moment (`peak_live × slot size`), as recorded by
    /// [`SmallObjectAllocator::histogram`] during a representative run. If no peaks were
    /// recorded, the request counts are used instead; if none either, the default split.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// use mmobject::alloc::{SmallObjectAllocator, SmallObjectConfig};
    ///
    /// // Record a run with the default config...
    /// let probe = SmallObjectAllocator::default();
    /// let blocks: Vec<_> = (0..300).map(|_| probe.alloc(Layout::new::<[u8; 40]>())).collect();
    /// let histogram = probe.histogram();
    /// assert_eq!(histogram.peak_live[3], 300); // 40 bytes go to the 48-byte class
    /// // SAFETY: each block is ours and freed once.
    /// for p in blocks { unsafe { probe.free(p) } }
    ///
    /// // ...then size the real allocator from it.
    /// let config = SmallObjectConfig::from_histogram(&histogram, 48 * 1000);
    /// assert_eq!(config.slots, [0, 0, 0, 1000, 0, 0, 0]);
    /// ```
    pub fn from_histogram(histogram: &SizeHistogram, budget_bytes: usize) -> SmallObjectConfig {
        let weights = |counts: &[u64; 7]| -> [u128; 7] {
            std::array::from_fn(|i| counts[i] as u128 * SMALL_OBJECT_CLASSES[i] as u128)
        };
        let mut w = weights(&histogram.peak_live);
        if w.iter().all(|&x| x == 0) {
            w = weights(&histogram.requests);
        }
        let total: u128 = w.iter().sum();
        if total == 0 {
            return SmallObjectConfig::default();
        }
        let slots =
            std::array::from_fn(|i| (budget_bytes as u128 * w[i] / total / SMALL_OBJECT_CLASSES[i] as u128) as usize);
        SmallObjectConfig { slots }
    }
}

impl Default for SmallObjectConfig {
    /// A 2 MiB budget split equally (in bytes) between the classes, each count rounded down
    /// to a multiple of 64: slots `[37440, 18688, 9344, 6208, 4672, 3072, 2304]`,
    /// 2,084,352 bytes of slots plus 10,216 bytes of bitmap.
    fn default() -> Self {
        let per_class = DEFAULT_REGION / SMALL_OBJECT_CLASSES.len();
        SmallObjectConfig { slots: SMALL_OBJECT_CLASSES.map(|s| per_class / s / 64 * 64) }
    }
}

/// Recorded request statistics, per class, from [`SmallObjectAllocator::histogram`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SizeHistogram {
    /// Requests per class (by the class the size rounds up to), including those that fell
    /// back to the system because the class was full.
    pub requests: [u64; 7],
    /// The most slots live at once per class, counting requests the full class pushed to the
    /// system (so it shows how many slots *would* have been needed).
    pub peak_live: [u64; 7],
    /// Requests too large (over 128 bytes) or too aligned for any class.
    pub larger: u64,
}

/// What one class costs: its slots and its bitmap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassFootprint {
    /// The slot size in bytes.
    pub slot_size: usize,
    /// The number of slots.
    pub slots: usize,
    /// `slots × slot_size`.
    pub data_bytes: usize,
    /// One bit per slot, rounded up to whole bytes: `ceil(slots / 8)`.
    pub bitmap_bytes: usize,
}

impl ClassFootprint {
    /// Data plus bitmap bytes.
    pub fn total(&self) -> usize {
        self.data_bytes + self.bitmap_bytes
    }
}

/// One class: `slots` slots of `slot_size` bytes at `start..end` in the region.
struct SmallClass {
    slot_size: usize,
    /// The alignment every slot has.
    align: usize,
    start: usize,
    end: usize,
    slots: usize,
    state: Mutex<Bits>,
}

/// A class's bitmap and counters, behind its lock.
///
/// Invariants:
/// 1. `bits` holds `ceil(slots / 8)` bytes; bit `i` (byte `i / 8`, bit `i % 8`) is set exactly
///    when slot `i` is handed out. Bits past `slots` in the last byte are always set, so a
///    scan never finds them free.
/// 2. Every 64-slot word below `hint` is full.
struct Bits {
    bits: Box<[u8]>,
    hint: usize,
    live: usize,
    peak_live: usize,
    /// Live slots plus live system fallbacks of this class's size (for the histogram).
    demand: u64,
    peak_demand: u64,
    requests: u64,
    allocations: u64,
}

impl Bits {
    fn new(slots: usize) -> Bits {
        let mut bits = vec![0u8; slots.div_ceil(8)].into_boxed_slice();
        if slots % 8 != 0 {
            bits[slots / 8] = !((1u8 << (slots % 8)) - 1);
        }
        Bits { bits, hint: 0, live: 0, peak_live: 0, demand: 0, peak_demand: 0, requests: 0, allocations: 0 }
    }

    /// The 64 slots of word `w`, slot `64w` in bit 0; missing bytes past the end read as full.
    #[inline]
    fn word(&self, w: usize) -> u64 {
        let bytes = &self.bits[w * 8..];
        match bytes.first_chunk::<8>() {
            Some(chunk) => u64::from_le_bytes(*chunk),
            None => {
                let mut chunk = [0xFF; 8];
                chunk[..bytes.len()].copy_from_slice(bytes);
                u64::from_le_bytes(chunk)
            }
        }
    }

    /// Finds and marks the lowest free slot, scanning 64 slots per step from the hint.
    #[inline]
    fn take(&mut self) -> Option<usize> {
        let words = self.bits.len().div_ceil(8);
        for w in self.hint..words {
            let word = self.word(w);
            if word != u64::MAX {
                let slot = w * 64 + (!word).trailing_zeros() as usize;
                self.bits[slot / 8] |= 1 << (slot % 8);
                self.hint = w;
                return Some(slot);
            }
        }
        self.hint = words;
        None
    }

    #[inline]
    fn is_set(&self, slot: usize) -> bool {
        self.bits[slot / 8] & (1 << (slot % 8)) != 0
    }

    #[inline]
    fn clear(&mut self, slot: usize) {
        self.bits[slot / 8] &= !(1 << (slot % 8));
        self.hint = self.hint.min(slot / 64);
    }

    #[inline]
    fn demand_up(&mut self) {
        self.requests += 1;
        self.demand += 1;
        self.peak_demand = self.peak_demand.max(self.demand);
    }
}

/// Live system-fallback blocks, by address.
#[derive(Default)]
struct Fallbacks {
    live: HashMap<usize, (Layout, Option<usize>)>,
    larger: u64,
    allocations: u64,
}

/// A small-object allocator: one region of 8/16/32/48/64/96/128-byte slots, one bit per slot.
///
/// - **Allocate**: the smallest class that fits the size and alignment; scan its bitmap from
///   the lowest-free hint, 64 slots per step (`trailing_zeros` of the inverted word). If the
///   class is full, or the request is over 128 bytes or more aligned than any class, the
///   system allocator serves it and it counts as a *fallback*. Fallback blocks are kept in
///   a small side table (address → layout) so they are recognised and freed correctly.
/// - **Free**: an address inside the region reveals its class; clearing the bit frees it,
///   and a bit that is already clear is a double free ([`Error::DoubleFree`]). An address
///   outside the region must be a live fallback block, or it is
///   [`Error::ForeignPointer`] (this includes a second free of a fallback block, since the
///   system may already have reused the address).
/// - **Overhead**: exactly one bit per slot ([`footprint`](Self::footprint)): 1,000 slots of
///   8 bytes cost 8,000 + 125 = 8,125 bytes. Classes start on 128-byte boundaries, so up to
///   127 bytes of padding can follow a class.
/// - **Sizing**: the allocator records a [`SizeHistogram`];
///   [`SmallObjectConfig::from_histogram`] turns a recorded run into slot counts.
/// - **Threads**: `Sync`, with a `parking_lot::Mutex` around each class's bitmap and counters
///   (and one around the fallback table). The lock is held for the bitmap scan only; there is
///   no other atomic on the fast path.
/// - **Debug builds** fill freed slots with `0xDD` and check the fill on allocation.
/// - **Drop** logs slots still in use as leaks (`log::warn!`) and frees live fallback blocks.
///
/// # Examples
///
/// ```
/// use std::alloc::Layout;
/// use mmobject::alloc::{SmallObjectAllocator, SmallObjectConfig};
///
/// let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [64, 0, 0, 64, 0, 0, 0] });
/// let node = small.alloc(Layout::new::<[u64; 5]>()); // 40 bytes: a 48-byte slot
/// let big = small.alloc(Layout::new::<[u8; 300]>()); // too large: the system serves it
/// assert_eq!(small.stats().fallbacks, 1);
/// // SAFETY: both blocks are ours, freed once.
/// unsafe {
///     small.free(node);
///     small.free(big);
/// }
/// ```
pub struct SmallObjectAllocator {
    region: Region,
    classes: [SmallClass; 7],
    /// `route[size]` for `size <= 128`: the first class whose slots are at least `size` bytes.
    route: [u8; 129],
    counters: SharedCounters,
    fallbacks: Mutex<Fallbacks>,
}

impl SmallObjectAllocator {
    /// Creates the allocator with `config.slots[i]` slots of `SMALL_OBJECT_CLASSES[i]` bytes.
    ///
    /// # Panics
    ///
    /// Panics if the total overflows `isize`.
    pub fn new(config: SmallObjectConfig) -> SmallObjectAllocator {
        let mut offset = 0usize;
        let classes = std::array::from_fn(|i| {
            let slot_size = SMALL_OBJECT_CLASSES[i];
            let slots = config.slots[i];
            let start = if slots == 0 { offset } else { region::align_up(offset, CLASS_ALIGN) };
            let end = slots
                .checked_mul(slot_size)
                .and_then(|b| b.checked_add(start))
                .filter(|&e| e < isize::MAX as usize / 2)
                .expect("small object region too large");
            offset = end;
            SmallClass {
                slot_size,
                align: 1 << slot_size.trailing_zeros(),
                start,
                end,
                slots,
                state: Mutex::new(Bits::new(slots)),
            }
        });
        let route = std::array::from_fn(|size| {
            SMALL_OBJECT_CLASSES.iter().position(|&s| s >= size).expect("size <= 128") as u8
        });
        SmallObjectAllocator {
            region: Region::new(offset),
            classes,
            route,
            counters: SharedCounters::default(),
            fallbacks: Mutex::new(Fallbacks::default()),
        }
    }

    /// The region's size: all slots plus padding between classes.
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

    /// Allocates a block for `layout`: a slot if one fits, otherwise a system block (a
    /// zero-size request gets a real 8-byte slot).
    ///
    /// # Errors
    ///
    /// [`Error::UnsupportedAlignment`] above 4096; [`Error::OutOfMemory`] only if the system
    /// fallback itself fails; in debug builds [`Error::UseAfterFree`] if the slot about to be
    /// handed out was written after it was freed (the slot is refilled and stays free).
    #[inline]
    pub fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        let (size, align) = (layout.size(), layout.align());
        if size <= 128 {
            let mut i = self.route[size] as usize;
            while i < 7 && self.classes[i].align < align {
                i += 1;
            }
            if i < 7 {
                let class = &self.classes[i];
                let mut st = class.state.lock();
                st.demand_up();
                if let Some(slot) = st.take() {
                    let ptr = self.region.at(class.start + slot * class.slot_size);
                    // SAFETY: the slot was free: nobody references its bytes.
                    if !unsafe { region::freed_intact(ptr, class.slot_size) } {
                        st.clear(slot);
                        st.demand -= 1;
                        drop(st);
                        return Err(self.corrupted(ptr, class.slot_size));
                    }
                    st.live += 1;
                    st.peak_live = st.peak_live.max(st.live);
                    st.allocations += 1;
                    return Ok(ptr);
                }
                drop(st);
                return self.fallback(layout, Some(i));
            }
        }
        self.fallback(layout, None)
    }

    #[cold]
    #[inline(never)]
    fn fallback(&self, layout: Layout, class: Option<usize>) -> Result<NonNull<u8>> {
        let align = layout.align();
        if align > MAX_ALIGN {
            self.counters.failure();
            return Err(Error::UnsupportedAlignment { align, max: MAX_ALIGN });
        }
        let real = Layout::from_size_align(layout.size().max(1), align).expect("valid layout");
        // SAFETY: `real` has a non-zero size.
        let Some(ptr) = NonNull::new(unsafe { System.alloc(real) }) else {
            if let Some(i) = class {
                self.classes[i].state.lock().demand -= 1;
            }
            self.counters.failure();
            return Err(Error::OutOfMemory { requested: layout.size(), available: 0 });
        };
        let mut table = self.fallbacks.lock();
        if class.is_none() {
            table.larger += 1;
        }
        table.allocations += 1;
        table.live.insert(ptr.as_ptr() as usize, (real, class));
        self.counters.fallback();
        Ok(ptr)
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
    #[inline]
    #[track_caller]
    pub unsafe fn free(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded contract.
        unsafe { Shell::free(self, ptr) }
    }

    /// Frees a block.
    ///
    /// # Errors
    ///
    /// [`Error::NotBlockStart`] for an address inside a slot, [`Error::DoubleFree`] for a slot
    /// that is not handed out, [`Error::ForeignPointer`] for an address that is neither in
    /// the region nor a live fallback block. Nothing changes on error.
    ///
    /// # Safety
    ///
    /// The three kinds of bad pointer above are caught without touching memory. If `ptr` is
    /// a live block, the caller must own it and must not use it afterwards.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// use mmobject::{alloc::SmallObjectAllocator, Error};
    ///
    /// let small = SmallObjectAllocator::default();
    /// let p = small.alloc(Layout::new::<u64>());
    /// // SAFETY: `p` is ours; the second free is caught.
    /// unsafe {
    ///     small.free(p);
    ///     assert_eq!(small.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
    /// }
    /// ```
    pub unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        if !self.region.contains(addr) {
            // SAFETY: forwarded contract.
            return unsafe { self.free_fallback(ptr) };
        }
        let offset = addr - self.region.addr();
        let Some(class) = self.classes.iter().find(|c| c.start <= offset && offset < c.end) else {
            return Err(Error::ForeignPointer { addr }); // padding between classes
        };
        let rel = offset - class.start;
        let slot = rel / class.slot_size;
        if rel % class.slot_size != 0 {
            let block_start = addr - rel % class.slot_size;
            return Err(Error::NotBlockStart { addr, block_start });
        }
        let mut st = class.state.lock();
        if !st.is_set(slot) {
            return Err(Error::DoubleFree { addr });
        }
        // SAFETY: the slot was handed out and the caller no longer uses it. The fill goes
        // through the region's own pointer, whose provenance covers the whole slot; the
        // caller's pointer may cover only the bytes it asked for (an
        // `allocator_api2::boxed::Box<u8>` retags it to one byte), so writing the whole slot
        // through it would be undefined behaviour under Stacked Borrows.
        unsafe { region::fill_freed(self.region.at(offset), class.slot_size) };
        st.clear(slot);
        st.live -= 1;
        st.demand -= 1;
        Ok(())
    }

    /// # Safety
    ///
    /// As `try_free`.
    #[cold]
    #[inline(never)]
    unsafe fn free_fallback(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        let Some((layout, class)) = self.fallbacks.lock().live.remove(&addr) else {
            return Err(Error::ForeignPointer { addr });
        };
        if let Some(i) = class {
            self.classes[i].state.lock().demand -= 1;
        }
        // SAFETY: the table only holds blocks from `System.alloc` with this layout, and the
        // entry was removed, so each is freed once.
        unsafe { System.dealloc(ptr.as_ptr(), layout) };
        Ok(())
    }

    /// Data and bitmap bytes per class, in the order of [`SMALL_OBJECT_CLASSES`].
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::alloc::{SmallObjectAllocator, SmallObjectConfig};
    ///
    /// let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [1000, 0, 0, 0, 0, 0, 0] });
    /// assert_eq!(small.footprint()[0].total(), 8_125);
    /// ```
    pub fn footprint(&self) -> [ClassFootprint; 7] {
        std::array::from_fn(|i| {
            let c = &self.classes[i];
            ClassFootprint {
                slot_size: c.slot_size,
                slots: c.slots,
                data_bytes: c.slots * c.slot_size,
                bitmap_bytes: c.state.lock().bits.len(),
            }
        })
    }

    /// The recorded request statistics, to feed [`SmallObjectConfig::from_histogram`].
    pub fn histogram(&self) -> SizeHistogram {
        let mut h = SizeHistogram { larger: self.fallbacks.lock().larger, ..SizeHistogram::default() };
        for (i, c) in self.classes.iter().enumerate() {
            let st = c.state.lock();
            h.requests[i] = st.requests;
            h.peak_live[i] = st.peak_demand;
        }
        h
    }

    /// Free slots per class, in the order of [`SMALL_OBJECT_CLASSES`].
    pub fn free_slots(&self) -> [usize; 7] {
        std::array::from_fn(|i| self.classes[i].slots - self.classes[i].state.lock().live)
    }

    /// A snapshot of the usage. `in_use`/`peak` count slot bytes in the region (`peak` is the
    /// sum of per-class peaks, see [`AllocStats::peak`]); `live` counts slots and fallback
    /// blocks; `fallbacks` counts requests the system served.
    pub fn stats(&self) -> AllocStats {
        let (mut live, mut allocations, mut in_use, mut peak) = (0, 0, 0, 0);
        for c in &self.classes {
            let st = c.state.lock();
            live += st.live;
            allocations += st.allocations;
            in_use += st.live * c.slot_size;
            peak += st.peak_live * c.slot_size;
        }
        let table = self.fallbacks.lock();
        live += table.live.len();
        allocations += table.allocations;
        drop(table);
        self.counters.snapshot_with(self.region.len(), in_use, peak, live, allocations)
    }

    #[cold]
    #[inline(never)]
    fn corrupted(&self, ptr: NonNull<u8>, len: usize) -> Error {
        // SAFETY: the slot is free (its bit was cleared again): nobody references it.
        unsafe { region::fill_freed(ptr, len) };
        self.counters.failure();
        region::use_after_free("SmallObjectAllocator", ptr.as_ptr() as usize)
    }
}

impl Default for SmallObjectAllocator {
    /// An allocator with [`SmallObjectConfig::default`] (a 2 MiB region).
    fn default() -> Self {
        SmallObjectAllocator::new(SmallObjectConfig::default())
    }
}

impl Drop for SmallObjectAllocator {
    fn drop(&mut self) {
        for c in self.classes.iter_mut() {
            let live = c.state.get_mut().live;
            if live > 0 {
                log::warn!(
                    "SmallObjectAllocator dropped with {live} slot(s) of {} B still in use (leaked)",
                    c.slot_size
                );
            }
        }
        let table = self.fallbacks.get_mut();
        if !table.live.is_empty() {
            log::warn!("SmallObjectAllocator dropped with {} fallback block(s) still in use (freed)", table.live.len());
        }
        for (addr, (layout, _)) in table.live.drain() {
            // SAFETY: a live fallback block from `System.alloc` with this layout; the
            // allocator is going away, so nobody can legally use it any more.
            unsafe { System.dealloc(std::ptr::with_exposed_provenance_mut(addr), layout) };
        }
    }
}

impl fmt::Debug for SmallObjectAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmallObjectAllocator")
            .field("capacity", &self.region.len())
            .field("free_slots", &self.free_slots())
            .field("stats", &self.stats())
            .finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` returns a slot (aligned to the class alignment, which routing made
//    `>= layout.align()`, and at least `layout.size()` bytes, from the region's pointer) or a
//    `System` block for the layout; either is handed to nobody else until freed.
// 2. Blocks stay valid until `try_free` or the allocator's drop (which needs it unborrowed).
// 3. `try_free` checks range, class, slot start and bit (or the fallback table) before
//    touching memory, and then writes only through the region's pointer.
unsafe impl Shell for SmallObjectAllocator {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        SmallObjectAllocator::try_alloc(self, layout)
    }

    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { SmallObjectAllocator::try_free(self, ptr) }
    }
}

shell::impl_allocator!(SmallObjectAllocator);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(slots: [usize; 7]) -> SmallObjectAllocator {
        SmallObjectAllocator::new(SmallObjectConfig { slots })
    }

    #[test]
    fn eight_thousand_one_hundred_twenty_five() {
        let small = config([1000, 0, 0, 0, 0, 0, 0]);
        let blocks: Vec<_> = (0..1000).map(|_| small.alloc(Layout::new::<u64>())).collect();
        let st = small.stats();
        assert_eq!((st.fallbacks, st.live, st.in_use, st.capacity), (0, 1000, 8000, 8000));
        let f = small.footprint()[0];
        assert_eq!((f.data_bytes, f.bitmap_bytes, f.total()), (8000, 125, 8125));
        assert_eq!(small.footprint()[1].total(), 0);
        // The 1001st goes to the system.
        let extra = small.alloc(Layout::new::<u64>());
        assert_eq!(small.stats().fallbacks, 1);
        assert_eq!(small.histogram().peak_live[0], 1001);
        // SAFETY: every block is ours, freed once.
        unsafe {
            small.free(extra);
            for p in blocks {
                small.free(p);
            }
        }
        assert_eq!(small.stats().in_use, 0);
    }

    #[test]
    fn default_config_figures() {
        let c = SmallObjectConfig::default();
        assert_eq!(c.slots, [37440, 18688, 9344, 6208, 4672, 3072, 2304]);
        assert_eq!(c.data_bytes(), 2_084_352);
        let bitmap: usize = c.slots.iter().map(|s| s.div_ceil(8)).sum();
        assert_eq!(bitmap, 10_216);
        if !cfg!(miri) {
            assert_eq!(SmallObjectAllocator::default().capacity(), 2_084_352);
        }
    }

    #[test]
    fn routing_and_alignment() {
        let small = config([4, 4, 4, 4, 4, 4, 4]);
        let cases =
            [(0, 1, 8), (1, 1, 8), (9, 8, 16), (40, 8, 48), (40, 32, 64), (65, 8, 96), (65, 64, 128), (100, 128, 128)];
        for (size, align, slot) in cases {
            let p = small.alloc(Layout::from_size_align(size, align).unwrap());
            assert_eq!(p.as_ptr() as usize % align, 0);
            let i = SMALL_OBJECT_CLASSES.iter().position(|&s| s == slot).unwrap();
            let c = &small.classes[i];
            let off = p.as_ptr() as usize - small.region.addr();
            assert!(c.start <= off && off < c.end, "{size}/{align} should use the {slot} B class");
        }
        assert_eq!(small.stats().fallbacks, 0);
        let aligned = small.alloc(Layout::from_size_align(8, 4096).unwrap());
        assert_eq!(aligned.as_ptr() as usize % 4096, 0);
        assert_eq!(small.stats().fallbacks, 1);
        assert_eq!(small.histogram().larger, 1);
        assert_eq!(
            small.try_alloc(Layout::from_size_align(8, 8192).unwrap()),
            Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
        );
        // SAFETY: ours, freed once.
        unsafe { small.free(aligned) };
    }

    #[test]
    fn bitmap_scan_crosses_words_and_hint_moves_back() {
        let small = config([200, 0, 0, 0, 0, 0, 0]);
        let blocks: Vec<_> = (0..200).map(|_| small.alloc(Layout::new::<u8>())).collect();
        for (i, p) in blocks.iter().enumerate() {
            assert_eq!(p.as_ptr() as usize - small.region.addr(), i * 8, "lowest free slot first");
        }
        // SAFETY: ours, freed once.
        unsafe { small.free(blocks[3]) };
        assert_eq!(small.alloc(Layout::new::<u8>()), blocks[3]);
        assert_eq!(small.free_slots()[0], 0);
    }

    #[test]
    fn bad_frees() {
        let small = config([8, 0, 0, 8, 0, 0, 0]);
        let p = small.alloc(Layout::new::<[u8; 48]>());
        let big = small.alloc(Layout::new::<[u8; 200]>());
        let mut local = 0u64;
        let local = NonNull::from(&mut local).cast::<u8>();
        // SAFETY: each bad free is caught before memory is touched; the good ones free ours.
        unsafe {
            assert_eq!(small.try_free(local), Err(Error::ForeignPointer { addr: local.as_ptr() as usize }));
            assert_eq!(
                small.try_free(p.add(8)),
                Err(Error::NotBlockStart { addr: p.as_ptr() as usize + 8, block_start: p.as_ptr() as usize })
            );
            // Padding between the 8-byte class (64 bytes) and the 48-byte class (at 128).
            let pad = small.region.at(100);
            assert!(matches!(small.try_free(pad), Err(Error::ForeignPointer { .. })));
            small.free(p);
            assert_eq!(small.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
            small.free(big);
            assert!(matches!(small.try_free(big), Err(Error::ForeignPointer { .. })));
        }
    }

    #[test]
    #[should_panic(expected = "double free of")]
    fn double_free_panics() {
        let small = config([8; 7]);
        let p = small.alloc(Layout::new::<u8>());
        // SAFETY: the second free is the bug under test; it is caught.
        unsafe {
            small.free(p);
            small.free(p);
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    fn use_after_free_is_caught() {
        let small = config([1, 0, 0, 0, 0, 0, 0]);
        let p = small.alloc(Layout::new::<u64>());
        // SAFETY: a write through a stale pointer (the bug under test) into memory the
        // allocator still owns.
        unsafe {
            small.free(p);
            p.as_ptr().write(0);
        }
        assert_eq!(small.try_alloc(Layout::new::<u64>()), Err(Error::UseAfterFree { addr: p.as_ptr() as usize }));
        assert_eq!(small.try_alloc(Layout::new::<u64>()), Ok(p));
    }

    #[test]
    fn from_histogram_splits_by_peak_bytes() {
        let h = SizeHistogram { requests: [9; 7], peak_live: [100, 0, 0, 200, 0, 0, 0], larger: 0 };
        let c = SmallObjectConfig::from_histogram(&h, 800 + 9600);
        assert_eq!(c.slots, [100, 0, 0, 200, 0, 0, 0]);
        let by_requests = SizeHistogram { requests: [1, 0, 0, 0, 0, 0, 1], ..Default::default() };
        assert_eq!(SmallObjectConfig::from_histogram(&by_requests, 272).slots, [2, 0, 0, 0, 0, 0, 2]);
        assert_eq!(SmallObjectConfig::from_histogram(&SizeHistogram::default(), 1), SmallObjectConfig::default());
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: if cfg!(miri) { 4 } else { 256 },
            failure_persistence: None,
            ..ProptestConfig::default()
        })]
        #[test]
        fn model(ops in proptest::collection::vec((any::<bool>(), 0usize..160, 0u32..8, any::<usize>()),
                                                  0..if cfg!(miri) { 30 } else { 200 })) {
            let small = config([3, 2, 2, 3, 2, 2, 2]);
            let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
            for (n, (alloc, size, a, pick)) in ops.into_iter().enumerate() {
                if alloc || live.is_empty() {
                    let align = 1usize << a;
                    let p = small.try_alloc(Layout::from_size_align(size, align).unwrap());
                    prop_assert!(p.is_ok());
                    let p = p.unwrap();
                    let addr = p.as_ptr() as usize;
                    prop_assert_eq!(addr % align, 0);
                    for &(q, l, _) in &live {
                        let b = q.as_ptr() as usize;
                        prop_assert!(addr >= b + l.max(1) || addr + size.max(1) <= b, "overlap");
                    }
                    // SAFETY: a fresh block of at least `size` bytes.
                    unsafe { p.as_ptr().write_bytes(n as u8, size) };
                    live.push((p, size, n as u8));
                } else {
                    let (p, size, fill) = live.swap_remove(pick % live.len());
                    // SAFETY: a live block of the model, read then freed once.
                    unsafe {
                        prop_assert!(std::slice::from_raw_parts(p.as_ptr(), size).iter().all(|&b| b == fill));
                        prop_assert_eq!(small.try_free(p), Ok(()));
                        prop_assert!(small.try_free(p).is_err());
                    }
                }
                let st = small.stats();
                prop_assert_eq!(st.live, live.len());
                prop_assert!(st.in_use <= st.peak && st.peak <= st.capacity);
            }
            for (p, _, _) in live {
                // SAFETY: live blocks of the model, freed once.
                unsafe { small.free(p) };
            }
            prop_assert_eq!(small.stats().in_use, 0);
        }
    }
}
