//! The check of an owner's lease lost because the store allocator panicked
//! while a drain queued it. Rings of last drops are process-wide (any
//! thread's drain drains every ring), so this lives in a binary of its own:
//! a drain in another test could queue the check before the allocator is
//! armed.

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
    token: Token,
}

/// Counts its drops.
struct Token(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Token {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
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

/// The owner clones an object (a lease: its check goes in the owner's ring),
/// and the store allocator panics while a drain queues that check: the
/// drain unwinds and the check is lost, so the reservation stays and the
/// object, once its handles are gone, waits: `upgrade` fails (the owner
/// saw its last handle go), but no collection destroys it, and the counts
/// that are kept from the queued checks (`len`, `dead_count`) take it for
/// alive. Shutdown on the owner thread gives back every
/// reservation, lost checks or not: the object is destroyed once and nothing
/// is reported outliving.
#[test]
fn a_lease_whose_check_is_lost_ends_at_shutdown() {
    let panicking = Panicking::default();
    let drops = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut mm = ObjectManager::builder().report_leaks(false).owner_thread(true).allocator(panicking.clone()).build();
    let e = mm.create(Entity { x: 1.0, token: Token(Arc::clone(&drops)) });
    let clone = e.clone(); // the owner's first clone: a lease, its check in the ring
    panicking.0.store(true, Ordering::SeqCst);
    let drained = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.dead_count()));
    assert!(drained.is_err(), "queueing the check panicked");
    let weak = e.downgrade();
    drop((e, clone)); // into the reservation: no handle is left
    assert!(mm.upgrade(weak).is_none(), "no handle is left");
    assert_eq!((mm.len(), mm.dead_count()), (1, 0), "no check names it");
    assert_eq!(mm.collect_garbage().objects, 0, "its check is lost: it waits");
    assert_eq!(drops.load(Ordering::SeqCst), 0);
    let report = mm.shutdown();
    assert!(report.is_empty(), "not reported as a leak: it has no handle");
    assert_eq!(report.outliving_handles(), 0, "the give-back at shutdown lists it");
    assert_eq!(drops.load(Ordering::SeqCst), 1, "destroyed once");
}
