//! The object layer as a game engine uses it: deferred destruction, cascades,
//! generations, wrong managers, raw handles, reports and shutdown.

use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};

use mmobject::{Error, Handle, MMObject, ObjectKey, ObjectManager, RawHandle};
use slotmap::SecondaryMap;

mod support;
use support::{quiet, DropToken, Drops};

// --- Test types -------------------------------------------------------------

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    width: u32,
    pixels: Vec<u8>,
    token: DropToken,
}

fn texture(width: u32, drops: &Drops) -> Texture {
    Texture { width, pixels: vec![0; width as usize], token: drops.token() }
}

#[derive(MMObject)]
struct Mesh {
    vertices: Vec<f32>,
    token: DropToken,
}

#[derive(MMObject)]
struct Material {
    albedo: Handle<Texture>,
    detail: Option<Handle<Texture>>,
    token: DropToken,
}

#[derive(MMObject)]
struct Entity {
    name: u32,
    mesh: Option<Handle<Mesh>>,
    material: Option<Handle<Material>>,
    parent: Option<Handle<Entity>>,
    token: DropToken,
}

fn entity(name: u32, parent: Option<Handle<Entity>>, drops: &Drops) -> Entity {
    Entity { name, mesh: None, material: None, parent, token: drops.token() }
}

/// Creates a chain of five entities, each holding the one before, and drops
/// its head: collecting it is a cascade of five rounds.
fn release_a_five_link_chain(mm: &mut ObjectManager, drops: &Drops) {
    let mut head = mm.create(entity(0, None, drops));
    for name in 1..5 {
        head = mm.create(entity(name, Some(head), drops));
    }
    drop(head);
}

/// Panics in `Drop` when armed; still holds handles and a drop token.
#[derive(MMObject)]
struct Bomb {
    armed: bool,
    held: Option<Handle<Texture>>,
    other: Option<Handle<Bomb>>,
    token: DropToken,
}

fn bomb(armed: bool, held: Option<Handle<Texture>>, drops: &Drops) -> Bomb {
    Bomb { armed, held, other: None, token: drops.token() }
}

/// A field whose heap size cannot be computed: `HeapSize` panics when it is set.
struct Fragile(bool);

impl mmobject::HeapSize for Fragile {
    fn heap_size(&self) -> usize {
        assert!(!self.0, "fragile size");
        0
    }
}

/// An object whose `size()` panics (through its field's `HeapSize`).
#[derive(MMObject)]
struct Gauge {
    fragile: Fragile,
    token: DropToken,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.armed {
            panic!("boom");
        }
    }
}

fn raw_of<T>(handle: &Handle<T>) -> RawHandle {
    handle.clone().into_raw()
}

// --- Deferred destruction -----------------------------------------------------

#[test]
fn last_drop_defers_destruction_until_collect() {
    let drops = Drops::new();
    let mut mm = quiet();
    let tex = mm.create(texture(8, &drops));
    let other = tex.clone();
    let weak = tex.downgrade();
    let size = mm[&tex].size();
    assert_eq!(size, std::mem::size_of::<Texture>() + 8);
    assert_eq!(tex.ref_count(), 2);

    drop(tex);
    assert_eq!(other.ref_count(), 1);
    assert!(mm.upgrade(weak).is_some_and(|h| h.ref_count() == 2), "still live while one handle is left");
    drop(other);

    assert_eq!(drops.count(), 0, "dropping the last handle never runs T::drop at once");
    assert!(mm.upgrade(weak).is_none());
    assert!(mm.get_weak(weak).is_none());
    assert!(!mm.is_alive(weak));
    assert!(matches!(mm.try_get_weak(weak), Err(Error::StaleHandle { type_name: "Texture", .. })));
    assert!(matches!(mm.try_upgrade(weak), Err(Error::StaleHandle { .. })));
    assert_eq!(mm.dead_count(), 1);
    assert_eq!(mm.count::<Texture>(), 0);
    assert_eq!(mm.len(), 0);
    assert!(mm.is_empty());
    assert_eq!(mm.report().get("Texture").unwrap().dead_pending, 1);
    assert_eq!(drops.count(), 0, "reading the manager destroys nothing");

    let stats = mm.collect_garbage();
    assert_eq!((stats.objects, stats.bytes, stats.rounds), (1, size, 1));
    assert_eq!(drops.count(), 1);
    assert_eq!(mm.dead_count(), 0);
    assert!(mm.upgrade(weak).is_none(), "never revived after collection either");

    let again = mm.collect_garbage();
    assert_eq!((again.objects, again.rounds), (0, 0));
    assert_eq!(drops.count(), 1, "destroyed exactly once");
    assert!(mm.shutdown().is_empty());
}

/// Every way an object's last count goes makes it dead to weak reads at
/// once, long before its collection: a drop, a drop of a type whose objects
/// may hold handles, a raw handle's release, and a drop on another thread.
/// (The drain that applies a deferred drop: `object_deferred_drops`.)
#[test]
fn every_last_release_is_seen_by_weak_reads_at_once() {
    let drops = Drops::new();
    let mut mm = quiet();
    let dead_to_readers = |mm: &ObjectManager, weak: mmobject::WeakHandle<Texture>| {
        mm.get_weak(weak).is_none()
            && mm.try_get_weak(weak).is_err()
            && mm.view::<Texture>().get_weak(weak).is_none()
            && mm.upgrade(weak).is_none()
    };
    let tex = mm.create(texture(1, &drops));
    let weak = tex.downgrade();
    assert!(!dead_to_readers(&mm, weak));
    drop(tex);
    assert!(dead_to_readers(&mm, weak), "a drop");

    let e = mm.create(entity(1, None, &drops));
    let weak_e = e.downgrade();
    drop(e);
    assert!(mm.get_weak(weak_e).is_none() && mm.view::<Entity>().get_weak(weak_e).is_none(), "a may-hold-handles drop");

    let tex = mm.create(texture(2, &drops));
    let weak = tex.downgrade();
    let raw = tex.into_raw();
    assert!(!dead_to_readers(&mm, weak));
    mm.release_raw(raw).unwrap();
    assert!(dead_to_readers(&mm, weak), "a raw release");
    assert!(matches!(mm.release_raw(raw), Err(Error::DoubleRelease { .. })), "released twice, not stale");

    let tex = mm.create(texture(3, &drops));
    let weak = tex.downgrade();
    std::thread::spawn(move || drop(tex)).join().unwrap();
    assert!(dead_to_readers(&mm, weak), "a drop on another thread");

    assert_eq!(drops.count(), 0, "nothing is destroyed outside collection");
    assert_eq!(mm.collect_garbage().objects, 4);
    assert_eq!(drops.count(), 4);
}

#[test]
fn get_mut_and_index_mut_write_through() {
    let drops = Drops::new();
    let mut mm = quiet();
    let tex = mm.create(texture(1, &drops));
    mm[&tex].width = 5;
    mm.get_mut(&tex).pixels.push(7);
    assert_eq!(mm.get(&tex).width, 5);
    assert_eq!(mm[&tex].pixels.last(), Some(&7));
    let weak = tex.downgrade();
    mm.get_weak_mut(weak).unwrap().width = 6;
    assert_eq!(mm.try_get(&tex).unwrap().width, 6);
    drop(tex);
    assert!(mm.get_weak_mut(weak).is_none());
    mm.collect_garbage();
    assert_eq!(drops.count(), 1);
}

// --- Cascades -------------------------------------------------------------------

#[test]
fn material_releases_its_textures_in_the_same_collect() {
    let drops = Drops::new();
    let mut mm = quiet();
    let albedo = mm.create(texture(4, &drops));
    let detail = mm.create(texture(2, &drops));
    let mat = mm.create(Material { albedo: albedo.clone(), detail: Some(detail.clone()), token: drops.token() });
    let (albedo_weak, detail_weak) = (albedo.downgrade(), detail.downgrade());
    assert_eq!(albedo.ref_count(), 2);
    drop(albedo);
    drop(detail);

    let stats = mm.collect_garbage();
    assert_eq!((stats.objects, stats.rounds), (0, 0), "the material still holds both textures");
    assert_eq!(mm.count::<Texture>(), 2);
    assert_eq!(mm[&mm[&mat].albedo].width, 4);

    drop(mat);
    assert_eq!(mm.count::<Texture>(), 2, "textures stay live until the material is destroyed");
    assert_eq!(mm.dead_count(), 1);
    let stats = mm.collect_garbage();
    assert_eq!(stats.objects, 3);
    assert_eq!(stats.rounds, 2, "material first, then its textures");
    assert_eq!(drops.count(), 3);
    assert_eq!(mm.dead_count(), 0);
    assert!(mm.get_weak(albedo_weak).is_none() && mm.get_weak(detail_weak).is_none());
    assert!(mm.shutdown().is_empty());
}

#[test]
fn chain_of_depth_ten_finishes_in_one_collect() {
    let drops = Drops::new();
    let mut mm = quiet();
    let mut head = mm.create(entity(0, None, &drops));
    let mut weaks = vec![head.downgrade()];
    for name in 1..10 {
        head = mm.create(entity(name, Some(head), &drops));
        weaks.push(head.downgrade());
    }
    assert_eq!(mm.count::<Entity>(), 10);
    drop(head);
    assert_eq!(mm.count::<Entity>(), 9);
    assert_eq!(mm.dead_count(), 1, "only the head is dead; it still holds its parent");
    assert_eq!(drops.count(), 0);

    let stats = mm.collect_garbage();
    assert_eq!(stats.objects, 10);
    assert_eq!(stats.rounds, 10, "each destruction releases the next link");
    assert_eq!(stats.bytes, 10 * std::mem::size_of::<Entity>());
    assert_eq!(drops.count(), 10);
    assert_eq!((mm.len(), mm.dead_count()), (0, 0));
    assert!(weaks.iter().all(|&w| mm.upgrade(w).is_none()));
}

#[test]
fn cascade_across_types_in_one_collect() {
    let drops = Drops::new();
    let mut mm = quiet();
    let tex = mm.create(texture(1, &drops));
    let mesh = mm.create(Mesh { vertices: vec![0.0; 9], token: drops.token() });
    let mat = mm.create(Material { albedo: tex, detail: None, token: drops.token() });
    let root = mm.create(entity(0, None, &drops));
    let mut child = mm.create(entity(1, Some(root), &drops));
    mm[&child].mesh = Some(mesh);
    mm[&child].material = Some(mat);
    for name in 2..5 {
        child = mm.create(entity(name, Some(child), &drops));
    }
    assert_eq!(mm.len(), 8);
    drop(child);
    let stats = mm.collect_garbage();
    assert_eq!(stats.objects, 8);
    assert!(stats.rounds >= 5, "a five-deep entity chain needs at least five rounds, got {}", stats.rounds);
    assert_eq!(drops.count(), 8);
    assert!(mm.is_empty() && mm.dead_count() == 0);
}

#[test]
fn budgeted_collection_keeps_the_rest_queued() {
    let drops = Drops::new();
    let mut mm = quiet();
    for w in 0..10 {
        drop(mm.create(texture(w, &drops)));
    }
    assert_eq!(mm.dead_count(), 10);
    let stats = mm.collect_garbage_budgeted(3);
    assert_eq!((stats.objects, stats.rounds), (3, 1));
    assert_eq!(drops.count(), 3);
    assert_eq!(mm.dead_count(), 7);
    assert_eq!(mm.collect_garbage_budgeted(0).objects, 0);
    assert_eq!(mm.dead_count(), 7);
    assert_eq!(mm.collect_garbage_budgeted(100).objects, 7);
    assert_eq!(drops.count(), 10);
    assert_eq!(mm.dead_count(), 0);
    assert_eq!(mm.report().get("Texture").unwrap().destroyed, 10);
}

#[test]
fn budgeted_collection_stops_inside_a_cascade() {
    let drops = Drops::new();
    let mut mm = quiet();
    release_a_five_link_chain(&mut mm, &drops);
    let stats = mm.collect_garbage_budgeted(2);
    assert_eq!((stats.objects, stats.rounds), (2, 2));
    assert_eq!(drops.count(), 2);
    assert_eq!(mm.dead_count(), 1, "the third link was released and waits");
    assert_eq!(mm.count::<Entity>(), 2);
    let stats = mm.collect_garbage();
    assert_eq!((stats.objects, stats.rounds), (3, 3));
    assert_eq!(drops.count(), 5);
    assert!(mm.is_empty());
}

#[test]
fn budgets_too_large_to_run_out_collect_everything() {
    // A budget above any store's slot count is not counted down per object
    // (the walk takes the destroyed count off once): whatever its value, it
    // collects all, a cascade's later rounds included.
    for budget in [u32::MAX as usize + 1, usize::MAX - 1, usize::MAX] {
        let drops = Drops::new();
        let mut mm = quiet();
        release_a_five_link_chain(&mut mm, &drops);
        for w in 0..10 {
            drop(mm.create(texture(w, &drops)));
        }
        let stats = mm.collect_garbage_budgeted(budget);
        assert_eq!((stats.objects, stats.rounds), (15, 5), "budget {budget}");
        assert_eq!(drops.count(), 15);
        assert!(mm.is_empty() && mm.dead_count() == 0);
    }
}

// --- Generations ----------------------------------------------------------------

#[test]
fn reused_slot_never_validates_old_weak_or_raw_handles() {
    let drops = Drops::new();
    let mut mm = quiet();
    let first = mm.create(texture(1, &drops));
    let old_weak = first.downgrade();
    let old_raw = raw_of(&first);
    let old_key = first.key();
    mm.release_raw(old_raw).unwrap();
    drop(first);
    mm.collect_garbage();

    let second = mm.create(texture(2, &drops));
    assert_eq!(second.key().index(), old_key.index(), "the slot is reused");
    assert_ne!(second.key(), old_key);
    assert_ne!(second.key().generation(), old_key.generation());
    assert!(mm.get_weak(old_weak).is_none());
    assert!(mm.upgrade(old_weak).is_none());
    assert!(matches!(mm.try_get_weak(old_weak), Err(Error::StaleHandle { .. })));
    assert!(matches!(mm.add_ref_raw(old_raw), Err(Error::StaleHandle { .. })));
    assert!(matches!(mm.release_raw(old_raw), Err(Error::StaleHandle { .. })));
    assert!(matches!(mm.handle_from_raw::<Texture>(old_raw), Err(Error::StaleHandle { .. })));
    assert_eq!(second.ref_count(), 1, "failed calls through the old handles change no count");
    assert_eq!(mm.get_weak(second.downgrade()).unwrap().width, 2);
    drop(second);
    mm.collect_garbage();
    assert_eq!(drops.count(), 2);
}

#[test]
fn many_reuses_of_one_slot_keep_every_old_handle_stale() {
    let drops = Drops::new();
    let mut mm = quiet();
    let mut old = Vec::new();
    let rounds = if cfg!(miri) { 20 } else { 300 };
    for w in 0..rounds {
        let tex = mm.create(texture(w, &drops));
        for &(weak, raw) in &old {
            assert!(mm.upgrade(weak).is_none());
            assert!(mm.add_ref_raw(raw).is_err());
        }
        assert_eq!(tex.ref_count(), 1);
        let raw = raw_of(&tex);
        mm.release_raw(raw).unwrap();
        old.push((tex.downgrade(), raw));
        drop(tex);
        assert_eq!(mm.collect_garbage().objects, 1);
    }
    let indices: HashSet<u32> = old.iter().map(|(w, _)| w.key().index()).collect();
    assert_eq!(indices.len(), 1, "one slot served every object");
    let keys: HashSet<ObjectKey> = old.iter().map(|(w, _)| w.key()).collect();
    assert_eq!(keys.len(), rounds as usize, "every key is distinct");
    assert_eq!(drops.count(), rounds as usize);
}

// --- Wrong manager --------------------------------------------------------------

#[test]
fn wrong_manager_gives_errors_from_try_calls() {
    let drops = Drops::new();
    let a = quiet();
    let mut b = quiet();
    let tex = a.create(texture(1, &drops));
    let weak = tex.downgrade();
    let wrong = Error::WrongManager { expected: b.id(), found: a.id() };
    assert_eq!(b.try_get(&tex).err(), Some(wrong.clone()));
    assert_eq!(b.try_get_weak(weak).err(), Some(wrong.clone()));
    assert_eq!(b.try_upgrade(weak).err(), Some(wrong.clone()));
    assert_eq!(b.try_get_mut(&tex).err(), Some(wrong));
    assert_eq!(tex.ref_count(), 1);

    let raw = raw_of(&tex);
    assert_eq!(tex.ref_count(), 2);
    for result in [b.add_ref_raw(raw), b.release_raw(raw), b.handle_from_raw::<Texture>(raw).map(drop)] {
        if a.id() & 0xff != b.id() & 0xff {
            assert!(matches!(result, Err(Error::WrongManager { .. })), "{result:?}");
        } else {
            assert!(result.is_err());
        }
    }
    assert_eq!(tex.ref_count(), 2, "failed raw calls change no count");
    a.release_raw(raw).unwrap();
    assert_eq!(tex.ref_count(), 1);
    drop(tex);
    drop(b);
    drop(a);
    assert_eq!(drops.count(), 1);
}

/// A handle's flag bits (counting through an owner thread, a type that may
/// hold handles) sit beside its manager id but outside what the check
/// compares: handles of every kind pass their own manager's check and fail
/// another's, weak handles too.
#[test]
fn the_manager_check_ignores_the_flag_bits() {
    let drops = Drops::new();
    let plain = quiet();
    let owned = ObjectManager::builder().report_leaks(false).owner_thread(true).build();
    for (mine, other) in [(&plain, &owned), (&owned, &plain)] {
        let tex = mine.create(texture(1, &drops));
        let ent = mine.create(entity(2, None, &drops));
        assert!(mine.try_get(&tex).is_ok() && mine.try_get(&ent).is_ok());
        assert!(mine.try_get_weak(tex.downgrade()).is_ok() && mine.try_get_weak(ent.downgrade()).is_ok());
        assert_eq!(mine.view::<Entity>().get(&ent).name, 2);
        let wrong = Error::WrongManager { expected: other.id(), found: mine.id() };
        assert_eq!(other.try_get(&tex).err(), Some(wrong.clone()));
        assert_eq!(other.try_get(&ent).err(), Some(wrong.clone()));
        assert_eq!(other.try_get_weak(tex.downgrade()).err(), Some(wrong.clone()));
        assert_eq!(other.try_get_weak(ent.downgrade()).err(), Some(wrong));
        let view = other.view::<Entity>();
        assert!(catch_unwind(AssertUnwindSafe(|| view.get(&ent).name)).is_err());
        assert!(catch_unwind(AssertUnwindSafe(|| view.get_weak(ent.downgrade()).map(|e| e.name))).is_err());
    }
}

#[test]
#[should_panic(expected = "handle belongs to object manager")]
fn get_with_wrong_manager_panics() {
    let drops = Drops::new();
    let (a, b) = (quiet(), quiet());
    let tex = a.create(texture(1, &drops));
    let _ = b.get(&tex);
}

#[test]
#[should_panic(expected = "handle belongs to object manager")]
fn index_with_wrong_manager_panics() {
    let drops = Drops::new();
    let (a, b) = (quiet(), quiet());
    let tex = a.create(texture(1, &drops));
    let _ = b[&tex].width;
}

#[test]
#[should_panic(expected = "handle belongs to object manager")]
fn index_mut_with_wrong_manager_panics() {
    let drops = Drops::new();
    let (a, mut b) = (quiet(), quiet());
    let tex = a.create(texture(1, &drops));
    b[&tex].width = 3;
}

#[test]
#[should_panic(expected = "handle belongs to object manager")]
fn get_weak_with_wrong_manager_panics() {
    let drops = Drops::new();
    let (a, b) = (quiet(), quiet());
    let tex = a.create(texture(1, &drops));
    let _ = b.get_weak(tex.downgrade());
}

#[test]
#[should_panic(expected = "handle belongs to object manager")]
fn upgrade_with_wrong_manager_panics() {
    let drops = Drops::new();
    let (a, b) = (quiet(), quiet());
    let tex = a.create(texture(1, &drops));
    let _ = b.upgrade(tex.downgrade());
}

#[test]
fn wrong_manager_panic_names_both_managers() {
    let drops = Drops::new();
    let (a, b) = (quiet(), quiet());
    let tex = a.create(texture(1, &drops));
    let payload = catch_unwind(AssertUnwindSafe(|| b.get(&tex).width)).unwrap_err();
    let message = payload.downcast_ref::<String>().expect("a formatted message");
    assert_eq!(
        message,
        &format!("handle belongs to object manager #{}, but was used with object manager #{}", a.id(), b.id())
    );
    assert_eq!(tex.ref_count(), 1);
}

// --- Raw handles ----------------------------------------------------------------

#[test]
fn raw_handles_round_trip_and_count() {
    let drops = Drops::new();
    let mut mm = quiet();
    let tex = mm.create(texture(3, &drops));
    let weak = tex.downgrade();
    let raw = tex.into_raw();
    assert_eq!(u64::from(raw), raw.0);
    assert!(mm.is_alive(weak), "a raw handle keeps the object alive");
    assert_eq!(mm.upgrade(weak).unwrap().ref_count(), 2);

    mm.add_ref_raw(raw).unwrap();
    mm.add_ref_raw(raw).unwrap();
    assert_eq!(mm.upgrade(weak).unwrap().ref_count(), 4);
    mm.release_raw(raw).unwrap();
    let back = mm.handle_from_raw::<Texture>(raw).unwrap();
    assert_eq!(back.ref_count(), 2);
    assert_eq!(mm[&back].width, 3);
    assert_eq!(back.key(), weak.key());
    mm.release_raw(raw).unwrap();
    assert_eq!(back.ref_count(), 1);
    assert!(matches!(mm.release_raw(raw), Err(Error::DoubleRelease { type_name: "Texture", .. })));
    assert_eq!(back.ref_count(), 1, "a raw handle cannot give back a reference a Handle holds");

    // The last reference given back through a raw handle makes the object dead, not destroyed.
    let raw = back.into_raw();
    mm.release_raw(raw).unwrap();
    assert_eq!(drops.count(), 0);
    assert_eq!(mm.dead_count(), 1);
    assert!(mm.upgrade(weak).is_none());
    assert!(matches!(mm.add_ref_raw(raw), Err(Error::StaleHandle { .. })), "a dead object is never revived");
    assert!(mm.release_raw(raw).is_err());
    assert!(mm.handle_from_raw::<Texture>(raw).is_err());
    assert_eq!(mm.dead_count(), 1);
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(drops.count(), 1);
    assert!(matches!(mm.add_ref_raw(raw), Err(Error::StaleHandle { .. })));
    assert!(matches!(mm.release_raw(raw), Err(Error::StaleHandle { .. })));
    assert!(matches!(mm.handle_from_raw::<Texture>(raw), Err(Error::StaleHandle { .. })));
}

#[test]
fn raw_handles_detect_wrong_type_and_double_release_without_changing_counts() {
    let drops = Drops::new();
    let mm = quiet();
    let tex = mm.create(texture(1, &drops));
    let mesh = mm.create(Mesh { vertices: vec![], token: drops.token() });
    let raw = raw_of(&tex);
    assert_eq!(mm.handle_from_raw::<Mesh>(raw).err(), Some(Error::WrongType { expected: "Mesh", found: "Texture" }));
    assert_eq!(tex.ref_count(), 2);
    let back = mm.handle_from_raw::<Texture>(raw).unwrap();
    assert_eq!(tex.ref_count(), 2, "the reference moved into the handle");
    assert!(matches!(mm.handle_from_raw::<Texture>(raw), Err(Error::DoubleRelease { .. })));
    assert!(matches!(mm.release_raw(raw), Err(Error::DoubleRelease { .. })));
    assert_eq!(tex.ref_count(), 2);
    drop(back);
    assert_eq!(tex.ref_count(), 1);
    assert_eq!(mesh.ref_count(), 1);
}

#[test]
fn raw_handles_detect_malformed_and_foreign_bits() {
    let drops = Drops::new();
    let mm = quiet();
    let tex = mm.create(texture(1, &drops));
    let raw = raw_of(&tex);
    let tag = raw.0 & (0xff << 56);

    let even_generation = RawHandle(raw.0 & !1);
    let unknown_index = RawHandle(tag | (0x00ff_fff0 << 32) | 1);
    for bad in [even_generation, unknown_index] {
        assert_eq!(mm.add_ref_raw(bad), Err(Error::InvalidRawHandle { raw: bad.0 }));
        assert_eq!(mm.release_raw(bad), Err(Error::InvalidRawHandle { raw: bad.0 }));
        assert!(matches!(mm.handle_from_raw::<Texture>(bad), Err(Error::InvalidRawHandle { .. })));
    }
    let other_generation = RawHandle(raw.0 ^ 0x2);
    assert!(matches!(mm.add_ref_raw(other_generation), Err(Error::StaleHandle { .. })));
    let foreign_tag = RawHandle(raw.0 ^ (1 << 56));
    assert!(matches!(mm.add_ref_raw(foreign_tag), Err(Error::WrongManager { .. })));
    assert!(matches!(mm.release_raw(foreign_tag), Err(Error::WrongManager { .. })));
    assert_eq!(tex.ref_count(), 2, "no failed call changed a count");
    mm.release_raw(raw).unwrap();
    assert_eq!(tex.ref_count(), 1);
}

// --- Queries ----------------------------------------------------------------------

#[test]
fn iter_count_len_and_dead_count() {
    let drops = Drops::new();
    let mut mm = quiet();
    assert_eq!(mm.iter::<Texture>().count(), 0, "an unused type iterates nothing");
    assert_eq!(mm.count::<Texture>(), 0);
    let mut textures: Vec<_> = (0..6).map(|w| mm.create(texture(w, &drops))).collect();
    let meshes: Vec<_> = (0..3).map(|_| mm.create(Mesh { vertices: vec![1.0], token: drops.token() })).collect();
    assert_eq!((mm.count::<Texture>(), mm.count::<Mesh>(), mm.len()), (6, 3, 9));

    textures.remove(4);
    textures.remove(1);
    assert_eq!((mm.count::<Texture>(), mm.len(), mm.dead_count()), (4, 7, 2));
    let seen: Vec<u32> = mm.iter::<Texture>().map(|(_, t)| t.width).collect();
    assert_eq!(seen, [0, 2, 3, 5], "live objects only, in key order");
    let keys: Vec<ObjectKey> = mm.iter::<Texture>().map(|(w, _)| w.key()).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    for (weak, tex) in mm.iter::<Texture>() {
        assert_eq!(mm.get_weak(weak).unwrap().width, tex.width);
        assert_eq!(mm.upgrade(weak).unwrap().ref_count(), 2);
    }
    assert_eq!(mm.iter::<Mesh>().count(), 3);
    let from_iter: Vec<_> = mm.iter::<Mesh>().map(|(w, _)| w).collect();
    let from_handles: Vec<_> = meshes.iter().map(Handle::downgrade).collect();
    assert_eq!(from_iter, from_handles, "iter's weak handles equal the downgraded ones");

    assert_eq!(mm.collect_garbage().objects, 2);
    assert_eq!((mm.count::<Texture>(), mm.len(), mm.dead_count()), (4, 7, 0));
    drop(textures);
    drop(meshes);
    assert_eq!((mm.len(), mm.dead_count()), (0, 7));
    assert_eq!(mm.collect_garbage().objects, 7);
    assert_eq!(drops.count(), 9);
}

#[test]
fn report_fields_and_display() {
    let drops = Drops::new();
    let mut mm = quiet();
    let textures: Vec<_> = (1..=4).map(|w| mm.create(texture(w * 10, &drops))).collect();
    let mesh = mm.create(Mesh { vertices: Vec::with_capacity(5), token: drops.token() });
    let tex_size = |w: usize| std::mem::size_of::<Texture>() + w;
    let mut textures = textures.into_iter();
    drop(textures.next()); // width 10: dead, still counted in bytes
    let report = mm.report();
    let t = report.get("Texture").unwrap();
    assert_eq!(t.tag, "Textures");
    assert_eq!((t.live, t.dead_pending, t.peak_live), (3, 1, 4));
    assert_eq!((t.created, t.destroyed), (4, 0));
    assert_eq!(t.bytes, tex_size(10) + tex_size(20) + tex_size(30) + tex_size(40));
    if cfg!(target_pointer_width = "64") {
        assert_eq!(t.slot_bytes, 16 + std::mem::size_of::<Texture>(), "a 16-byte header, then the value");
    }
    let m = report.get("Mesh").unwrap();
    assert_eq!((m.tag, m.live, m.bytes), ("Mesh", 1, std::mem::size_of::<Mesh>() + 5 * 4));
    assert!(report.get("Material").is_none());
    assert_eq!(report.total_live(), 4);
    assert_eq!(report.total_bytes(), t.bytes + m.bytes);

    let text = report.to_string();
    for needle in ["type", "tag", "live", "Texture", "Textures", "Mesh", "total"] {
        assert!(text.contains(needle), "{needle:?} missing from:\n{text}");
    }

    mm.collect_garbage();
    drop(textures);
    mm.collect_garbage();
    let t = mm.report().get("Texture").unwrap().clone();
    assert_eq!((t.live, t.dead_pending, t.peak_live, t.bytes), (0, 0, 4, 0));
    assert_eq!((t.created, t.destroyed), (4, 4));
    drop(mesh);
}

/// `created` is derived from the free list's length (no counter on `create`):
/// it stays exact through slot reuse, fresh slots and collection.
#[test]
fn report_counts_created_and_destroyed_exactly_through_reuse() {
    let drops = Drops::new();
    let mut mm = quiet();
    let mut kept: Vec<_> = (0..5).map(|w| mm.create(texture(w, &drops))).collect();
    kept.truncate(3);
    let line = |mm: &ObjectManager| {
        let t = mm.report().get("Texture").cloned().unwrap();
        (t.created, t.destroyed, t.live, t.dead_pending)
    };
    assert_eq!(line(&mm), (5, 0, 3, 2));
    assert_eq!(mm.collect_garbage().objects, 2);
    kept.extend((0..3).map(|w| mm.create(texture(w, &drops)))); // two reused slots, one new
    assert_eq!(line(&mm), (8, 2, 6, 0));
    assert_eq!(mm.count::<Texture>(), 6);
    drop(kept);
    assert_eq!(mm.collect_garbage().objects, 6);
    assert_eq!(line(&mm), (8, 8, 0, 0));
    assert_eq!(drops.count(), 8);
}

// --- Shutdown and leak reports --------------------------------------------------------

#[test]
fn shutdown_reports_each_leak_with_its_creation_site() {
    let drops = Drops::new();
    let mut mm = quiet();
    // Two entities that hold each other: a cycle nothing outside references.
    let (a, line_a) = (mm.create(entity(1, None, &drops)), line!());
    let (b, line_b) = (mm.create(entity(2, Some(a.clone()), &drops)), line!());
    mm[&a].parent = Some(b.clone());
    let (key_a, key_b) = (a.key(), b.key());
    drop(mm.create(texture(3, &drops))); // dead, not leaked
    drop(a);
    drop(b);

    let report = mm.shutdown();
    assert_eq!(drops.count(), 3, "shutdown destroys the dead and breaks the cycle");
    assert!(!report.is_empty());
    assert_eq!(report.len(), 2);
    assert_eq!(report.outliving_handles(), 0);
    assert_eq!(report.leaked_bytes(), 0);
    assert_eq!(report.drop_panics(), 0);
    let entries: Vec<_> = report.iter().collect();
    for (entry, key, line) in [(entries[0], key_a, line_a), (entries[1], key_b, line_b)] {
        assert_eq!(entry.type_name, "Entity");
        assert_eq!(entry.key, key);
        assert_eq!(entry.ref_count, 1);
        assert_eq!(entry.size, std::mem::size_of::<Entity>());
        assert!(entry.site.file().ends_with("object_api.rs"), "{}", entry.site.file());
        assert_eq!(entry.site.line(), line);
        let text = entry.to_string();
        let expected = format!(
            "Entity{} (refs: 1, {} B) created at {}:{}:{}",
            key,
            entry.size,
            entry.site.file(),
            line,
            entry.site.column()
        );
        assert_eq!(text, expected);
    }
    assert_eq!((&report).into_iter().count(), 2);
    let text = report.to_string();
    assert!(text.starts_with("2 leaked object(s):"), "{text}");
    assert!(text.contains(&format!("object_api.rs:{line_a}:")), "{text}");
    assert!(text.contains(&format!("object_api.rs:{line_b}:")), "{text}");
}

#[test]
fn clean_shutdown_reports_nothing() {
    let drops = Drops::new();
    let mm = quiet();
    let tex = mm.create(texture(1, &drops));
    drop(tex);
    let report = mm.shutdown();
    assert!(report.is_empty());
    assert_eq!((report.len(), report.outliving_handles(), report.leaked_bytes()), (0, 0, 0));
    assert_eq!(report.to_string(), "no leaked objects");
    assert_eq!(drops.count(), 1);
}

#[test]
fn dropping_the_manager_destroys_everything() {
    let drops = Drops::new();
    {
        let mm = quiet();
        let a = mm.create(entity(1, None, &drops));
        let b = mm.create(entity(2, Some(a.clone()), &drops));
        let _ = mm.create(texture(1, &drops));
        drop((a, b));
    }
    assert_eq!(drops.count(), 3);
}

#[test]
fn self_referencing_object_is_reported_and_freed() {
    let drops = Drops::new();
    let mut mm = quiet();
    let (e, line) = (mm.create(entity(7, None, &drops)), line!());
    mm[&e].parent = Some(e.clone());
    drop(e);
    assert_eq!(mm.collect_garbage().objects, 0);
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    assert_eq!(report.iter().next().unwrap().site.line(), line);
    assert_eq!(drops.count(), 1);
}

// --- Keys and side tables -------------------------------------------------------------

#[test]
fn object_keys_index_a_secondary_map_across_types() {
    let drops = Drops::new();
    let mut mm = quiet();
    let tex = mm.create(texture(1, &drops));
    let mesh = mm.create(Mesh { vertices: vec![], token: drops.token() });
    let mat = mm.create(Material { albedo: tex.clone(), detail: None, token: drops.token() });
    let keys = [tex.key(), mesh.key(), mat.key()];
    let unique: HashSet<u32> = keys.iter().map(|k| k.index()).collect();
    assert_eq!(unique.len(), 3, "indices are unique across types");

    let mut names: SecondaryMap<ObjectKey, &str> = SecondaryMap::new();
    names.insert(tex.key(), "rock.png");
    names.insert(mesh.key(), "rock.obj");
    names.insert(mat.key(), "rock");
    assert_eq!((names[tex.key()], names[mesh.key()], names[mat.key()]), ("rock.png", "rock.obj", "rock"));
    let mut visited = Vec::new();
    mm[&mat].visit_handles(&mut |k| visited.push(k));
    assert_eq!(visited, [tex.key()]);
    assert_eq!(names[visited[0]], "rock.png");

    // After the mesh is destroyed and its slot reused, its old side data does not match the new key.
    let old_mesh_key = mesh.key();
    drop(mesh);
    mm.collect_garbage();
    let new_mesh = mm.create(Mesh { vertices: vec![], token: drops.token() });
    assert_eq!(new_mesh.key().index(), old_mesh_key.index());
    assert!(names.get(new_mesh.key()).is_none());
    assert!(names.contains_key(old_mesh_key));
    names.insert(new_mesh.key(), "tree.obj");
    assert!(names.get(old_mesh_key).is_none());
    assert_eq!(names[new_mesh.key()], "tree.obj");
    assert_eq!(names.len(), 3);
}

// --- Capacity ---------------------------------------------------------------------------

#[test]
fn try_create_hands_the_value_back_when_full() {
    let drops = Drops::new();
    let mut mm = ObjectManager::builder().report_leaks(false).max_objects_per_type(2).build();
    let a = mm.create(texture(1, &drops));
    let b = mm.create(texture(2, &drops));
    let err = mm.try_create(texture(3, &drops)).unwrap_err();
    assert_eq!(err.error, Error::CapacityExceeded { what: "Texture", limit: 2 });
    assert_eq!(err.to_string(), "capacity exceeded for Texture: the limit is 2");
    assert_eq!(drops.count(), 0, "the value was handed back, not dropped");
    let value = err.into_value();
    assert_eq!((value.width, value.pixels.len()), (3, 3));
    drop(value);
    assert_eq!(drops.count(), 1);
    assert_eq!(mm.count::<Texture>(), 2);

    // Other types have their own limit.
    let mesh = mm.create(Mesh { vertices: vec![], token: drops.token() });

    // A dead object still holds its slot until it is collected.
    drop(a);
    let err = mm.try_create(texture(4, &drops)).unwrap_err();
    assert!(matches!(err.error, Error::CapacityExceeded { .. }));
    drop(err);
    assert_eq!(mm.collect_garbage().objects, 1);
    let c = mm.try_create(texture(5, &drops)).expect("the collected slot is free again");
    assert_eq!(mm[&c].width, 5);
    drop((b, c, mesh));
    mm.collect_garbage();
    assert_eq!(drops.count(), 6);
}

/// The limit counts objects, so every thread gets the room below it: slots held for the
/// thread that collects (its run of fresh slots, the slots a collection freed) would be
/// refused to a loader while fewer objects than the limit exist, so a capped type holds
/// none. And `try_reserve` refuses what the limit cannot give, without overflowing.
#[test]
fn every_thread_may_create_up_to_the_limit() {
    let drops = Drops::new();
    let mut mm = ObjectManager::builder().report_leaks(false).max_objects_per_type(8).build();
    let first = [mm.create(texture(1, &drops)), mm.create(texture(2, &drops))];
    let loader = mm.loader();
    let loaded: Vec<_> = std::thread::scope(|s| {
        s.spawn(|| (3..9).map(|w| loader.try_create(texture(w, &drops)).map_err(|e| e.error)).collect()).join().unwrap()
    });
    assert!(loaded.iter().all(Result::is_ok), "8 objects fit a limit of 8: {loaded:?}");
    assert!(matches!(mm.try_create(texture(9, &drops)), Err(e) if matches!(e.error, Error::CapacityExceeded { .. })));

    // Freed by a collection on this thread, the slots are everyone's at once.
    drop(loaded);
    assert_eq!(mm.collect_garbage().objects, 6);
    let reloaded: Vec<_> = std::thread::scope(|s| {
        s.spawn(|| (10..16).map(|w| loader.try_create(texture(w, &drops)).map_err(|e| e.error)).collect())
            .join()
            .unwrap()
    });
    assert!(reloaded.iter().all(Result::is_ok), "the 6 freed slots are the loader's to take: {reloaded:?}");

    assert!(matches!(mm.try_reserve::<Texture>(usize::MAX), Err(Error::CapacityExceeded { .. })));
    assert!(matches!(mm.try_reserve::<Texture>(1), Err(Error::CapacityExceeded { .. })), "full");
    drop(reloaded);
    mm.collect_garbage();
    assert!(mm.try_reserve::<Texture>(6).is_ok());
    assert!(matches!(mm.try_reserve::<Texture>(7), Err(Error::CapacityExceeded { .. })));
    drop(first);
}

#[test]
#[should_panic(expected = "capacity exceeded for Texture: the limit is 1")]
fn create_panics_when_full() {
    let drops = Drops::new();
    let mm = ObjectManager::builder().report_leaks(false).max_objects_per_type(1).build();
    let _a = mm.create(texture(1, &drops));
    let _b = mm.create(texture(2, &drops));
}

// --- Panics in Drop ------------------------------------------------------------------------

#[test]
fn panicking_drop_during_collect_leaves_the_manager_consistent() {
    let drops = Drops::new();
    let tex_drops = Drops::new();
    let mut mm = quiet();
    let tex = mm.create(texture(9, &tex_drops));
    let bombs: Vec<_> = (0..6)
        .map(|i| {
            let held = (i == 3).then(|| tex.clone());
            mm.create(bomb(i == 3, held, &drops))
        })
        .collect();
    let old_indices: HashSet<u32> = bombs.iter().map(|b| b.key().index()).collect();
    drop(tex);
    drop(bombs);
    assert_eq!(mm.dead_count(), 6);

    let payload = catch_unwind(AssertUnwindSafe(|| mm.collect_garbage())).expect_err("the panic propagates");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"boom"));
    let destroyed = mm.report().get("Bomb").unwrap().destroyed as usize;
    assert_eq!(drops.count(), destroyed, "each destroyed bomb dropped its fields exactly once");
    assert!(destroyed >= 1);
    assert_eq!(mm.dead_count(), 6 - destroyed + 1, "the rest stay queued; the texture was released");
    assert_eq!(tex_drops.count(), 0);

    let rest = mm.collect_garbage();
    assert_eq!(rest.objects, 6 - destroyed + 1, "the next collect carries on");
    assert_eq!(drops.count(), 6, "no bomb dropped twice, none lost");
    assert_eq!(tex_drops.count(), 1);
    assert_eq!(mm.dead_count(), 0);
    let report = mm.report();
    let stats = report.get("Bomb").unwrap();
    assert_eq!((stats.created, stats.destroyed, stats.live, stats.dead_pending), (6, 6, 0, 0));

    // Every slot came back exactly once: six new objects reuse the six old slots.
    let again: Vec<_> = (0..6).map(|_| mm.create(bomb(false, None, &drops))).collect();
    let new_indices: HashSet<u32> = again.iter().map(|b| b.key().index()).collect();
    assert_eq!(new_indices, old_indices);
    drop(again);
    assert_eq!(mm.collect_garbage().objects, 6);
    assert_eq!(drops.count(), 12);
    assert!(mm.shutdown().is_empty());
}

#[test]
fn panicking_drop_in_every_object_still_destroys_each_once() {
    let drops = Drops::new();
    let mut mm = quiet();
    for _ in 0..4 {
        drop(mm.create(bomb(true, None, &drops)));
    }
    let mut panics = 0;
    while mm.dead_count() > 0 {
        if catch_unwind(AssertUnwindSafe(|| mm.collect_garbage())).is_err() {
            panics += 1;
        }
        assert!(panics <= 4, "each panic destroys one object");
    }
    assert_eq!(panics, 4);
    assert_eq!(drops.count(), 4);
    assert_eq!(mm.report().get("Bomb").unwrap().destroyed, 4);
}

/// A value whose `Drop` panics if armed; it cannot hold handles.
#[derive(MMObject)]
struct Fuse {
    armed: bool,
    token: DropToken,
}

impl Drop for Fuse {
    fn drop(&mut self) {
        if self.armed {
            panic!("fuse");
        }
    }
}

/// Slots released out of index order spread over the store's dead lanes,
/// which collection walks side by side: a panicking `Drop` among them, and a
/// budget per call, still destroy each object exactly once, keep every count
/// exact, and give every slot back.
#[test]
fn scattered_releases_with_a_panic_and_a_budget_destroy_each_once() {
    const N: usize = 40;
    let drops = Drops::new();
    let mut mm = quiet();
    let mut fuses: Vec<Option<Handle<Fuse>>> =
        (0..N).map(|i| Some(mm.create(Fuse { armed: i == 23, token: drops.token() }))).collect();
    let old: HashSet<u32> = fuses.iter().flatten().map(|f| f.key().index()).collect();
    // 17 and 40 are coprime: every fuse once, never right after its neighbour.
    for i in (0..N).map(|i| i * 17 % N) {
        drop(fuses[i].take());
    }
    assert_eq!(mm.dead_count(), N);

    let mut panics = 0;
    while mm.dead_count() > 0 {
        let before = mm.dead_count();
        match catch_unwind(AssertUnwindSafe(|| mm.collect_garbage_budgeted(7))) {
            Ok(stats) => assert_eq!(stats.objects, before.min(7)),
            Err(payload) => {
                assert_eq!(payload.downcast_ref::<&str>(), Some(&"fuse"));
                panics += 1;
            }
        }
        let destroyed = mm.report().get("Fuse").unwrap().destroyed as usize;
        assert_eq!(drops.count(), destroyed, "each destroyed fuse dropped once");
        assert_eq!(mm.dead_count(), N - destroyed, "the rest stay queued");
        assert!(panics <= 1);
    }
    assert_eq!((panics, drops.count()), (1, N));

    // Every slot came back exactly once.
    let again: Vec<_> = (0..N).map(|_| mm.create(Fuse { armed: false, token: drops.token() })).collect();
    assert_eq!(again.iter().map(|f| f.key().index()).collect::<HashSet<_>>(), old);
    drop(again);
    assert_eq!(mm.collect_garbage().objects, N);
    assert!(mm.shutdown().is_empty());
}

#[test]
fn panicking_drop_during_shutdown_is_caught_and_counted() {
    let drops = Drops::new();
    let mm = quiet();
    let dead = mm.create(bomb(true, None, &drops));
    drop(dead);
    let report = mm.shutdown();
    assert_eq!(report.drop_panics(), 1);
    assert!(report.is_empty());
    assert_eq!(drops.count(), 1);
}

/// Regression: a live object whose `Drop` panicked during shutdown was not
/// counted in `LeakReport::drop_panics`.
#[test]
fn panicking_drop_of_a_live_object_at_shutdown_is_counted() {
    let drops = Drops::new();
    let mut mm = quiet();
    let kept = mm.create(bomb(true, None, &drops));
    mm[&kept].other = Some(kept.clone()); // a cycle: still alive at shutdown
    drop(kept);
    drop(mm.create(bomb(true, None, &drops))); // dead: destroyed by the collection at shutdown
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    assert_eq!(report.drop_panics(), 2, "one dead and one live object panicked");
    assert_eq!(report.outliving_handles(), 0);
    assert_eq!(drops.count(), 2);
}

/// Regression: a `size()` that panicked during collection left its object on
/// the dead list, so every later collection stopped at it and shutdown looped
/// forever.
#[test]
fn panicking_size_during_collect_destroys_the_object_and_propagates() {
    let drops = Drops::new();
    let mut mm = quiet();
    for i in 0..4 {
        drop(mm.create(Gauge { fragile: Fragile(i == 2), token: drops.token() }));
    }
    let payload = catch_unwind(AssertUnwindSafe(|| mm.collect_garbage())).expect_err("the panic propagates");
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"fragile size"));
    let destroyed = mm.report().get("Gauge").unwrap().destroyed as usize;
    assert!(destroyed >= 1);
    assert_eq!(drops.count(), destroyed, "the fragile object was destroyed too");
    assert_eq!(mm.dead_count(), 4 - destroyed);
    let rest = mm.collect_garbage();
    assert_eq!(rest.objects, 4 - destroyed, "the next collect carries on");
    assert_eq!(rest.bytes, (4 - destroyed) * std::mem::size_of::<Gauge>());
    assert_eq!((drops.count(), mm.dead_count()), (4, 0));

    // Shutdown finishes too, with the panic counted.
    drop(mm.create(Gauge { fragile: Fragile(true), token: drops.token() }));
    let report = mm.shutdown();
    assert_eq!(report.drop_panics(), 1);
    assert!(report.is_empty());
    assert_eq!(drops.count(), 5);
}

// --- Odd shapes and limits ------------------------------------------------------------------

#[derive(MMObject)]
struct Marker;

#[derive(MMObject)]
#[repr(align(64))]
struct Aligned {
    lanes: [u64; 3],
}

#[test]
fn zero_sized_and_over_aligned_objects() {
    let mut mm = quiet();
    let markers: Vec<_> = (0..10).map(|_| mm.create(Marker)).collect();
    let keys: HashSet<ObjectKey> = markers.iter().map(|h| h.key()).collect();
    assert_eq!(keys.len(), 10, "zero-sized objects still get their own slots");
    let aligned: Vec<_> = (0..10).map(|i| mm.create(Aligned { lanes: [i; 3] })).collect();
    for (i, h) in aligned.iter().enumerate() {
        let value = &mm[h];
        assert_eq!(value as *const Aligned as usize % 64, 0);
        assert_eq!(value.lanes, [i as u64; 3]);
    }
    if cfg!(target_pointer_width = "64") {
        let report = mm.report();
        // The 16-byte header (count, generation, owner reservation, creation-site number), then the value.
        assert_eq!(report.get("Marker").unwrap().slot_bytes, 16);
        assert_eq!(report.get("Aligned").unwrap().slot_bytes, 128, "the value starts on its own alignment");
    }
    drop((markers, aligned));
    let stats = mm.collect_garbage();
    assert_eq!(stats.objects, 20);
    assert_eq!(stats.bytes, 10 * std::mem::size_of::<Aligned>());
}

#[derive(MMObject)]
struct Kind<A: 'static, B: 'static> {
    _types: std::marker::PhantomData<fn() -> (A, B)>,
}

fn kind<A, B>() -> Kind<A, B> {
    Kind { _types: std::marker::PhantomData }
}

macro_rules! markers {
    ($($m:ident)*) => { $(struct $m;)* };
}
markers!(K0 K1 K2 K3 K4 K5 K6 K7 K8 K9 K10 K11 K12 K13 K14 K15 K16);

macro_rules! create_each {
    ($mm:ident, $out:ident, $a:ident, [$($b:ident)*]) => {
        $( $out.push(Box::new($mm.create(kind::<$a, $b>())) as Box<dyn std::any::Any>); )*
    };
}

macro_rules! create_grid {
    ($mm:ident, $out:ident, [$($a:ident)*], $bs:tt) => {
        $( create_each!($mm, $out, $a, $bs); )*
    };
}

#[test]
#[allow(clippy::vec_init_then_push)] // the pushes come from a macro, one per type
fn the_type_table_holds_exactly_max_types() {
    let mm = quiet();
    let mut handles: Vec<Box<dyn std::any::Any>> = Vec::new();
    create_grid!(
        mm,
        handles,
        [K0 K1 K2 K3 K4 K5 K6 K7 K8 K9 K10 K11 K12 K13 K14 K15],
        [K0 K1 K2 K3 K4 K5 K6 K7 K8 K9 K10 K11 K12 K13 K14 K15]
    );
    assert_eq!(handles.len(), mmobject::object::MAX_TYPES);
    assert_eq!(mm.len(), 256);
    let err = mm.try_create(kind::<K16, K0>()).unwrap_err();
    assert_eq!(err.error, Error::CapacityExceeded { what: "object types in one manager", limit: 256 });
    let _value: Kind<K16, K0> = err.into_value();
    // Every registered type is still found (the lookup probes past collisions).
    assert_eq!(mm.count::<Kind<K0, K0>>(), 1);
    assert_eq!(mm.count::<Kind<K15, K15>>(), 1);
    assert_eq!(mm.count::<Kind<K16, K0>>(), 0);
    let again = mm.create(kind::<K7, K9>());
    assert_eq!(mm.count::<Kind<K7, K9>>(), 2);
    assert_eq!(mm.report().types.len(), 256);
    drop(again);
    drop(handles);
    assert_eq!(mm.dead_count(), 257);
    assert!(mm.shutdown().is_empty());
}

#[test]
#[cfg_attr(miri, ignore = "makes up to 256 managers: slow under Miri, and it checks logic, not memory")]
fn raw_handle_from_a_manager_with_the_same_tag_is_refused() {
    let drops = Drops::new();
    let a = quiet();
    let tex = a.create(texture(1, &drops));
    let raw = raw_of(&tex);
    // Raw handles carry only the low 8 bits of the manager id: find a manager that shares them.
    let b = loop {
        let b = quiet();
        if b.id() & 0xff == a.id() & 0xff {
            break b;
        }
    };
    let theirs: Vec<_> = (0..8).map(|w| b.create(texture(w, &drops))).collect();
    assert!(b.add_ref_raw(raw).is_err());
    assert!(b.release_raw(raw).is_err());
    assert!(b.handle_from_raw::<Texture>(raw).is_err());
    assert!(theirs.iter().all(|h| h.ref_count() == 1), "no object of the other manager was touched");
    assert_eq!(tex.ref_count(), 2);
    a.release_raw(raw).unwrap();
    drop(theirs);
    drop(b);
}

#[test]
#[should_panic(expected = "the game loop failed")]
fn manager_dropped_during_unwinding_survives_panicking_drops() {
    let drops = Drops::new();
    let mut mm = quiet();
    drop(mm.create(bomb(true, None, &drops))); // dead
    let kept = mm.create(bomb(true, None, &drops));
    mm[&kept].other = Some(kept.clone()); // alive at shutdown
    drop(kept);
    // The manager is dropped while this panic unwinds; both Drop panics are caught.
    panic!("the game loop failed");
}

/// A type whose slots fill a 4 MiB chunk six at a time, so a few objects span
/// several chunks (each with its own header): every handle still finds its
/// store, manager, key and count from its slot's address alone.
#[derive(MMObject)]
struct Chunky {
    id: u32,
    #[mm(skip)]
    bulk: [u8; 600_000],
}

#[test]
fn handles_across_chunk_boundaries() {
    // Values this large are moved through the stack a few times in debug builds.
    let big_stack = std::thread::Builder::new().stack_size(64 << 20);
    big_stack.spawn(handles_across_chunk_boundaries_body).unwrap().join().unwrap();
}

fn handles_across_chunk_boundaries_body() {
    const N: u32 = 20;
    let mut mm = quiet();
    let other = quiet();
    let handles: Vec<Handle<Chunky>> = (0..N).map(|id| mm.create(Chunky { id, bulk: [id as u8; 600_000] })).collect();
    let keys: HashSet<ObjectKey> = handles.iter().map(Handle::key).collect();
    assert_eq!(keys.len(), N as usize, "every object has its own key");
    for (id, handle) in (0..N).zip(&handles) {
        assert_eq!((mm[handle].id, mm[handle].bulk[599_999]), (id, id as u8));
        assert_eq!(mm.upgrade(handle.downgrade()).as_ref(), Some(handle));
        assert_eq!(mm.try_get_by_key::<Chunky>(handle.key()).map(|c| c.id), Ok(id));
        assert!(matches!(other.try_get(handle), Err(Error::WrongManager { .. })));
    }
    let walked: Vec<(ObjectKey, u32)> = mm.iter::<Chunky>().map(|(weak, c)| (weak.key(), c.id)).collect();
    let expected: Vec<(ObjectKey, u32)> = handles.iter().map(|h| (h.key(), mm[h].id)).collect();
    assert_eq!(walked, expected, "iteration crosses chunks in key order");
    let raw = handles[N as usize - 1].clone().into_raw();
    assert_eq!(mm.handle_from_raw::<Chunky>(raw).map(|h| h.key()), Ok(handles[N as usize - 1].key()));
    // The last drops, in every chunk, queue the right slots: all are collected.
    drop(handles);
    assert_eq!(mm.collect_garbage().objects, N as usize);
    assert!(keys.iter().all(|&key| mm.try_get_by_key::<Chunky>(key).is_err()));
    assert_eq!(mm.count::<Chunky>(), 0);
}
