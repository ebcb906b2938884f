//! A flagged check lost because the store allocator panicked while a drain
//! queued it. Rings of last drops are process-wide (any thread's drain
//! drains every ring), so this lives in a binary of its own: a drain in
//! another test could queue the check before the allocator is armed.

mod support;

use std::alloc::{Layout, System};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use mmobject::allocator_api2::alloc::{AllocError, Allocator};
use mmobject::{MMObject, ObjectManager};

#[derive(MMObject)]
struct Entity {
    x: f32,
}

/// Serves blocks from `System`, but panics at the next request once told to.
#[derive(Clone, Default)]
struct Panicking(Arc<std::sync::atomic::AtomicBool>);

// SAFETY: forwards to `System`, or panics before serving anything.
unsafe impl Allocator for Panicking {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if self.0.swap(false, Ordering::SeqCst) {
            panic!("the store allocator panics on purpose");
        }
        System.allocate(layout)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: forwarded: the block came from `System` with this layout.
        unsafe { System.deallocate(ptr, layout) }
    }
}

/// A worker's drop sets `CHECK` on an object the owner holds no reservation
/// on, and the store allocator panics while a drain queues its check: the
/// drain unwinds, the check is lost, and its flag goes with it, so the
/// owner's last drop leaves the object dead and the next collection
/// destroys it (since `da1fa1a` and before `give_up_flag`, only the lost
/// check could end it: it was never collected).
#[test]
fn a_flagged_check_lost_to_a_panicking_drain_leaves_no_object_behind() {
    let panicking = Panicking::default();
    let mut mm = ObjectManager::builder().report_leaks(false).owner_thread(true).allocator(panicking.clone()).build();
    let e = mm.create(Entity { x: 1.0 });
    let (e, other) = support::cloned_elsewhere(e);
    // The drop on another thread sets `CHECK` and records its check in the
    // ring of a thread that stays alive until the owner drained it.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let worker = std::thread::spawn(move || {
        drop(other);
        done_tx.send(()).unwrap();
        rx.recv().unwrap();
    });
    done_rx.recv().unwrap();
    panicking.0.store(true, Ordering::SeqCst);
    let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.dead_count()));
    assert!(drained.is_err(), "queueing the check panicked");
    tx.send(()).unwrap();
    worker.join().unwrap();
    drop(e); // the last count, on the owner, with no reservation
    assert_eq!(mm.len(), 0, "no handle is left");
    assert_eq!(mm.collect_garbage().objects, 1, "the object dies");
    let report = mm.shutdown();
    assert_eq!(report.outliving_handles(), 0);
}
