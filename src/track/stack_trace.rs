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
        #[cfg_attr(miri, allow(unused_mut))]
        let mut st = StackTrace { depth: depth as u8, ..StackTrace::EMPTY };
        if depth == 0 {
            return st;
        }
        let want = (depth + OWN_FRAMES_SLACK).min(MAX_STACK_DEPTH);
        #[cfg(not(miri))]
        if StackTrace::walker() == StackWalker::FramePointers {
            st.len = frame_pointers::walk(&mut st.ips[..want]) as u8;
            return st;
        }
        #[cfg(not(miri))]
        {
            let mut n = 0usize;
            let mut on_frame = |frame: &backtrace::Frame| {
                st.ips[n] = frame.ip() as usize;
                n += 1;
                n < want
            };
            #[cfg(not(windows))]
            // SAFETY: `trace_unsynchronized` is unsafe only because it skips the crate's
            // global lock. On non-Windows targets it walks the stack with the libgcc/libunwind
            // unwinder, which is thread-safe; the lock exists for Windows' dbghelp, where we
            // use the synchronised `trace` instead. Our callback does not panic.
            unsafe {
                backtrace::trace_unsynchronized(&mut on_frame)
            };
            #[cfg(windows)]
            backtrace::trace(&mut on_frame);
            st.len = n as u8;
        }
        #[cfg(miri)]
        let _ = want;
        st
    }

    /// How [`StackTrace::capture`] walks the stack in this process: by frame pointers when
    /// the build keeps them (detected once, by checking a frame-pointer walk against the
    /// unwinder), else by DWARF unwinding (the `backtrace` crate).
    ///
    /// Frame pointers are kept with `RUSTFLAGS="-C force-frame-pointers=yes"`; the walk
    /// then costs tens of nanoseconds instead of about a microsecond. The walk is available
    /// on Linux for x86-64 and AArch64, and reads only within the current thread's stack
    /// (its bounds come from `/proc/self/maps`, read once per thread), so a frame without a
    /// frame pointer can end it early but never make it read elsewhere.
    ///
    /// # Examples
    ///
    /// ```
    /// use mmobject::track::{StackTrace, StackWalker};
    ///
    /// let walker = StackTrace::walker();
    /// assert!(matches!(walker, StackWalker::FramePointers | StackWalker::Unwinder));
    /// ```
    pub fn walker() -> StackWalker {
        #[cfg(not(miri))]
        {
            frame_pointers::detected()
        }
        #[cfg(miri)]
        StackWalker::Unwinder
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

    /// Resolves the frames to `(function, file, line)`, skipping the tracker's own leading
    /// frames, at most the requested depth.
    pub fn resolve(&self) -> Vec<ResolvedFrame> {
        let mut out = Vec::new();
        let mut skipping = true;
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
            for f in frames {
                if skipping && is_own_frame(&f) {
                    continue;
                }
                skipping = false;
                if out.len() < self.depth as usize {
                    out.push(f);
                }
            }
        }
        out
    }
}

/// How the stack is walked: see [`StackTrace::walker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StackWalker {
    /// Following the chain of saved frame pointers: fast; needs a build that keeps them.
    FramePointers,
    /// DWARF unwinding through the `backtrace` crate: works everywhere, slower.
    Unwinder,
}

/// The frame-pointer walk, and the detection of whether this build can use it.
#[cfg(not(miri))]
mod frame_pointers {
    use std::sync::atomic::{AtomicU8, Ordering};

    use super::StackWalker;

    /// 0: not probed yet, 1: frame pointers, 2: unwinder.
    static DETECTED: AtomicU8 = AtomicU8::new(0);

    pub(super) fn detected() -> StackWalker {
        match DETECTED.load(Ordering::Relaxed) {
            1 => StackWalker::FramePointers,
            2 => StackWalker::Unwinder,
            _ => {
                let _reentry = crate::track::scope::Reentry::enter();
                let found = if probe() { StackWalker::FramePointers } else { StackWalker::Unwinder };
                DETECTED.store(if found == StackWalker::FramePointers { 1 } else { 2 }, Ordering::Relaxed);
                found
            }
        }
    }

    /// Walks this call chain both ways: frame pointers are usable if the walk's frames
    /// above `probe` match the unwinder's, three in a row.
    #[inline(never)]
    fn probe() -> bool {
        let mut walked = [0usize; 8];
        let n = walk(&mut walked);
        if n < 4 {
            return false;
        }
        let mut unwound = [0usize; 24];
        let mut m = 0;
        let mut on_frame = |frame: &backtrace::Frame| {
            unwound[m] = frame.ip() as usize;
            m += 1;
            m < unwound.len()
        };
        // SAFETY: as in `StackTrace::capture`: the unsynchronised walk is thread-safe off
        // Windows, and the callback does not panic. (This module is Linux-only in effect:
        // `walk` finds nothing elsewhere, so `n < 4` returned above.)
        unsafe { backtrace::trace_unsynchronized(&mut on_frame) };
        // `walked[0]` is the return address into `probe` from `walk`; the unwinder sees
        // `probe` at its call to the tracer instead, a few bytes away. From `probe`'s caller
        // up they must agree frame for frame. (Without frame pointers, the walk would start
        // further up, at the nearest caller that keeps them: `walked[0]` would not be in
        // `probe`.)
        let Some(j) = unwound[..m].iter().position(|&ip| ip == walked[1]) else {
            return false;
        };
        j >= 1 && unwound[j - 1].abs_diff(walked[0]) < 512 && m - j >= 3 && unwound[j..j + 3] == walked[1..4]
    }

    /// Fills `out` with return addresses by following saved frame pointers from the
    /// caller of `walk`; returns how many. Reads only inside this thread's stack.
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    #[inline(never)]
    pub(super) fn walk(out: &mut [usize]) -> usize {
        let marker = 0u8;
        let sp = std::ptr::from_ref(&marker) as usize;
        let Some(top) = stack_top(sp) else {
            return 0;
        };
        let mut fp = frame_pointer();
        let mut n = 0;
        // Invariant at each step: `sp <= fp` and `fp + 16 <= top`, so both words read are
        // inside the mapped stack above the current stack pointer.
        while n < out.len() && fp >= sp && fp % std::mem::align_of::<usize>() == 0 && fp <= top - 16 {
            // SAFETY: `[fp, fp + 16)` lies in `[sp, top)`, this thread's stack above the
            // live stack pointer (mapped, readable, and not changing under us: it holds the
            // frames of our callers); the address is aligned. Volatile because the words are
            // not Rust values we own, just stack memory read as integers.
            let (next, ret) = unsafe {
                let p = std::ptr::with_exposed_provenance::<usize>(fp);
                (p.read_volatile(), p.add(1).read_volatile())
            };
            if ret == 0 {
                break;
            }
            out[n] = ret;
            n += 1;
            if next <= fp {
                break; // the chain must go up the stack; anything else is not a frame record
            }
            fp = next;
        }
        n
    }

    #[cfg(not(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64"))))]
    pub(super) fn walk(_out: &mut [usize]) -> usize {
        0
    }

    #[cfg(all(target_os = "linux", target_arch = "x86_64"))]
    #[inline(always)]
    fn frame_pointer() -> usize {
        let fp: usize;
        // SAFETY: copies a register; touches no memory, no stack, no flags.
        unsafe { std::arch::asm!("mov {}, rbp", out(reg) fp, options(nomem, nostack, preserves_flags)) };
        fp
    }

    #[cfg(all(target_os = "linux", target_arch = "aarch64"))]
    #[inline(always)]
    fn frame_pointer() -> usize {
        let fp: usize;
        // SAFETY: copies a register; touches no memory, no stack, no flags.
        unsafe { std::arch::asm!("mov {}, x29", out(reg) fp, options(nomem, nostack, preserves_flags)) };
        fp
    }

    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    std::thread_local! {
        /// This thread's stack mapping `(low, high)`, or `(0, 0)` before the first walk.
        static STACK: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
    }

    /// The end of the stack mapping holding `sp`: from the per-thread cache, else from
    /// `/proc/self/maps` (allocates; the caller is inside the tracker, so untracked).
    #[cfg(all(target_os = "linux", any(target_arch = "x86_64", target_arch = "aarch64")))]
    fn stack_top(sp: usize) -> Option<usize> {
        let (low, high) = STACK.try_with(std::cell::Cell::get).ok()?;
        if low <= sp && sp < high {
            return Some(high);
        }
        let _reentry = crate::track::scope::Reentry::enter();
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let range = maps.lines().find_map(|line| {
            let (low, high) = line.split(' ').next()?.split_once('-')?;
            let (low, high) = (usize::from_str_radix(low, 16).ok()?, usize::from_str_radix(high, 16).ok()?);
            (low <= sp && sp < high).then_some((low, high))
        })?;
        let _ = STACK.try_with(|c| c.set(range));
        Some(range.1)
    }
}

/// The tracker's own frames and the allocation plumbing above the caller: skipped while
/// they lead a stack. Known by qualified name, or by source file: builds with line tables
/// only (`debug = "line-tables-only"`) name functions without their paths.
fn is_own_frame(frame: &ResolvedFrame) -> bool {
    const OWN: [&str; 10] = [
        "backtrace::",
        "mmobject::track::",
        "<mmobject::track::",
        "__rust",
        "__rg_",
        "__rdl_",
        "alloc::",
        "<alloc::",
        "core::option::",
        "core::result::",
    ];
    let function = &frame.function;
    if OWN.iter().any(|p| function.starts_with(p)) || function.contains(" as alloc::") {
        return true;
    }
    let Some(file) = &frame.file else {
        return false;
    };
    let file = file.replace('\\', "/");
    file.starts_with(concat!(env!("CARGO_MANIFEST_DIR"), "/src/track/"))
        || file.contains("/library/alloc/src/")
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
        #[cfg(not(miri))]
        if walker == StackWalker::FramePointers {
            let mut walked = [0usize; 8];
            assert!(frame_pointers::walk(&mut walked) >= 2);
        }
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
