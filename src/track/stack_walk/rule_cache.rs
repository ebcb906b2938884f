//! A fixed-size map from code addresses to packed unwind rules, read by any thread without a
//! lock.
//!
//! A stack capture looks up one rule per frame, so a lookup must cost a few plain loads. The
//! map is filled lazily (a miss computes the rule from the unwind tables and inserts it), and
//! it is cleared whole when the set of loaded code changes in a way that can make an entry
//! wrong: a shared library was unloaded, so its addresses may later hold other code.
//!
//! # The protocol
//!
//! Readers follow the seqlock pattern. Each capture takes the epoch once
//! ([`RuleCache::begin`]), makes all its lookups, and checks at the end that the epoch did not
//! move ([`RuleCache::still`]); if it did, the capture's result is thrown away. Between a
//! clear and the next, entries are only added, never changed: an insert writes the rule, then
//! publishes the address with `Release`, so a reader that finds the address (`Acquire`) reads
//! that address's rule. A clear makes the epoch odd, empties every entry and makes the epoch
//! even again; a reader that read anything a clear or a later insert wrote sees a different
//! epoch at its check, through the fence before it. Inserts and clears take one lock, so they
//! never interleave.
//!
//! A full probe sequence refuses the insert: the rule is then recomputed at each use, which is
//! slower but still right.

#[cfg(not(loom))]
use super::super::table::SpinLock as WriterLock;
#[cfg(loom)]
use crate::sync::Mutex as WriterLock;
use crate::sync::{fence, AtomicU64, AtomicUsize, Ordering};

/// Entries probed before a lookup gives up (and before an insert is refused).
const MAX_PROBES: usize = 16;

/// One address and its rule. Invariant: `address == 0` means empty; a non-zero `address` was
/// stored after `rule` (with `Release`), and neither changes until the next clear.
#[derive(Debug)]
struct Entry {
    address: AtomicUsize,
    rule: AtomicU64,
}

/// The map: `N` entries (a power of two), open addressing with linear probing.
///
/// Invariants: `epoch` is odd exactly while a clear is emptying the entries; `version` is the
/// version of the loaded code (see [`RuleCache::sync`]) that every entry was computed against,
/// or `u64::MAX` before the first sync; `writer` is held by every insert and clear.
#[derive(Debug)]
pub struct RuleCache<const N: usize> {
    epoch: AtomicU64,
    version: AtomicU64,
    writer: WriterLock<()>,
    entries: [Entry; N],
}

impl<const N: usize> RuleCache<N> {
    const MASK: usize = {
        assert!(N.is_power_of_two(), "the cache's size is a power of two");
        N - 1
    };

    /// An empty cache, in a `static`.
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        RuleCache {
            epoch: AtomicU64::new(0),
            version: AtomicU64::new(u64::MAX),
            writer: WriterLock::new(()),
            entries: [const { Entry { address: AtomicUsize::new(0), rule: AtomicU64::new(0) } }; N],
        }
    }

    /// An empty cache (loom's atomics cannot be built in a `const`).
    #[cfg(loom)]
    pub fn new() -> Self {
        RuleCache {
            epoch: AtomicU64::new(0),
            version: AtomicU64::new(u64::MAX),
            writer: WriterLock::new(()),
            entries: std::array::from_fn(|_| Entry { address: AtomicUsize::new(0), rule: AtomicU64::new(0) }),
        }
    }

    /// Empties the cache if its entries were computed against another `version` of the loaded
    /// code than the one the caller just read. Call it before [`RuleCache::begin`].
    pub fn sync(&self, version: u64) {
        if self.version.load(Ordering::Acquire) == version {
            return;
        }
        let _writer = self.writer.lock();
        if self.version.load(Ordering::Relaxed) == version {
            return; // another thread cleared it meanwhile
        }
        let epoch = self.epoch.load(Ordering::Relaxed);
        self.epoch.store(epoch + 1, Ordering::Relaxed);
        // Orders the odd epoch before the emptying stores, for readers that see those.
        fence(Ordering::Release);
        for entry in &self.entries {
            entry.address.store(0, Ordering::Relaxed);
            entry.rule.store(0, Ordering::Relaxed);
        }
        self.epoch.store(epoch + 2, Ordering::Release);
        self.version.store(version, Ordering::Release);
    }

    /// Starts a read: the epoch to pass to [`RuleCache::still`] and [`RuleCache::insert`], or
    /// `None` while a clear is under way.
    #[inline]
    pub fn begin(&self) -> Option<u64> {
        let epoch = self.epoch.load(Ordering::Acquire);
        (epoch & 1 == 0).then_some(epoch)
    }

    /// The rule stored for `address` (not 0), if any. Only trustworthy once
    /// [`RuleCache::still`] confirms the epoch the read began in.
    #[inline]
    pub fn get(&self, address: usize) -> Option<u64> {
        let mut i = slot_of(address) & Self::MASK;
        for _ in 0..MAX_PROBES.min(N) {
            let entry = &self.entries[i];
            let found = entry.address.load(Ordering::Acquire);
            if found == address {
                return Some(entry.rule.load(Ordering::Relaxed));
            }
            if found == 0 {
                return None;
            }
            i = (i + 1) & Self::MASK;
        }
        None
    }

    /// `true` if no clear began since [`RuleCache::begin`] returned `epoch`: every value
    /// [`RuleCache::get`] returned since then is the rule inserted for its address.
    #[inline]
    pub fn still(&self, epoch: u64) -> bool {
        // Orders the reads before the check: a read that saw a clear's (or a later insert's)
        // store makes this load see the clear's epoch.
        fence(Ordering::Acquire);
        self.epoch.load(Ordering::Relaxed) == epoch
    }

    /// Stores `rule` (not 0) for `address` (not 0), unless the cache was cleared since
    /// `epoch` (the rule may then describe code that is gone), the address is already there,
    /// or its probe sequence is full.
    pub fn insert(&self, epoch: u64, address: usize, rule: u64) {
        debug_assert!(address != 0 && rule != 0, "0 marks an empty entry");
        let _writer = self.writer.lock();
        if self.epoch.load(Ordering::Relaxed) != epoch {
            return;
        }
        let mut i = slot_of(address) & Self::MASK;
        for _ in 0..MAX_PROBES.min(N) {
            let entry = &self.entries[i];
            match entry.address.load(Ordering::Relaxed) {
                0 => {
                    entry.rule.store(rule, Ordering::Relaxed);
                    entry.address.store(address, Ordering::Release);
                    return;
                }
                found if found == address => return,
                _ => i = (i + 1) & Self::MASK,
            }
        }
    }

    /// The number of entries in use (tests and diagnostics; takes the lock).
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn len(&self) -> usize {
        let _writer = self.writer.lock();
        self.entries.iter().filter(|e| e.address.load(Ordering::Relaxed) != 0).count()
    }
}

/// Where `address`'s probe sequence starts: a Fibonacci hash (return addresses share their
/// low bits' alignment patterns, so the high bits of the product are used).
#[inline]
fn slot_of(address: usize) -> usize {
    ((address as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn inserted_rules_are_found_in_the_epoch_they_were_read_in() {
        let cache = RuleCache::<64>::new();
        cache.sync(1);
        let epoch = cache.begin().unwrap();
        assert_eq!(cache.get(0x1000), None);
        cache.insert(epoch, 0x1000, 7);
        cache.insert(epoch, 0x2000, 9);
        cache.insert(epoch, 0x1000, 8); // an address keeps its first rule
        assert_eq!(cache.get(0x1000), Some(7));
        assert_eq!(cache.get(0x2000), Some(9));
        assert!(cache.still(epoch));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn a_new_version_of_the_loaded_code_empties_the_cache_and_moves_the_epoch() {
        let cache = RuleCache::<64>::new();
        cache.sync(1);
        let epoch = cache.begin().unwrap();
        cache.insert(epoch, 0x1000, 7);
        cache.sync(1); // the same version keeps the entries
        assert!(cache.still(epoch));
        assert_eq!(cache.get(0x1000), Some(7));
        cache.sync(2);
        assert!(!cache.still(epoch), "a read across a clear is not trusted");
        assert_eq!(cache.get(0x1000), None);
        assert_eq!(cache.len(), 0);
        // An insert computed before the clear is refused.
        cache.insert(epoch, 0x1000, 7);
        assert_eq!(cache.get(0x1000), None);
        let epoch = cache.begin().unwrap();
        cache.insert(epoch, 0x1000, 5);
        assert_eq!(cache.get(0x1000), Some(5));
    }

    #[test]
    fn colliding_addresses_probe_on_and_a_full_sequence_refuses_the_insert() {
        let cache = RuleCache::<16>::new();
        cache.sync(0);
        let epoch = cache.begin().unwrap();
        // Every address in a 16-entry table: the 17th finds no room.
        let addresses: Vec<usize> = (1..=17).map(|i| i * 0x40).collect();
        for (i, &a) in addresses.iter().enumerate() {
            cache.insert(epoch, a, i as u64 + 1);
        }
        assert_eq!(cache.len(), 16);
        let found = addresses.iter().filter(|&&a| cache.get(a).is_some()).count();
        assert_eq!(found, 16);
        for (i, &a) in addresses.iter().enumerate() {
            if let Some(rule) = cache.get(a) {
                assert_eq!(rule, i as u64 + 1, "each address keeps its own rule");
            }
        }
    }
}
