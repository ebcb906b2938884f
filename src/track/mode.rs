//! What the tracker records per allocation ([`Mode`], [`Sampling`]), and the packed
//! configuration word the allocator reads once per call.

use std::cell::Cell;
use std::fmt;

use super::MAX_STACK_DEPTH;

/// How much the tracker records per allocation.
///
/// # Examples
///
/// ```
/// use mmobject::track::{Mode, Sampling, Tracker};
///
/// let tracker = Tracker::with_mode(Mode::Stacks { depth: 5 });
/// assert_eq!(tracker.mode(), Mode::Stacks { depth: 5 });
/// tracker.set_mode(Mode::Sampled(Sampling::new(5, 256, 64 << 10, 64)));
/// assert_eq!(tracker.mode().stack_depth(), 5);
/// tracker.set_mode(Mode::Counting);
/// assert_eq!(tracker.mode(), Mode::Counting);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum Mode {
    /// Per-tag counters only: the cheapest mode.
    Counting,
    /// Counters plus one record per live allocation: size, tag and creation site.
    Records,
    /// Records plus `depth` raw return addresses per allocation (clamped to
    /// [`MAX_STACK_DEPTH`]).
    Stacks {
        /// Frames to keep.
        depth: usize,
    },
    /// Records with stacks for a sample of the allocations, by size (see [`Sampling`]):
    /// the cost of counting for small blocks, stacks where the bytes are.
    Sampled(Sampling),
}

/// Which allocations [`Mode::Sampled`] records, with a stack: none below `small` bytes,
/// one in `one_in` from `small` up to `large`, and every one of `large` bytes or more.
///
/// The three numbers are powers of two ([`Sampling::new`] rounds them up), so that a
/// [`Mode`] fits the tracker's configuration word. Sampling is per thread and
/// deterministic: every `one_in`-th middle-sized allocation of a thread.
///
/// # Examples
///
/// ```
/// use mmobject::track::Sampling;
///
/// let s = Sampling::new(8, 200, 50_000, 100);
/// assert_eq!((s.small(), s.large(), s.one_in()), (256, 65_536, 128));
/// assert_eq!(s.depth(), 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Sampling {
    /// Stack frames kept (at most `MAX_STACK_DEPTH`).
    depth: u8,
    /// log2 of `small` (`< 32`).
    small_log2: u8,
    /// log2 of `large` (`<= 63`, `>= small_log2`).
    large_log2: u8,
    /// log2 of `one_in` (`< 32`).
    one_in_log2: u8,
}

impl Sampling {
    /// Defaults: 5 frames; no record below 256 B; 1 in 64 up to 64 KiB; every
    /// allocation of 64 KiB or more.
    pub const DEFAULT: Sampling = Sampling::new(5, 256, 64 << 10, 64);

    /// Sampling with `depth` frames, nothing below `small` bytes, one in `one_in` up to
    /// `large` bytes, and everything from `large` up. Each number is rounded up to a power
    /// of two (`small` and `one_in` to at most 2^31, `large` to at least `small`); `depth`
    /// is clamped to [`MAX_STACK_DEPTH`].
    pub const fn new(depth: usize, small: usize, large: usize, one_in: usize) -> Sampling {
        const fn log2_up(n: usize, max: u32) -> u8 {
            let bits = if n <= 1 { 0 } else { usize::BITS - (n - 1).leading_zeros() };
            (if bits > max { max } else { bits }) as u8
        }
        let small_log2 = log2_up(small, 31);
        let large_log2 = log2_up(large, 63);
        Sampling {
            depth: (if depth > MAX_STACK_DEPTH { MAX_STACK_DEPTH } else { depth }) as u8,
            small_log2,
            large_log2: if large_log2 < small_log2 { small_log2 } else { large_log2 },
            one_in_log2: log2_up(one_in, 31),
        }
    }

    /// Stack frames kept per sampled allocation.
    pub const fn depth(self) -> usize {
        self.depth as usize
    }

    /// Allocations below this many bytes are never recorded.
    pub const fn small(self) -> usize {
        1 << self.small_log2
    }

    /// Allocations of this many bytes or more are always recorded.
    pub const fn large(self) -> usize {
        if (self.large_log2 as u32) < usize::BITS {
            1 << self.large_log2
        } else {
            usize::MAX
        }
    }

    /// One in this many allocations between `small` and `large` is recorded.
    pub const fn one_in(self) -> usize {
        1 << self.one_in_log2
    }

    const fn encode(self) -> u64 {
        SAMPLED
            | self.depth as u64
            | (self.small_log2 as u64) << 6
            | (self.large_log2 as u64) << 11
            | (self.one_in_log2 as u64) << 17
    }

    const fn decode(raw: u64) -> Sampling {
        Sampling {
            depth: (raw & 0x3f) as u8,
            small_log2: ((raw >> 6) & 0x1f) as u8,
            large_log2: ((raw >> 11) & 0x3f) as u8,
            one_in_log2: ((raw >> 17) & 0x1f) as u8,
        }
    }

    /// Whether this allocation of `size` bytes is recorded: one thread-local countdown in
    /// the middle range, nothing else.
    #[inline]
    pub(crate) fn samples(self, size: usize) -> bool {
        if size < self.small() {
            return false;
        }
        if size >= self.large() {
            return true;
        }
        SAMPLE_COUNTDOWN
            .try_with(|c| {
                let n = c.get();
                if n == 0 {
                    c.set((1u32 << self.one_in_log2) - 1);
                    true
                } else {
                    c.set(n - 1);
                    false
                }
            })
            .unwrap_or(false)
    }
}

impl Default for Sampling {
    fn default() -> Self {
        Sampling::DEFAULT
    }
}

thread_local! {
    /// Middle-sized allocations to skip before the next sampled one, on this thread.
    static SAMPLE_COUNTDOWN: Cell<u32> = const { Cell::new(0) };
}

/// The `Sampled` flag of an encoded mode (the other modes encode below 64).
const SAMPLED: u64 = 1 << 23;

impl Mode {
    const fn encode(self) -> u64 {
        match self {
            Mode::Counting => 0,
            Mode::Records => 1,
            Mode::Stacks { depth } => 2 + if depth > MAX_STACK_DEPTH { MAX_STACK_DEPTH } else { depth } as u64,
            Mode::Sampled(s) => s.encode(),
        }
    }

    const fn decode(raw: u64) -> Mode {
        if raw & SAMPLED != 0 {
            return Mode::Sampled(Sampling::decode(raw));
        }
        match raw {
            0 => Mode::Counting,
            1 => Mode::Records,
            n => Mode::Stacks { depth: n as usize - 2 },
        }
    }

    /// Whether this mode keeps a record for every allocation (`Sampled` keeps some).
    pub const fn keeps_records(self) -> bool {
        matches!(self, Mode::Records | Mode::Stacks { .. })
    }

    /// Stack frames kept per recorded allocation (0 in `Counting` and `Records`).
    pub const fn stack_depth(self) -> usize {
        match self {
            Mode::Stacks { depth } => depth,
            Mode::Sampled(s) => s.depth(),
            _ => 0,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Counting => f.write_str("counting"),
            Mode::Records => f.write_str("records"),
            Mode::Stacks { depth } => write!(f, "stacks (depth {depth})"),
            Mode::Sampled(s) => write!(
                f,
                "sampled (depth {}; none below {} B, 1 in {} below {} B, all above)",
                s.depth(),
                s.small(),
                s.one_in(),
                s.large()
            ),
        }
    }
}

/// One load of `Tracker::config`: the mode, the diagnostics flag, and the configuration
/// epoch, packed in a `u64` so the three are always read together.
///
/// Bits 0..22 and 23 hold `Mode::encode`, bit 22 [`Config::slow_tags`], bit 24 the
/// diagnostics flag, bits 25..31 the counting path's size shift (see
/// [`Config::counts_only`]), bit 31 [`Config::keeps_records`], bits 32..64 the epoch. The
/// shift and bit 31 are derived from the bits below them, so the allocator's fast path
/// tests them without decoding the mode.
///
/// Invariant (what makes the freed ring safe to trust, see `Tracker::decisive_double_free`):
/// every change of the mode or of the diagnostics flag adds one to the epoch, so two loads
/// with equal epochs saw the same mode and flag. The epoch saturates at `EPOCH_MAX` instead
/// of wrapping; from then on no ring entry is trusted (frees fall back to the header check).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Config(pub(crate) u64);

/// The diagnostic-mode bit of a [`Config`].
const DIAGNOSTICS: u64 = 1 << 24;
/// The bit of a [`Config`] set while some tag has a budget or a watch.
const SLOW_TAGS: u64 = 1 << 22;
/// The bits of a [`Config`] that hold `Mode::encode` (bit 22 is free in every encoding).
const MODE_BITS: u64 = (DIAGNOSTICS - 1) & !SLOW_TAGS;
/// The lowest bit of the counting path's size shift in a [`Config`].
const COUNTS_SHIFT: u32 = 25;
/// The keeps-records bit of a [`Config`].
const KEEPS_RECORDS: u64 = 1 << 31;
/// The epoch's lowest bit in a [`Config`].
pub(crate) const EPOCH_SHIFT: u32 = 32;
/// The largest epoch; it saturates there.
pub(crate) const EPOCH_MAX: u64 = u64::MAX >> EPOCH_SHIFT;

impl Config {
    pub(crate) const fn new(mode: Mode, diagnostics: bool) -> Config {
        Config::build(mode, diagnostics, false)
    }

    const fn build(mode: Mode, diagnostics: bool, slow_tags: bool) -> Config {
        let keeps = diagnostics || matches!(mode, Mode::Records | Mode::Stacks { .. });
        // Blocks under `1 << shift` bytes take the counting path: every size in counting
        // mode, those below the sampling threshold in sampled mode, none (a shift of 0
        // leaves every non-zero size) when every block gets a record or when some tag is
        // slow (then the allocator checks the tag out of line).
        let shift: u64 = match mode {
            _ if keeps || slow_tags => 0,
            Mode::Sampled(s) => s.small_log2 as u64,
            _ => 63,
        };
        Config(
            mode.encode()
                | if slow_tags { SLOW_TAGS } else { 0 }
                | if diagnostics { DIAGNOSTICS } else { 0 }
                | shift << COUNTS_SHIFT
                | if keeps { KEEPS_RECORDS } else { 0 },
        )
    }

    #[inline]
    pub(crate) const fn mode(self) -> Mode {
        Mode::decode(self.0 & MODE_BITS)
    }

    /// Whether some tag has a budget or a watch (see `Tracker::update_slow`): then the
    /// allocator's counting path checks each block's tag out of line.
    #[inline]
    pub(crate) const fn slow_tags(self) -> bool {
        self.0 & SLOW_TAGS != 0
    }

    /// This configuration with the slow-tags bit set to `on`, in the same epoch (the mode
    /// and the diagnostics flag are unchanged, so the epoch's invariant holds).
    pub(crate) const fn with_slow_tags(self, on: bool) -> Config {
        Config(Config::build(self.mode(), self.diagnostics(), on).0 | self.0 & !(u64::MAX >> (64 - EPOCH_SHIFT)))
    }

    #[inline]
    pub(crate) const fn diagnostics(self) -> bool {
        self.0 & DIAGNOSTICS != 0
    }

    /// The configuration epoch (see the type's invariant).
    #[inline]
    pub(crate) const fn epoch(self) -> u64 {
        self.0 >> EPOCH_SHIFT
    }

    /// Whether every tagged block placed under this configuration gets a record
    /// (`Records`/`Stacks` mode, or diagnostic mode). Sampling keeps only some, so it does
    /// not count: the freed ring's rule (see `Tracker::placed_without_record`) relies on
    /// this being `true` only where a block without a record is the exception.
    #[inline]
    pub(crate) const fn keeps_records(self) -> bool {
        self.0 & KEEPS_RECORDS != 0
    }

    /// Whether a tagged block of `size` bytes gets neither a record nor guards: the
    /// allocator's counting path. One shift and test, the mode left encoded.
    #[inline]
    pub(crate) const fn counts_only(self, size: usize) -> bool {
        (size as u64).wrapping_shr((self.0 >> COUNTS_SHIFT) as u32 & 63) == 0
    }

    /// [`counts_only`](Self::counts_only) as the mode and the diagnostics flag alone decide
    /// it (ignoring the slow-tags bit): for a tag that is not slow while others are.
    #[inline]
    pub(crate) const fn mode_counts_only(self, size: usize) -> bool {
        (size as u64).wrapping_shr(self.mode_shift()) == 0
    }

    /// The largest size [`mode_counts_only`](Self::mode_counts_only) accepts (0: none), for
    /// the allocator's per-thread cache, which compares sizes with it.
    pub(crate) const fn mode_limit(self) -> usize {
        let limit = (1u64 << self.mode_shift()) - 1;
        if limit > usize::MAX as u64 {
            usize::MAX
        } else {
            limit as usize
        }
    }

    /// The counting path's size shift as `build` derives it from the mode and the
    /// diagnostics flag alone.
    const fn mode_shift(self) -> u32 {
        match self.0 {
            raw if raw & KEEPS_RECORDS != 0 => 0,
            raw if raw & SAMPLED != 0 => Sampling::decode(raw & MODE_BITS).small_log2 as u32,
            _ => 63,
        }
    }

    /// Whether a tagged block of `size` bytes gets a record, and how many stack frames.
    #[inline]
    pub(crate) fn records(self, size: usize) -> Option<usize> {
        let raw = self.0 & MODE_BITS;
        if raw & SAMPLED != 0 {
            let s = Sampling::decode(raw);
            return (self.diagnostics() || s.samples(size)).then_some(s.depth());
        }
        // Counting encodes as 0, Records as 1, Stacks as 2 + depth (see `Mode::encode`).
        self.keeps_records().then_some((raw as usize).saturating_sub(2))
    }

    /// This configuration with another mode and flag, one epoch later (saturating).
    pub(crate) const fn changed(self, mode: Mode, diagnostics: bool) -> Config {
        let epoch = if self.epoch() < EPOCH_MAX { self.epoch() + 1 } else { EPOCH_MAX };
        Config(Config::build(mode, diagnostics, self.slow_tags()).0 | epoch << EPOCH_SHIFT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_roundtrip() {
        for m in [
            Mode::Counting,
            Mode::Records,
            Mode::Stacks { depth: 0 },
            Mode::Stacks { depth: 7 },
            Mode::Sampled(Sampling::DEFAULT),
            Mode::Sampled(Sampling::new(32, 1, usize::MAX, 1 << 31)),
        ] {
            assert_eq!(Mode::decode(m.encode()), m);
            assert_eq!(Config::new(m, true).changed(m, false).mode(), m);
        }
        assert_eq!(Mode::decode(Mode::Stacks { depth: 1000 }.encode()), Mode::Stacks { depth: MAX_STACK_DEPTH });
    }

    #[test]
    fn sampling_by_size() {
        let s = Sampling::new(3, 100, 1000, 4);
        assert_eq!((s.small(), s.large(), s.one_in()), (128, 1024, 4));
        assert!(!s.samples(127));
        assert!(s.samples(1024) && s.samples(1 << 20));
        let hits = (0..400).filter(|_| s.samples(500)).count();
        assert_eq!(hits, 100, "one in four, deterministically");
        let c = Config::new(Mode::Sampled(s), false);
        assert!(!c.keeps_records());
        assert_eq!(c.records(64), None);
        assert_eq!(c.records(4096), Some(3));
        assert_eq!(Config::new(Mode::Sampled(s), true).records(64), Some(3), "diagnostics record all");
        assert!(c.counts_only(127) && !c.counts_only(128));
        assert!(Config::new(Mode::Counting, false).counts_only(isize::MAX as usize));
        assert!(!Config::new(Mode::Counting, true).counts_only(1), "diagnostics guard all");
        assert!(!Config::new(Mode::Records, false).counts_only(1));
        assert!(!Config::new(Mode::Stacks { depth: 3 }, false).counts_only(1));
        assert!(Config::new(Mode::Stacks { depth: 3 }, false).keeps_records());
    }

    #[test]
    fn the_slow_tags_bit_sends_every_size_off_the_counting_path_and_keeps_the_mode() {
        let modes = [Mode::Counting, Mode::Records, Mode::Stacks { depth: 7 }, Mode::Sampled(Sampling::DEFAULT)];
        for m in modes {
            for diagnostics in [false, true] {
                let c = Config(Config::new(m, diagnostics).0 | 5 << EPOCH_SHIFT);
                let slow = c.with_slow_tags(true);
                assert!(slow.slow_tags() && !c.slow_tags());
                assert_eq!((slow.mode(), slow.diagnostics(), slow.epoch()), (m, diagnostics, 5));
                assert_eq!(slow.keeps_records(), c.keeps_records());
                assert!(!slow.counts_only(1));
                assert_eq!(slow.mode_counts_only(64), c.counts_only(64));
                assert_eq!(slow.mode_counts_only(1 << 20), c.counts_only(1 << 20));
                for size in [1, 255, 256, 1 << 20, isize::MAX as usize] {
                    assert_eq!(size <= slow.mode_limit(), c.counts_only(size), "{m:?} {size}");
                }
                assert_eq!(slow.records(64), c.records(64));
                assert_eq!(slow.with_slow_tags(false), c, "clearing the bit restores the word");
                let switched = slow.changed(Mode::Counting, false);
                assert!(switched.slow_tags(), "a mode change keeps the bit");
                assert_eq!(switched.epoch(), 6);
            }
        }
    }

    #[test]
    fn epochs_saturate() {
        let c = Config(Config::new(Mode::Records, true).0 | EPOCH_MAX << EPOCH_SHIFT);
        let d = c.changed(Mode::Counting, false);
        assert_eq!(d.epoch(), EPOCH_MAX);
        assert_eq!((d.mode(), d.diagnostics()), (Mode::Counting, false));
    }
}
