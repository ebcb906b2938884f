//! The timeline's CSV written while the timeline is cleared and filled again: every row
//! written is a whole frame.
//!
//! The clear is made to land between `write_csv`'s look at the timeline's length and its
//! copy of the samples, deterministically: this binary's global allocator runs a hook on
//! the test thread's next allocation, which is the copy's buffer.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use mmobject::track::Tracker;

/// `System`, running the test thread's armed hook (once) before its next allocation.
struct Hooked;

thread_local! {
    static HOOK: Cell<Option<fn()>> = const { Cell::new(None) };
}

// SAFETY: every block comes from `System` and goes back to it with the same layout; the
// hook allocates nothing through this allocator (it only touches the tracker's timeline,
// which lives in `System` memory).
unsafe impl GlobalAlloc for Hooked {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if let Some(hook) = HOOK.try_with(Cell::take).ok().flatten() {
            hook();
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Hooked = Hooked;

static TRACKER: Tracker = Tracker::new();

/// A frame sampled with fewer tags than the frames after the clear: the copy used to take
/// as many values as the timeline held at the first look, which cut the first new frame
/// short, and its missing values were written as zeros (a torn row).
#[test]
fn a_clear_between_the_csv_s_looks_leaves_no_torn_row() {
    let early = TRACKER.tag_named("timeline-early");
    TRACKER.try_charge(early, 5).unwrap();
    TRACKER.frame_mark();
    let late = TRACKER.tag_named("timeline-late");
    TRACKER.try_charge(late, 7).unwrap();
    fn clear_and_mark_two() {
        TRACKER.clear_timeline();
        TRACKER.frame_mark();
        TRACKER.frame_mark();
    }
    let mut csv = Vec::new();
    HOOK.with(|h| h.set(Some(clear_and_mark_two)));
    TRACKER.write_csv(&mut csv).unwrap();
    assert!(HOOK.with(Cell::take).is_none(), "the hook ran inside write_csv");
    let csv = String::from_utf8(csv).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (early_col, late_col) = (column("timeline-early"), column("timeline-late"));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(!rows.is_empty(), "{csv}");
    for row in &rows {
        assert_eq!((row[early_col], row[late_col]), ("5", "7"), "a torn row:\n{csv}");
    }
    assert_eq!(rows.len(), 2, "the timeline as it was at the copy:\n{csv}");
}
