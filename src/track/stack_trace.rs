//! Call stacks: captured cheaply as raw return addresses, resolved to symbols only when a
//! report is written.

use std::ffi::c_void;
use std::fmt;

use super::caller_frames::{callers_frames, ResolvedFrame};
use super::table::{SpinLock, SysMap, SysVec};

/// The most frames a [`StackTrace`] holds.
pub const MAX_STACK_DEPTH: usize = 32;

/// Extra frames captured beyond the requested depth, so that the tracker's own frames and
/// the allocation plumbing (skipped when displayed) do not eat into the caller's. Unoptimised
/// builds do not inline the plumbing, so they need more.
const OWN_FRAMES_SLACK: usize = if cfg!(debug_assertions) { 12 } else { 4 };

/// A call stack as raw instruction pointers; `Copy`, fixed size, never allocates.
///
/// [`StackTrace::capture`] only walks the stack; symbols are looked up by `Display`, which
/// prints one `function at file:line` per line and skips the tracker's own leading frames
/// and the allocation plumbing above the caller (`__rust_alloc`, the `alloc` crate's
/// `Vec`/`Box`/`RawVec` internals, `backtrace`).
///
/// Under Miri, capture returns an empty stack.
///
/// # Examples
///
/// ```
/// use mmobject::track::StackTrace;
///
/// let stack = StackTrace::capture(5);
/// assert!(stack.len() <= 5 + 12);
/// let text = stack.to_string(); // resolves symbols now
/// # let _ = text;
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StackTrace {
    ips: [usize; MAX_STACK_DEPTH],
    /// Frames captured (`ips[..len]` are valid).
    len: u8,
    /// Frames to display after skipping the tracker's own.
    depth: u8,
}

impl StackTrace {
    /// An empty stack.
    pub const EMPTY: StackTrace = StackTrace { ips: [0; MAX_STACK_DEPTH], len: 0, depth: 0 };

    /// Captures up to `depth` frames of the current call stack (plus a few, to make up for
    /// the tracker's own frames), without resolving symbols. `depth` is clamped to
    /// [`MAX_STACK_DEPTH`].
    #[inline(never)]
    pub fn capture(depth: usize) -> StackTrace {
        let depth = depth.min(MAX_STACK_DEPTH);
        let mut st = StackTrace { depth: depth as u8, ..StackTrace::EMPTY };
        if depth == 0 {
            return st;
        }
        let want = (depth + OWN_FRAMES_SLACK).min(MAX_STACK_DEPTH);
        st.len = super::stack_walk::walk(&mut st.ips[..want]) as u8;
        st
    }

    /// How [`StackTrace::capture`] walks the stack in this process, chosen on first use: by
    /// frame pointers when the build keeps them, else by the unwind tables with each return
    /// address's rule cached (x86-64 Linux), else by the `backtrace` crate's unwinder. A
    /// walker is chosen only if it walked a probe's stack exactly as the unwinder did.
    ///
    /// | walker | cost of a 5-frame capture | needs |
    /// |---|---|---|
    /// | [`FramePointers`](StackWalker::FramePointers) | tens of ns | `RUSTFLAGS="-C force-frame-pointers=yes"` |
    /// | [`UnwindTables`](StackWalker::UnwindTables) | about 100 ns once its call sites were seen, plus about a microsecond for each return address met the first time | x86-64 Linux |
    /// | [`Unwinder`](StackWalker::Unwinder) | about a microsecond | nothing |
    ///
    /// The first two read only inside the current thread's stack (its bounds come from
    /// `/proc/self/maps`, read once per thread), so a frame they cannot follow ends the walk
    /// early (frame pointers) or hands it to the unwinder (unwind tables), but never makes
    /// them read elsewhere. The figures are this crate's benchmark T3 (`BENCHMARKS.md`).
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{StackTrace, StackWalker};
    ///
    /// let walker = StackTrace::walker();
    /// assert!(matches!(walker, StackWalker::FramePointers | StackWalker::UnwindTables | StackWalker::Unwinder));
    /// ```
    pub fn walker() -> StackWalker {
        super::stack_walk::detected()
    }

    /// The number of frames captured.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// `true` if no frames were captured.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The raw instruction pointers.
    pub fn ips(&self) -> &[usize] {
        &self.ips[..self.len as usize]
    }

    /// Resolves the frames to `(function, file, line)`, at most the requested depth, leaving
    /// out what the caller did not write: the allocation plumbing that leads the stack, the
    /// tracker's own frames wherever they are (a [`scope`](super::scope) call between the
    /// caller's frames, say), and the runtime below `main` or a thread's closure.
    pub fn resolve(&self) -> Vec<ResolvedFrame> {
        let mut all = Vec::new();
        for &ip in self.ips() {
            let mut frames = Vec::new();
            backtrace::resolve(ip as *mut c_void, |sym| {
                frames.push(ResolvedFrame {
                    function: sym.name().map(|n| format!("{n:#}")).unwrap_or_else(|| format!("{ip:#x}")),
                    file: sym.filename().map(|p| p.display().to_string()),
                    line: sym.lineno(),
                });
            });
            if frames.is_empty() {
                frames.push(ResolvedFrame { function: format!("{ip:#x}"), file: None, line: None });
            }
            all.extend(frames);
        }
        callers_frames(all, self.depth as usize)
    }
}

/// How the stack is walked: see [`StackTrace::walker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StackWalker {
    /// Following the chain of saved frame pointers: fastest; needs a build that keeps them.
    FramePointers,
    /// Following the unwind tables' rule for each return address, cached after its first
    /// use: fast once a call site was seen; x86-64 Linux.
    UnwindTables,
    /// DWARF unwinding through the `backtrace` crate: works everywhere, slowest.
    Unwinder,
}

impl fmt::Display for StackTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let _reentry = super::scope::Reentry::enter();
        let frames = self.resolve();
        if frames.is_empty() {
            return f.write_str("    <no stack captured>\n");
        }
        for frame in frames {
            writeln!(f, "    {frame}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for StackTrace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.ips().iter().map(|ip| format!("{ip:#x}"))).finish()
    }
}

/// Interned stacks, so that records carry a 4-byte id and equal stacks are stored once.
///
/// Invariant: id `n >= 1` names `stacks[n - 1]`; `index` maps a stack's hash (forced to
/// `>= 2`, then linearly probed on collisions) to its id.
#[derive(Debug)]
pub(crate) struct StackStore {
    inner: SpinLock<(SysMap<u32>, SysVec<StackTrace>)>,
}

/// The id meaning "no stack".
pub(crate) const NO_STACK: u32 = 0;

impl StackStore {
    pub(crate) const fn new() -> Self {
        Self { inner: SpinLock::new((SysMap::new(), SysVec::new())) }
    }

    /// Interns `stack`, returning its id (`NO_STACK` if it is empty or memory ran out).
    pub(crate) fn intern(&self, stack: &StackTrace) -> u32 {
        if stack.is_empty() {
            return NO_STACK;
        }
        let hash = hash_stack(stack);
        let mut guard = self.inner.lock();
        let (index, stacks) = &mut *guard;
        let mut probe = 0usize;
        loop {
            let key = hash.wrapping_add(probe).max(2);
            match index.get_mut(key) {
                Some(&mut id) => {
                    if stacks.as_slice()[id as usize - 1] == *stack {
                        return id;
                    }
                    probe += 1;
                }
                None => {
                    if !stacks.push(*stack) {
                        return NO_STACK;
                    }
                    let id = stacks.len() as u32;
                    if index.insert(key, id).is_err() {
                        return NO_STACK;
                    }
                    return id;
                }
            }
        }
    }

    /// The stack with this id.
    pub(crate) fn get(&self, id: u32) -> Option<StackTrace> {
        if id == NO_STACK {
            return None;
        }
        self.inner.lock().1.as_slice().get(id as usize - 1).copied()
    }

    pub(crate) fn heap_bytes(&self) -> usize {
        let g = self.inner.lock();
        g.0.heap_bytes() + g.1.heap_bytes()
    }
}

fn hash_stack(stack: &StackTrace) -> usize {
    // FNV-1a over the addresses.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &ip in stack.ips() {
        h ^= ip as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= stack.depth as u64;
    h as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg_attr(miri, ignore = "stack walking is not supported under Miri")]
    fn capture_is_bounded_and_resolves() {
        #[inline(never)]
        fn here() -> StackTrace {
            StackTrace::capture(3)
        }
        let st = here();
        assert!(!st.is_empty());
        assert!(st.len() <= 3 + OWN_FRAMES_SLACK);
        let frames = st.resolve();
        assert!(frames.len() <= 3);
        assert!(!st.to_string().is_empty());
    }

    #[test]
    #[cfg_attr(miri, ignore = "stack walking is not supported under Miri")]
    fn the_walker_is_detected_once_and_captures_resolvable_frames() {
        #[inline(never)]
        fn a() -> StackTrace {
            b()
        }
        #[inline(never)]
        fn b() -> StackTrace {
            StackTrace::capture(6)
        }
        let walker = StackTrace::walker();
        assert_eq!(StackTrace::walker(), walker, "detected once, then the same");
        let st = a();
        assert!(st.len() >= 2, "{walker:?} found frames");
        let text = st.to_string();
        assert!(!text.is_empty());
    }

    #[test]
    fn zero_depth_is_empty() {
        assert!(StackTrace::capture(0).is_empty());
        assert_eq!(StackTrace::EMPTY.to_string(), "    <no stack captured>\n");
    }

    #[test]
    fn store_interns_equal_stacks() {
        let store = StackStore::new();
        let mut a = StackTrace::EMPTY;
        a.ips[0] = 0x1000;
        a.ips[1] = 0x2000;
        a.len = 2;
        a.depth = 2;
        let mut b = a;
        b.ips[1] = 0x3000;
        let ia = store.intern(&a);
        let ib = store.intern(&b);
        assert_ne!(ia, NO_STACK);
        assert_ne!(ia, ib);
        assert_eq!(store.intern(&a), ia);
        assert_eq!(store.get(ia), Some(a));
        assert_eq!(store.get(ib), Some(b));
        assert_eq!(store.intern(&StackTrace::EMPTY), NO_STACK);
        assert!(store.heap_bytes() > 0);
    }
}
