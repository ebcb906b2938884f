//! The open state that loaders create under, and the check that turns a
//! shutdown inside a loader's create on the same thread (a deadlock) into a
//! clear panic.
//!
//! A [`Loader`](crate::Loader)'s create holds a shared lock on its manager's
//! open state for the whole create, so that shutdown, which takes the lock
//! exclusively to close it, waits for every create under way. Such a create
//! runs user code: the iterator of `Loader::create_many`, and the store
//! allocator, `size()` or a logger. If that code shuts the manager down (or
//! drops it) on the same thread, shutdown would wait for the create that is
//! waiting for it, forever. So each thread keeps a list of the gates it is
//! inside, linked through the frames of the calls that entered them (no
//! allocation, and two thread-local accesses per create), and the manager's
//! shutdown asks [`OpenGate::entered_here`] before it closes the gate.

use std::cell::Cell;
use std::ptr;

use crate::sync::RwLock;

/// A manager's open state, for its loaders.
///
/// # Invariants
///
/// - The value is true until the manager shuts down, and false after: only
///   [`close`](Self::close) writes it, under the write lock.
/// - A thread is inside the gate, holding the read lock, for exactly the
///   duration of an [`enter`](Self::enter) call; its [`INSIDE`] list then
///   holds an [`Entry`] naming this gate (see there).
#[derive(Debug)]
pub(crate) struct OpenGate {
    open: RwLock<bool>,
}

/// One `enter` call under way on this thread: the gate it entered, and the
/// entry of the call it is nested in (null for the outermost).
///
/// It lives in the frame of its `enter` call, which links it into
/// [`INSIDE`] after taking the read lock and unlinks it (through [`Leave`],
/// also when `f` unwinds) before that frame ends and before the lock is
/// released. So every entry reachable from `INSIDE` is alive, entries are
/// unlinked in the reverse order of their linking, and an entry's gate is
/// borrowed by its call, so it is alive and at its address.
struct Entry {
    gate: *const OpenGate,
    outer: *const Entry,
}

// The innermost `enter` call under way on this thread (see `Entry`).
#[cfg(not(loom))]
std::thread_local!(static INSIDE: Cell<*const Entry> = const { Cell::new(ptr::null()) });
#[cfg(loom)]
loom::thread_local!(static INSIDE: Cell<*const Entry> = Cell::new(ptr::null()));

/// Restores `INSIDE` to the entry an `enter` call was nested in.
struct Leave(*const Entry);

impl Drop for Leave {
    #[inline(always)]
    fn drop(&mut self) {
        INSIDE.with(|inside| inside.set(self.0));
    }
}

impl OpenGate {
    pub(crate) fn new() -> Self {
        OpenGate { open: RwLock::new(true) }
    }

    /// Runs `f` inside the gate, with `true` if the manager is open: a
    /// shutdown then waits until `f` returns. With `false` (it has shut
    /// down), nothing waits for `f`.
    ///
    /// The lock is recursive: `f` may enter again (user code under a create
    /// that creates through a loader). A plain read lock would queue behind
    /// a waiting shutdown, which waits for the outer `enter`: a deadlock.
    #[inline]
    pub(crate) fn enter<R>(&self, f: impl FnOnce(bool) -> R) -> R {
        let open = self.open.read_recursive();
        let entry = Entry { gate: self, outer: INSIDE.with(Cell::get) };
        INSIDE.with(|inside| inside.set(ptr::from_ref(&entry)));
        // Declared after `open` and `entry`, so it unlinks `entry` before
        // either goes away (`Entry`).
        let _leave = Leave(entry.outer);
        f(*open)
    }

    /// True until the manager shuts down (it may shut down right after).
    pub(crate) fn is_open(&self) -> bool {
        *self.open.read_recursive()
    }

    /// True if this thread is inside the gate: a call of
    /// [`enter`](Self::enter) on it is under way on this thread, and
    /// [`close`](Self::close) would wait for it forever.
    pub(crate) fn entered_here(&self) -> bool {
        let mut at = INSIDE.with(Cell::get);
        while !at.is_null() {
            // SAFETY: an entry reachable from `INSIDE` is alive and only
            // read (`Entry`).
            let entry = unsafe { &*at };
            if ptr::eq(entry.gate, self) {
                return true;
            }
            at = entry.outer;
        }
        false
    }

    /// Closes the gate: waits until every thread inside has left, then
    /// sets the state to shut down.
    ///
    /// # Panics
    ///
    /// Panics if this thread is inside the gate (see
    /// [`entered_here`](Self::entered_here)), which the caller checks first.
    pub(crate) fn close(&self) {
        assert!(!self.entered_here(), "a gate is closed only from outside it");
        *self.open.write() = false;
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_thread_knows_which_gates_it_is_inside() {
        let (a, b) = (OpenGate::new(), OpenGate::new());
        assert!(!a.entered_here());
        a.enter(|open| {
            assert!(open);
            assert!(a.entered_here() && !b.entered_here());
            b.enter(|_| {
                a.enter(|_| assert!(a.entered_here() && b.entered_here()));
                assert!(a.entered_here() && b.entered_here(), "the outer entry of `a` is still there");
            });
            assert!(a.entered_here() && !b.entered_here());
            // Another thread is not inside, and closing from there waits for this one.
            std::thread::scope(|s| assert!(!s.spawn(|| a.entered_here()).join().unwrap()));
        });
        assert!(!a.entered_here());
        a.close();
        assert!(!a.is_open());
        assert!(!a.enter(|open| open));
    }

    #[test]
    fn an_unwinding_call_leaves_the_gate() {
        let gate = OpenGate::new();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gate.enter(|_| panic!("user code"))));
        assert!(unwound.is_err());
        assert!(!gate.entered_here());
        gate.close();
        assert!(!gate.is_open());
    }
}
