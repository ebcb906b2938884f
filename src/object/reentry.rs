//! Locks that user code can run under, and the check that turns a second
//! acquisition by the same thread (a deadlock) into a clear panic.
//!
//! The manager calls user code while it holds a few of its locks: the store
//! allocator (when a store grows, registers, or one of its side tables
//! grows), and a logger or a budget callback reached from there. If that code
//! comes back into the manager and needs the same lock on the same thread, a
//! plain mutex would wait for itself forever. A [`NamedMutex`] remembers which
//! thread holds it, so that acquisition panics instead, naming what the
//! thread was doing. Only cold paths use it: the check is a thread-local read
//! and a relaxed load per acquisition.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::sync::{thread_token, Mutex};

#[cfg(not(loom))]
type Guard<'a, T> = parking_lot::MutexGuard<'a, T>;
#[cfg(loom)]
type Guard<'a, T> = loom::sync::MutexGuard<'a, T>;

/// A mutex that knows which thread holds it (see the module docs).
///
/// # Invariants
///
/// `holder` is the [`thread_token`] of the thread that holds `lock`, stored
/// after it locked and cleared before it unlocks, or 0. So a thread that
/// reads its own token there holds the lock (a thread always sees its own
/// last store, and no other thread stores its token).
#[derive(Debug)]
pub(crate) struct NamedMutex<T> {
    lock: Mutex<T>,
    holder: AtomicU64,
    /// What the holder is doing, for the panic: "growing the store of".
    doing: &'static str,
    /// Whose lock it is: a type name, or "" for a manager-wide lock.
    whose: &'static str,
}

impl<T> NamedMutex<T> {
    #[cfg(not(loom))]
    pub(crate) const fn new(value: T, doing: &'static str, whose: &'static str) -> Self {
        NamedMutex { lock: Mutex::new(value), holder: AtomicU64::new(0), doing, whose }
    }

    #[cfg(loom)]
    pub(crate) fn new(value: T, doing: &'static str, whose: &'static str) -> Self {
        NamedMutex { lock: Mutex::new(value), holder: AtomicU64::new(0), doing, whose }
    }

    /// True if this thread holds the lock: for a caller that can do without
    /// it, where waiting would deadlock.
    pub(crate) fn held_here(&self) -> bool {
        self.holder.load(Ordering::Relaxed) == thread_token()
    }

    /// Locks, or panics if this thread already holds the lock (re-entered
    /// from user code the manager called under it).
    #[track_caller]
    pub(crate) fn lock(&self) -> NamedGuard<'_, T> {
        let me = thread_token();
        if self.holder.load(Ordering::Relaxed) == me {
            reentered(self.doing, self.whose);
        }
        let guard = self.lock.lock();
        self.holder.store(me, Ordering::Relaxed);
        NamedGuard { guard, holder: &self.holder }
    }
}

/// The guard of a [`NamedMutex`].
pub(crate) struct NamedGuard<'a, T> {
    guard: Guard<'a, T>,
    holder: &'a AtomicU64,
}

impl<T> Drop for NamedGuard<'_, T> {
    fn drop(&mut self) {
        // Before `guard` unlocks (fields drop after this body).
        self.holder.store(0, Ordering::Relaxed);
    }
}

impl<T> Deref for NamedGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> DerefMut for NamedGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

#[cold]
#[inline(never)]
#[track_caller]
fn reentered(doing: &str, whose: &str) -> ! {
    let whose = if whose.is_empty() { String::new() } else { format!(" `{whose}`") };
    panic!(
        "re-entrant call into the object manager: this thread is already {doing}{whose}, and user code the \
         manager runs there (a store allocator, a logger, a budget callback) called back into it in a way \
         that needs the same lock, which would deadlock (see \"Re-entrancy\" in the docs of \
         ObjectManagerBuilder::allocator)"
    )
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_the_same_thread_panics_with_the_name() {
        let lock = NamedMutex::new(0u32, "growing the store of", "Prop");
        let held = lock.lock();
        let again = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(lock.lock())));
        let message = *again.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("already growing the store of `Prop`"), "{message}");
        drop(held);
        *lock.lock() += 1;
        // Another thread waits as usual.
        let held = lock.lock();
        std::thread::scope(|s| {
            let other = s.spawn(|| *lock.lock() += 1);
            drop(held);
            other.join().unwrap();
        });
        assert_eq!(*lock.lock(), 2);
    }
}
