//! The open state that loaders create under: a gate that shutdown closes,
//! and waits for every create inside to leave.
//!
//! A [`Loader`](crate::Loader)'s create is inside its manager's gate for the
//! whole create, so that shutdown, which closes the gate, waits for every
//! create under way and no loader touches a store being torn down.
//!
//! **Sharded counts.** Loader threads that create all the time all enter the
//! gate, once per create. A reader-writer lock made each entry two locked
//! operations on one line that every loader thread writes (a quarter of two
//! workers' time, `BENCHMARKS.md`, O8). Instead a thread counts itself in
//! one of [`SHARDS`] counters, each on a cache line of its own, chosen by
//! its thread token, and then reads the `closed` flag: a line that only
//! shutdown writes, so it stays in every core's cache. Shutdown sets the
//! flag, then waits until every shard reads zero. Each side puts a `SeqCst`
//! fence between its write and its read, so at least one of them sees the
//! other: either the create sees the gate closed, or shutdown sees it
//! counted and waits. (Fences rather than `SeqCst` accesses, which would
//! do on their own: loom models the fences, not the accesses.)
//!
//! **Nested entries.** A create runs user code: the iterator of
//! `Loader::create_many`, and the store allocator, `size()` or a logger.
//! That code may create through a loader again, and must get in even when a
//! shutdown closed the gate meanwhile, since that shutdown waits for the
//! create the code runs in. So each thread keeps a list of the gates it was
//! let into, linked through the frames of the calls that entered them (no
//! allocation), and an entry that finds the gate closed still gets in if
//! its thread is inside already.
//!
//! **Shutdown inside.** If such code shuts the manager down (or drops it)
//! on the same thread, shutdown would wait for the create that is waiting
//! for it, forever. The manager's shutdown asks
//! [`OpenGate::entered_here`] first, and panics instead.

use std::cell::Cell;
use std::ptr;

use crate::sync::{fence, AtomicBool, AtomicUsize, Ordering};

/// Counters of the creates inside a gate (few under loom, to keep the
/// models small).
#[cfg(not(loom))]
const SHARDS: usize = 16;
#[cfg(loom)]
const SHARDS: usize = 2;

/// One counter of the creates inside, alone on its cache line (two lines:
/// the adjacent-line prefetcher pairs them).
#[derive(Debug)]
#[repr(align(128))]
struct Shard(AtomicUsize);

/// A manager's open state, for its loaders.
///
/// # Invariants
///
/// - `closed` is false until the manager shuts down, and true after: only
///   [`close`](Self::close) stores it.
/// - A thread is *inside* the gate for exactly the duration of an
///   [`enter`](Self::enter) call that let it in (called `f` with `true`).
///   Meanwhile the shard its thread token picks counts that call, and its
///   [`INSIDE`] list holds an [`Entry`] naming this gate (see there).
///   A count is added, then a `SeqCst` fence, then `closed` is read; it is
///   taken away (`Release`) after `f` returns or unwinds. `close` stores
///   `closed`, then a `SeqCst` fence, then reads the counts (`Acquire`).
/// - Once `close` returns, no call is inside, and none gets in: a later
///   `enter` reads `closed` (and takes its count away at once), and there
///   is no call inside left for it to be nested in.
#[derive(Debug)]
pub(crate) struct OpenGate {
    closed: AtomicBool,
    inside: Box<[Shard; SHARDS]>,
}

/// One `enter` call that let its thread in: the gate, and the entry of the
/// call it is nested in (null for the outermost).
///
/// It lives in the frame of its `enter` call, which links it into
/// [`INSIDE`] and unlinks it (through [`Leave`], also when `f` unwinds)
/// before that frame ends. So every entry reachable from `INSIDE` is alive,
/// entries are unlinked in the reverse order of their linking, and an
/// entry's gate is borrowed by its call, so it is alive and at its address.
struct Entry {
    gate: *const OpenGate,
    outer: *const Entry,
}

// The innermost `enter` call that let this thread in (see `Entry`).
#[cfg(not(loom))]
std::thread_local!(static INSIDE: Cell<*const Entry> = const { Cell::new(ptr::null()) });
#[cfg(loom)]
loom::thread_local!(static INSIDE: Cell<*const Entry> = Cell::new(ptr::null()));

/// The end of an `enter` call that let its thread in: restores `INSIDE` to
/// the entry the call was nested in, then takes the call's count away.
struct Leave<'a> {
    outer: *const Entry,
    shard: &'a Shard,
}

impl Drop for Leave<'_> {
    #[inline(always)]
    fn drop(&mut self) {
        INSIDE.with(|inside| inside.set(self.outer));
        // `Release`: what the create did happens before the shutdown that
        // reads the count as zero.
        self.shard.0.fetch_sub(1, Ordering::Release);
    }
}

impl OpenGate {
    pub(crate) fn new() -> Self {
        OpenGate {
            closed: AtomicBool::new(false),
            inside: Box::new(std::array::from_fn(|_| Shard(AtomicUsize::new(0)))),
        }
    }

    /// Runs `f` inside the gate, with `true` if the manager is open, or if
    /// this thread is inside already (a create under way, which the
    /// shutdown waits for): a shutdown then waits until `f` returns. With
    /// `false` (it has shut down), nothing waits for `f`.
    ///
    /// It never waits itself, so a create nested in another's user code
    /// gets in while a shutdown waits for the outer one.
    #[inline]
    pub(crate) fn enter<R>(&self, f: impl FnOnce(bool) -> R) -> R {
        let shard = &self.inside[crate::sync::thread_shard(SHARDS)];
        shard.0.fetch_add(1, Ordering::Relaxed);
        // Pairs with `close`'s: the count is seen, or the closing is.
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::Relaxed) && !self.entered_here() {
            shard.0.fetch_sub(1, Ordering::Relaxed);
            return f(false);
        }
        let entry = Entry { gate: self, outer: INSIDE.with(Cell::get) };
        INSIDE.with(|inside| inside.set(ptr::from_ref(&entry)));
        // Declared after `entry`, so it unlinks `entry` before it goes away.
        let _leave = Leave { outer: entry.outer, shard };
        f(true)
    }

    /// True until the manager shuts down (it may shut down right after).
    pub(crate) fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Relaxed)
    }

    /// True if this thread is inside the gate: a call of
    /// [`enter`](Self::enter) that let it in is under way on this thread,
    /// and [`close`](Self::close) would wait for it forever.
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

    /// Closes the gate, then waits until every create inside has left.
    /// The wait spins briefly, then yields, then sleeps: a loader's batch
    /// may take a while, and shutdown is rare.
    ///
    /// # Panics
    ///
    /// Panics if this thread is inside the gate (see
    /// [`entered_here`](Self::entered_here)), which the caller checks first.
    pub(crate) fn close(&self) {
        assert!(!self.entered_here(), "a gate is closed only from outside it");
        self.closed.store(true, Ordering::Relaxed);
        // Pairs with `enter`'s: a create is seen counted, or sees the closing.
        fence(Ordering::SeqCst);
        let mut waits = 0u32;
        while self.inside.iter().any(|shard| shard.0.load(Ordering::Acquire) != 0) {
            pause(waits);
            waits = waits.saturating_add(1);
        }
    }
}

/// The `waits`th pause of a shutdown waiting for creates to leave.
fn pause(waits: u32) {
    #[cfg(not(loom))]
    match waits {
        0..64 => std::hint::spin_loop(),
        64..128 => std::thread::yield_now(),
        _ => std::thread::sleep(std::time::Duration::from_micros(100)),
    }
    #[cfg(loom)]
    {
        let _ = waits;
        loom::thread::yield_now();
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicBool as StdBool;

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
            std::thread::scope(|s| assert!(!s.spawn(|| a.entered_here()).join().unwrap()));
        });
        assert!(!a.entered_here());
        a.close();
        assert!(!a.is_open());
        assert!(!a.enter(|open| open));
        assert!(!a.entered_here(), "a call the closed gate did not let in is not inside");
    }

    #[test]
    fn an_unwinding_call_leaves_the_gate() {
        let gate = OpenGate::new();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| gate.enter(|_| panic!("user code"))));
        assert!(unwound.is_err());
        assert!(!gate.entered_here());
        gate.close(); // would wait forever for a count the unwind left behind
        assert!(!gate.is_open());
    }

    /// Closing waits for the thread inside; that thread's nested entry still
    /// gets in meanwhile, and a new one from outside does not.
    #[test]
    fn close_waits_for_the_thread_inside_whose_nested_entries_still_get_in() {
        let gate = OpenGate::new();
        let (entered, left) = (StdBool::new(false), StdBool::new(false));
        std::thread::scope(|s| {
            let inside = s.spawn(|| {
                gate.enter(|open| {
                    assert!(open);
                    entered.store(true, std::sync::atomic::Ordering::SeqCst);
                    while gate.is_open() {
                        std::thread::yield_now();
                    }
                    // Closed meanwhile, and the closer waits for this call.
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    let nested = gate.enter(|open| open);
                    left.store(true, std::sync::atomic::Ordering::SeqCst);
                    nested
                })
            });
            while !entered.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::yield_now();
            }
            gate.close();
            assert!(left.load(std::sync::atomic::Ordering::SeqCst), "close returned before the call inside left");
            assert!(inside.join().unwrap(), "the nested entry got in");
        });
        assert!(!gate.enter(|open| open), "a new entry after close does not");
    }
}
