//! Which resolved frames of a captured stack the caller wrote: the filter that keeps the
//! tracker's own frames, the allocation plumbing and std's runtime out of leak reports.

use std::fmt;

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

/// The frames of `all` (innermost first) that the caller wrote, at most `depth` of them
/// (see [`StackTrace::resolve`](super::StackTrace::resolve)).
pub(super) fn callers_frames(all: Vec<ResolvedFrame>, depth: usize) -> Vec<ResolvedFrame> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
