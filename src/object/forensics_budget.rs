//! Cycle collection under a time budget: [`CycleCollector`].
//!
//! [`ObjectManager::collect_cycles`] reads the whole handle graph at once:
//! O(live + edges), milliseconds at 100k objects. A `CycleCollector` does the
//! same work a little each frame. Each [`step`](CycleCollector::step) takes
//! the next live objects in slot order as candidate roots and, from each,
//! reads the objects it reaches (at most [`max_group`](CycleCollector::with_max_group)
//! of them) and runs trial deletion on that group (Bacon and Rajan, 2001):
//! a member whose count is larger than the references it gets from inside
//! the group is held from elsewhere, and so is everything it reaches; what
//! is left is referenced only by itself, and is released as
//! [`collect_cycles`](ObjectManager::collect_cycles) releases its cycles.
//!
//! # Why it is sound across frames
//!
//! Nothing is remembered between steps but a cursor: each group is read,
//! judged and released within one call, under `&mut ObjectManager`. While it
//! runs no weak handle can be upgraded and no raw handle used (both need the
//! manager), so a member's count can only grow through a clone of a handle
//! that already exists, and such a handle outside the group is already
//! counted as "held from elsewhere". Counts that fall meanwhile on other
//! threads only make a member look more alive. So every released group is
//! garbage at that moment, as with `collect_cycles`, and with the same trust
//! in `visit_handles`.
//!
//! # Bounds
//!
//! A step reads at most `max_group` objects per candidate and looks at the
//! clock after each candidate, so it overruns its budget by at most one
//! group; each object in a group has all its handles read, so an object
//! holding 100k handles costs about a millisecond on its own.
//! A pass over all live objects ends after about `live / (objects per step)`
//! steps; [`passes`](CycleCollector::passes) counts them. A cycle is found if
//! everything it reaches fits in `max_group` objects when one of its members
//! comes up as a candidate; larger garbage is left to `collect_cycles`.
//!
//! Candidates are every live object in turn, not only those whose count
//! fell (Bacon and Rajan's "purple" buffer): recording those would put a
//! store on every handle drop, and handle drops stay free of it.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::slot::SlotState;
use super::{CollectStats, ObjectKey, ObjectManager};

/// Cycle collection a bounded slice at a time, over several frames.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use mmobject::{CycleCollector, Handle, MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Node { next: Option<Handle<Node>> }
///
/// let mut mm = ObjectManager::new();
/// let a = mm.create(Node { next: None });
/// let b = mm.create(Node { next: Some(a.clone()) });
/// mm[&a].next = Some(b.clone());
/// drop((a, b)); // a garbage cycle
///
/// let mut collector = CycleCollector::new();
/// let mut freed = 0;
/// while collector.passes() == 0 {
///     // once a frame:
///     freed += collector.step(&mut mm, Duration::from_millis(1)).collected.objects;
/// }
/// assert_eq!(freed, 2);
/// assert!(mm.is_empty());
/// ```
#[derive(Debug, Clone)]
pub struct CycleCollector {
    /// The next candidate: a store index and a local slot index.
    store: u32,
    local: u32,
    /// Objects already read in this pass (as candidates or group members).
    seen: HashSet<ObjectKey>,
    passes: u64,
    max_group: usize,
}

/// What one [`CycleCollector::step`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CycleStep {
    /// Slots looked at as candidates.
    pub candidates: usize,
    /// Objects whose handles were released (members of garbage groups).
    pub released: usize,
    /// What the step's collections destroyed: dead objects first, then the
    /// released groups and what only they held.
    pub collected: CollectStats,
    /// True if the step reached the end of the live objects (a pass ended).
    pub pass_finished: bool,
}

impl Default for CycleCollector {
    fn default() -> Self {
        Self::new()
    }
}

impl CycleCollector {
    /// Objects read per candidate by default.
    pub const DEFAULT_MAX_GROUP: usize = 512;

    /// A collector at the start of its first pass.
    pub fn new() -> Self {
        Self::with_max_group(Self::DEFAULT_MAX_GROUP)
    }

    /// A collector that reads at most `max_group` objects from each candidate
    /// (at least 1): the largest garbage it can find, and the most a step can
    /// overrun its budget by.
    pub fn with_max_group(max_group: usize) -> Self {
        CycleCollector { store: 0, local: 0, seen: HashSet::new(), passes: 0, max_group: max_group.max(1) }
    }

    /// Passes completed over all live objects.
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Works for about `budget`: collects dead objects, then takes candidates
    /// until the budget is spent or the pass ends, releases the garbage
    /// groups found, and collects again.
    ///
    /// It always looks at one candidate at least, so steps make progress
    /// even with a zero budget.
    ///
    /// # Panics
    ///
    /// A panic in a `visit_handles`, `release_handles` or `Drop` impl
    /// propagates; the manager stays consistent and the next step carries on.
    pub fn step(&mut self, mm: &mut ObjectManager, budget: Duration) -> CycleStep {
        let start = Instant::now();
        let mut out = CycleStep { collected: mm.collect_garbage(), ..CycleStep::default() };
        loop {
            let Some(candidate) = self.next_candidate(mm, &mut out.candidates) else {
                self.passes += 1;
                self.seen.clear();
                out.pass_finished = true;
                break;
            };
            if self.seen.insert(candidate) {
                let garbage = self.garbage_from(mm, candidate);
                out.released += garbage.len();
                release(mm, &garbage);
            }
            if start.elapsed() >= budget {
                break;
            }
        }
        if out.released > 0 {
            let more = mm.collect_garbage();
            out.collected.objects += more.objects;
            out.collected.bytes += more.bytes;
            out.collected.rounds += more.rounds;
        }
        out
    }

    /// The next live object at or after the cursor, or `None` at the end of
    /// a pass (the cursor then goes back to the start). Counts slots looked at.
    fn next_candidate(&mut self, mm: &mut ObjectManager, looked: &mut usize) -> Option<ObjectKey> {
        let stores = mm.all_stores().count() as u32;
        while self.store < stores {
            let store = mm.registry().store_by_index(self.store).expect("below the store count");
            while let Some(header) = store.header(self.local) {
                let local = self.local;
                self.local += 1;
                *looked += 1;
                if let SlotState::Live(_) = header.state() {
                    let generation = header.generation.load(std::sync::atomic::Ordering::Relaxed);
                    return Some(ObjectKey::new(store.shared().global_index(local), generation));
                }
            }
            self.store += 1;
            self.local = 0;
        }
        self.store = 0;
        self.local = 0;
        None
    }

    /// Reads the group `candidate` reaches (at most `max_group` objects) and
    /// returns its members referenced only from within the group's garbage.
    fn garbage_from(&mut self, mm: &mut ObjectManager, candidate: ObjectKey) -> Vec<ObjectKey> {
        let mut keys = vec![candidate];
        let mut counts = Vec::new();
        let mut index: HashMap<ObjectKey, u32> = HashMap::from([(candidate, 0)]);
        let mut edges: Vec<(u32, u32)> = Vec::new();
        let mut at = 0;
        while at < keys.len() {
            let key = keys[at];
            let (count, held) = read_object(mm, key).unwrap_or((0, Vec::new()));
            counts.push(count);
            for target in held {
                let to = match index.get(&target) {
                    Some(&to) => to,
                    None if keys.len() < self.max_group && is_live(mm, target) => {
                        index.insert(target, keys.len() as u32);
                        keys.push(target);
                        keys.len() as u32 - 1
                    }
                    None => continue, // outside the group: it does not matter
                };
                edges.push((at as u32, to));
            }
            at += 1;
        }
        self.seen.extend(keys.iter().copied());
        // Trial deletion: take away the references from inside the group.
        let mut inside = vec![0u32; keys.len()];
        for &(_, to) in &edges {
            inside[to as usize] += 1;
        }
        let mut alive: Vec<bool> = (0..keys.len()).map(|v| counts[v] == 0 || counts[v] > inside[v]).collect();
        let mut out_start = vec![0usize; keys.len() + 1];
        for &(from, _) in &edges {
            out_start[from as usize + 1] += 1;
        }
        for v in 0..keys.len() {
            out_start[v + 1] += out_start[v];
        }
        // `edges` are in `from` order (the search read each node once, in order).
        let mut stack: Vec<u32> = (0..keys.len() as u32).filter(|&v| alive[v as usize]).collect();
        while let Some(v) = stack.pop() {
            for &(_, to) in &edges[out_start[v as usize]..out_start[v as usize + 1]] {
                if !alive[to as usize] {
                    alive[to as usize] = true;
                    stack.push(to);
                }
            }
        }
        keys.iter().zip(alive).filter(|(_, alive)| !alive).map(|(&key, _)| key).collect()
    }
}

/// True if `key` names a live (referenced) object of `mm`.
fn is_live(mm: &mut ObjectManager, key: ObjectKey) -> bool {
    let Some((store, local)) = mm.locate_key(key) else { return false };
    let Some(store) = mm.registry().store_by_index(store) else { return false };
    store.header(local).is_some_and(|header| header.is_live(key.generation()))
}

/// The object's strong count and the keys it holds (with multiplicity), if
/// it is live. A panicking `visit_handles` propagates.
fn read_object(mm: &mut ObjectManager, key: ObjectKey) -> Option<(u32, Vec<ObjectKey>)> {
    let (store, local) = mm.locate_key(key)?;
    let store = mm.registry().store_by_index(store)?;
    let count = match store.header(local)?.state() {
        SlotState::Live(count) => count,
        SlotState::Vacant | SlotState::Dead => return None,
    };
    let object = mm.live_object_mut(key)?;
    let mut held = Vec::new();
    object.visit_handles(&mut |key| held.push(key));
    Some((count, held))
}

/// Releases the handles of each object in `keys`, as `collect_cycles` does.
fn release(mm: &mut ObjectManager, keys: &[ObjectKey]) {
    for &key in keys {
        if let Some(object) = mm.live_object_mut(key) {
            object.release_handles();
        }
    }
}
