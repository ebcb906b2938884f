//! Leak forensics over the handle graph: who holds an object
//! ([`ObjectManager::holders`]), the shortest chain of handles that keeps it
//! alive ([`ObjectManager::retention_path`]), and reference cycles
//! ([`ObjectManager::find_cycles`], [`ObjectManager::collect_cycles`]).
//!
//! How the graph is read, what it costs and how far it trusts user code:
//! [`implementation`](crate::implementation#leak-forensics).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::forensics_graph::{Analysis, NONE};
use super::leak::{LeakEntry, LeakRoot, ObjectLeakReport};
use super::{CollectStats, ObjectKey, ObjectManager};

/// An object named by its type and key, as in reports: `Texture#3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectName {
    /// The object's type.
    pub type_name: &'static str,
    /// The object's key.
    pub key: ObjectKey,
}

/// An object holding a handle to another, and the field that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Holder {
    /// The holding object.
    pub object: ObjectName,
    /// Its field holding the handle (empty where the type does not name its fields).
    pub field: &'static str,
}

/// A group of live objects kept alive only by each other's handles.
///
/// `members` holds one strongly connected component of the handle graph that
/// nothing outside the manager reaches. Its first `cycle_len` members form a
/// shortest cycle through the group's smallest key: each holds a handle to the
/// next, and the last holds one to the first. The rest follow in key order.
///
/// `Display` prints the cycle with the fields that hold each next member:
/// `Widget#4.children -> Widget#5.parent -> Widget#4`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReferenceCycle {
    /// The members: the cycle first, then the rest of the group.
    pub members: Vec<ObjectName>,
    /// How many of the first `members` form the cycle (at least 1: an object
    /// holding a handle to itself).
    pub cycle_len: usize,
    /// For each cycle member, the field holding the next member (the last
    /// one's holds the first): `cycle_len` names, from
    /// [`visit_handles_named`](crate::MMObject::visit_handles_named); empty
    /// where the type does not name its fields.
    pub fields: Vec<&'static str>,
}

impl ReferenceCycle {
    /// The members' keys, in the order of [`members`](Self::members).
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.members.iter().map(|m| m.key).collect()
    }

    /// The members that form the cycle, in order.
    pub fn cycle(&self) -> &[ObjectName] {
        &self.members[..self.cycle_len]
    }
}

/// Where a [`RetentionPath`] starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RetentionRoot {
    /// The first object of the chain is held from outside the manager:
    /// `outside` of its `total` strong references are not handles inside
    /// other live objects.
    Outside {
        /// References from outside the manager (handles in variables and
        /// systems, raw handles, objects dead but not yet collected).
        outside: u32,
        /// All its strong references.
        total: u32,
    },
    /// The first object of the chain belongs to this reference cycle: nothing
    /// outside the manager keeps the chain alive. (Shared: every object a
    /// cycle retains names the same one.)
    Cycle(Arc<ReferenceCycle>),
    /// No holder was found: counts changed while the graph was read (handles
    /// were cloned or dropped on another thread).
    Unaccounted,
}

/// The shortest chain of handles that keeps an object alive.
///
/// `chain` runs from an object held from outside the manager (or from a
/// member of a reference cycle) to the object asked about: each link holds a
/// handle to the next, in the field named in `fields`. `Display` prints
/// `Level#1.materials -> Material#7.albedo -> Texture#3 (Level#1 is held from outside: 1 of its 1 references)`,
/// shortened in the middle when the chain is long. A chain of one, the object
/// itself, prints only what holds it: `references from outside the manager (2 of its 2)`
/// or `a reference cycle: Node#4 -> Node#5 -> Node#4`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionPath {
    /// From the root to the object: each link holds a handle to the next.
    pub chain: Vec<ObjectName>,
    /// `fields[i]` is the field of `chain[i]` that holds `chain[i + 1]`
    /// (one fewer than `chain`), from
    /// [`visit_handles_named`](crate::MMObject::visit_handles_named); empty
    /// where the type does not name its fields.
    pub fields: Vec<&'static str>,
    /// Links left out of the middle of `chain`, between `chain[3]` and
    /// `chain[4]`: leak reports keep the first 4 and last 3 links of a chain
    /// longer than 8, so that they stay linear in the number of objects.
    /// Always 0 from [`retention_path`](crate::ObjectManager::retention_path).
    /// When it is not 0, `fields[3]` names the field of `chain[3]` that holds
    /// the first hidden link.
    pub hidden: usize,
    /// What keeps `chain[0]` alive.
    pub root: RetentionRoot,
}

impl RetentionPath {
    /// True if the chain ends at an object held from outside the manager.
    pub fn is_held_from_outside(&self) -> bool {
        matches!(self.root, RetentionRoot::Outside { .. })
    }

    /// The keys of [`chain`](Self::chain), root first.
    pub fn keys(&self) -> Vec<ObjectKey> {
        self.chain.iter().map(|link| link.key).collect()
    }

    /// Links in the whole chain, counting those left out (see [`hidden`](Self::hidden)).
    pub fn len(&self) -> usize {
        self.chain.len() + self.hidden
    }

    /// Never true: a chain holds at least the object itself.
    pub fn is_empty(&self) -> bool {
        self.chain.is_empty()
    }
}

/// Fills in the retention paths, holders, roots and cycles of a shutdown
/// report, before any value is destroyed. Builds the graph once:
/// O(live + edges) for the whole report.
pub(crate) fn annotate_leaks(mm: &ObjectManager, report: &mut ObjectLeakReport) {
    let analysis = Analysis::of(mm);
    let cycles = analysis.shared_cycles();
    annotate_entries(&analysis, &mut report.entries, &cycles);
    let chains = analysis.chains();
    // What each chain start retains: the leaked objects whose chain starts there.
    let mut retains = vec![(0usize, 0usize); analysis.graph.len()];
    for entry in &report.entries {
        let Some(&node) = analysis.graph.index.get(entry.key) else { continue };
        let origin = chains.origin[node as usize];
        if origin != NONE && origin != node {
            retains[origin as usize].0 += 1;
            retains[origin as usize].1 = retains[origin as usize].1.saturating_add(entry.size);
        }
    }
    report.roots = (0..analysis.graph.len())
        .filter(|&v| analysis.rooted[v] && analysis.parent[v] == NONE && retains[v].0 > 0)
        .map(|v| LeakRoot {
            object: analysis.graph.name(v as u32),
            outside: analysis.graph.outside(v),
            total: analysis.graph.ref_counts[v],
            retains: retains[v].0,
            retained_bytes: retains[v].1,
        })
        .collect();
    report.roots.sort_by(|a, b| b.retains.cmp(&a.retains).then(a.object.key.cmp(&b.object.key)));
    report.cycle_retains = analysis
        .cycles
        .iter()
        .map(|(members, _)| members.iter().map(|&m| retains[m as usize].0).sum::<usize>())
        .collect();
    // Only the cycles among the entries (all of them at shutdown).
    let mut keys: Vec<ObjectKey> = report.entries.iter().map(|e| e.key).collect();
    keys.sort_unstable();
    let touches = |cycle: &ReferenceCycle| cycle.members.iter().any(|m| keys.binary_search(&m.key).is_ok());
    let kept: Vec<usize> = (0..cycles.len()).filter(|&id| touches(&cycles[id])).collect();
    report.cycle_retains = kept.iter().map(|&id| report.cycle_retains[id]).collect();
    report.cycles = kept.iter().map(|&id| (*cycles[id]).clone()).collect();
}

/// Sets `retention` and `holders` on each entry that names a live object.
fn annotate_entries(analysis: &Analysis, entries: &mut [LeakEntry], cycles: &[Arc<ReferenceCycle>]) {
    let chains = analysis.chains();
    let reverse = analysis.reverse();
    for entry in entries {
        let Some(&node) = analysis.graph.index.get(entry.key) else { continue };
        entry.retention = Some(analysis.short_path(node, &chains, cycles));
        entry.holders = analysis.holders(node, &reverse);
    }
}

impl ObjectManager {
    /// The live objects that hold a strong handle to `key`, in key order.
    ///
    /// "Hold" means that the object's
    /// [`visit_handles`](crate::MMObject::visit_handles) yields `key`. Handles
    /// in local variables, systems and raw handles are not objects, so they
    /// are not listed; compare the count with [`Handle::ref_count`](crate::Handle::ref_count).
    ///
    /// Costs O(live + edges): it visits every live object.
    ///
    /// A key that names no live object of this manager (stale, or from
    /// another manager) has no holders: the result is empty. Keys carry no
    /// manager id, so a foreign key cannot be told apart from a stale one;
    /// [`retention_path`](Self::retention_path) returns `None` for both.
    /// (Generations start at a per-manager offset, so a foreign key does not
    /// name an object here by accident.)
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{Handle, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Texture { pixels: Vec<u8> }
    /// #[derive(MMObject)]
    /// struct Material { albedo: Handle<Texture> }
    ///
    /// let mm = ObjectManager::new();
    /// let tex = mm.create(Texture { pixels: vec![0; 16] });
    /// let a = mm.create(Material { albedo: tex.clone() });
    /// let b = mm.create(Material { albedo: tex.clone() });
    /// assert_eq!(mm.holders(tex.key()), vec![a.key(), b.key()]);
    /// assert!(mm.holders(a.key()).is_empty());
    /// ```
    pub fn holders(&self, key: ObjectKey) -> Vec<ObjectKey> {
        let mut holders = Vec::new();
        for store in self.all_stores() {
            store.visit_live(&mut |holder, _, _, value| {
                let mut holds = false;
                let visit = || value.visit_handles(&mut |held| holds |= held == key);
                let _ = catch_unwind(AssertUnwindSafe(visit));
                if holds {
                    holders.push(holder);
                }
            });
        }
        holders.sort_unstable();
        holders
    }

    /// The shortest chain of handles that keeps the object `key` alive, or
    /// `None` if `key` names no live object of this manager (a stale key, or
    /// a key from another manager).
    ///
    /// The chain starts at an object held from outside the manager (a handle
    /// in a variable, a raw handle) and each link holds a handle to the next;
    /// for an object held only by a reference cycle, it starts at a member of
    /// the cycle and says so. See [the implementation notes](crate::implementation#leak-forensics)
    /// for how outside references are counted, and the cost: O(live + edges).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{Handle, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Texture { pixels: Vec<u8> }
    /// #[derive(MMObject)]
    /// struct Material { albedo: Handle<Texture> }
    /// #[derive(MMObject)]
    /// struct Level { materials: Vec<Handle<Material>> }
    ///
    /// let mm = ObjectManager::new();
    /// let tex = mm.create(Texture { pixels: vec![0; 16] });
    /// let mat = mm.create(Material { albedo: tex.clone() });
    /// let level = mm.create(Level { materials: vec![mat] });
    /// let key = tex.key();
    /// drop(tex);
    ///
    /// let path = mm.retention_path(key).unwrap();
    /// assert!(path.is_held_from_outside());
    /// assert_eq!(path.chain.len(), 3);
    /// assert_eq!(
    ///     path.to_string(),
    ///     format!("Level{}.materials -> Material{}.albedo -> Texture{} (Level{} is held from outside: 1 of its 1 references)",
    ///         level.key(), mm[&level].materials[0].key(), key, level.key())
    /// );
    /// ```
    pub fn retention_path(&self, key: ObjectKey) -> Option<RetentionPath> {
        let analysis = Analysis::of(self);
        let node = *analysis.graph.index.get(key)?;
        Some(analysis.path(node, &analysis.shared_cycles()))
    }

    /// Groups of live objects kept alive only by each other's handles.
    ///
    /// Each group is a strongly connected component of the handle graph that
    /// no object held from outside the manager reaches. Its first members form
    /// a shortest cycle through its smallest key, in handle order; the rest
    /// follow in key order. Groups are sorted by their first key. Objects that
    /// a cycle holds but that hold no cycle themselves are not listed, though
    /// [`collect_cycles`](Self::collect_cycles) frees them too.
    ///
    /// Objects released but not yet collected hold their handles until
    /// collected, so they count as outside references: run
    /// [`collect_garbage`](Self::collect_garbage) first for an exact answer.
    /// Costs O(live + edges); see [the implementation notes](crate::implementation#leak-forensics).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{Handle, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Node { next: Option<Handle<Node>> }
    ///
    /// let mut mm = ObjectManager::new();
    /// let a = mm.create(Node { next: None });
    /// let b = mm.create(Node { next: Some(a.clone()) });
    /// mm[&a].next = Some(b.clone());
    /// let (ka, kb) = (a.key(), b.key());
    /// assert!(mm.find_cycles().is_empty(), "still held from outside");
    /// drop((a, b));
    /// assert_eq!(mm.find_cycles(), vec![vec![ka, kb]]);
    /// assert_eq!(mm.collect_cycles().objects, 2);
    /// ```
    pub fn find_cycles(&self) -> Vec<Vec<ObjectKey>> {
        self.reference_cycles().iter().map(ReferenceCycle::keys).collect()
    }

    /// Like [`find_cycles`](Self::find_cycles), with each member's type name.
    pub fn reference_cycles(&self) -> Vec<ReferenceCycle> {
        Analysis::of(self).reference_cycles()
    }

    /// Frees the reference cycles that [`find_cycles`](Self::find_cycles)
    /// finds, and everything only they hold. Opt-in: call it at a level
    /// unload or every few seconds, not every frame.
    ///
    /// It first runs [`collect_garbage`](Self::collect_garbage). Then it
    /// calls [`release_handles`](crate::MMObject::release_handles) on each
    /// cycle member (the derive empties `Option<Handle<_>>` fields and clears
    /// `Vec`s of handles), and runs `collect_garbage` again, which destroys
    /// the members whose count dropped to zero, in cascade. It never drops a
    /// value itself: if `visit_handles` reported handles an object does not
    /// hold, that object is still referenced and stays alive.
    ///
    /// A cycle whose every link is a plain `Handle<T>` field cannot be
    /// released (a `Handle` has no empty state) and stays alive: give one
    /// link an `Option` or `Vec` field.
    ///
    /// Returns both collections' statistics, added up. Costs O(live + edges)
    /// plus the collections.
    ///
    /// # Panics
    ///
    /// A panic in a `release_handles` or `Drop` impl propagates; the manager
    /// stays consistent, and the next call carries on.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{Handle, MMObject, ObjectManager};
    ///
    /// #[derive(MMObject)]
    /// struct Node { me: Option<Handle<Node>>, payload: Vec<u8> }
    ///
    /// let mut mm = ObjectManager::new();
    /// let a = mm.create(Node { me: None, payload: vec![1; 100] });
    /// mm[&a].me = Some(a.clone()); // holds itself
    /// drop(a);
    /// assert_eq!(mm.collect_garbage().objects, 0);
    /// assert_eq!(mm.collect_cycles().objects, 1);
    /// assert!(mm.is_empty());
    /// ```
    pub fn collect_cycles(&mut self) -> CollectStats {
        let mut stats = self.collect_garbage();
        let members: Vec<ObjectKey> = {
            let analysis = Analysis::of(self);
            analysis
                .cycles
                .iter()
                .flat_map(|(members, _)| members.iter().map(|&v| analysis.graph.keys[v as usize]))
                .collect()
        };
        for key in members {
            if let Some(object) = self.live_object_mut(key) {
                object.release_handles();
            }
        }
        // The same collection's second pass: it keeps the leases the first renewed.
        stats.absorb(self.collect_rounds(usize::MAX, false));
        stats
    }
}
