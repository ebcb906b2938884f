//! Re-entrancy: user code the manager runs (a store allocator, `size()`, a
//! `Drop`) that comes back into the manager. Each case either works or
//! panics with a message naming what the thread was doing; none deadlocks
//! and none corrupts the manager.
//!
//! The store allocator here forwards to `Global` and runs a per-thread hook
//! first, when one is armed. A hook is taken out while it runs, so the
//! allocations it causes itself do not run it again.

mod support;

use std::alloc::Layout;
use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::mpsc;
use std::time::Duration;

use mmobject::allocator_api2::alloc::{AllocError, Allocator, Global};
use mmobject::{MMObject, ObjectManager};

use support::Drops;

type Hook = Box<dyn FnMut(Layout)>;

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Runs `hook` before each store allocation this thread makes, until [`disarm`].
fn arm(hook: impl FnMut(Layout) + 'static) {
    HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
}

fn disarm() {
    HOOK.with(|h| h.borrow_mut().take());
}

#[derive(Clone, Copy)]
struct HookAlloc;

// SAFETY: every block comes from and goes back to `Global`.
unsafe impl Allocator for HookAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if let Some(mut hook) = HOOK.with(|h| h.borrow_mut().take()) {
            hook(layout);
            // Put back, unless the hook re-armed or a panic went past.
            HOOK.with(|h| {
                h.borrow_mut().get_or_insert(hook);
            });
        }
        Global.allocate(layout)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        // SAFETY: the caller's contract is `Global`'s, which allocated it.
        unsafe { Global.deallocate(ptr, layout) }
    }
}

fn hooked() -> ObjectManager {
    ObjectManager::builder().report_leaks(false).segment_base(4).allocator(HookAlloc).build()
}

/// [`hooked`], with this thread as its owner (so drops can queue checks).
fn hooked_owned() -> ObjectManager {
    ObjectManager::builder().report_leaks(false).segment_base(4).allocator(HookAlloc).owner_thread(true).build()
}

/// An object that counts its drops.
#[derive(MMObject)]
struct Counted {
    _token: support::DropToken,
}

/// Runs `f` on its own thread and returns what it returns, or panics as it
/// panicked; a run past 10 s is a deadlock, and fails the test (the stuck
/// thread is left behind).
///
/// The scenarios run one at a time: a collection drains every thread's
/// last drops, so one test's could run another's allocator (and hook) or
/// take the ring entries another test means to drain itself.
fn within_10s<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> R {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = SERIAL.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let (send, recv) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = send.send(catch_unwind(AssertUnwindSafe(f)));
    });
    // Miri runs a scenario hundreds of times slower: there only a hang fails it.
    match recv.recv_timeout(Duration::from_secs(if cfg!(miri) { 900 } else { 10 })) {
        Ok(Ok(value)) => value,
        Ok(Err(payload)) => std::panic::resume_unwind(payload),
        Err(_) => panic!("deadlock: the scenario did not finish within 10 s"),
    }
}

/// The message of a caught panic.
fn message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(s) => *s,
        Err(payload) => payload.downcast::<&str>().map_or_else(|_| "?".into(), |s| s.to_string()),
    }
}

#[derive(MMObject)]
struct Rock {
    id: u32,
}

#[derive(MMObject)]
struct Pebble {
    id: u32,
}

#[derive(MMObject)]
struct Sand {
    id: u32,
}

#[test]
fn allocator_creating_the_type_whose_store_grows_panics_clearly() {
    let text = within_10s(|| {
        let mm = hooked();
        mm.reserve::<Rock>(0); // registered, no segment yet
        let loader = mm.loader();
        arm(move |_| drop(loader.create(Rock { id: 1 })));
        let outcome = catch_unwind(AssertUnwindSafe(|| drop(mm.create(Rock { id: 0 }))));
        disarm();
        // The manager is still usable.
        assert_eq!(mm[&mm.create(Rock { id: 2 })].id, 2);
        message(outcome.expect_err("a re-entrant grow of the same store must panic"))
    });
    assert!(text.contains("already growing the store of `") && text.contains("Rock"), "{text}");
}

#[test]
fn allocator_creating_an_unregistered_type_while_one_registers_panics_clearly() {
    let text = within_10s(|| {
        let mm = hooked();
        let loader = mm.loader();
        arm(move |_| drop(loader.create(Pebble { id: 1 })));
        let outcome = catch_unwind(AssertUnwindSafe(|| drop(mm.create(Rock { id: 0 }))));
        disarm();
        assert_eq!(mm[&mm.create(Pebble { id: 2 })].id, 2);
        message(outcome.expect_err("a re-entrant registration must panic"))
    });
    assert!(text.contains("already registering an object type"), "{text}");
}

#[test]
fn allocator_creating_a_registered_type_while_another_store_grows_works() {
    within_10s(|| {
        let mm = hooked();
        let sand = mm.create(Sand { id: 0 }); // Sand's store has room for 3 more
        let loader = mm.loader();
        let made = std::rc::Rc::new(RefCell::new(Vec::new()));
        let keep = std::rc::Rc::clone(&made);
        arm(move |_| keep.borrow_mut().push(loader.create(Sand { id: 1 })));
        let rock = mm.create(Rock { id: 7 });
        disarm();
        assert_eq!(mm[&rock].id, 7);
        assert_eq!(mm[&sand].id, 0);
        assert!(!made.borrow().is_empty() && mm.count::<Sand>() == 1 + made.borrow().len());
    });
}

#[test]
fn allocator_growing_other_stores_while_the_index_table_grows_works() {
    within_10s(|| {
        let mm: &'static ObjectManager = Box::leak(Box::new(hooked()));
        let mut want = 0;
        // The index table's ranges (four `u32`s each) are the store allocations
        // aligned to 4: grow Pebble's store each time the table grows.
        arm(move |layout| {
            if layout.align() == 4 {
                want += 64;
                mm.reserve::<Pebble>(want);
            }
        });
        let rocks = mm.create_many((0..200).map(|id| Rock { id }));
        disarm();
        assert_eq!(mm[&rocks[199]].id, 199);
        assert!(mm.count::<Pebble>() == 0 && mm.report().types.len() == 2);
    });
}

/// A large object: a 2 KiB batch of slot headers covers only a few of them.
#[derive(MMObject)]
struct Boulder {
    id: u32,
    _mass: [u64; 64],
}

#[test]
fn allocator_creating_the_type_while_its_next_segment_grows_works() {
    within_10s(|| {
        let mm = ObjectManager::builder().report_leaks(false).segment_base(64).allocator(HookAlloc).build();
        let loader = mm.loader();
        // Made one at a time through the loader, so segment 0's headers are
        // written a few slots ahead only: the nested create writes the next ones.
        let first = loader.create(Boulder { id: 0, _mass: [0; 64] });
        let made = std::rc::Rc::new(RefCell::new(Vec::new()));
        let keep = std::rc::Rc::clone(&made);
        arm(move |_| {
            for id in 1..8 {
                keep.borrow_mut().push(loader.create(Boulder { id, _mass: [0; 64] }));
            }
        });
        mm.reserve::<Boulder>(100); // grows segment 1: the allocator runs
        disarm();
        // Once, or twice with `handle-sites` (the handle-site table grows through the same
        // allocator, and its nested creates are not recorded there).
        let made_count = made.borrow().len();
        assert!(made_count == 7 || cfg!(feature = "handle-sites") && made_count == 14, "{made_count}");
        assert_eq!(mm.count::<Boulder>(), 1 + made_count);
        assert_eq!(mm[&first].id, 0);
    });
}

#[test]
fn allocator_creating_the_type_while_its_charge_table_grows_works() {
    static TRACKER: mmobject::track::Tracker = mmobject::track::Tracker::new();
    within_10s(|| {
        let mm =
            ObjectManager::builder().report_leaks(false).segment_base(4).allocator(HookAlloc).tracker(&TRACKER).build();
        let first = mm.create(Rock { id: 0 }); // segment 0 has room for 3 more
        let loader = mm.loader();
        let made = std::rc::Rc::new(RefCell::new(Vec::new()));
        let keep = std::rc::Rc::clone(&made);
        // The tracker's charge table holds `usize`s: the store allocations aligned to 8.
        arm(move |layout| {
            if layout.align() == 8 {
                keep.borrow_mut().push(loader.create(Rock { id: 1 }));
            }
        });
        mm.reserve::<Rock>(10);
        disarm();
        assert!(!made.borrow().is_empty());
        assert_eq!(mm.count::<Rock>(), 1 + made.borrow().len());
        assert_eq!(mm[&first].id, 0);
    });
}

#[test]
fn nested_loader_create_while_shutdown_waits_completes() {
    within_10s(|| {
        let mm = hooked();
        mm.reserve::<Pebble>(1); // the nested create needs no lock of its own
        let loader = mm.loader();
        let (inside, entered) = mpsc::channel();
        let (closing, closes) = mpsc::channel::<()>();
        let worker = std::thread::spawn(move || {
            let nested = loader.clone();
            let mut once = Some((inside, closes));
            arm(move |_| {
                if let Some((inside, closes)) = once.take() {
                    inside.send(()).unwrap();
                    closes.recv().unwrap();
                    // Give shutdown time to close the gate and wait for this create.
                    std::thread::sleep(Duration::from_millis(200));
                    assert!(nested.try_create(Pebble { id: 1 }).is_ok());
                }
            });
            // Rock's first create registers its store: the allocator runs.
            let rock = loader.try_create(Rock { id: 0 });
            disarm();
            rock.is_ok()
        });
        entered.recv().unwrap();
        closing.send(()).unwrap();
        let report = mm.shutdown();
        assert!(worker.join().unwrap(), "the loader's create began before shutdown");
        drop(report);
    });
}

/// A store allocator that panics (or a logger that panics after it refused)
/// while the last drops of a thread are being drained: the drain must not
/// leave entries it already moved to look undrained, or the next collection
/// links them a second time and destroys objects twice. (The check being
/// queued is lost with the panic: its object waits for shutdown, whose
/// store memory is then kept on purpose.)
#[test]
fn a_panicking_allocator_during_a_drain_destroys_nothing_twice() {
    within_10s(|| {
        let drops = Drops::new();
        let mut mm = hooked_owned();
        let counted: Vec<_> = (0..3).map(|_| mm.create(Counted { _token: drops.token() })).collect();
        let checked = mm.create(Sand { id: 0 });
        let copy = checked.clone(); // the owner thread now holds counts on it
        drop(counted); // three last drops in this thread's ring
        drop(copy);
        drop(checked); // a check, queued after them
        arm(|_| panic!("store allocator refuses to work"));
        let outcome = catch_unwind(AssertUnwindSafe(|| mm.collect_garbage()));
        disarm();
        assert!(message(outcome.expect_err("the allocator panics")).contains("refuses"));
        mm.collect_garbage();
        mm.collect_garbage();
        assert_eq!(drops.count(), 3, "each object dropped once");
        drop(mm);
        assert_eq!(drops.count(), 3);
    });
}

#[derive(MMObject)]
struct Node {
    next: Option<mmobject::Handle<Node>>,
}

#[test]
fn allocator_dropping_a_handle_while_a_cycle_candidate_is_queued_works() {
    within_10s(|| {
        let mut mm = hooked();
        let a = mm.create(Node { next: None });
        let b = mm.create(Node { next: Some(a.clone()) });
        mm[&a].next = Some(b.clone());
        // Each is held by the other: dropping `a` queues a candidate, and
        // the allocator, growing the queue for it, drops `b`.
        let fired = std::rc::Rc::new(std::cell::Cell::new(false));
        let seen = std::rc::Rc::clone(&fired);
        let mut b = Some(b);
        arm(move |_| {
            seen.set(b.is_some());
            drop(b.take());
        });
        drop(a);
        disarm();
        assert!(fired.get(), "the candidate queue grew");
        let step = mmobject::CycleCollector::new().step(&mut mm, Duration::from_secs(5));
        assert_eq!(step.collected.objects, 2, "the cycle is found all the same");
        assert!(mm.is_empty());
    });
}

/// Creates 70 rocks, each at its own call site (its own column).
#[rustfmt::skip]
fn seventy_sites(mm: &ObjectManager) -> Vec<mmobject::Handle<Rock>> {
    let mut rocks = Vec::new();
    let mut at = |rock| rocks.push(rock);
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 })); at(mm.create(Rock { id: 0 }));
    rocks
}

/// Past the 64 creation sites a store numbers without a lock, a new site
/// is numbered in a locked table; the allocator, growing that table,
/// creates at another new site, which is then recorded as unknown.
#[test]
fn allocator_creating_while_a_creation_site_is_numbered_works() {
    within_10s(|| {
        let mm = hooked();
        mm.reserve::<Rock>(100);
        let loader = mm.loader();
        let made = std::rc::Rc::new(RefCell::new(Vec::new()));
        let keep = std::rc::Rc::clone(&made);
        // The site table's allocations are the ones aligned to 8 or 16 here.
        arm(move |layout| {
            if matches!(layout.align(), 8 | 16) {
                keep.borrow_mut().push(loader.create(Rock { id: 1 }));
            }
        });
        let rocks = seventy_sites(&mm);
        disarm();
        assert_eq!(rocks.len(), 70);
        assert!(!made.borrow().is_empty(), "the site table grew");
        assert_eq!(mm.count::<Rock>(), 70 + made.borrow().len());
    });
}

/// With `handle-sites`, the allocator drops recorded handles and gives back a raw
/// reference while the handle-site table grows under its lock. Neither may wait for that
/// lock nor panic (one is a `Drop`): their removals wait for the table's next lock, and the
/// leak report lists exactly the handles still alive.
#[cfg(feature = "handle-sites")]
#[test]
fn allocator_dropping_recorded_handles_while_the_handle_site_table_grows_works() {
    use mmobject::HandleOrigin;
    within_10s(|| {
        let mm = std::rc::Rc::new(hooked());
        let kept = mm.create(Rock { id: 0 });
        let doomed: Vec<_> = (0..3).map(|_| kept.clone()).collect();
        let raw = kept.clone().into_raw();
        let fired = std::rc::Rc::new(std::cell::Cell::new(false));
        let mut state = Some((doomed, std::rc::Rc::clone(&mm), std::rc::Rc::clone(&fired)));
        // A clone allocates from the store's allocator only to grow the handle-site table.
        arm(move |_| {
            if let Some((doomed, mm, fired)) = state.take() {
                drop(doomed);
                mm.release_raw(raw).expect("a live raw reference");
                fired.set(true);
            }
        });
        let clones: Vec<_> = (0..64).map(|_| kept.clone()).collect();
        disarm();
        assert!(fired.get(), "the handle-site table grew while clones were recorded");
        let mm = std::rc::Rc::try_unwrap(mm).expect("the hook is gone");
        let report = mm.shutdown();
        let entry = report.iter().find(|e| e.type_name.ends_with("Rock")).expect("leaked");
        assert_eq!(entry.ref_count, 65);
        let created = entry.handles.iter().filter(|s| s.origin == HandleOrigin::Created).count();
        let cloned = entry.handles.iter().filter(|s| s.origin == HandleOrigin::Cloned).count();
        // Clones made inside the growth are not recorded; none were made there.
        assert_eq!((created, cloned, entry.handles.len()), (1, 64, 65), "{:?}", entry.handles);
        drop((kept, clones));
    });
}

/// The allocator runs while a drain queues a check (owner thread): there it
/// drops enough last handles to fill this thread's ring again, and reads
/// and collects another manager (which drains every ring). Both would wait
/// for the drain under way; both go on without it.
#[test]
fn allocator_releasing_and_collecting_during_a_drain_works() {
    within_10s(|| {
        let drops = Drops::new();
        let mut mm = hooked_owned();
        let many: Vec<_> = (0..600).map(|_| mm.create(Counted { _token: drops.token() })).collect();
        let other = support::quiet();
        let elsewhere = other.create(Sand { id: 1 });
        let checked = mm.create(Sand { id: 0 });
        drop(checked.clone()); // the owner thread now holds counts on it
        drop(checked); // a check in this thread's ring
        let mut hook_state = Some((many, elsewhere, other));
        arm(move |_| {
            if let Some((many, elsewhere, mut other)) = hook_state.take() {
                // Every other slot first: no drop follows its neighbour, so
                // each takes an entry of the ring (a run of neighbours takes one).
                let (even, odd): (Vec<_>, Vec<_>) = many.into_iter().enumerate().partition(|(i, _)| i % 2 == 0);
                for (_, handle) in even.into_iter().chain(odd) {
                    drop(handle);
                }
                drop(elsewhere);
                assert_eq!(other.collect_garbage().objects, 1);
                assert!(other.shutdown().is_empty());
            }
        });
        mm.collect_garbage();
        disarm();
        mm.collect_garbage();
        assert_eq!(drops.count(), 600, "each object dropped once");
        assert_eq!(mm.len(), 0);
    });
}

/// `Drop` and `size()` during a collection: creating through a loader,
/// cloning and dropping handles (also the last handle of another object)
/// all work.
#[test]
fn drop_during_collection_may_create_and_release() {
    within_10s(|| {
        let mut mm = ObjectManager::builder().report_leaks(false).segment_base(4).build();
        struct Busy {
            loader: mmobject::Loader,
            other: Option<mmobject::Handle<Sand>>,
        }
        impl MMObject for Busy {
            const TYPE_NAME: &'static str = "Busy";
            const TAG: &'static str = "Busy";
            fn size(&self) -> usize {
                drop(self.loader.create(Pebble { id: 9 }));
                8
            }
        }
        impl Drop for Busy {
            fn drop(&mut self) {
                let made = self.loader.create(Sand { id: 3 });
                drop(made.clone());
                drop(self.other.take());
                drop(made);
            }
        }
        let busy: Vec<_> =
            (0..10).map(|i| mm.create(Busy { loader: mm.loader(), other: Some(mm.create(Sand { id: i })) })).collect();
        drop(busy);
        let stats = mm.collect_garbage();
        assert_eq!(stats.objects, 10 + 10 + 10 + 10, "the Busy, their Sand, and what they made");
        assert_eq!(mm.len(), 0);
    });
}

/// `Drop` during `release_many` and during shutdown: a loader's create
/// works in the first, and in the second is refused with a clear error.
#[test]
fn drop_during_release_many_and_shutdown_uses_a_loader() {
    within_10s(|| {
        let mut mm = ObjectManager::builder().report_leaks(false).segment_base(4).build();
        struct Maker {
            loader: mmobject::Loader,
            refused: std::sync::Arc<std::sync::atomic::AtomicUsize>,
        }
        impl MMObject for Maker {
            const TYPE_NAME: &'static str = "Maker";
            const TAG: &'static str = "Maker";
            fn may_hold_handles() -> bool {
                false
            }
        }
        impl Drop for Maker {
            fn drop(&mut self) {
                match self.loader.try_create(Pebble { id: 0 }) {
                    Ok(made) => drop(made),
                    Err(e) => {
                        assert!(matches!(e.error, mmobject::Error::ManagerShutDown { .. }), "{e}");
                        self.refused.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                }
            }
        }
        let refused = std::sync::Arc::default();
        let make =
            |mm: &ObjectManager| mm.create(Maker { loader: mm.loader(), refused: std::sync::Arc::clone(&refused) });
        let batch: Vec<_> = (0..5).map(|_| make(&mm)).collect();
        assert_eq!(mm.release_many(batch).objects, 5);
        assert_eq!(mm.count::<Pebble>(), 0, "the Pebbles made were dropped at once");
        assert_eq!(mm.collect_garbage().objects, 5);
        let kept = make(&mm);
        let report = mm.shutdown();
        assert_eq!(refused.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(report.drop_panics(), 0);
        drop(kept);
    });
}

/// `create_many`'s iterator runs while the batch holds a run of slots: it
/// may create objects of the same type and others through the manager.
#[test]
fn create_many_iterator_may_create_through_the_manager() {
    within_10s(|| {
        let mm = support::quiet();
        let mut side = Vec::new();
        let rocks = mm.create_many((0..50).map(|id| {
            side.push(mm.create(Rock { id: 1000 + id }));
            side.push(mm.create(Rock { id: 2000 + id }).clone());
            drop(mm.create(Pebble { id }));
            Rock { id }
        }));
        assert_eq!(mm.count::<Rock>(), 150);
        let mut ids: Vec<u32> = rocks.iter().chain(&side).map(|r| mm[r].id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 150, "every object in its own slot");
    });
}

/// `visit_handles` run by the cycle collector may clone and drop handles.
#[test]
fn visit_handles_may_clone_and_drop_handles() {
    within_10s(|| {
        let mut mm = support::quiet();
        struct Looped {
            next: std::sync::Mutex<Option<mmobject::Handle<Looped>>>,
            spare: mmobject::Handle<Sand>,
        }
        impl MMObject for Looped {
            const TYPE_NAME: &'static str = "Looped";
            const TAG: &'static str = "Looped";
            fn visit_handles(&self, visitor: &mut dyn FnMut(mmobject::ObjectKey)) {
                drop(self.spare.clone());
                if let Some(next) = &*self.next.lock().unwrap() {
                    visitor(next.key());
                }
            }
            fn release_handles(&mut self) {
                self.next.get_mut().unwrap().take();
            }
        }
        let sand = mm.create(Sand { id: 0 });
        let a = mm.create(Looped { next: std::sync::Mutex::new(None), spare: sand.clone() });
        let b = mm.create(Looped { next: std::sync::Mutex::new(Some(a.clone())), spare: sand.clone() });
        *mm[&a].next.lock().unwrap() = Some(b.clone());
        drop((a, b));
        assert_eq!(mm.collect_cycles().objects, 2);
        assert_eq!(mm.count::<Looped>(), 0);
        assert_eq!(mm[&sand].id, 0);
    });
}

/// A count made by the allocator while a drain queues a check (reached from
/// `dead_count`, which drains every thread's ring) leaves the objects being
/// queued out instead of waiting for the queue's lock.
#[test]
fn allocator_counting_while_checks_are_queued_works() {
    within_10s(|| {
        let mm: &'static ObjectManager = Box::leak(Box::new(hooked_owned()));
        let kept = mm.create(Sand { id: 1 });
        let checked = mm.create(Sand { id: 0 });
        drop(checked.clone()); // the owner thread now holds counts on it
        drop(checked); // a check in this thread's ring
        let counts = std::rc::Rc::new(RefCell::new(Vec::new()));
        let seen = std::rc::Rc::clone(&counts);
        arm(move |_| seen.borrow_mut().push(mm.count::<Sand>()));
        assert_eq!(mm.dead_count(), 1);
        disarm();
        assert!(!counts.borrow().is_empty(), "the check queue grew");
        assert_eq!(mm.count::<Sand>(), 1);
        assert_eq!(mm[&kept].id, 1);
    });
}

/// On an owner thread's manager, the allocator grows a type's queue of
/// checks (a drain queues one) and drops the last handles of 300 objects of
/// that type that the owner holds counts on. Those drops queue nothing (each
/// lease's check was queued when the owner took it, at its first clone), so
/// nothing waits on the queue being grown: the collections destroy every
/// object, once.
#[test]
fn allocator_releasing_owner_counted_objects_while_checks_are_queued_works() {
    within_10s(|| {
        let drops = Drops::new();
        let mut mm = hooked_owned();
        let many: Vec<_> = (0..300).map(|_| mm.create(Counted { _token: drops.token() })).collect();
        many.iter().for_each(|handle| drop(handle.clone())); // the owner holds counts on each
        let checked = mm.create(Counted { _token: drops.token() });
        drop(checked.clone());
        drop(checked); // a check in this thread's ring
        let mut many = Some(many);
        arm(move |_| {
            for handle in many.take().into_iter().flatten() {
                drop(handle);
            }
        });
        mm.collect_garbage();
        disarm();
        mm.collect_garbage();
        assert_eq!(drops.count(), 301, "the collections destroy every object");
        drop(mm);
        assert_eq!(drops.count(), 301, "once each");
    });
}

#[test]
fn allocator_making_a_raw_handle_while_the_raw_table_grows_panics_clearly() {
    let text = within_10s(|| {
        let mut mm = hooked();
        let a = mm.create(Rock { id: 0 });
        let mut b = Some(mm.create(Rock { id: 1 }));
        arm(move |_| {
            if let Some(b) = b.take() {
                let _ = b.into_raw();
            }
        });
        let outcome = catch_unwind(AssertUnwindSafe(|| a.into_raw()));
        disarm();
        assert_eq!(mm.collect_garbage().objects, 2, "both handles dropped as the panic went past");
        message(outcome.expect_err("a re-entrant raw-table update must panic"))
    });
    assert!(text.contains("already updating the raw references of `") && text.contains("Rock"), "{text}");
}

/// A store allocator that panics while a tracked `create` grows the store:
/// the object's charge goes back to its tag as the panic goes past (it once
/// stayed charged, and a budget then refused work that fit).
#[test]
fn a_panicking_allocator_in_a_tracked_create_leaves_no_charge() {
    static TRACKER: mmobject::track::Tracker = mmobject::track::Tracker::new();
    within_10s(|| {
        let tag = TRACKER.tag_named("Pebble");
        let mm =
            ObjectManager::builder().report_leaks(false).segment_base(4).allocator(HookAlloc).tracker(&TRACKER).build();
        mm.reserve::<Pebble>(0); // registered, no segment yet
        let before = TRACKER.tag_stats(tag);
        arm(|_| panic!("store allocator refuses to work"));
        let outcome = catch_unwind(AssertUnwindSafe(|| drop(mm.create(Pebble { id: 0 }))));
        disarm();
        assert!(message(outcome.expect_err("the allocator panics")).contains("refuses"));
        let after = TRACKER.tag_stats(tag);
        assert_eq!((after.bytes, after.count), (before.bytes, before.count), "no charge left behind");
        // The manager is still usable, and its count exact.
        let pebble = mm.create(Pebble { id: 1 });
        assert_eq!(mm[&pebble].id, 1);
        assert_eq!(TRACKER.tag_stats(tag).bytes, before.bytes + std::mem::size_of::<Pebble>());
        drop(pebble);
        drop(mm);
        assert_eq!(TRACKER.tag_stats(tag).bytes, before.bytes);
    });
}

/// What a shutdown inside its own loader's create says (one writer: the manager).
const INSIDE_OWN_LOADER: &str = "inside a create through its own `Loader` on the same thread";

/// The manager dropped by the iterator of its own loader's batch, on the
/// batch's thread: shutdown would wait for the batch, which waits for it. It
/// panics instead and leaves the manager as `mem::forget` would: the
/// handles made before stay sound, and the loader goes on creating.
#[test]
fn dropping_the_manager_inside_its_own_loader_batch_panics_instead_of_hanging() {
    let (text, after) = within_10s(|| {
        let mm = ObjectManager::builder().report_leaks(false).build();
        let loader = mm.loader();
        let kept = mm.create(Rock { id: 7 });
        let mut mm = Some(mm);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            loader.create_many((0..4).map(|id| {
                if id == 2 {
                    drop(mm.take());
                }
                Rock { id }
            }))
        }));
        let text = message(outcome.expect_err("the drop inside the batch must panic"));
        assert_eq!(kept.ref_count(), 1, "a handle made before stays sound");
        assert!(loader.is_open(), "left as `mem::forget` leaves it: never shut down");
        let after = loader.try_create(Rock { id: 8 }).map(|rock| rock.ref_count());
        drop(kept);
        (text, after.ok())
    });
    assert!(text.contains(INSIDE_OWN_LOADER) && text.contains("mem::forget"), "{text}");
    assert_eq!(after, Some(1));
}

/// The same from a store allocator under a single `Loader::create` (a new
/// type registers its store): the shutdown panics with the same message.
#[test]
fn shutting_the_manager_down_in_an_allocator_under_its_own_loader_create_panics() {
    let text = within_10s(|| {
        let mm = std::rc::Rc::new(RefCell::new(Some(hooked())));
        let loader = mm.borrow().as_ref().unwrap().loader();
        let inside = std::rc::Rc::clone(&mm);
        arm(move |_| {
            if let Some(mm) = inside.borrow_mut().take() {
                drop(mm.shutdown());
            }
        });
        let outcome = catch_unwind(AssertUnwindSafe(|| loader.try_create(Sand { id: 0 }).is_ok()));
        disarm();
        message(outcome.expect_err("the shutdown inside the create must panic"))
    });
    assert!(text.contains(INSIDE_OWN_LOADER), "{text}");
}

/// An iterator that owns the manager drops it after the batch, outside the
/// loader's create: an ordinary shutdown, which the handles outlive.
#[test]
fn a_batch_iterator_that_owns_the_manager_drops_it_after_the_batch() {
    let (open, counts) = within_10s(|| {
        let mm = ObjectManager::builder().report_leaks(false).build();
        let loader = mm.loader();
        let mut id = 0;
        let rocks = loader.create_many(std::iter::from_fn(move || {
            let _owned = &mm;
            id += 1;
            (id <= 3).then_some(Rock { id })
        }));
        (loader.is_open(), rocks.iter().map(|rock| rock.ref_count()).collect::<Vec<_>>())
    });
    assert!(!open, "the manager shut down when the iterator dropped");
    assert_eq!(counts, [1, 1, 1]);
}

/// Only the gate of the manager whose loader is creating counts: another
/// manager dropped inside the batch shuts down as usual.
#[test]
fn dropping_another_manager_inside_a_loader_batch_shuts_it_down() {
    let (other_open, made) = within_10s(|| {
        let mm = ObjectManager::builder().report_leaks(false).build();
        let other = ObjectManager::builder().report_leaks(false).build();
        let other_loader = other.loader();
        let mut other = Some(other);
        let rocks = mm.loader().create_many((0..3).map(|id| {
            drop(other.take());
            Rock { id }
        }));
        (other_loader.is_open(), rocks.len())
    });
    assert!(!other_open);
    assert_eq!(made, 3);
}

/// A drop of the manager while the batch's thread unwinds from the user's
/// own panic, inside the batch: a second panic would abort the process, so
/// the error is logged and the user's panic goes on.
#[test]
fn a_manager_dropped_while_unwinding_inside_its_own_loader_batch_does_not_abort() {
    let text = within_10s(|| {
        let mm = ObjectManager::builder().report_leaks(false).build();
        let loader = mm.loader();
        let mut mm = Some(mm);
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            loader.create_many((0..3).map(|id| {
                if id == 1 {
                    let _dropped_while_unwinding = mm.take();
                    panic!("the level file is corrupt");
                }
                Rock { id }
            }))
        }));
        assert!(loader.is_open(), "left as `mem::forget` leaves it");
        message(outcome.expect_err("the user's panic goes on"))
    });
    assert_eq!(text, "the level file is corrupt");
}
