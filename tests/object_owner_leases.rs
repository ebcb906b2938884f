//! The owner thread's leases (`owner_counts.rs`) under attack, from the
//! public API: counts, destroys and reports stay exact, and the check queue
//! stays bounded. Some tests leak store memory on purpose (a shutdown off
//! the owner thread), so Miri runs this binary with leaks ignored.

mod support;

use std::sync::Mutex;

use mmobject::{Handle, MMObject, ObjectManager};
use support::{DropToken, Drops, LiveBytes};

#[derive(MMObject)]
struct Target {
    token: DropToken,
}

/// Holds handles the derive does not see (so its store is not cyclable),
/// and clones and drops them in its `Drop`.
#[derive(MMObject)]
struct Holder {
    #[mm(skip)]
    hidden: Mutex<Vec<Handle<Target>>>,
}

impl Drop for Holder {
    fn drop(&mut self) {
        let hidden = std::mem::take(&mut *self.hidden.lock().unwrap());
        for h in &hidden {
            let clones: Vec<_> = (0..20).map(|_| h.clone()).collect();
            drop(clones);
        }
        drop(hidden);
    }
}

fn owned() -> ObjectManager {
    ObjectManager::builder().report_leaks(false).segment_base(4).owner_thread(true).build()
}

/// Shuts `mm` down, and checks that nothing was left alive or outliving it.
#[track_caller]
fn shuts_down_clean(mm: ObjectManager) {
    let report = mm.shutdown();
    assert!(report.is_empty() && report.outliving_handles() == 0, "{report:?}");
}

/// Two leases on one object in one frame (the first batch spent by clones):
/// two checks, one object.
#[test]
fn two_leases_in_one_frame_count_once() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    let clones: Vec<_> = (0..30).map(|_| e.clone()).collect();
    assert_eq!(e.ref_count(), 31);
    drop(clones);
    assert_eq!(e.ref_count(), 1);
    drop(e);
    assert_eq!((mm.len(), mm.dead_count()), (0, 1));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!((drops.count(), mm.len(), mm.dead_count()), (1, 0, 0));
    shuts_down_clean(mm);
}

/// A `Drop` that clones (a new lease) and drops the last handle of another
/// object during collection: the same call destroys it.
#[test]
fn a_drop_that_leases_during_collection_finishes_the_cascade() {
    let drops = Drops::new();
    let mut mm = owned();
    let t = mm.create(Target { token: drops.token() });
    let holder = mm.create(Holder { hidden: Mutex::new(vec![t]) });
    drop(holder);
    assert_eq!(mm.collect_garbage().objects, 2);
    assert_eq!((drops.count(), mm.len(), mm.dead_count()), (1, 0, 0));
    shuts_down_clean(mm);
}

/// The same at shutdown on the owner: values destroyed in place clone and
/// drop handles (new leases after the collection): no outliving handle, no
/// leak, each value dropped once.
#[test]
fn a_drop_that_leases_during_shutdown_on_the_owner() {
    let drops = Drops::new();
    let mm = owned();
    let t = mm.create(Target { token: drops.token() });
    // A lease before shutdown too.
    let t2 = t.clone();
    // Held by a raw reference only: destroyed in place, and not outliving.
    let _raw = mm.create(Holder { hidden: Mutex::new(vec![t, t2]) }).into_raw();
    let report = mm.shutdown();
    assert_eq!(report.len(), 2, "both still held at shutdown");
    assert_eq!(report.outliving_handles(), 0, "no handle outlives: {report:?}");
    assert_eq!(drops.count(), 1);
}

/// Shutdown on another thread while the owner clones and drops a handle
/// it keeps, and a worker drops its own: no use after free (Miri), each
/// value dropped once; the memory is kept (a reservation is held).
#[test]
fn shutdown_elsewhere_races_owner_and_worker() {
    let drops = Drops::new();
    let mm = owned();
    let kept = mm.create(Target { token: drops.token() });
    let plain = mm.create(Target { token: drops.token() });
    let (plain, remote) = support::cloned_elsewhere(plain);
    let worker_copy = kept.clone();
    let n = if cfg!(miri) { 20 } else { 2000 };
    let shut = std::thread::spawn(move || mm.shutdown());
    let worker = std::thread::spawn(move || {
        for _ in 0..n {
            drop(worker_copy.clone());
        }
        drop((worker_copy, remote));
    });
    for _ in 0..n {
        let c: Vec<_> = (0..9).map(|_| kept.clone()).collect();
        drop(c);
    }
    drop(plain);
    let report = shut.join().unwrap();
    worker.join().unwrap();
    drop(kept);
    assert_eq!(drops.count(), 2, "each value dropped once");
    // Whether the store's memory was kept depends on how the race went.
    drop(report);
}

/// Raw handles across threads: made on the owner from its reservation,
/// released on another thread, taken back on the owner.
#[test]
fn raw_handles_on_and_off_the_owner() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    let c = e.clone(); // lease
    let raw = c.into_raw();
    mm.add_ref_raw(raw).unwrap(); // from the reservation
    assert_eq!(e.ref_count(), 3);
    std::thread::scope(|s| {
        s.spawn(|| mm.release_raw(raw).unwrap());
    });
    assert_eq!(e.ref_count(), 2);
    let back: Handle<Target> = mm.handle_from_raw(raw).unwrap();
    assert!(mm.release_raw(raw).is_err(), "no raw reference left");
    drop(back);
    let w = e.downgrade();
    std::thread::scope(|s| {
        let mm = &mm;
        s.spawn(move || {
            let up = mm.upgrade(w).unwrap();
            drop(up);
        });
    });
    drop(e);
    assert!(mm.upgrade(w).is_none());
    assert_eq!((mm.len(), mm.dead_count()), (0, 1));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
    shuts_down_clean(mm);
}

/// A raw reference left at shutdown on the owner, while the owner held a
/// lease: the raw reference alone does not keep the memory.
#[test]
fn a_raw_reference_and_a_lease_at_shutdown_on_the_owner() {
    let drops = Drops::new();
    let mm = owned();
    let e = mm.create(Target { token: drops.token() });
    let c = e.clone();
    let _raw = c.into_raw();
    drop(e);
    let report = mm.shutdown();
    assert_eq!(report.outliving_handles(), 0, "{report:?}");
    assert_eq!(drops.count(), 1);
}

/// A manager moved to another thread, collected there, moved back: the
/// owner's collection then ends the leases taken meanwhile.
#[test]
fn a_manager_moved_away_and_back() {
    let drops = Drops::new();
    let mm = owned();
    let e = mm.create(Target { token: drops.token() });
    let c = e.clone();
    drop((e, c));
    let mut mm = std::thread::spawn(move || {
        let mut mm = mm;
        assert_eq!(mm.collect_garbage().objects, 0, "not the owner");
        mm
    })
    .join()
    .unwrap();
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
    assert!(mm.shutdown().is_empty());
}

/// The owner clones handles that another thread drops, and collection runs
/// only off the owner (the manager moved): each batch the clones spend used
/// to queue one more check, so the store's check queue grew without bound
/// (2 MB after 200,000 frames of 8 clones). One check per object now.
#[test]
fn the_check_queue_stays_bounded_while_the_owner_never_collects() {
    let counting = LiveBytes::default();
    let drops = Drops::new();
    let mm = ObjectManager::builder().report_leaks(false).owner_thread(true).allocator(counting.clone()).build();
    let e = mm.create(Target { token: drops.token() });
    // A bounded channel: the owner never gets far ahead of the collector,
    // so the live handles stay few (with `handle-sites` each has an entry
    // in the store's allocator, and a backlog of thousands would be counted).
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Handle<Target>>>(4);
    let collector = std::thread::spawn(move || {
        let mut mm = mm;
        for batch in rx {
            drop(batch);
            mm.collect_garbage();
        }
        mm
    });
    let before = counting.bytes();
    let frames = if cfg!(miri) { 10 } else { 20_000 };
    for _ in 0..frames {
        tx.send((0..8).map(|_| e.clone()).collect()).unwrap();
    }
    drop(tx);
    let mm = collector.join().unwrap();
    let grown = counting.bytes() - before;
    // With `handle-sites`, the table of the (at most 48) live handles is
    // sized once: bounded, and far below the old growth (200 KB here).
    let limit = if cfg!(feature = "handle-sites") { 16 * 1024 } else { 1024 };
    assert!(grown < limit, "the store's memory grew by {grown} bytes");
    drop(e);
    drop(mm);
}

/// An object whose lease clones spent (its check still queued) dies on
/// another thread and is collected there: the slot's next object starts
/// with no lease, so the owner's clone of it queues its own check, and the
/// owner's collection reclaims it.
#[test]
fn a_spent_lease_does_not_pass_to_the_slots_next_object() {
    let drops = Drops::new();
    let mm = ObjectManager::builder().report_leaks(false).segment_base(1).owner_thread(true).build();
    let e = mm.create(Target { token: drops.token() });
    let key = e.key();
    let clones: Vec<_> = (0..8).map(|_| e.clone()).collect(); // the batch, spent
    let mm = std::thread::spawn(move || {
        let mut mm = mm;
        drop((e, clones));
        assert_eq!(mm.collect_garbage().objects, 1);
        mm
    })
    .join()
    .unwrap();
    let mut mm = mm;
    // Shares the slot the other thread's collection kept for its creates
    // (its old check names the old generation: it decides nothing).
    assert_eq!(mm.collect_garbage().objects, 0);
    let f = mm.create(Target { token: drops.token() });
    assert_eq!(f.key().index(), key.index(), "the slot is reused");
    let c = f.clone();
    drop((f, c));
    assert_eq!((mm.len(), mm.dead_count()), (0, 1));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 2);
    shuts_down_clean(mm);
}

/// Shuts `mm` down on another thread while `held` is still alive, and says
/// how many outliving objects the owner still held reservations on (its
/// lease, renewed or not).
fn reserved_at_shutdown_elsewhere(mm: ObjectManager, held: Handle<Target>) -> usize {
    let report = std::thread::spawn(move || mm.shutdown()).join().unwrap();
    assert_eq!(report.outliving_handles(), 1);
    drop(held);
    report.owner_reserved()
}

/// A collection that destroys something runs a second round (for the
/// cascades), and each round decided the checks again: a lease the first
/// round renewed (clearing `USED`) looked unused to the second, which gave
/// it back. So renewal held only in frames in which nothing died. The
/// same frames, with and without a death, must leave the same lease.
#[test]
fn a_collection_that_destroys_something_still_renews_used_leases() {
    let mut reserved = Vec::new();
    for dies_each_frame in [false, true] {
        let drops = Drops::new();
        let mut mm = owned();
        let e = mm.create(Target { token: drops.token() });
        for _ in 0..3 {
            drop(e.clone());
            if dies_each_frame {
                drop(mm.create(Target { token: drops.token() }));
            }
            let destroyed = mm.collect_garbage().objects;
            assert_eq!(destroyed, usize::from(dies_each_frame));
            assert_eq!(e.ref_count(), 1);
        }
        reserved.push(reserved_at_shutdown_elsewhere(mm, e));
    }
    assert_eq!(reserved, [1, 1], "the lease used in the last frame is renewed either way");
}

/// The same through `collect_garbage_for`, whose batches of 32 objects
/// each decided the checks: a frame that destroys more than a batch ended
/// every lease the owner used in it.
#[test]
fn a_collection_in_batches_still_renews_used_leases() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    drop(e.clone());
    drop(mm.create_many((0..100).map(|_| Target { token: drops.token() })));
    let stats = mm.collect_garbage_for(std::time::Duration::from_secs(3600));
    assert_eq!(stats.objects, 100);
    assert_eq!(reserved_at_shutdown_elsewhere(mm, e), 1, "used this frame: renewed");
}

/// A cascade through a lease: the `Drop` of an object destroyed in the
/// first round drops the last handle of an object the owner used (and
/// holds a reservation on) in this frame; the later round finds it dead,
/// in the same call.
#[test]
fn a_cascade_through_a_renewed_lease_finishes_in_one_call() {
    let drops = Drops::new();
    let mut mm = owned();
    let t = mm.create(Target { token: drops.token() });
    let holder = mm.create(Holder { hidden: Mutex::new(vec![t.clone()]) });
    drop(t.clone()); // used: a lease
    assert_eq!(mm.collect_garbage().objects, 0);
    drop(t.clone()); // used again: renewed at the next collection
    drop(t);
    drop(holder);
    assert_eq!(mm.collect_garbage().objects, 2, "the holder, then its target");
    assert_eq!((drops.count(), mm.len(), mm.dead_count()), (1, 0, 0));
    shuts_down_clean(mm);
}

/// Objects the owner uses in every frame, in frames that also destroy
/// something (so every collection runs later rounds): each still dies at
/// the first owner collection after its last handle goes, on the owner or
/// elsewhere, and the counts stay exact in between.
#[test]
fn renewed_leases_in_frames_with_deaths_still_die_on_time() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    let f = mm.create(Target { token: drops.token() });
    let elsewhere = e.clone();
    for _ in 0..4 {
        let frame = [e.clone(), f.clone()];
        drop(mm.create(Target { token: drops.token() }));
        assert_eq!((e.ref_count(), f.ref_count()), (3, 2));
        drop(frame);
        assert_eq!(mm.collect_garbage().objects, 1, "the frame's temporary only");
        assert_eq!((e.ref_count(), f.ref_count()), (2, 1));
        assert_eq!((mm.len(), mm.dead_count()), (2, 0));
    }
    // `f` goes on the owner, `e` on another thread, in a frame with a death.
    drop(f.clone());
    drop(f);
    drop(e.clone());
    drop(e);
    std::thread::spawn(move || drop(elsewhere)).join().unwrap();
    drop(mm.create(Target { token: drops.token() }));
    assert_eq!((mm.len(), mm.dead_count()), (0, 3));
    assert_eq!(mm.collect_garbage().objects, 3);
    assert_eq!(drops.count(), 4 + 3);
    shuts_down_clean(mm);
}

/// Many objects renewed over many frames, with deaths and a new lease in
/// each: the check queue holds one check per leased object, and the
/// store's memory stops growing once the first frames have sized it.
#[test]
fn renewals_over_many_frames_keep_the_check_queue_bounded() {
    let counting = LiveBytes::default();
    let drops = Drops::new();
    let mut mm = ObjectManager::builder().report_leaks(false).owner_thread(true).allocator(counting.clone()).build();
    let kept: Vec<_> = (0..64).map(|_| mm.create(Target { token: drops.token() })).collect();
    let frames = if cfg!(miri) { 6 } else { 2_000 };
    let sized = if cfg!(feature = "handle-sites") { frames / 10 } else { 3 };
    let mut before = 0;
    for frame in 0..frames {
        let render = kept.to_vec();
        let temp = mm.create(Target { token: drops.token() });
        drop(temp.clone()); // a lease on an object that dies this frame
        drop((render, temp));
        assert_eq!(mm.collect_garbage().objects, 1);
        // The first frames size the store's tables (with `handle-sites`,
        // its table of live handles grows once more, by frame 100).
        if frame == sized {
            before = counting.bytes();
        }
    }
    let grown = counting.bytes() - before;
    assert!(grown == 0, "the store's memory grew by {grown} bytes over {frames} frames");
    assert!(kept.iter().all(|h| h.ref_count() == 1));
    drop(kept);
    assert_eq!(mm.collect_garbage().objects, 64);
    shuts_down_clean(mm);
}

/// A raw reference the owner adds every frame keeps a lease renewed; its
/// last release, on another thread, is found by the owner's next
/// collection (a frame with a death in it).
#[test]
fn a_raw_reference_renews_a_lease_until_released_elsewhere() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    let raw = e.clone().into_raw(); // a lease
    drop(e);
    for _ in 0..3 {
        mm.add_ref_raw(raw).unwrap(); // from the reservation: used
        mm.release_raw(raw).unwrap();
        drop(mm.create(Target { token: drops.token() }));
        assert_eq!(mm.collect_garbage().objects, 1);
        assert_eq!(mm.len(), 1);
    }
    mm.add_ref_raw(raw).unwrap();
    mm.release_raw(raw).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| mm.release_raw(raw).unwrap());
    });
    assert_eq!((mm.len(), mm.dead_count()), (0, 1));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 4);
    shuts_down_clean(mm);
}

/// The owner's last drop marks the object `PENDING`: no upgrade revives it,
/// on the owner or elsewhere, although its renewed lease still holds
/// counts; the next collection destroys it once.
#[test]
fn a_pending_object_with_a_renewed_lease_is_not_revived() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    let w = e.downgrade();
    drop(e.clone());
    assert_eq!(mm.collect_garbage().objects, 0, "renewed");
    drop(e.clone());
    drop(e);
    assert!(mm.upgrade(w).is_none());
    std::thread::scope(|s| {
        s.spawn(|| assert!(mm.upgrade(w).is_none(), "pending elsewhere too"));
    });
    assert_eq!((mm.len(), mm.dead_count()), (0, 1));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(mm.collect_garbage().objects, 0, "destroyed once");
    assert_eq!(drops.count(), 1);
    shuts_down_clean(mm);
}

/// A renewed lease whose handles all went elsewhere (the word holds only
/// the reservation), at a shutdown on another thread: the object is
/// destroyed once, its memory kept, and the report blames the owner's
/// reserved counts, not a handle.
#[test]
fn shutdown_elsewhere_of_a_renewed_lease_without_handles() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    drop(e.clone());
    assert_eq!(mm.collect_garbage().objects, 0, "renewed");
    std::thread::spawn(move || drop(e)).join().unwrap();
    let report = std::thread::spawn(move || mm.shutdown()).join().unwrap();
    assert_eq!(drops.count(), 1);
    assert_eq!((report.outliving_handles(), report.owner_reserved()), (1, 1));
}

/// `release_many` of the last handles of objects whose leases a collection
/// renewed (the owner cloned them in the frame before a level's unload):
/// the reservation was part of the count, so `release_many` took them for
/// shared and left them to the next collection (before renewal, the
/// collection had given every lease back, and it destroyed them all).
#[test]
fn release_many_of_objects_with_renewed_leases() {
    let drops = Drops::new();
    let mut mm = owned();
    let level: Vec<_> = (0..10).map(|_| mm.create(Target { token: drops.token() })).collect();
    let render = level[..5].to_vec();
    drop(render);
    assert_eq!(mm.collect_garbage().objects, 0, "renewed");
    let shared = level[7].clone();
    drop(level[7].clone()); // used again: a lease on a shared object
    assert_eq!(mm.release_many(level).objects, 9, "all but the shared one, at once");
    assert_eq!(drops.count(), 9);
    assert_eq!((mm.len(), mm.dead_count(), shared.ref_count()), (1, 0, 1));
    assert_eq!(mm.collect_garbage().objects, 0);
    drop(shared.clone());
    assert_eq!(mm.release_many([shared]).objects, 1, "its lease given back first");
    assert_eq!(mm.collect_garbage().objects, 0);
    assert_eq!(drops.count(), 10);
    shuts_down_clean(mm);
}

/// A lease renewed on the owner, then the manager moves away: the last
/// handle goes there, and collections there (which destroy what they can)
/// leave the check queued. Back on the owner, the first collection finds
/// the lease unused since its last and the object dead.
#[test]
fn a_renewed_lease_while_the_manager_is_away() {
    let drops = Drops::new();
    let mut mm = owned();
    let e = mm.create(Target { token: drops.token() });
    drop(e.clone());
    assert_eq!(mm.collect_garbage().objects, 0, "renewed");
    let away = drops.clone();
    let mut mm = std::thread::spawn(move || {
        let mut mm = mm;
        drop(e);
        for _ in 0..3 {
            drop(mm.create(Target { token: away.token() }));
            assert_eq!(mm.collect_garbage().objects, 1, "the temporary only: not the owner");
        }
        mm
    })
    .join()
    .unwrap();
    assert_eq!((mm.len(), mm.dead_count()), (0, 1));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 4);
    shuts_down_clean(mm);
}

/// A `Drop` run by a collection's first round clones (from the renewed
/// lease) and drops handles of an object that keeps a handle: the later
/// round keeps that lease (handles left), and the object is destroyed only
/// once its last handle goes.
#[test]
fn a_drop_that_uses_a_renewed_lease_during_collection() {
    let drops = Drops::new();
    let mut mm = owned();
    let t = mm.create(Target { token: drops.token() });
    drop(t.clone());
    assert_eq!(mm.collect_garbage().objects, 0, "renewed");
    let holder = mm.create(Holder { hidden: Mutex::new(vec![t.clone()]) });
    drop(holder);
    assert_eq!(mm.collect_garbage().objects, 1, "the holder only");
    assert_eq!((t.ref_count(), mm.len(), mm.dead_count()), (1, 1, 0));
    assert_eq!(mm.collect_garbage().objects, 0, "used by the holder's drop: renewed");
    drop(t);
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
    shuts_down_clean(mm);
}
