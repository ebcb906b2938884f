//! The thread-local tag stack, the thread-local re-entrancy flag, and the allocator's
//! per-thread cache: one thread-local block, [`Local`].
//!
//! The "stack" is threaded through the guards: the thread-local holds only the current tag,
//! and each [`TagGuard`] remembers the tag it replaced and restores it on drop. The same
//! thread-local word carries the re-entrancy flag (its top bit), so the allocator reads both
//! with one access. The block is `const`-initialised `Cell`s without a destructor, so
//! touching it never allocates and never registers a thread-exit destructor — a requirement
//! for use inside a global allocator.
//!
//! The allocator's counting path reads nothing else per call but its tracker's key (see
//! `Tracker::refill_local`): the block caches, for one tracker, the header a block of the
//! current tag gets, where the tag's counters are in this thread's slot, and the largest
//! size that is counted only. A change of tag updates the header and the counters'
//! address here, so the path needs no lookup by tag.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ptr;

use super::block::{Header, H_COUNTED};
use super::tag::{Tag, TagId, MAX_TAGS};
use super::thread_stats::TagDelta;

/// This thread's tracker state (see the module docs).
///
/// Invariant: while `key` equals the fast key of a tracker (`Tracker::fast_key`, which is
/// unique to one `'static` tracker and to one state of its configuration), `tags` is this
/// thread's slot's first `TagDelta` in that tracker, and `header`, `delta`, `limit` and
/// `any_size_key` are those of the current tag under that configuration. Only `Tracker::refill_local` sets
/// `key` to a tracker's key (and `Reentry` gives back one it took, under the same tag);
/// anything that would make the fields stale (a change of tag while some tag is slow,
/// entering the tracker) sets it to `NO_KEY` or updates them.
pub(crate) struct Local {
    /// The innermost tag in scope on this thread (low bits), plus `IN_TRACKER` while this
    /// thread runs tracker code that may allocate (logging, callbacks).
    state: Cell<u32>,
    /// The cached tracker's fast key, or `NO_KEY`.
    pub(crate) key: Cell<u64>,
    /// The largest block the counting path takes under the current tag (0: none).
    pub(crate) limit: Cell<usize>,
    /// `key` again if the counting path takes every size under the current tag (counting
    /// mode, the tag not slow), else `NO_KEY`: then one comparison stands for the key's and
    /// the limit's.
    pub(crate) any_size_key: Cell<u64>,
    /// The header of a block counted under the current tag, or `Header::NONE` while the
    /// tag is slow (so no block's header equals it).
    pub(crate) header: Cell<Header>,
    /// The current tag's deltas in this thread's slot (dangling without a cached slot).
    pub(crate) delta: Cell<*const TagDelta>,
    /// This thread's slot's first `TagDelta` (null without a cached slot).
    pub(crate) tags: Cell<*const TagDelta>,
    /// Whether some tag of the cached tracker is slow: `limit` and `header` then depend on
    /// whether the current one is, so a change of tag drops the key.
    pub(crate) any_slow: Cell<bool>,
}

/// The `key` of a thread that has no tracker cached. Tracker keys never take this value.
pub(crate) const NO_KEY: u64 = u64::MAX;

thread_local! {
    static LOCAL: Local = const {
        Local {
            state: Cell::new(0),
            key: Cell::new(NO_KEY),
            limit: Cell::new(0),
            any_size_key: Cell::new(NO_KEY),
            header: Cell::new(Header::NONE),
            delta: Cell::new(ptr::null()),
            tags: Cell::new(ptr::null()),
            any_slow: Cell::new(false),
        }
    };
}

/// The re-entrancy bit of `Local::state`. Tag ids are `< MAX_TAGS`, far below it.
const IN_TRACKER: u32 = 1 << 31;

impl Local {
    /// The current tag ([`TagId::UNTAGGED`] if none), whether or not inside the tracker.
    #[inline]
    pub(crate) fn tag(&self) -> TagId {
        TagId(self.state.get() & !IN_TRACKER)
    }

    /// Whether this thread is inside the tracker.
    #[inline]
    pub(crate) fn in_tracker(&self) -> bool {
        self.state.get() & IN_TRACKER != 0
    }

    /// Makes `id` the current tag, keeping the re-entrancy flag, and the cached header and
    /// counters' address follow it.
    #[inline]
    fn set_tag(&self, id: u32) {
        self.state.set(self.state.get() & IN_TRACKER | id);
        self.header.set(Header::new(id, H_COUNTED));
        // Plain address arithmetic: dereferenced only while `key` vouches for `tags`.
        self.delta.set(self.tags.get().wrapping_add(id as usize % MAX_TAGS));
        if self.any_slow.get() {
            // `limit` and `header` were for the previous tag's slowness.
            self.key.set(NO_KEY);
            self.any_size_key.set(NO_KEY);
        }
    }
}

/// Runs `f` on this thread's [`Local`]; `None` only if the thread-local is unreachable
/// (it has no destructor, so that does not happen in practice).
#[inline(always)]
pub(crate) fn with_local<R>(f: impl FnOnce(&Local) -> R) -> Option<R> {
    LOCAL.try_with(f).ok()
}

/// The tag to charge an allocation to, or `None` if this thread is inside the tracker (or
/// its thread-locals are gone): one thread-local read.
#[inline]
pub(crate) fn allocation_tag() -> Option<TagId> {
    match LOCAL.try_with(|l| l.state.get()) {
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
    LOCAL.try_with(Local::tag).unwrap_or(TagId::UNTAGGED)
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
        let _ = LOCAL.try_with(|l| l.set_tag(self.previous));
    }
}

pub(crate) fn enter(id: TagId) -> TagGuard {
    let previous = LOCAL
        .try_with(|l| {
            let previous = l.tag().0;
            l.set_tag(id.0);
            previous
        })
        .unwrap_or(0);
    TagGuard { previous, _not_send: PhantomData }
}

/// Whether this thread is already inside the tracker.
#[inline]
pub(crate) fn in_tracker() -> bool {
    // A thread-local that is gone (thread exit) counts as "inside": skip tracking.
    LOCAL.try_with(Local::in_tracker).unwrap_or(true)
}

/// Marks this thread as inside the tracker until dropped; allocations made meanwhile (by
/// the logger, a budget callback, report formatting) bypass tracking.
#[derive(Debug)]
pub(crate) struct Reentry {
    was: bool,
    /// The allocator's cached keys when entering, and the tag then: the keys are dropped
    /// meanwhile (so the counting path stays out), and given back on leaving if the tag is
    /// the same (a guard forgotten inside would leave another tag current).
    keys: (u64, u64),
    tag: u32,
    /// `*const ()`: `!Send` and `!Sync`, because the guard clears a flag in a thread-local
    /// of the thread that set it. Not generic, so there is no variance to choose.
    _not_send: PhantomData<*const ()>,
}

impl Reentry {
    #[inline]
    pub(crate) fn enter() -> Self {
        let (was, keys, tag) = LOCAL
            .try_with(|l| {
                let s = l.state.get();
                l.state.set(s | IN_TRACKER);
                let keys = (l.key.replace(NO_KEY), l.any_size_key.replace(NO_KEY));
                (s & IN_TRACKER != 0, keys, s & !IN_TRACKER)
            })
            .unwrap_or((true, (NO_KEY, NO_KEY), 0));
        Reentry { was, keys, tag, _not_send: PhantomData }
    }
}

impl Drop for Reentry {
    #[inline]
    fn drop(&mut self) {
        let _ = LOCAL.try_with(|l| {
            let s = l.state.get() & !IN_TRACKER;
            if self.was {
                l.state.set(s | IN_TRACKER);
            } else {
                l.state.set(s);
                if s == self.tag {
                    l.key.set(self.keys.0);
                    l.any_size_key.set(self.keys.1);
                }
            }
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

    /// A key no tracker gets (they count up from 2), so the cache it fakes is never used.
    const FAKE_KEY: u64 = NO_KEY - 1;

    fn key() -> u64 {
        LOCAL.with(|l| l.key.get())
    }

    #[test]
    fn a_change_of_tag_moves_the_cached_header_and_counters_and_drops_the_key_if_some_tag_is_slow() {
        static A: Tag = Tag::new("scope-unit-cache-a");
        static B: Tag = Tag::new("scope-unit-cache-b");
        let base = 0x1000 as *const TagDelta;
        LOCAL.with(|l| {
            l.tags.set(base);
            l.key.set(FAKE_KEY);
            l.any_size_key.set(FAKE_KEY);
            l.any_slow.set(false);
        });
        {
            let _a = A.enter();
            LOCAL.with(|l| {
                assert_eq!(l.header.get(), Header::new(A.id().0, H_COUNTED));
                assert_eq!(l.delta.get(), base.wrapping_add(A.id().index()));
            });
            assert_eq!(key(), FAKE_KEY, "no tag is slow: the cache holds for every tag");
            LOCAL.with(|l| l.any_slow.set(true));
            let _b = B.enter();
            assert_eq!(key(), NO_KEY, "the cache said whether A was slow, not B");
            assert_eq!(LOCAL.with(|l| l.any_size_key.get()), NO_KEY);
        }
        LOCAL.with(|l| {
            assert_eq!(l.delta.get(), base.wrapping_add(TagId::UNTAGGED.index()));
            l.any_slow.set(false);
            l.tags.set(ptr::null());
            l.key.set(NO_KEY);
        });
    }

    #[test]
    fn reentry_hides_the_cache_and_gives_it_back_to_the_same_tag() {
        static T: Tag = Tag::new("scope-unit-reentry-cache");
        let keys = || LOCAL.with(|l| (l.key.get(), l.any_size_key.get()));
        LOCAL.with(|l| {
            l.key.set(FAKE_KEY);
            l.any_size_key.set(FAKE_KEY);
        });
        {
            let _r = Reentry::enter();
            assert_eq!(keys(), (NO_KEY, NO_KEY), "no counting path inside the tracker");
            let _nested = Reentry::enter();
        }
        assert_eq!(keys(), (FAKE_KEY, FAKE_KEY));
        {
            let _r = Reentry::enter();
            std::mem::forget(T.enter());
        }
        assert_eq!(keys(), (NO_KEY, NO_KEY), "another tag is current: the cache was for the one before");
        drop(enter(TagId::UNTAGGED));
        LOCAL.with(|l| l.state.set(0));
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
