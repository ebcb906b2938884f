//! Handles that outlive their manager stay sound: the slot memory they point at
//! is leaked on purpose, and the leak report says so.
//!
//! These tests leak on purpose. Run them under Miri with
//! `MIRIFLAGS=-Zmiri-ignore-leaks cargo +nightly miri test --test object_outliving`.
//!
//! Every test takes `serial()` first: one test holds deferred drops that
//! another test's shutdown would apply early (rings are drained for every
//! manager).

use mmobject::{Error, Handle, LeakReport, MMObject, ObjectManager};

mod support;
use support::{quiet, serial, DropToken, Drops};

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    width: u32,
    token: DropToken,
}

#[derive(MMObject)]
struct Material {
    albedo: Handle<Texture>,
    token: DropToken,
}

fn texture(width: u32, drops: &Drops) -> Texture {
    Texture { width, token: drops.token() }
}

fn assert_outliving(report: &LeakReport, objects: usize) {
    assert_eq!(report.outliving_handles(), objects);
    assert!(report.leaked_bytes() > 0);
    let text = report.to_string();
    assert!(text.contains(&format!("{objects} object(s) referenced by handles outliving the manager")), "{text}");
}

/// Moved from the unit tests of `src/object/manager.rs`, which must not leak.
#[test]
fn shutdown_reports_leaks_and_outliving_handles() {
    let _serial = serial();
    let drops = Drops::default();
    let mm = quiet();
    let kept = mm.create(texture(3, &drops));
    drop(mm.create(texture(4, &drops)));
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    assert_eq!(report.iter().next().unwrap().ref_count, 1);
    assert_outliving(&report, 1);
    assert_eq!(drops.count(), 2, "values are destroyed at shutdown even while handles remain");
    // The handle outlives its manager: cloning and dropping stay sound.
    let again = kept.clone();
    assert_eq!(again.ref_count(), 2);
    drop(kept);
    drop(again);
}

/// A raw reference is a leak, but it keeps no slot memory: a raw handle is a
/// plain number that needs the (gone) manager to be used.
#[test]
fn shutdown_frees_everything_without_outside_handles() {
    let _serial = serial();
    let drops = Drops::default();
    let mm = quiet();
    let t = mm.create(texture(1, &drops));
    let m = mm.create(Material { albedo: t.clone(), token: drops.token() });
    drop(t);
    let raw = m.into_raw();
    let report = mm.shutdown();
    assert_eq!(report.len(), 2);
    assert_eq!(report.outliving_handles(), 0);
    assert_eq!(report.leaked_bytes(), 0);
    assert_eq!(drops.count(), 2);
    let _ = raw;
}

#[test]
fn handles_stay_usable_after_shutdown() {
    let _serial = serial();
    let drops = Drops::default();
    let mm = quiet();
    let tex = mm.create(texture(1, &drops));
    let dead_weak = {
        let gone = mm.create(texture(2, &drops));
        gone.downgrade()
    };
    let key = tex.key();
    let id = mm.id();
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    assert_outliving(&report, 1);

    assert_eq!(tex.key(), key);
    assert_eq!(tex.ref_count(), 1);
    let clones: Vec<_> = (0..4).map(|_| tex.clone()).collect();
    assert_eq!(tex.ref_count(), 5);
    let weak = tex.downgrade();
    assert_eq!(weak.key(), key);
    assert!(clones.iter().all(|c| Handle::ptr_eq(c, &tex) && *c == tex));
    assert_eq!(format!("{tex:?}"), format!("Texture{key}"));
    drop(clones);
    assert_eq!(tex.ref_count(), 1);

    // A new manager recognises neither handle.
    let other = quiet();
    assert_ne!(other.id(), id);
    assert_eq!(other.try_get(&tex).err(), Some(Error::WrongManager { expected: other.id(), found: id }));
    assert!(matches!(other.try_upgrade(weak), Err(Error::WrongManager { .. })));
    assert!(matches!(other.try_get_weak(dead_weak), Err(Error::WrongManager { .. })));
    drop(tex); // the last reference: pushed onto the leaked store's dead list
    assert!(other.shutdown().is_empty());
    assert_eq!(drops.count(), 2);
}

#[test]
fn handles_stay_usable_after_the_manager_is_dropped() {
    let _serial = serial();
    let drops = Drops::default();
    let tex;
    let mat;
    {
        let mm = quiet();
        tex = mm.create(texture(1, &drops));
        mat = mm.create(Material { albedo: tex.clone(), token: drops.token() });
        assert_eq!(tex.ref_count(), 2);
    }
    assert_eq!(drops.count(), 2);
    assert_eq!(tex.ref_count(), 1, "destroying the material released its texture handle");
    assert_eq!(mat.ref_count(), 1);
    let w = mat.downgrade();
    assert_eq!(w.key(), mat.key());
    let t2 = tex.clone();
    drop(tex);
    drop(mat);
    assert_eq!(t2.ref_count(), 1);
    drop(t2);
}

#[test]
fn handles_outlive_the_manager_on_another_thread() {
    let _serial = serial();
    let drops = Drops::default();
    let mm = quiet();
    let handles: Vec<_> = (0..4).map(|w| mm.create(texture(w, &drops))).collect();
    let keys: Vec<_> = handles.iter().map(Handle::key).collect();
    let report = mm.shutdown();
    assert_eq!(report.len(), 4);
    assert_outliving(&report, 4);
    let rounds = if cfg!(miri) { 10 } else { 1000 };
    std::thread::scope(|s| {
        for (handle, key) in handles.into_iter().zip(keys) {
            s.spawn(move || {
                for _ in 0..rounds {
                    let c = handle.clone();
                    assert_eq!(c.key(), key);
                    assert!(c.ref_count() >= 2);
                    let _ = c.downgrade();
                }
                assert_eq!(handle.ref_count(), 1);
                drop(handle);
            });
        }
    });
    assert_eq!(drops.count(), 4);
}

/// Deferred drops of handles that outlive their manager: those made before
/// shutdown are applied by it; those made after (on worker threads) are
/// applied by a later drain, on memory the outliving handles kept.
#[test]
fn deferred_drops_of_handles_that_outlive_the_manager() {
    let _serial = serial();
    let drops = Drops::default();
    let mm = ObjectManager::builder().report_leaks(false).segment_base(4).deferred_drops(true).build();
    let handles: Vec<_> = (0..4).map(|w| mm.create(texture(w, &drops))).collect();
    let copies: Vec<_> = handles.iter().map(Handle::clone).collect();
    drop(copies);
    assert_eq!(handles[0].ref_count(), 2, "the copies' drops wait");
    let report = mm.shutdown();
    assert_outliving(&report, 4);
    assert_eq!(drops.count(), 4, "shutdown destroyed every value");
    assert!(handles.iter().all(|h| h.ref_count() == 1), "shutdown applied the copies' drops");
    std::thread::scope(|s| {
        for handle in handles {
            s.spawn(move || {
                let copy = handle.clone();
                drop(handle);
                drop(copy);
            });
        }
    });
    // Any manager's collection drains every thread's drops.
    assert_eq!(quiet().collect_garbage().objects, 0, "nothing of the gone manager is destroyed again");
    assert_eq!(drops.count(), 4);
}

#[test]
fn handle_moved_to_a_thread_that_outlives_the_manager() {
    let _serial = serial();
    let drops = Drops::default();
    let mm = quiet();
    let tex = mm.create(texture(1, &drops));
    let shared = tex.clone();
    let worker = std::thread::spawn(move || {
        let c = shared.clone();
        (c.ref_count() >= 2, c.key())
    });
    let report = mm.shutdown();
    let (counted, key) = worker.join().unwrap();
    assert!(counted);
    assert_eq!(key, tex.key());
    assert_outliving(&report, 1);
    assert_eq!(tex.ref_count(), 1);
}

/// With a store allocator of the game's own, memory that outliving handles
/// point into stays allocated in it, and the allocator itself stays alive
/// (the manager keeps a reference to it forever), so the handles stay sound.
#[test]
fn outliving_handles_keep_the_store_allocator_alive() {
    let _serial = serial();
    let live = support::LiveBytes::default();
    let drops = Drops::default();
    let handle = {
        let mm = ObjectManager::builder().report_leaks(false).allocator(live.clone()).build();
        let handle = mm.create(texture(3, &drops));
        let report = mm.shutdown();
        assert_outliving(&report, 1);
        handle
    };
    assert!(live.bytes() > 0, "the slot memory stays allocated");
    assert!(live.clones() > 1, "the allocator is kept alive");
    assert_eq!(handle.ref_count(), 1);
    std::thread::spawn(move || drop(handle)).join().unwrap();
    assert_eq!(drops.count(), 1, "the value was destroyed at shutdown");
}
