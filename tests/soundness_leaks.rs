//! Adversarial cases that leak on purpose, so Miri runs them with leak
//! checking off (the rest of the suite is in `tests/soundness/`).

use mmobject::{Error, MMObject, ObjectManager};

#[derive(MMObject)]
struct Item {
    id: u32,
}

/// `mem::forget` of a handle is safe: the object stays alive, is reported at
/// shutdown, and its slot memory is leaked so nothing can dangle.
#[test]
fn forgotten_handle_is_a_reported_leak() {
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let kept = mm.create(Item { id: 1 });
    std::mem::forget(kept.clone());
    let weak = kept.downgrade();
    drop(kept);
    mm.collect_garbage();
    assert_eq!(mm.get_weak(weak).map(|i| i.id), Some(1), "a forgotten handle keeps its object alive");
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    assert_eq!(report.iter().next().map(|e| e.ref_count), Some(1));
}

/// The count never wraps: past 2^29 references, clone panics and upgrade and
/// `add_ref_raw` fail, each leaving the count as it was.
#[test]
fn reference_count_stops_at_its_limit() {
    let mm = ObjectManager::builder().report_leaks(false).build();
    count_stops_at_its_limit(&mm, mm.create(Item { id: 1 }));
}

/// The same on the owner thread of a manager that has one, whose clones
/// take counts in batches (near the limit, one at a time).
#[test]
fn reference_count_stops_at_its_limit_on_the_owner_thread() {
    let mm = ObjectManager::builder().report_leaks(false).owner_thread(true).build();
    count_stops_at_its_limit(&mm, mm.create(Item { id: 1 }));
}

/// The same for a type that may hold handles, whose count word also carries
/// the candidate-root flag (set here by the drop of a clone).
#[test]
fn reference_count_stops_at_its_limit_with_the_candidate_flag_set() {
    #[derive(MMObject)]
    struct Linked {
        next: Option<mmobject::Handle<Linked>>,
    }
    let mm = ObjectManager::builder().report_leaks(false).build();
    let h = mm.create(Linked { next: None });
    drop(h.clone());
    assert_eq!(mm.cycle_candidates(), 1);
    count_stops_at_its_limit(&mm, h);
    assert_eq!(mm.cycle_candidates(), 1, "queued once");
}

fn count_stops_at_its_limit<T: MMObject>(mm: &ObjectManager, h: mmobject::Handle<T>) {
    let limit = 1u32 << 29;
    h.leak_refs_for_tests(limit - 2);
    assert_eq!(h.ref_count(), limit - 1);
    let last = h.clone();
    assert_eq!(h.ref_count(), limit);

    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.clone())).unwrap_err();
    let message = panic.downcast_ref::<String>().map(String::as_str).unwrap_or_default();
    assert!(message.contains("reference count overflow"), "{message}");
    assert_eq!(h.ref_count(), limit, "a refused clone leaves the count as it was");
    assert!(matches!(mm.try_upgrade(h.downgrade()), Err(Error::RefCountOverflow { .. })));
    assert_eq!(h.ref_count(), limit);

    drop(last);
    let raw = h.clone().into_raw();
    assert!(matches!(mm.add_ref_raw(raw), Err(Error::RefCountOverflow { .. })));
    assert_eq!(h.ref_count(), limit);
    mm.release_raw(raw).unwrap();
    assert_eq!(h.ref_count(), limit - 1);
}

/// `into_raw` racing the manager's drop on another thread. With the
/// `handle-sites` feature `into_raw` used to touch its store's shared part
/// after the raw count made it look unreferenced, so a concurrent shutdown
/// could free it first. The race window is small: this runs it many times
/// (and Miri, which checks every access, explores other interleavings on
/// each run).
#[test]
fn into_raw_racing_shutdown() {
    let rounds = if cfg!(miri) { 8 } else { 200 };
    for _ in 0..rounds {
        let mm = ObjectManager::builder().report_leaks(false).build();
        let h = mm.create(Item { id: 1 });
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                let raw = h.into_raw();
                assert_ne!(u64::from(raw), 0);
            });
            barrier.wait();
            drop(mm);
        });
    }
}

/// A loader thread creating in a loop while the manager shuts down on
/// another thread: every create either lands before shutdown (its object is
/// destroyed and reported by shutdown, and the handle outlives the manager)
/// or is refused with the value back. The handles then drop after the manager.
#[test]
fn loader_creating_through_shutdown_on_another_thread() {
    let mm = ObjectManager::builder().report_leaks(false).segment_base(2).build();
    let loader = mm.loader();
    let creates = if cfg!(miri) { 20 } else { 2000 };
    let worker = std::thread::spawn(move || {
        let mut made = Vec::new();
        let mut refused = 0u32;
        for id in 0..creates {
            match loader.try_create(Item { id }) {
                Ok(h) => made.push(h),
                Err(e) => {
                    assert!(matches!(e.error, Error::ManagerShutDown { .. }));
                    assert_eq!(e.into_value().id, id);
                    refused += 1;
                }
            }
        }
        (made, refused)
    });
    std::thread::yield_now();
    let report = std::thread::spawn(move || mm.shutdown()).join().unwrap();
    let (made, refused) = worker.join().unwrap();
    assert_eq!(made.len() as u32 + refused, creates);
    assert_eq!(report.len(), made.len(), "each object created before shutdown is reported");
    drop(made); // after the manager: sound
}
