//! A per-frame record of live objects and bytes by type, drawn as an SVG chart: [`MemoryTimeline`].

use std::fmt::Write as _;
use std::path::Path;

use super::report::ObjectMemoryReport;

const WIDTH: f64 = 1000.0;
const PANEL_HEIGHT: f64 = 280.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 780.0;
const TOP: f64 = 60.0;
const GAP: f64 = 70.0;
const COLORS: [&str; 10] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];

/// Live objects and bytes per type, one sample per frame, drawn as an SVG chart.
///
/// Call [`sample`](Self::sample) once a frame with
/// [`ObjectManager::report`](crate::ObjectManager::report) (which costs
/// O(live)), then [`write_svg`](Self::write_svg) at the end. The chart has
/// two panels, live objects and bytes (live plus released but not yet
/// collected), with one line per type, axes with labels and a legend. A leak
/// shows as a line that keeps rising.
///
/// # Examples
///
/// ```
/// use mmobject::{MMObject, MemoryTimeline, ObjectManager};
///
/// #[derive(MMObject)]
/// struct Entity { hp: u32 }
///
/// let mut mm = ObjectManager::new();
/// let mut timeline = MemoryTimeline::new();
/// let mut leaked = Vec::new();
/// for frame in 0..10 {
///     leaked.push(mm.create(Entity { hp: frame }));
///     mm.collect_garbage();
///     timeline.sample(u64::from(frame), &mm.report());
/// }
/// assert_eq!(timeline.len(), 10);
/// assert_eq!(timeline.live_of("Entity").last(), Some(&10));
/// let svg = timeline.to_svg();
/// assert!(svg.starts_with("<svg") && svg.contains("Entity"));
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryTimeline {
    frames: Vec<u64>,
    /// Type names, in the order they first appeared.
    types: Vec<&'static str>,
    /// `live[t][s]`: live objects of type `t` at sample `s`.
    live: Vec<Vec<usize>>,
    /// `bytes[t][s]`: bytes of type `t` at sample `s`.
    bytes: Vec<Vec<usize>>,
}

impl MemoryTimeline {
    /// An empty timeline.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one frame: each type's live objects and bytes from `report`.
    /// Types missing from the report count as zero. Lines are told apart by
    /// type name ([`MMObject::TYPE_NAME`](crate::MMObject::TYPE_NAME)): two
    /// types with the same name (`a::Node` and `b::Node`) share one line,
    /// their numbers summed.
    pub fn sample(&mut self, frame: u64, report: &ObjectMemoryReport) {
        let samples = self.frames.len();
        self.frames.push(frame);
        for line in &report.types {
            let t = match self.types.iter().position(|&name| name == line.type_name) {
                Some(t) => t,
                None => {
                    self.types.push(line.type_name);
                    self.live.push(vec![0; samples]);
                    self.bytes.push(vec![0; samples]);
                    self.types.len() - 1
                }
            };
            match (self.live[t].get_mut(samples), self.bytes[t].get_mut(samples)) {
                // A type of the same name, sampled already in this frame.
                (Some(live), Some(bytes)) => {
                    *live = live.saturating_add(line.live);
                    *bytes = bytes.saturating_add(line.bytes);
                }
                _ => {
                    self.live[t].push(line.live);
                    self.bytes[t].push(line.bytes);
                }
            }
        }
        for series in self.live.iter_mut().chain(self.bytes.iter_mut()) {
            series.resize(samples + 1, 0);
        }
    }

    /// Samples taken.
    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// True if no sample was taken.
    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    /// The live-object series of one type (empty if the type never appeared).
    pub fn live_of(&self, type_name: &str) -> &[usize] {
        self.types.iter().position(|&name| name == type_name).map_or(&[], |t| &self.live[t])
    }

    /// The byte series of one type (empty if the type never appeared).
    pub fn bytes_of(&self, type_name: &str) -> &[usize] {
        self.types.iter().position(|&name| name == type_name).map_or(&[], |t| &self.bytes[t])
    }

    /// Writes the chart to `path` as SVG.
    ///
    /// # Errors
    ///
    /// Any I/O error from creating or writing the file.
    pub fn write_svg(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        std::fs::write(path, self.to_svg())
    }

    /// The chart as an SVG document.
    pub fn to_svg(&self) -> String {
        let height = TOP + 2.0 * PANEL_HEIGHT + GAP + 60.0;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="12">"#
        );
        let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="28" font-size="18" text-anchor="middle">mmobject memory timeline ({} frames)</text>"#,
            (LEFT + RIGHT) / 2.0,
            self.frames.len()
        );
        self.panel(&mut svg, TOP, "Live objects", &self.live, false);
        self.panel(&mut svg, TOP + PANEL_HEIGHT + GAP, "Bytes (live + awaiting collection)", &self.bytes, true);
        self.legend(&mut svg);
        svg.push_str("</svg>\n");
        svg
    }

    /// One chart: a title, a grid with y labels, x ticks, axes and a line per type.
    /// Byte ticks fall on round numbers of the largest binary unit that fits.
    fn panel(&self, svg: &mut String, top: f64, title: &str, series: &[Vec<usize>], bytes: bool) {
        let bottom = top + PANEL_HEIGHT;
        let max = series.iter().flatten().copied().max().unwrap_or(0).max(1) as f64;
        let (unit, unit_name) = if bytes { binary_unit(max) } else { (1.0, "") };
        let step = (nice_step(max / unit / 5.0) * unit).max(1.0);
        let y_max = (max / step).ceil() * step;
        let decimals = usize::from(step < unit);
        let label = |value: f64| {
            if bytes {
                format!("{:.decimals$} {unit_name}", value / unit)
            } else {
                format_count(value)
            }
        };
        let (first, last) = (self.frames.first().copied().unwrap_or(0), self.frames.last().copied().unwrap_or(1));
        let span = (last.saturating_sub(first)).max(1) as f64;
        let x = |frame: u64| LEFT + (frame.saturating_sub(first)) as f64 / span * (RIGHT - LEFT);
        let y = |value: f64| bottom - value / y_max * PANEL_HEIGHT;

        let _ =
            writeln!(svg, r#"<text x="{LEFT}" y="{}" font-size="14" font-weight="bold">{title}</text>"#, top - 10.0);
        // Horizontal grid lines and y labels.
        let mut tick = 0.0;
        while tick <= y_max + step / 2.0 {
            let at = y(tick);
            let _ = writeln!(svg, r##"<line x1="{LEFT}" y1="{at:.1}" x2="{RIGHT}" y2="{at:.1}" stroke="#e0e0e0"/>"##);
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                at + 4.0,
                label(tick)
            );
            tick += step;
        }
        // X ticks and labels.
        let x_step = nice_step(span / 8.0).max(1.0) as u64;
        let mut frame = first.div_ceil(x_step) * x_step;
        while frame <= last {
            let at = x(frame);
            let _ = writeln!(
                svg,
                r##"<line x1="{at:.1}" y1="{bottom}" x2="{at:.1}" y2="{}" stroke="#444"/>"##,
                bottom + 5.0
            );
            let _ = writeln!(svg, r#"<text x="{at:.1}" y="{}" text-anchor="middle">{frame}</text>"#, bottom + 18.0);
            frame += x_step;
        }
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">frame</text>"#,
            (LEFT + RIGHT) / 2.0,
            bottom + 34.0
        );
        // Axes.
        let _ = writeln!(
            svg,
            r##"<path d="M{LEFT},{top} L{LEFT},{bottom} L{RIGHT},{bottom}" fill="none" stroke="#444"/>"##
        );
        // One line per type.
        for (t, values) in series.iter().enumerate() {
            let mut points = String::new();
            for (&frame, &value) in self.frames.iter().zip(values) {
                let _ = write!(points, "{:.1},{:.1} ", x(frame), y(value as f64));
            }
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{}" stroke-width="2"/>"#,
                points.trim_end(),
                COLORS[t % COLORS.len()]
            );
        }
    }

    fn legend(&self, svg: &mut String) {
        let x = RIGHT + 30.0;
        let _ = writeln!(
            svg,
            r#"<text x="{x}" y="{}" font-size="14" font-weight="bold">type (last: live, bytes)</text>"#,
            TOP - 10.0
        );
        for (t, name) in self.types.iter().enumerate() {
            let y = TOP + 10.0 + 22.0 * t as f64;
            let color = COLORS[t % COLORS.len()];
            let live = self.live[t].last().copied().unwrap_or(0);
            let bytes = self.bytes[t].last().copied().unwrap_or(0);
            let _ = writeln!(
                svg,
                r#"<line x1="{x}" y1="{y}" x2="{}" y2="{y}" stroke="{color}" stroke-width="3"/>"#,
                x + 20.0
            );
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}">{} ({}, {})</text>"#,
                x + 26.0,
                y + 4.0,
                escape(name),
                format_count(live as f64),
                format_bytes(bytes as f64)
            );
        }
    }
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    if raw <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * power).find(|&s| s >= raw).unwrap_or(10.0 * power)
}

/// The largest of B, KiB, MiB, GiB not above `max`, and its name.
fn binary_unit(max: f64) -> (f64, &'static str) {
    [(1024.0 * 1024.0 * 1024.0, "GiB"), (1024.0 * 1024.0, "MiB"), (1024.0, "KiB")]
        .into_iter()
        .find(|&(unit, _)| max >= unit)
        .unwrap_or((1.0, "B"))
}

fn format_count(value: f64) -> String {
    if value >= 1e6 {
        format!("{:.1}M", value / 1e6)
    } else if value >= 1e4 {
        format!("{:.0}k", value / 1e3)
    } else {
        format!("{value:.0}")
    }
}

fn format_bytes(value: f64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = value;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 || value >= 100.0 {
        format!("{value:.0} {}", UNITS[unit])
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::TypeReport;

    fn report(live: usize) -> ObjectMemoryReport {
        ObjectMemoryReport {
            types: vec![TypeReport {
                type_name: "A<B>",
                tag: "A",
                live,
                peak_live: live,
                dead_pending: 0,
                bytes: live * 100,
                slot_bytes: 32,
                created: live as u64,
                destroyed: 0,
            }],
        }
    }

    #[test]
    fn late_types_are_padded_with_zeros() {
        let mut timeline = MemoryTimeline::new();
        timeline.sample(0, &ObjectMemoryReport::default());
        timeline.sample(1, &report(3));
        timeline.sample(2, &ObjectMemoryReport::default());
        assert_eq!(timeline.live_of("A<B>"), &[0, 3, 0]);
        assert_eq!(timeline.bytes_of("A<B>"), &[0, 300, 0]);
        let svg = timeline.to_svg();
        assert!(svg.contains("A&lt;B&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 2);
    }

    #[test]
    fn types_of_one_name_share_a_line() {
        let mut two = report(3);
        two.types.extend(report(5).types);
        let mut timeline = MemoryTimeline::new();
        timeline.sample(0, &two);
        timeline.sample(1, &report(2));
        assert_eq!(timeline.live_of("A<B>"), &[8, 2]);
        assert_eq!(timeline.bytes_of("A<B>"), &[800, 200]);
    }

    #[test]
    fn steps_and_units() {
        // Miri perturbs float functions slightly, so compare with a tolerance.
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9 * b;
        assert!(close(nice_step(0.3), 0.5));
        assert!(close(nice_step(7.0), 10.0));
        assert!(close(nice_step(120.0), 200.0));
        assert_eq!(format_bytes(1536.0), "1.5 KiB");
        assert_eq!(format_count(25_000.0), "25k");
    }
}
