//! The [`Tracker`]: per-tag counters, budgets, records and the explicit tracking API.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt;
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use super::block::{self, Header, H_COUNTED, H_GUARDED, H_RECORD};
#[cfg(test)]
use super::budget::{BudgetOverrun, BudgetPolicy};
use super::budget::{Charger, PolicyTable};
use super::mode::{Config, Mode, EPOCH_MAX, EPOCH_SHIFT};
use super::record::{
    Freed, FreedRing, Record, RecordTable, ALIGN_SHIFT, FLAG_EXTERNAL, FLAG_GLOBAL_ALLOC, FLAG_GUARDED,
    FLAG_OVERRUN_REPORTED, FLAG_TRACKER_ALLOC,
};
use super::scope::Reentry;
use super::stack_trace::{StackStore, StackTrace, NO_STACK};
use super::stats::{TagCounters, TagStats};
use super::table::SpinLock;
use super::tag::{self, TagId, MAX_TAGS};
use super::thread_stats::ThreadSlots;
use super::timeline::Timeline;
use crate::Error;

/// Counts of bad frees and overruns the tracker has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ErrorCounts {
    /// Frees of pointers the tracker never saw.
    pub untracked_frees: usize,
    /// Frees of pointers already freed.
    pub double_frees: usize,
    /// Blocks whose guard bytes were overwritten.
    pub buffer_overruns: usize,
}

/// The memory tracker: per-tag counters and budgets, and (by [`Mode`]) a record per live
/// allocation.
///
/// Use it as a value (`Tracker::new()`, handy in tests) or through the process-wide
/// [`Tracker::global()`], which [`TrackingAllocator`](super::TrackingAllocator) reports
/// into. All methods take `&self` and may be called from any thread; reading stats never
/// stops other threads.
///
/// Its own tables live in [`System`] memory, are never tracked, and are reported by
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
    /// A [`Config`] word: the mode, the diagnostics flag and the configuration epoch.
    config: AtomicU64,
    /// Per-thread deltas: the allocator's lock-free, RMW-free counting path.
    pub(crate) threads: ThreadSlots,
    pub(crate) records: RecordTable,
    pub(crate) stacks: StackStore,
    freed: FreedRing,
    pub(super) policies: SpinLock<PolicyTable>,
    /// Set once a `TrackingAllocator` counted an allocation here on the shared path (the
    /// per-thread path shows in `threads` instead); see [`Tracker::counts_allocations`].
    fed: AtomicBool,
    untracked_frees: AtomicUsize,
    double_frees: AtomicUsize,
    buffer_overruns: AtomicUsize,
    pub(crate) timeline: Timeline,
}

static GLOBAL: Tracker = Tracker::new();

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
            .field("live_records", &self.records.len())
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
            config: AtomicU64::new(Config::new(mode, false).0),
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
        Config(self.config.load(Ordering::Relaxed))
    }

    /// Applies `f` to the mode and flag, moving to the next epoch (see [`Config`]).
    fn reconfigure(&self, f: impl Fn(Mode, bool) -> (Mode, bool)) {
        let _ = self.config.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |raw| {
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

    /// Sets the configuration epoch (a test hook for the epoch's saturation: it starts the
    /// counter near its limit). Not part of the API.
    #[doc(hidden)]
    pub fn __set_config_epoch_for_tests(&self, epoch: u64) {
        let _ = self.config.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |raw| {
            Some(raw & ((1 << EPOCH_SHIFT) - 1) | epoch.min(EPOCH_MAX) << EPOCH_SHIFT)
        });
    }

    /// Whether diagnostic mode is on.
    pub fn diagnostics(&self) -> bool {
        self.config().diagnostics()
    }

    /// Turns diagnostic mode on or off.
    ///
    /// In diagnostic mode, blocks the tracker allocates get guard bytes (checked on free and
    /// by [`Tracker::check_guards`] / [`Tracker::snapshot`]), frees capture a stack, and
    /// the allocator's freed records are kept in a bounded ring so a double free can show
    /// where the first free happened. It implies at least [`Mode::Records`] for blocks the
    /// tracker allocates.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tracker, TagId};
    /// use mmobject::Error;
    /// use std::alloc::Layout;
    ///
    /// let tracker = Tracker::new();
    /// tracker.set_diagnostics(true);
    /// let p = tracker.alloc(Layout::new::<[u8; 8]>(), TagId::UNTAGGED);
    /// // SAFETY (of the example): writing one byte past an 8-byte block, on purpose.
    /// unsafe { p.as_ptr().add(8).write(0) };
    /// assert!(matches!(tracker.try_dealloc(p), Err(Error::BufferOverrun { size: 8, .. })));
    /// ```
    pub fn set_diagnostics(&self, on: bool) {
        self.reconfigure(|mode, _| (mode, on));
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

    /// Counts an allocation made by a `TrackingAllocator`: in this thread's slot when the
    /// tag has no budget and no watch, else through [`Tracker::charge_counters`]. Returns
    /// whether the tag is watched.
    #[inline]
    pub(crate) fn count_alloc(&self, tag: TagId, bytes: usize) -> Result<bool, Error> {
        let c = &self.counters[tag.index()];
        if !c.slow.load(Ordering::Relaxed) {
            if let Some(slot) = self.threads.slot() {
                if slot.alloc(tag.index(), bytes as isize) {
                    self.flush(slot, tag);
                }
                return Ok(false);
            }
        }
        if !self.fed.load(Ordering::Relaxed) {
            self.fed.store(true, Ordering::Relaxed);
        }
        self.charge_counters(tag, bytes, Charger::Allocator)?;
        Ok(c.watch.load(Ordering::Relaxed))
    }

    /// Counts a free (of a block counted by `count_alloc` or `charge_counters`), in this
    /// thread's slot when possible. Returns `true` if the tag is watched.
    #[inline]
    pub(crate) fn count_free(&self, tag: TagId, bytes: usize) -> bool {
        let c = &self.counters[tag.index()];
        if !c.slow.load(Ordering::Relaxed) {
            if let Some(slot) = self.threads.slot() {
                if slot.free(tag.index(), bytes as isize) {
                    self.flush(slot, tag);
                }
                return false;
            }
        }
        c.sub(bytes);
        c.watch.load(Ordering::Relaxed)
    }

    #[cold]
    #[inline(never)]
    fn flush(&self, slot: &super::thread_stats::ThreadSlot, tag: TagId) {
        let (b, n, a) = slot.take(tag.index());
        self.counters[tag.index()].fold(b, n, a);
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

    /// Adds a record for a block, with a stack of `depth` frames if `depth != 0`. Returns
    /// `false` if the record table is out of `System` memory (the block has no record then).
    #[inline]
    pub(crate) fn add_record(&self, addr: usize, mut record: Record, depth: usize) -> bool {
        if depth != 0 {
            let _reentry = Reentry::enter();
            record.stack = self.stacks.intern(&StackTrace::capture(depth));
        }
        match self.records.insert(addr, record) {
            Ok(None) => true,
            Ok(Some(stale)) => {
                // An external block freed without `untrack`, whose memory came back: count
                // it as freed, as `try_track` does.
                if stale.flags & FLAG_EXTERNAL != 0 {
                    self.counters[stale.tag.index()].sub(stale.size);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Removes a block's record if it has one, applying the counters, the freed ring and
    /// the watch log. Reports nothing when there is no record.
    #[inline]
    pub(crate) fn take_record(&self, addr: usize, keep_freed: bool) -> Option<Record> {
        let record = self.records.remove(addr)?;
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
        Some(record)
    }

    fn remember_freed(&self, addr: usize, record: Record) {
        let config = self.config();
        let free_stack = if config.diagnostics() {
            let _reentry = Reentry::enter();
            self.stacks.intern(&StackTrace::capture(config.mode().stack_depth().max(8)))
        } else {
            NO_STACK
        };
        self.freed.push(Freed { addr, record, free_stack, epoch: config.epoch() });
    }

    /// Removes a block's record, applying the counters and the freed ring; a missing record
    /// is reported as a bad free.
    pub(crate) fn remove_record(&self, addr: usize, keep_freed: bool) -> Result<Record, Error> {
        match self.take_record(addr, keep_freed) {
            Some(r) => Ok(r),
            None => Err(self.bad_free(addr)),
        }
    }

    /// Counts the free of a block that has no record (counted by its header).
    #[inline]
    pub(crate) fn uncount(&self, tag: TagId, size: usize, addr: usize) {
        if self.count_free(tag, size) {
            self.watch_event("free", tag, size, Some(addr), None);
        }
    }

    /// Called after a block without a record was placed at `addr`: if the configuration
    /// (loaded now, after the placement) keeps records, forgets `addr` in the freed ring.
    ///
    /// Together with the epoch rule of [`Config`] this keeps the ring truthful: a ring entry
    /// is only trusted (see [`Tracker::decisive_double_free`]) while the epoch it was
    /// pushed in is current, and a block without a record placed at its address since
    /// then either saw a record-less configuration here (which, being current when the
    /// entry was pushed or later, implies a later epoch by the time diagnostics are on)
    /// or forgot the entry here. The load is ordered after the entry's push because the
    /// entry is pushed before the old block goes back to the inner allocator, and the new
    /// block came out of it.
    #[inline]
    pub(crate) fn placed_without_record(&self, addr: usize) {
        if self.config().keeps_records() {
            self.freed.forget(addr);
        }
    }

    /// In diagnostic mode, a free of `addr`, which has no record, is a double free for sure
    /// when the freed ring has an entry for it pushed in the current configuration epoch
    /// (`config`, loaded at the start of the free): then no block without a record can
    /// have been placed there since (see [`Tracker::placed_without_record`]). Reports it
    /// and returns `true`; the caller must then leave the memory alone. Otherwise returns
    /// `false`, and the caller decides from the block's header, as outside diagnostic mode.
    #[cold]
    pub(crate) fn decisive_double_free(&self, addr: usize, config: Config) -> bool {
        match self.freed.find(addr) {
            Some(first) if first.epoch == config.epoch() && config.epoch() != EPOCH_MAX => {
                let _ = self.double_free(addr, first);
                true
            }
            _ => false,
        }
    }

    /// Reports a free of an address with no record; returns the error.
    #[cold]
    #[inline(never)]
    pub(crate) fn bad_free(&self, addr: usize) -> Error {
        match self.freed.find(addr) {
            Some(first) => self.double_free(addr, first),
            None => self.untracked_free(addr),
        }
    }

    /// Reports a double free of `addr`, first freed as `first`; returns the error.
    #[cold]
    #[inline(never)]
    fn double_free(&self, addr: usize, first: Freed) -> Error {
        let _reentry = Reentry::enter();
        self.double_frees.fetch_add(1, Ordering::Relaxed);
        let tag = first.record.tag;
        match self.stacks.get(first.free_stack) {
            Some(stack) => log::error!(
                "double free of {addr:#x} ({} B, tag {tag}, allocated at {}); first freed at:\n{stack}",
                first.record.size,
                first.record.site
            ),
            None => log::error!(
                "double free of {addr:#x} ({} B, tag {tag}, allocated at {})",
                first.record.size,
                first.record.site
            ),
        }
        Error::DoubleFree { addr }
    }

    #[cold]
    pub(crate) fn untracked_free(&self, addr: usize) -> Error {
        let _reentry = Reentry::enter();
        self.untracked_frees.fetch_add(1, Ordering::Relaxed);
        log::error!("untracked free: the tracker has no record of {addr:#x}");
        Error::UntrackedFree { addr }
    }

    #[cold]
    pub(crate) fn double_free_by_header(&self, addr: usize) -> Error {
        let _reentry = Reentry::enter();
        self.double_frees.fetch_add(1, Ordering::Relaxed);
        log::error!("double free of {addr:#x} (its header is marked freed)");
        Error::DoubleFree { addr }
    }

    #[cold]
    pub(crate) fn overrun(&self, addr: usize, size: usize, bytes: usize, site: &'static Location<'static>) -> Error {
        let _reentry = Reentry::enter();
        self.buffer_overruns.fetch_add(1, Ordering::Relaxed);
        let e = Error::BufferOverrun { addr, size, bytes, site };
        log::error!("{e}");
        e
    }

    /// Tracks memory the tracker did not allocate (from an external library, say).
    ///
    /// Counts `size` bytes under `tag` and keeps a record of `ptr` (whatever the mode), so
    /// that [`Tracker::untrack`] can find it. Policies apply as for
    /// [`Tracker::try_charge`].
    ///
    /// # Errors
    ///
    /// [`Error::BudgetExceeded`] under the [`BudgetPolicy::Error`] policy (nothing is
    /// tracked then).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tag, Tracker};
    ///
    /// static FFI: Tag = Tag::new("FFI");
    /// let tracker = Tracker::new();
    /// let external = [0u8; 64]; // stands in for memory a C library handed us
    /// tracker.try_track(external.as_ptr(), 64, FFI.id())?;
    /// assert_eq!(tracker.tag_stats(&FFI).bytes, 64);
    /// assert_eq!(tracker.try_untrack(external.as_ptr())?, 64);
    /// assert!(tracker.try_untrack(external.as_ptr()).is_err()); // a double free
    /// # Ok::<(), mmobject::Error>(())
    /// ```
    #[track_caller]
    pub fn try_track(&self, ptr: *const u8, size: usize, tag: TagId) -> Result<(), Error> {
        let site = Location::caller();
        self.charge_counters(tag, size, Charger::Policy)?;
        let depth = self.mode().stack_depth();
        let stack = if depth == 0 {
            NO_STACK
        } else {
            let _reentry = Reentry::enter();
            self.stacks.intern(&StackTrace::capture(depth))
        };
        let record = Record { size, tag, flags: FLAG_EXTERNAL, site, stack };
        let addr = (ptr as usize).max(2);
        if let Ok(Some(old)) = self.records.insert(addr, record) {
            // A block tracked twice without `untrack`: count the old one as freed.
            self.counters[old.tag.index()].sub(old.size);
        }
        if self.counters[tag.index()].watch.load(Ordering::Relaxed) {
            self.watch_event("track", tag, size, Some(addr), Some(site));
        }
        Ok(())
    }

    /// Tracks external memory, like [`Tracker::try_track`].
    ///
    /// # Panics
    ///
    /// With the [`Error::BudgetExceeded`] message if the tag goes over budget under the
    /// `Error` or `Panic` policy.
    #[track_caller]
    pub fn track(&self, ptr: *const u8, size: usize, tag: TagId) {
        if let Err(e) = self.try_track(ptr, size, tag) {
            panic!("{e}");
        }
    }

    /// Stops tracking `ptr`; returns the size it was tracked with.
    ///
    /// # Errors
    ///
    /// [`Error::DoubleFree`] if `ptr` was untracked or freed recently (and not tracked
    /// again), [`Error::UntrackedFree`] if the tracker has no record of it. Both are also
    /// logged (`log::error!`) and counted in [`Tracker::error_counts`].
    pub fn try_untrack(&self, ptr: *const u8) -> Result<usize, Error> {
        self.remove_record((ptr as usize).max(2), true).map(|r| r.size)
    }

    /// Stops tracking `ptr`.
    ///
    /// A bad free is logged and counted but does not panic (this is typically called from
    /// `Drop`, which must not panic); use [`Tracker::try_untrack`] to see it.
    pub fn untrack(&self, ptr: *const u8) {
        let _ = self.try_untrack(ptr);
    }

    // ---- allocation through the tracker ----------------------------------------------

    /// Allocates a block from [`System`] under `tag`, with a record (and guard bytes in
    /// diagnostic mode).
    ///
    /// # Errors
    ///
    /// [`Error::BudgetExceeded`] under the `Error` policy; [`Error::OutOfMemory`] if
    /// `System` fails; [`Error::UnsupportedAlignment`] if the layout cannot be padded.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tag, Tracker};
    /// use std::alloc::Layout;
    ///
    /// static PARTICLES: Tag = Tag::new("Particles");
    /// let tracker = Tracker::new();
    /// let p = tracker.try_alloc(Layout::new::<[u32; 16]>(), PARTICLES.id())?;
    /// assert_eq!(tracker.tag_stats(&PARTICLES).bytes, 64);
    /// tracker.try_dealloc(p)?;
    /// assert!(tracker.try_dealloc(p).is_err()); // double free, detected
    /// # Ok::<(), mmobject::Error>(())
    /// ```
    #[track_caller]
    pub fn try_alloc(&self, layout: Layout, tag: TagId) -> Result<NonNull<u8>, Error> {
        let site = Location::caller();
        let config = self.config();
        let guarded = config.diagnostics();
        let Some(block) = block::block_layout(layout, guarded) else {
            return Err(Error::UnsupportedAlignment { align: layout.align(), max: 1 << 20 });
        };
        self.charge_counters(tag, layout.size(), Charger::Policy)?;
        // SAFETY: `block.outer` has a non-zero size (it includes the 16-byte header).
        let base = unsafe { System.alloc(block.outer) };
        if base.is_null() {
            self.counters[tag.index()].sub(layout.size());
            return Err(Error::OutOfMemory { requested: block.outer.size(), available: 0 });
        }
        let mut hflags = H_COUNTED | H_RECORD;
        let mut rflags = FLAG_TRACKER_ALLOC | (layout.align().trailing_zeros() << ALIGN_SHIFT);
        if guarded {
            hflags |= H_GUARDED;
            rflags |= FLAG_GUARDED;
        }
        // SAFETY: `base` is a fresh `System` block of `block.outer`, which came from
        // `block_layout(layout, guarded)`.
        let user = unsafe { block::init(base, block, layout.size(), Header::new(tag.0, hflags, layout.size())) };
        let record = Record { size: layout.size(), tag, flags: rflags, site, stack: NO_STACK };
        if !self.add_record(user as usize, record, config.mode().stack_depth()) {
            // Without a record `try_dealloc` could not free it: give it back now.
            self.counters[tag.index()].sub(layout.size());
            // SAFETY: `base` came from `System.alloc(block.outer)` above and is unused.
            unsafe { System.dealloc(base, block.outer) };
            return Err(Error::OutOfMemory { requested: block.outer.size(), available: 0 });
        }
        if self.counters[tag.index()].watch.load(Ordering::Relaxed) {
            self.watch_event("alloc", tag, layout.size(), Some(user as usize), Some(site));
        }
        // SAFETY: `user` is inside a non-null block.
        Ok(unsafe { NonNull::new_unchecked(user) })
    }

    /// Allocates a block under `tag`, like [`Tracker::try_alloc`].
    ///
    /// # Panics
    ///
    /// With the error's message where `try_alloc` would return an error.
    #[track_caller]
    pub fn alloc(&self, layout: Layout, tag: TagId) -> NonNull<u8> {
        match self.try_alloc(layout, tag) {
            Ok(p) => p,
            Err(e) => panic!("{e}"),
        }
    }

    /// Frees a block from [`Tracker::alloc`], checking its guard bytes.
    ///
    /// Safe because the pointer is looked up in the record table before its memory is
    /// touched: a pointer without a live record is reported and left alone.
    ///
    /// # Errors
    ///
    /// - [`Error::DoubleFree`] if `ptr` was freed already (recently enough to be in the
    ///   ring of freed records); [`Error::UntrackedFree`] if the tracker never allocated
    ///   it. Nothing is freed.
    /// - [`Error::BufferOverrun`] if guard bytes were overwritten; the block is still freed.
    pub fn try_dealloc(&self, ptr: NonNull<u8>) -> Result<(), Error> {
        let addr = ptr.as_ptr() as usize;
        match self.records.get(addr) {
            Some(r) if r.flags & FLAG_TRACKER_ALLOC != 0 => {}
            // Tracked with `track`: not ours to free.
            Some(_) => return Err(self.untracked_free(addr)),
            None => return Err(self.bad_free(addr)),
        }
        // Another thread may free it between `get` and here; then this reports the bad free.
        let record = self.remove_record(addr, true)?;
        let guarded = record.flags & FLAG_GUARDED != 0;
        let layout = Layout::from_size_align(record.size, record.align()).expect("layout was valid at allocation");
        let block = block::block_layout(layout, guarded).expect("layout was valid at allocation");
        let mut result = Ok(());
        if guarded {
            let hflags = H_COUNTED | H_RECORD | H_GUARDED;
            // SAFETY: the record was live until we removed it, so the block is live, guarded
            // and of this size; only this thread could remove the record.
            let bad = unsafe {
                block::damaged_bytes(ptr.as_ptr(), record.size, Header::new(record.tag.0, hflags, record.size))
            };
            if bad != 0 && record.flags & FLAG_OVERRUN_REPORTED == 0 {
                result = Err(self.overrun(addr, record.size, bad, record.site));
            }
        }
        // SAFETY: the block was allocated by `System` with `block.outer` at
        // `ptr - block.prefix` (see `try_alloc`), and its record is gone, so it is freed once.
        unsafe { System.dealloc(ptr.as_ptr().sub(block.prefix), block.outer) };
        result
    }

    /// Frees a block from [`Tracker::alloc`]. Bad frees and overruns are logged and
    /// counted, not raised (this is typically called from `Drop`); see
    /// [`Tracker::try_dealloc`].
    pub fn dealloc(&self, ptr: NonNull<u8>) {
        let _ = self.try_dealloc(ptr);
    }

    // ---- reading -------------------------------------------------------------------------

    /// One tag's numbers now.
    pub fn tag_stats(&self, tag: impl Into<TagId>) -> TagStats {
        let tag = tag.into();
        self.counters[tag.index()].snapshot(tag, tag.name(), self.pending(tag))
    }

    /// Each registered tag's numbers, in id order.
    pub fn all_tag_stats(&self) -> Vec<TagStats> {
        let (names, n) = tag::registered_names();
        (0..n)
            .map(|i| {
                let tag = TagId(i as u32);
                self.counters[i].snapshot(tag, names[i], self.pending(tag))
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

    /// Bytes the tracker's own tables hold (from [`System`], never tracked).
    pub fn overhead_bytes(&self) -> usize {
        self.records.heap_bytes()
            + self.stacks.heap_bytes()
            + self.freed.heap_bytes()
            + self.timeline.heap_bytes()
            + self.threads.heap_bytes()
    }

    /// Bad frees and overruns seen so far.
    pub fn error_counts(&self) -> ErrorCounts {
        ErrorCounts {
            untracked_frees: self.untracked_frees.load(Ordering::Relaxed),
            double_frees: self.double_frees.load(Ordering::Relaxed),
            buffer_overruns: self.buffer_overruns.load(Ordering::Relaxed),
        }
    }

    /// The number of live records.
    pub fn live_records(&self) -> usize {
        self.records.len()
    }

    /// Sets every tag's peaks to its current values (say, at a level load).
    pub fn reset_peaks(&self) {
        for (i, c) in self.counters.iter().enumerate() {
            c.reset_peaks(self.pending(TagId(i as u32)));
        }
    }

    /// Forgets the freed-record ring (so later frees of those addresses count as untracked
    /// rather than double).
    pub fn clear_freed(&self) {
        self.freed.clear();
    }

    /// Checks the guard bytes of every live guarded block; logs, counts and returns each
    /// newly found overrun (each block is reported once).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tracker, TagId};
    /// use std::alloc::Layout;
    ///
    /// let tracker = Tracker::new();
    /// tracker.set_diagnostics(true);
    /// let p = tracker.alloc(Layout::new::<u64>(), TagId::UNTAGGED);
    /// assert!(tracker.check_guards().is_empty());
    /// // SAFETY (of the example): an overrun, on purpose, into the guard zone.
    /// unsafe { p.as_ptr().add(9).write(1) };
    /// assert_eq!(tracker.check_guards().len(), 1);
    /// assert!(tracker.check_guards().is_empty()); // reported once
    /// tracker.dealloc(p);
    /// ```
    pub fn check_guards(&self) -> Vec<Error> {
        let _reentry = Reentry::enter();
        // Collect (addr, size, bytes, site) under the shard locks into System-free storage:
        // a fixed batch, repeated while more are found. Nothing allocates under a lock.
        let mut found = Vec::new();
        let mut batch: [(usize, usize, usize, Option<&'static Location<'static>>); 32] = [(0, 0, 0, None); 32];
        let mut n = 0;
        self.records.for_each(|addr, r| {
            if r.flags & FLAG_GUARDED == 0 || r.flags & FLAG_OVERRUN_REPORTED != 0 || n == batch.len() {
                return;
            }
            let hflags = H_COUNTED | H_RECORD | H_GUARDED;
            // SAFETY: the record is live and we hold its shard's lock, so its block cannot be
            // freed meanwhile (frees remove the record under this lock first); guarded
            // records describe guarded blocks of `r.size` bytes at `addr`. The block's
            // provenance was exposed when its address was recorded (`as usize`).
            let bad = unsafe {
                block::damaged_bytes(
                    std::ptr::with_exposed_provenance::<u8>(addr),
                    r.size,
                    Header::new(r.tag.0, hflags, r.size),
                )
            };
            if bad != 0 {
                r.flags |= FLAG_OVERRUN_REPORTED;
                batch[n] = (addr, r.size, bad, Some(r.site));
                n += 1;
            }
        });
        for &(addr, size, bytes, site) in &batch[..n] {
            found.push(self.overrun(addr, size, bytes, site.expect("set with the entry")));
        }
        if n == batch.len() {
            found.extend(self.check_guards());
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn charge_and_credit() {
        let t = Tracker::new();
        let tag = t.tag_named("tracker-unit-charge");
        t.try_charge(tag, 10).unwrap();
        t.try_charge(tag, 20).unwrap();
        t.credit(tag, 10);
        let s = t.tag_stats(tag);
        assert_eq!((s.bytes, s.peak_bytes, s.count, s.peak_count), (20, 30, 1, 2));
    }

    #[test]
    fn error_policy_counts_nothing() {
        let t = Tracker::new();
        let tag = t.tag_named("tracker-unit-error");
        t.set_budget(tag, 10);
        t.set_budget_policy(tag, BudgetPolicy::Error);
        assert_eq!(
            t.try_charge(tag, 11),
            Err(Error::BudgetExceeded { tag: "tracker-unit-error", budget: 10, current: 0, requested: 11 })
        );
        assert_eq!(t.tag_stats(tag).count, 0);
    }

    #[test]
    fn callback_policy_is_called() {
        static CALLS: AtomicUsize = AtomicUsize::new(0);
        fn on_over(o: &BudgetOverrun) {
            assert_eq!(o.requested, 5);
            CALLS.fetch_add(1, Ordering::Relaxed);
        }
        let t = Tracker::new();
        let tag = t.tag_named("tracker-unit-callback");
        t.set_budget(tag, 4);
        t.set_budget_policy(tag, BudgetPolicy::Callback(on_over));
        t.try_charge(tag, 5).unwrap();
        assert_eq!(CALLS.load(Ordering::Relaxed), 1);
        assert_eq!(t.tag_stats(tag).bytes, 5);
    }

    #[test]
    #[should_panic(expected = "budget exceeded for tag 'tracker-unit-panic'")]
    fn panic_policy_panics() {
        let t = Tracker::new();
        let tag = t.tag_named("tracker-unit-panic");
        t.set_budget(tag, 1);
        t.set_budget_policy(tag, BudgetPolicy::Panic);
        let _ = t.try_charge(tag, 2);
    }

    #[test]
    fn alloc_dealloc_and_bad_frees() {
        let t = Tracker::new();
        let tag = t.tag_named("tracker-unit-alloc");
        let p = t.alloc(Layout::from_size_align(40, 64).unwrap(), tag);
        assert_eq!(p.as_ptr() as usize % 64, 0);
        assert_eq!(t.tag_stats(tag).bytes, 40);
        t.try_dealloc(p).unwrap();
        assert_eq!(t.try_dealloc(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
        let bogus = NonNull::new(std::ptr::without_provenance_mut(0x1234_5670)).unwrap();
        assert_eq!(t.try_dealloc(bogus), Err(Error::UntrackedFree { addr: 0x1234_5670 }));
        assert_eq!(t.error_counts(), ErrorCounts { untracked_frees: 1, double_frees: 1, buffer_overruns: 0 });
        assert_eq!(t.tag_stats(tag).bytes, 0);
    }

    #[test]
    fn guards_catch_under_and_overruns() {
        let t = Tracker::new();
        t.set_diagnostics(true);
        let p = t.alloc(Layout::new::<[u8; 4]>(), TagId::UNTAGGED);
        // SAFETY: writing into the front guard zone of our own block, on purpose.
        unsafe { p.as_ptr().sub(1).write(9) };
        assert!(matches!(t.try_dealloc(p), Err(Error::BufferOverrun { size: 4, bytes: 1, .. })));
        assert_eq!(t.error_counts().buffer_overruns, 1);
    }
}
