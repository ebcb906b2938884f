//! Writing leak forensics as text: object names, retention paths, cycles,
//! leak entries and the leak report.
//!
//! One writer per output. [`write_report`] is the only place a leak report
//! is laid out: `Display for ObjectLeakReport`, the shutdown log and
//! [`ObjectManager::assert_released_since`](crate::ObjectManager::assert_released_since)
//! all go through it, and it writes each entry with [`EntryText`], which is
//! also `{:#}` of a [`LeakEntry`].

use std::collections::HashMap;
use std::fmt::{self, Display, Formatter};
use std::hash::BuildHasherDefault;
use std::panic::Location;

use super::forensics::{Holder, ObjectName, ReferenceCycle, RetentionPath, RetentionRoot};
use super::forensics_graph::{HEAD, KEPT, TAIL};
use super::leak::{AddressHasher, LeakEntry, ObjectLeakReport};

/// Rows of the by-type and by-site tables, roots and cycles shown before "… and N more".
const SUMMARY_ROWS: usize = 10;
/// Holders named on an entry's "held by" line before "… and N more".
const HOLDERS_SHOWN: usize = 5;

impl Display for ObjectName {
    /// `Texture#3`
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.type_name, self.key)
    }
}

impl Display for Holder {
    /// `Material#7.albedo`
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.object)?;
        if !self.field.is_empty() {
            write!(f, ".{}", self.field)?;
        }
        Ok(())
    }
}

/// One link of a chain: an object and the field holding the next link.
type Link = (ObjectName, &'static str);

/// Writes `head`, then `… (hidden more) …` if `hidden > 0`, then `tail`:
/// `a.field -> b.field -> c`.
fn write_links(f: &mut Formatter<'_>, head: &[Link], hidden: usize, tail: &[Link]) -> fmt::Result {
    for (i, (link, field)) in head.iter().chain(tail).enumerate() {
        if i > 0 {
            f.write_str(" -> ")?;
        }
        if i == head.len() && hidden > 0 {
            write!(f, "… ({hidden} more) … -> ")?;
        }
        write!(f, "{link}")?;
        if !field.is_empty() {
            write!(f, ".{field}")?;
        }
    }
    Ok(())
}

/// Writes a chain, shortened in the middle past [`KEPT`] links.
fn write_chain(f: &mut Formatter<'_>, links: &[Link], hidden: usize) -> fmt::Result {
    if hidden > 0 {
        let split = HEAD.min(links.len());
        return write_links(f, &links[..split], hidden, &links[split..]);
    }
    if links.len() <= KEPT {
        return write_links(f, links, 0, &[]);
    }
    write_links(f, &links[..HEAD], links.len() - HEAD - TAIL, &links[links.len() - TAIL..])
}

impl Display for ReferenceCycle {
    /// `Widget#4.children -> Widget#5.parent -> Widget#4`
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let cycle = self.cycle();
        let closed: Vec<Link> =
            cycle.iter().copied().zip(self.fields.iter().copied()).chain(cycle.first().map(|&m| (m, ""))).collect();
        write_chain(f, &closed, 0)?;
        let rest = self.members.len() - self.cycle_len;
        if rest > 0 {
            write!(f, " (and {rest} more object(s) in the same group)")?;
        }
        Ok(())
    }
}

impl Display for RetentionPath {
    /// `Level#1.materials -> Material#7.albedo -> Texture#3 (Level#1 is held from outside: 1 of its 1 references)`;
    /// for a chain of one, only what holds it.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let Some(first) = self.chain.first() else { return Ok(()) };
        if self.len() == 1 {
            return match &self.root {
                RetentionRoot::Outside { outside, total } => {
                    write!(f, "references from outside the manager ({outside} of its {total})")
                }
                RetentionRoot::Cycle(cycle) => write!(f, "a reference cycle: {cycle}"),
                RetentionRoot::Unaccounted => write!(f, "nothing found (counts changed during the analysis)"),
            };
        }
        let links: Vec<Link> = self.chain.iter().copied().zip(self.fields.iter().copied().chain([""])).collect();
        write_chain(f, &links, self.hidden)?;
        match &self.root {
            RetentionRoot::Outside { outside, total } => {
                write!(f, " ({first} is held from outside: {outside} of its {total} references)")
            }
            RetentionRoot::Cycle(cycle) => write!(f, " ({first} is in a reference cycle: {cycle})"),
            RetentionRoot::Unaccounted => {
                write!(f, " (no holder of {first} found: counts changed during the analysis)")
            }
        }
    }
}

/// `file:line:col`
struct Site(&'static Location<'static>);

impl Display for Site {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.0.file(), self.0.line(), self.0.column())
    }
}

/// A count with thousands separators: `100,005`.
pub(crate) struct Count(pub(crate) usize);

impl Display for Count {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let digits = self.0.to_string();
        let mut out = String::with_capacity(digits.len() + digits.len() / 3);
        for (i, digit) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(digit);
        }
        f.pad(&out)
    }
}

/// Bytes for people: `512 B`, `12.5 KiB`, `6.1 MiB`.
pub(crate) struct Bytes(pub(crate) usize);

impl Display for Bytes {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
        if self.0 < 10 * 1024 {
            return f.pad(&format!("{} B", self.0));
        }
        let mut value = self.0 as f64 / 1024.0;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        f.pad(&format!("{value:.1} {}", UNITS[unit]))
    }
}

impl Display for LeakEntry {
    /// `Material#3 (refs: 1, 16 B) created at src/level.rs:42:17`; with
    /// `{:#}`, the whole entry as the leak report writes it.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}{} (refs: {}, {} B) created at {}",
            self.type_name,
            self.key,
            self.ref_count,
            self.size,
            Site(self.site)
        )?;
        if f.alternate() {
            write_entry_details(f, self)?;
        }
        Ok(())
    }
}

/// The lines under an entry: who holds it, why it is alive, its handles'
/// sites, its creation stack.
fn write_entry_details(f: &mut Formatter<'_>, entry: &LeakEntry) -> fmt::Result {
    if entry.retention.is_some() || !entry.holders.is_empty() {
        f.write_str("\n    held by: ")?;
        for (i, holder) in entry.holders.iter().take(HOLDERS_SHOWN).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{holder}")?;
        }
        if entry.holders.len() > HOLDERS_SHOWN {
            write!(f, " … and {} more", Count(entry.holders.len() - HOLDERS_SHOWN))?;
        }
        let outside = entry.outside_refs();
        if outside > 0 {
            if !entry.holders.is_empty() {
                f.write_str("; ")?;
            }
            let plural = if outside == 1 { "" } else { "s" };
            write!(f, "{outside} reference{plural} from outside the manager (variables, systems, raw handles)")?;
        }
    }
    if let Some(path) = &entry.retention {
        // A chain of one held from outside is what "held by" just said.
        if path.len() > 1 || !path.is_held_from_outside() {
            write!(f, "\n    kept alive by: {path}")?;
        }
    }
    if let Some(sites) = entry.handle_sites_line() {
        write!(f, "\n    handles: {sites}")?;
    }
    if let Some(stack) = &entry.stack {
        write!(f, "\n    creation stack:\n{stack}")?;
    }
    Ok(())
}

/// A leak report's text, for `Display` and [`ObjectLeakReport::display_with`].
pub(crate) struct ReportText<'a> {
    pub(crate) report: &'a ObjectLeakReport,
    /// The first line, followed by the bytes; `None` for "N leaked object(s):".
    pub(crate) header: Option<&'a str>,
    pub(crate) per_site: usize,
}

impl Display for ReportText<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let mut first = true;
        write_report(self.report, self.header, self.per_site, &mut |block| {
            if !std::mem::take(&mut first) {
                f.write_str("\n")?;
            }
            write!(f, "{block}")
        })
    }
}

impl Display for ObjectLeakReport {
    /// The summary, roots, cycles and capped details; `{:#}` details every object.
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let per_site = if f.alternate() { usize::MAX } else { Self::DETAILS_PER_SITE };
        write!(f, "{}", ReportText { report: self, header: None, per_site })
    }
}

/// Formats through a closure.
struct WithFmt<F>(F);

impl<F: Fn(&mut Formatter<'_>) -> fmt::Result> Display for WithFmt<F> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        (self.0)(f)
    }
}

/// Lays out a leak report as blocks (each one log record): the summary, the
/// roots, the cycles, then each detailed entry and each "… and N more".
///
/// `header` replaces the start of the first line, "N leaked object(s):",
/// which ends with the leaked bytes. Costs
/// O(entries) plus the shown blocks, whatever the number of entries.
pub(crate) fn write_report(
    report: &ObjectLeakReport,
    header: Option<&str>,
    per_site: usize,
    sink: &mut dyn FnMut(&dyn Display) -> fmt::Result,
) -> fmt::Result {
    write_report_with_hidden(report, header, per_site, true, sink, &mut |_| {})
}

/// [`write_report`], also calling `hidden` with each entry left out of the
/// details; `footer` adds the drop panics and outliving handles.
pub(crate) fn write_report_with_hidden(
    report: &ObjectLeakReport,
    header: Option<&str>,
    per_site: usize,
    footer: bool,
    sink: &mut dyn FnMut(&dyn Display) -> fmt::Result,
    hidden: &mut dyn FnMut(&LeakEntry),
) -> fmt::Result {
    if report.is_empty() {
        sink(&"no leaked objects")?;
        return if footer { write_footer(report, sink) } else { Ok(()) };
    }
    let by_site = report.by_site();
    sink(&WithFmt(|f: &mut Formatter<'_>| write_summary(f, report, header, &by_site)))?;
    if !report.roots.is_empty() {
        sink(&WithFmt(|f: &mut Formatter<'_>| write_roots(f, report)))?;
    }
    for (i, cycle) in report.cycles.iter().enumerate().take(SUMMARY_ROWS) {
        let retains = report.cycle_retains.get(i).copied().unwrap_or(0);
        sink(&WithFmt(|f: &mut Formatter<'_>| {
            write!(f, "cycle: {cycle}")?;
            if retains > 0 {
                write!(f, " (retains {} more object(s))", Count(retains))?;
            }
            Ok(())
        }))?;
    }
    if report.cycles.len() > SUMMARY_ROWS {
        let more = report.cycles.len() - SUMMARY_ROWS;
        sink(&WithFmt(|f: &mut Formatter<'_>| write!(f, "… and {} more cycle(s)", Count(more))))?;
    }
    // Details, site by site in the order of the summary.
    // Grouped by address first (cheap), then by text: one call site can
    // have several `Location`s (Miri makes one per call).
    let mut at_address: HashMap<SiteKey, Vec<&LeakEntry>, BuildHasherDefault<AddressHasher>> = HashMap::default();
    for entry in &report.entries {
        at_address.entry(site_key(entry.type_name, entry.site)).or_default().push(entry);
    }
    let mut at_site: HashMap<SiteText, Vec<&LeakEntry>> = HashMap::with_capacity(at_address.len());
    for (_, entries) in at_address {
        let first = entries[0];
        match at_site.entry(site_text(first.type_name, first.site)) {
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(entries);
            }
            std::collections::hash_map::Entry::Occupied(mut slot) => {
                let merged = slot.get_mut();
                merged.extend(entries);
                merged.sort_by_key(|entry| entry.key);
            }
        }
    }
    let mut groups: Vec<Vec<&LeakEntry>> = Vec::with_capacity(by_site.len());
    for tally in &by_site {
        let site = tally.site.expect("tallies by site have a site");
        groups.extend(at_site.remove(&site_text(tally.type_name, site)));
    }
    for entries in groups {
        for entry in entries.iter().take(per_site) {
            sink(&WithFmt(|f: &mut Formatter<'_>| write!(f, "leaked {entry:#}")))?;
        }
        if entries.len() > per_site {
            let (more, last) = (entries.len() - per_site, entries[per_site]);
            sink(&WithFmt(|f: &mut Formatter<'_>| {
                write!(f, "… and {} more {} created at {}", Count(more), last.type_name, Site(last.site))
            }))?;
            entries[per_site..].iter().for_each(|entry| hidden(entry));
        }
    }
    if footer {
        write_footer(report, sink)?;
    }
    Ok(())
}

/// A (type, site) group, by the address and length of the type name (a
/// name may start where a longer one does) and the address of the `Location`.
type SiteKey = (usize, usize, usize);

fn site_key(type_name: &'static str, site: &'static Location<'static>) -> SiteKey {
    (type_name.as_ptr() as usize, type_name.len(), std::ptr::from_ref(site) as usize)
}

/// A (type, site) group, by text.
type SiteText = (&'static str, &'static str, u32, u32);

fn site_text(type_name: &'static str, site: &'static Location<'static>) -> SiteText {
    (type_name, site.file(), site.line(), site.column())
}

fn write_footer(report: &ObjectLeakReport, sink: &mut dyn FnMut(&dyn Display) -> fmt::Result) -> fmt::Result {
    if report.drop_panics > 0 {
        let panics = report.drop_panics;
        sink(&WithFmt(|f: &mut Formatter<'_>| write!(f, "{panics} Drop impl(s) panicked during shutdown")))?;
    }
    if report.outliving_handles > 0 {
        let (objects, bytes, reserved) = (report.outliving_handles, report.leaked_bytes, report.owner_reserved);
        sink(&WithFmt(|f: &mut Formatter<'_>| {
            write!(f, "{objects} object(s) referenced by handles outliving the manager")?;
            if reserved > 0 {
                write!(f, " ({reserved} perhaps only by the owner thread's reserved counts)")?;
            }
            write!(f, "; {bytes} bytes leaked on purpose")
        }))?;
    }
    Ok(())
}

fn write_summary(
    f: &mut Formatter<'_>,
    report: &ObjectLeakReport,
    header: Option<&str>,
    by_site: &[super::leak::LeakTally],
) -> fmt::Result {
    match header {
        Some(header) => write!(f, "{header} {}", Bytes(report.total_bytes()))?,
        None => write!(f, "{} leaked object(s): {}", Count(report.len()), Bytes(report.total_bytes()))?,
    }
    let by_type = report.by_type();
    let count_width = Count(report.len()).to_string().len();
    let bytes_width = by_type.iter().map(|t| Bytes(t.bytes).to_string().len()).max().unwrap_or(1);
    f.write_str("\n  by type:")?;
    for tally in by_type.iter().take(SUMMARY_ROWS) {
        write!(
            f,
            "\n    {:>count_width$}  {:>bytes_width$}  {}",
            Count(tally.count),
            Bytes(tally.bytes),
            tally.type_name
        )?;
    }
    if by_type.len() > SUMMARY_ROWS {
        write!(f, "\n    … and {} more type(s)", by_type.len() - SUMMARY_ROWS)?;
    }
    f.write_str("\n  by creation site:")?;
    for tally in by_site.iter().take(SUMMARY_ROWS) {
        let site = Site(tally.site.expect("tallies by site have a site"));
        let (count, bytes) = (Count(tally.count), Bytes(tally.bytes));
        write!(f, "\n    {count:>count_width$}  {bytes:>bytes_width$}  {} at {site}", tally.type_name)?;
    }
    if by_site.len() > SUMMARY_ROWS {
        write!(f, "\n    … and {} more site(s)", Count(by_site.len() - SUMMARY_ROWS))?;
    }
    Ok(())
}

fn write_roots(f: &mut Formatter<'_>, report: &ObjectLeakReport) -> fmt::Result {
    f.write_str("roots: held from outside the manager, keeping other leaks alive")?;
    for root in report.roots.iter().take(SUMMARY_ROWS) {
        write!(
            f,
            "\n  {} retains {} object(s), {} ({} of its {} references from outside)",
            root.object,
            Count(root.retains),
            Bytes(root.retained_bytes),
            root.outside,
            root.total
        )?;
    }
    if report.roots.len() > SUMMARY_ROWS {
        write!(f, "\n  … and {} more root(s)", Count(report.roots.len() - SUMMARY_ROWS))?;
    }
    Ok(())
}

/// A panic's message, when it is a string.
pub(crate) struct PanicMessage<'a>(pub(crate) &'a (dyn std::any::Any + Send));

impl Display for PanicMessage<'_> {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match (self.0.downcast_ref::<&str>(), self.0.downcast_ref::<String>()) {
            (Some(message), _) => f.write_str(message),
            (_, Some(message)) => f.write_str(message),
            _ => f.write_str("(a panic payload that is not a string)"),
        }
    }
}

/// Logs the shutdown report: one `emit` per block (summary, roots, each
/// cycle, each detailed entry). With `debug` enabled for the target
/// `mmobject::leaks`, every entry left out of the details is logged there too.
pub(crate) fn log_shutdown_report(report: &ObjectLeakReport, manager_id: u32, emit: &mut dyn FnMut(&str)) {
    let header = format!("{} object(s) still alive at shutdown of object manager #{manager_id}:", Count(report.len()));
    let all = log::log_enabled!(target: "mmobject::leaks", log::Level::Debug);
    let mut sink = |block: &dyn Display| {
        emit(&block.to_string());
        Ok(())
    };
    let _ = write_report_with_hidden(
        report,
        Some(&header),
        ObjectLeakReport::DETAILS_PER_SITE,
        false,
        &mut sink,
        &mut |entry| {
            if all {
                log::debug!(target: "mmobject::leaks", "leaked {entry:#}");
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_bytes_read_easily() {
        assert_eq!(Count(0).to_string(), "0");
        assert_eq!(Count(999).to_string(), "999");
        assert_eq!(Count(1000).to_string(), "1,000");
        assert_eq!(Count(100_005).to_string(), "100,005");
        assert_eq!(Count(1_234_567).to_string(), "1,234,567");
        assert_eq!(format!("{:>7}", Count(1000)), "  1,000");
        assert_eq!(Bytes(512).to_string(), "512 B");
        assert_eq!(Bytes(10 * 1024).to_string(), "10.0 KiB");
        assert_eq!(Bytes(6_400_000).to_string(), "6.1 MiB");
    }
}
