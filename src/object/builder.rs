//! Building an [`ObjectManager`]: options, and the process-wide manager ids.

use std::any::TypeId;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use allocator_api2::alloc::Allocator;

use crate::track::Tracker;

use super::handle::MAX_MANAGER_ID;
use super::index_space::MAX_INDEX;
use super::registry::{Registry, RegistryConfig};
use super::slot::GENERATION_LIMIT;
use super::store_alloc::StoreAlloc;
use super::{MMObject, ObjectManager};

static NEXT_MANAGER_ID: AtomicU32 = AtomicU32::new(1);

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
    destroy_events: bool,
    owner_thread: bool,
    deferred_drops: bool,
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
            destroy_events: false,
            owner_thread: false,
            deferred_drops: false,
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
    /// Past it, `try_create` fails with [`Error::CapacityExceeded`](crate::Error::CapacityExceeded).
    ///
    /// Below it, every thread may create, loaders included: a type with a
    /// limit holds no slots for the thread that collects (which otherwise
    /// takes fresh slots 64 at a time, and keeps the slots a collection
    /// freed until its next one), so its `create`s skip that fast path.
    pub fn max_objects_per_type(mut self, max: u32) -> Self {
        self.max_objects_per_type = max.min(MAX_INDEX);
        self
    }

    /// Whether shutdown logs each leaked object (default: on). The
    /// [`ObjectLeakReport`](super::ObjectLeakReport) is returned either way.
    pub fn report_leaks(mut self, on: bool) -> Self {
        self.report_leaks = on;
        self
    }

    /// Reports each type's bytes to `tracker`, under the type's `#[mm(tag)]`.
    ///
    /// A budget on that tag then limits creation: [`ObjectManager::try_create`]
    /// returns [`Error::BudgetExceeded`](crate::Error::BudgetExceeded) when the new object would go over it,
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
    /// [`Error::StoreOutOfMemory`](crate::Error::StoreOutOfMemory) with the value, and
    /// [`ObjectManager::create`] panics with that error's message, which names
    /// the type and the allocator. Objects already alive are untouched.
    ///
    /// # Re-entrancy
    ///
    /// The manager calls the allocator while a store grows (and, the first
    /// time a type is used, while the type registers), sometimes holding one
    /// of its locks, on whichever thread creates, drops or collects. The
    /// allocator's own code may use the manager, within these rules:
    ///
    /// - It may create objects (through the manager or a
    ///   [`Loader`](crate::Loader)) of types already registered, other than
    ///   the one whose store is growing; grow other stores; clone and drop
    ///   handles, the last ones included; read objects and count them; and
    ///   collect another manager. Where the manager would wait for itself it
    ///   does without: a handle dropped while the allocator grows the cycle
    ///   candidate queue goes unqueued (the [`CycleCollector`](crate::CycleCollector)
    ///   then scans the store), an object created while a creation site is
    ///   numbered gets no site, a count made while checks are queued leaves
    ///   them out, the last drops made while this thread drains its
    ///   ring go straight to the dead lists, and (feature `handle-sites`) a
    ///   handle made while the handle-site table grows gets no site, while
    ///   one dropped then leaves the table at its next lock. One costs memory until
    ///   shutdown: on an [owner thread](Self::owner_thread)'s manager, the
    ///   last handle dropped to an object the owner holds counts on, while
    ///   the allocator grows that type's queue of such checks, leaves the
    ///   object to shutdown (an error is logged).
    /// - It must not create an object of the type whose store it is growing,
    ///   nor of a type not registered yet while a type registers (reserve
    ///   such types first, with [`ObjectManager::reserve`]`::<T>(0)`), nor
    ///   use raw handles of the store it serves.
    ///   Each would wait for a lock its own thread holds: the manager panics
    ///   instead, with a message that names what the thread was doing
    ///   ("this thread is already growing the store of `Prop`").
    /// - Under a create through a [`Loader`](crate::Loader), it must not
    ///   shut down or drop that loader's own manager: shutdown waits for the
    ///   create under way, so it would wait for itself. It panics instead, and
    ///   leaves the manager as [`mem::forget`](std::mem::forget) would (see
    ///   [`Loader`](crate::Loader)).
    /// - It may panic (on a refusal it cannot report, say): the operation
    ///   that allocated panics with it and the manager stays consistent,
    ///   though objects whose bookkeeping the allocation was for may be
    ///   reclaimed only at shutdown (a leak, never a double destroy).
    ///
    /// The same rules hold for a logger and a tracker's budget callback,
    /// which the manager may call from the same places. The simplest
    /// allocator, and the fastest, uses no manager at all.
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

    /// Records a [`Destroyed`](super::Destroyed) event for every object collection destroys
    /// (default: off), to be read with
    /// [`ObjectManager::drain_destroyed`]. Each costs 32 bytes until drained:
    /// drain them every frame.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Mesh { vertices: u32 }
    ///
    /// let mut mm = ObjectManager::builder().destroy_events(true).build();
    /// let mesh = mm.create(Mesh { vertices: 3 });
    /// let key = mesh.key();
    /// drop(mesh);
    /// mm.collect_garbage();
    /// let events: Vec<_> = mm.drain_destroyed().collect();
    /// assert_eq!(events.len(), 1);
    /// assert_eq!(events[0].key(), key);
    /// assert!(events[0].is::<Mesh>());
    /// ```
    pub fn destroy_events(mut self, on: bool) -> Self {
        self.destroy_events = on;
        self
    }

    /// Makes the thread that builds the manager its *owner* (default: off).
    ///
    /// Handle clones and drops on the owner thread then cost plain loads and
    /// stores instead of an atomic read-modify-write: the owner keeps a small
    /// reservation of counts per object it clones, which its collections
    /// renew while it goes on cloning that object's handles, and give back
    /// at the first one after a frame in which it did not (see
    /// `BENCHMARKS.md`, O2 and O2c, for the numbers). Drops on other
    /// threads stay one `fetch_sub`, as `Arc`'s. Turn it on when the manager stays on the thread that builds
    /// it and calls [`collect_garbage`](super::ObjectManager::collect_garbage)
    /// each frame, as a game's main thread does, and that thread clones and
    /// drops handles often. It does not speed up churn: the release of an
    /// object the owner never cloned first reads the reservation, then counts
    /// down as without an owner, so a frame of creates and releases runs no
    /// faster (BENCHMARKS.md, O1 and O1c).
    ///
    /// Keep it off if the manager moves to another thread to be collected.
    /// Only the owner can read its reservations, so a collection on another
    /// thread leaves the objects whose count is all a reservation (their last
    /// handle went while the owner held counts on them) for a collection on
    /// the owner thread, or for shutdown, and logs a warning once. Moving it
    /// stays sound: a shutdown (or drop) on another thread, even while the
    /// owner thread goes on cloning and dropping handles, destroys every
    /// value once, and keeps the memory of a store in which the owner holds
    /// counts on an object, as for handles that outlive the manager.
    ///
    /// What else changes: when the last handle of an object is dropped on
    /// another thread while the owner holds counts on it, weak reads may
    /// still see the object until the owner's next collection (or the one
    /// after, if the drop races the collection), and so may
    /// `upgrade` on threads other than the owner (the object then stays
    /// alive). When the last handle goes on the owner thread, everything
    /// fails at once, as without an owner. Objects of types that may hold
    /// handles (see [`CycleCollector`](crate::CycleCollector)) are always
    /// counted atomically.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Entity { hp: u32 }
    ///
    /// // This thread runs the frames: its clones and drops are plain loads and stores.
    /// let mut mm = ObjectManager::builder().owner_thread(true).build();
    /// let e = mm.create(Entity { hp: 3 });
    /// let weak = e.downgrade();
    /// let copies: Vec<_> = (0..100).map(|_| e.clone()).collect();
    /// assert_eq!(e.ref_count(), 101);
    /// drop(copies);
    /// drop(e);
    /// assert!(mm.upgrade(weak).is_none());
    /// assert_eq!(mm.dead_count(), 1);
    /// assert_eq!(mm.collect_garbage().objects, 1);
    /// ```
    pub fn owner_thread(mut self, on: bool) -> Self {
        self.owner_thread = on;
        self
    }

    /// Defers each handle drop: the drop writes the object's slot into a
    /// buffer of its thread and returns, and the count goes down later, with
    /// a batch of others. Off by default.
    ///
    /// A frame that releases objects at random among many live ones pays, per
    /// release, a locked decrement on a cold cache line, and those misses do
    /// not overlap. Deferred, the decrements run in a batch that prefetches
    /// each count a few entries ahead, so they do: a frame of 1,000 random
    /// releases and creates among 100k ran 20–52 % faster on the hosts
    /// measured (BENCHMARKS.md, O1). Unloading a level's handles in order ran
    /// up to 3 % slower (they already overlap, and the buffer adds work): unload
    /// with [`release_many`](crate::ObjectManager::release_many) instead.
    ///
    /// **What changes.** A deferred drop takes effect when its thread's
    /// buffer is applied, which is at the latest at the next
    /// [`collect_garbage`](crate::ObjectManager::collect_garbage) (every
    /// round, so cascades still finish in one call), and also at
    /// [`dead_count`](crate::ObjectManager::dead_count), at shutdown, when
    /// the thread exits, and after every 256 drops on the thread. Until then
    /// the object counts the dropped handle:
    /// [`Handle::ref_count`](crate::Handle::ref_count) includes it, and
    /// [`upgrade`](crate::ObjectManager::upgrade) and weak reads still find
    /// the object alive, exactly as if the handle were dropped that much
    /// later (with the `handle-sites` feature, the handle's site is forgotten
    /// at the drop itself). Nothing is destroyed early, and collection,
    /// reports and the leak report at shutdown are exact as before. Clones
    /// still count at once. Objects of types that may hold handles (see
    /// [`CycleCollector`](crate::CycleCollector)) count every drop at once.
    ///
    /// It cannot be combined with [`owner_thread`](Self::owner_thread):
    /// [`build`](Self::build) panics if both are on.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Particle { pos: [f32; 3] }
    ///
    /// let mut mm = ObjectManager::builder().deferred_drops(true).build();
    /// let p = mm.create(Particle { pos: [0.0; 3] });
    /// let weak = p.downgrade();
    /// drop(p);
    /// assert!(mm.is_alive(weak), "the drop waits for the next collection");
    /// assert_eq!(mm.collect_garbage().objects, 1);
    /// assert!(!mm.is_alive(weak));
    /// ```
    pub fn deferred_drops(mut self, on: bool) -> Self {
        self.deferred_drops = on;
        self
    }

    /// Creates the manager.
    ///
    /// # Panics
    ///
    /// Panics once a process has built 2^16 - 1 (65,535) managers. Manager
    /// ids are never reused, because a handle of a dropped manager must never
    /// pass another manager's check, and handles carry their manager's id in
    /// 16 bits (so that a read checks it with one compare, without a load).
    ///
    /// Panics if both [`owner_thread`](Self::owner_thread) and
    /// [`deferred_drops`](Self::deferred_drops) are on.
    pub fn build(self) -> ObjectManager {
        assert!(
            !(self.owner_thread && self.deferred_drops),
            "mmobject: an object manager cannot have both an owner thread and deferred drops: \
             build it with `owner_thread(true)` or with `deferred_drops(true)`, not both"
        );
        let id = next_manager_id();
        // Before any store exists, so every handle of the manager sees it.
        super::deferred_drops::set(id, self.deferred_drops);
        let config = RegistryConfig {
            base_bits: self.segment_base.trailing_zeros(),
            max_objects: self.max_objects_per_type,
            tracker: self.tracker,
            first_generation: self.first_generation.unwrap_or_else(|| first_generation_of(id)),
            owner: if self.owner_thread {
                super::owner_counts::claim(id);
                crate::sync::thread_token()
            } else {
                0
            },
            alloc: self.alloc.unwrap_or_else(StoreAlloc::default_segments),
            alloc_for: self.alloc_for,
        };
        ObjectManager::from_parts(
            Arc::new(Registry::new(id, config)),
            self.report_leaks,
            self.destroy_events.then(Vec::new),
        )
    }
}

/// Hands out the next manager id: each once per process, never wrapping.
#[cfg(not(loom))]
fn next_manager_id() -> u32 {
    let next = NEXT_MANAGER_ID
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| (id <= MAX_MANAGER_ID).then_some(id + 1));
    match next {
        Ok(id) => id,
        Err(_) => panic!(
            "mmobject: object manager ids are used up: all {MAX_MANAGER_ID} have been handed out in this process, \
             and ids are never reused (a handle of a dropped manager must never match a new one)"
        ),
    }
}

/// Under loom, ids wrap around instead of running out: the loom suite runs
/// every model many thousands of times in one process (more managers than
/// handles have id bits for), and no handle outlives the model run that made
/// its manager, so none can meet a later manager with the same id.
#[cfg(loom)]
fn next_manager_id() -> u32 {
    let wrap = |id: u32| Some(if id >= MAX_MANAGER_ID { 1 } else { id + 1 });
    match NEXT_MANAGER_ID.fetch_update(Ordering::Relaxed, Ordering::Relaxed, wrap) {
        Ok(id) | Err(id) => id,
    }
}

/// Test hook: moves the next manager id up to at least `id`, so a test can
/// reach the end of the ids quickly. It never moves it down, so no id is ever
/// handed out twice.
#[doc(hidden)]
pub fn skip_manager_ids_for_tests(id: u32) {
    NEXT_MANAGER_ID.fetch_max(id, Ordering::Relaxed);
}

/// The generation a manager's new slots start at: even, spread over
/// `0..2^22` by the id, so that a raw handle of one manager rarely matches a
/// slot of another, while leaving each slot about 2^31 reuses before it
/// retires.
fn first_generation_of(id: u32) -> u32 {
    (id.wrapping_mul(0x9E37_79B9) >> 11) << 1
}

/// The next id [`next_manager_id`] would hand out (ids below it were made).
pub(crate) fn manager_ids_made() -> u32 {
    NEXT_MANAGER_ID.load(Ordering::Relaxed)
}
