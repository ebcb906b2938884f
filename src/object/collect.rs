//! Collection: destroying the dead, all at once, by count or by time, and
//! telling the caller what was destroyed ([`Destroyed`] events and
//! [`ObjectManager::on_destroy`] hooks).

use std::any::TypeId;
use std::time::{Duration, Instant};

use super::{Handle, MMObject, ObjectKey, ObjectManager};

/// Objects destroyed between two looks at the clock.
const BATCH: usize = if cfg!(miri) { 4 } else { 32 };

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

impl CollectStats {
    /// Adds what a later step destroyed: counts saturate (`size()` may claim
    /// anything), and the rounds add up, as for a cascade.
    pub(crate) fn absorb(&mut self, more: CollectStats) {
        self.objects = self.objects.saturating_add(more.objects);
        self.bytes = self.bytes.saturating_add(more.bytes);
        self.rounds = self.rounds.saturating_add(more.rounds);
    }
}

/// An object that collection destroyed: its key and type.
///
/// Recorded when the manager was built with
/// [`destroy_events(true)`](crate::ObjectManagerBuilder::destroy_events), by
/// every collection (`collect_garbage`, the budgeted and timed forms, cascades
/// and [`collect_cycles`](ObjectManager::collect_cycles)), and read with
/// [`ObjectManager::drain_destroyed`]. Shutdown records none: the manager is
/// gone by then. Use it to clean side tables keyed by [`ObjectKey`] (a
/// `SecondaryMap` of GPU buffers, say).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Destroyed {
    key: ObjectKey,
    type_name: &'static str,
    type_id: TypeId,
}

impl Destroyed {
    pub(crate) fn new<T: MMObject>(key: ObjectKey) -> Self {
        Destroyed { key, type_name: T::TYPE_NAME, type_id: TypeId::of::<T>() }
    }

    /// The destroyed object's key (no live object has it any more).
    pub fn key(&self) -> ObjectKey {
        self.key
    }

    /// Its type's [`MMObject::TYPE_NAME`].
    pub fn type_name(&self) -> &'static str {
        self.type_name
    }

    /// True if the object was a `T`.
    pub fn is<T: MMObject>(&self) -> bool {
        self.type_id == TypeId::of::<T>()
    }
}

impl ObjectManager {
    /// Destroys every dead object, including those that become dead while
    /// others are destroyed (cascades finish in the same call). Objects
    /// that other threads release while it runs wait for the next call, so
    /// it ends even while they go on releasing.
    ///
    /// Costs O(dead + types), never O(live). If a `Drop` panics, the manager
    /// stays consistent (that object counts as destroyed, the rest stay
    /// queued) and the panic propagates; the next call carries on.
    ///
    /// The slots it frees go first to the threads that create through a
    /// [`Loader`](crate::Loader), until each holds twice what it made since
    /// the last call, and the rest are kept for the calling
    /// thread's next `create`s, which reuse them without an atomic
    /// read-modify-write; the next call hands the ones not reused to every
    /// thread (so a `create` on another thread waits at most one collection
    /// for a freed slot).
    pub fn collect_garbage(&mut self) -> CollectStats {
        self.collect_garbage_budgeted(usize::MAX)
    }

    /// Drops `handles` (a level's, at unload) and destroys at once the
    /// objects they alone held, as dropping them and then collecting would,
    /// with less work per object: under `&mut self`, a handle that holds its
    /// object's only reference gives it up with a plain load (a drop takes an
    /// atomic read-modify-write and a record for collection to gather), and
    /// the object is destroyed while its slot is still in cache. Returns what
    /// it destroyed; destroy events and hooks run as in a collection.
    ///
    /// Handles of shared objects, of another manager, or of types whose
    /// objects may hold handles ([`MMObject::may_hold_handles`]) drop the
    /// ordinary way: their objects, and objects that only the destroyed ones
    /// held, wait for the next [`collect_garbage`](Self::collect_garbage).
    ///
    /// # Panics
    ///
    /// If a value's `Drop` panics, that object counts as destroyed, the
    /// manager stays consistent, the handles not reached yet drop the
    /// ordinary way, and the panic propagates.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Prop { id: u32 }
    ///
    /// let mut mm = ObjectManager::new();
    /// let level = mm.create_many((0..1000).map(|id| Prop { id }));
    /// let kept = level[7].clone();
    /// assert_eq!(mm.release_many(level).objects, 999);
    /// assert_eq!(mm[&kept].id, 7, "a shared object stays alive");
    /// assert_eq!(mm.count::<Prop>(), 1);
    /// ```
    pub fn release_many<T: MMObject>(&mut self, handles: impl IntoIterator<Item = Handle<T>>) -> CollectStats {
        let registry = std::sync::Arc::clone(self.registry());
        match registry.store::<T>() {
            // SAFETY: we hold `&mut self`.
            Some(store) => unsafe { store.release_many(handles.into_iter(), self.destroyed.as_mut()) },
            // No store of `T` here: every handle is another manager's.
            None => {
                handles.into_iter().for_each(drop);
                CollectStats::default()
            }
        }
    }

    /// Like [`collect_garbage`](Self::collect_garbage), but stops after
    /// `max_objects`; the rest stay queued for the next call.
    pub fn collect_garbage_budgeted(&mut self, max_objects: usize) -> CollectStats {
        self.collect_rounds(max_objects, true)
    }

    /// [`collect_garbage_budgeted`](Self::collect_garbage_budgeted).
    /// `ends_unused`: this call starts a collection, and its first round
    /// ends the owner's leases not used since the previous one (see
    /// `owner_counts.rs`); every other round (and a call that goes on with
    /// a collection, as `collect_garbage_for`'s later batches) only finds
    /// the objects that died meanwhile, and keeps the leases it renewed.
    pub(crate) fn collect_rounds(&mut self, max_objects: usize, mut ends_unused: bool) -> CollectStats {
        let mut stats = CollectStats::default();
        let mut budget = max_objects;
        let registry = std::sync::Arc::clone(self.registry());
        for store in registry.all_stores() {
            // SAFETY: we hold `&mut self`.
            unsafe { store.share_held_slots() };
        }
        loop {
            let noted = super::last_drops::noted_here();
            // Every round: the last drops made so far, including the
            // cascades of the round before, go onto their dead lists.
            super::last_drops::drain_all();
            let mut freed = 0;
            for store in registry.all_stores() {
                // SAFETY: we hold `&mut self`.
                freed += unsafe { store.collect(ends_unused, &mut budget, &mut stats, self.destroyed.as_mut()) };
            }
            ends_unused = false;
            if freed == 0 {
                break;
            }
            stats.rounds += 1;
            if budget == 0 {
                break;
            }
            // Another round only for a cascade: drops made on this thread
            // by the values it destroyed. Objects that other threads release
            // meanwhile wait for the next call, so a collection ends while
            // other threads go on releasing (it used to chase them).
            if super::last_drops::noted_here() == noted {
                break;
            }
        }
        stats
    }

    /// Destroys dead objects for about `budget`, leaving the rest queued for
    /// the next call.
    ///
    /// It works in batches of 32 objects (through
    /// [`collect_garbage_budgeted`](Self::collect_garbage_budgeted)) and reads
    /// the clock after each, so it overruns its budget by at most one batch of
    /// `Drop`s. It always runs at least one batch, so repeated calls make
    /// progress even with a zero budget. Nothing is lost between calls:
    /// objects not destroyed stay on the dead lists. Cascades that outlast
    /// the budget also stay queued.
    ///
    /// # Panics
    ///
    /// A panic in a `Drop` impl propagates, as in
    /// [`collect_garbage`](Self::collect_garbage); the manager stays consistent.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Particle { pos: [f32; 2] }
    ///
    /// let mut mm = ObjectManager::new();
    /// for _ in 0..100 {
    ///     drop(mm.create(Particle { pos: [0.0; 2] }));
    /// }
    /// let mut freed = 0;
    /// while mm.dead_count() > 0 {
    ///     freed += mm.collect_garbage_for(Duration::from_micros(50)).objects;
    /// }
    /// assert_eq!(freed, 100);
    /// ```
    pub fn collect_garbage_for(&mut self, budget: Duration) -> CollectStats {
        let start = Instant::now();
        let mut stats = CollectStats::default();
        let mut first = true;
        loop {
            // One collection: only the first batch ends unused leases.
            let batch = self.collect_rounds(BATCH, std::mem::take(&mut first));
            // Each batch goes on with the passes of the one before: the rounds
            // are the deepest cascade a batch met, not a pass per batch.
            stats.absorb(CollectStats { rounds: 0, ..batch });
            stats.rounds = stats.rounds.max(batch.rounds);
            // Fewer than a batch means every dead list was found empty.
            if batch.objects < BATCH || start.elapsed() >= budget {
                return stats;
            }
        }
    }

    /// The [`Destroyed`] events recorded since the last drain, oldest first;
    /// empty unless the manager was built with
    /// [`destroy_events(true)`](crate::ObjectManagerBuilder::destroy_events).
    ///
    /// Events not drained stay (and take memory) until the next drain.
    pub fn drain_destroyed(&mut self) -> std::vec::Drain<'_, Destroyed> {
        let events = self.destroyed.get_or_insert_with(Vec::new);
        events.drain(..)
    }

    /// Calls `hook` with each `T` collection destroys, just before its value
    /// drops, with the key it had: to free what a side table keeps for it
    /// (renderer resources, say), or to read its last state. It runs for
    /// every collection (cascades and cycles included) and at shutdown for
    /// the objects destroyed there. A second call replaces the hook.
    ///
    /// The hook must not panic; if it does, the object is destroyed all the
    /// same and the panic propagates from the collection (at shutdown it is
    /// logged and counted in [`ObjectLeakReport::drop_panics`](crate::ObjectLeakReport)).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::mpsc;
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Texture { gpu_id: u32 }
    ///
    /// let mut mm = ObjectManager::new();
    /// let (freed, gpu_frees) = mpsc::channel();
    /// mm.on_destroy::<Texture>(move |_key, texture| freed.send(texture.gpu_id).unwrap());
    /// drop(mm.create(Texture { gpu_id: 7 }));
    /// mm.collect_garbage();
    /// assert_eq!(gpu_frees.try_recv(), Ok(7));
    /// ```
    ///
    /// # Panics
    ///
    /// Panics if `T`'s store cannot be made (see [`try_reserve`](Self::try_reserve)).
    #[track_caller]
    pub fn on_destroy<T: MMObject>(&mut self, hook: impl FnMut(ObjectKey, &mut T) + Send + 'static) {
        match self.registry().store_or_register::<T>() {
            Ok(store) => store.set_destroy_hook(Some(Box::new(hook))),
            Err(e) => super::manager::fail(e),
        }
    }

    /// Removes `T`'s destroy hook, if any.
    pub fn clear_on_destroy<T: MMObject>(&mut self) {
        if let Some(store) = self.store::<T>() {
            store.set_destroy_hook(None);
        }
    }
}
