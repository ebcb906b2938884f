//! The shell every allocator shares: the [`Shell`] trait (the untyped `try_alloc` /
//! `try_free` pair, with the panicking forms provided), the one `unsafe impl Allocator for &X`
//! (the [`impl_allocator!`] macro, with its one SAFETY argument), and the one cold failure
//! path ([`fail`], reached through [`ok_or_fail`]).

use std::alloc::Layout;
use std::ptr::NonNull;

use crate::{Error, Result};

/// An allocator's untyped calls, from which [`impl_allocator!`] builds its `Allocator` impl.
///
/// # Safety
///
/// The `Allocator` impl the macro writes is sound only if the implementation guarantees:
///
/// 1. A block from `try_alloc(layout)` is valid for reads and writes of `layout.size()`
///    bytes, aligned to `layout.align()`, carries provenance over those bytes, and overlaps
///    no other live block.
/// 2. It stays valid until `try_free` takes it back, or until a call through `&mut self` or
///    the allocator's drop; neither can happen while a `&Self` (the `Allocator`) is
///    borrowed.
/// 3. `try_free` of a pointer that is not a live block of this allocator either returns an
///    error or does nothing, and in both cases touches no memory through that pointer.
///    `free_fast` of such a pointer returns `false` and touches no memory through it; it
///    returns `true` only for a live block, which it has freed.
/// 4. A block from `grow_in_place(ptr, old, new)` is `ptr`'s block itself, grown: valid for
///    `new.size()` bytes, aligned to `new.align()`, its first `old.size()` bytes unchanged,
///    and live as in 1 and 2.
/// 5. A block from `shrink_in_place(ptr, old, new)` is `ptr`'s block itself, shrunk: valid
///    for `new.size()` bytes, aligned to `new.align()`, its first `new.size()` bytes
///    unchanged, and live as in 1 and 2.
/// 6. `try_free` frees a block by its address alone, whatever layout it was last known by
///    (so a block kept in place by a shrink is freed whole).
pub(crate) unsafe trait Shell {
    /// Allocates a block for `layout`.
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>>;

    /// Frees a block with every check (for the stacks: checks that it is theirs; they free
    /// by marker). The pools reach it only after [`free_fast`](Self::free_fast) declined.
    ///
    /// # Safety
    ///
    /// If `ptr` is a live block of this allocator, the caller owns it and does not use it
    /// afterwards.
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()>;

    /// The common case of a free, inlined into every free: frees `ptr` and returns `true`,
    /// or returns `false` having changed nothing, and [`try_free`](Self::try_free) then does
    /// the whole checked free. It builds no error and calls nothing, so a caller's fast path
    /// needs no stack frame. Allocators without such a path keep the default, `false`.
    ///
    /// # Safety
    ///
    /// As [`try_free`](Self::try_free).
    #[inline(always)]
    unsafe fn free_fast(&self, ptr: NonNull<u8>) -> bool {
        let _ = ptr;
        false
    }

    /// Grows `ptr`'s block in place if the allocator can, or returns `None`.
    ///
    /// # Safety
    ///
    /// `ptr` is a live block of this allocator allocated for `old`, and
    /// `new.size() >= old.size()`.
    #[inline]
    unsafe fn grow_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        let _ = (ptr, old, new);
        None
    }

    /// Shrinks `ptr`'s block in place if the allocator prefers that to moving it (the stacks:
    /// a new block would only add to the top; a `Pool`: every slot is the same size), or
    /// returns `None` to try a smaller block first.
    ///
    /// # Safety
    ///
    /// `ptr` is a live block of this allocator allocated for `old`, and
    /// `new.size() <= old.size()`.
    #[inline]
    unsafe fn shrink_in_place(&self, ptr: NonNull<u8>, old: Layout, new: Layout) -> Option<NonNull<u8>> {
        let _ = (ptr, old, new);
        None
    }

    /// [`try_alloc`](Self::try_alloc), panicking with the error's message.
    #[inline]
    #[track_caller]
    fn alloc(&self, layout: Layout) -> NonNull<u8> {
        ok_or_fail(self.try_alloc(layout))
    }

    /// [`free_fast`](Self::free_fast), else [`try_free`](Self::try_free) out of line,
    /// panicking with the error's message.
    ///
    /// # Safety
    ///
    /// As [`try_free`](Self::try_free).
    #[inline]
    #[track_caller]
    unsafe fn free(&self, ptr: NonNull<u8>) {
        // SAFETY: forwarded contract.
        if !unsafe { self.free_fast(ptr) } {
            // SAFETY: forwarded contract.
            free_cold(move || unsafe { self.try_free(ptr) });
        }
    }
}

/// The value of `result`, or a panic with its error's message: the body of every plain
/// (non-`try_`) call.
#[inline]
#[track_caller]
pub(crate) fn ok_or_fail<T>(result: Result<T>) -> T {
    match result {
        Ok(value) => value,
        Err(error) => fail(error),
    }
}

/// [`Shell::free_fast`], else [`Shell::try_free`]: a free with every check, whose common
/// case is inlined. The body of the pools' public `try_free`, and of `deallocate`.
///
/// # Safety
///
/// As [`Shell::try_free`].
#[inline(always)]
pub(crate) unsafe fn try_free_fast_first<S: Shell + ?Sized>(shell: &S, ptr: NonNull<u8>) -> Result<()> {
    // SAFETY: forwarded contract.
    if unsafe { shell.free_fast(ptr) } {
        Ok(())
    } else {
        // SAFETY: forwarded contract.
        unsafe { shell.try_free(ptr) }
    }
}

/// The half of [`Shell::free`] that `free_fast` left: `checked_free`, the whole checked
/// free, then a panic on its error. Out of line and called last, so the fast path needs no
/// stack frame.
#[inline(never)]
#[track_caller]
fn free_cold(checked_free: impl FnOnce() -> Result<()>) {
    ok_or_fail(checked_free())
}

/// The error for a free of `addr` that is no live block, for allocators that keep a ledger:
/// a double free if `addr` was freed recently, a free inside a block if the nearest live
/// block below it, `(start, size)`, covers it, and a foreign pointer otherwise.
pub(crate) fn bad_free(addr: usize, freed_recently: bool, below: Option<(usize, usize)>) -> Error {
    match below {
        _ if freed_recently => Error::DoubleFree { addr },
        Some((start, size)) if addr < start + size => Error::NotBlockStart { addr, block_start: start },
        _ => Error::ForeignPointer { addr },
    }
}

/// The block a zero-size request of `layout` gets: a dangling pointer aligned for it, if
/// its alignment is at most [`MAX_ALIGN`](super::region::MAX_ALIGN) (so that
/// [`is_dangling`](super::region::is_dangling) knows it on the way back); `None` for any
/// other request.
#[inline]
pub(crate) fn zero_size_block(layout: Layout) -> Option<NonNull<[u8]>> {
    if layout.size() != 0 || layout.align() > super::region::MAX_ALIGN {
        return None;
    }
    let dangling = NonNull::new(std::ptr::without_provenance_mut::<u8>(layout.align()))?;
    Some(NonNull::slice_from_raw_parts(dangling, 0))
}

/// A `deallocate` the allocator refused: ignored if it is a zero-size value's dangling
/// pointer aligned above [`MAX_ALIGN`](super::region::MAX_ALIGN) (`allocator_api2`'s `Box`
/// and `Vec` make one up at the alignment's address without asking, and give it back all
/// the same), and otherwise a panic with the error's message.
#[cold]
#[inline(never)]
#[track_caller]
pub(crate) fn free_refused(ptr: NonNull<u8>, layout: Layout, error: Error) {
    if layout.size() == 0 && ptr.as_ptr() as usize == layout.align() {
        return;
    }
    fail(error)
}

/// The one failure path: panics with the error's message.
#[cold]
#[inline(never)]
#[track_caller]
pub(crate) fn fail(error: Error) -> ! {
    panic!("{error}")
}

/// Implements `allocator_api2::alloc::Allocator` for `&X`, where `X:` [`Shell`].
///
/// `deallocate` panics with the error's message on a bad free (a foreign pointer, not a
/// block start, a double free), except for a zero-size value's dangling pointer (see
/// [`free_refused`]); `grow` grows in place when [`Shell::grow_in_place`] can,
/// and otherwise allocates, copies and frees. `shrink` shrinks in place when
/// [`Shell::shrink_in_place`] prefers to, and otherwise moves the contents to a smaller
/// block; when there is no room for one it keeps the block where it is (if its address
/// suits the new alignment), so a shrink never fails for want of room (the failed request
/// is still counted in `failures`).
///
/// Zero-size requests (alignment up to [`MAX_ALIGN`](super::region::MAX_ALIGN)) get a
/// dangling, aligned pointer and no block, as `Global` does, and freeing one does nothing:
/// `allocator_api2`'s `Box` frees zero-size values too, and its `Vec` keeps whatever a
/// shrink to zero returns without ever freeing it (a real block there leaked).
macro_rules! impl_allocator {
    (<$($param:ident $(: $bound:path)?),+> $ty:ty) => {
        $crate::alloc::shell::impl_allocator!(@impl [$($param $(: $bound)?),+] $ty);
    };
    ($ty:ty) => {
        $crate::alloc::shell::impl_allocator!(@impl [] $ty);
    };
    (@impl [$($generics:tt)*] $ty:ty) => {
        // SAFETY: `Allocator`'s requirements follow from `Shell`'s contract (`shell.rs`):
        // 1. `allocate` returns `try_alloc`'s block, valid, aligned and unshared (Shell 1).
        // 2. A block stays valid until `deallocate` or until the allocator is dropped or
        //    reset through `&mut`, which cannot happen while this `&X` is borrowed (Shell 2);
        //    `grow` returns the same block grown (Shell 4) or a new block that holds the old
        //    contents, and frees the old one only after the copy.
        //    `shrink` returns the same block shrunk (Shell 5), the block itself unchanged
        //    when its address suits the new alignment (it is valid for `old.size() >=
        //    new.size()` bytes and is freed by address whatever its layout, Shell 6), or a
        //    new block as `grow` does.
        // 3. Copies of `&X` are the same allocator, so a block may be freed through any.
        unsafe impl<$($generics)*> ::allocator_api2::alloc::Allocator for &$ty {
            #[inline]
            fn allocate(
                &self,
                layout: ::std::alloc::Layout,
            ) -> ::core::result::Result<::std::ptr::NonNull<[u8]>, ::allocator_api2::alloc::AllocError> {
                if let Some(empty) = $crate::alloc::shell::zero_size_block(layout) {
                    return Ok(empty);
                }
                match $crate::alloc::shell::Shell::try_alloc(*self, layout) {
                    Ok(p) => Ok(::std::ptr::NonNull::slice_from_raw_parts(p, layout.size())),
                    Err(_) => Err(::allocator_api2::alloc::AllocError),
                }
            }

            /// Panics with the error's message on a bad free.
            #[inline]
            unsafe fn deallocate(&self, ptr: ::std::ptr::NonNull<u8>, layout: ::std::alloc::Layout) {
                if $crate::alloc::region::is_dangling(ptr) {
                    return; // a zero-size block: nothing was allocated
                }
                // SAFETY: the `Allocator` contract: `ptr` is a live block of this allocator,
                // not used again.
                if let Err(error) = unsafe { $crate::alloc::shell::try_free_fast_first(*self, ptr) } {
                    $crate::alloc::shell::free_refused(ptr, layout, error);
                }
            }

            #[inline]
            unsafe fn grow(
                &self,
                ptr: ::std::ptr::NonNull<u8>,
                old: ::std::alloc::Layout,
                new: ::std::alloc::Layout,
            ) -> ::core::result::Result<::std::ptr::NonNull<[u8]>, ::allocator_api2::alloc::AllocError> {
                if $crate::alloc::region::is_dangling(ptr) {
                    // A zero-size block: nothing to keep.
                    return ::allocator_api2::alloc::Allocator::allocate(self, new);
                }
                // SAFETY: the `Allocator` contract: `ptr` is a live block allocated for `old`,
                // and `new.size() >= old.size()`.
                if let Some(p) = unsafe { $crate::alloc::shell::Shell::grow_in_place(*self, ptr, old, new) } {
                    return Ok(::std::ptr::NonNull::slice_from_raw_parts(p, new.size()));
                }
                let block = ::allocator_api2::alloc::Allocator::allocate(self, new)?;
                // SAFETY: `ptr` is live for `old.size()` bytes and the new block is fresh
                // memory of at least that many, so they do not overlap; `ptr` is freed once,
                // after the copy, and not used again.
                unsafe {
                    block.cast::<u8>().as_ptr().copy_from_nonoverlapping(ptr.as_ptr(), old.size());
                    ::allocator_api2::alloc::Allocator::deallocate(self, ptr, old);
                }
                Ok(block)
            }

            #[inline]
            unsafe fn shrink(
                &self,
                ptr: ::std::ptr::NonNull<u8>,
                old: ::std::alloc::Layout,
                new: ::std::alloc::Layout,
            ) -> ::core::result::Result<::std::ptr::NonNull<[u8]>, ::allocator_api2::alloc::AllocError> {
                if new.size() != 0 {
                    // SAFETY: the `Allocator` contract: `ptr` is a live block allocated for
                    // `old`, and `new.size() <= old.size()`.
                    if let Some(p) = unsafe { $crate::alloc::shell::Shell::shrink_in_place(*self, ptr, old, new) } {
                        return Ok(::std::ptr::NonNull::slice_from_raw_parts(p, new.size()));
                    }
                }
                match ::allocator_api2::alloc::Allocator::allocate(self, new) {
                    Ok(block) => {
                        // SAFETY: `ptr` is live for `old.size() >= new.size()` bytes and the new
                        // block is fresh (or empty), so they do not overlap; `ptr` is freed
                        // once, after the copy, and not used again.
                        unsafe {
                            block.cast::<u8>().as_ptr().copy_from_nonoverlapping(ptr.as_ptr(), new.size());
                            ::allocator_api2::alloc::Allocator::deallocate(self, ptr, old);
                        }
                        Ok(block)
                    }
                    // No room for a smaller block: this one, kept where it is, serves (Shell 6).
                    Err(_) if new.size() != 0 && (ptr.as_ptr() as usize) % new.align() == 0 => {
                        Ok(::std::ptr::NonNull::slice_from_raw_parts(ptr, new.size()))
                    }
                    Err(error) => Err(error),
                }
            }
        }
    };
}

pub(crate) use impl_allocator;
