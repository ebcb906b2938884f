//! [`Pool<T>`]: a typed, fixed-capacity pool of `T` with stable addresses.

use std::alloc::Layout;
use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use super::shell::{self, Shell};

use super::region::{self, Region, MAX_ALIGN};
use super::AllocStats;
use crate::{Error, Result};

/// One slot: a value while occupied, the free-list link while free.
#[repr(C)]
union Slot<T> {
    value: ManuallyDrop<T>,
    next: u32,
}

/// A marker type that makes its user invariant in `T` and adds no auto-trait bound.
type Invariant<T> = fn(T) -> T;

/// End of the free list.
const NIL: u32 = u32::MAX;

/// A typed pool: `n` slots of `T` in one preallocated region, a free list threaded through
/// the free slots, and a bitmap (one bit per slot) that catches double frees.
///
/// - [`alloc`](Self::alloc) moves a value in and returns a [`PoolBox`], which drops the value
///   and frees the slot when it goes out of scope. The value never moves: its address is
///   stable until it is freed.
/// - For manual lifetimes, [`PoolBox::into_raw`] gives the pointer, and
///   [`free`](Self::free)/[`try_free`](Self::try_free) take it back; a pointer from elsewhere
///   ([`Error::ForeignPointer`]), into the middle of a slot ([`Error::NotBlockStart`]) or to a
///   free slot ([`Error::DoubleFree`]) is reported.
/// - Overhead per slot: `size_of::<Slot<T>>() - size_of::<T>()` (padding up to 4 bytes when
///   `T` is smaller than the `u32` link) plus one bit.
/// - **Threads**: `Send` when `T` is, not `Sync` (the free list is in `Cell`s). Use one pool
///   per thread, or put it in a `Mutex`.
/// - **Drop**: values still in the pool (leaked with `into_raw`) are dropped, and reported
///   with `log::warn!`.
///
/// **Variance.** Invariant in `T`: values go in through `&self`, so a covariant pool would
/// let `&Pool<Foo<'static>>` be used as `&Pool<Foo<'short>>`, insert a value borrowing a
/// local, and drop it later as a `Foo<'static>`.
///
/// Invariants:
/// 1. Slots `fresh..capacity` have never been used; the free list links slots below `fresh`
///    through `Slot::next`.
/// 2. Bit `i` of `occupied` is set exactly when slot `i` is handed out (holding a value, or
///    raw memory through the `Allocator` impl).
/// 3. Bit `i` of `values` is set exactly when slot `i` holds an initialised `T` written by
///    [`try_alloc`](Self::try_alloc); it implies bit `i` of `occupied`. Only those slots are
///    dropped by the pool's drop: a slot handed out through the `Allocator` impl holds raw
///    bytes, and may outlive its borrow of the pool if its owner was leaked with `mem::forget`.
///
/// # Examples
///
/// ```
/// use mmobject::alloc::Pool;
///
/// #[derive(Debug)]
/// struct Particle { pos: [f32; 3], life: f32 }
///
/// let pool = Pool::with_capacity(1000);
/// let mut p = pool.alloc(Particle { pos: [0.0; 3], life: 1.0 });
/// p.life -= 0.5;
/// assert_eq!(pool.len(), 1);
/// drop(p);
/// assert_eq!(pool.len(), 0);
/// ```
pub struct Pool<T> {
    region: Region,
    capacity: u32,
    head: Cell<u32>,
    fresh: Cell<u32>,
    /// One bit per slot: handed out (invariant 2).
    occupied: Box<[Cell<u64>]>,
    /// One bit per slot: holds a `T` (invariant 3).
    values: Box<[Cell<u64>]>,
    live: Cell<usize>,
    peak: Cell<usize>,
    allocations: Cell<u64>,
    failures: Cell<u64>,
    /// `T`: the pool owns `T`s (drop check), and is `Send` only when `T` is.
    /// `fn(T) -> T`: invariant in `T`, because values are inserted through `&self` (see the
    /// type's docs); a function pointer adds no auto-trait bound of its own.
    _values: PhantomData<(T, Invariant<T>)>,
}

impl<T> Pool<T> {
    const SLOT: usize = size_of::<Slot<T>>();

    /// Creates a pool with room for `n` values.
    ///
    /// # Panics
    ///
    /// Panics if `n >= u32::MAX`, if the region would overflow, or if `T` is aligned to more
    /// than 4096.
    pub fn with_capacity(n: usize) -> Pool<T> {
        assert!(n < NIL as usize, "a pool holds fewer than u32::MAX values");
        assert!(align_of::<Slot<T>>() <= MAX_ALIGN, "Pool<T> supports alignment up to 4096");
        let bytes = Self::SLOT.checked_mul(n).expect("pool region too large");
        Pool {
            region: Region::new(bytes),
            capacity: n as u32,
            head: Cell::new(NIL),
            fresh: Cell::new(0),
            occupied: (0..n.div_ceil(64)).map(|_| Cell::new(0)).collect(),
            values: (0..n.div_ceil(64)).map(|_| Cell::new(0)).collect(),
            live: Cell::new(0),
            peak: Cell::new(0),
            allocations: Cell::new(0),
            failures: Cell::new(0),
            _values: PhantomData,
        }
    }

    /// How many values the pool can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// How many slots are handed out.
    #[inline]
    pub fn len(&self) -> usize {
        self.live.get()
    }

    /// Whether no slot is handed out.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.live.get() == 0
    }

    /// Moves `value` into a free slot.
    ///
    /// # Panics
    ///
    /// Panics with [`Error::OutOfMemory`]'s message if the pool is full.
    #[inline]
    #[track_caller]
    pub fn alloc(&self, value: T) -> PoolBox<'_, T> {
        shell::ok_or_fail(self.try_alloc(value))
    }

    /// Moves `value` into a free slot, or fails if the pool is full.
    ///
    /// # Errors
    ///
    /// [`Error::OutOfMemory`] if every slot is taken (the value is dropped); in debug builds
    /// [`Error::UseAfterFree`] if the slot about to be reused was written after it was freed.
    ///
    /// # Examples
    ///
    /// ```
    /// let pool = mmobject::alloc::Pool::with_capacity(1);
    /// let a = pool.try_alloc(1u8).unwrap();
    /// assert!(pool.try_alloc(2u8).is_err());
    /// ```
    #[inline]
    pub fn try_alloc(&self, value: T) -> Result<PoolBox<'_, T>> {
        let index = self.take()?;
        let slot = self.slot(index).cast::<T>();
        // SAFETY: a slot handed out just now: aligned for `T` (slots are `Slot<T>`-aligned,
        // repr(C) puts `value` at offset 0) and unreferenced.
        unsafe { slot.as_ptr().write(value) };
        flip(&self.values, index); // invariant 3: the slot now holds a `T`
        Ok(PoolBox { pool: self, ptr: slot })
    }

    /// Takes a slot off the free list (or the never-used tail), marks it occupied and
    /// returns its index.
    #[inline]
    fn take(&self) -> Result<u32> {
        let head = self.head.get();
        let index = if head != NIL {
            let slot = self.slot(head);
            // SAFETY: a free slot's first 4 bytes hold its link (invariant).
            let next = unsafe { slot.cast::<u32>().as_ptr().read() };
            // SAFETY: the slot is free; bytes after the link hold the debug fill.
            let intact = unsafe { region::freed_intact(slot.add(4), Self::SLOT - 4) };
            if !(next == NIL || next < self.fresh.get()) || self.is_occupied(head) || !intact {
                return Err(self.corrupted(head, next));
            }
            self.head.set(next);
            head
        } else if self.fresh.get() < self.capacity {
            self.fresh.set(self.fresh.get() + 1);
            self.fresh.get() - 1
        } else {
            return Err(self.out_of_memory());
        };
        self.toggle(index);
        let live = self.live.get() + 1;
        self.live.set(live);
        self.peak.set(self.peak.get().max(live));
        self.allocations.set(self.allocations.get() + 1);
        Ok(index)
    }

    /// Puts a slot back (after checking it) without touching its value.
    fn release(&self, ptr: NonNull<u8>) -> Result<u32> {
        let index = self.index_of(ptr)?;
        if !self.is_occupied(index) {
            return Err(Error::DoubleFree { addr: ptr.as_ptr() as usize });
        }
        self.toggle(index);
        if bit(&self.values, index) {
            // Invariant 3: whatever `T` was there is now forgotten (a raw `deallocate` of a
            // value slot leaks the value; `try_free` has moved it out already).
            flip(&self.values, index);
        }
        let slot = self.slot(index);
        // SAFETY: the slot was handed out and its owner gave it back; it is `SLOT >= 4`
        // bytes, aligned to at least 4.
        unsafe {
            region::fill_freed(slot, Self::SLOT);
            slot.cast::<u32>().as_ptr().write(self.head.get());
        }
        self.head.set(index);
        self.live.set(self.live.get() - 1);
        Ok(index)
    }

    fn index_of(&self, ptr: NonNull<u8>) -> Result<u32> {
        let addr = ptr.as_ptr() as usize;
        if !self.region.contains(addr) {
            return Err(Error::ForeignPointer { addr });
        }
        let offset = addr - self.region.addr();
        if offset % Self::SLOT != 0 {
            return Err(Error::NotBlockStart { addr, block_start: addr - offset % Self::SLOT });
        }
        Ok((offset / Self::SLOT) as u32)
    }

    /// Slot `index`'s first byte.
    ///
    /// # Panics
    ///
    /// Panics if `index` is not a slot (callers pass indices of slots, so it never does; the
    /// check keeps this safe function sound on its own).
    #[inline]
    fn slot(&self, index: u32) -> NonNull<u8> {
        assert!(index < self.capacity, "slot {index} out of range");
        // SAFETY: `index < capacity`, and the region holds `capacity` slots of `SLOT` bytes.
        unsafe { self.region.at(index as usize * Self::SLOT) }
    }

    #[inline]
    fn is_occupied(&self, index: u32) -> bool {
        bit(&self.occupied, index)
    }

    #[inline]
    fn toggle(&self, index: u32) {
        flip(&self.occupied, index);
    }

    /// Drops the value at `ptr` and frees its slot.
    ///
    /// # Panics
    ///
    /// Panics with the message of the error [`try_free`](Self::try_free) would return.
    ///
    /// # Safety
    ///
    /// As [`try_free`](Self::try_free).
    #[track_caller]
    pub unsafe fn free(&self, ptr: NonNull<T>) {
        // SAFETY: forwarded contract.
        shell::ok_or_fail(unsafe { self.try_free(ptr) })
    }

    /// Drops the value at `ptr` (from [`PoolBox::into_raw`]) and frees its slot.
    ///
    /// # Errors
    ///
    /// [`Error::ForeignPointer`], [`Error::NotBlockStart`] or [`Error::DoubleFree`]; the value
    /// is not touched on error.
    ///
    /// # Safety
    ///
    /// Bad pointers of those three kinds are caught, and so is a slot handed out as raw memory
    /// through the `Allocator` impl (reported as [`Error::ForeignPointer`]: it holds no `T`).
    /// If `ptr` is a slot holding a `T`, the caller must own that value (it came from
    /// [`PoolBox::into_raw`]) and must not use it afterwards.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::{alloc::{Pool, PoolBox}, Error};
    ///
    /// let pool = Pool::with_capacity(4);
    /// let raw = PoolBox::into_raw(pool.alloc(String::from("kept")));
    /// // SAFETY: `raw` came from this pool; the second free is caught.
    /// unsafe {
    ///     pool.free(raw);
    ///     assert!(matches!(pool.try_free(raw), Err(Error::DoubleFree { .. })));
    /// }
    /// ```
    pub unsafe fn try_free(&self, ptr: NonNull<T>) -> Result<()> {
        let index = self.index_of(ptr.cast())?;
        if !self.is_occupied(index) {
            return Err(Error::DoubleFree { addr: ptr.as_ptr() as usize });
        }
        if !bit(&self.values, index) {
            return Err(Error::ForeignPointer { addr: ptr.as_ptr() as usize });
        }
        // SAFETY: the slot holds a `T` (invariant 3) that the caller owns (contract). It is
        // read through the pool's own pointer, whose provenance covers the whole slot. Move
        // it out first, then free the slot, so a panicking `Drop` leaves the pool consistent.
        let value = unsafe { self.slot(index).cast::<T>().as_ptr().read() };
        self.release(ptr.cast()).expect("checked above");
        drop(value);
        Ok(())
    }

    /// A snapshot of the usage (`in_use` counts whole slots).
    pub fn stats(&self) -> AllocStats {
        AllocStats {
            capacity: self.region.len(),
            in_use: self.live.get() * Self::SLOT,
            peak: self.peak.get() * Self::SLOT,
            live: self.live.get(),
            allocations: self.allocations.get(),
            failures: self.failures.get(),
            fallbacks: 0,
        }
    }

    #[cold]
    #[inline(never)]
    fn out_of_memory(&self) -> Error {
        self.failures.set(self.failures.get() + 1);
        Error::OutOfMemory { requested: Self::SLOT, available: 0 }
    }

    #[cold]
    #[inline(never)]
    fn corrupted(&self, index: u32, next: u32) -> Error {
        let slot = self.slot(index);
        if (next == NIL || next < self.fresh.get()) && !self.is_occupied(index) {
            // SAFETY: the slot is free: refill after the (sound) link.
            unsafe { region::fill_freed(slot.add(4), Self::SLOT - 4) };
        } else {
            self.head.set(NIL); // never follow a corrupt link
        }
        self.failures.set(self.failures.get() + 1);
        region::use_after_free("Pool", slot.as_ptr() as usize)
    }
}

impl<T> Drop for Pool<T> {
    fn drop(&mut self) {
        let live = self.live.get();
        if live == 0 {
            return;
        }
        log::warn!(
            "Pool<{}> dropped with {live} value(s) still in it (leaked; dropping them now)",
            std::any::type_name::<T>()
        );
        for index in 0..self.fresh.get() {
            if bit(&self.values, index) {
                flip(&self.values, index);
                // SAFETY: invariant 3: the slot holds an initialised `T`, and nobody can use it
                // any more (the pool is being dropped, so no `PoolBox` borrows it). Slots
                // handed out through the `Allocator` impl hold raw bytes and have no bit in
                // `values`, so they are skipped even when a leaked collection still owns one.
                unsafe { self.slot(index).cast::<T>().as_ptr().drop_in_place() };
            }
        }
    }
}

/// Bit `index` of a bitmap.
#[inline]
fn bit(bits: &[Cell<u64>], index: u32) -> bool {
    bits[(index / 64) as usize].get() & (1 << (index % 64)) != 0
}

/// Flips bit `index` of a bitmap.
#[inline]
fn flip(bits: &[Cell<u64>], index: u32) {
    let word = &bits[(index / 64) as usize];
    word.set(word.get() ^ (1 << (index % 64)));
}

impl<T> fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("type", &std::any::type_name::<T>())
            .field("capacity", &self.capacity)
            .field("len", &self.live.get())
            .finish()
    }
}

// SAFETY: `Shell` contract:
// 1. `try_alloc` hands out a whole slot (from the region's pointer), only when the layout
//    fits in it (size and alignment), to nobody else until it comes back through `try_free`.
// 2. Slots stay valid until `try_free` or the pool's drop (which needs it unborrowed).
// 3. `try_free` (`release`) checks range, slot start and the occupied bit before touching
//    memory, and then writes only through the region's pointer.
// 4. `grow_in_place` returns the slot itself (through the region's pointer) when the new
//    layout fits in it: its bytes past the old size were the block's already.
// 5. `shrink_in_place` returns the block itself, when its address suits the new alignment.
// 6. `try_free` (`release`) frees a slot by its address.
unsafe impl<T> Shell for Pool<T> {
    fn try_alloc(&self, layout: Layout) -> Result<NonNull<u8>> {
        let slot_align = align_of::<Slot<T>>();
        if layout.align() > slot_align {
            self.failures.set(self.failures.get() + 1);
            return Err(Error::UnsupportedAlignment { align: layout.align(), max: slot_align });
        }
        if layout.size() > Self::SLOT {
            self.failures.set(self.failures.get() + 1);
            return Err(Error::OutOfMemory { requested: layout.size(), available: Self::SLOT });
        }
        Ok(self.slot(self.take()?))
    }

    #[inline]
    unsafe fn try_free(&self, ptr: NonNull<u8>) -> Result<()> {
        self.release(ptr).map(drop)
    }

    /// Every slot is the same size: a smaller block would be another whole slot, so the
    /// block stays where it is (if its address suits the new alignment).
    #[inline]
    unsafe fn shrink_in_place(&self, ptr: NonNull<u8>, _old: Layout, new: Layout) -> Option<NonNull<u8>> {
        ((ptr.as_ptr() as usize) % new.align() == 0).then_some(ptr)
    }

    /// A block grows within its slot: the slot's spare bytes are the block's already.
    #[inline]
    unsafe fn grow_in_place(&self, ptr: NonNull<u8>, _old: Layout, new: Layout) -> Option<NonNull<u8>> {
        if new.size() > Self::SLOT || (ptr.as_ptr() as usize) % new.align() != 0 {
            return None;
        }
        // The caller's pointer may cover only the bytes it asked for: hand back the pool's
        // own pointer to the slot, which covers all of it.
        Some(self.slot(self.index_of(ptr).ok()?))
    }
}

shell::impl_allocator!(<T> Pool<T>);

/// An owning pointer to a value in a [`Pool`]; drops the value and frees the slot when it
/// goes out of scope.
///
/// Covariant in `'pool` (it may be held for a shorter borrow of its pool), invariant in `T`
/// (it borrows a `Pool<T>`, which is). Neither `Send` nor `Sync`: it borrows a pool, which
/// is not `Sync`.
pub struct PoolBox<'pool, T> {
    pool: &'pool Pool<T>,
    /// Points at an occupied slot of `pool` holding an initialised `T` owned by this box.
    ptr: NonNull<T>,
}

impl<T> PoolBox<'_, T> {
    /// Gives up ownership: the value stays in the pool until [`Pool::free`] (or the pool's
    /// drop).
    pub fn into_raw(this: Self) -> NonNull<T> {
        let this = ManuallyDrop::new(this);
        this.ptr
    }
}

impl<T> Deref for PoolBox<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        // SAFETY: the box owns an initialised `T` in an occupied slot (field invariant).
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for PoolBox<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes the access unique.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> Drop for PoolBox<'_, T> {
    fn drop(&mut self) {
        // SAFETY: the box owns the value in an occupied slot of `pool`; it is freed once.
        unsafe { self.pool.free(self.ptr) }
    }
}

impl<T: fmt::Debug> fmt::Debug for PoolBox<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::rc::Rc;

    #[test]
    fn addresses_are_stable_and_reused() {
        let pool = Pool::with_capacity(3);
        let a = pool.alloc([1u64; 4]);
        let addr = &*a as *const _ as usize;
        let b = pool.alloc([2u64; 4]);
        drop(a);
        let c = pool.alloc([3u64; 4]);
        assert_eq!(&*c as *const _ as usize, addr, "LIFO reuse");
        assert_eq!((b[0], c[0]), (2, 3));
        let _d = pool.alloc([4u64; 4]);
        assert!(matches!(pool.try_alloc([0; 4]), Err(Error::OutOfMemory { .. })));
        let st = pool.stats();
        assert_eq!((st.live, st.allocations, st.failures, st.in_use), (3, 4, 1, 96));
    }

    #[test]
    fn drops_exactly_once() {
        let counter = Rc::new(());
        let pool = Pool::with_capacity(4);
        let a = pool.alloc(Rc::clone(&counter));
        let raw = PoolBox::into_raw(pool.alloc(Rc::clone(&counter)));
        let _leaked = PoolBox::into_raw(pool.alloc(Rc::clone(&counter)));
        assert_eq!(Rc::strong_count(&counter), 4);
        drop(a);
        // SAFETY: `raw` is ours, freed once.
        unsafe { pool.free(raw) };
        assert_eq!(Rc::strong_count(&counter), 2);
        drop(pool); // drops the leaked one (and warns)
        assert_eq!(Rc::strong_count(&counter), 1);
    }

    #[test]
    fn bad_frees() {
        let pool: Pool<u64> = Pool::with_capacity(4);
        let raw = PoolBox::into_raw(pool.alloc(5));
        let mut local = 0u64;
        let local = NonNull::from(&mut local);
        // SAFETY: bad frees are caught before any value is touched; `raw` is ours.
        unsafe {
            assert_eq!(pool.try_free(local), Err(Error::ForeignPointer { addr: local.as_ptr() as usize }));
            let inside = raw.cast::<u8>().add(4).cast::<u64>();
            assert_eq!(
                pool.try_free(inside),
                Err(Error::NotBlockStart { addr: raw.as_ptr() as usize + 4, block_start: raw.as_ptr() as usize })
            );
            pool.free(raw);
            assert_eq!(pool.try_free(raw), Err(Error::DoubleFree { addr: raw.as_ptr() as usize }));
        }
    }

    #[test]
    fn zero_sized_values() {
        let pool = Pool::with_capacity(2);
        let a = pool.alloc(());
        let b = pool.alloc(());
        assert_ne!(&*a as *const (), &*b as *const (), "each ZST gets its own 4-byte slot");
        assert!(pool.try_alloc(()).is_err());
    }

    #[test]
    #[cfg(debug_assertions)]
    fn use_after_free_is_caught() {
        let pool: Pool<u64> = Pool::with_capacity(2);
        let raw = PoolBox::into_raw(pool.alloc(1));
        // SAFETY: a write through a stale pointer (the bug under test) into pool memory.
        unsafe {
            pool.free(raw);
            raw.cast::<u32>().add(1).as_ptr().write(9);
        }
        assert_eq!(pool.try_alloc(2).map(|_| ()), Err(Error::UseAfterFree { addr: raw.as_ptr() as usize }));
        assert_eq!(pool.len(), 0);
        assert!(pool.try_alloc(3).is_ok());
    }

    proptest! {
        #![proptest_config(crate::alloc::model_config())]
        #[test]
        fn model(ops in proptest::collection::vec((any::<bool>(), any::<u32>(), any::<usize>()),
                                                  0..if cfg!(miri) { 30 } else { 200 })) {
            let pool: Pool<(u32, u64)> = Pool::with_capacity(16);
            let mut live: Vec<(PoolBox<'_, (u32, u64)>, u32)> = Vec::new();
            for (alloc, value, pick) in ops {
                if alloc || live.is_empty() {
                    match pool.try_alloc((value, value as u64 * 3)) {
                        Ok(b) => {
                            let addr = &*b as *const _ as usize;
                            prop_assert_eq!(addr % align_of::<(u32, u64)>(), 0);
                            prop_assert!(live.iter().all(|(o, _)| &**o as *const _ as usize != addr));
                            live.push((b, value));
                        }
                        Err(_) => prop_assert_eq!(live.len(), 16),
                    }
                } else {
                    let (b, v) = live.swap_remove(pick % live.len());
                    prop_assert_eq!(*b, (v, v as u64 * 3));
                }
                prop_assert_eq!(pool.len(), live.len());
                for (b, v) in &live {
                    prop_assert_eq!(b.0, *v);
                }
            }
        }
    }
}
