//! Strong, weak and raw handles.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::sync::{AtomicU32, Ordering as AtomicOrdering};

use super::handle_sites::HandleOrigin;
#[cfg(feature = "handle-sites")]
use super::handle_sites::HandleSite;
use super::index_space::INDEX_BITS;
use super::layout::Chunks;
use super::owner_counts::Released;
use super::shared::{reserve_raw_ref, StoreShared};
use super::slot::{Slot, COUNT_MASK, MAX_REFS, PURPLE};
use super::{MMObject, ObjectKey, VisitHandles};

/// A strong, refcounted reference to an object in an [`ObjectManager`](crate::ObjectManager).
///
/// A handle is one word, like `Rc` (so `Option<Handle<T>>` is 8 bytes too):
/// its slot's address, with its manager's id beside it on 64-bit targets.
/// Cloning adds a reference (one relaxed atomic add, or on the manager's
/// [owner thread](crate::object::ObjectManagerBuilder::owner_thread) a plain
/// load and store); dropping removes one.
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
/// `tagged` encodes (see below) a pointer to an occupied slot of a published
/// segment (so its chunk header names the store, see `layout.rs`), with the
/// provenance of the whole segment (it was computed from the segment's base,
/// never taken from a reference to the slot, which would not reach the
/// header), and the handle owns one counted reference to it. The slot's
/// generation therefore stays what it was when the handle was made (until
/// shutdown destroys the object in place and makes it one more), and the
/// segment stays allocated while the handle lives (the manager leaks it if
/// handles outlive the manager). The tag bits, where there are any, are
/// copies of that chunk header's manager id and `cyclable` flag.
///
/// # Layout
///
/// On 64-bit targets `tagged` is the slot's address shifted left by 16 bits
/// (segments lie below 2^48, and slots are 8-byte aligned, so bits 0..19
/// are free), with the manager id in bits 0..16, in bit 16 whether the
/// store counts through an owner thread's reservations (its manager has an
/// owner and it is not `cyclable`), and the store's `cyclable` flag in bit
/// 17. A read checks the manager id, and a clone or drop tests the flags,
/// without loading the chunk header: in a loop of reads that miss the cache,
/// each load per read costs about as much as the read's own miss (see
/// `BENCHMARKS.md`, O3). The id fills the low 16 bits exactly, so the check
/// is one 16-bit compare of the handle with the manager's id, and the
/// address is one shift away: in such a loop every instruction between the
/// handle and the object's load costs too. Elsewhere `tagged` is the slot's
/// address, and both come from the chunk header.
pub struct Handle<T> {
    tagged: NonNull<u8>,
    /// This handle's entry in its store's table of live handles.
    #[cfg(feature = "handle-sites")]
    site: u32,
    /// Invariant in `T`: `mm.get_mut(&h)` writes a `T` into the slot, so a
    /// handle coerced to a supertype (say `for<'a> fn(&'a str)` to
    /// `fn(&'static str)`) could store a value the slot's real type forbids.
    /// `fn(T) -> T` keeps the handle `Send + Sync` whatever `T` is.
    _type: PhantomData<fn(T) -> T>,
}

// A handle only touches its slot's atomic header and its store's atomic dead
// list (through its thread's ring), and never reads, writes or drops a `T` on
// its own; reads go through a manager, whose stores need `T: Send + Sync`.
// SAFETY: no bound on `T` is needed: a handle holds no `T`, so a `T` with an
// `Rc` inside never crosses threads through it (see above).
unsafe impl<T> Send for Handle<T> {}
// SAFETY: no bound on `T`, as for `Send`: `&Handle` allows only `clone`,
// `ref_count` and key reads, none of which touches a `T`.
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
    pub(crate) unsafe fn from_counted(
        slot: NonNull<Slot<T>>,
        origin: HandleOrigin,
        location: &'static std::panic::Location<'static>,
    ) -> Self {
        // SAFETY: the caller's contract (a published segment's slot, its
        // count transferred).
        unsafe { Self::from_counted_tagged(slot, HandleTag::of(slot), origin, location) }
    }

    /// [`from_counted`](Self::from_counted) with the store's tag already read.
    ///
    /// # Safety
    ///
    /// As for `from_counted`, and `tag` is [`HandleTag::of`] a slot of
    /// `slot`'s store.
    #[inline]
    #[allow(unused_variables)]
    pub(crate) unsafe fn from_counted_tagged(
        slot: NonNull<Slot<T>>,
        tag: HandleTag,
        origin: HandleOrigin,
        location: &'static std::panic::Location<'static>,
    ) -> Self {
        #[allow(unused_mut)]
        let mut handle = Handle {
            // SAFETY: a published segment's slot (the caller's contract), and stores refuse
            // segments above 2^48.
            tagged: unsafe { tag_slot_with(slot, tag) },
            #[cfg(feature = "handle-sites")]
            site: 0,
            _type: PhantomData,
        };
        #[cfg(feature = "handle-sites")]
        handle.register_site(HandleSite { origin, location });
        handle
    }

    /// Records where this handle was made. A handle made by user code the table runs while
    /// it grows (the store's allocator, on this thread) is not recorded, as when the
    /// allocator refuses room: a diagnostic never makes a `clone` panic.
    #[cfg(feature = "handle-sites")]
    #[cold]
    fn register_site(&mut self, site: HandleSite) {
        let shared = self.shared();
        self.site = shared.handle_sites.register(shared.global_index(self.local()), site);
    }

    /// Forgets this handle's site. A handle whose site was never recorded (id 0) takes no
    /// lock: it may be dropped while its own registration unwinds, from inside the lock. One
    /// dropped by user code the table runs (the store's allocator, while the table grows)
    /// leaves the table at its next lock (see `SiteTable`).
    #[cfg(feature = "handle-sites")]
    fn unregister_site(&self) {
        self.shared().handle_sites.remove(self.site);
    }

    /// The slot's pointer, with the segment's provenance.
    #[inline]
    pub(crate) fn slot_ptr(&self) -> NonNull<Slot<T>> {
        #[cfg(target_pointer_width = "64")]
        // Bits 16..19 hold tag bits, not the address's (zero) low bits:
        // shift them out. The `<< 3` folds into the load's addressing.
        let slot = self.tagged.as_ptr().map_addr(|tagged| tagged >> (TAG_BITS + 3) << 3);
        #[cfg(not(target_pointer_width = "64"))]
        let slot = self.tagged.as_ptr();
        // SAFETY: the address bits are a slot's address, never zero.
        unsafe { NonNull::new_unchecked(slot.cast()) }
    }

    /// The slot of a handle this thread counts through the owner's
    /// reservation ([`Counting::Owner`]): its tags are exactly `OWNED_TAG`,
    /// a constant, so it is subtracted instead of masked out, and the
    /// subtraction folds into the loads' displacement (one instruction
    /// fewer on the owner's clone and drop).
    ///
    /// # Safety
    ///
    /// The calling thread counts the handle through the owner's reservation
    /// ([`counts_on_owner`](Self::counts_on_owner)), so the handle's tags
    /// are exactly `OWNED_TAG`: with other tags the address is wrong.
    #[inline]
    unsafe fn owner_slot(&self) -> &Slot<T> {
        #[cfg(target_pointer_width = "64")]
        {
            debug_assert!(self.tagged.as_ptr().addr() & (CYCLABLE_TAG | OWNED_TAG) == OWNED_TAG);
            let slot = self.tagged.as_ptr().map_addr(|tagged| tagged >> TAG_BITS).wrapping_sub(OWNED_TAG >> TAG_BITS);
            // SAFETY: with the tags `OWNED_TAG` alone (the caller's contract), this is `slot_ptr`'s
            // address (the tag bits sit in the address's zero low bits), with
            // the segment's provenance; the segment outlives the handle (type
            // invariant).
            unsafe { &*slot.cast::<Slot<T>>() }
        }
        #[cfg(not(target_pointer_width = "64"))]
        self.slot()
    }

    /// The slot's header word, with the handle's provenance (its segment's).
    #[inline]
    fn word_ptr(&self) -> NonNull<AtomicU32> {
        let slot = self.slot_ptr().as_ptr();
        // SAFETY: only computes the field's address in the slot, which is
        // never null; no reference is made, so the provenance stays the segment's.
        unsafe { NonNull::new_unchecked(std::ptr::addr_of_mut!((*slot).header.word)) }
    }

    #[inline]
    pub(crate) fn slot(&self) -> &Slot<T> {
        // SAFETY: the slot's segment outlives every handle into it (type invariant).
        unsafe { self.slot_ptr().as_ref() }
    }

    /// The header of the slot's chunk: the store's shared part and manager id.
    #[inline]
    fn chunk(&self) -> &super::layout::ChunkHeader {
        // SAFETY: the slot lies in a published segment that outlives the handle (type invariant).
        unsafe { Chunks::header(self.slot_ptr()) }
    }

    /// How this thread counts the handle's clones and drops.
    #[inline]
    fn counting(&self) -> Counting {
        #[cfg(target_pointer_width = "64")]
        {
            if self.plainly_atomic() {
                Counting::Atomic
            } else if self.counts_on_owner() {
                Counting::Owner
            } else if self.tagged.as_ptr().addr() & CYCLABLE_TAG != 0 {
                Counting::Cyclable
            } else if super::deferred_drops::defers(self.manager_id()) {
                Counting::Deferred
            } else {
                Counting::Atomic
            }
        }
        #[cfg(not(target_pointer_width = "64"))]
        {
            let chunk = self.chunk();
            match chunk.owner_thread {
                _ if chunk.cyclable => Counting::Cyclable,
                0 if super::deferred_drops::defers(chunk.manager_id) => Counting::Deferred,
                0 => Counting::Atomic,
                owner if owner == crate::sync::thread_token() => Counting::Owner,
                _ => Counting::Atomic,
            }
        }
    }

    /// True if this thread counts the handle through the owner's reservation
    /// ([`Counting::Owner`]): all a clone needs to know, since every other
    /// way counts a clone with one atomic add. Kept apart from `counting` so
    /// that the clone stays small enough to inline (its look at deferred
    /// drops, a load, is for drops only).
    #[inline]
    fn counts_on_owner(&self) -> bool {
        #[cfg(target_pointer_width = "64")]
        {
            // One compare: the key has `OWNED_TAG` set and `CYCLABLE_TAG` clear.
            super::owner_counts::owns_key((self.tagged.as_ptr().addr() & OWNER_KEY_BITS) as u32)
        }
        #[cfg(not(target_pointer_width = "64"))]
        {
            let chunk = self.chunk();
            !chunk.cyclable && chunk.owner_thread != 0 && chunk.owner_thread == crate::sync::thread_token()
        }
    }

    #[inline]
    pub(crate) fn shared(&self) -> &StoreShared {
        // SAFETY: the store's shared part outlives every handle (`StoreShared` invariant).
        unsafe { self.chunk().shared.as_ref() }
    }

    /// The id of the manager the handle belongs to.
    #[inline]
    pub(crate) fn manager_id(&self) -> u32 {
        #[cfg(target_pointer_width = "64")]
        return u32::from(self.tagged.as_ptr().addr() as u16);
        #[cfg(not(target_pointer_width = "64"))]
        return self.chunk().manager_id;
    }

    /// The slot's local index in its store.
    #[inline]
    pub(crate) fn local(&self) -> u32 {
        // SAFETY: as in `chunk`.
        unsafe { Chunks::local(self.slot_ptr()) }
    }

    /// The object's generation. While the handle holds its reference the
    /// slot's generation is the object's (odd), or, once shutdown destroyed
    /// the object in place, one more: `(g - 1) | 1` gives the object's in both cases.
    #[inline]
    fn generation(&self) -> u32 {
        self.slot().header.generation.load(AtomicOrdering::Relaxed).wrapping_sub(1) | 1
    }

    /// The number of strong references to the object (handles plus raw handles).
    ///
    /// On a manager with an [owner thread](crate::object::ObjectManagerBuilder::owner_thread),
    /// read on another thread while the owner clones or drops handles of the
    /// same object, it may be off by what those changed (it subtracts the
    /// owner's reservation as it reads it); on the owner thread it is exact.
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
        // SAFETY: the handle's slot, with its segment's provenance, of its
        // manager's store (type invariant).
        unsafe { WeakHandle::new(self.slot_ptr(), self.key(), self.manager_id()) }
    }

    /// True if both handles name the same object.
    pub fn ptr_eq(a: &Self, b: &Self) -> bool {
        a.tagged == b.tagged
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
            shared.handle_sites.register_raw(index as u32, site);
        }
        *raw_refs.entry(local).or_insert(0) += 1;
        drop(raw_refs);
        std::mem::forget(self);
        raw
    }
}

impl<T> Handle<T> {
    /// Gives up the handle's count without an atomic read-modify-write if it
    /// is its object's only reference: `Ok` with the slot, whose object the
    /// caller must destroy, else the handle back (always for a type whose
    /// objects may hold handles: their drops keep the cycle collector's
    /// candidates).
    ///
    /// # Safety
    ///
    /// The caller holds `&mut ObjectManager` of the handle's manager. With a
    /// count of one, only this handle references the object, and only the
    /// manager (`upgrade`, raw handles, views) can make another: so nothing
    /// can add a count, and the object is dead once this returns `Ok`. The
    /// caller destroys it before that borrow ends.
    pub(crate) unsafe fn release_last(self) -> Result<NonNull<Slot<T>>, Self> {
        if self.counting() == Counting::Cyclable {
            return Err(self);
        }
        // Exactly one: no flag, no owner's reservation (it is part of the
        // count). Acquire: pairs with the `Release` of the other handles'
        // drops, so their uses of the object come before its destruction.
        if self.slot().header.word.load(AtomicOrdering::Acquire) != 1 {
            return Err(self);
        }
        #[cfg(feature = "handle-sites")]
        self.unregister_site();
        let slot = self.slot_ptr();
        std::mem::forget(self);
        Ok(slot)
    }
}

impl<T> Clone for Handle<T> {
    #[inline]
    #[cfg_attr(feature = "handle-sites", track_caller)]
    fn clone(&self) -> Self {
        if self.counts_on_owner() {
            // SAFETY: this thread counts the handle on the owner's reservation (just tested).
            let header = &unsafe { self.owner_slot() }.header;
            if header.owner_clone() {
                // SAFETY: on the owner thread (`counts_on_owner`), through this handle, which
                // just took the lease.
                unsafe { super::last_drops::record_lease(self.shared(), self.local(), self.generation(), header) };
            }
        } else {
            let old = self.slot().header.word.fetch_add(1, AtomicOrdering::Relaxed);
            if old & COUNT_MASK >= MAX_REFS {
                refcount_overflow(&self.slot().header.word);
            }
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
        // The two common ways inline, the rest out of line, so that the
        // drop stays small enough to inline wherever a handle goes.
        let counting = if self.counts_on_owner() {
            Counting::Owner
        } else if self.plainly_atomic() {
            Counting::Atomic
        } else {
            return self.drop_looking_further();
        };
        // SAFETY: `counting` is how this thread counts the handle (just tested).
        unsafe { self.release_as(counting) };
    }
}

impl<T> Handle<T> {
    /// True if the handle counts with one atomic operation on any thread
    /// (no owner thread, no deferred drops, not a type whose objects may
    /// hold handles): on 64-bit targets its tags alone say so, the common
    /// drop's test after the owner's.
    #[inline]
    fn plainly_atomic(&self) -> bool {
        #[cfg(target_pointer_width = "64")]
        return self.tagged.as_ptr().addr() & (CYCLABLE_TAG | OWNED_TAG) == 0;
        #[cfg(not(target_pointer_width = "64"))]
        return self.counting() == Counting::Atomic;
    }

    /// `drop` when the tags say more than [`plainly_atomic`](Self::plainly_atomic)
    /// and the calling thread does not count the handle through the owner's
    /// reservation: a cyclable type, deferred drops, or an owned manager's
    /// handle on another thread.
    #[inline(never)]
    fn drop_looking_further(&mut self) {
        // SAFETY: `counting` says how this thread counts the handle.
        unsafe { self.release_as(self.counting()) };
    }

    /// Gives up the handle's count, counted as `counting` says.
    ///
    /// # Safety
    ///
    /// `counting` is how the calling thread counts the handle (as
    /// [`counting`](Self::counting) says): [`Counting::Owner`] only where
    /// [`owner_slot`](Self::owner_slot) may be called.
    #[inline(always)]
    unsafe fn release_as(&mut self, counting: Counting) {
        match counting {
            Counting::Atomic => {
                if self.slot().header.word.fetch_sub(1, AtomicOrdering::Release) == 1 {
                    // SAFETY: this drop took the count to zero.
                    unsafe { self.record_last_drop() };
                }
            }
            Counting::Owner => {
                // SAFETY: the caller's contract.
                if !unsafe { self.owner_slot() }.header.owner_release_kept() {
                    // SAFETY: as above.
                    unsafe { self.owner_release_rest() };
                }
            }
            Counting::Cyclable => self.drop_cyclable(),
            Counting::Deferred => self.record_release(),
        }
    }
}

impl<T> Handle<T> {
    /// A drop on a manager that defers its drops: recorded for the thread's
    /// ring to apply (see `deferred_drops.rs`). Out of line, as below.
    #[inline(never)]
    fn record_release(&self) {
        // SAFETY: the handle counts on the slot, and its word pointer has
        // the segment's provenance.
        unsafe { super::last_drops::record_release(self.shared(), self.local(), self.word_ptr()) };
    }

    /// The end of an owner's drop that did not just join the reservation
    /// (see `SlotHeader::owner_release_rest`). Out of line, as below.
    ///
    /// # Safety
    ///
    /// As for [`owner_slot`](Self::owner_slot).
    #[inline(never)]
    unsafe fn owner_release_rest(&self) {
        // SAFETY: the caller's contract.
        if unsafe { self.owner_slot() }.header.owner_release_rest() == Released::Last {
            // SAFETY: this drop took the count to zero.
            unsafe { self.record_last_drop() };
        }
    }

    /// The end of a last drop: lists the slot as dead. Out of line, with
    /// the lookup of its store and index, so that the drop that inlines the
    /// test leading here needs no registers saved on its common paths.
    ///
    /// # Safety
    ///
    /// The caller took the slot's count to zero.
    #[inline(never)]
    unsafe fn record_last_drop(&self) {
        // SAFETY: the caller's contract; the word carries the
        // handle's provenance, the segment's, and the store's slots lie
        // `Slot<T>`'s size apart within a chunk (`layout.rs`).
        unsafe { super::last_drops::record(self.word_ptr(), size_of::<Slot<T>>(), || (self.shared(), self.local())) };
    }
}

/// How a handle's clones and drops count (from its tag bits, and for a
/// manager with an owner, the calling thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// One atomic add or subtract on the word, as `Arc` counts (a manager
    /// without an owner, or another thread than the owner).
    Atomic,
    /// On the owner thread: through its reservation (see `owner_counts.rs`).
    Owner,
    /// A store whose objects may hold handles: drops mark candidate roots.
    Cyclable,
    /// A manager that defers its drops: a drop is recorded in the thread's
    /// ring and applied when it drains; clones count as `Atomic` does (see
    /// `deferred_drops.rs`).
    Deferred,
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
            // SAFETY: as in `record_last_drop`.
            unsafe {
                super::last_drops::record(self.word_ptr(), size_of::<Slot<T>>(), || (self.shared(), self.local()))
            };
        }
    }
}

impl<T> PartialEq for Handle<T> {
    /// Same slot, same object: a slot's generation cannot change while a handle holds it.
    fn eq(&self, other: &Self) -> bool {
        self.tagged == other.tagged
    }
}

impl<T> Eq for Handle<T> {}

impl<T> Hash for Handle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.tagged.hash(state);
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
/// A weak handle is only made by this crate, from a slot it names: `slot`
/// (its address bits) points to a slot of the `T` store of the manager whose
/// id is `manager`, with the whole segment's provenance (as a [`Handle`]'s
/// pointer), in a segment published before the weak handle was made; and the
/// key bits are that slot's manager-wide index and the object's generation.
/// Manager ids are never reused in a process, so while a manager with that id
/// lives, the slot's segment is allocated: a weak handle's pointer may be
/// followed only after its manager id matched a live manager's.
///
/// # Layout
///
/// Sixteen bytes that hold the slot's address beside the key, so that a read
/// through a weak handle follows a pointer instead of locating the slot from
/// its index (a loop of such reads is bound by how many the core keeps in
/// flight, and each instruction of index arithmetic costs some of them; see
/// `BENCHMARKS.md`, O4):
///
/// On 64-bit targets:
/// - `slot`: the manager id in bits 0..16 and the slot's address above it
///   (a store refuses a segment placed above 2^48), so that, as in a
///   [`Handle`], the manager check is one 16-bit compare and the address
///   one shift;
/// - `word`: the generation in bits 0..32 and the key's index (24 bits) in
///   bits 32..56.
///
/// Elsewhere `slot` is the address, `word` holds the generation in bits
/// 0..32, the index bits 16..24 in bits 32..40 and the manager id in bits
/// 40..56, and `index_low` the index bits 0..16.
pub struct WeakHandle<T> {
    slot: NonNull<u8>,
    word: u64,
    /// The key's index bits 0..16, where pointers have no spare bits.
    #[cfg(not(target_pointer_width = "64"))]
    index_low: u16,
    /// Invariant in `T`, for the same reason as [`Handle`]'s marker: a weak
    /// handle coerced to another type would name a slot of the wrong store,
    /// and every read trusts its pointer once the manager id matched.
    _type: PhantomData<fn(T) -> T>,
}

// A weak handle never reads a slot on its own; every read goes through a
// manager (`&ObjectManager`), which checks the id first and whose stores
// need `T: Send + Sync`.
// SAFETY: no bound on `T` is needed: a weak handle is an address and a key
// and holds no `T`, so a `T` with an `Rc` inside never crosses threads through it.
unsafe impl<T> Send for WeakHandle<T> {}
// SAFETY: no bound on `T`, as for `Send`: `&WeakHandle` allows only copying
// and key reads, none of which touches a `T`.
unsafe impl<T> Sync for WeakHandle<T> {}

/// Handles that carry their manager's id: a manager or a view checks them
/// with [`check_manager`] before following their slot.
pub(crate) trait ManagerTagged {
    /// The id of the manager the handle belongs to.
    fn manager_id(&self) -> u32;

    /// True if the handle belongs to the manager with id `manager_id`.
    /// Both ids are at most [`MAX_MANAGER_ID`], so their low 16 bits decide:
    /// on 64-bit targets, where the handle's id is its low 16 bits, that is
    /// one 16-bit compare of the handle itself.
    #[inline]
    fn belongs_to(&self, manager_id: u32) -> bool {
        debug_assert!(manager_id <= MAX_MANAGER_ID && self.manager_id() <= MAX_MANAGER_ID);
        self.manager_id() as u16 == manager_id as u16
    }
}

impl<T> ManagerTagged for Handle<T> {
    #[inline]
    fn manager_id(&self) -> u32 {
        Handle::manager_id(self)
    }
}

impl<T> ManagerTagged for WeakHandle<T> {
    #[inline]
    fn manager_id(&self) -> u32 {
        WeakHandle::manager_id(self)
    }
}

/// `Ok` if `handle` belongs to the manager with id `expected`, else the error that says whose it is.
#[inline]
pub(crate) fn check_manager(handle: &impl ManagerTagged, expected: u32) -> crate::Result<()> {
    if handle.belongs_to(expected) {
        Ok(())
    } else {
        Err(crate::Error::WrongManager { expected, found: handle.manager_id() })
    }
}

/// The bits of a slot's address that handles keep: stores refuse segments
/// above 2^48.
#[cfg(target_pointer_width = "64")]
pub(crate) const ADDRESS_BITS: u32 = 48;

/// The largest manager id: ids are 16 bits, so that a [`Handle`] and a
/// [`WeakHandle`] carry their manager's id beside the slot's address, and
/// the check is one 16-bit compare (see their layouts).
pub(crate) const MAX_MANAGER_ID: u32 = (1 << 16) - 1;

/// The bits of a [`Handle`]'s `tagged` (and a [`WeakHandle`]'s `slot`)
/// below the slot's address: the manager id.
#[cfg(target_pointer_width = "64")]
const TAG_BITS: u32 = 16;
/// Set in a [`Handle`]'s `tagged` if its manager has an owner thread and
/// its store counts through the owner's reservations (see `owner_counts.rs`),
/// or if its manager defers its drops (see `deferred_drops.rs`; the two
/// exclude each other): either way, counting looks further than the tag.
#[cfg(target_pointer_width = "64")]
const OWNED_TAG: usize = 1 << 16;
/// The store's `cyclable` flag in a [`Handle`]'s `tagged`.
#[cfg(target_pointer_width = "64")]
const CYCLABLE_TAG: usize = 1 << 17;
/// The bits of a [`Handle`]'s `tagged` that an owner key is compared with
/// (see `owner_counts::owns_key`): the manager id and both tags. A handle
/// counts through the calling thread's reservations exactly when they are
/// its manager's id with `OWNED_TAG`, the key its owner thread holds.
#[cfg(target_pointer_width = "64")]
const OWNER_KEY_BITS: usize = (1 << (TAG_BITS + 2)) - 1;
#[cfg(target_pointer_width = "64")]
const _: () = assert!(
    OWNED_TAG == super::owner_counts::OWNER_KEY_FLAG as usize
        && (OWNED_TAG | CYCLABLE_TAG | MAX_MANAGER_ID as usize) == OWNER_KEY_BITS
);

/// What a [`Handle`] keeps beside its slot's address (the manager id and the
/// counting flags): the same for every slot of one store, since each chunk
/// header copies its store's values (see `ChunkHeader`), so the store keeps
/// it for its creates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandleTag(#[cfg(target_pointer_width = "64")] usize);

impl HandleTag {
    /// The tag of `slot`'s store.
    ///
    /// # Safety
    ///
    /// `slot` must be a slot of a published segment, with its provenance.
    #[inline]
    pub(crate) unsafe fn of<T>(slot: NonNull<Slot<T>>) -> HandleTag {
        // SAFETY: the caller's contract: the chunk header is initialised.
        let chunk = unsafe { Chunks::header(slot) };
        HandleTag::new(chunk.manager_id, chunk.cyclable, chunk.owner_thread)
    }

    /// The tag of a store whose chunk headers say `manager_id`, `cyclable`
    /// and `owner_thread` (see `ChunkHeader`): what [`of`](Self::of) reads
    /// from any of its slots, so a store can keep it.
    #[inline]
    #[allow(unused_variables)]
    pub(crate) fn new(manager_id: u32, cyclable: bool, owner_thread: u64) -> HandleTag {
        #[cfg(target_pointer_width = "64")]
        {
            debug_assert!(manager_id <= MAX_MANAGER_ID, "manager ids are 16 bits");
            let looks_further = owner_thread != 0 || super::deferred_drops::defers(manager_id);
            let flag = match (cyclable, looks_further) {
                (true, _) => CYCLABLE_TAG,
                (false, true) => OWNED_TAG,
                (false, false) => 0,
            };
            HandleTag(manager_id as usize | flag)
        }
        #[cfg(not(target_pointer_width = "64"))]
        HandleTag()
    }
}

/// A [`Handle`]'s `tagged` word for `slot` (see its layout), given its
/// store's tag.
///
/// `tag` must be [`HandleTag::of`] a slot of `slot`'s store: a tag from
/// another store would give the handle another manager's id or counting.
///
/// # Safety
///
/// `slot`'s address is below 2^[`ADDRESS_BITS`] (a store's slots are: stores
/// refuse segments above), so the shift keeps all of it.
#[inline]
#[allow(unused_variables)]
unsafe fn tag_slot_with<T>(slot: NonNull<Slot<T>>, tag: HandleTag) -> NonNull<u8> {
    #[cfg(target_pointer_width = "64")]
    {
        debug_assert!(slot.as_ptr().addr() >> ADDRESS_BITS == 0 && slot.as_ptr().addr() % 8 == 0);
        let tagged = slot.as_ptr().cast::<u8>().map_addr(|addr| addr << TAG_BITS | tag.0);
        // SAFETY: a slot's address is not zero and, below 2^48 (the caller's contract),
        // keeps every bit through the shift: neither is this zero.
        unsafe { NonNull::new_unchecked(tagged) }
    }
    #[cfg(not(target_pointer_width = "64"))]
    slot.cast()
}

impl<T> WeakHandle<T> {
    /// The object's untyped key.
    #[inline]
    pub fn key(&self) -> ObjectKey {
        #[cfg(target_pointer_width = "64")]
        let index = (self.word >> 32) as u32;
        #[cfg(not(target_pointer_width = "64"))]
        let index = ((self.word >> 32) as u32 & 0xff) << 16 | u32::from(self.index_low);
        ObjectKey::new(index, self.word as u32)
    }

    /// The object's generation (the key's, read without unpacking the index).
    #[inline]
    pub(crate) fn generation(&self) -> u32 {
        self.word as u32
    }

    #[inline]
    pub(crate) fn manager_id(&self) -> u32 {
        #[cfg(target_pointer_width = "64")]
        return u32::from(self.slot.as_ptr().addr() as u16);
        #[cfg(not(target_pointer_width = "64"))]
        return (self.word >> 40) as u32;
    }

    /// The slot the weak handle names.
    ///
    /// # Safety
    ///
    /// The weak handle's manager id must be that of a manager that is alive
    /// for the returned lifetime (see the type's invariants): only then is
    /// the slot's segment allocated.
    #[inline]
    pub(crate) unsafe fn slot_ptr(&self) -> NonNull<Slot<T>> {
        #[cfg(target_pointer_width = "64")]
        let slot = self.slot.as_ptr().map_addr(|tagged| tagged >> TAG_BITS);
        #[cfg(not(target_pointer_width = "64"))]
        let slot = self.slot.as_ptr();
        // SAFETY: the address bits are a slot's address, never zero.
        unsafe { NonNull::new_unchecked(slot.cast()) }
    }

    /// The slot's local index in its store.
    ///
    /// # Safety
    ///
    /// As for [`slot_ptr`](Self::slot_ptr).
    pub(crate) unsafe fn local(&self) -> u32 {
        // SAFETY: the caller's contract keeps the segment (and its chunk
        // headers) allocated; the pointer carries the segment's provenance.
        unsafe { Chunks::local(self.slot_ptr()) }
    }

    /// A weak handle to the object with `key` in `slot`, of the manager `manager`.
    ///
    /// # Safety
    ///
    /// `slot` is slot `key.index()` of a published segment of the store of
    /// `T` of manager `manager` (at most [`MAX_MANAGER_ID`]), carries the
    /// segment's provenance and lies below 2^48: the type's invariants, on
    /// which its reads rely.
    #[inline]
    pub(crate) unsafe fn new(slot: NonNull<Slot<T>>, key: ObjectKey, manager: u32) -> Self {
        debug_assert!(manager <= MAX_MANAGER_ID && key.index() < 1 << INDEX_BITS);
        let index = key.index();
        #[cfg(target_pointer_width = "64")]
        {
            debug_assert!(slot.as_ptr().addr() >> ADDRESS_BITS == 0, "segments lie below 2^48");
            let word = u64::from(index) << 32 | u64::from(key.generation());
            let tagged = slot.as_ptr().cast::<u8>().map_addr(|addr| addr << TAG_BITS | manager as usize);
            // SAFETY: a slot's address is not zero, so neither is this.
            let slot = unsafe { NonNull::new_unchecked(tagged) };
            WeakHandle { slot, word, _type: PhantomData }
        }
        #[cfg(not(target_pointer_width = "64"))]
        {
            let word = u64::from(manager) << 40 | u64::from(index >> 16) << 32 | u64::from(key.generation());
            WeakHandle { slot: slot.cast(), word, index_low: index as u16, _type: PhantomData }
        }
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
        self.key() == other.key() && self.manager_id() == other.manager_id()
    }
}

impl<T> Eq for WeakHandle<T> {}

impl<T> Hash for WeakHandle<T> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key().hash(state);
        self.manager_id().hash(state);
    }
}

impl<T> Ord for WeakHandle<T> {
    /// By manager id, then key (index, then generation).
    fn cmp(&self, other: &Self) -> Ordering {
        (self.manager_id(), self.key()).cmp(&(other.manager_id(), other.key()))
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
        write!(f, "Weak({}{:?}, unchecked)", T::TYPE_NAME, self.key())
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
        assert_eq!(std::mem::size_of::<Option<WeakHandle<u8>>>(), 16);
    }

    /// Every field of a weak handle comes back whole at its extremes: the
    /// highest slot address, index, generation and manager id, and the lowest.
    #[test]
    fn weak_handles_pack_losslessly() {
        let highest = (1usize << ADDRESS_BITS) - 8;
        for (address, index, generation, manager) in [
            (highest, (1 << INDEX_BITS) - 1, u32::MAX, MAX_MANAGER_ID),
            (8, 0, 1, 1),
            (0x1234_5678_9ab8, 0x00ab_cdef, 0x8000_0001, 0x8001),
        ] {
            let slot = NonNull::new(std::ptr::without_provenance_mut::<Slot<u8>>(address)).unwrap();
            // SAFETY: not a real slot, so the handle breaks the type's
            // invariants; it is only unpacked (nothing reads through it, and
            // a weak handle has no drop).
            let weak = unsafe { WeakHandle::<u8>::new(slot, ObjectKey::new(index, generation), manager) };
            assert_eq!((weak.key().index(), weak.key().generation()), (index, generation));
            assert_eq!((weak.generation(), weak.manager_id()), (generation, manager));
            // SAFETY: only the address is compared; nothing is read through it.
            assert_eq!(unsafe { weak.slot_ptr() }.as_ptr().addr(), address);
        }
    }
}
