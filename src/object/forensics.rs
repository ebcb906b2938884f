//! Leak forensics over the handle graph: who holds an object
//! ([`ObjectManager::holders`]), the shortest chain of handles that keeps it
//! alive ([`ObjectManager::retention_path`]), and reference cycles
//! ([`ObjectManager::find_cycles`], [`ObjectManager::collect_cycles`]).
//!
//! How the graph is read, what it costs and how far it trusts user code:
//! [`implementation`](crate::implementation#leak-forensics).

use std::collections::VecDeque;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use slotmap::SecondaryMap;

use super::leak::LeakReport;
use super::{CollectStats, ObjectKey, ObjectManager};

/// No node, no parent.
const NONE: u32 = u32::MAX;
/// Links shown before a long chain or cycle is shortened in `Display`.
const MAX_SHOWN: usize = 8;

/// An object named by its type and key, as in reports: `Texture#3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ObjectName {
    /// The object's type.
    pub type_name: &'static str,
    /// The object's key.
    pub key: ObjectKey,
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.type_name, self.key)
    }
}

/// One link of a chain: an object and the name of its field that holds the
/// next link (empty when unknown, and for the last link).
type Link = (ObjectName, &'static str);

/// Writes `a.field -> b.field -> c`, shortened in the middle past
/// [`MAX_SHOWN`] links.
fn write_chain(f: &mut fmt::Formatter<'_>, links: &[Link]) -> fmt::Result {
    if links.len() <= MAX_SHOWN {
        return write_links(f, links, 0, &[]);
    }
    let (head, tail) = (MAX_SHOWN / 2, MAX_SHOWN / 2 - 1);
    write_links(f, &links[..head], links.len() - head - tail, &links[links.len() - tail..])
}

/// Writes `head`, then `… (hidden more) …` if `hidden > 0`, then `tail`.
fn write_links(f: &mut fmt::Formatter<'_>, head: &[Link], hidden: usize, tail: &[Link]) -> fmt::Result {
    for (i, (link, field)) in head.iter().chain(tail).enumerate() {
        if i > 0 {
            f.write_str(" -> ")?;
        }
        if i == head.len() && hidden > 0 {
            write!(f, "… ({hidden} more) … -> ")?;
        }
        write!(f, "{link}")?;
        if !field.is_empty() {
            write!(f, ".{field}")?;
        }
    }
    Ok(())
}

/// What [`write_path`] says about the start of a chain.
enum RootText<'a> {
    Outside { outside: u32, total: u32 },
    Cycle(&'a dyn fmt::Display),
    Unaccounted,
}

/// Writes a retention path, shared by [`RetentionPath`]'s `Display` and the
/// shutdown report (which builds only the links it shows).
fn write_path(
    f: &mut fmt::Formatter<'_>,
    head: &[Link],
    hidden: usize,
    tail: &[Link],
    root: RootText<'_>,
) -> fmt::Result {
    let Some((first, _)) = head.first() else { return Ok(()) };
    if head.len() + tail.len() == 1 && hidden == 0 {
        // The object itself: say what holds it, without repeating its name.
        return match root {
            RootText::Outside { outside, total } => {
                write!(f, "references from outside the manager ({outside} of its {total})")
            }
            RootText::Cycle(cycle) => write!(f, "a reference cycle: {cycle}"),
            RootText::Unaccounted => write!(f, "nothing found (counts changed during the analysis)"),
        };
    }
    write_links(f, head, hidden, tail)?;
    match root {
        RootText::Outside { outside, total } => {
            write!(f, " ({first} is held from outside: {outside} of its {total} references)")
        }
        RootText::Cycle(cycle) => write!(f, " ({first} is in a reference cycle: {cycle})"),
        RootText::Unaccounted => write!(f, " (no holder of {first} found: counts changed during the analysis)"),
    }
}

/// Formats through a closure.
struct WithFmt<F>(F);

impl<F: Fn(&mut fmt::Formatter<'_>) -> fmt::Result> fmt::Display for WithFmt<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (self.0)(f)
    }
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

impl fmt::Display for ReferenceCycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cycle = self.cycle();
        let closed: Vec<(ObjectName, &'static str)> =
            cycle.iter().copied().zip(self.fields.iter().copied()).chain(cycle.first().map(|&m| (m, ""))).collect();
        write_chain(f, &closed)?;
        let rest = self.members.len() - self.cycle_len;
        if rest > 0 {
            write!(f, " (and {rest} more object(s) in the same group)")?;
        }
        Ok(())
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
    /// outside the manager keeps the chain alive.
    Cycle(ReferenceCycle),
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
}

impl fmt::Display for RetentionPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let links: Vec<Link> = self.chain.iter().copied().zip(self.fields.iter().copied().chain([""])).collect();
        let root = match &self.root {
            RetentionRoot::Outside { outside, total } => RootText::Outside { outside: *outside, total: *total },
            RetentionRoot::Cycle(cycle) => RootText::Cycle(cycle),
            RetentionRoot::Unaccounted => RootText::Unaccounted,
        };
        if links.len() <= MAX_SHOWN {
            return write_path(f, &links, 0, &[], root);
        }
        let (head, tail) = (MAX_SHOWN / 2, MAX_SHOWN / 2 - 1);
        write_path(f, &links[..head], links.len() - head - tail, &links[links.len() - tail..], root)
    }
}

/// The live-object handle graph, in compressed sparse row form.
struct Graph {
    keys: Vec<ObjectKey>,
    type_names: Vec<&'static str>,
    ref_counts: Vec<u32>,
    /// Out-edges of node `v`: `out[out_start[v]..out_start[v + 1]]`.
    out_start: Vec<u32>,
    out: Vec<u32>,
    /// The field each edge comes from, parallel to `out`.
    labels: Vec<&'static str>,
    /// Edges into each node, with multiplicity.
    in_degree: Vec<u32>,
    index: SecondaryMap<ObjectKey, u32>,
}

impl Graph {
    /// Reads every live object and its handles. A panicking `visit_handles`
    /// contributes the handles it reported before the panic.
    fn build(mm: &ObjectManager) -> Graph {
        let mut keys = Vec::new();
        let mut type_names = Vec::new();
        let mut ref_counts = Vec::new();
        let mut raw_edges: Vec<(ObjectKey, &'static str)> = Vec::new();
        let mut raw_start = vec![0u32];
        for store in mm.all_stores() {
            let type_name = store.type_name();
            store.visit_live(&mut |key, header, value| {
                keys.push(key);
                type_names.push(type_name);
                ref_counts.push(header.ref_count());
                let visit = || value.visit_handles_named(&mut |field, held| raw_edges.push((held, field)));
                let _ = catch_unwind(AssertUnwindSafe(visit));
                raw_start.push(raw_edges.len() as u32);
            });
        }
        let mut index = SecondaryMap::with_capacity(keys.len());
        for (node, &key) in keys.iter().enumerate() {
            index.insert(key, node as u32);
        }
        let mut out_start = Vec::with_capacity(keys.len() + 1);
        let mut out = Vec::with_capacity(raw_edges.len());
        let mut labels = Vec::with_capacity(raw_edges.len());
        let mut in_degree = vec![0u32; keys.len()];
        out_start.push(0);
        for node in 0..keys.len() {
            for &(held, field) in &raw_edges[raw_start[node] as usize..raw_start[node + 1] as usize] {
                if let Some(&target) = index.get(held) {
                    out.push(target);
                    labels.push(field);
                    in_degree[target as usize] += 1;
                }
            }
            out_start.push(out.len() as u32);
        }
        Graph { keys, type_names, ref_counts, out_start, out, labels, in_degree, index }
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    fn out_edges(&self, node: usize) -> &[u32] {
        &self.out[self.out_start[node] as usize..self.out_start[node + 1] as usize]
    }

    /// The field of `from` that holds `to` (the first, if several do).
    fn label(&self, from: u32, to: u32) -> &'static str {
        let start = self.out_start[from as usize] as usize;
        self.out_edges(from as usize).iter().position(|&w| w == to).map_or("", |at| self.labels[start + at])
    }

    fn name(&self, node: u32) -> ObjectName {
        ObjectName { type_name: self.type_names[node as usize], key: self.keys[node as usize] }
    }

    /// References from outside the manager (saturating: a `visit_handles`
    /// that over-reports cannot make it negative).
    fn outside(&self, node: usize) -> u32 {
        self.ref_counts[node].saturating_sub(self.in_degree[node])
    }
}

/// The graph, split into what the roots reach and the garbage cycles.
struct Analysis {
    graph: Graph,
    /// Reachable from an object held from outside.
    rooted: Vec<bool>,
    /// The holder one step nearer the root (or cycle); `NONE` at roots and
    /// cycle members, and at nodes no search reached.
    parent: Vec<u32>,
    /// For cycle members: the index of their cycle in `cycles`.
    cycle_of: Vec<u32>,
    /// Nodes in the order the searches reached them: each after its parent.
    reached: Vec<u32>,
    /// Garbage strongly connected components that contain a cycle, ordered
    /// as [`ReferenceCycle::members`], sorted by their first key.
    cycles: Vec<(Vec<u32>, usize)>,
}

impl Analysis {
    fn new(mm: &ObjectManager) -> Analysis {
        let graph = Graph::build(mm);
        let n = graph.len();
        let mut rooted: Vec<bool> = (0..n).map(|node| graph.outside(node) > 0).collect();
        let mut parent = vec![NONE; n];
        let mut queue: VecDeque<u32> = (0..n as u32).filter(|&node| rooted[node as usize]).collect();
        let mut reached: Vec<u32> = queue.iter().copied().collect();
        // Breadth-first from every root at once: shortest chains from any root.
        while let Some(v) = queue.pop_front() {
            for &w in graph.out_edges(v as usize) {
                if !rooted[w as usize] {
                    rooted[w as usize] = true;
                    parent[w as usize] = v;
                    reached.push(w);
                    queue.push_back(w);
                }
            }
        }
        let mut analysis = Analysis { graph, rooted, parent, cycle_of: vec![NONE; n], reached, cycles: Vec::new() };
        analysis.find_garbage_cycles();
        analysis.link_garbage_to_cycles();
        analysis
    }

    /// Tarjan's strongly connected components over the unrooted nodes
    /// (iterative, so long chains cannot overflow the stack).
    fn find_garbage_cycles(&mut self) {
        let graph = &self.graph;
        let n = graph.len();
        let mut order = vec![NONE; n];
        let mut low = vec![0u32; n];
        let mut on_stack = vec![false; n];
        let mut stack: Vec<u32> = Vec::new();
        let mut calls: Vec<(u32, u32)> = Vec::new();
        let mut next = 0u32;
        let mut components: Vec<Vec<u32>> = Vec::new();
        for start in 0..n {
            if self.rooted[start] || order[start] != NONE {
                continue;
            }
            order[start] = next;
            low[start] = next;
            next += 1;
            stack.push(start as u32);
            on_stack[start] = true;
            calls.push((start as u32, graph.out_start[start]));
            while let Some(top) = calls.len().checked_sub(1) {
                let (v, at) = calls[top];
                let v = v as usize;
                if at < graph.out_start[v + 1] {
                    calls[top].1 += 1;
                    let w = graph.out[at as usize] as usize;
                    if self.rooted[w] {
                        continue;
                    }
                    if order[w] == NONE {
                        order[w] = next;
                        low[w] = next;
                        next += 1;
                        stack.push(w as u32);
                        on_stack[w] = true;
                        calls.push((w as u32, graph.out_start[w]));
                    } else if on_stack[w] {
                        low[v] = low[v].min(order[w]);
                    }
                } else {
                    calls.pop();
                    if let Some(&(u, _)) = calls.last() {
                        low[u as usize] = low[u as usize].min(low[v]);
                    }
                    if low[v] == order[v] {
                        let mut component = Vec::new();
                        loop {
                            let w = stack.pop().expect("v is on the stack");
                            on_stack[w as usize] = false;
                            component.push(w);
                            if w as usize == v {
                                break;
                            }
                        }
                        let cyclic = component.len() > 1 || graph.out_edges(v).contains(&(v as u32));
                        if cyclic {
                            components.push(component);
                        }
                    }
                }
            }
        }
        for (id, component) in components.iter().enumerate() {
            for &v in component {
                self.cycle_of[v as usize] = id as u32;
            }
        }
        let mut ordered: Vec<(Vec<u32>, usize)> =
            components.iter().enumerate().map(|(id, component)| self.order_component(id as u32, component)).collect();
        ordered.sort_by_key(|(members, _)| self.graph.keys[members[0] as usize]);
        for (id, (members, _)) in ordered.iter().enumerate() {
            for &v in members {
                self.cycle_of[v as usize] = id as u32;
            }
        }
        self.cycles = ordered;
    }

    /// A shortest cycle through the component's smallest key (breadth-first
    /// inside the component), then the other members in key order.
    fn order_component(&self, id: u32, component: &[u32]) -> (Vec<u32>, usize) {
        let graph = &self.graph;
        let start = *component.iter().min_by_key(|&&v| graph.keys[v as usize]).expect("components are not empty");
        let mut came_from: std::collections::HashMap<u32, u32> = std::collections::HashMap::new();
        let mut queue = VecDeque::from([start]);
        let mut last = NONE;
        'search: while let Some(v) = queue.pop_front() {
            for &w in graph.out_edges(v as usize) {
                if w == start {
                    last = v;
                    break 'search;
                }
                if self.cycle_of[w as usize] == id && !came_from.contains_key(&w) {
                    came_from.insert(w, v);
                    queue.push_back(w);
                }
            }
        }
        let mut cycle = Vec::new();
        let mut at = last;
        while at != start && at != NONE {
            cycle.push(at);
            at = came_from[&at];
        }
        cycle.push(start);
        cycle.reverse();
        let cycle_len = cycle.len();
        let on_cycle: std::collections::HashSet<u32> = cycle.iter().copied().collect();
        let mut rest: Vec<u32> = component.iter().copied().filter(|v| !on_cycle.contains(v)).collect();
        rest.sort_by_key(|&v| graph.keys[v as usize]);
        cycle.extend(rest);
        (cycle, cycle_len)
    }

    /// Breadth-first from every cycle member over the other garbage, so each
    /// garbage object gets a shortest chain from some cycle.
    fn link_garbage_to_cycles(&mut self) {
        let mut seen: Vec<bool> = self.cycle_of.iter().map(|&c| c != NONE).collect();
        let mut queue: VecDeque<u32> = self.cycles.iter().flat_map(|(members, _)| members.iter().copied()).collect();
        self.reached.extend(queue.iter().copied());
        while let Some(v) = queue.pop_front() {
            for &w in self.graph.out_edges(v as usize) {
                if !self.rooted[w as usize] && !seen[w as usize] {
                    seen[w as usize] = true;
                    self.parent[w as usize] = v;
                    self.reached.push(w);
                    queue.push_back(w);
                }
            }
        }
    }

    fn reference_cycle(&self, id: usize) -> ReferenceCycle {
        let (members, cycle_len) = &self.cycles[id];
        let cycle = &members[..*cycle_len];
        let fields = (0..cycle.len()).map(|i| self.graph.label(cycle[i], cycle[(i + 1) % cycle.len()])).collect();
        ReferenceCycle { members: members.iter().map(|&v| self.graph.name(v)).collect(), cycle_len: *cycle_len, fields }
    }

    fn reference_cycles(&self) -> Vec<ReferenceCycle> {
        (0..self.cycles.len()).map(|id| self.reference_cycle(id)).collect()
    }

    /// Sets each entry's `retention` text. It builds only the links the text
    /// shows (the first and last few), so a report on many objects deep in one
    /// long chain stays linear: O(live + edges) for the whole report.
    fn annotate(&self, entries: &mut [super::LeakEntry], cycles: &[ReferenceCycle]) {
        const HEAD: usize = MAX_SHOWN / 2;
        const TAIL: usize = MAX_SHOWN / 2 - 1;
        let n = self.graph.len();
        // depth[v]: links above v; prefix[v]: the first HEAD + 1 nodes of v's chain.
        let mut depth = vec![0u32; n];
        let mut prefix = vec![[NONE; HEAD + 1]; n];
        let mut done = vec![false; n];
        for &v in &self.reached {
            let v = v as usize;
            let parent = self.parent[v];
            if parent == NONE {
                prefix[v][0] = v as u32;
            } else {
                depth[v] = depth[parent as usize] + 1;
                prefix[v] = prefix[parent as usize];
                if (depth[v] as usize) <= HEAD {
                    prefix[v][depth[v] as usize] = v as u32;
                }
            }
            done[v] = true;
        }
        let link =
            |from: u32, to: u32| (self.graph.name(from), if to == NONE { "" } else { self.graph.label(from, to) });
        for entry in entries {
            let Some(&node) = self.graph.index.get(entry.key) else { continue };
            let v = node as usize;
            let len = if done[v] { depth[v] as usize + 1 } else { 1 };
            // The last links: walk up from the node.
            let mut tail_nodes = vec![node];
            while tail_nodes.len() < len.min(if len <= MAX_SHOWN { MAX_SHOWN } else { TAIL }) {
                tail_nodes.push(self.parent[*tail_nodes.last().expect("not empty") as usize]);
            }
            tail_nodes.reverse();
            let (head, hidden, tail): (Vec<Link>, usize, Vec<Link>) = if len <= MAX_SHOWN {
                let next = tail_nodes.iter().skip(1).copied().chain([NONE]);
                (tail_nodes.iter().zip(next).map(|(&a, b)| link(a, b)).collect(), 0, Vec::new())
            } else {
                let p = &prefix[v];
                let head = (0..HEAD).map(|i| link(p[i], p[i + 1])).collect();
                let next = tail_nodes.iter().skip(1).copied().chain([NONE]);
                (head, len - HEAD - TAIL, tail_nodes.iter().zip(next).map(|(&a, b)| link(a, b)).collect())
            };
            let first = if len <= MAX_SHOWN { tail_nodes[0] } else { prefix[v][0] } as usize;
            let root = if self.rooted[first] {
                RootText::Outside { outside: self.graph.outside(first), total: self.graph.ref_counts[first] }
            } else if self.cycle_of[first] != NONE {
                RootText::Cycle(&cycles[self.cycle_of[first] as usize])
            } else {
                RootText::Unaccounted
            };
            let text = WithFmt(|f: &mut fmt::Formatter<'_>| {
                let root = match &root {
                    RootText::Outside { outside, total } => RootText::Outside { outside: *outside, total: *total },
                    RootText::Cycle(cycle) => RootText::Cycle(*cycle),
                    RootText::Unaccounted => RootText::Unaccounted,
                };
                write_path(f, &head, hidden, &tail, root)
            });
            entry.retention = Some(text.to_string());
        }
    }

    fn path(&self, node: u32) -> RetentionPath {
        let mut nodes = vec![node];
        let mut at = node;
        while self.parent[at as usize] != NONE {
            at = self.parent[at as usize];
            nodes.push(at);
        }
        nodes.reverse();
        let chain = nodes.iter().map(|&v| self.graph.name(v)).collect();
        let fields = nodes.windows(2).map(|pair| self.graph.label(pair[0], pair[1])).collect();
        let root = at as usize;
        let root = if self.rooted[root] {
            RetentionRoot::Outside { outside: self.graph.outside(root), total: self.graph.ref_counts[root] }
        } else if self.cycle_of[root] != NONE {
            RetentionRoot::Cycle(self.reference_cycle(self.cycle_of[root] as usize))
        } else {
            RetentionRoot::Unaccounted
        };
        RetentionPath { chain, fields, root }
    }
}

/// Fills in the retention paths and cycles of a shutdown report, before any
/// value is destroyed. Builds the graph once.
pub(crate) fn annotate_leaks(mm: &ObjectManager, report: &mut LeakReport) {
    let analysis = Analysis::new(mm);
    report.cycles = analysis.reference_cycles();
    analysis.annotate(&mut report.entries, &report.cycles);
}

/// Sets `retention` on each entry that names a live object. Builds the graph once.
pub(crate) fn annotate(mm: &ObjectManager, entries: &mut [super::LeakEntry]) {
    let analysis = Analysis::new(mm);
    let cycles = analysis.reference_cycles();
    analysis.annotate(entries, &cycles);
}

/// Cycles among the given keys only, for reports about a subset of objects.
pub(crate) fn cycles_among(mm: &ObjectManager, keys: &[ObjectKey]) -> Vec<ReferenceCycle> {
    Analysis::new(mm)
        .reference_cycles()
        .into_iter()
        .filter(|cycle| cycle.members.iter().any(|m| keys.binary_search(&m.key).is_ok()))
        .collect()
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
            store.visit_live(&mut |holder, _, value| {
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
    /// `None` if `key` names no live object.
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
        let analysis = Analysis::new(self);
        let node = *analysis.graph.index.get(key)?;
        Some(analysis.path(node))
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
        Analysis::new(self).reference_cycles()
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
            let analysis = Analysis::new(self);
            analysis
                .cycles
                .iter()
                .flat_map(|(members, _)| members.iter().map(|&v| analysis.graph.keys[v as usize]))
                .collect()
        };
        for key in members {
            let Some((store_index, local)) = self.locate_key(key) else { continue };
            let object = self.store_by_index_mut(store_index).and_then(|s| s.live_object_mut(local, key.generation()));
            if let Some(object) = object {
                object.release_handles();
            }
        }
        let more = self.collect_garbage();
        stats.objects += more.objects;
        stats.bytes += more.bytes;
        stats.rounds += more.rounds;
        stats
    }
}
