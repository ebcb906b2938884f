//! The type table and the stores: what the manager and its
//! [`Loader`](super::Loader)s share.
//!
//! The manager owns its registry through an `Arc`, and every [`Loader`](super::Loader)
//! holds another, so a loader can find (or register) a type's store and place an
//! object in it on any thread, even while the main thread holds
//! `&mut ObjectManager`. For that to be sound nothing ever takes `&mut Store`: every
//! store method takes `&self`, and the few that need the manager's exclusive access
//! (collection, shutdown) are `unsafe` with that as their contract.

use std::any::TypeId;
use std::hash::{Hash, Hasher};
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

use crate::sync::{AtomicUsize, Ordering};
use crate::track::Tracker;
use crate::{Error, Result};

use super::index_space::IndexSpace;
use super::open_gate::OpenGate;
use super::reentry::NamedMutex;
use super::store::{ErasedStore, SlotSource, Store, StoreConfig};
use super::store_alloc::StoreAlloc;
use super::{Handle, HandleOrigin, MMObject, TryCreateError};

/// Most object types one manager can hold.
pub const MAX_TYPES: usize = 256;
const TYPE_TABLE: usize = MAX_TYPES * 2;

/// A registered store, with the `TypeId` of its object type kept inline so
/// that a typed lookup by store index (a key's store) costs one compare
/// instead of two virtual calls (`as_any`, then `Any::type_id`).
///
/// # Invariants
///
/// `store` is a `Store<T>` for the `T` with `TypeId::of::<T>() == type_id`.
pub(crate) struct StoreEntry {
    pub(crate) type_id: TypeId,
    pub(crate) store: Box<dyn ErasedStore>,
}

/// What every store of a manager is made with.
#[derive(Debug)]
pub(crate) struct RegistryConfig {
    pub(crate) base_bits: u32,
    pub(crate) max_objects: u32,
    pub(crate) tracker: Option<&'static Tracker>,
    pub(crate) first_generation: u32,
    /// The owner thread's token (see `owner_counts.rs`), or 0 for none.
    pub(crate) owner: u64,
    /// Where store memory comes from, and the per-type overrides.
    pub(crate) alloc: StoreAlloc,
    pub(crate) alloc_for: Vec<(TypeId, StoreAlloc)>,
}

/// One entry of the type table: a type and its store, so that a typed
/// lookup (every `create`, `count`, `reserve` and view) is one probe and one
/// compare, with no second table.
///
/// # Invariants
///
/// `store` points at the `Store<T>` with `TypeId::of::<T>() == type_id`,
/// boxed in the registry's `stores`, so it lives (and does not move) as long
/// as the registry.
struct TypeEntry {
    type_id: TypeId,
    store: NonNull<()>,
}

// SAFETY: `store` points at a `Store<T>` owned by the registry (invariant);
// `ErasedStore: Send + Sync`, so sharing or sending the pointer with the
// registry is what sharing `&dyn ErasedStore` is.
unsafe impl Send for TypeEntry {}
// SAFETY: as above; the entry itself is never written after it is set.
unsafe impl Sync for TypeEntry {}

/// A manager's type table and stores.
///
/// # Invariants
///
/// - `types` is an open-addressed map from `TypeId` to store (see
///   [`TypeEntry`]); `stores` holds the stores by index. Entries of both are
///   set once, under `register_lock`, a store before its type entry, and
///   `store_count` (`Release`) counts the stores set.
/// - Stores are only ever borrowed shared. Changes that need the manager's
///   exclusive access go through `unsafe` store methods whose callers hold
///   `&mut ObjectManager`; loaders never call them.
/// - `gate` is open until the manager shuts down. A loader is inside it
///   for the whole of a create; shutdown closes it, which waits for every
///   create inside, so no loader touches a store after shutdown began.
pub(crate) struct Registry {
    pub(crate) id: u32,
    types: Box<[OnceLock<TypeEntry>; TYPE_TABLE]>,
    stores: Box<[OnceLock<StoreEntry>]>,
    store_count: AtomicUsize,
    register_lock: NamedMutex<()>,
    pub(crate) index_space: Arc<IndexSpace>,
    config: RegistryConfig,
    pub(crate) gate: OpenGate,
}

impl Registry {
    pub(crate) fn new(id: u32, config: RegistryConfig) -> Self {
        Registry {
            id,
            // On the heap, not inline: 22 KiB built on the stack would not
            // fit a small thread stack (loom's, or a job system's).
            types: (0..TYPE_TABLE)
                .map(|_| OnceLock::new())
                .collect::<Box<[_]>>()
                .try_into()
                .unwrap_or_else(|_| unreachable!("the table has `TYPE_TABLE` entries")),
            stores: (0..MAX_TYPES).map(|_| OnceLock::new()).collect(),
            store_count: AtomicUsize::new(0),
            register_lock: NamedMutex::new((), "registering an object type", ""),
            index_space: Arc::new(IndexSpace::new(config.alloc.clone())),
            config,
            gate: OpenGate::new(),
        }
    }

    #[inline]
    fn type_slot(type_id: TypeId) -> usize {
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

    #[inline]
    fn type_entry(&self, type_id: TypeId) -> Option<&TypeEntry> {
        let mut at = Self::type_slot(type_id);
        loop {
            match self.types[at].get() {
                None => return None,
                Some(entry) if entry.type_id == type_id => return Some(entry),
                Some(_) => at = (at + 1) % TYPE_TABLE,
            }
        }
    }

    /// `T`'s store, if it has one.
    #[inline]
    pub(crate) fn store<T: MMObject>(&self) -> Option<&Store<T>> {
        let entry = self.type_entry(TypeId::of::<T>())?;
        // SAFETY: the entry is `T`'s, so its pointer is to the registry's
        // live `Store<T>`, borrowed for as long as `self` (`TypeEntry`).
        Some(unsafe { entry.store.cast::<Store<T>>().as_ref() })
    }

    /// The store at `index`, if it is `T`'s.
    #[inline]
    pub(crate) fn store_at<T: MMObject>(&self, index: u32) -> Option<&Store<T>> {
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

    /// The store at `index`, untyped.
    pub(crate) fn store_by_index(&self, index: u32) -> Option<&dyn ErasedStore> {
        self.stores.get(index as usize)?.get().map(|e| &*e.store)
    }

    /// `T`'s store, registering it on first use.
    #[inline(always)]
    pub(crate) fn store_or_register<T: MMObject>(&self) -> Result<&Store<T>> {
        match self.store::<T>() {
            Some(store) => Ok(store),
            None => self.register::<T>(),
        }
    }

    /// Registers `T`'s store (or finds the one another thread just
    /// registered). Out of line: it runs once per type, and inlined, its
    /// frame weighed on every `create` (a level load 5 % slower).
    #[cold]
    #[inline(never)]
    fn register<T: MMObject>(&self) -> Result<&Store<T>> {
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
            base_bits: self.config.base_bits,
            max_objects: self.config.max_objects,
            first_generation: self.config.first_generation,
            owner: self.config.owner,
            tracker: self.config.tracker,
        };
        let alloc_for = self.config.alloc_for.iter().find(|(type_id, _)| *type_id == TypeId::of::<T>());
        let alloc = alloc_for.map_or(&self.config.alloc, |(_, a)| a).clone();
        // Store memory is never tracked (see `object/tracking.rs`), the descriptor included.
        let _untracked = crate::track::Reentry::enter();
        let store: Box<dyn ErasedStore> = Box::new(Store::<T>::new(config, Arc::clone(&self.index_space), alloc)?);
        if self.stores[index].set(StoreEntry { type_id: TypeId::of::<T>(), store }).is_err() {
            unreachable!("store entries are set once, under the register lock");
        }
        let boxed = &self.stores[index].get().expect("just set").store;
        let entry = TypeEntry { type_id: TypeId::of::<T>(), store: NonNull::from(&**boxed).cast::<()>() };
        let mut at = Self::type_slot(TypeId::of::<T>());
        while self.types[at].get().is_some() {
            at = (at + 1) % TYPE_TABLE;
        }
        if self.types[at].set(entry).is_err() {
            unreachable!("type entries are set once, under the register lock");
        }
        self.store_count.store(index + 1, Ordering::Release);
        Ok(self.store::<T>().expect("just registered"))
    }

    /// The stores registered so far, in index order.
    pub(crate) fn all_stores(&self) -> impl Iterator<Item = &dyn ErasedStore> {
        let count = self.store_count.load(Ordering::Acquire);
        self.stores[..count].iter().filter_map(|s| s.get().map(|e| &*e.store))
    }

    /// True if the manager has an owner thread (only then can an object be
    /// [`PENDING`](super::owner_counts::PENDING)).
    pub(crate) fn has_owner(&self) -> bool {
        self.config.owner != 0
    }

    /// The (store index, local slot index) a manager-wide index names.
    pub(crate) fn locate(&self, index: u32) -> Option<(u32, u32)> {
        self.index_space.resolve(index)
    }

    /// Creates an object in `T`'s store, taking its slot from `source`.
    ///
    /// Inlined into `ObjectManager::create`, and with it into its caller:
    /// the store lookup and the owner's common case
    /// ([`Store::try_create_common`]), about 1 KB of code, so that a loop of
    /// creates writes each value straight into its slot (see `BENCHMARKS.md`,
    /// O1b); the rest is out of line, once per type, in
    /// [`create_general`](Self::create_general).
    #[inline(always)]
    pub(crate) fn create_at<T: MMObject>(
        &self,
        value: T,
        site: &'static Location<'static>,
        strict_budget: bool,
        source: SlotSource,
    ) -> std::result::Result<Handle<T>, TryCreateError<T>> {
        let value = match (source, self.store::<T>()) {
            (SlotSource::Manager, Some(store)) => match store.try_create_common(value, site) {
                Ok(handle) => return Ok(handle),
                Err(value) => value,
            },
            _ => value,
        };
        self.create_general(value, site, strict_budget, source)
    }

    /// [`create_at`](Self::create_at) in every case: registering the type,
    /// a tracker, a loader, an iterator running, a store to grow.
    #[cold]
    #[inline(never)]
    fn create_general<T: MMObject>(
        &self,
        value: T,
        site: &'static Location<'static>,
        strict_budget: bool,
        source: SlotSource,
    ) -> std::result::Result<Handle<T>, TryCreateError<T>> {
        let store = match self.store_or_register::<T>() {
            Ok(store) => store,
            Err(error) => return Err(TryCreateError { value, error }),
        };
        match store.try_insert(value, site, strict_budget, source) {
            Ok(slot) => {
                // SAFETY: `try_insert` returns an occupied slot of this store
                // with a count of one, which the new handle takes over.
                Ok(unsafe { Handle::from_counted(slot, HandleOrigin::Created, site) })
            }
            Err((value, error)) => Err(TryCreateError { value, error }),
        }
    }

    /// [`ObjectManager::create_many`](crate::ObjectManager::create_many)'s
    /// work: the store found once, then [`Store::insert_many`]. Out of line,
    /// once per type and iterator.
    #[inline(never)]
    pub(crate) fn create_many_at<T: MMObject>(
        &self,
        mut values: impl Iterator<Item = T>,
        site: &'static Location<'static>,
        strict_budget: bool,
        source: SlotSource,
        handles: &mut Vec<Handle<T>>,
    ) -> std::result::Result<(), TryCreateError<T>> {
        let store = match self.store_or_register::<T>() {
            Ok(store) => store,
            Err(error) => return values.next().map_or(Ok(()), |value| Err(TryCreateError { value, error })),
        };
        handles.reserve(values.size_hint().0);
        store
            .insert_many(values, site, strict_budget, source, handles)
            .map_err(|(value, error)| TryCreateError { value, error })
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("id", &self.id)
            .field("types", &self.store_count.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
