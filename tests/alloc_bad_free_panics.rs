//! A bad `free` on a pool panics with the error's message at the caller's line, and leaves
//! the pool as it was. The pools' `free` runs an inlined fast path and hands every other case
//! to an out-of-line checked free; the panic must still name the caller's line, not the
//! allocator's.
//!
//! The panic hook is process-wide, so this test has a binary of its own.

use std::alloc::Layout;
use std::panic::{self, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::Mutex;

use mmobject::alloc::{SizeClassPool, SmallObjectAllocator, SmallObjectConfig};

/// The file and line of the last panic, recorded by the hook.
static LAST_PANIC: Mutex<Option<(String, u32)>> = Mutex::new(None);

/// Runs `f`, which must panic; returns its message and where the panic was raised.
fn panic_of(f: impl FnOnce()) -> (String, String, u32) {
    let payload = panic::catch_unwind(AssertUnwindSafe(f)).expect_err("the call panics");
    let message = match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => payload.downcast_ref::<&str>().copied().unwrap_or_default().to_owned(),
    };
    let (file, line) = LAST_PANIC.lock().unwrap().take().expect("the hook saw the panic");
    (message, file, line)
}

/// Frees a block twice through `free`, then frees inside a block and frees a foreign
/// pointer; checks each panic's message, that the double free's panic names `free_line` of
/// this file (the line of the `free` call inside `free`), and that nothing changed.
fn check(
    name: &str,
    free_line: u32,
    alloc: impl Fn() -> NonNull<u8>,
    free: impl Fn(NonNull<u8>),
    live: impl Fn() -> usize,
) {
    let p = alloc();
    let live_before = live();
    free(p);
    let (message, file, line) = panic_of(|| free(p));
    assert!(message.starts_with("double free of"), "{name}: {message}");
    assert_eq!((file.as_str(), line), (file!(), free_line), "{name}: the panic names the caller's line");
    assert_eq!(live(), live_before - 1, "{name}: the double free changed nothing");

    let q = alloc();
    // SAFETY: one byte into a live block of at least 16 bytes.
    let inside = unsafe { q.add(1) };
    let (message, _, _) = panic_of(|| free(inside));
    assert!(message.contains("not the start of a block"), "{name}: {message}");
    let mut foreign = 0u64;
    let (message, _, _) = panic_of(|| free(NonNull::from(&mut foreign).cast()));
    assert!(message.contains("foreign"), "{name}: {message}");
    assert_eq!(live(), live_before, "{name}: the bad frees changed nothing");
    free(q);
    assert_eq!(live(), live_before - 1);
}

#[test]
fn bad_frees_panic_at_the_callers_line_and_change_nothing() {
    panic::set_hook(Box::new(|info| {
        let location = info.location().map(|l| (l.file().to_owned(), l.line()));
        *LAST_PANIC.lock().unwrap() = location;
    }));
    let layout = Layout::new::<[u64; 2]>();

    let pool = SizeClassPool::new(&[(16, 64), (64, 64)]);
    // SAFETY: every pointer freed is one of this pool's blocks, freed once, or a bad
    // pointer the pool detects without touching it.
    let free = |p: NonNull<u8>| unsafe { pool.free(p) };
    let free_line = line!() - 1;
    check("SizeClassPool", free_line, || pool.alloc(layout), free, || pool.stats().live);

    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [64; 7] });
    // SAFETY: as above, for this allocator.
    let free = |p: NonNull<u8>| unsafe { small.free(p) };
    let free_line = line!() - 1;
    check("SmallObjectAllocator", free_line, || small.alloc(layout), free, || small.stats().live);
}
