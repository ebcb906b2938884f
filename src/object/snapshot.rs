//! Snapshots of the live set: "unload the level, collect, and check that
//! nothing it created remains" ([`Snapshot`]).

use super::forensics::annotate_leaks;
use super::leak::{LeakEntry, ObjectLeakReport};
use super::leak_render::{Count, ReportText};
use super::store::leak_entries;
use super::{ObjectKey, ObjectManager};

/// The set of objects alive at one moment, from [`ObjectManager::snapshot`].
///
/// It holds the keys (O(live) memory). Keys include generations, so an object
/// created later in a reused slot is not mistaken for one in the snapshot.
///
/// # Examples
///
/// ```
/// use mmobject::{Handle, MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Texture { pixels: Vec<u8> }
/// #[derive(MMObject)]
/// struct Level { textures: Vec<Handle<Texture>> }
///
/// let mut mm = ObjectManager::new();
/// let before = mm.snapshot();
/// let level = mm.create(Level { textures: vec![mm.create(Texture { pixels: vec![0; 64] })] });
/// assert_eq!(mm.alive_since(&before).len(), 2);
/// drop(level);
/// mm.collect_garbage();
/// mm.assert_released_since(&before); // passes: nothing from the level remains
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    manager: u32,
    /// Sorted.
    keys: Vec<ObjectKey>,
}

impl Snapshot {
    /// Objects alive when the snapshot was taken.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// True if no object was alive when the snapshot was taken.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// True if the object `key` was alive when the snapshot was taken.
    pub fn contains(&self, key: ObjectKey) -> bool {
        self.keys.binary_search(&key).is_ok()
    }
}

impl ObjectManager {
    /// Records which objects are alive now. Costs O(live).
    ///
    /// Compare later with [`alive_since`](Self::alive_since) or
    /// [`assert_released_since`](Self::assert_released_since).
    pub fn snapshot(&self) -> Snapshot {
        let mut keys = Vec::new();
        for store in self.all_stores() {
            store.visit_live(&mut |key, _, _, _| keys.push(key));
        }
        keys.sort_unstable();
        Snapshot { manager: self.id(), keys }
    }

    /// The objects created after `snapshot` that are still alive, in key
    /// order, with their type, count, size and creation site (`retention` is
    /// not computed: see [`retention_path`](Self::retention_path)).
    ///
    /// Objects released but not yet collected are not alive. Costs O(live).
    ///
    /// # Panics
    ///
    /// Panics if the snapshot was taken from another manager.
    pub fn alive_since(&self, snapshot: &Snapshot) -> Vec<LeakEntry> {
        assert_eq!(
            snapshot.manager,
            self.id(),
            "mmobject: a snapshot of object manager #{} used with manager #{}",
            snapshot.manager,
            self.id()
        );
        let mut entries = Vec::new();
        for store in self.all_stores() {
            leak_entries(store, &mut entries);
        }
        entries.retain(|entry| !snapshot.contains(entry.key));
        entries.sort_by_key(|entry| entry.key);
        entries
    }

    /// Checks that every object created after `snapshot` has been released.
    ///
    /// Run [`collect_garbage`](Self::collect_garbage) (and
    /// [`collect_cycles`](Self::collect_cycles), if you use it) first: this
    /// looks at live objects only. Costs O(live) when it passes, and
    /// O(live + edges) to explain a failure.
    ///
    /// # Panics
    ///
    /// Panics if any object created after `snapshot` is still alive. The
    /// message is laid out as the shutdown report: a summary by type and
    /// creation site, the roots that keep the others alive, the reference
    /// cycles among them, then up to
    /// [`DETAILS_PER_SITE`](crate::ObjectLeakReport::DETAILS_PER_SITE)
    /// objects per creation site, each with its holders and the shortest
    /// chain of handles that keeps it alive. Also panics if the snapshot was
    /// taken from another manager.
    #[track_caller]
    pub fn assert_released_since(&self, snapshot: &Snapshot) {
        let entries = self.alive_since(snapshot);
        if entries.is_empty() {
            return;
        }
        let count = entries.len();
        let mut report = ObjectLeakReport { entries, ..ObjectLeakReport::default() };
        annotate_leaks(self, &mut report);
        let header = format!("{} object(s) created since the snapshot are still alive:", Count(count));
        let text = ReportText { report: &report, header: Some(&header), per_site: ObjectLeakReport::DETAILS_PER_SITE };
        let message = text.to_string();
        panic!("{message}");
    }
}
