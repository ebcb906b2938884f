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

#[test]
fn a_grown_object_never_takes_its_tag_below_zero() {
    static TRACKER: Tracker = Tracker::new();
    let tag = TRACKER.tag_named("Textures");
    let mut mm = ObjectManager::builder().tracker(&TRACKER).build();
    let a = mm.create(texture(10));
    let b = mm.create(texture(10));
    mm[&a].pixels.reserve_exact(10_000); // now larger than what was charged
    drop(a);
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0, "the credit is capped by what the store charged");
    drop(b);
    mm.collect_garbage();
    assert_eq!(TRACKER.tag_stats(tag).bytes, 0);
    drop(mm);
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
