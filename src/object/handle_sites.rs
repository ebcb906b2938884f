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

use super::store_alloc::StoreAlloc;

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
