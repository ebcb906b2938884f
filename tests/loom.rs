//! Loom models of the lock-free parts: the dead-list push on the last drop,
//! `upgrade` racing the last drop, concurrent `create` popping the free list,
//! and loaders creating while the owner collects or shuts down. Under
//! `--cfg loom` the slot values sit in loom's `UnsafeCell`, so every read and
//! write of a value is checked too.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom`.
#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use loom::thread;
use mmobject::{MMObject, ObjectManager};

struct DropToken(Arc<AtomicUsize>);

impl Drop for DropToken {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[derive(MMObject)]
struct Texture {
    id: u32,
    token: DropToken,
}

fn quiet() -> ObjectManager {
    ObjectManager::builder().report_leaks(false).segment_base(1).build()
}

/// Runs `f` under every interleaving (no preemption bound unless
/// `LOOM_MAX_PREEMPTIONS` sets one): these models are small enough.
fn model(f: impl Fn() + Sync + Send + 'static) {
    loom::model::Builder::new().check(f);
}

/// Two threads each drop a clone while a third clones and drops: exactly one
/// thread pushes the slot onto the dead list, and it is collected once.
#[test]
fn last_drop_pushes_once() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut mm = quiet();
        let h = mm.create(Texture { id: 1, token: DropToken(Arc::clone(&drops)) });
        let (a, b) = (h.clone(), h.clone());
        let t1 = thread::spawn(move || drop(a));
        let t2 = thread::spawn(move || drop(b));
        let t3 = thread::spawn(move || {
            let c = h.clone();
            drop(h);
            drop(c);
        });
        for t in [t1, t2, t3] {
            t.join().unwrap();
        }
        assert_eq!(mm.dead_count(), 1, "exactly one dead-list push");
        assert_eq!(mm.len(), 0);
        assert_eq!(drops.load(Ordering::SeqCst), 0, "no drop runs outside collection");
        let stats = mm.collect_garbage();
        assert_eq!(stats.objects, 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        assert_eq!(mm.collect_garbage().objects, 0);
        assert_eq!(drops.load(Ordering::SeqCst), 1, "collected once");
        assert!(mm.shutdown().is_empty());
    });
}

/// `upgrade` racing the last drop either wins (and the object stays alive) or
/// returns `None`; it never revives a dead object.
#[test]
fn upgrade_never_revives() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mm = Arc::new(quiet());
        let h = mm.create(Texture { id: 7, token: DropToken(Arc::clone(&drops)) });
        let weak = h.downgrade();
        let mm2 = Arc::clone(&mm);
        let upgrader = thread::spawn(move || {
            let up = mm2.upgrade(weak);
            if let Some(up) = &up {
                assert_eq!(mm2[up].id, 7);
            }
            up
        });
        drop(h);
        let up = upgrader.join().unwrap();
        match up {
            Some(up) => {
                assert!(mm.is_alive(weak), "the upgraded handle keeps it alive");
                assert_eq!(mm.dead_count(), 0);
                assert_eq!(up.ref_count(), 1);
                drop(up);
            }
            None => assert!(mm.upgrade(weak).is_none()),
        }
        assert_eq!(mm.dead_count(), 1);
        let mut mm = Arc::try_unwrap(mm).expect("the upgrader is done");
        assert_eq!(mm.collect_garbage().objects, 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    });
}

/// Two threads create at once, popping the same free list: distinct slots.
#[test]
fn concurrent_create_pops_distinct_slots() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut mm = quiet();
        // Put two slots on the free list (segment_base(1): segments of 1 and 2 slots).
        drop(mm.create(Texture { id: 0, token: DropToken(Arc::clone(&drops)) }));
        drop(mm.create(Texture { id: 0, token: DropToken(Arc::clone(&drops)) }));
        assert_eq!(mm.collect_garbage().objects, 2);
        let mm = Arc::new(mm);
        let spawn = |id| {
            let mm = Arc::clone(&mm);
            let drops = Arc::clone(&drops);
            thread::spawn(move || {
                let h = mm.create(Texture { id, token: DropToken(drops) });
                assert_eq!(mm[&h].id, id);
                h
            })
        };
        let (t1, t2) = (spawn(1), spawn(2));
        let (h1, h2) = (t1.join().unwrap(), t2.join().unwrap());
        assert_ne!(h1.key().index(), h2.key().index(), "distinct slots");
        assert_eq!((mm[&h1].id, mm[&h2].id), (1, 2));
        assert_eq!(mm.count::<Texture>(), 2);
        drop((h1, h2));
        let mut mm = Arc::try_unwrap(mm).expect("the creators are done");
        assert_eq!(mm.collect_garbage().objects, 2);
        assert_eq!(drops.load(Ordering::SeqCst), 4);
    });
}

/// One thread pops the last free slot while the other finds the list empty and
/// takes a fresh slot: still distinct.
#[test]
fn concurrent_create_pop_and_bump() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut mm = quiet();
        mm.reserve::<Texture>(4);
        drop(mm.create(Texture { id: 0, token: DropToken(Arc::clone(&drops)) }));
        assert_eq!(mm.collect_garbage().objects, 1);
        let mm = Arc::new(mm);
        let spawn = |id| {
            let mm = Arc::clone(&mm);
            let drops = Arc::clone(&drops);
            thread::spawn(move || mm.create(Texture { id, token: DropToken(drops) }))
        };
        let (t1, t2) = (spawn(1), spawn(2));
        let (h1, h2) = (t1.join().unwrap(), t2.join().unwrap());
        assert_ne!(h1.key().index(), h2.key().index());
        assert_eq!((mm[&h1].id, mm[&h2].id), (1, 2));
        drop((h1, h2));
        let mut mm = Arc::try_unwrap(mm).expect("the creators are done");
        assert_eq!(mm.collect_garbage().objects, 2);
        assert_eq!(drops.load(Ordering::SeqCst), 3);
    });
}

/// A raw release racing a strong handle's drop: exactly one of them pushes the
/// object onto the dead list, and a read of the dead list meanwhile sees at most it.
#[test]
fn raw_release_races_handle_drop() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mm = Arc::new(quiet());
        let h = mm.create(Texture { id: 3, token: DropToken(Arc::clone(&drops)) });
        let raw = h.clone().into_raw();
        let mm2 = Arc::clone(&mm);
        let releaser = thread::spawn(move || mm2.release_raw(raw));
        let dropper = thread::spawn(move || drop(h));
        assert!(mm.dead_count() <= 1);
        releaser.join().unwrap().expect("the raw handle held a reference");
        dropper.join().unwrap();
        assert_eq!(mm.dead_count(), 1);
        assert!(mm.release_raw(raw).is_err(), "nothing left to release");
        let mut mm = Arc::try_unwrap(mm).expect("the threads are done");
        assert_eq!(mm.collect_garbage().objects, 1);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
    });
}

/// Handles don't borrow the manager, so a thread can drop the last handle while
/// the owner collects. A budgeted collection puts the rest of its chain back
/// (a chain push) while that thread pushes: nothing is lost or freed twice.
#[test]
fn drop_races_budgeted_collect() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut mm = quiet();
        let token = || DropToken(Arc::clone(&drops));
        drop(mm.create(Texture { id: 1, token: token() }));
        drop(mm.create(Texture { id: 2, token: token() }));
        let h = mm.create(Texture { id: 3, token: token() });
        let dropper = thread::spawn(move || drop(h));
        let stats = mm.collect_garbage_budgeted(1);
        assert_eq!(stats.objects, 1);
        dropper.join().unwrap();
        assert_eq!(mm.dead_count(), 2);
        assert_eq!(mm.collect_garbage().objects, 2);
        assert_eq!(drops.load(Ordering::SeqCst), 3);
        assert!(mm.shutdown().is_empty());
    });
}

/// A loader pops the free list while the owner collects and pushes the slots
/// it freed back (one chain, under the free-list lock): every slot is handed
/// out once, nothing on the free list is lost, and the counts add up.
#[test]
fn loader_creates_while_the_owner_collects() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut mm = quiet();
        mm.reserve::<Texture>(4);
        let token = || DropToken(Arc::clone(&drops));
        // One free slot for the loader, one dead object for the collector.
        drop(mm.create(Texture { id: 0, token: token() }));
        assert_eq!(mm.collect_garbage().objects, 1);
        let dead = mm.create(Texture { id: 1, token: token() });
        drop(dead);
        let loader = mm.loader();
        let loader_drops = Arc::clone(&drops);
        let t = thread::spawn(move || loader.create(Texture { id: 2, token: DropToken(loader_drops) }));
        assert_eq!(mm.collect_garbage().objects, 1);
        let h = t.join().unwrap();
        assert_eq!(mm[&h].id, 2);
        // Whichever slot the loader took, the other one is free: the next two
        // creates get distinct slots, neither of them the loader's.
        let a = mm.create(Texture { id: 3, token: token() });
        let b = mm.create(Texture { id: 4, token: token() });
        let keys = [h.key().index(), a.key().index(), b.key().index()];
        assert!(keys[0] != keys[1] && keys[1] != keys[2] && keys[0] != keys[2], "{keys:?}");
        assert_eq!(mm.count::<Texture>(), 3);
        drop((h, a, b));
        assert_eq!(mm.collect_garbage().objects, 3);
        assert_eq!(drops.load(Ordering::SeqCst), 5);
        assert!(mm.shutdown().is_empty());
    });
}

/// Shutdown racing a loader's create: either the create finishes first (and
/// its object is reported and destroyed by shutdown) or it is refused with
/// the value handed back; never a create into a store being torn down.
#[test]
fn loader_races_shutdown() {
    model(|| {
        let drops = Arc::new(AtomicUsize::new(0));
        let mm = ObjectManager::builder().report_leaks(false).segment_base(1).build();
        mm.reserve::<Texture>(2);
        let loader = mm.loader();
        let loader_drops = Arc::clone(&drops);
        let t = thread::spawn(move || {
            loader.try_create(Texture { id: 7, token: DropToken(loader_drops) }).map_err(|e| e.into_value().id)
        });
        let report = mm.shutdown();
        match t.join().unwrap() {
            Ok(h) => {
                assert_eq!(report.len(), 1, "created before shutdown: reported");
                drop(h); // outlives the manager
            }
            Err(id) => {
                assert_eq!(id, 7);
                assert!(report.is_empty());
            }
        }
        assert_eq!(drops.load(Ordering::SeqCst), 1, "the value dropped exactly once either way");
    });
}
