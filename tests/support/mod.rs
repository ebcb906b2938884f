//! Helpers the object test binaries share: a drop counter, a manager that
//! logs nothing at shutdown, a clone made on another thread, a store
//! allocator that counts its live bytes, and a lock for tests that must not
//! run beside the others of their binary. Each binary includes this with `mod support;`
//! and uses only some of it.

#![allow(dead_code)]

use std::alloc::{Layout, System};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mmobject::allocator_api2::alloc::{AllocError, Allocator};
use mmobject::{Handle, ObjectManager};

/// Counts how many values holding one of its tokens were dropped. Each test
/// owns its counter, so tests can run in parallel.
#[derive(Clone, Default)]
pub struct Drops(Arc<AtomicUsize>);

impl Drops {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    pub fn token(&self) -> DropToken {
        DropToken(Arc::clone(&self.0))
    }
}

/// A field that bumps its counter when the object that holds it is dropped.
pub struct DropToken(Arc<AtomicUsize>);

impl Drop for DropToken {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A manager that logs nothing at shutdown, with tiny segments (4 slots) so
/// slots are reused early.
pub fn quiet() -> ObjectManager {
    quiet_with(4)
}

/// A manager that logs nothing at shutdown, with segments of `segment_base`
/// slots (rounded up to a power of two).
pub fn quiet_with(segment_base: u32) -> ObjectManager {
    ObjectManager::builder().report_leaks(false).segment_base(segment_base).build()
}

/// Returns `handle` and a clone of it made on another thread, so that a
/// manager's owner thread holds no reservation on the object for it (the
/// clone counts in the slot's word, as any thread's but the owner's does).
pub fn cloned_elsewhere<T: 'static>(handle: Handle<T>) -> (Handle<T>, Handle<T>) {
    std::thread::spawn(move || {
        let clone = handle.clone();
        (handle, clone)
    })
    .join()
    .unwrap()
}

/// A store allocator over `System` that counts the bytes it handed out and
/// has not taken back. Clones share the count.
#[derive(Clone, Default)]
pub struct LiveBytes(Arc<AtomicUsize>);

impl LiveBytes {
    /// The bytes allocated and not yet freed.
    pub fn bytes(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// How many clones of this allocator are alive (this one included).
    pub fn clones(&self) -> usize {
        Arc::strong_count(&self.0)
    }
}

// SAFETY: every block comes from and goes back to `System`; the count is on top.
unsafe impl Allocator for LiveBytes {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        self.0.fetch_add(layout.size(), Ordering::SeqCst);
        System.allocate(layout)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        self.0.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: forwarded: the block came from `System` with this layout.
        unsafe { System.deallocate(ptr, layout) }
    }
}

/// Serialises the tests of a binary that hold deferred drops. Any
/// manager's collection, `dead_count` or shutdown drains every thread's
/// ring of deferred drops, so a test that checks a drop is still pending
/// fails if another test of its binary collects meanwhile (the harness runs
/// them on parallel threads). Every test of such a binary takes this first.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    // A failed test poisons the lock; the others still run, one at a time.
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
