//! One type's object store: a generational slot map over never-moving segments.
//!
//! Segment `k` holds `base << k` slots (laid out as `layout.rs` says) and is
//! allocated once, when the store first needs it, and never moved or freed
//! while the store lives. Handles can therefore point straight at their slot.
//! Free slots form a list threaded through their header words; `create` pops it with one CAS (no lock), a
//! [`Loader`](super::Loader) pops it under the store's `free_lock` (when its
//! thread's shard of freed slots, `loader_slots.rs`, is empty), and only
//! collection, which holds `&mut ObjectManager`, pushes onto it (one chain per
//! collection, under the same lock). So pops never race a push: no ABA.
//! The slots a collection frees go first to the shards of the threads that
//! create through loaders (`loader_slots.rs`), as many as each made since
//! the last collection, and the rest are kept for the owner thread, whose
//! creates pop them with plain loads and stores; the next collection
//! pushes what the owner did not use. Never-used slots come from raising
//! `len`, by the owner thread a run at a time (both in `owner_slots.rs`), and
//! by `create_many` a run per batch (`store/batch.rs`). Collection, which
//! destroys the dead and frees their slots, is in `store/collect.rs`.

mod batch;
mod collect;

use std::alloc::Layout;
use std::any::Any;
use std::collections::HashMap;
use std::panic::Location;
use std::ptr::{self, NonNull};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use allocator_api2::alloc::Allocator;

use crate::sync::{AtomicPtr, AtomicU32, AtomicU64, Mutex, Ordering};
use crate::track::StackTrace;
use crate::Error;

use self::collect::SlotChain;
use super::creation_sites::CreationSites;
use super::handle::HandleTag;
use super::index_space::{IndexSpace, MAX_INDEX};
use super::layout::{
    allocate_segment, free_segment, init_vacant, locate, segment_first, segment_len, Chunks, SegmentOwner, MAX_SEGMENTS,
};
use super::loader_slots::LoaderSlots;
use super::owner_counts::RESERVE_COUNT;
use super::owner_slots::{Chain, OwnerSlots, RUN};
use super::reentry::NamedMutex;
use super::report::TypeReport;
use super::shared::{StoreShared, DEAD_LANES};
use super::slot::{Slot, SlotHeader, SlotState, GENERATION_LIMIT, LINK_FLAG, NIL};
use super::store_alloc::StoreAlloc;
use super::tracking::Tracking;
use super::{CollectStats, Destroyed, Handle, HandleOrigin, LeakEntry, MMObject, ObjectKey};

/// About how many bytes of never-used slots get their headers written at a
/// time (see `Store::initialize_to`): small enough to stay in a core's cache
/// until `create` writes the objects, large enough that the lock it takes
/// is rare.
const INIT_BYTES: usize = 2 << 10;

/// A store's configuration, fixed at creation.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StoreConfig {
    pub(crate) manager_id: u32,
    pub(crate) store_index: u32,
    pub(crate) base_bits: u32,
    pub(crate) max_objects: u32,
    /// The generation new slots start at (even, below [`GENERATION_LIMIT`]).
    pub(crate) first_generation: u32,
    /// The owner thread's token (see `owner_counts.rs`), or 0 for none.
    pub(crate) owner: u64,
    /// Where to report the type's bytes, if anywhere.
    pub(crate) tracker: Option<&'static crate::track::Tracker>,
}

/// The objects of one type.
///
/// # Invariants
///
/// - `shared` was allocated from `alloc` with `Layout::new::<StoreShared>()`
///   and is freed in `Drop` unless `leaked` is set. It is never freed while a
///   handle into the store exists: `leaked` is set from the start of shutdown
///   until `settle` finds no handle left, and before shutdown the registry
///   (which the manager holds) keeps the store.
/// - `segments[k]` is null or the base of a segment of `segment_len(k)`
///   slots, with chunk headers naming this store, allocated from `alloc` by
///   [`allocate_segment`]; once published it never changes. Everything the
///   store allocates goes back to `alloc`, the same allocator, unless
///   `leaked` is set.
/// - The slots below `initialized` have headers (written vacant by
///   [`init_vacant`], under `init_lock`, published by its `Release` store);
///   the others were never written and nothing reads them. `len <=
///   initialized`, both only grow, and `initialized` lies in the segment of
///   `len` or at its end. So a slot below `len` (read with `Acquire`) is
///   initialised: every reader of a slot it did not take itself checks its
///   index against `len` first ([`used_slot`](Store::used_slot)).
/// - Every local index below `len` names a slot that is occupied, on the dead
///   list, on the free list (or is about to be, inside `create`), retired
///   (generation [`GENERATION_LIMIT`] and word `LINK_FLAG | NIL`, counted in
///   `retired`), held for the owner thread, in its run of fresh slots or
///   its chain of kept ones (`owner_slots`, counted in its `left`), held for
///   loader threads (`loader_slots`, counted in its `held`), or
///   returned by a batch that did not fill them (on `returned_head`, counted
///   in `returned`, vacant and never used). `len` only grows, and only over
///   slots of published segments.
/// - The store is only ever borrowed shared (see `registry.rs`). The free
///   list is popped by `create` with a CAS while the manager is borrowed
///   shared, and by loaders at any time, under `free_lock`; it is pushed only
///   by collection, which holds `&mut ObjectManager` (so no `create` runs)
///   and takes `free_lock` for the push (so no loader pops meanwhile).
/// - While `iterating` is non-zero, new objects take never-used slots (past
///   every iterator's end) instead of free ones, so an iteration never
///   yields an object created after it began by a thread that saw it begin
///   (a loader's create that read zero just before may still take a free
///   slot the iteration reaches). It is reset under
///   `&mut ObjectManager`, where no iterator can be alive (a forgotten one
///   only costs fresh slots until then).
/// - The free list's length is the high half of `free_head`, kept in the same
///   word as its head so that a pop updates both with its one CAS. Objects
///   created and not yet destroyed are therefore
///   `len` less the free list's length, `retired`, `destroyed_in_place`,
///   `owner_slots.left()`, `loader_slots.held()` and `returned`, with no
///   counter on `create`.
pub(crate) struct Store<T> {
    shared: NonNull<StoreShared>,
    segments: [AtomicPtr<u8>; MAX_SEGMENTS],
    /// The numbered creation sites of the store's objects.
    sites: CreationSites,
    /// The segments hold `T`s behind untyped pointers: the store owns them,
    /// and is invariant in `T` as its handles are.
    _type: std::marker::PhantomData<fn(T) -> T>,
    /// Low 32 bits: the free list's head (a local index, or [`NIL`]); high 32 bits: its length.
    free_head: AtomicU64,
    len: AtomicU32,
    /// Slots whose headers are written (see the invariants).
    initialized: AtomicU32,
    /// The slots held for the owner thread: a run of never-used ones and
    /// those the last collection kept (see `owner_slots.rs`).
    owner_slots: OwnerSlots,
    /// Freed slots handed to loader threads (see `loader_slots.rs`).
    loader_slots: LoaderSlots,
    destroyed: AtomicU64,
    /// Objects destroyed by `destroy_all`, whose slots never return to the free list.
    destroyed_in_place: AtomicU64,
    /// Slots retired because their generation reached [`GENERATION_LIMIT`].
    retired: AtomicU64,
    /// Never-used slots a batch took and did not fill (see `batch.rs`), on
    /// their way to the free list: a stack linked through the slots' words,
    /// pushed by any `create_many`, taken whole by the next collection.
    returned_head: AtomicU32,
    /// How many slots `returned_head` holds (added before a push, taken off
    /// after the collection moved them).
    returned: AtomicU64,
    peak_resident: AtomicU64,
    grow_lock: NamedMutex<()>,
    /// Taken to write never-used slots' headers (see the invariants). Not
    /// `grow_lock`, which is held while the store allocator runs: an
    /// allocator that creates objects of this type while the next segment
    /// grows still can.
    init_lock: Mutex<()>,
    /// Taken by loaders to pop, and by collection to push (see the invariants).
    free_lock: Mutex<()>,
    /// Live iterators over this store (see the invariants).
    iterating: AtomicU32,
    index_space: Arc<IndexSpace>,
    config: StoreConfig,
    tracking: Option<Tracking>,
    /// Called with each object just before collection drops it.
    on_destroy: Mutex<Option<DestroyHook<T>>>,
    alloc: StoreAlloc,
    leaked: AtomicBool,
    /// What every handle to this store carries beside its slot's address:
    /// [`HandleTag::of`] any of its slots (made from the values its chunk
    /// headers copy), kept so that `create` does not read a chunk header.
    tag: HandleTag,
}

/// A per-type destroy callback: see [`ObjectManager::on_destroy`](super::ObjectManager::on_destroy).
pub(crate) type DestroyHook<T> = Box<dyn FnMut(ObjectKey, &mut T) + Send>;

/// A vacant slot this thread took for a `create`: its local index and its
/// pointer.
///
/// # Invariants
///
/// `slot` is slot `local` of a published segment of the store that made it,
/// with the segment's provenance, and the thread holding it took it from a
/// list or from `len`: no other thread uses it until its generation is
/// published.
struct VacantSlot<T> {
    local: u32,
    slot: NonNull<Slot<T>>,
}

/// Where `create` may take a used slot from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotSource {
    /// A create through `&ObjectManager`: no collection can run, so the free
    /// list is popped without its lock.
    Manager,
    /// A create through a loader, which may run during a collection: the free
    /// list is popped under `free_lock`.
    Loader,
}

// The store owns `T`s: it hands out `&T` to any thread holding `&self` and
// drops them on the thread holding `&mut ObjectManager`. Its own shared state
// is atomic or behind a lock, and the destroy hook is `Send` and called under
// its lock. So a `T` holding an `Rc` (neither `Send` nor `Sync`) is refused.
// SAFETY: `T: Send` (values are dropped on another thread) + `T: Sync` (`&T` is shared).
unsafe impl<T: Send + Sync> Send for Store<T> {}
// SAFETY: `T: Sync` (`&Store<T>` gives `&T`) + `T: Send` (it creates `T`s other threads drop).
unsafe impl<T: Send + Sync> Sync for Store<T> {}

/// The outcome of the shutdown pass over one store.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Settled {
    /// Slots still referenced from outside the manager.
    pub(crate) outliving: usize,
    /// Bytes of segment memory left allocated on purpose.
    pub(crate) leaked_bytes: usize,
    /// Of `outliving`, the slots the owner thread held counts on, at a
    /// shutdown elsewhere: perhaps held by no handle at all.
    pub(crate) owner_reserved: usize,
}

impl<T: MMObject> Store<T> {
    /// A store whose memory comes from `alloc`.
    ///
    /// # Errors
    ///
    /// [`Error::StoreOutOfMemory`] if `alloc` refuses the store's shared
    /// part or its creation-site table.
    pub(crate) fn new(config: StoreConfig, index_space: Arc<IndexSpace>, alloc: StoreAlloc) -> Result<Self, Error> {
        let sites = CreationSites::new(alloc.clone(), T::TYPE_NAME)?;
        let shared = StoreShared::new(
            config.manager_id,
            config.store_index,
            config.base_bits,
            T::TYPE_NAME,
            T::may_hold_handles(),
            config.owner,
            alloc.clone(),
        );
        let layout = Layout::new::<StoreShared>();
        let memory = alloc.allocate(layout).map_err(|_| Error::StoreOutOfMemory {
            type_name: T::TYPE_NAME,
            part: "its shared header",
            bytes: layout.size(),
            allocator: alloc.name(),
        })?;
        let shared_cyclable = shared.cyclable;
        let shared_ptr = memory.cast::<StoreShared>();
        // SAFETY: `memory` is fresh, valid for `layout` (size and alignment of
        // a `StoreShared`) and not aliased.
        unsafe { shared_ptr.as_ptr().write(shared) };
        Ok(Store {
            shared: shared_ptr,
            segments: std::array::from_fn(|_| AtomicPtr::new(ptr::null_mut())),
            sites,
            _type: std::marker::PhantomData,
            free_head: AtomicU64::new(free_word(NIL, 0)),
            len: AtomicU32::new(0),
            initialized: AtomicU32::new(0),
            owner_slots: OwnerSlots::new(config.max_objects >= MAX_INDEX),
            loader_slots: LoaderSlots::new(config.max_objects >= MAX_INDEX),
            destroyed: AtomicU64::new(0),
            destroyed_in_place: AtomicU64::new(0),
            retired: AtomicU64::new(0),
            returned_head: AtomicU32::new(NIL),
            returned: AtomicU64::new(0),
            peak_resident: AtomicU64::new(0),
            grow_lock: NamedMutex::new((), "growing the store of", T::TYPE_NAME),
            init_lock: Mutex::new(()),
            free_lock: Mutex::new(()),
            iterating: AtomicU32::new(0),
            index_space,
            tracking: config.tracker.map(|tracker| Tracking::new(tracker, T::TAG, alloc.clone())),
            on_destroy: Mutex::new(None),
            config,
            alloc,
            leaked: AtomicBool::new(false),
            // What every chunk header of this store will say (`allocate_segment`).
            tag: HandleTag::new(config.manager_id, shared_cyclable, config.owner),
        })
    }

    #[inline]
    pub(crate) fn shared(&self) -> &StoreShared {
        // SAFETY: `shared` is valid for the store's whole life (type invariant).
        unsafe { self.shared.as_ref() }
    }

    /// The slot `local`, if its header was ever written. Every slot this
    /// store handed out (below `len`, as every slot on its lists is) has
    /// one; an index from outside, such as a key's, goes through
    /// [`used_slot`](Self::used_slot), which also refuses slots never handed out.
    #[inline]
    pub(crate) fn slot(&self, local: u32) -> Option<&Slot<T>> {
        // `Acquire`: pairs with `initialize_to`'s `Release`, so the header is
        // visible. Checked, not assumed, so that no caller's mistake makes a
        // reference to memory never written.
        if local >= self.initialized.load(Ordering::Acquire) {
            return None;
        }
        // SAFETY: slots below `initialized` lie in published segments and
        // have headers (invariants), and a published segment lives as long
        // as the store.
        self.slot_ptr(local).map(|slot| unsafe { slot.as_ref() })
    }

    /// The slot `local`, if the store ever handed it out: an index from
    /// outside (a key's, a raw handle's), checked against `len`.
    #[inline]
    pub(crate) fn used_slot(&self, local: u32) -> Option<&Slot<T>> {
        // `Acquire`: pairs with `raise_len`'s `Release`, so the slot's header is visible.
        if local >= self.len.load(Ordering::Acquire) {
            return None;
        }
        self.slot(local)
    }

    /// A pointer to the slot `local`, if its segment exists. It carries the
    /// whole segment's provenance (it is made from the segment's base, not
    /// from a reference to the slot), so a [`Handle`](super::Handle) made
    /// from it may read its chunk header.
    #[inline]
    pub(crate) fn slot_ptr(&self, local: u32) -> Option<NonNull<Slot<T>>> {
        if local >= MAX_INDEX {
            return None;
        }
        let (segment, offset) = locate(local, self.config.base_bits);
        let base = NonNull::new(self.segments[segment].load(Ordering::Acquire))?;
        // SAFETY: a published segment holds `segment_len(segment)` slots and
        // `offset` is below that by construction of `locate`.
        Some(unsafe { Chunks::slot(base, offset) })
    }

    /// The slot `local` (as [`slot_ptr`](Self::slot_ptr) gives it) and how
    /// many slots lie contiguously up to it (from the start of its chunk,
    /// itself included), if its segment exists.
    ///
    /// # Safety
    ///
    /// Slot `local`'s header was written (it is below `initialized`, as
    /// every slot this store handed out is), so every slot of the run, which
    /// lie below it, may be read. Not checked: it is the collection's step
    /// to a dead object, where the load and compare were 1 % of a frame.
    #[inline]
    unsafe fn slot_run_back(&self, local: u32) -> Option<(NonNull<Slot<T>>, u32)> {
        debug_assert!(local < self.initialized.load(Ordering::Relaxed));
        if local >= MAX_INDEX {
            return None;
        }
        let (segment, offset) = locate(local, self.config.base_bits);
        let base = NonNull::new(self.segments[segment].load(Ordering::Acquire))?;
        // SAFETY: a published segment holds `segment_len(segment)` slots and
        // `offset` is below that by construction of `locate`.
        Some(unsafe { Chunks::run_back(base, offset) })
    }

    /// The creation site of the occupied slot `local`.
    ///
    /// # Safety
    ///
    /// The slot's generation must have been read as odd (with `Acquire`).
    pub(crate) unsafe fn site(&self, local: u32) -> &'static Location<'static> {
        let slot = self.slot(local).expect("an occupied slot's segment is published");
        // Written before the generation was published (caller).
        self.sites.site(slot.header.site.load(Ordering::Relaxed)).unwrap_or_else(unknown_site)
    }

    /// The link to the tracker, if the manager has one.
    pub(crate) fn tracking(&self) -> Option<&Tracking> {
        self.tracking.as_ref()
    }

    /// This store's log2 of the first segment's slot count.
    #[inline]
    pub(crate) fn base_bits(&self) -> u32 {
        self.config.base_bits
    }

    /// `create`'s common case as one step: `value` in a slot taken with
    /// plain loads and stores, and its first handle; or the value back, for
    /// [`try_insert`](Self::try_insert).
    ///
    /// The common case: the owner thread, no tracker, no iterator running,
    /// and a slot kept for the owner, or, with the free list empty, one of
    /// the owner's run of fresh ones. It is inlined into every `create`, so
    /// it holds nothing else: popping the free list (a compare-exchange),
    /// other threads' creates and refilling the run are in `try_insert`,
    /// out of line.
    #[inline(always)]
    pub(crate) fn try_create_common(&self, value: T, site: &'static Location<'static>) -> Result<Handle<T>, T> {
        if self.tracking.is_some() || self.iterating.load(Ordering::Relaxed) != 0 || !self.owner_slots.is_owner() {
            return Err(value);
        }
        // SAFETY: this thread is the owner (for `take_run` below too;
        // checked above).
        let vacant = match unsafe { self.take_kept() } {
            Some(vacant) => vacant,
            // Freed slots first: the run only once the free list is empty.
            // (`Relaxed`: nothing is read through it; a stale answer costs
            // at most the general path or one fresh slot.)
            // SAFETY: as above.
            None if split_free(self.free_head.load(Ordering::Relaxed)).0 == NIL => match unsafe { self.take_run() } {
                Some(vacant) => vacant,
                None => return Err(value),
            },
            None => return Err(value),
        };
        let slot = self.place_vacant(vacant, value, site);
        // SAFETY: `place_vacant` returns an occupied slot of this store with a count
        // of one, which the new handle takes over; `tag` is this store's.
        Ok(unsafe { Handle::from_counted_tagged(slot, self.tag, HandleOrigin::Created, site) })
    }

    /// Puts `value` in a free slot, with a count of one, and returns the
    /// slot: every case, where [`try_create_common`](Self::try_create_common)
    /// takes only the common one.
    ///
    /// With a tracker, the value's `size()` is charged to its tag first;
    /// `strict` refuses anything over the tag's budget (see [`Tracking::charge`]).
    #[inline(never)]
    pub(crate) fn try_insert(
        &self,
        value: T,
        site: &'static Location<'static>,
        strict: bool,
        source: SlotSource,
    ) -> Result<NonNull<Slot<T>>, (T, Error)> {
        // Credited back if `create` does not get as far as the slot: an
        // error, or a panic in the store allocator while the store grows.
        let charged = match &self.tracking {
            Some(tracking) => match tracking.charge(value.size(), std::mem::size_of::<T>(), strict) {
                Ok(charged) => Some(charged),
                Err(error) => return Err((value, error)),
            },
            None => None,
        };
        let reused = match source {
            _ if self.iterating.load(Ordering::Relaxed) > 0 => None,
            // SAFETY: `owner` is whether this thread is the owner.
            SlotSource::Manager => unsafe { self.pop_reused(self.owner_slots.is_owner()) },
            SlotSource::Loader => self.pop_for_loader(),
        };
        let vacant = match reused {
            Some(vacant) => vacant,
            None => match self.take_fresh(source) {
                Ok(vacant) => vacant,
                Err(error) => return Err((value, error)),
            },
        };
        if let Some(charged) = charged {
            charged.place(vacant.local);
        }
        Ok(self.place_vacant(vacant, value, site))
    }

    /// Slot `local`, which the caller just took from the owner's run or from
    /// `len`, with its pointer.
    #[inline(always)]
    fn vacant(&self, local: u32) -> VacantSlot<T> {
        VacantSlot { local, slot: self.slot_ptr(local).expect("an allocated slot's segment is published") }
    }

    /// Makes `value`, created at `site`, the object in the slot the caller
    /// took, with a count of one, and returns the slot.
    #[inline(always)]
    fn place_vacant(&self, vacant: VacantSlot<T>, value: T, site: &'static Location<'static>) -> NonNull<Slot<T>> {
        // SAFETY: a `VacantSlot` is a slot of a published segment of this
        // store, with its provenance, that this thread took (type invariants).
        unsafe { self.place_at(vacant.slot, value, self.sites.number(site)) }
    }

    /// [`place_vacant`](Self::place_vacant) with the creation site's number already found.
    ///
    /// # Safety
    ///
    /// `slot_ptr` is a slot of one of this store's published segments, with
    /// the segment's provenance, that the caller popped from the free list
    /// or took from `len` (so no other thread uses it).
    #[inline(always)]
    unsafe fn place_at(&self, slot_ptr: NonNull<Slot<T>>, value: T, site_number: u32) -> NonNull<Slot<T>> {
        // SAFETY: a published segment's slots are initialised and live as long as the store.
        let slot = unsafe { slot_ptr.as_ref() };
        // SAFETY: the slot was popped from the free list or freshly bumped, so
        // this thread owns it exclusively until it publishes the generation below.
        unsafe { slot.write_value(value) };
        slot.header.site.store(site_number, Ordering::Relaxed);
        slot.header.word.store(1, Ordering::Relaxed);
        let generation = slot.header.generation.load(Ordering::Relaxed).wrapping_add(1);
        debug_assert!(generation & 1 == 1, "a vacant slot's generation is even");
        // Release: readers that see the odd generation see the value and count.
        slot.header.generation.store(generation, Ordering::Release);
        slot_ptr
    }

    /// Takes a freed slot: on the owner thread (`owner`) one the last
    /// collection kept for it (plain loads and stores), else one from the
    /// free list. Its pointer comes with it: finding it from the index is
    /// a dozen instructions, which the pop has already spent.
    ///
    /// # Safety
    ///
    /// If `owner`, the calling thread is the owner.
    #[inline(always)]
    unsafe fn pop_reused(&self, owner: bool) -> Option<VacantSlot<T>> {
        if owner {
            // SAFETY: the caller's contract.
            if let Some(vacant) = unsafe { self.take_kept() } {
                return Some(vacant);
            }
        }
        self.pop_free()
    }

    /// The first of the slots kept for the owner, if any.
    ///
    /// # Safety
    ///
    /// The calling thread is the owner (`OwnerSlots::is_owner`).
    #[inline(always)]
    unsafe fn take_kept(&self) -> Option<VacantSlot<T>> {
        // SAFETY: the caller's contract.
        let (local, slot) = unsafe { self.owner_slots.take_kept(|head| self.read_link(head)) }?;
        Some(VacantSlot { local, slot })
    }

    /// A held slot's link (the next slot of its chain) and its pointer.
    #[inline(always)]
    fn read_link(&self, local: u32) -> (u32, NonNull<Slot<T>>) {
        let slot = self.slot_ptr(local).expect("held slots live in published segments");
        // SAFETY: a published segment's slots are initialised and live as long as the store.
        (unsafe { slot.as_ref() }.header.word.load(Ordering::Relaxed) & !LINK_FLAG, slot)
    }

    /// Takes a freed slot for a loader: from the calling thread's shard of
    /// those collection handed out (see `loader_slots.rs`), else from the
    /// free list under its lock.
    #[inline]
    fn pop_for_loader(&self) -> Option<VacantSlot<T>> {
        match self.loader_slots.take(|head| self.read_link(head)) {
            Some((local, slot)) => Some(VacantSlot { local, slot }),
            None => self.pop_free_locked(),
        }
    }

    /// Pops the free list under `free_lock`, as a loader must (it may run
    /// during a collection, which pushes). An empty list is seen without
    /// the lock: a level streamed into a fresh store skips two locked
    /// operations per object (a push that lands meanwhile waits for the
    /// next create, which is as if it had come after this one).
    #[inline]
    fn pop_free_locked(&self) -> Option<VacantSlot<T>> {
        if split_free(self.free_head.load(Ordering::Relaxed)).0 == NIL {
            return None;
        }
        let _free = self.free_lock.lock();
        self.pop_free()
    }

    /// Pops the free list, decrementing its length in the same CAS.
    /// Concurrent callers only pop (see the type's invariants), so the head
    /// never returns to a value it held: a stale `next` read makes the CAS fail.
    #[inline]
    fn pop_free(&self) -> Option<VacantSlot<T>> {
        let mut word = self.free_head.load(Ordering::Acquire);
        loop {
            let (head, free) = split_free(word);
            if head == NIL {
                return None;
            }
            debug_assert!(free > 0, "a non-empty free list has a length");
            let slot = self.slot_ptr(head).expect("free slots live in published segments");
            // SAFETY: a published segment's slots are initialised and live as long as the store.
            let next = unsafe { slot.as_ref() }.header.word.load(Ordering::Relaxed) & !LINK_FLAG;
            let popped = free_word(next, free - 1);
            match self.free_head.compare_exchange_weak(word, popped, Ordering::Acquire, Ordering::Acquire) {
                Ok(_) => return Some(VacantSlot { local: head, slot }),
                Err(actual) => word = actual,
            }
        }
    }

    /// Takes a never-used slot: from the owner's run on the owner thread
    /// (refilling it from `len` when it is empty), else straight from `len`.
    #[inline]
    fn take_fresh(&self, source: SlotSource) -> Result<VacantSlot<T>, Error> {
        if source == SlotSource::Manager && self.iterating.load(Ordering::Relaxed) == 0 && self.owner_slots.is_owner() {
            // SAFETY: this thread is the owner (checked above; for `refill` below too).
            if let Some(vacant) = unsafe { self.take_run() } {
                return Ok(vacant);
            }
            // No growing here: that runs the allocator, which must not find
            // the run half refilled. `bump` grows, and the next call refills.
            if let Some((start, end)) = self.raise_len(RUN, false)? {
                if end - start > 1 {
                    // SAFETY: as above.
                    unsafe { self.owner_slots.refill(start + 1, end) };
                }
                return Ok(self.vacant(start));
            }
        }
        self.bump().map(|local| self.vacant(local))
    }

    /// The next slot of the owner's run, if it has one.
    ///
    /// # Safety
    ///
    /// The calling thread is the owner (`OwnerSlots::is_owner`).
    #[inline(always)]
    unsafe fn take_run(&self) -> Option<VacantSlot<T>> {
        // SAFETY: the caller's contract.
        let taken = unsafe {
            self.owner_slots.take(std::mem::size_of::<Slot<T>>(), |next, end| {
                let (first, contiguous) = self.chunk_run(next, end);
                (first.cast::<u8>(), contiguous)
            })
        };
        let (local, slot) = taken?;
        // The run's slots are this store's (`OwnerSlots` invariants), and its
        // cursor steps by whole slots through a chunk's contiguous ones.
        Some(VacantSlot { local, slot: slot.cast::<Slot<T>>() })
    }

    /// Takes one never-used slot from `len`, allocating its segment if needed.
    fn bump(&self) -> Result<u32, Error> {
        let (start, _) = self.raise_len(1, true)?.expect("a grown segment has room");
        Ok(start)
    }

    /// Raises `len` by up to `want` slots, all in the segment of the first
    /// (allocated first if `grow`, else `None` if it is not), and returns
    /// them. `len` only ever covers published segments, so nothing is
    /// undone if growing fails (before, a failed `create` lowered `len`
    /// again, which could hand a slot out twice when another thread's
    /// `create` had raised it meanwhile).
    fn raise_len(&self, want: u32, grow: bool) -> Result<Option<(u32, u32)>, Error> {
        let max = self.config.max_objects;
        let mut len = self.len.load(Ordering::Relaxed);
        loop {
            if len >= max {
                return Err(Error::CapacityExceeded { what: T::TYPE_NAME, limit: max as usize });
            }
            let (segment, offset) = locate(len, self.config.base_bits);
            if self.segments[segment].load(Ordering::Acquire).is_null() {
                if !grow {
                    return Ok(None);
                }
                self.grow(segment)?;
            }
            let room = segment_len(segment, self.config.base_bits) - offset;
            let end = len + want.min(room).min(max - len);
            // `Acquire`: pairs with `initialize_to`'s `Release`.
            if end > self.initialized.load(Ordering::Acquire) {
                self.initialize_to(segment, end);
            }
            // `Release` (and the `Acquire` above): a thread that reads the new
            // `len` with `Acquire` sees the headers of the slots below it.
            match self.len.compare_exchange_weak(len, end, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return Ok(Some((len, end))),
                Err(actual) => len = actual,
            }
        }
    }

    /// Writes vacant headers into the never-written slots of published
    /// segment `segment` up to at least `end` (a batch of about
    /// [`INIT_BYTES`] at a time, so that the slots' lines are still in
    /// cache when their objects are written), and publishes them.
    #[cold]
    #[inline(never)]
    fn initialize_to(&self, segment: usize, end: u32) {
        let _guard = self.init_lock.lock();
        let from = self.initialized.load(Ordering::Relaxed);
        if from >= end {
            return;
        }
        let base_bits = self.config.base_bits;
        let first = segment_first(segment, base_bits);
        let batch = (INIT_BYTES / std::mem::size_of::<Slot<T>>()).max(1) as u32;
        let to = end.max(from.saturating_add(batch)).min(first + segment_len(segment, base_bits));
        // `initialized` is at or past `len`, which lies in this segment, and
        // never past its end (invariants); `end` lies in it too (the caller).
        debug_assert!(first <= from && end <= to);
        let base = NonNull::new(self.segments[segment].load(Ordering::Acquire)).expect("the caller grew the segment");
        // SAFETY: the segment is published and holds `segment_len` slots,
        // `from - first..to - first` lies inside it, and its slots were never
        // written: nothing reads a slot at or past `initialized`, and only
        // this function (under `init_lock`, running no user code) writes there.
        unsafe { init_vacant::<T>(base, from - first, to - first, self.config.first_generation) };
        // `Release`: publishes the headers to `raise_len`.
        self.initialized.store(to, Ordering::Release);
    }

    /// Puts the owner's run of fresh slots and its kept ones on the free
    /// list, and makes the calling thread the owner if `adopt`.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of this store's manager.
    unsafe fn release_owner_slots(&self, adopt: bool) {
        // SAFETY: the caller's contract.
        let ((start, end), kept) = unsafe { self.owner_slots.release(adopt) };
        let mut chain = SlotChain::default();
        for local in (start..end).rev() {
            chain.push(local, self.slot(local).expect("fresh slots live in published segments"));
        }
        self.push_free_chain(chain.chain);
        self.push_free_chain(kept);
    }

    /// Allocates segments so that `additional` more slots exist past `len`.
    pub(crate) fn reserve(&self, additional: usize) -> Result<(), Error> {
        let len = self.len.load(Ordering::Relaxed);
        let max = self.config.max_objects;
        // Room for the next `additional` creates: never-used slots under the limit, free
        // ones, and those held for the owner thread and for loader threads.
        let free = split_free(self.free_head.load(Ordering::Relaxed)).1;
        let held = u64::from(self.owner_slots.left()) + u64::from(self.loader_slots.held());
        let room = u64::from(max.saturating_sub(len)) + u64::from(free) + held;
        if additional as u64 > room {
            return Err(Error::CapacityExceeded { what: T::TYPE_NAME, limit: max as usize });
        }
        let want = (u64::from(len) + additional as u64).min(u64::from(max)) as u32;
        if want == 0 {
            return Ok(());
        }
        let (last, _) = locate(want - 1, self.config.base_bits);
        for segment in 0..=last {
            if self.segments[segment].load(Ordering::Acquire).is_null() {
                self.grow(segment)?;
            }
        }
        // The first handle of each new object gets an entry in the site table.
        #[cfg(feature = "handle-sites")]
        if !self.shared().handle_sites.reserve(additional) {
            return Err(Error::StoreOutOfMemory {
                type_name: T::TYPE_NAME,
                part: "the handle-site table",
                bytes: additional * std::mem::size_of::<(u32, (u32, super::HandleSite))>(),
                allocator: self.alloc.name(),
            });
        }
        Ok(())
    }

    #[cold]
    fn grow(&self, segment: usize) -> Result<(), Error> {
        let _guard = self.grow_lock.lock();
        if !self.segments[segment].load(Ordering::Acquire).is_null() {
            return Ok(());
        }
        let base_bits = self.config.base_bits;
        let len = segment_len(segment, base_bits);
        let first_local = segment_first(segment, base_bits);
        let owner = SegmentOwner {
            shared: self.shared,
            manager_id: self.config.manager_id,
            owner_thread: self.config.owner,
            first_local,
        };
        let memory = allocate_segment::<T>(&self.alloc, len, &owner)?;
        let slots = first_local as usize + len as usize;
        let tables = match &self.tracking {
            Some(tracking) => tracking.reserve_slots(slots).map_err(|()| Error::StoreOutOfMemory {
                type_name: T::TYPE_NAME,
                part: "the tracker's charge table",
                bytes: slots * std::mem::size_of::<usize>(),
                allocator: self.alloc.name(),
            }),
            None => Ok(()),
        };
        let start =
            tables.and_then(|()| self.index_space.reserve(len, self.config.store_index, first_local, T::TYPE_NAME));
        let start = match start {
            Ok(start) => start,
            Err(error) => {
                // SAFETY: `memory` was just allocated from `alloc` with this
                // length and was never published, so none of its slots were
                // written. (A charge table that grew stays: it only covers
                // slots that do not exist yet.)
                unsafe { free_segment::<T>(&self.alloc, memory.base, len, 0) };
                return Err(error);
            }
        };
        self.shared().set_segment_start(segment, start);
        // Release: publishes the chunk headers and the segment start.
        self.segments[segment].store(memory.base.as_ptr(), Ordering::Release);
        Ok(())
    }

    /// Calls `f` with every slot in published segments, in local order.
    pub(crate) fn for_each_slot(&self, mut f: impl FnMut(u32, &Slot<T>)) {
        let limit = self.len.load(Ordering::Acquire);
        for segment in 0..MAX_SEGMENTS {
            let first = segment_first(segment, self.config.base_bits);
            if first >= limit {
                break;
            }
            let Some(base) = NonNull::new(self.segments[segment].load(Ordering::Acquire)) else { continue };
            let len = segment_len(segment, self.config.base_bits).min(limit - first);
            let mut offset = 0;
            while offset < len {
                // SAFETY: `offset < len <= segment_len(segment)`; the segment is published.
                let (run, run_len) = unsafe { Chunks::<T>::run(base, offset, len) };
                for i in 0..run_len {
                    // SAFETY: the run's slots are contiguous and initialised.
                    f(first + offset + i, unsafe { run.add(i as usize).as_ref() });
                }
                offset += run_len;
            }
        }
    }

    /// The live object in `slot`, if the slot is occupied.
    ///
    /// # Safety
    ///
    /// The slot's generation must have been read as odd (with `Acquire`) by
    /// this thread, under a borrow of the store that prevents collection.
    #[inline]
    pub(crate) unsafe fn value_unchecked(slot: &Slot<T>) -> &T {
        // SAFETY: an odd generation means the value is initialised (type
        // invariant of `Slot`), and the caller's borrow keeps it alive.
        unsafe { slot.value_ref() }
    }

    pub(crate) fn key_of(&self, local: u32, generation: u32) -> ObjectKey {
        ObjectKey::new(self.shared().global_index(local), generation)
    }

    fn note_peak(&self) -> u64 {
        let resident = self.resident();
        self.peak_resident.fetch_max(resident, Ordering::Relaxed).max(resident)
    }

    /// Puts a chain of freed slots on the free list, under `free_lock`.
    fn push_free_chain(&self, chain: Chain) {
        if chain.len == 0 {
            return;
        }
        let _free = self.free_lock.lock();
        let (head, free) = split_free(self.free_head.load(Ordering::Relaxed));
        let tail = self.slot(chain.tail).expect("freed slots live in published segments");
        tail.header.word.store(LINK_FLAG | head, Ordering::Relaxed);
        // Release: a popper that sees the new head sees the links above.
        self.free_head.store(free_word(chain.head, free + chain.len), Ordering::Release);
    }

    /// Sets (or clears) the destroy hook.
    pub(crate) fn set_destroy_hook(&self, hook: Option<DestroyHook<T>>) {
        *self.on_destroy.lock() = hook;
    }

    /// The base of the store's segment `k` and the manager-wide index of its
    /// first slot, if it is published: for iterators, which walk a chunk at a time.
    #[inline]
    pub(crate) fn segment(&self, segment: usize) -> Option<(NonNull<u8>, u32)> {
        let base = NonNull::new(self.segments.get(segment)?.load(Ordering::Acquire))?;
        let first = segment_first(segment, self.config.base_bits);
        Some((base, self.shared().global_index(first)))
    }

    /// Live objects (dead ones not counted). Costs O(dead).
    pub(crate) fn live_count_now(&self) -> usize {
        self.live_count_read(true)
    }

    /// Live objects as a thread that reads the owner's reservations or not
    /// sees them (see [`dead_count_read`](Self::dead_count_read)): what an
    /// iterator there yields. Costs O(dead).
    pub(crate) fn live_count_read(&self, reads_reservations: bool) -> usize {
        (self.resident() as usize).saturating_sub(self.dead_count_read(reads_reservations))
    }

    /// One past the last used local index.
    #[inline]
    pub(crate) fn used(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    /// True if the store's manager has an owner thread (see `owner_counts.rs`).
    pub(crate) fn has_owner(&self) -> bool {
        self.config.owner != 0
    }

    /// True on the thread that owns the store's manager (see `owner_counts.rs`): there,
    /// an object whose count is all the owner's reservation is known to be dead.
    pub(crate) fn reads_reservations_here(&self) -> bool {
        self.has_owner() && self.config.owner == crate::sync::thread_token()
    }
}

impl<T> Store<T> {
    /// How many of segment `segment`'s slots have headers (see the invariants).
    fn initialized_in(&self, segment: usize) -> u32 {
        let first = segment_first(segment, self.config.base_bits);
        let len = segment_len(segment, self.config.base_bits);
        self.initialized.load(Ordering::Acquire).saturating_sub(first).min(len)
    }

    /// Counts a new iterator over the store (see the invariants).
    pub(crate) fn begin_iteration(&self) {
        self.iterating.fetch_add(1, Ordering::Relaxed);
    }

    /// Uncounts an iterator.
    pub(crate) fn end_iteration(&self) {
        // A collection may have reset the count under a forgotten iterator's
        // feet; never wrap below zero.
        let _ = self.iterating.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Objects created and not yet destroyed (live or dead): used slots that
    /// are neither free, retired, held for the owner, returned by a batch,
    /// nor destroyed in place.
    pub(crate) fn resident(&self) -> u64 {
        let used = u64::from(self.len.load(Ordering::Relaxed));
        let free = u64::from(split_free(self.free_head.load(Ordering::Relaxed)).1);
        let retired = self.retired.load(Ordering::Relaxed);
        let held = u64::from(self.owner_slots.left())
            + u64::from(self.loader_slots.held())
            + self.returned.load(Ordering::Relaxed);
        used.saturating_sub(free + retired + held + self.destroyed_in_place.load(Ordering::Relaxed))
    }

    /// Retires a vacant slot whose generation is at the limit (see
    /// [`GENERATION_LIMIT`]): its word links nowhere, it goes on no list, and
    /// the count of retired slots takes it.
    #[cold]
    #[inline(never)]
    fn retire(&self, slot: &Slot<T>) {
        slot.header.word.store(LINK_FLAG | NIL, Ordering::Relaxed);
        self.retired.fetch_add(1, Ordering::Relaxed);
    }

    /// Objects ever created.
    fn created(&self) -> u64 {
        self.destroyed.load(Ordering::Relaxed) + self.resident()
    }
}

/// The site reports show for an object whose own site could not be
/// numbered (the store's allocator refused room for it): this line.
fn unknown_site() -> &'static Location<'static> {
    Location::caller() // the creation site could not be recorded: out of store memory
}

/// Packs the free list's head and length into one word.
#[inline]
fn free_word(head: u32, len: u32) -> u64 {
    u64::from(len) << 32 | u64::from(head)
}

/// Splits a free-list word into (head, length).
#[inline]
fn split_free(word: u64) -> (u32, u32) {
    (word as u32, (word >> 32) as u32)
}

/// The type-erased face of a store, used by the manager.
///
/// The `unsafe` methods need the manager's exclusive access: their caller
/// holds `&mut ObjectManager` of the store's manager, so no reference into
/// its values is alive and no `create` through the manager runs.
pub(crate) trait ErasedStore: Send + Sync {
    fn as_any(&self) -> &dyn Any;
    fn type_name(&self) -> &'static str;
    fn header(&self, local: u32) -> Option<&SlotHeader>;
    fn shared(&self) -> &StoreShared;
    /// See [`Store::collect`].
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` (see the trait).
    unsafe fn collect(
        &self,
        ends_unused: bool,
        budget: &mut usize,
        stats: &mut CollectStats,
        events: Option<&mut std::vec::Vec<Destroyed>>,
    ) -> usize;
    /// Starts a `collect_garbage` call: the slots kept for the owner that it
    /// did not use ([`Store::share_unused_kept`]), and those batches returned
    /// ([`Store::free_returned`]), go on the free list, for every thread.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` (see the trait).
    unsafe fn share_held_slots(&self);
    fn dead_count(&self) -> usize;
    fn live_count(&self) -> usize;
    fn report(&self) -> TypeReport;
    fn visit_live(&self, f: &mut dyn FnMut(ObjectKey, &SlotHeader, &'static Location<'static>, &dyn ErasedObject));
    /// The live object in slot `local` with `generation`, for writing.
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` (see the trait), and keeps the
    /// result no longer than that borrow.
    #[allow(clippy::mut_from_ref)]
    unsafe fn live_object_mut(&self, local: u32, generation: u32) -> Option<&mut dyn ErasedObject>;
    /// Drops every object in place (shutdown).
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` (see the trait), and no loader
    /// can create any more (the registry is closed).
    unsafe fn destroy_all(&self, on_panic: &mut dyn FnMut(&'static str, ObjectKey));
    /// Creation stacks of occupied slots, when a tracker in `Mode::Stacks` is attached.
    fn creation_stacks(&self) -> HashMap<ObjectKey, StackTrace>;
    /// Keeps the store's memory when it drops, until [`settle`](Self::settle)
    /// finds that no handle is left. Shutdown calls it first, so that a panic
    /// in user code on the way (a logger, an allocator) leaks the memory
    /// instead of freeing it under live handles.
    fn keep_memory(&self);
    /// Decides whether the store's memory may be freed when it drops.
    ///
    /// # Safety
    ///
    /// As for [`destroy_all`](Self::destroy_all), which must have run.
    unsafe fn settle(&self) -> Settled;
}

/// A live object seen without its type.
pub(crate) trait ErasedObject {
    fn size(&self) -> usize;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey));
    fn visit_handles_named(&self, visitor: &mut dyn FnMut(&'static str, ObjectKey));
    fn release_handles(&mut self);
}

impl<T: MMObject> ErasedObject for T {
    fn size(&self) -> usize {
        MMObject::size(self)
    }

    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        MMObject::visit_handles(self, visitor);
    }

    fn visit_handles_named(&self, visitor: &mut dyn FnMut(&'static str, ObjectKey)) {
        MMObject::visit_handles_named(self, visitor);
    }

    fn release_handles(&mut self) {
        MMObject::release_handles(self);
    }
}

impl<T: MMObject> ErasedStore for Store<T> {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn type_name(&self) -> &'static str {
        T::TYPE_NAME
    }

    fn header(&self, local: u32) -> Option<&SlotHeader> {
        self.used_slot(local).map(|s| &s.header)
    }

    fn shared(&self) -> &StoreShared {
        Store::shared(self)
    }

    unsafe fn collect(
        &self,
        ends_unused: bool,
        budget: &mut usize,
        stats: &mut CollectStats,
        events: Option<&mut std::vec::Vec<Destroyed>>,
    ) -> usize {
        // SAFETY: the caller's contract is `Store::collect`'s.
        unsafe { Store::collect(self, ends_unused, budget, stats, events) }
    }

    unsafe fn share_held_slots(&self) {
        // SAFETY: the caller's contract is theirs.
        unsafe {
            Store::share_unused_kept(self);
            Store::share_idle_loader_slots(self);
            Store::free_returned(self);
        }
    }

    fn dead_count(&self) -> usize {
        Store::dead_count(self)
    }

    fn live_count(&self) -> usize {
        self.live_count_now()
    }

    fn keep_memory(&self) {
        self.leaked.store(true, Ordering::Relaxed);
    }

    fn report(&self) -> TypeReport {
        let mut bytes = 0usize;
        self.for_each_slot(|_, slot| {
            if slot.header.generation.load(Ordering::Acquire) & 1 == 1 {
                // SAFETY: odd generation read with Acquire; `&self` blocks collection.
                bytes = bytes.saturating_add(unsafe { Self::value_unchecked(slot) }.size());
            }
        });
        let dead = self.dead_count();
        TypeReport {
            type_name: T::TYPE_NAME,
            tag: T::TAG,
            live: (self.resident() as usize).saturating_sub(dead),
            peak_live: self.note_peak() as usize,
            dead_pending: dead,
            bytes,
            slot_bytes: Chunks::<T>::slot_bytes(),
            created: self.created(),
            destroyed: self.destroyed.load(Ordering::Relaxed),
        }
    }

    fn visit_live(&self, f: &mut dyn FnMut(ObjectKey, &SlotHeader, &'static Location<'static>, &dyn ErasedObject)) {
        // An empty store (a level unloaded and collected) skips the pass over
        // its slots. (No debug check against the pass here: a loader may
        // create meanwhile, so the two may differ; `destroy_all`, which runs
        // with loaders shut out, checks the count.)
        if self.resident() == 0 {
            return;
        }
        self.for_each_slot(|local, slot| {
            if let SlotState::Live(_) = slot.header.state() {
                // SAFETY: live implies an odd generation read with Acquire in
                // `state`; `&self` blocks collection.
                let (value, site) = unsafe { (Self::value_unchecked(slot), self.site(local)) };
                let generation = slot.header.generation(Ordering::Relaxed);
                f(self.key_of(local, generation), &slot.header, site, value);
            }
        });
    }

    unsafe fn live_object_mut(&self, local: u32, generation: u32) -> Option<&mut dyn ErasedObject> {
        let slot = self.used_slot(local)?;
        if !slot.header.is_live(generation) {
            return None;
        }
        // SAFETY: `is_live` read the generation as odd with `Acquire`, so the
        // value is initialised; the caller's `&mut ObjectManager` excludes
        // every other reference to the value for as long as it keeps this one.
        Some(unsafe { slot.value_mut() })
    }

    unsafe fn destroy_all(&self, on_panic: &mut dyn FnMut(&'static str, ObjectKey)) {
        // As in `visit_live`: nothing to destroy, no pass over the slots.
        // Debug builds make the pass and check the count (no loader creates
        // meanwhile: shutdown closed the registry to them).
        let empty = self.resident() == 0;
        let mut destroyed = 0;
        let mut hook = self.on_destroy.lock();
        let scan = !empty || cfg!(debug_assertions);
        if scan {
            self.for_each_slot(|local, slot| {
                let generation = slot.header.generation(Ordering::Relaxed);
                if generation & 1 == 1 {
                    let key = self.key_of(local, generation);
                    if let Some(hook) = hook.as_mut() {
                        // SAFETY: the slot is occupied, and the caller's
                        // `&mut ObjectManager` excludes every other reference.
                        let value = unsafe { slot.value_mut() };
                        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(key, value))).is_err() {
                            on_panic(T::TYPE_NAME, key);
                        }
                    }
                    slot.header.generation.store(generation.wrapping_add(1), Ordering::Release);
                    destroyed += 1;
                    // SAFETY: the slot was occupied, so its value is initialised; it
                    // is now marked vacant, so nothing reads or drops it again.
                    let drop_value = || unsafe { slot.drop_value() };
                    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(drop_value)).is_err() {
                        on_panic(T::TYPE_NAME, key);
                    }
                }
            })
        }
        debug_assert!(!empty || destroyed == 0, "resident() counted no object, but {destroyed} were left");
        self.destroyed.fetch_add(destroyed, Ordering::Relaxed);
        self.destroyed_in_place.fetch_add(destroyed, Ordering::Relaxed);
        if let Some(tracking) = &self.tracking {
            tracking.credit_all();
        }
    }

    fn creation_stacks(&self) -> HashMap<ObjectKey, StackTrace> {
        let mut stacks = HashMap::new();
        if let Some(tracking) = &self.tracking {
            self.for_each_slot(|local, slot| {
                let generation = slot.header.generation(Ordering::Acquire);
                if generation & 1 == 1 {
                    if let Some(stack) = tracking.stack(local) {
                        stacks.insert(self.key_of(local, generation), stack);
                    }
                }
            });
        }
        stacks
    }

    /// Decides whether the segments can be freed: every used slot must be
    /// accounted for (on the free list, or taken off the dead list now). A slot
    /// that is not is still referenced from outside the manager, or its last
    /// handle is being dropped on another thread right now: then the memory
    /// is leaked on purpose, so those handles stay sound.
    unsafe fn settle(&self) -> Settled {
        // The owner's fresh and kept slots, and the loaders', go on the free
        // list, where they are accounted for.
        // SAFETY: the caller holds `&mut ObjectManager` (trait contract); no
        // loader creates any more (the registry is closed).
        unsafe {
            self.release_owner_slots(false);
            self.loader_slots.release_all(|chain| self.push_free_chain(chain));
        }
        // Last drops made before now (`destroy_all`'s cascades among them)
        // are listed, so they are accounted for below; so are the objects
        // that the owner's give-back of its reservations leaves dead (on the
        // owner thread: elsewhere an object the owner holds counts on stays
        // outliving, and its memory is kept), those `destroy_all` destroyed
        // in place among them.
        super::last_drops::drain_all();
        if self.reads_reservations_here() && !self.shared().cyclable {
            // (A store whose objects may hold handles keeps no reservations.)
            self.give_back_all();
        }
        let dead = self.shared().take_dead();
        // The counts settle the common case (nothing outlives) without a
        // pass over every slot; debug builds check them against that pass.
        let (outliving, owner_reserved) = if self.all_listed(dead) {
            debug_assert_eq!(self.count_outliving(dead).0, 0, "the counts missed an outliving slot");
            (0, 0)
        } else {
            self.count_outliving(dead)
        };
        let mut settled = Settled { outliving, leaked_bytes: 0, owner_reserved };
        self.leaked.store(outliving > 0, Ordering::Relaxed);
        if outliving > 0 {
            for segment in 0..MAX_SEGMENTS {
                if !self.segments[segment].load(Ordering::Relaxed).is_null() {
                    settled.leaked_bytes += Chunks::<T>::segment_bytes(segment_len(segment, self.config.base_bits));
                }
            }
            settled.leaked_bytes += std::mem::size_of::<StoreShared>();
        }
        settled
    }
}

impl<T: MMObject> Store<T> {
    /// Slots neither free, nor on the dead lists taken as `dead`, nor
    /// retired, nor held only by raw references: O(slots). Also returns
    /// how many of them the owner thread holds counts on (none once its
    /// own shutdown gave them back).
    fn count_outliving(&self, dead: [u32; DEAD_LANES]) -> (usize, usize) {
        let limit = self.len.load(Ordering::Relaxed) as usize;
        let mut accounted = vec![false; limit];
        let (free_head, _) = split_free(self.free_head.load(Ordering::Relaxed));
        for head in dead.into_iter().chain([free_head]) {
            self.walk_chain(head, |local, _| accounted[local as usize] = true);
        }
        // A slot held only by raw references is safe to free too (see
        // `SlotHeader::held_only_by_raw`, which reads the owner's
        // reservations only on the owner thread).
        let reads_reservation = self.shared().cyclable || self.config.owner == 0 || self.reads_reservations_here();
        for (&local, &raw) in self.shared().raw_refs.lock().iter() {
            if self.slot(local).is_some_and(|slot| slot.header.held_only_by_raw(raw, reads_reservation)) {
                accounted[local as usize] = true;
            }
        }
        let mut outliving = 0;
        let mut owner_reserved = 0;
        self.for_each_slot(|local, slot| {
            let header = &slot.header;
            // Retired slots hold nothing. (An object destroyed in place above
            // at the last generation also reaches the limit, but its word is
            // still its count: outliving handles hold it.)
            let retired = header.generation(Ordering::Relaxed) >= GENERATION_LIMIT
                && header.word.load(Ordering::Acquire) & LINK_FLAG != 0;
            if accounted.get(local as usize) == Some(&false) && !retired {
                outliving += 1;
                // Only for the report: the owner may be changing it now.
                if header.reserve.load(Ordering::Relaxed) & RESERVE_COUNT != 0 {
                    owner_reserved += 1;
                }
            }
        });
        (outliving, owner_reserved)
    }

    /// True if the free list, the dead lists taken as `dead` and the retired
    /// slots make up every used slot: then none is outliving, and shutdown
    /// need not look at each one. O(dead).
    fn all_listed(&self, dead: [u32; DEAD_LANES]) -> bool {
        let mut listed = u64::from(split_free(self.free_head.load(Ordering::Relaxed)).1);
        for head in dead {
            self.walk_chain(head, |_, _| listed += 1);
        }
        listed + self.retired.load(Ordering::Relaxed) == u64::from(self.len.load(Ordering::Relaxed))
    }
}

impl<T> Drop for Store<T> {
    fn drop(&mut self) {
        if *self.leaked.get_mut() {
            // The leaked segments and shared part stay in the allocator, so
            // it must outlive them: keep one reference to it forever.
            std::mem::forget(self.alloc.clone());
            return;
        }
        for segment in 0..MAX_SEGMENTS {
            let base = self.segments[segment].load(Ordering::Relaxed);
            if let Some(base) = NonNull::new(base) {
                let len = segment_len(segment, self.config.base_bits);
                // SAFETY: a published segment came from `allocate_segment` with
                // `self.alloc` and this length, and its first `initialized_in`
                // slots were written; the manager's shutdown destroyed every
                // value, and `leaked` is false, so no handle into the store is left.
                unsafe { free_segment::<T>(&self.alloc, base, len, self.initialized_in(segment)) };
            }
        }
        // SAFETY: `shared` was allocated from `self.alloc` with this layout
        // and initialised in `new`; `leaked` is false, so the shutdown pass
        // proved that no handle into this store is left.
        unsafe {
            ptr::drop_in_place(self.shared.as_ptr());
            self.alloc.deallocate(self.shared.cast(), Layout::new::<StoreShared>());
        }
    }
}

impl<T> std::fmt::Debug for Store<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("len", &self.len.load(Ordering::Relaxed))
            .field("created", &self.created())
            .field("destroyed", &self.destroyed.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// Collects the leak entries of one store's live objects.
pub(crate) fn leak_entries(store: &dyn ErasedStore, out: &mut Vec<LeakEntry>) {
    let type_name = store.type_name();
    let mut stacks = store.creation_stacks();
    #[cfg(feature = "handle-sites")]
    let mut sites = store.shared().handle_sites.by_index();
    store.visit_live(&mut |key, header, site, value| {
        let size = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| value.size())).unwrap_or(0);
        out.push(LeakEntry {
            type_name,
            key,
            ref_count: header.ref_count(),
            size,
            site,
            retention: None,
            holders: Vec::new(),
            stack: stacks.remove(&key),
            #[cfg(feature = "handle-sites")]
            handles: sites.remove(&key.index()).unwrap_or_default(),
            #[cfg(not(feature = "handle-sites"))]
            handles: Vec::new(),
        });
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MMObject, ObjectManager};

    #[derive(MMObject)]
    struct Thing(#[allow(dead_code)] u64);

    #[test]
    fn slot_refuses_slots_whose_header_was_never_written() {
        // A first segment far longer than one batch of written headers.
        let mm = ObjectManager::builder().segment_base(4096).build();
        let _h = mm.create(Thing(1));
        let store = mm.store::<Thing>().expect("registered");
        let initialized = store.initialized.load(Ordering::Relaxed);
        assert!(store.slot(0).is_some());
        assert!(store.slot(initialized - 1).is_some());
        // Past `initialized` the segment is published, but its slots were never written.
        assert!(store.slot_ptr(initialized).is_some(), "the test reaches into a published segment");
        assert!(store.slot(initialized).is_none());
        assert!(store.slot(MAX_INDEX).is_none());
        assert!(store.used_slot(1).is_none(), "slot 1 was never handed out");
    }

    #[test]
    #[should_panic(expected = "lies in one segment")]
    fn chunk_run_refuses_a_run_past_its_segment() {
        let mm = ObjectManager::builder().segment_base(64).build();
        let _h = mm.create(Thing(1));
        let store = mm.store::<Thing>().expect("registered");
        // Segment 0 holds slots 0..64.
        let _ = store.chunk_run(0, 65);
    }
}
