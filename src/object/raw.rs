//! Raw handles: the `u64` form of a handle for scripts and FFI, and the
//! checked protocol for its references (each store's raw-reference table
//! makes sure a raw handle never gives back more than it holds).

use std::panic::Location;

use crate::sync::Ordering;
use crate::{Error, Result};

use super::builder::manager_ids_made;
use super::manager::fail;
use super::owner_counts::Released;
use super::shared::reserve_raw_ref;
use super::slot::{AddRefError, ReleaseError, SlotHeader};
use super::store::{ErasedStore, Store};
use super::{Handle, HandleOrigin, MMObject, ObjectManager, RawHandle};

impl ObjectManager {
    fn resolve_raw(&self, raw: RawHandle) -> Result<(&dyn ErasedStore, u32, &SlotHeader)> {
        let tag = raw.manager_tag();
        let invalid = || Error::InvalidRawHandle { raw: raw.0 };
        if tag != self.id() & 0xff {
            // Every raw handle has an odd generation and the tag of a manager
            // that was made: anything else is garbage, not another manager's.
            // (Tags up to the next id, `made`, are taken as possible.)
            let made = manager_ids_made();
            if raw.generation() & 1 == 0 || (made < 0x100 && (tag == 0 || tag > made)) {
                return Err(invalid());
            }
            return Err(Error::WrongManager { expected: self.id(), found: tag });
        }
        if raw.generation() & 1 == 0 {
            return Err(invalid());
        }
        let (store_index, local) = self.registry().locate(raw.index()).ok_or_else(invalid)?;
        let store = self.registry().store_by_index(store_index).ok_or_else(invalid)?;
        let header = store.header(local).ok_or_else(invalid)?;
        Ok((store, local, header))
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
        let shared = store.shared();
        match header.add_ref(raw.generation(), shared.owner_thread, shared.cyclable) {
            Ok(()) => {
                *raw_refs.entry(local).or_insert(0) += 1;
                drop(raw_refs);
                #[cfg(feature = "handle-sites")]
                store.shared().handle_sites.register_raw(
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
        if !header.is_live(raw.generation()) && header.generation(Ordering::Acquire) != raw.generation() {
            return Err(Self::stale_raw(store, raw));
        }
        let mut raw_refs = store.shared().raw_refs.lock();
        let Some(count) = raw_refs.get_mut(&local).filter(|c| **c > 0) else {
            return Err(Error::DoubleRelease { type_name: store.type_name(), index: raw.index() });
        };
        let shared = store.shared();
        let note = || shared.note_candidate(local);
        let note_candidate = shared.cyclable.then_some(&note as &dyn Fn() -> bool);
        match header.try_release(raw.generation(), note_candidate, shared.owner_thread) {
            Ok(released) => {
                *count -= 1;
                if *count == 0 {
                    raw_refs.remove(&local);
                }
                drop(raw_refs);
                #[cfg(feature = "handle-sites")]
                store.shared().handle_sites.remove_raw(raw.index());
                if released == Released::Last {
                    shared.release_last(local, &header.word);
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
        if header.generation(Ordering::Acquire) != raw.generation() {
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
                store.shared().handle_sites.remove_raw(raw.index());
                let slot = store.slot_ptr(local).expect("resolved");
                // SAFETY: the raw handle held a counted reference (checked in
                // the raw table), which moves to the new handle.
                Ok(unsafe { Handle::from_counted(slot, HandleOrigin::FromRaw, Location::caller()) })
            }
            _ => Err(Error::DoubleRelease { type_name: T::TYPE_NAME, index: raw.index() }),
        }
    }

    /// Reads the object a raw handle names without changing any count: a
    /// script's "peek". `None` if the object is dead or destroyed.
    ///
    /// # Panics
    ///
    /// Panics if the raw handle belongs to another manager, is not a raw
    /// handle at all, or names an object of another type: see
    /// [`try_get_raw`](Self::try_get_raw).
    #[track_caller]
    pub fn get_raw<T: MMObject>(&self, raw: RawHandle) -> Option<&T> {
        match self.try_get_raw(raw) {
            Ok(value) => Some(value),
            Err(Error::StaleHandle { .. }) => None,
            Err(e) => fail(e),
        }
    }

    /// Reads the object a raw handle names without changing any count, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if the object is dead or destroyed,
    /// [`Error::WrongManager`] if the raw handle belongs to another manager,
    /// [`Error::WrongType`] if it names an object of another type,
    /// [`Error::InvalidRawHandle`] if it is no raw handle of this manager.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{Error, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Door { open: bool }
    /// #[derive(MMObject)]
    /// struct Key;
    ///
    /// let mut mm = ObjectManager::new();
    /// let raw = mm.create(Door { open: true }).into_raw();
    /// assert!(mm.try_get_raw::<Door>(raw).unwrap().open);
    /// assert!(matches!(mm.try_get_raw::<Key>(raw), Err(Error::WrongType { .. })));
    /// mm.release_raw(raw).unwrap();
    /// assert!(matches!(mm.try_get_raw::<Door>(raw), Err(Error::StaleHandle { .. })));
    /// ```
    pub fn try_get_raw<T: MMObject>(&self, raw: RawHandle) -> Result<&T> {
        let (erased, local, header) = self.resolve_raw(raw)?;
        let store = erased
            .as_any()
            .downcast_ref::<Store<T>>()
            .ok_or(Error::WrongType { expected: T::TYPE_NAME, found: erased.type_name() })?;
        if !header.is_live(raw.generation()) {
            return Err(Self::stale_raw(erased, raw));
        }
        let slot = store.slot(local).expect("resolved");
        // SAFETY: `is_live` read the generation as odd with `Acquire`, so the
        // value is initialised; `&self` keeps collection away.
        Ok(unsafe { Store::value_unchecked(slot) })
    }
}
