//! Creating objects from other threads at any time: [`Loader`].

use std::panic::Location;
use std::sync::Arc;

use crate::Error;

use super::manager::fail;
use super::registry::Registry;
use super::store::SlotSource;
use super::{Handle, MMObject, ObjectManager, TryCreateError};

/// Creates objects in an [`ObjectManager`] from any thread, at any time,
/// even while the main thread holds `&mut ObjectManager` (for `get_mut`,
/// `iter_mut` or `collect_garbage`): the way to stream a level in on a
/// loader thread. Take one with [`ObjectManager::loader`]; it is
/// `Send + Sync + Clone`, and clones are cheap (an `Arc`).
///
/// # When its objects become visible
///
/// At once, exactly as with [`ObjectManager::create`]: the handle returned
/// names a live object, and once the main thread has the handle (or
/// synchronises with the loader thread in any other way), `get`, `upgrade`
/// and iterators made from then on see the object. An iterator whose start
/// the loader thread has seen (through any synchronisation) never yields it;
/// one that starts while the `create` runs may. Budgets, capacity limits and
/// the leak report treat loader objects like any other.
///
/// # Which thread owns what
///
/// The thread that holds `&mut ObjectManager` owns collection: it alone
/// destroys objects and puts their slots back on the free list. A loader
/// only ever *takes* slots: those a collection freed and handed to its
/// thread (under a lock of the thread's own), or from the free list under
/// the store's lock, which collection also takes for its one push per
/// store, so the two never interleave. Handles made by a loader are
/// ordinary handles: they may be cloned and dropped on any thread.
///
/// # What it costs
///
/// Each [`create`](Self::create) enters the manager's open state (a count
/// on a line of the calling thread's own, and a fence), then takes a freed
/// slot that a collection handed to the calling thread (under a lock of the
/// thread's own), or, when it has none, either the store's lock on its free
/// list and a pop (when freed slots are waiting) or a compare-exchange on
/// the store's length: locked operations on lines every loader thread
/// shares. A level streamed in through [`create_many`](Self::create_many)
/// enters once per batch, and takes never-used slots a run at a time: 100k
/// objects into an empty manager cost about slotmap's inserts (1.0–1.2×
/// [`ObjectManager::create_many`]), a loop of `create` over 4× that
/// (`BENCHMARKS.md`, O1b).
///
/// Loader threads that create objects all the time, replacing them while
/// the main thread collects (a job system spawning entities), pay more:
/// each object's slot crosses from the thread that made it to the thread
/// that destroys it and back. Each collection hands a thread as many of the
/// slots it freed as the thread made since the last one (up to twice that
/// held), so a thread that keeps its pace creates without waiting for
/// another. In a probe of that pattern (`BENCHMARKS.md`, O8), one such
/// thread took 3.2× `Arc::new`'s time, two 6.3× each (11.4× when they
/// shared the store's free list).
///
/// # From user code the manager runs
///
/// A loader may create from inside a `Drop`, `size()` or destroy hook that a
/// collection runs, and from a store allocator within the rules of
/// [`ObjectManagerBuilder::allocator`](crate::ObjectManagerBuilder::allocator),
/// even while another thread's shutdown waits for the create under way.
///
/// The one thing such code must not do is shut down or drop this loader's
/// own manager on the same thread, from inside a create: in the iterator of
/// [`create_many`](Self::create_many), or in a store allocator under a
/// create. Shutdown waits for every create under way, so it would wait for
/// itself. It panics instead, with a message that says so, and leaves the
/// manager as [`mem::forget`](std::mem::forget) would: its objects are never
/// destroyed and its memory is never freed, so every handle stays sound.
/// (While the thread is already unwinding, it logs that error instead of
/// panicking a second time.)
///
/// # After shutdown
///
/// Once the manager has shut down (or dropped), [`try_create`](Self::try_create)
/// returns [`Error::ManagerShutDown`] with the value, and
/// [`create`](Self::create) panics. A loader keeps the manager's type table
/// and store descriptors (not its objects) until the last loader drops.
///
/// # Examples
///
/// ```
/// use std::sync::mpsc;
/// use mmobject::{MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Prop { id: u32 }
///
/// let mut mm = ObjectManager::new();
/// let loader = mm.loader();
/// let (send, loaded) = mpsc::channel();
/// let thread = std::thread::spawn(move || {
///     for id in 0..100 {
///         send.send(loader.create(Prop { id })).unwrap();
///     }
/// });
/// let mut level = Vec::new();
/// while level.len() < 100 {
///     mm.collect_garbage(); // the main thread's frame goes on meanwhile
///     level.extend(loaded.try_iter());
/// }
/// thread.join().unwrap();
/// assert_eq!(mm[&level[99]].id, 99);
/// assert_eq!(mm.count::<Prop>(), 100);
/// ```
#[derive(Clone)]
pub struct Loader {
    registry: Arc<Registry>,
}

impl Loader {
    pub(crate) fn new(registry: Arc<Registry>) -> Self {
        Loader { registry }
    }

    /// Creates an object and returns the first handle to it; the caller's
    /// location is its creation site.
    ///
    /// # Panics
    ///
    /// Panics with the [`try_create`](Self::try_create) error's message.
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
    /// [`Error::ManagerShutDown`] once the manager has shut down; otherwise
    /// the errors of [`ObjectManager::try_create`].
    #[track_caller]
    pub fn try_create<T: MMObject>(&self, value: T) -> Result<Handle<T>, TryCreateError<T>> {
        self.create_at(value, Location::caller(), true)
    }

    /// Creates one object from each value, in order, and returns their
    /// handles: [`ObjectManager::create_many`] from a loader thread, the bulk
    /// form a level stream uses. All are created at the caller's location.
    ///
    /// Per object it skips what a [`create`](Self::create) loop pays each
    /// time: the manager's open state is checked once for the whole batch,
    /// and never-used slots are taken a run at a time. Freed slots are still
    /// popped one at a time under the store's lock, as `create` pops them.
    ///
    /// A shutdown on another thread waits for the whole batch, as it waits
    /// for a `create` under way: the iterator must not wait for the thread
    /// that drops or shuts down the manager. A shutdown or drop of the
    /// manager *inside* the iterator, on the batch's own thread, would wait
    /// for itself: it panics instead (see the type's docs).
    ///
    /// # Panics
    ///
    /// Panics with the [`try_create_many`](Self::try_create_many) error's message.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Rock { size: u32 }
    ///
    /// let mut mm = ObjectManager::new();
    /// let loader = mm.loader();
    /// let level = std::thread::spawn(move || loader.create_many((0..1000).map(|size| Rock { size })));
    /// mm.collect_garbage(); // the frame goes on meanwhile
    /// let rocks = level.join().unwrap();
    /// assert_eq!(mm[&rocks[999]].size, 999);
    /// assert_eq!(mm.count::<Rock>(), 1000);
    /// ```
    #[track_caller]
    pub fn create_many<T: MMObject>(&self, values: impl IntoIterator<Item = T>) -> Vec<Handle<T>> {
        let mut handles = Vec::new();
        if let Err(e) = self.create_many_at(values.into_iter(), Location::caller(), false, &mut handles) {
            fail(e.error)
        }
        handles
    }

    /// The [`try_create`](Self::try_create) of [`create_many`](Self::create_many),
    /// pushing the handles onto `handles`. As with
    /// [`ObjectManager::try_create_many`], an error loses nothing: the
    /// handles made so far are in `handles`, the refused value comes back,
    /// and the rest stay in the iterator.
    ///
    /// # Errors
    ///
    /// [`Error::ManagerShutDown`] once the manager has shut down (with the
    /// first value, and nothing created); otherwise the errors of
    /// [`ObjectManager::try_create_many`].
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{Error, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Rock { size: u32 }
    ///
    /// let mm = ObjectManager::new();
    /// let loader = mm.loader();
    /// drop(mm);
    /// let mut rocks = Vec::new();
    /// let mut stream = (0..10).map(|size| Rock { size });
    /// let refused = loader.try_create_many(stream.by_ref(), &mut rocks).unwrap_err();
    /// assert!(matches!(refused.error, Error::ManagerShutDown { .. }));
    /// assert_eq!(refused.value.size, 0, "the first value comes back");
    /// assert_eq!(stream.next().map(|r| r.size), Some(1), "the rest stay in the iterator");
    /// assert!(rocks.is_empty());
    /// ```
    #[track_caller]
    pub fn try_create_many<T: MMObject>(
        &self,
        values: impl IntoIterator<Item = T>,
        handles: &mut Vec<Handle<T>>,
    ) -> Result<(), TryCreateError<T>> {
        self.create_many_at(values.into_iter(), Location::caller(), true, handles)
    }

    fn create_many_at<T: MMObject>(
        &self,
        mut values: impl Iterator<Item = T>,
        site: &'static Location<'static>,
        strict_budget: bool,
        handles: &mut Vec<Handle<T>>,
    ) -> Result<(), TryCreateError<T>> {
        // Inside the gate through the batch, as through one create (see
        // `create_at`). The iterator itself drops after the batch, outside:
        // it may own the manager.
        self.registry.gate.enter(|open| {
            if !open {
                let error = Error::ManagerShutDown { manager: self.registry.id };
                return values.next().map_or(Ok(()), |value| Err(TryCreateError { value, error }));
            }
            self.registry.create_many_at(values.by_ref(), site, strict_budget, SlotSource::Loader, handles)
        })
    }

    fn create_at<T: MMObject>(
        &self,
        value: T,
        site: &'static Location<'static>,
        strict_budget: bool,
    ) -> Result<Handle<T>, TryCreateError<T>> {
        // Inside the gate through the create, so shutdown waits for it (see
        // `Registry`); the create runs user code (the store allocator,
        // `size()` under a tracker, a logger), which may create through a
        // loader again (see `OpenGate::enter`).
        self.registry.gate.enter(|open| {
            if !open {
                return Err(TryCreateError { value, error: Error::ManagerShutDown { manager: self.registry.id } });
            }
            self.registry.create_at(value, site, strict_budget, SlotSource::Loader)
        })
    }

    /// The id of the manager this loader creates in.
    pub fn manager_id(&self) -> u32 {
        self.registry.id
    }

    /// True until the manager shuts down.
    pub fn is_open(&self) -> bool {
        self.registry.gate.is_open()
    }
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader").field("manager", &self.registry.id).field("open", &self.is_open()).finish()
    }
}

impl ObjectManager {
    /// A [`Loader`]: creates objects in this manager from any thread, at any
    /// time.
    pub fn loader(&self) -> Loader {
        Loader::new(Arc::clone(self.registry()))
    }
}
