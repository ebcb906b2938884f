//! The thread-local tag stack, and the thread-local re-entrancy flag.
//!
//! The "stack" is threaded through the guards: the thread-local holds only the current tag,
//! and each [`TagGuard`] remembers the tag it replaced and restores it on drop. The same
//! thread-local word carries the re-entrancy flag (its top bit), so the allocator reads both
//! with one access. It is a `const`-initialised `Cell` without a destructor, so touching it
//! never allocates and never registers a thread-exit destructor — a requirement for use
//! inside a global allocator.

use std::cell::Cell;
use std::marker::PhantomData;

use super::tag::{Tag, TagId};

thread_local! {
    /// The innermost tag in scope on this thread (low bits), plus `IN_TRACKER` while this
    /// thread runs tracker code that may allocate (logging, callbacks).
    static STATE: Cell<u32> = const { Cell::new(0) };
}

/// The re-entrancy bit of `STATE`. Tag ids are `< MAX_TAGS`, far below it.
const IN_TRACKER: u32 = 1 << 31;

/// The tag to charge an allocation to, or `None` if this thread is inside the tracker (or
/// its thread-locals are gone): one thread-local read.
#[inline]
pub(crate) fn allocation_tag() -> Option<TagId> {
    match STATE.try_with(Cell::get) {
        Ok(s) if s & IN_TRACKER == 0 => Some(TagId(s)),
        _ => None,
    }
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
    TagId(STATE.try_with(Cell::get).unwrap_or(0) & !IN_TRACKER)
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
/// Guards drop in reverse order of creation (as `let` bindings do); it is not `Send`, so it
/// drops on the thread whose tag it changed.
///
/// Forgetting a guard (`mem::forget`) or dropping guards out of order is safe: the tag is
/// plain data, never a pointer, so the worst outcome is a wrong attribution, never undefined
/// behaviour. A forgotten guard's tag stays current until an enclosing guard drops, which
/// restores the tag that was current before that enclosing guard; the re-entrancy flag
/// sharing the word is never touched by a guard.
///
/// The current tag belongs to the thread, not to a task. In `async` code, a guard held
/// across an `.await` also tags whatever other tasks the executor runs on that thread
/// meanwhile (being `!Send`, the guard keeps the future on one thread, so a
/// single-threaded executor is where this happens). Enter the tag inside each poll instead,
/// with [`scope`] around synchronous work, and drop the guard before awaiting.
#[derive(Debug)]
#[must_use = "the tag is only current while the guard is alive"]
pub struct TagGuard {
    /// The tag current before this guard (restored on drop).
    previous: u32,
    /// `PhantomData<*const ()>`: `!Send` and `!Sync`, because the guard restores a
    /// thread-local of the thread that created it.
    _not_send: PhantomData<*const ()>,
}

impl Drop for TagGuard {
    fn drop(&mut self) {
        // No check that this guard's tag is still current: a forgotten inner guard changes it,
        // and a `Drop` must not panic (see the type's docs for what happens then).
        let _ = STATE.try_with(|c| c.set(c.get() & IN_TRACKER | self.previous));
    }
}

pub(crate) fn enter(id: TagId) -> TagGuard {
    let previous = STATE
        .try_with(|c| {
            let s = c.get();
            c.set(s & IN_TRACKER | id.0);
            s & !IN_TRACKER
        })
        .unwrap_or(0);
    TagGuard { previous, _not_send: PhantomData }
}

/// Whether this thread is already inside the tracker.
#[inline]
pub(crate) fn in_tracker() -> bool {
    // A thread-local that is gone (thread exit) counts as "inside": skip tracking.
    STATE.try_with(|c| c.get() & IN_TRACKER != 0).unwrap_or(true)
}

/// Marks this thread as inside the tracker until dropped; allocations made meanwhile (by
/// the logger, a budget callback, report formatting) bypass tracking.
#[derive(Debug)]
pub(crate) struct Reentry {
    was: bool,
    /// `*const ()`: `!Send` and `!Sync`, because the guard clears a flag in a thread-local
    /// of the thread that set it. Not generic, so there is no variance to choose.
    _not_send: PhantomData<*const ()>,
}

impl Reentry {
    #[inline]
    pub(crate) fn enter() -> Self {
        let was = STATE
            .try_with(|c| {
                let s = c.get();
                c.set(s | IN_TRACKER);
                s & IN_TRACKER != 0
            })
            .unwrap_or(true);
        Reentry { was, _not_send: PhantomData }
    }
}

impl Drop for Reentry {
    #[inline]
    fn drop(&mut self) {
        let _ = STATE.try_with(|c| {
            let s = c.get() & !IN_TRACKER;
            c.set(if self.was { s | IN_TRACKER } else { s });
        });
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
        static T: Tag = Tag::new("scope-unit-reentry");
        let _g = T.enter();
        assert_eq!(allocation_tag(), Some(T.id()));
        assert!(!in_tracker());
        {
            let _a = Reentry::enter();
            assert!(in_tracker());
            assert_eq!(allocation_tag(), None);
            assert_eq!(current_tag(), T.id(), "the tag survives the flag");
            {
                let _b = Reentry::enter();
                assert!(in_tracker());
            }
            assert!(in_tracker());
        }
        assert!(!in_tracker());
    }
}
