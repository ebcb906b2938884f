//! Budgets: per-tag byte limits, what happens when a tag goes over one, and the one budget
//! check that every charge (explicit API, object manager, global allocator) goes through.

use std::fmt;
use std::sync::atomic::Ordering;

use super::scope::Reentry;
use super::stats::NO_BUDGET;
use super::tag::{TagId, MAX_TAGS};
use super::tracker::Tracker;
use crate::Error;

/// What the tracker does when an allocation would take a tag over its budget.
///
/// Set per tag with [`Tracker::set_budget_policy`](super::Tracker::set_budget_policy), or
/// for all tags without their own policy with
/// [`Tracker::set_default_budget_policy`](super::Tracker::set_default_budget_policy).
///
/// # Examples
///
/// ```
/// use mmobject::track::{BudgetPolicy, Tag, Tracker};
/// use mmobject::Error;
///
/// static MESHES: Tag = Tag::new("Meshes");
/// let tracker = Tracker::new();
/// tracker.set_budget(&MESHES, 1024);
/// tracker.set_budget_policy(&MESHES, BudgetPolicy::Error);
/// assert!(matches!(
///     tracker.try_charge(MESHES.id(), 2048),
///     Err(Error::BudgetExceeded { tag: "Meshes", budget: 1024, current: 0, requested: 2048 })
/// ));
/// ```
#[derive(Clone, Copy)]
pub enum BudgetPolicy {
    /// `log::warn!` once when the tag goes over, and again after it came back under. The
    /// allocation goes ahead. The default.
    Log,
    /// Call the function for every allocation that goes over; the allocation goes ahead.
    ///
    /// The callback runs inside the allocator when the tracker is the global allocator:
    /// its own allocations are not tracked, and it must not call back into the tracker's
    /// allocation API. A panic in it cannot unwind out of the allocator there: the process
    /// aborts.
    Callback(fn(&BudgetOverrun)),
    /// Refuse the allocation: `try_` calls return [`Error::BudgetExceeded`] and count
    /// nothing; plain calls panic with that message; under
    /// [`TrackingAllocator`](super::TrackingAllocator) the allocation returns null (so
    /// `Vec::try_reserve` reports an error and other allocations abort through
    /// `handle_alloc_error`).
    Error,
    /// Panic with the [`Error::BudgetExceeded`] message (opt-in). Under
    /// [`TrackingAllocator`](super::TrackingAllocator), where unwinding out of the
    /// allocator is not allowed, the error is logged and the process aborts.
    Panic,
}

impl PartialEq for BudgetPolicy {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (BudgetPolicy::Callback(a), BudgetPolicy::Callback(b)) => std::ptr::fn_addr_eq(*a, *b),
            _ => std::mem::discriminant(self) == std::mem::discriminant(other),
        }
    }
}

impl Eq for BudgetPolicy {}

impl fmt::Debug for BudgetPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BudgetPolicy::Log => f.write_str("Log"),
            BudgetPolicy::Callback(_) => f.write_str("Callback(..)"),
            BudgetPolicy::Error => f.write_str("Error"),
            BudgetPolicy::Panic => f.write_str("Panic"),
        }
    }
}

/// An allocation that would take a tag over its budget, as passed to a
/// [`BudgetPolicy::Callback`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetOverrun {
    /// The tag.
    pub tag: TagId,
    /// The tag's name.
    pub name: &'static str,
    /// The budget in bytes.
    pub budget: usize,
    /// Bytes in use under the tag before the request.
    pub current: usize,
    /// Bytes requested.
    pub requested: usize,
}

impl BudgetOverrun {
    /// The matching [`Error::BudgetExceeded`].
    pub fn to_error(&self) -> Error {
        Error::BudgetExceeded { tag: self.name, budget: self.budget, current: self.current, requested: self.requested }
    }
}

impl fmt::Display for BudgetOverrun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_error(), f)
    }
}

/// Policies per tag plus the default. Copied out under the tracker's lock; never holds
/// anything that allocates.
#[derive(Debug)]
pub(crate) struct PolicyTable {
    pub(crate) default: BudgetPolicy,
    pub(crate) per_tag: [Option<BudgetPolicy>; MAX_TAGS],
}

impl PolicyTable {
    pub(crate) const fn new() -> Self {
        Self { default: BudgetPolicy::Log, per_tag: [None; MAX_TAGS] }
    }

    pub(crate) fn policy(&self, tag: TagId) -> BudgetPolicy {
        self.per_tag[tag.index()].unwrap_or(self.default)
    }
}

/// Who charges: decides what going over a budget does, beyond the tag's policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charger {
    /// The explicit API and the object manager's `create`: the tag's policy decides.
    Policy,
    /// The object manager's `try_create`: refused whenever it would go over, whatever the
    /// policy (nothing is counted then).
    Strict,
    /// A global allocator: the tag's policy, except that `Panic` aborts (an allocator must
    /// not unwind).
    Allocator,
    /// Bytes already in use (an object re-measured after it grew): always counted. `Log`
    /// and `Callback` run as usual, `Error` logs a warning instead, `Panic` panics.
    InUse,
    /// A global allocator's `realloc` growing a block: the growth alone, as `Allocator`
    /// decides (refused under `Error`, aborting under `Panic`), counting no allocation.
    Growth,
}

/// Budgets: setting them, and the one budget check every charge goes through.
impl Tracker {
    /// Sets a tag's budget in bytes. Going over applies the tag's [`BudgetPolicy`].
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tag, Tracker};
    ///
    /// static AUDIO: Tag = Tag::new("Audio");
    /// let tracker = Tracker::new();
    /// tracker.set_budget(&AUDIO, 1 << 20);
    /// assert_eq!(tracker.budget(&AUDIO), Some(1 << 20));
    /// tracker.clear_budget(&AUDIO);
    /// assert_eq!(tracker.budget(&AUDIO), None);
    /// ```
    pub fn set_budget(&self, tag: impl Into<TagId>, bytes: usize) {
        let tag = tag.into();
        let c = &self.counters[tag.index()];
        c.budget.store(bytes.min(NO_BUDGET - 1), Ordering::Relaxed);
        c.warned.store(false, Ordering::Relaxed);
        self.update_slow(tag);
    }

    /// Budgeted or watched tags take the exact (shared-counter) path in the allocator.
    /// The configuration's slow-tags bit says whether any tag is slow, so that while none
    /// is, the allocator's counting path skips the per-tag flag; it is recomputed from
    /// every tag's flag under one lock, so two updates cannot leave it stale. Every change
    /// also gives the tracker a new fast key, since the allocator's per-thread caches hold
    /// whether their current tag is slow.
    pub(super) fn update_slow(&self, tag: TagId) {
        let _serial = super::tracker::CONFIG_SERIAL.lock();
        let c = &self.counters[tag.index()];
        let slow = c.budget.load(Ordering::Relaxed) != NO_BUDGET || c.watch.load(Ordering::Relaxed);
        c.slow.store(slow, Ordering::Relaxed);
        let any = self.counters.iter().any(|c| c.slow.load(Ordering::Relaxed));
        self.set_slow_tags(any);
    }

    /// Removes a tag's budget.
    pub fn clear_budget(&self, tag: impl Into<TagId>) {
        let tag = tag.into();
        self.counters[tag.index()].budget.store(NO_BUDGET, Ordering::Relaxed);
        self.update_slow(tag);
    }

    /// A tag's budget, if set.
    pub fn budget(&self, tag: impl Into<TagId>) -> Option<usize> {
        let b = self.counters[tag.into().index()].budget.load(Ordering::Relaxed);
        (b != NO_BUDGET).then_some(b)
    }

    /// Sets what happens when this tag goes over its budget.
    pub fn set_budget_policy(&self, tag: impl Into<TagId>, policy: BudgetPolicy) {
        self.policies.lock().per_tag[tag.into().index()] = Some(policy);
    }

    /// Sets the policy for tags without their own (initially [`BudgetPolicy::Log`]).
    pub fn set_default_budget_policy(&self, policy: BudgetPolicy) {
        self.policies.lock().default = policy;
    }

    /// The policy that applies to `tag`.
    pub fn budget_policy(&self, tag: impl Into<TagId>) -> BudgetPolicy {
        self.policies.lock().policy(tag.into())
    }

    /// Counts an allocation of `bytes` under `tag`, applying the tag's budget policy.
    ///
    /// This is the object manager's hook: it charges each object's size to its type's tag.
    /// Policies: `Error` → `Err` and nothing counted; `Log` → warning and `Ok`; `Callback`
    /// → call and `Ok`; `Panic` → panic.
    ///
    /// # Errors
    ///
    /// [`Error::BudgetExceeded`] if the allocation would take the tag over its budget and
    /// its policy is [`BudgetPolicy::Error`].
    ///
    /// # Panics
    ///
    /// If the tag goes over budget and its policy is [`BudgetPolicy::Panic`].
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tracker, BudgetPolicy};
    ///
    /// let tracker = Tracker::new();
    /// let tag = tracker.tag_named("Entities");
    /// tracker.set_budget(tag, 100);
    /// tracker.set_budget_policy(tag, BudgetPolicy::Error);
    /// assert!(tracker.try_charge(tag, 60).is_ok());
    /// assert!(tracker.try_charge(tag, 60).is_err());
    /// assert_eq!(tracker.tag_stats(tag).bytes, 60);
    /// tracker.credit(tag, 60);
    /// ```
    #[inline]
    pub fn try_charge(&self, tag: TagId, bytes: usize) -> Result<(), Error> {
        self.try_charge_as(tag, bytes, Charger::Policy)
    }

    /// Counts `bytes` under `tag` for `charger` (see [`Charger`]), logging it if the tag is
    /// watched.
    #[inline]
    pub(crate) fn try_charge_as(&self, tag: TagId, bytes: usize, charger: Charger) -> Result<(), Error> {
        self.charge_counters(tag, bytes, charger)?;
        if self.counters[tag.index()].watch.load(Ordering::Relaxed) {
            self.watch_event("charge", tag, bytes, None, None);
        }
        Ok(())
    }

    /// Counts an allocation of `bytes` under `tag`, like [`Tracker::try_charge`].
    ///
    /// # Panics
    ///
    /// With the [`Error::BudgetExceeded`] message if the tag goes over budget and its policy
    /// is [`BudgetPolicy::Error`] or [`BudgetPolicy::Panic`].
    pub fn charge(&self, tag: TagId, bytes: usize) {
        if let Err(e) = self.try_charge(tag, bytes) {
            panic!("{e}");
        }
    }

    /// Counts the free of `bytes` previously charged to `tag`.
    #[inline]
    pub fn credit(&self, tag: TagId, bytes: usize) {
        let c = &self.counters[tag.index()];
        c.sub(bytes);
        if c.watch.load(Ordering::Relaxed) {
            self.watch_event("credit", tag, bytes, None, None);
        }
    }

    /// Charges a new object's `bytes` for the object manager: `strict` (its `try_create`)
    /// refuses anything over the budget whatever the policy, else the policy decides.
    #[inline]
    pub(crate) fn charge_object(&self, tag: TagId, bytes: usize, strict: bool) -> Result<(), Error> {
        self.try_charge_as(tag, bytes, if strict { Charger::Strict } else { Charger::Policy })
    }

    /// Adds `bytes` already in use to `tag`'s byte count, without counting an allocation (an
    /// object that grew). Over the budget the policy runs, but nothing is refused.
    pub(crate) fn charge_in_use(&self, tag: TagId, bytes: usize) {
        let _ = self.charge_counters(tag, bytes, Charger::InUse);
        if self.counters[tag.index()].watch.load(Ordering::Relaxed) {
            self.watch_event("grow", tag, bytes, None, None);
        }
    }

    /// Takes `bytes` off `tag`'s byte count, without counting a free (an object that shrank).
    pub(crate) fn credit_bytes(&self, tag: TagId, bytes: usize) {
        let c = &self.counters[tag.index()];
        c.sub_bytes(bytes);
        if c.watch.load(Ordering::Relaxed) {
            self.watch_event("shrink", tag, bytes, None, None);
        }
    }

    /// The budget check and the charge, as one step: [`claim_bytes`](Self::claim_bytes),
    /// then [`commit_claim`](Self::commit_claim) (which counts the allocation unless the
    /// `charger` is `InUse` or `Growth`).
    #[inline]
    pub(crate) fn charge_counters(&self, tag: TagId, bytes: usize, charger: Charger) -> Result<(), Error> {
        self.claim_bytes(tag, bytes, charger)?;
        self.commit_claim(tag, !matches!(charger, Charger::InUse | Charger::Growth));
        Ok(())
    }

    /// The budget check and the claim of `bytes` on the tag's shared byte counter: the one
    /// place a budget is checked. Counts no allocation and raises no peak: a caller that
    /// has yet to allocate the bytes does that with [`commit_claim`](Self::commit_claim)
    /// once the block exists, or gives them back with `sub_bytes` if the allocation fails
    /// (an allocation that never happened shows in no peak and no total).
    ///
    /// Under the budget, the bytes are claimed with a compare-exchange, so two charges
    /// racing for the last bytes of a budget cannot both pass (the check and the add see
    /// the same value). Over it, the tag's policy (or the `charger`'s rule) decides, and
    /// unless it refuses, the bytes are claimed all the same.
    ///
    /// Bytes still pending in thread slots (counted before the budget was set, which made
    /// the tag take this path) are included in the current use.
    #[inline]
    pub(crate) fn claim_bytes(&self, tag: TagId, bytes: usize, charger: Charger) -> Result<(), Error> {
        let c = &self.counters[tag.index()];
        let budget = c.budget.load(Ordering::Relaxed);
        if budget == NO_BUDGET {
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
            return Ok(());
        }
        let (pending_bytes, _, _) = self.threads.pending(tag.index());
        let mut raw = c.bytes.load(Ordering::Relaxed);
        loop {
            let current = (raw as isize).wrapping_add(pending_bytes).max(0) as usize;
            if current.saturating_add(bytes) > budget {
                self.over_budget(tag, budget, current, bytes, charger)?;
                c.bytes.fetch_add(bytes, Ordering::Relaxed);
                return Ok(());
            }
            match c.bytes.compare_exchange_weak(raw, raw.wrapping_add(bytes), Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return Ok(()),
                Err(now) => raw = now,
            }
        }
    }

    /// Completes a [`claim_bytes`](Self::claim_bytes): counts one allocation if
    /// `one_more`, and raises the tag's peaks from the whole total.
    #[inline]
    pub(crate) fn commit_claim(&self, tag: TagId, one_more: bool) {
        let c = &self.counters[tag.index()];
        let bytes = c.bytes.load(Ordering::Relaxed);
        self.raise_peaks(tag, (bytes, c.counted(one_more)));
    }

    #[cold]
    #[inline(never)]
    fn over_budget(
        &self,
        tag: TagId,
        budget: usize,
        current: usize,
        requested: usize,
        charger: Charger,
    ) -> Result<(), Error> {
        let overrun = BudgetOverrun { tag, name: tag.name(), budget, current, requested };
        if charger == Charger::Strict {
            return Err(overrun.to_error());
        }
        let _reentry = Reentry::enter();
        let policy = self.policies.lock().policy(tag);
        match policy {
            BudgetPolicy::Log => {
                if !self.counters[tag.index()].warned.swap(true, Ordering::Relaxed) {
                    log::warn!("{overrun}");
                }
                Ok(())
            }
            BudgetPolicy::Callback(f) => {
                f(&overrun);
                Ok(())
            }
            BudgetPolicy::Error if charger == Charger::InUse => {
                if !self.counters[tag.index()].warned.swap(true, Ordering::Relaxed) {
                    log::warn!("{overrun} (memory already in use: counted)");
                }
                Ok(())
            }
            BudgetPolicy::Error => Err(overrun.to_error()),
            BudgetPolicy::Panic => {
                if matches!(charger, Charger::Allocator | Charger::Growth) {
                    log::error!("{overrun}; aborting (the global allocator cannot unwind)");
                    std::process::abort();
                }
                panic!("{}", overrun.to_error())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn per_tag_overrides_default() {
        let mut t = PolicyTable::new();
        assert_eq!(t.policy(TagId(3)), BudgetPolicy::Log);
        t.default = BudgetPolicy::Error;
        t.per_tag[3] = Some(BudgetPolicy::Panic);
        assert_eq!(t.policy(TagId(3)), BudgetPolicy::Panic);
        assert_eq!(t.policy(TagId(4)), BudgetPolicy::Error);
    }

    #[test]
    fn overrun_formats_as_error() {
        let o = BudgetOverrun { tag: TagId(0), name: "Untagged", budget: 10, current: 8, requested: 4 };
        assert_eq!(o.to_string(), "budget exceeded for tag 'Untagged': budget 10 bytes, 8 in use, 4 requested");
    }

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
}
