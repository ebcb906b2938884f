//! A manager with an owner thread (`ObjectManagerBuilder::owner_thread`):
//! the owner's clones and drops go through its reservations, other threads'
//! through the atomic word, and collection on the owner decides the objects
//! whose last handle may be gone. Counts stay exact, no object is destroyed
//! while a handle lives, and the rules for other threads hold.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use mmobject::{Handle, MMObject, ObjectManager};

mod support;
use support::{DropToken, Drops};

#[derive(MMObject)]
struct Entity {
    id: usize,
    token: DropToken,
}

/// An object that records its own destruction, so a thread holding a handle
/// can check that it is still alive.
#[derive(MMObject)]
struct Watched {
    id: usize,
    destroyed: Arc<Vec<AtomicBool>>,
}

impl Drop for Watched {
    fn drop(&mut self) {
        assert!(!self.destroyed[self.id].swap(true, Ordering::SeqCst), "destroyed twice");
    }
}

fn owned() -> ObjectManager {
    ObjectManager::builder().report_leaks(false).segment_base(4).owner_thread(true).build()
}

#[test]
fn the_owners_clones_and_drops_keep_exact_counts() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let weak = e.downgrade();
    let mut copies: Vec<Handle<Entity>> = Vec::new();
    for n in 1..=100 {
        copies.push(e.clone());
        assert_eq!(e.ref_count(), n + 1);
    }
    for n in (1..=100).rev() {
        copies.pop();
        assert_eq!(e.ref_count(), n);
    }
    assert_eq!(mm.dead_count(), 0);
    assert!(mm.is_alive(weak));
    drop(e);
    assert!(mm.upgrade(weak).is_none(), "the owner sees the last drop at once");
    assert!(!mm.is_alive(weak));
    // Every read by weak handle or key tests `PENDING` on an owned manager.
    assert!(mm.get_weak(weak).is_none() && mm.try_get_weak(weak).is_err());
    assert!(mm.get_by_key::<Entity>(weak.key()).is_none() && mm.try_get_by_key::<Entity>(weak.key()).is_err());
    // The view reads the same (it tests `PENDING` only where a manager has an owner).
    assert!(mm.view::<Entity>().get_weak(weak).is_none() && !mm.view::<Entity>().is_alive(weak));
    assert_eq!((mm.dead_count(), mm.len()), (1, 0));
    assert_eq!(mm.iter::<Entity>().count(), 0);
    assert_eq!(drops.count(), 0, "dead, not destroyed");
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
    assert_eq!(mm.dead_count(), 0);
}

#[test]
fn a_last_drop_on_another_thread_is_found_by_the_owners_collection() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let weak = e.downgrade();
    let sent = e.clone(); // from the owner's reservation
    drop(e);
    std::thread::spawn(move || drop(sent)).join().unwrap();
    // The word now holds only the owner's reservation: dead, decided by the owner.
    assert_eq!(mm.dead_count(), 1);
    assert!(mm.upgrade(weak).is_none(), "the owner reads its own reservation");
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
    assert!(!mm.is_alive(weak));
}

#[test]
fn an_upgrade_on_another_thread_may_keep_a_reserved_object_alive() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Entity { id: 7, token: drops.token() });
    let weak = e.downgrade();
    let sent = e.clone();
    drop(e);
    let mm_ref = &mm;
    let revived = std::thread::scope(|s| {
        s.spawn(move || {
            drop(sent);
            // Not the owner: this thread cannot tell the reservation from a
            // handle, so the object is still live for it until the owner's
            // next collection, and an upgrade keeps it alive.
            mm_ref.upgrade(weak)
        })
        .join()
        .unwrap()
    })
    .expect("another thread may still upgrade until the owner collects");
    assert_eq!(mm.collect_garbage().objects, 0, "the check finds a handle");
    assert_eq!(mm[&revived].id, 7);
    assert_eq!(revived.ref_count(), 1);
    drop(revived);
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
}

#[test]
fn a_collection_on_another_thread_leaves_the_owners_checks_for_the_owner() {
    let drops = Drops::new();
    let mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let other = e.clone();
    drop(other);
    drop(e); // the last, on the owner, with a reservation: a check
    let mm = std::thread::spawn(move || {
        let mut mm = mm;
        assert_eq!(mm.collect_garbage().objects, 0, "not the owner: the check waits");
        assert_eq!(mm.dead_count(), 1);
        mm
    })
    .join()
    .unwrap();
    let mut mm = mm;
    assert_eq!(mm.collect_garbage().objects, 1, "back on the owner");
    assert_eq!(drops.count(), 1);
    let report = mm.shutdown();
    assert!(report.is_empty());
    assert_eq!(report.outliving_handles(), 0);
}

#[test]
fn shutdown_on_another_thread_keeps_the_memory_of_reserved_objects() {
    let drops = Drops::new();
    let mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    drop(e.clone());
    drop(e);
    let report = std::thread::spawn(move || mm.shutdown()).join().unwrap();
    assert_eq!(drops.count(), 1, "destroyed at shutdown");
    // The owner's reservation cannot be read from there: the slot may still
    // be held, so its memory is kept (safe, and said in the report).
    assert_eq!(report.outliving_handles(), 1);
    assert_eq!(report.owner_reserved(), 1, "the report says why");
    let text = report.to_string();
    assert!(text.contains("(1 perhaps only by the owner thread's reserved counts)"), "{text}");
}

#[test]
fn a_handle_outliving_a_shutdown_elsewhere_is_not_blamed_on_the_owner() {
    let mm = owned();
    let e = mm.create(Entity { id: 1, token: Drops::new().token() });
    let report = std::thread::spawn(move || mm.shutdown()).join().unwrap();
    assert_eq!((report.outliving_handles(), report.owner_reserved()), (1, 0));
    drop(e);
}

#[test]
fn raw_handles_release_through_the_owner_or_another_thread() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let raw = e.clone().into_raw();
    mm.add_ref_raw(raw).unwrap();
    assert_eq!(e.ref_count(), 3);
    mm.release_raw(raw).unwrap();
    assert_eq!(e.ref_count(), 2);
    drop(e);
    let mm_ref = &mm;
    std::thread::scope(|s| s.spawn(move || mm_ref.release_raw(raw).unwrap()).join().unwrap());
    assert!(mm.release_raw(raw).is_err(), "given back once");
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
}

#[test]
fn a_full_reservation_gives_counts_back_and_stays_exact() {
    let mut mm = owned();
    let drops = Drops::new();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let workers: Vec<Handle<Entity>> = (0..50).map(|_| e.clone()).collect();
    let held_elsewhere = std::thread::spawn(move || workers).join().unwrap();
    assert_eq!(e.ref_count(), 51);
    // The owner drops what came back: its reservation fills and gives counts back.
    drop(held_elsewhere);
    assert_eq!(e.ref_count(), 1);
    let weak = e.downgrade();
    drop(e);
    assert!(mm.upgrade(weak).is_none());
    assert_eq!(mm.collect_garbage().objects, 1);
}

#[test]
#[should_panic(expected = "reference count overflow")]
fn an_owner_clone_past_the_limit_panics() {
    let mm = owned();
    let e = mm.create(Entity { id: 1, token: Drops::new().token() });
    e.leak_refs_for_tests((1 << 29) - 4);
    // No room for a batch: the clones count one at a time up to the limit.
    let clones: Vec<Handle<Entity>> = (0..3).map(|_| e.clone()).collect();
    assert_eq!(e.ref_count(), 1 << 29);
    let _past = e.clone();
    drop(clones);
}

#[test]
fn handles_dropped_after_the_manager_stay_sound() {
    let drops = Drops::new();
    let mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let owners_copy = e.clone();
    let sent = e.clone();
    drop(mm);
    let worker = std::thread::spawn(move || drop(sent));
    worker.join().unwrap();
    drop(owners_copy);
    drop(e);
    assert_eq!(drops.count(), 1, "destroyed at shutdown, in place");
}

/// The owner and three workers clone and drop handles to a shared set while
/// the owner releases its own and collects: no object is ever destroyed
/// while a thread holds a handle to it, and each is destroyed exactly once.
#[test]
fn no_object_dies_while_any_thread_holds_it() {
    let (objects, rounds, ops) = if cfg!(miri) { (6, 2, 30) } else { (64, 20, 3_000) };
    let destroyed: Arc<Vec<AtomicBool>> = Arc::new((0..objects * rounds).map(|_| AtomicBool::new(false)).collect());
    let mut mm = owned();
    for round in 0..rounds {
        let set: Vec<(usize, Handle<Watched>)> = (0..objects)
            .map(|i| {
                let id = round * objects + i;
                (id, mm.create(Watched { id, destroyed: Arc::clone(&destroyed) }))
            })
            .collect();
        // The owner clones first, so its reservations are in play.
        let mut owners: Vec<(usize, Handle<Watched>)> = set.iter().map(|(id, h)| (*id, h.clone())).collect();
        let shares: Vec<Vec<(usize, Handle<Watched>)>> =
            (0..3).map(|_| set.iter().map(|(id, h)| (*id, h.clone())).collect()).collect();
        drop(set);
        std::thread::scope(|s| {
            for (worker, mine) in shares.into_iter().enumerate() {
                let destroyed = Arc::clone(&destroyed);
                s.spawn(move || {
                    let mut mine = mine;
                    let mut held: Vec<(usize, Handle<Watched>)> = Vec::new();
                    for n in 0..ops {
                        if mine.is_empty() && held.is_empty() {
                            break;
                        }
                        if !mine.is_empty() {
                            let (id, h) = &mine[(n * 7 + worker) % mine.len()];
                            held.push((*id, h.clone()));
                        }
                        if held.len() > 4 || mine.is_empty() {
                            held.swap_remove(n % held.len());
                        }
                        if n % 5 == worker && !mine.is_empty() {
                            mine.swap_remove(n % mine.len());
                        }
                        for (id, _) in mine.iter().chain(&held) {
                            assert!(!destroyed[*id].load(Ordering::SeqCst), "destroyed while held");
                        }
                    }
                });
            }
            for n in 0..ops {
                if n % 10 == 0 {
                    mm.collect_garbage();
                }
                if owners.is_empty() {
                    continue;
                }
                let at = n % owners.len();
                let copy = owners[at].1.clone();
                if n % 3 == 0 {
                    owners.swap_remove(at);
                }
                for (id, _) in &owners {
                    assert!(!destroyed[*id].load(Ordering::SeqCst), "destroyed while the owner holds it");
                }
                drop(copy);
            }
        });
        drop(owners);
        mm.collect_garbage();
        assert_eq!(mm.len(), 0, "round {round}: everything released is collected");
    }
    assert!(destroyed.iter().all(|d| d.load(Ordering::SeqCst)), "each destroyed once");
}

/// An owned manager with two entities: `kept` (returned), and one whose last
/// handle went on another thread while the owner held counts on it.
fn one_kept_one_released_elsewhere(drops: &Drops) -> (ObjectManager, Handle<Entity>) {
    let mm = ObjectManager::builder().owner_thread(true).report_leaks(false).build();
    let kept = mm.create(Entity { id: 1, token: drops.token() });
    let gone = mm.create(Entity { id: 2, token: drops.token() });
    let copy = gone.clone(); // the owner now holds counts on it
    drop(gone);
    std::thread::spawn(move || drop(copy)).join().unwrap();
    (mm, kept)
}

/// On the owner thread, an object whose last handle went on another thread while the
/// owner held counts on it is dead for the counts (`count`, `dead_count`) until the next
/// collection destroys it; the iterators agree and skip it, so `len` matches what they
/// yield.
#[test]
fn iterators_agree_with_the_counts_on_the_owner_thread() {
    let drops = Drops::new();
    let (mut mm, kept) = one_kept_one_released_elsewhere(&drops);
    assert_eq!((mm.count::<Entity>(), mm.dead_count()), (1, 1));
    let iter = mm.iter::<Entity>();
    assert_eq!(iter.len(), 1);
    let seen: Vec<usize> = iter.map(|(_, entity)| entity.id).collect();
    assert_eq!(seen, [1]);
    assert_eq!(mm.iter_mut::<Entity>().count(), 1);
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(mm.iter::<Entity>().map(|(_, entity)| entity.id).collect::<Vec<_>>(), [1]);
    drop(kept);
}

/// An object that holds itself (a garbage cycle at shutdown) and a handle to an entity.
#[derive(MMObject)]
struct Holder {
    me: Option<Handle<Holder>>,
    entity: Handle<Entity>,
}

/// Shutdown on the owner thread destroys the objects still alive in place;
/// the last handle to an entity the owner held counts on then goes in a
/// `Drop` there, and its check is decided like any other: the entity's
/// memory is freed, and the report names no outliving handle.
#[test]
fn shutdown_on_the_owner_decides_checks_of_objects_destroyed_in_place() {
    let drops = Drops::new();
    let mm = owned();
    let entity = mm.create(Entity { id: 1, token: drops.token() });
    // The owner now holds counts on the entity: its last drop queues a check.
    let holder = mm.create(Holder { me: None, entity: entity.clone() });
    drop(entity);
    let mut mm = mm;
    mm[&holder].me = Some(holder.clone());
    drop(holder); // a garbage cycle: alive at shutdown
    let report = mm.shutdown();
    assert_eq!(drops.count(), 1, "destroyed at shutdown");
    assert_eq!(report.len(), 2, "the holder and the entity it held were leaked");
    assert_eq!(report.outliving_handles(), 0, "no handle outlives the manager");
    assert_eq!(report.leaked_bytes(), 0);
}

/// On another thread than the owner, an object whose last handle went while
/// the owner held counts on it is still live for weak reads and iterators
/// (only the owner reads its reservation): `len` counts it too, so it
/// matches what the iterator yields.
#[test]
fn iterators_on_another_thread_count_what_they_yield() {
    let drops = Drops::new();
    let (mut mm, kept) = one_kept_one_released_elsewhere(&drops);
    std::thread::scope(|s| {
        s.spawn(|| {
            let iter = mm.iter::<Entity>();
            let len = iter.len();
            let seen: Vec<usize> = iter.map(|(_, entity)| entity.id).collect();
            assert_eq!(seen, [1, 2], "live for other threads until the owner's collection");
            assert_eq!(len, seen.len(), "len counts what the iterator yields");
            let mut iter = mm.view::<Entity>().iter();
            assert_eq!(iter.size_hint(), (2, Some(2)));
            iter.next();
            assert_eq!(iter.len(), 1);
        });
    });
    assert_eq!(mm.collect_garbage().objects, 1);
    drop(kept);
}

/// The manager moves to another thread and shuts down there while its owner
/// thread still clones and drops handles through its reservations (`Send`
/// allows it). Shutdown there cannot read the reservations, so it keeps the
/// memory of every slot whose word holds a count: the owner's later clones
/// and drops, and the checks they queue, touch memory that stays allocated,
/// and every value is dropped exactly once (Miri checks the accesses).
#[test]
fn shutdown_on_another_thread_while_the_owner_counts() {
    let drops = Drops::new();
    let mm = owned();
    let n = if cfg!(miri) { 4 } else { 64 };
    let handles: Vec<Handle<Entity>> = (0..n).map(|id| mm.create(Entity { id, token: drops.token() })).collect();
    // Reservations on half of them, and a last owner drop on a quarter (checks queued).
    for h in handles.iter().step_by(2) {
        drop(h.clone());
    }
    let mut handles: Vec<Option<Handle<Entity>>> = handles.into_iter().map(Some).collect();
    for h in handles.iter_mut().step_by(4) {
        drop(h.take());
    }
    let started = Arc::new(AtomicBool::new(false));
    let shutdown = {
        let started = Arc::clone(&started);
        std::thread::spawn(move || {
            started.store(true, Ordering::SeqCst);
            mm.shutdown()
        })
    };
    // Counting from before the shutdown starts until after it has finished.
    let mut round = 0;
    while !started.load(Ordering::SeqCst) || !shutdown.is_finished() {
        if let Some(h) = &handles[round % n] {
            let copies = [h.clone(), h.clone()];
            drop(copies);
        }
        round += 1;
    }
    let report = shutdown.join().unwrap();
    assert_eq!(drops.count(), n, "shutdown destroyed every value once");
    assert!(report.outliving_handles() > 0, "the slots the owner counts on stay allocated");
    drop(handles);
    assert_eq!(drops.count(), n, "no value is dropped again");
}

/// As above, for objects that also have a raw reference: shutdown on another
/// thread frees the slot of an object held only by raw references, so it must
/// not take the owner's handles for raw ones. Its look at the word and its
/// look at the reservation could straddle the owner's drop that gives a full
/// reservation back (nine counts leave the word, then the reservation falls
/// from 16 to 8), or its clone that takes a batch (eight counts join the
/// word, then seven are reserved): the difference was the raw count alone,
/// and the store was freed under the owner's handles. Each object races one
/// of the two (under Miri, whose weak memory also serves the stale look; the
/// loom models `shutdown_on_another_thread_races_the_owners_*` try every
/// interleaving).
#[test]
fn shutdown_on_another_thread_keeps_raw_referenced_objects_the_owner_counts_on() {
    let (rounds, objects) = if cfg!(miri) { (4, 8) } else { (100, 16) };
    for round in 0..rounds {
        let drops = Drops::new();
        let mm = owned();
        let mut held: Vec<Vec<Handle<Entity>>> = (0..objects)
            .map(|id| {
                let h = mm.create(Entity { id, token: drops.token() });
                if id % 2 == 0 {
                    // An `upgrade` with no reservation counts in the word: two counts, one raw.
                    let _raw = mm.upgrade(h.downgrade()).expect("alive").into_raw();
                    // Three batches of 8: 24 handles, one count reserved;
                    // fifteen drops fill the reservation (16), nine handles are left.
                    let mut handles: Vec<_> = (0..23).map(|_| h.clone()).collect();
                    handles.push(h);
                    handles.drain(..15);
                    handles
                } else {
                    // Eight counts in the word, one of them raw, nothing reserved.
                    let mut handles: Vec<_> = (0..7).map(|_| mm.upgrade(h.downgrade()).expect("alive")).collect();
                    let _raw = handles.pop().expect("seven").into_raw();
                    handles.push(h);
                    handles
                }
            })
            .collect();
        let shutdown = std::thread::spawn(move || mm.shutdown());
        for (id, handles) in held.iter_mut().enumerate() {
            if id % 2 == 0 {
                drop(handles.pop()); // gives nine counts back
            } else {
                handles.push(handles[0].clone()); // takes a batch
            }
            std::thread::yield_now();
        }
        let report = shutdown.join().unwrap();
        if report.outliving_handles() != objects {
            // A store was freed under these handles: dropping them would be a use after free.
            std::mem::forget(held);
            panic!("round {round}: shutdown freed a store the owner still holds handles into");
        }
        assert_eq!(drops.count(), objects, "shutdown destroyed every value once");
        drop(held);
        assert_eq!(drops.count(), objects, "and never again");
    }
}

/// The last handle of an object the owner holds no reservation on, after a
/// drop on another thread left one count (which, for all that thread knew,
/// could have been a reservation).
fn dropped_elsewhere_without_reservation(mm: &ObjectManager, drops: &Drops) -> Handle<Entity> {
    let e = mm.create(Entity { id: 1, token: drops.token() });
    // Cloned on another thread: the owner holds no reservation on it.
    let (e, other) = support::cloned_elsewhere(e);
    std::thread::spawn(move || drop(other)).join().unwrap();
    e
}

/// An object the owner holds no reservation on, whose last two handles go on
/// other threads (or the last on the owner): the last drop takes the count to
/// zero, so a collection or a shutdown on any thread reclaims the object.
/// (Under the remote drops' compare-exchange of earlier versions, the first
/// drop flagged a check and the last left the object to it: a manager moved
/// off its owner thread then never reclaimed it, and its shutdown there
/// reported a handle outliving it and leaked the store's memory.)
#[test]
fn an_object_without_reservation_dropped_elsewhere_is_collected_on_any_thread() {
    for owner_drops_last in [false, true] {
        let drops = Drops::new();
        let mm = owned();
        let e = dropped_elsewhere_without_reservation(&mm, &drops);
        if owner_drops_last {
            drop(e); // no reservation: takes the last count
        } else {
            std::thread::spawn(move || drop(e)).join().unwrap();
        }
        assert_eq!(mm.len(), 0);
        let (destroyed, report) = std::thread::spawn(move || {
            let mut mm = mm;
            assert_eq!(mm.dead_count(), 1);
            assert_eq!(mm.collect_garbage().objects, 1, "no count is left: dead on any thread");
            assert_eq!(mm.dead_count(), 0);
            let e2 = mm.create(Entity { id: 2, token: drops.token() });
            drop(e2.clone());
            drop(e2);
            let report = mm.shutdown();
            (drops.count(), report)
        })
        .join()
        .unwrap();
        assert_eq!(destroyed, 2);
        assert_eq!(report.outliving_handles(), 0, "nothing outlives the manager");
    }
}

/// The same object left to shutdown on another thread than the owner: no
/// count is left, so its memory is freed, not leaked.
#[test]
fn shutdown_elsewhere_frees_an_object_dropped_elsewhere() {
    let drops = Drops::new();
    let mm = owned();
    let e = dropped_elsewhere_without_reservation(&mm, &drops);
    drop(e);
    let report = std::thread::spawn(move || mm.shutdown()).join().unwrap();
    assert_eq!(drops.count(), 1);
    assert_eq!(report.outliving_handles(), 0);
    assert_eq!(report.leaked_bytes(), 0);
}

/// A lease lasts until the first owner collection that finds the owner did
/// not count on it since the previous one: after it, the owner holds no
/// counts on the objects it cloned, so their last handles, dropped on other
/// threads, are last drops, and a manager moved off its owner thread
/// reclaims them (before leases, a reservation lasted as long as the
/// object, and only the owner's collection could end such objects).
#[test]
fn the_owners_collection_ends_its_leases() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let copies: Vec<_> = (0..20).map(|_| e.clone()).collect(); // leases on the owner
    assert_eq!(e.ref_count(), 21);
    assert_eq!(mm.collect_garbage().objects, 0, "used this frame: the lease is renewed");
    assert_eq!(e.ref_count(), 21, "counts stay exact across the renewal");
    assert_eq!(mm.collect_garbage().objects, 0, "unused since: the give-back leaves the handles' counts");
    assert_eq!(e.ref_count(), 21, "counts stay exact across the give-back");
    let (destroyed, report) = std::thread::spawn(move || {
        drop(copies);
        drop(e);
        let mut mm = mm;
        assert_eq!(mm.len(), 0);
        let destroyed = mm.collect_garbage().objects;
        (destroyed, mm.shutdown())
    })
    .join()
    .unwrap();
    assert_eq!(destroyed, 1, "reclaimed off the owner thread");
    assert_eq!(drops.count(), 1);
    assert_eq!((report.outliving_handles(), report.leaked_bytes()), (0, 0));
}

/// An object the owner clones in every frame keeps its lease across the
/// owner's collections (no locked operation per frame), and still dies at
/// the first owner collection after its last handle goes, whichever thread
/// dropped it.
#[test]
fn a_lease_used_every_frame_is_renewed_and_its_object_still_dies_on_time() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let f = mm.create(Entity { id: 2, token: drops.token() });
    let kept_elsewhere = e.clone();
    for _ in 0..5 {
        let frame: Vec<_> = [&e, &f].into_iter().cloned().collect();
        assert_eq!((e.ref_count(), f.ref_count()), (3, 2));
        drop(frame);
        assert_eq!(mm.collect_garbage().objects, 0);
        assert_eq!((e.ref_count(), f.ref_count()), (2, 1), "counts stay exact across renewals");
    }
    // The last handle of `e` goes on another thread, after the owner used its lease.
    let frame = e.clone();
    drop(frame);
    std::thread::spawn(move || drop(kept_elsewhere)).join().unwrap();
    drop(e);
    assert_eq!(mm.collect_garbage().objects, 1, "the owner's last drop and another thread's");
    // `f`'s last handle goes on the owner, in a frame in which it was used.
    let frame = f.clone();
    drop((frame, f));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 2);
    assert_eq!(mm.len(), 0);
}

/// An object whose other handles are all on other threads, used by the
/// owner in every frame until those threads drop them: the owner's
/// collection right after finds it dead.
#[test]
fn a_renewed_lease_ends_with_the_last_drop_elsewhere() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Entity { id: 1, token: drops.token() });
    let elsewhere: Vec<_> = (0..3).map(|_| e.clone()).collect();
    drop(e);
    let weak = elsewhere[0].downgrade();
    for _ in 0..3 {
        let frame = mm.upgrade(weak).expect("held elsewhere");
        drop(frame);
        assert_eq!(mm.collect_garbage().objects, 0, "renewed: handles are left");
    }
    let frame = mm.upgrade(weak).expect("held elsewhere");
    drop(frame);
    std::thread::spawn(move || drop(elsewhere)).join().unwrap();
    assert_eq!(mm.collect_garbage().objects, 1, "used this frame, but no handle is left");
    assert_eq!(drops.count(), 1);
    assert!(mm.upgrade(weak).is_none());
}

/// A thread owns the last manager it built with an owner: the handles of
/// one it built before count there as on any other thread (in the word, no
/// reservation), so their last drop elsewhere kills the object at once,
/// while the last manager's object lives on for other threads until its
/// owner's collection.
#[test]
fn a_thread_counts_through_the_reservations_of_the_last_manager_it_built_only() {
    let drops = Drops::new();
    let mut first = owned();
    let mut last = owned();
    let a = first.create(Entity { id: 1, token: drops.token() });
    let b = last.create(Entity { id: 2, token: drops.token() });
    let (weak_a, weak_b) = (a.downgrade(), b.downgrade());
    let sent = (a.clone(), b.clone());
    drop((a, b));
    let (first_ref, last_ref) = (&first, &last);
    let (upgraded_a, upgraded_b) = std::thread::scope(|s| {
        s.spawn(move || {
            drop(sent);
            (first_ref.upgrade(weak_a).is_some(), last_ref.upgrade(weak_b).is_some())
        })
        .join()
        .unwrap()
    });
    assert!(!upgraded_a, "the first manager's last handle went on the word: dead at once");
    assert!(upgraded_b, "the last manager's object is held by its owner's reservation until it collects");
    assert_eq!((first.collect_garbage().objects, last.collect_garbage().objects), (1, 1));
    assert_eq!(drops.count(), 2);
    assert!(!first.is_alive(weak_a) && !last.is_alive(weak_b));
}
