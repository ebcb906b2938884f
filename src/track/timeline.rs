//! The per-frame timeline: [`Tracker::frame_mark`] samples every tag's bytes, and
//! [`Tracker::write_csv`] writes one row per frame and one column per tag, ready to plot.

use std::io::{self, Write};

use super::table::{SpinLock, SysVec};
use super::tag::{self, MAX_TAGS};
use super::tracker::Tracker;

/// Samples in `System` memory. Each frame is stored as `[frame, n, bytes_0 .. bytes_n-1]`,
/// where `n` is the number of tags registered at that frame.
#[derive(Debug)]
pub(crate) struct Timeline {
    inner: SpinLock<(SysVec<usize>, usize)>,
}

impl Timeline {
    pub(crate) const fn new() -> Self {
        Self { inner: SpinLock::new((SysVec::new(), 0)) }
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        self.inner.lock().0.heap_bytes()
    }
}

impl Tracker {
    /// Samples every tag's current bytes as one frame of the timeline; returns the frame's
    /// number (0, 1, 2, ...). Call once per frame.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{Tag, Tracker};
    ///
    /// static MESHES: Tag = Tag::new("Meshes");
    /// let tracker = Tracker::new();
    /// for frame in 0..3 {
    ///     tracker.try_charge(MESHES.id(), 100)?;
    ///     assert_eq!(tracker.frame_mark(), frame);
    /// }
    /// let mut csv = Vec::new();
    /// tracker.write_csv(&mut csv)?;
    /// let csv = String::from_utf8(csv).unwrap();
    /// assert!(csv.starts_with("frame,Untagged,"));
    /// assert_eq!(csv.lines().count(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn frame_mark(&self) -> usize {
        let n = tag::registered_count();
        let mut sample = [0usize; MAX_TAGS];
        for (i, s) in sample[..n].iter_mut().enumerate() {
            let tag = super::TagId(i as u32);
            *s = self.counters[i].current(|| self.pending(tag)).0;
        }
        let mut g = self.timeline.inner.lock();
        let (rows, frames) = &mut *g;
        let frame = *frames;
        let mut ok = rows.push(frame) && rows.push(n);
        for &s in &sample[..n] {
            ok = ok && rows.push(s);
        }
        if ok {
            *frames += 1;
        } else {
            // Out of System memory: drop the timeline rather than keep a torn row.
            rows.clear();
            *frames = 0;
        }
        frame
    }

    /// The number of frames sampled so far.
    pub fn timeline_frames(&self) -> usize {
        self.timeline.inner.lock().1
    }

    /// Forgets all samples.
    pub fn clear_timeline(&self) {
        let mut g = self.timeline.inner.lock();
        g.0.clear();
        g.1 = 0;
    }

    /// Writes the timeline as CSV: a header `frame,<tag>,<tag>,...` (every registered tag,
    /// in id order), then one row of byte counts per frame, the frames as they were at one
    /// moment (a concurrent [`Tracker::clear_timeline`] comes wholly before or after).
    ///
    /// # Errors
    ///
    /// Any error from `out`.
    pub fn write_csv(&self, mut out: impl Write) -> io::Result<()> {
        // Copy the samples out whole, under one lock, without allocating while it is held:
        // the buffer is sized first, and if the timeline outgrew it meanwhile, sized again.
        // (A prefix of the length seen first is not enough: a `clear_timeline` and new
        // frames in between may put a frame's boundary elsewhere, and the copy would end
        // inside a frame.)
        let mut rows: Vec<usize> = Vec::new();
        loop {
            let len = self.timeline.inner.lock().0.len();
            rows.reserve(len);
            let g = self.timeline.inner.lock();
            if g.0.len() <= rows.capacity() {
                // Cannot reallocate: the capacity covers the whole copy.
                rows.extend_from_slice(g.0.as_slice());
                break;
            }
        }
        let (names, n) = tag::registered_names();
        let mut line = String::from("frame");
        for name in &names[..n] {
            line.push(',');
            push_csv_field(&mut line, name);
        }
        writeln!(out, "{line}")?;
        let mut i = 0;
        while i + 2 <= rows.len() {
            let (frame, tags) = (rows[i], rows[i + 1]);
            let values = &rows[i + 2..(i + 2 + tags).min(rows.len())];
            line.clear();
            line.push_str(&frame.to_string());
            for t in 0..n {
                line.push(',');
                line.push_str(&values.get(t).copied().unwrap_or(0).to_string());
            }
            writeln!(out, "{line}")?;
            i += 2 + tags;
        }
        Ok(())
    }
}

fn push_csv_field(line: &mut String, field: &str) {
    if field.contains([',', '"', '\n', '\r']) {
        line.push('"');
        line.push_str(&field.replace('"', "\"\""));
        line.push('"');
    } else {
        line.push_str(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_has_a_column_per_tag_and_a_row_per_frame() {
        let t = Tracker::new();
        let a = t.tag_named("timeline-unit-a");
        let b = t.tag_named("timeline-unit,b");
        t.try_charge(a, 5).unwrap();
        t.frame_mark();
        t.try_charge(b, 7).unwrap();
        t.frame_mark();
        let mut out = Vec::new();
        t.write_csv(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        let header: Vec<&str> = lines[0].split(',').collect();
        assert_eq!(header[0], "frame");
        assert!(lines[0].contains("\"timeline-unit,b\""));
        let col_a = header.iter().position(|h| *h == "timeline-unit-a").unwrap();
        let row1: Vec<&str> = lines[1].split(',').collect();
        assert_eq!(row1[0], "0");
        assert_eq!(row1[col_a], "5");
        assert!(lines[2].ends_with(",7") || lines[2].contains(",7,"));
        assert_eq!(t.timeline_frames(), 2);
        t.clear_timeline();
        assert_eq!(t.timeline_frames(), 0);
    }
}
