//! Allocator ids never repeat (issue 8: wrap-around of every counter).
//!
//! A `FrameRef` or a `Marker` is checked against the id of the allocator it came from. Were
//! ids to wrap, a `FrameRef` of a dropped `DoubleBufferedAllocator` would pass the owner
//! check of a new one with the same id and read memory that holds no `T`. The id counter is
//! process-wide and the hook moves it to the end of its range, so this test has a binary of
//! its own.

use mmobject::alloc::{__advance_allocator_ids, DoubleBufferedAllocator, StackAllocator};

#[test]
fn ids_run_out_instead_of_wrapping() {
    let first = DoubleBufferedAllocator::with_capacity(64);
    let r = first.alloc(1u64);
    // The hook only moves the counter forward; moving it back is a no-op.
    __advance_allocator_ids(u64::MAX - 4); // 3 ids for `last`, 1 for `_one_more`
    __advance_allocator_ids(0);
    let last = DoubleBufferedAllocator::with_capacity(64);
    last.alloc(2u64);
    assert!(last.try_get(r).is_err(), "another allocator's reference is refused");
    let _one_more = StackAllocator::with_capacity(16); // takes the last id, u64::MAX - 1
    for _ in 0..2 {
        let exhausted = std::panic::catch_unwind(|| DoubleBufferedAllocator::with_capacity(64));
        let payload = exhausted.expect_err("no id is left");
        let message = payload.downcast_ref::<&str>().copied().unwrap_or_default();
        assert!(message.contains("allocator ids exhausted"), "{message}");
    }
    assert_eq!(*first.get(r), 1);
}
