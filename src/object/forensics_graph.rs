//! The handle graph and its analysis: what the roots reach, the garbage
//! strongly connected components (reference cycles), shortest retention
//! chains, holders and what each root retains.
//!
//! Nothing here writes text: [`leak_render`](super::leak_render) does. The
//! analysis is tested below on synthetic graphs, built with [`GraphBuilder`].

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use slotmap::SecondaryMap;

use super::forensics::{Holder, ObjectName, ReferenceCycle, RetentionPath, RetentionRoot};
use super::{ObjectKey, ObjectManager};

/// No node, no parent.
pub(crate) const NONE: u32 = u32::MAX;

/// Collects nodes and their out-edges, then builds a [`Graph`].
#[derive(Default)]
pub(crate) struct GraphBuilder {
    keys: Vec<ObjectKey>,
    type_names: Vec<&'static str>,
    ref_counts: Vec<u32>,
    raw_edges: Vec<(ObjectKey, &'static str)>,
    /// `raw_edges[raw_start[v]..raw_start[v + 1]]` are node `v`'s.
    raw_start: Vec<u32>,
}

impl GraphBuilder {
    /// A builder with room for `nodes` nodes (and as many edges).
    pub(crate) fn with_capacity(nodes: usize) -> Self {
        GraphBuilder {
            keys: Vec::with_capacity(nodes),
            type_names: Vec::with_capacity(nodes),
            ref_counts: Vec::with_capacity(nodes),
            raw_edges: Vec::with_capacity(nodes),
            raw_start: Vec::with_capacity(nodes + 1),
        }
    }

    /// Adds a node; `edges` reports each key it holds, with the field holding it.
    pub(crate) fn node(
        &mut self,
        key: ObjectKey,
        type_name: &'static str,
        ref_count: u32,
        edges: impl FnOnce(&mut dyn FnMut(&'static str, ObjectKey)),
    ) {
        if self.raw_start.is_empty() {
            self.raw_start.push(0);
        }
        self.keys.push(key);
        self.type_names.push(type_name);
        self.ref_counts.push(ref_count);
        let raw_edges = &mut self.raw_edges;
        edges(&mut |field, held| raw_edges.push((held, field)));
        self.raw_start.push(self.raw_edges.len() as u32);
    }

    /// The graph in compressed sparse row form. Edges to keys that are not
    /// nodes (dead or foreign objects) are dropped.
    pub(crate) fn finish(self) -> Graph {
        let GraphBuilder { keys, type_names, ref_counts, raw_edges, raw_start } = self;
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
}

/// The live-object handle graph, in compressed sparse row form.
pub(crate) struct Graph {
    pub(crate) keys: Vec<ObjectKey>,
    type_names: Vec<&'static str>,
    pub(crate) ref_counts: Vec<u32>,
    /// Out-edges of node `v`: `out[out_start[v]..out_start[v + 1]]`.
    out_start: Vec<u32>,
    out: Vec<u32>,
    /// The field each edge comes from, parallel to `out`.
    labels: Vec<&'static str>,
    /// Edges into each node, with multiplicity.
    in_degree: Vec<u32>,
    pub(crate) index: SecondaryMap<ObjectKey, u32>,
}

impl Graph {
    /// Reads every live object and its handles. A panicking `visit_handles`
    /// contributes the handles it reported before the panic.
    pub(crate) fn build(mm: &ObjectManager) -> Graph {
        let mut builder = GraphBuilder::with_capacity(mm.len());
        for store in mm.all_stores() {
            let type_name = store.type_name();
            store.visit_live(&mut |key, header, _, value| {
                builder.node(key, type_name, header.ref_count(), |edge| {
                    let visit = || value.visit_handles_named(edge);
                    let _ = catch_unwind(AssertUnwindSafe(visit));
                });
            });
        }
        builder.finish()
    }

    pub(crate) fn len(&self) -> usize {
        self.keys.len()
    }

    pub(crate) fn out_edges(&self, node: usize) -> &[u32] {
        &self.out[self.out_start[node] as usize..self.out_start[node + 1] as usize]
    }

    /// The field of `from` that holds `to` (the first, if several do).
    pub(crate) fn label(&self, from: u32, to: u32) -> &'static str {
        let start = self.out_start[from as usize] as usize;
        self.out_edges(from as usize).iter().position(|&w| w == to).map_or("", |at| self.labels[start + at])
    }

    pub(crate) fn name(&self, node: u32) -> ObjectName {
        ObjectName { type_name: self.type_names[node as usize], key: self.keys[node as usize] }
    }

    /// References from outside the manager (saturating: a `visit_handles`
    /// that over-reports cannot make it negative).
    pub(crate) fn outside(&self, node: usize) -> u32 {
        self.ref_counts[node].saturating_sub(self.in_degree[node])
    }
}

/// The graph, split into what the roots reach and the garbage cycles.
pub(crate) struct Analysis {
    pub(crate) graph: Graph,
    /// Reachable from an object held from outside.
    pub(crate) rooted: Vec<bool>,
    /// The holder one step nearer the root (or cycle); `NONE` at roots and
    /// cycle members, and at nodes no search reached.
    pub(crate) parent: Vec<u32>,
    /// The field of `parent[v]` that holds `v` (the first such edge): read
    /// here rather than searched for, so a node with 100k out-edges costs
    /// nothing per child.
    pub(crate) parent_field: Vec<&'static str>,
    /// For cycle members: the index of their cycle in `cycles`.
    pub(crate) cycle_of: Vec<u32>,
    /// Nodes in the order the searches reached them: each after its parent.
    pub(crate) reached: Vec<u32>,
    /// Garbage strongly connected components that contain a cycle, ordered
    /// as [`ReferenceCycle::members`], sorted by their first key.
    pub(crate) cycles: Vec<(Vec<u32>, usize)>,
}

impl Analysis {
    /// Analyses the live objects of `mm`.
    pub(crate) fn of(mm: &ObjectManager) -> Analysis {
        Analysis::new(Graph::build(mm))
    }

    pub(crate) fn new(graph: Graph) -> Analysis {
        let n = graph.len();
        let mut rooted: Vec<bool> = (0..n).map(|node| graph.outside(node) > 0).collect();
        let mut parent = vec![NONE; n];
        let mut parent_field = vec![""; n];
        let mut queue: VecDeque<u32> = (0..n as u32).filter(|&node| rooted[node as usize]).collect();
        let mut reached: Vec<u32> = queue.iter().copied().collect();
        // Breadth-first from every root at once: shortest chains from any root.
        while let Some(v) = queue.pop_front() {
            let first = graph.out_start[v as usize] as usize;
            for (at, &w) in graph.out_edges(v as usize).iter().enumerate() {
                if !rooted[w as usize] {
                    rooted[w as usize] = true;
                    parent[w as usize] = v;
                    parent_field[w as usize] = graph.labels[first + at];
                    reached.push(w);
                    queue.push_back(w);
                }
            }
        }
        let mut analysis =
            Analysis { graph, rooted, parent, parent_field, cycle_of: vec![NONE; n], reached, cycles: Vec::new() };
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
            let first = self.graph.out_start[v as usize] as usize;
            for (at, &w) in self.graph.out_edges(v as usize).iter().enumerate() {
                if !self.rooted[w as usize] && !seen[w as usize] {
                    seen[w as usize] = true;
                    self.parent[w as usize] = v;
                    self.parent_field[w as usize] = self.graph.labels[first + at];
                    self.reached.push(w);
                    queue.push_back(w);
                }
            }
        }
    }

    pub(crate) fn reference_cycle(&self, id: usize) -> ReferenceCycle {
        let (members, cycle_len) = &self.cycles[id];
        let cycle = &members[..*cycle_len];
        let fields = (0..cycle.len()).map(|i| self.graph.label(cycle[i], cycle[(i + 1) % cycle.len()])).collect();
        ReferenceCycle { members: members.iter().map(|&v| self.graph.name(v)).collect(), cycle_len: *cycle_len, fields }
    }

    pub(crate) fn reference_cycles(&self) -> Vec<ReferenceCycle> {
        (0..self.cycles.len()).map(|id| self.reference_cycle(id)).collect()
    }

    /// What keeps the chain that starts at `first` alive.
    fn root_of_chain(&self, first: usize, cycles: &[Arc<ReferenceCycle>]) -> RetentionRoot {
        if self.rooted[first] {
            RetentionRoot::Outside { outside: self.graph.outside(first), total: self.graph.ref_counts[first] }
        } else if self.cycle_of[first] != NONE {
            RetentionRoot::Cycle(Arc::clone(&cycles[self.cycle_of[first] as usize]))
        } else {
            RetentionRoot::Unaccounted
        }
    }

    /// The whole shortest chain to `node`.
    pub(crate) fn path(&self, node: u32, cycles: &[Arc<ReferenceCycle>]) -> RetentionPath {
        let mut nodes = vec![node];
        let mut at = node;
        while self.parent[at as usize] != NONE {
            at = self.parent[at as usize];
            nodes.push(at);
        }
        nodes.reverse();
        let chain = nodes.iter().map(|&v| self.graph.name(v)).collect();
        let fields = nodes[1..].iter().map(|&v| self.parent_field[v as usize]).collect();
        RetentionPath { chain, fields, hidden: 0, root: self.root_of_chain(at as usize, cycles) }
    }

    /// Each cycle as shared data, for the roots of retention paths.
    pub(crate) fn shared_cycles(&self) -> Vec<Arc<ReferenceCycle>> {
        (0..self.cycles.len()).map(|id| Arc::new(self.reference_cycle(id))).collect()
    }

    /// Depths and chain prefixes of every reached node, for [`short_path`](Self::short_path).
    pub(crate) fn chains(&self) -> Chains {
        let n = self.graph.len();
        let mut depth = vec![NONE; n];
        let mut prefix = vec![[NONE; HEAD + 1]; n];
        let mut origin = vec![NONE; n];
        for &v in &self.reached {
            let v = v as usize;
            let parent = self.parent[v];
            if parent == NONE {
                depth[v] = 0;
                prefix[v][0] = v as u32;
                origin[v] = v as u32;
            } else {
                let p = parent as usize;
                depth[v] = depth[p] + 1;
                prefix[v] = prefix[p];
                origin[v] = origin[p];
                if (depth[v] as usize) <= HEAD {
                    prefix[v][depth[v] as usize] = v as u32;
                }
            }
        }
        Chains { depth, prefix, origin }
    }

    /// The shortest chain to `node`, keeping only the first [`HEAD`] and last
    /// [`TAIL`] links of a chain longer than [`KEPT`] links (`hidden` counts
    /// the rest): O(1) links per object, so a report stays linear.
    pub(crate) fn short_path(&self, node: u32, chains: &Chains, cycles: &[Arc<ReferenceCycle>]) -> RetentionPath {
        let v = node as usize;
        let len = if chains.depth[v] == NONE { 1 } else { chains.depth[v] as usize + 1 };
        let keep_tail = if len <= KEPT { len } else { TAIL };
        let mut tail = vec![node];
        while tail.len() < keep_tail {
            tail.push(self.parent[*tail.last().expect("not empty") as usize]);
        }
        tail.reverse();
        let (nodes, next_of_head, hidden) = if len <= KEPT {
            (tail, None, 0)
        } else {
            let head = &chains.prefix[v][..HEAD];
            (head.iter().copied().chain(tail).collect::<Vec<u32>>(), Some(chains.prefix[v][HEAD]), len - HEAD - TAIL)
        };
        let fields = (0..nodes.len() - 1)
            .map(|i| {
                let to = match next_of_head {
                    Some(next) if i == HEAD - 1 => next,
                    _ => nodes[i + 1],
                };
                self.parent_field[to as usize]
            })
            .collect();
        let first = nodes[0] as usize;
        let chain = nodes.iter().map(|&n| self.graph.name(n)).collect();
        RetentionPath { chain, fields, hidden, root: self.root_of_chain(first, cycles) }
    }

    /// Every node's in-edges: who holds it, through which field.
    pub(crate) fn reverse(&self) -> Reverse {
        let n = self.graph.len();
        let mut start = vec![0u32; n + 1];
        for &w in &self.graph.out {
            start[w as usize + 1] += 1;
        }
        for i in 0..n {
            start[i + 1] += start[i];
        }
        let mut fill = start.clone();
        let mut from = vec![0u32; self.graph.out.len()];
        let mut field = vec![""; self.graph.out.len()];
        for v in 0..n {
            let first = self.graph.out_start[v] as usize;
            for (at, &w) in self.graph.out_edges(v).iter().enumerate() {
                let slot = &mut fill[w as usize];
                from[*slot as usize] = v as u32;
                field[*slot as usize] = self.graph.labels[first + at];
                *slot += 1;
            }
        }
        Reverse { start, from, field }
    }

    /// The objects holding `node`, one entry per handle, in key order.
    pub(crate) fn holders(&self, node: u32, reverse: &Reverse) -> Vec<Holder> {
        let range = reverse.start[node as usize] as usize..reverse.start[node as usize + 1] as usize;
        let mut holders: Vec<Holder> =
            range.map(|at| Holder { object: self.graph.name(reverse.from[at]), field: reverse.field[at] }).collect();
        holders.sort_by_key(|h| h.object.key);
        holders
    }
}

/// Links kept at the start of a shortened chain.
pub(crate) const HEAD: usize = 4;
/// Links kept at the end of a shortened chain.
pub(crate) const TAIL: usize = 3;
/// Chains of up to this many links are kept whole.
pub(crate) const KEPT: usize = HEAD + TAIL + 1;

/// Per reached node: its depth, the first links of its chain, and where the chain starts.
pub(crate) struct Chains {
    /// Links above the node (`NONE` if no search reached it).
    depth: Vec<u32>,
    /// The first `HEAD + 1` nodes of its chain.
    prefix: Vec<[u32; HEAD + 1]>,
    /// The first node of its chain: a root held from outside, or a cycle member.
    pub(crate) origin: Vec<u32>,
}

/// In-edges in compressed sparse row form.
pub(crate) struct Reverse {
    start: Vec<u32>,
    from: Vec<u32>,
    field: Vec<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(index: u32) -> ObjectKey {
        ObjectKey::new(index, 1)
    }

    /// A graph of `counts.len()` nodes named `N#i`, with `edges` as (from, to, field).
    fn graph(counts: &[u32], edges: &[(u32, u32, &'static str)]) -> Analysis {
        let mut builder = GraphBuilder::default();
        for (node, &count) in counts.iter().enumerate() {
            builder.node(key(node as u32), "N", count, |edge| {
                for &(_, to, field) in edges.iter().filter(|e| e.0 == node as u32) {
                    edge(field, key(to));
                }
            });
        }
        Analysis::new(builder.finish())
    }

    #[test]
    fn roots_are_nodes_with_outside_references() {
        // 0 -> 1 -> 2, and 0 held once from outside.
        let a = graph(&[1, 1, 1], &[(0, 1, "a"), (1, 2, "b")]);
        assert_eq!(a.rooted, [true, true, true]);
        assert_eq!(a.parent, [NONE, 0, 1]);
        assert!(a.cycles.is_empty());
        let path = a.path(2, &[]);
        assert_eq!(path.fields, ["a", "b"]);
        assert_eq!(path.root, RetentionRoot::Outside { outside: 1, total: 1 });
        // An edge to a key that is not a node is dropped; over-reporting saturates.
        let b = graph(&[0], &[(0, 7, "ghost"), (0, 0, "me"), (0, 0, "me")]);
        assert_eq!(b.graph.outside(0), 0);
        assert_eq!(b.cycles.len(), 1);
    }

    #[test]
    fn garbage_cycles_and_what_hangs_off_them() {
        // 0 <-> 1 is a garbage cycle; 2 hangs off 1; 3 is rooted and holds 2 too.
        let a = graph(&[1, 1, 2, 1], &[(0, 1, "next"), (1, 0, "back"), (1, 2, "child"), (3, 2, "also")]);
        assert_eq!(a.rooted, [false, false, true, true]);
        assert_eq!(a.cycles, [(vec![0, 1], 2)]);
        let cycle = a.reference_cycle(0);
        assert_eq!(cycle.fields, ["next", "back"]);
        let chains = a.chains();
        assert_eq!(chains.origin, [0, 1, 3, 3]);
        let reverse = a.reverse();
        let holders = a.holders(2, &reverse);
        assert_eq!(
            holders.iter().map(|h| (h.object.key, h.field)).collect::<Vec<_>>(),
            [(key(1), "child"), (key(3), "also")]
        );
        assert!(a.holders(3, &reverse).is_empty());
    }

    #[test]
    fn long_chains_keep_their_ends_and_count_the_rest() {
        let n = 20u32;
        let counts: Vec<u32> = (0..n).map(|i| u32::from(i == 0) + u32::from(i > 0)).collect();
        let edges: Vec<(u32, u32, &'static str)> = (0..n - 1).map(|i| (i, i + 1, "next")).collect();
        let a = graph(&counts, &edges);
        let chains = a.chains();
        let short = a.short_path(n - 1, &chains, &[]);
        let full = a.path(n - 1, &[]);
        assert_eq!(full.chain.len(), 20);
        assert_eq!(short.chain.len(), HEAD + TAIL);
        assert_eq!(short.hidden, 20 - HEAD - TAIL);
        assert_eq!(short.len(), 20);
        assert_eq!(short.chain[..HEAD], full.chain[..HEAD]);
        assert_eq!(short.chain[HEAD..], full.chain[20 - TAIL..]);
        assert_eq!(short.fields.len(), HEAD + TAIL - 1);
        // A chain of up to KEPT links is kept whole.
        let whole = a.short_path(KEPT as u32 - 1, &chains, &[]);
        assert_eq!((whole.chain.len(), whole.hidden), (KEPT, 0));
        assert_eq!(whole, a.path(KEPT as u32 - 1, &[]));
    }
}
