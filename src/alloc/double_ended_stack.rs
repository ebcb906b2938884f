//! [`DoubleEndedStack`]: two stacks growing towards each other in one region.

use std::alloc::Layout;
use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;

use super::shell::{self, Shell};

use super::region::{self, Region, MAX_ALIGN};
use super::stack::next_stack_id;
use super::{AllocStats, Marker};
use crate::{Error, Result};

/// Which end of a [`DoubleEndedStack`] to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum End {
    /// The lower stack: grows up from the start of the region.
    Lower,
    /// The upper stack: grows down from the end of the region.
    Upper,
}

impl End {
    fn tag(self) -> u8 {
        match self {
            End::Lower => 0,
            End::Upper => 1,
        }
    }
}

/// Two stacks in one region: the lower grows up, the upper grows down, and an allocation
/// that would make them meet fails cleanly with [`Error::OutOfMemory`].
///
/// A typical use: level data on the lower end, temporary loading data on the upper end, so
/// neither needs its own fixed budget. Each end has its own [`Marker`]s.
///
/// Borrowing, drop and thread rules are those of [`StackAllocator`](super::StackAllocator):
/// `alloc_*` take `&self`, the frees take `&mut self`, values are never dropped, and the type
/// is `Send` but not `Sync`.
///
/// Invariants: `lower <= upper <= region.len()`; bytes in `lower..upper` are free (and hold the
/// fill pattern in debug builds).
///
/// # Examples
///
/// ```
/// use mmobject::alloc::{DoubleEndedStack, End};
///
/// let mut stack = DoubleEndedStack::with_capacity(1024);
/// let level = stack.alloc(End::Lower, [0u8; 600]);
/// level[0] = 1;
/// let scratch_mark = stack.marker(End::Upper);
/// let scratch = stack.alloc(End::Upper, [0u8; 400]);
/// scratch[0] = 2;
/// assert!(stack.try_alloc(End::Upper, [0u8; 100]).is_err()); // would meet the lower stack
/// stack.free_to_marker(scratch_mark);
/// assert!(stack.try_alloc(End::Upper, [0u8; 100]).is_ok());
/// ```
pub struct DoubleEndedStack {
    region: Region,
    /// Offset of the first free byte above the lower stack.
    lower: Cell<usize>,
    /// Offset of the lowest byte used by the upper stack (`region.len()` when empty).
    upper: Cell<usize>,
    id: u64,
    failures: Cell<u64>,
    peak: Cell<usize>,
}

impl DoubleEndedStack {
    /// Creates a double-ended stack over a preallocated region of `bytes` bytes.
    ///
    /// # Panics
    ///
    /// Panics if `bytes` is larger than `isize::MAX - 4096`.
    pub fn with_capacity(bytes: usize) -> DoubleEndedStack {
        DoubleEndedStack {
            region: Region::new(bytes),
            lower: Cell::new(0),
            upper: Cell::new(bytes),
            id: next_stack_id(),
            failures: Cell::new(0),
            peak: Cell::new(0),
        }
    }

    /// The region's size in bytes.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.region.len()
    }

    /// Bytes used by one end (including padding).
    #[inline]
    pub fn allocated_bytes(&self, end: End) -> usize {
        match end {
            End::Lower => self.lower.get(),
            End::Upper => self.region.len() - self.upper.get(),
        }
    }

    /// Bytes still free between the two stacks.
    #[inline]
    pub fn available(&self) -> usize {
        self.upper.get() - self.lower.get()
    }

    /// Moves `value` onto one end and returns a reference to it. It is never dropped.
    ///
    /// # Panics
    ///
    /// Panics with [`Error::OutOfMemory`]'s message if the stacks would meet, or
    /// [`Error::UnsupportedAlignment`]'s if `T` is aligned to more than 4096.
    #[inline]
    #[track_caller]
    pub fn alloc<T>(&self, end: End, value: T) -> &mut T {
        shell::ok_or_fail(self.try_alloc(end, value))
    }

    /// Moves `value` onto one end, or fails if the stacks would meet.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`] (the value is dropped) or [`Error::UnsupportedAlignment`].
    #[inline]
    #[allow(clippy::mut_from_ref)] // like bumpalo: each call returns fresh, disjoint memory
    pub fn try_alloc<T>(&self, end: End, value: T) -> Result<&mut T> {
        let ptr = self.try_alloc_layout(end, Layout::new::<T>())?.cast::<T>();
        // SAFETY: a fresh block between the two tops (or dangling for a ZST), aligned for `T`,
        // that nobody references; it is only reused after a `&mut self` call, which cannot
        // happen while the returned borrow of `self` lives.
        unsafe {
            ptr.as_ptr().write(value);
            Ok(&mut *ptr.as_ptr())
        }
    }

    /// Reserves an uninitialised block on one end.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`] if the stacks would meet, [`Error::UnsupportedAlignment`] for an
    /// alignment above 4096, and in debug builds [`Error::UseAfterFree`] if a stale pointer
    /// wrote into the free gap.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// use mmobject::alloc::{DoubleEndedStack, End};
    ///
    /// let stack = DoubleEndedStack::with_capacity(8192);
    /// let p = stack.try_alloc_layout(End::Upper, Layout::from_size_align(100, 256).unwrap()).unwrap();
    /// assert_eq!(p.as_ptr() as usize % 256, 0);
    /// assert_eq!(stack.allocated_bytes(End::Upper), 8192 - 7936);
    /// ```
    pub fn try_alloc_layout(&self, end: End, layout: Layout) -> Result<NonNull<u8>> {
        let (size, align) = (layout.size(), layout.align());
        if align > MAX_ALIGN {
            return Err(self.failed(Error::UnsupportedAlignment { align, max: MAX_ALIGN }));
        }
        if size == 0 {
            return Ok(region::dangling(align));
        }
        let (lower, upper) = (self.lower.get(), self.upper.get());
        let start = match end {
            End::Lower => {
                let start = region::align_up(lower, align);
                if start + size > upper {
                    return Err(self.out_of_memory(start + size - lower));
                }
                start
            }
            End::Upper => {
                let start = upper.checked_sub(size).map(|s| s & !(align - 1));
                match start {
                    Some(start) if start >= lower => start,
                    _ => return Err(self.out_of_memory(size + align - 1)),
                }
            }
        };
        // SAFETY: `start + size <= upper <= len` (both arms checked it).
        let ptr = unsafe { self.region.at(start) };
        // SAFETY: `start..start + size` lies in the free gap `lower..upper`.
        if !unsafe { region::freed_intact(ptr, size) } {
            // SAFETY: as above: nobody references the gap.
            unsafe { region::fill_freed(ptr, size) };
            return Err(self.failed(region::use_after_free("DoubleEndedStack", ptr.as_ptr() as usize)));
        }
        match end {
            End::Lower => self.lower.set(start + size),
            End::Upper => self.upper.set(start),
        }
        debug_assert!(self.lower.get() <= self.upper.get(), "the stacks crossed");
        Ok(ptr)
    }

    /// The current top of one end.
    #[inline]
    pub fn marker(&self, end: End) -> Marker {
        let offset = match end {
            End::Lower => self.lower.get(),
            End::Upper => self.upper.get(),
        };
        Marker { owner: self.id, end: end.tag(), offset }
    }

    /// Frees everything allocated on the marker's end after it was taken.
    ///
    /// # Panics
    ///
    /// Panics with [`Error::InvalidMarker`]'s message if the marker came from another stack
    /// or lies beyond that end's current top.
    #[track_caller]
    pub fn free_to_marker(&mut self, marker: Marker) {
        shell::ok_or_fail(self.try_free_to_marker(marker))
    }

    /// Frees everything allocated on the marker's end after it was taken.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidMarker`] if the marker came from another stack (or a plain
    /// [`StackAllocator`](super::StackAllocator)) or lies beyond that end's current top.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{alloc::{DoubleEndedStack, End}, Error};
    ///
    /// let mut stack = DoubleEndedStack::with_capacity(64);
    /// let m = stack.marker(End::Lower);
    /// stack.alloc(End::Lower, 1u64);
    /// let above = stack.marker(End::Lower);
    /// stack.free_to_marker(m);
    /// assert!(matches!(stack.try_free_to_marker(above), Err(Error::InvalidMarker { .. })));
    /// ```
    pub fn try_free_to_marker(&mut self, marker: Marker) -> Result<()> {
        if marker.owner != self.id {
            return Err(Error::InvalidMarker { reason: "the marker belongs to another stack" });
        }
        self.update_peak();
        let (lower, upper) = (self.lower.get(), self.upper.get());
        match marker.end {
            0 if marker.offset <= lower => {
                // SAFETY: `marker.offset..lower` is inside the region (`lower <= len`) and
                // `&mut self` proves nothing in it is borrowed.
                unsafe { region::fill_freed(self.region.at(marker.offset), lower - marker.offset) };
                self.lower.set(marker.offset);
            }
            1 if marker.offset >= upper && marker.offset <= self.region.len() => {
                // SAFETY: as above, for `upper..marker.offset`.
                unsafe { region::fill_freed(self.region.at(upper), marker.offset - upper) };
                self.upper.set(marker.offset);
            }
            _ => return Err(Error::InvalidMarker { reason: "the marker is above the top of its stack" }),
        }
        Ok(())
    }

    /// Frees both ends.
    pub fn reset(&mut self) {
        self.update_peak();
        let len = self.region.len();
        // SAFETY: `lower <= upper <= len`, and `&mut self`: nothing in the region is borrowed.
        unsafe {
            region::fill_freed(self.region.at(0), self.lower.get());
            region::fill_freed(self.region.at(self.upper.get()), len - self.upper.get());
        }
        self.lower.set(0);
        self.upper.set(len);
    }

    fn update_peak(&self) {
        let used = self.region.len() - self.available();
        self.peak.set(self.peak.get().max(used));
    }

    /// A snapshot of the usage of both ends together, derived from the two tops (blocks are
    /// not counted: `live` and `allocations` are 0, as for the other stacks).
    pub fn stats(&self) -> AllocStats {
        self.update_peak();
        AllocStats {
            capacity: self.region.len(),
            in_use: self.region.len() - self.available(),
            peak: self.peak.get(),
            live: 0,
            allocations: 0,
            failures: self.failures.get(),
            fallbacks: 0,
        }
    }

    /// Grows `block` in place if it is the last block of the lower stack (it ends at the
    /// lower top), stays aligned for `new_align`, and the free gap has room. The upper
    /// stack's last block cannot grow in place: the bytes after it belong to the block
    /// allocated before it.
    fn grow_last_lower(
        &self,
        block: NonNull<u8>,
        old_size: usize,
        new_size: usize,
        new_align: usize,
    ) -> Option<NonNull<u8>> {
        let offset = (block.as_ptr() as usize).wrapping_sub(self.region.addr());
        let (lower, upper) = (self.lower.get(), self.upper.get());
        // A pointer from elsewhere gives a meaningless (wrapped) offset, which cannot end at
        // the lower top unless the pointer is that stack's last block.
        let is_last = old_size != 0 && offset.checked_add(old_size) == Some(lower);
        let aligned = new_align <= MAX_ALIGN && offset % new_align == 0;
        if !is_last || !aligned || new_size > upper - offset {
            return None;
        }
        let end = offset + new_size;
        // SAFETY: `lower..end` lies in the free gap `lower..upper`: nobody references it.
        if !unsafe { region::freed_intact(self.region.at(lower), end - lower) } {
            return None; // a stale write: leave it to `allocate`, which reports it
        }
        self.lower.set(end);
        // SAFETY: `offset + new_size <= upper <= len` (checked above).
        Some(unsafe { self.region.at(offset) })
    }

    #[cold]
    #[inline(never)]
    fn failed(&self, error: Error) -> Error {
        self.failures.set(self.failures.get() + 1);
        error
    }

    #[cold]
    #[inline(never)]
    fn out_of_memory(&self, requested: usize) -> Error {
        self.failed(Error::OutOfMemory { requested, available: self.available() })
    }
}

impl fmt::Debug for DoubleEndedStack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DoubleEndedStack")
            .field("capacity", &self.region.len())
            .field("lower", &self.lower.get())
            .field("upper", &self.upper.get())
            .finish()
    }
}

// SAFETY: `Shell` contract: `try_alloc` returns a block of the lower stack, in the free gap,
// from the region's pointer (1); blocks stay valid until a `&mut self` call
// (`free_to_marker`, `reset`) or the drop (2); `try_free` touches no memory (3);
// `grow_in_place` extends the lower stack's last block into the free gap, keeping its start
// and contents, and only while it stays below the upper stack (4); `shrink_in_place` keeps
// the block where it is, unchanged (5);
// `try_free` frees nothing, so it ignores layouts (6).
unsafe impl Shell for DoubleEndedStack {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        self.try_alloc_layout(End::Lower, layout)
    }

    /// Individual blocks are not freed; a pointer that is neither in the region nor a
    /// zero-size block is [`Error::ForeignPointer`].
    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        if self.region.contains(ptr.as_ptr() as usize) || region::is_dangling(ptr) {
            return Ok(());
        }
        Err(Error::ForeignPointer { addr: ptr.as_ptr() as usize })
    }

    #[inline]
    unsafe fn grow_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        debug_assert!(new.size() >= old.size(), "grow to a smaller size");
        self.grow_last_lower(ptr, old.size(), new.size(), new.align())
    }

    #[inline]
    unsafe fn shrink_in_place(&self, ptr: NonNull<u8>, _old: Layout, new: Layout) -> Option<NonNull<u8>> {
        // The block stays where it is, and so does the top: a marker taken above the block
        // stays valid (moving the top down through `&self` would put it above the top).
        ((ptr.as_ptr() as usize) % new.align() == 0).then_some(ptr)
    }
}

shell::impl_allocator!(DoubleEndedStack);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::StackAllocator;
    use allocator_api2::alloc::Allocator;
    use proptest::prelude::*;

    #[test]
    fn ends_meet_cleanly() {
        let s = DoubleEndedStack::with_capacity(64);
        s.alloc(End::Lower, [0u8; 30]);
        s.alloc(End::Upper, [0u8; 30]);
        assert_eq!(s.available(), 4);
        assert_eq!(
            s.try_alloc(End::Lower, [0u8; 5]).map(|_| ()),
            Err(Error::OutOfMemory { requested: 5, available: 4 })
        );
        assert!(s.try_alloc(End::Upper, [0u8; 5]).is_err());
        s.alloc(End::Upper, [0u8; 4]);
        assert_eq!(s.available(), 0);
        assert_eq!(s.stats().failures, 2);
    }

    #[test]
    fn last_lower_block_grows_in_place_and_counts_come_from_the_tops() {
        let s = DoubleEndedStack::with_capacity(1024);
        s.alloc(End::Upper, [1u8; 16]);
        let mut v = allocator_api2::vec::Vec::with_capacity_in(8, &s);
        let first = v.as_ptr();
        v.extend(0..100u8);
        assert_eq!(v.as_ptr(), first, "grown in place");
        assert_eq!(s.allocated_bytes(End::Lower), v.capacity());
        // Not the last block any more: a copy.
        let other = s.alloc(End::Lower, 7u8);
        v.extend(0..50u8);
        assert_ne!(v.as_ptr(), first);
        assert_eq!(*other, 7);
        assert!(v.iter().take(100).copied().eq(0..100u8));
        // A block that would reach the upper stack does not grow.
        let mut w = allocator_api2::vec::Vec::<u8, _>::with_capacity_in(1, &s);
        assert!(w.try_reserve(s.available() + 2).is_err(), "its own byte and the whole gap, plus one");
        w.push(1);
        let st = s.stats();
        assert_eq!((st.live, st.allocations), (0, 0));
        assert_eq!(st.in_use, 1024 - s.available());
    }

    #[test]
    fn marker_errors() {
        let mut s = DoubleEndedStack::with_capacity(64);
        let other = StackAllocator::with_capacity(8);
        assert!(matches!(s.try_free_to_marker(other.marker()), Err(Error::InvalidMarker { .. })));
        let up0 = s.marker(End::Upper);
        s.alloc(End::Upper, 1u32);
        let up1 = s.marker(End::Upper);
        s.free_to_marker(up0);
        assert_eq!(
            s.try_free_to_marker(up1),
            Err(Error::InvalidMarker { reason: "the marker is above the top of its stack" })
        );
        s.alloc(End::Lower, 1u32);
        s.reset();
        assert_eq!(s.available(), 64);
        assert_eq!(s.stats().peak, 4);
    }

    #[test]
    #[should_panic(expected = "invalid marker")]
    fn invalid_marker_panics() {
        let mut s = DoubleEndedStack::with_capacity(64);
        let m = s.marker(End::Lower);
        let mut t = DoubleEndedStack::with_capacity(64);
        t.free_to_marker(m);
        s.reset();
    }

    #[test]
    #[should_panic(expected = "foreign free")]
    fn foreign_deallocate_panics() {
        let a = DoubleEndedStack::with_capacity(16);
        let mut x = 0u64;
        // SAFETY: deliberately wrong; the allocator detects it before touching the pointer.
        unsafe { (&a).deallocate(NonNull::from(&mut x).cast(), Layout::new::<u64>()) };
    }

    proptest! {
        #![proptest_config(crate::alloc::model_config())]
        #[test]
        fn model(ops in proptest::collection::vec((any::<bool>(), 0usize..6, 0usize..64, 0u32..6),
                                                  0..if cfg!(miri) { 20 } else { 100 })) {
            let mut s = DoubleEndedStack::with_capacity(512);
            let mut live: Vec<(End, NonNull<u8>, usize, u8)> = Vec::new();
            let mut marks: Vec<(Marker, End, usize)> = Vec::new();
            for (n, (upper, action, size, a)) in ops.into_iter().enumerate() {
                let end = if upper { End::Upper } else { End::Lower };
                match action {
                    0 => marks.push((s.marker(end), end, live.iter().filter(|l| l.0 == end).count())),
                    1 => {
                        if let Some(&(m, e, count)) = marks.last() {
                            s.free_to_marker(m);
                            marks.pop();
                            let mut kept = 0;
                            live.retain(|l| l.0 != e || { kept += 1; kept <= count });
                        }
                    }
                    _ => {
                        let align = 1usize << a;
                        match s.try_alloc_layout(end, Layout::from_size_align(size, align).unwrap()) {
                            Ok(p) => {
                                prop_assert_eq!(p.as_ptr() as usize % align, 0);
                                if size > 0 {
                                    let addr = p.as_ptr() as usize;
                                    for l in &live {
                                        let b = l.1.as_ptr() as usize;
                                        prop_assert!(addr >= b + l.2 || addr + size <= b, "overlap");
                                    }
                                    // SAFETY: fresh block of `size` bytes.
                                    unsafe { p.as_ptr().write_bytes(n as u8, size) };
                                    live.push((end, p, size, n as u8));
                                }
                            }
                            Err(Error::OutOfMemory { .. }) => {}
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                }
                for l in &live {
                    // SAFETY: the model's live blocks are allocated and initialised.
                    let bytes = unsafe { std::slice::from_raw_parts(l.1.as_ptr(), l.2) };
                    prop_assert!(bytes.iter().all(|&x| x == l.3));
                }
                prop_assert!(s.allocated_bytes(End::Lower) + s.allocated_bytes(End::Upper) <= 512);
            }
        }
    }
}
