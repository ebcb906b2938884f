//! The explicit API: [`Tracker::track`] / [`Tracker::untrack`] for memory the tracker did
//! not allocate, and [`Tracker::alloc`] / [`Tracker::dealloc`] for blocks it allocates from
//! [`System`]. Blocks are placed by [`Tracker::place`], as the global allocator's are.

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::Location;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use super::block::{self, Header, PlaceError, Placement, H_COUNTED, H_GUARDED, H_RECORD};
use super::budget::Charger;
use super::record::{Record, ALIGN_SHIFT, FLAG_EXTERNAL, FLAG_GUARDED, FLAG_OVERRUN_REPORTED, FLAG_TRACKER_ALLOC};
use super::scope::Reentry;
use super::stack_trace::{StackTrace, NO_STACK};
use super::table::SysMap;
use super::tag::TagId;
use super::tracker::Tracker;
use crate::Error;

/// The explicit tracking API.
impl Tracker {
    /// Tracks memory the tracker did not allocate (from an external library, say).
    ///
    /// Counts `size` bytes under `tag` and keeps a record of `ptr` (whatever the mode), so
    /// that [`Tracker::untrack`] can find it. Policies apply as for
    /// [`Tracker::try_charge`].
    ///
    /// Tracking an address again before [`Tracker::untrack`] replaces its record and
    /// counts the old one as freed.
    ///
    /// # Errors
    ///
    /// Nothing is tracked on error:
    /// - [`Error::BudgetExceeded`] under the [`BudgetPolicy::Error`](super::BudgetPolicy::Error) policy;
    /// - [`Error::AlreadyTracked`] if `ptr` is a block the tracker allocated and keeps a
    ///   record of ([`Tracker::alloc`], or a [`TrackingAllocator`](super::TrackingAllocator)
    ///   keeping records): its own free needs that record;
    /// - [`Error::OutOfMemory`] if the record table cannot grow.
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
        let addr = (ptr as usize).max(2);
        // Refused before anything is counted (no budget check, no policy run).
        if self.records.with_shard(addr, |map| self.own_record_locked(map, addr)) {
            return Err(Error::AlreadyTracked { addr });
        }
        // The bytes are claimed (the budget check) now, the allocation counted once the
        // record is in: a refusal below gives the bytes back and shows in no peak or total.
        self.claim_bytes(tag, size, Charger::Policy)?;
        let depth = self.mode().stack_depth();
        let stack = if depth == 0 {
            NO_STACK
        } else {
            let _reentry = Reentry::enter();
            self.stacks.intern(&StackTrace::capture(depth))
        };
        let record = Record { size, tag, flags: FLAG_EXTERNAL, site, stack };
        // Checked again with the insert, in one step under the shard's lock: a block the
        // tracker placed at `addr` since the first check keeps its own record.
        let inserted = self.records.with_shard(addr, |map| {
            if self.own_record_locked(map, addr) {
                return Err(Error::AlreadyTracked { addr });
            }
            let old = map
                .insert(addr, record)
                .map_err(|_| Error::OutOfMemory { requested: std::mem::size_of::<Record>(), available: 0 })?;
            // Counted before the lock goes, so an `untrack` never credits it first.
            self.commit_claim(tag, true);
            Ok(old)
        });
        match inserted {
            // A block tracked twice without `untrack`: count the old one as freed.
            Ok(Some(old)) => self.counters[old.tag.index()].sub(old.size),
            Ok(None) => {}
            Err(e) => {
                self.counters[tag.index()].sub_bytes(size);
                return Err(e);
            }
        }
        if self.counters[tag.index()].watch.load(Ordering::Relaxed) {
            self.watch_event("track", tag, size, Some(addr), Some(site));
        }
        Ok(())
    }

    /// Whether the tracker keeps a record of its own (not `track`ed memory) for `addr`: in
    /// `map`, the table's shard of `addr` whose lock the caller holds, or pending in any
    /// thread's slot (a block a `TrackingAllocator` recorded there; see
    /// [`Tracker::pending_anywhere`] for why the lock makes the look complete).
    fn own_record_locked(&self, map: &mut SysMap<Record>, addr: usize) -> bool {
        // External records never go pending: one pending is the tracker's own (and may sit
        // beside an external record of memory that was freed without `untrack`).
        map.get_mut(addr).is_some_and(|r| r.flags & FLAG_EXTERNAL == 0) || self.pending_anywhere(addr)
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
    /// Only memory tracked with [`Tracker::track`] is untracked: the record of a block the
    /// tracker allocated itself ([`Tracker::alloc`], or a
    /// [`TrackingAllocator`](super::TrackingAllocator) keeping records) stays, for its own
    /// free to find.
    ///
    /// # Errors
    ///
    /// [`Error::DoubleFree`] if `ptr` was untracked or freed recently (and not tracked
    /// again), [`Error::UntrackedFree`] if the tracker has no record of external memory at
    /// `ptr`. Both are also logged (`log::error!`) and counted in
    /// [`Tracker::error_counts`].
    pub fn try_untrack(&self, ptr: *const u8) -> Result<usize, Error> {
        let addr = (ptr as usize).max(2);
        match self.take_external_record(addr) {
            Ok(record) => Ok(record.size),
            // A block the tracker allocated: not `track`ed, and its own free needs the record.
            Err(true) => Err(self.untracked_free(addr)),
            Err(false) => Err(self.bad_free(addr)),
        }
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
    /// `System` fails, or if the size with the tracker's header (and guard bytes) would
    /// exceed `isize::MAX`.
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
        let config = self.config();
        let how = Placement {
            tag: Some(tag),
            guarded: config.diagnostics(),
            record: Some(config.mode().stack_depth()),
            record_flags: FLAG_TRACKER_ALLOC | (layout.align().trailing_zeros() << ALIGN_SHIFT),
            charger: Charger::Policy,
            record_required: true,
            site: Location::caller(),
        };
        // SAFETY: `System.alloc` is called with the outer layout, which has a non-zero size
        // (it includes the header), and returns a fresh block of it or null.
        let placed = unsafe { self.place(layout, how, |outer| System.alloc(outer)) };
        match placed {
            Ok(user) => {
                // `try_dealloc` reaches the block through this provenance, not the caller's
                // pointer (the record's `as usize` exposed it too; this says so).
                let _ = user.expose_provenance();
                // SAFETY: `user` is inside a non-null block.
                Ok(unsafe { NonNull::new_unchecked(user) })
            }
            Err(PlaceError::NoRecord { base, outer }) => {
                // No room for its record: `try_dealloc` could not free it, so give it back.
                // SAFETY: `base` came from `System.alloc(outer)` in `place`, and the block
                // was never handed out.
                unsafe { System.dealloc(base, outer) };
                Err(Error::OutOfMemory { requested: outer.size(), available: 0 })
            }
            // The header (and guards) would take the size past `isize::MAX`.
            Err(PlaceError::Layout) => Err(Error::OutOfMemory { requested: layout.size(), available: 0 }),
            Err(PlaceError::Budget(e)) => Err(e),
            Err(PlaceError::OutOfMemory(outer)) => Err(Error::OutOfMemory { requested: outer.size(), available: 0 }),
        }
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
        if addr < 2 {
            // No block of ours lives there (the record table reserves those keys).
            return Err(self.untracked_free(addr));
        }
        // Checked and removed in one step: another thread's `track` of the address could
        // otherwise swap in a record with another layout between the two.
        let record = match self.take_own_record(addr) {
            Ok(record) => record,
            // Tracked with `track`: not ours to free.
            Err(true) => return Err(self.untracked_free(addr)),
            // Freed already (perhaps on another thread just now), or never ours.
            Err(false) => return Err(self.bad_free(addr)),
        };
        let guarded = record.flags & FLAG_GUARDED != 0;
        let layout = Layout::from_size_align(record.size, record.align()).expect("layout was valid at allocation");
        let block = block::block_layout(layout, guarded).expect("layout was valid at allocation");
        // The block is reached through the provenance `place` exposed when it recorded the
        // address (`as usize`), never through `ptr`: this function is safe, so `ptr` may be
        // any pointer with this address (one made from the integer alone, with no
        // provenance, or one narrowed to part of the block).
        let user = std::ptr::with_exposed_provenance_mut::<u8>(addr);
        let mut result = Ok(());
        if guarded {
            let hflags = H_COUNTED | H_RECORD | H_GUARDED;
            // SAFETY: the record was live until we removed it, so the block is live, guarded
            // and of this size; only this thread could remove the record. `user` carries the
            // provenance of the whole `System` block, exposed when the record was made.
            let bad = unsafe { block::damaged_bytes(user, record.size, Header::new(record.tag.0, hflags)) };
            if bad != 0 && record.flags & FLAG_OVERRUN_REPORTED == 0 {
                result = Err(self.overrun(addr, record.size, bad, record.site));
            }
        }
        // SAFETY: the block was allocated by `System` with `block.outer` at
        // `user - block.prefix` (see `try_alloc`), with the provenance `user` carries, and its
        // record is gone, so it is freed once.
        unsafe { System.dealloc(user.sub(block.prefix), block.outer) };
        result
    }

    /// Frees a block from [`Tracker::alloc`]. Bad frees and overruns are logged and
    /// counted, not raised (this is typically called from `Drop`); see
    /// [`Tracker::try_dealloc`].
    pub fn dealloc(&self, ptr: NonNull<u8>) {
        let _ = self.try_dealloc(ptr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::track::ErrorCounts;

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

    /// A block whose record finds no room in the table is refused, and leaves the tag as
    /// it was: no bytes, no count, no total, no peak (the count and peaks once rose first).
    #[test]
    fn a_block_refused_for_want_of_a_record_is_not_counted() {
        use crate::track::table::test_hooks::REFUSE_GROWTH;
        let t = Tracker::new();
        let tag = t.tag_named("tracker-unit-no-record");
        let layout = Layout::from_size_align(100, 8).unwrap();
        let kept = t.alloc(layout, tag);
        let before = t.tag_stats(tag);
        REFUSE_GROWTH.with(|refuse| refuse.set(true));
        // The table grows every so often: allocate until an insert needs it.
        let mut placed = Vec::new();
        let refused = loop {
            match t.try_alloc(layout, tag) {
                Ok(p) => placed.push(p),
                Err(e) => break e,
            }
            assert!(placed.len() < 1 << 16, "the table never needed to grow");
        };
        REFUSE_GROWTH.with(|refuse| refuse.set(false));
        assert!(matches!(refused, Error::OutOfMemory { .. }), "{refused:?}");
        let n = placed.len();
        let after = t.tag_stats(tag);
        assert_eq!(after.bytes, before.bytes + n * 100);
        assert_eq!(after.count, before.count + n);
        assert_eq!(after.peak_bytes, after.bytes, "the refused block raised no peak");
        assert_eq!(after.peak_count, after.count);
        assert_eq!(after.total_count, before.total_count + n as u64);
        for p in placed.into_iter().chain([kept]) {
            t.try_dealloc(p).unwrap();
        }
        assert_eq!((t.tag_stats(tag).bytes, t.tag_stats(tag).count), (0, 0));
        assert_eq!(t.error_counts(), ErrorCounts::default());
    }
}
