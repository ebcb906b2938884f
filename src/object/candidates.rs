//! Candidate roots for cycle collection: the objects whose count fell and
//! stayed above zero (Bacon and Rajan, 2001: the "purple" objects).
//!
//! A garbage cycle is made by a decrement that leaves a count above zero:
//! the last outside handle goes, and the references from inside the cycle
//! remain. So a [`CycleCollector`](crate::CycleCollector) need only look at
//! the objects such decrements touched, never at every live object.
//!
//! Each store whose type may hold handles ([`MMObject::may_hold_handles`](crate::MMObject::may_hold_handles))
//! keeps a buffer of local slot indices. A drop that leaves references
//! behind queues its slot here once, and marks it with the
//! [`PURPLE`](super::slot::PURPLE) flag in the count word so the next drops
//! skip the queue (see `SlotHeader::release_marking`). The collector pops
//! entries and clears the flag; an entry whose flag is clear (taken by an
//! earlier entry, or an object that died since) is skipped.
//!
//! Nothing else clears the flag, so a store whose cycles are never collected
//! would queue one entry per object that ever lost a reference. Entries go
//! stale only when objects die, so a collection that finds dead objects in a
//! store *compacts* its buffer once it doubles past its last compacted
//! length: it keeps the purple slots, once each. The buffer stays
//! within twice the store's purple objects (and at least
//! [`Candidates::MIN_COMPACT`]), at an amortised constant cost per entry.

use allocator_api2::vec::Vec;

use super::store::ErasedStore;
use super::store_alloc::StoreAlloc;

/// A store's candidate buffer (in [`StoreShared`](super::shared::StoreShared), under its lock).
///
/// # Invariants
///
/// Every live slot whose count word has `PURPLE` set is in `queue`. (An
/// entry may also name a slot that is not purple: it is skipped.)
#[derive(Debug)]
pub(crate) struct Candidates {
    queue: Vec<u32, StoreAlloc>,
    /// The length at which `collect_garbage` next compacts `queue`.
    compact_at: usize,
    /// Set when a slot could not be queued (the store's allocator refused):
    /// its flag stayed clear, so the collector looks at every live object
    /// of the store once instead.
    lost: bool,
}

impl Candidates {
    /// The least length at which a buffer is compacted.
    pub(crate) const MIN_COMPACT: usize = 1024;

    pub(crate) fn new(alloc: StoreAlloc) -> Self {
        Candidates { queue: Vec::new_in(alloc), compact_at: Self::MIN_COMPACT, lost: false }
    }

    /// Queues `local`. Returns false, remembering the loss, if the store's
    /// allocator refuses the room.
    pub(crate) fn push(&mut self, local: u32) -> bool {
        if self.queue.try_reserve(1).is_err() {
            self.lost = true;
            return false;
        }
        self.queue.push(local);
        true
    }

    pub(crate) fn pop(&mut self) -> Option<u32> {
        self.queue.pop()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// True once if a slot was lost since the last call.
    pub(crate) fn take_lost(&mut self) -> bool {
        std::mem::take(&mut self.lost)
    }
}

/// Compacts `store`'s candidate buffer if it has grown past its mark.
///
/// Called by the store's collection (under `&mut ObjectManager`: no
/// collector runs meanwhile), before it destroys the dead.
pub(crate) fn compact(store: &dyn ErasedStore) {
    let mut candidates = store.shared().candidates.lock();
    if candidates.queue.len() < candidates.compact_at {
        return;
    }
    candidates.queue.retain(|&local| store.header(local).is_some_and(|header| header.is_purple()));
    candidates.queue.sort_unstable();
    candidates.queue.dedup();
    candidates.compact_at = (2 * candidates.queue.len()).max(Candidates::MIN_COMPACT);
}
