//! The object manager reporting into the memory tracker: per-tag bytes,
//! budgets limiting creation, and creation stacks in the leak report.

use std::sync::atomic::{AtomicUsize, Ordering};

use mmobject::track::{BudgetOverrun, BudgetPolicy, Mode, Tracker};
use mmobject::{Error, MMObject, ObjectManager};

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    pixels: Vec<u8>,
}

#[derive(MMObject)]
#[mm(tag = "Audio")]
struct Clip {
    samples: Vec<i16>,
}

fn texture(bytes: usize) -> Texture {
    Texture { pixels: vec![0; bytes] }
}

fn size_of_texture(bytes: usize) -> usize {
    std::mem::size_of::<Texture>() + bytes
}

#[test]
fn object_bytes_count_under_their_tag_and_return_to_zero() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    let a = mm.create(texture(1000));
    let b = mm.create(texture(500));
    let clip = mm.create(Clip { samples: vec![0; 100] });
    assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(1000) + size_of_texture(500));
    assert_eq!(TRACKER.tag_stats(tag).count, 2);
    assert_eq!(TRACKER.tag_stats(TRACKER.tag_named("Audio")).bytes, std::mem::size_of::<Clip>() + 200);

    drop(a);
    assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(1000) + size_of_texture(500), "dead, not collected");
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(500));
    drop((b, clip));
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0);
    assert_eq!(TRACKER.tag_stats(tag).count, 0);
    assert_eq!(TRACKER.tag_stats(tag).peak_bytes, size_of_texture(1000) + size_of_texture(500));
}

/// Issue 11: a grown object's credit took the other live objects' charge with it (two
/// textures of 3,000 B, one grows to 7,000 B and dies: the tag read 0 with 3,024 B alive,
/// and an 8,000-B `try_create` passed an 8,192-B budget). Each object is now credited
/// exactly what it was charged.
#[test]
fn a_grown_object_is_credited_what_it_was_charged() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    TRACKER.set_budget(tag, 8192);
    TRACKER.set_budget_policy(tag, BudgetPolicy::Error);
    let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    let a = mm.create(texture(3000));
    let b = mm.create(texture(3000));
    mm[&a].pixels.resize(7000, 0); // now larger than what was charged
    drop(a);
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(3000), "b's charge is intact");
    assert_eq!(TRACKER.tag_stats(tag).count, 1);
    let refused = mm.try_create(texture(8000)).unwrap_err();
    assert!(matches!(refused.error, Error::BudgetExceeded { current, .. } if current == size_of_texture(3000)));
    drop(b);
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0);
    assert_eq!(TRACKER.tag_stats(tag).count, 0);
    drop(mm);
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0);
}

/// Issue 11: a texture whose pixels are freed before it dies (uploaded to the GPU, say)
/// left its pixels charged forever, and a 1 MiB budget then refused every later load with
/// no object alive. Without re-measuring, the tag still returns to exactly zero once the
/// texture is gone; with [`ObjectManager::remeasure`] it drops at once.
#[test]
fn a_texture_whose_pixels_are_freed_before_it_dies_ends_at_zero() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    TRACKER.set_budget(tag, 1 << 20);
    TRACKER.set_budget_policy(tag, BudgetPolicy::Error);
    let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    for round in 0..4 {
        let t = mm.try_create(texture(512 << 10)).expect("fits the budget: nothing else is alive");
        mm.get_mut(&t).pixels = Vec::new();
        if round % 2 == 1 {
            assert_eq!(mm.remeasure(&t), size_of_texture(0));
            assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(0), "re-measured: the pixels are gone");
        } else {
            assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(512 << 10), "charged until re-measured");
        }
        drop(t);
        mm.collect_garbage();
        assert_eq!(TRACKER.tag_stats(tag).bytes, 0, "round {round}: no phantom bytes");
        assert_eq!(TRACKER.tag_stats(tag).count, 0);
    }
}

#[derive(MMObject)]
#[mm(tag = "Entities")]
struct Entity {
    inventory: Vec<u64>,
}

/// Issue 11: entities that grow after creation were under-counted, and the tag floored at
/// 0 with hundreds alive. `remeasure_all` brings the tag to the entities' real size; the
/// tag still ends at exactly zero, with no refusals under a budget that fits.
#[test]
fn entities_that_grow_are_counted_once_remeasured_and_end_at_zero() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Entities");
    let n = if cfg!(miri) { 20 } else { 300 };
    let entity_size = |items: usize| std::mem::size_of::<Entity>() + items * 8;
    TRACKER.set_budget(tag, n * entity_size(64) + 1);
    TRACKER.set_budget_policy(tag, BudgetPolicy::Error);
    let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    let entities: Vec<_> = (0..n).map(|_| mm.try_create(Entity { inventory: Vec::new() }).expect("fits")).collect();
    assert_eq!(TRACKER.tag_stats(tag).bytes, n * entity_size(0));
    for (i, e) in entities.iter().enumerate() {
        mm.get_mut(e).inventory.reserve_exact(if i % 2 == 0 { 64 } else { 32 });
    }
    let total = mm.remeasure_all::<Entity>();
    assert_eq!(total, n / 2 * entity_size(64) + (n - n / 2) * entity_size(32));
    assert_eq!(TRACKER.tag_stats(tag).bytes, total);
    assert_eq!(TRACKER.tag_stats(tag).count, n, "re-measuring counts no new allocations");
    // Some shrink again before they die.
    for e in entities.iter().step_by(3) {
        mm.get_mut(e).inventory = Vec::new();
    }
    mm.remeasure_all::<Entity>();
    drop(entities);
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0);
    assert_eq!(TRACKER.tag_stats(tag).count, 0);
}

/// Growth is counted even over the budget (the memory is in use): the `Error` policy
/// warns instead of refusing, and the tag still returns to zero.
#[test]
fn remeasuring_over_the_budget_counts_the_growth() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    TRACKER.set_budget(tag, 2048);
    TRACKER.set_budget_policy(tag, BudgetPolicy::Error);
    let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    let t = mm.create(texture(1000));
    mm.get_mut(&t).pixels.resize(5000, 0);
    assert_eq!(mm.remeasure(&t), size_of_texture(5000));
    assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(5000));
    assert!(mm.try_create(texture(1)).is_err(), "over budget now: refused");
    drop(t);
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0);
}

#[test]
fn shutdown_credits_every_remaining_object() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    let mm = ObjectManager::builder().tracker(&TRACKER).report_leaks(false).build();
    let kept = mm.create(texture(64)).into_raw();
    assert_eq!(TRACKER.tag_stats(tag).bytes, size_of_texture(64));
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0);
    let _ = kept;
}

#[test]
fn try_create_refuses_over_budget_whatever_the_policy_and_hands_the_value_back() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    TRACKER.set_budget(tag, 4096);
    TRACKER.set_budget_policy(tag, BudgetPolicy::Log);
    let mm = ObjectManager::builder().tracker(&TRACKER).build();
    let small = mm.try_create(texture(1024)).unwrap();
    let err = mm.try_create(texture(4000)).unwrap_err();
    let current = size_of_texture(1024);
    assert_eq!(
        err.error,
        Error::BudgetExceeded { tag: "Textures", budget: 4096, current, requested: size_of_texture(4000) }
    );
    assert_eq!(err.into_value().pixels.len(), 4000, "the value comes back");
    assert_eq!(TRACKER.tag_stats(tag).bytes, current, "nothing charged for the refused object");
    assert_eq!(mm.count::<Texture>(), 1);

    // `create` follows the Log policy: it warns and creates.
    let big = mm.create(texture(4000));
    assert_eq!(mm.count::<Texture>(), 2);
    assert_eq!(TRACKER.tag_stats(tag).bytes, current + size_of_texture(4000));
    drop((small, big));
}

#[test]
fn create_calls_the_callback_policy_and_goes_ahead() {
    static TRACKER: Tracker = Tracker::new();
    static CALLS: AtomicUsize = AtomicUsize::new(0);
    fn on_overrun(overrun: &BudgetOverrun) {
        assert_eq!(overrun.name, "Audio");
        CALLS.fetch_add(1, Ordering::Relaxed);
    }
    let tag = TRACKER.tag_named("Audio");
    TRACKER.set_budget(tag, 100);
    TRACKER.set_budget_policy(tag, BudgetPolicy::Callback(on_overrun));
    let mm = ObjectManager::builder().tracker(&TRACKER).build();
    let clip = mm.create(Clip { samples: vec![0; 1000] });
    assert_eq!(CALLS.load(Ordering::Relaxed), 1);
    assert_eq!(mm.count::<Clip>(), 1);
    drop(clip);
}

#[test]
#[should_panic(expected = "budget exceeded for tag 'Textures': budget 100 bytes, 0 in use")]
fn create_panics_under_the_error_policy() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    TRACKER.set_budget(tag, 100);
    TRACKER.set_budget_policy(tag, BudgetPolicy::Error);
    let mm = ObjectManager::builder().tracker(&TRACKER).report_leaks(false).build();
    let _ = mm.create(texture(1000));
}

#[test]
fn the_leak_report_carries_creation_stacks_in_stacks_mode() {
    static TRACKER: Tracker = Tracker::with_mode(Mode::Stacks { depth: 8 });
    let mm = ObjectManager::builder().tracker(&TRACKER).report_leaks(false).build();
    let kept = mm.create(texture(16)).into_raw();
    let freed = mm.create(texture(16));
    drop(freed);
    let report = mm.shutdown();
    assert_eq!(report.len(), 1);
    let entry = report.iter().next().unwrap();
    let stack = entry.stack.expect("Stacks mode records creation stacks");
    if !cfg!(miri) {
        assert!(!stack.is_empty(), "a stack was captured");
    }
    let _ = kept;
}

#[test]
fn counting_mode_keeps_no_stacks() {
    static TRACKER: Tracker = Tracker::new();
    let mm = ObjectManager::builder().tracker(&TRACKER).report_leaks(false).build();
    let kept = mm.create(texture(16)).into_raw();
    let report = mm.shutdown();
    assert!(report.iter().next().unwrap().stack.is_none());
    let _ = kept;
}

/// A value whose `Drop` panics is destroyed all the same (the panic comes out of
/// `collect_garbage`), so its charge comes off its tag then, not never: the slot's reuse
/// and shutdown used to leave it behind for good.
#[test]
fn a_panicking_drop_takes_its_charge_with_it() {
    #[derive(MMObject)]
    #[mm(tag = "Fuses")]
    struct Fuse {
        armed: bool,
        _payload: [u64; 8],
    }
    impl Drop for Fuse {
        fn drop(&mut self) {
            if self.armed {
                panic!("the fuse blows");
            }
        }
    }

    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Fuses");
    let mut mm = ObjectManager::builder().tracker(&TRACKER).report_leaks(false).build();
    drop(mm.create(Fuse { armed: true, _payload: [0; 8] }));
    assert_eq!(TRACKER.tag_stats(tag).count, 1);
    let blown = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.collect_garbage()));
    assert!(blown.is_err(), "the panic comes out of the collection");
    assert_eq!((TRACKER.tag_stats(tag).bytes, TRACKER.tag_stats(tag).count), (0, 0), "destroyed, so credited");
    // The slot is reused, and the manager ends: the tag stays exact.
    let calm = mm.create(Fuse { armed: false, _payload: [0; 8] });
    assert_eq!(TRACKER.tag_stats(tag).bytes, std::mem::size_of::<Fuse>());
    drop(calm);
    mm.collect_garbage();
    drop(mm);
    assert_eq!((TRACKER.tag_stats(tag).bytes, TRACKER.tag_stats(tag).count), (0, 0));
}

/// `size()` is a safe method and may claim anything: an object that says it is
/// `usize::MAX` bytes is charged the most a tag can show, and credited exactly that (one
/// byte stayed behind; the tag read 0 bytes while it lived).
#[test]
fn a_size_of_usize_max_is_credited_exactly() {
    struct Boast;
    impl MMObject for Boast {
        const TYPE_NAME: &'static str = "Boast";
        const TAG: &'static str = "Boasts";
        fn size(&self) -> usize {
            usize::MAX
        }
    }

    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Boasts");
    let mut mm = ObjectManager::builder().tracker(&TRACKER).report_leaks(false).build();
    let boast = mm.create(Boast);
    // Capped at `isize::MAX`: the counters are read as signed, so more would read as empty.
    assert_eq!((TRACKER.tag_stats(tag).bytes, TRACKER.tag_stats(tag).count), (isize::MAX as usize, 1));
    drop(boast);
    mm.collect_garbage();
    assert_eq!((TRACKER.tag_stats(tag).bytes, TRACKER.tag_stats(tag).count), (0, 0));
    drop(mm);
    assert_eq!((TRACKER.tag_stats(tag).bytes, TRACKER.tag_stats(tag).count), (0, 0));
}
