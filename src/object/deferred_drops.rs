//! Deferred drops: a manager built with
//! [`deferred_drops(true)`](super::ObjectManagerBuilder::deferred_drops)
//! counts a handle's drop later, in a batch, instead of at once.
//!
//! A drop usually decrements its object's count with one locked
//! read-modify-write on the object's own cache line. When a frame releases
//! objects at random among many, that line is cold, and a locked operation
//! that misses the cache holds back the loads after it: the misses of a
//! frame's releases do not overlap. Here the drop writes the slot into its
//! thread's ring of last drops instead (see `last_drops.rs`), touching
//! nothing of the object. The ring's drain applies the decrements in order,
//! prefetching each count a few entries ahead, so the misses overlap; a
//! decrement that reaches zero is a last drop there, and the slot goes onto
//! its store's dead list as any last drop does.
//!
//! **What it means.** A deferred drop is the handle dropped later: at the
//! next drain of its thread's ring. Rings are drained when they fill (every
//! 256 entries), when their thread exits, and by every call that reads a
//! dead list (`collect_garbage`, every round, so cascades still finish in
//! one call; `dead_count`; shutdown). Until then the count still holds the
//! dropped handle: [`Handle::ref_count`](super::Handle::ref_count) counts
//! it, and `upgrade` and weak reads still find the object alive.
//!
//! **Why it is sound.** A recorded drop keeps its count, so its object
//! stays alive and its slot and store stay allocated until the drain, as
//! for a handle that was not dropped yet. Everything after the decrement is
//! the last-drop path that exists without deferral. The `Release` store that
//! publishes the ring entry, the drainer's `Acquire` load of it and the
//! decrement's own `Release` carry the dropping thread's uses of the object
//! to whoever destroys it.
//!
//! Stores of types whose objects may hold handles keep counting at once
//! (their drops mark candidate roots for the cycle collector), and so does a
//! thread whose ring has no room while it drains it itself.

use std::sync::atomic::{AtomicU64, Ordering};

use super::handle::MAX_MANAGER_ID;

/// One bit per manager id: set while the manager with that id defers its
/// drops. Ids are never reused (see `next_manager_id`), so a bit is written
/// once, by its manager's builder, and stays: handles that outlive their
/// manager keep deferring, which is as sound as any deferred drop. (Under
/// loom ids wrap around, so each builder writes its id's bit either way.)
static DEFERRING: [AtomicU64; (MAX_MANAGER_ID as usize + 1) / 64] =
    [const { AtomicU64::new(0) }; (MAX_MANAGER_ID as usize + 1) / 64];

/// Says whether the manager with id `manager_id` defers its drops. Called
/// by its builder before it makes any store, so every handle of it, on any
/// thread, sees the bit: a handle reaches another thread only through a
/// synchronising hand-over that follows the store's creation.
pub(crate) fn set(manager_id: u32, on: bool) {
    let (word, bit) = (&DEFERRING[manager_id as usize / 64], 1u64 << (manager_id % 64));
    if on {
        word.fetch_or(bit, Ordering::Relaxed);
    } else if word.load(Ordering::Relaxed) & bit != 0 {
        word.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// True if the manager with id `manager_id` defers its drops.
#[inline]
pub(crate) fn defers(manager_id: u32) -> bool {
    DEFERRING[manager_id as usize / 64].load(Ordering::Relaxed) & 1 << (manager_id % 64) != 0
}

/// Asks the CPU to bring the line at `addr` into its cache, with the hint
/// that it will be written (`_MM_HINT_ET0`: `prefetchw` where the target
/// has it, `prefetcht0` on baseline x86-64): the drain's look-ahead (a
/// no-op on other targets, and under Miri and loom).
#[inline(always)]
pub(crate) fn prefetch_for_write(addr: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri), not(loom)))]
    // SAFETY: a prefetch is only a hint: it reads nothing and faults on no
    // address, valid or not.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_ET0 }>(addr.cast());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri), not(loom))))]
    let _ = addr;
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn marks_are_per_id() {
        // Ids this test owns: high ones, which the other unit tests' managers never reach.
        let (a, b) = (MAX_MANAGER_ID - 1, MAX_MANAGER_ID);
        assert!(!defers(a) && !defers(b));
        set(a, true);
        set(b, false);
        assert!(defers(a));
        assert!(!defers(b), "a neighbouring id is not marked");
        assert!(!defers(a - 64), "nor the same bit of another word");
        set(a, false);
        assert!(!defers(a));
    }
}
