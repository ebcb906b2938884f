//! The layout of blocks the tracker allocates itself (through
//! [`TrackingAllocator`](super::TrackingAllocator) or [`Tracker::alloc`](super::Tracker::alloc)):
//!
//! ```text
//! base                                           user pointer
//! | padding | front guard (16 B, diagnostics) | header (8 B) | user bytes | back guard (16 B, diagnostics) |
//! ```
//!
//! The header records the tag and how the block was tracked, so a free is attributed to
//! the tag it was allocated under whatever mode the tracker is in by then. It holds no
//! size: every free is given the block's layout (`GlobalAlloc::dealloc`'s `Layout`, or the
//! record of a [`Tracker::alloc`](super::Tracker::alloc) block). One 8-byte word keeps
//! the cost at one store per allocation and one load per free, and keeps a 64-byte block in
//! the same `malloc` size class as it would have untracked. An underrun hits the header
//! (magic checked on free) and then the front guard; an overrun hits the back guard.

use std::alloc::Layout;
use std::panic::Location;
use std::ptr;
use std::sync::atomic::Ordering;

use super::budget::Charger;
use super::record::{Record, FLAG_GUARDED};
use super::stack_trace::NO_STACK;
use super::tag::{TagId, MAX_TAGS};
use super::tracker::Tracker;
use crate::Error;

/// Bytes of header before each user pointer.
pub(crate) const HEADER: usize = 8;
/// Bytes of each guard zone (diagnostic mode only).
pub(crate) const GUARD: usize = 16;
/// The guard fill byte.
pub(crate) const GUARD_BYTE: u8 = 0xFD;

const MAGIC: u32 = 0x7AC4_0000;
const MAGIC_MASK: u32 = 0xFFFF_0000;
const FREED_MAGIC: u32 = 0xDEAD_0000;

/// The block was counted in the per-tag counters.
pub(crate) const H_COUNTED: u32 = 1;
/// The block has a record in the record table.
pub(crate) const H_RECORD: u32 = 2;
/// The block has guard zones.
pub(crate) const H_GUARDED: u32 = 4;
/// No block has it (see `Header::NONE`).
const H_NONE: u32 = 1 << 15;

/// The 8 bytes right before every user pointer: one word, so it is written with one store
/// and read with one load.
///
/// Bits 0..32 hold the tag id, bits 32..64 `MAGIC | H_*` flags while the block is live.
/// Once freed it is `FREED_WORD`. Every bit pattern is a valid `Header`, so a corrupted one
/// still reads (and fails [`Header::is_valid`]).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header(u64);

const _: () = assert!(std::mem::size_of::<Header>() == HEADER);

/// The header word of a freed block: `FREED_MAGIC` sign-extended, so that marking a block
/// freed is one store of a 32-bit immediate. Its upper half is not a live block's magic.
const FREED_WORD: u64 = FREED_MAGIC as i32 as i64 as u64;

impl Header {
    /// A header no block gets (it has a flag no placement sets), and no likelier in foreign
    /// memory than a live one: what the allocator's per-thread cache holds where it must
    /// match no block (see `scope::Local`).
    pub(crate) const NONE: Header = Header::new(0, H_NONE);

    #[inline]
    pub(crate) const fn new(tag: u32, flags: u32) -> Self {
        Header(((MAGIC | flags) as u64) << 32 | tag as u64)
    }

    /// The tag id the block was counted under.
    #[inline]
    pub(crate) const fn tag(self) -> u32 {
        self.0 as u32
    }

    const fn magic_flags(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// A live block's header, under an existing tag id (so a corrupted header never
    /// indexes out of the tag table).
    pub(crate) const fn is_valid(self) -> bool {
        self.magic_flags() & MAGIC_MASK == MAGIC && (self.tag() as usize) < MAX_TAGS
    }

    /// A header [`mark_freed`] wrote.
    pub(crate) const fn was_freed(self) -> bool {
        self.0 == FREED_WORD
    }

    /// A live block that is counted, with no record and no guards, under an existing tag
    /// id (so a corrupted header never indexes out of the tag table).
    #[inline]
    pub(crate) const fn is_counted_only(self) -> bool {
        self.is_exactly(MAGIC | H_COUNTED)
    }

    /// A live block that is counted and has a record, with no guards, under an existing
    /// tag id.
    #[inline]
    pub(crate) const fn is_recorded_only(self) -> bool {
        self.is_exactly(MAGIC | H_COUNTED | H_RECORD)
    }

    /// Whether the magic and flags are `magic_flags` and the tag is below `MAX_TAGS` (256:
    /// its upper 24 bits are zero), in one shift and compare.
    #[inline]
    const fn is_exactly(self, magic_flags: u32) -> bool {
        const _: () = assert!(MAX_TAGS == 1 << 8, "the header's tag check assumes 256 tags");
        self.0 >> 8 == (magic_flags as u64) << 24
    }

    pub(crate) const fn flags(self) -> u32 {
        self.magic_flags() & !MAGIC_MASK
    }

    fn to_ne_bytes(self) -> [u8; HEADER] {
        self.0.to_ne_bytes()
    }
}

/// Where the user block sits inside the outer block, and the outer block's layout.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockLayout {
    pub(crate) outer: Layout,
    /// Bytes from the outer base to the user pointer.
    pub(crate) prefix: usize,
}

/// The outer layout for a user `layout`, or `None` on overflow.
///
/// Unguarded, the prefix is the alignment (at least `HEADER`): the header fills the last
/// 8 bytes of it, and a block of alignment 8 or less costs exactly 8 bytes more.
#[inline]
pub(crate) fn block_layout(layout: Layout, guarded: bool) -> Option<BlockLayout> {
    let align = layout.align().max(HEADER);
    if !guarded {
        let total = layout.size().checked_add(align)?;
        if total > isize::MAX as usize - (align - 1) {
            return None;
        }
        // SAFETY: `align` is a power of two (the larger of two), and `total` rounded up to
        // it does not overflow `isize` (checked above).
        let outer = unsafe { Layout::from_size_align_unchecked(total, align) };
        return Some(BlockLayout { outer, prefix: align });
    }
    let front = HEADER + GUARD;
    // Round `front` up to the alignment so the user pointer stays aligned.
    let prefix = front.checked_add(align - 1)? & !(align - 1);
    let total = prefix.checked_add(layout.size())?.checked_add(GUARD)?;
    let outer = Layout::from_size_align(total, align).ok()?;
    Some(BlockLayout { outer, prefix })
}

/// Writes the header (and guards) into a fresh outer block; returns the user pointer.
///
/// # Safety
///
/// `base` must be valid for writes of `block.outer.size()` bytes and aligned to
/// `block.outer.align()`, and `block` must come from `block_layout(layout, guarded)` with
/// `size` = `layout.size()`.
#[inline]
pub(crate) unsafe fn init(base: *mut u8, block: BlockLayout, size: usize, header: Header) -> *mut u8 {
    // SAFETY: `prefix <= outer.size()` (caller's contract), so `user` is inside the block.
    let user = unsafe { base.add(block.prefix) };
    // SAFETY: `prefix >= HEADER` and `user` is aligned to at least `HEADER` (8), so the
    // header slot `user - HEADER` is inside the block and aligned for `Header` (align 8).
    unsafe { user.sub(HEADER).cast::<Header>().write(header) };
    if header.flags() & H_GUARDED != 0 {
        // SAFETY: with guards, `prefix >= HEADER + GUARD`, and the block has `GUARD` bytes
        // after the user bytes (caller's contract), so both zones are inside it.
        unsafe {
            ptr::write_bytes(user.sub(HEADER + GUARD), GUARD_BYTE, GUARD);
            ptr::write_bytes(user.add(size), GUARD_BYTE, GUARD);
        }
    }
    user
}

/// Reads the header before a user pointer.
///
/// # Safety
///
/// `user` must be a live user pointer returned by [`init`] (the 8 bytes before it must be
/// readable).
#[inline]
pub(crate) unsafe fn read_header(user: *const u8) -> Header {
    // SAFETY: the caller guarantees the header slot is readable; it is aligned (see `init`).
    // Every bit pattern is a valid `Header` (plain integers), so a corrupted one still reads.
    unsafe { ptr::read(user.sub(HEADER).cast::<Header>()) }
}

/// Rewrites the header before a user pointer.
///
/// # Safety
///
/// As for [`read_header`], and the block must not be freed yet.
#[inline]
pub(crate) unsafe fn write_header(user: *mut u8, header: Header) {
    // SAFETY: the caller guarantees the header slot is live and writable; it is aligned
    // (see `init`).
    unsafe { user.sub(HEADER).cast::<Header>().write(header) };
}

/// Marks the header freed (best-effort double-free detection).
///
/// # Safety
///
/// As for [`read_header`], and the block must not be freed yet.
#[inline]
pub(crate) unsafe fn mark_freed(user: *mut u8) {
    // SAFETY: the caller guarantees the header slot is live and writable; it is aligned
    // (see `init`).
    unsafe { user.sub(HEADER).cast::<Header>().write(Header(FREED_WORD)) };
}

/// Counts the guard and header bytes that differ from what was written.
///
/// # Safety
///
/// `user` must be a live guarded user pointer returned by [`init`] with this `size`.
pub(crate) unsafe fn damaged_bytes(user: *const u8, size: usize, expected: Header) -> usize {
    let mut bad = 0;
    for i in 0..GUARD {
        // SAFETY: both guard zones are inside the live block (see `init`); volatile because
        // we read bytes the user should not have written.
        unsafe {
            bad += usize::from(ptr::read_volatile(user.sub(HEADER + GUARD).add(i)) != GUARD_BYTE);
            bad += usize::from(ptr::read_volatile(user.add(size + i)) != GUARD_BYTE);
        }
    }
    // SAFETY: the header slot is inside the live block.
    let header = unsafe { read_header(user) };
    let (expected, found) = (expected.to_ne_bytes(), header.to_ne_bytes());
    bad + expected.iter().zip(found.iter()).filter(|(a, b)| a != b).count()
}

/// How [`Tracker::place`] tracks one block.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    /// The tag to count the block under; `None`: not tracked at all (re-entrant calls).
    pub(crate) tag: Option<TagId>,
    /// Guard zones around the user bytes (diagnostic mode).
    pub(crate) guarded: bool,
    /// A record, with this many stack frames.
    pub(crate) record: Option<usize>,
    /// The record's `FLAG_*` bits (`FLAG_GUARDED` is added for guarded blocks).
    pub(crate) record_flags: u32,
    /// Who charges: `Charger::Allocator` counts in the thread's slot where it can.
    pub(crate) charger: Charger,
    /// The block is refused if its record finds no room in the table (the explicit API
    /// frees through the record); else it is kept without one.
    pub(crate) record_required: bool,
    /// Where the allocation was asked for.
    pub(crate) site: &'static Location<'static>,
}

/// Why [`Tracker::place`] placed nothing (nothing is counted then).
#[derive(Debug)]
pub(crate) enum PlaceError {
    /// The layout cannot take a header (and guards).
    Layout,
    /// Refused by the tag's budget.
    Budget(Error),
    /// The inner allocator returned null for this outer layout.
    OutOfMemory(Layout),
    /// The record table had no room for a record the placement requires. The block at
    /// `base` (of layout `outer`) is the caller's to free; it was never counted.
    NoRecord { base: *mut u8, outer: Layout },
}

impl Tracker {
    /// Puts one tracked block in memory: the outer layout (header, guards), the count (and
    /// budget check), the inner allocation through `allocate`, the header and guards, the
    /// record. The one placement used by the explicit API ([`Tracker::try_alloc`]) and by
    /// [`TrackingAllocator`](super::TrackingAllocator) (whose counting-only fast path is the
    /// same steps without a record, inlined).
    ///
    /// A record the table has no room for is dropped, and the header says so (else the
    /// block's free would look like a double free).
    /// If the placement requires it, the block is refused instead
    /// ([`PlaceError::NoRecord`]). The record goes in before the block is counted, so a
    /// refused block shows in no peak and no total.
    ///
    /// # Safety
    ///
    /// `allocate` must return null or a fresh block valid for the layout it is given.
    #[inline]
    pub(crate) unsafe fn place(
        &self,
        layout: Layout,
        how: Placement,
        allocate: impl FnOnce(Layout) -> *mut u8,
    ) -> Result<*mut u8, PlaceError> {
        let size = layout.size();
        let block = block_layout(layout, how.guarded).ok_or(PlaceError::Layout)?;
        let in_allocator = how.charger == Charger::Allocator;
        // The budget is checked, and the bytes claimed, before the allocation; the
        // allocation is counted, and the peaks raised, only once the block exists, so an
        // allocation the inner allocator refuses shows in no peak and no total. A global
        // allocator's block of a tag with no budget and no watch is counted afterwards,
        // in the thread's slot, as on the counting path (nothing could refuse it).
        let claimed = match how.tag {
            Some(tag) if !in_allocator || self.is_slow(tag) => {
                self.claim_bytes(tag, size, how.charger).map_err(PlaceError::Budget)?;
                if in_allocator && !self.fed.load(Ordering::Relaxed) {
                    self.fed.store(true, Ordering::Relaxed);
                }
                Some(tag)
            }
            _ => None,
        };
        let base = allocate(block.outer);
        if base.is_null() {
            if let Some(tag) = claimed {
                self.counters[tag.index()].sub_bytes(size);
            }
            return Err(PlaceError::OutOfMemory(block.outer));
        }
        let tag = how.tag.unwrap_or(TagId::UNTAGGED);
        let mut hflags = if how.tag.is_some() { H_COUNTED } else { 0 };
        if how.record.is_some() {
            hflags |= H_RECORD;
        }
        if how.guarded {
            hflags |= H_GUARDED;
        }
        // SAFETY: `base` is a fresh block of `block.outer` (the caller's contract for
        // `allocate`), which came from `block_layout(layout, how.guarded)`.
        let user = unsafe { init(base, block, size, Header::new(tag.0, hflags)) };
        let recorded = match how.record {
            Some(depth) => {
                let flags = how.record_flags | if how.guarded { FLAG_GUARDED } else { 0 };
                self.add_record(user as usize, Record { size, tag, flags, site: how.site, stack: NO_STACK }, depth)
            }
            None => false,
        };
        if !recorded && how.record_required {
            if let Some(tag) = claimed {
                self.counters[tag.index()].sub_bytes(size);
            }
            return Err(PlaceError::NoRecord { base, outer: block.outer });
        }
        let watched = match (how.tag, claimed) {
            (Some(tag), Some(_)) => {
                self.commit_claim(tag, true);
                self.counters[tag.index()].watch.load(Ordering::Relaxed)
            }
            (Some(tag), None) => {
                self.count_unbudgeted(tag, size);
                false
            }
            (None, _) => false,
        };
        if !recorded {
            if how.record.is_some() {
                // SAFETY: `user` is the block `init` just set up.
                unsafe { write_header(user, Header::new(tag.0, hflags & !H_RECORD)) };
            }
            self.placed_without_record(user as usize);
        }
        if watched {
            self.watch_event("alloc", tag, size, Some(user as usize), Some(how.site));
        }
        Ok(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::alloc::{GlobalAlloc, System};

    #[test]
    fn layouts_keep_alignment() {
        for align in [1, 8, 16, 64, 4096] {
            for guarded in [false, true] {
                let l = Layout::from_size_align(24, align).unwrap();
                let b = block_layout(l, guarded).unwrap();
                assert_eq!(b.prefix % align, 0);
                assert!(b.prefix >= HEADER + if guarded { GUARD } else { 0 });
                assert!(b.outer.size() >= b.prefix + 24 + if guarded { GUARD } else { 0 });
            }
        }
    }

    #[test]
    fn an_unguarded_block_costs_its_alignment_and_at_least_eight_bytes() {
        for (size, align, outer) in [(64, 8, 72), (1, 1, 9), (64, 16, 80), (24, 256, 280)] {
            let b = block_layout(Layout::from_size_align(size, align).unwrap(), false).unwrap();
            assert_eq!((b.outer.size(), b.outer.align(), b.prefix), (outer, align.max(HEADER), align.max(HEADER)));
        }
        assert!(block_layout(Layout::from_size_align(isize::MAX as usize - 7, 8).unwrap(), false).is_none());
    }

    #[test]
    fn guards_detect_damage() {
        let l = Layout::from_size_align(10, 8).unwrap();
        let b = block_layout(l, true).unwrap();
        // SAFETY: non-zero size.
        let base = unsafe { System.alloc(b.outer) };
        assert!(!base.is_null());
        let h = Header::new(3, H_COUNTED | H_GUARDED);
        // SAFETY: `base` is a fresh block of `b.outer`.
        let user = unsafe { init(base, b, 10, h) };
        // SAFETY: `user` is live and guarded with size 10.
        unsafe {
            assert_eq!(read_header(user), h);
            assert_eq!(damaged_bytes(user, 10, h), 0);
            user.add(10).write(0);
            user.add(11).write(0);
            assert_eq!(damaged_bytes(user, 10, h), 2);
            user.sub(1).write(0x55);
            assert_eq!(damaged_bytes(user, 10, h), 3);
            mark_freed(user);
            assert!(read_header(user).was_freed());
            System.dealloc(base, b.outer);
        }
    }
}
