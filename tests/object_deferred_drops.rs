//! A manager built with `deferred_drops(true)`: a drop takes effect when its
//! thread's ring is applied (a collection, `dead_count`, shutdown, thread
//! exit, or a full ring), and in every other way as if the handle were
//! dropped then.
//!
//! Every test takes `serial()` first: another test's collection would apply
//! this test's pending drops early (rings are drained for every manager).

use std::panic::{catch_unwind, AssertUnwindSafe};

use mmobject::{Handle, MMObject, ObjectManager};

mod support;
use support::{serial, DropToken, Drops};

#[derive(MMObject)]
struct Particle {
    id: u32,
    token: DropToken,
}

#[derive(MMObject)]
struct Emitter {
    particles: Vec<Handle<Particle>>,
}

fn deferring() -> ObjectManager {
    ObjectManager::builder().deferred_drops(true).build()
}

fn particle(mm: &ObjectManager, id: u32, drops: &Drops) -> Handle<Particle> {
    mm.create(Particle { id, token: drops.token() })
}

#[test]
fn a_drop_takes_effect_at_the_next_collection() {
    let _serial = serial();
    let drops = Drops::new();
    let mut mm = deferring();
    let p = particle(&mm, 1, &drops);
    let weak = p.downgrade();
    let copy = p.clone();
    assert_eq!(p.ref_count(), 2, "clones count at once");
    drop(copy);
    assert_eq!(p.ref_count(), 2, "the dropped copy still counts until its drop is applied");
    drop(p);
    assert!(mm.is_alive(weak), "alive until the drops are applied");
    let again = mm.upgrade(weak).expect("an upgrade still finds it");
    assert_eq!(mm[&again].id, 1);
    drop(again);
    assert_eq!(drops.count(), 0, "nothing is destroyed outside collection");
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
    assert!(mm.upgrade(weak).is_none());
    assert_eq!(mm.len(), 0);
    assert!(mm.shutdown().is_empty());
}

#[test]
fn dead_count_applies_the_drops() {
    let _serial = serial();
    let drops = Drops::new();
    let mut mm = deferring();
    let kept = particle(&mm, 0, &drops);
    let gone: Vec<_> = (1..=10).map(|id| particle(&mm, id, &drops)).collect();
    let weak = gone[3].downgrade();
    drop(gone);
    assert_eq!(mm.dead_count(), 10);
    assert!(!mm.is_alive(weak), "applied: the object is dead for every reader");
    assert_eq!(kept.ref_count(), 1);
    assert_eq!(mm.collect_garbage().objects, 10);
    assert_eq!(drops.count(), 10);
    drop(kept);
    assert_eq!(mm.collect_garbage().objects, 1);
}

/// A ring holds 256 drops: the drop that finds it full applies the ones before it.
#[test]
fn a_full_ring_applies_its_drops_without_a_collection() {
    let _serial = serial();
    let drops = Drops::new();
    let mut mm = deferring();
    let handles: Vec<_> = (0..300).map(|id| particle(&mm, id, &drops)).collect();
    let (first, last) = (handles[0].downgrade(), handles[299].downgrade());
    drop(handles);
    assert!(!mm.is_alive(first), "applied when the ring filled");
    assert!(mm.is_alive(last), "still waiting in the ring");
    assert_eq!(drops.count(), 0);
    assert_eq!(mm.collect_garbage().objects, 300);
    assert_eq!(drops.count(), 300);
}

/// Drops on other threads are applied by their thread's exit or by the
/// next collection, whichever comes first; every object dies once.
#[test]
fn drops_on_other_threads_are_collected() {
    let _serial = serial();
    let drops = Drops::new();
    let mut mm = deferring();
    let shared: Vec<_> = (0..64).map(|id| particle(&mm, id, &drops)).collect();
    std::thread::scope(|s| {
        for _ in 0..4 {
            let mine: Vec<_> = shared.iter().map(Handle::clone).collect();
            s.spawn(move || {
                let more: Vec<_> = mine.iter().map(Handle::clone).collect();
                drop(mine);
                drop(more);
            });
        }
    });
    assert_eq!(mm.collect_garbage().objects, 0, "the originals still hold every object");
    assert!(shared.iter().all(|h| h.ref_count() == 1), "every worker's drop is applied");
    drop(shared);
    assert_eq!(mm.collect_garbage().objects, 64);
    assert_eq!(drops.count(), 64);
    assert!(mm.shutdown().is_empty());
}

#[test]
fn a_thread_that_exits_applies_its_drops() {
    let _serial = serial();
    let drops = Drops::new();
    let mm = deferring();
    let p = particle(&mm, 1, &drops);
    let weak = p.downgrade();
    std::thread::spawn(move || drop(p)).join().unwrap();
    assert!(!mm.is_alive(weak), "the worker's exit applied its drop");
    assert!(mm.shutdown().is_empty());
    assert_eq!(drops.count(), 1);
}

/// Destroying an emitter drops its particles' handles; those drops are
/// deferred too, and the same collection applies them and destroys the
/// particles (a cascade still ends in one call).
#[test]
fn cascades_finish_in_one_collection() {
    let _serial = serial();
    let drops = Drops::new();
    let mut mm = deferring();
    let particles = (0..5).map(|id| particle(&mm, id, &drops)).collect();
    let emitter = mm.create(Emitter { particles });
    drop(emitter);
    let stats = mm.collect_garbage();
    assert_eq!(stats.objects, 6);
    assert!(stats.rounds >= 2, "the particles died in a later round of the same call");
    assert_eq!(drops.count(), 5);
}

#[test]
fn shutdown_applies_the_drops_before_it_reports() {
    let _serial = serial();
    let drops = Drops::new();
    let mm = deferring();
    let handles: Vec<_> = (0..20).map(|id| particle(&mm, id, &drops)).collect();
    drop(handles);
    let report = mm.shutdown();
    assert!(report.is_empty(), "no dropped handle is reported as a leak: {report:?}");
    assert_eq!(drops.count(), 20);
}

#[test]
fn a_panicking_drop_during_collection_loses_nothing() {
    let _serial = serial();
    #[derive(MMObject)]
    struct Fragile {
        panics: bool,
        token: DropToken,
    }
    impl Drop for Fragile {
        fn drop(&mut self) {
            if self.panics {
                panic!("fragile");
            }
        }
    }
    let drops = Drops::new();
    let mut mm = deferring();
    let handles: Vec<_> = (0..4).map(|i| mm.create(Fragile { panics: i == 1, token: drops.token() })).collect();
    drop(handles);
    let first = catch_unwind(AssertUnwindSafe(|| mm.collect_garbage()));
    assert!(first.is_err(), "the panic propagates");
    let rest = mm.collect_garbage().objects;
    assert_eq!(drops.count(), 4, "every value dropped once, the panicking one too");
    assert!(rest <= 3);
    assert_eq!(mm.len(), 0);
}

#[test]
#[should_panic(expected = "cannot have both an owner thread and deferred drops")]
fn an_owner_thread_and_deferred_drops_are_refused() {
    let _serial = serial();
    let _ = ObjectManager::builder().owner_thread(true).deferred_drops(true).build();
}

/// Without the option nothing is deferred: the next manager counts at once.
#[test]
fn other_managers_count_at_once() {
    let _serial = serial();
    let drops = Drops::new();
    let _deferring = deferring();
    let mm = ObjectManager::new();
    let p = particle(&mm, 1, &drops);
    let weak = p.downgrade();
    drop(p);
    assert!(!mm.is_alive(weak), "dead at once, as without deferral");
}
