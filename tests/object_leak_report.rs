//! With a logger installed, the shutdown leak report goes through `log::warn!`.
//!
//! This binary installs a capturing logger for the whole process; the stderr
//! fallback (no logger) is checked in `tests/object_leak_stderr.rs`.

use std::sync::{Mutex, Once};

use mmobject::{Handle, MMObject, ObjectManager};

#[derive(MMObject)]
struct Entity {
    name: String,
    parent: Option<Handle<Entity>>,
}

#[derive(Debug, Clone)]
struct Record {
    level: log::Level,
    target: String,
    message: String,
}

struct Capture;

static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());
static LOGGER: Capture = Capture;

impl log::Log for Capture {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        RECORDS.lock().unwrap().push(Record {
            level: record.level(),
            target: record.target().to_owned(),
            message: record.args().to_string(),
        });
    }

    fn flush(&self) {}
}

fn install_logger() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        log::set_logger(&LOGGER).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

fn records_containing(needle: &str) -> Vec<Record> {
    RECORDS.lock().unwrap().iter().filter(|r| r.message.contains(needle)).cloned().collect()
}

/// The detail records (one per leaked object shown) that contain `needle`.
fn details_containing(needle: &str) -> Vec<Record> {
    records_containing(needle).into_iter().filter(|r| r.message.starts_with("leaked ")).collect()
}

/// Two entities that reference each other, so nothing outside holds them.
fn leak_cycle(mm: &mut ObjectManager, a: Handle<Entity>, b: Handle<Entity>) {
    mm[&a].parent = Some(b.clone());
    mm[&b].parent = Some(a.clone());
}

#[test]
fn leaks_are_logged_as_warnings_with_type_refs_size_and_site() {
    install_logger();
    let mut mm = ObjectManager::new();
    let id = mm.id();
    let (a, line_a) = (mm.create(Entity { name: String::with_capacity(24), parent: None }), line!());
    let (b, line_b) = (mm.create(Entity { name: String::new(), parent: None }), line!());
    let size_a = mm[&a].size();
    assert_eq!(size_a, std::mem::size_of::<Entity>() + 24);
    leak_cycle(&mut mm, a, b);
    let report = mm.shutdown();
    assert_eq!(report.len(), 2);

    let header = records_containing(&format!("still alive at shutdown of object manager #{id}:"));
    assert_eq!(header.len(), 1, "{header:?}");
    assert!(header[0].message.starts_with("2 object(s)"), "{header:?}");

    for (entry, line, size) in [
        (&report.iter().next().unwrap(), line_a, size_a),
        (&report.iter().nth(1).unwrap(), line_b, std::mem::size_of::<Entity>()),
    ] {
        let site = format!("{}:{}:{}", file!(), line, entry.site.column());
        let logged = details_containing(&site);
        assert_eq!(logged.len(), 1, "one warning per leaked object: {logged:?}");
        let record = &logged[0];
        assert_eq!(record.level, log::Level::Warn);
        assert_eq!(record.target, "mmobject");
        assert!(record.message.starts_with(&format!("leaked {entry}")), "{:?}", record.message);
        for needle in ["leaked Entity#", "refs: 1", &format!("{size} B"), &format!("created at {site}")] {
            assert!(record.message.contains(needle), "{needle:?} missing from {:?}", record.message);
        }
    }
}

#[test]
fn dropping_the_manager_logs_the_same_report() {
    install_logger();
    let mut mm = ObjectManager::new();
    let id = mm.id();
    let (a, line) = (mm.create(Entity { name: String::new(), parent: None }), line!());
    let b = a.clone();
    leak_cycle(&mut mm, a, b);
    drop(mm);
    assert_eq!(records_containing(&format!("object manager #{id}:")).len(), 1);
    let logged = details_containing(&format!("{}:{line}:", file!()));
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0].message.starts_with("leaked Entity#"));
    assert!(logged[0].message.contains("(refs: 1, "), "{:?}", logged[0].message);
}

#[test]
fn outliving_handles_are_logged_too() {
    install_logger();
    let mm = ObjectManager::new();
    let id = mm.id();
    let (kept, line) = (mm.create(Entity { name: String::new(), parent: None }), line!());
    let report = mm.shutdown();
    assert_eq!(report.outliving_handles(), 1);
    let logged = records_containing(&format!("outlive object manager #{id};"));
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].level, log::Level::Warn);
    assert!(logged[0].message.contains(&format!("{} bytes of slot memory", report.leaked_bytes())));
    assert_eq!(details_containing(&format!("{}:{line}:", file!())).len(), 1);
    drop(kept);
}

#[test]
fn report_leaks_off_logs_no_entries() {
    install_logger();
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let id = mm.id();
    let (a, line) = (mm.create(Entity { name: String::new(), parent: None }), line!());
    let b = a.clone();
    leak_cycle(&mut mm, a, b);
    let report = mm.shutdown();
    assert_eq!(report.len(), 1, "the report is returned either way");
    assert!(records_containing(&format!("object manager #{id}:")).is_empty());
    assert!(records_containing(&format!("{}:{line}:", file!())).is_empty());
}

#[test]
fn a_clean_shutdown_logs_nothing() {
    install_logger();
    let mm = ObjectManager::new();
    let id = mm.id();
    drop(mm.create(Entity { name: String::new(), parent: None }));
    assert!(mm.shutdown().is_empty());
    assert!(records_containing(&format!("object manager #{id}:")).is_empty());
    assert!(records_containing(&format!("object manager #{id};")).is_empty());
}

#[test]
fn report_leaks_off_silences_the_outliving_warning_too() {
    install_logger();
    let mm = ObjectManager::builder().report_leaks(false).build();
    let id = mm.id();
    let kept = mm.create(Entity { name: String::new(), parent: None });
    let report = mm.shutdown();
    assert_eq!(report.outliving_handles(), 1, "still counted in the report");
    assert!(records_containing(&format!("outlive object manager #{id};")).is_empty());
    drop(kept);
}

/// Panics when dropped.
#[derive(MMObject)]
struct Bomb {
    armed: bool,
}

impl Drop for Bomb {
    fn drop(&mut self) {
        if self.armed {
            panic!("boom");
        }
    }
}

#[test]
fn a_panicking_drop_at_shutdown_is_logged_with_type_and_key() {
    install_logger();
    let mm = ObjectManager::builder().report_leaks(false).build();
    let id = mm.id();
    let bomb = mm.create(Bomb { armed: true });
    let key = bomb.key();
    let _raw = bomb.into_raw();
    let report = mm.shutdown();
    assert_eq!(report.drop_panics(), 1);
    let logged = records_containing(&format!("Bomb{key} panicked in Drop at shutdown of object manager #{id}"));
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0].level, log::Level::Error);
}

#[test]
fn garbage_raw_handles_are_invalid_not_from_another_manager() {
    use mmobject::{Error, RawHandle};
    let mm = ObjectManager::builder().report_leaks(false).build();
    let kept = mm.create(Entity { name: String::new(), parent: None });
    // Tag 222 (this test binary makes far fewer managers), tag 0, an even generation.
    for bits in [0xDE00_0000_0000_0001_u64, 12_345, 0xDE00_0000_0000_0002, u64::MAX - 1] {
        let error = mm.add_ref_raw(RawHandle(bits)).unwrap_err();
        assert_eq!(error, Error::InvalidRawHandle { raw: bits }, "{bits:#x}");
        assert!(!error.to_string().contains("object manager #"), "{error}");
    }
    // A real raw handle of another manager still says so.
    let other = ObjectManager::builder().report_leaks(false).build();
    let raw = other.create(Entity { name: String::new(), parent: None }).into_raw();
    assert!(matches!(mm.release_raw(raw), Err(Error::WrongManager { .. })));
    other.release_raw(raw).unwrap();
    drop(kept);
}
