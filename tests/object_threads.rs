//! Handles cloned and dropped on worker threads while the main thread creates,
//! reads and (between phases) collects; objects created by several asset
//! loaders at once.

use std::alloc::{Layout, System};
use std::collections::HashSet;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use mmobject::allocator_api2::alloc::{AllocError, Allocator};
use mmobject::{Handle, MMObject, ObjectManager, WeakHandle};

mod support;
use support::{quiet_with, DropToken, Drops};

const WORKERS: usize = 4;

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    id: usize,
    token: DropToken,
}

#[derive(MMObject)]
struct Mesh {
    id: usize,
    texture: Option<Handle<Texture>>,
    token: DropToken,
}

#[test]
fn workers_clone_and_drop_while_main_creates_reads_and_collects() {
    let (phases, per_worker, iterations, meshes) = if cfg!(miri) { (2, 2, 10, 4) } else { (6, 50, 2000, 200) };
    let tex_drops = Drops::default();
    let mesh_drops = Drops::default();
    let mut mm = quiet_with(2);
    let shared: Vec<Handle<Texture>> = (0..8).map(|id| mm.create(Texture { id, token: tex_drops.token() })).collect();
    let mut kept_meshes = Vec::new();
    let mut next_id = 1000;
    let mut textures_created = shared.len();
    let mut meshes_created = 0;

    for phase in 0..phases {
        // Each worker owns a batch of fresh textures and drops every one of them during the phase.
        let batches: Vec<Vec<Handle<Texture>>> = (0..WORKERS)
            .map(|_| {
                (0..per_worker)
                    .map(|_| {
                        next_id += 1;
                        mm.create(Texture { id: next_id, token: tex_drops.token() })
                    })
                    .collect()
            })
            .collect();
        textures_created += WORKERS * per_worker;
        let watched: Vec<(usize, WeakHandle<Texture>)> =
            batches.iter().flatten().map(|h| (mm[h].id, h.downgrade())).collect();
        let dropped_meshes = {
            let mm = &mm;
            let shared = &shared;
            std::thread::scope(|s| {
                for (w, batch) in batches.into_iter().enumerate() {
                    s.spawn(move || {
                        let mut local = Vec::new();
                        for i in 0..iterations {
                            local.push(shared[(i * 7 + w) % shared.len()].clone());
                            if let Some(h) = batch.get(i % batch.len().max(1)) {
                                local.push(h.clone());
                            }
                            if local.len() > 6 {
                                local.drain(..3);
                            }
                        }
                        drop(local);
                        drop(batch);
                    });
                }
                // Main thread: create, read, iterate while the workers run.
                let mut dropped = 0;
                for i in 0..meshes {
                    let texture = Some(shared[i % shared.len()].clone());
                    let mesh = mm.create(Mesh { id: i, texture, token: mesh_drops.token() });
                    assert_eq!(mm.get(&mesh).id, i);
                    assert_eq!(mm[mm[&mesh].texture.as_ref().unwrap()].id, i % shared.len());
                    let (id, weak) = watched[i % watched.len()];
                    if let Some(t) = mm.get_weak(weak) {
                        assert_eq!(t.id, id);
                    }
                    if let Some(h) = mm.upgrade(weak) {
                        assert_eq!(mm[&h].id, id, "an upgraded handle reads its own object");
                    }
                    if i % 2 == 0 {
                        kept_meshes.push(mesh);
                    } else {
                        dropped += 1;
                    }
                    let mut live = 0;
                    for (w, t) in mm.iter::<Texture>() {
                        live += 1;
                        if let Some(again) = mm.get_weak(w) {
                            assert_eq!(again.id, t.id, "a weak handle from iter names the same object");
                        }
                    }
                    assert!(live >= shared.len() && live <= shared.len() + WORKERS * per_worker);
                }
                dropped
            })
        };
        meshes_created += meshes;

        // The sync point: every batch texture and every dropped mesh is dead now.
        assert_eq!(mm.dead_count(), WORKERS * per_worker + dropped_meshes, "phase {phase}");
        let stats = mm.collect_garbage();
        assert_eq!(stats.objects, WORKERS * per_worker + dropped_meshes);
        assert_eq!(mm.dead_count(), 0);
        assert!(watched.iter().all(|&(_, w)| mm.upgrade(w).is_none()));
        assert_eq!(mm.count::<Texture>(), shared.len());
        assert_eq!(mm.count::<Mesh>(), kept_meshes.len());
        assert_eq!(tex_drops.count(), textures_created - shared.len());
        assert_eq!(mesh_drops.count(), meshes_created - kept_meshes.len());
        for (i, h) in shared.iter().enumerate() {
            let held_by_meshes = kept_meshes.iter().filter(|m| mm[*m].texture.as_ref() == Some(h)).count();
            assert_eq!(h.ref_count() as usize, 1 + held_by_meshes, "texture {i}");
        }
    }

    drop(kept_meshes);
    drop(shared);
    let stats = mm.collect_garbage();
    assert_eq!(stats.rounds, 2, "meshes, then the textures they held");
    assert_eq!(tex_drops.count(), textures_created);
    assert_eq!(mesh_drops.count(), meshes_created);
    let report = mm.report();
    assert_eq!(report.get("Texture").unwrap().destroyed as usize, textures_created);
    assert_eq!(report.get("Mesh").unwrap().destroyed as usize, meshes_created);
    assert!(mm.shutdown().is_empty());
}

#[test]
fn asset_loaders_create_from_four_threads_at_once() {
    let per_thread = if cfg!(miri) { 12 } else { 2000 };
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    for round in 0..2 {
        // Round 0 grows fresh segments concurrently; round 1 also pops the free list.
        let handles: Vec<Vec<Handle<Texture>>> = {
            let mm = &mm;
            let drops = &drops;
            std::thread::scope(|s| {
                let loaders: Vec<_> = (0..WORKERS)
                    .map(|t| {
                        s.spawn(move || {
                            (0..per_thread)
                                .map(|i| {
                                    let id = t * per_thread + i;
                                    let h = mm.create(Texture { id, token: drops.token() });
                                    assert_eq!(mm[&h].id, id);
                                    h
                                })
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                loaders.into_iter().map(|l| l.join().unwrap()).collect()
            })
        };
        let all: Vec<&Handle<Texture>> = handles.iter().flatten().collect();
        let total = WORKERS * per_thread;
        assert_eq!(all.len(), total);
        let indices: HashSet<u32> = all.iter().map(|h| h.key().index()).collect();
        assert_eq!(indices.len(), total, "round {round}: every object got its own slot");
        for (t, batch) in handles.iter().enumerate() {
            for (i, h) in batch.iter().enumerate() {
                assert_eq!(mm[h].id, t * per_thread + i, "no two objects share a slot");
                assert_eq!(h.ref_count(), 1);
            }
        }
        assert_eq!(mm.count::<Texture>(), total);
        assert_eq!(mm.iter::<Texture>().count(), total);
        drop(all);
        drop(handles);
        assert_eq!(mm.collect_garbage().objects, total);
        assert_eq!(drops.count(), total * (round + 1));
    }
    let report = mm.report();
    let t = report.get("Texture").unwrap();
    assert_eq!((t.created, t.destroyed, t.live), (2 * (WORKERS * per_thread) as u64, t.created, 0));
}

#[test]
fn upgrades_race_with_the_last_drop() {
    let rounds = if cfg!(miri) { 3 } else { 500 };
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    for round in 0..rounds {
        let h = mm.create(Texture { id: round, token: drops.token() });
        let weak = h.downgrade();
        let upgraded = {
            let mm = &mm;
            std::thread::scope(|s| {
                let upgraders: Vec<_> = (0..WORKERS - 1)
                    .map(|_| {
                        s.spawn(move || {
                            let mut got = 0;
                            for _ in 0..4 {
                                if let Some(up) = mm.upgrade(weak) {
                                    assert_eq!(mm[&up].id, round);
                                    got += 1;
                                }
                            }
                            got
                        })
                    })
                    .collect();
                s.spawn(move || drop(h));
                upgraders.into_iter().map(|u| u.join().unwrap()).sum::<usize>()
            })
        };
        assert!(upgraded <= 4 * (WORKERS - 1));
        assert!(mm.upgrade(weak).is_none(), "dead once every handle is gone");
        assert_eq!(mm.dead_count(), 1, "exactly one push onto the dead list");
        assert_eq!(mm.collect_garbage().objects, 1);
        assert_eq!(drops.count(), round + 1);
    }
}

#[test]
fn main_collects_while_workers_drop_their_last_handles() {
    // Handles do not borrow the manager: the owner may collect while workers drop.
    let per_worker = if cfg!(miri) { 6 } else { 3000 };
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    let batches: Vec<Vec<Handle<Mesh>>> = (0..WORKERS)
        .map(|w| {
            (0..per_worker)
                .map(|i| {
                    let texture = Some(mm.create(Texture { id: i, token: drops.token() }));
                    mm.create(Mesh { id: w * per_worker + i, texture, token: drops.token() })
                })
                .collect()
        })
        .collect();
    let total = 2 * WORKERS * per_worker;
    let mut collected = 0;
    std::thread::scope(|s| {
        let workers: Vec<_> = batches
            .into_iter()
            .map(|mut batch| {
                s.spawn(move || {
                    while let Some(h) = batch.pop() {
                        let extra = h.clone();
                        drop(h);
                        drop(extra);
                    }
                })
            })
            .collect();
        while !workers.iter().all(|w| w.is_finished()) {
            collected += mm.collect_garbage_budgeted(3).objects;
            collected += mm.collect_garbage().objects;
        }
    });
    collected += mm.collect_garbage().objects;
    assert_eq!(collected, total, "every object collected exactly once");
    assert_eq!(drops.count(), total);
    assert_eq!((mm.len(), mm.dead_count()), (0, 0));
    let report = mm.report();
    assert_eq!(report.get("Mesh").unwrap().destroyed as usize, WORKERS * per_worker);
    assert_eq!(report.get("Texture").unwrap().destroyed as usize, WORKERS * per_worker);
}

#[test]
fn the_manager_moves_to_another_thread_for_collection() {
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    let kept = mm.create(Texture { id: 1, token: drops.token() });
    drop(mm.create(Texture { id: 2, token: drops.token() }));
    let mesh = mm.create(Mesh { id: 3, texture: Some(kept.clone()), token: drops.token() });
    let (mm, stats) = std::thread::spawn(move || {
        let stats = mm.collect_garbage();
        (mm, stats)
    })
    .join()
    .unwrap();
    assert_eq!(stats.objects, 1);
    assert_eq!(drops.count(), 1);
    drop((kept, mesh));
    let report = std::thread::spawn(move || {
        let mut mm = mm;
        assert_eq!(mm.collect_garbage().objects, 2);
        mm.shutdown()
    })
    .join()
    .unwrap();
    assert!(report.is_empty());
    assert_eq!(drops.count(), 3);
}

/// The thread that makes a store, and later whichever thread collects, takes
/// fresh slots from a run it holds (one atomic step per run, not per
/// object). The run's slots are not objects: counts stay exact while it is
/// partly used, a collection on another thread hands the run over (its
/// slots go on the free list and are created into next), and shutdown with a
/// partly used run leaks nothing.
#[test]
fn the_owners_run_of_fresh_slots_is_never_counted_or_lost() {
    let drops = Drops::default();
    let mm = quiet_with(1024);
    // Made on this thread, so this thread owns the store's run.
    let first: Vec<Handle<Texture>> = (0..3).map(|id| mm.create(Texture { id, token: drops.token() })).collect();
    assert_eq!(mm.count::<Texture>(), 3);
    assert_eq!(mm.report().get("Texture").unwrap().live, 3);

    // Another thread creates meanwhile: its slots never collide with the run's.
    let mm = std::sync::Arc::new(mm);
    let worker = {
        let mm = std::sync::Arc::clone(&mm);
        let drops = drops.clone();
        std::thread::spawn(move || {
            (10..20).map(|id| mm.create(Texture { id, token: drops.token() })).collect::<Vec<_>>()
        })
    };
    let more: Vec<Handle<Texture>> = (3..10).map(|id| mm.create(Texture { id, token: drops.token() })).collect();
    let theirs = worker.join().unwrap();
    let keys: HashSet<_> = first.iter().chain(&more).chain(&theirs).map(Handle::key).collect();
    assert_eq!(keys.len(), 20, "every object has a slot of its own");
    assert_eq!(mm.count::<Texture>(), 20);
    let ids: Vec<usize> = first.iter().chain(&more).chain(&theirs).map(|h| mm[h].id).collect();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
    let report = mm.report();
    let textures = report.get("Texture").unwrap();
    assert_eq!((textures.live, textures.created), (20, 20));

    // A collection on another thread takes the run over: what is left of it
    // goes on the free list, and the next objects made there reuse it.
    let mm = std::sync::Arc::try_unwrap(mm).expect("the worker is done");
    // The worker's slots lie past the run's (taken from the store's end).
    let past_the_run = theirs.iter().map(|h| h.key().index()).min().unwrap();
    drop(first);
    let (mm, collected) = std::thread::spawn({
        let drops = drops.clone();
        move || {
            let mut mm = mm;
            let collected = mm.collect_garbage().objects;
            let reused: Vec<_> = (0..5).map(|id| mm.create(Texture { id: 100 + id, token: drops.token() })).collect();
            assert_eq!(mm.count::<Texture>(), 17 + 5);
            assert!(reused.iter().all(|h| h.key().index() < past_the_run), "the released run is reused first");
            drop(reused);
            (mm, collected)
        }
    })
    .join()
    .unwrap();
    assert_eq!(collected, 3);
    assert_eq!(mm.count::<Texture>(), 17);
    assert_eq!(mm.dead_count(), 5);

    drop((more, theirs));
    let mut mm = mm;
    assert_eq!(mm.collect_garbage().objects, 22);
    assert_eq!(mm.count::<Texture>(), 0);
    let report = mm.shutdown();
    assert!(report.is_empty(), "{report}");
    assert_eq!(drops.count(), 25);

    // Shutdown while the owner's run is partly used: its slots are accounted
    // for, so the segments are freed, not kept for outliving handles.
    let mm = quiet_with(1024);
    let kept = mm.create(Texture { id: 300, token: drops.token() });
    drop(mm.create(Texture { id: 301, token: drops.token() }));
    assert_eq!((mm.count::<Texture>(), mm.dead_count()), (1, 1));
    drop(kept);
    let report = mm.shutdown();
    assert!(report.is_empty(), "{report}");
    assert_eq!((report.outliving_handles(), report.leaked_bytes()), (0, 0));
    assert_eq!(drops.count(), 27);
}

/// A collection keeps the slots it freed for the owner thread (the one that
/// collects): the owner's next creates reuse exactly those slots, another
/// thread's creates do not see them until the next collection, which puts
/// what the owner left on the shared free list. Counts stay exact while
/// slots are kept, a thread that only creates never makes the store grow
/// without bound, and shutdown with kept slots frees everything.
#[test]
fn a_collection_keeps_the_slots_it_freed_for_the_owner_until_the_next() {
    let drops = Drops::default();
    // Creates textures `ids` on another thread and returns their slots.
    let create_elsewhere = |mm: &mmobject::ObjectManager, ids: std::ops::Range<usize>| {
        std::thread::scope(|scope| {
            scope.spawn(|| ids.map(|id| mm.create(Texture { id, token: drops.token() })).collect::<Vec<_>>()).join()
        })
        .unwrap()
    };
    let indices = |handles: &[Handle<Texture>]| handles.iter().map(|h| h.key().index()).collect::<HashSet<_>>();
    let mut mm = quiet_with(1024);
    let mut held: Vec<Handle<Texture>> = (0..8).map(|id| mm.create(Texture { id, token: drops.token() })).collect();
    let released: Vec<Handle<Texture>> = held.drain(4..).collect();
    let freed = indices(&released);
    let stale: Vec<WeakHandle<Texture>> = released.iter().map(Handle::downgrade).collect();
    drop(released);
    assert_eq!(mm.collect_garbage().objects, 4);
    assert_eq!((mm.count::<Texture>(), mm.report().get("Texture").unwrap().live), (4, 4));

    // Another thread's creates take other slots: the freed ones are kept.
    let theirs = create_elsewhere(&mm, 10..14);
    assert!(indices(&theirs).is_disjoint(&freed), "kept for the owner");
    // The owner's creates reuse exactly the freed slots.
    let mine: Vec<Handle<Texture>> = (20..24).map(|id| mm.create(Texture { id, token: drops.token() })).collect();
    assert_eq!(indices(&mine), freed);
    assert!(stale.iter().all(|&w| mm.get_weak(w).is_none()), "a reused slot never answers a stale handle");
    assert_eq!(mm.count::<Texture>(), 12);
    let report = mm.report();
    let textures = report.get("Texture").unwrap();
    assert_eq!((textures.live, textures.created, textures.destroyed), (12, 16, 4));

    // Freed again and kept; the next collection frees nothing and hands
    // them to everyone: another thread's creates reuse them.
    drop(mine);
    assert_eq!(mm.collect_garbage().objects, 4);
    assert_eq!(mm.collect_garbage().objects, 0);
    let reused = create_elsewhere(&mm, 30..34);
    assert_eq!(indices(&reused), freed);
    drop((held, theirs, reused));
    assert_eq!(mm.collect_garbage().objects, 12);

    // Frames where only another thread creates: what the owner does not use
    // goes back to everyone one collection later, so after two frames the
    // worker only reuses slots and the store stops growing.
    let mut first_two = 0;
    for frame in 0..40 {
        let top = *indices(&create_elsewhere(&mm, 0..16)).iter().max().unwrap();
        if frame < 2 {
            first_two = first_two.max(top);
        } else {
            assert!(top <= first_two, "frame {frame}: the store grew to index {top}, past {first_two}");
        }
        assert_eq!(mm.collect_garbage().objects, 16);
    }

    // Shutdown with kept slots: every slot is accounted for.
    let kept = mm.create(Texture { id: 99, token: drops.token() });
    drop(kept);
    assert_eq!(mm.collect_garbage().objects, 1);
    let report = mm.shutdown();
    assert!(report.is_empty(), "{report}");
    assert_eq!((report.outliving_handles(), report.leaked_bytes()), (0, 0));
    assert_eq!(drops.count(), 8 + 4 + 4 + 4 + 40 * 16 + 1);
}

/// A thread's last drops wait in a ring of its own until something drains
/// it. The owner's `collect_garbage` drains every thread's ring, so a worker
/// that is still running (here: blocked) has its drops collected, including
/// those past the ring's capacity that it drained itself.
#[test]
fn a_running_threads_last_drops_are_collected_by_the_owner() {
    let n = if cfg!(miri) { 20 } else { 300 };
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    let handles: Vec<Handle<Texture>> = (0..n).map(|id| mm.create(Texture { id, token: drops.token() })).collect();
    let (dropped, wait) = std::sync::mpsc::channel();
    let (release, go) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        drop(handles);
        dropped.send(()).unwrap();
        go.recv().unwrap();
    });
    wait.recv().unwrap();
    assert_eq!(mm.collect_garbage().objects, n, "every drop is listed, none twice");
    assert_eq!(drops.count(), n);
    release.send(()).unwrap();
    worker.join().unwrap();
    assert_eq!(mm.collect_garbage().objects, 0, "the worker's exit lists nothing again");
}

/// One thread's ring holds the last drops of two managers, interleaved:
/// each slot reaches its own store's dead list, whichever manager drains.
#[test]
fn last_drops_of_two_managers_share_a_ring() {
    let n = if cfg!(miri) { 6 } else { 200 };
    let drops = Drops::default();
    let mut a = quiet_with(2);
    let mut b = quiet_with(2);
    let mut handles = Vec::new();
    for id in 0..n {
        handles.push(a.create(Texture { id, token: drops.token() }));
        handles.push(b.create(Texture { id, token: drops.token() }));
    }
    drop(handles);
    assert_eq!(a.collect_garbage().objects, n);
    assert_eq!((a.dead_count(), b.dead_count()), (0, n));
    assert_eq!(b.collect_garbage().objects, n);
    assert_eq!(drops.count(), 2 * n);
    assert!(a.shutdown().is_empty() && b.shutdown().is_empty());
}

thread_local! {
    /// Handles a worker keeps in a thread-local cache, as engines do, dropped
    /// by the thread-local destructors when the worker exits.
    static CACHED: std::cell::RefCell<Vec<Handle<Texture>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// A worker's thread-local cache of handles goes at its exit, before or
/// after the thread's own ring of last drops (thread-local destructors run
/// in reverse order of first use): every last drop reaches the dead list,
/// through the ring or (once the ring is gone) straight, and the next
/// collection destroys each object once.
#[test]
fn handles_in_a_workers_thread_local_are_collected_after_it_exits() {
    let n = if cfg!(miri) { 6 } else { 300 };
    for ring_first in [false, true] {
        let drops = Drops::default();
        let mut mm = quiet_with(2);
        let handles: Vec<Handle<Texture>> = (0..n).map(|id| mm.create(Texture { id, token: drops.token() })).collect();
        let early = mm.create(Texture { id: n, token: drops.token() });
        std::thread::spawn(move || {
            if ring_first {
                // A last drop makes the thread's ring before the cache exists,
                // so the cache's destructor runs first, into the live ring.
                drop(early);
                CACHED.with(|cache| cache.borrow_mut().extend(handles));
            } else {
                // The cache first: its destructor runs after the ring's, so
                // these last drops find the ring gone.
                CACHED.with(|cache| cache.borrow_mut().extend(handles));
                drop(early);
            }
        })
        .join()
        .unwrap();
        assert_eq!(mm.collect_garbage().objects, n + 1, "ring first: {ring_first}");
        assert_eq!(drops.count(), n + 1);
        assert_eq!(mm.collect_garbage().objects, 0, "each listed once");
        assert!(mm.shutdown().is_empty());
    }
}

/// A ring's last drops in runs of neighbours, each run broken by a slot from
/// elsewhere: a run follows its first slot onto one dead lane, a stray moves
/// to the next, and every slot reaches the dead list once.
#[test]
fn runs_of_neighbouring_last_drops_broken_by_strays_are_all_listed() {
    let n = if cfg!(miri) { 24 } else { 600 };
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    let mut handles: Vec<Option<Handle<Texture>>> =
        (0..n).map(|id| Some(mm.create(Texture { id, token: drops.token() }))).collect();
    let mut order = Vec::new();
    for (run, start) in (0..n / 2).step_by(5).enumerate() {
        order.extend(start..(start + 5).min(n / 2));
        order.push(n - 1 - run);
    }
    let rest: Vec<usize> = (0..n).filter(|i| !order.contains(i)).collect();
    order.extend(rest);
    for i in order {
        drop(handles[i].take().expect("each dropped once"));
    }
    assert_eq!(mm.dead_count(), n, "every last drop is listed");
    assert_eq!(mm.collect_garbage().objects, n);
    assert_eq!(drops.count(), n);
    assert!(mm.shutdown().is_empty());
}

/// A plain object, for the tests of runs of last drops below.
#[derive(MMObject)]
struct Particle {
    id: usize,
}

/// A run of last drops left open while more of its slots drop after a
/// drain (here `dead_count`'s): the drain takes what the run held and keeps
/// it open, the later drops join it, and every slot is listed once.
#[test]
fn a_run_of_last_drops_goes_on_after_a_drain() {
    let n = if cfg!(miri) { 12 } else { 300 };
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    let mut handles: Vec<Handle<Texture>> = (0..n).map(|id| mm.create(Texture { id, token: drops.token() })).collect();
    let later = handles.split_off(n / 3);
    drop(handles);
    assert_eq!(mm.dead_count(), n / 3, "the run so far is listed");
    drop(later);
    assert_eq!(mm.dead_count(), n, "the rest of the run is listed too");
    assert_eq!(mm.collect_garbage().objects, n);
    assert_eq!(drops.count(), n);
    assert!(mm.shutdown().is_empty());
}

/// A level's unload in index order over more than one chunk and segment
/// (natively, a segment of several 4 MiB chunks): a run of neighbours in the
/// ring ends where the next slot does not follow in memory, and every slot
/// is listed once.
#[test]
fn an_unload_in_index_order_across_chunks_and_segments_lists_every_slot() {
    let n = if cfg!(miri) { 40 } else { 150_000 };
    let mut mm = quiet_with(if cfg!(miri) { 2 } else { 1 << 16 });
    let handles: Vec<Handle<Particle>> = (0..n).map(|id| mm.create(Particle { id })).collect();
    drop(handles);
    assert_eq!(mm.dead_count(), n);
    assert_eq!(mm.collect_garbage().objects, n);
    assert_eq!(mm.len(), 0);
    assert!(mm.shutdown().is_empty());
}

/// A store allocator that hands out one block whenever it is free, so that
/// the segments of managers made one after another land at one address.
#[derive(Clone, Default)]
struct OneBlock(Arc<Mutex<OneBlockState>>);

#[derive(Default)]
struct OneBlockState {
    block: Option<NonNull<u8>>,
    in_use: bool,
    handed_out: usize,
}

// SAFETY: the pointer is a block of `System`'s, owned by no thread; only
// the mutex around the state reaches it.
unsafe impl Send for OneBlockState {}

const ONE_BLOCK: Layout = match Layout::from_size_align(8 << 20, 8 << 20) {
    Ok(layout) => layout,
    Err(_) => panic!("a valid layout"),
};

// SAFETY: the block is handed out to one allocation at a time and is large
// and aligned enough for it (asserted); anything else comes from `System`.
unsafe impl Allocator for OneBlock {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let mut state = self.0.lock().unwrap();
        if state.in_use || layout.size() > ONE_BLOCK.size() || layout.align() > ONE_BLOCK.align() {
            return System.allocate(layout);
        }
        let block = match state.block {
            Some(block) => block,
            None => *state.block.insert(System.allocate(ONE_BLOCK)?.cast()),
        };
        state.in_use = true;
        state.handed_out += 1;
        Ok(NonNull::slice_from_raw_parts(block, layout.size()))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        let mut state = self.0.lock().unwrap();
        if state.block == Some(ptr) {
            state.in_use = false;
        } else {
            // SAFETY: not the block, so it came from `System` with this layout.
            unsafe { System.deallocate(ptr, layout) }
        }
    }
}

/// A run of last drops ends with its store: after a manager whose last
/// drop left this thread's ring expecting the slot after it is gone, a
/// slot of the next manager's store at that very address starts its own
/// entry, and is listed in its own store (continuing the old run would list
/// it in the freed store's dead list).
#[test]
fn a_run_of_last_drops_ends_with_its_store() {
    let block = OneBlock::default();
    let build = || ObjectManager::builder().report_leaks(false).segment_base(2).allocator(block.clone()).build();
    let first = build();
    drop(first.create(Particle { id: 0 }));
    drop(first);
    let mut second = build();
    let keep = second.create(Particle { id: 1 });
    let next = second.create(Particle { id: 2 });
    assert_eq!(block.0.lock().unwrap().handed_out, 2, "both managers' first segments took the block");
    drop(next);
    assert_eq!(second.dead_count(), 1, "the drop is listed in its own store");
    assert_eq!(second.collect_garbage().objects, 1);
    drop(keep);
    assert_eq!(second.collect_garbage().objects, 1);
    assert!(second.shutdown().is_empty());
    let state = block.0.lock().unwrap();
    assert!(!state.in_use);
    // SAFETY: allocated from `System` with `ONE_BLOCK`, and no longer in use.
    unsafe { System.deallocate(state.block.expect("handed out"), ONE_BLOCK) };
}

/// An object whose drop has another thread release an object and waits
/// until it has.
#[derive(MMObject)]
struct Messenger {
    #[mm(skip)]
    ask: Mutex<std::sync::mpsc::SyncSender<()>>,
    #[mm(skip)]
    done: Mutex<std::sync::mpsc::Receiver<()>>,
}

impl Drop for Messenger {
    fn drop(&mut self) {
        self.ask.lock().unwrap().send(()).unwrap();
        self.done.lock().unwrap().recv().unwrap();
    }
}

/// A collection destroys what was dead when it began and what its own
/// destruction releases (cascades), not what other threads release while it
/// runs: that waits for the next call. (It used to take another round for
/// those, so a collection racing threads that release all the time went on
/// for as long as they did.)
#[test]
fn a_collection_leaves_what_other_threads_release_meanwhile_to_the_next() {
    let drops = Drops::default();
    let mut mm = quiet_with(2);
    let theirs = mm.create(Texture { id: 1, token: drops.token() });
    let (ask, asked) = std::sync::mpsc::sync_channel(1);
    let (done, finished) = std::sync::mpsc::sync_channel(1);
    let worker = std::thread::spawn(move || {
        asked.recv().unwrap();
        drop(theirs);
        done.send(()).unwrap();
        // The thread lives on: its drop waits in its ring until a drain.
        asked.recv().unwrap_err();
    });
    drop(mm.create(Messenger { ask: Mutex::new(ask), done: Mutex::new(finished) }));
    assert_eq!(mm.collect_garbage().objects, 1, "the messenger alone");
    assert_eq!(drops.count(), 0);
    assert_eq!(mm.collect_garbage().objects, 1, "the texture, at the next call");
    assert_eq!(drops.count(), 1);
    worker.join().unwrap();
}
