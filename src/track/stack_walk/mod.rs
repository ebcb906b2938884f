//! Walking the current thread's stack into raw return addresses, by the fastest means this
//! build allows, chosen once per process (see [`StackTrace::walker`](super::StackTrace::walker)):
//!
//! - frame pointers, when the build keeps them: two loads per frame;
//! - the unwind tables with each return address's rule cached (`unwind_tables.rs`): a cache
//!   lookup and two or three loads per frame once a call site was seen;
//! - the `backtrace` crate's unwinder, which handles every frame but costs about a
//!   microsecond for a few frames.
//!
//! A walker is chosen only after it walked a probe's stack exactly as the unwinder did.

#[cfg(not(miri))]
mod frame_pointers;
pub(crate) mod rule_cache;
#[cfg(all(target_os = "linux", target_arch = "x86_64", not(miri), not(loom)))]
mod unwind_tables;

use super::StackWalker;

/// Fills `out` with the return addresses of the caller's stack (from the return address into
/// the caller of the function this is inlined into), returns how many.
#[inline(always)]
pub(super) fn walk(out: &mut [usize]) -> usize {
    #[cfg(not(miri))]
    match detected() {
        StackWalker::FramePointers => return frame_pointers::walk(out),
        StackWalker::UnwindTables =>
        {
            #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
            if let Some(n) = unwind_tables::walk(out) {
                return n;
            }
        }
        StackWalker::Unwinder => {}
    }
    unwinder_walk(out)
}

/// The walk through the `backtrace` crate (none under Miri).
#[inline(always)]
fn unwinder_walk(out: &mut [usize]) -> usize {
    let mut n = 0usize;
    #[cfg(not(miri))]
    if !out.is_empty() {
        let mut on_frame = |frame: &backtrace::Frame| {
            out[n] = frame.ip() as usize;
            n += 1;
            n < out.len()
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
    }
    #[cfg(miri)]
    let _ = out;
    n
}

/// The walker this process uses, probed on first use.
pub(super) fn detected() -> StackWalker {
    #[cfg(not(miri))]
    {
        use std::sync::atomic::{AtomicU8, Ordering};

        /// 0: not probed yet; 1: frame pointers; 2: unwind tables; 3: the unwinder.
        static DETECTED: AtomicU8 = AtomicU8::new(0);

        match DETECTED.load(Ordering::Relaxed) {
            1 => StackWalker::FramePointers,
            2 => StackWalker::UnwindTables,
            3 => StackWalker::Unwinder,
            _ => {
                let found = probe();
                let code = match found {
                    StackWalker::FramePointers => 1,
                    StackWalker::UnwindTables => 2,
                    StackWalker::Unwinder => 3,
                };
                DETECTED.store(code, Ordering::Relaxed);
                found
            }
        }
    }
    #[cfg(miri)]
    StackWalker::Unwinder
}

/// Finds the fastest walker that walks this call chain as the unwinder does. Frame pointers
/// must agree for three frames: deeper, the frames of libraries built without them are
/// skipped, and a capture's few frames rarely reach those. The unwind tables must agree to
/// the end of the stack.
#[cfg(not(miri))]
#[inline(never)]
fn probe() -> StackWalker {
    let _reentry = super::Reentry::enter();
    let mut walked = [0usize; 24];
    let n = frame_pointers::walk(&mut walked);
    if agrees_with_the_unwinder(&walked[..n], 3) {
        return StackWalker::FramePointers;
    }
    #[cfg(all(target_os = "linux", target_arch = "x86_64", not(loom)))]
    if let Some(n) = unwind_tables::walk(&mut walked) {
        if agrees_with_the_unwinder(&walked[..n], usize::MAX) {
            return StackWalker::UnwindTables;
        }
    }
    StackWalker::Unwinder
}

/// `true` if `walked`, a walk made by this function's caller, lists the unwinder's frames
/// above that caller, frame for frame, for `frames` frames or to the end of the shorter walk,
/// and at least three.
#[cfg(not(miri))]
#[inline(never)]
fn agrees_with_the_unwinder(walked: &[usize], frames: usize) -> bool {
    if walked.len() < 4 {
        return false;
    }
    let mut unwound = [0usize; 32];
    let m = unwinder_walk(&mut unwound);
    // `walked[0]` is the return address into the caller from its walk; the unwinder sees the
    // caller at its call to this function, a few bytes away. From the caller's caller up, the
    // two must agree frame for frame. (A frame-pointer walk in a build without frame pointers
    // starts further up, at the nearest caller that keeps them: `walked[0]` would not be in
    // the caller.)
    let Some(j) = unwound[..m].iter().position(|&ip| ip == walked[1]) else {
        return false;
    };
    let common = (walked.len() - 1).min(m - j).min(frames);
    j >= 1 && unwound[j - 1].abs_diff(walked[0]) < 512 && common >= 3 && unwound[j..j + common] == walked[1..1 + common]
}

#[cfg(all(target_os = "linux", not(miri)))]
std::thread_local! {
    /// This thread's stack mapping `(low, high)`, or `(0, 0)` before the first walk.
    static STACK: std::cell::Cell<(usize, usize)> = const { std::cell::Cell::new((0, 0)) };
}

/// The end of the stack mapping holding `sp`: from the per-thread cache, else from
/// `/proc/self/maps` (allocates; the caller is inside the tracker, so untracked).
#[cfg(all(target_os = "linux", not(miri)))]
fn stack_top(sp: usize) -> Option<usize> {
    let (low, high) = STACK.try_with(std::cell::Cell::get).ok()?;
    if low <= sp && sp < high {
        return Some(high);
    }
    let _reentry = super::Reentry::enter();
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    let range = maps.lines().find_map(|line| {
        let (low, high) = line.split(' ').next()?.split_once('-')?;
        let (low, high) = (usize::from_str_radix(low, 16).ok()?, usize::from_str_radix(high, 16).ok()?);
        (low <= sp && sp < high).then_some((low, high))
    })?;
    let _ = STACK.try_with(|c| c.set(range));
    Some(range.1)
}

#[cfg(all(test, target_os = "linux", target_arch = "x86_64", not(miri), not(loom)))]
mod tests {
    use std::hint::black_box;

    use super::*;

    /// Serialises the tests that walk with the unwind tables directly: one of them unloads a
    /// library, which clears the cache, and a walk that spans a clear gives up (as
    /// `walk` then falls back to the unwinder).
    static SERIAL: parking_lot::Mutex<()> = parking_lot::Mutex::new(());

    /// Walks from here with the unwind tables and with the unwinder, and checks they agree
    /// frame for frame above this function, to the end of the stack.
    #[inline(never)]
    fn both_walks_agree() -> usize {
        let _serial = SERIAL.lock();
        let mut walked = [0usize; 64];
        let n = unwind_tables::walk(&mut walked).expect("every frame here has a rule of the common shape");
        let mut unwound = [0usize; 64];
        let mut m = unwinder_walk(&mut unwound);
        // The unwinder reports a thread's outermost frame, whose return address is 0, as a
        // frame at address 0; the walk ends there without one.
        while m > 0 && unwound[m - 1] == 0 {
            m -= 1;
        }
        let j = unwound[..m].iter().position(|&ip| ip == walked[1]).expect("the unwinder saw the caller");
        assert!(unwound[j - 1].abs_diff(walked[0]) < 512, "the first frame is this function");
        assert!(n < walked.len() && m < unwound.len(), "both reached the end of the stack");
        assert_eq!(&walked[1..n], &unwound[j..m], "every frame above this one, in order");
        n
    }

    #[inline(never)]
    fn recurse(depth: usize, f: &dyn Fn() -> usize) -> usize {
        // A frame whose size depends on nothing but still differs from its neighbours'.
        let pad = black_box([depth; 7]);
        if depth == 0 {
            f() + pad[0]
        } else {
            recurse(black_box(depth - 1), f) + pad[depth % 7]
        }
    }

    /// 64-byte alignment makes the compiler realign the stack, so this frame's CFA is found
    /// from `rbp`, not `rsp`.
    #[repr(align(64))]
    struct Aligned([u8; 64]);

    #[inline(never)]
    fn realigned(f: &dyn Fn() -> usize) -> usize {
        let local = black_box(Aligned([1; 64]));
        assert_eq!(std::ptr::from_ref(&local) as usize % 64, 0);
        f() + usize::from(black_box(&local).0[3])
    }

    #[inline(never)]
    fn dynamic_frame(len: usize, f: &dyn Fn() -> usize) -> usize {
        // A frame whose callee-saved registers spill around a call in a loop.
        let mut total = 0;
        for i in 0..black_box(len) {
            total += black_box(i);
        }
        total + f()
    }

    #[test]
    fn the_unwind_table_walk_matches_the_unwinder_through_many_frame_shapes() {
        let here = both_walks_agree();
        let deep = recurse(20, &|| realigned(&|| dynamic_frame(3, &both_walks_agree)));
        assert!(deep >= here + 22, "the deeper stack has its extra frames");
        // On another thread: a stack of its own, which ends at the thread's start.
        std::thread::spawn(|| recurse(5, &|| realigned(&both_walks_agree))).join().unwrap();
    }

    /// Walks a new thread's stack, always from the same call sites (a loop calling a walk
    /// directly could be unrolled into several): how many rules that thread learned, and how
    /// many frames it walked.
    fn walk_on_a_new_thread() -> (usize, usize) {
        std::thread::spawn(|| {
            let mut out = [0usize; 32];
            let frames = unwind_tables::walk(&mut out).expect("a thread's frames have rules of the common shape");
            (unwind_tables::rules_learned(), frames)
        })
        .join()
        .unwrap()
    }

    #[test]
    fn a_second_walk_through_the_same_call_sites_reads_every_rule_from_the_cache() {
        let _serial = SERIAL.lock();
        let (_, frames) = walk_on_a_new_thread();
        for _ in 0..3 {
            assert_eq!(walk_on_a_new_thread(), (0, frames), "every rule came from the cache");
        }
    }

    #[test]
    fn unloading_a_library_empties_the_cache() {
        use std::ffi::{c_char, c_int, c_void};
        extern "C" {
            fn dlopen(file: *const c_char, mode: c_int) -> *mut c_void;
            fn dlclose(handle: *mut c_void) -> c_int;
        }
        const RTLD_NOW: c_int = 2;

        let _serial = SERIAL.lock();
        let (_, frames) = walk_on_a_new_thread();
        assert_eq!(walk_on_a_new_thread(), (0, frames), "cached before the unload");
        // Small glibc libraries a Rust program does not load by itself.
        let library = [c"libanl.so.1", c"libresolv.so.2", c"libBrokenLocale.so.1", c"libutil.so.1"]
            .iter()
            // SAFETY: a NUL-terminated name; these libraries run no code of note when loaded.
            .map(|name| unsafe { dlopen(name.as_ptr(), RTLD_NOW) })
            .find(|handle| !handle.is_null())
            .expect("one of glibc's small libraries can be loaded");
        // SAFETY: a handle `dlopen` returned, closed once; nothing of it is used.
        assert_eq!(unsafe { dlclose(library) }, 0);
        // Every frame's rule, and the walk's own first one, is learned again.
        assert_eq!(walk_on_a_new_thread(), (frames + 1, frames), "the unload emptied the cache");
        assert_eq!(walk_on_a_new_thread(), (0, frames), "cached again");
    }

    #[test]
    fn a_short_buffer_stops_the_walk_and_an_empty_one_walks_nothing() {
        let _serial = SERIAL.lock();
        let mut out = [0usize; 2];
        assert_eq!(unwind_tables::walk(&mut out), Some(2));
        assert!(out.iter().all(|&ip| ip != 0));
        assert_eq!(unwind_tables::walk(&mut []), Some(0));
        assert_eq!(unwinder_walk(&mut []), 0, "the unwinder's callback never writes past the end");
        assert_eq!(walk(&mut []), 0);
    }

    #[test]
    fn the_walker_is_the_fastest_that_agrees_with_the_unwinder() {
        let walker = detected();
        assert_eq!(detected(), walker, "probed once");
        // With or without frame pointers, one of the fast walks agrees here.
        assert_ne!(walker, StackWalker::Unwinder, "frame pointers or the unwind tables agree on this host");
        let mut out = [0usize; 8];
        assert!(walk(&mut out) >= 2);
    }
}
