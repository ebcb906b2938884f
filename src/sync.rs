//! Atomics and the locks of the lock-free protocols, switched to loom's under
//! `--cfg loom` so those protocols can be model-checked.
#![allow(unused_imports)]

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

#[cfg(not(loom))]
pub(crate) use parking_lot::Mutex;

/// A mutex loom can schedule around (a `parking_lot` lock would block the
/// model's only OS thread), with `parking_lot`'s poison-free `lock`.
#[cfg(loom)]
#[derive(Debug, Default)]
pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

#[cfg(loom)]
impl<T> Mutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Mutex(loom::sync::Mutex::new(value))
    }

    pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// A cell for the slot values. Outside loom it is `std`'s, with loom's
/// closure API (zero cost); under loom it is loom's, so the models also see
/// every write and read of a value, not only the atomics around them.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    #[allow(dead_code)]
    pub(crate) const fn new(value: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(value))
    }

    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    #[inline(always)]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

#[cfg(loom)]
pub(crate) use loom::cell::UnsafeCell;

/// A number naming the calling thread, unique over the process's life: a
/// thread-local's address could be reused by a later thread, this never is.
/// Under loom, each model thread gets its own.
#[inline]
pub(crate) fn thread_token() -> u64 {
    /// The last token handed out (std's atomic even under loom: tokens are
    /// not part of any modelled protocol, only their uniqueness is).
    static LAST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    #[cfg(not(loom))]
    std::thread_local!(static TOKEN: std::cell::Cell<u64> = const { std::cell::Cell::new(0) });
    #[cfg(loom)]
    loom::thread_local!(static TOKEN: std::cell::Cell<u64> = std::cell::Cell::new(0));
    TOKEN.with(|token| match token.get() {
        0 => {
            let new = LAST.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            token.set(new);
            new
        }
        known => known,
    })
}

/// The calling thread's shard of `shards` (sharded counters and lists):
/// threads made one after another (a job system's workers) take different
/// ones.
#[cfg(not(loom))]
#[inline(always)]
pub(crate) fn thread_shard(shards: usize) -> usize {
    thread_token() as usize % shards
}

/// Under loom, by the model thread's number, which each execution replays
/// alike (the thread token's counter runs on across executions and tests,
/// and a model must be deterministic). Loom shows it only through `Debug`.
#[cfg(loom)]
pub(crate) fn thread_shard(shards: usize) -> usize {
    let id = format!("{:?}", loom::thread::current().id());
    id.bytes().filter(u8::is_ascii_digit).fold(0, |n: usize, digit| n * 10 + usize::from(digit - b'0')) % shards
}

/// A pause in a retry loop: a spin hint, or under loom a yield, so that the
/// model schedules the thread being waited for.
#[inline(always)]
pub(crate) fn spin() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}
