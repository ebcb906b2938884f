//! The object manager's leak report: [`ObjectLeakReport`] and its entries,
//! as data. The text is written by [`leak_render`](super::leak_render).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::panic::Location;

use super::forensics::{Holder, ObjectName, ReferenceCycle, RetentionPath};
use super::ObjectKey;

/// One object still alive at shutdown (or, from
/// [`ObjectManager::alive_since`](crate::ObjectManager::alive_since), created
/// since a snapshot).
///
/// `Display` writes the one-line form, `Material#3 (refs: 1, 16 B) created at src/level.rs:42:17`;
/// `{:#}` adds what holds it, its retention path, its handles' sites and its
/// creation stack, as the leak report does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakEntry {
    /// The object's type.
    pub type_name: &'static str,
    /// The object's key.
    pub key: ObjectKey,
    /// Its strong count at shutdown (handles and raw handles).
    pub ref_count: u32,
    /// Its `size()` in bytes.
    pub size: usize,
    /// Where it was created.
    pub site: &'static Location<'static>,
    /// The shortest chain of handles that keeps it alive, from an object held
    /// from outside the manager (or from a reference cycle); long chains keep
    /// their ends only (see [`RetentionPath::hidden`]). `None` where it was
    /// not computed.
    pub retention: Option<RetentionPath>,
    /// The live objects holding a handle to it, one entry per handle, in key
    /// order. Its other `ref_count - holders.len()` references come from
    /// outside the manager. Empty where it was not computed.
    pub holders: Vec<Holder>,
    /// The call stack of its creation, when the manager reports to a
    /// [`Tracker`](crate::track::Tracker) in [`Mode::Stacks`](crate::track::Mode::Stacks).
    /// Resolved to symbols only when displayed.
    pub stack: Option<crate::track::StackTrace>,
    /// Where each strong handle and raw handle still holding it was created,
    /// cloned, upgraded or taken, oldest first. Filled only with the
    /// `handle-sites` feature.
    pub handles: Vec<super::HandleSite>,
}

impl LeakEntry {
    /// The object's name: `Material#3`.
    pub fn name(&self) -> ObjectName {
        ObjectName { type_name: self.type_name, key: self.key }
    }

    /// References from outside the manager: handles in variables and
    /// systems, raw handles (valid once [`holders`](Self::holders) is computed).
    pub fn outside_refs(&self) -> u32 {
        self.ref_count.saturating_sub(self.holders.len() as u32)
    }

    /// The handle sites as one line: `cloned at src/ai.rs:88:21, created at …`.
    pub fn handle_sites_line(&self) -> Option<String> {
        (!self.handles.is_empty()).then(|| self.handles.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
    }
}

/// An object held from outside the manager that keeps other leaked objects
/// alive: the first place to look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeakRoot {
    /// The object.
    pub object: ObjectName,
    /// Its references from outside the manager.
    pub outside: u32,
    /// All its strong references.
    pub total: u32,
    /// Leaked objects whose retention path starts at it (not counting itself).
    pub retains: usize,
    /// Their bytes.
    pub retained_bytes: usize,
}

/// Leaked objects and bytes of one type, or of one creation site.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeakTally {
    /// The type.
    pub type_name: &'static str,
    /// The creation site, for a tally by site; `None` for a tally by type.
    pub site: Option<&'static Location<'static>>,
    /// Leaked objects.
    pub count: usize,
    /// Their bytes.
    pub bytes: usize,
}

/// What [`ObjectManager::shutdown`](crate::ObjectManager::shutdown) found:
/// the objects still alive, as data, with a summary for reading.
///
/// (The memory tracker has its own leak report, of raw allocations:
/// [`track::LeakReport`](crate::track::LeakReport).)
///
/// `Display` writes the same report as the shutdown log: a summary by type
/// and by creation site (largest first), the roots (objects held from
/// outside that keep others alive, with how many), the reference cycles, then
/// details of at most [`DETAILS_PER_SITE`](Self::DETAILS_PER_SITE) objects per
/// creation site ("… and 9,990 more"). `{:#}` lists every object. The full
/// list is always [`iter`](Self::iter).
///
/// # Examples
///
/// ```
/// use mmobject::{MMObject, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Sound { id: u32 }
///
/// let mm = ObjectManager::builder().report_leaks(false).build();
/// let kept = mm.create(Sound { id: 7 }).into_raw(); // never released
/// let report = mm.shutdown();
/// assert_eq!(report.len(), 1);
/// let leak = report.iter().next().unwrap();
/// assert_eq!(leak.type_name, "Sound");
/// assert_eq!(leak.ref_count, 1);
/// assert!(leak.site.file().ends_with(".rs"));
/// assert_eq!(report.by_type()[0].count, 1);
/// # let _ = kept;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectLeakReport {
    pub(crate) entries: Vec<LeakEntry>,
    pub(crate) outliving_handles: usize,
    pub(crate) owner_reserved: usize,
    pub(crate) leaked_bytes: usize,
    pub(crate) drop_panics: usize,
    pub(crate) cycles: Vec<ReferenceCycle>,
    /// Per cycle: the leaked objects it retains beyond its members.
    pub(crate) cycle_retains: Vec<usize>,
    pub(crate) roots: Vec<LeakRoot>,
}

/// The old name of [`ObjectLeakReport`].
#[doc(hidden)]
pub type LeakReport = ObjectLeakReport;

impl ObjectLeakReport {
    /// Objects listed per creation site in the details of `Display` (and of
    /// the shutdown log) before "… and N more".
    pub const DETAILS_PER_SITE: usize = 10;

    /// True if no object was alive at shutdown.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Objects alive at shutdown.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The leaked objects, in key order: the full list.
    pub fn iter(&self) -> std::slice::Iter<'_, LeakEntry> {
        self.entries.iter()
    }

    /// Bytes of all leaked objects (their `size()`).
    pub fn total_bytes(&self) -> usize {
        // Saturating: `size()` may claim anything.
        self.entries.iter().fold(0, |total, e| total.saturating_add(e.size))
    }

    /// Leaked objects and bytes per type, most objects first (then most bytes, then name).
    pub fn by_type(&self) -> Vec<LeakTally> {
        tally(&self.entries, false)
    }

    /// Leaked objects and bytes per creation site, most objects first.
    pub fn by_site(&self) -> Vec<LeakTally> {
        tally(&self.entries, true)
    }

    /// Objects held from outside the manager that keep other leaked objects
    /// alive, the one retaining most first.
    pub fn roots(&self) -> &[LeakRoot] {
        &self.roots
    }

    /// Objects still referenced by handles (or raw handles) that outlive the manager.
    pub fn outliving_handles(&self) -> usize {
        self.outliving_handles
    }

    /// Of the [`outliving_handles`](Self::outliving_handles), the objects
    /// that the manager's owner thread held counts on, at a shutdown on
    /// another thread (see
    /// [`owner_thread`](crate::ObjectManagerBuilder::owner_thread)). Only the
    /// owner can tell whether any handle to them is left, so they count as
    /// held, perhaps by no handle at all. Always 0 for a shutdown on the
    /// owner thread, which gives its counts back first.
    pub fn owner_reserved(&self) -> usize {
        self.owner_reserved
    }

    /// Bytes of slot memory left allocated on purpose, so outliving handles stay sound.
    pub fn leaked_bytes(&self) -> usize {
        self.leaked_bytes
    }

    /// `Drop` impls that panicked during shutdown (caught and logged).
    pub fn drop_panics(&self) -> usize {
        self.drop_panics
    }

    /// The reference cycles among the leaked objects: groups that nothing
    /// outside the manager held, kept alive only by each other's handles.
    pub fn cycles(&self) -> &[ReferenceCycle] {
        &self.cycles
    }

    /// The report with at most `per_site` objects detailed per creation site
    /// (`usize::MAX`: every object), as the shutdown log writes it.
    pub fn display_with(&self, per_site: usize) -> impl std::fmt::Display + '_ {
        super::leak_render::ReportText { report: self, header: None, per_site }
    }
}

/// Groups entries by type (and site), largest first. O(entries).
///
/// Groups by the address and length of the type name and the address of the
/// `Location` first (a cheap hash; one call site gives one `Location`), then
/// merges groups whose text is equal, should the compiler have duplicated
/// one. (The length counts: a name may share its address with a longer one
/// it is the start of, as `"Node"` cut from `"NodeList"` does.)
fn tally(entries: &[LeakEntry], by_site: bool) -> Vec<LeakTally> {
    let mut groups: HashMap<(usize, usize, usize), LeakTally, BuildHasherDefault<AddressHasher>> = HashMap::default();
    for entry in entries {
        let site = by_site.then_some(entry.site);
        let id = (
            entry.type_name.as_ptr() as usize,
            entry.type_name.len(),
            site.map_or(0, |s| std::ptr::from_ref(s) as usize),
        );
        let group = groups.entry(id).or_insert(LeakTally { type_name: entry.type_name, site, count: 0, bytes: 0 });
        group.count += 1;
        group.bytes = group.bytes.saturating_add(entry.size);
    }
    let text = |t: &LeakTally| (t.type_name, t.site.map(|s| (s.file(), s.line(), s.column())));
    let mut out: Vec<LeakTally> = groups.into_values().collect();
    out.sort_by(|a, b| text(a).cmp(&text(b)));
    out.dedup_by(|later, kept| {
        let same = text(later) == text(kept);
        if same {
            kept.count += later.count;
            kept.bytes = kept.bytes.saturating_add(later.bytes);
        }
        same
    });
    out.sort_by(|a, b| b.count.cmp(&a.count).then(b.bytes.cmp(&a.bytes)).then_with(|| text(a).cmp(&text(b))));
    out
}

/// A hasher for pairs of addresses: one multiply per word.
#[derive(Default)]
pub(crate) struct AddressHasher(u64);

impl Hasher for AddressHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }
}

impl<'a> IntoIterator for &'a ObjectLeakReport {
    type Item = &'a LeakEntry;
    type IntoIter = std::slice::Iter<'a, LeakEntry>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}
