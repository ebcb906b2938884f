//! [`FrameAllocator`]: a single-frame scratch allocator, reset once per frame.

use std::alloc::Layout;
use std::fmt;
use std::ptr::NonNull;

use super::shell::{self, Shell};

use super::{AllocStats, StackAllocator};
use crate::Result;

/// A single-frame allocator: bump-allocate during a frame, [`reset`](Self::reset) at its end.
///
/// This is a [`StackAllocator`] with one marker, the bottom. Allocation costs a bump and a
/// compare.
///
/// **Borrowing.** [`alloc`](Self::alloc) takes `&self` and returns a reference tied to that
/// borrow; [`reset`](Self::reset) takes `&mut self`. So frame data cannot be kept past the
/// reset: the borrow checker rejects it (see `tests/ui/alloc/frame_reset.rs`). To keep data
/// for one more frame, use a [`DoubleBufferedAllocator`](super::DoubleBufferedAllocator).
///
/// **Drop.** Values are never dropped, as in bumpalo: `reset` reclaims the memory without
/// running destructors. This keeps `reset` O(1) (O(used bytes) in debug builds, which refill
/// freed memory). A value that owns heap memory (a `String`, a `Vec`) leaks that memory.
///
/// **Threads.** `Send`, not `Sync`. Use one per thread.
///
/// # Examples
///
/// ```
/// use mmobject::alloc::FrameAllocator;
///
/// let mut frame = FrameAllocator::with_capacity(64 * 1024);
/// for n in 0..3 {
///     let visible = frame.alloc_slice_copy(&[1u32, 2, 3]);
///     visible[0] = n;
///     let label = frame.alloc_str("frame");
///     assert_eq!(label, "frame");
///     frame.reset();
/// }
/// assert_eq!(frame.frame(), 3);
/// ```
pub struct FrameAllocator {
    stack: StackAllocator,
    /// Frames completed (resets so far).
    frame: u64,
}

impl FrameAllocator {
    /// Creates a frame allocator over a preallocated region of `bytes` bytes.
    ///
    /// # Panics
    ///
    /// Panics if `bytes` is larger than `isize::MAX - 4096`.
    pub fn with_capacity(bytes: usize) -> FrameAllocator {
        FrameAllocator { stack: StackAllocator::with_capacity(bytes), frame: 0 }
    }

    /// Moves `value` into this frame's memory. It is never dropped.
    ///
    /// # Panics
    ///
    /// Panics with [`Error::OutOfMemory`](crate::Error::OutOfMemory)'s message if the frame is
    /// full, or [`Error::UnsupportedAlignment`](crate::Error::UnsupportedAlignment)'s if `T` is
    /// aligned to more than 4096.
    ///
    /// # Examples
    ///
    /// ```
    /// let frame = mmobject::alloc::FrameAllocator::with_capacity(64);
    /// let v = frame.alloc([0.5f32; 3]);
    /// assert_eq!(v[2], 0.5);
    /// ```
    #[inline(always)]
    #[track_caller]
    pub fn alloc<T>(&self, value: T) -> &mut T {
        self.stack.alloc(value)
    }

    /// Moves `value` into this frame's memory, or fails if the frame is full.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`](crate::Error::OutOfMemory) if the frame is full (the value is
    /// dropped); [`Error::UnsupportedAlignment`](crate::Error::UnsupportedAlignment) if `T` is
    /// aligned to more than 4096.
    ///
    /// # Examples
    ///
    /// ```
    /// let frame = mmobject::alloc::FrameAllocator::with_capacity(4);
    /// assert!(frame.try_alloc(1u64).is_err());
    /// ```
    #[inline]
    pub fn try_alloc<T>(&self, value: T) -> Result<&mut T> {
        self.stack.try_alloc(value)
    }

    /// Copies `slice` into this frame's memory.
    ///
    /// # Panics
    ///
    /// As [`alloc`](Self::alloc).
    #[inline]
    #[track_caller]
    pub fn alloc_slice_copy<T: Copy>(&self, slice: &[T]) -> &mut [T] {
        self.stack.alloc_slice_copy(slice)
    }

    /// Copies `s` into this frame's memory.
    ///
    /// # Panics
    ///
    /// As [`alloc`](Self::alloc).
    ///
    /// # Examples
    ///
    /// ```
    /// let frame = mmobject::alloc::FrameAllocator::with_capacity(64);
    /// let s = frame.alloc_str("hello");
    /// s.make_ascii_uppercase();
    /// assert_eq!(s, "HELLO");
    /// ```
    #[inline]
    #[track_caller]
    #[allow(clippy::mut_from_ref)] // like bumpalo: each call returns fresh, disjoint memory
    pub fn alloc_str(&self, s: &str) -> &mut str {
        let bytes = self.stack.alloc_slice_copy(s.as_bytes());
        // SAFETY: the bytes were copied from a `str`, so they are valid UTF-8.
        unsafe { std::str::from_utf8_unchecked_mut(bytes) }
    }

    /// Reserves an uninitialised block for `layout`.
    ///
    /// # Errors
    ///
    /// As [`try_alloc`](Self::try_alloc), plus [`Error::UseAfterFree`](crate::Error::UseAfterFree)
    /// in debug builds if a stale pointer wrote to the memory after a reset.
    #[inline]
    pub fn try_alloc_layout(&self, layout: Layout) -> Result<NonNull<u8>> {
        self.stack.try_alloc_layout(layout)
    }

    /// Frees everything allocated this frame and starts the next one.
    #[inline]
    pub fn reset(&mut self) {
        self.stack.reset();
        self.frame += 1;
    }

    /// The number of completed frames (resets).
    #[inline]
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// Bytes allocated this frame (including alignment padding and the rounding of each
    /// block to 8 bytes).
    #[inline]
    pub fn allocated_bytes(&self) -> usize {
        self.stack.allocated_bytes()
    }

    /// The region's size in bytes.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.stack.capacity()
    }

    /// A snapshot of the allocator's usage; `peak` is the busiest frame so far.
    pub fn stats(&self) -> AllocStats {
        self.stack.stats()
    }
}

impl fmt::Debug for FrameAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameAllocator")
            .field("frame", &self.frame)
            .field("capacity", &self.capacity())
            .field("allocated", &self.allocated_bytes())
            .finish()
    }
}

// SAFETY: `Shell` contract: forwards to the inner stack, whose guarantees hold here: memory
// is only reclaimed by `reset(&mut self)` or the drop.
unsafe impl Shell for FrameAllocator {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        self.stack.try_alloc_layout(layout)
    }

    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Shell::try_free(&self.stack, ptr) }
    }

    #[inline]
    unsafe fn grow_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        // SAFETY: forwarded contract: the block came from the inner stack.
        unsafe { Shell::grow_in_place(&self.stack, ptr, old, new) }
    }

    #[inline]
    unsafe fn shrink_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        // SAFETY: forwarded contract: the block came from the inner stack.
        unsafe { Shell::shrink_in_place(&self.stack, ptr, old, new) }
    }
}

shell::impl_allocator!(FrameAllocator);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;
    use allocator_api2::alloc::Allocator;
    use proptest::prelude::*;

    #[test]
    fn reset_reclaims_everything() {
        let mut f = FrameAllocator::with_capacity(128);
        for _ in 0..10 {
            for i in 0..16u64 {
                f.alloc(i);
            }
            assert!(f.try_alloc(0u8).is_err());
            f.reset();
        }
        assert_eq!(f.frame(), 10);
        let st = f.stats();
        assert_eq!((st.peak, st.in_use, st.allocations, st.failures), (128, 0, 0, 10));
    }

    #[test]
    fn slices_strings_and_zero_size() {
        let f = FrameAllocator::with_capacity(256);
        let empty: &mut [u64] = f.alloc_slice_copy(&[]);
        assert!(empty.is_empty());
        assert_eq!(f.alloc_str(""), "");
        let s = f.alloc_slice_copy(&[1u16, 2, 3]);
        assert_eq!(s, &[1, 2, 3]);
        assert_eq!(f.allocated_bytes(), 8, "6 bytes, rounded to the 8-byte grain");
        assert_eq!(
            f.try_alloc_layout(Layout::from_size_align(1, 1 << 13).unwrap()),
            Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
        );
    }

    #[test]
    fn never_drops() {
        struct CountsDrops<'a>(&'a std::cell::Cell<u32>);
        impl Drop for CountsDrops<'_> {
            fn drop(&mut self) {
                self.0.set(self.0.get() + 1);
            }
        }
        let drops = std::cell::Cell::new(0);
        let mut f = FrameAllocator::with_capacity(256);
        f.alloc(CountsDrops(&drops));
        f.reset();
        assert_eq!(drops.get(), 0, "documented: values are never dropped");
    }

    #[test]
    #[should_panic(expected = "foreign free")]
    fn foreign_deallocate_panics() {
        let a = FrameAllocator::with_capacity(16);
        let mut x = 0u64;
        // SAFETY: deliberately wrong; the allocator detects it before touching the pointer.
        unsafe { (&a).deallocate(NonNull::from(&mut x).cast(), Layout::new::<u64>()) };
    }

    proptest! {
        #![proptest_config(crate::alloc::model_config())]
        #[test]
        fn model(frames in proptest::collection::vec(
            proptest::collection::vec((1usize..100, 0u32..7), 0..20), 0..if cfg!(miri) { 3 } else { 10 })) {
            let mut f = FrameAllocator::with_capacity(1024);
            for frame in frames {
                let mut live: Vec<(&mut [u8], u8)> = Vec::new();
                let mut used = 0;
                for (i, (size, a)) in frame.into_iter().enumerate() {
                    let align = 1usize << a;
                    match f.try_alloc_layout(Layout::from_size_align(size, align).unwrap()) {
                        Ok(p) => {
                            prop_assert_eq!(p.as_ptr() as usize % align, 0);
                            // SAFETY: a fresh block of `size` bytes, borrowed from `f` until reset.
                            let block = unsafe {
                                p.as_ptr().write_bytes(i as u8, size);
                                std::slice::from_raw_parts_mut(p.as_ptr(), size)
                            };
                            used += size;
                            live.push((block, i as u8));
                        }
                        Err(Error::OutOfMemory { .. }) => {}
                        Err(e) => prop_assert!(false, "unexpected {e}"),
                    }
                }
                for (block, fill) in &live {
                    prop_assert!(block.iter().all(|b| b == fill));
                }
                prop_assert!(f.allocated_bytes() >= used);
                drop(live);
                f.reset();
                prop_assert_eq!(f.allocated_bytes(), 0);
            }
        }
    }
}
