//! Reading and writing objects: through handles, weak handles, keys, and
//! several at once.

use std::panic::Location;
use std::ptr::NonNull;

use crate::sync::Ordering;
use crate::{Error, Result};

use super::handle::{check_manager, ManagerTagged};
use super::layout::Chunks;
use super::manager::{fail, ReadCheck};
use super::slot::{AddRefError, Slot};
use super::store::Store;
use super::{Handle, HandleOrigin, MMObject, ObjectKey, ObjectManager, ObjectViewMut, WeakHandle};

impl ObjectManager {
    #[inline]
    pub(crate) fn check_manager(&self, handle: &impl ManagerTagged) -> Result<()> {
        check_manager(handle, self.id())
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
        self.check_manager(handle)?;
        let slot = handle.slot();
        debug_assert!(slot.header.generation.load(Ordering::Relaxed) & 1 == 1, "a handle's slot is occupied");
        // SAFETY: the handle is counted, so its slot is occupied and its value
        // initialised; it belongs to this manager, and `&self` keeps
        // collection and `release_many` (the only things that destroy
        // values, both under `&mut`) away.
        Ok(unsafe { slot.value_ref() })
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
        self.check_manager(handle)?;
        // SAFETY: as in `try_get`; `&mut self` also excludes every other
        // reference to objects of this manager.
        Ok(unsafe { handle.slot().value_mut() })
    }

    /// The weak handle's slot if its object is live.
    ///
    /// # Safety
    ///
    /// The weak handle must belong to this manager (`weak.manager_id() ==
    /// self.id()`), and `check` is this manager's [`read_check`](Self::read_check).
    #[inline]
    unsafe fn live_slot<T: MMObject>(&self, weak: WeakHandle<T>, check: ReadCheck) -> Option<&Slot<T>> {
        // SAFETY: the caller's contract; a published slot lives as long as its store.
        unsafe { self.live_slot_ptr(weak, check) }.map(|slot| unsafe { slot.as_ref() })
    }

    /// [`live_slot`](Self::live_slot) as a pointer that may become a
    /// [`Handle`] (it carries the segment's provenance).
    ///
    /// # Safety
    ///
    /// As for `live_slot`.
    #[inline]
    unsafe fn live_slot_ptr<T: MMObject>(&self, weak: WeakHandle<T>, check: ReadCheck) -> Option<NonNull<Slot<T>>> {
        // SAFETY: the weak handle belongs to this manager (caller), so
        // (`WeakHandle` invariant) it names a slot of this manager's `T`
        // store, in a segment that lives as long as the manager.
        let slot = unsafe { weak.slot_ptr() };
        // SAFETY: the slot is initialised and lives as long as the store.
        unsafe { slot.as_ref() }.header.is_live_in(weak.generation(), check.owned()).then_some(slot)
    }

    #[inline]
    fn weak_slot<T: MMObject>(&self, weak: WeakHandle<T>) -> Result<&Slot<T>> {
        // SAFETY: a published slot lives as long as its store.
        self.weak_slot_ptr(weak).map(|slot| unsafe { slot.as_ref() })
    }

    #[inline]
    fn weak_slot_ptr<T: MMObject>(&self, weak: WeakHandle<T>) -> Result<NonNull<Slot<T>>> {
        let check = self.read_check();
        check_manager(&weak, check.id())?;
        // SAFETY: the manager id was checked just above.
        unsafe { self.live_slot_ptr(weak, check) }.ok_or_else(|| Error::StaleHandle {
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
        let check = self.read_check();
        if let Err(e) = check_manager(&weak, check.id()) {
            fail(e)
        }
        // SAFETY: the manager id was checked just above.
        let slot = unsafe { self.live_slot(weak, check) }?;
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
            Ok(slot) => Some(unsafe { slot.value_mut() }),
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
    /// A destroyed object is never revived. Once the last strong handle is
    /// gone this returns `None`, even before the object is collected, with
    /// one exception when the manager has an [owner
    /// thread](super::ObjectManagerBuilder::owner_thread): if that last
    /// handle was dropped on another thread while the owner held counts on
    /// the object, threads other than the owner may still upgrade it until
    /// the owner's next collection (the object then stays alive), and weak
    /// reads may still see it.
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
    /// [`Error::RefCountOverflow`] past 2^29 references.
    #[track_caller]
    pub fn try_upgrade<T: MMObject>(&self, weak: WeakHandle<T>) -> Result<Handle<T>> {
        let slot = self.weak_slot_ptr(weak)?;
        let key = weak.key();
        // SAFETY: a weak handle's slot is a published segment's, with its
        // provenance, so its chunk header may be read; the slot lives as long as its store.
        let (chunk, header) = unsafe { (Chunks::<T>::header(slot), &slot.as_ref().header) };
        match header.add_ref(key.generation(), chunk.owner_thread, chunk.cyclable) {
            Ok(()) => {
                // SAFETY: we just counted a reference to this occupied slot.
                Ok(unsafe { Handle::from_counted(slot, HandleOrigin::Upgraded, Location::caller()) })
            }
            Err(AddRefError::Stale) => {
                Err(Error::StaleHandle { type_name: T::TYPE_NAME, index: key.index(), generation: key.generation() })
            }
            Err(AddRefError::Overflow) => Err(Error::RefCountOverflow { type_name: T::TYPE_NAME, index: key.index() }),
        }
    }

    // ---- keys ------------------------------------------------------------------

    /// The slot a key names, if it is a live `T`.
    fn key_slot<T: MMObject>(&self, key: ObjectKey) -> Result<&Slot<T>> {
        let (store_index, local) = self.locate_key(key).ok_or(Error::UnknownKey { index: key.index() })?;
        let Some(store) = self.registry().store_at::<T>(store_index) else {
            let found = self.registry().store_by_index(store_index).map_or("?", |s| s.type_name());
            return Err(Error::WrongType { expected: T::TYPE_NAME, found });
        };
        let slot = store.used_slot(local).ok_or(Error::UnknownKey { index: key.index() })?;
        if !slot.header.is_live_in(key.generation(), self.owned()) {
            return Err(Error::StaleHandle {
                type_name: T::TYPE_NAME,
                index: key.index(),
                generation: key.generation(),
            });
        }
        Ok(slot)
    }

    /// Reads the object an [`ObjectKey`] names, if it is a live `T`: the
    /// typed lookup for side tables keyed by `ObjectKey` (a
    /// `slotmap::SecondaryMap`, a [`Destroyed`](crate::Destroyed) event).
    ///
    /// A key carries no manager id, so a key of another manager is only
    /// caught if it names no slot here, a slot of another type, or a slot
    /// whose generation differs (generations start at a different value in
    /// each manager). Use handles where the manager check matters.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Mesh { vertices: u32 }
    /// #[derive(MMObject)]
    /// struct Texture { width: u32 }
    ///
    /// let mm = ObjectManager::new();
    /// let mesh = mm.create(Mesh { vertices: 3 });
    /// let key = mesh.key();
    /// assert_eq!(mm.get_by_key::<Mesh>(key).map(|m| m.vertices), Some(3));
    /// assert!(mm.get_by_key::<Texture>(key).is_none(), "another type");
    /// assert!(mm.try_get_by_key::<Texture>(key).is_err());
    /// ```
    pub fn get_by_key<T: MMObject>(&self, key: ObjectKey) -> Option<&T> {
        self.try_get_by_key(key).ok()
    }

    /// Reads the object an [`ObjectKey`] names, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownKey`] if the key names no slot of this manager,
    /// [`Error::WrongType`] if it names a slot of another type,
    /// [`Error::StaleHandle`] if its object is dead or destroyed.
    pub fn try_get_by_key<T: MMObject>(&self, key: ObjectKey) -> Result<&T> {
        let slot = self.key_slot::<T>(key)?;
        // SAFETY: `key_slot` saw the slot live with `Acquire`, so the value is
        // initialised; `&self` keeps collection away.
        Ok(unsafe { Store::value_unchecked(slot) })
    }

    /// Writes the object an [`ObjectKey`] names, if it is a live `T`.
    pub fn get_by_key_mut<T: MMObject>(&mut self, key: ObjectKey) -> Option<&mut T> {
        let slot = self.key_slot::<T>(key).ok()?;
        // SAFETY: live slot (value initialised) and `&mut self` is exclusive.
        Some(unsafe { slot.value_mut() })
    }

    // ---- several at once -----------------------------------------------------

    /// Writes several objects of one type at once, as
    /// `slotmap::SlotMap::get_disjoint_mut` does.
    ///
    /// # Panics
    ///
    /// Panics if two handles name the same object, or a handle belongs to
    /// another manager: see [`try_get_disjoint_mut`](Self::try_get_disjoint_mut).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Body { velocity: f32 }
    ///
    /// let mut mm = ObjectManager::new();
    /// let (a, b) = (mm.create(Body { velocity: 1.0 }), mm.create(Body { velocity: -1.0 }));
    /// let [x, y] = mm.get_disjoint_mut([&a, &b]);
    /// std::mem::swap(&mut x.velocity, &mut y.velocity);
    /// assert_eq!(mm[&a].velocity, -1.0);
    /// ```
    #[track_caller]
    pub fn get_disjoint_mut<T: MMObject, const N: usize>(&mut self, handles: [&Handle<T>; N]) -> [&mut T; N] {
        self.try_get_disjoint_mut(handles).unwrap_or_else(|e| fail(e))
    }

    /// Writes several objects of one type at once, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::AliasedHandles`] if two handles name the same object;
    /// [`Error::WrongManager`] if a handle belongs to another manager.
    pub fn try_get_disjoint_mut<T: MMObject, const N: usize>(
        &mut self,
        handles: [&Handle<T>; N],
    ) -> Result<[&mut T; N]> {
        // SAFETY: `&mut self` gives exclusive access for the view's lifetime.
        unsafe { ObjectViewMut::new_lazy(self.registry()) }.try_into_disjoint_mut(handles)
    }

    /// Writes several objects of one type at once through weak handles;
    /// `None` if any of them is dead.
    ///
    /// # Panics
    ///
    /// Panics if two weak handles name the same object, or one belongs to
    /// another manager.
    #[track_caller]
    pub fn get_disjoint_weak_mut<T: MMObject, const N: usize>(
        &mut self,
        weaks: [WeakHandle<T>; N],
    ) -> Option<[&mut T; N]> {
        match self.try_get_disjoint_weak_mut(weaks) {
            Ok(values) => Some(values),
            Err(Error::StaleHandle { .. }) => None,
            Err(e) => fail(e),
        }
    }

    /// Writes several objects of one type at once through weak handles, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if one is dead; [`Error::AliasedHandles`] if
    /// two name the same object; [`Error::WrongManager`].
    pub fn try_get_disjoint_weak_mut<T: MMObject, const N: usize>(
        &mut self,
        weaks: [WeakHandle<T>; N],
    ) -> Result<[&mut T; N]> {
        self.view_mut::<T>().try_into_disjoint_weak_mut(weaks)
    }
}
