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
    let report = mm.shutdown();
    assert!(report.is_empty() && report.outliving_handles() == 0);
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
    let report = mm.shutdown();
    assert!(report.is_empty() && report.outliving_handles() == 0);
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
    let report = mm.shutdown();
    assert!(report.is_empty() && report.outliving_handles() == 0);
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
    let (tx, rx) = std::sync::mpsc::channel::<Vec<Handle<Target>>>();
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
    assert!(grown < 1024, "the store's memory grew by {grown} bytes");
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
    let report = mm.shutdown();
    assert!(report.is_empty() && report.outliving_handles() == 0);
}
