//! The geometry of a [`SmallObjectAllocator`]'s classes: where each lies in the region,
//! and how a free goes from an address to its class, slot and lanes in one table load.

use std::ptr::NonNull;

use super::super::lane::Lanes;
use super::SmallObjectAllocator;

/// Each class starts on a multiple of this, so slot `i` of a class of size `s` is aligned to
/// the lowest set bit of `s` (8, 16, 32, 16, 64, 32, 128).
pub(super) const CLASS_ALIGN: usize = 128;

/// The most granules the region is cut into. Each class starts on a granule, so one record
/// per granule ([`GranuleClass`], a table of 2 KiB) names the class of an address with one
/// shift and one load.
pub(super) const GRANULES: usize = 64;

/// `log2` of a [`GranuleClass`]'s size, to index their table by byte offset.
pub(super) const RECORD_SHIFT: u32 = {
    let size = size_of::<GranuleClass>();
    assert!(size.is_power_of_two() && GRANULES.is_power_of_two());
    size.trailing_zeros()
};

/// A class index, `0..7`, as a type: the compiler then knows its range and indexes the
/// per-class arrays with it without a bounds check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(super) enum ClassIndex {
    I0,
    I1,
    I2,
    I3,
    I4,
    I5,
    I6,
}

impl ClassIndex {
    pub(super) const ALL: [ClassIndex; 7] = [
        ClassIndex::I0,
        ClassIndex::I1,
        ClassIndex::I2,
        ClassIndex::I3,
        ClassIndex::I4,
        ClassIndex::I5,
        ClassIndex::I6,
    ];

    #[inline(always)]
    pub(super) fn get(self) -> usize {
        self as usize
    }
}

/// One class: `slots` slots of `slot_size` bytes at `start..end` in the region. `start` is a
/// multiple of the granule, and the padding after `end` stops at the next class's `start`.
/// A line each, so the alloc finds a class's record with a shift, not a multiplication.
///
/// Invariant: in a class with slots, `first` is the region's own pointer (its provenance) at
/// offset `start`, so a slot's address is one load and one multiply-add away (dangling in a
/// class without slots, which hands none out).
#[repr(align(64))]
pub(super) struct SmallClass {
    pub(super) slot_size: usize,
    /// Slot 0 (see the invariant).
    pub(super) first: NonNull<u8>,
    /// The alignment every slot has.
    pub(super) align: usize,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) slots: u64,
}

// SAFETY: `first` is an address in the region the allocator owns, read only to derive slot
// pointers, as `Region`'s own pointer is (which is `Send` and `Sync` for the same reason).
unsafe impl Send for SmallClass {}
// SAFETY: as above: `&SmallClass` exposes the pointer's value, never the bytes behind it.
unsafe impl Sync for SmallClass {}

/// `(inverse, shift)` per class, to turn an offset into a class into a slot index and check it
/// in one step. A slot size is `odd << shift` with `odd` 1 or 3, and `inverse` is `odd`'s
/// inverse modulo `2^64`. Then `slot_of(rel) = (rel × inverse mod 2^64).rotate_right(shift)`,
/// for `rel` bytes into the class ([`GranuleClass::slot_of`]):
/// - if `rel = q × size`, then `rel × inverse ≡ q << shift`, which is exact (it is `rel / odd`)
///   and has its low `shift` bits clear, so the rotation gives `q`;
/// - multiplying by an odd number and rotating are both bijections of `u64`, and the multiples
///   `q × size` already map onto every `q` up to `u64::MAX / size`, so every other `rel` maps
///   above that, and so above any slot count (classes have fewer than `2^32` slots).
///
/// So `slot_of(rel) < slots` holds exactly when `rel` is the start of one of the class's
/// slots: one multiplication, one rotation and one compare cover the division, the
/// "inside a slot" check and the "past the class's last slot" check.
pub(super) const INVERSE: [(u64, u32); 7] = {
    const ONE: u64 = 1;
    const THIRD: u64 = 0xAAAA_AAAA_AAAA_AAAB; // 3 × THIRD ≡ 1 (mod 2^64)
    [(ONE, 3), (ONE, 4), (ONE, 5), (THIRD, 4), (ONE, 6), (THIRD, 5), (ONE, 7)]
};

/// What a free needs of the class a granule belongs to, copied from its [`SmallClass`]: one
/// record per granule, so the free goes from an address to its slot, class and lanes with one
/// table load (the record's fields share a line) and no class record or `Arc` on the way.
///
/// Invariant: `whole_slots` is at most 64 times the number of whole words in the bitmap of
/// `lanes`, so the free's fast path indexes a slot's word below it without a bounds check.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(32))]
pub(super) struct GranuleClass {
    start: u64,
    /// The class's inverse in [`INVERSE`].
    inverse: u64,
    /// The class's slots in whole bitmap words: a multiple of 64, below `2^32`.
    pub(super) whole_slots: u32,
    /// The class's other slots, in its bitmap's partial last word: under 64.
    tail_slots: u8,
    /// The class's shift in [`INVERSE`].
    shift: u8,
    pub(super) class: ClassIndex,
    /// The class's lanes, loaded with the rest so the free needs no second lookup for them.
    pub(super) lanes: LanesPtr,
}

impl GranuleClass {
    /// The record of class `i`, whose lanes are `lanes` (which must lie in the allocator's
    /// `Shared`, for [`LanesPtr`]'s invariant); `None` for a granule past the region, which has
    /// no slots, so every free there takes the cold path.
    pub(super) fn new(class: Option<&SmallClass>, i: usize, lanes: &Lanes) -> GranuleClass {
        let (inverse, shift) = INVERSE[i];
        let slots = class.map_or(0, |c| u32::try_from(c.slots).expect("fewer than 2^32 slots"));
        // The invariant: whole words of this very bitmap.
        let whole_slots = u32::try_from(lanes.whole_words() * 64).expect("fewer than 2^32 slots").min(slots);
        GranuleClass {
            start: class.map_or(0, |c| c.start as u64),
            inverse,
            whole_slots,
            tail_slots: u8::try_from(slots - whole_slots).expect("under 64 slots past the whole words"),
            shift: shift as u8,
            class: ClassIndex::ALL[i],
            lanes: LanesPtr(NonNull::from(lanes)),
        }
    }

    /// The class's slot count.
    #[inline(always)]
    pub(super) fn slots(&self) -> u64 {
        u64::from(self.whole_slots) + u64::from(self.tail_slots)
    }

    /// [`INVERSE`]'s `slot_of` for `offset` bytes into the region (at or after the class's
    /// start, as every granule of a class is): the slot index if `offset` is a slot's start,
    /// and at least `2^32` if it is not.
    #[inline(always)]
    pub(super) fn slot_of(&self, offset: usize) -> u64 {
        (offset as u64).wrapping_sub(self.start).wrapping_mul(self.inverse).rotate_right(u32::from(self.shift))
    }
}

/// A pointer to one of the [`Lanes`] in an allocator's [`Shared`](super::Shared), so the fast paths reach a
/// class's lanes with one load instead of the `Arc`'s pointer and an index.
///
/// Invariant: it points into the `Arc<Shared>` of the allocator whose fields hold it. That
/// `Arc` lives as long as the allocator and is never borrowed mutably (nothing calls
/// `Arc::get_mut` on it), so the pointee is valid for shared access while the allocator is.
#[derive(Debug, Clone, Copy)]
pub(super) struct LanesPtr(pub(super) NonNull<Lanes>);

impl LanesPtr {
    /// The lanes, for as long as `owner` is borrowed.
    ///
    /// # Safety
    ///
    /// `owner` is the allocator whose fields hold this pointer.
    #[inline(always)]
    pub(super) unsafe fn get(self, owner: &SmallObjectAllocator) -> &Lanes {
        let _ = owner;
        // SAFETY: by the invariant and the caller's contract, it points into `owner.shared`,
        // alive and never mutably borrowed while `owner` is borrowed.
        unsafe { self.0.as_ref() }
    }
}

// SAFETY: it stands for a `&Lanes` into an `Arc` its allocator holds; `Lanes` is `Sync`.
unsafe impl Send for LanesPtr {}
// SAFETY: as above.
unsafe impl Sync for LanesPtr {}
