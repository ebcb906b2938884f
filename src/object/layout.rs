//! Where a slot lives: a store's segments, the chunks they are cut into, and
//! the way back from a slot's address to its store.
//!
//! Segment `k` of a store holds `base << k` slots. It is one allocation,
//! aligned to [`Chunks::BYTES`] (4 MiB, or the next power of two that
//! holds one slot), and cut into chunks of that many bytes. Each chunk
//! begins with a prefix holding its [`ChunkHeader`] (the store's shared
//! part, the chunk's first local index, the manager id), and its slots
//! follow; the last chunk of a segment ends after its last slot. So the
//! address of any slot, rounded down to the chunk alignment, finds its
//! chunk's header: a [`Handle`](crate::Handle) needs nothing but the slot
//! pointer.
//!
//! Every strong read loads its chunk's header (the manager check), so the
//! headers must stay cached while the reads miss on the slots:
//!
//! - Chunks are large, so headers are few: 18 for a million 64-byte
//!   objects. Measured on strong reads over a million objects against an
//!   `Rc` deref (loaded machine, a few runs each): 1.4–1.6× with 64 KiB
//!   chunks, 1.75–1.85× with 256 KiB, 1.1–1.8× with 1 MiB, 1.0–1.45× with
//!   4 MiB, and 1.0–1.15× with no header load at all (an experiment).
//! - A header does not sit at its chunk's first byte but on one of
//!   [`COLORS`] cache lines of a 2 KiB prefix, chosen by the chunk's
//!   address. Were every header at a multiple of 4 MiB, all of them would
//!   fall in one set of the L1 cache (indexed by the address bits below 4 KiB).
//!
//! The price is address space, not memory: a small segment is allocated at
//! its own size, but aligned to 4 MiB, and the allocator may reserve (not
//! touch) up to 4 MiB more to align it.

use std::alloc::Layout;
use std::marker::PhantomData;
use std::ptr::{self, NonNull};

use allocator_api2::alloc::Allocator;

use crate::Error;

use super::shared::StoreShared;
use super::slot::{Slot, SlotHeader};
use super::store_alloc::StoreAlloc;
use super::MMObject;

/// Segments per store: enough for 2^24 slots from a base of one slot.
pub(crate) const MAX_SEGMENTS: usize = 26;

/// The least chunk size: one chunk header per 4 MiB of slots, so that a
/// strong read finds a cached header (see the module docs).
const MIN_CHUNK_BYTES: usize = 4 << 20;

/// The cache lines a chunk header may sit on (see the module docs).
const COLORS: usize = 32;
const LINE: usize = 64;

/// Splits a local slot index into (segment, offset): segment `k` holds `base << k` slots.
#[inline]
pub(crate) fn locate(local: u32, base_bits: u32) -> (usize, u32) {
    let shifted = u64::from(local) + (1u64 << base_bits);
    let segment = 63 - shifted.leading_zeros() - base_bits;
    let offset = shifted - (1u64 << (segment + base_bits));
    (segment as usize, offset as u32)
}

/// The slot count of segment `k`.
#[inline]
pub(crate) fn segment_len(segment: usize, base_bits: u32) -> u32 {
    1u32 << (segment as u32 + base_bits)
}

/// The local index of segment `k`'s first slot.
#[inline]
pub(crate) fn segment_first(segment: usize, base_bits: u32) -> u32 {
    segment_len(segment, base_bits) - (1u32 << base_bits)
}

/// The start of every chunk: what a slot pointer needs to know about its store.
///
/// # Invariants
///
/// Written once, before the chunk's segment is published, and never again:
/// `shared` is the store's shared part (which outlives every handle),
/// `first_local` the local index of the chunk's first slot, and `manager_id`
/// the store's manager (a copy of `shared.manager_id`, one load closer),
/// `cyclable` a copy of `shared.cyclable` (read by every handle drop), and
/// `owner_thread` the manager's owner thread's token, or 0 (read by every
/// handle clone and drop, see `owner_counts.rs`).
#[repr(C)]
pub(crate) struct ChunkHeader {
    pub(crate) shared: NonNull<StoreShared>,
    pub(crate) owner_thread: u64,
    pub(crate) first_local: u32,
    pub(crate) manager_id: u32,
    pub(crate) cyclable: bool,
}

/// The chunk geometry of `T`'s slots: all compile-time constants, so
/// dividing by the slot count is a multiply and masking a slot's address
/// finds its chunk.
///
/// Never built: only its associated items are used. The marker names `T`
/// without owning one, so it asks nothing of `T`.
pub(crate) struct Chunks<T>(PhantomData<fn(T) -> T>);

impl<T> Chunks<T> {
    const SLOT: usize = std::mem::size_of::<Slot<T>>();

    /// The prefix before the first slot: room for the header on any of its
    /// cache lines, padded so the first slot is aligned.
    const PREFIX: usize = {
        assert!(std::mem::size_of::<ChunkHeader>() <= LINE);
        (COLORS * LINE).next_multiple_of(std::mem::align_of::<Slot<T>>())
    };

    /// A chunk's size and alignment: a power of two that holds the header
    /// and at least one slot.
    pub(crate) const BYTES: usize = {
        let one = (Self::PREFIX + Self::SLOT).next_power_of_two();
        if one > MIN_CHUNK_BYTES {
            one
        } else {
            MIN_CHUNK_BYTES
        }
    };

    /// Slots in a full chunk.
    pub(crate) const SLOTS: u32 = {
        let slots = (Self::BYTES - Self::PREFIX) / Self::SLOT;
        assert!(slots >= 1 && slots <= u32::MAX as usize);
        slots as u32
    };

    /// The memory of a segment of `len` slots: whole chunks, then a last
    /// chunk that ends after its last slot. `None` if it does not fit in `isize`.
    pub(crate) fn segment_layout(len: u32) -> Option<Layout> {
        debug_assert!(len > 0);
        let full = ((len - 1) / Self::SLOTS) as usize;
        let last = (len - full as u32 * Self::SLOTS) as usize;
        let size = full.checked_mul(Self::BYTES)?.checked_add(Self::PREFIX + last * Self::SLOT)?;
        Layout::from_size_align(size, Self::BYTES).ok()
    }

    /// Segment bytes per slot, for reports: the header and the value
    /// (chunk headers and the last chunk's padding are not counted).
    pub(crate) fn slot_bytes() -> usize {
        Self::SLOT
    }

    /// Bytes a segment of `len` slots takes.
    pub(crate) fn segment_bytes(len: u32) -> usize {
        Self::segment_layout(len).map_or(usize::MAX, |layout| layout.size())
    }

    /// Slot `offset` of the segment at `base`.
    ///
    /// # Safety
    ///
    /// `base` is a segment from [`allocate_segment`] whose length is above `offset`.
    #[inline]
    pub(crate) unsafe fn slot(base: NonNull<u8>, offset: u32) -> NonNull<Slot<T>> {
        // Slot `offset` sits `offset` slots past the first, plus one gap (the
        // unused tail of a chunk and the next one's prefix) per chunk before
        // it: two multiplies and a shift, no division (the weak-read path).
        let chunk = Self::chunk_of(offset);
        let bytes = Self::PREFIX + offset as usize * Self::SLOT + chunk * Self::GAP;
        // SAFETY: inside the segment's allocation (caller), by its layout.
        unsafe { base.add(bytes).cast() }
    }

    /// The bytes between the last slot of a full chunk and the next chunk's first.
    const GAP: usize = Self::BYTES - Self::SLOTS as usize * Self::SLOT;

    /// The shift of [`chunk_of`](Self::chunk_of): 24 bits for the offset,
    /// plus the bits of `SLOTS`.
    const SHIFT: u32 = 24 + (32 - Self::SLOTS.leading_zeros());

    /// `2^SHIFT / SLOTS`, rounded up: see [`chunk_of`](Self::chunk_of).
    const RECIPROCAL: u64 = (1u64 << Self::SHIFT).div_ceil(Self::SLOTS as u64);

    /// `offset / SLOTS` for any segment offset (below 2^24), as a multiply
    /// and a shift. Exact: with `e = RECIPROCAL * SLOTS - 2^SHIFT < SLOTS`,
    /// the product overshoots `offset / SLOTS` by
    /// `offset * e / (SLOTS * 2^SHIFT) < 2^24 / 2^SHIFT = 2^-bits(SLOTS) < 1 / SLOTS`,
    /// never enough to reach the next integer. The product stays below 2^49.
    #[inline]
    fn chunk_of(offset: u32) -> usize {
        debug_assert!(offset < 1 << 24);
        ((u64::from(offset) * Self::RECIPROCAL) >> Self::SHIFT) as usize
    }

    /// The run of slots from `offset` to the end of its chunk (or to `end`,
    /// if sooner): its first slot and its length.
    ///
    /// # Safety
    ///
    /// As for [`slot`](Self::slot), with `offset < end <= ` the segment's length.
    #[inline]
    pub(crate) unsafe fn run(base: NonNull<u8>, offset: u32, end: u32) -> (NonNull<Slot<T>>, u32) {
        debug_assert!(offset < end);
        let chunk_end = (Self::chunk_of(offset) as u32 + 1) * Self::SLOTS;
        // SAFETY: the caller's contract.
        (unsafe { Self::slot(base, offset) }, chunk_end.min(end) - offset)
    }

    /// Slot `offset` and how many slots lie contiguously up to it from the
    /// start of its chunk (itself included).
    ///
    /// # Safety
    ///
    /// As for [`slot`](Self::slot).
    #[inline]
    pub(crate) unsafe fn run_back(base: NonNull<u8>, offset: u32) -> (NonNull<Slot<T>>, u32) {
        let chunk_start = Self::chunk_of(offset) as u32 * Self::SLOTS;
        // SAFETY: the caller's contract.
        (unsafe { Self::slot(base, offset) }, offset - chunk_start + 1)
    }

    /// Where the header of the chunk at `chunk` (an address) sits in its prefix.
    #[inline]
    fn header_offset(chunk: usize) -> usize {
        (chunk / Self::BYTES % COLORS) * LINE
    }

    /// The header of the chunk that holds `slot`.
    ///
    /// # Safety
    ///
    /// `slot` points to a slot of a published segment, and the segment is
    /// still allocated for the returned lifetime.
    #[inline]
    pub(crate) unsafe fn header<'a>(slot: NonNull<Slot<T>>) -> &'a ChunkHeader {
        let header = slot.as_ptr().cast::<u8>().map_addr(|addr| {
            let chunk = addr & !(Self::BYTES - 1);
            chunk + Self::header_offset(chunk)
        });
        // SAFETY: segments are aligned to `BYTES` and cut into chunks of
        // `BYTES` bytes, each with an initialised header at `header_offset`
        // of its prefix (see the module docs); `map_addr` keeps the slot's
        // provenance, which covers the whole segment.
        unsafe { &*header.cast::<ChunkHeader>() }
    }

    /// The local index of `slot`.
    ///
    /// # Safety
    ///
    /// As for [`header`](Self::header).
    #[inline]
    pub(crate) unsafe fn local(slot: NonNull<Slot<T>>) -> u32 {
        let addr = slot.as_ptr().addr();
        let in_chunk = (addr & (Self::BYTES - 1)) - Self::PREFIX;
        // SAFETY: the caller's contract.
        let first = unsafe { Self::header(slot) }.first_local;
        first + (in_chunk / Self::SLOT) as u32
    }
}

/// A segment's memory: its slots, in chunks.
pub(crate) struct Segment<T> {
    pub(crate) base: NonNull<u8>,
    /// Which slots `base` holds (invariant, as every slot type here).
    _type: PhantomData<fn(T) -> T>,
}

/// What every chunk header of a new segment says.
pub(crate) struct SegmentOwner {
    pub(crate) shared: NonNull<StoreShared>,
    pub(crate) manager_id: u32,
    /// The manager's owner thread, or 0.
    pub(crate) owner_thread: u64,
    /// The local index of the segment's first slot.
    pub(crate) first_local: u32,
}

/// Allocates a segment of `len` slots from `alloc`, with its chunk headers
/// written and its slots not: the store writes a slot's vacant header with
/// [`init_vacant`] just before it first hands the slot out, so a level load
/// writes each new slot's lines once, while they are in cache, instead of
/// once here for the whole segment and again in `create`.
///
/// A refusal (by the allocator, or a layout too large for the address space)
/// is an [`Error::StoreOutOfMemory`], never an abort; nothing stays allocated.
pub(crate) fn allocate_segment<T: MMObject>(
    alloc: &StoreAlloc,
    len: u32,
    owner: &SegmentOwner,
) -> Result<Segment<T>, Error> {
    let refused = |part| Error::StoreOutOfMemory {
        type_name: T::TYPE_NAME,
        part,
        bytes: Chunks::<T>::segment_bytes(len),
        allocator: alloc.name(),
    };
    let layout = Chunks::<T>::segment_layout(len).ok_or_else(|| refused("a new segment"))?;
    let base = alloc.allocate(layout).map_err(|_| refused("a new segment"))?.cast::<u8>();
    // Handles keep 48 bits of a slot's address (`Handle`'s and `WeakHandle`'s layouts).
    // User-space addresses lie below 2^47 on x86-64 and below 2^48 on
    // AArch64 unless a program asks for more, so this refusal stays theoretical.
    #[cfg(target_pointer_width = "64")]
    if base.as_ptr().addr() + layout.size() > 1 << super::handle::ADDRESS_BITS {
        // SAFETY: just allocated from `alloc` with `layout`, and never used.
        unsafe { alloc.deallocate(base, layout) };
        return Err(refused("a new segment (it came back above 2^48, past what handles can address)"));
    }
    for chunk in 0..len.div_ceil(Chunks::<T>::SLOTS) {
        let header = ChunkHeader {
            shared: owner.shared,
            first_local: owner.first_local + chunk * Chunks::<T>::SLOTS,
            manager_id: owner.manager_id,
            owner_thread: owner.owner_thread,
            // SAFETY: the store's shared part is valid while it makes segments.
            cyclable: unsafe { owner.shared.as_ref() }.cyclable,
        };
        // SAFETY: every chunk of the layout starts with a prefix of `COLORS`
        // lines, so the header's line lies inside the allocation; lines are
        // aligned for a header (chunks are `BYTES`-aligned).
        unsafe {
            let start = base.add(chunk as usize * Chunks::<T>::BYTES);
            let offset = Chunks::<T>::header_offset(start.as_ptr().addr());
            start.add(offset).cast::<ChunkHeader>().write(header);
        }
    }
    Ok(Segment { base, _type: PhantomData })
}

/// Writes vacant headers at `first_generation` into slots `from..to` of the
/// segment at `base`, whose slots there were never written.
///
/// # Safety
///
/// `base` is a segment from [`allocate_segment`] whose length is at least
/// `to`, and no other thread reads or writes slots `from..to` until the
/// caller publishes them.
pub(crate) unsafe fn init_vacant<T>(base: NonNull<u8>, from: u32, to: u32, first_generation: u32) {
    let mut offset = from;
    while offset < to {
        // SAFETY: `offset < to <=` the segment's length (caller).
        let (run, run_len) = unsafe { Chunks::<T>::run(base, offset, to) };
        for i in 0..run_len as usize {
            // SAFETY: the run's slots are contiguous, inside the allocation,
            // and only this thread touches them (caller). Only the header is
            // written of the slot: the value is a `MaybeUninit`, and building
            // a whole `Slot<T>` on the stack would cost a `T`-sized frame.
            unsafe {
                let slot = run.as_ptr().add(i);
                ptr::addr_of_mut!((*slot).header).write(SlotHeader::vacant(first_generation));
                // Loom's cell keeps state of its own (std's is plain memory).
                #[cfg(loom)]
                Slot::<T>::value_ptr(slot).write(Slot::<T>::empty_value());
            }
        }
        offset += run_len;
    }
}

/// Drops and frees a segment made by [`allocate_segment`], whose first
/// `initialized` slots had their headers written by [`init_vacant`].
///
/// # Safety
///
/// `base` must be a segment from `allocate_segment::<T>(alloc, len, ..)`,
/// `initialized <= len`, no slot value may be initialised any more, and
/// nothing may use the segment afterwards.
pub(crate) unsafe fn free_segment<T>(alloc: &StoreAlloc, base: NonNull<u8>, len: u32, initialized: u32) {
    debug_assert!(initialized <= len);
    let layout = Chunks::<T>::segment_layout(len).expect("the layout was valid when the segment was allocated");
    // SAFETY: the caller guarantees the segment holds `len` slots from
    // `alloc` with these layouts that nothing else uses, of which the first
    // `initialized` were written; a slot's drop glue only drops its header
    // (the value is a `MaybeUninit`, destroyed earlier by the manager), and
    // the chunk headers need no drop.
    unsafe {
        for offset in 0..initialized {
            ptr::drop_in_place(Chunks::<T>::slot(base, offset).as_ptr());
        }
        alloc.deallocate(base, layout);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_walks_doubling_segments() {
        for base_bits in [0, 3, 6] {
            let mut local = 0u32;
            for segment in 0..8 {
                assert_eq!(segment_first(segment, base_bits), local);
                for offset in 0..segment_len(segment, base_bits) {
                    assert_eq!(locate(local, base_bits), (segment, offset));
                    local += 1;
                }
            }
        }
        assert_eq!(locate((1 << 24) - 1, 0).0, 24);
    }

    #[cfg(target_pointer_width = "64")]
    #[test]
    fn chunk_geometry() {
        type Big = [u8; 5_000_000];
        assert_eq!(Chunks::<[u64; 8]>::BYTES, 4 << 20);
        assert_eq!(Chunks::<[u64; 8]>::SLOTS, ((4 << 20) - 2048) / 80);
        assert_eq!(Chunks::<Big>::BYTES, 8 << 20);
        assert_eq!(Chunks::<Big>::SLOTS, 1);
        #[repr(align(4096))]
        struct Page(#[allow(dead_code)] u8);
        assert_eq!(Chunks::<Page>::PREFIX, 4096);
        assert_eq!(Chunks::<Page>::SLOTS, ((4 << 20) - 4096) / 8192);
        let layout = Chunks::<[u64; 8]>::segment_layout(Chunks::<[u64; 8]>::SLOTS + 1).unwrap();
        assert_eq!(layout.size(), (4 << 20) + 2048 + 80);
        assert_eq!(layout.align(), 4 << 20);
    }

    #[test]
    fn chunk_of_divides_exactly() {
        fn check<T>() {
            let slots = Chunks::<T>::SLOTS;
            let step = if cfg!(miri) { 99_991 } else { 997 };
            for offset in (0..1u32 << 24).step_by(step).chain([slots - 1, slots, 2 * slots - 1, (1 << 24) - 1]) {
                assert_eq!(Chunks::<T>::chunk_of(offset), (offset / slots) as usize, "offset {offset}");
            }
        }
        check::<u8>();
        check::<[u64; 8]>();
        check::<[u8; 100]>();
        check::<[u8; 5_000_000]>();
    }

    #[test]
    fn headers_spread_over_cache_lines() {
        let bytes = Chunks::<u64>::BYTES;
        let offsets: std::collections::HashSet<usize> =
            (0..COLORS * 2).map(|chunk| Chunks::<u64>::header_offset(chunk * bytes)).collect();
        assert_eq!(offsets.len(), COLORS);
        assert!(offsets.iter().all(|&offset| offset % LINE == 0 && offset + LINE <= Chunks::<u64>::PREFIX));
    }

    #[test]
    fn runs_stop_at_chunk_ends() {
        type T = [u64; 8];
        let slots = Chunks::<T>::SLOTS;
        let layout = Chunks::<T>::segment_layout(slots + 5).unwrap();
        // SAFETY: the layout has a non-zero size.
        let base = NonNull::new(unsafe { std::alloc::alloc(layout) }).unwrap();
        let header = Chunks::<T>::PREFIX;
        let slot = Chunks::<T>::SLOT;
        // SAFETY: the segment has `slots + 5` slots.
        let (first, len) = unsafe { Chunks::<T>::run(base, 3, slots + 5) };
        assert_eq!((first.as_ptr().addr() - base.as_ptr().addr(), len), (header + 3 * slot, slots - 3));
        // SAFETY: as above.
        let (second, len) = unsafe { Chunks::<T>::run(base, slots, slots + 5) };
        assert_eq!((second.as_ptr().addr() - base.as_ptr().addr(), len), (Chunks::<T>::BYTES + header, 5));
        // Backwards runs start at their chunk's first slot.
        // SAFETY: as above.
        let (back, len) = unsafe { Chunks::<T>::run_back(base, slots + 2) };
        // SAFETY: as above.
        let expected = unsafe { Chunks::<T>::slot(base, slots + 2) };
        assert_eq!((back, len), (expected, 3));
        // SAFETY: as above.
        let (back, len) = unsafe { Chunks::<T>::run_back(base, slots - 1) };
        assert_eq!((back.as_ptr().addr() - base.as_ptr().addr(), len), (header + (slots as usize - 1) * slot, slots));
        // SAFETY: allocated just above with this layout.
        unsafe { std::alloc::dealloc(base.as_ptr(), layout) };
    }
}
