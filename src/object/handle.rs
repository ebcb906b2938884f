//! Strong, weak and raw handles.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::sync::Ordering as AtomicOrdering;

use super::handle_sites::HandleOrigin;
#[cfg(feature = "handle-sites")]
use super::handle_sites::HandleSite;
use super::index_space::INDEX_BITS;
use super::layout::Chunks;
use super::shared::{reserve_raw_ref, StoreShared};
use super::slot::{Slot, COUNT_MASK, MAX_REFS, PURPLE};
use super::{MMObject, ObjectKey, VisitHandles};

/// Packs a store index and a local slot index into one `u32`.
#[inline]
pub(crate) fn pack_location(store_index: u32, local: u32) -> u32 {
    debug_assert!(store_index < 256 && local < (1 << INDEX_BITS), "location out of range");
    store_index << INDEX_BITS | local
}

#[inline]
pub(crate) fn unpack_location(location: u32) -> (u32, u32) {
    (location >> INDEX_BITS, location & ((1 << INDEX_BITS) - 1))
}

/// A strong, refcounted reference to an object in an [`ObjectManager`](crate::ObjectManager).
///
/// A handle is one pointer, like `Rc` (so `Option<Handle<T>>` is 8 bytes too).
/// Cloning adds a reference (one relaxed atomic add); dropping removes one.
/// Dropping the last handle never runs `T::drop` on the spot: the object
/// becomes *dead*, and the next
/// [`collect_garbage`](crate::ObjectManager::collect_garbage) destroys it.
/// Read the object through the manager: `mm.get(&h)`, `mm[&h]`, `mm.get_mut(&h)`.
///
/// `Handle<T>` is `Send + Sync`: dropping a handle never drops a `T`, so
/// handles can be cloned and dropped on any thread.
///
/// # Examples
///
/// ```
/// use mmobject::{MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Mesh { vertices: Vec<[f32; 3]> }
///
/// let mut mm = ObjectManager::new();
/// let mesh = mm.create(Mesh { vertices: vec![[0.0; 3]; 3] });
/// let other = mesh.clone();
/// assert_eq!(mesh.ref_count(), 2);
/// assert_eq!(mm[&other].vertices.len(), 3);
/// drop(mesh);
/// drop(other);
/// assert_eq!(mm.dead_count(), 1);
/// assert_eq!(mm.collect_garbage().objects, 1);
/// ```
///
/// # Invariants
///
/// `slot` points to an occupied slot of a published segment (so its chunk
/// header names the store, see `layout.rs`), with the provenance of the
/// whole segment (it was computed from the segment's base, never taken from
/// a reference to the slot, which would not reach the header), and the
/// handle owns one counted reference to it. The slot's generation therefore
/// stays what it was when the handle was made (until shutdown destroys the
/// object in place and makes it one more), and the segment stays allocated
/// while the handle lives (the manager leaks it if handles outlive the manager).
pub struct Handle<T> {
    slot: NonNull<Slot<T>>,
    /// This handle's entry in its store's table of live handles.
    #[cfg(feature = "handle-sites")]
    site: u32,
    /// Invariant in `T`: `mm.get_mut(&h)` writes a `T` into the slot, so a
    /// handle coerced to a supertype (say `for<'a> fn(&'a str)` to
    /// `fn(&'static str)`) could store a value the slot's real type forbids.
    /// `fn(T) -> T` keeps the handle `Send + Sync` whatever `T` is.
    _type: PhantomData<fn(T) -> T>,
}

// SAFETY: a handle only touches its slot's atomic header and its store's
// atomic dead list; it never reads, writes or drops a `T` on its own.
unsafe impl<T> Send for Handle<T> {}
// SAFETY: as for `Send`; `&Handle` allows only `clone`, `ref_count` and key reads.
unsafe impl<T> Sync for Handle<T> {}

impl<T> Handle<T> {
    /// Wraps a reference the caller already counted.
    ///
    /// # Safety
    ///
    /// `slot` must be an occupied slot of a published segment, with the
    /// segment's provenance (from `Store::slot_ptr` or `published_slot_ptr`),
    /// and the caller must transfer one counted reference to the new handle.
    /// `origin` and `location` say where it was made (kept only with the
    /// `handle-sites` feature).
    #[inline]
    #[allow(unused_variables)]
    pub(crate) unsafe fn from_counted(
        slot: NonNull<Slot<T>>,
        origin: HandleOrigin,
        location: &'static std::panic::Location<'static>,
    ) -> Self {
        #[allow(unused_mut)]
        let mut handle = Handle {
            slot,
            #[cfg(feature = "handle-sites")]
            site: 0,
            _type: PhantomData,
        };
        #[cfg(feature = "handle-sites")]
        handle.register_site(HandleSite { origin, location });
        handle
    }

    #[cfg(feature = "handle-sites")]
    #[cold]
    fn register_site(&mut self, site: HandleSite) {
        let index = self.shared().global_index(self.local());
        let id = self.shared().handle_sites.lock().register(index, site);
        self.site = id;
    }

    #[cfg(feature = "handle-sites")]
    fn unregister_site(&self) {
        self.shared().handle_sites.lock().remove(self.site);
    }

    #[inline]
    pub(crate) fn slot(&self) -> &Slot<T> {
        // SAFETY: the slot's segment outlives every handle into it (type invariant).
        unsafe { self.slot.as_ref() }
    }

    /// The header of the slot's chunk: the store's shared part and manager id.
    #[inline]
    fn chunk(&self) -> &super::layout::ChunkHeader {
        // SAFETY: the slot lies in a published segment that outlives the handle (type invariant).
        unsafe { Chunks::header(self.slot) }
    }

    #[inline]
    pub(crate) fn shared(&self) -> &StoreShared {
        // SAFETY: the store's shared part outlives every handle (`StoreShared` invariant).
        unsafe { self.chunk().shared.as_ref() }
    }

    /// The id of the manager the handle belongs to.
    #[inline]
    pub(crate) fn manager_id(&self) -> u32 {
        self.chunk().manager_id
    }

    /// The slot's local index in its store.
    #[inline]
    fn local(&self) -> u32 {
        // SAFETY: as in `chunk`.
        unsafe { Chunks::local(self.slot) }
    }

    /// The object's generation. While the handle holds its reference the
    /// slot's generation is the object's (odd), or, once shutdown destroyed
    /// the object in place, one more: `(g - 1) | 1` gives the object's in both cases.
    #[inline]
    fn generation(&self) -> u32 {
        self.slot().header.generation.load(AtomicOrdering::Relaxed).wrapping_sub(1) | 1
    }

    /// The number of strong references to the object (handles plus raw handles).
    pub fn ref_count(&self) -> u32 {
        self.slot().header.ref_count()
    }

    /// The object's untyped key.
    pub fn key(&self) -> ObjectKey {
        ObjectKey::new(self.shared().global_index(self.local()), self.generation())
    }

    /// Test hook: adds `n` references that are never given back, so a test
    /// can reach the count limit in one call. Sound, like `mem::forget` of
    /// `n` clones: the object just stays alive, and is reported as leaked.
    ///
    /// # Panics
    ///
    /// Panics if the count would pass the limit (2^29).
    #[doc(hidden)]
    pub fn leak_refs_for_tests(&self, n: u32) {
        let word = &self.slot().header.word;
        let mut count = word.load(AtomicOrdering::Relaxed);
        loop {
            let raised = (count & COUNT_MASK)
                .checked_add(n)
                .filter(|&c| c <= MAX_REFS)
                .expect("the count stays within its limit")
                | count & PURPLE;
            match word.compare_exchange_weak(count, raised, AtomicOrdering::Relaxed, AtomicOrdering::Relaxed) {
                Ok(_) => return,
                Err(actual) => count = actual,
            }
        }
    }

    /// A weak handle to the same object: `Copy`, uncounted, checked on use.
    pub fn downgrade(&self) -> WeakHandle<T> {
        let shared = self.shared();
        WeakHandle {
            key: self.key(),
            location: pack_location(shared.store_index, self.local()),
            manager: shared.manager_id,
            _type: PhantomData,
        }
    }

    /// True if both handles name the same object.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.slot == b.slot
    }

    /// Turns the handle into a raw `u64` for scripting or FFI, keeping its reference.
    ///
    /// Give the reference back with [`ObjectManager::handle_from_raw`](crate::ObjectManager::handle_from_raw)
    /// or [`ObjectManager::release_raw`](crate::ObjectManager::release_raw);
    /// until then the object stays alive (and is reported as a leak at shutdown).
    ///
    /// # Panics
    ///
    /// Panics if the store's [allocator](crate::object::ObjectManagerBuilder::allocator)
    /// refuses room in the raw-reference table (the handle is dropped as usual).
    #[cfg_attr(feature = "handle-sites", track_caller)]
    pub fn into_raw(self) -> RawHandle {
        let shared = self.shared();
        let tag = u64::from(shared.manager_id & 0xff);
        let local = self.local();
        let index = u64::from(shared.global_index(local));
        let raw = RawHandle(tag << 56 | index << 32 | u64::from(self.generation()));
        let mut raw_refs = shared.raw_refs.lock();
        if let Err(error) = reserve_raw_ref(&mut raw_refs, shared.type_name) {
            drop(raw_refs);
            panic!("{error}");
        }
        // The handle's site goes and the raw reference's comes before the
        // raw-count bump: once the raw count equals the slot's count, a
        // concurrent shutdown may free `shared`, so the lock release after the
        // bump must be the last touch of it. (Lock order: `raw_refs`, then
        // `handle_sites`.)
        #[cfg(feature = "handle-sites")]
        {
            self.unregister_site();
            let site = HandleSite { origin: HandleOrigin::IntoRaw, location: std::panic::Location::caller() };
            shared.handle_sites.lock().register_raw(index as u32, site);
        }
        *raw_refs.entry(local).or_insert(0) += 1;
        drop(raw_refs);
        std::mem::forget(self);
        raw
    }
}

impl<T> Clone for Handle<T> {
    #[inline]
    #[cfg_attr(feature = "handle-sites", track_caller)]
    fn clone(&self) -> Self {
        let old = self.slot().header.word.fetch_add(1, AtomicOrdering::Relaxed);
        if old & COUNT_MASK >= MAX_REFS {
            refcount_overflow(&self.slot().header.word);
        }
        #[allow(unused_mut)]
        let mut handle = Handle { ..*self };
        #[cfg(feature = "handle-sites")]
        handle.register_site(HandleSite { origin: HandleOrigin::Cloned, location: std::panic::Location::caller() });
        handle
    }
}

#[cold]
#[inline(never)]
fn refcount_overflow(word: &crate::sync::AtomicU32) -> ! {
    word.fetch_sub(1, AtomicOrdering::Relaxed);
    panic!("mmobject: reference count overflow (more than {MAX_REFS} handles to one object)");
}

impl<T> Drop for Handle<T> {
    #[inline]
    fn drop(&mut self) {
        #[cfg(feature = "handle-sites")]
        self.unregister_site();
        let word = &self.slot().header.word;
        if self.chunk().cyclable {
            return self.drop_cyclable();
        }
        if word.fetch_sub(1, AtomicOrdering::Release) != 1 {
            return;
        }
        self.shared().release_last(self.local(), word);
    }
}

impl<T> Handle<T> {
    /// `drop` for a type whose objects may hold handles: a drop that leaves
    /// references behind makes the object a candidate root for the
    /// [`CycleCollector`](crate::CycleCollector) (see `candidates.rs`).
    /// Out of line, so that the common drop stays small enough to inline.
    #[inline(never)]
    fn drop_cyclable(&mut self) {
        let header = &self.slot().header;
        let old = header.release_marking(Some(&|| self.shared().note_candidate(self.local())));
        if old & COUNT_MASK == 1 {
            self.shared().release_last(self.local(), &header.word);
        }
    }
}

impl<T> PartialEq for Handle<T> {
    /// Same slot, same object: a slot's generation cannot change while a handle holds it.
    fn eq(&self, other: &Self) -> bool {
        self.slot == other.slot
    }
}

impl<T> Eq for Handle<T> {}

impl<T> Hash for Handle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.slot.hash(state);
    }
}

impl<T> Ord for Handle<T> {
    /// By manager id, then key (index, then generation): the same order as
    /// the handles' [`WeakHandle`]s, and key order within one manager.
    fn cmp(&self, other: &Self) -> Ordering {
        (self.manager_id(), self.key()).cmp(&(other.manager_id(), other.key()))
    }
}

impl<T> PartialOrd for Handle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: MMObject> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", T::TYPE_NAME, self.key())
    }
}

impl<T> VisitHandles for Handle<T> {
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        visitor(self.key());
    }
}

impl<T> super::HeapSize for Handle<T> {
    fn heap_size(&self) -> usize {
        0
    }
}

/// A weak reference: `Copy`, 16 bytes, no count. Read through the manager.
///
/// [`ObjectManager::upgrade`](crate::ObjectManager::upgrade) turns it into a
/// [`Handle`] while the object is live; once the last strong handle is gone,
/// upgrading returns `None`, even before the object is collected.
///
/// # Examples
///
/// ```
/// use mmobject::{MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Enemy { hp: u32 }
///
/// let mm = ObjectManager::new();
/// let enemy = mm.create(Enemy { hp: 3 });
/// let target = enemy.downgrade();
/// assert_eq!(mm.get_weak(target).map(|e| e.hp), Some(3));
/// drop(enemy);
/// assert!(mm.upgrade(target).is_none());
/// ```
///
/// # Invariants
///
/// A weak handle is only made by this crate, from a slot it names: `location`
/// packs the store index and local slot index of a slot of the `T` store of
/// the manager whose id is `manager`, in a segment published before the weak
/// handle was made, and `key` is that slot's manager-wide index and the
/// object's generation. (Manager ids are never reused in a process.)
pub struct WeakHandle<T> {
    key: ObjectKey,
    location: u32,
    manager: u32,
    /// Invariant in `T`, for the same reason as [`Handle`]'s marker: a weak
    /// handle coerced to another type would name a slot of the wrong store,
    /// and the view's fast path trusts its location.
    _type: PhantomData<fn(T) -> T>,
}

impl<T> WeakHandle<T> {
    /// The object's untyped key.
    pub fn key(&self) -> ObjectKey {
        self.key
    }

    pub(crate) fn location(&self) -> u32 {
        self.location
    }

    pub(crate) fn manager_id(&self) -> u32 {
        self.manager
    }

    pub(crate) fn new(key: ObjectKey, location: u32, manager: u32) -> Self {
        WeakHandle { key, location, manager, _type: PhantomData }
    }
}

impl<T> Clone for WeakHandle<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for WeakHandle<T> {}

impl<T> PartialEq for WeakHandle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key && self.manager == other.manager
    }
}

impl<T> Eq for WeakHandle<T> {}

impl<T> Hash for WeakHandle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
        self.manager.hash(state);
    }
}

impl<T> Ord for WeakHandle<T> {
    /// By manager id, then key (index, then generation).
    fn cmp(&self, other: &Self) -> Ordering {
        (self.manager, self.key).cmp(&(other.manager, other.key))
    }
}

impl<T> PartialOrd for WeakHandle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl<T: MMObject> fmt::Debug for WeakHandle<T> {
    /// `Weak(Texture#3v1a2b, unchecked)`: the key with its generation, so a
    /// weak handle to a reused slot differs from one to the live object; a
    /// weak handle cannot tell by itself whether its object is alive (ask
    /// [`ObjectManager::is_alive`](crate::ObjectManager::is_alive)), and says so.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Weak({}{:?}, unchecked)", T::TYPE_NAME, self.key)
    }
}

/// A handle as a plain `u64`, for scripting languages and FFI.
///
/// It carries one counted reference (see [`Handle::into_raw`]). Bits: the
/// low 8 bits of the manager id, a 24-bit manager-wide index and a 32-bit
/// generation. Every call that takes one checks it: a stale, foreign,
/// wrong-type or over-released raw handle gives an `Err`, and a failed call
/// changes no count.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RawHandle(pub u64);

impl RawHandle {
    pub(crate) fn manager_tag(self) -> u32 {
        (self.0 >> 56) as u32
    }

    pub(crate) fn index(self) -> u32 {
        (self.0 >> 32) as u32 & ((1 << INDEX_BITS) - 1)
    }

    pub(crate) fn generation(self) -> u32 {
        self.0 as u32
    }
}

impl fmt::Debug for RawHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RawHandle({:#018x})", self.0)
    }
}

impl From<RawHandle> for u64 {
    fn from(raw: RawHandle) -> u64 {
        raw.0
    }
}

#[cfg(all(test, target_pointer_width = "64"))]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        let handle = if cfg!(feature = "handle-sites") { 16 } else { 8 };
        assert_eq!(std::mem::size_of::<Handle<u8>>(), handle);
        assert_eq!(std::mem::size_of::<Option<Handle<u8>>>(), handle);
        assert_eq!(std::mem::size_of::<WeakHandle<u8>>(), 16);
    }
}
