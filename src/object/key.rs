//! Keys: the untyped, copyable name of an object within its manager.

use slotmap::{Key, KeyData};

/// The untyped name of an object: a manager-wide index and a generation.
///
/// Indices are unique across all object types of one manager, so a
/// `slotmap::SecondaryMap<ObjectKey, V>` can hold side data for objects of any
/// type. The generation follows the slotmap convention (odd = occupied), so a
/// slot that is reused never matches an old key.
///
/// # Examples
///
/// ```
/// use mmobject::{MMObject, ObjectKey, ObjectManager};
/// use slotmap::SecondaryMap;
///
/// #[derive(MMObject)]
/// struct Enemy { hp: u32 }
///
/// let mm = ObjectManager::new();
/// let a = mm.create(Enemy { hp: 10 });
/// let mut names: SecondaryMap<ObjectKey, &str> = SecondaryMap::new();
/// names.insert(a.key(), "grunt");
/// assert_eq!(names[a.key()], "grunt");
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(transparent)]
pub struct ObjectKey(KeyData);

impl ObjectKey {
    pub(crate) fn new(index: u32, generation: u32) -> Self {
        debug_assert!(generation & 1 == 1, "an occupied generation is odd");
        ObjectKey(KeyData::from_ffi(u64::from(index) | (u64::from(generation) << 32)))
    }

    /// The manager-wide index of the object's slot.
    pub fn index(self) -> u32 {
        self.0.as_ffi() as u32
    }

    /// The generation of the slot when the key was made (odd).
    pub fn generation(self) -> u32 {
        (self.0.as_ffi() >> 32) as u32
    }
}

impl From<KeyData> for ObjectKey {
    fn from(data: KeyData) -> Self {
        ObjectKey(data)
    }
}

// SAFETY: `data` returns exactly the `KeyData` the key was built from, as the
// trait requires; the trait has no other unsafe contract.
unsafe impl Key for ObjectKey {
    fn data(&self) -> KeyData {
        self.0
    }
}

impl std::fmt::Debug for ObjectKey {
    /// `#5v9b1f`: the index, then the low 16 bits of the generation in hex.
    /// Generations start at a per-manager offset, so the full number is long
    /// and says nothing; its low bits still tell two keys of one slot apart.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}v{:x}", self.index(), self.generation() & 0xffff)
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}", self.index())
    }
}
