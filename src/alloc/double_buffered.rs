//! [`DoubleBufferedAllocator`]: data made in frame *i* is readable in frame *i + 1*, and
//! provably unreachable afterwards.
//!
//! See the type's docs for the design choice.

use std::alloc::Layout;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use super::shell::{self, Shell};

use super::region;
use super::stack::next_stack_id;
use super::{AllocStats, StackAllocator};
use crate::{Error, Result};

/// A checked reference to a value in a [`DoubleBufferedAllocator`], valid in the frame it was
/// made and the next one.
///
/// It is a plain token (no borrow), so it can be stored in game state across the swap.
///
/// **Variance.** Invariant in `T`: a `FrameRef<T>` gives mutable access
/// ([`DoubleBufferedAllocator::try_get_mut`]), so a covariant one would let a copy coerced
/// to `FrameRef<&'short U>` write a short-lived reference that the original then reads back
/// as `&'static U`.
///
/// **Threads.** `Send` and `Sync` for every `T`: it holds no pointer and no `T`, only a
/// number, and reading through it needs the allocator, which only stores `T: Send` values
/// behind `FrameRef`s and is not `Sync`.
pub struct FrameRef<T> {
    owner: u64,
    frame: u64,
    offset: usize,
    /// `fn(T) -> T`: invariant in `T` (see above); a function pointer is `Send + Sync` and
    /// owns no `T`, which is right for a token.
    _type: PhantomData<fn(T) -> T>,
}

impl<T> FrameRef<T> {
    /// The frame the value was allocated in.
    pub fn frame(&self) -> u64 {
        self.frame
    }
}

impl<T> Clone for FrameRef<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for FrameRef<T> {}

impl<T> fmt::Debug for FrameRef<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrameRef")
            .field("type", &std::any::type_name::<T>())
            .field("owner", &self.owner)
            .field("frame", &self.frame)
            .field("offset", &self.offset)
            .finish()
    }
}

/// Two frame buffers used alternately: what frame *i* writes, frame *i + 1* can read.
///
/// # The choice: generation-checked references
///
/// Frame *i* allocates into buffer `i % 2`. [`swap`](Self::swap) starts
/// frame *i + 1*: it resets buffer `(i + 1) % 2`, which held frame *i − 1*'s data, and leaves
/// frame *i*'s data alone.
///
/// Data is reached in two ways, and neither can read a reused buffer:
///
/// - [`alloc`](Self::alloc) returns a [`FrameRef<T>`]: a copyable token
///   holding the frame number and offset, not a pointer. [`get`](Self::get)
///   checks the frame number: a token from the current or the previous frame is valid; an
///   older one (its buffer has been reset) gives [`Error::StaleFrameRef`]. So a stale read is
///   *checked*, at run time, at the cost of one comparison.
/// - [`alloc_mut`](Self::alloc_mut) and the `Allocator` impl return
///   plain references and blocks tied to `&self`; `swap` takes `&mut self`, so the borrow
///   checker ends them at the swap (see `tests/ui/alloc/double_buffered_swap.rs`). That is
///   *impossible*, at compile time, but only lasts one frame.
///
/// The references `get` returns borrow the allocator, so they too end at the next `swap`.
///
/// Values are never dropped (as in [`FrameAllocator`](super::FrameAllocator)).
///
/// **Threads.** `Send`, not `Sync`. Values stored behind a [`FrameRef`] must be `Send`:
/// a `FrameRef` is not tied to a borrow, so after the allocator moves to another thread the
/// value can still be reached there through the `FrameRef` (an `Rc` cloned on the old thread
/// and again on the new one would race on its count). Values from
/// [`alloc_mut`](Self::alloc_mut) and the `Allocator` impl need no bound: they are reachable
/// only through borrows of the allocator, which end before it can move.
///
/// # Examples
///
/// ```
/// use mmobject::{alloc::DoubleBufferedAllocator, Error};
///
/// let mut buffers = DoubleBufferedAllocator::with_capacity(4096);
/// // Frame 0: an async job writes its result.
/// let result = buffers.alloc([1.0f32, 2.0, 3.0]);
/// buffers.swap();
/// // Frame 1: the result is still readable.
/// assert_eq!(buffers.get(result)[1], 2.0);
/// buffers.swap();
/// // Frame 2: its buffer has been reused.
/// assert!(matches!(buffers.try_get(result), Err(Error::StaleFrameRef { frame: 0, .. })));
/// ```
pub struct DoubleBufferedAllocator {
    buffers: [StackAllocator; 2],
    /// The current frame; it allocates into `buffers[frame % 2]`.
    frame: u64,
    id: u64,
    /// The most bytes both buffers held at once, as of the last `swap` (the stats fold in
    /// the current use). Both tops only grow between two swaps, so the sum peaks just
    /// before a swap resets one of them: the buffers' own peaks, taken apart, would add up
    /// frames that were never live together.
    peak: Cell<usize>,
}

impl DoubleBufferedAllocator {
    /// Creates the allocator with two buffers of `bytes` bytes each.
    ///
    /// # Panics
    ///
    /// Panics if `bytes` is larger than `isize::MAX - 4096`.
    pub fn with_capacity(bytes: usize) -> DoubleBufferedAllocator {
        DoubleBufferedAllocator {
            buffers: [StackAllocator::with_capacity(bytes), StackAllocator::with_capacity(bytes)],
            frame: 0,
            id: next_stack_id(),
            peak: Cell::new(0),
        }
    }

    #[inline]
    fn current(&self) -> &StackAllocator {
        &self.buffers[(self.frame % 2) as usize]
    }

    /// The current frame number (swaps so far).
    #[inline]
    pub fn frame(&self) -> u64 {
        self.frame
    }

    /// Moves `value` into the current frame's buffer and returns a checked reference to it.
    /// It is never dropped. `T` must be `Send` (see the type's docs on threads).
    ///
    /// # Panics
    ///
    /// Panics with [`Error::OutOfMemory`]'s message if the buffer is full, or
    /// [`Error::UnsupportedAlignment`]'s if `T` is aligned to more than 4096.
    #[inline]
    #[track_caller]
    pub fn alloc<T: Send>(&self, value: T) -> FrameRef<T> {
        shell::ok_or_fail(self.try_alloc(value))
    }

    /// Moves `value` into the current frame's buffer, or fails if it is full.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`] (the value is dropped) or [`Error::UnsupportedAlignment`].
    ///
    /// # Examples
    ///
    /// ```
    /// let buffers = mmobject::alloc::DoubleBufferedAllocator::with_capacity(4);
    /// assert!(buffers.try_alloc(1u64).is_err());
    /// ```
    pub fn try_alloc<T: Send>(&self, value: T) -> Result<FrameRef<T>> {
        let current = self.current();
        let value = current.try_alloc(value)?;
        let addr = value as *mut T as usize;
        // A ZST lives at a dangling address; record offset 0 and rebuild a dangling pointer.
        let offset = if size_of::<T>() == 0 { 0 } else { addr - current.base_addr() };
        Ok(FrameRef { owner: self.id, frame: self.frame, offset, _type: PhantomData })
    }

    /// Moves `value` into the current frame's buffer and returns a plain reference, which
    /// ends at the next [`swap`](Self::swap).
    ///
    /// # Panics
    ///
    /// As [`alloc`](Self::alloc).
    #[inline]
    #[track_caller]
    pub fn alloc_mut<T>(&self, value: T) -> &mut T {
        self.current().alloc(value)
    }

    /// Reads a value from the current or the previous frame.
    ///
    /// # Panics
    ///
    /// Panics with [`Error::StaleFrameRef`]'s message if the reference is older than the
    /// previous frame, or comes from another allocator.
    #[inline]
    #[track_caller]
    pub fn get<T>(&self, r: FrameRef<T>) -> &T {
        shell::ok_or_fail(self.try_get(r))
    }

    /// Reads a value from the current or the previous frame.
    ///
    /// # Errors
    ///
    /// [`Error::StaleFrameRef`] if the reference is older than the previous frame (its buffer
    /// has been reused) or comes from another allocator.
    pub fn try_get<T>(&self, r: FrameRef<T>) -> Result<&T> {
        let ptr = self.locate(r)?;
        // SAFETY: `locate` checked that `r` came from this allocator and that its buffer has not
        // been reset since `alloc` wrote a `T` at this aligned offset; shared access only, and
        // the mutable access (`get_mut`) needs `&mut self`.
        Ok(unsafe { &*ptr.as_ptr() })
    }

    /// Mutable access to a value from the current or the previous frame.
    ///
    /// # Errors
    ///
    /// As [`try_get`](Self::try_get).
    pub fn try_get_mut<T>(&mut self, r: FrameRef<T>) -> Result<&mut T> {
        let ptr = self.locate(r)?;
        // SAFETY: as in `try_get`, and `&mut self` rules out any other reference into the
        // buffers (all of them borrow `self`).
        Ok(unsafe { &mut *ptr.as_ptr() })
    }

    fn locate<T>(&self, r: FrameRef<T>) -> Result<NonNull<T>> {
        let fresh = r.frame == self.frame || r.frame + 1 == self.frame;
        if r.owner != self.id || !fresh {
            return Err(Error::StaleFrameRef { frame: r.frame, owner: r.owner, current: self.frame });
        }
        if size_of::<T>() == 0 {
            return Ok(NonNull::dangling());
        }
        let buffer = &self.buffers[(r.frame % 2) as usize];
        debug_assert!(r.offset + size_of::<T>() <= buffer.allocated_bytes(), "frame ref beyond the top");
        Ok(buffer.pointer_at(r.offset).cast())
    }

    /// Ends the current frame: the buffer holding the frame before it is reset and becomes the
    /// new current buffer.
    pub fn swap(&mut self) {
        self.peak.set(self.peak.get().max(self.in_use()));
        self.frame += 1;
        let next = (self.frame % 2) as usize;
        self.buffers[next].reset();
    }

    /// Bytes allocated in the current frame.
    pub fn allocated_bytes(&self) -> usize {
        self.current().allocated_bytes()
    }

    /// Bytes allocated in both buffers (the current frame's and the previous one's).
    fn in_use(&self) -> usize {
        self.buffers[0].allocated_bytes() + self.buffers[1].allocated_bytes()
    }

    /// Usage of both buffers together (capacity counts both; `peak` is the most bytes the
    /// two held at once).
    pub fn stats(&self) -> AllocStats {
        let (a, b) = (self.buffers[0].stats(), self.buffers[1].stats());
        AllocStats {
            capacity: a.capacity + b.capacity,
            in_use: a.in_use + b.in_use,
            peak: self.peak.get().max(a.in_use + b.in_use),
            live: a.live + b.live,
            allocations: a.allocations + b.allocations,
            failures: a.failures + b.failures,
            fallbacks: 0,
        }
    }
}

impl fmt::Debug for DoubleBufferedAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DoubleBufferedAllocator").field("frame", &self.frame).field("buffers", &self.buffers).finish()
    }
}

// SAFETY: `Shell` contract: allocates from the current buffer through the stack's
// implementation. Buffers are only reset by `swap(&mut self)` (or the drop), so blocks stay
// valid while `&DoubleBufferedAllocator` is borrowed; frees touch no memory; the current
// buffer grows a block in place only if it is that buffer's last block.
unsafe impl Shell for DoubleBufferedAllocator {
    #[inline]
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        self.current().try_alloc_layout(layout)
    }

    /// Individual blocks are not freed; a pointer from neither buffer (and not a zero-size
    /// block) is [`Error::ForeignPointer`].
    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        if self.buffers.iter().any(|b| b.contains(ptr)) || region::is_dangling(ptr) {
            return Ok(());
        }
        Err(Error::ForeignPointer { addr: ptr.as_ptr() as usize })
    }

    #[inline]
    unsafe fn grow_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        // SAFETY: forwarded contract: a block of the previous frame's buffer is never the
        // current buffer's last block, so it is left to the copying path.
        unsafe { Shell::grow_in_place(self.current(), ptr, old, new) }
    }

    #[inline]
    unsafe fn shrink_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        // SAFETY: forwarded contract: the stack keeps any block where it is and touches no
        // memory, so the block may be of either buffer.
        unsafe { Shell::shrink_in_place(self.current(), ptr, old, new) }
    }
}

shell::impl_allocator!(DoubleBufferedAllocator);

#[cfg(test)]
mod tests {
    use super::*;
    use allocator_api2::alloc::Allocator;
    use proptest::prelude::*;

    #[test]
    fn lifetimes_of_frame_refs() {
        let mut d = DoubleBufferedAllocator::with_capacity(256);
        let a = d.alloc(1u32);
        let unit = d.alloc(());
        assert_eq!(*d.get(a), 1);
        d.swap();
        let b = d.alloc(2u32);
        *d.try_get_mut(a).unwrap() += 10;
        assert_eq!((*d.get(a), *d.get(b)), (11, 2));
        d.get(unit);
        d.swap();
        assert_eq!(d.try_get(a), Err(Error::StaleFrameRef { frame: 0, owner: a.owner, current: 2 }));
        assert_eq!(*d.get(b), 2);
        let other = DoubleBufferedAllocator::with_capacity(16);
        assert!(other.try_get(b).is_err());
    }

    #[test]
    #[should_panic(expected = "stale frame reference")]
    fn stale_get_panics() {
        let mut d = DoubleBufferedAllocator::with_capacity(64);
        let a = d.alloc(1u8);
        d.swap();
        d.swap();
        d.get(a);
    }

    #[test]
    fn buffers_alternate() {
        let mut d = DoubleBufferedAllocator::with_capacity(16);
        d.alloc([0u8; 16]);
        assert!(d.try_alloc(0u8).is_err(), "current buffer full");
        d.swap();
        d.alloc([0u8; 16]); // the other buffer
        d.swap();
        d.alloc([0u8; 16]); // the first one again, reset
        assert_eq!(d.stats().capacity, 32);
    }

    /// The peak is the most both buffers held at once: a busy frame 0 and a busy frame 3
    /// were never live together, though each buffer's own peak saw one of them (the sum of
    /// those, 200 here, was reported).
    #[test]
    fn peak_counts_frames_live_together() {
        let mut d = DoubleBufferedAllocator::with_capacity(256);
        for bytes in [100, 10, 10, 100] {
            d.current().alloc_layout(Layout::from_size_align(bytes, 1).unwrap());
            d.swap();
        }
        // Each block's end is rounded to 8 bytes: 100 takes 104, 10 takes 16.
        assert_eq!(d.stats().in_use, 104, "frame 3's bytes: frame 4 has none yet");
        assert_eq!(d.stats().peak, 120);
        d.alloc([0u8; 120]);
        assert_eq!(d.stats().peak, 224, "the current frame's use counts before any swap");
    }

    #[test]
    #[should_panic(expected = "foreign free")]
    fn foreign_deallocate_panics() {
        let a = DoubleBufferedAllocator::with_capacity(16);
        let mut x = 0u64;
        // SAFETY: deliberately wrong; the allocator detects it before touching the pointer.
        unsafe { (&a).deallocate(NonNull::from(&mut x).cast(), Layout::new::<u64>()) };
    }

    proptest! {
        #![proptest_config(crate::alloc::model_config())]
        #[test]
        fn model(frames in proptest::collection::vec(proptest::collection::vec(any::<u64>(), 0..10),
                                                     0..if cfg!(miri) { 4 } else { 12 })) {
            let mut d = DoubleBufferedAllocator::with_capacity(512);
            let mut all: Vec<(FrameRef<u64>, u64, u64)> = Vec::new();
            for (frame, values) in frames.into_iter().enumerate() {
                let frame = frame as u64;
                for v in values {
                    all.push((d.alloc(v), v, frame));
                }
                for &(r, v, made) in &all {
                    let got = d.try_get(r).copied();
                    if made + 1 >= frame { prop_assert_eq!(got, Ok(v)); } else { prop_assert!(got.is_err()); }
                }
                d.swap();
            }
        }
    }
}
