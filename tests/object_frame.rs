//! Per-frame access: `iter_mut`, disjoint borrows, views of several types at
//! once, destroy events and hooks, typed key lookup, raw peeks, handle order,
//! and iteration that never sees objects created during it.

mod support;

use std::collections::{BTreeSet, HashSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

use mmobject::{Error, Handle, MMObject, ObjectKey, ObjectManager, RawHandle, WeakHandle};
use slotmap::SecondaryMap;
use support::quiet_with;

#[derive(MMObject, Debug)]
struct Entity {
    pos: f32,
    vel: f32,
    mesh: Option<Handle<Mesh>>,
}

#[derive(MMObject, Debug)]
struct Mesh {
    radius: f32,
}

fn entity(vel: f32) -> Entity {
    Entity { pos: 0.0, vel, mesh: None }
}

fn n() -> usize {
    if cfg!(miri) {
        40
    } else {
        1000
    }
}

// --- iter_mut ---------------------------------------------------------------------

#[test]
fn iter_mut_updates_every_live_object_once_across_segments() {
    let mut mm = quiet_with(2);
    let mut hs: Vec<Option<Handle<Entity>>> = (0..n()).map(|i| Some(mm.create(entity(i as f32)))).collect();
    for (i, h) in hs.iter_mut().enumerate() {
        if i % 4 == 0 {
            *h = None; // dead, not yet collected: skipped
        }
    }
    let mut seen = 0;
    for (weak, e) in mm.iter_mut::<Entity>() {
        e.pos += e.vel;
        seen += 1;
        assert!(weak.key().index() < u32::MAX);
    }
    assert_eq!(seen, n() - n().div_ceil(4));
    for (i, h) in hs.iter().enumerate() {
        if let Some(h) = h {
            assert_eq!(mm[h].pos, i as f32, "updated exactly once");
        }
    }
    // The weak handles it yields name the objects it yields.
    let weaks: Vec<(WeakHandle<Entity>, f32)> = mm.iter_mut::<Entity>().map(|(w, e)| (w, e.vel)).collect();
    for (weak, vel) in weaks {
        assert_eq!(mm.get_weak(weak).unwrap().vel, vel);
    }
}

#[test]
fn internal_and_external_iteration_agree() {
    let mut mm = quiet_with(2);
    let mut hs: Vec<Option<Handle<Entity>>> = (0..n()).map(|i| Some(mm.create(entity(i as f32)))).collect();
    for (i, h) in hs.iter_mut().enumerate() {
        if i % 3 == 1 || (i > 20 && i < 40) {
            *h = None;
        }
    }
    // `fold` (used by `collect`, `sum`, `for_each`) walks with its own loop;
    // `next` (used by `for` and `by_ref`) with the cursor: same answers.
    let by_fold: Vec<(WeakHandle<Entity>, f32)> = mm.iter::<Entity>().map(|(w, e)| (w, e.vel)).collect();
    let mut by_next = Vec::new();
    let mut it = mm.iter::<Entity>();
    if let Some((w, e)) = it.next() {
        by_next.push((w, e.vel));
    }
    assert_eq!(it.len(), by_fold.len() - 1);
    let rest: Vec<_> = it.map(|(w, e)| (w, e.vel)).collect(); // fold after a next
    by_next.extend(rest);
    assert_eq!(by_fold, by_next);
    let mut by_next_mut = Vec::new();
    let mut it = mm.iter_mut::<Entity>();
    for (w, e) in it.by_ref() {
        by_next_mut.push((w, e.vel));
    }
    drop(it);
    assert_eq!(by_fold, by_next_mut);
    mm.iter_mut::<Entity>().for_each(|(_, e)| e.pos = 1.0);
    assert_eq!(mm.iter::<Entity>().map(|(_, e)| e.pos).sum::<f32>(), by_fold.len() as f32);
    drop(hs);
}

#[test]
fn iterators_are_exact_size_fused_and_cloneable() {
    let mut mm = quiet_with(2);
    assert_eq!(mm.iter::<Entity>().len(), 0, "no store yet");
    let hs: Vec<_> = (0..10).map(|i| mm.create(entity(i as f32))).collect();
    drop(hs[3].clone());
    let mut it = mm.iter::<Entity>();
    assert_eq!(it.len(), 10);
    it.next();
    let copy = it.clone();
    assert_eq!((it.len(), copy.len()), (9, 9));
    assert_eq!(it.by_ref().count(), 9);
    assert_eq!(it.len(), 0);
    assert!(it.next().is_none() && it.next().is_none(), "fused");
    assert_eq!(copy.map(|(_, e)| e.vel as u32).collect::<Vec<_>>(), (1..10).collect::<Vec<_>>());
    drop(it);
    let mut it = mm.iter_mut::<Entity>();
    assert_eq!(it.size_hint(), (10, Some(10)));
    assert_eq!(it.by_ref().count(), 10);
    assert!(it.next().is_none());
    drop(it);
    drop(hs);
    assert_eq!(mm.iter::<Entity>().len(), 0, "released objects are not counted");
    assert_eq!(mm.iter::<Entity>().count(), 0);
}

#[test]
fn creating_inside_iteration_never_yields_the_new_objects() {
    let mut mm = quiet_with(2);
    let hs: Vec<_> = (0..8).map(|i| mm.create(entity(i as f32))).collect();
    // Free slots ahead of the cursor exist: a create could reuse them.
    drop(hs);
    mm.collect_garbage();
    let keep: Vec<_> = (0..8).map(|i| mm.create(entity(i as f32))).collect();
    drop(keep[1].clone());
    let mut made = Vec::new();
    let mut visits = 0;
    for (_, e) in mm.iter::<Entity>() {
        visits += 1;
        assert!(visits <= 8, "the iteration must end");
        made.push(mm.create(entity(e.vel + 100.0)));
    }
    assert_eq!(visits, 8);
    assert_eq!(mm.count::<Entity>(), 16);
    // With no iterator left, the next collection lets creates reuse slots again.
    drop(made);
    mm.collect_garbage();
    let reused = mm.create(entity(0.0));
    assert!(reused.key().index() < 64);
    // A forgotten iterator only costs fresh slots until the next collection
    // (16 slots are used; 7 of them are free).
    std::mem::forget(mm.iter::<Entity>());
    let fresh = mm.create(entity(0.0));
    assert!(fresh.key().index() >= 16, "a fresh slot while the iterator counts");
    mm.collect_garbage();
    let again = mm.create(entity(0.0));
    assert!(again.key().index() < 16, "reuse resumes after a collection");
}

// --- disjoint borrows ----------------------------------------------------------------

#[test]
fn disjoint_mut_through_handles_and_weak_handles() {
    let mut mm = quiet_with(2);
    let a = mm.create(entity(1.0));
    let b = mm.create(entity(2.0));
    let c = mm.create(entity(3.0));
    let [x, y, z] = mm.get_disjoint_mut([&a, &b, &c]);
    std::mem::swap(&mut x.vel, &mut z.vel);
    y.pos = 9.0;
    assert_eq!((mm[&a].vel, mm[&b].pos, mm[&c].vel), (3.0, 9.0, 1.0));

    let [x, y] = mm.get_disjoint_weak_mut([a.downgrade(), c.downgrade()]).unwrap();
    x.pos = y.vel;
    assert_eq!(mm[&a].pos, 1.0);

    // Aliasing is an error naming the object, and changes nothing.
    let err = mm.try_get_disjoint_mut([&a, &b, &a]).unwrap_err();
    assert_eq!(err, Error::AliasedHandles { type_name: "Entity", index: a.key().index() });
    assert!(err.to_string().contains("more than once"));
    let caught = catch_unwind(AssertUnwindSafe(|| {
        mm.get_disjoint_mut([&b, &b]);
    }));
    assert!(caught.is_err());
    assert!(matches!(mm.try_get_disjoint_weak_mut([a.downgrade(), a.downgrade()]), Err(Error::AliasedHandles { .. })));

    // A dead one makes the weak form fail as a whole.
    let weak_b = b.downgrade();
    drop(b);
    assert!(mm.get_disjoint_weak_mut([a.downgrade(), weak_b]).is_none());
    assert!(matches!(mm.try_get_disjoint_weak_mut([weak_b, a.downgrade()]), Err(Error::StaleHandle { .. })));

    // Another manager's handle.
    let other = quiet_with(2);
    let foreign = other.create(entity(0.0));
    assert!(matches!(mm.try_get_disjoint_mut([&a, &foreign]), Err(Error::WrongManager { .. })));
    let caught = catch_unwind(AssertUnwindSafe(|| {
        mm.get_disjoint_weak_mut([foreign.downgrade()]);
    }));
    assert!(caught.is_err());
}

// --- views of several types ------------------------------------------------------------

#[test]
fn one_type_written_while_another_is_read() {
    let mut mm = quiet_with(2);
    let meshes: Vec<_> = (0..4).map(|i| mm.create(Mesh { radius: i as f32 })).collect();
    let entities: Vec<_> =
        (0..n()).map(|i| mm.create(Entity { pos: 0.0, vel: 1.0, mesh: Some(meshes[i % 4].clone()) })).collect();
    {
        let views = mm.views();
        let mut ents = views.view_mut::<Entity>();
        let mesh_view = views.view::<Mesh>();
        let again = views.view::<Mesh>(); // reading twice is fine
        for (_, e) in ents.iter_mut() {
            let mesh = e.mesh.as_ref().unwrap();
            e.pos += mesh_view.get(mesh).radius + again.get(mesh).radius;
        }
        let first = ents.get_mut(&entities[0]);
        first.vel = 5.0;
        assert_eq!(ents.get_weak(entities[0].downgrade()).unwrap().vel, 5.0);
        assert_eq!(ents.count(), n());
    }
    for (i, e) in entities.iter().enumerate() {
        assert_eq!(mm[e].pos, 2.0 * (i % 4) as f32);
    }
}

#[test]
fn views_refuse_a_second_borrow_of_a_written_type() {
    let mut mm = quiet_with(2);
    let _e = mm.create(entity(1.0));
    let views = mm.views();
    let _write = views.view_mut::<Entity>();
    assert_eq!(views.try_view::<Entity>().unwrap_err(), Error::AlreadyBorrowed { type_name: "Entity", mutably: true });
    assert!(matches!(views.try_view_mut::<Entity>(), Err(Error::AlreadyBorrowed { mutably: true, .. })));
    let _read = views.view::<Mesh>(); // a type with no store yet
    let err = views.try_view_mut::<Mesh>().unwrap_err();
    assert_eq!(err, Error::AlreadyBorrowed { type_name: "Mesh", mutably: false });
    assert!(err.to_string().contains("Mesh is already borrowed for reading"), "{err}");
    let caught = catch_unwind(AssertUnwindSafe(|| {
        views.view_mut::<Entity>();
    }));
    let message = caught.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains("Entity is already borrowed for writing"), "{message}");
    assert!(format!("{views:?}").contains("types_taken: 2"));
}

#[test]
fn view_mut_checks_managers_and_staleness() {
    let mut mm = quiet_with(2);
    let other = quiet_with(2);
    let foreign = other.create(entity(0.0));
    let a = mm.create(entity(1.0));
    let weak = a.downgrade();
    let mut view = mm.view_mut::<Entity>();
    assert!(matches!(view.try_get_mut(&foreign), Err(Error::WrongManager { .. })));
    assert!(matches!(view.try_get(&foreign), Err(Error::WrongManager { .. })));
    assert!(matches!(view.try_get_weak_mut(foreign.downgrade()), Err(Error::WrongManager { .. })));
    view.get_weak_mut(weak).unwrap().pos = 3.0;
    drop(a);
    assert!(view.get_weak_mut(weak).is_none());
    assert!(matches!(view.try_get_weak_mut(weak), Err(Error::StaleHandle { .. })));
    assert_eq!(view.iter().count(), 0);
    assert!(format!("{view:?}").starts_with("ObjectViewMut"));
}

// --- destroy events and hooks ------------------------------------------------------------

#[test]
fn destroyed_events_cover_cascades_budgets_and_timed_collection() {
    let mut mm = ObjectManager::builder().report_leaks(false).destroy_events(true).build();
    let mesh = mm.create(Mesh { radius: 1.0 });
    let mesh_key = mesh.key();
    let holder = mm.create(Entity { pos: 0.0, vel: 0.0, mesh: Some(mesh) });
    let holder_key = holder.key();
    let mut gpu: SecondaryMap<ObjectKey, &str> = SecondaryMap::new();
    gpu.insert(mesh_key, "vertex buffer");
    gpu.insert(holder_key, "uniforms");
    drop(holder);
    assert_eq!(mm.collect_garbage().objects, 2, "the cascade finishes in one call");
    let events: Vec<_> = mm.drain_destroyed().collect();
    assert_eq!(events.len(), 2);
    assert_eq!((events[0].key(), events[0].type_name()), (holder_key, "Entity"));
    assert!(events[0].is::<Entity>() && !events[0].is::<Mesh>());
    assert_eq!(events[1].key(), mesh_key);
    assert!(events[1].is::<Mesh>());
    for event in &events {
        gpu.remove(event.key());
    }
    assert!(gpu.is_empty());
    assert_eq!(mm.drain_destroyed().count(), 0, "drained");

    for i in 0..10 {
        drop(mm.create(entity(i as f32)));
    }
    mm.collect_garbage_budgeted(4);
    assert_eq!(mm.drain_destroyed().count(), 4);
    while mm.dead_count() > 0 {
        mm.collect_garbage_for(std::time::Duration::from_millis(1));
    }
    assert_eq!(mm.drain_destroyed().count(), 6);
}

#[derive(MMObject)]
struct Node {
    next: Option<Handle<Node>>,
    name: u32,
}

#[test]
fn destroyed_events_include_cycle_collection_and_are_off_by_default() {
    let mut mm = ObjectManager::builder().report_leaks(false).destroy_events(true).build();
    let a = mm.create(Node { next: None, name: 1 });
    let b = mm.create(Node { next: Some(a.clone()), name: 2 });
    mm.get_mut(&a).next = Some(b.clone());
    let keys: HashSet<_> = [a.key(), b.key()].into();
    drop((a, b));
    assert_eq!(mm.collect_garbage().objects, 0, "a cycle keeps itself alive");
    assert_eq!(mm.collect_cycles().objects, 2);
    let destroyed: HashSet<_> = mm.drain_destroyed().map(|e| e.key()).collect();
    assert_eq!(destroyed, keys);

    let mut plain = quiet_with(2);
    drop(plain.create(Node { next: None, name: 0 }));
    plain.collect_garbage();
    assert_eq!(plain.drain_destroyed().count(), 0);
}

#[test]
fn on_destroy_sees_each_value_before_it_drops_also_at_shutdown() {
    let mut mm = quiet_with(2);
    let (send, seen) = mpsc::channel();
    mm.on_destroy::<Node>(move |key, node: &mut Node| {
        send.send((key, node.name, node.next.take().is_some())).unwrap();
    });
    let tail = mm.create(Node { next: None, name: 2 });
    let head = mm.create(Node { next: Some(tail.clone()), name: 1 });
    let head_key = head.key();
    drop(tail);
    drop(head);
    mm.collect_garbage();
    let got: Vec<_> = seen.try_iter().collect();
    assert_eq!(got.len(), 2);
    assert_eq!(got[0], (head_key, 1, true), "the hook may take the handles out");
    assert_eq!(got[1].1, 2);

    // Alive at shutdown, held by a raw handle only (so its memory is freed).
    let _kept = mm.create(Node { next: None, name: 3 }).into_raw();
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    assert_eq!(seen.try_iter().map(|(_, name, _)| name).collect::<Vec<_>>(), [3], "shutdown runs the hook too");
}

#[test]
fn a_panicking_hook_still_destroys_the_object_and_loses_nothing() {
    let mut mm = quiet_with(2);
    mm.on_destroy::<Mesh>(|_, mesh: &mut Mesh| {
        if mesh.radius == 2.0 {
            panic!("hook failed");
        }
    });
    for i in 0..5 {
        drop(mm.create(Mesh { radius: i as f32 }));
    }
    assert!(catch_unwind(AssertUnwindSafe(|| mm.collect_garbage())).is_err());
    mm.collect_garbage();
    assert_eq!(mm.dead_count(), 0);
    assert_eq!(mm.report().get("Mesh").unwrap().destroyed, 5);
    mm.clear_on_destroy::<Mesh>();
    drop(mm.create(Mesh { radius: 2.0 }));
    assert_eq!(mm.collect_garbage().objects, 1, "no hook any more");
}

// --- keys, raw peeks, order ------------------------------------------------------------------

#[test]
fn get_by_key_is_typed_and_checked() {
    let mut mm = quiet_with(2);
    let e = mm.create(entity(4.0));
    let m = mm.create(Mesh { radius: 1.0 });
    let key = e.key();
    assert_eq!(mm.get_by_key::<Entity>(key).unwrap().vel, 4.0);
    mm.get_by_key_mut::<Entity>(key).unwrap().vel = 5.0;
    assert_eq!(mm[&e].vel, 5.0);
    assert_eq!(mm.try_get_by_key::<Mesh>(key).unwrap_err(), Error::WrongType { expected: "Mesh", found: "Entity" });
    assert!(mm.get_by_key::<Mesh>(m.key()).is_some());
    drop(e);
    assert!(matches!(mm.try_get_by_key::<Entity>(key), Err(Error::StaleHandle { .. })));
    mm.collect_garbage();
    let reused = mm.create(entity(0.0));
    assert_eq!(reused.key().index(), key.index());
    assert!(mm.get_by_key::<Entity>(key).is_none(), "an old key never names the new object");
    let unknown = slotmap::KeyData::from_ffi(u64::from(1u32 << 23) | 1 << 32).into();
    assert_eq!(mm.try_get_by_key::<Entity>(unknown).unwrap_err(), Error::UnknownKey { index: 1 << 23 });
}

#[test]
fn raw_peek_changes_no_count_and_reports_each_misuse() {
    let mm = quiet_with(2);
    let h = mm.create(entity(7.0));
    let keep = h.clone();
    let raw = h.into_raw();
    assert_eq!(keep.ref_count(), 2);
    assert_eq!(mm.try_get_raw::<Entity>(raw).unwrap().vel, 7.0);
    assert_eq!(mm.get_raw::<Entity>(raw).unwrap().vel, 7.0);
    assert_eq!(keep.ref_count(), 2, "a peek takes no reference");
    assert!(matches!(mm.try_get_raw::<Mesh>(raw), Err(Error::WrongType { .. })));
    let other = quiet_with(2);
    assert!(matches!(
        other.try_get_raw::<Entity>(raw),
        Err(Error::WrongManager { .. } | Error::InvalidRawHandle { .. })
    ));
    assert!(matches!(mm.try_get_raw::<Entity>(RawHandle(2)), Err(Error::InvalidRawHandle { .. })));
    let caught = catch_unwind(AssertUnwindSafe(|| mm.get_raw::<Mesh>(raw).is_some()));
    assert!(caught.is_err(), "the panicking form panics on the wrong type");
    mm.release_raw(raw).unwrap();
    drop(keep);
    assert!(matches!(mm.try_get_raw::<Entity>(raw), Err(Error::StaleHandle { .. })));
    assert!(mm.get_raw::<Entity>(raw).is_none());
}

#[test]
fn handles_are_ordered_by_manager_then_key() {
    let mm = quiet_with(2);
    let hs: Vec<_> = (0..20).map(|i| mm.create(entity(i as f32))).collect();
    let set: BTreeSet<Handle<Entity>> = hs.iter().rev().cloned().collect();
    let keys: Vec<_> = set.iter().map(Handle::key).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    assert_eq!(set.len(), 20);
    let weaks: BTreeSet<WeakHandle<Entity>> = hs.iter().map(Handle::downgrade).collect();
    assert!(weaks.iter().map(|w| w.key()).eq(keys.iter().copied()));
    assert!(hs[0] < hs[1] && hs[0].downgrade() < hs[1].downgrade());
    let other = quiet_with(2);
    let later = other.create(entity(0.0));
    assert!(hs[19] < later, "a later manager sorts after");
    assert_eq!(hs[3].cmp(&hs[3].clone()), std::cmp::Ordering::Equal);
}

/// So large that a 4 MiB chunk holds 13 slots, so a few objects span several
/// chunks and segments. (Under Miri, small: its runs then break only at
/// segment ends, which is what it checks the pointer steps over.)
const CHUNKY: usize = if cfg!(miri) { 16 } else { 300_000 };

#[derive(MMObject)]
struct Chunky {
    bytes: [u8; CHUNKY],
    id: u32,
}

#[test]
fn collection_walks_runs_of_neighbours_across_chunk_and_segment_ends() {
    // Debug builds copy the large values through a few frames: room for them.
    let big_stack = std::thread::Builder::new().stack_size(64 << 20);
    big_stack.spawn(runs_of_neighbours).unwrap().join().unwrap();
}

fn runs_of_neighbours() {
    static DROPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            DROPS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    #[derive(MMObject)]
    struct Big {
        _bytes: [u8; CHUNKY],
        #[mm(skip)]
        _counted: Counted,
    }
    let mut mm = ObjectManager::new();
    // Segments of 1, 2, 4, 8 and 16 slots; 13 slots to a chunk, so the
    // 16-slot segment breaks at a chunk end too (outside Miri).
    let n = 30;
    let chunky: Vec<Handle<Chunky>> = (0..n).map(|id| mm.create(Chunky { bytes: [id as u8; CHUNKY], id })).collect();
    let weak: Vec<_> = chunky.iter().map(Handle::downgrade).collect();
    let big: Vec<Handle<Big>> = (0..n).map(|_| mm.create(Big { _bytes: [0; CHUNKY], _counted: Counted })).collect();
    // Released in index order, then every other one of the rest: the dead
    // list holds descending runs broken at chunk and segment ends.
    let (evens, odds): (Vec<_>, Vec<_>) = chunky.into_iter().partition(|h| mm[h].id % 2 == 0);
    drop(evens);
    drop(big);
    assert_eq!(mm.collect_garbage().objects, n as usize + (n as usize).div_ceil(2));
    assert_eq!(DROPS.load(std::sync::atomic::Ordering::Relaxed), n as usize);
    for (id, weak) in weak.iter().enumerate() {
        assert_eq!(mm.get_weak(*weak).is_some(), id % 2 == 1, "object {id}");
    }
    for h in &odds {
        assert!(mm[h].bytes.iter().all(|&b| u32::from(b) == mm[h].id));
    }
    drop(odds);
    assert_eq!(mm.collect_garbage().objects, (n as usize) / 2);
    let again: Vec<Handle<Chunky>> = (0..n).map(|id| mm.create(Chunky { bytes: [0; CHUNKY], id })).collect();
    assert!(weak.iter().all(|w| mm.get_weak(*w).is_none()), "stale keys stay stale after reuse");
    drop(again);
}

/// `collect_garbage_for` works in batches, and each batch goes on with the pass the one
/// before started: its `rounds` say how deep the cascades went, as `collect_garbage`'s do,
/// not how many batches ran (100 dead objects and no cascade read 4 rounds).
#[test]
fn a_timed_collection_counts_passes_not_batches() {
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let drop_many = |mm: &ObjectManager| {
        for i in 0..100 {
            drop(mm.create(entity(i as f32)));
        }
    };
    drop_many(&mm);
    let whole = mm.collect_garbage();
    drop_many(&mm);
    let timed = mm.collect_garbage_for(std::time::Duration::from_secs(60));
    assert_eq!((whole.objects, whole.rounds), (100, 1));
    assert_eq!(timed, whole, "the same work, the same stats");

    // A cascade: each node holds the next; releasing the head frees the chain one link
    // per pass.
    let mut next = None;
    for name in 0..3 {
        next = Some(mm.create(Node { next, name }));
    }
    drop(next);
    let cascade = mm.collect_garbage_for(std::time::Duration::from_secs(60));
    assert_eq!((cascade.objects, cascade.rounds), (3, 3));
}

/// The peak of a type counts what a destroy hook creates while the object it is called
/// for is still there: one dying mesh whose hook loads five replacements makes six at once.
#[test]
fn the_peak_sees_what_a_destroy_hook_creates() {
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let loader = mm.loader();
    let replacements = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = std::sync::Arc::clone(&replacements);
    mm.on_destroy::<Mesh>(move |_, _| {
        let mut keep = keep.lock().unwrap();
        if keep.is_empty() {
            keep.extend((0..5).map(|_| loader.create(Mesh { radius: 1.0 })));
        }
    });
    drop(mm.create(Mesh { radius: 1.0 }));
    assert_eq!(mm.collect_garbage().objects, 1);
    let report = mm.report();
    let meshes = report.get("Mesh").expect("a line for meshes");
    assert_eq!((meshes.live, meshes.peak_live), (5, 6));
    mm.clear_on_destroy::<Mesh>();
    replacements.lock().unwrap().clear();
}
