//! The shutdown report: [`LeakReport`].

use std::fmt;
use std::panic::Location;

use super::forensics::ReferenceCycle;
use super::ObjectKey;

/// One object still alive at shutdown (or, from
/// [`ObjectManager::alive_since`](crate::ObjectManager::alive_since), created
/// since a snapshot).
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
    /// The shortest chain of handles that keeps it alive, ending at an object
    /// held from outside the manager (or at a reference cycle); see
    /// [`RetentionPath`](crate::RetentionPath). `None` where it was not computed.
    pub retention: Option<String>,
    /// The call stack of its creation, when the manager reports to a
    /// [`Tracker`](crate::track::Tracker) in [`Mode::Stacks`](crate::track::Mode::Stacks).
    /// Resolved to symbols only when displayed.
    pub stack: Option<crate::track::StackTrace>,
    /// Where each strong handle still holding it was created, cloned or
    /// upgraded, oldest first. Filled only with the `handle-sites` feature.
    pub handles: Vec<super::HandleSite>,
}

impl LeakEntry {
    /// The handle sites as one line: `cloned at src/ai.rs:88:21, created at …`.
    pub fn handle_sites_line(&self) -> Option<String> {
        (!self.handles.is_empty()).then(|| self.handles.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
    }
}

impl fmt::Display for LeakEntry {
    /// `Material#3 (refs: 1, 16 B) created at src/level.rs:42:17`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{} (refs: {}, {} B) created at {}:{}:{}",
            self.type_name,
            self.key,
            self.ref_count,
            self.size,
            self.site.file(),
            self.site.line(),
            self.site.column()
        )
    }
}

/// What [`ObjectManager::shutdown`](crate::ObjectManager::shutdown) found.
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
/// # let _ = kept;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeakReport {
    pub(crate) entries: Vec<LeakEntry>,
    pub(crate) outliving_handles: usize,
    pub(crate) leaked_bytes: usize,
    pub(crate) drop_panics: usize,
    pub(crate) cycles: Vec<ReferenceCycle>,
}

impl LeakReport {
    /// True if no object was alive at shutdown.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Objects alive at shutdown.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The leaked objects, in key order.
    pub fn iter(&self) -> std::slice::Iter<'_, LeakEntry> {
        self.entries.iter()
    }

    /// Objects still referenced by handles (or raw handles) that outlive the manager.
    pub fn outliving_handles(&self) -> usize {
        self.outliving_handles
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
}

impl<'a> IntoIterator for &'a LeakReport {
    type Item = &'a LeakEntry;
    type IntoIter = std::slice::Iter<'a, LeakEntry>;

    fn into_iter(self) -> Self::IntoIter {
        self.entries.iter()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entries.is_empty() {
            write!(f, "no leaked objects")?;
        } else {
            write!(f, "{} leaked object(s):", self.entries.len())?;
            for entry in &self.entries {
                write!(f, "\n  {entry}")?;
                if let Some(retention) = &entry.retention {
                    write!(f, "\n      kept alive by: {retention}")?;
                }
                if let Some(sites) = entry.handle_sites_line() {
                    write!(f, "\n      held by handles: {sites}")?;
                }
            }
        }
        for cycle in &self.cycles {
            write!(f, "\n  cycle: {cycle}")?;
        }
        if self.outliving_handles > 0 {
            write!(
                f,
                "\n{} object(s) referenced by handles outliving the manager; {} bytes leaked on purpose",
                self.outliving_handles, self.leaked_bytes
            )?;
        }
        Ok(())
    }
}
