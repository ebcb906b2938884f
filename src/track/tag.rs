//! Memory tags: user-defined categories that allocations are attributed to.
//!
//! A [`Tag`] is a `static` with a name. On first use it gets a small dense [`TagId`] from a
//! process-wide registry, so every [`Tracker`](super::Tracker) can keep its per-tag
//! counters in a plain array indexed by the id. The registry is process-wide rather than
//! per tracker so that the id a `static` caches is valid for every tracker (a test's
//! `Tracker::new()` and `Tracker::global()` alike). Tags are matched by name: two `Tag`s
//! named `"Textures"`, and [`Tracker::tag_named("Textures")`](super::Tracker::tag_named),
//! all give the same id.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

use super::table::SpinLock;
use crate::Error;

/// The most tags a process can register, including [`TagId::UNTAGGED`].
pub const MAX_TAGS: usize = 256;
const _: () = assert!(MAX_TAGS.is_power_of_two(), "TagId::index masks by MAX_TAGS");

/// The small dense id of a registered [`Tag`]; it indexes the tracker's per-tag stats.
///
/// # Examples
///
/// ```
/// use mmobject::track::{Tag, TagId, Tracker};
///
/// static MESHES: Tag = Tag::new("Meshes");
/// let id: TagId = MESHES.id();
/// assert_eq!(id, Tracker::global().tag_named("Meshes"));
/// assert_eq!(id.name(), "Meshes");
/// assert_ne!(id, TagId::UNTAGGED);
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TagId(pub(crate) u32);

impl TagId {
    /// The default tag, `"Untagged"`, for memory allocated with no tag in scope.
    pub const UNTAGGED: TagId = TagId(0);

    /// The id as an index into per-tag arrays (always `< MAX_TAGS`).
    pub const fn index(self) -> usize {
        // Ids are below `MAX_TAGS` already; the mask (a power of two) lets the allocator's
        // fast path index per-tag arrays with no bounds check.
        self.0 as usize % MAX_TAGS
    }

    /// The tag's name.
    pub fn name(self) -> &'static str {
        REGISTRY.lock().names[self.index()]
    }

    /// Makes this tag the current one on this thread until the guard drops.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{current_tag, TagId, Tracker};
    ///
    /// let audio = Tracker::global().tag_named("Audio");
    /// {
    ///     let _g = audio.enter();
    ///     assert_eq!(current_tag(), audio);
    /// }
    /// assert_eq!(current_tag(), TagId::UNTAGGED);
    /// ```
    pub fn enter(self) -> super::TagGuard {
        super::scope::enter(self)
    }
}

impl fmt::Debug for TagId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TagId({} {:?})", self.0, self.name())
    }
}

impl fmt::Display for TagId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A memory tag, defined by the user as a `static`.
///
/// # Examples
///
/// ```
/// use mmobject::track::{current_tag, Tag};
///
/// static TEXTURES: Tag = Tag::new("Textures");
///
/// let _g = TEXTURES.enter(); // allocations on this thread now count as "Textures"
/// assert_eq!(current_tag(), TEXTURES.id());
/// ```
pub struct Tag {
    name: &'static str,
    /// `0` until registered, then the [`TagId`] plus one.
    id_plus_one: AtomicU32,
}

impl Tag {
    /// A tag with this name; registered lazily on first use.
    pub const fn new(name: &'static str) -> Self {
        Self { name, id_plus_one: AtomicU32::new(0) }
    }

    /// The tag's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The tag's id, registering the tag on first use.
    ///
    /// If the registry is full ([`MAX_TAGS`]), the tag maps to [`TagId::UNTAGGED`] and an
    /// error is logged once per tag; use [`Tag::try_id`] to see the error.
    #[inline]
    pub fn id(&self) -> TagId {
        let cached = self.id_plus_one.load(Ordering::Relaxed);
        if cached != 0 {
            return TagId(cached - 1);
        }
        self.try_id().unwrap_or_else(|e| {
            log::error!("memory tag '{}' not registered: {e}; counting it as Untagged", self.name);
            self.id_plus_one.store(1, Ordering::Relaxed);
            TagId::UNTAGGED
        })
    }

    /// The tag's id, registering the tag on first use.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExceeded`] when [`MAX_TAGS`] tags are already registered.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::Tag;
    ///
    /// static PHYSICS: Tag = Tag::new("Physics");
    /// assert_eq!(PHYSICS.try_id()?, PHYSICS.id());
    /// # Ok::<(), mmobject::Error>(())
    /// ```
    pub fn try_id(&self) -> Result<TagId, Error> {
        let cached = self.id_plus_one.load(Ordering::Relaxed);
        if cached != 0 {
            return Ok(TagId(cached - 1));
        }
        let id = register(self.name)?;
        self.id_plus_one.store(id.0 + 1, Ordering::Relaxed);
        Ok(id)
    }

    /// Makes this tag the current one on this thread until the guard drops.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{current_tag, Tag};
    ///
    /// static AI: Tag = Tag::new("AI");
    /// let g = AI.enter();
    /// assert_eq!(current_tag(), AI.id());
    /// drop(g);
    /// assert_ne!(current_tag(), AI.id());
    /// ```
    pub fn enter(&self) -> super::TagGuard {
        super::scope::enter(self.id())
    }
}

impl fmt::Debug for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tag").field("name", &self.name).finish()
    }
}

impl From<&Tag> for TagId {
    fn from(tag: &Tag) -> TagId {
        tag.id()
    }
}

/// The process-wide name table. Invariant: `names[..len]` are the registered names, in id
/// order, and all distinct; `names[0]` is `"Untagged"`.
struct Registry {
    names: [&'static str; MAX_TAGS],
    len: usize,
}

static REGISTRY: SpinLock<Registry> = SpinLock::new(Registry {
    names: {
        let mut names = [""; MAX_TAGS];
        names[0] = "Untagged";
        names
    },
    len: 1,
});

/// Finds or registers the tag named `name`.
pub(crate) fn register(name: &'static str) -> Result<TagId, Error> {
    let mut reg = REGISTRY.lock();
    if let Some(i) = reg.names[..reg.len].iter().position(|n| *n == name) {
        return Ok(TagId(i as u32));
    }
    if reg.len == MAX_TAGS {
        return Err(Error::CapacityExceeded { what: "memory tags", limit: MAX_TAGS });
    }
    let i = reg.len;
    reg.names[i] = name;
    reg.len += 1;
    Ok(TagId(i as u32))
}

/// The number of registered tags (ids `0..count` are valid).
pub(crate) fn registered_count() -> usize {
    REGISTRY.lock().len
}

/// Copies the registered names out (without allocating while the lock is held).
pub(crate) fn registered_names() -> ([&'static str; MAX_TAGS], usize) {
    let reg = REGISTRY.lock();
    (reg.names, reg.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_same_id() {
        static A: Tag = Tag::new("tag-unit-same");
        static B: Tag = Tag::new("tag-unit-same");
        assert_eq!(A.id(), B.id());
        assert_eq!(register("tag-unit-same").unwrap(), A.id());
        assert_eq!(A.id().name(), "tag-unit-same");
    }

    #[test]
    fn untagged_is_zero() {
        assert_eq!(TagId::UNTAGGED.name(), "Untagged");
        assert_eq!(register("Untagged").unwrap(), TagId::UNTAGGED);
    }

    #[test]
    fn ids_are_dense() {
        let a = register("tag-unit-dense-a").unwrap();
        let b = register("tag-unit-dense-b").unwrap();
        assert!(a.index() < registered_count());
        assert!(b.index() < registered_count());
        assert_ne!(a, b);
    }
}
