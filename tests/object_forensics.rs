//! Leak forensics as a user meets them: holders, retention paths, reference
//! cycles and their collection, snapshots, collection under a time budget,
//! and the shutdown report that ties them together.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use mmobject::{CycleCollector, Handle, MMObject, ObjectKey, ObjectLeakReport, ObjectManager, RetentionRoot};
use proptest::prelude::*;

mod support;
use support::{quiet, DropToken, Drops};

/// A graph node: edges through a `Vec`, one optional extra link.
#[derive(MMObject)]
struct Node {
    edges: Vec<Handle<Node>>,
    link: Option<Handle<Node>>,
    drops: DropToken,
}

fn node(mm: &ObjectManager, drops: &Drops) -> Handle<Node> {
    mm.create(Node { edges: Vec::new(), link: None, drops: drops.token() })
}

/// Two nodes linked to each other, and the handles to them.
fn pair(mm: &mut ObjectManager, drops: &Drops) -> (Handle<Node>, Handle<Node>) {
    let (a, b) = (node(mm, drops), node(mm, drops));
    mm[&a].link = Some(b.clone());
    mm[&b].link = Some(a.clone());
    (a, b)
}

/// A ring of `n` nodes through `link`; returns the keys in ring order.
fn ring(mm: &mut ObjectManager, drops: &Drops, n: usize) -> Vec<ObjectKey> {
    let nodes: Vec<_> = (0..n).map(|_| node(mm, drops)).collect();
    for i in 0..n {
        let next = nodes[(i + 1) % n].clone();
        mm[&nodes[i]].link = Some(next);
    }
    nodes.iter().map(Handle::key).collect()
}

// ---- cycles ---------------------------------------------------------------------

#[test]
fn self_reference_is_a_cycle_of_one() {
    let mut mm = quiet();
    let drops = Drops::default();
    let a = node(&mm, &drops);
    mm[&a].link = Some(a.clone());
    let key = a.key();
    assert!(mm.find_cycles().is_empty(), "held from outside");
    drop(a);
    assert_eq!(mm.collect_garbage().objects, 0, "refcounting alone cannot free it");
    assert_eq!(mm.find_cycles(), vec![vec![key]]);
    assert_eq!(mm.reference_cycles()[0].to_string(), format!("Node{key}.link -> Node{key}"));
    let path = mm.retention_path(key).unwrap();
    assert!(matches!(path.root, RetentionRoot::Cycle(_)));
    assert_eq!(mm.collect_cycles().objects, 1);
    assert_eq!(drops.count(), 1);
    assert!(mm.is_empty());
}

#[test]
fn cycle_of_two() {
    let mut mm = quiet();
    let drops = Drops::default();
    let keys = ring(&mut mm, &drops, 2);
    assert_eq!(mm.find_cycles(), vec![keys.clone()]);
    let cycle = &mm.reference_cycles()[0];
    assert_eq!(cycle.cycle_len, 2);
    assert_eq!(cycle.to_string(), format!("Node{}.link -> Node{}.link -> Node{}", keys[0], keys[1], keys[0]));
    assert_eq!(cycle.fields, ["link", "link"]);
    assert_eq!(mm.collect_cycles().objects, 2);
    assert_eq!(drops.count(), 2);
}

#[test]
fn cycle_of_ten_in_handle_order() {
    let mut mm = quiet();
    let drops = Drops::default();
    let keys = ring(&mut mm, &drops, 10);
    let cycles = mm.find_cycles();
    assert_eq!(cycles, vec![keys.clone()], "the group reads as the ring, from its smallest key");
    assert_eq!(mm.holders(keys[3]), vec![keys[2]]);
    let text = mm.reference_cycles()[0].to_string();
    assert!(text.contains("more"), "long cycles are shortened: {text}");
    assert_eq!(mm.collect_cycles().objects, 10);
    assert_eq!(drops.count(), 10);
}

#[test]
fn cycle_held_from_outside_is_not_collected() {
    let mut mm = quiet();
    let drops = Drops::default();
    let (a, b) = pair(&mut mm, &drops);
    drop(b);
    assert!(mm.find_cycles().is_empty());
    assert_eq!(mm.collect_cycles().objects, 0);
    assert_eq!(drops.count(), 0);
    assert!(mm[&a].link.is_some(), "a live object's handles are left alone");
    let path = mm.retention_path(mm[&a].link.as_ref().unwrap().key()).unwrap();
    assert_eq!(path.keys(), vec![a.key(), path.chain[1].key]);
    assert!(path.is_held_from_outside());
    drop(a);
    assert_eq!(mm.collect_cycles().objects, 2);
    assert_eq!(drops.count(), 2);
}

#[test]
fn objects_hanging_off_a_cycle_go_with_it() {
    let mut mm = quiet();
    let drops = Drops::default();
    let keys = ring(&mut mm, &drops, 3);
    // Give the first ring member two children through its Vec.
    let (_, first) = mm.iter::<Node>().next().unwrap();
    assert!(first.edges.is_empty());
    let children: Vec<_> = (0..2).map(|_| node(&mm, &drops)).collect();
    let child_keys: Vec<_> = children.iter().map(Handle::key).collect();
    let weak = mm.iter::<Node>().map(|(w, _)| w).find(|w| w.key() == keys[0]).unwrap();
    mm.get_weak_mut(weak).unwrap().edges.extend(children);
    assert_eq!(mm.find_cycles(), vec![keys.clone()], "children are not cycle members");
    let path = mm.retention_path(child_keys[1]).unwrap();
    assert_eq!(path.keys(), vec![keys[0], child_keys[1]]);
    assert!(path.to_string().contains("is in a reference cycle"), "{path}");
    assert_eq!(mm.collect_cycles().objects, 5);
    assert_eq!(drops.count(), 5);
}

#[test]
fn plain_handle_cycles_stay_alive_but_safe() {
    #[derive(MMObject)]
    struct Pair {
        other: Option<Handle<Pinned>>,
    }
    #[derive(MMObject)]
    struct Pinned {
        back: Handle<Pair>,
    }
    let mut mm = quiet();
    let pair = mm.create(Pair { other: None });
    let pinned = mm.create(Pinned { back: pair.clone() });
    mm[&pair].other = Some(pinned.clone());
    drop((pair, pinned));
    // One removable link is enough to break the cycle.
    assert_eq!(mm.find_cycles().len(), 1);
    assert_eq!(mm.collect_cycles().objects, 2);

    #[derive(MMObject)]
    struct Stuck {
        next: Handle<Stuck2>,
    }
    #[derive(MMObject)]
    struct Stuck2 {
        #[mm(skip)]
        hidden: Option<Handle<Stuck>>,
        next: Option<Handle<Stuck>>,
    }
    let a = mm.create(Stuck2 { hidden: None, next: None });
    let b = mm.create(Stuck { next: a.clone() });
    mm[&a].hidden = Some(b.clone()); // skipped: invisible to forensics
    drop((a, b));
    assert!(mm.find_cycles().is_empty(), "an invisible link makes its target look held from outside");
    assert_eq!(mm.collect_cycles().objects, 0);
    assert_eq!(mm.len(), 2);
}

#[test]
fn a_lying_visit_handles_never_frees_a_used_object() {
    struct Liar {
        real: Option<Handle<Liar>>,
        claimed: Vec<ObjectKey>,
        _drops: DropToken,
    }
    impl MMObject for Liar {
        const TYPE_NAME: &'static str = "Liar";
        const TAG: &'static str = "Liar";
        fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
            self.real.iter().for_each(|h| visitor(h.key()));
            self.claimed.iter().for_each(|&k| visitor(k));
        }
        fn release_handles(&mut self) {
            self.real = None;
        }
    }
    let mut mm = quiet();
    let drops = Drops::default();
    let a = mm.create(Liar { real: None, claimed: Vec::new(), _drops: drops.token() });
    let b = mm.create(Liar { real: Some(a.clone()), claimed: Vec::new(), _drops: drops.token() });
    // `a` claims to hold `b`, so `b`'s only (outside) reference looks internal.
    mm[&a].claimed.push(b.key());
    let a_key = a.key();
    drop(a);
    assert_eq!(mm.find_cycles(), vec![vec![a_key, b.key()]], "fooled");
    mm.collect_cycles();
    // `b` is really held from outside: it stays alive and readable.
    assert_eq!(drops.count(), 1, "only `a`, which nothing held any more, was destroyed");
    assert!(mm[&b].real.is_none(), "its removable handle was released");
    drop(b);
    assert_eq!(mm.collect_garbage().objects, 1);
}

#[test]
fn a_panicking_visit_handles_stops_one_step_and_only_its_candidate() {
    use std::sync::atomic::{AtomicBool, Ordering};
    static PANIC: AtomicBool = AtomicBool::new(false);
    struct Brittle {
        next: Option<Handle<Brittle>>,
        brittle: bool,
        _drops: DropToken,
    }
    impl MMObject for Brittle {
        const TYPE_NAME: &'static str = "Brittle";
        const TAG: &'static str = "Brittle";
        fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
            assert!(!(self.brittle && PANIC.load(Ordering::Relaxed)), "visit_handles failed");
            self.next.iter().for_each(|h| visitor(h.key()));
        }
        fn release_handles(&mut self) {
            self.next = None;
        }
    }
    let mut mm = quiet();
    let drops = Drops::default();
    let mut cycle = |brittle: bool| {
        let a = mm.create(Brittle { next: None, brittle, _drops: drops.token() });
        let b = mm.create(Brittle { next: Some(a.clone()), brittle, _drops: drops.token() });
        mm[&a].next = Some(b.clone());
        drop(a); // `a` becomes a candidate; `b` is one too, once its handle goes
        drop(b);
    };
    cycle(false);
    cycle(true); // queued last: a step takes it first
    PANIC.store(true, Ordering::Relaxed);
    let mut collector = CycleCollector::new();
    let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| collector.step(&mut mm, Duration::ZERO)));
    assert!(step.is_err(), "the panic propagates");
    PANIC.store(false, Ordering::Relaxed);
    // The next steps carry on: the sound cycle is found; of the brittle
    // one, the candidate whose read panicked left the queue, and the other
    // member is still queued, so a pass collects it all the same.
    let mut collected = 0;
    while collected < 4 {
        let step = collector.step(&mut mm, Duration::from_secs(1));
        collected += step.collected.objects;
        if step.pass_finished {
            break;
        }
    }
    assert_eq!(collected, 4, "both cycles, through the candidates left");
    assert_eq!(drops.count(), 4);
    assert!(mm.is_empty());
}

#[test]
fn enum_release_handles() {
    #[derive(MMObject)]
    enum Shape {
        Empty,
        Group { children: Vec<Handle<Shape>>, parent: Option<Handle<Shape>> },
    }
    let mut mm = quiet();
    let parent = mm.create(Shape::Empty);
    let child = mm.create(Shape::Group { children: Vec::new(), parent: None });
    mm[&parent] = Shape::Group { children: vec![child.clone()], parent: None };
    if let Shape::Group { parent: up, .. } = &mut mm[&child] {
        *up = Some(parent.clone());
    }
    drop((parent, child));
    assert_eq!(mm.find_cycles().len(), 1);
    assert_eq!(mm.collect_cycles().objects, 2);
}

// ---- holders and retention paths ---------------------------------------------------

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    pixels: Vec<u8>,
}

#[derive(MMObject)]
struct Material {
    albedo: Handle<Texture>,
    detail: Option<Handle<Texture>>,
}

#[derive(MMObject)]
struct Level {
    name: &'static str,
    materials: Vec<Handle<Material>>,
}

fn load_level(mm: &ObjectManager, name: &'static str, textures: usize) -> Handle<Level> {
    let textures: Vec<_> = (0..textures).map(|i| mm.create(Texture { pixels: vec![i as u8; 64] })).collect();
    let materials = textures
        .iter()
        .enumerate()
        .map(|(i, t)| {
            mm.create(Material { albedo: t.clone(), detail: Some(textures[(i + 1) % textures.len()].clone()) })
        })
        .collect();
    mm.create(Level { name, materials })
}

#[test]
fn diamond_holders_and_paths() {
    let mut mm = quiet();
    let drops = Drops::default();
    let top = node(&mm, &drops);
    let left = node(&mm, &drops);
    let right = node(&mm, &drops);
    let bottom = node(&mm, &drops);
    mm[&left].link = Some(bottom.clone());
    mm[&right].edges.push(bottom.clone());
    mm[&top].edges = vec![left.clone(), right.clone()];
    let keys = [top.key(), left.key(), right.key(), bottom.key()];
    drop((left, right, bottom));
    assert_eq!(mm.holders(keys[3]), vec![keys[1], keys[2]]);
    assert_eq!(mm.holders(keys[0]), Vec::<ObjectKey>::new());
    let path = mm.retention_path(keys[3]).unwrap();
    assert_eq!(path.chain.len(), 3);
    assert_eq!(path.chain[0].key, keys[0]);
    assert_eq!(path.root, RetentionRoot::Outside { outside: 1, total: 1 });
    assert!(mm.find_cycles().is_empty(), "a diamond is not a cycle");
    drop(top);
    assert_eq!(mm.collect_garbage().objects, 4);
    assert_eq!(drops.count(), 4);
    assert!(mm.retention_path(keys[0]).is_none());
}

#[test]
fn retention_path_through_vec_and_option_fields() {
    let mut mm = quiet();
    let level = load_level(&mm, "Forest", 3);
    let material = mm[&level].materials[1].clone();
    let detail = mm[&material].detail.as_ref().unwrap().key();
    let texture = mm[&material].albedo.clone();
    let texture_key = texture.key();
    drop((material, texture));
    // Each texture is held as one material's albedo and another's detail.
    assert_eq!(mm.holders(detail).len(), 2);
    let path = mm.retention_path(texture_key).unwrap();
    assert_eq!(path.chain.iter().map(|l| l.type_name).collect::<Vec<_>>(), ["Level", "Material", "Texture"]);
    assert_eq!(path.chain[0].key, level.key());
    let text = path.to_string();
    assert!(text.starts_with(&format!("Level{}.materials -> Material", level.key())), "{text}");
    assert!(text.ends_with(&format!("(Level{} is held from outside: 1 of its 1 references)", level.key())), "{text}");
    // A second outside reference shows in the count.
    let extra = level.clone();
    assert_eq!(mm.retention_path(texture_key).unwrap().root, RetentionRoot::Outside { outside: 2, total: 2 });
    drop((extra, level));
    assert_eq!(mm.collect_garbage().objects, 7);
}

#[test]
fn paths_name_the_fields_that_hold() {
    #[derive(MMObject)]
    struct Slot(u32, Option<Handle<Texture>>);
    #[derive(MMObject)]
    enum Holder {
        Empty,
        One { r#texture: Handle<Texture> },
    }
    let mut mm = quiet();
    let texture = mm.create(Texture { pixels: Vec::new() });
    let key = texture.key();
    let slot = mm.create(Slot(7, Some(texture.clone())));
    let holder = mm.create(Holder::One { texture });
    let path = mm.retention_path(key).unwrap();
    assert_eq!(path.fields, ["1"]);
    assert_eq!(
        path.to_string(),
        format!(
            "Slot{}.1 -> Texture{key} (Slot{} is held from outside: 1 of its 1 references)",
            slot.key(),
            slot.key()
        )
    );
    drop(slot);
    mm.collect_garbage();
    assert_eq!(mm.retention_path(key).unwrap().fields, ["texture"]);
    mm[&holder] = Holder::Empty;
    mm.collect_garbage();
    assert!(mm.retention_path(key).is_none());
}

// ---- snapshots -----------------------------------------------------------------------

#[test]
fn snapshot_across_level_load_and_unload() {
    let mut mm = quiet();
    let menu = mm.create(Texture { pixels: vec![1; 8] });
    let before = mm.snapshot();
    assert_eq!(before.len(), 1);
    let level = load_level(&mm, "Caves", 4);
    let fresh = mm.alive_since(&before);
    assert_eq!(fresh.len(), 9);
    assert!(fresh.iter().all(|e| e.key != menu.key()));
    assert!(fresh.iter().any(|e| e.type_name == "Level"));

    // Unload, but a system forgot one material.
    let forgotten = mm[&level].materials[2].clone();
    drop(level);
    mm.collect_garbage();
    let left: Vec<_> = mm.alive_since(&before).iter().map(|e| e.type_name).collect();
    assert_eq!(left, ["Texture", "Texture", "Material"], "the material and its two textures");
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.assert_released_since(&before)));
    let message = *failure.unwrap_err().downcast::<String>().unwrap();
    assert!(message.starts_with("3 object(s) created since the snapshot are still alive:"), "{message}");
    assert!(message.contains(&format!("kept alive by: Material{}.detail -> Texture", forgotten.key())), "{message}");
    assert!(message.contains("tests/object_forensics.rs"), "creation sites: {message}");

    drop(forgotten);
    mm.collect_garbage();
    mm.assert_released_since(&before);
    // Reused slots are new objects, not the snapshot's.
    let again = load_level(&mm, "Caves", 4);
    assert_eq!(mm.alive_since(&before).len(), 9);
    drop(again);
    mm.collect_garbage();
    mm.assert_released_since(&before);
}

#[test]
fn assert_released_names_cycles() {
    let mut mm = quiet();
    let drops = Drops::default();
    let before = mm.snapshot();
    let keys = ring(&mut mm, &drops, 2);
    mm.collect_garbage();
    let failure = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.assert_released_since(&before)));
    let message = *failure.unwrap_err().downcast::<String>().unwrap();
    let cycle = format!("cycle: Node{}.link -> Node{}.link -> Node{}", keys[0], keys[1], keys[0]);
    assert!(message.contains(&cycle), "{message}");
    mm.collect_cycles();
    mm.assert_released_since(&before);
}

// ---- incremental collection ----------------------------------------------------------

/// `chains` linked lists of `len` nodes, each node holding the next through
/// its `Vec`, all released: collecting them is one cascade per list.
fn chains(mm: &ObjectManager, drops: &Drops, chains: usize, len: usize) {
    for _ in 0..chains {
        let mut head = node(mm, drops);
        for _ in 1..len {
            head = mm.create(Node { edges: vec![head], link: None, drops: drops.token() });
        }
        drop(head);
    }
}

#[test]
fn budget_of_one_object_per_call_loses_nothing() {
    let mut mm = quiet();
    let drops = Drops::default();
    let n = if cfg!(miri) { 10 } else { 300 };
    chains(&mm, &drops, 3, n / 3);
    let mut freed = 0;
    let mut calls = 0;
    loop {
        let stats = mm.collect_garbage_budgeted(1);
        assert!(stats.objects <= 1);
        if stats.objects == 0 {
            break;
        }
        freed += stats.objects;
        calls += 1;
    }
    assert_eq!(freed, calls);
    assert_eq!(freed, 3 * (n / 3));
    assert_eq!(drops.count(), freed);
    assert!(mm.is_empty());
    assert_eq!(mm.dead_count(), 0);
    let report = mm.report();
    let line = report.get("Node").unwrap();
    assert_eq!(line.created, line.destroyed);
    assert_eq!(line.destroyed as usize, freed);
}

#[test]
fn tiny_time_budgets_lose_nothing() {
    let mut mm = quiet();
    let drops = Drops::default();
    let n = if cfg!(miri) { 12 } else { 2000 };
    chains(&mm, &drops, 4, n / 4);
    let total = mm.report().get("Node").unwrap().created as usize;
    let mut freed = 0;
    for budget in [Duration::ZERO, Duration::from_nanos(1), Duration::from_micros(1)].into_iter().cycle() {
        let stats = mm.collect_garbage_for(budget);
        freed += stats.objects;
        if stats.objects == 0 {
            break;
        }
    }
    assert_eq!(freed, total);
    assert_eq!(drops.count(), total);
    assert!(mm.is_empty());
    assert_eq!(mm.dead_count(), 0);
}

// ---- the shutdown report ---------------------------------------------------------------

#[test]
fn shutdown_report_has_retention_paths_and_cycles() {
    let mut mm = quiet();
    let drops = Drops::default();
    let level = load_level(&mm, "Forest", 2);
    let level_key = level.key();
    let keys = ring(&mut mm, &drops, 2);
    let _raw = level.into_raw(); // held "by a script" past shutdown
    let report = mm.shutdown();
    assert_eq!(report.len(), 5 + 2);
    let texture = report.iter().find(|e| e.type_name == "Texture").unwrap();
    let path = texture.retention.as_ref().unwrap();
    assert_eq!(path.chain[0].key, level_key, "structured: the chain starts at the level");
    assert_eq!(path.fields[0], "materials");
    let retention = path.to_string();
    assert!(retention.starts_with(&format!("Level{level_key}.materials -> Material")), "{retention}");
    assert!(retention.ends_with("is held from outside: 1 of its 1 references)"), "{retention}");
    assert_eq!(report.cycles().len(), 1);
    assert_eq!(report.cycles()[0].keys(), keys);
    let text = report.to_string();
    assert!(text.contains("kept alive by: "), "{text}");
    assert!(
        text.contains(&format!("cycle: Node{}.link -> Node{}.link -> Node{}", keys[0], keys[1], keys[0])),
        "{text}"
    );
    assert_eq!(drops.count(), 2, "shutdown still destroys the cycle");
}

#[test]
fn report_paths_match_retention_path_on_long_chains() {
    let mut mm = quiet();
    let drops = Drops::default();
    // A chain of 20 held from outside at its head, and a tail of 12 hanging off a ring of 11.
    let head = node(&mm, &drops);
    let mut at = head.clone();
    for _ in 1..20 {
        let next = node(&mm, &drops);
        mm[&at].edges.push(next.clone());
        at = next;
    }
    drop(at);
    let ring_keys = ring(&mut mm, &drops, 11);
    let (ring_start, _) = mm.iter::<Node>().find(|(w, _)| w.key() == ring_keys[4]).unwrap();
    let first = node(&mm, &drops);
    mm.get_weak_mut(ring_start).unwrap().edges.push(first.clone());
    let mut at = first;
    for _ in 1..12 {
        let next = node(&mm, &drops);
        mm[&at].link = Some(next.clone());
        at = next;
    }
    drop(at);
    let keys: Vec<ObjectKey> = mm.iter::<Node>().map(|(w, _)| w.key()).collect();
    assert_eq!(keys.len(), 20 + 11 + 12);
    let full: Vec<_> = keys.iter().map(|&k| mm.retention_path(k).unwrap()).collect();
    let expected: Vec<String> = full.iter().map(ToString::to_string).collect();
    assert!(expected.iter().any(|t| t.contains("(12 more)")), "the chain of 20 is shortened");
    let _raw = head.into_raw();
    let report = mm.shutdown();
    for ((key, expected), full) in keys.iter().zip(&expected).zip(&full) {
        let entry = report.iter().find(|e| e.key == *key).unwrap();
        let path = entry.retention.as_ref().unwrap();
        assert_eq!(path.to_string(), *expected);
        assert_eq!(path.len(), full.chain.len(), "hidden links are counted");
        assert_eq!(path.chain.first(), full.chain.first());
        assert_eq!(path.chain.last(), full.chain.last());
        assert!(path.chain.len() <= 8);
    }
}

// ---- random graphs --------------------------------------------------------------------

/// Nodes reachable from the roots along the edges.
fn reachable(n: usize, edges: &[(usize, usize)], roots: &[bool]) -> BTreeSet<usize> {
    let mut seen: BTreeSet<usize> = (0..n).filter(|&i| roots[i]).collect();
    let mut stack: Vec<usize> = seen.iter().copied().collect();
    while let Some(v) = stack.pop() {
        for &(a, b) in edges {
            if a == v && seen.insert(b) {
                stack.push(b);
            }
        }
    }
    seen
}

fn graphs() -> impl Strategy<Value = (usize, Vec<(usize, usize)>, Vec<bool>)> {
    let max: usize = if cfg!(miri) { 6 } else { 24 };
    (1..=max).prop_flat_map(|n| {
        (Just(n), prop::collection::vec((0..n, 0..n), 0..=n * 2), prop::collection::vec(any::<bool>(), n))
    })
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 2 } else { 128 },
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn collect_cycles_frees_exactly_the_unreachable((n, edges, roots) in graphs()) {
        let mut mm = quiet();
        let drops = Drops::default();
        let handles: Vec<_> = (0..n).map(|_| node(&mm, &drops)).collect();
        for &(a, b) in &edges {
            let target = handles[b].clone();
            mm[&handles[a]].edges.push(target);
        }
        let keys: Vec<_> = handles.iter().map(Handle::key).collect();
        let weak: Vec<_> = handles.iter().map(Handle::downgrade).collect();
        let kept: Vec<_> = handles.into_iter().enumerate().filter(|(i, _)| roots[*i]).map(|(_, h)| h).collect();
        let alive = reachable(n, &edges, &roots);

        mm.collect_garbage();
        // Every cycle found is garbage, and reads as a cycle along real edges.
        for group in mm.reference_cycles() {
            let at = |k: ObjectKey| keys.iter().position(|&x| x == k).unwrap();
            let cycle: Vec<usize> = group.cycle().iter().map(|m| at(m.key)).collect();
            for (i, &v) in cycle.iter().enumerate() {
                prop_assert!(!alive.contains(&v));
                let next = cycle[(i + 1) % cycle.len()];
                prop_assert!(edges.contains(&(v, next)), "{v} -> {next} is not an edge");
            }
        }
        // Retention paths of live objects start at a root and follow edges.
        for &v in &alive {
            let path = mm.retention_path(keys[v]).unwrap();
            prop_assert!(path.is_held_from_outside());
            let chain: Vec<usize> = path.keys().iter().map(|&k| keys.iter().position(|&x| x == k).unwrap()).collect();
            prop_assert!(roots[chain[0]]);
            for pair in chain.windows(2) {
                prop_assert!(edges.contains(&(pair[0], pair[1])));
            }
        }

        mm.collect_cycles();
        for (i, w) in weak.iter().enumerate() {
            prop_assert_eq!(mm.is_alive(*w), alive.contains(&i), "node {}", i);
        }
        prop_assert_eq!(drops.count(), n - alive.len());
        prop_assert!(mm.find_cycles().is_empty());
        prop_assert_eq!(mm.len(), alive.len());
        drop(kept);
        mm.collect_cycles();
        prop_assert_eq!(drops.count(), n);
    }

    #[test]
    fn the_budgeted_collector_frees_exactly_the_unreachable((n, edges, roots) in graphs()) {
        let mut mm = quiet();
        let drops = Drops::default();
        let handles: Vec<_> = (0..n).map(|_| node(&mm, &drops)).collect();
        for &(a, b) in &edges {
            let target = handles[b].clone();
            mm[&handles[a]].edges.push(target);
        }
        let weak: Vec<_> = handles.iter().map(Handle::downgrade).collect();
        let kept: Vec<_> = handles.into_iter().enumerate().filter(|(i, _)| roots[*i]).map(|(_, h)| h).collect();
        let alive = reachable(n, &edges, &roots);

        // Zero budgets: one candidate per step, spread over many "frames".
        let mut collector = CycleCollector::new();
        let mut steps = 0;
        loop {
            let mut released = 0;
            loop {
                let step = collector.step(&mut mm, Duration::ZERO);
                steps += 1;
                prop_assert!(step.candidates >= 1 || step.pass_finished);
                released += step.released;
                // Never frees anything reachable, at any step.
                for &v in &alive {
                    prop_assert!(mm.is_alive(weak[v]), "node {} freed after {} steps", v, steps);
                }
                if step.pass_finished {
                    break;
                }
            }
            if released == 0 {
                break;
            }
        }
        for (i, w) in weak.iter().enumerate() {
            prop_assert_eq!(mm.is_alive(*w), alive.contains(&i), "node {}", i);
        }
        prop_assert_eq!(drops.count(), n - alive.len());
        drop(kept);
    }
}

// ---- handles inside std collections and plain structs ---------------------------------

/// A resource cache, as engines keep them: handles as `HashMap` values.
#[derive(MMObject)]
struct Cache {
    by_name: std::collections::HashMap<String, Handle<Asset>>,
}

/// An asset that points back at its cache: a cycle through the map.
#[derive(MMObject)]
struct Asset {
    owner: Option<Handle<Cache>>,
    peers: std::collections::HashSet<Handle<Asset>>,
    drops: DropToken,
}

#[test]
fn holders_and_paths_see_handles_in_a_hash_map() {
    let mm = quiet();
    let drops = Drops::default();
    let asset = mm.create(Asset { owner: None, peers: Default::default(), drops: drops.token() });
    let cache = mm.create(Cache { by_name: [("grass".to_string(), asset.clone())].into() });
    let key = asset.key();
    drop(asset);
    assert_eq!(mm.holders(key), vec![cache.key()]);
    let path = mm.retention_path(key).unwrap();
    assert_eq!(path.chain[0].to_string(), format!("Cache{}", cache.key()));
    assert_eq!(path.fields, ["by_name"]);
    assert_eq!(
        path.to_string(),
        format!("Cache{0}.by_name -> Asset{key} (Cache{0} is held from outside: 1 of its 1 references)", cache.key())
    );
}

#[test]
fn a_cycle_through_a_hash_map_value_is_found_and_collected() {
    let mut mm = quiet();
    let drops = Drops::default();
    let asset = mm.create(Asset { owner: None, peers: Default::default(), drops: drops.token() });
    let cache = mm.create(Cache { by_name: [("grass".to_string(), asset.clone())].into() });
    mm[&asset].owner = Some(cache.clone());
    let (ka, kc) = (asset.key(), cache.key());
    drop((asset, cache));
    assert_eq!(mm.collect_garbage().objects, 0);
    let cycles = mm.find_cycles();
    assert_eq!(cycles.len(), 1);
    let mut members = cycles[0].clone();
    members.sort();
    assert_eq!(members, {
        let mut k = vec![ka, kc];
        k.sort();
        k
    });
    assert_eq!(mm.collect_cycles().objects, 2);
    assert_eq!(drops.count(), 1);
    assert!(mm.is_empty());
}

#[test]
fn a_cycle_through_a_set_key_is_collected_by_clearing_the_set() {
    let mut mm = quiet();
    let drops = Drops::default();
    let asset = mm.create(Asset { owner: None, peers: Default::default(), drops: drops.token() });
    let me = asset.clone();
    let _ = mm[&asset].peers.insert(me);
    let key = asset.key();
    drop(asset);
    assert_eq!(mm.find_cycles(), vec![vec![key]]);
    assert_eq!(mm.collect_cycles().objects, 1);
    assert_eq!(drops.count(), 1);
}

#[test]
fn the_shutdown_report_blames_the_cache_not_the_outside() {
    let mm = quiet();
    let drops = Drops::default();
    let asset = mm.create(Asset { owner: None, peers: Default::default(), drops: drops.token() });
    let cache = mm.create(Cache { by_name: [("rock".to_string(), asset.clone())].into() });
    let (ka, kc) = (asset.key(), cache.key());
    drop(asset);
    let _kept = cache.into_raw();
    let report = mm.shutdown();
    let entry = report.iter().find(|e| e.key == ka).unwrap();
    let path = entry.retention.as_ref().unwrap().to_string();
    assert!(path.starts_with(&format!("Cache{kc}.by_name -> Asset{ka}")), "{path}");
}

/// Handles behind shared, locked and weak fields.
#[derive(MMObject)]
struct Holder {
    shared: Arc<parking_lot::Mutex<Vec<Handle<Asset>>>>,
    weak: Option<mmobject::WeakHandle<Asset>>,
}

#[test]
fn locks_are_visited_without_waiting_and_weak_handles_hold_nothing() {
    let mm = quiet();
    let drops = Drops::default();
    let asset = mm.create(Asset { owner: None, peers: Default::default(), drops: drops.token() });
    let list = Arc::new(parking_lot::Mutex::new(vec![asset.clone()]));
    let holder = mm.create(Holder { shared: Arc::clone(&list), weak: Some(asset.downgrade()) });
    let weak_only = mm.create(Holder { shared: Arc::default(), weak: Some(asset.downgrade()) });
    assert_eq!(mm.holders(asset.key()), vec![holder.key()], "the weak handle is not a holder");
    assert!(!mm.holders(asset.key()).contains(&weak_only.key()));

    // While the list is locked, its handle cannot be seen: it then counts as
    // a reference from outside the manager, and nothing blocks.
    let guard = list.lock();
    assert!(mm.holders(asset.key()).is_empty());
    let path = mm.retention_path(asset.key()).unwrap();
    assert_eq!(path.root, RetentionRoot::Outside { outside: 2, total: 2 });
    drop(guard);
    assert_eq!(mm.retention_path(asset.key()).unwrap().root, RetentionRoot::Outside { outside: 1, total: 2 });
}

// ---- the leak report at scale ------------------------------------------------------------

#[test]
fn the_report_reads_summary_then_roots_then_capped_details() {
    let mm = quiet();
    let textures: Vec<_> = (0..30).map(|i| mm.create(Texture { pixels: vec![i as u8; 100] })).collect();
    let site_line = line!() - 1;
    let materials: Vec<_> = textures.iter().map(|t| mm.create(Material { albedo: t.clone(), detail: None })).collect();
    let level = mm.create(Level { name: "Forest", materials });
    let level_key = level.key();
    drop(textures);
    let _script = level.into_raw();
    let report = mm.shutdown();
    assert_eq!(report.len(), 61);

    // As data: tallies largest first, and the root with what it retains.
    let by_type = report.by_type();
    assert_eq!((by_type[0].count, by_type[2].type_name, by_type[2].count), (30, "Level", 1));
    assert_eq!((by_type[0].type_name, by_type[1].type_name), ("Texture", "Material"), "equal counts: more bytes first");
    assert_eq!(report.roots().len(), 1);
    let root = &report.roots()[0];
    assert_eq!((root.object.key, root.retains, root.outside, root.total), (level_key, 60, 1, 1));
    assert_eq!(root.retained_bytes, report.iter().filter(|e| e.key != level_key).map(|e| e.size).sum::<usize>());

    let text = report.to_string();
    let at = |needle: &str| text.find(needle).unwrap_or_else(|| panic!("{needle:?} missing from\n{text}"));
    assert!(text.starts_with("61 leaked object(s): "), "{text}");
    assert!(at("by type:") < at("by creation site:"));
    assert!(at("by creation site:") < at("roots: "));
    assert!(at(&format!("Level{level_key} retains 60 object(s)")) < at("\nleaked "));
    assert!(text.contains("\n    30  ") && text.contains("\n     1  "), "aligned counts:\n{text}");
    assert_eq!(text.matches("leaked Texture#").count(), ObjectLeakReport::DETAILS_PER_SITE);
    assert!(text.contains(&format!("… and 20 more Texture created at {}:{site_line}:", file!())), "{text}");
    assert_eq!(format!("{report:#}").matches("leaked Texture#").count(), 30, "{{:#}} lists every object");
    assert_eq!(report.display_with(2).to_string().matches("leaked Material#").count(), 2);
}

#[test]
fn every_holder_is_named_even_when_also_held_from_outside() {
    let mm = quiet();
    let texture = mm.create(Texture { pixels: vec![0; 16] });
    let material = mm.create(Material { albedo: texture.clone(), detail: Some(texture.clone()) });
    let (tk, mk) = (texture.key(), material.key());
    let _kept = (texture.into_raw(), material.into_raw());
    let report = mm.shutdown();
    let entry = report.iter().find(|e| e.key == tk).unwrap();
    assert_eq!(entry.ref_count, 3);
    let holders: Vec<String> = entry.holders.iter().map(ToString::to_string).collect();
    assert_eq!(holders, [format!("Material{mk}.albedo"), format!("Material{mk}.detail")]);
    assert_eq!(entry.outside_refs(), 1);
    let text = format!("{entry:#}");
    assert!(
        text.contains(&format!(
            "held by: Material{mk}.albedo, Material{mk}.detail; 1 reference from outside the manager"
        )),
        "{text}"
    );
}

#[test]
fn assert_released_since_uses_the_same_writer() {
    let mm = quiet();
    let before = mm.snapshot();
    let level = load_level(&mm, "Cave", 3);
    let level_key = level.key();
    let message = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.assert_released_since(&before)))
        .expect_err("the level is alive");
    let message = message.downcast_ref::<String>().unwrap();
    assert!(message.starts_with("7 object(s) created since the snapshot are still alive: "), "{message}");
    assert!(message.contains("by creation site:"), "{message}");
    assert!(message.contains(&format!("Level{level_key} retains 6 object(s)")), "{message}");
    assert!(message.contains("\nleaked Texture#"), "{message}");
    drop(level);
}

// ---- clear answers to wrong questions ----------------------------------------------------

#[test]
fn keys_from_another_manager_name_nothing_here() {
    // Keys carry no manager id, so a foreign key cannot be refused with
    // `WrongManager`; generations start at a per-manager offset, so it names
    // no live object here: `holders` is empty and `retention_path` is `None`.
    let mut mm = quiet();
    let other = quiet();
    let drops = Drops::default();
    let here = node(&mm, &drops);
    let holder = node(&mm, &drops);
    mm.get_weak_mut(holder.downgrade()).unwrap().link = Some(here.clone());
    let there = node(&other, &drops);
    assert_eq!(there.key().index(), here.key().index(), "same slot index in both managers");
    assert_ne!(there.key(), here.key());
    assert!(mm.retention_path(there.key()).is_none());
    assert!(mm.holders(there.key()).is_empty());
    assert_eq!(mm.holders(here.key()), vec![holder.key()]);
}

#[test]
fn debug_shows_a_short_generation_and_weak_handles_say_they_cannot_tell() {
    let mut mm = quiet();
    let drops = Drops::default();
    let first = node(&mm, &drops);
    let key = first.key();
    let debug = format!("{key:?}");
    assert_eq!(debug, format!("#{}v{:x}", key.index(), key.generation() & 0xffff));
    assert!(debug.len() <= 1 + 8 + 1 + 4, "{debug}");
    let stale = first.downgrade();
    drop(first);
    mm.collect_garbage();
    let reused = node(&mm, &drops);
    assert_eq!(reused.key().index(), key.index(), "the slot is reused");
    let live = reused.downgrade();
    let (stale_text, live_text) = (format!("{stale:?}"), format!("{live:?}"));
    assert_ne!(stale_text, live_text);
    assert!(live_text.starts_with("Weak(Node#") && live_text.ends_with(", unchecked)"), "{live_text}");
}

// ---- cycle collection under a budget -----------------------------------------------------

/// A step budget no test reaches, even under Miri (whose clock runs with
/// the instructions it interprets): single steps that must finish.
const NO_LIMIT: Duration = Duration::from_secs(24 * 3600);

#[test]
fn the_budgeted_collector_reads_only_candidates_and_finds_a_cycle_through_a_hash_map() {
    let mut mm = quiet();
    let drops = Drops::default();
    // Live nodes nobody let go of are never candidates, however many.
    let live: Vec<_> = (0..1_000).map(|_| node(&mm, &drops)).collect();
    let asset = mm.create(Asset { owner: None, peers: Default::default(), drops: drops.token() });
    let cache = mm.create(Cache { by_name: [("grass".to_string(), asset.clone())].into() });
    mm[&asset].owner = Some(cache.clone());
    let weak = (asset.downgrade(), cache.downgrade());
    drop((asset, cache));
    assert_eq!(mm.cycle_candidates(), 2, "each lost its outside handle and kept one");
    let mut collector = CycleCollector::new();
    let step = collector.step(&mut mm, NO_LIMIT);
    assert!(step.pass_finished);
    assert_eq!((step.candidates, step.released, step.collected.objects), (2, 2, 2), "{step:?}");
    assert!(!mm.is_alive(weak.0) && !mm.is_alive(weak.1));
    assert_eq!(drops.count(), 1);
    assert_eq!(mm.len(), live.len());
    assert_eq!(mm.cycle_candidates(), 0);
    // Nothing queued, nothing read.
    let step = collector.step(&mut mm, NO_LIMIT);
    assert_eq!((step.candidates, step.released), (0, 0));
    assert_eq!(collector.passes(), 2);
}

#[test]
fn a_candidate_found_alive_is_looked_at_again_after_its_next_drop() {
    let mut mm = quiet();
    let drops = Drops::default();
    let nodes: Vec<_> = (0..3).map(|_| node(&mm, &drops)).collect();
    for i in 0..3 {
        let next = nodes[(i + 1) % 3].clone();
        mm[&nodes[i]].link = Some(next);
    }
    // The ring holds itself, and `outside` holds the first node.
    let outside = nodes[0].clone();
    drop(nodes);
    assert_eq!(mm.cycle_candidates(), 3);
    let mut collector = CycleCollector::new();
    let step = collector.step(&mut mm, Duration::ZERO);
    assert_eq!(step.released, 0, "held from outside");
    while collector.step(&mut mm, Duration::ZERO).candidates > 0 {}
    assert_eq!(mm.cycle_candidates(), 0);
    drop(outside);
    assert_eq!(mm.cycle_candidates(), 1);
    let mut freed = 0;
    loop {
        let step = collector.step(&mut mm, Duration::ZERO);
        freed += step.collected.objects;
        if step.pass_finished {
            break;
        }
    }
    assert_eq!(freed, 3);
    assert!(mm.is_empty());
    assert_eq!(drops.count(), 3);
}

#[test]
fn a_cycle_let_go_on_another_thread_is_found() {
    let mut mm = quiet();
    let drops = Drops::default();
    let (a, b) = pair(&mut mm, &drops);
    std::thread::spawn(move || drop((a, b))).join().unwrap();
    let step = CycleCollector::new().step(&mut mm, NO_LIMIT);
    assert_eq!(step.collected.objects, 2);
    assert!(mm.is_empty());
}

#[test]
fn a_cycle_let_go_through_a_raw_handle_is_found() {
    let mut mm = quiet();
    let drops = Drops::default();
    let (a, b) = pair(&mut mm, &drops);
    let raw = a.into_raw();
    drop(b);
    step_until_idle(&mut mm);
    assert_eq!(mm.len(), 2, "the raw handle holds the cycle");
    mm.release_raw(raw).unwrap();
    let step = CycleCollector::new().step(&mut mm, NO_LIMIT);
    assert_eq!(step.collected.objects, 2);
    assert!(mm.is_empty());
}

/// Steps a new collector until its queue is empty.
fn step_until_idle(mm: &mut ObjectManager) {
    let mut collector = CycleCollector::new();
    while !collector.step(mm, Duration::ZERO).pass_finished {}
}

#[test]
fn objects_that_cannot_hold_handles_queue_no_candidates() {
    #[derive(MMObject)]
    struct Texture {
        pixels: Vec<u8>,
        name: String,
        weak_owner: Option<mmobject::WeakHandle<Node>>,
    }
    #[derive(mmobject::VisitHandles)]
    struct Slots {
        by_name: std::collections::HashMap<String, Handle<Texture>>,
    }
    #[derive(MMObject)]
    struct Atlas {
        slots: Slots,
    }
    #[derive(MMObject)]
    struct Tagged {
        #[mm(skip)]
        _hidden: Option<Handle<Texture>>,
        id: u64,
    }
    assert!(!Texture::may_hold_handles());
    assert!(!Tagged::may_hold_handles(), "skipped fields do not count");
    assert!(Node::may_hold_handles() && Cache::may_hold_handles() && Asset::may_hold_handles());
    assert!(Atlas::may_hold_handles(), "through a struct deriving VisitHandles");
    const {
        assert!(!<(u8, String, Vec<Box<str>>) as mmobject::VisitHandles>::MAY_HOLD_HANDLES);
        assert!(
            <std::collections::HashMap<String, Option<Handle<Texture>>> as mmobject::VisitHandles>::MAY_HOLD_HANDLES
        );
    }

    let mm = quiet();
    let texture = mm.create(Texture { pixels: vec![0; 4], name: "grass".into(), weak_owner: None });
    let clones: Vec<_> = (0..10).map(|_| texture.clone()).collect();
    drop(clones);
    assert_eq!(mm.cycle_candidates(), 0);
    let atlas = mm.create(Atlas { slots: Slots { by_name: [("grass".to_string(), texture.clone())].into() } });
    drop(atlas.clone());
    assert_eq!(mm.cycle_candidates(), 1);
    assert_eq!(mm[&texture].name, "grass");
    assert_eq!(mm[&texture].pixels.len() + usize::from(mm[&texture].weak_owner.is_some()), 4);
}

#[test]
fn the_candidate_queue_stays_bounded_without_a_collector() {
    let mut mm = quiet();
    let drops = Drops::default();
    // Every object loses a handle and keeps one, then dies: an entry each,
    // never taken by a `CycleCollector`.
    // Past the first compaction mark (1,024 entries); smaller under Miri.
    let many = if cfg!(miri) { 1_100 } else { 3_000 };
    let nodes: Vec<_> = (0..many).map(|_| node(&mm, &drops)).collect();
    for n in &nodes {
        drop(n.clone());
    }
    assert_eq!(mm.cycle_candidates(), many);
    drop(nodes);
    mm.collect_garbage();
    assert_eq!(mm.cycle_candidates(), 0, "the dead are compacted away");
    for _ in 0..if cfg!(miri) { 2 } else { 20 } {
        let nodes: Vec<_> = (0..1_000).map(|_| node(&mm, &drops)).collect();
        for n in &nodes {
            drop(n.clone());
        }
        drop(nodes);
        mm.collect_garbage();
        assert!(mm.cycle_candidates() <= 2_000, "{} queued", mm.cycle_candidates());
    }
    // Live purple objects stay queued through compaction, once each.
    let kept: Vec<_> = (0..many).map(|_| node(&mm, &drops)).collect();
    for n in &kept {
        drop(n.clone());
        drop(n.clone());
    }
    mm.collect_garbage();
    assert!(mm.cycle_candidates() >= many);
    let step = CycleCollector::new().step(&mut mm, NO_LIMIT);
    assert_eq!(step.released, 0);
    assert_eq!(mm.cycle_candidates(), 0);
    assert_eq!(mm.len(), kept.len());
}

#[test]
fn the_budgeted_collector_leaves_groups_larger_than_its_limit() {
    let mut mm = quiet();
    let drops = Drops::default();
    ring(&mut mm, &drops, 10);
    let mut small = CycleCollector::with_max_group(4);
    let mut cut_short = 0;
    while small.passes() == 0 {
        let step = small.step(&mut mm, Duration::from_secs(1));
        assert_eq!(step.released, 0);
        cut_short += step.cut_short;
    }
    assert_eq!(cut_short, 10, "every node was a candidate, each group cut short");
    assert_eq!(mm.len(), 10, "a ring of 10 is beyond a group of 4");
    assert_eq!(mm.find_cycles().len(), 1);
    assert_eq!(mm.collect_cycles().objects, 10, "left to `collect_cycles`");

    let keys = ring(&mut mm, &drops, 10);
    let mut big = CycleCollector::with_max_group(10);
    let (mut released, mut freed) = (0, 0);
    while big.passes() == 0 {
        let step = big.step(&mut mm, Duration::from_secs(1));
        assert_eq!(step.cut_short, 0);
        released += step.released;
        freed += step.collected.objects;
    }
    assert_eq!((released, freed), (10, 10));
    assert!(mm.is_empty(), "{keys:?}");
}

/// Two types whose names share their first bytes in memory (one a prefix of
/// the other, cut from one constant): the tally tells them apart.
#[test]
fn tallies_tell_apart_names_that_share_their_bytes() {
    const NAMES: &str = "NodeList";
    struct Node;
    impl MMObject for Node {
        const TYPE_NAME: &'static str = NAMES.split_at(4).0;
        const TAG: &'static str = "Nodes";
    }
    struct NodeList;
    impl MMObject for NodeList {
        const TYPE_NAME: &'static str = NAMES;
        const TAG: &'static str = "Nodes";
    }
    let mm = quiet();
    // One creation site for both types (a generic helper without
    // `#[track_caller]`). Held by raw handles alone, so shutdown frees the stores.
    fn leak<T: MMObject>(mm: &ObjectManager, value: T) -> mmobject::object::RawHandle {
        mm.create(value).into_raw()
    }
    let _raw = (leak(&mm, Node), leak(&mm, Node), leak(&mm, NodeList));
    let report = mm.shutdown();
    let by_type: Vec<_> = report.by_type().iter().map(|t| (t.type_name, t.count)).collect();
    assert_eq!(by_type, [("Node", 2), ("NodeList", 1)]);
    let by_site: Vec<_> = report.by_site().iter().map(|t| (t.type_name, t.count)).collect();
    assert_eq!(by_site, [("Node", 2), ("NodeList", 1)]);
    // The details too: one group per type at the site.
    let text = report.display_with(1).to_string();
    assert_eq!(text.matches("leaked NodeList#").count(), 1, "{text}");
    assert_eq!(text.matches("leaked Node#").count(), 1, "{text}");
    assert_eq!(text.matches("… and 1 more Node created at").count(), 1, "{text}");
}
