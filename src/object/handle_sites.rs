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
//! holding it. With the feature off, none of this exists and handles stay 24
//! bytes.

use std::collections::HashMap;
use std::fmt;
use std::panic::Location;

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

/// The live handles of one store, by handle id (never 0).
#[derive(Debug, Default)]
#[cfg_attr(not(feature = "handle-sites"), allow(dead_code))]
pub(crate) struct HandleSites {
    next: u32,
    live: HashMap<u32, (u32, HandleSite)>,
    /// Raw references by object index: (registration id, site), oldest first.
    raw: HashMap<u32, Vec<(u32, HandleSite)>>,
}

#[cfg_attr(not(feature = "handle-sites"), allow(dead_code))]
impl HandleSites {
    /// Records a new handle to the object with manager-wide index `index`.
    pub(crate) fn register(&mut self, index: u32, site: HandleSite) -> u32 {
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

    pub(crate) fn remove(&mut self, id: u32) {
        self.live.remove(&id);
    }

    /// Records a new raw reference to the object with manager-wide index `index`.
    pub(crate) fn register_raw(&mut self, index: u32, site: HandleSite) {
        self.next = self.next.wrapping_add(1).max(1);
        self.raw.entry(index).or_default().push((self.next, site));
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
