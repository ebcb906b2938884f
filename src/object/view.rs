//! Typed views of one object type: [`ObjectView`] (shared), [`ObjectViewMut`]
//! (exclusive), and [`Views`], which hands out views of several types at
//! once, checked at run time in the manner of `RefCell`.

use std::cell::Cell;
use std::marker::PhantomData;

use crate::{Error, Result};

use super::handle::{check_manager, ManagerTagged};
use super::iter::{Iter, IterMut};
use super::manager::{fail, wrong_manager};
use super::registry::{Registry, MAX_TYPES};
use super::slot::Slot;
use super::store::Store;
use super::{Handle, MMObject, ObjectManager, WeakHandle};

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
/// `manager_id` is a copy of the manager's id, and `owned` says whether the
/// manager has an owner thread (both kept here so that a loop holds them in
/// registers).
pub struct ObjectView<'a, T> {
    pub(crate) manager: &'a ObjectManager,
    pub(crate) store: Option<&'a Store<T>>,
    pub(crate) manager_id: u32,
    pub(crate) owned: bool,
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
        if !weak.belongs_to(self.manager_id) {
            wrong_manager(self.manager_id, weak.manager_id())
        }
        // SAFETY: the weak handle belongs to this manager, which the view
        // borrows, so (`WeakHandle` invariant) it names a slot of this
        // manager's `T` store in a segment that stays allocated for `'a`
        // (whether or not the store existed when the view was made).
        let slot = unsafe { weak.slot_ptr().as_ref() };
        if !slot.header.is_live_in(weak.generation(), self.owned) {
            return None;
        }
        // SAFETY: `is_live` read the generation as odd with `Acquire`, so the
        // value is initialised; the view borrows the manager, which keeps
        // collection and `release_many` (the only things that destroy
        // values, both under `&mut`) away for `'a`.
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

    /// Reads an object through a strong handle: the same as
    /// [`ObjectManager::get`], checked against the view's copy of the
    /// manager id (which a loop keeps in a register).
    ///
    /// # Panics
    ///
    /// Panics if the handle belongs to another manager.
    #[inline]
    pub fn get(&self, handle: &Handle<T>) -> &'a T {
        if !handle.belongs_to(self.manager_id) {
            wrong_manager(self.manager_id, handle.manager_id())
        }
        // SAFETY: the handle is counted, so its slot is occupied and its
        // value initialised; it belongs to this manager, which the view
        // borrows for `'a`, keeping collection and `release_many` (the only
        // things that destroy values, both under `&mut`) away.
        unsafe { handle.slot().value_ref() }
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
            Some(store) => Iter::new(Some(store), self.manager_id),
            None => self.manager.iter(),
        }
    }

    /// Live objects of type `T`: the same as [`ObjectManager::count`].
    pub fn count(&self) -> usize {
        self.manager.count::<T>()
    }
}

impl<T> std::fmt::Debug for ObjectView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectView").field("manager", &self.manager_id).finish_non_exhaustive()
    }
}

/// Exclusive access to the objects of one type: see
/// [`ObjectManager::view_mut`] and [`Views::view_mut`].
///
/// It writes objects through strong and weak handles, several at once
/// ([`get_disjoint_mut`](Self::get_disjoint_mut)), and all of them
/// ([`iter_mut`](Self::iter_mut)), with the same checks as the manager's own
/// methods. Made by [`Views`], it works beside views of other types.
///
/// # Examples
///
/// ```
/// use mmobject::{Handle, MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Node { value: u32, children: Vec<Handle<Node>> }
///
/// let mut mm = ObjectManager::new();
/// let leaf = mm.create(Node { value: 1, children: vec![] });
/// let root = mm.create(Node { value: 10, children: vec![leaf.clone()] });
///
/// let mut nodes = mm.view_mut::<Node>();
/// let [parent, child] = nodes.get_disjoint_mut([&root, &leaf]);
/// child.value += parent.value;
/// for (_, node) in nodes.iter_mut() {
///     node.value *= 2;
/// }
/// assert_eq!(mm[&leaf].value, 22);
/// ```
///
/// # Invariants
///
/// The view has exclusive access to the values of `T` in `registry`'s
/// manager for `'a`: it was made from `&'a mut ObjectManager`, or by a
/// [`Views`] that gave no other view of `T`. `store`, if set, is that
/// manager's store for `T`; `manager_id` is its id.
pub struct ObjectViewMut<'a, T> {
    registry: &'a Registry,
    store: Option<&'a Store<T>>,
    manager_id: u32,
    /// Hands out `&'a mut T`: invariant in `T`, as `&'a mut T` is.
    _values: PhantomData<&'a mut T>,
}

impl<'a, T: MMObject> ObjectViewMut<'a, T> {
    /// # Safety
    ///
    /// The caller gives the view exclusive access to the values of `T` in
    /// `registry`'s manager for `'a` (the type's invariant).
    pub(crate) unsafe fn new(registry: &'a Registry) -> Self {
        ObjectViewMut { registry, store: registry.store::<T>(), manager_id: registry.id, _values: PhantomData }
    }

    /// As [`new`](Self::new), leaving the store to be looked up when first
    /// needed (calls through strong handles never need it).
    ///
    /// # Safety
    ///
    /// As for [`new`](Self::new).
    pub(crate) unsafe fn new_lazy(registry: &'a Registry) -> Self {
        ObjectViewMut { registry, store: None, manager_id: registry.id, _values: PhantomData }
    }

    /// The store, looked up again if `T` had none when the view was made (a
    /// loader may have registered it since).
    fn store(&self) -> Option<&'a Store<T>> {
        self.store.or_else(|| self.registry.store::<T>())
    }

    fn check_manager(&self, handle: &impl ManagerTagged) -> Result<()> {
        check_manager(handle, self.manager_id)
    }

    /// The slot of a handle of this manager.
    fn handle_slot(&self, handle: &Handle<T>) -> Result<&'a Slot<T>> {
        self.check_manager(handle)?;
        let slot: *const Slot<T> = handle.slot();
        // SAFETY: the handle belongs to this manager, so its slot lies in a
        // segment of the manager's `T` store, which lives as long as the
        // registry the view borrows for `'a`.
        Ok(unsafe { &*slot })
    }

    /// The slot of a weak handle of this manager, if its object is live.
    fn weak_slot(&self, weak: WeakHandle<T>) -> Result<&'a Slot<T>> {
        self.check_manager(&weak)?;
        let stale = || Error::StaleHandle {
            type_name: T::TYPE_NAME,
            index: weak.key().index(),
            generation: weak.key().generation(),
        };
        // SAFETY: the weak handle belongs to this manager (checked above), so
        // (`WeakHandle` invariant) it names a slot of its `T` store, whose
        // segments live as long as the registry the view borrows for `'a`.
        let slot = unsafe { weak.slot_ptr().as_ref() };
        slot.header.is_live(weak.generation()).then_some(slot).ok_or_else(stale)
    }

    /// Reads an object.
    ///
    /// # Panics
    ///
    /// Panics if the handle belongs to another manager.
    #[track_caller]
    pub fn get(&self, handle: &Handle<T>) -> &T {
        self.try_get(handle).unwrap_or_else(|e| fail(e))
    }

    /// Reads an object, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::WrongManager`] if the handle belongs to another manager.
    pub fn try_get(&self, handle: &Handle<T>) -> Result<&T> {
        let slot = self.handle_slot(handle)?;
        // SAFETY: a counted handle's slot is occupied (value initialised); the
        // view's exclusive access (invariant) is borrowed shared here.
        Ok(unsafe { Store::value_unchecked(slot) })
    }

    /// Writes an object.
    ///
    /// # Panics
    ///
    /// Panics if the handle belongs to another manager.
    #[track_caller]
    pub fn get_mut(&mut self, handle: &Handle<T>) -> &mut T {
        self.try_get_mut(handle).unwrap_or_else(|e| fail(e))
    }

    /// Writes an object, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::WrongManager`] if the handle belongs to another manager.
    pub fn try_get_mut(&mut self, handle: &Handle<T>) -> Result<&mut T> {
        let slot = self.handle_slot(handle)?;
        // SAFETY: a counted handle's slot is occupied; the view's exclusive
        // access (invariant) is borrowed mutably here.
        Ok(unsafe { slot.value_mut() })
    }

    /// Reads an object through a weak handle; `None` once it is dead.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager.
    #[track_caller]
    pub fn get_weak(&self, weak: WeakHandle<T>) -> Option<&T> {
        match self.weak_slot(weak) {
            // SAFETY: live slot (value initialised); shared use of the view's access.
            Ok(slot) => Some(unsafe { Store::value_unchecked(slot) }),
            Err(Error::StaleHandle { .. }) => None,
            Err(e) => fail(e),
        }
    }

    /// Writes an object through a weak handle; `None` once it is dead.
    ///
    /// # Panics
    ///
    /// Panics if the weak handle belongs to another manager.
    #[track_caller]
    pub fn get_weak_mut(&mut self, weak: WeakHandle<T>) -> Option<&mut T> {
        match self.try_get_weak_mut(weak) {
            Ok(value) => Some(value),
            Err(Error::StaleHandle { .. }) => None,
            Err(e) => fail(e),
        }
    }

    /// Writes an object through a weak handle, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if the object is dead or destroyed;
    /// [`Error::WrongManager`] if the weak handle belongs to another manager.
    pub fn try_get_weak_mut(&mut self, weak: WeakHandle<T>) -> Result<&mut T> {
        let slot = self.weak_slot(weak)?;
        // SAFETY: live slot; the view's exclusive access is borrowed mutably.
        Ok(unsafe { slot.value_mut() })
    }

    /// Writes several objects at once.
    ///
    /// # Panics
    ///
    /// Panics if two handles name the same object, or one belongs to another manager.
    #[track_caller]
    pub fn get_disjoint_mut<const N: usize>(&mut self, handles: [&Handle<T>; N]) -> [&mut T; N] {
        self.try_get_disjoint_mut(handles).unwrap_or_else(|e| fail(e))
    }

    /// Writes several objects at once, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::AliasedHandles`] if two handles name the same object;
    /// [`Error::WrongManager`] if one belongs to another manager.
    pub fn try_get_disjoint_mut<const N: usize>(&mut self, handles: [&Handle<T>; N]) -> Result<[&mut T; N]> {
        let mut slots = [std::ptr::null(); N];
        for (at, handle) in handles.iter().enumerate() {
            slots[at] = self.handle_slot(handle)?;
        }
        // SAFETY: every entry is from `handle_slot`.
        unsafe { self.disjoint(slots, |at| handles[at].key().index()) }
    }

    /// Writes several objects at once through weak handles; `None` if any is dead.
    ///
    /// # Panics
    ///
    /// Panics if two weak handles name the same object, or one belongs to another manager.
    #[track_caller]
    pub fn get_disjoint_weak_mut<const N: usize>(&mut self, weaks: [WeakHandle<T>; N]) -> Option<[&mut T; N]> {
        match self.try_get_disjoint_weak_mut(weaks) {
            Ok(values) => Some(values),
            Err(Error::StaleHandle { .. }) => None,
            Err(e) => fail(e),
        }
    }

    /// Writes several objects at once through weak handles, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::StaleHandle`] if one is dead; [`Error::AliasedHandles`] if two
    /// name the same object; [`Error::WrongManager`].
    pub fn try_get_disjoint_weak_mut<const N: usize>(&mut self, weaks: [WeakHandle<T>; N]) -> Result<[&mut T; N]> {
        let mut slots = [std::ptr::null(); N];
        for (at, &weak) in weaks.iter().enumerate() {
            slots[at] = self.weak_slot(weak)?;
        }
        // SAFETY: every entry is from `weak_slot`.
        unsafe { self.disjoint(slots, |at| weaks[at].key().index()) }
    }

    /// The by-value form of [`try_get_disjoint_mut`](Self::try_get_disjoint_mut), for the manager.
    pub(crate) fn try_into_disjoint_mut<const N: usize>(mut self, handles: [&Handle<T>; N]) -> Result<[&'a mut T; N]> {
        let values = self.try_get_disjoint_mut(handles)?;
        // SAFETY: the view's exclusive access lasts `'a` and the view is
        // consumed here, so the references may have its whole lifetime.
        Ok(values.map(|value| unsafe { &mut *(value as *mut T) }))
    }

    /// The by-value form of [`try_get_disjoint_weak_mut`](Self::try_get_disjoint_weak_mut).
    pub(crate) fn try_into_disjoint_weak_mut<const N: usize>(
        mut self,
        weaks: [WeakHandle<T>; N],
    ) -> Result<[&'a mut T; N]> {
        let values = self.try_get_disjoint_weak_mut(weaks)?;
        // SAFETY: as in `try_into_disjoint_mut`.
        Ok(values.map(|value| unsafe { &mut *(value as *mut T) }))
    }

    /// Turns checked, distinct slots into references, or reports the first alias.
    ///
    /// # Safety
    ///
    /// Every entry of `slots` is an occupied slot of this view's store, as
    /// [`handle_slot`](Self::handle_slot) and [`weak_slot`](Self::weak_slot)
    /// give them.
    unsafe fn disjoint<const N: usize>(
        &mut self,
        slots: [*const Slot<T>; N],
        index_of: impl Fn(usize) -> u32,
    ) -> Result<[&mut T; N]> {
        for i in 0..N {
            for j in 0..i {
                if slots[i] == slots[j] {
                    return Err(Error::AliasedHandles { type_name: T::TYPE_NAME, index: index_of(i) });
                }
            }
        }
        // SAFETY: each pointer is a live reference to an occupied slot of
        // this manager (the caller's contract), the slots are distinct (checked above), and the
        // view's exclusive access is borrowed mutably by the result: the
        // references cannot alias.
        Ok(slots.map(|slot| unsafe { (*slot).value_mut() }))
    }

    /// Iterates over the live objects of `T`, in key order.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter::new(self.store(), self.manager_id)
    }

    /// Iterates over the live objects of `T` for writing, in key order.
    #[inline]
    pub fn iter_mut(&mut self) -> IterMut<'_, T> {
        // SAFETY: the view's exclusive access is borrowed mutably by the iterator.
        unsafe { IterMut::new(self.store(), self.manager_id) }
    }

    /// Live objects of type `T`.
    pub fn count(&self) -> usize {
        self.store().map_or(0, Store::live_count_now)
    }
}

impl<'a, T: MMObject> IntoIterator for ObjectViewMut<'a, T> {
    type Item = (WeakHandle<T>, &'a mut T);
    type IntoIter = IterMut<'a, T>;

    #[inline]
    fn into_iter(self) -> IterMut<'a, T> {
        // SAFETY: the view's exclusive access for `'a` moves to the iterator.
        unsafe { IterMut::new(self.store(), self.manager_id) }
    }
}

impl<T> std::fmt::Debug for ObjectViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectViewMut").field("manager", &self.manager_id).finish_non_exhaustive()
    }
}

/// Views of several object types at once, from [`ObjectManager::views`]: one
/// type written while others are read, checked at run time in the manner of
/// `RefCell`.
///
/// Each type can be taken once for writing ([`view_mut`](Self::view_mut))
/// or any number of times for reading ([`view`](Self::view)), not both. A
/// type stays taken until the `Views` is dropped; take a new `Views` for a
/// different split.
///
/// # Examples
///
/// Move every entity while reading its mesh:
///
/// ```
/// use mmobject::{Handle, MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Mesh { radius: f32 }
/// #[derive(MMObject)]
/// struct Entity { x: f32, mesh: Handle<Mesh> }
///
/// let mut mm = ObjectManager::new();
/// let mesh = mm.create(Mesh { radius: 2.0 });
/// let entity = mm.create(Entity { x: 0.0, mesh: mesh.clone() });
///
/// let views = mm.views();
/// let mut entities = views.view_mut::<Entity>();
/// let meshes = views.view::<Mesh>();
/// for (_, e) in entities.iter_mut() {
///     e.x += meshes.get(&e.mesh).radius;
/// }
/// drop(views);
/// assert_eq!(mm[&entity].x, 2.0);
/// ```
///
/// # Invariants
///
/// `manager` was borrowed mutably for `'m`; `taken[i]` says how the type of
/// store `i` was handed out (0: not yet, `READ` or `WRITE`) and never goes
/// back, so a type given for writing is given to no one else while `'m` lasts.
pub struct Views<'m> {
    manager: &'m ObjectManager,
    taken: [Cell<u8>; MAX_TYPES],
    /// Stands for the `&'m mut ObjectManager` the views were made from.
    _exclusive: PhantomData<&'m mut ObjectManager>,
}

const READ: u8 = 1;
const WRITE: u8 = 2;

impl<'m> Views<'m> {
    pub(crate) fn new(manager: &'m mut ObjectManager) -> Self {
        Views { manager, taken: std::array::from_fn(|_| Cell::new(0)), _exclusive: PhantomData }
    }

    /// Marks `T` taken `how`, or says who has it.
    fn take<T: MMObject>(&self, how: u8) -> Result<()> {
        let store = self.manager.registry().store_or_register::<T>()?;
        let flag = &self.taken[store.shared().store_index as usize];
        match (flag.get(), how) {
            (0, _) | (READ, READ) => {
                flag.set(how);
                Ok(())
            }
            (held, _) => Err(Error::AlreadyBorrowed { type_name: T::TYPE_NAME, mutably: held == WRITE }),
        }
    }

    /// Exclusive access to the objects of `T`.
    ///
    /// # Panics
    ///
    /// Panics if `T` was already taken from these views (for reading or
    /// writing), or its store cannot be made: see [`try_view_mut`](Self::try_view_mut).
    #[track_caller]
    pub fn view_mut<T: MMObject>(&self) -> ObjectViewMut<'_, T> {
        self.try_view_mut().unwrap_or_else(|e| fail(e))
    }

    /// Exclusive access to the objects of `T`, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyBorrowed`] if `T` was already taken from these views;
    /// [`Error::CapacityExceeded`] or [`Error::StoreOutOfMemory`] if `T` had
    /// no store and one cannot be made.
    pub fn try_view_mut<T: MMObject>(&self) -> Result<ObjectViewMut<'_, T>> {
        self.take::<T>(WRITE)?;
        // SAFETY: `self` stands for `&'m mut ObjectManager` (invariant), and
        // `T` is now marked written for good, so no other view of `T` is
        // handed out while the result lives.
        Ok(unsafe { ObjectViewMut::new(self.manager.registry()) })
    }

    /// Shared access to the objects of `T`.
    ///
    /// # Panics
    ///
    /// Panics if `T` was already taken for writing: see [`try_view`](Self::try_view).
    #[track_caller]
    pub fn view<T: MMObject>(&self) -> ObjectView<'_, T> {
        self.try_view().unwrap_or_else(|e| fail(e))
    }

    /// Shared access to the objects of `T`, or says why not.
    ///
    /// # Errors
    ///
    /// [`Error::AlreadyBorrowed`] if `T` was taken for writing;
    /// [`Error::CapacityExceeded`] or [`Error::StoreOutOfMemory`] as for
    /// [`try_view_mut`](Self::try_view_mut).
    pub fn try_view<T: MMObject>(&self) -> Result<ObjectView<'_, T>> {
        self.take::<T>(READ)?;
        Ok(self.manager.view::<T>())
    }
}

impl std::fmt::Debug for Views<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let taken = self.taken.iter().filter(|t| t.get() != 0).count();
        f.debug_struct("Views").field("manager", &self.manager.id()).field("types_taken", &taken).finish()
    }
}

impl ObjectManager {
    /// Iterates over the live objects of type `T`, in key order, with a weak
    /// handle to each.
    ///
    /// Dead objects (released, not yet collected) are skipped. An object
    /// created after the iterator was made is never yielded, so creating
    /// inside the loop is fine; see [`Iter`] for the exact rules.
    pub fn iter<T: MMObject>(&self) -> Iter<'_, T> {
        Iter::new(self.store::<T>(), self.id())
    }

    /// A typed view of the objects of type `T`: the fast path for hot loops.
    ///
    /// The view holds a copy of the manager's id, which a loop keeps in a
    /// register, so a read through it loads nothing but the handle and the
    /// object: [`get`](ObjectView::get) checks the id, and
    /// [`get_weak`](ObjectView::get_weak) the id, the generation and the
    /// count. The manager's own methods do the same checks, but a loop
    /// inside a closure reloads the id from the manager on every read (the
    /// compiler cannot keep it through a captured reference), and in a loop
    /// that misses the cache each load counts (`BENCHMARKS.md`, O3). Take
    /// the view outside the loop:
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
        ObjectView { manager: self, store, manager_id: self.id(), owned: self.owned() }
    }

    /// Iterates over the live objects of type `T` for writing, in key order:
    /// the per-frame update loop.
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Entity { pos: f32, vel: f32 }
    ///
    /// let mut mm = ObjectManager::new();
    /// let entities: Vec<_> = (0..3).map(|i| mm.create(Entity { pos: 0.0, vel: i as f32 })).collect();
    /// for (_, e) in mm.iter_mut::<Entity>() {
    ///     e.pos += e.vel;
    /// }
    /// assert_eq!(mm[&entities[2]].pos, 2.0);
    /// ```
    ///
    /// To read objects of other types in the same loop, split the manager
    /// with [`views`](Self::views).
    #[inline]
    pub fn iter_mut<T: MMObject>(&mut self) -> IterMut<'_, T> {
        self.view_mut::<T>().into_iter()
    }

    /// Exclusive access to the objects of `T`: writes through handles, weak
    /// handles, several at once, and iteration. See [`ObjectViewMut`].
    #[inline]
    pub fn view_mut<T: MMObject>(&mut self) -> ObjectViewMut<'_, T> {
        // SAFETY: `&mut self` gives exclusive access to every value for the
        // view's lifetime.
        unsafe { ObjectViewMut::new(self.registry()) }
    }

    /// Views of several types at once: one type written while others are
    /// read, checked at run time. See [`Views`].
    pub fn views(&mut self) -> Views<'_> {
        Views::new(self)
    }
}
