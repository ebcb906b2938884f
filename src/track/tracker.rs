//! The [`Tracker`]: its configuration, per-tag counters and records. Budgets, diagnostics
//! and the explicit API are in `budget.rs`, `diagnostics.rs` and `explicit.rs`.

use std::fmt;
use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::block::{Header, H_COUNTED};
use super::budget::{Charger, PolicyTable};
use super::config_key::{ConfigKey, FIRST_KEY};
use super::mode::{Config, Mode, EPOCH_MAX, EPOCH_SHIFT};
use super::pending;
use super::record::{shard_of, FreedRing, Record, RecordTable, FLAG_EXTERNAL, FLAG_GLOBAL_ALLOC, FLAG_TRACKER_ALLOC};
use super::scope::{with_local, Reentry};
use super::stack_trace::{StackStore, StackTrace};
use super::stats::{TagCounters, TagStats};
use super::table::SpinLock;
use super::tag::{self, TagId, MAX_TAGS};
use super::thread_stats::{ThreadSlot, ThreadSlots};
use super::timeline::Timeline;
use crate::Error;

/// The memory tracker: per-tag counters and budgets, and (by [`Mode`]) a record per live
/// allocation.
///
/// Use it as a value (`Tracker::new()`, handy in tests) or through the process-wide
/// [`Tracker::global()`], which [`TrackingAllocator`](super::TrackingAllocator) reports
/// into. All methods take `&self` and may be called from any thread; reading stats never
/// stops other threads.
///
/// Its own tables live in [`System`](std::alloc::System) memory, are never tracked, and are reported by
/// [`Tracker::overhead_bytes`].
///
/// # Examples
///
/// ```
/// use mmobject::track::{Tag, Tracker};
///
/// static TEXTURES: Tag = Tag::new("Textures");
/// let tracker = Tracker::new();
/// tracker.try_charge(TEXTURES.id(), 4096)?;
/// assert_eq!(tracker.tag_stats(&TEXTURES).bytes, 4096);
/// tracker.credit(TEXTURES.id(), 4096);
/// assert_eq!(tracker.tag_stats(&TEXTURES).bytes, 0);
/// assert_eq!(tracker.tag_stats(&TEXTURES).peak_bytes, 4096);
/// # Ok::<(), mmobject::Error>(())
/// ```
pub struct Tracker {
    pub(crate) counters: [TagCounters; MAX_TAGS],
    /// A [`Config`] word (the mode, the diagnostics flag and the configuration epoch) and
    /// the fast key the allocator's per-thread caches (`scope::Local`) hold to say they are
    /// current: replaced, under `CONFIG_SERIAL`, after every change of the word or of a
    /// tag's `slow` flag (see [`ConfigKey`] and [`Tracker::refill_local`]).
    config: ConfigKey,
    /// Per-thread deltas: the allocator's lock-free, RMW-free counting path.
    pub(crate) threads: ThreadSlots,
    pub(crate) records: RecordTable,
    pub(crate) stacks: StackStore,
    pub(super) freed: FreedRing,
    pub(super) policies: SpinLock<PolicyTable>,
    /// Set once a `TrackingAllocator` counted an allocation here on the shared path (the
    /// per-thread path shows in `threads` instead); see [`Tracker::counts_allocations`].
    pub(super) fed: AtomicBool,
    pub(super) untracked_frees: AtomicUsize,
    pub(super) double_frees: AtomicUsize,
    pub(super) buffer_overruns: AtomicUsize,
    pub(crate) timeline: Timeline,
}

static GLOBAL: Tracker = Tracker::new();

/// The next fast key (process-wide, so no two trackers share one; never `scope::NO_KEY`
/// in practice: 2^64 configuration changes).
static NEXT_KEY: AtomicU64 = AtomicU64::new(FIRST_KEY);

/// Serialises the changes of every tracker's configuration word, tags' `slow` flags and
/// fast key, so the key published last is for the configuration stored last.
pub(super) static CONFIG_SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

impl Default for Tracker {
    fn default() -> Self {
        Tracker::new()
    }
}

impl fmt::Debug for Tracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracker")
            .field("mode", &self.mode())
            .field("diagnostics", &self.diagnostics())
            .field("live_records", &self.live_records())
            .field("errors", &self.error_counts())
            .finish_non_exhaustive()
    }
}

impl Tracker {
    /// A tracker in [`Mode::Counting`], diagnostics off. Allocates nothing until used.
    pub const fn new() -> Tracker {
        Tracker::with_mode(Mode::Counting)
    }

    /// A tracker in the given mode.
    pub const fn with_mode(mode: Mode) -> Tracker {
        Tracker {
            counters: [const { TagCounters::new() }; MAX_TAGS],
            config: ConfigKey::new(Config::new(mode, false).0),
            threads: ThreadSlots::new(),
            records: RecordTable::new(),
            stacks: StackStore::new(),
            freed: FreedRing::new(),
            policies: SpinLock::new(PolicyTable::new()),
            fed: AtomicBool::new(false),
            untracked_frees: AtomicUsize::new(0),
            double_frees: AtomicUsize::new(0),
            buffer_overruns: AtomicUsize::new(0),
            timeline: Timeline::new(),
        }
    }

    /// The process-wide tracker, which [`TrackingAllocator`](super::TrackingAllocator)
    /// reports into. It starts in [`Mode::Counting`].
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::Tracker;
    ///
    /// let a: &'static Tracker = Tracker::global();
    /// assert!(std::ptr::eq(a, Tracker::global()));
    /// ```
    pub const fn global() -> &'static Tracker {
        &GLOBAL
    }

    // ---- configuration ---------------------------------------------------------------

    /// The current mode.
    pub fn mode(&self) -> Mode {
        self.config().mode()
    }

    /// The mode, the diagnostics flag and the epoch, in one load.
    #[inline]
    pub(crate) fn config(&self) -> Config {
        Config(self.config.config())
    }

    /// [`Tracker::config`], ordered before what follows it: a configuration change made
    /// before the one read (a fast key taken away, see `Tracker::change_config`) shows to
    /// whatever this thread hands memory to afterwards.
    #[inline]
    pub(crate) fn config_acquire(&self) -> Config {
        Config(self.config.config_acquire())
    }

    /// Applies `f` to the mode and flag, moving to the next epoch (see [`Config`]).
    pub(super) fn reconfigure(&self, f: impl Fn(Mode, bool) -> (Mode, bool)) {
        let _serial = CONFIG_SERIAL.lock();
        self.change_config(|raw| {
            let c = Config(raw);
            let (mode, diagnostics) = f(c.mode(), c.diagnostics());
            Some(c.changed(mode, diagnostics).0)
        });
    }

    /// Changes the mode. Allocations made before keep the tracking they had (each block
    /// remembers how it was tracked), so switching is safe at any time.
    pub fn set_mode(&self, mode: Mode) {
        self.reconfigure(|_, diagnostics| (mode, diagnostics));
    }

    /// Sets the configuration's slow-tags bit (see [`Config::slow_tags`]), keeping the epoch,
    /// after some tag's `slow` flag changed. The caller holds `CONFIG_SERIAL`.
    pub(super) fn set_slow_tags(&self, on: bool) {
        // A new key even with the bit unchanged: the caches hold whether their current tag
        // is slow.
        self.change_config(|raw| {
            let c = Config(raw);
            (c.slow_tags() != on).then(|| c.with_slow_tags(on).0)
        });
    }

    /// Sets the configuration epoch (a test hook for the epoch's saturation: it starts the
    /// counter near its limit). Not part of the API.
    #[doc(hidden)]
    pub fn __set_config_epoch_for_tests(&self, epoch: u64) {
        let _serial = CONFIG_SERIAL.lock();
        self.change_config(|raw| Some(raw & ((1 << EPOCH_SHIFT) - 1) | epoch.min(EPOCH_MAX) << EPOCH_SHIFT));
    }

    /// Stores the configuration `f` makes of the current one (`None`: unchanged), between
    /// taking the fast key away and publishing a new one ([`ConfigKey::change`]); a
    /// configuration in diagnostic mode gets no key. The caller holds `CONFIG_SERIAL`, and
    /// stored the tags' `slow` flags before.
    ///
    /// The key is taken away *before* the store (which releases it): a thread that reads
    /// the new configuration with `Acquire` and then hands memory to another thread (a
    /// free, then the inner allocator's `malloc`) makes that thread see the key gone. The
    /// allocator's counting path relies on it (see `TrackingAllocator::alloc_fast`).
    fn change_config(&self, f: impl FnOnce(u64) -> Option<u64>) {
        self.config.change(&NEXT_KEY, f, |raw| !Config(raw).diagnostics());
    }

    /// The key the allocator's per-thread cache must hold to take the counting path.
    #[inline(always)]
    pub(crate) fn fast_key(&self) -> u64 {
        self.config.key()
    }

    /// Fills this thread's allocator cache (`scope::Local`) for this tracker: the key of its
    /// configuration, this thread's slot, and the current tag's header, counters and the
    /// largest size it counts only. Returns `false`, leaving the cache as it was (without
    /// this tracker's current key), if there is no counting path to cache: inside the
    /// tracker, in diagnostic mode, while the configuration changes, or for a thread
    /// without a slot.
    ///
    /// `'static`: a cache outlives any call, so it may only name a tracker that is never
    /// dropped (the key is unique to this tracker, so no other tracker's key matches it).
    #[cold]
    #[inline(never)]
    pub(crate) fn refill_local(&'static self) -> bool {
        with_local(|l| {
            if l.in_tracker() {
                return false;
            }
            // The first cache of a tracker built by `with_mode` (no diagnostics) gives it
            // its first key.
            let Some((key, config)) = self.config.cache(&NEXT_KEY) else {
                return false;
            };
            let Some(slot) = self.threads.slot() else {
                return false;
            };
            // The configuration and the tag's `slow` flag were read after the key
            // (`Acquire`): as published with it, or newer, whose key then replaces this one.
            let config = Config(config);
            let tag = l.tag();
            let any_slow = config.slow_tags();
            let slow = any_slow && self.is_slow(tag);
            let tags = slot.tags_ptr();
            l.tags.set(tags);
            l.delta.set(tags.wrapping_add(tag.index()));
            l.any_slow.set(any_slow);
            l.header.set(if slow { Header::NONE } else { Header::new(tag.0, H_COUNTED) });
            let limit = if slow { 0 } else { config.mode_limit() };
            l.limit.set(limit);
            l.any_size_key.set(if limit >= isize::MAX as usize { key } else { super::scope::NO_KEY });
            l.key.set(key);
            true
        })
        .unwrap_or(false)
    }

    /// The id of the tag named `name`, registering it if missing.
    ///
    /// This is how the object manager maps a type's `#[mm(tag = "...")]` to a tag; a user's
    /// `static T: Tag = Tag::new("...")` with the same name maps to the same id. If
    /// [`MAX_TAGS`] tags exist already it logs an error and returns [`TagId::UNTAGGED`].
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tag, Tracker};
    ///
    /// static TEXTURES: Tag = Tag::new("Textures");
    /// assert_eq!(Tracker::global().tag_named("Textures"), TEXTURES.id());
    /// ```
    pub fn tag_named(&self, name: &'static str) -> TagId {
        self.try_tag_named(name).unwrap_or_else(|e| {
            log::error!("memory tag '{name}' not registered: {e}; counting it as Untagged");
            TagId::UNTAGGED
        })
    }

    /// The id of the tag named `name`, registering it if missing.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExceeded`] when [`MAX_TAGS`] tags are already registered.
    pub fn try_tag_named(&self, name: &'static str) -> Result<TagId, Error> {
        tag::register(name)
    }

    /// Logs (`log::debug!`) each allocation and free of `tag`: size, address and site.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tag, Tracker};
    ///
    /// static NET: Tag = Tag::new("Net");
    /// let tracker = Tracker::new();
    /// tracker.watch(&NET, true);
    /// assert!(tracker.tag_stats(&NET).watched);
    /// ```
    pub fn watch(&self, tag: impl Into<TagId>, on: bool) {
        let tag = tag.into();
        self.counters[tag.index()].watch.store(on, Ordering::Relaxed);
        self.update_slow(tag);
    }

    // ---- counting ----------------------------------------------------------------------

    /// Whether `tag` has a budget or a watch, so every one of its allocations must go
    /// through the shared counters (exact budget checks, one log line each).
    #[inline(always)]
    pub(crate) fn is_slow(&self, tag: TagId) -> bool {
        self.counters[tag.index()].slow.load(Ordering::Relaxed)
    }

    /// Counts an allocation a `TrackingAllocator` already made under a tag that was not
    /// slow ([`Tracker::is_slow`]) when it checked: in this thread's slot, else in the
    /// shared counters. Never refused: a budget set meanwhile starts with the next
    /// allocation.
    #[inline(always)]
    pub(crate) fn count_unbudgeted(&self, tag: TagId, bytes: usize) {
        if let Some(slot) = self.threads.cached_slot() {
            if slot.alloc(tag.index(), bytes as isize) {
                self.flush(slot, tag);
            }
            return;
        }
        self.count_unbudgeted_slow(tag, bytes);
    }

    /// `count_unbudgeted` for a thread without its slot cached.
    #[cold]
    #[inline(never)]
    fn count_unbudgeted_slow(&self, tag: TagId, bytes: usize) {
        if let Some(slot) = self.threads.slot() {
            if slot.alloc(tag.index(), bytes as isize) {
                self.flush(slot, tag);
            }
            return;
        }
        if !self.fed.load(Ordering::Relaxed) {
            self.fed.store(true, Ordering::Relaxed);
        }
        let shared = self.counters[tag.index()].add(bytes, true);
        self.raise_peaks(tag, shared);
    }

    /// Raises `tag`'s peaks after its shared counters changed to `shared`: from the whole
    /// total, the shared counters plus every thread slot's pending deltas, once any thread
    /// has a slot (else the shared counters are the total).
    pub(crate) fn raise_peaks(&self, tag: TagId, shared: (usize, usize)) {
        let pending = if self.threads.used() { self.pending(tag) } else { (0, 0, 0) };
        self.counters[tag.index()].raise_peaks(shared, (pending.0, pending.1));
    }

    /// Counts a free (of a block counted by `count_unbudgeted` or `charge_counters`), in this
    /// thread's slot when possible. Returns `true` if the tag is watched.
    #[inline(always)]
    pub(crate) fn count_free(&self, tag: TagId, bytes: usize) -> bool {
        if !self.counters[tag.index()].slow.load(Ordering::Relaxed) {
            if let Some(slot) = self.threads.cached_slot() {
                slot.free(tag.index(), bytes as isize);
                return false;
            }
        }
        self.count_free_slow(tag, bytes)
    }

    /// `count_free` for budgeted or watched tags, or a thread without its slot cached.
    #[cold]
    #[inline(never)]
    fn count_free_slow(&self, tag: TagId, bytes: usize) -> bool {
        let c = &self.counters[tag.index()];
        if !c.slow.load(Ordering::Relaxed) {
            if let Some(slot) = self.threads.slot() {
                slot.free(tag.index(), bytes as isize);
                return false;
            }
        }
        c.sub(bytes);
        c.watch.load(Ordering::Relaxed)
    }

    /// The first step of counting a counted block's change of size from `old` to `new`
    /// bytes (a `realloc` in place), before the inner `realloc`: a growth under a slow tag
    /// is checked against the budget (as `Charger::Growth` decides) and its bytes claimed
    /// (`Ok(true)`); anything else waits for the block (`Ok(false)`), as nothing can refuse
    /// it. Then [`Tracker::resized`] if the block changed size, else
    /// [`Tracker::resize_refused`].
    pub(crate) fn claim_resize(&self, tag: TagId, old: usize, new: usize) -> Result<bool, Error> {
        if new > old && self.is_slow(tag) {
            self.claim_bytes(tag, new - old, Charger::Growth)?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Counts the change of size once the block has it: a claimed growth is committed
    /// (raising the peaks); else the difference goes to this thread's slot if the tag is
    /// not slow, or to the shared counters (no budget check: a growth not claimed had
    /// nothing to refuse it). Returns whether the tag is watched.
    pub(crate) fn resized(&self, tag: TagId, old: usize, new: usize, claimed: bool) -> bool {
        let c = &self.counters[tag.index()];
        if claimed {
            self.commit_claim(tag, false);
            return c.watch.load(Ordering::Relaxed);
        }
        if !c.slow.load(Ordering::Relaxed) {
            if let Some(slot) = self.threads.slot() {
                if slot.resize(tag.index(), (new as isize).wrapping_sub(old as isize)) {
                    self.flush(slot, tag);
                }
                return false;
            }
        }
        if new >= old {
            // No budget to check: the tag was not slow when the growth was claimed.
            let shared = c.add(new - old, false);
            self.raise_peaks(tag, shared);
        } else {
            c.sub_bytes(old - new);
        }
        c.watch.load(Ordering::Relaxed)
    }

    /// Gives back what [`Tracker::claim_resize`] claimed, for a block that kept its size.
    pub(crate) fn resize_refused(&self, tag: TagId, old: usize, new: usize, claimed: bool) {
        if claimed {
            self.counters[tag.index()].sub_bytes(new - old);
        }
    }

    /// Folds this thread's deltas for `tag` into the shared counters.
    #[cold]
    #[inline(never)]
    pub(crate) fn flush(&self, slot: &super::thread_stats::ThreadSlot, tag: TagId) {
        let (b, n, a) = slot.take(tag.index());
        let c = &self.counters[tag.index()];
        c.fold(b, n, a);
        if b > 0 || n > 0 {
            // The peaks come from the whole total: a block counted here may have its
            // credit waiting in another thread's slot (it was freed there).
            c.current(|| self.pending(tag));
        }
    }

    /// [`Tracker::flush`] of this thread's slot, for the allocator's cached counting path
    /// (which holds the slot's counters, not the slot).
    #[cold]
    #[inline(never)]
    pub(crate) fn flush_local(&self, tag: TagId) {
        if let Some(slot) = self.threads.slot() {
            self.flush(slot, tag);
        }
    }

    /// `(bytes, count, allocs)` still pending in thread slots for `tag`.
    pub(crate) fn pending(&self, tag: TagId) -> (isize, isize, isize) {
        self.threads.pending(tag.index())
    }

    #[cold]
    #[inline(never)]
    pub(crate) fn watch_event(
        &self,
        what: &str,
        tag: TagId,
        size: usize,
        addr: Option<usize>,
        site: Option<&'static Location<'static>>,
    ) {
        let _reentry = Reentry::enter();
        match (addr, site) {
            (Some(a), Some(s)) => log::debug!("[{tag}] {what} {size} B at {a:#x} (site {s})"),
            (Some(a), None) => log::debug!("[{tag}] {what} {size} B at {a:#x}"),
            _ => log::debug!("[{tag}] {what} {size} B"),
        }
    }

    // ---- records -------------------------------------------------------------------------

    /// Adds a record for a block to the table, with a stack of `depth` frames if
    /// `depth != 0`. Returns `false` if the record table is out of `System` memory (the block
    /// has no record then).
    #[inline(always)]
    pub(crate) fn add_record(&self, addr: usize, mut record: Record, depth: usize) -> bool {
        if depth != 0 {
            record.stack = self.capture_stack(depth);
        }
        self.insert_record(addr, record)
    }

    /// Adds the record of a block a `TrackingAllocator` just placed on this thread (`slot`
    /// is the thread's slot, if cached): as the thread's pending record once its exit flush
    /// is registered, after moving the record pending before into the table; else into the
    /// table. Returns `false` if the table is out of `System` memory (no record then).
    #[inline(always)]
    pub(crate) fn add_record_pending(
        &'static self,
        slot: Option<&'static ThreadSlot>,
        addr: usize,
        mut record: Record,
        depth: usize,
    ) -> bool {
        if depth != 0 {
            record.stack = self.capture_stack(depth);
        }
        if let Some(slot) = slot {
            if slot.exit_hooked.load(Ordering::Relaxed) || pending::hook_thread_exit(self, slot) {
                let held = slot.pending.held();
                if held == 0 || self.move_pending(slot, held) {
                    slot.pending.publish(addr, record);
                    return true;
                }
            }
        }
        self.insert_record(addr, record)
    }

    /// Inserts a record into the table; `false` if it is out of `System` memory.
    #[inline(always)]
    fn insert_record(&self, addr: usize, record: Record) -> bool {
        match self.records.insert(addr, record) {
            Ok(None) => true,
            Ok(Some(stale)) => {
                self.replaced_record(stale);
                true
            }
            Err(_) => false,
        }
    }

    /// Moves `slot`'s pending record into the table, unless another thread claimed it
    /// meanwhile. `held` is the address its owner, the caller, saw pending. Returns `false`
    /// if the table is out of `System` memory (the record stays pending then).
    #[inline(never)]
    pub(crate) fn move_pending(&self, slot: &ThreadSlot, held: usize) -> bool {
        self.records.with_shard(held, |map| {
            slot.pending.move_out(|addr, record| {
                debug_assert_eq!(addr, held, "only the owner makes its slot non-empty");
                match map.insert(addr, record) {
                    Ok(stale) => {
                        if let Some(stale) = stale {
                            self.replaced_record(stale);
                        }
                        true
                    }
                    Err(_) => false,
                }
            })
        })
    }

    /// Captures and interns this thread's stack, `depth` frames deep. Inlined, so that it
    /// adds no frame of its own to the capture (see `OWN_FRAMES_SLACK`).
    #[inline(always)]
    fn capture_stack(&self, depth: usize) -> u32 {
        let _reentry = Reentry::enter();
        self.stacks.intern(&StackTrace::capture(depth))
    }

    /// A record replaced by a new block's at the same address.
    #[cold]
    fn replaced_record(&self, stale: Record) {
        // An external block freed without `untrack`, whose memory came back: count it as
        // freed, as `try_track` does.
        if stale.flags & FLAG_EXTERNAL != 0 {
            self.counters[stale.tag.index()].sub(stale.size);
        }
    }

    /// Removes `addr`'s record wherever it is: this thread's pending record (no lock), the
    /// table, or another thread's pending record (claimed under the shard's lock, after the
    /// table missed).
    #[inline]
    pub(crate) fn remove_record_anywhere(&self, addr: usize) -> Option<Record> {
        if let Some(slot) = self.threads.cached_slot() {
            if let Some(record) = slot.pending.cancel(addr) {
                return Some(record);
            }
        }
        self.remove_record_locked(addr)
    }

    /// [`Tracker::remove_record_anywhere`] without looking at this thread's pending record
    /// first (the caller did).
    #[inline(never)]
    pub(crate) fn remove_record_locked(&self, addr: usize) -> Option<Record> {
        self.records.with_shard(addr, |map| map.remove(addr).or_else(|| self.claim_pending(addr)))
    }

    /// Claims `addr`'s record from whichever thread holds it pending. The caller holds the
    /// lock of `addr`'s shard.
    #[cold]
    #[inline(never)]
    fn claim_pending(&self, addr: usize) -> Option<Record> {
        let mut found = None;
        self.threads.for_each(|slot| {
            if found.is_none() {
                found = slot.pending.claim(addr);
            }
        });
        found
    }

    /// Whether `addr`'s record is pending in some thread's slot (any thread's, the caller's
    /// included). The caller holds the lock of `addr`'s shard. Not on the allocator's path:
    /// it walks every slot.
    ///
    /// Ordering: it cannot miss a record pending at `addr` when the caller took the lock
    /// (one whose publish happened before, as a block handed to the caller was). The slot's
    /// `addr` leaves that value only by the owner's cancel (its free of the block: then
    /// the block is gone, and a concurrent free may be ordered either way), or by a move or
    /// a claim, which run under this same lock: one that finished before the caller took it
    /// shows in the table (the lock's release and acquire order it before the table's
    /// look), and one that starts later cannot have stored yet, so the relaxed load reads
    /// the published `addr`. A new `addr` is published only for a block placed meanwhile.
    pub(crate) fn pending_anywhere(&self, addr: usize) -> bool {
        let mut found = false;
        self.threads.for_each(|slot| found |= slot.pending.holds(addr));
        found
    }

    /// A copy of `addr`'s record, from the table or a thread's pending record (tests read
    /// where a record is with it).
    #[cfg(all(test, not(loom)))]
    pub(crate) fn find_record(&self, addr: usize) -> Option<Record> {
        self.records.with_shard(addr, |map| {
            map.get_mut(addr).copied().or_else(|| {
                let mut found = None;
                self.threads.for_each(|slot| match slot.pending.read() {
                    Some((a, record)) if a == addr => found = Some(record),
                    _ => {}
                });
                found
            })
        })
    }

    /// Calls `f` on every live record: shard by shard, the table's and then the pending
    /// records (of every thread) that belong to the shard, under its lock. A record moves
    /// from a slot into the table only under that lock, so each is seen exactly once. `f`
    /// must not allocate through the global allocator. Pending records are passed as
    /// copies (so `f`'s changes to them are lost; they are never guarded).
    pub(crate) fn for_each_record(&self, mut f: impl FnMut(usize, &mut Record)) {
        self.records.for_each_shard(|shard, map| {
            map.for_each(&mut f);
            self.threads.for_each(|slot| {
                if let Some((addr, mut record)) = slot.pending.read() {
                    if shard_of(addr) == shard {
                        f(addr, &mut record);
                    }
                }
            });
        });
    }

    /// Copies out every live record (into a `Vec`, grown without holding any lock).
    pub(crate) fn collect_records(&self) -> Vec<(usize, Record)> {
        // Untracked: with a `TrackingAllocator` recording, the copy's own block would be
        // among the records it copies (a report that lists itself as a leak).
        let _untracked = Reentry::enter();
        let mut out = Vec::new();
        let mut slack = 64;
        loop {
            // Reserve outside the locks, then copy; start again if more came meanwhile.
            out.clear();
            out.reserve(self.live_records() + slack);
            slack *= 2;
            let room = out.capacity();
            let mut all = true;
            self.for_each_record(|addr, r| {
                if out.len() < room {
                    // Cannot reallocate: `len < capacity`.
                    out.push((addr, *r));
                } else {
                    all = false;
                }
            });
            if all {
                return out;
            }
        }
    }

    /// Removes a block's record if it has one, applying the counters, the freed ring and
    /// the watch log. Reports nothing when there is no record.
    #[inline]
    pub(crate) fn take_record(&self, addr: usize, keep_freed: bool) -> Option<Record> {
        let record = self.remove_record_anywhere(addr)?;
        self.record_removed(addr, record, keep_freed);
        Some(record)
    }

    /// Applies the counters, the freed ring (if `keep_freed`) and the watch log to a record
    /// just removed.
    #[inline(always)]
    pub(crate) fn record_removed(&self, addr: usize, record: Record, keep_freed: bool) {
        let watched = if record.flags & FLAG_GLOBAL_ALLOC != 0 {
            self.count_free(record.tag, record.size)
        } else {
            let c = &self.counters[record.tag.index()];
            c.sub(record.size);
            c.watch.load(Ordering::Relaxed)
        };
        if keep_freed {
            self.remember_freed(addr, record);
        }
        if watched {
            self.watch_event("free", record.tag, record.size, Some(addr), Some(record.site));
        }
    }

    /// Removes `addr`'s record if it is one of the tracker's own blocks
    /// ([`Tracker::alloc`]), applying the counters and the freed ring. The test and the
    /// removal are one step under the shard's lock: a `track` of the same address on
    /// another thread replaces the record in the table, and the block must be freed with
    /// the layout of its own record. `Err(true)` if the table holds a record of another
    /// kind, `Err(false)` if it holds none.
    pub(crate) fn take_own_record(&self, addr: usize) -> Result<Record, bool> {
        self.take_record_of_kind(addr, FLAG_TRACKER_ALLOC)
    }

    /// Removes `addr`'s record if it is external memory ([`Tracker::track`]), applying the
    /// counters and the freed ring; as [`take_own_record`](Self::take_own_record)
    /// otherwise. (External records never go pending: `try_track` puts them in the table.)
    pub(crate) fn take_external_record(&self, addr: usize) -> Result<Record, bool> {
        self.take_record_of_kind(addr, FLAG_EXTERNAL)
    }

    /// Removes `addr`'s record from the table if its flags have `kind`, in one step under
    /// the shard's lock. `Err(true)` if the tracker holds a record of another kind (in the
    /// table, or pending in a thread's slot: a `TrackingAllocator` block's, which neither
    /// kind is), `Err(false)` if it holds none.
    fn take_record_of_kind(&self, addr: usize, kind: u32) -> Result<Record, bool> {
        let taken = self.records.with_shard(addr, |map| match map.get_mut(addr).map(|r| r.flags) {
            Some(flags) if flags & kind != 0 => map.remove(addr).ok_or(false),
            Some(_) => Err(true),
            None => Err(self.pending_anywhere(addr)),
        })?;
        self.record_removed(addr, taken, true);
        Ok(taken)
    }

    /// Counts the free of a block that has no record (counted by its header).
    #[inline]
    pub(crate) fn uncount(&self, tag: TagId, size: usize, addr: usize) {
        if self.count_free(tag, size) {
            self.watch_event("free", tag, size, Some(addr), None);
        }
    }

    // ---- reading -------------------------------------------------------------------------

    /// One tag's numbers now.
    pub fn tag_stats(&self, tag: impl Into<TagId>) -> TagStats {
        let tag = tag.into();
        self.counters[tag.index()].snapshot(tag, tag.name(), || self.pending(tag))
    }

    /// Each registered tag's numbers, in id order.
    pub fn all_tag_stats(&self) -> Vec<TagStats> {
        let (names, n) = tag::registered_names();
        (0..n)
            .map(|i| {
                let tag = TagId(i as u32);
                self.counters[i].snapshot(tag, names[i], || self.pending(tag))
            })
            .collect()
    }

    /// Whether a [`TrackingAllocator`](super::TrackingAllocator) reports into this tracker
    /// (it has counted at least one allocation here).
    ///
    /// The object manager reads it to count each byte once: heap bytes are then counted by
    /// the allocator, and the manager adds none of its own (see
    /// [Objects and the global allocator](super#objects-and-the-global-allocator)).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tracker, TrackingAllocator};
    /// use std::alloc::{GlobalAlloc, Layout, System};
    ///
    /// static TRACKER: Tracker = Tracker::new();
    /// assert!(!TRACKER.counts_allocations());
    /// let alloc = TrackingAllocator::with_tracker(System, &TRACKER);
    /// // SAFETY (of the example): a non-zero layout, freed once with it.
    /// unsafe { alloc.dealloc(alloc.alloc(Layout::new::<u64>()), Layout::new::<u64>()) };
    /// assert!(TRACKER.counts_allocations());
    /// ```
    pub fn counts_allocations(&self) -> bool {
        self.fed.load(Ordering::Relaxed) || self.threads.used()
    }

    /// Bytes the tracker's own tables hold (from [`System`](std::alloc::System), never tracked).
    pub fn overhead_bytes(&self) -> usize {
        self.records.heap_bytes()
            + self.stacks.heap_bytes()
            + self.freed.heap_bytes()
            + self.timeline.heap_bytes()
            + self.threads.heap_bytes()
    }

    /// The number of live records.
    pub fn live_records(&self) -> usize {
        let mut n = 0;
        self.for_each_record(|_, _| n += 1);
        n
    }

    /// Sets every tag's peaks to its current values (say, at a level load).
    pub fn reset_peaks(&self) {
        for (i, c) in self.counters.iter().enumerate() {
            c.reset_peaks(|| self.pending(TagId(i as u32)));
        }
    }
}
