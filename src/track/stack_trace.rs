//! Call stacks: captured cheaply as raw return addresses, resolved to symbols only when a
//! report is written.

use std::ffi::c_void;
use std::fmt;

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

/// The frames of `all` (innermost first) that the caller wrote, at most `depth` of them
/// (see [`StackTrace::resolve`]).
fn callers_frames(all: Vec<ResolvedFrame>, depth: usize) -> Vec<ResolvedFrame> {
    // std starts `main` and every spawned thread's closure through this function: below it
    // is the runtime, and the `FnOnce::call_once` shims just above it are std's too.
    let mut end = all.iter().position(|f| f.function.contains("__rust_begin_short_backtrace")).unwrap_or(all.len());
    if end < all.len() {
        while end > 0 && is_call_once_shim(&all[end - 1]) {
            end -= 1;
        }
    }
    let lead = all[..end].iter().take_while(|f| is_plumbing_frame(f) || is_tracker_frame(f)).count();
    all.into_iter().take(end).skip(lead).filter(|f| !is_tracker_frame(f)).take(depth).collect()
}

/// `core::ops::function::FnOnce::call_once` and its kin, through which std calls `main`.
fn is_call_once_shim(frame: &ResolvedFrame) -> bool {
    frame.function.starts_with("core::ops::function::")
        || frame.function.starts_with("call_once<")
        || frame
            .file
            .as_deref()
            .is_some_and(|file| file.replace('\\', "/").contains("/library/core/src/ops/function.rs"))
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

/// The tracker's own frames: never the caller's, wherever they are. Known by qualified
/// name, or by source file: builds with line tables only (`debug = "line-tables-only"`)
/// name functions without their paths.
fn is_tracker_frame(frame: &ResolvedFrame) -> bool {
    let function = &frame.function;
    function.starts_with("mmobject::track::")
        || function.starts_with("<mmobject::track::")
        || frame
            .file
            .as_deref()
            .is_some_and(|file| file.replace('\\', "/").starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src/track/")))
}

/// The allocation plumbing above the caller (the stack walker, the global allocator's
/// entry points, `alloc`'s collections): skipped while it leads a stack, kept below the
/// caller's first frame.
fn is_plumbing_frame(frame: &ResolvedFrame) -> bool {
    const PLUMBING: [&str; 8] =
        ["backtrace::", "__rust", "__rg_", "__rdl_", "alloc::", "<alloc::", "core::option::", "core::result::"];
    let function = &frame.function;
    if PLUMBING.iter().any(|p| function.starts_with(p)) || function.contains(" as alloc::") {
        return true;
    }
    let Some(file) = &frame.file else {
        return false;
    };
    let file = file.replace('\\', "/");
    file.contains("/library/alloc/src/")
        || file.contains("/src/backtrace/")
        || (file.contains("/backtrace-") && file.ends_with("/src/lib.rs"))
}

/// One resolved stack frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedFrame {
    /// The demangled function name (or the address if unknown).
    pub function: String,
    /// The source file, if debug info has it.
    pub file: Option<String>,
    /// The line, if debug info has it.
    pub line: Option<u32>,
}

impl fmt::Display for ResolvedFrame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.file, self.line) {
            (Some(file), Some(line)) => write!(f, "{} at {}:{}", self.function, file, line),
            (Some(file), None) => write!(f, "{} at {}", self.function, file),
            _ => f.write_str(&self.function),
        }
    }
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

    fn frame(function: &str, file: &str) -> ResolvedFrame {
        ResolvedFrame { function: function.to_owned(), file: Some(file.to_owned()), line: Some(1) }
    }

    /// A stack as the tracker's leak report gets it, innermost first: only the caller's
    /// frames are shown, without the `scope` call between them or the runtime below `main`.
    #[test]
    fn only_the_callers_frames_are_shown() {
        let track = concat!(env!("CARGO_MANIFEST_DIR"), "/src/track/scope.rs");
        let all = vec![
            frame("backtrace::backtrace::trace", "/x/backtrace-0.3.75/src/backtrace/mod.rs"),
            frame("mmobject::track::global::TrackingAllocator::alloc_slow", "/x/src/track/global.rs"),
            frame("__rust_alloc", "/x/main.rs"),
            frame("alloc::raw_vec::finish_grow", "/rustc/1/library/alloc/src/raw_vec/mod.rs"),
            frame("game::load_level::{{closure}}", "/game/src/level.rs"),
            frame("scope<u8, game::load_level::{closure_env#0}>", track),
            frame("game::load_level", "/game/src/level.rs"),
            frame("alloc::boxed::Box<F>::new", "/rustc/1/library/alloc/src/boxed.rs"),
            frame("game::main", "/game/src/main.rs"),
            frame("call_once<fn(), ()>", "/rustc/1/library/core/src/ops/function.rs"),
            frame("std::sys::backtrace::__rust_begin_short_backtrace", "/rustc/1/library/std/src/sys/backtrace.rs"),
            frame("std::rt::lang_start_internal", "/rustc/1/library/std/src/rt.rs"),
        ];
        let names = |frames: Vec<ResolvedFrame>| frames.into_iter().map(|f| f.function).collect::<Vec<_>>();
        assert_eq!(
            names(callers_frames(all.clone(), 8)),
            [
                "game::load_level::{{closure}}",
                "game::load_level",
                "alloc::boxed::Box<F>::new", // below the caller's first frame: kept
                "game::main",
            ]
        );
        assert_eq!(names(callers_frames(all.clone(), 2)), ["game::load_level::{{closure}}", "game::load_level"]);
        // A stack cut short by its depth keeps everything past the plumbing.
        assert_eq!(names(callers_frames(all[..6].to_vec(), 8)), ["game::load_level::{{closure}}"]);
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
