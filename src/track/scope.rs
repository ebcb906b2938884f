//! The thread-local tag stack, and the thread-local re-entrancy flag.
//!
//! The "stack" is threaded through the guards: the thread-local holds only the current tag,
//! and each [`TagGuard`] remembers the tag it replaced and restores it on drop. Both
//! thread-locals are `const`-initialised `Cell`s without destructors, so touching them
//! never allocates and never registers a thread-exit destructor — a requirement for use
//! inside a global allocator.

use std::cell::Cell;
use std::marker::PhantomData;

use super::tag::{Tag, TagId};

thread_local! {
    /// The innermost tag in scope on this thread.
    static CURRENT: Cell<u32> = const { Cell::new(0) };
    /// `true` while this thread runs tracker code that may allocate (logging, callbacks).
    static IN_TRACKER: Cell<bool> = const { Cell::new(false) };
}

/// The innermost tag in scope on this thread ([`TagId::UNTAGGED`] if none).
///
/// # Examples
///
/// ```
/// use mmobject::track::{current_tag, scope, Tag, TagId};
///
/// static UI: Tag = Tag::new("UI");
/// assert_eq!(current_tag(), TagId::UNTAGGED);
/// scope(&UI, || assert_eq!(current_tag(), UI.id()));
/// ```
#[inline]
pub fn current_tag() -> TagId {
    TagId(CURRENT.try_with(Cell::get).unwrap_or(0))
}

/// Runs `f` with `tag` as the current tag on this thread.
///
/// # Examples
///
/// ```
/// use mmobject::track::{scope, Tag};
///
/// static LEVEL: Tag = Tag::new("Level");
/// let v: Vec<u8> = scope(&LEVEL, || vec![0; 100]); // counted under "Level" by TrackingAllocator
/// assert_eq!(v.len(), 100);
/// ```
pub fn scope<R>(tag: &Tag, f: impl FnOnce() -> R) -> R {
    let _guard = tag.enter();
    f()
}

/// Runs `f` with the tag `id` as the current tag on this thread.
///
/// # Examples
///
/// ```
/// use mmobject::track::{current_tag, scope_id, Tracker};
///
/// let id = Tracker::global().tag_named("Scripts");
/// scope_id(id, || assert_eq!(current_tag(), id));
/// ```
pub fn scope_id<R>(id: TagId, f: impl FnOnce() -> R) -> R {
    let _guard = enter(id);
    f()
}

/// Restores the previous current tag when dropped. Returned by [`Tag::enter`].
///
/// Guards must drop in reverse order of creation (as `let` bindings do); it is not `Send`.
#[derive(Debug)]
#[must_use = "the tag is only current while the guard is alive"]
pub struct TagGuard {
    previous: u32,
    entered: u32,
    _not_send: PhantomData<*const ()>,
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        let _ = CURRENT.try_with(|c| {
            debug_assert_eq!(c.get(), self.entered, "tag guards dropped out of order");
            c.set(self.previous);
        });
    }
}

pub(crate) fn enter(id: TagId) -> TagGuard {
    let previous = CURRENT.try_with(|c| c.replace(id.0)).unwrap_or(0);
    TagGuard { previous, entered: id.0, _not_send: PhantomData }
}

/// Whether this thread is already inside the tracker.
#[inline]
pub(crate) fn in_tracker() -> bool {
    // A thread-local that is gone (thread exit) counts as "inside": skip tracking.
    IN_TRACKER.try_with(Cell::get).unwrap_or(true)
}

/// Marks this thread as inside the tracker until dropped; allocations made meanwhile (by
/// the logger, a budget callback, report formatting) bypass tracking.
#[derive(Debug)]
pub(crate) struct Reentry {
    was: bool,
    _not_send: PhantomData<*const ()>,
}

impl Reentry {
    #[inline]
    pub(crate) fn enter() -> Self {
        let was = IN_TRACKER.try_with(|c| c.replace(true)).unwrap_or(true);
        Reentry { was, _not_send: PhantomData }
    }
}

impl Drop for Reentry {
    #[inline]
    fn drop(&mut self) {
        let _ = IN_TRACKER.try_with(|c| c.set(self.was));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guards_nest() {
        static OUTER: Tag = Tag::new("scope-unit-outer");
        static INNER: Tag = Tag::new("scope-unit-inner");
        assert_eq!(current_tag(), TagId::UNTAGGED);
        {
            let _a = OUTER.enter();
            assert_eq!(current_tag(), OUTER.id());
            scope(&INNER, || assert_eq!(current_tag(), INNER.id()));
            assert_eq!(current_tag(), OUTER.id());
        }
        assert_eq!(current_tag(), TagId::UNTAGGED);
    }

    #[test]
    fn scope_is_per_thread() {
        static T: Tag = Tag::new("scope-unit-thread");
        let _a = T.enter();
        std::thread::spawn(|| assert_eq!(current_tag(), TagId::UNTAGGED)).join().unwrap();
    }

    #[test]
    fn reentry_flag_nests() {
        assert!(!in_tracker());
        {
            let _a = Reentry::enter();
            assert!(in_tracker());
            {
                let _b = Reentry::enter();
                assert!(in_tracker());
            }
            assert!(in_tracker());
        }
        assert!(!in_tracker());
    }
}
