//! The record table (one record per live allocation) and the ring of recently freed records.

use std::panic::Location;

use super::table::{SpinLock, SysMap, SysVec};
use super::tag::TagId;

/// What the tracker knows about one live allocation. 32 bytes on 64-bit targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    /// The size the user asked for (guards and headers excluded).
    pub(crate) size: usize,
    pub(crate) tag: TagId,
    /// `FLAG_*` bits.
    pub(crate) flags: u32,
    /// Where it was allocated (or tracked).
    pub(crate) site: &'static Location<'static>,
    /// An id in the tracker's `StackStore`, or `NO_STACK`.
    pub(crate) stack: u32,
}

/// Guard bytes surround the block.
pub(crate) const FLAG_GUARDED: u32 = 1;
/// Memory the tracker did not allocate (`Tracker::track`).
pub(crate) const FLAG_EXTERNAL: u32 = 2;
/// An overrun of this block was already reported.
pub(crate) const FLAG_OVERRUN_REPORTED: u32 = 4;
/// Allocated by `Tracker::alloc` (so `Tracker::dealloc` may free it).
pub(crate) const FLAG_TRACKER_ALLOC: u32 = 8;
/// Allocated by a `TrackingAllocator`.
pub(crate) const FLAG_GLOBAL_ALLOC: u32 = 16;
/// Bits 8..16 hold log2 of the alignment (for `Tracker::alloc` blocks).
pub(crate) const ALIGN_SHIFT: u32 = 8;

impl Record {
    pub(crate) fn align(&self) -> usize {
        1usize << ((self.flags >> ALIGN_SHIFT) & 0xff)
    }
}

/// Shards of the record table. A power of two.
const SHARDS: usize = if cfg!(miri) { 4 } else { 64 };

#[repr(align(64))]
#[derive(Debug)]
struct Shard(SpinLock<SysMap<Record>>);

/// Live records keyed by address, in `SHARDS` independently locked open-addressing maps.
///
/// The records of the newest allocation of each thread may be pending in the thread's slot
/// instead (see `pending.rs`); the tracker's lookups and reports go through
/// `Tracker::take_record` and `Tracker::for_each_record`, which see both
/// (`Tracker::take_own_record` takes from the table alone: the records of the tracker's own
/// blocks never go pending; a miss looks at the pending records only to tell the error).
#[derive(Debug)]
pub(crate) struct RecordTable {
    shards: [Shard; SHARDS],
}

/// The shard of `addr`'s record.
#[inline]
pub(crate) fn shard_of(addr: usize) -> usize {
    ((addr >> 4) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> (usize::BITS - SHARDS.trailing_zeros())
        & (SHARDS - 1)
}

impl RecordTable {
    pub(crate) const fn new() -> Self {
        Self { shards: [const { Shard(SpinLock::new(SysMap::new())) }; SHARDS] }
    }

    /// Runs `f` on the map of `addr`'s shard, its lock held. `f` must not allocate through
    /// the global allocator.
    #[inline]
    pub(crate) fn with_shard<R>(&self, addr: usize, f: impl FnOnce(&mut SysMap<Record>) -> R) -> R {
        f(&mut self.shards[shard_of(addr)].0.lock())
    }

    /// Inserts a record; returns the record it replaced. `Err` if `System` is out of memory.
    #[inline]
    pub(crate) fn insert(&self, addr: usize, record: Record) -> Result<Option<Record>, Record> {
        self.with_shard(addr, |map| map.insert(addr, record))
    }

    /// Runs `f` on each shard's index and map, one shard locked at a time. `f` must not
    /// allocate through the global allocator.
    pub(crate) fn for_each_shard(&self, mut f: impl FnMut(usize, &mut SysMap<Record>)) {
        for (i, shard) in self.shards.iter().enumerate() {
            f(i, &mut shard.0.lock());
        }
    }

    /// Calls `f` on every record of the table (pending records excluded), one shard locked
    /// at a time. `f` must not allocate through the global allocator.
    pub(crate) fn for_each(&self, mut f: impl FnMut(usize, &mut Record)) {
        self.for_each_shard(|_, map| map.for_each(&mut f));
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().heap_bytes()).sum()
    }
}

/// A freed record kept for double-free diagnosis.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Freed {
    pub(crate) addr: usize,
    pub(crate) record: Record,
    /// Stack of the (first) free, or `NO_STACK`.
    pub(crate) free_stack: u32,
    /// The tracker's configuration epoch when the block was freed. The entry proves a
    /// double free only while the epoch is unchanged (see `Tracker::decisive_double_free`).
    pub(crate) epoch: u64,
}

/// How many freed records are kept.
pub(crate) const FREED_RING: usize = if cfg!(miri) { 16 } else { 4096 };

/// A bounded ring of recently freed records. Invariant: `buf.len() <= FREED_RING`, and once
/// full, `next` is the oldest entry (the next to be overwritten).
#[derive(Debug)]
pub(crate) struct FreedRing {
    inner: SpinLock<(SysVec<Freed>, usize)>,
}

impl FreedRing {
    pub(crate) const fn new() -> Self {
        Self { inner: SpinLock::new((SysVec::new(), 0)) }
    }

    pub(crate) fn push(&self, freed: Freed) {
        let mut g = self.inner.lock();
        let (buf, next) = &mut *g;
        if buf.len() < FREED_RING {
            buf.push(freed);
        } else {
            buf.as_mut_slice()[*next] = freed;
            *next = (*next + 1) % FREED_RING;
        }
    }

    /// The most recent freed record of `addr`.
    pub(crate) fn find(&self, addr: usize) -> Option<Freed> {
        let g = self.inner.lock();
        let (buf, next) = &*g;
        let s = buf.as_slice();
        // Newest first: indices next-1, next-2, ... wrapping.
        (0..s.len()).map(|k| (next + s.len() - 1 - k) % s.len()).map(|i| s[i]).find(|f| f.addr == addr)
    }

    /// Forgets every entry of `addr` (a block without a record was placed there).
    ///
    /// Entries are overwritten with address 0, which no block has; the ring's order is kept.
    #[cold]
    pub(crate) fn forget(&self, addr: usize) {
        let mut g = self.inner.lock();
        for f in g.0.as_mut_slice() {
            if f.addr == addr {
                f.addr = 0;
            }
        }
    }

    /// Forgets every entry.
    pub(crate) fn clear(&self) {
        let mut g = self.inner.lock();
        g.0.clear();
        g.1 = 0;
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.inner.lock().0.heap_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(size: usize) -> Record {
        Record { size, tag: TagId(0), flags: 0, site: Location::caller(), stack: 0 }
    }

    #[test]
    fn insert_remove_collect() {
        let t = RecordTable::new();
        for i in 0..200usize {
            assert_eq!(t.insert(0x1000 + i * 16, rec(i)).unwrap(), None);
        }
        assert_eq!(t.with_shard(0x1000, |m| m.get_mut(0x1000).map(|r| r.size)), Some(0));
        assert_eq!(t.with_shard(0x1010, |m| m.remove(0x1010)).map(|r| r.size), Some(1));
        assert_eq!(t.with_shard(0x1010, |m| m.remove(0x1010)), None);
        let mut n = 0;
        t.for_each(|addr, r| {
            assert_eq!(addr, 0x1000 + r.size * 16);
            n += 1;
        });
        assert_eq!(n, 199);
        assert!(t.heap_bytes() > 0);
    }

    #[test]
    fn ring_keeps_the_newest() {
        let ring = FreedRing::new();
        for i in 0..FREED_RING + 10 {
            ring.push(Freed { addr: i, record: rec(i), free_stack: 0, epoch: 0 });
        }
        assert!(ring.find(3).is_none(), "overwritten");
        assert_eq!(ring.find(FREED_RING + 9).unwrap().record.size, FREED_RING + 9);
        ring.push(Freed { addr: 5000, record: rec(1), free_stack: 0, epoch: 0 });
        ring.push(Freed { addr: 5000, record: rec(2), free_stack: 0, epoch: 0 });
        assert_eq!(ring.find(5000).unwrap().record.size, 2);
        ring.forget(5000);
        assert!(ring.find(5000).is_none());
        assert_eq!(ring.find(FREED_RING + 9).unwrap().record.size, FREED_RING + 9, "others stay");
        ring.clear();
        assert!(ring.find(FREED_RING + 9).is_none());
    }
}
