//! The object manager: creation, access, collection and shutdown.

use std::any::TypeId;
use std::hash::{Hash, Hasher};
use std::ops::{Index, IndexMut};
use std::panic::{catch_unwind, AssertUnwindSafe, Location};
use std::sync::atomic::Ordering as StdOrdering;
use std::sync::{Arc, OnceLock};

use allocator_api2::alloc::Allocator;
use parking_lot::Mutex;

use crate::sync::{AtomicUsize, Ordering};
use crate::track::Tracker;
use crate::{Error, Result};

use super::handle::{pack_location, unpack_location};
use super::index_space::{IndexSpace, MAX_INDEX};
use super::leak::ObjectLeakReport;
use super::report::ObjectMemoryReport;
use super::shared::reserve_raw_ref;
use super::slot::{AddRefError, ReleaseError, SlotHeader, SlotState, GENERATION_LIMIT};
use super::store::{leak_entries, ErasedStore, Inserted, Store, StoreConfig};
use super::store_alloc::StoreAlloc;
use super::{Handle, HandleOrigin, MMObject, RawHandle, WeakHandle};

/// Most object types one manager can hold.
pub const MAX_TYPES: usize = 256;
const TYPE_TABLE: usize = MAX_TYPES * 2;

static NEXT_MANAGER_ID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);

/// What [`ObjectManager::collect_garbage`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CollectStats {
    /// Objects destroyed.
    pub objects: usize,
    /// Their bytes, as [`MMObject::size`] reported just before each was dropped.
    pub bytes: usize,
    /// Passes over the dead lists that destroyed something: more than one when
    /// destroying objects released others (a cascade).
    pub rounds: usize,
}

/// The error of [`ObjectManager::try_create`]: it hands the value back.
pub struct TryCreateError<T> {
    /// The value that could not be stored.
    pub value: T,
    /// Why.
    pub error: Error,
}

impl<T> TryCreateError<T> {
    /// Takes the value back.
    pub fn into_value(self) -> T {
        self.value
    }
}

impl<T> std::fmt::Debug for TryCreateError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TryCreateError").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<T> std::fmt::Display for TryCreateError<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl<T> std::error::Error for TryCreateError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

/// Options for an [`ObjectManager`].
///
/// # Examples
///
/// ```
/// use mmobject::ObjectManager;
///
/// let mm = ObjectManager::builder()
///     .segment_base(1024)
///     .max_objects_per_type(100_000)
///     .build();
/// # drop(mm);
/// ```
#[derive(Debug, Clone)]
pub struct ObjectManagerBuilder {
    segment_base: u32,
    max_objects_per_type: u32,
    report_leaks: bool,
    tracker: Option<&'static Tracker>,
    first_generation: Option<u32>,
    alloc: Option<StoreAlloc>,
    alloc_for: Vec<(TypeId, StoreAlloc)>,
}

impl Default for ObjectManagerBuilder {
    fn default() -> Self {
        ObjectManagerBuilder {
            segment_base: 64,
            max_objects_per_type: MAX_INDEX,
            report_leaks: true,
            tracker: None,
            first_generation: None,
            alloc: None,
            alloc_for: Vec::new(),
        }
    }
}

impl ObjectManagerBuilder {
    /// Starts from the defaults: first segment of 64 slots, 2^24 objects per type, leak logging on.
    pub fn new() -> Self {
        Self::default()
    }

    /// Slots in each type's first segment (rounded up to a power of two, at most 2^20).
    /// Segment `k` holds `base << k` slots.
    pub fn segment_base(mut self, slots: u32) -> Self {
        self.segment_base = slots.clamp(1, 1 << 20).next_power_of_two();
        self
    }

    /// The most objects of one type alive (or dead, not yet collected) at once.
    /// Past it, `try_create` fails with [`Error::CapacityExceeded`].
    pub fn max_objects_per_type(mut self, max: u32) -> Self {
        self.max_objects_per_type = max.min(MAX_INDEX);
        self
    }

    /// Whether shutdown logs each leaked object (default: on). The
    /// [`ObjectLeakReport`] is returned either way.
    pub fn report_leaks(mut self, on: bool) -> Self {
        self.report_leaks = on;
        self
    }

    /// Reports each type's bytes to `tracker`, under the type's `#[mm(tag)]`.
    ///
    /// A budget on that tag then limits creation: [`ObjectManager::try_create`]
    /// returns [`Error::BudgetExceeded`] when the new object would go over it,
    /// whatever the tag's policy, and [`ObjectManager::create`] follows the
    /// tag's [`BudgetPolicy`](crate::track::BudgetPolicy) (log, callback, or
    /// panic for `Error` and `Panic`). In [`Mode::Stacks`](crate::track::Mode::Stacks)
    /// the leak report also shows each leaked object's creation stack.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{BudgetPolicy, Tracker};
    /// use mmobject::{Error, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// #[mm(tag = "Textures")]
    /// struct Texture { pixels: Vec<u8> }
    ///
    /// static TRACKER: Tracker = Tracker::new();
    /// TRACKER.set_budget(TRACKER.tag_named("Textures"), 4096);
    ///
    /// let mm = ObjectManager::builder().tracker(&TRACKER).build();
    /// let small = mm.create(Texture { pixels: vec![0; 1024] });
    /// let big = mm.try_create(Texture { pixels: vec![0; 8192] });
    /// assert!(matches!(big.unwrap_err().error, Error::BudgetExceeded { tag: "Textures", .. }));
    /// assert!(TRACKER.tag_stats(TRACKER.tag_named("Textures")).bytes >= 1024);
    /// # drop(small);
    /// ```
    pub fn tracker(mut self, tracker: &'static Tracker) -> Self {
        self.tracker = Some(tracker);
        self
    }

    /// Test hook: new slots start at this generation (even, below 2^31)
    /// instead of the manager's own, so a test can reach the generation limit
    /// in a few creates. Any start is sound; it only moves the limit closer.
    ///
    /// # Panics
    ///
    /// Panics if `generation` is odd or not below 2^31.
    #[doc(hidden)]
    pub fn first_generation_for_tests(mut self, generation: u32) -> Self {
        assert!(
            generation & 1 == 0 && generation < GENERATION_LIMIT,
            "a first generation is even and below 2^31, got {generation}"
        );
        self.first_generation = Some(generation);
        self
    }

    /// Takes every byte of store memory from `allocator`: the segments that
    /// hold the objects, and the side tables that grow with them (raw
    /// references, the manager's index ranges, each store's shared header,
    /// and with a [tracker](Self::tracker) the per-object charge table).
    /// All of it goes back to the allocator when the manager drops, except
    /// what handles that outlive the manager still point into (then the leak
    /// report says how many bytes were kept on purpose). What stays on the
    /// global allocator: each store's descriptor (about half a KiB per type,
    /// allocated when the type is first used), and the diagnostics tables of
    /// the `handle-sites` feature and of a tracker in `Mode::Stacks`.
    ///
    /// Any [`Allocator`](allocator_api2::alloc::Allocator) that is
    /// `Send + Sync + 'static` works, including a `&'static` reference to one
    /// of the crate's allocators. Without this call, store memory comes from
    /// [`SegmentAlloc::global`](crate::alloc::SegmentAlloc::global). A store
    /// asks for about `log2(objects)` segments over its life, each twice the
    /// size of the one before, so the allocator sees few, large requests.
    ///
    /// When the allocator refuses, [`ObjectManager::try_create`] returns
    /// [`Error::StoreOutOfMemory`] with the value, and
    /// [`ObjectManager::create`] panics with that error's message, which names
    /// the type and the allocator. Objects already alive are untouched.
    ///
    /// # Examples
    ///
    /// A level whose objects live under a 16 MiB cap:
    ///
    /// ```
    /// use mmobject::alloc::SegmentAlloc;
    /// use mmobject::{Error, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Prop { transform: [f32; 16] }
    ///
    /// static LEVEL_MEMORY: SegmentAlloc = SegmentAlloc::with_limit(16 << 20);
    ///
    /// let mut level = ObjectManager::builder().allocator(&LEVEL_MEMORY).build();
    /// let props: Vec<_> = (0..1000).map(|_| level.create(Prop { transform: [0.0; 16] })).collect();
    /// assert!(LEVEL_MEMORY.stats().in_use > 1000 * 64);
    /// drop(props);
    /// level.collect_garbage();
    /// drop(level);
    /// assert_eq!(LEVEL_MEMORY.stats().in_use, 0, "all of it went back");
    /// ```
    pub fn allocator<A: Allocator + Send + Sync + 'static>(mut self, allocator: A) -> Self {
        self.alloc = Some(StoreAlloc::new(allocator));
        self
    }

    /// Like [`allocator`](Self::allocator), for the store of `T` alone; it
    /// wins over `allocator` for that type. (The manager-wide index table
    /// stays with the manager's allocator.)
    pub fn allocator_for<T: MMObject, A: Allocator + Send + Sync + 'static>(mut self, allocator: A) -> Self {
        self.alloc_for.retain(|(type_id, _)| *type_id != TypeId::of::<T>());
        self.alloc_for.push((TypeId::of::<T>(), StoreAlloc::new(allocator)));
        self
    }

    /// Creates the manager.
    ///
    /// # Panics
    ///
    /// Panics once a process has built `u32::MAX - 1` managers. Manager ids are
    /// never reused, because a handle of a dropped manager must never pass
    /// another manager's check.
    pub fn build(self) -> ObjectManager {
        let id = next_manager_id();
        let alloc = self.alloc.unwrap_or_else(StoreAlloc::default_segments);
        let first_generation = self.first_generation.unwrap_or_else(|| first_generation_of(id));
        ObjectManager {
            id,
            types: (0..TYPE_TABLE).map(|_| OnceLock::new()).collect(),
            stores: (0..MAX_TYPES).map(|_| OnceLock::new()).collect(),
            store_count: AtomicUsize::new(0),
            register_lock: Mutex::new(()),
            index_space: Arc::new(IndexSpace::new(alloc.clone())),
            base_bits: self.segment_base.trailing_zeros(),
            max_objects: self.max_objects_per_type,
            report_leaks: self.report_leaks,
            tracker: self.tracker,
            first_generation,
            alloc,
            alloc_for: self.alloc_for,
            shut_down: false,
        }
    }
}

/// Hands out the next manager id: each once per process, never wrapping.
fn next_manager_id() -> u32 {
    let next = NEXT_MANAGER_ID.fetch_update(StdOrdering::Relaxed, StdOrdering::Relaxed, |id| id.checked_add(1));
    match next {
        Ok(id) => id,
        Err(_) => panic!(
            "mmobject: object manager ids are used up: all {} have been handed out in this process, and ids \
             are never reused (a handle of a dropped manager must never match a new one)",
            u32::MAX - 1
        ),
    }
}

/// Test hook: moves the next manager id up to at least `id`, so a test can
/// reach the end of the ids quickly. It never moves it down, so no id is ever
/// handed out twice.
#[doc(hidden)]
pub fn skip_manager_ids_for_tests(id: u32) {
    NEXT_MANAGER_ID.fetch_max(id, StdOrdering::Relaxed);
}

/// The generation a manager's new slots start at: even, spread over
/// `0..2^22` by the id, so that a raw handle of one manager rarely matches a
/// slot of another, while leaving each slot about 2^31 reuses before it
/// retires.
fn first_generation_of(id: u32) -> u32 {
    (id.wrapping_mul(0x9E37_79B9) >> 11) << 1
}

/// Owns objects of any [`MMObject`] type and hands out refcounted [`Handle`]s to them.
///
/// - `create`, `get`, `upgrade`, `iter` and `report` take `&self` and may run
///   on several threads at once.
/// - `get_mut`, `collect_garbage` and `shutdown` take `&mut self`: the frame's
///   sync point.
/// - Dropping the last handle makes an object *dead*; `collect_garbage`
///   destroys the dead, at a cost proportional to their number only.
/// - Dropping the manager runs [`shutdown`](Self::shutdown), which logs every
///   object still alive.
///
/// # Examples
///
/// ```
/// use mmobject::{Handle, MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// #[mm(tag = "Textures")]
/// struct Texture { width: u32, height: u32, pixels: Vec<u8> }
///
/// #[derive(MMObject)]
/// struct Material { albedo: Handle<Texture>, detail: Option<Handle<Texture>> }
///
/// let mut mm = ObjectManager::new();
/// let tex = mm.create(Texture { width: 4, height: 4, pixels: vec![0; 64] });
/// let mat = mm.create(Material { albedo: tex.clone(), detail: None });
/// drop(tex); // the material still holds it
/// assert_eq!(mm[&mm[&mat].albedo].width, 4);
///
/// drop(mat);
/// let freed = mm.collect_garbage(); // the material, then its texture
/// assert_eq!(freed.objects, 2);
/// assert!(mm.shutdown().is_empty());
/// ```
pub struct ObjectManager {
    id: u32,
    /// Open-addressed map from `TypeId` to store index; entries are set once.
    types: Box<[OnceLock<(TypeId, u32)>]>,
    /// Stores by index; entries are set once, in order.
    stores: Box<[OnceLock<StoreEntry>]>,
    store_count: AtomicUsize,
    register_lock: Mutex<()>,
    index_space: Arc<IndexSpace>,
    base_bits: u32,
    max_objects: u32,
    report_leaks: bool,
    tracker: Option<&'static Tracker>,
    first_generation: u32,
    /// Where store memory comes from, and the per-type overrides.
    alloc: StoreAlloc,
    alloc_for: Vec<(TypeId, StoreAlloc)>,
    shut_down: bool,
}

/// A registered store, with the `TypeId` of its object type kept inline so
/// that a typed lookup (every weak-handle read) costs one compare instead of
/// two virtual calls (`as_any`, then `Any::type_id`).
///
/// # Invariants
///
/// `store` is a `Store<T>` for the `T` with `TypeId::of::<T>() == type_id`.
struct StoreEntry {
    type_id: TypeId,
    store: Box<dyn ErasedStore>,
}

impl Default for ObjectManager {
    fn default() -> Self {
        Self::new()
    }
}

impl ObjectManager {
    /// A manager with default options.
    pub fn new() -> Self {
        ObjectManagerBuilder::default().build()
    }

    /// A builder for capacities and options.
    pub fn builder() -> ObjectManagerBuilder {
        ObjectManagerBuilder::default()
    }

    /// This manager's id, unique in the process.
    pub fn id(&self) -> u32 {
        self.id
    }

    // ---- stores ------------------------------------------------------------

    fn type_slot(&self, type_id: TypeId) -> usize {
        struct IdHasher(u64);
        impl Hasher for IdHasher {
            fn finish(&self) -> u64 {
                self.0
            }
            fn write(&mut self, bytes: &[u8]) {
                for &b in bytes {
                    self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
                }
            }
            fn write_u64(&mut self, n: u64) {
                self.0 ^= n;
            }
        }
        let mut hasher = IdHasher(0);
        type_id.hash(&mut hasher);
        (hasher.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as usize % TYPE_TABLE
    }

    fn store_index_of(&self, type_id: TypeId) -> Option<u32> {
        let mut at = self.type_slot(type_id);
        loop {
            match self.types[at].get() {
                None => return None,
                Some(&(id, index)) if id == type_id => return Some(index),
                Some(_) => at = (at + 1) % TYPE_TABLE,
            }
        }
    }

    #[inline]
    pub(crate) fn store<T: MMObject>(&self) -> Option<&Store<T>> {
        let index = self.store_index_of(TypeId::of::<T>())?;
        self.store_at::<T>(index)
    }

    #[inline]
    fn store_at<T: MMObject>(&self, index: u32) -> Option<&Store<T>> {
        let entry = self.stores.get(index as usize)?.get()?;
        if entry.type_id != TypeId::of::<T>() {
            return None;
        }
        let store: *const dyn ErasedStore = &*entry.store;
        // SAFETY: by `StoreEntry`'s invariant the box holds a `Store<T>` (its
        // `type_id` is `T`'s), so the data pointer of the `dyn ErasedStore`
        // points to a live `Store<T>`, borrowed for as long as `self`.
        Some(unsafe { &*store.cast::<Store<T>>() })
    }

    fn store_or_register<T: MMObject>(&self) -> Result<&Store<T>> {
        if let Some(store) = self.store::<T>() {
            return Ok(store);
        }
        let _guard = self.register_lock.lock();
        if let Some(store) = self.store::<T>() {
            return Ok(store);
        }
        let index = self.store_count.load(Ordering::Relaxed);
        if index >= MAX_TYPES {
            return Err(Error::CapacityExceeded { what: "object types in one manager", limit: MAX_TYPES });
        }
        let config = StoreConfig {
            manager_id: self.id,
            store_index: index as u32,
            base_bits: self.base_bits,
            max_objects: self.max_objects,
            first_generation: self.first_generation,
            tracker: self.tracker,
        };
        let alloc = self.alloc_for.iter().find(|(type_id, _)| *type_id == TypeId::of::<T>()).map(|(_, a)| a);
        let alloc = alloc.unwrap_or(&self.alloc).clone();
        // Store memory is never tracked (see `object/tracking.rs`), the descriptor included.
        let _untracked = crate::track::Reentry::enter();
        let store: Box<dyn ErasedStore> = Box::new(Store::<T>::new(config, Arc::clone(&self.index_space), alloc)?);
        if self.stores[index].set(StoreEntry { type_id: TypeId::of::<T>(), store }).is_err() {
            unreachable!("store entries are set once, under the register lock");
        }
        let mut at = self.type_slot(TypeId::of::<T>());
        while self.types[at].get().is_some() {
            at = (at + 1) % TYPE_TABLE;
        }
        let _ = self.types[at].set((TypeId::of::<T>(), index as u32));
        self.store_count.store(index + 1, Ordering::Release);
        Ok(self.store_at::<T>(index as u32).expect("just registered"))
    }

    /// The store at `index`, for changes under `&mut self`.
    pub(crate) fn store_by_index_mut(&mut self, index: u32) -> Option<&mut (dyn ErasedStore + 'static)> {
        self.stores.get_mut(index as usize)?.get_mut().map(|e| &mut *e.store)
    }

    /// The (store index, local slot index) a key's manager-wide index names.
    pub(crate) fn locate_key(&self, key: super::ObjectKey) -> Option<(u32, u32)> {
        self.index_space.resolve(key.index())
    }

    pub(crate) fn all_stores(&self) -> impl Iterator<Item = &dyn ErasedStore> {
        let count = self.store_count.load(Ordering::Acquire);
        self.stores[..count].iter().filter_map(|s| s.get().map(|e| &*e.store))
    }

    // ---- creation ------------------------------------------------------------

    /// Creates an object and returns the first handle to it.
    ///
    /// The caller's location is recorded as the creation site, for the leak
    /// report. Safe to call from several threads at once.
    ///
    /// # Panics
    ///
    /// Panics with the [`try_create`](Self::try_create) error's message if the
    /// type's store is full; with a [tracker](ObjectManagerBuilder::tracker),
    /// also if the type's tag goes over budget under the `Error` or `Panic`
    /// policy (the `Log` and `Callback` policies let the object be created).
    #[track_caller]
    pub fn create<T: MMObject>(&self, value: T) -> Handle<T> {
        match self.create_at(value, Location::caller(), false) {
            Ok(handle) => handle,
            Err(e) => fail(e.error),
        }
    }

    /// Creates an object, or hands the value back.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExceeded`] when the type's store is at
    /// [`max_objects_per_type`](ObjectManagerBuilder::max_objects_per_type),
    /// the manager's index space (2^24 slots) is used up, or the manager
    /// already holds [`MAX_TYPES`] types. [`Error::BudgetExceeded`] when the
    /// manager has a [tracker](ObjectManagerBuilder::tracker) and the object's
    /// `size()` would take its tag over budget, whatever the tag's policy.
    #[track_caller]
    pub fn try_create<T: MMObject>(&self, value: T) -> std::result::Result<Handle<T>, TryCreateError<T>> {
        self.create_at(value, Location::caller(), true)
    }

    #[inline]
    fn create_at<T: MMObject>(
        &self,
        value: T,
        site: &'static Location<'static>,
        strict_budget: bool,
    ) -> std::result::Result<Handle<T>, TryCreateError<T>> {
        let store = match self.store_or_register::<T>() {
            Ok(store) => store,
            Err(error) => return Err(TryCreateError { value, error }),
        };
        match store.try_insert(value, site, strict_budget) {
            Ok(Inserted { local, slot, generation }) => {
                // SAFETY: `try_insert` returns an occupied slot of this store
                // with a count of one, which the new handle takes over.
                Ok(unsafe {
                    Handle::from_counted(slot, store.shared_ptr(), generation, local, HandleOrigin::Created, site)
                })
            }
            Err((value, error)) => Err(TryCreateError { value, error }),
        }
    }

    /// Allocates slot memory for at least `additional` more objects of type `T` up front.
    ///
    /// # Panics
    ///
    /// Panics with the [`try_reserve`](Self::try_reserve) error's message.
    pub fn reserve<T: MMObject>(&self, additional: usize) {
        if let Err(e) = self.try_reserve::<T>(additional) {
            fail(e)
        }
    }

    /// Allocates slot memory for at least `additional` more objects of type
    /// `T` up front, or says why not. Once it succeeds, the next `additional`
    /// creates of `T` allocate no slot memory.
    ///
    /// # Errors
    ///
    /// [`Error::StoreOutOfMemory`] if the memory for a segment is refused;
    /// [`Error::CapacityExceeded`] if the manager's index space or type table
    /// is full. Segments allocated before the failure stay, and nothing else
    /// changes.
    pub fn try_reserve<T: MMObject>(&self, additional: usize) -> Result<()> {
        self.store_or_register::<T>()?.reserve(additional)
    }

    // ---- access through strong handles ---------------------------------------

    #[inline]
    fn check_manager(&self, found: u32) -> Result<()> {
        if found == self.id {
            Ok(())
        } else {
            Err(Error::WrongManager { expected: self.id, found })
        }
    }

    /// Reads an object.
    ///
    /// # Panics
    ///
    /// Panics if the handle belongs to another manager.
    #[inline]
    pub fn get<T: MMObject>(&self, handle: &Handle<T>) -> &T {
        self.try_get(handle).unwrap_or_else(|e| fail(e))
    }

    /// Reads an object.
    ///
    /// # Errors
    ///
    /// [`Error::WrongManager`] if the handle belongs to another manager.
    #[inline]
    pub fn try_get<T: MMObject>(&self, handle: &Handle<T>) -> Result<&T> {
        self.check_manager(handle.manager_id())?;
        let slot = handle.slot();
        debug_assert!(slot.header.generation.load(Ordering::Relaxed) & 1 == 1, "a handle's slot is occupied");
        // SAFETY: the handle is counted, so its slot is occupied and its value
        // initialised; it belongs to this manager, and `&self` keeps
        // collection (the only thing that destroys values) away.
        Ok(unsafe { (*slot.value.get()).assume_init_ref() })
    }

    /// Writes an object.
    ///
    /// # Panics
    ///
    /// Panics if the handle belongs to another manager.
    #[inline]
    pub fn get_mut<T: MMObject>(&mut self, handle: &Handle<T>) -> &mut T {
        self.try_get_mut(handle).unwrap_or_else(|e| fail(e))
    }

    /// Writes an object.
    ///
    /// # Errors
    ///
    /// [`Error::WrongManager`] if the handle belongs to another manager.
    #[inline]
    pub fn try_get_mut<T: MMObject>(&mut self, handle: &Handle<T>) -> Result<&mut T> {
        self.check_manager(handle.manager_id())?;
        // SAFETY: as in `try_get`; `&mut self` also excludes every other
        // reference to objects of this manager.
        Ok(unsafe { (*handle.slot().value.get()).assume_init_mut() })
    }

    // ---- weak handles ----------------------------------------------------------

    /// The weak handle's slot if its object is live.
    ///
    /// # Safety
    ///
    /// The weak handle must belong to this manager (`weak.manager_id() == self.id`).
    #[inline]
    unsafe fn live_slot<T: MMObject>(&self, weak: WeakHandle<T>) -> Option<&super::slot::Slot<T>> {
        let (store_index, local) = unpack_location(weak.location());
        let store = self.store_at::<T>(store_index)?;
        // SAFETY: `local < 2^24` (unpacked) and `base_bits` is the store's.
        // The weak handle belongs to this manager (caller), so
        // (`WeakHandle` invariant) it names a slot of this store in a segment
        // published before the weak handle was made, and so before this call.
        let slot = unsafe { store.published_slot(local, store.base_bits()) };
        slot.header.is_live(weak.key().generation()).then_some(slot)
    }

    #[inline]
    fn weak_slot<T: MMObject>(&self, weak: WeakHandle<T>) -> Result<&super::slot::Slot<T>> {
        self.check_manager(weak.manager_id())?;
        // SAFETY: the manager id was checked just above.
        unsafe { self.live_slot(weak) }.ok_or_else(|| Error::StaleHandle {
            type_name: T::TYPE_NAME,
            index: weak.key().index(),
            generation: weak.key().generation(),
        })
    }

    /// Reads an object through a weak handle, touching no count.
    ///
    /// Returns `None` once the object's last strong handle is gone.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager.
    #[inline]
    pub fn get_weak<T: MMObject>(&self, weak: WeakHandle<T>) -> Option<&T> {
        if let Err(e) = self.check_manager(weak.manager_id()) {
            fail(e)
        }
        // SAFETY: the manager id was checked just above.
        let slot = unsafe { self.live_slot(weak) }?;
        // SAFETY: `live_slot` saw the slot live with `Acquire`, so the value is
        // initialised; `&self` keeps collection away.
        Some(unsafe { Store::value_unchecked(slot) })
    }

    /// Reads an object through a weak handle.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if the object is dead or destroyed;
    /// [`Error::WrongManager`] if the handle belongs to another manager.
    #[inline]
    pub fn try_get_weak<T: MMObject>(&self, weak: WeakHandle<T>) -> Result<&T> {
        let slot = self.weak_slot(weak)?;
        // SAFETY: `weak_slot` saw the slot live with `Acquire`, so the value is
        // initialised; `&self` keeps collection away.
        Ok(unsafe { Store::value_unchecked(slot) })
    }

    /// Writes an object through a weak handle, if it is still live.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager.
    pub fn get_weak_mut<T: MMObject>(&mut self, weak: WeakHandle<T>) -> Option<&mut T> {
        match self.weak_slot(weak) {
            // SAFETY: live slot (value initialised) and `&mut self` is exclusive.
            Ok(slot) => Some(unsafe { (*slot.value.get()).assume_init_mut() }),
            Err(Error::StaleHandle { .. }) => None,
            Err(e) => fail(e),
        }
    }

    /// True while the object has strong handles.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager.
    pub fn is_alive<T: MMObject>(&self, weak: WeakHandle<T>) -> bool {
        self.get_weak(weak).is_some()
    }

    /// A new strong handle from a weak one, while the object is live.
    ///
    /// A dead object is never revived: once the last strong handle is gone
    /// this returns `None`, even before the object is collected.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager, or on reference count overflow.
    #[track_caller]
    pub fn upgrade<T: MMObject>(&self, weak: WeakHandle<T>) -> Option<Handle<T>> {
        match self.try_upgrade(weak) {
            Ok(handle) => Some(handle),
            Err(Error::StaleHandle { .. }) => None,
            Err(e) => fail(e),
        }
    }

    /// A new strong handle from a weak one.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if the object is dead or destroyed,
    /// [`Error::WrongManager`] if the handle belongs to another manager,
    /// [`Error::RefCountOverflow`] past 2^30 references.
    #[track_caller]
    pub fn try_upgrade<T: MMObject>(&self, weak: WeakHandle<T>) -> Result<Handle<T>> {
        let slot = self.weak_slot(weak)?;
        let (store_index, local) = unpack_location(weak.location());
        let key = weak.key();
        match slot.header.try_add_ref(key.generation()) {
            Ok(()) => {
                let store = self.store_at::<T>(store_index).expect("checked by weak_slot");
                // SAFETY: we just counted a reference to this occupied slot.
                Ok(unsafe {
                    Handle::from_counted(
                        std::ptr::NonNull::from(slot),
                        store.shared_ptr(),
                        key.generation(),
                        local,
                        HandleOrigin::Upgraded,
                        Location::caller(),
                    )
                })
            }
            Err(AddRefError::Stale) => {
                Err(Error::StaleHandle { type_name: T::TYPE_NAME, index: key.index(), generation: key.generation() })
            }
            Err(AddRefError::Overflow) => Err(Error::RefCountOverflow { type_name: T::TYPE_NAME, index: key.index() }),
        }
    }

    // ---- raw handles -----------------------------------------------------------

    fn resolve_raw(&self, raw: RawHandle) -> Result<(&dyn ErasedStore, u32, &SlotHeader)> {
        let tag = raw.manager_tag();
        let invalid = || Error::InvalidRawHandle { raw: raw.0 };
        if tag != self.id & 0xff {
            // Every raw handle has an odd generation and the tag of a manager
            // that was made: anything else is garbage, not another manager's.
            // (Tags up to the next id, `made`, are taken as possible.)
            let made = NEXT_MANAGER_ID.load(std::sync::atomic::Ordering::Relaxed);
            if raw.generation() & 1 == 0 || (made < 0x100 && (tag == 0 || tag > made)) {
                return Err(invalid());
            }
            return Err(Error::WrongManager { expected: self.id, found: tag });
        }
        if raw.generation() & 1 == 0 {
            return Err(invalid());
        }
        let (store_index, local) = self.index_space.resolve(raw.index()).ok_or_else(invalid)?;
        let store =
            self.stores.get(store_index as usize).and_then(|s| s.get()).map(|e| &e.store).ok_or_else(invalid)?;
        let header = store.header(local).ok_or_else(invalid)?;
        Ok((&**store, local, header))
    }

    fn stale_raw(store: &dyn ErasedStore, raw: RawHandle) -> Error {
        Error::StaleHandle { type_name: store.type_name(), index: raw.index(), generation: raw.generation() }
    }

    /// Adds a reference through a raw handle (the seeds' `AddRef`).
    ///
    /// # Errors
    ///
    /// [`Error::WrongManager`], [`Error::InvalidRawHandle`], [`Error::StaleHandle`]
    /// (the object is dead or destroyed), [`Error::RefCountOverflow`]. On error no count changes.
    #[cfg_attr(feature = "handle-sites", track_caller)]
    pub fn add_ref_raw(&self, raw: RawHandle) -> Result<()> {
        let (store, local, header) = self.resolve_raw(raw)?;
        let mut raw_refs = store.shared().raw_refs.lock();
        reserve_raw_ref(&mut raw_refs, store.type_name())?;
        match header.try_add_ref(raw.generation()) {
            Ok(()) => {
                *raw_refs.entry(local).or_insert(0) += 1;
                drop(raw_refs);
                #[cfg(feature = "handle-sites")]
                store.shared().handle_sites.lock().register_raw(
                    raw.index(),
                    super::HandleSite { origin: HandleOrigin::AddRefRaw, location: Location::caller() },
                );
                Ok(())
            }
            Err(AddRefError::Stale) => Err(Self::stale_raw(store, raw)),
            Err(AddRefError::Overflow) => {
                Err(Error::RefCountOverflow { type_name: store.type_name(), index: raw.index() })
            }
        }
    }

    /// Gives back one reference held through a raw handle (the seeds' `Release`).
    ///
    /// # Errors
    ///
    /// [`Error::DoubleRelease`] if the raw handle holds no reference any more,
    /// [`Error::StaleHandle`], [`Error::WrongManager`], [`Error::InvalidRawHandle`].
    /// On error no count changes.
    pub fn release_raw(&self, raw: RawHandle) -> Result<()> {
        let (store, local, header) = self.resolve_raw(raw)?;
        if !header.is_live(raw.generation()) && header.generation.load(Ordering::Acquire) != raw.generation() {
            return Err(Self::stale_raw(store, raw));
        }
        let mut raw_refs = store.shared().raw_refs.lock();
        let Some(count) = raw_refs.get_mut(&local).filter(|c| **c > 0) else {
            return Err(Error::DoubleRelease { type_name: store.type_name(), index: raw.index() });
        };
        match header.try_release(raw.generation()) {
            Ok(last) => {
                *count -= 1;
                if *count == 0 {
                    raw_refs.remove(&local);
                }
                drop(raw_refs);
                #[cfg(feature = "handle-sites")]
                store.shared().handle_sites.lock().remove_raw(raw.index());
                if last {
                    store.shared().release_last(local, &header.word);
                }
                Ok(())
            }
            Err(ReleaseError::Stale) => Err(Self::stale_raw(store, raw)),
            Err(ReleaseError::NoReferences) => {
                Err(Error::DoubleRelease { type_name: store.type_name(), index: raw.index() })
            }
        }
    }

    /// Turns a raw handle back into a [`Handle`], taking over its reference
    /// (as `Arc::from_raw` does).
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] if the raw handle names an object of another type,
    /// [`Error::DoubleRelease`] if it holds no reference any more,
    /// [`Error::StaleHandle`], [`Error::WrongManager`], [`Error::InvalidRawHandle`].
    /// On error no count changes.
    #[track_caller]
    pub fn handle_from_raw<T: MMObject>(&self, raw: RawHandle) -> Result<Handle<T>> {
        let (erased, local, header) = self.resolve_raw(raw)?;
        let store = erased
            .as_any()
            .downcast_ref::<Store<T>>()
            .ok_or(Error::WrongType { expected: T::TYPE_NAME, found: erased.type_name() })?;
        if header.generation.load(Ordering::Acquire) != raw.generation() {
            return Err(Self::stale_raw(erased, raw));
        }
        let mut raw_refs = store.shared().raw_refs.lock();
        match raw_refs.get_mut(&local) {
            Some(count) if *count > 0 && header.is_live(raw.generation()) => {
                *count -= 1;
                if *count == 0 {
                    raw_refs.remove(&local);
                }
                #[cfg(feature = "handle-sites")]
                store.shared().handle_sites.lock().remove_raw(raw.index());
                let slot = store.slot(local).expect("resolved");
                // SAFETY: the raw handle held a counted reference (checked in
                // the raw table), which moves to the new handle.
                Ok(unsafe {
                    Handle::from_counted(
                        std::ptr::NonNull::from(slot),
                        store.shared_ptr(),
                        raw.generation(),
                        local,
                        HandleOrigin::FromRaw,
                        Location::caller(),
                    )
                })
            }
            _ => Err(Error::DoubleRelease { type_name: T::TYPE_NAME, index: raw.index() }),
        }
    }

    // ---- queries ---------------------------------------------------------------

    /// Iterates over the live objects of type `T`, in key order.
    ///
    /// Dead objects (released, not yet collected) are skipped.
    pub fn iter<T: MMObject>(&self) -> Iter<'_, T> {
        Iter { store: self.store::<T>(), local: 0, manager: self.id }
    }

    /// A typed view of the objects of type `T`: the fast path for hot loops.
    ///
    /// The view finds `T`'s store once, so each read through it skips the
    /// per-read store lookup of [`get_weak`](Self::get_weak) (store table,
    /// `TypeId` compare) and only checks the manager id, the generation and
    /// the count. Take it outside the loop:
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Enemy { hp: u32 }
    ///
    /// let mm = ObjectManager::new();
    /// let mut enemies: Vec<_> = (0..4).map(|hp| mm.create(Enemy { hp })).collect();
    /// let targets: Vec<_> = enemies.iter().map(|e| e.downgrade()).collect();
    /// drop(enemies.remove(0)); // the first target dies
    ///
    /// let view = mm.view::<Enemy>();
    /// let total: u32 = targets.iter().filter_map(|&t| view.get_weak(t)).map(|e| e.hp).sum();
    /// assert_eq!(total, 1 + 2 + 3);
    /// assert!(view.upgrade(targets[0]).is_none());
    /// assert_eq!(view.iter().count(), 3);
    /// ```
    ///
    /// The view borrows the manager (`&self`), so collection waits until it
    /// is gone, and it may be used from any thread that may use `&ObjectManager`.
    #[inline]
    pub fn view<T: MMObject>(&self) -> ObjectView<'_, T> {
        let store = self.store::<T>();
        ObjectView { manager: self, store, manager_id: self.id, base_bits: store.map_or(0, Store::base_bits) }
    }

    /// Live objects of type `T` (dead ones not counted).
    pub fn count<T: MMObject>(&self) -> usize {
        self.store::<T>().map_or(0, ErasedStore::live_count)
    }

    /// Live objects of all types.
    pub fn len(&self) -> usize {
        self.all_stores().map(|s| s.live_count()).sum()
    }

    /// True if no object is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Objects released but not yet collected. Costs O(dead).
    pub fn dead_count(&self) -> usize {
        self.all_stores().map(|s| s.dead_count()).sum()
    }

    /// Per-type statistics. Costs O(live) (it sums each object's `size()`).
    pub fn report(&self) -> ObjectMemoryReport {
        ObjectMemoryReport { types: self.all_stores().map(|s| s.report()).collect() }
    }

    // ---- collection --------------------------------------------------------------

    /// Destroys every dead object, including those that become dead while
    /// others are destroyed (cascades finish in the same call).
    ///
    /// Costs O(dead + types), never O(live). If a `Drop` panics, the manager
    /// stays consistent (that object counts as destroyed, the rest stay
    /// queued) and the panic propagates; the next call carries on.
    pub fn collect_garbage(&mut self) -> CollectStats {
        self.collect_garbage_budgeted(usize::MAX)
    }

    /// Like [`collect_garbage`](Self::collect_garbage), but stops after
    /// `max_objects`; the rest stay queued for the next call.
    pub fn collect_garbage_budgeted(&mut self, max_objects: usize) -> CollectStats {
        let mut stats = CollectStats::default();
        let mut budget = max_objects;
        let count = self.store_count.load(Ordering::Relaxed);
        loop {
            let mut freed = 0;
            for store in self.stores[..count].iter_mut().filter_map(|s| s.get_mut().map(|e| &mut e.store)) {
                freed += store.collect(&mut budget, &mut stats);
            }
            if freed == 0 {
                break;
            }
            stats.rounds += 1;
            if budget == 0 {
                break;
            }
        }
        stats
    }

    // ---- shutdown ------------------------------------------------------------------

    /// Destroys everything and reports the objects that were still alive.
    ///
    /// Dead objects are destroyed first. Each object still alive is logged
    /// with `log::warn!` (type, key, refcount, size, creation site), or
    /// written to stderr when no logger would show a warning. Then all values
    /// are dropped, in key order, which also breaks reference cycles.
    ///
    /// If handles outlive the manager, their slot memory is leaked on purpose
    /// so they stay sound, and the report says so. Dropping the manager does
    /// the same. Panics from `Drop` impls are caught and logged here.
    pub fn shutdown(mut self) -> ObjectLeakReport {
        self.shutdown_in_place()
    }

    fn shutdown_in_place(&mut self) -> ObjectLeakReport {
        self.shut_down = true;
        let mut report = ObjectLeakReport::default();
        // Dead first. A panicking Drop leaves the manager consistent, so retry.
        loop {
            match catch_unwind(AssertUnwindSafe(|| self.collect_garbage())) {
                Ok(_) => break,
                Err(payload) => {
                    report.drop_panics += 1;
                    let id = self.id;
                    let message = super::leak_render::PanicMessage(&*payload);
                    log::error!(target: "mmobject", "a released object panicked in Drop at shutdown of object manager #{id}: {message}");
                }
            }
        }
        for store in self.all_stores() {
            leak_entries(store, &mut report.entries);
        }
        report.entries.sort_by_key(|e| e.key);
        if !report.entries.is_empty() {
            // Before any value is destroyed: retention paths and cycles read `visit_handles`.
            super::forensics::annotate_leaks(self, &mut report);
        }
        if self.report_leaks && !report.entries.is_empty() {
            super::leak_render::log_shutdown_report(&report, self.id, &mut |block| emit(block));
        }
        let id = self.id;
        let count = self.store_count.load(Ordering::Relaxed);
        for store in self.stores[..count].iter_mut().filter_map(|s| s.get_mut().map(|e| &mut e.store)) {
            store.destroy_all(&mut |type_name, key| {
                report.drop_panics += 1;
                log::error!(target: "mmobject", "{type_name}{key} panicked in Drop at shutdown of object manager #{id}");
            });
        }
        for store in self.stores[..count].iter_mut().filter_map(|s| s.get_mut().map(|e| &mut e.store)) {
            let settled = store.settle();
            report.outliving_handles += settled.outliving;
            report.leaked_bytes += settled.leaked_bytes;
        }
        if self.report_leaks && report.outliving_handles > 0 {
            emit(&format!(
                "{} object(s) are still referenced by handles that outlive object manager #{}; \
                 {} bytes of slot memory are leaked on purpose so those handles stay sound",
                report.outliving_handles, self.id, report.leaked_bytes
            ));
        }
        report
    }
}

/// Logs a warning, or writes it to stderr when no logger would show it.
fn emit(message: &str) {
    if log::log_enabled!(target: "mmobject", log::Level::Warn) {
        log::warn!(target: "mmobject", "{message}");
    } else {
        eprintln!("WARN mmobject: {message}");
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn fail(error: Error) -> ! {
    panic!("{error}")
}

#[cold]
#[inline(never)]
#[track_caller]
fn wrong_manager(expected: u32, found: u32) -> ! {
    fail(Error::WrongManager { expected, found })
}

impl Drop for ObjectManager {
    fn drop(&mut self) {
        if !self.shut_down {
            self.shutdown_in_place();
        }
    }
}

impl std::fmt::Debug for ObjectManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectManager")
            .field("id", &self.id)
            .field("types", &self.all_stores().map(|s| s.type_name()).collect::<Vec<_>>())
            .field("live", &self.len())
            .field("dead", &self.dead_count())
            .finish()
    }
}

impl<T: MMObject> Index<&Handle<T>> for ObjectManager {
    type Output = T;

    /// # Panics
    ///
    /// Panics if the handle belongs to another manager.
    fn index(&self, handle: &Handle<T>) -> &T {
        self.get(handle)
    }
}

impl<T: MMObject> IndexMut<&Handle<T>> for ObjectManager {
    fn index_mut(&mut self, handle: &Handle<T>) -> &mut T {
        self.get_mut(handle)
    }
}

/// Iterator over the live objects of one type: see [`ObjectManager::iter`].
pub struct Iter<'a, T> {
    store: Option<&'a Store<T>>,
    local: u32,
    manager: u32,
}

impl<'a, T: MMObject> Iterator for Iter<'a, T> {
    type Item = (WeakHandle<T>, &'a T);

    fn next(&mut self) -> Option<Self::Item> {
        let store = self.store?;
        while let Some(slot) = store.slot(self.local) {
            let local = self.local;
            self.local += 1;
            if let SlotState::Live(_) = slot.header.state() {
                // SAFETY: live means the generation was read odd with Acquire;
                // the iterator borrows the manager, which keeps collection away.
                let value = unsafe { Store::value_unchecked(slot) };
                let generation = slot.header.generation.load(Ordering::Relaxed);
                let key = store.key_of(local, generation);
                let location = pack_location(store.shared().store_index, local);
                return Some((WeakHandle::new(key, location, self.manager), value));
            }
        }
        None
    }
}

/// A typed view of one object type in an [`ObjectManager`]: see [`ObjectManager::view`].
///
/// Reads through it check the same things as the manager's own methods (the
/// manager id, and for weak handles the generation and liveness), but the
/// store is found once, when the view is made.
///
/// # Invariants
///
/// `store` is `manager`'s store for `T`, or `None` if `T` had no store when
/// the view was made (then every call forwards to the manager, which sees a
/// store registered since).
///
/// `manager_id` and `base_bits` are copies of the manager's id and the
/// store's segment shift (kept here so that a loop holds them in registers).
pub struct ObjectView<'a, T> {
    manager: &'a ObjectManager,
    store: Option<&'a Store<T>>,
    manager_id: u32,
    base_bits: u32,
}

impl<T> Clone for ObjectView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for ObjectView<'_, T> {}

impl<'a, T: MMObject> ObjectView<'a, T> {
    /// Reads an object through a weak handle, touching no count: the same
    /// answer as [`ObjectManager::get_weak`], with less work per call.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager.
    #[inline]
    pub fn get_weak(&self, weak: WeakHandle<T>) -> Option<&'a T> {
        if weak.manager_id() != self.manager_id {
            wrong_manager(self.manager_id, weak.manager_id())
        }
        let Some(store) = self.store else {
            return self.manager.get_weak(weak);
        };
        // The location's store index needs no check: this manager has one
        // store for `T`, and it is `store`.
        let (_, local) = unpack_location(weak.location());
        // SAFETY: `local < 2^24` (unpacked); `base_bits` is the store's; the
        // weak handle belongs to this manager, so (`WeakHandle` invariant) it
        // names a slot of this manager's `T` store in a segment published
        // before the weak handle was made, and so before this call.
        let slot = unsafe { store.published_slot(local, self.base_bits) };
        if !slot.header.is_live(weak.key().generation()) {
            return None;
        }
        // SAFETY: `is_live` read the generation as odd with `Acquire`, so the
        // value is initialised; the view borrows the manager, which keeps
        // collection (the only thing that destroys values) away for `'a`.
        Some(unsafe { Store::value_unchecked(slot) })
    }

    /// True while the object has strong handles.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager.
    #[inline]
    pub fn is_alive(&self, weak: WeakHandle<T>) -> bool {
        self.get_weak(weak).is_some()
    }

    /// Reads an object through a strong handle: the same as [`ObjectManager::get`].
    ///
    /// # Panics
    ///
    /// Panics if the handle belongs to another manager.
    #[inline]
    pub fn get(&self, handle: &Handle<T>) -> &'a T {
        self.manager.get(handle)
    }

    /// A new strong handle from a weak one, while the object is live: the
    /// same as [`ObjectManager::upgrade`].
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager, or on reference count overflow.
    #[inline]
    #[track_caller]
    pub fn upgrade(&self, weak: WeakHandle<T>) -> Option<Handle<T>> {
        self.manager.upgrade(weak)
    }

    /// Iterates over the live objects of type `T`, in key order: the same as
    /// [`ObjectManager::iter`].
    pub fn iter(&self) -> Iter<'a, T> {
        match self.store {
            Some(store) => Iter { store: Some(store), local: 0, manager: self.manager.id },
            None => self.manager.iter(),
        }
    }
}

impl<T> std::fmt::Debug for ObjectView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectView").field("manager", &self.manager.id).finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for Iter<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iter").field("at", &self.local).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ObjectKey;
    use std::sync::atomic::{AtomicUsize as StdAtomicUsize, Ordering as StdOrdering};

    static DROPS: StdAtomicUsize = StdAtomicUsize::new(0);

    struct Texture {
        width: u32,
    }
    impl MMObject for Texture {
        const TYPE_NAME: &'static str = "Texture";
        const TAG: &'static str = "Textures";
    }

    struct Material {
        albedo: Handle<Texture>,
    }
    impl MMObject for Material {
        const TYPE_NAME: &'static str = "Material";
        const TAG: &'static str = "Material";
        fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
            visitor(self.albedo.key());
        }
    }

    struct Counted(#[allow(dead_code)] u64);
    impl MMObject for Counted {
        const TYPE_NAME: &'static str = "Counted";
        const TAG: &'static str = "Counted";
    }
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPS.fetch_add(1, StdOrdering::Relaxed);
        }
    }

    fn quiet() -> ObjectManager {
        ObjectManager::builder().report_leaks(false).segment_base(4).build()
    }

    #[test]
    fn create_get_release_collect() {
        let mut mm = quiet();
        let t = mm.create(Texture { width: 8 });
        assert_eq!(mm[&t].width, 8);
        mm[&t].width = 16;
        assert_eq!(mm.get(&t).width, 16);
        let w = t.downgrade();
        assert!(mm.is_alive(w));
        drop(t);
        assert!(!mm.is_alive(w));
        assert!(mm.upgrade(w).is_none());
        assert_eq!(mm.dead_count(), 1);
        assert_eq!(mm.len(), 0);
        let stats = mm.collect_garbage();
        assert_eq!((stats.objects, stats.rounds), (1, 1));
        assert_eq!(mm.dead_count(), 0);
    }

    #[test]
    fn cascade_finishes_in_one_call() {
        let mut mm = quiet();
        let t = mm.create(Texture { width: 1 });
        let m = mm.create(Material { albedo: t.clone() });
        drop(t);
        assert_eq!(mm.count::<Texture>(), 1);
        drop(m);
        let stats = mm.collect_garbage();
        assert_eq!(stats.objects, 2);
        assert!(mm.is_empty());
    }

    #[test]
    fn slot_reuse_never_validates_old_weak() {
        let mut mm = quiet();
        let a = mm.create(Texture { width: 1 });
        let old = a.downgrade();
        drop(a);
        mm.collect_garbage();
        let b = mm.create(Texture { width: 2 });
        assert_eq!(b.key().index(), old.key().index(), "the slot is reused");
        assert!(mm.get_weak(old).is_none());
        assert!(mm.upgrade(old).is_none());
        assert_eq!(mm.get_weak(b.downgrade()).unwrap().width, 2);
    }

    #[test]
    fn wrong_manager_is_detected() {
        let a = quiet();
        let b = quiet();
        let h = a.create(Texture { width: 1 });
        assert!(matches!(b.try_get(&h), Err(Error::WrongManager { .. })));
        assert!(matches!(b.try_get_weak(h.downgrade()), Err(Error::WrongManager { .. })));
        let caught = std::panic::catch_unwind(AssertUnwindSafe(|| b.get(&h).width));
        assert!(caught.is_err());
    }

    #[test]
    fn raw_handles_are_checked() {
        let mut mm = quiet();
        let h = mm.create(Texture { width: 1 });
        let keep = h.clone();
        let raw = h.into_raw();
        assert_eq!(keep.ref_count(), 2);
        mm.add_ref_raw(raw).unwrap();
        assert_eq!(keep.ref_count(), 3);
        mm.release_raw(raw).unwrap();
        assert!(matches!(mm.handle_from_raw::<Material>(raw), Err(Error::WrongType { .. })));
        let back = mm.handle_from_raw::<Texture>(raw).unwrap();
        assert_eq!(keep.ref_count(), 2);
        assert!(matches!(mm.release_raw(raw), Err(Error::DoubleRelease { .. })));
        assert!(matches!(mm.handle_from_raw::<Texture>(raw), Err(Error::DoubleRelease { .. })));
        assert_eq!(keep.ref_count(), 2, "failed calls change no count");
        drop(back);
        drop(keep);
        mm.collect_garbage();
        assert!(matches!(mm.add_ref_raw(raw), Err(Error::StaleHandle { .. })));
        let other = quiet();
        assert!(matches!(
            other.add_ref_raw(raw),
            Err(Error::WrongManager { .. }) | Err(Error::InvalidRawHandle { .. })
        ));
    }

    #[test]
    fn panicking_drop_leaves_manager_consistent() {
        struct Bomb(bool);
        impl MMObject for Bomb {
            const TYPE_NAME: &'static str = "Bomb";
            const TAG: &'static str = "Bomb";
        }
        impl Drop for Bomb {
            fn drop(&mut self) {
                if self.0 {
                    panic!("boom");
                }
            }
        }
        let mut mm = quiet();
        for i in 0..6 {
            drop(mm.create(Bomb(i == 3)));
        }
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| mm.collect_garbage()));
        assert!(result.is_err());
        let rest = mm.collect_garbage();
        assert_eq!(mm.dead_count(), 0);
        assert!(rest.objects < 6);
        let report = mm.report();
        assert_eq!(report.get("Bomb").unwrap().destroyed, 6, "no slot lost, none freed twice");
    }

    #[test]
    fn budgeted_collection_keeps_the_rest() {
        let mut mm = quiet();
        let before = DROPS.load(StdOrdering::Relaxed);
        for i in 0..10 {
            drop(mm.create(Counted(i)));
        }
        assert_eq!(mm.collect_garbage_budgeted(3).objects, 3);
        assert_eq!(mm.dead_count(), 7);
        let mut total = 3;
        while mm.dead_count() > 0 {
            total += mm.collect_garbage_budgeted(1).objects;
        }
        assert_eq!(total, 10);
        assert!(DROPS.load(StdOrdering::Relaxed) - before >= 10);
    }

    #[test]
    fn iter_and_counts() {
        let mm = quiet();
        let hs: Vec<_> = (0..10).map(|w| mm.create(Texture { width: w })).collect();
        assert_eq!(mm.count::<Texture>(), 10);
        let widths: Vec<u32> = mm.iter::<Texture>().map(|(_, t)| t.width).collect();
        assert_eq!(widths, (0..10).collect::<Vec<_>>());
        let (w, _) = mm.iter::<Texture>().nth(4).unwrap();
        assert_eq!(mm.get_weak(w).unwrap().width, 4);
        drop(hs);
        assert_eq!(mm.iter::<Texture>().count(), 0);
        assert_eq!(mm.iter::<Material>().count(), 0);
    }

    #[test]
    fn keys_are_unique_across_types() {
        let mm = quiet();
        let t = mm.create(Texture { width: 1 });
        let c = mm.create(Counted(1));
        assert_ne!(t.key().index(), c.key().index());
        let mut side = slotmap::SecondaryMap::new();
        side.insert(t.key(), "texture");
        side.insert(c.key(), "counted");
        assert_eq!(side[t.key()], "texture");
        assert_eq!(side[c.key()], "counted");
    }

    #[test]
    fn capacity_limit_hands_value_back() {
        let mm = ObjectManager::builder().report_leaks(false).max_objects_per_type(2).build();
        let _a = mm.create(Texture { width: 1 });
        let _b = mm.create(Texture { width: 2 });
        let err = mm.try_create(Texture { width: 3 }).unwrap_err();
        assert!(matches!(err.error, Error::CapacityExceeded { .. }));
        assert_eq!(err.into_value().width, 3);
    }

    #[test]
    fn threads_clone_and_drop_while_creating() {
        let mut mm = quiet();
        let n = if cfg!(miri) { 20 } else { 2000 };
        let shared: Vec<_> = (0..16).map(|w| mm.create(Texture { width: w })).collect();
        std::thread::scope(|s| {
            for t in 0..3 {
                let shared = &shared;
                s.spawn(move || {
                    for i in 0..n {
                        let h = shared[(i + t) % shared.len()].clone();
                        drop(h);
                    }
                });
            }
            let mm = &mm;
            s.spawn(move || {
                for i in 0..n {
                    let h = mm.create(Counted(i as u64));
                    assert_eq!(mm.get(&h).0, i as u64);
                }
            });
        });
        assert_eq!(mm.collect_garbage().objects, n);
        assert!(shared.iter().all(|h| h.ref_count() == 1));
    }

    /// `created` is derived from the free list's length (no counter on
    /// `create`): it must stay exact through reuse, bumps and collection.
    #[test]
    fn report_counts_created_and_destroyed_exactly() {
        let mut mm = quiet();
        let mut kept: Vec<_> = (0..5).map(|w| mm.create(Texture { width: w })).collect();
        kept.truncate(3);
        let line = |mm: &ObjectManager| mm.report().get("Texture").cloned().unwrap();
        assert_eq!((line(&mm).created, line(&mm).destroyed, line(&mm).live, line(&mm).dead_pending), (5, 0, 3, 2));
        assert_eq!(mm.collect_garbage().objects, 2);
        kept.extend((0..3).map(|w| mm.create(Texture { width: w }))); // two reused slots, one new
        let after = line(&mm);
        assert_eq!((after.created, after.destroyed, after.live, after.dead_pending), (8, 2, 6, 0));
        assert_eq!(mm.count::<Texture>(), 6);
        drop(kept);
        assert_eq!(mm.collect_garbage().objects, 6);
        let end = line(&mm);
        assert_eq!((end.created, end.destroyed, end.live), (8, 8, 0));
    }
}
