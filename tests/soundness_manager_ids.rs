//! The end of the manager ids. Ids are process-wide, so this test has a
//! binary of its own: after it, no manager can be built in this process.

use mmobject::{MMObject, ObjectManager};

#[derive(MMObject)]
struct Item {
    id: u32,
}

/// Ids never wrap: once they are used up, `build` keeps panicking with a
/// clear message, and a handle of an old manager never passes a new
/// manager's check. Before the fix, the id counter wrapped after the first
/// panic and ids 0, 1, 2… were handed out again.
#[test]
fn manager_ids_never_wrap() {
    let old = ObjectManager::new();
    let old_handle = old.create(Item { id: 1 });

    // Handles carry the id in 16 bits: the last id is 2^16 - 1.
    const LAST: u32 = (1 << 16) - 1;
    mmobject::object::skip_manager_ids_for_tests(LAST - 1);
    let second_last = ObjectManager::new();
    let last = ObjectManager::new();
    assert_eq!((second_last.id(), last.id()), (LAST - 1, LAST));
    // The last id fills every bit a handle keeps for it, and still tells the managers apart.
    let last_handle = last.create(Item { id: 2 });
    assert_eq!(last.try_get(&last_handle).map(|item| item.id), Ok(2));
    assert_eq!(last.try_get_weak(last_handle.downgrade()).map(|item| item.id), Ok(2));
    assert!(matches!(second_last.try_get(&last_handle), Err(mmobject::Error::WrongManager { .. })));
    assert!(matches!(second_last.try_get_weak(last_handle.downgrade()), Err(mmobject::Error::WrongManager { .. })));
    for _ in 0..3 {
        let panic = std::panic::catch_unwind(ObjectManager::new).unwrap_err();
        let message = panic.downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        assert!(message.contains("object manager ids are used up"), "{message}");
    }
    // Moving the counter down is impossible through the hook.
    mmobject::object::skip_manager_ids_for_tests(1);
    assert!(std::panic::catch_unwind(ObjectManager::new).is_err());

    for mm in [&second_last, &last] {
        assert!(matches!(mm.try_get(&old_handle), Err(mmobject::Error::WrongManager { .. })));
        assert!(matches!(mm.try_get_weak(old_handle.downgrade()), Err(mmobject::Error::WrongManager { .. })));
    }
    assert_eq!(old[&old_handle].id, 1);
}
