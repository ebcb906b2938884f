//! Adversarial cases where user code runs inside shutdown: a logger that
//! panics, or drops handles, while the manager reports and settles. The
//! logger is process-wide, so these live in a binary of their own; each test
//! sets a hook for its own thread. They leak slot memory on purpose (that is
//! what keeps the handles sound), so Miri runs them with leaks ignored.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use mmobject::{MMObject, ObjectManager};

#[derive(MMObject)]
struct Item {
    id: u32,
}

type Hook = Box<dyn FnMut(&str)>;

thread_local! {
    /// What the logger does with a message logged on this thread.
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// A logger that hands each message to the calling thread's hook.
struct HookedLogger;

impl log::Log for HookedLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }

    fn log(&self, record: &log::Record) {
        let message = record.args().to_string();
        HOOK.with(|hook| {
            if let Ok(mut hook) = hook.try_borrow_mut() {
                if let Some(hook) = hook.as_mut() {
                    hook(&message);
                }
            }
        });
    }

    fn flush(&self) {}
}

/// Installs the logger (once per process) and this thread's hook.
fn on_log(hook: impl FnMut(&str) + 'static) {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&HookedLogger).expect("no other logger in this binary");
        log::set_max_level(log::LevelFilter::Warn);
    });
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
}

fn clear_hook() {
    HOOK.with(|h| h.borrow_mut().take());
}

/// A logger that panics in the middle of the leak report unwinds out of
/// `shutdown`, and the manager is dropped without settling. The stores must
/// then keep their memory: a live handle stays sound, and a new manager's
/// objects (which could reuse freed segments) are not touched through it.
#[test]
fn a_logger_that_panics_during_shutdown_leaves_live_handles_sound() {
    on_log(|message| {
        if message.contains("still alive at shutdown") {
            panic!("the logger panics");
        }
    });
    let mm = ObjectManager::new();
    let kept = mm.create(Item { id: 7 });
    let unwound = catch_unwind(AssertUnwindSafe(move || mm.shutdown()));
    clear_hook();
    assert!(unwound.is_err(), "the logger's panic comes out of shutdown");

    let other = ObjectManager::builder().report_leaks(false).build();
    let fresh = other.create(Item { id: 42 });
    let copy = kept.clone();
    assert_eq!(kept.ref_count(), 2, "the dead manager's slot still holds its count");
    assert_eq!(fresh.ref_count(), 1, "a new manager's object is not reached through an old handle");
    drop(copy);
    drop(kept);
    assert_eq!(fresh.ref_count(), 1);
    assert_eq!(other.dead_count(), 0, "nothing of the new manager was released");
    assert_eq!(other[&fresh].id, 42);
}

/// A handle dropped on a thread other than the owner, while shutdown settles
/// the store, records a check that names the store's shared part. Its slot
/// is also held by a raw reference, and once the drop is done the count
/// equals the raw count: that must not let shutdown free the store, or the
/// check's later drain reads freed memory. (The logger's hook drops the
/// handle at the moment shutdown warns that it does not own the manager,
/// which it does while settling, after its last drain of the rings.)
#[test]
fn a_drop_on_another_thread_while_shutdown_settles_keeps_the_store() {
    // Built with an owner on another thread: this thread counts remotely.
    let mm = std::thread::spawn(|| ObjectManager::builder().owner_thread(true).build()).join().unwrap();
    let first = mm.create(Item { id: 1 });
    let second = mm.create(Item { id: 2 });
    let _raw_first = first.clone().into_raw();
    let _raw_second = second.clone().into_raw();
    let mut held = vec![second, first];
    on_log(move |message| {
        // The leak report drops the first handle (queuing a check, so that
        // settling warns); the warning drops the second.
        if held.len() == 2 || (held.len() == 1 && message.contains("does not own")) {
            drop(held.pop());
        }
    });
    let report = mm.shutdown();
    clear_hook();
    assert!(
        report.outliving_handles() >= 1,
        "a slot whose drop had yet to record its check is held from outside (got {report:?})"
    );
    // Drains this thread's ring, and the check in it.
    let mut later = ObjectManager::builder().report_leaks(false).build();
    later.collect_garbage();
}
