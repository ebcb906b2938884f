//! Tracker overhead benches (BENCHMARKS.md T1–T3 and S1).
//!
//! Every tracked case calls `TrackingAllocator<System>`'s `GlobalAlloc` methods directly
//! (as the global allocator would be called) on a tracker of its own, and its peer is the
//! very same allocator, `System`, called untracked in the same group, so the ratio is the
//! tracker's cost alone. Blocks are 64 B, allocated and freed immediately (the hot path of
//! a short-lived allocation), with a tag in scope as in real use.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;

use criterion::{criterion_main, Criterion};
use mmobject::track::{Mode, Sampling, StackTrace, Tag, Tracker, TrackingAllocator};

static BENCH_TAG: Tag = Tag::new("Bench");
static COUNTING: Tracker = Tracker::with_mode(Mode::Counting);
/// Counting, with a budget on another tag: the counting path then also reads the tag's flag.
static COUNTING_BUDGETED: Tracker = Tracker::with_mode(Mode::Counting);
static OTHER_TAG: Tag = Tag::new("Other");
static RECORDS: Tracker = Tracker::with_mode(Mode::Records);
static STACKS: Tracker = Tracker::with_mode(Mode::Stacks { depth: 5 });
static SAMPLED: Tracker = Tracker::with_mode(Mode::Sampled(Sampling::DEFAULT));

const LAYOUT: Layout = match Layout::from_size_align(64, 8) {
    Ok(l) => l,
    Err(_) => panic!("valid layout"),
};

/// Allocates and frees one 64-byte block through `a`.
#[inline(always)]
fn alloc_free<A: GlobalAlloc>(a: &A) {
    // SAFETY: a non-zero layout, freed once with the same layout.
    unsafe {
        let p = a.alloc(LAYOUT);
        black_box(p);
        a.dealloc(p, LAYOUT);
    }
}

/// T1: counting mode (per-tag counters only) vs the same allocator untracked. The peer is
/// `System` itself because `TrackingAllocator<System>` wraps exactly it: any difference is
/// the header, the tag lookup and the counters. A second tracked case has a budget on
/// another tag (what a game with budgets pays on its unbudgeted tags).
fn t1_counting(c: &mut Criterion) {
    let tracked = TrackingAllocator::with_tracker(System, &COUNTING);
    let _g = BENCH_TAG.enter();
    let mut g = c.benchmark_group("T1_counting_alloc_free_64B");
    g.bench_function("tracked_counting", |b| b.iter(|| alloc_free(&tracked)));
    COUNTING_BUDGETED.set_budget(&OTHER_TAG, 1 << 30);
    let budgeted = TrackingAllocator::with_tracker(System, &COUNTING_BUDGETED);
    g.bench_function("tracked_counting_other_tag_budgeted", |b| b.iter(|| alloc_free(&budgeted)));
    g.bench_function("system_untracked", |b| b.iter(|| alloc_free(&System)));
    g.finish();
}

/// T2: a record per live allocation (size, tag, site; no stack) vs untracked `System`, for
/// the same reason as T1: the only difference is the tracker's work, here including the
/// record-table insert and remove.
fn t2_records(c: &mut Criterion) {
    let tracked = TrackingAllocator::with_tracker(System, &RECORDS);
    let _g = BENCH_TAG.enter();
    let mut g = c.benchmark_group("T2_records_alloc_free_64B");
    g.bench_function("tracked_records", |b| b.iter(|| alloc_free(&tracked)));
    g.bench_function("system_untracked", |b| b.iter(|| alloc_free(&System)));
    g.finish();
}

/// T3: records with a 5-frame stack (captured as raw addresses, not resolved). Reported in
/// ns against Tracy's published ~206 ns for a 5-frame capture; untracked `System` runs in
/// the same group so the stack's share can be read off, and the bare capture is measured
/// too. Called a few frames deep so there are frames to walk. Which walker runs is printed
/// first: in an ordinary x86-64 Linux build the cached unwind tables (every call site here is
/// met in the warm-up, so the timed loop reads rules from the cache); build with
/// `RUSTFLAGS="-C force-frame-pointers=yes"` for the frame-pointer walk.
fn t3_stacks(c: &mut Criterion) {
    eprintln!("T3 stack walker: {:?}", StackTrace::walker());
    let tracked = TrackingAllocator::with_tracker(System, &STACKS);
    let _g = BENCH_TAG.enter();
    let mut g = c.benchmark_group("T3_stacks5_alloc_free_64B");
    g.bench_function("tracked_stacks5", |b| b.iter(|| nested(4, &|| alloc_free(&tracked))));
    g.bench_function("system_untracked", |b| b.iter(|| nested(4, &|| alloc_free(&System))));
    g.bench_function("capture_only_5", |b| {
        b.iter(|| {
            nested(4, &|| {
                black_box(StackTrace::capture(5));
            })
        })
    });
    g.finish();
}

/// S1: sampled mode (defaults: no record below 256 B, 1 in 64 up to 64 KiB, all above) at
/// 64 B, the size that dominates allocation counts: it must cost about what counting does.
/// The peer is untracked `System`, as in T1.
fn s1_sampled(c: &mut Criterion) {
    let tracked = TrackingAllocator::with_tracker(System, &SAMPLED);
    let _g = BENCH_TAG.enter();
    let mut g = c.benchmark_group("S1_sampled_alloc_free_64B");
    g.bench_function("tracked_sampled", |b| b.iter(|| alloc_free(&tracked)));
    g.bench_function("system_untracked", |b| b.iter(|| alloc_free(&System)));
    g.finish();
}

#[inline(never)]
fn nested(depth: usize, f: &dyn Fn()) {
    if depth == 0 {
        f()
    } else {
        nested(black_box(depth - 1), f)
    }
}

/// The criterion entry points (the macro's `pub fn` has no docs of its own).
mod group {
    #![allow(missing_docs)]
    use super::{s1_sampled, t1_counting, t2_records, t3_stacks};
    criterion::criterion_group!(benches, t1_counting, t2_records, t3_stacks, s1_sampled);
}
criterion_main!(group::benches);
