//! The tracker's own storage: a spin lock, a growable array and an open-addressing map,
//! all over memory from [`std::alloc::System`].
//!
//! Nothing here goes through the global allocator, so the tracker can keep its tables
//! while it is itself the global allocator ([`TrackingAllocator`](super::TrackingAllocator))
//! without ever re-entering itself. The containers hold `Copy` values only, so they never
//! run user code (no `Drop`) while a lock is held.
//!
//! These use `std` atomics directly rather than `crate::sync`: the tracker must be
//! constructible in a `static` (for `Tracker::global()`), and loom's atomics are not `const`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::UnsafeCell;
use std::fmt;
use std::marker::PhantomData;
use std::mem::{size_of, MaybeUninit};
use std::ops::{Deref, DerefMut};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};

/// A test-and-test-and-set lock that never allocates.
///
/// Invariant: `value` is only accessed through a [`SpinGuard`], and at most one guard
/// exists at a time (`locked` is `true` exactly while one exists).
pub(crate) struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: the lock hands out access to `value` to one thread at a time, so sharing the
// lock is sharing a `T` by moving access between threads, which needs `T: Send` only.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    /// A new, unlocked lock.
    pub(crate) const fn new(value: T) -> Self {
        Self { locked: AtomicBool::new(false), value: UnsafeCell::new(value) }
    }

    /// Takes the lock, spinning (then yielding) while another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
        if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
            self.lock_slow();
        }
        SpinGuard { lock: self, _not_send: PhantomData }
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.locked.load(Ordering::Relaxed) {
                if spins < 100 {
                    std::hint::spin_loop();
                    spins += 1;
                } else {
                    std::thread::yield_now();
                }
            }
            if self.locked.compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                return;
            }
        }
    }
}

impl<T> fmt::Debug for SpinLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpinLock").field("locked", &self.locked.load(Ordering::Relaxed)).finish_non_exhaustive()
    }
}

/// Exclusive access to a [`SpinLock`]'s value; unlocks on drop.
pub(crate) struct SpinGuard<'a, T> {
    /// Covariant in `'a` and invariant in `T` (through `SpinLock<T>`'s `UnsafeCell`), as a
    /// `MutexGuard` is: the guard gives `&mut T`.
    lock: &'a SpinLock<T>,
    /// `*const ()`: `!Send` and `!Sync`, like std's `MutexGuard`: a guard stays on the
    /// thread that locked (it never needs to move); it adds no variance of its own.
    _not_send: PhantomData<*const ()>,
}

impl<T> Deref for SpinGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: a guard exists only while `locked` is held by this thread (see the
        // `SpinLock` invariant), so no other reference to `value` exists.
        unsafe { &*self.lock.value.get() }
    }
}

impl<T> DerefMut for SpinGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`; `&mut self` makes this the only access through the guard.
        unsafe { &mut *self.lock.value.get() }
    }
}

impl<T> Drop for SpinGuard<'_, T> {
    fn drop(&mut self) {
        self.lock.locked.store(false, Ordering::Release);
    }
}

/// A growable array of `Copy` values in `System` memory.
///
/// Invariants: `ptr` is dangling when `cap == 0`, otherwise it was allocated by `System`
/// with `Layout::array::<T>(cap)`; the first `len <= cap` elements are initialised.
pub(crate) struct SysVec<T: Copy> {
    ptr: NonNull<T>,
    len: usize,
    cap: usize,
}

// SAFETY: `SysVec` owns its elements like a `Vec<T>` does, and its raw pointer is its own
// allocation; so it may move to another thread exactly when `T: Send` (an `Rc` inside is
// refused by that bound).
unsafe impl<T: Copy + Send> Send for SysVec<T> {}

impl<T: Copy> SysVec<T> {
    /// An empty array; allocates nothing.
    pub(crate) const fn new() -> Self {
        Self { ptr: NonNull::dangling(), len: 0, cap: 0 }
    }

    /// The number of elements.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of `System` memory held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.cap * size_of::<T>()
    }

    /// Appends a value; returns `false` (and drops nothing) if `System` is out of memory.
    pub(crate) fn push(&mut self, value: T) -> bool {
        if self.len == self.cap && !self.grow() {
            return false;
        }
        // SAFETY: `len < cap` after a successful `grow`, so the slot lies inside the
        // allocation (invariant of `SysVec`).
        unsafe { self.ptr.as_ptr().add(self.len).write(value) };
        self.len += 1;
        true
    }

    /// Removes all elements, keeping the memory.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// The elements as a slice.
    pub(crate) fn as_slice(&self) -> &[T] {
        // SAFETY: the first `len` elements are initialised and `ptr` is valid (or dangling
        // and well aligned with `len == 0`).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The elements as a mutable slice.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice`, and `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    fn grow(&mut self) -> bool {
        let new_cap = if self.cap == 0 { 16 } else { self.cap * 2 };
        let Ok(new_layout) = Layout::array::<T>(new_cap) else {
            return false;
        };
        if new_layout.size() == 0 {
            self.cap = usize::MAX;
            return true;
        }
        let new_ptr = if self.cap == 0 {
            // SAFETY: `new_layout` has a non-zero size (checked above).
            unsafe { System.alloc(new_layout) }
        } else {
            let old_layout = Layout::array::<T>(self.cap).expect("layout was valid when allocated");
            // SAFETY: `ptr` was allocated by `System` with `old_layout` (type invariant),
            // and the new size is non-zero and does not overflow `isize` (`Layout::array`).
            unsafe { System.realloc(self.ptr.as_ptr().cast(), old_layout, new_layout.size()) }
        };
        match NonNull::new(new_ptr.cast::<T>()) {
            Some(p) => {
                self.ptr = p;
                self.cap = new_cap;
                true
            }
            None => false,
        }
    }
}

impl<T: Copy> Drop for SysVec<T> {
    fn drop(&mut self) {
        if self.cap != 0 && size_of::<T>() != 0 {
            let layout = Layout::array::<T>(self.cap).expect("layout was valid when allocated");
            // SAFETY: `ptr` was allocated by `System` with this layout (type invariant).
            unsafe { System.dealloc(self.ptr.as_ptr().cast(), layout) };
        }
    }
}

impl<T: Copy> fmt::Debug for SysVec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SysVec").field("len", &self.len).field("cap", &self.cap).finish()
    }
}

/// Key value marking an empty [`SysMap`] slot.
const EMPTY: usize = 0;
/// Key value marking a removed [`SysMap`] slot (a tombstone).
const TOMBSTONE: usize = 1;

#[derive(Clone, Copy)]
struct Slot<V: Copy> {
    /// `EMPTY`, `TOMBSTONE`, or a live key (>= 2).
    key: usize,
    /// Initialised iff `key >= 2`.
    value: MaybeUninit<V>,
}

/// An open-addressing (linear probing) map from `usize` keys to `Copy` values, in `System`
/// memory.
///
/// Keys `0` and `1` are reserved (empty and tombstone); callers use addresses or hashes
/// forced to be `>= 2`.
///
/// Invariants: `slots` is null when `cap == 0`, otherwise it points to `cap` (a power of two)
/// zeroed-then-written slots allocated by `System` with `Layout::array::<Slot<V>>(cap)`;
/// `len + tombstones < cap`, so every probe sequence meets an empty slot; `grow_at` is
/// `cap * 3 / 4`.
pub(crate) struct SysMap<V: Copy> {
    slots: *mut Slot<V>,
    cap: usize,
    len: usize,
    tombstones: usize,
    /// Used slots (live or tombstones) at which an insert rehashes first.
    grow_at: usize,
}

// SAFETY: `SysMap` owns its slots like a `Vec<(usize, V)>` does, through a raw pointer to
// its own allocation; so it may move to another thread exactly when `V: Send`.
unsafe impl<V: Copy + Send> Send for SysMap<V> {}

#[inline]
fn spread(key: usize) -> usize {
    // Fibonacci hashing: the high bits of the product are well mixed.
    (key as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(29) as usize
}

impl<V: Copy> SysMap<V> {
    /// An empty map; allocates nothing.
    pub(crate) const fn new() -> Self {
        Self { slots: ptr::null_mut(), cap: 0, len: 0, tombstones: 0, grow_at: 0 }
    }

    /// The number of entries.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Bytes of `System` memory held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.cap * size_of::<Slot<V>>()
    }

    /// The slot index holding `key`, or the empty slot where the probe ended.
    #[inline]
    fn find(&self, key: usize) -> (usize, bool) {
        // Every caller checks both first (`get_mut` and `remove` return early on an empty map,
        // and `insert` allocates before it looks).
        debug_assert!(key >= 2, "keys 0 and 1 are reserved");
        debug_assert!(self.cap != 0, "find on an unallocated map");
        let mask = self.cap - 1;
        let mut i = spread(key) & mask;
        loop {
            // SAFETY: `i <= mask < cap`, so the slot is inside the allocation; its `key`
            // field is always initialised (zeroed at allocation).
            let k = unsafe { (*self.slots.add(i)).key };
            if k == key {
                return (i, true);
            }
            if k == EMPTY {
                return (i, false);
            }
            i = (i + 1) & mask;
        }
    }

    /// The value for `key`.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut V> {
        // Keys 0 and 1 mark empty and removed slots: no value is ever stored under them.
        if self.len == 0 || key < 2 {
            return None;
        }
        let (i, found) = self.find(key);
        if !found {
            return None;
        }
        // SAFETY: slot `i` is in bounds and holds `key >= 2`, so its value is initialised.
        Some(unsafe { (*self.slots.add(i)).value.assume_init_mut() })
    }

    /// Inserts or replaces; returns the old value. Returns `Err(value)` if `System` is out
    /// of memory.
    #[inline]
    pub(crate) fn insert(&mut self, key: usize, value: V) -> Result<Option<V>, V> {
        // A reserved key would "find" an empty or removed slot and read its value.
        assert!(key >= 2, "keys 0 and 1 are reserved");
        // Keeps the load under 3/4 after this insert.
        if self.len + self.tombstones >= self.grow_at && !self.rehash() {
            return Err(value);
        }
        let (i, found) = self.find(key);
        // SAFETY: slot `i` is in bounds (returned by `find`).
        let slot = unsafe { &mut *self.slots.add(i) };
        if found {
            // SAFETY: the slot holds a live key, so its value is initialised.
            let old = unsafe { slot.value.assume_init() };
            slot.value = MaybeUninit::new(value);
            return Ok(Some(old));
        }
        slot.key = key;
        slot.value = MaybeUninit::new(value);
        self.len += 1;
        Ok(None)
    }

    /// Removes `key`, returning its value.
    #[inline]
    pub(crate) fn remove(&mut self, key: usize) -> Option<V> {
        // As in `get_mut`: a reserved key would match an empty or removed slot.
        if self.len == 0 || key < 2 {
            return None;
        }
        let (i, found) = self.find(key);
        if !found {
            return None;
        }
        // SAFETY: slot `i` is in bounds and live.
        let slot = unsafe { &mut *self.slots.add(i) };
        // SAFETY: the slot holds a live key, so its value is initialised.
        let value = unsafe { slot.value.assume_init() };
        let next = (i + 1) & (self.cap - 1);
        // SAFETY: `next < cap`.
        if unsafe { (*self.slots.add(next)).key } == EMPTY {
            // No probe sequence continues past this slot, so it can become empty again.
            slot.key = EMPTY;
        } else {
            slot.key = TOMBSTONE;
            self.tombstones += 1;
        }
        self.len -= 1;
        Some(value)
    }

    /// Calls `f` on every entry.
    pub(crate) fn for_each(&mut self, mut f: impl FnMut(usize, &mut V)) {
        for i in 0..self.cap {
            // SAFETY: `i < cap`.
            let slot = unsafe { &mut *self.slots.add(i) };
            if slot.key >= 2 {
                // SAFETY: a live key means the value is initialised.
                f(slot.key, unsafe { slot.value.assume_init_mut() });
            }
        }
    }

    /// Grows (or cleans tombstones) so that one more insert keeps the load under 3/4.
    #[cold]
    fn rehash(&mut self) -> bool {
        #[cfg(test)]
        if test_hooks::REFUSE_GROWTH.with(std::cell::Cell::get) {
            return false;
        }
        let new_cap = if self.cap == 0 {
            64
        } else if (self.len + 1) * 2 > self.cap {
            self.cap * 2
        } else {
            self.cap
        };
        let Ok(layout) = Layout::array::<Slot<V>>(new_cap) else {
            return false;
        };
        // SAFETY: `layout` has a non-zero size (`new_cap >= 64`, `Slot` has a `usize` field).
        let new_slots = unsafe { System.alloc_zeroed(layout) }.cast::<Slot<V>>();
        if new_slots.is_null() {
            return false;
        }
        let old = std::mem::replace(
            self,
            Self { slots: new_slots, cap: new_cap, len: 0, tombstones: 0, grow_at: new_cap / 4 * 3 },
        );
        for i in 0..old.cap {
            // SAFETY: `i < old.cap`, inside the old allocation.
            let slot = unsafe { *old.slots.add(i) };
            if slot.key >= 2 {
                let (j, _) = self.find(slot.key);
                // SAFETY: `find` returned an in-bounds empty slot of the new table.
                unsafe { self.slots.add(j).write(slot) };
                self.len += 1;
            }
        }
        drop(old);
        true
    }
}

impl<V: Copy> Drop for SysMap<V> {
    fn drop(&mut self) {
        if self.cap != 0 {
            let layout = Layout::array::<Slot<V>>(self.cap).expect("layout was valid when allocated");
            // SAFETY: `slots` was allocated by `System` with this layout (type invariant).
            unsafe { System.dealloc(self.slots.cast(), layout) };
        }
    }
}

impl<V: Copy> fmt::Debug for SysMap<V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SysMap").field("len", &self.len).field("cap", &self.cap).finish()
    }
}

/// Fault injection for the unit tests: a table that cannot grow, as when `System` is out
/// of memory.
#[cfg(test)]
pub(crate) mod test_hooks {
    std::thread_local! {
        /// While set, every table this thread grows or cleans refuses to (the insert
        /// that needed it fails).
        pub(crate) static REFUSE_GROWTH: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// A reserved key would match a removed slot and hand back its stale value.
    #[test]
    #[should_panic(expected = "keys 0 and 1 are reserved")]
    fn insert_refuses_a_reserved_key() {
        let mut map: SysMap<u64> = SysMap::new();
        map.insert(2, 7).unwrap();
        assert_eq!(map.remove(2), Some(7));
        let _ = map.insert(1, 8);
    }

    #[test]
    fn map_matches_a_hashmap_model() {
        let mut ours: SysMap<u64> = SysMap::new();
        let mut model = HashMap::new();
        let n: usize = if cfg!(miri) { 300 } else { 20_000 };
        let mut x = 12345usize;
        for step in 0..n {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let key = (x >> 40) % 512 + 2;
            if step % 3 == 0 {
                assert_eq!(ours.remove(key), model.remove(&key));
            } else {
                assert_eq!(ours.insert(key, step as u64).unwrap(), model.insert(key, step as u64));
            }
            assert_eq!(ours.len(), model.len());
        }
        let mut seen = 0;
        ours.for_each(|k, v| {
            assert_eq!(model.get(&k), Some(&*v));
            seen += 1;
        });
        assert_eq!(seen, model.len());
    }

    #[test]
    fn vec_pushes_and_clears() {
        let mut v: SysVec<u32> = SysVec::new();
        for i in 0..100 {
            assert!(v.push(i));
        }
        assert_eq!(v.len(), 100);
        assert_eq!(v.as_slice()[99], 99);
        v.as_mut_slice()[0] = 7;
        assert_eq!(v.as_slice()[0], 7);
        assert!(v.heap_bytes() >= 400);
        v.clear();
        assert_eq!(v.len(), 0);
    }

    #[test]
    fn spin_lock_excludes() {
        let lock = SpinLock::new(0u64);
        let threads = if cfg!(miri) { 2 } else { 4 };
        let iters = if cfg!(miri) { 50 } else { 10_000 };
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..iters {
                        *lock.lock() += 1;
                    }
                });
            }
        });
        assert_eq!(*lock.lock(), threads * iters);
    }
}
