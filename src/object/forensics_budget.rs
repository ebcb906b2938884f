//! Cycle collection under a time budget: [`CycleCollector`].
//!
//! [`ObjectManager::collect_cycles`] reads the whole handle graph at once:
//! O(live + edges), milliseconds at 100k objects. A `CycleCollector` works
//! from *candidate roots* instead (Bacon and Rajan, 2001): the objects whose
//! count fell and stayed above zero since the collector last looked at them,
//! which handle drops queue as they happen (see `candidates.rs`). A garbage
//! cycle is always made by such a drop (its last outside handle goes; the
//! references from inside remain), so the live objects nobody let go of are
//! never read. Each [`step`](CycleCollector::step) takes candidates until its
//! budget is spent and, from each, reads the objects it reaches (at most
//! [`max_group`](CycleCollector::with_max_group) of them) and runs trial
//! deletion on that group: a member whose count is larger than the
//! references it gets from inside the group is held from elsewhere, and so
//! is everything it reaches; what is left is referenced only by itself, and
//! is released as [`collect_cycles`](ObjectManager::collect_cycles) releases
//! its cycles.
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
//! # Why it is complete
//!
//! A candidate's flag is cleared (one compare-exchange on its count word)
//! before its group is read, and a drop that leaves references behind sets
//! the flag in the same atomic step as its decrement. So a drop either
//! happened before the clear, and the read sees it, or it sets the flag
//! again and queues the object anew. A garbage cycle whose members' groups
//! fit in `max_group` is therefore found by a later step, whichever thread
//! made it garbage. A group cut short at `max_group` is counted in
//! [`CycleStep::cut_short`]: garbage that large is left to `collect_cycles`.
//!
//! # Bounds
//!
//! A step reads at most `max_group` objects per candidate and looks at the
//! clock after each candidate, so it overruns its budget by at most one
//! group; each object in a group has all its handles read, so an object
//! holding 100k handles costs about a millisecond on its own. A pass ends
//! when the candidates queued so far are all taken; its cost is proportional
//! to the candidates and their groups, never to the other live objects.
//!
//! If a store's allocator refused room for a candidate, the flag was left
//! clear, and the collector walks every live object of that store once
//! instead (as candidates), so nothing is missed.

use std::collections::HashMap;
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
/// // Once a frame:
/// let step = collector.step(&mut mm, Duration::from_millis(1));
/// assert_eq!(step.candidates, 2, "each lost a handle and kept one");
/// assert_eq!(step.collected.objects, 2);
/// assert!(mm.is_empty());
/// ```
#[derive(Debug, Clone)]
pub struct CycleCollector {
    /// The store whose candidates are taken next.
    store: u32,
    /// While walking every live slot of `store` (its buffer lost entries):
    /// the next local slot index.
    scan: Option<u32>,
    passes: u64,
    max_group: usize,
}

/// What one [`CycleCollector::step`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CycleStep {
    /// Candidate roots taken (including those that had died or had been
    /// taken already, which cost no read).
    pub candidates: usize,
    /// Groups that reached the collector's `max_group` before all they
    /// reach was read: any garbage among them is left to
    /// [`collect_cycles`](ObjectManager::collect_cycles).
    pub cut_short: usize,
    /// Objects whose handles were released (members of garbage groups).
    pub released: usize,
    /// What the step's collections destroyed: dead objects first, then the
    /// released groups and what only they held.
    pub collected: CollectStats,
    /// True if the step took the last candidate queued (a pass ended).
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
        CycleCollector { store: 0, scan: None, passes: 0, max_group: max_group.max(1) }
    }

    /// Passes completed: times a step took the last queued candidate.
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// Works for about `budget`: collects dead objects, then takes candidates
    /// until the budget is spent or none is left, releases the garbage
    /// groups found, and collects again.
    ///
    /// It always takes one candidate at least, so steps make progress
    /// even with a zero budget.
    ///
    /// # Panics
    ///
    /// A panic in a `visit_handles`, `release_handles` or `Drop` impl
    /// propagates; the manager stays consistent and the next step carries on.
    /// The candidate whose group was being read when `visit_handles`
    /// panicked leaves the queue (so a `visit_handles` that always panics
    /// does not stop every later step at the same object): it is queued
    /// again when its count next falls, and
    /// [`collect_cycles`](ObjectManager::collect_cycles) reads every object.
    pub fn step(&mut self, mm: &mut ObjectManager, budget: Duration) -> CycleStep {
        let start = Instant::now();
        let mut out = CycleStep { collected: mm.collect_garbage(), ..CycleStep::default() };
        loop {
            let Some(candidate) = self.next_candidate(mm, &mut out.candidates) else {
                self.passes += 1;
                out.pass_finished = true;
                break;
            };
            let (garbage, cut_short) = self.garbage_from(mm, candidate);
            out.cut_short += usize::from(cut_short);
            out.released += garbage.len();
            release(mm, &garbage);
            if start.elapsed() >= budget {
                break;
            }
        }
        if out.released > 0 {
            out.collected.absorb(mm.collect_garbage());
        }
        out
    }

    /// The next candidate root, its flag taken, or `None` once every store's
    /// queue is empty (the cursor then goes back to the first store).
    /// Counts the candidates taken.
    fn next_candidate(&mut self, mm: &mut ObjectManager, taken: &mut usize) -> Option<ObjectKey> {
        let stores = mm.all_stores().count() as u32;
        while self.store < stores {
            let store = mm.registry().store_by_index(self.store).expect("below the store count");
            let key_of = |local: u32, header: &super::slot::SlotHeader| {
                let generation = header.generation(std::sync::atomic::Ordering::Relaxed);
                ObjectKey::new(store.shared().global_index(local), generation)
            };
            if let Some(local) = self.scan {
                let Some(header) = store.header(local) else {
                    self.scan = None;
                    self.store += 1;
                    continue;
                };
                self.scan = Some(local + 1);
                if let SlotState::Live(_) = header.state() {
                    *taken += 1;
                    header.take_purple();
                    return Some(key_of(local, header));
                }
                continue;
            }
            let popped = {
                let mut candidates = store.shared().candidates.lock();
                match candidates.pop() {
                    Some(local) => Ok(local),
                    None => Err(candidates.take_lost()
                        | store.shared().candidates_missed.swap(false, std::sync::atomic::Ordering::Relaxed)),
                }
            };
            match popped {
                Ok(local) => {
                    *taken += 1;
                    let header = store.header(local).expect("candidates are published slots");
                    if header.take_purple() {
                        return Some(key_of(local, header));
                    }
                }
                Err(true) => self.scan = Some(0),
                Err(false) => self.store += 1,
            }
        }
        self.store = 0;
        None
    }

    /// Reads the group `candidate` reaches (at most `max_group` objects) and
    /// returns its members referenced only from within the group's garbage,
    /// and whether the group was cut short at `max_group`.
    fn garbage_from(&mut self, mm: &mut ObjectManager, candidate: ObjectKey) -> (Vec<ObjectKey>, bool) {
        let mut keys = vec![candidate];
        let mut counts = Vec::new();
        let mut index: HashMap<ObjectKey, u32> = HashMap::from([(candidate, 0)]);
        let mut edges: Vec<(u32, u32)> = Vec::new();
        let mut at = 0;
        let mut cut_short = false;
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
                    None => {
                        // Outside the group: it does not matter, unless the
                        // group is full and this is live (then its garbage,
                        // if any, is larger than the group).
                        cut_short = cut_short || (keys.len() >= self.max_group && is_live(mm, target));
                        continue;
                    }
                };
                edges.push((at as u32, to));
            }
            at += 1;
        }
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
        let garbage = keys.iter().zip(alive).filter(|(_, alive)| !alive).map(|(&key, _)| key).collect();
        (garbage, cut_short)
    }
}

impl ObjectManager {
    /// Entries queued for the [`CycleCollector`]: objects whose count fell
    /// and stayed above zero since a collector last looked at them. Entries
    /// of objects that died since are counted too, until
    /// [`collect_garbage`](Self::collect_garbage) compacts the queue (at
    /// twice its last compacted length, at least 1,024 per type).
    ///
    /// Only types whose objects may hold handles queue candidates (see
    /// [`MMObject::may_hold_handles`](crate::MMObject::may_hold_handles)).
    pub fn cycle_candidates(&self) -> usize {
        self.all_stores().map(|store| store.shared().candidates.lock().len()).sum()
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
