//! [`TrackingAllocator`]: a `GlobalAlloc` wrapper that attributes every heap allocation to
//! the tag in scope.

use std::alloc::{GlobalAlloc, Layout, System};
use std::fmt;
use std::panic::Location;
use std::ptr;

use super::block::Placement;
use super::block::{self, Header, H_COUNTED, H_GUARDED, H_RECORD};
use super::budget::Charger;
use super::config_key::KEY_NONE;
use super::mode::Config;
use super::record::{Record, FLAG_GLOBAL_ALLOC};
use super::scope::{allocation_tag, current_tag, in_tracker, with_local, Local};
use super::stack_trace::NO_STACK;
use super::tag::TagId;
use super::tracker::Tracker;

/// Runs `f`, tracker code that may call user code (a budget callback, the logger of a
/// watched tag or of a diagnostic) from inside the allocator, and aborts the process if it
/// unwinds: a `GlobalAlloc` must not unwind (undefined behaviour), and a panic in such code
/// would otherwise come out of `alloc`, `realloc` or `dealloc`. Only on cold paths: the
/// counting path calls no user code.
#[inline(always)]
fn no_unwind<R>(f: impl FnOnce() -> R) -> R {
    /// Aborts when dropped, which only happens while `f` unwinds (it is forgotten after).
    struct AbortOnUnwind;
    impl Drop for AbortOnUnwind {
        #[cold]
        fn drop(&mut self) {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "mmobject: a panic inside the global allocator; aborting");
            std::process::abort();
        }
    }
    let armed = AbortOnUnwind;
    let r = f();
    std::mem::forget(armed);
    r
}

/// `true`, and marks the branch that calls it unlikely, so the likely one falls through.
#[cold]
#[inline]
fn cold_path() -> bool {
    true
}

/// A [`GlobalAlloc`] that wraps another allocator and reports every allocation to a
/// [`Tracker`] (by default [`Tracker::global()`]), under the tag in scope on the
/// allocating thread.
///
/// Each block gets an 8-byte header (the tag and how the block was tracked), so a free is
/// attributed to the tag it was allocated under, from any thread, and `realloc` keeps the
/// block's tag. In [`Mode::Records`](super::Mode::Records) / `Stacks` each block also gets a
/// record (its site is the allocator; use `Stacks` to see callers); in diagnostic mode,
/// guard bytes too.
///
/// Re-entry is impossible: the tracker's tables use [`System`] directly, and while the
/// tracker runs code that may allocate (logging, budget callbacks, symbol resolution) a
/// const-initialised thread-local flag sends those allocations straight to the inner
/// allocator, untracked.
///
/// Under Miri, programs using it as the global allocator need `-Zmiri-tree-borrows`: Stacked
/// Borrows rejects reading a header in front of a block through the (retagged) pointer
/// `dealloc` receives.
///
/// Budget policies inside the allocator: `Error` makes the allocation return null
/// (`Vec::try_reserve` sees an error; other allocations abort via `handle_alloc_error`);
/// `Panic` logs and aborts, since a global allocator must not unwind. For the same reason, a
/// panic in code the tracker calls from inside the allocator (a budget callback, the logger
/// of a watched tag or of a diagnostic) aborts the process.
///
/// # Examples
///
/// ```
/// use mmobject::track::{Tag, Tracker, TrackingAllocator};
/// use std::alloc::System;
///
/// #[global_allocator]
/// static ALLOC: TrackingAllocator<System> = TrackingAllocator::new(System);
///
/// static LEVEL: Tag = Tag::new("Level");
/// let before = Tracker::global().tag_stats(&LEVEL).bytes;
/// let v: Vec<u8> = mmobject::track::scope(&LEVEL, || Vec::with_capacity(1000));
/// assert_eq!(Tracker::global().tag_stats(&LEVEL).bytes, before + 1000);
/// drop(v);
/// assert_eq!(Tracker::global().tag_stats(&LEVEL).bytes, before);
/// ```
pub struct TrackingAllocator<A: GlobalAlloc = System> {
    inner: A,
    tracker: &'static Tracker,
}

impl<A: GlobalAlloc> TrackingAllocator<A> {
    /// Wraps `inner`, reporting into [`Tracker::global()`].
    pub const fn new(inner: A) -> Self {
        Self { inner, tracker: Tracker::global() }
    }

    /// Wraps `inner`, reporting into `tracker`.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tracker, TrackingAllocator};
    /// use std::alloc::{GlobalAlloc, Layout, System};
    ///
    /// static TRACKER: Tracker = Tracker::new();
    /// let alloc = TrackingAllocator::with_tracker(System, &TRACKER);
    /// let layout = Layout::new::<[u8; 32]>();
    /// // SAFETY (of the example): non-zero layout; freed once with the same layout.
    /// unsafe {
    ///     let p = alloc.alloc(layout);
    ///     assert!(!p.is_null());
    ///     alloc.dealloc(p, layout);
    /// }
    /// ```
    pub const fn with_tracker(inner: A, tracker: &'static Tracker) -> Self {
        Self { inner, tracker }
    }

    /// The wrapped allocator.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// The tracker this allocator reports into.
    pub fn tracker(&self) -> &'static Tracker {
        self.tracker
    }

    /// Allocates under `tag` (`None`: untracked, for re-entrant calls) through
    /// [`Tracker::place`], with a record and guards as the configuration says.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    // Out of line: inlined, its frame (records, stacks, guards) would weigh on the counting
    // fast path of `alloc` that shares the function.
    #[inline(never)]
    unsafe fn alloc_tagged(&self, layout: Layout, tag: Option<TagId>, zeroed: bool) -> *mut u8 {
        let (guarded, record) = match tag {
            None => (false, None),
            Some(_) => {
                let config = self.tracker.config();
                (config.diagnostics(), config.records(layout.size()))
            }
        };
        // SAFETY: the caller's contract, passed on.
        unsafe { self.alloc_placed(layout, tag, zeroed, guarded, record) }
    }

    /// [`alloc_tagged`](Self::alloc_tagged) with the guards and the record decided by the
    /// caller (`record`: a record with that many stack frames).
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    unsafe fn alloc_placed(
        &self,
        layout: Layout,
        tag: Option<TagId>,
        zeroed: bool,
        guarded: bool,
        record: Option<usize>,
    ) -> *mut u8 {
        let how = Placement {
            tag,
            guarded,
            record,
            record_flags: FLAG_GLOBAL_ALLOC,
            charger: Charger::Allocator,
            record_required: false,
            site: Location::caller(),
        };
        let allocate = |outer: Layout| {
            if zeroed {
                // SAFETY: the outer layout has a non-zero size (it includes the header).
                unsafe { self.inner.alloc_zeroed(outer) }
            } else {
                // SAFETY: as above.
                unsafe { self.inner.alloc(outer) }
            }
        };
        // The budget's callback and the watch log may run: no unwinding out of here.
        // SAFETY: `allocate` calls the inner allocator with the layout it is given, which
        // returns a fresh block of it or null (`GlobalAlloc`'s contract).
        match no_unwind(|| unsafe { self.tracker.place(layout, how, allocate) }) {
            Ok(user) => user,
            Err(_) => ptr::null_mut(),
        }
    }
}

impl<A: GlobalAlloc> fmt::Debug for TrackingAllocator<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TrackingAllocator").field("tracker", self.tracker).finish_non_exhaustive()
    }
}

// SAFETY: every block comes from `inner` with an outer layout that contains the user block
// at `prefix` (aligned to the user alignment, see `block::block_layout`), and is returned to
// `inner` with that same outer layout, recomputed from the user layout and the header's
// guard flag; blocks whose header or record says they are not live are leaked, never freed
// twice.
unsafe impl<A: GlobalAlloc> GlobalAlloc for TrackingAllocator<A> {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller guarantees a non-zero size.
        unsafe { self.alloc_counted(layout, false) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller guarantees a non-zero size.
        unsafe { self.alloc_counted(layout, true) }
    }

    #[inline(always)]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        if unsafe { self.free_fast(ptr, layout) } {
            return;
        }
        // SAFETY: as above.
        unsafe { self.dealloc_cold(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `new_size` is non-zero and does not overflow `isize` when rounded to
        // `layout.align()` (the caller's contract for `realloc`).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        let config = self.tracker.config();
        if !in_tracker() && !config.keeps_records() {
            // SAFETY: `ptr` is live and came from this allocator (caller's contract).
            let header = unsafe { block::read_header(ptr) };
            if header.is_counted_only() {
                // Sampled mode records some sizes (every one from its `large` up): a block
                // that grows into one gets its record, as an allocation of the new size
                // would, so it is moved; else it is resized in place.
                let Some(depth) = config.records(new_size) else {
                    // SAFETY: the caller's contract, passed on; the header says the block
                    // is counted only.
                    return unsafe { self.realloc_counted(ptr, layout, new_layout, header) };
                };
                // SAFETY: `new_layout` has a non-zero size; no guards, since diagnostics
                // are off (`keeps_records` is false).
                let new =
                    unsafe { self.alloc_placed(new_layout, Some(TagId(header.tag())), false, false, Some(depth)) };
                // SAFETY: the caller's contract, passed on; `new` is null or a fresh block.
                return unsafe { self.move_block(ptr, layout, new, new_size) };
            }
        }
        let tag = if in_tracker() {
            None
        } else {
            // SAFETY: `ptr` is live and came from this allocator (caller's contract).
            let header = unsafe { block::read_header(ptr) };
            // Keep the block's tag; a block allocated untracked takes the tag in scope now.
            Some(if header.is_valid() && header.flags() & H_COUNTED != 0 { TagId(header.tag()) } else { current_tag() })
        };
        // SAFETY: `new_layout` has a non-zero size.
        let new = unsafe { self.alloc_tagged(new_layout, tag, false) };
        // SAFETY: the caller's contract, passed on; `new` is null or a fresh block.
        unsafe { self.move_block(ptr, layout, new, new_size) }
    }
}

impl<A: GlobalAlloc> TrackingAllocator<A> {
    /// The end of a `realloc` that moves: copies `ptr`'s bytes into `new` and frees `ptr`,
    /// unless `new` is null (then `ptr` stays as it was). Returns `new`.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::realloc`] (`ptr` is live, from this allocator, allocated with
    /// `layout`), and `new` is null or a fresh block of this allocator of at least
    /// `new_size` bytes, the size `realloc` was asked for.
    #[inline]
    unsafe fn move_block(&self, ptr: *mut u8, layout: Layout, new: *mut u8, new_size: usize) -> *mut u8 {
        if !new.is_null() {
            // SAFETY: both blocks are live, distinct, and at least `min(old, new)` long.
            unsafe {
                ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
        }
        new
    }

    /// `dealloc`'s counting path: this thread's cache (`scope::Local`) is current for this
    /// tracker, so diagnostics are off and the thread's slot is at hand, and the block is
    /// counted only, under a tag that is not slow. The block's header is compared with the
    /// one the current tag's blocks get, which gives the tag's counters when they match;
    /// else it is checked as `Header::is_counted_only` does. The layout gives the size.
    /// Returns `false`, having done nothing, off that path.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`].
    #[inline(always)]
    unsafe fn free_fast(&self, ptr: *mut u8, layout: Layout) -> bool {
        let t = self.tracker;
        let key = t.fast_key();
        with_local(|l| {
            if l.key.get() != key {
                return false;
            }
            // SAFETY: the caller guarantees `ptr` is live and came from this allocator, so it
            // has a header.
            let header = unsafe { block::read_header(ptr) };
            let delta = if header == l.header.get() {
                l.delta.get()
            } else if cold_path() && header.is_counted_only() && !(l.any_slow.get() && t.is_slow(TagId(header.tag()))) {
                l.tags.get().wrapping_add(TagId(header.tag()).index())
            } else {
                return false;
            };
            // SAFETY: `l.key` is this tracker's key, so `l.tags` is this thread's slot's
            // counters in it and `l.delta` the current tag's (`Local`'s invariant); the
            // slot lives as long as the tracker, which is `'static`. The header's tag is
            // that tag, or below `MAX_TAGS` (`is_counted_only` checks it).
            unsafe { &*delta }.free(layout.size() as isize);
            // SAFETY: the caller's contract; the header says counted only (`l.header` is a
            // counted-only header, or `Header::NONE`, which no block has).
            unsafe { self.free_counted(ptr, layout) };
            true
        })
        .unwrap_or(false)
    }

    /// `dealloc` off the counting path: the thread's cache is for another tracker or
    /// configuration (it is filled, and the counting path tried again), or the block or the
    /// configuration needs more than a count.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`].
    #[inline(never)]
    unsafe fn dealloc_cold(&self, ptr: *mut u8, layout: Layout) {
        let t = self.tracker;
        if with_local(|l| l.key.get()) != Some(t.fast_key()) && t.refill_local() {
            // SAFETY: the caller's contract, passed on.
            if unsafe { self.free_fast(ptr, layout) } {
                return;
            }
        }
        // SAFETY: as above.
        unsafe { self.dealloc_checked(ptr, layout) }
    }

    /// `dealloc` off the counting path: diagnostics, a slow tag, a block with a record, or
    /// a thread without its slot.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`].
    // Inlined into `dealloc_cold`, its one caller: no frame more before a diagnostic free's
    // stack capture than before that function existed.
    #[inline(always)]
    unsafe fn dealloc_checked(&self, ptr: *mut u8, layout: Layout) {
        // The watch log and the diagnostics' logs may run: no unwinding out of here.
        // SAFETY: the caller's contract, passed on.
        no_unwind(|| unsafe { self.dealloc_checked_unguarded(ptr, layout) })
    }

    /// [`dealloc_checked`](Self::dealloc_checked)'s work, which may call the logger.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`].
    #[inline(always)]
    unsafe fn dealloc_checked_unguarded(&self, ptr: *mut u8, layout: Layout) {
        let t = self.tracker;
        if !t.config().diagnostics() {
            // SAFETY: the caller guarantees `ptr` is live and came from this allocator, so it
            // has a header.
            let header = unsafe { block::read_header(ptr) };
            if header.is_counted_only() {
                // The thread's slot if the tag is not slow, else the shared counters.
                t.uncount(TagId(header.tag()), layout.size(), ptr as usize);
                // SAFETY: the caller's contract; the header says counted only.
                return unsafe { self.free_counted(ptr, layout) };
            }
            if header.is_recorded_only() {
                // SAFETY: the caller's contract; the header says recorded, unguarded.
                return unsafe { self.free_recorded(ptr, layout) };
            }
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { self.dealloc_slow(ptr, layout) }
    }

    /// `alloc` and `alloc_zeroed`: the counting path inline, everything else out of line.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline(always)]
    unsafe fn alloc_counted(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        // SAFETY: the caller guarantees a non-zero size.
        if let Some(user) = unsafe { self.alloc_fast(layout, zeroed) } {
            return user;
        }
        // SAFETY: as above.
        unsafe { self.alloc_cold(layout, zeroed) }
    }

    /// `alloc`'s counting path: one thread-local block (`scope::Local`) and the tracker's
    /// fast key. While the two keys match, the cache holds this thread's slot, the current
    /// tag's header and counters, and the largest size counted only under that tag (none if
    /// it is slow, none but small ones in sampled mode; in counting mode a second copy of
    /// the key stands for both tests). Then: the inner allocation, the keys compared again,
    /// one header store and two counter updates. The count comes after the allocation: with
    /// the tag not slow there is no budget to refuse it, so a failed allocation has nothing
    /// to undo. `None`, having done nothing, off that path.
    ///
    /// The second comparison stands for [`Tracker::placed_without_record`]'s load of the
    /// configuration (see its docs for why an unchanged key is enough), and lets the header
    /// and counters be read after the inner allocation (nothing is kept across it): an
    /// unchanged key vouches for them as it did before.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline(always)]
    unsafe fn alloc_fast(&self, layout: Layout, zeroed: bool) -> Option<*mut u8> {
        let t = self.tracker;
        let key = t.fast_key();
        // Counting mode: one comparison; sampled mode, or a slow tag: the key and the limit.
        let counted = |l: &Local| l.any_size_key.get() == key || l.key.get() == key && layout.size() <= l.limit.get();
        if !with_local(counted)? {
            return None;
        }
        let Some((base, block)) = self.alloc_unguarded(layout, zeroed) else {
            return Some(ptr::null_mut());
        };
        // SAFETY: `base` is a fresh block of `block.outer`, from `block_layout(layout, false)`,
        // so its user pointer is `prefix` bytes in.
        let user = unsafe { base.add(block.prefix) };
        let counted = with_local(|l| {
            if l.key.get() != t.fast_key() {
                return false;
            }
            let header = l.header.get();
            // SAFETY: `user` is the fresh block's user pointer, its header slot in the block
            // (`prefix >= HEADER`). The key still matches, so since the size was checked
            // the tag has not become slow, nor changed while some tag is (that drops the
            // key): `header` is a counted-only header.
            unsafe { block::write_header(user, header) };
            // SAFETY: the key matches, so `l.delta` is the current tag's counters in this
            // thread's slot of this tracker (`Local`'s invariant), which lives as long as the
            // tracker (`'static`).
            let counters = unsafe { &*l.delta.get() };
            if counters.alloc(layout.size() as isize) {
                t.flush_local(TagId(header.tag()));
            }
            true
        });
        if counted != Some(true) {
            // SAFETY: as above, `user` is the fresh block's user pointer.
            unsafe { self.placed_meanwhile(user, layout.size()) };
        }
        Some(user)
    }

    /// The end of [`alloc_fast`](Self::alloc_fast) when the tracker's configuration changed
    /// during the inner allocation: as [`place_counted`](Self::place_counted) ends, under
    /// the current tag. Never refused: a budget set meanwhile starts with the next
    /// allocation.
    ///
    /// # Safety
    ///
    /// `user` is the user pointer of a fresh unguarded block, not yet handed out.
    #[cold]
    #[inline(never)]
    unsafe fn placed_meanwhile(&self, user: *mut u8, size: usize) {
        let t = self.tracker;
        let tag = current_tag();
        // SAFETY: the caller's contract.
        unsafe { block::write_header(user, Header::new(tag.0, H_COUNTED)) };
        t.placed_without_record(user as usize);
        t.count_unbudgeted(tag, size);
    }

    /// `alloc` off the counting path: the thread's cache is for another tracker or
    /// configuration (it is filled, and the counting path tried again), or the allocation
    /// needs more than a count (a record, guards, a slow tag, re-entry).
    ///
    /// Kept small: the records path goes through it (it is the first out-of-line frame, as
    /// `OWN_FRAMES_SLACK` expects before a record's stack capture), so everything heavier
    /// than choosing the path is a call.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline(never)]
    unsafe fn alloc_cold(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let key = self.tracker.fast_key();
        // Not for a configuration without a counting path (diagnostics): no frame more before
        // its stack captures.
        if with_local(|l| l.key.get()) != Some(key) && key != KEY_NONE {
            // SAFETY: the caller guarantees a non-zero size.
            return unsafe { self.alloc_refill(layout, zeroed) };
        }
        // SAFETY: as above.
        unsafe { self.alloc_general(layout, zeroed) }
    }

    /// [`alloc_cold`](Self::alloc_cold) with the cache not current: it is filled, and the
    /// counting path tried again, else the general one. (A record's stack placed from here
    /// has one frame of ours more: the first allocation of a thread after a change of
    /// configuration.)
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline(never)]
    unsafe fn alloc_refill(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        if self.tracker.refill_local() {
            // SAFETY: the caller guarantees a non-zero size.
            if let Some(user) = unsafe { self.alloc_fast(layout, zeroed) } {
                return user;
            }
        }
        // SAFETY: as above.
        unsafe { self.alloc_general(layout, zeroed) }
    }

    /// `alloc` under the tag in scope as the configuration and the tag's flag decide,
    /// without the thread's cache.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline(always)]
    unsafe fn alloc_general(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let t = self.tracker;
        let Some(tag) = allocation_tag() else {
            // SAFETY: the caller guarantees a non-zero size.
            return unsafe { self.alloc_tagged(layout, None, zeroed) };
        };
        let config = t.config();
        // While no tag is slow, one test; else this tag's flag too.
        let counted = config.counts_only(layout.size())
            || (config.slow_tags() && config.mode_counts_only(layout.size()) && !t.is_slow(tag));
        if !counted {
            // SAFETY: as above.
            return unsafe { self.alloc_checked(layout, tag, config, zeroed) };
        }
        // SAFETY: as above.
        unsafe { self.place_counted(layout, tag, zeroed) }
    }

    /// The counting path's allocation, header and count, for a tag that is not slow, without
    /// the thread's cache (the cache's own path is [`alloc_fast`](Self::alloc_fast)).
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline(never)]
    unsafe fn place_counted(&self, layout: Layout, tag: TagId, zeroed: bool) -> *mut u8 {
        let t = self.tracker;
        let Some((base, block)) = self.alloc_unguarded(layout, zeroed) else {
            return ptr::null_mut();
        };
        // SAFETY: `base` is a fresh block of `block.outer`, from `block_layout(layout, false)`.
        let user = unsafe { block::init(base, block, layout.size(), Header::new(tag.0, H_COUNTED)) };
        t.placed_without_record(user as usize);
        t.count_unbudgeted(tag, layout.size());
        user
    }

    /// `alloc` off the counting path: a size that gets a record, diagnostics, or a tag with
    /// a budget or a watch.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    // Inlined into `alloc_cold`, its one caller: no frame more before a record's stack
    // capture than before that function existed (`OWN_FRAMES_SLACK` covers so many).
    #[inline(always)]
    unsafe fn alloc_checked(&self, layout: Layout, tag: TagId, config: Config, zeroed: bool) -> *mut u8 {
        if config.diagnostics() || self.tracker.is_slow(tag) {
            // SAFETY: the caller guarantees a non-zero size.
            return unsafe { self.alloc_tagged(layout, Some(tag), zeroed) };
        }
        // SAFETY: as above.
        unsafe { self.alloc_recorded(layout, tag, config, zeroed) }
    }

    /// The inner allocation of an unguarded block for `layout` (header included), or `None`
    /// if the layout overflows or the inner allocator refuses.
    #[inline(always)]
    fn alloc_unguarded(&self, layout: Layout, zeroed: bool) -> Option<(*mut u8, block::BlockLayout)> {
        let block = block::block_layout(layout, false)?;
        // SAFETY: `block.outer` has a non-zero size (it includes the header).
        let base = unsafe {
            if zeroed {
                self.inner.alloc_zeroed(block.outer)
            } else {
                self.inner.alloc(block.outer)
            }
        };
        (!base.is_null()).then_some((base, block))
    }

    /// `alloc` of a block that may get a record but no guards (records or stacks mode, a
    /// size sampling looks at, or any size while some other tag is slow; diagnostics off)
    /// under a tag that is not slow:
    /// [`Tracker::place`]'s steps for this one case, without its generality. The record
    /// becomes the thread's pending record (see `pending.rs`) when the thread has its slot.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::alloc`]: `layout` has a non-zero size.
    #[inline(never)]
    unsafe fn alloc_recorded(&self, layout: Layout, tag: TagId, config: Config, zeroed: bool) -> *mut u8 {
        let t = self.tracker;
        let size = layout.size();
        // `None`: a sampled size that this allocation skips; it is counted only.
        let depth = config.records(size);
        let Some((base, block)) = self.alloc_unguarded(layout, zeroed) else {
            return ptr::null_mut();
        };
        // SAFETY: `base` is a fresh block of `block.outer`, from `block_layout(layout, false)`.
        let user = unsafe {
            block::init(
                base,
                block,
                size,
                Header::new(tag.0, if depth.is_some() { H_COUNTED | H_RECORD } else { H_COUNTED }),
            )
        };
        let slot = t.threads.cached_slot();
        match slot {
            Some(slot) => {
                if slot.alloc(tag.index(), size as isize) {
                    t.flush(slot, tag);
                }
            }
            None => t.count_unbudgeted(tag, size),
        }
        let Some(depth) = depth else {
            t.placed_without_record(user as usize);
            return user;
        };
        let record = Record { size, tag, flags: FLAG_GLOBAL_ALLOC, site: Location::caller(), stack: NO_STACK };
        if !t.add_record_pending(slot, user as usize, record, depth) {
            // No room for the record (`System` is out of memory): counted only, and the
            // header says so, else its free would look like a double free.
            // SAFETY: `user` is the block `init` just set up, not handed out yet.
            unsafe { block::write_header(user, Header::new(tag.0, H_COUNTED)) };
            t.placed_without_record(user as usize);
        }
        user
    }

    /// `dealloc` of a block with a record and no guards, diagnostics off: the record is
    /// removed (this thread's pending record first, with no lock), the count taken off, the
    /// block freed. A missing record is a double free: the block is then left alone.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`], and `ptr`'s header says recorded, unguarded.
    #[inline(never)]
    unsafe fn free_recorded(&self, ptr: *mut u8, layout: Layout) {
        let t = self.tracker;
        let addr = ptr as usize;
        if let Some(slot) = t.threads.cached_slot() {
            if let Some(record) = slot.pending.cancel(addr) {
                // `record_removed`'s steps for a pending record (counted by the allocator,
                // never kept in the freed ring here), with the slot at hand.
                if t.is_slow(record.tag) {
                    t.record_removed(addr, record, false);
                } else {
                    slot.free(record.tag.index(), record.size as isize);
                }
                // SAFETY: the caller's contract; its record is removed, so this is the one
                // free.
                return unsafe { self.free_counted(ptr, layout) };
            }
        }
        let Some(record) = t.remove_record_locked(addr) else {
            let _ = t.double_free_by_header(addr);
            return; // leak rather than free twice
        };
        t.record_removed(addr, record, false);
        // SAFETY: the caller's contract; its record is removed, so this is the one free.
        unsafe { self.free_counted(ptr, layout) }
    }

    /// Gives a counted-only block (already uncounted) back to the inner allocator.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`], and `ptr`'s header says counted only.
    #[inline(always)]
    unsafe fn free_counted(&self, ptr: *mut u8, layout: Layout) {
        let block = block::block_layout(layout, false).expect("layout was valid at allocation");
        // SAFETY: the block is live and ours (the caller's contract), and `ptr - prefix` is
        // the base `inner` returned for this unguarded layout.
        unsafe {
            block::mark_freed(ptr);
            self.inner.dealloc(ptr.sub(block.prefix), block.outer);
        }
    }

    /// `realloc` of a counted-only block (header, no record, no guards) in place through
    /// the inner allocator's `realloc`, keeping the block's tag.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::realloc`], and `header` is `ptr`'s header, counted only.
    #[inline]
    unsafe fn realloc_counted(&self, ptr: *mut u8, layout: Layout, new_layout: Layout, header: Header) -> *mut u8 {
        let t = self.tracker;
        let tag = TagId(header.tag());
        let (old_size, new_size) = (layout.size(), new_layout.size());
        // The block changes size: the difference is counted, not a new block beside the
        // old one. A growth is checked against the budget (and claimed) first; the count
        // and the peaks wait for the inner `realloc`, so a refused one shows nowhere.
        // A growth of a slow tag may call its budget callback: no unwinding out of here.
        let Ok(claimed) = no_unwind(|| t.claim_resize(tag, old_size, new_size)) else {
            return ptr::null_mut(); // refused by the budget; the old block stays
        };
        let undo = || t.resize_refused(tag, old_size, new_size, claimed);
        let (Some(old_block), Some(new_block)) =
            (block::block_layout(layout, false), block::block_layout(new_layout, false))
        else {
            undo();
            return ptr::null_mut();
        };
        debug_assert_eq!(old_block.prefix, new_block.prefix, "same alignment, same prefix");
        // SAFETY: `ptr - prefix` is the base `inner` returned for `old_block.outer` (same
        // layout, unguarded), the block is live, and the new size is non-zero and valid
        // (`block_layout` checked it).
        let base = unsafe { self.inner.realloc(ptr.sub(old_block.prefix), old_block.outer, new_block.outer.size()) };
        if base.is_null() {
            undo();
            return base;
        }
        let watched = t.resized(tag, old_size, new_size, claimed);
        // SAFETY: `base` is a live block of `new_block.outer`.
        let user = unsafe { block::init(base, new_block, new_size, Header::new(tag.0, H_COUNTED)) };
        t.placed_without_record(user as usize);
        if watched {
            no_unwind(|| t.watch_event("realloc", tag, new_size, Some(user as usize), None));
        }
        user
    }

    /// The general free path: records, guards, diagnostics, bad frees.
    ///
    /// # Safety
    ///
    /// As for [`GlobalAlloc::dealloc`].
    #[cold]
    #[inline(never)]
    unsafe fn dealloc_slow(&self, ptr: *mut u8, layout: Layout) {
        let t = self.tracker;
        let addr = ptr as usize;
        let config = t.config();
        let mut record = None;
        if config.diagnostics() {
            // Look the pointer up before touching its memory.
            record = t.take_record(addr, true);
            if record.is_none() && t.decisive_double_free(addr, config) {
                return; // leak rather than free twice
            }
        }
        // SAFETY: the caller guarantees `ptr` came from this allocator (so it has a header)
        // and is live; a block freed before is caught above in diagnostic mode.
        let header = unsafe { block::read_header(ptr) };
        if !header.is_valid() {
            if header.was_freed() {
                let _ = t.double_free_by_header(addr);
            } else {
                let _ = t.untracked_free(addr);
            }
            return; // leak: we cannot know the block's real layout
        }
        let flags = header.flags();
        if flags & H_RECORD != 0 {
            if record.is_none() {
                record = t.take_record(addr, false);
                if record.is_none() {
                    let _ = t.double_free_by_header(addr);
                    return;
                }
            }
        } else if flags & H_COUNTED != 0 {
            t.uncount(TagId(header.tag()), layout.size(), addr);
        }
        let guarded = flags & H_GUARDED != 0;
        if guarded {
            // SAFETY: the header says the block is guarded, it is live, and `layout` is the
            // one it was allocated with (the caller's contract), so its size is the user size.
            let bad = unsafe { block::damaged_bytes(ptr, layout.size(), header) };
            if bad != 0 {
                let site = record.map(|r| r.site).unwrap_or_else(Location::caller);
                let _ = t.overrun(addr, layout.size(), bad, site);
            }
        }
        let block = block::block_layout(layout, guarded).expect("layout was valid at allocation");
        // SAFETY: the block is live and ours to free: we hold the only claim to it (its
        // record, if any, was removed above), and `ptr - prefix` is the base `inner`
        // returned for `block.outer` (same layout and guard flag as at allocation).
        unsafe {
            block::mark_freed(ptr);
            self.inner.dealloc(ptr.sub(block.prefix), block.outer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::track::{Mode, Tag};

    static T_COUNT: Tracker = Tracker::new();
    static T_REC: Tracker = Tracker::with_mode(Mode::Records);
    static T_DIAG: Tracker = Tracker::with_mode(Mode::Records);

    fn roundtrip(t: &'static Tracker, tag: &Tag) {
        let a = TrackingAllocator::with_tracker(System, t);
        let _g = tag.enter();
        for align in [1usize, 8, 32, 256] {
            let l = Layout::from_size_align(24, align).unwrap();
            // SAFETY: non-zero layouts, each freed once with its layout.
            unsafe {
                let p = a.alloc(l);
                assert!(!p.is_null());
                assert_eq!(p as usize % align, 0);
                p.write_bytes(7, 24);
                assert_eq!(t.tag_stats(tag).bytes, 24);
                let q = a.realloc(p, l, 100);
                assert_eq!(q.read(), 7);
                assert_eq!(t.tag_stats(tag).bytes, 100);
                a.dealloc(q, Layout::from_size_align(100, align).unwrap());
                let z = a.alloc_zeroed(l);
                assert_eq!(z.add(23).read(), 0);
                a.dealloc(z, l);
            }
        }
        assert_eq!(t.tag_stats(tag).bytes, 0);
        assert_eq!(t.tag_stats(tag).count, 0);
    }

    #[test]
    fn counting_roundtrip() {
        static TAG: Tag = Tag::new("global-unit-counting");
        roundtrip(&T_COUNT, &TAG);
    }

    #[test]
    fn a_budget_on_one_tag_leaves_the_others_counted_and_is_enforced_on_its_own() {
        static T: Tracker = Tracker::new();
        static FREE: Tag = Tag::new("global-unit-unbudgeted");
        static TIGHT: Tag = Tag::new("global-unit-budgeted");
        let a = TrackingAllocator::with_tracker(System, &T);
        T.set_budget(&TIGHT, 100);
        T.set_budget_policy(&TIGHT, crate::track::BudgetPolicy::Error);
        assert!(T.config().slow_tags());
        roundtrip(&T, &FREE);
        let l = Layout::new::<[u8; 64]>();
        // SAFETY: non-zero layouts; every non-null block is freed once with its layout.
        unsafe {
            let _g = TIGHT.enter();
            let p = a.alloc(l);
            assert!(!p.is_null());
            assert!(a.alloc(l).is_null(), "the second 64 B block exceeds the 100 B budget");
            assert_eq!(T.tag_stats(&TIGHT).bytes, 64);
            a.dealloc(p, l);
        }
        assert_eq!(T.tag_stats(&TIGHT).bytes, 0);
        T.clear_budget(&TIGHT);
        assert!(!T.config().slow_tags(), "no slow tag left");
        T.watch(&FREE, true);
        T.watch(&TIGHT, true);
        T.watch(&FREE, false);
        assert!(T.config().slow_tags(), "one watched tag is left");
        T.watch(&TIGHT, false);
        assert!(!T.config().slow_tags());
        roundtrip(&T, &TIGHT);
    }

    /// The counting path caches the tag in scope per thread: a budget set after that, on
    /// that tag or on one entered later, must still be enforced, and a budgeted tag's frees
    /// must reach the shared counters, not the thread's slot.
    #[test]
    fn budgets_set_after_the_counting_path_cached_the_tags_are_enforced() {
        use crate::track::BudgetPolicy;
        static T: Tracker = Tracker::new();
        static FIRST: Tag = Tag::new("global-unit-cached-then-budgeted");
        static LATER: Tag = Tag::new("global-unit-budgeted-then-entered");
        static PLAIN: Tag = Tag::new("global-unit-unbudgeted-meanwhile");
        let a = TrackingAllocator::with_tracker(System, &T);
        let l = Layout::new::<[u8; 64]>();
        // SAFETY: non-zero layouts; every non-null block is freed once with its layout.
        unsafe {
            let _first = FIRST.enter();
            a.dealloc(a.alloc(l), l);
            T.set_budget(&FIRST, 100);
            T.set_budget_policy(&FIRST, BudgetPolicy::Error);
            let p = a.alloc(l);
            assert!(!p.is_null());
            assert!(a.alloc(l).is_null(), "a budget set on the cached tag applies at once");
            a.dealloc(p, l);
            let (bytes, count, _) = T.threads.pending(FIRST.id().index());
            assert_eq!((bytes, count), (0, 0), "frees of a slow tag are shared");
            T.set_budget(&LATER, 100);
            T.set_budget_policy(&LATER, BudgetPolicy::Error);
            {
                // Cached while some tag is slow, under a tag that is not.
                let _plain = PLAIN.enter();
                a.dealloc(a.alloc(l), l);
                let _later = LATER.enter();
                let q = a.alloc(l);
                assert!(!q.is_null());
                assert!(a.alloc(l).is_null(), "entering a budgeted tag leaves the cached path");
                a.dealloc(q, l);
            }
            let (bytes, count, _) = T.threads.pending(LATER.id().index());
            assert_eq!((bytes, count), (0, 0));
        }
        for tag in [&FIRST, &LATER, &PLAIN] {
            let s = T.tag_stats(tag);
            assert_eq!((s.bytes, s.count), (0, 0), "{s:?}");
        }
    }

    /// A change of mode or of the diagnostics flag reaches a thread whose counting path
    /// cached the configuration before: the next allocation gets a record, then guards.
    #[test]
    fn mode_changes_reach_a_thread_that_cached_the_counting_path() {
        static T: Tracker = Tracker::new();
        static TAG: Tag = Tag::new("global-unit-cached-then-switched");
        let a = TrackingAllocator::with_tracker(System, &T);
        let l = Layout::new::<[u8; 16]>();
        let _g = TAG.enter();
        // SAFETY: non-zero layouts; each block is freed once with its layout; the overrun
        // writes one byte into the block's back guard, which diagnostics put there.
        unsafe {
            a.dealloc(a.alloc(l), l);
            T.set_mode(Mode::Records);
            let p = a.alloc(l);
            assert_eq!(T.live_records(), 1);
            a.dealloc(p, l);
            T.set_mode(Mode::Counting);
            a.dealloc(a.alloc(l), l);
            assert_eq!(T.live_records(), 0);
            T.set_diagnostics(true);
            let q = a.alloc(l);
            q.add(16).write(0);
            a.dealloc(q, l);
            assert_eq!(T.error_counts().buffer_overruns, 1);
        }
        let s = T.tag_stats(&TAG);
        assert_eq!((s.bytes, s.count, s.total_count), (0, 0, 4), "{s:?}");
    }

    /// One thread alternating between two trackers counts each block in its own tracker.
    #[test]
    fn two_trackers_on_one_thread_count_apart() {
        static ONE: Tracker = Tracker::new();
        static TWO: Tracker = Tracker::new();
        static TAG: Tag = Tag::new("global-unit-two-trackers");
        let (a, b) = (TrackingAllocator::with_tracker(System, &ONE), TrackingAllocator::with_tracker(System, &TWO));
        let _g = TAG.enter();
        let (small, large) = (Layout::new::<[u8; 8]>(), Layout::new::<[u8; 800]>());
        // SAFETY: non-zero layouts; each block is freed once, by its allocator, with its layout.
        unsafe {
            let blocks: Vec<_> = (0..10).map(|_| (a.alloc(small), b.alloc(large))).collect();
            assert_eq!((ONE.tag_stats(&TAG).bytes, TWO.tag_stats(&TAG).bytes), (80, 8000));
            for (p, q) in blocks {
                a.dealloc(p, small);
                b.dealloc(q, large);
            }
        }
        for t in [&ONE, &TWO] {
            let s = t.tag_stats(&TAG);
            assert_eq!((s.bytes, s.count, s.total_count), (0, 0, 10), "{s:?}");
        }
    }

    /// A pointer whose header is not one of ours is reported and left alone by the counting
    /// path as by the others.
    #[test]
    fn a_foreign_pointer_is_reported_not_freed() {
        static T: Tracker = Tracker::new();
        static TAG: Tag = Tag::new("global-unit-foreign");
        let a = TrackingAllocator::with_tracker(System, &T);
        let l = Layout::new::<u64>();
        let _g = TAG.enter();
        // SAFETY: non-zero layouts; `a`'s block is freed once with its layout; the foreign
        // block is two words from `System`, freed there, and `a` only reads its first word
        // (the header slot before the pointer it is given) and then leaks it.
        unsafe {
            a.dealloc(a.alloc(l), l);
            let foreign = System.alloc(Layout::new::<[u64; 2]>()).cast::<u64>();
            foreign.write(0x1234_5678_9abc_def0);
            a.dealloc(foreign.add(1).cast(), l);
            assert_eq!(T.error_counts().untracked_frees, 1);
            System.dealloc(foreign.cast(), Layout::new::<[u64; 2]>());
        }
        let s = T.tag_stats(&TAG);
        assert_eq!((s.bytes, s.count), (0, 0), "{s:?}");
    }

    #[test]
    fn records_roundtrip() {
        static TAG: Tag = Tag::new("global-unit-records");
        roundtrip(&T_REC, &TAG);
        assert_eq!(T_REC.live_records(), 0);
    }

    #[test]
    fn records_freed_on_another_thread_or_after_a_mode_switch() {
        static T_SWITCH: Tracker = Tracker::with_mode(Mode::Records);
        static TAG: Tag = Tag::new("global-unit-records-elsewhere");
        let a = TrackingAllocator::with_tracker(System, &T_SWITCH);
        let l = Layout::new::<[u64; 8]>();
        let _g = TAG.enter();
        // SAFETY: non-zero layouts; each block is freed once, with its layout.
        let (p, q) = unsafe { (a.alloc(l) as usize, a.alloc_zeroed(l) as usize) };
        assert_eq!((T_SWITCH.live_records(), T_SWITCH.tag_stats(&TAG).count), (2, 2));
        std::thread::scope(|s| {
            // SAFETY: `p` is live, from `a`, with `l`; freed once, here.
            s.spawn(|| unsafe { a.dealloc(p as *mut u8, l) });
        });
        assert_eq!(T_SWITCH.live_records(), 1);
        T_SWITCH.set_mode(Mode::Counting);
        // SAFETY: as above, for `q`.
        unsafe { a.dealloc(q as *mut u8, l) };
        assert_eq!(T_SWITCH.live_records(), 0, "the header sends the free to the record");
        assert_eq!((T_SWITCH.tag_stats(&TAG).bytes, T_SWITCH.tag_stats(&TAG).count), (0, 0));
        assert_eq!(T_SWITCH.error_counts(), Default::default());
    }

    #[test]
    fn sampled_mode_records_by_size() {
        use crate::track::Sampling;
        static T_SAMPLED: Tracker = Tracker::with_mode(Mode::Sampled(Sampling::new(0, 256, 4096, 4)));
        static TAG: Tag = Tag::new("global-unit-sampled");
        let a = TrackingAllocator::with_tracker(System, &T_SAMPLED);
        let _g = TAG.enter();
        let mut blocks = Vec::new();
        for size in [64usize, 300, 5000] {
            let l = Layout::from_size_align(size, 8).unwrap();
            for _ in 0..8 {
                // SAFETY: a non-zero layout; freed below with it.
                blocks.push((unsafe { a.alloc(l) }, l));
            }
        }
        // None of the 64-B blocks, 2 in 8 of the 300-B ones, all 5000-B ones.
        assert_eq!(T_SAMPLED.live_records(), 2 + 8);
        assert_eq!(T_SAMPLED.tag_stats(&TAG).count, 24);
        for (p, l) in blocks {
            // SAFETY: each block is live, from `a`, with `l`, freed once.
            unsafe { a.dealloc(p, l) };
        }
        assert_eq!(T_SAMPLED.live_records(), 0);
        assert_eq!((T_SAMPLED.tag_stats(&TAG).bytes, T_SAMPLED.tag_stats(&TAG).count), (0, 0));
    }

    #[test]
    fn diagnostics_roundtrip_and_overrun() {
        static TAG: Tag = Tag::new("global-unit-diag");
        T_DIAG.set_diagnostics(true);
        roundtrip(&T_DIAG, &TAG);
        let a = TrackingAllocator::with_tracker(System, &T_DIAG);
        let l = Layout::new::<[u8; 8]>();
        // SAFETY: an 8-byte block, overrun by one byte into its guard on purpose, then
        // freed once; the second free is caught before the memory is touched.
        unsafe {
            let p = a.alloc(l);
            p.add(8).write(0);
            a.dealloc(p, l);
            assert_eq!(T_DIAG.error_counts().buffer_overruns, 1);
            a.dealloc(p, l);
            assert_eq!(T_DIAG.error_counts().double_frees, 1);
        }
    }
}
