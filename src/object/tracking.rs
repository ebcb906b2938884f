//! Reporting a store's bytes to a memory [`Tracker`], under the type's `#[mm(tag)]`.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::sync::{AtomicU64, Ordering};
use crate::track::{StackTrace, TagId, Tracker};
use crate::Error;

/// One store's link to a tracker.
///
/// Objects are charged their `size()` when created and credited their
/// `size()` when destroyed. An object whose heap use changed in between would
/// make the two differ, so credits are capped by what the store still has
/// charged, and shutdown credits the rest: the tag's count never goes below
/// zero and returns exactly to zero once the store is empty.
pub(crate) struct Tracking {
    tracker: &'static Tracker,
    tag: TagId,
    charged: AtomicU64,
    /// Creation stacks by local slot index, kept only in `Mode::Stacks`.
    stacks: Mutex<HashMap<u32, StackTrace>>,
}

impl Tracking {
    pub(crate) fn new(tracker: &'static Tracker, tag_name: &'static str) -> Self {
        Tracking { tracker, tag: tracker.tag_named(tag_name), charged: AtomicU64::new(0), stacks: Mutex::default() }
    }

    /// Charges a new object's bytes.
    ///
    /// `strict` (the `try_create` path) refuses anything over the tag's
    /// budget, whatever its policy; otherwise the tag's policy decides
    /// (log, callback, error or panic).
    pub(crate) fn charge(&self, bytes: usize, strict: bool) -> Result<(), Error> {
        if strict {
            if let Some(budget) = self.tracker.budget(self.tag) {
                let current = self.tracker.tag_stats(self.tag).bytes;
                if current.saturating_add(bytes) > budget {
                    return Err(Error::BudgetExceeded { tag: self.tag.name(), budget, current, requested: bytes });
                }
            }
        }
        self.tracker.try_charge(self.tag, bytes)?;
        self.charged.fetch_add(bytes as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Credits a destroyed object's bytes (capped by what is still charged).
    pub(crate) fn credit(&self, bytes: usize) {
        let mut charged = self.charged.load(Ordering::Relaxed);
        loop {
            let credit = (bytes as u64).min(charged);
            match self.charged.compare_exchange_weak(charged, charged - credit, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => {
                    if credit > 0 {
                        self.tracker.credit(self.tag, credit as usize);
                    }
                    return;
                }
                Err(actual) => charged = actual,
            }
        }
    }

    /// Credits everything still charged (the store is empty).
    pub(crate) fn credit_all(&self) {
        let charged = self.charged.swap(0, Ordering::Relaxed);
        if charged > 0 {
            self.tracker.credit(self.tag, charged as usize);
        }
        self.stacks.lock().clear();
    }

    /// Records the creation stack of the object in slot `local`, if the tracker keeps stacks.
    pub(crate) fn record_stack(&self, local: u32) {
        let depth = self.tracker.mode().stack_depth();
        if depth > 0 {
            self.stacks.lock().insert(local, StackTrace::capture(depth));
        }
    }

    pub(crate) fn forget_stack(&self, local: u32) {
        if self.tracker.mode().stack_depth() > 0 {
            self.stacks.lock().remove(&local);
        }
    }

    pub(crate) fn stack(&self, local: u32) -> Option<StackTrace> {
        self.stacks.lock().get(&local).copied()
    }
}

impl std::fmt::Debug for Tracking {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracking")
            .field("tag", &self.tag.name())
            .field("charged", &self.charged.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}
