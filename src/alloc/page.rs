//! [`Page`]: up to 64 blocks of one size class, owned by one thread at a time. The owner
//! allocates and frees with plain (relaxed load + store) updates of a local free mask; any
//! other thread frees by setting a bit in an atomic remote mask, which the owner takes in
//! one swap. This is mimalloc's local / thread-free split (Leijen, Zorn and de Moura, 2019)
//! with bitmaps for lists: the allocator never writes into a block it does not own, so no
//! link can be corrupted and a double free is a bit that is already set.

use crate::sync::{AtomicU64, Ordering};

/// The owner of a page that no thread owns.
pub(crate) const UNOWNED: u64 = 0;

/// The state of up to 64 consecutive blocks of one size class, and where they are (fixed at
/// creation, so a free finds everything it needs in the page's one cache line).
///
/// Invariants:
/// 1. `owner` is [`UNOWNED`] or the token of the one thread that owns the page
///    (`thread_cache::token`). Only the owner stores to `free`, `allocations` and `taken`,
///    always as a
///    relaxed load followed by a relaxed store: no other thread stores to them, so no update
///    is lost. A thread takes an unowned page with an `Acquire` compare-exchange and gives it
///    up with a `Release` store of `UNOWNED`, so each owner sees the last owner's stores.
/// 2. Bit `i` of `free` is set when block `i` is free and the owner may hand it out; bit `i`
///    of `remote` is set when another thread freed block `i` and the owner has not collected
///    it yet (collecting moves it to `free` with an `Acquire` swap that pairs with the
///    freeing thread's `Release` `fetch_or`, so the block's last writes happen before it is
///    handed out again). A block is handed out exactly when both bits are clear.
/// 3. Bits at or above the page's block count are never set in `free` or `remote` (an
///    [`empty`](Self::empty) page has no blocks: its masks stay 0).
/// 4. `allocations` counts the blocks the owners took from `free`. Bit `i` of `taken` is set
///    once block `i` has been taken. The owner always takes the lowest free bit, so when it
///    takes block `i` every block below `i` is handed out or freed remotely and not yet
///    collected: the highest bit of `taken`, plus one, is exactly the most blocks that were
///    ever outside `free` at once (the page's peak, an upper bound of its blocks in use),
///    without a compare on each allocation.
#[repr(C, align(64))]
pub(crate) struct Page {
    owner: AtomicU64,
    free: AtomicU64,
    remote: AtomicU64,
    allocations: AtomicU64,
    taken: AtomicU64,
    /// `taken` before the last take, so [`untake`](Self::untake) can put it back (debug
    /// builds only: only their use-after-free check refuses a block just taken).
    #[cfg(debug_assertions)]
    taken_before: AtomicU64,
    /// Region offset of block 0.
    start: usize,
    /// Blocks are `1 << shift` bytes.
    shift: u8,
    /// The page's size class (its index in the pool).
    class: u8,
    /// Blocks in the page, 1 to 64.
    blocks: u8,
}

/// The mask of a page of `blocks` blocks (1 to 64).
#[inline]
pub(crate) fn full_mask(blocks: u32) -> u64 {
    debug_assert!((1..=64).contains(&blocks), "a page holds 1 to 64 blocks");
    u64::MAX >> (64 - blocks)
}

impl Page {
    /// An unowned page whose `blocks` blocks are all free, the first at region offset `start`,
    /// each `1 << shift` bytes, in class `class`.
    pub(crate) fn new(blocks: u32, start: usize, shift: u32, class: usize) -> Page {
        Page::unowned(blocks, start, shift, class, full_mask(blocks))
    }

    /// A page of no blocks, owned by nobody: it never has a block to take or free (see
    /// [`PageMap`](super::page_map::PageMap)).
    pub(crate) fn empty() -> Page {
        Page::unowned(0, 0, 0, 0, 0)
    }

    /// An unowned page with free mask `free` (the two constructors above).
    fn unowned(blocks: u32, start: usize, shift: u32, class: usize, free: u64) -> Page {
        Page {
            start,
            shift: shift as u8,
            class: u8::try_from(class).expect("at most 64 classes"),
            blocks: blocks as u8,
            owner: AtomicU64::new(UNOWNED),
            free: AtomicU64::new(free),
            remote: AtomicU64::new(0),
            allocations: AtomicU64::new(0),
            taken: AtomicU64::new(0),
            #[cfg(debug_assertions)]
            taken_before: AtomicU64::new(0),
        }
    }

    /// Region offset of block 0.
    #[inline(always)]
    pub(crate) fn start(&self) -> usize {
        self.start
    }

    /// Region offset of block `bit`.
    #[inline(always)]
    pub(crate) fn block_offset(&self, bit: u32) -> usize {
        self.start + ((bit as usize) << self.shift)
    }

    /// Blocks are `1 << shift()` bytes.
    #[inline(always)]
    pub(crate) fn shift(&self) -> u32 {
        u32::from(self.shift)
    }

    /// The page's size class.
    #[inline(always)]
    pub(crate) fn class(&self) -> usize {
        usize::from(self.class)
    }

    /// Blocks in the page.
    #[inline(always)]
    pub(crate) fn blocks(&self) -> u32 {
        u32::from(self.blocks)
    }

    /// The page's owner now (a hint for other threads; exact for the owner itself, since
    /// only it moves the owner away from its own token).
    #[inline]
    pub(crate) fn owner(&self) -> u64 {
        self.owner.load(Ordering::Relaxed)
    }

    /// Takes the page if nobody owns it.
    #[inline]
    pub(crate) fn try_acquire(&self, token: u64) -> bool {
        self.owner.compare_exchange(UNOWNED, token, Ordering::Acquire, Ordering::Relaxed).is_ok()
    }

    /// Gives the page up (owner only), publishing the owner's updates to the next owner.
    #[inline]
    pub(crate) fn release(&self) {
        self.owner.store(UNOWNED, Ordering::Release);
    }

    /// Whether any block may be free, locally or remotely (any thread; a hint).
    #[inline]
    pub(crate) fn may_have_free(&self) -> bool {
        (self.free.load(Ordering::Relaxed) | self.remote.load(Ordering::Relaxed)) != 0
    }

    /// Whether the owner has a block to hand out without collecting (owner only).
    #[inline]
    pub(crate) fn has_local_free(&self) -> bool {
        self.free.load(Ordering::Relaxed) != 0
    }

    /// Blocks the owner can hand out without collecting (owner only).
    #[inline]
    pub(crate) fn local_free_count(&self) -> u32 {
        self.free.load(Ordering::Relaxed).count_ones()
    }

    /// Whether every block of a page with this `full` mask is free locally (owner only,
    /// after a collect).
    #[inline]
    pub(crate) fn all_free(&self, full: u64) -> bool {
        self.free.load(Ordering::Relaxed) == full
    }

    /// [`take`](Self::take) when no block of the page is free twice (the common case), or
    /// `None` (nothing free, or a double free to report: call `take` then).
    #[inline(always)]
    pub(crate) fn take_clean(&self) -> Option<u32> {
        let mask = self.free.load(Ordering::Relaxed);
        if mask == 0 || self.remote.load(Ordering::Relaxed) & mask != 0 {
            return None;
        }
        Some(self.take_lowest(mask))
    }

    /// Takes the lowest block of `mask`, the page's free mask just loaded (not 0), and
    /// returns its bit index.
    #[inline(always)]
    fn take_lowest(&self, mask: u64) -> u32 {
        let rest = mask & (mask - 1);
        self.free.store(rest, Ordering::Relaxed);
        self.count_take(mask ^ rest);
        mask.trailing_zeros()
    }

    /// Counts the take of block `bit`, a mask of one bit (invariant 4).
    #[inline(always)]
    fn count_take(&self, bit: u64) {
        self.allocations.store(self.allocations.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let taken = self.taken.load(Ordering::Relaxed);
        #[cfg(debug_assertions)]
        self.taken_before.store(taken, Ordering::Relaxed);
        self.taken.store(taken | bit, Ordering::Relaxed);
    }

    /// Takes the lowest free block (owner only) and returns its bit index, with the mask of
    /// blocks found free twice (usually 0): free here and also freed remotely, a double free
    /// whose two frees raced on two threads. Those remote bits are dropped, so each such
    /// block is free once.
    #[inline]
    pub(crate) fn take(&self) -> Option<(u32, u64)> {
        let mask = self.free.load(Ordering::Relaxed);
        if mask == 0 {
            return None;
        }
        let doubles = self.remote.load(Ordering::Relaxed) & mask;
        if doubles != 0 {
            self.drop_remote(doubles);
        }
        Some((self.take_lowest(mask), doubles))
    }

    #[cold]
    #[inline(never)]
    fn drop_remote(&self, bits: u64) {
        self.remote.fetch_and(!bits, Ordering::Relaxed);
    }

    /// Puts back the block just taken and takes back its count and its mark in `taken`
    /// (owner only): for a block that failed its use-after-free check (debug builds only)
    /// and was refilled, which was never handed out. A block never taken before (its fill
    /// overwritten by a write past the block below) must not raise the page's peak.
    #[inline]
    pub(crate) fn untake(&self, bit: u32) {
        let mask = self.free.load(Ordering::Relaxed);
        self.free.store(mask | 1 << bit, Ordering::Relaxed);
        self.allocations.store(self.allocations.load(Ordering::Relaxed) - 1, Ordering::Relaxed);
        #[cfg(debug_assertions)]
        self.taken.store(self.taken_before.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Frees block `bit` on the owner's thread. `fill` runs after the double-free check and
    /// before the block becomes free. `Err` if it is free already (locally or remotely).
    #[inline]
    pub(crate) fn free_local(&self, bit: u32, fill: impl FnOnce()) -> Result<(), ()> {
        let mask = self.free.load(Ordering::Relaxed);
        if (mask | self.remote.load(Ordering::Relaxed)) & 1 << bit != 0 {
            return Err(());
        }
        fill();
        self.free.store(mask | 1 << bit, Ordering::Relaxed);
        Ok(())
    }

    /// Frees block `bit` from a thread that does not own the page. Touches no block memory.
    /// `Err` if the block is free already: seen in the owner's mask (a relaxed load is enough:
    /// the caller's ownership of the block happens after the owner cleared the bit, so a set
    /// bit means a later free), or already in the remote mask (atomically).
    #[inline]
    pub(crate) fn free_remote(&self, bit: u32) -> Result<(), ()> {
        if self.free.load(Ordering::Relaxed) & 1 << bit != 0 {
            return Err(());
        }
        let before = self.remote.fetch_or(1 << bit, Ordering::Release);
        if before & 1 << bit != 0 {
            return Err(());
        }
        Ok(())
    }

    /// Whether [`steal_remote`](Self::steal_remote) would find a block now (any thread; a
    /// hint).
    #[inline]
    pub(crate) fn has_stealable(&self) -> bool {
        self.remote.load(Ordering::Relaxed) & !self.free.load(Ordering::Relaxed) != 0
    }

    /// Claims one block from the remote mask (any thread, owner or not): the last resort of
    /// a thread that finds no page of its own. The block goes from "freed remotely" straight
    /// to "handed out" (both bits clear) without the owner's involvement; the `Acquire`
    /// pairs with the freeing thread's `Release`. Its debug fill was never written (remote
    /// frees touch no block memory), so it is handed out unchecked.
    pub(crate) fn steal_remote(&self) -> Option<u32> {
        let mut remote = self.remote.load(Ordering::Relaxed);
        loop {
            // A block also free in the owner's mask was freed twice (two frees raced):
            // left for the owner's collection, which reports it and keeps it free once.
            let claimable = remote & !self.free.load(Ordering::Relaxed);
            if claimable == 0 {
                return None;
            }
            let bit = claimable.trailing_zeros();
            match self.remote.compare_exchange_weak(remote, remote & !(1 << bit), Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(bit),
                Err(now) => remote = now,
            }
        }
    }

    /// Moves the remote frees into the local mask (owner only). `on_freed` runs for each
    /// newly free block before it can be handed out; the returned mask holds blocks that were
    /// free on both sides: a double free whose two frees raced on two threads, which only
    /// this collection can see.
    #[inline]
    pub(crate) fn collect(&self, mut on_freed: impl FnMut(u32)) -> u64 {
        if self.remote.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        let remote = self.remote.swap(0, Ordering::Acquire);
        let mask = self.free.load(Ordering::Relaxed);
        let mut fresh = remote & !mask;
        while fresh != 0 {
            on_freed(fresh.trailing_zeros());
            fresh &= fresh - 1;
        }
        self.free.store(mask | remote, Ordering::Relaxed);
        remote & mask
    }

    /// Free blocks, local and remote (any thread; a snapshot).
    pub(crate) fn free_count(&self) -> u32 {
        (self.free.load(Ordering::Relaxed) | self.remote.load(Ordering::Relaxed)).count_ones()
    }

    /// Blocks handed out from this page over its life, and the most in use at once (an
    /// upper bound: a remote free counts as in use until collected).
    pub(crate) fn counts(&self) -> (u64, u32) {
        let taken = self.taken.load(Ordering::Relaxed);
        (self.allocations.load(Ordering::Relaxed), u64::BITS - taken.leading_zeros())
    }
}

impl std::fmt::Debug for Page {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Page")
            .field("owner", &self.owner())
            .field("free", &format_args!("{:#x}", self.free.load(Ordering::Relaxed)))
            .field("remote", &format_args!("{:#x}", self.remote.load(Ordering::Relaxed)))
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn owner_and_remote_frees() {
        let page = Page::new(3, 0, 3, 0);
        assert!(page.try_acquire(7));
        assert!(!page.try_acquire(8), "owned");
        assert_eq!(
            (page.take(), page.take(), page.take(), page.take()),
            (Some((0, 0)), Some((1, 0)), Some((2, 0)), None)
        );
        assert_eq!(page.free_local(1, || {}), Ok(()));
        assert_eq!(page.free_local(1, || {}), Err(()), "double free on the owner");
        assert_eq!(page.free_remote(1), Err(()), "double free seen in the owner's mask");
        assert_eq!(page.free_remote(2), Ok(()));
        assert_eq!(page.free_remote(2), Err(()), "double remote free");
        assert_eq!(page.free_local(2, || {}), Err(()), "remote then local");
        let mut seen = Vec::new();
        assert_eq!(page.collect(|b| seen.push(b)), 0);
        assert_eq!(seen, [2]);
        assert_eq!(page.free_count(), 2);
        assert_eq!(page.counts(), (3, 3));
        assert_eq!(page.take(), Some((1, 0)));
        assert_eq!(page.free_remote(1), Ok(()));
        assert_eq!(Page::new(2, 0, 3, 0).steal_remote(), None);
        assert_eq!(page.steal_remote(), Some(1), "claimed by any thread");
        assert_eq!(page.free_count(), 1);
        page.release();
        assert!(page.try_acquire(8));
    }

    #[test]
    fn racing_double_free_shows_at_collection() {
        let page = Page::new(64, 0, 3, 0);
        assert!(page.try_acquire(1));
        let (bit, _) = page.take().unwrap();
        // The remote free lands first, the owner's check ran before it (the race).
        page.free_remote(bit).unwrap();
        let mask = page.free.load(Ordering::Relaxed);
        page.free.store(mask | 1 << bit, Ordering::Relaxed);
        assert_eq!(page.collect(|_| {}), 1 << bit);
        assert_eq!(page.free_count(), 64);
        // The same race, seen when the block is about to be handed out again.
        let (bit, _) = page.take().unwrap();
        page.free_remote(bit).unwrap();
        let mask = page.free.load(Ordering::Relaxed);
        page.free.store(mask | 1 << bit, Ordering::Relaxed);
        assert_eq!(page.take(), Some((bit, 1 << bit)));
        assert_eq!(page.free_count(), 63, "free once, and now handed out");
    }
}
