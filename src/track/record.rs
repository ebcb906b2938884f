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
#[derive(Debug)]
pub(crate) struct RecordTable {
    shards: [Shard; SHARDS],
}

#[inline]
fn shard_of(addr: usize) -> usize {
    ((addr >> 4) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) as usize >> (usize::BITS - SHARDS.trailing_zeros())
        & (SHARDS - 1)
}

impl RecordTable {
    pub(crate) const fn new() -> Self {
        Self { shards: [const { Shard(SpinLock::new(SysMap::new())) }; SHARDS] }
    }

    /// Inserts a record; returns the record it replaced. `Err` if `System` is out of memory.
    #[inline]
    pub(crate) fn insert(&self, addr: usize, record: Record) -> Result<Option<Record>, Record> {
        self.shards[shard_of(addr)].0.lock().insert(addr, record)
    }

    /// Removes the record of `addr`.
    #[inline]
    pub(crate) fn remove(&self, addr: usize) -> Option<Record> {
        self.shards[shard_of(addr)].0.lock().remove(addr)
    }

    /// A copy of the record of `addr`.
    pub(crate) fn get(&self, addr: usize) -> Option<Record> {
        self.shards[shard_of(addr)].0.lock().get_mut(addr).copied()
    }

    /// Calls `f` on every record, one shard locked at a time. `f` must not allocate through
    /// the global allocator (the shard's lock is held).
    pub(crate) fn for_each(&self, mut f: impl FnMut(usize, &mut Record)) {
        for shard in &self.shards {
            shard.0.lock().for_each(&mut f);
        }
    }

    /// The number of live records.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().len()).sum()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().heap_bytes()).sum()
    }

    /// Copies out all records (into a `Vec`, allocated without holding any lock).
    pub(crate) fn collect(&self) -> Vec<(usize, Record)> {
        let mut out = Vec::new();
        for shard in &self.shards {
            // Reserve outside the lock, then copy at most what fits.
            let n = shard.0.lock().len();
            out.reserve(n + 8);
            let room = out.capacity() - out.len();
            let mut taken = 0;
            shard.0.lock().for_each(|addr, r| {
                if taken < room {
                    // Cannot reallocate: `taken < room` keeps us within capacity.
                    out.push((addr, *r));
                    taken += 1;
                }
            });
        }
        out
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
        assert_eq!(t.len(), 200);
        assert_eq!(t.get(0x1000).map(|r| r.size), Some(0));
        assert_eq!(t.remove(0x1000 + 16).map(|r| r.size), Some(1));
        assert_eq!(t.remove(0x1000 + 16), None);
        let all = t.collect();
        assert_eq!(all.len(), 199);
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
