//! Diagnostic mode: guard bytes, the ring of freed records, and how bad frees and
//! overruns are told apart and reported.
//!
//! The ring is trusted only within one configuration epoch (see `Config`): a block placed
//! without a record while records are kept forgets its address in the ring, and every
//! switch of mode or diagnostics starts a new epoch, so a legitimate free is never taken for
//! a double free. A free the ring cannot decide is checked through the block's header, as
//! outside diagnostic mode.

use std::panic::Location;
use std::sync::atomic::Ordering;

use super::block::{self, Header, H_COUNTED, H_GUARDED, H_RECORD};
use super::mode::{Config, EPOCH_MAX};
use super::record::{Freed, Record, FLAG_GUARDED, FLAG_OVERRUN_REPORTED};
use super::scope::Reentry;
use super::stack_trace::{StackTrace, NO_STACK};
use super::tracker::Tracker;
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

/// Diagnostics: guard checks, the freed ring, bad-free and overrun reports.
impl Tracker {
    /// Whether diagnostic mode is on.
    pub fn diagnostics(&self) -> bool {
        self.config().diagnostics()
    }

    /// Turns diagnostic mode on or off.
    ///
    /// In diagnostic mode, blocks the tracker allocates get guard bytes (checked on free and
    /// by [`Tracker::check_guards`] / [`Tracker::snapshot`]), frees capture a stack, and
    /// the allocator's freed records are kept in a bounded ring so a double free can show
    /// where the first free happened. It implies at least [`Mode::Records`](super::Mode::Records) for blocks the
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

    /// Pushes `addr`'s record into the freed ring, with the current epoch (read with
    /// `Acquire`: see [`Tracker::placed_without_record`]).
    pub(super) fn remember_freed(&self, addr: usize, record: Record) {
        let config = self.config_acquire();
        let free_stack = if config.diagnostics() {
            let _reentry = Reentry::enter();
            self.stacks.intern(&StackTrace::capture(config.mode().stack_depth().max(8)))
        } else {
            NO_STACK
        };
        self.freed.push(Freed { addr, record, free_stack, epoch: config.epoch() });
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
    ///
    /// The allocator's counting path calls this only when the tracker's fast key changed
    /// while it allocated: an unchanged key means no entry it must forget. A trusted entry
    /// was pushed in a diagnostic epoch, read with `Acquire` (`remember_freed`) after the
    /// change that began it took the key away (`Tracker::change_config`), and before the
    /// block went back to the inner allocator, so an allocation that got the block sees
    /// the key gone, or a newer one, published after that epoch had ended.
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

    /// Bad frees and overruns seen so far.
    pub fn error_counts(&self) -> ErrorCounts {
        ErrorCounts {
            untracked_frees: self.untracked_frees.load(Ordering::Relaxed),
            double_frees: self.double_frees.load(Ordering::Relaxed),
            buffer_overruns: self.buffer_overruns.load(Ordering::Relaxed),
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
                    Header::new(r.tag.0, hflags),
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
    use crate::track::TagId;
    use std::alloc::Layout;

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
