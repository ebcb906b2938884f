//! Where each live strong handle came from: the `handle-sites` feature.
//!
//! With the feature on, every [`Handle`](crate::Handle) carries an id into its
//! store's table of live handles, and `create`, `clone`, `upgrade` and
//! `handle_from_raw` record their caller's location (`#[track_caller]`: no
//! stack walk, already resolved). Raw references are listed too:
//! [`Handle::into_raw`](crate::Handle::into_raw) and
//! [`add_ref_raw`](crate::ObjectManager::add_ref_raw) record their caller, and
//! `release_raw` / `handle_from_raw` remove the most recent raw site of the
//! object (raw references are plain numbers, so which one went back cannot be
//! told: with several raw references to one object, the sites listed are
//! those of the oldest ones still counted). The leak report then lists, for
//! each leaked object, the sites of the handles and raw references still
//! holding it. With the feature off, none of this exists and handles stay 8
//! bytes (16 with it). The table lives in the store's allocator, as the rest
//! of the store's memory does.

use std::collections::HashMap;
use std::fmt;
use std::panic::Location;

use allocator_api2::vec::Vec as AllocVec;
use hashbrown::{DefaultHashBuilder, HashMap as AllocMap};

use super::reentry::{NamedGuard, NamedMutex};
use super::store_alloc::StoreAlloc;
use crate::sync::{AtomicBool, Mutex, Ordering};

/// How a handle came to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HandleOrigin {
    /// The first handle, from `create`.
    Created,
    /// `Handle::clone`.
    Cloned,
    /// `upgrade` of a weak handle.
    Upgraded,
    /// `handle_from_raw`.
    FromRaw,
    /// A raw reference, from `Handle::into_raw`.
    IntoRaw,
    /// A raw reference, from `add_ref_raw`.
    AddRefRaw,
}

/// Where a live handle was made, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HandleSite {
    /// How the handle was made.
    pub origin: HandleOrigin,
    /// The caller of `create`, `clone`, `upgrade`, `handle_from_raw`,
    /// `into_raw` or `add_ref_raw`.
    pub location: &'static Location<'static>,
}

impl fmt::Display for HandleSite {
    /// `cloned at src/ai.rs:88:21`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verb = match self.origin {
            HandleOrigin::Created => "created",
            HandleOrigin::Cloned => "cloned",
            HandleOrigin::Upgraded => "upgraded",
            HandleOrigin::FromRaw => "taken from a raw handle",
            HandleOrigin::IntoRaw => "made raw",
            HandleOrigin::AddRefRaw => "raw reference added",
        };
        let l = self.location;
        write!(f, "{verb} at {}:{}:{}", l.file(), l.line(), l.column())
    }
}

/// The live handles of one store, by handle id (never 0), in the store's allocator.
#[derive(Debug)]
#[cfg_attr(not(feature = "handle-sites"), allow(dead_code))]
pub(crate) struct HandleSites {
    next: u32,
    live: AllocMap<u32, (u32, HandleSite), DefaultHashBuilder, StoreAlloc>,
    /// Raw references by object index: (registration id, site), oldest first.
    raw: AllocMap<u32, AllocVec<(u32, HandleSite), StoreAlloc>, DefaultHashBuilder, StoreAlloc>,
}

#[cfg_attr(not(feature = "handle-sites"), allow(dead_code))]
impl HandleSites {
    /// An empty table in `alloc`.
    pub(crate) fn new(alloc: StoreAlloc) -> Self {
        HandleSites {
            next: 0,
            live: AllocMap::with_hasher_in(DefaultHashBuilder::default(), alloc.clone()),
            raw: AllocMap::with_hasher_in(DefaultHashBuilder::default(), alloc),
        }
    }

    /// Records a new handle to the object with manager-wide index `index`.
    /// Returns its id, or 0 (nothing recorded) if the store's allocator
    /// refused room for the entry: a diagnostic never aborts a `clone`.
    pub(crate) fn register(&mut self, index: u32, site: HandleSite) -> u32 {
        if self.live.try_reserve(1).is_err() {
            return 0;
        }
        // Ids wrap after 2^32 handles; skip any still in use, so a
        // long-lived handle's entry is never overwritten.
        loop {
            self.next = self.next.wrapping_add(1).max(1);
            if !self.live.contains_key(&self.next) {
                break;
            }
        }
        self.live.insert(self.next, (index, site));
        self.next
    }

    /// Makes room for `additional` more handles; false if the store's
    /// allocator refused it.
    pub(crate) fn reserve(&mut self, additional: usize) -> bool {
        self.live.try_reserve(additional).is_ok()
    }

    /// Forgets the handle `id` (0: never recorded).
    pub(crate) fn remove(&mut self, id: u32) {
        self.live.remove(&id);
    }

    /// Records a new raw reference to the object with manager-wide index
    /// `index`, unless the store's allocator refuses room for it.
    pub(crate) fn register_raw(&mut self, index: u32, site: HandleSite) {
        if self.raw.try_reserve(1).is_err() {
            return;
        }
        let alloc = self.raw.allocator().clone();
        let sites = self.raw.entry(index).or_insert_with(|| AllocVec::new_in(alloc));
        if sites.try_reserve(1).is_err() {
            if sites.is_empty() {
                self.raw.remove(&index);
            }
            return;
        }
        self.next = self.next.wrapping_add(1).max(1);
        sites.push((self.next, site));
    }

    /// Forgets the most recent raw reference to the object `index`, if any.
    pub(crate) fn remove_raw(&mut self, index: u32) {
        if let Some(sites) = self.raw.get_mut(&index) {
            sites.pop();
            if sites.is_empty() {
                self.raw.remove(&index);
            }
        }
    }

    /// The sites of the live handles and raw references, grouped by object
    /// index, oldest first.
    pub(crate) fn by_index(&self) -> HashMap<u32, Vec<HandleSite>> {
        let mut ids: Vec<(u32, u32, HandleSite)> =
            self.live.iter().map(|(&id, &(index, site))| (id, index, site)).collect();
        for (&index, sites) in &self.raw {
            ids.extend(sites.iter().map(|&(id, site)| (id, index, site)));
        }
        ids.sort_by_key(|&(id, _, _)| id);
        let mut out: HashMap<u32, Vec<HandleSite>> = HashMap::new();
        for (_, index, site) in ids {
            out.entry(index).or_default().push(site);
        }
        out
    }
}

/// A removal that arrived while this thread held the table (see [`SiteTable`]).
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(feature = "handle-sites"), allow(dead_code))]
enum Removal {
    /// A handle's id, as in [`HandleSites::remove`].
    Handle(u32),
    /// An object's newest raw site, as in [`HandleSites::remove_raw`].
    Raw(u32),
}

/// A store's [`HandleSites`] behind its lock, with every call safe to make from user code
/// that the table itself runs.
///
/// The table grows through the store's allocator, which is user code: it may make, drop
/// or report handles of this store on the thread that holds the table's lock. None of
/// those may wait for that lock (it would wait for itself) or panic (a drop inside
/// `Drop`). So, on the holding thread only:
/// - a new handle or raw reference is not recorded (its id is 0), as when the allocator
///   refuses room;
/// - a removal is *deferred*: kept in `deferred` and applied at the table's next lock, so
///   every report, which takes the lock, sees it;
/// - a reservation does nothing (the later registrations reserve for themselves), and a
///   report lists no sites.
///
/// # Invariants
///
/// `deferred` is only pushed to by the thread holding `table`'s lock and only drained by a
/// thread holding it, so `has_deferred` (set after a push, cleared after a drain, both
/// under `table`'s lock) is exact for any thread that holds that lock.
#[derive(Debug)]
#[cfg_attr(not(feature = "handle-sites"), allow(dead_code))]
pub(crate) struct SiteTable {
    table: NamedMutex<HandleSites>,
    /// Removals made while the table's holder was inside the table: a handful at most, in
    /// the global allocator (not the store's, which is what is running).
    deferred: Mutex<Vec<Removal>>,
    has_deferred: AtomicBool,
}

#[cfg_attr(not(feature = "handle-sites"), allow(dead_code))]
impl SiteTable {
    /// An empty table in `alloc`, for the store of `type_name`.
    pub(crate) fn new(alloc: StoreAlloc, type_name: &'static str) -> Self {
        SiteTable {
            table: NamedMutex::new(HandleSites::new(alloc), "recording a handle site of", type_name),
            deferred: Mutex::new(Vec::new()),
            has_deferred: AtomicBool::new(false),
        }
    }

    /// The table, locked, with the removals deferred so far applied; `None` on the thread
    /// that already holds it.
    fn lock(&self) -> Option<NamedGuard<'_, HandleSites>> {
        if self.table.held_here() {
            return None;
        }
        let mut table = self.table.lock();
        if self.has_deferred.load(Ordering::Relaxed) {
            let deferred = std::mem::take(&mut *self.deferred.lock());
            self.has_deferred.store(false, Ordering::Relaxed);
            for removal in deferred {
                match removal {
                    Removal::Handle(id) => table.remove(id),
                    Removal::Raw(index) => table.remove_raw(index),
                }
            }
        }
        Some(table)
    }

    /// Keeps `removal` for the table's next lock (this thread holds it now).
    #[cold]
    fn defer(&self, removal: Removal) {
        self.deferred.lock().push(removal);
        self.has_deferred.store(true, Ordering::Relaxed);
    }

    /// Records a new handle to the object `index`: its id, or 0 if nothing was recorded.
    pub(crate) fn register(&self, index: u32, site: HandleSite) -> u32 {
        self.lock().map_or(0, |mut table| table.register(index, site))
    }

    /// Forgets the handle `id` (0: never recorded, and no lock is taken).
    pub(crate) fn remove(&self, id: u32) {
        if id == 0 {
            return;
        }
        match self.lock() {
            Some(mut table) => table.remove(id),
            None => self.defer(Removal::Handle(id)),
        }
    }

    /// Records a new raw reference to the object `index`.
    pub(crate) fn register_raw(&self, index: u32, site: HandleSite) {
        if let Some(mut table) = self.lock() {
            table.register_raw(index, site);
        }
    }

    /// Forgets the most recent raw reference to the object `index`, if any.
    pub(crate) fn remove_raw(&self, index: u32) {
        match self.lock() {
            Some(mut table) => table.remove_raw(index),
            None => self.defer(Removal::Raw(index)),
        }
    }

    /// Makes room for `additional` more handles; false if the store's allocator refused it.
    pub(crate) fn reserve(&self, additional: usize) -> bool {
        self.lock().is_none_or(|mut table| table.reserve(additional))
    }

    /// The live sites by object index, oldest first (see [`HandleSites::by_index`]).
    pub(crate) fn by_index(&self) -> HashMap<u32, Vec<HandleSite>> {
        self.lock().map(|table| table.by_index()).unwrap_or_default()
    }
}
