//! A last drop on a worker thread paused between its count and its record
//! in its ring of last drops, while the manager shuts down: the store's
//! memory must outlive the paused drop. The pause is a global allocator hook
//! (the worker's first last drop allocates its ring of last drops), which is
//! process-wide, so this lives in a binary of its own. The store is kept on
//! purpose (that is what keeps the drop sound), so Miri runs it with leaks
//! ignored.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use mmobject::{MMObject, ObjectManager};

mod support;
use support::{DropToken, Drops};

#[derive(MMObject)]
struct Entity {
    id: usize,
    token: DropToken,
}

thread_local! {
    /// Set by a thread whose next allocation waits for [`RESUME`].
    static ARMED: Cell<bool> = const { Cell::new(false) };
}

/// Set when an armed thread's allocation is waiting.
static PAUSED: AtomicBool = AtomicBool::new(false);
/// Lets the waiting allocation go on.
static RESUME: AtomicBool = AtomicBool::new(false);

/// `System`, except that an armed thread's next allocation first waits for
/// [`RESUME`] (spinning: the wait allocates nothing).
struct PausingAlloc;

// SAFETY: forwards every call to `System` unchanged; the wait before an
// allocation touches only atomics and a thread-local `Cell`.
unsafe impl GlobalAlloc for PausingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ARMED.try_with(|armed| armed.replace(false)).unwrap_or(false) {
            PAUSED.store(true, Ordering::SeqCst);
            while !RESUME.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
        }
        // SAFETY: the caller's contract, forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (`alloc` above).
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: PausingAlloc = PausingAlloc;

/// A worker's drop takes the count of an object of an owned manager to
/// zero, and then records the slot in its ring of last drops (reading the
/// slot's chunk header, writing the entry). It is paused in between, at its
/// ring's allocation, and the manager shuts down on another thread. The slot
/// is neither free nor listed, so shutdown must count it as held and keep
/// the store: else the worker's entry names freed memory (a use after free
/// when its ring drains). This once happened when a last drop found a flag
/// another drop had set (the remote drops' compare-exchange of earlier
/// versions); a remote drop is now one `fetch_sub`, and this guards its
/// last-drop path.
#[test]
fn shutdown_keeps_the_store_while_a_last_drop_is_on_its_way() {
    let drops = Drops::new();
    let mm = ObjectManager::builder().report_leaks(false).owner_thread(true).build();
    let h = mm.create(Entity { id: 1, token: drops.token() });
    // An `upgrade` with no reservation counts in the word: two handles, nothing reserved.
    let sent = mm.upgrade(h.downgrade()).expect("alive");
    drop(h); // on the owner, with no reservation: one count is left, the worker's
    let worker = std::thread::spawn(move || {
        ARMED.with(|armed| armed.set(true));
        // A fresh thread: this is its first last drop, and its ring is allocated in it.
        drop(sent);
    });
    while !PAUSED.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
    let report = std::thread::spawn(move || mm.shutdown()).join().unwrap();
    RESUME.store(true, Ordering::SeqCst);
    // The worker records its last drop and exits, draining its ring into the store.
    worker.join().unwrap();
    assert_eq!(report.outliving_handles(), 1, "the store outlives the worker's last drop");
    assert_eq!(drops.count(), 1, "shutdown destroyed the value once");
    let other = ObjectManager::builder().report_leaks(false).build();
    assert_eq!(other.dead_count(), 0, "every ring drained");
    assert_eq!(drops.count(), 1, "and never again");
}
