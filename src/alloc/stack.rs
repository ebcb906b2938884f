//! [`StackAllocator`]: bump up from the bottom of a region; free back to a [`Marker`].

use std::alloc::Layout;
use std::cell::Cell;
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use super::shell::{self, Shell};

use super::region::{self, Region, MAX_ALIGN};
use super::AllocStats;
use crate::{Error, Result};

/// Every block's end is rounded up to this, so the top stays a multiple of it and a block
/// aligned to 8 or less starts at the top with no rounding: the chain from the top's load to
/// its store is then one add (the rounding put two more steps on it, and each allocation
/// waits for the previous one's store). Only a block that fits exactly into a region whose
/// size is not a multiple of 8 leaves the top off the grain; the slow path serves the
/// region's last bytes then.
const TOP_GRAIN: usize = 8;

/// The top after a block that ends at `end`: rounded up to [`TOP_GRAIN`] where the region
/// has room, else `end` (the region's last bytes).
#[inline]
fn top_after(end: usize, len: usize) -> usize {
    let rounded = region::align_up(end, TOP_GRAIN);
    if rounded <= len {
        rounded
    } else {
        end
    }
}

/// The next id [`next_stack_id`] hands out. It only moves forward.
static NEXT_STACK_ID: AtomicU64 = AtomicU64::new(1);

/// Hands out a fresh id for each stack, so a marker (or a
/// [`FrameRef`](super::FrameRef)) from another allocator is caught.
///
/// Ids never repeat: a repeated id would let a `FrameRef` of one
/// [`DoubleBufferedAllocator`](super::DoubleBufferedAllocator) pass the owner check of another
/// and read memory that holds no `T`. They are `u64`s (2^64 allocators is out of reach), and
/// the counter refuses to wrap: once exhausted, every call panics and nothing is handed out.
///
/// # Panics
///
/// Panics when every id has been used.
pub(crate) fn next_stack_id() -> u64 {
    NEXT_STACK_ID
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |id| id.checked_add(1))
        .unwrap_or_else(|_| panic!("allocator ids exhausted: 2^64 - 1 stack allocators were created"))
}

/// Test hook: moves the allocator-id counter forward to at least `next`, so a test can reach
/// the end of the id space quickly. It can only move the counter forward, so it can make
/// [`next_stack_id`] panic sooner but never repeat an id.
#[doc(hidden)]
pub fn __advance_allocator_ids(next: u64) {
    NEXT_STACK_ID.fetch_max(next, Ordering::Relaxed);
}

/// A position in a stack, taken with [`StackAllocator::marker`] (or one end of a
/// [`DoubleEndedStack`](super::DoubleEndedStack)); freeing to it releases everything allocated
/// after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Marker {
    /// The id of the stack (and, for a double-ended stack, which end) it came from.
    pub(crate) owner: u64,
    /// The end it came from: 0 for a plain stack or the lower end, 1 for the upper end.
    pub(crate) end: u8,
    /// The offset of the top when the marker was taken.
    pub(crate) offset: usize,
}

impl Marker {
    /// The marker's offset from the start of the region, in bytes.
    pub fn offset(&self) -> usize {
        self.offset
    }
}

/// A stack allocator: one region, a top that only moves up on `alloc`, and back down to a
/// [`Marker`] on `free_to_marker`.
///
/// Allocation is a bump: round the top up to the alignment, add the size, compare against the
/// capacity. Each block's end is rounded up to a multiple of 8 bytes (as `malloc` rounds its
/// blocks), which keeps the common bump one add long: a 5-byte block takes 8 bytes. Freeing
/// single blocks is not possible; free everything above a marker instead.
///
/// **Borrowing.** [`alloc`](Self::alloc) takes `&self` and returns `&mut T` tied to that
/// borrow; [`free_to_marker`](Self::free_to_marker) and [`reset`](Self::reset) take
/// `&mut self`. The borrow checker therefore rejects any use of an allocation after the
/// memory under it is released (see the compile-fail test `tests/ui/alloc/stack_marker.rs`).
///
/// **Drop.** Values are never dropped (as in bumpalo): memory is reclaimed without running
/// destructors. Allocate plain data, or drop values yourself with `ptr::drop_in_place`.
///
/// **Growth.** Through the `Allocator` impl, the last block grows in place: a collection
/// filled while nothing else is allocated above it uses no more than its final capacity.
/// A shrink keeps the block where it is (its spare bytes come back with the next
/// `free_to_marker` or `reset`), so it never fails and never moves the top.
///
/// **Threads.** `Send` but not `Sync`: the top is a `Cell`.
///
/// Invariants: `top <= region.len()`; `top` is a multiple of 8 (`TOP_GRAIN`) unless the
/// last block ends in the region's last 7 bytes, where its rounded end would not fit (then
/// `top` is that end, above `grain_end`); `grain_end` is `region.len()` rounded down to the
/// grain, so a top at or below it is on the grain; in debug builds every byte in
/// `top..len` holds the freed fill pattern (checked on allocation).
///
/// # Examples
///
/// ```
/// use mmobject::alloc::StackAllocator;
///
/// let mut stack = StackAllocator::with_capacity(4096);
/// let level = stack.marker();
/// let a = stack.alloc([1.0f32; 4]);
/// a[0] = 2.0;
/// assert_eq!(stack.allocated_bytes(), 16);
/// stack.free_to_marker(level);
/// assert_eq!(stack.allocated_bytes(), 0);
/// ```
pub struct StackAllocator {
    region: Region,
    /// Offset of the first free byte. `top <= region.len()`, on the grain but for the
    /// region's last bytes (see the type's invariants).
    top: Cell<usize>,
    /// `region.len()` rounded down to a multiple of [`TOP_GRAIN`]: the fast path's limit.
    /// A block that ends at or below it leaves the top on the grain, and a top off the
    /// grain lies above it, so one compare covers both "fits" and "on the grain".
    grain_end: usize,
    /// Unique id stamped into markers.
    id: u64,
    failures: Cell<u64>,
    /// Highest top seen; updated whenever the top goes down and when stats are read.
    peak: Cell<usize>,
}

impl StackAllocator {
    /// Creates a stack over a preallocated region of `bytes` bytes (aligned to 4096).
    ///
    /// # Panics
    ///
    /// Panics if `bytes` is larger than `isize::MAX - 4096`.
    ///
    /// # Examples
    ///
    /// ```
    /// let stack = mmobject::alloc::StackAllocator::with_capacity(1 << 20);
    /// assert_eq!(stack.capacity(), 1 << 20);
    /// ```
    pub fn with_capacity(bytes: usize) -> StackAllocator {
        let region = Region::new(bytes);
        StackAllocator {
            grain_end: region.len() & !(TOP_GRAIN - 1),
            region,
            top: Cell::new(0),
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

    /// Bytes between the bottom and the top (including alignment padding, and the rounding
    /// of each block's end to a multiple of 8 bytes).
    #[inline]
    pub fn allocated_bytes(&self) -> usize {
        self.top.get()
    }

    /// Moves `value` onto the stack and returns a reference to it.
    ///
    /// # Panics
    ///
    /// Panics with [`Error::OutOfMemory`]'s message if the value does not fit, or with
    /// [`Error::UnsupportedAlignment`]'s if `T` is aligned to more than 4096.
    ///
    /// # Examples
    ///
    /// ```
    /// let stack = mmobject::alloc::StackAllocator::with_capacity(64);
    /// let x = stack.alloc(5u32);
    /// *x += 1;
    /// assert_eq!(*x, 6);
    /// ```
    #[inline(always)]
    #[track_caller]
    pub fn alloc<T>(&self, value: T) -> &mut T {
        shell::ok_or_fail(self.try_alloc(value))
    }

    /// Moves `value` onto the stack, or returns an error if it does not fit.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`] if the value does not fit (the value is dropped);
    /// [`Error::UnsupportedAlignment`] if `T` is aligned to more than 4096.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{alloc::StackAllocator, Error};
    ///
    /// let stack = StackAllocator::with_capacity(4);
    /// assert!(stack.try_alloc(1u32).is_ok());
    /// assert!(matches!(stack.try_alloc(2u32), Err(Error::OutOfMemory { requested: 4, available: 0 })));
    /// ```
    #[inline]
    #[allow(clippy::mut_from_ref)] // like bumpalo: each call returns fresh, disjoint memory
    pub fn try_alloc<T>(&self, value: T) -> Result<&mut T> {
        let ptr = self.try_alloc_layout(Layout::new::<T>())?.cast::<T>();
        // SAFETY: `ptr` is aligned for `T` and valid for `size_of::<T>()` bytes that nobody
        // else references (fresh memory above the old top, or dangling for a ZST). The
        // reference lives as long as `&self`, and the memory is only reused after a
        // `&mut self` call, which cannot happen while the reference lives.
        unsafe {
            ptr.as_ptr().write(value);
            Ok(&mut *ptr.as_ptr())
        }
    }

    /// Reserves a block for `layout` and returns its (uninitialised) start.
    ///
    /// # Panics
    ///
    /// As [`alloc`](Self::alloc).
    #[inline]
    #[track_caller]
    pub fn alloc_layout(&self, layout: Layout) -> NonNull<u8> {
        Shell::alloc(self, layout)
    }

    /// Reserves a block for `layout` and returns its (uninitialised) start.
    ///
    /// A zero-size request returns a dangling pointer aligned to `layout.align()` and
    /// reserves nothing.
    ///
    /// # Errors
    ///
    /// As [`try_alloc`](Self::try_alloc); in debug builds also [`Error::UseAfterFree`] if the
    /// bytes about to be handed out were written after they were freed (they are refilled, so
    /// the next call succeeds).
    ///
    /// # Examples
    ///
    /// ```
    /// use std::alloc::Layout;
    /// let stack = mmobject::alloc::StackAllocator::with_capacity(8192);
    /// let p = stack.try_alloc_layout(Layout::from_size_align(10, 4096).unwrap()).unwrap();
    /// assert_eq!(p.as_ptr() as usize % 4096, 0);
    /// ```
    #[inline]
    pub fn try_alloc_layout(&self, layout: Layout) -> Result<NonNull<u8>> {
        match self.bump(layout) {
            Some(p) => Ok(p),
            None => self.alloc_slow(layout),
        }
    }

    /// The fast path: bump the top if the block fits. Returns `None` for anything unusual
    /// (zero size, alignment above 4096, not enough room, a top off the grain), so that
    /// [`alloc_slow`](Self::alloc_slow) handles it with every check. It runs in every
    /// build; debug builds add the use-after-free check after the bump arithmetic (and
    /// leave a block that fails it to the slow path, which reports it), so `cargo test`
    /// exercises the same path as a release build.
    #[inline(always)]
    fn bump(&self, layout: Layout) -> Option<NonNull<u8>> {
        let (size, align) = (layout.size(), layout.align());
        if size == 0 || align > MAX_ALIGN {
            return None;
        }
        let top = self.top.get();
        // The region is MAX_ALIGN-aligned, so aligning the offset aligns the address. No
        // overflow: top <= isize::MAX, align <= 4096, size <= isize::MAX.
        let start = if align <= TOP_GRAIN { top } else { region::align_up(top, align) };
        let end = start + region::align_up(size, TOP_GRAIN);
        // Also refuses a top off the grain, which lies above `grain_end` (see the field):
        // then `start` needs no rounding for an alignment of 8 or less.
        if end > self.grain_end {
            return None;
        }
        // SAFETY: `start < end <= grain_end <= len`.
        let ptr = unsafe { self.region.at(start) };
        // SAFETY: `start..end` lies inside the region above the top: nobody references it.
        if cfg!(debug_assertions) && !unsafe { region::freed_intact(ptr, size) } {
            return None;
        }
        self.top.set(end);
        Some(ptr)
    }

    /// The checked path: zero-size requests, errors, and the debug fill check.
    #[cold]
    #[inline(never)]
    fn alloc_slow(&self, layout: Layout) -> Result<NonNull<u8>> {
        #[cfg(test)]
        tests::SLOW_CALLS.with(|c| c.set(c.get() + 1));
        let (size, align) = (layout.size(), layout.align());
        if align > MAX_ALIGN {
            return Err(self.failed(Error::UnsupportedAlignment { align, max: MAX_ALIGN }));
        }
        if size == 0 {
            return Ok(region::dangling(align));
        }
        let top = self.top.get();
        let start = region::align_up(top, align);
        let end = start + size;
        if end > self.region.len() {
            return Err(self.out_of_memory(end - top));
        }
        // SAFETY: `start <= end <= len`.
        let ptr = unsafe { self.region.at(start) };
        // SAFETY: `start..end` lies inside the region above the old top: nobody references it.
        if !unsafe { region::freed_intact(ptr, size) } {
            // SAFETY: as above.
            return Err(unsafe { self.corrupted(ptr, size) });
        }
        self.top.set(top_after(end, self.region.len()));
        Ok(ptr)
    }

    /// Copies `slice` onto the stack.
    ///
    /// # Panics
    ///
    /// As [`alloc`](Self::alloc).
    #[inline]
    #[track_caller]
    #[allow(clippy::mut_from_ref)] // like bumpalo: each call returns fresh, disjoint memory
    pub fn alloc_slice_copy<T: Copy>(&self, slice: &[T]) -> &mut [T] {
        let ptr = self.alloc_layout(Layout::for_value(slice)).cast::<T>();
        // SAFETY: `ptr` is fresh memory aligned for `T` and valid for `slice.len()` elements
        // (or dangling and aligned when the slice occupies no bytes); the source cannot
        // overlap it. The result lives as long as `&self` (see `try_alloc`).
        unsafe {
            ptr.as_ptr().copy_from_nonoverlapping(slice.as_ptr(), slice.len());
            std::slice::from_raw_parts_mut(ptr.as_ptr(), slice.len())
        }
    }

    /// The current top, to free back to later.
    ///
    /// # Examples
    ///
    /// ```
    /// let stack = mmobject::alloc::StackAllocator::with_capacity(64);
    /// assert_eq!(stack.marker().offset(), 0);
    /// ```
    #[inline]
    pub fn marker(&self) -> Marker {
        Marker { owner: self.id, end: 0, offset: self.top.get() }
    }

    /// Frees everything allocated after `marker` was taken.
    ///
    /// # Panics
    ///
    /// Panics with [`Error::InvalidMarker`]'s message if the marker came from another stack
    /// or lies above the current top.
    #[track_caller]
    pub fn free_to_marker(&mut self, marker: Marker) {
        shell::ok_or_fail(self.try_free_to_marker(marker))
    }

    /// Frees everything allocated after `marker` was taken.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidMarker`] if the marker came from another stack or lies above the
    /// current top (it was taken before an earlier `free_to_marker` to a lower marker).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{alloc::StackAllocator, Error};
    ///
    /// let mut a = StackAllocator::with_capacity(64);
    /// let b = StackAllocator::with_capacity(64);
    /// assert!(matches!(a.try_free_to_marker(b.marker()), Err(Error::InvalidMarker { .. })));
    /// ```
    pub fn try_free_to_marker(&mut self, marker: Marker) -> Result<()> {
        if marker.owner != self.id || marker.end != 0 {
            return Err(Error::InvalidMarker { reason: "the marker belongs to another stack" });
        }
        let top = self.top.get();
        if marker.offset > top {
            return Err(Error::InvalidMarker { reason: "the marker is above the top of the stack" });
        }
        // SAFETY: `marker.offset <= top`, just checked.
        unsafe { self.release(marker.offset, top) };
        Ok(())
    }

    /// Frees everything.
    pub fn reset(&mut self) {
        let top = self.top.get();
        // SAFETY: `0 <= top`, the stack's top.
        unsafe { self.release(0, top) };
    }

    /// Moves the top down from `top` to `to`, filling what it frees.
    ///
    /// # Safety
    ///
    /// `top` is the stack's top and `to <= top`.
    unsafe fn release(&mut self, to: usize, top: usize) {
        debug_assert!(to <= top && top == self.top.get(), "release moves the top down");
        self.peak.set(self.peak.get().max(top));
        // SAFETY: `to..top` is inside the region (`to <= top`, the caller's contract, and the
        // top is at most the region's length), and `&mut self` proves
        // no allocation in it is still borrowed.
        unsafe { region::fill_freed(self.region.at(to), top - to) };
        self.top.set(to);
    }

    /// A snapshot of the stack's usage.
    ///
    /// Everything is derived from the top: `in_use` is the top's offset, `peak` the highest
    /// top seen. Blocks are not counted one by one (that would cost a store on the bump
    /// path), so `live` and `allocations` are 0.
    pub fn stats(&self) -> AllocStats {
        let top = self.top.get();
        self.peak.set(self.peak.get().max(top));
        AllocStats {
            capacity: self.region.len(),
            in_use: top,
            peak: self.peak.get(),
            live: 0,
            allocations: 0,
            failures: self.failures.get(),
            fallbacks: 0,
        }
    }

    /// Grows `block` (the last block, of `old_size` bytes) in place to `new_size` bytes, if
    /// it is the last block on the stack, `new_align` divides its address, and the region
    /// has room. Returns the block, with the region's provenance, or `None`.
    #[inline]
    fn grow_last(&self, block: NonNull<u8>, old_size: usize, new_size: usize, new_align: usize) -> Option<NonNull<u8>> {
        let offset = (block.as_ptr() as usize).wrapping_sub(self.region.addr());
        let top = self.top.get();
        // A pointer from elsewhere gives a meaningless (wrapped) offset, which cannot end at
        // the top (rounded as `top_after` rounds) unless the pointer is this stack's last
        // block.
        let is_last =
            old_size != 0 && offset.checked_add(old_size).is_some_and(|end| top_after(end, self.region.len()) == top);
        // The region is only `MAX_ALIGN`-aligned: above that, an aligned offset is not an
        // aligned address.
        let aligned = new_align <= MAX_ALIGN && offset % new_align == 0;
        if !is_last || !aligned || new_size > self.region.len() - offset {
            return None;
        }
        let end = offset + new_size;
        // A growth within the block's rounding leaves the top where it is.
        if end > top {
            // SAFETY: `top..end` lies inside the region (`new_size <= len - offset` above)
            // above the top: nobody references it.
            if !unsafe { region::freed_intact(self.region.at(top), end - top) } {
                return None; // a stale write: leave it to `allocate`, which reports it
            }
            self.top.set(top_after(end, self.region.len()));
        }
        // SAFETY: `offset + new_size <= len` (checked above).
        Some(unsafe { self.region.at(offset) })
    }

    /// Whether `ptr` points into this stack's region.
    #[inline]
    pub fn contains(&self, ptr: NonNull<u8>) -> bool {
        self.region.contains(ptr.as_ptr() as usize)
    }

    /// The address of the region's first byte.
    #[inline]
    pub(crate) fn base_addr(&self) -> usize {
        self.region.addr()
    }

    /// A pointer (with the region's provenance) to `offset`, which must be `<= top`.
    ///
    /// # Panics
    ///
    /// Panics if `offset` is above the top (callers pass offsets of blocks they allocated,
    /// so it never does; the check keeps this safe function sound on its own).
    #[inline]
    pub(crate) fn pointer_at(&self, offset: usize) -> NonNull<u8> {
        assert!(offset <= self.top.get(), "offset {offset} above the top");
        // SAFETY: `offset <= top <= len`.
        unsafe { self.region.at(offset) }
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
        let available = self.region.len() - self.top.get();
        self.failed(Error::OutOfMemory { requested, available })
    }

    /// Refills and reports the `size` bytes at `ptr`, found written above the top.
    ///
    /// # Safety
    ///
    /// `ptr..ptr + size` lies in the region above the top (nobody references it).
    #[cold]
    #[inline(never)]
    unsafe fn corrupted(&self, ptr: NonNull<u8>, size: usize) -> Error {
        // SAFETY: the caller's contract.
        unsafe { region::fill_freed(ptr, size) };
        self.failed(region::use_after_free("StackAllocator", ptr.as_ptr() as usize))
    }
}

impl fmt::Debug for StackAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StackAllocator")
            .field("id", &self.id)
            .field("capacity", &self.region.len())
            .field("top", &self.top.get())
            .finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` returns a block above the top (from the region's pointer), which no other
//    live block overlaps, aligned as asked (`try_alloc_layout`).
// 2. Blocks stay valid until a `&mut self` call (`free_to_marker`, `reset`) or the drop of
//    the stack.
// 3. `try_free` touches no memory: individual blocks are not freed.
// 4. `grow_in_place` extends the last block into free bytes above the top (`grow_last`).
// 5. `shrink_in_place` keeps the block where it is, unchanged (a new block would only add
//    to the top).
// 6. `try_free` frees nothing, so it ignores layouts.
unsafe impl Shell for StackAllocator {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        self.try_alloc_layout(layout)
    }

    /// Individual blocks are not freed: memory comes back with `free_to_marker` or `reset`.
    /// A pointer that is neither in the region nor a zero-size block is
    /// [`Error::ForeignPointer`].
    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        if self.contains(ptr) || region::is_dangling(ptr) {
            return Ok(());
        }
        Err(Error::ForeignPointer { addr: ptr.as_ptr() as usize })
    }

    #[inline]
    unsafe fn grow_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        debug_assert!(new.size() >= old.size(), "grow to a smaller size");
        self.grow_last(ptr, old.size(), new.size(), new.align())
    }

    #[inline]
    unsafe fn shrink_in_place(&self, ptr: NonNull<u8>, _old: Layout, new: Layout) -> Option<NonNull<u8>> {
        // The block stays where it is, and so does the top: a marker taken above the block
        // stays valid (moving the top down through `&self` would put it above the top).
        ((ptr.as_ptr() as usize) % new.align() == 0).then_some(ptr)
    }
}

shell::impl_allocator!(StackAllocator);

#[cfg(test)]
mod tests {
    use super::*;
    use allocator_api2::alloc::Allocator;
    use proptest::prelude::*;

    thread_local! {
        /// How many times this thread entered `alloc_slow`.
        pub(super) static SLOW_CALLS: Cell<u32> = const { Cell::new(0) };
    }

    /// Issue 10: the fast path runs in debug builds too (it used to be compiled out under
    /// `debug_assertions`, so `cargo test` only ever ran the slow path), and the debug
    /// use-after-free check still reports through the slow path.
    #[test]
    fn ordinary_allocations_take_the_fast_path() {
        let mut s = StackAllocator::with_capacity(1024);
        let before = SLOW_CALLS.with(Cell::get);
        for i in 0..64u64 {
            assert_eq!(*s.alloc(i), i);
        }
        assert_eq!(SLOW_CALLS.with(Cell::get), before, "no slow-path call for ordinary requests");
        s.alloc(());
        assert!(s.try_alloc_layout(Layout::from_size_align(2048, 8).unwrap()).is_err());
        assert_eq!(SLOW_CALLS.with(Cell::get), before + 2, "zero size and out of memory go slow");
        s.reset();
        if cfg!(debug_assertions) {
            let p = s.alloc_layout(Layout::new::<u64>());
            s.reset();
            // SAFETY: the region is still allocated; this simulates a stale raw pointer.
            unsafe { p.as_ptr().write(7) };
            assert_eq!(s.try_alloc(0u64).unwrap_err(), Error::UseAfterFree { addr: p.as_ptr() as usize });
        }
    }

    /// Blocks of any size leave the top on the 8-byte grain, so a run of odd sizes stays on
    /// the fast path; each block starts on the grain and none overlaps the next.
    #[test]
    fn odd_sizes_keep_the_top_on_the_grain() {
        let s = StackAllocator::with_capacity(256);
        let before = SLOW_CALLS.with(Cell::get);
        let sizes = [1usize, 3, 2, 8, 5, 16, 7];
        let mut last_end = s.base_addr();
        for (i, &size) in sizes.iter().enumerate() {
            let p = s.alloc_layout(Layout::from_size_align(size, 1).unwrap()).as_ptr() as usize;
            assert_eq!(p % TOP_GRAIN, 0, "block {i} starts on the grain");
            assert!(p >= last_end, "block {i} overlaps the one before");
            last_end = p + size;
            assert_eq!(s.allocated_bytes() % TOP_GRAIN, 0);
        }
        assert_eq!(s.allocated_bytes(), 8 + 8 + 8 + 8 + 8 + 16 + 8);
        assert_eq!(SLOW_CALLS.with(Cell::get), before, "no slow-path call for odd sizes");
    }

    /// A region whose size is not a multiple of 8 is usable to its last byte: blocks that
    /// fit only without the rounding go through the slow path, exactly.
    #[test]
    fn a_region_off_the_grain_is_used_to_its_last_byte() {
        let s = StackAllocator::with_capacity(13);
        s.alloc(0u64);
        let a = s.alloc(1u8) as *mut u8 as usize;
        assert_eq!(s.allocated_bytes(), 9, "the rounded end would pass the region's end");
        let b = s.alloc(2u8) as *mut u8 as usize;
        let c = s.alloc(3u16) as *mut u16 as usize;
        let d = s.alloc(4u8) as *mut u8 as usize;
        assert_eq!([b - a, c - a, d - a], [1, 2, 4]);
        assert_eq!(s.allocated_bytes(), 13);
        assert_eq!(s.try_alloc(5u8), Err(Error::OutOfMemory { requested: 1, available: 0 }));
        let four = StackAllocator::with_capacity(4);
        assert_eq!(*four.alloc(7u32), 7);
    }

    /// The last block grows in place within its rounding (the top stays) and past it; a
    /// block with another after it does not.
    #[test]
    fn the_last_block_grows_within_and_past_its_rounding() {
        let s = StackAllocator::with_capacity(64);
        let one = |n| Layout::from_size_align(n, 1).unwrap();
        let a = (&s).allocate(one(5)).unwrap().cast::<u8>();
        assert_eq!(s.allocated_bytes(), 8);
        // SAFETY: `a` came from this allocator with the old layout.
        let grown = unsafe { (&s).grow(a, one(5), one(7)) }.unwrap().cast::<u8>();
        assert_eq!((grown, s.allocated_bytes()), (a, 8));
        // SAFETY: as above, with the layout it has now.
        let grown = unsafe { (&s).grow(a, one(7), one(12)) }.unwrap().cast::<u8>();
        assert_eq!((grown, s.allocated_bytes()), (a, 16));
        let b = (&s).allocate(one(3)).unwrap().cast::<u8>();
        // SAFETY: as above; `a` is no longer the last block, so it moves.
        let moved = unsafe { (&s).grow(a, one(12), one(14)) }.unwrap().cast::<u8>();
        assert_ne!(moved, a);
        assert!(moved.as_ptr() as usize > b.as_ptr() as usize);
    }

    #[test]
    fn markers_nest() {
        let mut s = StackAllocator::with_capacity(256);
        let m0 = s.marker();
        s.alloc(1u8);
        let m1 = s.marker();
        s.alloc(2u64);
        assert_eq!(s.allocated_bytes(), 16, "the byte's block ends on the 8-byte grain");
        s.free_to_marker(m1);
        assert_eq!(s.allocated_bytes(), 8);
        s.free_to_marker(m0);
        assert_eq!(s.allocated_bytes(), 0);
        // m1 is now above the top.
        assert_eq!(
            s.try_free_to_marker(m1),
            Err(Error::InvalidMarker { reason: "the marker is above the top of the stack" })
        );
        assert_eq!(s.stats().peak, 16);
    }

    #[test]
    #[should_panic(expected = "invalid marker: the marker belongs to another stack")]
    fn foreign_marker_panics() {
        let mut a = StackAllocator::with_capacity(16);
        let b = StackAllocator::with_capacity(16);
        a.free_to_marker(b.marker());
    }

    #[test]
    #[should_panic(expected = "out of memory: requested 16 bytes, 8 available")]
    fn out_of_memory_panics() {
        let s = StackAllocator::with_capacity(16);
        s.alloc(0u64);
        s.alloc([0u64; 2]);
    }

    #[test]
    fn alignment_and_zero_size() {
        let s = StackAllocator::with_capacity(3 * 4096);
        s.alloc(1u8);
        for align in [1, 2, 8, 64, 4096] {
            let p = s.alloc_layout(Layout::from_size_align(3, align).unwrap());
            assert_eq!(p.as_ptr() as usize % align, 0);
        }
        let z = s.alloc_layout(Layout::from_size_align(0, 256).unwrap());
        assert_eq!(z.as_ptr() as usize % 256, 0);
        let unit: &mut () = s.alloc(());
        *unit = ();
        assert_eq!(
            s.try_alloc_layout(Layout::from_size_align(1, 8192).unwrap()),
            Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
        );
        assert_eq!(s.stats().failures, 1);
    }

    #[test]
    #[should_panic(expected = "foreign free")]
    fn foreign_deallocate_panics() {
        let s = StackAllocator::with_capacity(16);
        let mut x = 0u64;
        // SAFETY: deliberately wrong; the stack detects it before touching the pointer.
        unsafe { (&s).deallocate(NonNull::from(&mut x).cast(), Layout::new::<u64>()) };
    }

    #[test]
    #[cfg(debug_assertions)]
    fn use_after_free_is_caught() {
        let mut s = StackAllocator::with_capacity(64);
        let p = s.alloc_layout(Layout::new::<u64>());
        s.reset();
        // SAFETY: the region is still allocated; this simulates a stale raw pointer.
        unsafe { p.as_ptr().write(7) };
        let err = s.try_alloc(0u64).unwrap_err();
        assert_eq!(err, Error::UseAfterFree { addr: p.as_ptr() as usize });
        assert!(s.try_alloc(0u64).is_ok(), "the block is refilled after the report");
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(usize, u32),
        Mark,
        FreeToMark(usize),
        Reset,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0usize..200, 0u32..8).prop_map(|(s, a)| Op::Alloc(s, a)),
            1 => Just(Op::Mark),
            1 => (0usize..8).prop_map(Op::FreeToMark),
            1 => Just(Op::Reset),
        ]
    }

    proptest! {
        #![proptest_config(crate::alloc::model_config())]
        #[test]
        fn model(
            ops in proptest::collection::vec(op(), 0..if cfg!(miri) { 20 } else { 100 }),
            // Sizes off the 8-byte grain too, so the region's last bytes are used.
            capacity in 2040usize..2056,
        ) {
            let mut s = StackAllocator::with_capacity(capacity);
            // Model: live blocks (addr, len, fill byte) and the markers (with block counts).
            let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
            let mut marks: Vec<(Marker, usize)> = Vec::new();
            for (n, op) in ops.into_iter().enumerate() {
                match op {
                    Op::Alloc(size, a) => {
                        let align = 1usize << a;
                        let layout = Layout::from_size_align(size, align).unwrap();
                        let top = s.allocated_bytes();
                        // Where the block goes if it fits: the rounding of ends to the
                        // grain costs nothing else.
                        let start = region::align_up(top, align);
                        match s.try_alloc_layout(layout) {
                            Ok(p) => {
                                let addr = p.as_ptr() as usize;
                                prop_assert_eq!(addr % align, 0);
                                if size > 0 {
                                    prop_assert_eq!(addr - s.base_addr(), start);
                                    let end = start + size;
                                    prop_assert!(s.allocated_bytes() == region::align_up(end, TOP_GRAIN)
                                        || s.allocated_bytes() == end);
                                    prop_assert!(s.allocated_bytes() <= capacity);
                                    for &(b, l, _) in &live {
                                        let b = b.as_ptr() as usize;
                                        prop_assert!(addr >= b + l || addr + size <= b, "overlap");
                                    }
                                    // SAFETY: fresh block of `size` bytes.
                                    unsafe { p.as_ptr().write_bytes(n as u8, size) };
                                    live.push((p, size, n as u8));
                                }
                            }
                            Err(Error::OutOfMemory { .. }) => {
                                prop_assert!(start + size > capacity, "refused a block that fits");
                            }
                            Err(e) => prop_assert!(false, "unexpected {e}"),
                        }
                    }
                    Op::Mark => marks.push((s.marker(), live.len())),
                    Op::FreeToMark(i) => {
                        if let Some(&(m, count)) = marks.get(i) {
                            let r = s.try_free_to_marker(m);
                            if m.offset() <= s.allocated_bytes() {
                                prop_assert!(r.is_ok());
                                live.truncate(count);
                                marks.retain(|(mm, _)| mm.offset() <= m.offset());
                            } else {
                                prop_assert!(r.is_err());
                            }
                        }
                    }
                    Op::Reset => { s.reset(); live.clear(); marks.clear(); }
                }
                for &(b, l, fill) in &live {
                    // SAFETY: the model's live blocks are still allocated and initialised.
                    let bytes = unsafe { std::slice::from_raw_parts(b.as_ptr(), l) };
                    prop_assert!(bytes.iter().all(|&x| x == fill), "contents changed");
                }
                let st = s.stats();
                prop_assert!(st.in_use <= st.capacity && st.in_use <= st.peak);
            }
        }
    }
}
