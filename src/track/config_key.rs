//! [`ConfigKey`]: a tracker's configuration word and the *fast key* that tells the
//! allocator's per-thread caches, without a lock, whether the configuration they copied is
//! still the current one.
//!
//! The protocol, all of it here so the loom models run this code:
//! - **Change** (under the tracker's `CONFIG_SERIAL` lock): take the key away (store
//!   [`KEY_NONE`]), store the new configuration (`Release`), then publish a fresh key
//!   (`Release`), or `KEY_NONE` again if the configuration has no counting path.
//! - **Cache** (a thread's refill): load the key (`Acquire`), then the configuration and
//!   whatever else the caller copies. It read the configuration the key was published for
//!   or a newer one; a newer one's change took the key away first, so the cache's key
//!   stops matching as soon as that change is visible.
//! - **Check** (every counted allocation): the cached key against [`ConfigKey::key`]
//!   (`Relaxed`). A change that happens before the check (through any synchronisation:
//!   the changer reads its configuration with `Acquire`, then frees memory another thread
//!   allocates) makes the check fail, because the key it took away comes before it in the
//!   key's modification order.
//!
//! The words are generic so the models can use loom's atomics while the tracker, built in
//! a `const`, uses the standard ones.

use std::sync::atomic::Ordering;

/// The key before any thread cached the configuration.
pub(crate) const KEY_UNSET: u64 = 0;
/// The key of a configuration without a counting path, and while one changes.
pub const KEY_NONE: u64 = 1;
/// The first key [`ConfigKey::change`] or a first cache hands out.
pub const FIRST_KEY: u64 = 2;

/// The atomic operations the protocol uses, on a `u64` word.
pub trait Word {
    /// As `AtomicU64::load`.
    fn load(&self, order: Ordering) -> u64;
    /// As `AtomicU64::store`.
    fn store(&self, value: u64, order: Ordering);
    /// As `AtomicU64::swap`.
    fn swap(&self, value: u64, order: Ordering) -> u64;
    /// As `AtomicU64::fetch_add`.
    fn fetch_add(&self, value: u64, order: Ordering) -> u64;
    /// As `AtomicU64::compare_exchange`.
    fn compare_exchange(&self, current: u64, new: u64, success: Ordering, failure: Ordering) -> Result<u64, u64>;
}

macro_rules! impl_word {
    ($atomic:ty) => {
        impl Word for $atomic {
            #[inline(always)]
            fn load(&self, order: Ordering) -> u64 {
                <$atomic>::load(self, order)
            }
            #[inline(always)]
            fn store(&self, value: u64, order: Ordering) {
                <$atomic>::store(self, value, order)
            }
            #[inline(always)]
            fn swap(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::swap(self, value, order)
            }
            #[inline(always)]
            fn fetch_add(&self, value: u64, order: Ordering) -> u64 {
                <$atomic>::fetch_add(self, value, order)
            }
            #[inline(always)]
            fn compare_exchange(
                &self,
                current: u64,
                new: u64,
                success: Ordering,
                failure: Ordering,
            ) -> Result<u64, u64> {
                <$atomic>::compare_exchange(self, current, new, success, failure)
            }
        }
    };
}

impl_word!(std::sync::atomic::AtomicU64);
#[cfg(loom)]
impl_word!(loom::sync::atomic::AtomicU64);

/// A configuration word and its fast key (see the module docs).
///
/// # Invariants
///
/// Every [`change`](Self::change) runs under one lock shared by all the `ConfigKey`s that
/// draw keys from one counter, and the counter only hands out values from [`FIRST_KEY`]
/// on, each once: so a key other than `KEY_UNSET` and `KEY_NONE` names exactly one stored
/// configuration of one `ConfigKey`, and is stored after it.
pub struct ConfigKey<W = std::sync::atomic::AtomicU64> {
    config: W,
    key: W,
}

impl ConfigKey {
    /// The standard atomics' form, for a `const` tracker.
    pub(crate) const fn new(config: u64) -> Self {
        use std::sync::atomic::AtomicU64;
        ConfigKey { config: AtomicU64::new(config), key: AtomicU64::new(KEY_UNSET) }
    }
}

impl<W: Word> ConfigKey<W> {
    /// A configuration with no key yet, from its two words (`config`'s value, and a key
    /// word holding `KEY_UNSET`, 0): the loom models' form.
    #[cfg(loom)]
    pub fn from_words(config: W, key: W) -> Self {
        debug_assert_eq!(key.load(Ordering::Relaxed), KEY_UNSET);
        ConfigKey { config, key }
    }

    /// The configuration, `Relaxed`.
    #[inline(always)]
    pub fn config(&self) -> u64 {
        self.config.load(Ordering::Relaxed)
    }

    /// The configuration, ordered before what this thread does next (see the module docs).
    #[inline(always)]
    pub fn config_acquire(&self) -> u64 {
        self.config.load(Ordering::Acquire)
    }

    /// The key a cache must hold to use what it copied.
    #[inline(always)]
    pub fn key(&self) -> u64 {
        self.key.load(Ordering::Relaxed)
    }

    /// Stores `f`'s configuration made of the current one (`None`: keeps it), then a fresh
    /// key from `next` if `counts` says the new configuration has a counting path, else
    /// `KEY_NONE`. The caller holds the lock of every change (type invariant); even an
    /// unchanged configuration gets a new key (the caller changed something the caches copy
    /// along with it).
    ///
    /// The key is written by swaps, not stores: a first [`cache`](Self::cache) may race
    /// the change with a compare-exchange, and with read-modify-writes on both sides the
    /// key's history is one chain (loom, which checks this protocol, let a plain store
    /// land before a compare-exchange that had already run). A change is rare: the swaps
    /// cost nothing that matters.
    pub fn change(&self, next: &W, f: impl FnOnce(u64) -> Option<u64>, counts: impl Fn(u64) -> bool) {
        self.key.swap(KEY_NONE, Ordering::Relaxed);
        // Under the lock nobody else stores the word: a load and a store are the update.
        let old = self.config.load(Ordering::Relaxed);
        let config = match f(old) {
            Some(new) => {
                self.config.store(new, Ordering::Release);
                new
            }
            None => old,
        };
        let key = if counts(config) { next.fetch_add(1, Ordering::Relaxed) } else { KEY_NONE };
        self.key.swap(key, Ordering::Release);
    }

    /// The current key and the configuration it was published for or a newer one, for a
    /// cache; `None` if there is no counting path to cache (no key). The first cache of a
    /// `ConfigKey` no change has touched gives it its first key, from `next`.
    pub fn cache(&self, next: &W) -> Option<(u64, u64)> {
        let mut key = self.key.load(Ordering::Acquire);
        if key == KEY_UNSET {
            // No change happened yet (each publishes a key), so the configuration is the one
            // built, with a counting path. A change racing with this replaces the key after.
            let fresh = next.fetch_add(1, Ordering::Relaxed);
            key = match self.key.compare_exchange(KEY_UNSET, fresh, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => fresh,
                Err(now) => now,
            };
        }
        if key == KEY_NONE {
            return None;
        }
        // After the key (`Acquire`): its configuration or a newer one.
        Some((key, self.config.load(Ordering::Relaxed)))
    }
}

impl<W: Word> std::fmt::Debug for ConfigKey<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigKey").field("config", &self.config()).field("key", &self.key()).finish()
    }
}
