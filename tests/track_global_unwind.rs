//! A panic in user code that `TrackingAllocator` runs from inside the global allocator (a
//! budget callback, the logger of a watched tag) must not unwind out of the allocator:
//! `GlobalAlloc` forbids it (undefined behaviour), so the process aborts instead.
//!
//! Each case runs in a child process (this binary, re-run with `--exact child`), which
//! reports on stdout whether the panic came out of the allocation. Not under Miri (no
//! processes).

use std::alloc::System;
use std::process::Command;

use mmobject::track::{BudgetOverrun, BudgetPolicy, Tag, Tracker, TrackingAllocator};

#[global_allocator]
static ALLOC: TrackingAllocator<System> = TrackingAllocator::new(System);

const CHILD_ENV: &str = "MMOBJECT_UNWIND_CHILD";
const UNWOUND: &str = "UNWOUND-OUT-OF-THE-ALLOCATOR";
const REACHED: &str = "REACHED-THE-PANIC";

static BUDGETED: Tag = Tag::new("unwind-Budgeted");
static WATCHED: Tag = Tag::new("unwind-Watched");

fn panicking_callback(_: &BudgetOverrun) {
    println!("{REACHED}");
    panic!("a budget callback that panics");
}

struct PanickingLogger;

impl log::Log for PanickingLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, _: &log::Record) {
        println!("{REACHED}");
        panic!("a logger that panics");
    }
    fn flush(&self) {}
}

/// The child: allocates (or frees, or grows) so that the tracker calls the panicking code,
/// and says on stdout whether the panic unwound out of the allocation.
#[test]
fn child() {
    let Ok(case) = std::env::var(CHILD_ENV) else { return };
    // Silence the default hook: it would allocate (and log nothing useful here).
    std::panic::set_hook(Box::new(|_| {}));
    let t = Tracker::global();
    let caught = match case.as_str() {
        "callback-alloc" | "callback-grow" => {
            t.set_budget(&BUDGETED, 16);
            t.set_budget_policy(&BUDGETED, BudgetPolicy::Callback(panicking_callback));
            let grow = case == "callback-grow";
            let mut v: Vec<u8> = mmobject::track::scope(&BUDGETED, || Vec::with_capacity(if grow { 8 } else { 0 }));
            std::panic::catch_unwind(move || {
                let _g = BUDGETED.enter();
                v.reserve_exact(64);
                v
            })
            .is_err()
        }
        "logger-free" => {
            log::set_logger(&PanickingLogger).unwrap();
            log::set_max_level(log::LevelFilter::Trace);
            // `black_box`: a release build may otherwise elide the unused allocation.
            let v: Vec<u8> = mmobject::track::scope(&WATCHED, || std::hint::black_box(Vec::with_capacity(32)));
            t.watch(&WATCHED, true);
            std::panic::catch_unwind(move || drop(v)).is_err()
        }
        other => panic!("unknown case {other}"),
    };
    if caught {
        println!("{UNWOUND}");
    }
}

/// Runs the child on `case`: the panic is reached, and the process ends without the panic
/// having come out of the allocator.
fn assert_no_unwind(case: &str) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, case)
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(REACHED), "{case}: the panicking code ran:\n{stdout}");
    assert!(!stdout.contains(UNWOUND), "{case}: a panic unwound out of the global allocator:\n{stdout}");
    assert!(!out.status.success(), "{case}: the process aborts");
}

#[test]
#[cfg_attr(miri, ignore = "runs child processes")]
fn a_panicking_budget_callback_aborts_instead_of_unwinding_out_of_alloc() {
    assert_no_unwind("callback-alloc");
}

#[test]
#[cfg_attr(miri, ignore = "runs child processes")]
fn a_panicking_budget_callback_aborts_instead_of_unwinding_out_of_realloc() {
    assert_no_unwind("callback-grow");
}

#[test]
#[cfg_attr(miri, ignore = "runs child processes")]
fn a_panicking_logger_aborts_instead_of_unwinding_out_of_dealloc() {
    assert_no_unwind("logger-free");
}
