//! `ObjectManager::view`: the typed fast path gives the same answers as the
//! manager's own methods.

use std::panic::{catch_unwind, AssertUnwindSafe};

use mmobject::{Handle, MMObject, WeakHandle};

mod support;
use support::quiet_with;

#[derive(MMObject)]
struct Unit {
    hp: u32,
}

#[derive(MMObject)]
struct Other(#[allow(dead_code)] u8);

#[test]
fn view_matches_the_manager_across_segments_and_reuse() {
    let mut mm = quiet_with(2);
    let n = if cfg!(miri) { 40 } else { 1000 };
    let mut units: Vec<Option<Handle<Unit>>> = (0..n).map(|hp| Some(mm.create(Unit { hp }))).collect();
    let weaks: Vec<WeakHandle<Unit>> = units.iter().map(|h| h.as_ref().unwrap().downgrade()).collect();
    for (i, unit) in units.iter_mut().enumerate() {
        if i % 3 == 0 {
            *unit = None;
        }
    }
    {
        let view = mm.view::<Unit>();
        for (i, &weak) in weaks.iter().enumerate() {
            let expected = mm.get_weak(weak).map(|u| u.hp);
            assert_eq!(view.get_weak(weak).map(|u| u.hp), expected);
            assert_eq!(expected, (i % 3 != 0).then_some(i as u32));
            assert_eq!(view.is_alive(weak), i % 3 != 0);
        }
        for unit in units.iter().flatten() {
            assert_eq!(view.get(unit).hp, mm[unit].hp);
        }
        assert_eq!(view.iter().count(), mm.iter::<Unit>().count());
    }
    mm.collect_garbage();
    // Reused slots must not validate the old weak handles.
    let fresh: Vec<_> = (0..n).map(|hp| mm.create(Unit { hp: hp + 10_000 })).collect();
    let view = mm.view::<Unit>();
    for (i, &weak) in weaks.iter().enumerate() {
        assert_eq!(view.get_weak(weak).map(|u| u.hp), (i % 3 != 0).then_some(i as u32));
        assert_eq!(view.upgrade(weak).is_some(), i % 3 != 0);
    }
    for h in &fresh {
        assert_eq!(view.get_weak(h.downgrade()).unwrap().hp, mm[h].hp);
    }
}

#[test]
fn view_made_before_the_type_has_a_store_still_sees_it() {
    let mm = quiet_with(2);
    let view = mm.view::<Unit>();
    assert_eq!(view.iter().count(), 0);
    let unit = mm.create(Unit { hp: 7 });
    assert_eq!(view.get_weak(unit.downgrade()).unwrap().hp, 7);
    assert_eq!(view.get(&unit).hp, 7);
    assert_eq!(view.iter().count(), 1);
    let strong = view.upgrade(unit.downgrade()).unwrap();
    assert!(Handle::ptr_eq(&strong, &unit));
}

#[test]
fn view_rejects_handles_of_another_manager() {
    let a = quiet_with(2);
    let b = quiet_with(2);
    let unit = a.create(Unit { hp: 1 });
    let _other = b.create(Unit { hp: 2 });
    let view = b.view::<Unit>();
    assert!(catch_unwind(AssertUnwindSafe(|| view.get_weak(unit.downgrade()).is_some())).is_err());
    assert!(catch_unwind(AssertUnwindSafe(|| view.get(&unit).hp)).is_err());
    assert!(catch_unwind(AssertUnwindSafe(|| view.upgrade(unit.downgrade()).is_some())).is_err());
    let _ = b.view::<Other>();
}

#[test]
fn handle_keys_and_reuse() {
    let mut mm = quiet_with(2);
    let handles: Vec<_> = (0..100).map(|hp| mm.create(Unit { hp })).collect();
    let keys: Vec<_> = handles.iter().map(Handle::key).collect();
    let from_iter: Vec<_> = mm.iter::<Unit>().map(|(w, _)| w.key()).collect();
    assert_eq!(keys, from_iter, "a handle's key is the store's");
    let copy = handles[5].clone();
    assert_eq!(copy, handles[5]);
    assert_ne!(handles[4], handles[5]);
    drop(copy);
    drop(handles);
    mm.collect_garbage();
    let again = mm.create(Unit { hp: 1 });
    assert!(keys.iter().any(|k| k.index() == again.key().index()), "a slot is reused");
    assert!(!keys.contains(&again.key()), "with a new generation");
    assert_eq!(mm.get_weak(again.downgrade()).unwrap().hp, 1);
}
