//! `TrackingAllocator<System>` as the `#[global_allocator]`: heap traffic inside scopes
//! lands on the right tags, and totals balance after everything is dropped.
//!
//! The test harness allocates on its own threads meanwhile, so every check measures tags
//! that only this test uses, and everything runs from one `#[test]` function so the steps
//! that change the global tracker's mode cannot race each other.
//!
//! Under Miri, run it with `MIRIFLAGS=-Zmiri-tree-borrows`: Stacked Borrows rejects any
//! allocator that keeps a header in front of the block (a `Box` retag narrows the pointer
//! handed to `dealloc` to the user bytes), while Tree Borrows accepts it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;

use mmobject::track::{scope, BudgetPolicy, Mode, Tag, TagStats, Tracker, TrackingAllocator};
use mmobject::{Error, MMObject, ObjectManager};

#[global_allocator]
static ALLOC: TrackingAllocator<System> = TrackingAllocator::new(System);

static TEXTURES: Tag = Tag::new("global-Textures");
static MESHES: Tag = Tag::new("global-Meshes");
static STRINGS: Tag = Tag::new("global-Strings");
static MAPS: Tag = Tag::new("global-Maps");
static LIMITED: Tag = Tag::new("global-Limited");
static LOGGED: Tag = Tag::new("global-Logged");
static RING: Tag = Tag::new("global-Ring");
static THREADS: [Tag; 4] =
    [Tag::new("global-Thread0"), Tag::new("global-Thread1"), Tag::new("global-Thread2"), Tag::new("global-Thread3")];

fn stats(tag: &Tag) -> TagStats {
    Tracker::global().tag_stats(tag)
}

/// A logger that allocates (a `String` per line) — logging from inside the allocator must
/// not re-enter the tracker.
struct AllocatingLogger;
static LINES: Mutex<Vec<String>> = Mutex::new(Vec::new());
impl log::Log for AllocatingLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        let line = format!("{} {}", record.level(), record.args());
        LINES.lock().unwrap().push(line);
    }
    fn flush(&self) {}
}

#[test]
fn global_allocator_attributes_and_balances() {
    log::set_logger(&AllocatingLogger).unwrap();
    log::set_max_level(log::LevelFilter::Trace);

    vec_string_hashmap_land_on_their_tags();
    realloc_keeps_the_tag_and_frees_attribute_across_threads();
    four_threads_exact_totals();
    budget_error_policy_fails_try_reserve();
    budget_callback_may_allocate();
    watch_logs_from_inside_the_allocator();
    records_mode_leak_report();
    reports_do_not_count_themselves();
    track_refuses_what_the_allocator_recorded();
    diagnostics_catch_overruns_and_double_frees();
    objects_and_the_allocator_count_each_byte_once();
    a_store_allocator_through_the_tracking_allocator_counts_nothing();
    a_threads_ring_of_last_drops_is_not_charged_to_the_tag_in_scope();
    totals_balance();
}

fn vec_string_hashmap_land_on_their_tags() {
    // `black_box`: a release build may otherwise elide the unused allocation.
    let v: Vec<u64> = scope(&TEXTURES, || black_box(Vec::with_capacity(128)));
    assert_eq!(stats(&TEXTURES).bytes, 128 * 8);
    assert_eq!(stats(&TEXTURES).count, 1);

    let s = {
        let _g = STRINGS.enter();
        let mut s = String::with_capacity(10);
        s.push_str("hello, tracked world");
        s
    };
    assert!(stats(&STRINGS).bytes >= s.len());
    assert_eq!(stats(&STRINGS).count, 1);

    let mut meshes: Vec<Vec<u8>> = Vec::new();
    scope(&MESHES, || {
        for i in 0..10 {
            meshes.push(vec![0u8; 100 + i]);
        }
    });
    assert!(stats(&MESHES).bytes >= (100..110).sum::<usize>());

    let m: HashMap<u32, String> = scope(&MAPS, || (0..50).map(|i| (i, i.to_string())).collect());
    assert!(stats(&MAPS).count >= 51, "the table plus 50 strings");

    // Untagged code does not touch them.
    let before = stats(&TEXTURES);
    let other = vec![1u8; 1000];
    assert_eq!(stats(&TEXTURES).bytes, before.bytes);

    drop((v, s, meshes, m, other));
    for tag in [&TEXTURES, &STRINGS, &MESHES, &MAPS] {
        let st = stats(tag);
        assert_eq!((st.bytes, st.count), (0, 0), "{st:?}");
        assert!(st.peak_bytes > 0);
    }
}

fn realloc_keeps_the_tag_and_frees_attribute_across_threads() {
    let mut v: Vec<u8> = scope(&TEXTURES, || Vec::with_capacity(16));
    // Grows outside the scope: the block keeps its tag.
    v.extend(std::iter::repeat_n(7u8, 10_000));
    assert!(stats(&TEXTURES).bytes >= 10_000);
    assert_eq!(stats(&TEXTURES).count, 1);
    // Freed on another thread: still credited to its tag.
    std::thread::spawn(move || drop(v)).join().unwrap();
    assert_eq!(stats(&TEXTURES).bytes, 0);
    assert_eq!(stats(&TEXTURES).count, 0);
}

fn four_threads_exact_totals() {
    let rounds = if cfg!(miri) { 20 } else { 5_000 };
    let kept: Vec<Vec<Box<[u8]>>> = std::thread::scope(|s| {
        let handles: Vec<_> = THREADS
            .iter()
            .enumerate()
            .map(|(i, tag)| {
                s.spawn(move || {
                    let _g = tag.enter();
                    let mut live: Vec<Box<[u8]>> = Vec::with_capacity(rounds);
                    for r in 0..rounds {
                        live.push(vec![i as u8; 1 + (r % 13) * 8].into_boxed_slice());
                        if r % 2 == 0 {
                            live.swap_remove(0);
                        }
                    }
                    live.truncate(7);
                    live
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (tag, live) in THREADS.iter().zip(&kept) {
        let expected: usize =
            live.iter().map(|b| b.len()).sum::<usize>() + live.capacity() * std::mem::size_of::<Box<[u8]>>();
        let st = stats(tag);
        assert_eq!(st.bytes, expected, "{st:?}");
        assert_eq!(st.count, 8, "7 boxes and the Vec");
    }
    drop(kept);
    for tag in &THREADS {
        assert_eq!((stats(tag).bytes, stats(tag).count), (0, 0));
    }
}

fn budget_error_policy_fails_try_reserve() {
    let t = Tracker::global();
    t.set_budget(&LIMITED, 4096);
    t.set_budget_policy(&LIMITED, BudgetPolicy::Error);
    let _g = LIMITED.enter();
    let mut ok: Vec<u8> = Vec::new();
    assert!(ok.try_reserve_exact(4000).is_ok());
    let mut refused: Vec<u8> = Vec::new();
    assert!(refused.try_reserve_exact(1000).is_err(), "over budget: the allocation fails");
    assert_eq!(stats(&LIMITED).bytes, 4000);
    drop(ok);
    assert!(refused.try_reserve_exact(1000).is_ok(), "room again");
    drop(refused);
    t.clear_budget(&LIMITED);
    assert_eq!(stats(&LIMITED).bytes, 0);
}

static CALLBACK_TAG: Tag = Tag::new("global-Callback");
static CALLBACK_NOTES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Runs inside the allocator, and allocates: its allocations must bypass the tracker.
fn note_overrun(o: &mmobject::track::BudgetOverrun) {
    CALLBACK_NOTES.lock().unwrap().push(o.to_string());
}

fn budget_callback_may_allocate() {
    let t = Tracker::global();
    t.set_budget(&CALLBACK_TAG, 100);
    t.set_budget_policy(&CALLBACK_TAG, BudgetPolicy::Callback(note_overrun));
    let v: Vec<u8> = scope(&CALLBACK_TAG, || black_box(Vec::with_capacity(500)));
    {
        let notes = CALLBACK_NOTES.lock().unwrap();
        assert_eq!(notes.len(), 1);
        assert!(notes[0].contains("'global-Callback': budget 100 bytes, 0 in use, 500 requested"));
    }
    assert_eq!(stats(&CALLBACK_TAG).bytes, 500, "the callback policy lets it through");
    drop(v);
    t.clear_budget(&CALLBACK_TAG);
    assert_eq!(stats(&CALLBACK_TAG).bytes, 0);
}

fn watch_logs_from_inside_the_allocator() {
    let t = Tracker::global();
    t.watch(&LOGGED, true);
    let b = scope(&LOGGED, || Box::new([0u8; 77]));
    drop(b);
    t.watch(&LOGGED, false);
    let lines = LINES.lock().unwrap();
    let watched: Vec<_> = lines.iter().filter(|l| l.contains("[global-Logged]")).collect();
    assert_eq!(watched.len(), 2, "{watched:?}");
    assert!(watched[0].starts_with("DEBUG [global-Logged] alloc 77 B at 0x"));
    assert!(watched[1].starts_with("DEBUG [global-Logged] free 77 B at 0x"));
    drop(lines);
    assert_eq!(stats(&LOGGED).bytes, 0, "the logger's own allocations are not counted");
}

#[inline(never)]
#[allow(clippy::vec_box)] // three separate heap blocks are the point
fn allocate_for_the_leak_report() -> Vec<Box<[u8; 300]>> {
    scope(&MESHES, || (0..3).map(|_| Box::new([0u8; 300])).collect())
}

fn records_mode_leak_report() {
    let t = Tracker::global();
    // Allocated in counting mode, freed in records mode: its header says it has no record.
    let early = scope(&MESHES, || vec![0u8; 50]);
    t.set_mode(Mode::Stacks { depth: 8 });
    let kept = allocate_for_the_leak_report();
    let report = t.leak_report();
    let meshes: Vec<_> = report.groups.iter().filter(|g| g.tag_name == "global-Meshes").collect();
    if cfg!(miri) {
        // No stacks under Miri: every Meshes block shares the allocator's site.
        assert!(meshes.iter().any(|g| g.count >= 3 && g.bytes >= 900));
    } else {
        let group = meshes.iter().find(|g| g.count == 3).expect("the three boxes form one group");
        assert_eq!(group.bytes, 900);
        let text = report.to_string();
        assert!(text.contains("allocate_for_the_leak_report"), "{text}");
    }
    drop(early);
    t.set_mode(Mode::Counting);
    drop(kept); // allocated with records, freed in counting mode: still found
    assert_eq!((stats(&MESHES).bytes, stats(&MESHES).count), (0, 0));
    assert_eq!(t.error_counts().untracked_frees, 0);
}

/// `track` is for memory the tracker did not allocate: a block the global allocator recorded
/// (pending in this thread's slot, or in the table) is refused, and its own free still finds
/// its record.
fn track_refuses_what_the_allocator_recorded() {
    static TRACKED: Tag = Tag::new("global-Tracked");
    let t = Tracker::global();
    t.set_mode(Mode::Records);
    let first = scope(&MESHES, || Box::new([0u8; 64]));
    let second = scope(&MESHES, || Box::new([0u8; 64])); // `first`'s record is in the table now
    for block in [first.as_ptr(), second.as_ptr()] {
        assert_eq!(t.try_track(block, 64, TRACKED.id()), Err(Error::AlreadyTracked { addr: block as usize }));
    }
    assert_eq!(stats(&TRACKED).bytes, 0);
    drop((first, second));
    t.set_mode(Mode::Counting);
    assert_eq!(t.error_counts().untracked_frees + t.error_counts().double_frees, 0, "both frees found their records");
}

/// With the tracker recording every block, a leak report taken inside a tag's scope does
/// not list its own working copy as a leak of that tag, and a snapshot does not count its
/// own rows in the numbers they hold.
fn reports_do_not_count_themselves() {
    static REPORTS: Tag = Tag::new("global-Reports");
    let t = Tracker::global();
    t.set_mode(Mode::Records);
    let (leaks, snapshot) = scope(&REPORTS, || (t.leak_report(), t.snapshot()));
    let listed: usize = leaks.groups.iter().filter(|g| g.tag_name == "global-Reports").map(|g| g.count).sum();
    assert_eq!(listed, 0, "{leaks}");
    let row = snapshot.tags.iter().find(|r| r.name == "global-Reports");
    assert!(row.is_none_or(|r| r.bytes == 0 && r.count == 0), "{row:?}");
    drop((leaks, snapshot));
    t.set_mode(Mode::Counting);
}

fn diagnostics_catch_overruns_and_double_frees() {
    let t = Tracker::global();
    t.set_diagnostics(true);
    let layout = Layout::from_size_align(24, 8).unwrap();
    let _g = TEXTURES.enter();
    // SAFETY: `ALLOC` is the global allocator; the block is 24 bytes and we write one byte
    // past it, into the guard zone the tracker keeps there (really allocated memory), then
    // free it once with its layout. The second free is caught before the memory is read.
    unsafe {
        let p = ALLOC.alloc(layout);
        p.add(24).write(0);
        ALLOC.dealloc(p, layout);
        assert_eq!(t.error_counts().buffer_overruns, 1);
        ALLOC.dealloc(p, layout);
        assert_eq!(t.error_counts().double_frees, 1);
    }
    t.set_diagnostics(false);
    assert_eq!(stats(&TEXTURES).bytes, 0);
}

fn totals_balance() {
    for tag in [&TEXTURES, &MESHES, &STRINGS, &MAPS, &LIMITED, &LOGGED, &CALLBACK_TAG, &OBJECT_TEXTURES]
        .into_iter()
        .chain(&THREADS)
    {
        let st = stats(tag);
        assert_eq!((st.bytes, st.count), (0, 0), "{st:?}");
        assert!(st.total_count > 0, "{} was used", st.name);
    }
}

#[derive(MMObject)]
#[mm(tag = "global-ObjectTextures")]
struct Texture {
    pixels: Vec<u8>,
}

static OBJECT_TEXTURES: Tag = Tag::new("global-ObjectTextures");

/// Issue 11: with the tracker as the global allocator and the same tracker given to the
/// object manager, an object's heap bytes were counted by both (1 MiB of pixels showed as
/// 2 MiB, and budgets tripped at half the real use). The rule: the allocator counts every
/// heap byte, once, under the tag in scope (`create_with` builds under the object's tag);
/// the manager adds nothing. A texture whose pixels are freed before it dies, and one that
/// grows, end at exactly zero, with no refusal under a budget the real use fits.
/// Issue 15: a store allocator that itself goes through this tracking global allocator
/// adds nothing to any tag (store memory is never tracked); the manager counts each object
/// once, under its type's tag.
fn a_store_allocator_through_the_tracking_allocator_counts_nothing() {
    let t = Tracker::global();
    let inline = std::mem::size_of::<Texture>();
    let mut mm = ObjectManager::builder()
        .tracker(t)
        .allocator(mmobject::allocator_api2::alloc::Global)
        .report_leaks(false)
        .build();
    let mut textures = Vec::with_capacity(100);
    // Segments are allocated in the tag's scope, through the tracking allocator.
    scope(&OBJECT_TEXTURES, || {
        for _ in 0..100 {
            textures.push(mm.create(Texture { pixels: vec![0; 16] }));
        }
    });
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, 100 * (16 + inline), "segments are not counted, objects once");
    drop(textures);
    mm.collect_garbage();
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, 0);
    drop(mm);
    assert_eq!(stats(&OBJECT_TEXTURES).count, 0);
}

#[derive(MMObject)]
struct Marker(u32);

/// The ring that carries a thread's last handle drops, allocated at its first one, is
/// framework memory like a store's: the tag in scope is not charged for it.
fn a_threads_ring_of_last_drops_is_not_charged_to_the_tag_in_scope() {
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    std::thread::scope(|s| {
        s.spawn(|| {
            scope(&RING, || drop(mm.create(Marker(7))));
            assert_eq!(stats(&RING).bytes, 0, "the new thread's ring is not the tag's");
        });
    });
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!((stats(&RING).bytes, stats(&RING).count), (0, 0));
}

fn objects_and_the_allocator_count_each_byte_once() {
    let t = Tracker::global();
    assert!(t.counts_allocations());
    let kib = if cfg!(miri) { 1 } else { 256 };
    // The inline part of an object: the allocator never sees it (it lives in the store's
    // memory, which is never tracked), so the manager charges it to the object's tag.
    let inline = std::mem::size_of::<Texture>();
    // Room for 2 units of pixels and two objects' inline bytes, exactly: the growth below
    // fits (a `realloc` counts the block's growth, not a second block beside the first).
    t.set_budget(&OBJECT_TEXTURES, ((2 * kib) << 10) + 2 * inline);
    t.set_budget_policy(&OBJECT_TEXTURES, BudgetPolicy::Error);
    let mut mm = ObjectManager::builder().tracker(t).report_leaks(false).build();
    // Store memory (segments, side tables) is counted by nobody, whatever tag is in scope.
    scope(&OBJECT_TEXTURES, || mm.reserve::<Texture>(4));
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, 0);

    let a = mm.create_with(|| Texture { pixels: vec![1; kib << 10] });
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, (kib << 10) + inline, "counted once, under the object's tag");
    let b_pixels = scope(&OBJECT_TEXTURES, || vec![2u8; kib << 10]);
    let b = match mm.try_create(Texture { pixels: b_pixels }) {
        Ok(b) => b,
        Err(refused) => panic!("2 of a 3 budget must not be refused: {}", refused.error),
    };
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, ((2 * kib) << 10) + 2 * inline, "not 4: nothing counted twice");

    // Pixels freed before the texture dies: the allocator sees the free.
    mm.get_mut(&a).pixels = Vec::new();
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, (kib << 10) + 2 * inline);
    // A texture that grows: `realloc` keeps the block's tag, wherever it runs.
    mm.get_mut(&b).pixels.resize((2 * kib) << 10, 3);
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, ((2 * kib) << 10) + 2 * inline);
    assert_eq!(mm.remeasure(&b), inline + ((2 * kib) << 10));
    assert_eq!(stats(&OBJECT_TEXTURES).bytes, ((2 * kib) << 10) + 2 * inline, "re-measuring adds nothing here");

    drop((a, b));
    mm.collect_garbage();
    let st = stats(&OBJECT_TEXTURES);
    assert_eq!((st.bytes, st.count), (0, 0), "{st:?}");
    drop(mm);
    t.clear_budget(&OBJECT_TEXTURES);
}
