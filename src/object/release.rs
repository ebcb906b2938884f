//! Releasing the handles an object holds: [`ReleaseHandles`], used by
//! [`ObjectManager::collect_cycles`](crate::ObjectManager::collect_cycles).
//!
//! Cycle collection never drops a value it found in a cycle. It asks each
//! member to let go of its outgoing handles instead, and then lets ordinary
//! reference counting do the rest: a member whose count reaches zero becomes
//! dead and the next collection destroys it. If the analysis was wrong
//! (because a hand-written `visit_handles` reported handles the object does
//! not hold), the members are still referenced, so they simply stay alive.
//!
//! Only handles that can be *removed* can be released:
//!
//! - `Option<Handle<T>>` becomes `None`;
//! - `Vec`, `VecDeque` and `LinkedList` of handles are cleared; of other
//!   releasable types, released element by element;
//! - maps and sets (`HashMap`, `HashSet`, `BTreeMap`, `BTreeSet`) and
//!   `BinaryHeap` are **cleared** if any of their keys or values holds a
//!   handle: a handle in a key (or inside a heap) cannot be taken out in
//!   place, and a map's values cannot be emptied one by one without knowing
//!   their type, so the whole container goes. The object is garbage anyway:
//!   nothing outside the manager reaches it;
//! - `Box`, `Option`, `Result`, arrays, slices and tuples release what they hold;
//! - `Mutex`, `RwLock` (std and parking_lot) and `RefCell` are reached
//!   through `get_mut`, which needs no lock, so this never blocks; a poisoned
//!   std lock is released too;
//! - `Arc` and `Rc` are released only when unique (`get_mut`); a shared one
//!   keeps its handles, so its targets stay alive (safe, never wrong).
//!
//! A plain `Handle<T>` field has no empty state, so a cycle made only of
//! plain `Handle` fields cannot be collected: give at least one link of such
//! a cycle an `Option` (or collection) field.

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, LinkedList, VecDeque};

use super::traits::VisitHandles;
use super::Handle;

/// Dropping the strong handles a value holds, where they can be removed.
///
/// `#[derive(MMObject)]` calls this for each field whose type implements it,
/// to implement [`MMObject::release_handles`](crate::MMObject::release_handles).
/// What each type does:
///
/// - `Option<Handle<T>>` becomes `None`;
/// - `Vec`, `VecDeque` and `LinkedList` of handles are cleared; of other
///   releasable types, released element by element;
/// - maps and sets (`HashMap`, `HashSet`, `BTreeMap`, `BTreeSet`) and
///   `BinaryHeap` are **cleared** if any key or value holds a handle: a handle
///   in a key (or in a heap) cannot be taken out in place, so the whole
///   container goes (the object is garbage anyway);
/// - `Box`, `Option`, `Result`, arrays, slices and tuples release what they hold;
/// - `Mutex`, `RwLock` (std and parking_lot) and `RefCell` are reached through
///   `get_mut`, so this never blocks; a poisoned std lock is released too;
/// - `Arc` and `Rc` are released only when unique; a shared one keeps its
///   handles, so their targets stay alive;
/// - a plain `Handle<T>` has no empty state and is not releasable.
///
/// # Examples
///
/// ```
/// use mmobject::{Handle, MMObject, ObjectManager, ReleaseHandles};
///
/// #[derive(MMObject)]
/// struct Node { next: Option<Handle<Node>> }
///
/// let mm = ObjectManager::new();
/// let a = mm.create(Node { next: None });
/// let mut link = Some(a.clone());
/// assert_eq!(a.ref_count(), 2);
/// link.release_handles();
/// assert!(link.is_none());
/// assert_eq!(a.ref_count(), 1);
/// ```
pub trait ReleaseHandles {
    /// Drops every strong handle in `self` that can be removed.
    fn release_handles(&mut self);
}

impl<T> ReleaseHandles for Option<Handle<T>> {
    fn release_handles(&mut self) {
        *self = None;
    }
}

impl<T> ReleaseHandles for Vec<Handle<T>> {
    fn release_handles(&mut self) {
        self.clear();
    }
}

impl<T: ReleaseHandles> ReleaseHandles for Option<T> {
    fn release_handles(&mut self) {
        if let Some(value) = self {
            value.release_handles();
        }
    }
}

impl<T: ReleaseHandles> ReleaseHandles for Vec<T> {
    fn release_handles(&mut self) {
        self.iter_mut().for_each(ReleaseHandles::release_handles);
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for Box<T> {
    fn release_handles(&mut self) {
        (**self).release_handles();
    }
}

impl<T: ReleaseHandles, const N: usize> ReleaseHandles for [T; N] {
    fn release_handles(&mut self) {
        self.iter_mut().for_each(ReleaseHandles::release_handles);
    }
}

impl<T: ReleaseHandles> ReleaseHandles for [T] {
    fn release_handles(&mut self) {
        self.iter_mut().for_each(ReleaseHandles::release_handles);
    }
}

/// True if `value` holds at least one strong handle.
fn holds_handles<T: VisitHandles + ?Sized>(value: &T) -> bool {
    let mut any = false;
    value.visit_handles(&mut |_| any = true);
    any
}

/// Sequences: cleared when they hold handles directly, else released element by element.
macro_rules! release_sequence {
    ($container:ident) => {
        impl<T> ReleaseHandles for $container<Handle<T>> {
            fn release_handles(&mut self) {
                self.clear();
            }
        }

        impl<T: ReleaseHandles> ReleaseHandles for $container<T> {
            fn release_handles(&mut self) {
                self.iter_mut().for_each(ReleaseHandles::release_handles);
            }
        }
    };
}

release_sequence!(VecDeque);
release_sequence!(LinkedList);

impl<T: VisitHandles> ReleaseHandles for BinaryHeap<T> {
    /// Cleared if any element holds a handle (elements cannot change in place).
    fn release_handles(&mut self) {
        if holds_handles(self) {
            self.clear();
        }
    }
}

impl<T: VisitHandles> ReleaseHandles for BTreeSet<T> {
    /// Cleared if any element holds a handle (keys cannot change in place).
    fn release_handles(&mut self) {
        if holds_handles(self) {
            self.clear();
        }
    }
}

impl<T: VisitHandles, S> ReleaseHandles for HashSet<T, S> {
    /// Cleared if any element holds a handle (keys cannot change in place).
    fn release_handles(&mut self) {
        if holds_handles(self) {
            self.clear();
        }
    }
}

impl<K: VisitHandles, V: VisitHandles> ReleaseHandles for BTreeMap<K, V> {
    /// Cleared if any key or value holds a handle.
    fn release_handles(&mut self) {
        if holds_handles(self) {
            self.clear();
        }
    }
}

impl<K: VisitHandles, V: VisitHandles, S> ReleaseHandles for HashMap<K, V, S> {
    /// Cleared if any key or value holds a handle.
    fn release_handles(&mut self) {
        if holds_handles(self) {
            self.clear();
        }
    }
}

impl<T: ReleaseHandles, E: ReleaseHandles> ReleaseHandles for Result<T, E> {
    fn release_handles(&mut self) {
        match self {
            Ok(value) => value.release_handles(),
            Err(error) => error.release_handles(),
        }
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for std::sync::Arc<T> {
    /// Releases the value only if this is the only `Arc` to it.
    fn release_handles(&mut self) {
        if let Some(value) = std::sync::Arc::get_mut(self) {
            value.release_handles();
        }
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for std::rc::Rc<T> {
    /// Releases the value only if this is the only `Rc` to it.
    fn release_handles(&mut self) {
        if let Some(value) = std::rc::Rc::get_mut(self) {
            value.release_handles();
        }
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for std::cell::RefCell<T> {
    fn release_handles(&mut self) {
        self.get_mut().release_handles();
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for std::sync::Mutex<T> {
    /// Through `get_mut`: no locking, so it never blocks; poisoned or not.
    fn release_handles(&mut self) {
        match self.get_mut() {
            Ok(value) => value.release_handles(),
            Err(poisoned) => poisoned.into_inner().release_handles(),
        }
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for std::sync::RwLock<T> {
    /// Through `get_mut`: no locking, so it never blocks; poisoned or not.
    fn release_handles(&mut self) {
        match self.get_mut() {
            Ok(value) => value.release_handles(),
            Err(poisoned) => poisoned.into_inner().release_handles(),
        }
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for parking_lot::Mutex<T> {
    /// Through `get_mut`: no locking, so it never blocks.
    fn release_handles(&mut self) {
        self.get_mut().release_handles();
    }
}

impl<T: ReleaseHandles + ?Sized> ReleaseHandles for parking_lot::RwLock<T> {
    /// Through `get_mut`: no locking, so it never blocks.
    fn release_handles(&mut self) {
        self.get_mut().release_handles();
    }
}

/// Support for the derive's generated code. Not public API.
///
/// `(&mut ProbeMut(&mut field)).mm_release_handles()` picks
/// `ViaReleaseHandles` (receiver `&mut ProbeMut<T>`) when the field type
/// implements [`ReleaseHandles`], and otherwise autorefs once more to
/// `NoReleaseHandles` (on `&mut ProbeMut<T>`), which does nothing: the same
/// autoref specialization as the other probes.
#[doc(hidden)]
pub mod probe {
    use super::ReleaseHandles;

    #[allow(missing_debug_implementations)]
    pub struct ProbeMut<'a, T: ?Sized>(pub &'a mut T);

    pub trait ViaReleaseHandles {
        fn mm_release_handles(&mut self);
    }
    impl<T: ReleaseHandles + ?Sized> ViaReleaseHandles for ProbeMut<'_, T> {
        #[inline]
        fn mm_release_handles(&mut self) {
            self.0.release_handles();
        }
    }

    pub trait NoReleaseHandles {
        fn mm_release_handles(&mut self);
    }
    impl<T: ?Sized> NoReleaseHandles for &mut ProbeMut<'_, T> {
        #[inline]
        fn mm_release_handles(&mut self) {}
    }
}
