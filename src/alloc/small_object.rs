//! [`SmallObjectAllocator`]: a fixed region of small slots tracked by one bit each, sized from
//! recorded statistics, with the system allocator as the fallback.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::fmt;
use std::ptr::NonNull;
use std::sync::{Arc, Weak};

use super::lane::{LaneCache, LaneCounts, Lanes, Taken};
use super::region::{self, Region, SystemBlock, MAX_ALIGN};
use super::shell::{self, Shell};
use super::small_object_config::{ClassFootprint, SizeHistogram, SmallObjectConfig, SMALL_OBJECT_CLASSES};
use super::stats::SharedCounters;
use super::thread_cache::{self, CacheEntry, Caches, Fast, LocalKey, SMALL_CACHES, SMALL_FAST};
use super::AllocStats;
use crate::sync::Mutex;
use crate::{Error, Result};

mod classes;

use self::classes::{ClassIndex, GranuleClass, LanesPtr, SmallClass, CLASS_ALIGN, GRANULES, RECORD_SHIFT};

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
///
/// Invariant: `class_counts[i]` points to `counts.0[i]`, which `counts` keeps alive (it is
/// never replaced) and nothing borrows mutably.
#[repr(C)]
pub(crate) struct SmallCache {
    classes: [LaneCache; 7],
    /// Per class, its counts in `counts`: the alloc's fast path counts through one load, not
    /// through the `Arc` and a second index.
    class_counts: [NonNull<LaneCounts>; 7],
    /// Per class: requests still to send straight to the system, set when a refill found no
    /// free slot in any of the class's words. A full class then costs a request that spills
    /// to the system what the system allocation costs, not a visit to every word of the
    /// class (6 µs a request with 3,125 words). Frees queued for the thread's lanes by other
    /// threads end the wait at once (the next refill applies them); slots the thread freed
    /// itself wait at most one request per word before they are used again. (The system
    /// refusing fails the request as any fallback does: `try_alloc`'s `OutOfMemory`.)
    dry: [u32; 7],
    counts: Arc<ThreadCounts>,
    id: u64,
    shared: Weak<Shared>,
}

// SAFETY: `ID_OFFSET` is `id`'s, which nothing changes after `new_cache`; the assertion
// keeps it inside `Closed`.
unsafe impl CacheEntry for SmallCache {
    const ID_OFFSET: usize = {
        let offset = std::mem::offset_of!(SmallCache, id);
        assert!(offset + 8 <= size_of::<thread_cache::Closed>());
        offset
    };

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
        f.debug_struct("SmallCache")
            .field("id", &self.id)
            .field("classes", &self.classes)
            .field("dry", &self.dry)
            .finish()
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
///   recognised and freed correctly. A thread that found a class full sends that class's
///   requests straight to the system for as many requests as the class has bitmap words,
///   then looks again: a full class costs a spilled request the system's allocation, not a
///   visit to every word.
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
    /// `log2` of the granule size (at least [`CLASS_ALIGN`]) less [`RECORD_SHIFT`]: an
    /// offset shifted right by it holds its granule's record's byte offset in
    /// `granule_class` (in its high bits).
    record_shift: u32,
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
        let mut classes: [SmallClass; 7] = std::array::from_fn(|i| {
            let slot_size = SMALL_OBJECT_CLASSES[i];
            let (start, end) = (offset, offset + bytes[i]);
            let first = start >> granule_shift;
            offset = region::align_up(end, 1 << granule_shift);
            let slots = config.slots[i] as u64;
            granule_of[first..offset >> granule_shift].fill(Some(i));
            let first = NonNull::dangling();
            SmallClass { slot_size, first, align: 1 << slot_size.trailing_zeros(), start, end, slots }
        });
        // No padding after the last class: the region ends with its last slot.
        let offset = classes.iter().filter(|c| c.slots > 0).map(|c| c.end).max().unwrap_or(0);
        let region = Region::new(offset);
        // `SmallClass`'s invariant (a class with slots lies inside the region).
        for c in classes.iter_mut().filter(|c| c.slots > 0) {
            // SAFETY: `c.start < c.end <= offset`, the region's length.
            c.first = unsafe { region.at(c.start) };
        }
        let shared = Arc::new(Shared {
            lanes: std::array::from_fn(|i| Lanes::new(config.slots[i], classes[i].start, classes[i].slot_size)),
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
            Some(i) => GranuleClass::new(Some(&classes[i]), i, &shared.lanes[i]),
            None => GranuleClass::new(None, 0, &shared.lanes[0]),
        });
        SmallObjectAllocator {
            region,
            classes,
            id: thread_cache::next_allocator_id(),
            route,
            route_lanes,
            record_shift: granule_shift - RECORD_SHIFT,
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
    // Always inlined: its fast path calls nothing, and inlined, its `Result` stays in
    // registers (left to the inliner, a benchmark loop called it and read the result back
    // from the stack).
    #[inline(always)]
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
                // counts: it calls nothing that could reach the thread cache again. And
                // `cache.classes[i]` is this allocator's cache of class `i`, which only the
                // class's `lanes` change.
                let fast = unsafe {
                    thread_cache::with_last_cache(self.id, |cache: &mut SmallCache| {
                        // SAFETY: `SmallCache`'s invariant: `counts` keeps them alive.
                        let counts = cache.class_counts[i].as_ref();
                        lanes.take_active_fast(&mut cache.classes[i], counts)
                    })
                };
                return match fast {
                    // SAFETY: this thread's lanes just took the slot.
                    Some(taken) => unsafe { self.hand_out_taken(i, taken) },
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

    /// The rest of [`try_alloc`](Self::try_alloc) for class `i`, once its fast path found no
    /// slot in a whole active word: the partial last word, another word or lane for this
    /// thread, the uncached path, and the system fallback.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout, i: usize) -> Result<NonNull<u8>> {
        match self.take_next_own(i) {
            // SAFETY: this thread just took the slot in its own lanes.
            Ok(slot) => unsafe { self.hand_out(i, slot) },
            Err(own_searched) => self.alloc_slower(layout, i, own_searched),
        }
    }

    /// The rest of [`alloc_slow`](Self::alloc_slow), kept out of it so that its common case
    /// needs no large stack frame. `own_searched`: as for [`take_slot`](Self::take_slot).
    #[cold]
    #[inline(never)]
    fn alloc_slower(&self, layout: Layout, i: usize, own_searched: bool) -> Result<NonNull<u8>> {
        self.take_slot(i, own_searched).unwrap_or_else(|| self.fallback(layout, Some(i)))
    }

    /// The common way into [`alloc_slow`](Self::alloc_slow): the active word ran full, and a
    /// slot of class `i` is taken from the next word of this thread's lanes, through the
    /// last-used cache without [`take_slot`](Self::take_slot)'s setup. `Err(true)` if every
    /// word of the thread's lanes was searched and none has a free slot; `Err(false)` if none
    /// was searched: this allocator's cache is not the last used, the class is dry (a search
    /// found nothing lately: see `SmallCache::dry`), or its lanes have queued frees. Take
    /// `take_slot` then.
    #[inline(always)]
    fn take_next_own(&self, i: usize) -> Result<usize, bool> {
        let lanes = &self.shared.lanes[i];
        // SAFETY: the closure only reads and writes bitmap words and this thread's counts:
        // it calls nothing that could reach the thread cache again. And `cache.classes[i]` is
        // this allocator's cache of class `i`, which only the class's `lanes` change.
        unsafe {
            thread_cache::with_last_cache(self.id, |cache: &mut SmallCache| {
                if cache.dry[i] != 0 {
                    return Some(Err(false));
                }
                Some(lanes.take_next_inline(&mut cache.classes[i], &cache.counts.0[i]))
            })
        }
        .unwrap_or(Err(false))
    }

    /// A slot of class `i` for this thread, from its active word, its other words or an
    /// unowned lane, or `None`: there is none, or the thread's cache says the class is dry
    /// (see `SmallCache::dry`). `own_searched`: the caller has just searched every word of
    /// the thread's lanes and found none free, so they are not searched again (unless queued
    /// frees come to them meanwhile: see [`Lanes::refill`]).
    fn take_slot(&self, i: usize, own_searched: bool) -> Option<Result<NonNull<u8>>> {
        let lanes = &self.shared.lanes[i];
        let cached = thread_cache::with_cache(
            self.id,
            || self.new_cache(),
            |cache| {
                if cache.dry[i] > 0 && !lanes.has_queued_for(&cache.classes[i]) {
                    cache.dry[i] -= 1;
                    return None;
                }
                let (dry, counts) = (&mut cache.dry[i], &cache.counts.0[i]);
                let cache = &mut cache.classes[i];
                // SAFETY: `cache` is this allocator's cache of class `i`, which only the
                // class's `lanes` change.
                let taken = if own_searched { None } else { unsafe { lanes.take_active(cache, counts) } };
                let found = match taken {
                    Some(slot) => (Some(slot), Vec::new()),
                    None => lanes.refill(cache, counts, own_searched),
                };
                if found.0.is_none() {
                    *dry = u32::try_from(lanes.words()).unwrap_or(u32::MAX);
                }
                Some(found)
            },
        );
        match cached {
            Some(Some((slot, raced))) => {
                if !raced.is_empty() {
                    self.shared.report_raced(i, raced);
                }
                // SAFETY: this thread just took the slot in its own lanes.
                slot.map(|slot| unsafe { self.hand_out(i, slot) })
            }
            Some(None) => None,
            // No cache to use (the thread's locals are gone): a slot of an unowned lane,
            // checked under the class's lock before it is taken.
            // SAFETY: `take_unowned` passes free slots of an unowned lane, under the class's
            // lock (the lane's writer), so nobody takes them meanwhile.
            None => match lanes.take_unowned(|slot| unsafe { self.intact_or_refilled(i, slot) }) {
                Ok(slot) => slot.map(|slot| Ok(self.slot_ptr(i, slot))),
                Err(slot) => Some(Err(self.refused(self.slot_ptr(i, slot)))),
            },
        }
    }

    /// Whether free slot `slot` of class `i` still holds its fill (always, in release
    /// builds); if not, it is refilled.
    ///
    /// # Safety
    ///
    /// The slot is free, and the caller keeps anyone else from taking it meanwhile.
    unsafe fn intact_or_refilled(&self, i: usize, slot: usize) -> bool {
        let (ptr, len) = (self.slot_ptr(i, slot), self.classes[i].slot_size);
        // SAFETY: the caller's contract: nobody references the slot's bytes, initialised by
        // the region's fill or the last free's.
        unsafe {
            if region::freed_intact(ptr, len) {
                return true;
            }
            region::fill_freed(ptr, len);
        }
        false
    }

    /// Slot `slot` of class `i`, with the region's provenance.
    ///
    /// # Panics
    ///
    /// Panics if `slot` is not one of the class's slots (callers pass slots its lanes handed
    /// out, so it never does).
    #[inline(always)]
    fn slot_ptr(&self, i: usize, slot: usize) -> NonNull<u8> {
        let class = &self.classes[i];
        // Checked in every build, so this safe function is sound on its own: the paths that
        // call it are off the fast path (which takes its offset from the thread's cache).
        assert!((slot as u64) < class.slots, "slot {slot} of class {i}");
        // SAFETY: `first` is the region's pointer at the class's start (`SmallClass`'s
        // invariant), and the class's `slots` slots lie inside the region.
        unsafe { class.first.add(slot * class.slot_size) }
    }

    /// A new thread cache for this allocator, its counts registered.
    fn new_cache(&self) -> SmallCache {
        let counts = Arc::new(ThreadCounts::default());
        self.shared.threads.lock().push(Arc::clone(&counts));
        SmallCache {
            id: self.id,
            shared: Arc::downgrade(&self.shared),
            // The invariant: into `counts`, moved in beside them.
            class_counts: std::array::from_fn(|i| NonNull::from(&counts.0[i])),
            counts,
            classes: Default::default(),
            dry: [0; 7],
        }
    }

    /// Returns slot `slot` of class `i`, just taken by this thread in its own lanes, after
    /// the use-after-free check.
    ///
    /// # Safety
    ///
    /// As for [`checked`](Self::checked).
    #[inline(always)]
    unsafe fn hand_out(&self, i: usize, slot: usize) -> Result<NonNull<u8>> {
        // SAFETY: the caller's contract; `slot_ptr` gives the slot's address.
        unsafe { self.checked(i, slot, self.slot_ptr(i, slot)) }
    }

    /// [`hand_out`](Self::hand_out) for a slot the fast path took, whose region offset it
    /// found with no multiply by the slot's index.
    ///
    /// # Safety
    ///
    /// As for [`checked`](Self::checked), for the slot `taken` names, which this thread's
    /// lanes of class `i` just took.
    #[inline(always)]
    unsafe fn hand_out_taken(&self, i: usize, taken: Taken) -> Result<NonNull<u8>> {
        // SAFETY: `taken.at` is the offset of one of the class's slots (its lanes handed it
        // out: see `Taken`), so inside the region.
        let ptr = unsafe { self.region.at(taken.at) };
        debug_assert_eq!(ptr, self.slot_ptr(i, taken.slot), "the offset of slot {} of class {i}", taken.slot);
        // SAFETY: the caller's contract.
        unsafe { self.checked(i, taken.slot, ptr) }
    }

    /// Returns `ptr`, slot `slot` of class `i`, after the use-after-free check.
    ///
    /// # Safety
    ///
    /// `ptr` is slot `slot` of class `i`, which the calling thread just took (it was free,
    /// and nobody else references it) and hands to nobody else.
    #[inline(always)]
    unsafe fn checked(&self, i: usize, slot: usize, ptr: NonNull<u8>) -> Result<NonNull<u8>> {
        // SAFETY: the slot was free until just now (the caller): `slot_size` bytes nobody references,
        // initialised by the region's fill or the last free's.
        if !unsafe { region::freed_intact(ptr, self.classes[i].slot_size) } {
            // SAFETY: as above: the slot was just taken, and is handed to nobody yet.
            return Err(unsafe { self.corrupted(i, slot, ptr) });
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
        // SAFETY: forwarded contract.
        unsafe { shell::try_free_fast_first(self, ptr) }
    }

    /// The common case of [`try_free`](Self::try_free), inlined into its callers: `ptr` is a
    /// handed-out slot of a whole bitmap word, in a lane this thread owns with no queued
    /// frees. Frees it and returns
    /// `true`; otherwise returns `false` having changed nothing, and
    /// [`free_checked`](Self::free_checked) does the whole free. Kept apart so that the
    /// caller's fast path builds no error and needs no stack frame.
    ///
    /// # Safety
    ///
    /// As `try_free`.
    #[inline(always)]
    unsafe fn free_owned_fast(&self, ptr: NonNull<u8>) -> bool {
        let Some((class, slot, offset)) = self.locate_whole(ptr) else { return false };
        let i = class.class.get();
        // SAFETY: `class` is one of `self.granule_class`, so its pointer is `self`'s.
        let lanes = unsafe { class.lanes.get(self) };
        // SAFETY: the closure only reads and writes bitmap words and this thread's counts,
        // and writes the debug fill: it calls nothing that could reach the thread cache again.
        // And `slot` is below the record's `whole_slots`, so (`GranuleClass`'s invariant) in a
        // whole word of `lanes`' bitmap, as `free_owned_fast` asks. The fill's contract:
        // `offset` is slot `slot`'s (`locate_whole`), the lanes run the fill only once they
        // found the slot handed out, and by the forwarded contract the caller no longer uses
        // it.
        let freed = unsafe {
            thread_cache::with_last_cache(self.id, |cache: &mut SmallCache| {
                Some(lanes.free_owned_fast(&mut cache.classes[i], slot, move || self.fill_slot(i, offset)))
            })
        };
        freed == Some(true)
    }

    /// [`try_free`](Self::try_free) from the start, for every case the fast path leaves: a
    /// lane this thread does not own or with queued frees, the partial last word, a fallback
    /// block, and every bad free.
    ///
    /// # Safety
    ///
    /// As `try_free`.
    #[cold]
    #[inline(never)]
    unsafe fn free_checked(&self, ptr: NonNull<u8>) -> Result<()> {
        let Some((class, slot, offset)) = self.locate(ptr) else {
            // SAFETY: forwarded contract.
            return unsafe { self.not_a_slot(ptr) };
        };
        // SAFETY: `offset` is slot `slot`'s (`locate`), and the forwarded contract is
        // `try_free`'s.
        let own = unsafe { self.free_in_own_lane(class, slot, offset) };
        match own {
            Some(Ok(())) => Ok(()),
            Some(Err(())) => Err(Error::DoubleFree { addr: ptr.as_ptr() as usize }),
            // SAFETY: as above.
            None => unsafe { self.free_slow(class.class.get(), slot, offset) },
        }
    }

    /// Where `ptr` lies if it starts a slot (handed out or not): its class's record, the slot
    /// and the region offset.
    #[inline(always)]
    fn locate(&self, ptr: NonNull<u8>) -> Option<(&GranuleClass, usize, usize)> {
        let (class, slot, offset) = self.granule_slot(ptr);
        // Also past the region's end (in its last granule, or in a granule past it).
        (slot < class.slots()).then_some((class, slot as usize, offset))
    }

    /// [`locate`](Self::locate) for the free's fast path: only the slots of whole bitmap
    /// words (below the record's `whole_slots`); `None` for the rest too.
    #[inline(always)]
    fn locate_whole(&self, ptr: NonNull<u8>) -> Option<(&GranuleClass, usize, usize)> {
        let (class, slot, offset) = self.granule_slot(ptr);
        (slot < u64::from(class.whole_slots)).then_some((class, slot as usize, offset))
    }

    /// The record of `ptr`'s granule, `ptr`'s slot in its class by
    /// [`slot_of`](GranuleClass::slot_of) (at least `2^32` if `ptr` starts no slot of it),
    /// and its region offset.
    ///
    /// Past the granule table, the granule number wraps around it (a mask, not a bounds
    /// check), and the slot is at least the class's slot count all the same: `slot_of` is
    /// below it only for `offset = start + q × size` with `q` below it, an offset inside the
    /// class and so inside the table.
    #[inline(always)]
    fn granule_slot(&self, ptr: NonNull<u8>) -> (&GranuleClass, u64, usize) {
        // Below the region, the offset wraps to far past it.
        let offset = (ptr.as_ptr() as usize).wrapping_sub(self.region.addr());
        // The granule number times the record's size, masked to the table, divided again:
        // written so, the compiler indexes with the masked byte offset and shifts once.
        let at = (offset >> self.record_shift) & ((GRANULES - 1) << RECORD_SHIFT);
        let class = &self.granule_class[at >> RECORD_SHIFT];
        (class, class.slot_of(offset), offset)
    }

    /// Frees slot `slot` of `class` (at `offset`) if its lane is this thread's and has no
    /// queued frees: `Err` if the slot is free already, `None` for another lane.
    ///
    /// # Safety
    ///
    /// `offset` is the region offset of slot `slot` of `class`, and `try_free`'s contract
    /// holds for that slot.
    #[inline(always)]
    unsafe fn free_in_own_lane(&self, class: &GranuleClass, slot: usize, offset: usize) -> Option<Result<(), ()>> {
        let i = class.class.get();
        // SAFETY: `class` is one of `self.granule_class` (from `locate`), so its pointer is
        // `self`'s.
        let lanes = unsafe { class.lanes.get(self) };
        // SAFETY: the closure only reads and writes bitmap words and this thread's counts,
        // and writes the debug fill: it calls nothing that could reach the thread cache again.
        // The fill's contract: the lanes run it only once they found the slot handed out; the
        // rest is the forwarded contract.
        unsafe {
            thread_cache::with_last_cache(self.id, |cache: &mut SmallCache| {
                lanes.free_owned(&mut cache.classes[i], slot, move || self.fill_slot(i, offset))
            })
        }
    }

    /// Writes the debug fill over the slot of class `i` at `offset`, being freed.
    ///
    /// # Safety
    ///
    /// `offset` is the region offset of a slot of class `i` that was handed out and that
    /// nobody uses any more (`try_free`'s checks passed, and its caller's contract).
    #[inline(always)]
    unsafe fn fill_slot(&self, i: usize, offset: usize) {
        // SAFETY: the caller's contract: the slot lies inside the region and nobody uses
        // it. The fill goes through the region's own
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
    ///
    /// # Safety
    ///
    /// As [`free_in_own_lane`](Self::free_in_own_lane), for slot `slot` of class `i`.
    #[cold]
    #[inline(never)]
    unsafe fn free_slow(&self, i: usize, slot: usize, offset: usize) -> Result<()> {
        let lanes = &self.shared.lanes[i];
        // SAFETY: the lanes run the fill only once they found the slot handed out; the rest
        // is the caller's contract.
        let fill = || unsafe { self.fill_slot(i, offset) };
        let (freed, raced) = thread_cache::with_cache(
            self.id,
            || self.new_cache(),
            |cache| lanes.free_shared(Some(&mut cache.classes[i]), slot, fill),
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
    ///
    /// # Safety
    ///
    /// `ptr` is slot `slot` of class `i`, just taken and handed to nobody.
    #[cold]
    #[inline(never)]
    unsafe fn corrupted(&self, i: usize, slot: usize, ptr: NonNull<u8>) -> Error {
        // SAFETY: the caller's contract: nobody references the slot.
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
        unsafe { self.free_checked(ptr) }
    }

    #[inline(always)]
    unsafe fn free_fast(&self, ptr: NonNull<u8>) -> bool {
        // SAFETY: forwarded contract.
        unsafe { self.free_owned_fast(ptr) }
    }
}

shell::impl_allocator!(SmallObjectAllocator);

#[cfg(test)]
mod tests;
