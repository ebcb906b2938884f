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
//! Only handles that can be *removed* can be released: `Option<Handle<T>>`
//! becomes `None`, and a `Vec` of handles is cleared. A plain `Handle<T>`
//! field has no empty state, so a cycle made only of plain `Handle` fields
//! cannot be collected: give at least one link of such a cycle an `Option`
//! (or `Vec`) field.

use super::Handle;

/// Dropping the strong handles a value holds, where they can be removed.
///
/// `#[derive(MMObject)]` calls this for each field whose type implements it,
/// to implement [`MMObject::release_handles`](crate::MMObject::release_handles).
/// It is implemented for `Option<Handle<T>>` (set to `None`), `Vec<Handle<T>>`
/// (cleared), and for `Option`, `Vec`, `Box` and arrays of types that
/// implement it (released element by element).
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
