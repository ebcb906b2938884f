//! Reports: the per-tag table ([`MemoryReport`]) and the leak report ([`LeakReport`]).

use std::fmt;
use std::panic::Location;

use super::diagnostics::ErrorCounts;
use super::mode::Mode;
use super::record::FLAG_GLOBAL_ALLOC;
use super::scope::Reentry;
use super::stack_trace::StackTrace;
use super::stats::TagStats;
use super::tag::TagId;
use super::tracker::Tracker;
use crate::Error;

/// Every tag's numbers at one moment, plus the tracker's overhead and error counts.
///
/// `Display` writes a text table; with the `serde` feature, `MemoryReport::to_json`
/// writes JSON.
///
/// # Examples
///
/// ```
/// use mmobject::track::{Tag, Tracker};
///
/// static TEXTURES: Tag = Tag::new("Textures");
/// let tracker = Tracker::new();
/// tracker.set_budget(&TEXTURES, 1 << 20);
/// tracker.try_charge(TEXTURES.id(), 300 << 10)?;
/// let report = tracker.snapshot();
/// let text = report.to_string();
/// assert!(text.contains("Textures"));
/// assert!(text.contains("29.3%"));
/// # Ok::<(), mmobject::Error>(())
/// ```
#[derive(Debug, Clone)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct MemoryReport {
    /// The tracker's mode when the report was taken.
    pub mode: Mode,
    /// Every registered tag that was ever used or has a budget (Untagged always), by id.
    pub tags: Vec<TagStats>,
    /// Bytes the tracker's own tables hold.
    pub overhead_bytes: usize,
    /// Live records (0 in counting mode).
    pub live_records: usize,
    /// Bad frees and overruns so far.
    pub errors: ErrorCounts,
    /// Overruns newly found while taking this report (guards of live blocks).
    #[cfg_attr(feature = "serde", serde(serialize_with = "ser_errors"))]
    pub new_overruns: Vec<Error>,
}

#[cfg(feature = "serde")]
fn ser_errors<S: serde::Serializer>(errors: &[Error], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(errors.iter().map(|e| e.to_string()))
}

impl MemoryReport {
    /// The row of one tag, if it is in the report.
    pub fn tag(&self, tag: impl Into<TagId>) -> Option<&TagStats> {
        let id = tag.into().0;
        self.tags.iter().find(|t| t.id == id)
    }

    /// Bytes in use over all tags.
    pub fn total_bytes(&self) -> usize {
        // Saturating: sizes given to the explicit API may be anything.
        self.tags.iter().fold(0, |total, t| total.saturating_add(t.bytes))
    }

    /// The report as pretty-printed JSON.
    ///
    /// # Examples
    ///
    /// ```
    /// # #[cfg(feature = "serde")] {
    /// use mmobject::track::Tracker;
    ///
    /// let json = Tracker::new().snapshot().to_json();
    /// assert!(json.contains("\"overhead_bytes\""));
    /// # }
    /// ```
    #[cfg(feature = "serde")]
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a memory report always serialises")
    }
}

/// Formats a byte count with a binary unit.
pub(crate) struct Bytes(pub(crate) usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        let s = if b < 1024 {
            format!("{b} B")
        } else if b < 1 << 20 {
            format!("{:.1} KiB", b as f64 / 1024.0)
        } else if b < 1 << 30 {
            format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
        } else {
            format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
        };
        f.pad(&s)
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "Memory by tag (mode: {})", self.mode)?;
        writeln!(
            f,
            "{:<20} {:>11} {:>11} {:>9} {:>10} {:>11} {:>8}",
            "tag", "current", "peak", "count", "peak count", "budget", "% budget"
        )?;
        writeln!(f, "{}", "-".repeat(86))?;
        for t in &self.tags {
            let budget = t.budget.map_or_else(|| "-".to_string(), |b| Bytes(b).to_string());
            let pct = t.budget_percent().map_or_else(|| "-".to_string(), |p| format!("{p:.1}%"));
            let flag = if t.budget.is_some_and(|b| t.bytes > b) { " OVER" } else { "" };
            writeln!(
                f,
                "{:<20} {:>11} {:>11} {:>9} {:>10} {:>11} {:>8}{}",
                t.name,
                Bytes(t.bytes),
                Bytes(t.peak_bytes),
                t.count,
                t.peak_count,
                budget,
                pct,
                flag
            )?;
        }
        writeln!(f, "{}", "-".repeat(86))?;
        writeln!(f, "{:<20} {:>11}", "total", Bytes(self.total_bytes()))?;
        writeln!(
            f,
            "{:<20} {:>11}   ({} live records)",
            "tracker overhead",
            Bytes(self.overhead_bytes),
            self.live_records
        )?;
        let e = self.errors;
        if e != ErrorCounts::default() {
            writeln!(
                f,
                "errors: {} untracked free(s), {} double free(s), {} buffer overrun(s)",
                e.untracked_frees, e.double_frees, e.buffer_overruns
            )?;
        }
        for o in &self.new_overruns {
            writeln!(f, "  {o}")?;
        }
        Ok(())
    }
}

/// Live allocations with the same tag, site and call stack.
#[derive(Debug, Clone)]
pub struct LeakGroup {
    /// The tag.
    pub tag: TagId,
    /// The tag's name.
    pub tag_name: &'static str,
    /// Where the allocations were made (`#[track_caller]` site of [`Tracker::alloc`] or
    /// [`Tracker::track`]); `None` for [`TrackingAllocator`](super::TrackingAllocator)
    /// blocks, whose callers only the `stack` shows.
    pub site: Option<&'static Location<'static>>,
    /// The allocation stack, in [`Mode::Stacks`].
    pub stack: Option<StackTrace>,
    /// How many allocations.
    pub count: usize,
    /// Their total size.
    pub bytes: usize,
}

/// Live allocations grouped by call stack, largest first.
///
/// Taken with [`Tracker::leak_report`] at a point where everything should have been freed
/// (shutdown, level unload). Needs [`Mode::Records`] or [`Mode::Stacks`]; `Display`
/// resolves the stacks' symbols.
///
/// # Examples
///
/// ```
/// use mmobject::track::{Mode, Tag, Tracker};
/// use std::alloc::Layout;
///
/// static CACHE: Tag = Tag::new("Cache");
/// let tracker = Tracker::with_mode(Mode::Stacks { depth: 4 });
/// let kept = tracker.alloc(Layout::new::<[u8; 48]>(), CACHE.id());
/// let report = tracker.leak_report();
/// assert_eq!(report.total_bytes, 48);
/// assert_eq!(report.groups[0].tag_name, "Cache");
/// println!("{report}");
/// tracker.dealloc(kept);
/// assert!(tracker.leak_report().groups.is_empty());
/// ```
#[derive(Debug, Clone, Default)]
pub struct LeakReport {
    /// The groups, largest total size first.
    pub groups: Vec<LeakGroup>,
    /// Live allocations.
    pub total_count: usize,
    /// Their total size.
    pub total_bytes: usize,
}

impl LeakReport {
    /// `true` if nothing is live.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }

    /// Keeps only the groups `keep` accepts, and recomputes the totals.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Mode, TagId, Tracker};
    ///
    /// let tracker = Tracker::with_mode(Mode::Records);
    /// let mine = tracker.tag_named("Mine");
    /// let (a, b) = ([0u8; 1], [0u8; 1]);
    /// tracker.track(a.as_ptr(), 10, mine);
    /// tracker.track(b.as_ptr(), 20, TagId::UNTAGGED);
    /// let mut report = tracker.leak_report();
    /// report.retain(|g| g.tag == mine);
    /// assert_eq!((report.total_count, report.total_bytes), (1, 10));
    /// # tracker.untrack(a.as_ptr()); tracker.untrack(b.as_ptr());
    /// ```
    pub fn retain(&mut self, keep: impl FnMut(&LeakGroup) -> bool) {
        self.groups.retain(keep);
        self.total_count = self.groups.iter().map(|g| g.count).sum();
        self.total_bytes = self.groups.iter().fold(0, |total, g| total.saturating_add(g.bytes));
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _reentry = Reentry::enter();
        writeln!(
            f,
            "Leak report: {} live allocation(s), {} in {} group(s)",
            self.total_count,
            Bytes(self.total_bytes),
            self.groups.len()
        )?;
        for (i, g) in self.groups.iter().enumerate() {
            write!(f, "#{} {} in {} allocation(s), tag {}", i + 1, Bytes(g.bytes), g.count, g.tag_name)?;
            match g.site {
                Some(site) => writeln!(f, ", site {site}")?,
                None => writeln!(f, ", via the global allocator")?,
            }
            if let Some(stack) = &g.stack {
                write!(f, "{stack}")?;
            }
        }
        Ok(())
    }
}

impl Tracker {
    /// A report of every tag's numbers, the overhead and the error counts; also checks the
    /// guard bytes of live blocks (diagnostic mode) and reports new overruns.
    ///
    /// Reads atomics only (and the record shards one at a time for the guard check); other
    /// threads keep allocating meanwhile.
    pub fn snapshot(&self) -> MemoryReport {
        let new_overruns = if self.diagnostics() { self.check_guards() } else { Vec::new() };
        // Untracked, as the tracker's own bookkeeping: the rows' block must not count
        // itself in the numbers it holds.
        let _untracked = Reentry::enter();
        let tags = self
            .all_tag_stats()
            .into_iter()
            .filter(|t| t.id == 0 || t.total_count > 0 || t.budget.is_some() || t.bytes > 0)
            .collect();
        MemoryReport {
            mode: self.mode(),
            tags,
            overhead_bytes: self.overhead_bytes(),
            live_records: self.live_records(),
            errors: self.error_counts(),
            new_overruns,
        }
    }

    /// Live records grouped by (tag, site, stack), largest total first. In diagnostic mode
    /// it first checks the guard bytes of live blocks, like [`Tracker::snapshot`].
    pub fn leak_report(&self) -> LeakReport {
        if self.diagnostics() {
            let _ = self.check_guards(); // logged and counted
        }
        let mut records = self.collect_records();
        records.sort_by_key(|(_, r)| (r.tag, r.stack, r.site.file(), r.site.line(), r.site.column()));
        let mut groups: Vec<LeakGroup> = Vec::new();
        let mut last: Option<(TagId, u32, &'static Location<'static>)> = None;
        let mut report = LeakReport::default();
        for (_, r) in records {
            report.total_count += 1;
            report.total_bytes = report.total_bytes.saturating_add(r.size);
            let key = (r.tag, r.stack, r.site);
            if last == Some(key) {
                let g = groups.last_mut().expect("a group exists for the last key");
                g.count += 1;
                g.bytes = g.bytes.saturating_add(r.size);
            } else {
                groups.push(LeakGroup {
                    tag: r.tag,
                    tag_name: r.tag.name(),
                    site: (r.flags & FLAG_GLOBAL_ALLOC == 0).then_some(r.site),
                    stack: self.stacks.get(r.stack),
                    count: 1,
                    bytes: r.size,
                });
                last = Some(key);
            }
        }
        groups.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(b.count.cmp(&a.count)));
        report.groups = groups;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_format() {
        assert_eq!(Bytes(10).to_string(), "10 B");
        assert_eq!(Bytes(2048).to_string(), "2.0 KiB");
        assert_eq!(Bytes(3 << 20).to_string(), "3.0 MiB");
    }

    #[test]
    fn leak_groups_are_largest_first() {
        let t = Tracker::with_mode(Mode::Records);
        let a = t.tag_named("report-unit-a");
        let small = [0u8; 1];
        let big = [0u8; 1];
        let big2 = [0u8; 1];
        t.track(small.as_ptr(), 10, a);
        for p in [big.as_ptr(), big2.as_ptr()] {
            t.track(p, 100, a); // same site: one group
        }
        let r = t.leak_report();
        assert_eq!(r.total_count, 3);
        assert_eq!(r.total_bytes, 210);
        assert_eq!(r.groups.len(), 2);
        assert_eq!((r.groups[0].count, r.groups[0].bytes), (2, 200));
        assert!(r.to_string().contains("#1 200 B in 2 allocation(s), tag report-unit-a"));
        let snap = t.snapshot();
        assert_eq!(snap.tag(a).unwrap().bytes, 210);
        assert!(snap.to_string().contains("report-unit-a"));
    }
}
