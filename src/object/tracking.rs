//! Reporting a store's bytes to a memory [`Tracker`], under the type's `#[mm(tag)]`, and
//! the manager's calls for it: [`ObjectManager::remeasure`],
//! [`ObjectManager::remeasure_all`] and [`ObjectManager::create_with`].
//!
//! # One rule: each byte is counted once
//!
//! - **The tracker alone** (no [`TrackingAllocator`](crate::track::TrackingAllocator)
//!   reports into it): the manager charges each object's `size()` to the type's tag at
//!   creation, and remembers that amount per object. Destruction credits exactly the
//!   remembered amount, so every tag returns to its starting value once its objects are
//!   gone, whatever happened to them in between. An object whose size changed is brought
//!   up to date by [`ObjectManager::remeasure`] / [`ObjectManager::remeasure_all`].
//! - **The tracker fed by a `TrackingAllocator`** ([`Tracker::counts_allocations`]): the
//!   allocator already counts every heap byte, once, under the tag in scope when it was
//!   allocated (a `realloc` keeps its block's tag). The manager then charges no bytes
//!   (each object still counts once in the tag's allocation count), so nothing is counted
//!   twice; to have an object's heap bytes under its type's tag, build
//!   it inside that tag's scope, which [`ObjectManager::create_with`] does for you. The
//!   object's inline bytes (`size_of::<T>()`) live in the store's memory, which no
//!   `TrackingAllocator` ever counts (below), so the manager charges those to the type's
//!   tag. Budgets are checked by the allocator as bytes are allocated, and by the manager
//!   for the inline bytes; `try_create` refuses when the tag would go over its budget.
//!
//! # Store memory
//!
//! A store's segments and side tables come from its
//! [allocator](crate::object::ObjectManagerBuilder::allocator), and every call to it runs
//! outside tracking (as the tracker's own tables do): even an allocator that goes through a
//! `TrackingAllocator` adds nothing to any tag. So store memory is never counted twice,
//! whichever allocator serves it: under the type's tag, the manager counts the bytes of its
//! live objects (all of `size()`, or the inline part when the allocator counts the heap);
//! the slot headers and unused capacity are the store allocator's to report (for the
//! default, [`SegmentAlloc::global`](crate::alloc::SegmentAlloc::global)`.stats()`), and
//! [`ObjectManager::report`] shows each type's slot size.

use allocator_api2::vec::Vec;
use parking_lot::Mutex;
use std::collections::HashMap;

use super::manager::ObjectManager;
use super::store::Store;
use super::store_alloc::StoreAlloc;
use super::traits::MMObject;
use super::Handle;
use crate::track::{scope_id, StackTrace, TagId, Tracker};
use crate::Error;

/// A charge-table entry with no charged object.
const VACANT: usize = usize::MAX;
/// The most one object is charged, whatever its `size()` says: the tracker's counters are
/// read as signed (a free may be counted before its allocation on another thread), so a
/// larger charge would read as negative, and the tag as empty.
const MAX_CHARGE: usize = isize::MAX as usize;

/// One store's link to a tracker.
///
/// Invariant: `charged[local]` is what the live object in slot `local` was charged (and not
/// yet credited) under `tag`, or [`VACANT`] when no object there is charged; the tag's
/// count holds exactly one unit per non-vacant entry. The table has an entry for every slot
/// of every published segment: it grows with the segments ([`Tracking::reserve_slots`]),
/// in the store's allocator, so placing an object never allocates.
pub(crate) struct Tracking {
    tracker: &'static Tracker,
    tag: TagId,
    /// Per slot: the bytes charged for its object (see the invariant).
    charged: Mutex<Vec<usize, StoreAlloc>>,
    /// Creation stacks by local slot index, kept only in `Mode::Stacks`.
    stacks: Mutex<HashMap<u32, StackTrace>>,
}

impl Tracking {
    pub(crate) fn new(tracker: &'static Tracker, tag_name: &'static str, alloc: StoreAlloc) -> Self {
        Tracking {
            tracker,
            tag: tracker.tag_named(tag_name),
            charged: Mutex::new(Vec::new_in(alloc)),
            stacks: Mutex::default(),
        }
    }

    /// Makes the charge table cover slots `0..slots` (a segment is being added), or says
    /// that the store's allocator refused; nothing changes then.
    pub(crate) fn reserve_slots(&self, slots: usize) -> Result<(), ()> {
        // The allocator runs with the lock released: it is user code, which
        // may create (so charge) an object of this type on this thread. Only
        // `grow`, under the store's growth lock, changes the table's length,
        // so it is the same when the lock is taken again.
        let (len, alloc) = {
            let table = self.charged.lock();
            (table.len(), table.allocator().clone())
        };
        if slots <= len {
            return Ok(());
        }
        let mut bigger = Vec::new_in(alloc);
        bigger.try_reserve_exact(slots).map_err(|_| ())?;
        let mut table = self.charged.lock();
        debug_assert_eq!(table.len(), len, "only `grow` resizes the charge table");
        bigger.extend_from_slice(&table);
        bigger.resize(slots, VACANT);
        let old = std::mem::replace(&mut *table, bigger);
        drop(table);
        // Freed with the lock released too.
        drop(old);
        Ok(())
    }

    /// The tag objects of this store are counted under.
    pub(crate) fn tag(&self) -> TagId {
        self.tag
    }

    /// Charges a new object of `bytes` (its `size()`); returns the charge, to give to the
    /// object's slot with [`Charged::place`] (dropped instead, it is credited back: when
    /// `create` fails, or the store allocator panics, before a slot is had).
    ///
    /// `strict` (the `try_create` path) refuses anything over the tag's budget, whatever
    /// its policy; otherwise the tag's policy decides (log, callback, error or panic). The
    /// check and the charge are one step ([`Tracker`]'s budget check). When a
    /// `TrackingAllocator` feeds the tracker, only the object's `inline` bytes are charged
    /// (its heap is the allocator's; see the module docs).
    pub(crate) fn charge(&self, bytes: usize, inline: usize, strict: bool) -> Result<Charged<'_>, Error> {
        // Capped as the charge table records it, so the credit matches (a
        // `size()` may claim anything, even `usize::MAX`).
        let bytes = if self.tracker.counts_allocations() { inline } else { bytes }.min(MAX_CHARGE);
        self.tracker.charge_object(self.tag, bytes, strict)?;
        Ok(Charged { tracking: self, bytes })
    }

    /// Records that the object in slot `local` was charged `charged` bytes, and its
    /// creation stack if the tracker keeps stacks.
    fn placed(&self, local: u32, charged: usize) {
        match self.charged.lock().get_mut(local as usize) {
            Some(entry) => *entry = charged.min(MAX_CHARGE),
            None => unreachable!("the charge table covers every published slot"),
        }
        let depth = self.tracker.mode().stack_depth();
        if depth > 0 {
            // The stack table is bookkeeping, like the tracker's own: never tracked.
            let _untracked = crate::track::Reentry::enter();
            self.stacks.lock().insert(local, StackTrace::capture(depth));
        }
    }

    /// Credits what the object in slot `local` was charged (it is being destroyed).
    pub(crate) fn release(&self, local: u32) {
        let charged = self.charged.lock().get_mut(local as usize).map_or(VACANT, |e| std::mem::replace(e, VACANT));
        if charged != VACANT {
            self.tracker.credit(self.tag, charged);
        }
        if self.tracker.mode().stack_depth() > 0 {
            self.stacks.lock().remove(&local);
        }
    }

    /// Brings the charge of the live object in slot `local` to `bytes` (its `size()` now);
    /// returns `bytes`. Nothing changes when a `TrackingAllocator` feeds the tracker (the
    /// allocator has counted the change already).
    pub(crate) fn remeasure(&self, local: u32, bytes: usize) -> usize {
        if self.tracker.counts_allocations() {
            return bytes;
        }
        let mut table = self.charged.lock();
        let Some(charged) = table.get_mut(local as usize).filter(|c| **c != VACANT) else {
            return bytes;
        };
        let old = *charged;
        let bytes = bytes.min(MAX_CHARGE);
        *charged = bytes;
        drop(table);
        if bytes > old {
            self.tracker.charge_in_use(self.tag, bytes - old);
        } else if bytes < old {
            self.tracker.credit_bytes(self.tag, old - bytes);
        }
        bytes
    }

    /// Credits everything still charged (the store is empty).
    pub(crate) fn credit_all(&self) {
        let mut table = self.charged.lock();
        for entry in table.iter_mut() {
            let charged = std::mem::replace(entry, VACANT);
            if charged != VACANT {
                self.tracker.credit(self.tag, charged);
            }
        }
        drop(table);
        self.stacks.lock().clear();
    }

    pub(crate) fn stack(&self, local: u32) -> Option<StackTrace> {
        self.stacks.lock().get(&local).copied()
    }
}

impl std::fmt::Debug for Tracking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracking")
            .field("tag", &self.tag.name())
            .field(
                "charged",
                &self.charged.lock().iter().filter(|&&c| c != VACANT).fold(0usize, |t, &c| t.saturating_add(c)),
            )
            .finish_non_exhaustive()
    }
}

/// Memory accounting of objects whose size changes.
impl ObjectManager {
    /// Re-measures one object: its tag's charge becomes the object's `size()` now.
    ///
    /// The manager charges an object's `size()` when it is created and credits the same
    /// amount when it is destroyed, so a tag always returns to its starting value. An
    /// object whose heap use changed meanwhile (pixels dropped, an inventory that grew) is
    /// counted at its old size until it is re-measured. Growth is counted even over the
    /// budget (the memory is already in use): the tag's `Log` or `Callback` policy runs,
    /// `Error` logs a warning, `Panic` panics.
    ///
    /// Returns the object's size. Without a tracker, or when a `TrackingAllocator` feeds
    /// it (the allocator counted the change already), it only measures.
    ///
    /// Cost: one `size()` call, one uncontended lock and at most one counter update.
    ///
    /// # Panics
    ///
    /// If the handle belongs to another manager, or the tag's policy is
    /// [`BudgetPolicy::Panic`](crate::track::BudgetPolicy::Panic) and the growth takes it
    /// over budget.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::Tracker;
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// #[mm(tag = "Textures")]
    /// struct Texture { pixels: Vec<u8> }
    ///
    /// static TRACKER: Tracker = Tracker::new();
    /// let textures = TRACKER.tag_named("Textures");
    /// let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    /// let t = mm.create(Texture { pixels: vec![0; 4096] });
    /// mm.get_mut(&t).pixels = Vec::new(); // uploaded to the GPU: pixels freed
    /// assert!(TRACKER.tag_stats(textures).bytes >= 4096); // still charged
    /// mm.remeasure(&t);
    /// assert_eq!(TRACKER.tag_stats(textures).bytes, std::mem::size_of::<Texture>());
    /// drop(t);
    /// mm.collect_garbage();
    /// assert_eq!(TRACKER.tag_stats(textures).bytes, 0);
    /// ```
    pub fn remeasure<T: MMObject>(&self, handle: &Handle<T>) -> usize {
        let size = self.get(handle).size();
        match self.store::<T>().and_then(Store::tracking) {
            Some(tracking) => tracking.remeasure(handle.local(), size),
            None => size,
        }
    }

    /// Re-measures every live object of type `T` (see [`ObjectManager::remeasure`]);
    /// returns their total size.
    ///
    /// Cost: O(live objects of `T`): one `size()` call each, under one lock per object. Call
    /// it where sizes may have changed (after a level load, or once a frame for a type that
    /// grows), not after every write.
    ///
    /// # Panics
    ///
    /// If the tag's policy is [`BudgetPolicy::Panic`](crate::track::BudgetPolicy::Panic)
    /// and the growth takes it over budget.
    pub fn remeasure_all<T: MMObject>(&self) -> usize {
        let tracking = self.store::<T>().and_then(Store::tracking);
        self.iter::<T>()
            .map(|(weak, value)| {
                let size = value.size();
                match tracking {
                    // SAFETY: the weak handle comes from this manager's
                    // iterator, and the manager is borrowed meanwhile.
                    Some(tracking) => tracking.remeasure(unsafe { weak.local() }, size),
                    None => size,
                }
            })
            .fold(0, usize::saturating_add)
    }

    /// Builds an object inside its type's tag scope, then creates it.
    ///
    /// When a `TrackingAllocator` reports into the manager's tracker, the heap bytes `make`
    /// allocates are counted by the allocator under `T`'s `#[mm(tag)]`, once (the manager
    /// adds nothing of its own then; see the [module docs](crate::track#objects-and-the-global-allocator)).
    /// Without a tracker it is `create(make())`.
    ///
    /// # Panics
    ///
    /// As [`ObjectManager::create`].
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// #[mm(tag = "Meshes")]
    /// struct Mesh { vertices: Vec<[f32; 3]> }
    ///
    /// let mm = ObjectManager::new();
    /// let mesh = mm.create_with(|| Mesh { vertices: vec![[0.0; 3]; 64] });
    /// assert_eq!(mm[&mesh].vertices.len(), 64);
    /// ```
    #[track_caller]
    pub fn create_with<T: MMObject>(&self, make: impl FnOnce() -> T) -> Handle<T> {
        let value = match self.tracker_tag::<T>() {
            Some(tag) => scope_id(tag, make),
            None => make(),
        };
        self.create(value)
    }

    /// The tag `T`'s bytes are counted under, if the manager has a tracker.
    fn tracker_tag<T: MMObject>(&self) -> Option<TagId> {
        if self.store::<T>().is_none() {
            self.reserve::<T>(0); // registers the store
        }
        self.store::<T>().and_then(Store::tracking).map(Tracking::tag)
    }
}

/// A new object's charge, made before `create` takes a slot: credited back when dropped,
/// unless [`place`](Self::place) gave it to the object's slot.
#[must_use = "dropped, the charge is credited back"]
pub(crate) struct Charged<'a> {
    tracking: &'a Tracking,
    bytes: usize,
}

impl Charged<'_> {
    /// Records the charge as the object's in slot `local` (and its creation stack).
    pub(crate) fn place(self, local: u32) {
        let this = std::mem::ManuallyDrop::new(self);
        this.tracking.placed(local, this.bytes);
    }
}

impl Drop for Charged<'_> {
    fn drop(&mut self) {
        self.tracking.tracker.credit(self.tracking.tag, self.bytes);
    }
}
