//! Object stores take every byte from the allocator the game chose.
//!
//! This binary's global allocator counts what each thread asks of it while a
//! test switches counting on, which shows that store memory never goes
//! through the global allocator.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mmobject::alloc::SegmentAlloc;
use mmobject::allocator_api2::alloc::{AllocError, Allocator};
use mmobject::{Error, MMObject, ObjectManager};

// ---- the global allocator: counts this thread's calls while enabled --------

struct CountingGlobal;

thread_local! {
    static COUNT_GLOBAL: Cell<bool> = const { Cell::new(false) };
    static GLOBAL_CALLS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to `System`; the counting touches only const-initialised
// thread-locals, which never allocate.
unsafe impl GlobalAlloc for CountingGlobal {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNT_GLOBAL.with(Cell::get) {
            GLOBAL_CALLS.with(|c| c.set(c.get() + 1));
        }
        // SAFETY: forwarded.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: CountingGlobal = CountingGlobal;

/// Global allocations made by `f` on this thread.
fn global_allocations(f: impl FnOnce()) -> usize {
    GLOBAL_CALLS.with(|c| c.set(0));
    COUNT_GLOBAL.with(|c| c.set(true));
    f();
    COUNT_GLOBAL.with(|c| c.set(false));
    GLOBAL_CALLS.with(Cell::get)
}

// ---- a store allocator that counts, and can be told to refuse ---------------

#[derive(Default)]
struct Counts {
    live_bytes: AtomicUsize,
    allocations: AtomicUsize,
    refuse_over: AtomicUsize,
}

#[derive(Clone, Default)]
struct Counting(Arc<Counts>);

impl Counting {
    fn refusing_over(bytes: usize) -> Self {
        let counting = Counting::default();
        counting.0.refuse_over.store(bytes, Ordering::Relaxed);
        counting
    }
    fn live_bytes(&self) -> usize {
        self.0.live_bytes.load(Ordering::Relaxed)
    }
    fn allocations(&self) -> usize {
        self.0.allocations.load(Ordering::Relaxed)
    }
}

// SAFETY: forwards to `System` (which serves any layout), and only refuses
// or counts on top.
unsafe impl Allocator for Counting {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        let limit = self.0.refuse_over.load(Ordering::Relaxed);
        if limit != 0 && self.live_bytes() + layout.size() > limit {
            return Err(AllocError);
        }
        let block = System.allocate(layout)?;
        self.0.live_bytes.fetch_add(layout.size(), Ordering::Relaxed);
        self.0.allocations.fetch_add(1, Ordering::Relaxed);
        Ok(block)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        self.0.live_bytes.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded: the block came from `System` with this layout.
        unsafe { System.deallocate(ptr, layout) }
    }
}

#[derive(MMObject, Debug, PartialEq)]
struct Entity {
    pos: [f32; 3],
    vel: [f32; 3],
}

#[derive(MMObject)]
struct Particle {
    life: f32,
}

fn entity(x: f32) -> Entity {
    Entity { pos: [x; 3], vel: [1.0; 3] }
}

const OBJECTS: usize = if cfg!(miri) { 300 } else { 20_000 };

/// Every byte of store memory comes from the given allocator (nothing from
/// the global allocator, once the type is registered), and all of it goes
/// back when the manager drops.
#[test]
fn every_store_byte_comes_from_the_allocator_and_goes_back() {
    // With a tracker too: its per-object charge table is store memory as well.
    static TRACKER: mmobject::track::Tracker = mmobject::track::Tracker::new();
    let counting = Counting::default();
    let mut mm = ObjectManager::builder().allocator(counting.clone()).tracker(&TRACKER).build();
    drop(mm.create(entity(0.0))); // registers the type: its store's fixed part is a `Box`

    let mut handles = Vec::with_capacity(OBJECTS);
    let mut raws = Vec::with_capacity(OBJECTS);
    let calls = global_allocations(|| {
        for i in 0..OBJECTS {
            handles.push(mm.create(entity(i as f32)));
        }
        raws.extend(handles.iter().step_by(7).map(|h| h.clone().into_raw()));
        for raw in &raws {
            mm.add_ref_raw(*raw).unwrap();
            mm.release_raw(*raw).unwrap();
        }
    });
    assert_eq!(calls, 0, "store memory never goes through the global allocator");
    assert!(counting.live_bytes() >= OBJECTS * std::mem::size_of::<Entity>());
    // (With `handle-sites`, the site table is store memory too, and lists the
    // raw references of each object in a list of its own.)
    #[cfg(not(feature = "handle-sites"))]
    {
        let segments = counting.allocations();
        assert!(segments < 40, "segments double: {segments} allocations for {OBJECTS} objects");
    }

    drop(handles);
    mm.collect_garbage();
    // The raw references still hold every 7th object.
    assert_eq!(mm.count::<Entity>(), OBJECTS.div_ceil(7));
    let report = mm.shutdown();
    assert_eq!(report.len(), OBJECTS.div_ceil(7), "raw references are leaks, and are reported");
    assert_eq!(report.outliving_handles(), 0);
    assert_eq!(counting.live_bytes(), 0, "every byte went back");
    assert_eq!(TRACKER.tag_stats(TRACKER.tag_named("Entity")).bytes, 0);
}

/// `allocator_for` serves one type's store; the others keep the manager's.
#[test]
fn allocator_for_one_type() {
    let manager_wide = Counting::default();
    let particles = Counting::default();
    let mut mm = ObjectManager::builder()
        .allocator(manager_wide.clone())
        .allocator_for::<Particle, _>(particles.clone())
        .build();
    let es: Vec<_> = (0..100).map(|i| mm.create(entity(i as f32))).collect();
    let before = particles.live_bytes();
    assert_eq!(before, 0, "no particle yet");
    let ps: Vec<_> = (0..1000).map(|_| mm.create(Particle { life: 1.0 })).collect();
    let particle_bytes = particles.live_bytes();
    assert!(particle_bytes >= 1000 * (16 + 4), "{particle_bytes}");
    assert!(manager_wide.live_bytes() < particle_bytes, "the particles' segments are not the manager's");
    drop((es, ps));
    mm.collect_garbage();
    drop(mm);
    assert_eq!((manager_wide.live_bytes(), particles.live_bytes()), (0, 0));
}

/// A refusing allocator: `try_create` gives the value back, `create` panics
/// naming the type and the allocator, and nothing alive changes.
#[test]
fn refusal_is_an_error_and_nothing_is_lost() {
    let counting = Counting::refusing_over(8 << 10);
    let mm = ObjectManager::builder().segment_base(16).allocator(counting.clone()).build();
    let mut kept = Vec::new();
    let refused = loop {
        match mm.try_create(entity(kept.len() as f32)) {
            Ok(h) => kept.push(h),
            Err(e) => break e,
        }
    };
    assert!(matches!(refused.error, Error::StoreOutOfMemory { type_name: "Entity", .. }), "{:?}", refused.error);
    assert!(refused.error.to_string().contains("Counting"), "{}", refused.error);
    let value = refused.into_value();
    assert_eq!(value, entity(kept.len() as f32));

    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| mm.create(entity(0.0)))).unwrap_err();
    let message = panic.downcast_ref::<String>().expect("a formatted message");
    assert!(message.contains("Entity") && message.contains("Counting") && message.contains("refused"), "{message}");

    for (i, h) in kept.iter().enumerate() {
        assert_eq!(mm[h], entity(i as f32));
        assert_eq!(h.ref_count(), 1);
    }
    assert_eq!(mm.count::<Entity>(), kept.len());
    drop(kept);
    drop(mm);
    assert_eq!(counting.live_bytes(), 0);
}

/// `try_reserve(n)` succeeds or fails as a whole, and once it succeeds the
/// next `n` creates ask the allocator for nothing.
#[test]
fn try_reserve_then_create_asks_nothing_more() {
    let counting = Counting::default();
    let mm = ObjectManager::builder().allocator(counting.clone()).build();
    mm.try_reserve::<Entity>(1000).unwrap();
    let asked = counting.allocations();
    let handles: Vec<_> = (0..1000).map(|i| mm.create(entity(i as f32))).collect();
    assert_eq!(counting.allocations(), asked);
    drop(handles);

    // Room for the first segment (64 slots and a 2 KiB chunk prefix), not for 10,000 slots.
    let tight = Counting::refusing_over(8 << 10);
    let small = ObjectManager::builder().allocator(tight.clone()).build();
    assert!(matches!(small.try_reserve::<Entity>(10_000), Err(Error::StoreOutOfMemory { .. })));
    let h = small.create(entity(1.0));
    assert_eq!(small[&h], entity(1.0));
}

/// A `&'static` crate allocator as the store allocator, and the default's
/// memory shows in `SegmentAlloc::global().stats()`.
#[test]
fn crate_allocators_serve_stores() {
    static LEVEL: SegmentAlloc = SegmentAlloc::with_limit(1 << 20);
    let mut level = ObjectManager::builder().allocator(&LEVEL).build();
    let hs: Vec<_> = (0..500).map(|i| level.create(entity(i as f32))).collect();
    assert!(LEVEL.stats().in_use >= 500 * std::mem::size_of::<Entity>());
    drop(hs);
    level.collect_garbage();
    drop(level);
    assert_eq!(LEVEL.stats().in_use, 0);
    assert_eq!(LEVEL.stats().live, 0);
}

// ---- candidate roots when the allocator refuses ------------------------------

#[derive(MMObject)]
struct Link {
    next: Option<mmobject::Handle<Link>>,
}

#[test]
fn a_refused_candidate_makes_the_cycle_collector_walk_the_store() {
    let counting = Counting::default();
    let mut mm = ObjectManager::builder().report_leaks(false).allocator(counting.clone()).build();
    let a = mm.create(Link { next: None });
    let b = mm.create(Link { next: Some(a.clone()) });
    mm[&a].next = Some(b.clone());
    let others: Vec<_> = (0..5).map(|_| mm.create(Link { next: None })).collect();
    // Refuse every new block: the candidate queue cannot take its first entry.
    counting.0.refuse_over.store(1, Ordering::Relaxed);
    drop((a, b));
    assert_eq!(mm.cycle_candidates(), 0, "no room to queue");
    counting.0.refuse_over.store(0, Ordering::Relaxed);
    let step = mmobject::CycleCollector::new().step(&mut mm, std::time::Duration::from_secs(24 * 3600));
    assert_eq!(step.collected.objects, 2, "{step:?}");
    // Every live object of the store, once: `a` (whose group releases `b`
    // before the walk reaches it) and the five others.
    assert_eq!(step.candidates, 6);
    assert_eq!(mm.len(), others.len());
    // Walked once: the next pass reads only what is queued.
    let step = mmobject::CycleCollector::new().step(&mut mm, std::time::Duration::from_secs(24 * 3600));
    assert_eq!(step.candidates, 0);
}

/// Serves blocks from `System`, except that once told to, it answers each
/// segment request (4 MiB alignment or more) with an address at 2^48: what an
/// allocator on a machine with a 57-bit address space might return. Handles
/// keep 48 bits of a slot's address, so the store must refuse such a segment
/// before it touches it.
#[cfg(target_pointer_width = "64")]
#[derive(Clone, Default)]
struct HighAddresses {
    high: Arc<std::sync::atomic::AtomicBool>,
    live_bytes: Arc<AtomicUsize>,
}

#[cfg(target_pointer_width = "64")]
const HIGH: usize = 1 << 48;

// SAFETY: every block below 2^48 comes from `System`. The blocks at 2^48 are
// not memory at all, which breaks the trait's contract on purpose: the store
// must give them back unread (Miri would report any access), and that is
// what the test checks.
#[cfg(target_pointer_width = "64")]
unsafe impl Allocator for HighAddresses {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if self.high.load(Ordering::Relaxed) && layout.align() >= 4 << 20 {
            let high = NonNull::new(std::ptr::without_provenance_mut::<u8>(HIGH)).ok_or(AllocError)?;
            return Ok(NonNull::slice_from_raw_parts(high, layout.size()));
        }
        self.live_bytes.fetch_add(layout.size(), Ordering::Relaxed);
        System.allocate(layout)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if ptr.as_ptr().addr() == HIGH {
            return;
        }
        self.live_bytes.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded: every other block came from `System` with this layout.
        unsafe { System.deallocate(ptr, layout) }
    }
}

/// A segment placed above 2^48 is refused with an error, before anything is
/// written to it, and the objects already made are untouched.
#[cfg(target_pointer_width = "64")]
#[test]
fn a_segment_above_what_handles_address_is_refused() {
    let alloc = HighAddresses::default();
    let mm = ObjectManager::builder().segment_base(16).allocator(alloc.clone()).build();
    let kept: Vec<_> = (0..16).map(|i| mm.create(entity(i as f32))).collect();
    alloc.high.store(true, Ordering::Relaxed);
    let refused = mm.try_create(entity(16.0)).unwrap_err();
    assert!(matches!(refused.error, Error::StoreOutOfMemory { type_name: "Entity", .. }), "{:?}", refused.error);
    assert!(refused.error.to_string().contains("above 2^48"), "{}", refused.error);
    assert_eq!(refused.into_value(), entity(16.0));
    alloc.high.store(false, Ordering::Relaxed);
    let later = mm.create(entity(17.0));
    assert_eq!(mm[&later], entity(17.0));
    for (i, h) in kept.iter().enumerate() {
        assert_eq!(mm[h], entity(i as f32));
        assert_eq!(mm.get_weak(h.downgrade()), Some(&entity(i as f32)));
    }
    drop((kept, later));
    drop(mm);
    assert_eq!(alloc.live_bytes.load(Ordering::Relaxed), 0);
}

// ---- checks when the allocator refuses ----------------------------------------

/// The owner clones an object (a lease, whose check goes in its ring), and
/// the store's check queue has no room for that check when a drain queues
/// it: the check is lost (and logged), and the reservation stays. Once the
/// handles are gone the object waits (no collection can give the
/// reservation back without its check); shutdown on the owner thread gives
/// back every reservation, so it is destroyed once, nothing is reported
/// outliving, and the store's memory is freed.
#[test]
fn a_lease_whose_check_finds_no_room_ends_at_shutdown() {
    let counting = Counting::default();
    let mut mm = ObjectManager::builder().report_leaks(false).owner_thread(true).allocator(counting.clone()).build();
    let e = mm.create(entity(1.0));
    let clone = e.clone(); // the owner's first clone: a lease
    counting.0.refuse_over.store(1, Ordering::Relaxed);
    // Drains every ring: the check finds no room in the queue, and is lost.
    let _ = mm.dead_count();
    counting.0.refuse_over.store(0, Ordering::Relaxed);
    let weak = e.downgrade();
    drop((e, clone));
    assert!(mm.upgrade(weak).is_none(), "no handle is left");
    assert_eq!(mm.collect_garbage().objects, 0, "its check is lost: it waits");
    let report = mm.shutdown();
    assert!(report.is_empty());
    assert_eq!(report.outliving_handles(), 0);
    assert_eq!(report.leaked_bytes(), 0);
}
