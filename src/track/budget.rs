//! Budgets: what happens when a tag goes over its byte budget.

use std::fmt;

use super::tag::{TagId, MAX_TAGS};
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
    /// allocation API.
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
