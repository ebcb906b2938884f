//! The object manager: its handle on the registry, creation, counts and reports.
//!
//! The rest of its methods live beside what they do: `access.rs` (reads and
//! writes), `raw.rs` (raw handles), `collect.rs` (collection and destroy
//! events), `shutdown.rs`, `view.rs` and `iter.rs`, and `loader.rs`.

use std::ops::{Index, IndexMut};
use std::panic::Location;
use std::sync::Arc;

use crate::{Error, Result};

use super::builder::ObjectManagerBuilder;
use super::handle::MAX_MANAGER_ID;
use super::registry::Registry;
use super::report::ObjectMemoryReport;
use super::store::{ErasedObject, ErasedStore, SlotSource, Store};
use super::{Destroyed, Handle, MMObject, ObjectKey};

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
    /// The registry's id and whether it has an owner thread, kept here for
    /// the checks of every access.
    check: ReadCheck,
    registry: Arc<Registry>,
    pub(crate) report_leaks: bool,
    /// Destroy events not yet drained, when recorded.
    pub(crate) destroyed: Option<Vec<Destroyed>>,
    pub(crate) shut_down: bool,
}

/// A manager's id (low 16 bits) and whether it has an owner thread
/// ([`OWNED`](Self::OWNED)), in one word: a loop of weak reads loads it once
/// per read (their `Acquire` loads keep the compiler from hoisting it out of
/// the loop), and every load counts in a loop of cache misses (see
/// `BENCHMARKS.md`, O4).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReadCheck(u32);

impl ReadCheck {
    /// Set if the manager has an owner thread: only then can an object be
    /// [`PENDING`](super::owner_counts::PENDING), so only then does a read
    /// load the slot's reservation.
    const OWNED: u32 = 1 << 16;

    fn new(id: u32, owned: bool) -> Self {
        assert!(id <= MAX_MANAGER_ID, "manager ids are 16 bits");
        ReadCheck(id | if owned { Self::OWNED } else { 0 })
    }

    /// The manager's id.
    #[inline]
    pub(crate) fn id(self) -> u32 {
        self.0 & MAX_MANAGER_ID
    }

    /// True if the manager has an owner thread.
    #[inline]
    pub(crate) fn owned(self) -> bool {
        self.0 & Self::OWNED != 0
    }
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

    pub(crate) fn from_parts(registry: Arc<Registry>, report_leaks: bool, destroyed: Option<Vec<Destroyed>>) -> Self {
        ObjectManager {
            check: ReadCheck::new(registry.id, registry.has_owner()),
            registry,
            report_leaks,
            destroyed,
            shut_down: false,
        }
    }

    /// This manager's id, unique in the process.
    pub fn id(&self) -> u32 {
        self.check.id()
    }

    /// True if the manager has an owner thread.
    #[inline]
    pub(crate) fn owned(&self) -> bool {
        self.check.owned()
    }

    /// What a read checks, in one word.
    #[inline]
    pub(crate) fn read_check(&self) -> ReadCheck {
        self.check
    }

    // ---- stores ------------------------------------------------------------

    pub(crate) fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    #[inline]
    pub(crate) fn store<T: MMObject>(&self) -> Option<&Store<T>> {
        self.registry.store::<T>()
    }

    /// The (store index, local slot index) a key's manager-wide index names.
    pub(crate) fn locate_key(&self, key: ObjectKey) -> Option<(u32, u32)> {
        self.registry.locate(key.index())
    }

    pub(crate) fn all_stores(&self) -> impl Iterator<Item = &dyn ErasedStore> {
        self.registry.all_stores()
    }

    /// The live object `key` names, for writing, untyped.
    pub(crate) fn live_object_mut(&mut self, key: ObjectKey) -> Option<&mut dyn ErasedObject> {
        let (store_index, local) = self.locate_key(key)?;
        let store = self.registry.store_by_index(store_index)?;
        // SAFETY: we hold `&mut self`, and the result borrows it.
        unsafe { store.live_object_mut(local, key.generation()) }
    }

    // ---- creation ------------------------------------------------------------

    /// Creates an object and returns the first handle to it.
    ///
    /// The caller's location is recorded as the creation site, for the leak
    /// report. Safe to call from several threads at once. The object is
    /// visible at once: to `get` through the handle, to `upgrade`, and to
    /// iterators made after this returns (an iterator already running never
    /// yields it).
    ///
    /// The common case is part of this function, which is always inlined:
    /// on the thread that last collected (at first, the one that made the
    /// type's store), with no tracker and no iterator running, the object
    /// takes a slot the last collection freed, or the next fresh one, with
    /// plain loads and stores, and the value is written straight into it.
    /// Other threads, a tracker, a running iterator and a store that must
    /// grow take one out-of-line call. That is about 1 KB of code at each
    /// call site. Out of line, a create cost half as much again: the value
    /// went through the stack, and the call's own stores queued behind
    /// the new slot's (see `BENCHMARKS.md`, O1b). Where many objects are
    /// made at once, [`create_many`](Self::create_many) is faster still,
    /// from one call site.
    ///
    /// # Panics
    ///
    /// Panics with the [`try_create`](Self::try_create) error's message if the
    /// type's store is full; with a [tracker](ObjectManagerBuilder::tracker),
    /// also if the type's tag goes over budget under the `Error` or `Panic`
    /// policy (the `Log` and `Callback` policies let the object be created).
    #[inline(always)]
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
    /// already holds [`MAX_TYPES`](crate::object::MAX_TYPES) types. [`Error::BudgetExceeded`] when the
    /// manager has a [tracker](ObjectManagerBuilder::tracker) and the object's
    /// `size()` would take its tag over budget, whatever the tag's policy.
    #[track_caller]
    pub fn try_create<T: MMObject>(&self, value: T) -> std::result::Result<Handle<T>, TryCreateError<T>> {
        self.create_at(value, Location::caller(), true)
    }

    /// Creates one object from each value, in order, and returns their
    /// handles in the same order: what a loop of [`create`](Self::create)
    /// calls at this line would return, with less work per object.
    ///
    /// For level loads and spawn waves. The type's store is found and the
    /// creation site numbered once per call, not once per object, and
    /// never-used slots are taken a run at a time (sized by the iterator's
    /// `size_hint`); free slots are reused first, as `create` does. Every
    /// object records the caller's location as its creation site.
    ///
    /// # Panics
    ///
    /// As [`create`](Self::create), at the first value that cannot be
    /// stored; the objects made before it are released (their handles drop
    /// during the unwind) and destroyed by the next collection. Use
    /// [`try_create_many`](Self::try_create_many) to keep them.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Tree { x: f32, y: f32 }
    ///
    /// let mm = ObjectManager::new();
    /// let forest = mm.create_many((0..1000).map(|i| Tree { x: i as f32, y: 0.0 }));
    /// assert_eq!(forest.len(), 1000);
    /// assert_eq!(mm[&forest[10]].x, 10.0);
    /// assert_eq!(mm.count::<Tree>(), 1000);
    /// ```
    #[track_caller]
    pub fn create_many<T: MMObject>(&self, values: impl IntoIterator<Item = T>) -> Vec<Handle<T>> {
        let mut handles = Vec::new();
        if let Err(e) = self.registry.create_many_at(
            values.into_iter(),
            Location::caller(),
            false,
            SlotSource::Manager,
            &mut handles,
        ) {
            fail(e.error)
        }
        handles
    }

    /// Creates one object from each value, in order, pushing their handles
    /// onto `handles`, until a value cannot be stored: the
    /// [`try_create`](Self::try_create) of [`create_many`](Self::create_many).
    ///
    /// Nothing is lost on an error: the objects made before the refused value
    /// keep their handles in `handles`, the error hands the refused value
    /// back, and the values after it stay in the iterator (pass
    /// `iter.by_ref()` to keep it).
    ///
    /// # Errors
    ///
    /// As [`try_create`](Self::try_create), for the first value refused.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Spark { life: u32 }
    ///
    /// let mm = ObjectManager::builder().max_objects_per_type(64).build();
    /// let mut sparks = Vec::new();
    /// let mut wave = (0..100).map(|life| Spark { life });
    /// let refused = mm.try_create_many(wave.by_ref(), &mut sparks).unwrap_err();
    /// assert_eq!(sparks.len(), 64, "the first 64 were made");
    /// assert_eq!(refused.value.life, 64, "the 65th is handed back");
    /// assert_eq!(wave.next().map(|s| s.life), Some(65), "the rest are still in the iterator");
    /// ```
    #[track_caller]
    pub fn try_create_many<T: MMObject>(
        &self,
        values: impl IntoIterator<Item = T>,
        handles: &mut Vec<Handle<T>>,
    ) -> std::result::Result<(), TryCreateError<T>> {
        self.registry.create_many_at(values.into_iter(), Location::caller(), true, SlotSource::Manager, handles)
    }

    #[inline]
    fn create_at<T: MMObject>(
        &self,
        value: T,
        site: &'static Location<'static>,
        strict_budget: bool,
    ) -> std::result::Result<Handle<T>, TryCreateError<T>> {
        self.registry.create_at(value, site, strict_budget, SlotSource::Manager)
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
    /// is full, or if `additional` more slots would pass the type's
    /// [`max_objects_per_type`](ObjectManagerBuilder::max_objects_per_type)
    /// (then nothing is allocated). Segments allocated before the failure
    /// stay, and nothing else changes.
    pub fn try_reserve<T: MMObject>(&self, additional: usize) -> Result<()> {
        self.registry.store_or_register::<T>()?.reserve(additional)
    }

    // ---- counts and reports ----------------------------------------------------

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
}

/// Logs a warning, or writes it to stderr when no logger would show it.
pub(crate) fn emit(message: &str) {
    if log::log_enabled!(target: "mmobject", log::Level::Warn) {
        log::warn!(target: "mmobject", "{message}");
    } else {
        eprintln!("WARN mmobject: {message}");
    }
}

#[cold]
#[inline(never)]
#[track_caller]
pub(crate) fn fail(error: Error) -> ! {
    panic!("{error}")
}

#[cold]
#[inline(never)]
#[track_caller]
pub(crate) fn wrong_manager(expected: u32, found: u32) -> ! {
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
            .field("id", &self.id())
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
