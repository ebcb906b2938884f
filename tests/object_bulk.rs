//! The bulk calls. `create_many` and `try_create_many`: the same objects,
//! handles and counts as a loop of `create`, and nothing lost when the
//! iterator misbehaves or a value is refused. `release_many`: the same
//! outcome as dropping the handles and collecting, whoever else holds them.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mmobject::track::Tracker;
use mmobject::{Error, Handle, MMObject, ObjectManager, WeakHandle};

#[derive(MMObject, Debug, PartialEq)]
struct Unit {
    id: u32,
    hp: [u64; 7],
}

fn unit(id: u32) -> Unit {
    Unit { id, hp: [u64::from(id); 7] }
}

/// A type whose objects may hold handles (its drops take the cyclable path).
#[derive(MMObject)]
struct Squad {
    leader: Option<Handle<Unit>>,
    id: u32,
}

/// Small under Miri, where every step is slow; large enough elsewhere to
/// span several segments and many chunks.
const N: u32 = if cfg!(miri) { 40 } else { 5000 };

/// An iterator that promises `promised` values in its `size_hint` and
/// yields `yields`: a safe trait's answer the store must not trust.
struct Liar {
    next: u32,
    yields: u32,
    promised: usize,
}

impl Iterator for Liar {
    type Item = Unit;
    fn next(&mut self) -> Option<Unit> {
        (self.next < self.yields).then(|| {
            self.next += 1;
            unit(self.next - 1)
        })
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.promised, Some(self.promised))
    }
}

/// Drops what `mm` holds, collects, and checks that shutdown finds nothing
/// alive, no outliving handle and no leaked memory: the store's counts
/// matched its slots.
fn assert_clean_shutdown(mut mm: ObjectManager, handles: Vec<Handle<Unit>>) {
    drop(handles);
    mm.collect_garbage();
    assert_eq!(mm.count::<Unit>(), 0);
    let report = mm.shutdown();
    assert!(report.is_empty(), "{report}");
    assert_eq!(report.outliving_handles(), 0);
    assert_eq!(report.leaked_bytes(), 0);
}

#[test]
fn the_handles_come_back_in_order_each_counted_once() {
    let mm = ObjectManager::builder().segment_base(4).build();
    let handles = mm.create_many((0..N).map(unit));
    assert_eq!(handles.len(), N as usize);
    assert_eq!(mm.count::<Unit>(), N as usize);
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(mm[h], unit(i as u32));
        assert_eq!(h.ref_count(), 1);
    }
    let mut keys: Vec<_> = handles.iter().map(Handle::key).collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), N as usize, "every object has its own slot");
    assert_clean_shutdown(mm, handles);
}

#[test]
fn the_creation_site_is_the_callers_line() {
    let mm = ObjectManager::builder().report_leaks(false).build();
    let line = line!() + 1;
    let handles = mm.create_many((0..3).map(unit));
    // Held only by raw handles, the objects are alive at shutdown (so
    // reported) and their memory is still freed.
    let _raw: Vec<_> = handles.into_iter().map(Handle::into_raw).collect();
    let report = mm.shutdown();
    assert_eq!(report.len(), 3);
    for leak in report.iter() {
        assert_eq!((leak.site.file(), leak.site.line()), (file!(), line));
    }
    assert_eq!(report.leaked_bytes(), 0);
}

#[test]
fn free_slots_are_reused_first_and_stale_handles_stay_stale() {
    let mut mm = ObjectManager::builder().segment_base(4).build();
    let old: Vec<Handle<Unit>> = (0..16).map(|i| mm.create(unit(i))).collect();
    let weak: Vec<WeakHandle<Unit>> = old.iter().map(Handle::downgrade).collect();
    let slots_before = mm.report().types[0].slot_bytes;
    drop(old);
    mm.collect_garbage();
    let new = mm.create_many((100..116).map(unit));
    assert_eq!(mm.report().types[0].slot_bytes, slots_before, "the 16 freed slots were reused");
    for w in &weak {
        assert!(mm.get_weak(*w).is_none(), "a reused slot does not revive an old weak handle");
    }
    for (i, h) in new.iter().enumerate() {
        assert_eq!(mm[h].id, 100 + i as u32);
    }
    assert_clean_shutdown(mm, new);
}

#[test]
fn a_size_hint_that_promises_too_much_loses_no_slot() {
    // On the thread that made the store (which owns its run of fresh
    // slots): the slots taken and not filled become that run.
    let mm = ObjectManager::builder().segment_base(4).build();
    let handles = mm.create_many(Liar { next: 0, yields: 3, promised: 1000 });
    assert_eq!(handles.len(), 3);
    assert_eq!(mm.count::<Unit>(), 3, "counts see no phantom objects");
    let more: Vec<Handle<Unit>> = (0..5).map(|i| mm.create(unit(i))).collect();
    assert_eq!(mm.count::<Unit>(), 8);
    let all: Vec<Handle<Unit>> = handles.into_iter().chain(more).collect();
    assert_clean_shutdown(mm, all);

    // On another thread: they go back at the next collection.
    let mm = ObjectManager::builder().segment_base(4).build();
    mm.reserve::<Unit>(1);
    let handles =
        std::thread::scope(|s| s.spawn(|| mm.create_many(Liar { next: 0, yields: 2, promised: 500 })).join().unwrap());
    assert_eq!(handles.len(), 2);
    assert_eq!(mm.count::<Unit>(), 2, "counts see no phantom objects");
    assert_clean_shutdown(mm, handles);
}

/// The slots a batch took and did not fill come back at the next collection, on
/// whichever thread the batch ran: a type with a limit loses no capacity to an iterator
/// that panicked (a corrupt level file) or promised too much. They were retired for
/// good on other threads, and on the owner thread once its run was in use.
#[test]
fn a_batch_that_stops_early_loses_no_capacity() {
    let limit = 64;
    let stops_early = || (0..limit).map(|i| if i == 2 { panic!("the level file is corrupt") } else { unit(i) });
    let on_another_thread = |mm: &ObjectManager, batch: &(dyn Fn(&ObjectManager) + Sync)| {
        std::thread::scope(|s| s.spawn(|| batch(mm)).join().unwrap());
    };
    let mut mm = ObjectManager::builder().max_objects_per_type(limit).report_leaks(false).build();
    mm.reserve::<Unit>(1);
    on_another_thread(&mm, &|mm| assert!(catch_unwind(AssertUnwindSafe(|| mm.create_many(stops_early()))).is_err()));
    assert_eq!(mm.count::<Unit>(), 0, "counts see no phantom objects");
    mm.collect_garbage();
    let kept = std::sync::Mutex::new(Vec::new());
    on_another_thread(&mm, &|mm| {
        kept.lock().unwrap().extend(mm.create_many(Liar { next: 0, yields: 2, promised: 40 }))
    });
    assert_eq!(mm.count::<Unit>(), 2);
    mm.collect_garbage();
    assert!(catch_unwind(AssertUnwindSafe(|| mm.create_many(stops_early()))).is_err());
    assert_eq!(mm.count::<Unit>(), 2, "counts see no phantom objects");
    mm.collect_garbage();
    let mut made = Vec::new();
    let refused = mm.try_create_many((0..limit).map(unit), &mut made);
    assert_eq!(made.len(), limit as usize - 2, "every slot but the two objects' is back");
    assert!(refused.is_err());
    drop(made);
    mm.collect_garbage();
    assert_eq!(mm.count::<Unit>(), 2);
    assert_clean_shutdown(mm, kept.into_inner().unwrap());
}

#[test]
fn a_size_hint_that_promises_too_little_still_creates_everything() {
    let mm = ObjectManager::new();
    let handles = mm.create_many(Liar { next: 0, yields: N, promised: 0 });
    assert_eq!(handles.len(), N as usize);
    assert_eq!(mm.count::<Unit>(), N as usize);
    assert_clean_shutdown(mm, handles);
}

#[test]
fn an_iterator_that_panics_leaves_the_store_consistent() {
    let mut mm = ObjectManager::builder().segment_base(4).build();
    let values = (0..100).map(|i| if i == 7 { panic!("the level file is corrupt") } else { unit(i) });
    let caught = catch_unwind(AssertUnwindSafe(|| mm.create_many(values)));
    assert!(caught.is_err());
    mm.collect_garbage();
    assert_eq!(mm.count::<Unit>(), 0, "the 7 made before the panic were released by the unwind");
    let handles = mm.create_many((0..10).map(unit));
    assert_eq!(mm.count::<Unit>(), 10);
    assert_clean_shutdown(mm, handles);
}

#[test]
fn try_create_many_keeps_what_it_made_and_hands_back_the_refused_value() {
    let mm = ObjectManager::builder().max_objects_per_type(50).build();
    let first = mm.create(unit(0));
    let mut handles = vec![first];
    let mut wave = (1..80).map(unit);
    let refused = mm.try_create_many(wave.by_ref(), &mut handles).unwrap_err();
    assert!(matches!(refused.error, Error::CapacityExceeded { limit: 50, .. }), "{:?}", refused.error);
    assert_eq!(refused.value, unit(50));
    assert_eq!(handles.len(), 50);
    assert_eq!(wave.next(), Some(unit(51)), "the values after the refused one stay in the iterator");
    assert_eq!(mm.count::<Unit>(), 50);
    for (i, h) in handles.iter().enumerate() {
        assert_eq!(mm[h].id, i as u32);
    }
    assert_clean_shutdown(mm, handles);
}

#[test]
#[should_panic(expected = "capacity")]
fn create_many_panics_on_the_first_refused_value() {
    let mm = ObjectManager::builder().max_objects_per_type(4).report_leaks(false).build();
    let _handles = mm.create_many((0..10).map(unit));
}

#[test]
fn with_a_tracker_each_object_is_charged_and_budgets_hold() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Unit");
    let each = std::mem::size_of::<Unit>();
    TRACKER.set_budget(tag, 10 * each);
    let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    let mut handles = Vec::new();
    let refused = mm.try_create_many((0..20).map(unit), &mut handles).unwrap_err();
    assert!(matches!(refused.error, Error::BudgetExceeded { .. }), "{:?}", refused.error);
    assert_eq!(handles.len(), 10);
    assert_eq!(TRACKER.tag_stats(tag).bytes, 10 * each);
    drop(handles);
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0, "every charge credited back");
}

#[test]
fn objects_made_while_an_iterator_runs_are_not_yielded_by_it() {
    let mm = ObjectManager::new();
    let first = mm.create_many((0..4).map(unit));
    let mut seen = 0;
    let mut later = Vec::new();
    for (_, u) in mm.iter::<Unit>() {
        if later.is_empty() {
            later = mm.create_many((100..140).map(unit));
        }
        assert!(u.id < 100, "a running iterator never yields an object created after it began");
        seen += 1;
    }
    assert_eq!(seen, 4);
    assert_eq!(mm.count::<Unit>(), 44);
    let all: Vec<Handle<Unit>> = first.into_iter().chain(later).collect();
    assert_clean_shutdown(mm, all);
}

#[test]
fn threads_creating_many_at_once_get_distinct_slots() {
    let threads = if cfg!(miri) { 2 } else { 4 };
    let mm = ObjectManager::builder().segment_base(4).build();
    let batches: Vec<Vec<Handle<Unit>>> = std::thread::scope(|s| {
        let spawned: Vec<_> = (0..threads)
            .map(|t| {
                let mm = &mm;
                s.spawn(move || mm.create_many((0..N).map(|i| unit(t * N + i))))
            })
            .collect();
        spawned.into_iter().map(|j| j.join().unwrap()).collect()
    });
    let handles: Vec<Handle<Unit>> = batches.into_iter().flatten().collect();
    assert_eq!(mm.count::<Unit>(), (threads * N) as usize);
    let mut ids: Vec<u32> = handles.iter().map(|h| mm[h].id).collect();
    ids.sort_unstable();
    assert!(ids.iter().copied().eq(0..threads * N), "each object holds its own value");
    assert_clean_shutdown(mm, handles);
}

/// A manager with an owner thread, `N` units made in one batch, and `leaders`
/// squads (a type that holds handles) led by the first units, in another.
fn owned_units_led_by_squads(leaders: usize) -> (ObjectManager, Vec<Handle<Unit>>, Vec<Handle<Squad>>) {
    let mm = ObjectManager::builder().owner_thread(true).segment_base(4).build();
    let units = mm.create_many((0..N).map(unit));
    let squads = mm.create_many(
        units.iter().take(leaders).enumerate().map(|(i, u)| Squad { leader: Some(u.clone()), id: i as u32 }),
    );
    (mm, units, squads)
}

#[test]
fn handles_count_as_creates_do_with_an_owner_and_for_types_that_hold_handles() {
    let (mut mm, units, squads) = owned_units_led_by_squads(8);
    // Clones and drops on the owner, then on another thread.
    let clones: Vec<Handle<Unit>> = units.iter().map(Handle::clone).collect();
    assert!(units.iter().take(8).all(|u| u.ref_count() == 3));
    assert!(units.iter().skip(8).all(|u| u.ref_count() == 2));
    std::thread::scope(|s| {
        s.spawn(move || drop(clones));
    });
    mm.collect_garbage();
    assert_eq!(mm.count::<Unit>(), N as usize);
    assert_eq!(mm[&squads[3]].id, 3);
    drop(squads);
    mm.collect_garbage();
    assert_eq!(mm.count::<Squad>(), 0);
    assert!(units.iter().all(|u| u.ref_count() == 1), "the squads' leaders were released");
    assert_clean_shutdown(mm, units);
}

// ---- release_many ----------------------------------------------------------

/// Counts its drops, to check each object is destroyed exactly once.
#[derive(MMObject)]
struct Counted {
    id: u32,
    #[mm(skip)]
    drops: Arc<AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.drops.fetch_add(1, Ordering::SeqCst);
    }
}

fn counted(mm: &ObjectManager, n: u32, drops: &Arc<AtomicUsize>) -> Vec<Handle<Counted>> {
    mm.create_many((0..n).map(|id| Counted { id, drops: Arc::clone(drops) }))
}

#[test]
fn released_objects_are_destroyed_once_at_the_release() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut mm = ObjectManager::builder().segment_base(4).destroy_events(true).build();
    let level = counted(&mm, N, &drops);
    let weak: Vec<WeakHandle<Counted>> = level.iter().map(Handle::downgrade).collect();
    let hooked = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&hooked);
    mm.on_destroy::<Counted>(move |_, _| {
        seen.fetch_add(1, Ordering::SeqCst);
    });
    let stats = mm.release_many(level);
    assert_eq!((stats.objects, stats.rounds), (N as usize, 1));
    assert_eq!(stats.bytes, N as usize * std::mem::size_of::<Counted>());
    assert_eq!(drops.load(Ordering::SeqCst), N as usize);
    assert_eq!(hooked.load(Ordering::SeqCst), N as usize, "the destroy hook saw each");
    assert_eq!(mm.drain_destroyed().count(), N as usize, "an event for each");
    assert!(weak.iter().all(|w| mm.upgrade(*w).is_none()));
    assert_eq!(mm.count::<Counted>(), 0);
    assert_eq!(mm.collect_garbage().objects, 0, "nothing left for collection");
    // The freed slots are reused.
    let slots = mm.report().types[0].slot_bytes;
    let again = counted(&mm, N, &drops);
    assert_eq!(mm.report().types[0].slot_bytes, slots);
    mm.release_many(again);
    let report = mm.shutdown();
    assert!(report.is_empty() && report.leaked_bytes() == 0);
}

#[derive(MMObject)]
struct Fragile {
    id: u32,
}

impl Drop for Fragile {
    fn drop(&mut self) {
        if self.id == 3 {
            panic!("fragile 3 breaks");
        }
    }
}

#[test]
fn a_panicking_drop_leaves_the_manager_consistent() {
    let mut mm = ObjectManager::new();
    let level = mm.create_many((0..8).map(|id| Fragile { id }));
    let caught = catch_unwind(AssertUnwindSafe(|| mm.release_many(level)));
    assert!(caught.is_err());
    // 0..=3 were destroyed (3 with its panic); 4..8 dropped the ordinary way
    // in the unwind, and collection destroys them.
    assert_eq!(mm.collect_garbage().objects, 4);
    assert_eq!(mm.count::<Fragile>(), 0);
    let report = mm.shutdown();
    assert!(report.is_empty() && report.leaked_bytes() == 0);
}

#[test]
fn shared_objects_survive_a_release_of_one_of_their_handles() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut mm = ObjectManager::new();
    let level = counted(&mm, 10, &drops);
    let kept: Vec<Handle<Counted>> = level.iter().step_by(3).cloned().collect();
    assert_eq!(mm.release_many(level).objects, 6);
    assert_eq!(mm.collect_garbage().objects, 0);
    assert_eq!(mm.count::<Counted>(), 4);
    assert!(kept.iter().all(|h| h.ref_count() == 1));
    assert_eq!(kept.iter().map(|h| mm[h].id).collect::<Vec<_>>(), [0, 3, 6, 9]);
    assert_eq!(mm.release_many(kept).objects, 4);
    assert_eq!(drops.load(Ordering::SeqCst), 10);
}

#[test]
fn another_managers_handles_drop_the_ordinary_way() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mut mm = ObjectManager::new();
    let mut other = ObjectManager::new();
    let mine = counted(&mm, 5, &drops);
    let theirs = counted(&other, 5, &drops);
    assert_eq!(mm.release_many(theirs.into_iter().chain(mine)).objects, 5);
    assert_eq!(other.collect_garbage().objects, 5, "released to their own manager");
    assert_eq!(drops.load(Ordering::SeqCst), 10);
    // A manager with no store of the type only drops them.
    let mut empty = ObjectManager::new();
    empty.release_many(counted(&other, 3, &drops));
    assert_eq!(other.collect_garbage().objects, 3);
}

#[test]
fn types_that_hold_handles_and_owned_managers_release_correctly() {
    let (mut mm, units, squads) = owned_units_led_by_squads(4);
    // The owner's own clones and drops leave a reservation in some counts.
    for u in units.iter().take(16) {
        drop(u.clone());
    }
    // Another thread holds clones of a few, and drops them meanwhile.
    let held: Vec<Handle<Unit>> = units.iter().skip(16).take(8).cloned().collect();
    let worker = std::thread::spawn(move || drop(held));
    mm.release_many(squads);
    mm.release_many(units);
    worker.join().unwrap();
    mm.collect_garbage();
    assert_eq!(mm.count::<Squad>(), 0);
    assert_eq!(mm.count::<Unit>(), 0, "the squads' leaders went with them");
    let report = mm.shutdown();
    assert!(report.is_empty() && report.leaked_bytes() == 0);
}

#[test]
fn a_manager_moved_to_another_thread_releases_there() {
    let drops = Arc::new(AtomicUsize::new(0));
    let mm = ObjectManager::new();
    let level = counted(&mm, 100, &drops);
    let (mut mm, destroyed) = std::thread::spawn(move || {
        let mut mm = mm;
        let destroyed = mm.release_many(level).objects;
        (mm, destroyed)
    })
    .join()
    .unwrap();
    assert_eq!(destroyed, 100);
    assert_eq!(mm.collect_garbage().objects, 0);
    assert_eq!(drops.load(Ordering::SeqCst), 100);
}

/// Every live handle reads its own object and names its own slot.
fn assert_each_its_own(mm: &ObjectManager, made: &[(Handle<Unit>, u32)]) {
    let mut keys = std::collections::HashSet::new();
    for (h, id) in made {
        assert_eq!(mm[h], unit(*id), "a handle reads the object it was made for");
        assert!(keys.insert(h.key()), "two live objects share slot {:?}", h.key());
    }
    assert_eq!(mm.count::<Unit>(), made.len());
}

/// Creates `n` objects one `create` at a time, numbered on from `made`'s.
fn create_more(mm: &ObjectManager, made: &mut Vec<(Handle<Unit>, u32)>, n: u32) {
    let first = made.iter().map(|&(_, id)| id + 1).max().unwrap_or(0);
    made.extend((first..first + n).map(|id| (mm.create(unit(id)), id)));
}

/// The owner's creates step a cursor through each chunk of its run of fresh
/// slots instead of mapping each index to an address. Across chunk ends,
/// refills, a batch's unfilled slots becoming the run, a collection on another
/// thread (which takes the run over) and one back on this thread, each create
/// still gets a slot of its own.
#[test]
fn the_owners_run_gives_each_create_its_own_slot_across_chunks_and_hand_overs() {
    // Small segments, so the run crosses segment and chunk ends often.
    let mut mm = ObjectManager::builder().segment_base(4).report_leaks(false).build();
    let mut made = Vec::new();
    create_more(&mm, &mut made, N);
    assert_each_its_own(&mm, &made);

    // A batch that promises more than it yields: its unfilled slots become the run.
    let batch = mm.create_many(Liar { next: 0, yields: 3, promised: 200 });
    made.extend(batch.into_iter().map(|h| {
        let id = mm[&h].id;
        (h, id)
    }));
    create_more(&mm, &mut made, N / 2);
    assert_each_its_own(&mm, &made);

    // Another thread collects and becomes the owner: the run goes to the free list.
    mm = std::thread::scope(|s| {
        s.spawn(move || {
            let mut mm = mm;
            mm.collect_garbage();
            mm
        })
        .join()
        .unwrap()
    });
    create_more(&mm, &mut made, N / 2);
    assert_each_its_own(&mm, &made);

    // Back on this thread, with a third of them dead: kept slots, then a new run.
    let mut i = 0;
    made.retain(|_| {
        i += 1;
        i % 3 != 0
    });
    mm.collect_garbage();
    create_more(&mm, &mut made, N);
    assert_each_its_own(&mm, &made);
    assert_clean_shutdown(mm, made.into_iter().map(|(h, _)| h).collect());
}
