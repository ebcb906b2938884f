//! Per-type statistics: [`ObjectMemoryReport`].

use std::fmt;

/// One type's line in a [`ObjectMemoryReport`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct TypeReport {
    /// The type's name.
    pub type_name: &'static str,
    /// The type's memory tag.
    pub tag: &'static str,
    /// Objects with strong handles.
    pub live: usize,
    /// The most objects held at once (live plus dead pending), sampled at
    /// every collection and report, and after each destroy hook (which may
    /// create objects while the one it is called for is still held). Exact
    /// while objects are created on the collecting thread: they only leave
    /// at collection. Creates on other threads while a collection runs can
    /// make it miss a peak by at most their number.
    pub peak_live: usize,
    /// Objects released but not yet collected.
    pub dead_pending: usize,
    /// Sum of `size()` over live and dead-pending objects.
    pub bytes: usize,
    /// Segment bytes per slot: the 16-byte header plus `size_of::<T>()` (with
    /// padding).
    pub slot_bytes: usize,
    /// Objects ever created.
    pub created: u64,
    /// Objects ever destroyed.
    pub destroyed: u64,
}

/// Per-type statistics of the object manager, from [`ObjectManager::report`](crate::ObjectManager::report).
///
/// (The memory tracker's per-tag table is [`track::MemoryReport`](crate::track::MemoryReport).)
///
/// `Display` prints an aligned table.
///
/// # Examples
///
/// ```
/// use mmobject::{MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Bullet { speed: f32 }
///
/// let mm = ObjectManager::new();
/// let _b = mm.create(Bullet { speed: 9.0 });
/// let report = mm.report();
/// assert_eq!(report.get("Bullet").unwrap().live, 1);
/// println!("{report}");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct ObjectMemoryReport {
    /// One entry per type, in registration order.
    pub types: Vec<TypeReport>,
}

/// The old name of [`ObjectMemoryReport`].
#[doc(hidden)]
pub type MemoryReport = ObjectMemoryReport;

impl ObjectMemoryReport {
    /// The line for the type with this name.
    pub fn get(&self, type_name: &str) -> Option<&TypeReport> {
        self.types.iter().find(|t| t.type_name == type_name)
    }

    /// Live objects over all types.
    pub fn total_live(&self) -> usize {
        self.types.iter().map(|t| t.live).sum()
    }

    /// Bytes over all types.
    pub fn total_bytes(&self) -> usize {
        // Saturating: `size()` may claim anything.
        self.types.iter().fold(0, |total, t| total.saturating_add(t.bytes))
    }

    /// The report as JSON.
    #[cfg(feature = "serde")]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report always serialises")
    }
}

impl fmt::Display for ObjectMemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name_width = self.types.iter().map(|t| t.type_name.len()).chain([4]).max().unwrap_or(4);
        let tag_width = self.types.iter().map(|t| t.tag.len()).chain([3]).max().unwrap_or(3);
        writeln!(
            f,
            "{:<name_width$}  {:<tag_width$}  {:>9}  {:>9}  {:>9}  {:>12}  {:>10}  {:>12}  {:>12}",
            "type", "tag", "live", "peak", "dead", "bytes", "slot B", "created", "destroyed"
        )?;
        for t in &self.types {
            writeln!(
                f,
                "{:<name_width$}  {:<tag_width$}  {:>9}  {:>9}  {:>9}  {:>12}  {:>10}  {:>12}  {:>12}",
                t.type_name, t.tag, t.live, t.peak_live, t.dead_pending, t.bytes, t.slot_bytes, t.created, t.destroyed
            )?;
        }
        write!(
            f,
            "{:<name_width$}  {:<tag_width$}  {:>9}  {:>9}  {:>9}  {:>12}",
            "total",
            "",
            self.total_live(),
            "",
            self.types.iter().map(|t| t.dead_pending).sum::<usize>(),
            self.total_bytes()
        )
    }
}
