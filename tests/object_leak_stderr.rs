//! The leak report is never silent: with no logger (or one that would not show
//! warnings) it goes to stderr.
//!
//! Logging is process-wide, so each case runs in a child process: this test
//! binary re-runs itself with `MMOBJECT_LEAK_CHILD` set, and only the test
//! `child` does anything then. The parent reads the child's stderr.

use std::process::Command;

use mmobject::{Handle, MMObject, ObjectManager};

const CHILD_ENV: &str = "MMOBJECT_LEAK_CHILD";

#[derive(MMObject)]
struct Entity {
    parent: Option<Handle<Entity>>,
}

/// Prints what the parent should find, as `EXPECT <line>` on stdout.
fn expect(line: &str) {
    println!("EXPECT {line}");
}

/// A logger that would print to stdout, so the parent sees what reached it.
struct StdoutLogger;

impl log::Log for StdoutLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        println!("LOGGED {} {}", record.level(), record.args());
    }

    fn flush(&self) {}
}

static LOGGER: StdoutLogger = StdoutLogger;

/// Leaks a self-referencing entity and a handle that outlives the manager, then drops the manager.
fn leak_and_drop() {
    let mut mm = ObjectManager::new();
    let id = mm.id();
    let (e, line) = (mm.create(Entity { parent: None }), line!());
    mm[&e].parent = Some(e.clone());
    let key = e.key();
    drop(e);
    let outliving = mm.create(Entity { parent: None });
    expect(&format!("2 object(s) still alive at shutdown of object manager #{id}:"));
    expect(&format!(
        "leaked Entity{key} (refs: 1, {} B) created at {}:{line}:",
        std::mem::size_of::<Entity>(),
        file!()
    ));
    expect(&format!("1 object(s) are still referenced by handles that outlive object manager #{id};"));
    drop(mm);
    drop(outliving);
}

#[test]
fn child() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return; // Only runs as a child of the tests below.
    };
    match mode.as_str() {
        "no_logger" => {}
        "logger_below_warn" => {
            log::set_logger(&LOGGER).unwrap();
            log::set_max_level(log::LevelFilter::Error);
        }
        "logger" => {
            log::set_logger(&LOGGER).unwrap();
            log::set_max_level(log::LevelFilter::Warn);
        }
        other => panic!("unknown child mode {other:?}"),
    }
    leak_and_drop();
}

struct ChildOutput {
    expected: Vec<String>,
    stdout: String,
    stderr: String,
}

fn run_child(mode: &str) -> ChildOutput {
    let exe = std::env::current_exe().unwrap();
    let output = Command::new(exe)
        .args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, mode)
        .output()
        .expect("the test binary runs");
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "child failed:\n{stdout}\n{stderr}");
    let expected: Vec<String> =
        stdout.lines().filter_map(|l| l.split_once("EXPECT ").map(|(_, e)| e)).map(str::to_owned).collect();
    assert_eq!(expected.len(), 3, "the child ran the leak: {stdout}");
    ChildOutput { expected, stdout, stderr }
}

fn assert_on_stderr(out: &ChildOutput) {
    for expected in &out.expected {
        let line = format!("WARN mmobject: {expected}");
        assert!(out.stderr.lines().any(|l| l.starts_with(&line)), "{line:?} not on stderr:\n{}", out.stderr);
    }
}

#[test]
#[cfg_attr(miri, ignore = "Miri cannot spawn processes")]
fn without_a_logger_the_report_goes_to_stderr() {
    let out = run_child("no_logger");
    assert_on_stderr(&out);
    assert!(!out.stdout.contains("LOGGED"));
}

#[test]
#[cfg_attr(miri, ignore = "Miri cannot spawn processes")]
fn with_a_logger_below_warn_the_report_goes_to_stderr() {
    let out = run_child("logger_below_warn");
    assert_on_stderr(&out);
    assert!(!out.stdout.contains("LOGGED"), "the logger would not show it:\n{}", out.stdout);
}

#[test]
#[cfg_attr(miri, ignore = "Miri cannot spawn processes")]
fn with_a_logger_the_report_goes_to_the_logger_only() {
    let out = run_child("logger");
    for expected in &out.expected {
        let line = format!("LOGGED WARN {expected}");
        assert!(out.stdout.lines().any(|l| l.contains(&line)), "{line:?} not logged:\n{}", out.stdout);
    }
    assert!(!out.stderr.contains("mmobject"), "nothing on stderr:\n{}", out.stderr);
}
