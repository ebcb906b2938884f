//! [`SmallObjectAllocator`]: a fixed region of small slots tracked by one bit each, sized from
//! recorded statistics, with the system allocator as the fallback.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use super::lane::{LaneCache, LaneCounts, Lanes};
use super::region::{self, Region, SystemBlock, MAX_ALIGN};
use super::shell::{self, Shell};
use super::small_object_config::{ClassFootprint, SizeHistogram, SmallObjectConfig, SMALL_OBJECT_CLASSES};
use super::stats::SharedCounters;
use super::thread_cache::{self, CacheEntry, Caches, Fast, LocalKey, SMALL_CACHES, SMALL_FAST};
use super::AllocStats;
use crate::sync::Mutex;
use crate::{Error, Result};

/// Each class starts on a multiple of this, so slot `i` of a class of size `s` is aligned to
/// the lowest set bit of `s` (8, 16, 32, 16, 64, 32, 128).
const CLASS_ALIGN: usize = 128;

/// The most granules the region is cut into. Each class starts on a granule, so one record
/// per granule ([`GranuleClass`], a table of 2 KiB) names the class of an address with one
/// shift and one load.
const GRANULES: usize = 64;

/// A class index, `0..7`, as a type: the compiler then knows its range and indexes the
/// per-class arrays with it without a bounds check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum ClassIndex {
    I0,
    I1,
    I2,
    I3,
    I4,
    I5,
    I6,
}

impl ClassIndex {
    const ALL: [ClassIndex; 7] = [
        ClassIndex::I0,
        ClassIndex::I1,
        ClassIndex::I2,
        ClassIndex::I3,
        ClassIndex::I4,
        ClassIndex::I5,
        ClassIndex::I6,
    ];

    #[inline(always)]
    fn get(self) -> usize {
        self as usize
    }
}

/// One class: `slots` slots of `slot_size` bytes at `start..end` in the region. `start` is a
/// multiple of the granule, and the padding after `end` stops at the next class's `start`.
/// A line each, so the alloc finds a class's record with a shift, not a multiplication.
#[repr(align(64))]
struct SmallClass {
    slot_size: usize,
    /// The alignment every slot has.
    align: usize,
    start: usize,
    end: usize,
    slots: u64,
}

/// What the allocator shares with the thread caches (which hold it as a `Weak`), so that a
/// thread leaving can give its lanes back and move its counts into the classes'.
struct Shared {
    /// The classes' bitmaps and lanes, in the order of [`SMALL_OBJECT_CLASSES`].
    lanes: [Lanes; 7],
    /// The counts of the threads that have a cache for this allocator now.
    threads: Mutex<Vec<Arc<ThreadCounts>>>,
    counters: SharedCounters,
    /// Each class's first slot address and slot size, to name slots in reports.
    slot_addr: [(usize, usize); 7],
}

impl Shared {
    /// Reports slots of class `i` found freed twice when their two frees raced on two
    /// threads. The second free is ignored (the slot is free once).
    #[cold]
    #[inline(never)]
    fn report_raced(&self, i: usize, raced: Vec<usize>) {
        let (start, size) = self.slot_addr[i];
        for slot in raced {
            log::error!(
                "SmallObjectAllocator: {} (two frees raced on two threads; the second is ignored)",
                Error::DoubleFree { addr: start + slot * size }
            );
            self.counters.failure();
        }
    }
}

/// One thread's counts, per class.
#[derive(Debug, Default)]
struct ThreadCounts([LaneCounts; 7]);

/// One thread's cache for one [`SmallObjectAllocator`]: the lanes it owns in each class.
/// Dropping it (when the thread exits) gives them back. `repr(C)` keeps the fast paths'
/// fields first.
#[repr(C)]
pub(crate) struct SmallCache {
    classes: [LaneCache; 7],
    counts: Arc<ThreadCounts>,
    id: u64,
    shared: Weak<Shared>,
}

impl CacheEntry for SmallCache {
    fn id(&self) -> u64 {
        self.id
    }

    fn is_alive(&self) -> bool {
        self.shared.strong_count() > 0
    }

    fn caches() -> &'static LocalKey<Caches<Self>> {
        &SMALL_CACHES
    }

    fn fast() -> &'static LocalKey<Fast<Self>> {
        &SMALL_FAST
    }
}

impl Drop for SmallCache {
    fn drop(&mut self) {
        // The allocator may be gone, or alive on another thread: hand the lanes back so
        // other threads can take them over.
        let Some(shared) = self.shared.upgrade() else { return };
        for (i, lanes) in shared.lanes.iter().enumerate() {
            let raced = lanes.release(&mut self.classes[i], &self.counts.0[i]);
            shared.report_raced(i, raced);
        }
        shared.threads.lock().retain(|counts| !Arc::ptr_eq(counts, &self.counts));
    }
}

impl fmt::Debug for SmallCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmallCache").field("id", &self.id).field("classes", &self.classes).finish()
    }
}

/// Live system-fallback blocks, by address, and the fallback counts.
#[derive(Default)]
struct Fallbacks {
    /// The pointer `System` returned (frees go through it, never through the caller's),
    /// the layout it was allocated with, and the class it stands in for.
    live: HashMap<usize, (SystemBlock, Layout, Option<usize>)>,
    larger: u64,
    allocations: u64,
    /// Per class: requests the system served (or refused) because the class had no slot
    /// for the thread, fallback blocks live now, and the most live at once.
    requests: [u64; 7],
    live_by_class: [u64; 7],
    peak_by_class: [u64; 7],
}

/// `(inverse, shift)` per class, to turn an offset into a class into a slot index and check it
/// in one step. A slot size is `odd << shift` with `odd` 1 or 3, and `inverse` is `odd`'s
/// inverse modulo `2^64`. Then `slot_of(rel) = (rel × inverse mod 2^64).rotate_right(shift)`,
/// for `rel` bytes into the class ([`GranuleClass::slot_of`]):
/// - if `rel = q × size`, then `rel × inverse ≡ q << shift`, which is exact (it is `rel / odd`)
///   and has its low `shift` bits clear, so the rotation gives `q`;
/// - multiplying by an odd number and rotating are both bijections of `u64`, and the multiples
///   `q × size` already map onto every `q` up to `u64::MAX / size`, so every other `rel` maps
///   above that, and so above any slot count (classes have fewer than `2^32` slots).
///
/// So `slot_of(rel) < slots` holds exactly when `rel` is the start of one of the class's
/// slots: one multiplication, one rotation and one compare cover the division, the
/// "inside a slot" check and the "past the class's last slot" check.
const INVERSE: [(u64, u32); 7] = {
    const ONE: u64 = 1;
    const THIRD: u64 = 0xAAAA_AAAA_AAAA_AAAB; // 3 × THIRD ≡ 1 (mod 2^64)
    [(ONE, 3), (ONE, 4), (ONE, 5), (THIRD, 4), (ONE, 6), (THIRD, 5), (ONE, 7)]
};

/// What a free needs of the class a granule belongs to, copied from its [`SmallClass`]: one
/// record per granule, so the free goes from an address to its slot, class and lanes with one
/// table load (the record's fields share a line) and no class record or `Arc` on the way.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
struct GranuleClass {
    start: u64,
    /// The class's inverse in [`INVERSE`].
    inverse: u64,
    /// The class's slot count (below `2^32`).
    slots: u32,
    /// The class's shift in [`INVERSE`].
    shift: u8,
    class: ClassIndex,
    /// The class's lanes, loaded with the rest so the free needs no second lookup for them.
    lanes: LanesPtr,
}

impl GranuleClass {
    /// The record of class `i` (its lanes at `lanes`); `None` for a granule past the region,
    /// which has no slots, so every free there takes the cold path.
    fn new(class: Option<&SmallClass>, i: usize, lanes: LanesPtr) -> GranuleClass {
        let (inverse, shift) = INVERSE[i];
        GranuleClass {
            start: class.map_or(0, |c| c.start as u64),
            inverse,
            slots: class.map_or(0, |c| u32::try_from(c.slots).expect("fewer than 2^32 slots")),
            shift: shift as u8,
            class: ClassIndex::ALL[i],
            lanes,
        }
    }

    /// [`INVERSE`]'s `slot_of` for `offset` bytes into the region (at or after the class's
    /// start, as every granule of a class is): the slot index if `offset` is a slot's start,
    /// and at least `2^32` if it is not.
    #[inline(always)]
    fn slot_of(self, offset: usize) -> u64 {
        (offset as u64).wrapping_sub(self.start).wrapping_mul(self.inverse).rotate_right(u32::from(self.shift))
    }
}

/// A pointer to one of the [`Lanes`] in an allocator's [`Shared`], so the fast paths reach a
/// class's lanes with one load instead of the `Arc`'s pointer and an index.
///
/// Invariant: it points into the `Arc<Shared>` of the allocator whose fields hold it. That
/// `Arc` lives as long as the allocator and is never borrowed mutably (nothing calls
/// `Arc::get_mut` on it), so the pointee is valid for shared access while the allocator is.
#[derive(Debug, Clone, Copy)]
struct LanesPtr(NonNull<Lanes>);

impl LanesPtr {
    /// The lanes, for as long as `owner` is borrowed.
    ///
    /// # Safety
    ///
    /// `owner` is the allocator whose fields hold this pointer.
    #[inline(always)]
    unsafe fn get(self, owner: &SmallObjectAllocator) -> &Lanes {
        let _ = owner;
        // SAFETY: by the invariant and the caller's contract, it points into `owner.shared`,
        // alive and never mutably borrowed while `owner` is borrowed.
        unsafe { self.0.as_ref() }
    }
}

// SAFETY: it stands for a `&Lanes` into an `Arc` its allocator holds; `Lanes` is `Sync`.
unsafe impl Send for LanesPtr {}
// SAFETY: as above.
unsafe impl Sync for LanesPtr {}

/// A small-object allocator: one region of 8/16/32/48/64/96/128-byte slots, one bit per slot,
/// with a per-thread fast path.
///
/// - **Allocate**: the smallest class that fits the size and alignment. Each class's bitmap
///   is cut into at most 64 *lanes* of consecutive 64-slot words; a thread takes lanes for
///   itself and allocates from them with no lock and no atomic read-modify-write (the lowest
///   clear bit of its active word, `trailing_zeros`). If the thread has no free slot in its
///   lanes and finds no unowned lane with one, or the request is over 128 bytes or more
///   aligned than any class, the system allocator serves it and it counts as a *fallback*.
///   Fallback blocks are kept in a small side table (address → layout) so they are
///   recognised and freed correctly.
/// - **Free**: an address inside the region reveals its class and slot: classes start on
///   *granules* (the region is cut into at most 64), so a table of one 32-byte record per
///   granule gives the class with one shift and one load, and one multiplication by the
///   inverse of the slot size gives the slot and rejects an address inside a slot or past the class's last. In a lane the
///   freeing thread owns, clearing the bit frees the slot (a plain store). Otherwise the free
///   takes the class's lock and either clears the bit (nobody owns the lane) or queues the
///   slot for the lane's owner, which applies it when it next needs a slot or frees in that
///   lane. A slot whose bit is clear, or which is queued already, is a double free
///   ([`Error::DoubleFree`]), on the owner's thread or any other. An address outside the
///   region must be a live fallback block, or it is [`Error::ForeignPointer`] (this
///   includes a second free of a fallback block, since the system may already have reused
///   the address).
/// - **Double frees across threads** are caught at the call. Only two frees of one slot
///   racing on two threads at the same moment can both pass their checks; the owner then
///   finds the slot free twice when it applies the queued free, logs the double free
///   (`log::error!`), counts it in [`AllocStats::failures`] and keeps the slot free once.
///   (If the late free of such a race lands only after the slot was handed out again, it
///   looks exactly like freeing a block someone else holds, which `try_free`'s safety
///   contract rules out and no allocator can tell apart.)
/// - **Lanes and threads**: a thread keeps the lanes it has taken until it exits; then they
///   go back, and other threads take them over. So while one thread owns every lane of a
///   class with free slots, other threads' requests in that class fall back to the system.
/// - **Overhead**: exactly one bit per slot ([`footprint`](Self::footprint)): 1,000 slots of
///   8 bytes cost 8,000 + 125 = 8,125 bytes. Lanes have no metadata of their own. Beside
///   that, a fixed part per class (its lock, two lane masks, the queue of frees waiting for
///   an owner), the allocator's own tables (3 KiB of granule records and size routes) and,
///   per thread that uses the allocator, a few words per class in its
///   thread-local cache and in its counts. Classes start on granules (of 128 bytes, or of
///   the smallest power of two that cuts the classes into at most 64), so padding can follow
///   a class up to the next granule: address space the allocator never reads or writes
///   (debug builds fill it once), and not in [`capacity`](Self::capacity). It is under
///   6 × 128 bytes with 128-byte granules, and under 21 % of the slot bytes with larger
///   ones (those are used only when the classes need more than 64 granules of half the
///   size); none follows the last class.
/// - **Sizing**: the allocator records a [`SizeHistogram`];
///   [`SmallObjectConfig::from_histogram`] turns a recorded run into slot counts.
/// - **Debug builds** fill freed slots with `0xDD` and check the fill on allocation.
/// - **Drop** logs slots still in use as leaks (`log::warn!`) and frees live fallback blocks.
///   Dropping the allocator while other threads' caches still name it is fine: they hold
///   its id and a `Weak` to its bitmaps, never a pointer into it.
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
/// // Blocks may be freed on any thread.
/// let addr = node.as_ptr() as usize;
/// std::thread::scope(|s| {
///     s.spawn(|| {
///         let node = std::ptr::NonNull::new(addr as *mut u8).unwrap();
///         // SAFETY: `node` is a live block from `small`, freed once.
///         unsafe { small.free(node) };
///     });
/// });
/// // SAFETY: ours, freed once.
/// unsafe { small.free(big) };
/// assert_eq!(small.stats().live, 0);
/// ```
pub struct SmallObjectAllocator {
    region: Region,
    classes: [SmallClass; 7],
    shared: Arc<Shared>,
    /// Keys this allocator's thread caches; never repeats.
    id: u64,
    /// `route[size]` for `size <= 128`: the first class whose slots are at least `size` bytes.
    route: [ClassIndex; 129],
    /// `route_lanes[size]`: that class's lanes, loaded beside its index rather than after it.
    route_lanes: [LanesPtr; 129],
    /// Granules are `1 << granule_shift` bytes (at least [`CLASS_ALIGN`]).
    granule_shift: u32,
    /// The class of each granule of the region; the entries past it have no slots.
    granule_class: [GranuleClass; GRANULES],
    fallbacks: Mutex<Fallbacks>,
    /// `&shared.lanes[i]` per class.
    lanes: [LanesPtr; 7],
}

impl SmallObjectAllocator {
    /// Creates the allocator with `config.slots[i]` slots of `SMALL_OBJECT_CLASSES[i]` bytes.
    ///
    /// # Panics
    ///
    /// Panics if the total overflows `isize`, or if a class has `2^32` slots or more.
    pub fn new(config: SmallObjectConfig) -> SmallObjectAllocator {
        let bytes: [usize; 7] = std::array::from_fn(|i| {
            config.slots[i]
                .checked_mul(SMALL_OBJECT_CLASSES[i])
                .filter(|&b| b < isize::MAX as usize / 4)
                .expect("small object region too large")
        });
        // The smallest granule (from 128 bytes) that cuts the classes into at most `GRANULES`
        // granules. Padding follows each class but the last, up to the next granule: under
        // six granules in all. A granule over 128 bytes is chosen only when the classes need
        // more than 64 granules of half its size, so more than 29 of its own (each class
        // rounds up by less than one): the padding is then under 6/29 of the slot bytes.
        let granules = |shift: u32| bytes.iter().map(|&b| b.div_ceil(1 << shift)).sum::<usize>();
        let mut granule_shift = CLASS_ALIGN.trailing_zeros();
        while granules(granule_shift) > GRANULES {
            granule_shift += 1;
        }
        let mut offset = 0usize;
        let mut granule_of = [None; GRANULES];
        let classes: [SmallClass; 7] = std::array::from_fn(|i| {
            let slot_size = SMALL_OBJECT_CLASSES[i];
            let (start, end) = (offset, offset + bytes[i]);
            let first = start >> granule_shift;
            offset = region::align_up(end, 1 << granule_shift);
            let slots = config.slots[i] as u64;
            granule_of[first..offset >> granule_shift].fill(Some(i));
            SmallClass { slot_size, align: 1 << slot_size.trailing_zeros(), start, end, slots }
        });
        // No padding after the last class: the region ends with its last slot.
        let offset = classes.iter().filter(|c| c.slots > 0).map(|c| c.end).max().unwrap_or(0);
        let region = Region::new(offset);
        let shared = Arc::new(Shared {
            lanes: std::array::from_fn(|i| Lanes::new(config.slots[i])),
            threads: Mutex::new(Vec::new()),
            counters: SharedCounters::default(),
            slot_addr: std::array::from_fn(|i| (region.addr() + classes[i].start, classes[i].slot_size)),
        });
        // `LanesPtr`'s invariant: each points into `shared`, which the allocator holds.
        let lanes: [LanesPtr; 7] = std::array::from_fn(|i| LanesPtr(NonNull::from(&shared.lanes[i])));
        let route: [ClassIndex; 129] = std::array::from_fn(|size| {
            ClassIndex::ALL[SMALL_OBJECT_CLASSES.iter().position(|&s| s >= size).expect("size <= 128")]
        });
        let route_lanes = route.map(|c| lanes[c.get()]);
        let granule_class = granule_of.map(|i| match i {
            Some(i) => GranuleClass::new(Some(&classes[i]), i, lanes[i]),
            None => GranuleClass::new(None, 0, lanes[0]),
        });
        SmallObjectAllocator {
            region,
            classes,
            id: thread_cache::next_allocator_id(),
            route,
            route_lanes,
            granule_shift,
            granule_class,
            fallbacks: Mutex::new(Fallbacks::default()),
            lanes,
            shared,
        }
    }

    /// Bytes of slots, over all classes (the region also holds the padding after each class
    /// up to the next granule, which is never handed out).
    pub fn capacity(&self) -> usize {
        self.classes.iter().map(|c| c.end - c.start).sum()
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
            // Every slot is 8-aligned: only a larger alignment can need a larger class.
            let class = if align <= 8 {
                Some((self.route[size], self.route_lanes[size]))
            } else {
                self.route_aligned(size, align).map(|c| (c, self.lanes[c.get()]))
            };
            if let Some((class, lanes)) = class {
                let i = class.get();
                // SAFETY: `lanes` is one of `self`'s own (from `route_lanes` or `lanes`).
                let lanes = unsafe { lanes.get(self) };
                // SAFETY: the closure only reads and writes bitmap words and this thread's
                // counts: it calls nothing that could reach the thread cache again.
                let fast = unsafe {
                    thread_cache::with_last_cache(self.id, |cache: &mut SmallCache| {
                        lanes.take_active(&mut cache.classes[i], &cache.counts.0[i])
                    })
                };
                return match fast {
                    Some(slot) => self.hand_out(i, slot),
                    None => self.alloc_slow(layout, i),
                };
            }
        }
        self.fallback(layout, None)
    }

    /// The first class for `size` whose slots are aligned to `align` (over 8), if any.
    #[cold]
    #[inline(never)]
    fn route_aligned(&self, size: usize, align: usize) -> Option<ClassIndex> {
        ClassIndex::ALL[self.route[size].get()..].iter().copied().find(|c| self.classes[c.get()].align >= align)
    }

    /// The rest of [`try_alloc`](Self::try_alloc) for class `i`: another word or lane for
    /// this thread, the uncached path, and the system fallback.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout, i: usize) -> Result<NonNull<u8>> {
        let lanes = &self.shared.lanes[i];
        let cached = thread_cache::with_cache(
            self.id,
            || self.new_cache(),
            |cache| lanes.refill(&mut cache.classes[i], &cache.counts.0[i]),
        );
        let slot = match cached {
            Some((slot, raced)) => {
                if !raced.is_empty() {
                    self.shared.report_raced(i, raced);
                }
                slot.map(|slot| self.hand_out(i, slot))
            }
            // No cache to use (the thread's locals are gone): a slot of an unowned lane,
            // checked under the class's lock before it is taken.
            None => match lanes.take_unowned(|slot| self.intact_or_refilled(i, slot)) {
                Ok(slot) => slot.map(|slot| Ok(self.slot_ptr(i, slot))),
                Err(slot) => Some(Err(self.refused(self.slot_ptr(i, slot)))),
            },
        };
        slot.unwrap_or_else(|| self.fallback(layout, Some(i)))
    }

    /// Whether free slot `slot` of class `i` still holds its fill (always, in release
    /// builds); if not, it is refilled. The caller keeps anyone else from taking the slot.
    fn intact_or_refilled(&self, i: usize, slot: usize) -> bool {
        let (ptr, len) = (self.slot_ptr(i, slot), self.classes[i].slot_size);
        // SAFETY: the slot is free, and the caller (holding its class's lock, the writer of
        // an unowned lane) keeps it from being taken meanwhile: nobody references its bytes,
        // initialised by the region's fill or the last free's.
        unsafe {
            if region::freed_intact(ptr, len) {
                return true;
            }
            region::fill_freed(ptr, len);
        }
        false
    }

    /// Slot `slot` of class `i`, with the region's provenance.
    #[inline(always)]
    fn slot_ptr(&self, i: usize, slot: usize) -> NonNull<u8> {
        let class = &self.classes[i];
        self.region.at(class.start + slot * class.slot_size)
    }

    /// A new thread cache for this allocator, its counts registered.
    fn new_cache(&self) -> SmallCache {
        let counts = Arc::new(ThreadCounts::default());
        self.shared.threads.lock().push(Arc::clone(&counts));
        SmallCache { id: self.id, shared: Arc::downgrade(&self.shared), counts, classes: Default::default() }
    }

    /// Returns slot `slot` of class `i`, just taken by this thread in its own lanes, after
    /// the use-after-free check.
    #[inline(always)]
    fn hand_out(&self, i: usize, slot: usize) -> Result<NonNull<u8>> {
        let ptr = self.slot_ptr(i, slot);
        // SAFETY: the slot was free until just now: `slot_size` bytes nobody references,
        // initialised by the region's fill or the last free's.
        if !unsafe { region::freed_intact(ptr, self.classes[i].slot_size) } {
            return Err(self.corrupted(i, slot, ptr));
        }
        Ok(ptr)
    }

    #[cold]
    #[inline(never)]
    fn fallback(&self, layout: Layout, class: Option<usize>) -> Result<NonNull<u8>> {
        let align = layout.align();
        if align > MAX_ALIGN {
            self.shared.counters.failure();
            return Err(Error::UnsupportedAlignment { align, max: MAX_ALIGN });
        }
        let real = Layout::from_size_align(layout.size().max(1), align).expect("valid layout");
        // SAFETY: `real` has a non-zero size.
        let ptr = NonNull::new(unsafe { System.alloc(real) });
        let mut table = self.fallbacks.lock();
        if let Some(i) = class {
            table.requests[i] += 1;
        }
        let Some(ptr) = ptr else {
            drop(table);
            self.shared.counters.failure();
            return Err(Error::OutOfMemory { requested: layout.size(), available: 0 });
        };
        match class {
            None => table.larger += 1,
            Some(i) => {
                table.live_by_class[i] += 1;
                table.peak_by_class[i] = table.peak_by_class[i].max(table.live_by_class[i]);
            }
        }
        table.allocations += 1;
        table.live.insert(ptr.as_ptr() as usize, (SystemBlock(ptr), real, class));
        drop(table);
        self.shared.counters.fallback();
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

    /// Frees a block, from any thread.
    ///
    /// # Errors
    ///
    /// [`Error::NotBlockStart`] for an address inside a slot, [`Error::DoubleFree`] for a slot
    /// that is not handed out, [`Error::ForeignPointer`] for an address that is neither in
    /// the region nor a live fallback block. Nothing changes on error. (Two frees of one slot
    /// racing on two threads at once are reported later instead: see the type's docs.)
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
    #[inline(always)]
    pub unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        // Below the region, the offset wraps to far past it.
        let offset = addr.wrapping_sub(self.region.addr());
        let Some(&class) = self.granule_class.get(offset >> self.granule_shift) else {
            // SAFETY: forwarded contract.
            return unsafe { self.not_a_slot(ptr) };
        };
        let slot = class.slot_of(offset);
        // Also past the region's end (in its last granule, or in a granule past it).
        if slot >= u64::from(class.slots) {
            // SAFETY: forwarded contract.
            return unsafe { self.not_a_slot(ptr) };
        }
        let i = class.class.get();
        let slot = slot as usize;
        // SAFETY: `class` is a copy of one of `self.granule_class`, so its pointer is `self`'s.
        let lanes = unsafe { class.lanes.get(self) };
        // SAFETY: the closure only reads and writes bitmap words and this thread's counts,
        // and writes the debug fill: it calls nothing that could reach the thread cache again.
        let fast = unsafe {
            thread_cache::with_last_cache(self.id, |cache: &mut SmallCache| {
                lanes.free_owned(&cache.classes[i], &cache.counts.0[i], slot, move || self.fill_slot(i, offset))
            })
        };
        match fast {
            Some(Ok(())) => Ok(()),
            Some(Err(())) => Err(Error::DoubleFree { addr }),
            None => self.free_slow(i, slot, offset),
        }
    }

    /// Writes the debug fill over the slot of class `i` at `offset`, being freed.
    #[inline(always)]
    fn fill_slot(&self, i: usize, offset: usize) {
        // SAFETY: called once `try_free`'s checks passed, so the slot was handed out and, by
        // the caller's contract, is no longer used. The fill goes through the region's own
        // pointer, whose provenance covers the whole slot; the caller's pointer may cover
        // only the bytes it asked for (an `allocator_api2::boxed::Box<u8>` retags it to one
        // byte), so writing the whole slot through it would be undefined behaviour under
        // Stacked Borrows.
        unsafe { region::fill_freed(self.region.at(offset), self.classes[i].slot_size) }
    }

    /// A free at an address that is no slot's start: outside the region (a fallback block,
    /// or foreign), inside a slot, or in the padding after a class.
    ///
    /// # Safety
    ///
    /// As `try_free`.
    #[cold]
    #[inline(never)]
    unsafe fn not_a_slot(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        if !self.region.contains(addr) {
            // SAFETY: forwarded contract.
            return unsafe { self.free_fallback(ptr) };
        }
        let offset = addr - self.region.addr();
        // The class with the last start at or before the offset (classes are in order).
        let class = self.classes.iter().rev().find(|c| c.start <= offset && c.start < c.end);
        match class {
            Some(c) if offset < c.end => {
                Err(Error::NotBlockStart { addr, block_start: addr - (offset - c.start) % c.slot_size })
            }
            _ => Err(Error::ForeignPointer { addr }),
        }
    }

    /// The rest of [`try_free`](Self::try_free) for slot `slot` of class `i` (at `offset`): a
    /// lane with queued frees, or one this thread does not own.
    #[cold]
    #[inline(never)]
    fn free_slow(&self, i: usize, slot: usize, offset: usize) -> Result<()> {
        let lanes = &self.shared.lanes[i];
        let fill = || self.fill_slot(i, offset);
        let (freed, raced) = thread_cache::with_cache(
            self.id,
            || self.new_cache(),
            |cache| lanes.free_shared(Some((&mut cache.classes[i], &cache.counts.0[i])), slot, fill),
        )
        .unwrap_or_else(|| lanes.free_shared(None, slot, fill));
        if !raced.is_empty() {
            self.shared.report_raced(i, raced);
        }
        freed.map_err(|()| Error::DoubleFree { addr: self.region.addr() + offset })
    }

    /// # Safety
    ///
    /// As `try_free`.
    #[cold]
    #[inline(never)]
    unsafe fn free_fallback(&self, ptr: NonNull<u8>) -> Result<()> {
        let addr = ptr.as_ptr() as usize;
        let mut table = self.fallbacks.lock();
        let Some((block, layout, class)) = table.live.remove(&addr) else {
            return Err(Error::ForeignPointer { addr });
        };
        if let Some(i) = class {
            table.live_by_class[i] -= 1;
        }
        drop(table);
        // SAFETY: the table only holds blocks from `System.alloc` with this layout, and the
        // entry was removed, so each is freed once. The free goes through the system's own
        // pointer: `ptr` names the block but may not carry provenance over all of it.
        unsafe { System.dealloc(block.0.as_ptr(), layout) };
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
                slots: c.slots as usize,
                data_bytes: c.end - c.start,
                bitmap_bytes: self.shared.lanes[i].bitmap_bytes(),
            }
        })
    }

    /// Per class: slots handed out over the allocator's life and the most in use at once
    /// (an upper bound: the sum of the peaks of each thread's own slots and of the unowned
    /// lanes', each an upper bound itself, see [`SizeHistogram::peak_live`]).
    fn class_totals(&self) -> [(u64, usize); 7] {
        let threads = self.shared.threads.lock();
        std::array::from_fn(|i| self.shared.lanes[i].totals(threads.iter().map(|t| &t.0[i])))
    }

    /// The recorded request statistics, to feed [`SmallObjectConfig::from_histogram`].
    pub fn histogram(&self) -> SizeHistogram {
        let totals = self.class_totals();
        let table = self.fallbacks.lock();
        SizeHistogram {
            requests: std::array::from_fn(|i| totals[i].0 + table.requests[i]),
            peak_live: std::array::from_fn(|i| totals[i].1 as u64 + table.peak_by_class[i]),
            larger: table.larger,
        }
    }

    /// Free slots per class, in the order of [`SMALL_OBJECT_CLASSES`] (a snapshot, exact
    /// when no other thread is inside the allocator).
    pub fn free_slots(&self) -> [usize; 7] {
        std::array::from_fn(|i| self.classes[i].slots as usize - self.shared.lanes[i].live())
    }

    /// A snapshot of the usage. `in_use`/`peak` count slot bytes in the region (`peak` is the
    /// sum of per-class peaks, each the sum of per-thread peaks, see [`AllocStats::peak`]);
    /// `live` counts slots and fallback blocks; `fallbacks` counts requests the system served.
    pub fn stats(&self) -> AllocStats {
        let totals = self.class_totals();
        let (mut live, mut allocations, mut in_use, mut peak) = (0, 0, 0, 0);
        for (i, c) in self.classes.iter().enumerate() {
            let class_live = self.shared.lanes[i].live();
            live += class_live;
            allocations += totals[i].0;
            in_use += class_live * c.slot_size;
            peak += totals[i].1 * c.slot_size;
        }
        let table = self.fallbacks.lock();
        live += table.live.len();
        allocations += table.allocations;
        drop(table);
        self.shared.counters.snapshot_with(self.capacity(), in_use, peak, live, allocations)
    }

    /// Reports slot `slot` of class `i` (at `ptr`), just taken by this thread in its own
    /// lanes, whose fill was overwritten: it is refilled and put back as if never taken (no
    /// allocation, no peak), so the next call hands it out.
    #[cold]
    #[inline(never)]
    fn corrupted(&self, i: usize, slot: usize, ptr: NonNull<u8>) -> Error {
        // SAFETY: the slot was just taken and is handed to nobody: nobody references it.
        unsafe { region::fill_freed(ptr, self.classes[i].slot_size) };
        let lanes = &self.shared.lanes[i];
        let untaken = thread_cache::with_cache(
            self.id,
            || self.new_cache(),
            |cache| lanes.untake(&cache.classes[i], &cache.counts.0[i], slot),
        );
        debug_assert_eq!(untaken, Some(true), "a slot this thread just took goes back to its lane");
        if untaken != Some(true) {
            // The cache it was taken through is out of reach (it cannot be: taking needed
            // it a moment ago). Free the slot rather than lose it; it then counts as an
            // allocation.
            // SAFETY: the slot was just taken by this call and is handed to nobody, so this
            // is its one free.
            let back = unsafe { self.try_free(ptr) };
            debug_assert!(back.is_ok(), "a slot just taken frees cleanly: {back:?}");
        }
        self.refused(ptr)
    }

    /// The error for a slot at `ptr` that failed the use-after-free check and stays free:
    /// a failure, and not an allocation.
    #[cold]
    #[inline(never)]
    fn refused(&self, ptr: NonNull<u8>) -> Error {
        self.shared.counters.failure();
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
        for (i, c) in self.classes.iter().enumerate() {
            let live = self.shared.lanes[i].live();
            if live > 0 {
                log::warn!(
                    "SmallObjectAllocator dropped with {live} slot(s) of {} B still in use (leaked)",
                    c.slot_size
                );
            }
        }
        let mut table = self.fallbacks.lock();
        if !table.live.is_empty() {
            log::warn!("SmallObjectAllocator dropped with {} fallback block(s) still in use (freed)", table.live.len());
        }
        for (_, (block, layout, _)) in table.live.drain() {
            // SAFETY: a live fallback block from `System.alloc` with this layout, freed
            // through the pointer `System` returned; the allocator is going away, so nobody
            // can legally use it any more.
            unsafe { System.dealloc(block.0.as_ptr(), layout) };
        }
    }
}

impl fmt::Debug for SmallObjectAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SmallObjectAllocator")
            .field("capacity", &self.capacity())
            .field("free_slots", &self.free_slots())
            .field("stats", &self.stats())
            .finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` returns a slot (aligned to the class alignment, which routing made
//    `>= layout.align()`, and at least `layout.size()` bytes, from the region's pointer) or a
//    `System` block for the layout. A slot's bit was set by the one writer of its word (the
//    lane's owner, or the lock holder for an unowned lane: `Lanes` invariant 2), so it is
//    handed to nobody else until freed; a system block is the system's to give.
// 2. Blocks stay valid until `try_free` or the allocator's drop (which needs it unborrowed).
// 3. `try_free` checks range, class, slot start and bit (or the fallback table) before
//    touching memory, and then writes only the debug fill, through the region's pointer.
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
            let small = SmallObjectAllocator::default();
            assert_eq!(small.capacity(), 2_084_352);
            // 64 KiB granules, 35 of them: each class but the last is padded to 5 granules.
            assert_eq!((small.granule_shift, small.region.len()), (16, 6 * 5 * 65_536 + 294_912));
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

    /// Classes too large for 64 granules of 128 bytes get larger granules; every slot is
    /// still found from its address, and the padding after each class is no slot.
    #[test]
    fn classes_on_larger_granules() {
        let small = config([3000, 10, 0, 2000, 0, 0, 5]);
        assert_eq!(small.granule_shift, 11, "24,000 + 160 + 96,000 + 640 bytes in 61 granules of 2 KiB");
        let starts: Vec<usize> = small.classes.iter().map(|c| c.start).collect();
        assert_eq!(starts, [0, 24_576, 26_624, 26_624, 122_880, 122_880, 122_880]);
        assert_eq!(small.capacity(), 24_000 + 160 + 96_000 + 640);
        assert_eq!(small.region.len(), 122_880 + 640, "no padding after the last class");
        let layouts =
            [Layout::new::<u64>(), Layout::new::<[u8; 16]>(), Layout::new::<[u8; 48]>(), Layout::new::<[u8; 128]>()];
        let blocks: Vec<_> = layouts.iter().flat_map(|&l| (0..5).map(move |_| l)).map(|l| small.alloc(l)).collect();
        assert_eq!(small.stats().fallbacks, 0);
        for (i, c) in small.classes.iter().enumerate().filter(|(_, c)| c.slots > 0) {
            let at = |offset: usize| small.region.at(offset);
            // SAFETY: none of these is a live block; each bad free is caught before memory
            // is touched.
            unsafe {
                if c.end < small.region.len() {
                    assert!(matches!(small.try_free(at(c.end)), Err(Error::ForeignPointer { .. })), "class {i}");
                }
                assert!(matches!(small.try_free(at(c.start + 3)), Err(Error::NotBlockStart { .. })), "class {i}");
            }
        }
        // Just past the region, in its last granule (whose record is the last class's).
        let end = small.region.at(small.region.len());
        // SAFETY: not a block; caught before memory is touched.
        assert_eq!(unsafe { small.try_free(end) }, Err(Error::ForeignPointer { addr: end.as_ptr() as usize }));
        for p in blocks {
            // SAFETY: ours, freed once; the second free is caught.
            unsafe {
                small.free(p);
                assert_eq!(small.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
            }
        }
        assert_eq!(small.stats().live, 0);
    }

    #[test]
    fn slot_of_divides_and_rejects_non_multiples() {
        let small = config([1; 7]);
        for (i, size) in SMALL_OBJECT_CLASSES.into_iter().enumerate() {
            let record = GranuleClass::new(Some(&small.classes[i]), i, small.lanes[i]);
            let start = small.classes[i].start;
            let slot_of = |rel: usize| record.slot_of(start.wrapping_add(rel));
            let last = ((1usize << 32) - 1) * size; // the start of the last possible slot
            for rel in [0, size, 5 * size, 1000 * size, last - size, last] {
                assert_eq!(slot_of(rel), (rel / size) as u64, "class {i}, {rel} bytes in");
            }
            // Inside a slot, or past the most slots a class can have: never below 2^32.
            for rel in [1, 7, size - 1, size + 1, 5 * size + 3, last - 1, last + 1, last + size, 1 << 40, usize::MAX] {
                assert!(slot_of(rel) >= 1 << 32, "class {i}, {rel} bytes in");
            }
        }
    }

    /// The owner's alloc and free in its own lane take no lock: only the first allocation
    /// (which takes the lane) and the refill after the word fills up do.
    #[test]
    fn owner_fast_paths_take_no_lock() {
        let small = config([200, 0, 0, 0, 0, 0, 0]);
        let lanes = &small.shared.lanes[0];
        let first = small.alloc(Layout::new::<u64>());
        let taken = lanes.locks_taken();
        assert_eq!(taken, 1, "the lane was taken under the lock");
        for _ in 0..100 {
            let p = small.alloc(Layout::new::<u64>());
            // SAFETY: ours, freed once.
            unsafe { small.free(p) };
        }
        assert_eq!(lanes.locks_taken(), taken, "alloc and free in an owned lane");
        // SAFETY: ours, freed once.
        unsafe { small.free(first) };
        assert_eq!(small.stats().live, 0);
    }

    /// Blocks freed on another thread go back to the owner's lane; a double free is caught
    /// whichever thread makes either free.
    #[test]
    fn frees_on_another_thread() {
        let small = config([64, 0, 0, 0, 0, 0, 0]);
        let blocks: Vec<_> = (0..64).map(|_| small.alloc(Layout::new::<u64>())).collect();
        let addrs: Vec<usize> = blocks.iter().map(|p| p.as_ptr() as usize).collect();
        let here = |addr: usize| NonNull::new(addr as *mut u8).unwrap();
        // SAFETY: the owner frees block 0; the rest are bad frees, caught.
        unsafe { small.free(blocks[0]) };
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: blocks 1..32 are ours, handed over and freed once; the rest are the
                // double frees under test.
                unsafe {
                    assert_eq!(small.try_free(here(addrs[0])), Err(Error::DoubleFree { addr: addrs[0] }));
                    for &addr in &addrs[1..32] {
                        small.free(here(addr));
                    }
                    assert_eq!(small.try_free(here(addrs[1])), Err(Error::DoubleFree { addr: addrs[1] }));
                }
            });
        });
        assert_eq!(small.stats().live, 32);
        // SAFETY: freed on the other thread (queued for this owner): a double free.
        assert_eq!(unsafe { small.try_free(blocks[2]) }, Err(Error::DoubleFree { addr: addrs[2] }));
        // The 32 freed slots are the owner's again.
        let again: Vec<_> = (0..32).map(|_| small.alloc(Layout::new::<u64>())).collect();
        assert_eq!(small.stats().fallbacks, 0);
        let mut sorted: Vec<_> = again.iter().map(|p| p.as_ptr() as usize).collect();
        sorted.sort_unstable();
        assert_eq!(sorted, addrs[..32]);
        // SAFETY: ours, freed once.
        unsafe {
            for p in again.into_iter().chain(blocks.into_iter().skip(32)) {
                small.free(p);
            }
        }
        assert_eq!(small.stats().live, 0);
        assert_eq!(small.stats().failures, 0, "every double free was caught at its call");
    }

    /// A thread that exits gives its lanes back, with the slots it still holds: another
    /// thread then allocates the free ones and frees the held ones (no owner: under the lock),
    /// and a second free of those is still caught.
    #[test]
    fn exiting_thread_gives_its_lanes_back() {
        let small = config([128, 0, 0, 0, 0, 0, 0]);
        let kept = std::thread::scope(|s| {
            s.spawn(|| {
                let blocks: Vec<_> = (0..128).map(|_| small.alloc(Layout::new::<u64>())).collect();
                let kept: Vec<usize> = blocks[..10].iter().map(|p| p.as_ptr() as usize).collect();
                for p in &blocks[10..] {
                    // SAFETY: ours, freed once.
                    unsafe { small.free(*p) };
                }
                kept
            })
            .join()
            .unwrap()
        });
        // The scoped thread's locals are gone once the scope returns.
        let blocks: Vec<_> = (0..118).map(|_| small.alloc(Layout::new::<u64>())).collect();
        assert_eq!(small.stats().fallbacks, 0, "the lanes came back");
        for addr in kept {
            let p = NonNull::new(addr as *mut u8).unwrap();
            // SAFETY: handed over from the exited thread, freed once; the second is caught.
            unsafe {
                small.free(p);
                assert_eq!(small.try_free(p), Err(Error::DoubleFree { addr }));
            }
        }
        // SAFETY: ours, freed once.
        unsafe { blocks.into_iter().for_each(|p| small.free(p)) };
        let st = small.stats();
        assert_eq!((st.live, st.allocations), (0, 246));
        // The first thread's peak was 128 and this one's own is 118 (the 10 it took over
        // count in the first's): the sum is an upper bound, capped at the class's slots.
        assert_eq!(small.histogram().peak_live[0], 128);
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
        let refused = small.stats();
        assert_eq!((refused.allocations, refused.failures, refused.live), (1, 1, 0), "a refusal is no allocation");
        assert_eq!(small.try_alloc(Layout::new::<u64>()), Ok(p));
        assert_eq!(small.stats().allocations, 2);
    }

    /// A slot refused by the use-after-free check is no allocation and raises no peak,
    /// whether it was never handed out (its fill overwritten by a write past the slot below)
    /// or freed before.
    #[test]
    #[cfg(debug_assertions)]
    fn a_refused_slot_is_no_peak() {
        let l = Layout::new::<u64>();
        let small = config([64, 0, 0, 0, 0, 0, 0]);
        let p = small.alloc(l);
        // SAFETY: a write past the end of `p` (the bug under test) into slot 1, never handed
        // out: memory the allocator owns.
        unsafe { p.add(8).as_ptr().write(0) };
        let next = p.as_ptr() as usize + 8;
        assert_eq!(small.try_alloc(l), Err(Error::UseAfterFree { addr: next }));
        let st = small.stats();
        assert_eq!((st.allocations, st.failures, st.live, st.peak), (1, 1, 1, 8));
        assert_eq!(small.histogram().peak_live[0], 1);
        let q = small.alloc(l);
        assert_eq!(q.as_ptr() as usize, next, "refilled and handed out");
        assert_eq!((small.stats().allocations, small.histogram().peak_live[0]), (2, 2), "exact: no frees");
        // SAFETY: ours, each freed once.
        unsafe { [p, q].into_iter().for_each(|b| small.free(b)) };

        let small = config([64, 0, 0, 0, 0, 0, 0]);
        let p = small.alloc(l);
        // SAFETY: freed, then written through the stale pointer (the bug under test) into
        // memory the allocator still owns.
        unsafe {
            small.free(p);
            p.as_ptr().write(0);
        }
        assert!(matches!(small.try_alloc(l), Err(Error::UseAfterFree { .. })));
        let st = small.stats();
        assert_eq!((st.allocations, st.failures, st.live, st.peak), (1, 1, 0, 8));
        assert_eq!(small.histogram().peak_live[0], 1);
    }

    #[test]
    fn peak_is_exact_without_frees_and_bounded_with_them() {
        let small = config([256, 0, 0, 0, 0, 0, 0]);
        let l = Layout::new::<u64>();
        let mut live: Vec<_> = (0..10).map(|_| small.alloc(l)).collect();
        assert_eq!(small.histogram().peak_live[0], 10);
        // SAFETY: ours, each freed once.
        unsafe { live.drain(..5).for_each(|p| small.free(p)) };
        live.extend((0..3).map(|_| small.alloc(l)));
        // The true peak is 10; frees since the word was taken may be counted (up to 5).
        let peak = small.histogram().peak_live[0];
        assert!((10..=15).contains(&peak), "{peak}");
        // Filling the word starts a new bound: 64 slots of the first word, then 20 more.
        live.extend((0..76).map(|_| small.alloc(l)));
        assert_eq!(live.len(), 84);
        let peak = small.histogram().peak_live[0];
        assert!((84..=89).contains(&peak), "{peak}");
        // SAFETY: ours, each freed once.
        unsafe { live.into_iter().for_each(|p| small.free(p)) };
    }

    #[test]
    fn slots_left_by_an_exited_thread_count_once_in_the_peak() {
        let small = config([256, 0, 0, 0, 0, 0, 0]);
        let l = Layout::new::<u64>();
        let left: Vec<usize> = std::thread::scope(|s| {
            s.spawn(|| (0..100).map(|_| small.alloc(l).as_ptr() as usize).collect()).join().unwrap()
        });
        // The thread's peak counted them; as loose slots they used to count again (200).
        assert_eq!(small.histogram().peak_live[0], 100);
        for addr in left {
            // SAFETY: each came from `small` and is freed once.
            unsafe { small.free(NonNull::new(addr as *mut u8).unwrap()) };
        }
        assert_eq!(small.histogram().peak_live[0], 100);
        assert_eq!(small.stats().live, 0);
    }

    /// A thread that takes over a lane an exited thread left live slots in does not count
    /// them in its own peak: the exited thread's peak counted them already.
    #[test]
    fn slots_in_a_lane_taken_over_count_once_in_the_peak() {
        let small = config([128, 0, 0, 0, 0, 0, 0]); // two lanes of one word
        let l = Layout::new::<u64>();
        let left: Vec<usize> = std::thread::scope(|s| {
            s.spawn(|| (0..100).map(|_| small.alloc(l).as_ptr() as usize).collect()).join().unwrap()
        });
        // The only lane with a free slot holds 36 of the exited thread's slots.
        let mine = small.alloc(l);
        assert_eq!(small.stats().fallbacks, 0);
        assert_eq!(small.histogram().peak_live[0], 101, "no frees: exact");
        assert_eq!(small.stats().peak, 101 * 8);
        // SAFETY: each came from `small` and is freed once.
        unsafe {
            small.free(mine);
            left.into_iter().for_each(|addr| small.free(NonNull::new(addr as *mut u8).unwrap()));
        }
        assert_eq!(small.histogram().peak_live[0], 101);
    }

    /// The same after the exited thread freed some: the peaks of the two threads may add up
    /// past the true peak (100) only by what the second one allocated itself.
    #[test]
    fn slots_taken_over_after_frees_stay_within_the_bound() {
        let small = config([128, 0, 0, 0, 0, 0, 0]); // two lanes of one word
        let l = Layout::new::<u64>();
        let left: Vec<usize> = std::thread::scope(|s| {
            s.spawn(|| {
                let mut blocks: Vec<_> = (0..100).map(|_| small.alloc(l)).collect();
                // SAFETY: ours, each freed once.
                unsafe { blocks.drain(60..).for_each(|p| small.free(p)) };
                blocks.into_iter().map(|p| p.as_ptr() as usize).collect()
            })
            .join()
            .unwrap()
        });
        // The first lane holds the 60 left; the second is empty.
        let mine: Vec<_> = (0..4).map(|_| small.alloc(l)).collect();
        assert!(mine.iter().all(|p| p.as_ptr() as usize - small.region.addr() < 64 * 8));
        let peak = small.histogram().peak_live[0];
        assert!((100..=104).contains(&peak), "{peak}");
        // SAFETY: each came from `small` and is freed once.
        unsafe {
            mine.into_iter().for_each(|p| small.free(p));
            left.into_iter().for_each(|addr| small.free(NonNull::new(addr as *mut u8).unwrap()));
        }
        assert_eq!(small.stats().live, 0);
    }

    proptest! {
        #![proptest_config(crate::alloc::model_config())]
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
