//! Object-layer benches O1–O8 from `BENCHMARKS.md` (the shared targets file).
//!
//! Every target is a ratio against a peer measured in the same run, so each
//! workload is one criterion group that holds our implementation and all of
//! its peers. Objects are 64 B (`[u64; 8]`). Two peers are written here: a
//! minimal free-list pool (`Vec<[u64; 8]>` + `Vec<u32>` of free indices, the
//! near-physical limit for a pool) and a bevy-style strong handle (an `Arc`
//! holding the id and a `crossbeam-channel` `Sender` that sends the id on
//! drop, drained once a frame).
//!
//! Run with `cargo bench --bench objects` (two to five minutes, depending on
//! the load); a group alone with `cargo bench --bench objects -- O3`.
//!
//! The single-threaded groups (O1–O4) are timed in this thread's CPU time
//! (`CLOCK_THREAD_CPUTIME_ID` on Linux), not wall time: the machines are
//! shared, and time spent descheduled would otherwise land on whichever
//! bench was running. Cache and memory-bandwidth interference from other
//! processes still shows. O5 (one short call per timing) and O6 (five
//! threads) use wall time.

use std::cell::RefCell;
use std::hint::black_box;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Bencher, BenchmarkId, Criterion, Throughput};
use crossbeam_channel::{Receiver, Sender};
use mmobject::{Handle, MMObject, ObjectManager, WeakHandle};
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use slotmap::{DefaultKey, SecondaryMap, SlotMap};

/// The 64-byte payload every bench stores.
type Payload = [u64; 8];

/// The payload as an object of ours.
#[derive(MMObject)]
struct Obj(Payload);

/// Live objects in the O1 frame.
const FRAME_LIVE: usize = 100_000;
/// Objects released and created per O1 frame.
const FRAME_CHURN: usize = 1_000;
/// Objects read in O3 and O4.
const READ_LIVE: usize = 1_000_000;
/// Length of the precomputed random-index tables (a power of two).
const PICKS: usize = 1 << 18;

fn payload(n: usize) -> Payload {
    [n as u64; 8]
}

fn rng() -> SmallRng {
    SmallRng::seed_from_u64(0x5EED_0B1E_C700)
}

/// `PICKS` random indices below `n`, precomputed so that every peer walks the same sequence.
fn picks(n: usize) -> Vec<u32> {
    let mut rng = rng();
    (0..PICKS).map(|_| rng.gen_range(0..n as u32)).collect()
}

/// A random permutation of `0..n`: each object read exactly once per pass.
fn permutation(n: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..n as u32).collect();
    order.shuffle(&mut rng());
    order
}

/// A clock that advances only while this thread runs: `CLOCK_THREAD_CPUTIME_ID`.
#[cfg(all(target_os = "linux", target_pointer_width = "64"))]
fn cpu_clock() -> Duration {
    /// `struct timespec` on 64-bit Linux.
    #[repr(C)]
    struct Timespec {
        seconds: i64,
        nanoseconds: i64,
    }
    extern "C" {
        fn clock_gettime(clock: i32, out: *mut Timespec) -> i32;
    }
    const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
    let mut now = Timespec { seconds: 0, nanoseconds: 0 };
    // SAFETY: `clock_gettime` (libc, always linked by std on Linux) writes
    // one `timespec`, whose 64-bit layout `Timespec` matches, through a
    // pointer valid for writes; clock 3 is the calling thread's CPU clock.
    let status = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut now) };
    assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID) failed");
    Duration::new(now.seconds as u64, now.nanoseconds as u32)
}

/// Wall time elsewhere.
#[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
fn cpu_clock() -> Duration {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed()
}

/// `Bencher::iter`, timed with [`cpu_clock`].
fn cpu_iter<O>(b: &mut Bencher, mut routine: impl FnMut() -> O) {
    b.iter_custom(|iters| {
        let start = cpu_clock();
        for _ in 0..iters {
            black_box(routine());
        }
        cpu_clock() - start
    })
}

/// Like [`cpu_iter`], with an untimed `setup` before each call and the
/// routine's output dropped after the clock stops.
fn cpu_iter_with_setup<S, O>(b: &mut Bencher, mut setup: impl FnMut() -> S, mut routine: impl FnMut(S) -> O) {
    b.iter_custom(|iters| {
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let input = setup();
            let start = cpu_clock();
            let output = routine(input);
            total += cpu_clock() - start;
            drop(black_box(output));
        }
        total
    })
}

/// A manager whose stores use `allocator_api2::alloc::Global`, as the
/// stores' own private allocation path did before store allocators: the
/// in-run reference for "no slower than today".
fn manager_on_global() -> ObjectManager {
    ObjectManager::builder().allocator(mmobject::allocator_api2::alloc::Global).build()
}

/// A manager owned by the calling thread (the bench's): its clones and drops
/// there go through the owner's reservation (`owner_thread`).
fn owned() -> ObjectManager {
    ObjectManager::builder().owner_thread(true).build()
}

/// A manager whose drops wait for its thread's ring to apply them in a
/// batch (`deferred_drops`): the same objects, released later.
fn deferring() -> ObjectManager {
    ObjectManager::builder().deferred_drops(true).build()
}

/// Walks a precomputed pick table, wrapping around.
struct Cursor<'a> {
    picks: &'a [u32],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn new(picks: &'a [u32]) -> Self {
        Cursor { picks, at: 0 }
    }

    #[inline]
    fn next(&mut self) -> usize {
        let pick = self.picks[self.at];
        self.at = (self.at + 1) & (PICKS - 1);
        pick as usize
    }
}

// ---- in-file peers ----------------------------------------------------------

/// The minimal free-list pool: the near-physical limit for a pool of 64-byte objects.
#[derive(Default)]
struct FreeListPool {
    items: Vec<Payload>,
    free: Vec<u32>,
}

impl FreeListPool {
    #[inline]
    fn alloc(&mut self, value: Payload) -> u32 {
        match self.free.pop() {
            Some(index) => {
                self.items[index as usize] = value;
                index
            }
            None => {
                self.items.push(value);
                (self.items.len() - 1) as u32
            }
        }
    }

    #[inline]
    fn free(&mut self, index: u32) {
        self.free.push(index);
    }
}

/// What a bevy-style handle shares: the id, and the channel its drop reports to.
struct BevyInner {
    id: u32,
    drop_sender: Sender<u32>,
}

impl Drop for BevyInner {
    fn drop(&mut self) {
        let _ = self.drop_sender.send(self.id);
    }
}

/// A bevy-style strong handle: `Arc` around the id and a drop sender.
#[derive(Clone)]
struct BevyHandle(Arc<BevyInner>);

/// Bevy-style asset storage: a free-list pool, freed from the drop channel once a frame.
struct BevyAssets {
    pool: FreeListPool,
    sender: Sender<u32>,
    receiver: Receiver<u32>,
}

impl BevyAssets {
    fn new() -> Self {
        let (sender, receiver) = crossbeam_channel::unbounded();
        BevyAssets { pool: FreeListPool::default(), sender, receiver }
    }

    #[inline]
    fn add(&mut self, value: Payload) -> BevyHandle {
        let id = self.pool.alloc(value);
        BevyHandle(Arc::new(BevyInner { id, drop_sender: self.sender.clone() }))
    }

    #[inline]
    fn get(&self, handle: &BevyHandle) -> &Payload {
        &self.pool.items[handle.0.id as usize]
    }

    /// The once-a-frame drain.
    fn free_dropped(&mut self) {
        for id in self.receiver.try_iter() {
            self.pool.free(id);
        }
    }
}

slotmap::new_key_type! {
    /// The refslots peer's key.
    struct RefKey;
}

// ---- O1 ---------------------------------------------------------------------

/// O1, a frame: 100k live objects; 1,000 random ones are released and 1,000
/// created, then the frame's cleanup runs (`collect_garbage` for us).
/// Reported per frame; divide by 1,000 for the cost per object.
///
/// Why the peers are fair: each keeps 100k live 64-byte objects and replaces
/// the same 1,000 random ones per frame, so each pays a release, a create and
/// its own deferred cleanup on a cold object. slotmap churn (remove + insert)
/// is the refcount-free floor of a generational map; `Arc`/`Rc` replace is
/// what a refcounted engine does without a manager (malloc + free); froggy,
/// refslots + `SecondaryMap` and bevy-style handles are the refcounted,
/// frame-collected designs this crate competes with. The free-list pool is
/// the physical limit (no refcount, no generation) and is shown for scale.
/// `mmobject_deferred` is a manager built with `deferred_drops(true)`: its
/// releases are applied by the frame's collection, in a batch.
fn o1_frame(c: &mut Criterion) {
    let picks = picks(FRAME_LIVE);
    let mut group = c.benchmark_group("O1_frame");
    group.throughput(Throughput::Elements(FRAME_CHURN as u64));
    group.sample_size(30).warm_up_time(Duration::from_millis(700)).measurement_time(Duration::from_secs(2));

    let managers = [
        ("mmobject", ObjectManager::new()),
        ("mmobject_owner", owned()),
        ("mmobject_deferred", deferring()),
        ("mmobject_global_alloc", manager_on_global()),
    ];
    for (name, mut mm) in managers {
        let mut handles: Vec<Handle<Obj>> = (0..FRAME_LIVE).map(|i| mm.create(Obj(payload(i)))).collect();
        let mut cursor = Cursor::new(&picks);
        group.bench_function(name, |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    handles[i] = mm.create(Obj(payload(n)));
                }
                black_box(mm.collect_garbage());
            })
        });
        drop(handles);
    }
    {
        let mut map: SlotMap<DefaultKey, Payload> = SlotMap::with_capacity(FRAME_LIVE);
        let mut keys: Vec<DefaultKey> = (0..FRAME_LIVE).map(|i| map.insert(payload(i))).collect();
        let mut cursor = Cursor::new(&picks);
        group.bench_function("slotmap_churn", |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    black_box(map.remove(keys[i]));
                    keys[i] = map.insert(payload(n));
                }
            })
        });
    }
    {
        let mut arcs: Vec<Arc<Payload>> = (0..FRAME_LIVE).map(|i| Arc::new(payload(i))).collect();
        let mut cursor = Cursor::new(&picks);
        group.bench_function("arc_replace", |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    arcs[i] = Arc::new(payload(n));
                }
            })
        });
    }
    {
        let mut rcs: Vec<Rc<Payload>> = (0..FRAME_LIVE).map(|i| Rc::new(payload(i))).collect();
        let mut cursor = Cursor::new(&picks);
        group.bench_function("rc_replace", |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    rcs[i] = Rc::new(payload(n));
                }
            })
        });
    }
    {
        let mut storage: froggy::Storage<Payload> = froggy::Storage::with_capacity(FRAME_LIVE);
        let mut pointers: Vec<froggy::Pointer<Payload>> = (0..FRAME_LIVE).map(|i| storage.create(payload(i))).collect();
        let mut cursor = Cursor::new(&picks);
        group.bench_function("froggy", |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    pointers[i] = storage.create(payload(n));
                }
                storage.sync_pending();
            })
        });
    }
    {
        // refslots wants an `Arc<parking_lot::RwLock<Registry>>` of its own
        // parking_lot version; inference builds it without naming it.
        let registry = Arc::default();
        let first = refslots::Handle::<RefKey>::insert(&registry, ());
        let mut data: SecondaryMap<RefKey, Payload> = SecondaryMap::with_capacity(FRAME_LIVE);
        data.insert(first.key(), payload(0));
        let mut handles = vec![first];
        for i in 1..FRAME_LIVE {
            let handle = refslots::Handle::insert(&registry, ());
            data.insert(handle.key(), payload(i));
            handles.push(handle);
        }
        let mut released = Vec::with_capacity(FRAME_CHURN);
        let mut cursor = Cursor::new(&picks);
        group.bench_function("refslots_secondarymap", |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    let handle = refslots::Handle::insert(&registry, ());
                    data.insert(handle.key(), payload(n));
                    handles[i] = handle;
                }
                released.extend(registry.write().take_released());
                for key in released.drain(..) {
                    black_box(data.remove(key));
                }
            })
        });
        drop(handles);
    }
    {
        let mut assets = BevyAssets::new();
        let mut handles: Vec<BevyHandle> = (0..FRAME_LIVE).map(|i| assets.add(payload(i))).collect();
        let mut cursor = Cursor::new(&picks);
        group.bench_function("bevy_style", |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    handles[i] = assets.add(payload(n));
                }
                assets.free_dropped();
            })
        });
        black_box(assets.get(&handles[0]));
    }
    {
        let mut pool = FreeListPool::default();
        let mut ids: Vec<u32> = (0..FRAME_LIVE).map(|i| pool.alloc(payload(i))).collect();
        let mut cursor = Cursor::new(&picks);
        group.bench_function("free_list_pool_limit", |b| {
            cpu_iter(b, || {
                for n in 0..FRAME_CHURN {
                    let i = cursor.next();
                    pool.free(ids[i]);
                    ids[i] = pool.alloc(payload(n));
                }
            })
        });
    }
    group.finish();
}

// ---- O2 ---------------------------------------------------------------------

/// O2: one handle clone plus its drop, on one thread, on a hot object.
///
/// Why `Arc` is the fair peer: both are thread-safe strong references whose
/// clone is one relaxed atomic add and whose drop is one release atomic sub,
/// so the difference is the handle's own overhead (size, checks, inlining).
/// `Rc` is the peer of the stretch target (≤ 2× `Rc`), for the owner
/// thread's plain counts.
fn o2_clone_drop(c: &mut Criterion) {
    let mut group = c.benchmark_group("O2_clone_drop");
    group.throughput(Throughput::Elements(1));
    group.sample_size(50).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));

    let mm = ObjectManager::new();
    let handle = mm.create(Obj(payload(1)));
    group.bench_function("mmobject", |b| {
        cpu_iter(b, || {
            let clone = black_box(&handle).clone();
            drop(black_box(clone));
        })
    });
    // A type that may hold handles: its drops go through the candidate-root
    // path (a compare-exchange; the object is queued once, on the first drop).
    let owner = owned();
    let owned_handle = owner.create(Obj(payload(1)));
    group.bench_function("mmobject_owner", |b| {
        cpu_iter(b, || {
            let clone = black_box(&owned_handle).clone();
            drop(black_box(clone));
        })
    });
    let node = mm.create(CycleNode { next: None, payload: payload(1) });
    group.bench_function("mmobject_may_hold_handles", |b| {
        cpu_iter(b, || {
            let clone = black_box(&node).clone();
            drop(black_box(clone));
        })
    });
    let arc = Arc::new(payload(1));
    group.bench_function("arc", |b| {
        cpu_iter(b, || {
            let clone = black_box(&arc).clone();
            drop(black_box(clone));
        })
    });
    // The stretch target's peer: a non-atomic count, what the owner thread's
    // reservation is measured against.
    let rc = Rc::new(payload(1));
    group.bench_function("rc", |b| {
        cpu_iter(b, || {
            let clone = black_box(&rc).clone();
            drop(black_box(clone));
        })
    });
    group.finish();
    drop((handle, node, owned_handle));
}

/// `iters` calls of `routine` on a thread of their own, timed in that
/// thread's CPU time (O2b).
fn cpu_iter_on_worker<O>(b: &mut Bencher, routine: impl Fn() -> O + Sync) {
    b.iter_custom(|iters| {
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let start = cpu_clock();
                    for _ in 0..iters {
                        black_box(routine());
                    }
                    cpu_clock() - start
                })
                .join()
                .expect("the worker does not panic")
        })
    });
}

/// O2b: one handle clone plus its drop on a worker thread, while the manager
/// (which collects) lives on the bench's main thread. The peer is `Arc` on
/// the same kind of worker. Today a clone or drop does the same work on
/// every thread; the row is here for the owner-thread counting of issue 13,
/// under which this would be the slow side.
fn o2b_clone_drop_other_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("O2b_clone_drop_other_thread");
    group.throughput(Throughput::Elements(1));
    group.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    let mm = ObjectManager::new();
    let handle = mm.create(Obj(payload(1)));
    group.bench_function("mmobject", |b| {
        cpu_iter_on_worker(b, || {
            let clone = black_box(&handle).clone();
            drop(black_box(clone));
        })
    });
    // The manager owned by the bench's thread: a worker's clone and drop are
    // one atomic add and one atomic subtract, as without an owner.
    let owner = owned();
    let owned_handle = owner.create(Obj(payload(1)));
    group.bench_function("mmobject_owner", |b| {
        cpu_iter_on_worker(b, || {
            let clone = black_box(&owned_handle).clone();
            drop(black_box(clone));
        })
    });
    let arc = Arc::new(payload(1));
    group.bench_function("arc", |b| {
        cpu_iter_on_worker(b, || {
            let clone = black_box(&arc).clone();
            drop(black_box(clone));
        })
    });
    group.finish();
    drop((handle, owned_handle));
}

/// Objects whose handles O2c clones each frame.
const FRAME_CLONED: usize = 1_000;

/// O2c: a frame in which the collecting thread clones a handle to each of
/// 1,000 live objects (say, into a render list), drops the clones at the
/// frame's end, and collects (with nothing dead).
///
/// This is what the owner's reservations cost across frames: the owner's
/// first clone of an object takes a lease (one atomic add of a batch and a
/// queued check), and each collection visits the check, renewing the lease
/// while the owner goes on using it (O2's loop never collects, so it shows
/// only the plain counts). The peers clone into the same `Vec`: `Arc` (two
/// atomic operations per object), `Rc`, and a manager without an owner
/// (whose collection has nothing to do).
fn o2c_clone_each_frame(c: &mut Criterion) {
    let mut group = c.benchmark_group("O2c_clone_each_frame");
    group.throughput(Throughput::Elements(FRAME_CLONED as u64));
    group.sample_size(50).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));

    for (name, mut mm) in [("mmobject", ObjectManager::new()), ("mmobject_owner", owned())] {
        let handles: Vec<Handle<Obj>> = (0..FRAME_CLONED).map(|i| mm.create(Obj(payload(i)))).collect();
        let mut frame: Vec<Handle<Obj>> = Vec::with_capacity(FRAME_CLONED);
        group.bench_function(name, |b| {
            cpu_iter(b, || {
                frame.extend(handles.iter().cloned());
                frame.clear();
                black_box(mm.collect_garbage())
            })
        });
        drop(handles);
    }
    let arcs: Vec<Arc<Payload>> = (0..FRAME_CLONED).map(|i| Arc::new(payload(i))).collect();
    let mut arc_frame: Vec<Arc<Payload>> = Vec::with_capacity(FRAME_CLONED);
    group.bench_function("arc", |b| {
        cpu_iter(b, || {
            arc_frame.extend(arcs.iter().cloned());
            arc_frame.clear();
        })
    });
    let rcs: Vec<Rc<Payload>> = (0..FRAME_CLONED).map(|i| Rc::new(payload(i))).collect();
    let mut rc_frame: Vec<Rc<Payload>> = Vec::with_capacity(FRAME_CLONED);
    group.bench_function("rc", |b| {
        cpu_iter(b, || {
            rc_frame.extend(rcs.iter().cloned());
            rc_frame.clear();
        })
    });
    group.finish();
}

// ---- O3 ---------------------------------------------------------------------

/// O3: one pass over 1M objects in a precomputed random order, summing one
/// field read through a strong handle (`mm[&handles[i]]`). The
/// `mmobject_view` row reads through `mm.view::<Obj>()`, taken once per
/// pass: the view keeps the manager id in a register, where `mm[..]` in a
/// closure reloads it on every read (LLVM cannot hoist a load through a
/// captured reference), and in a loop that misses the cache every load
/// counts.
///
/// Why the peers are fair: the `Rc` peer makes the same two dependent loads
/// (the reference from a shuffled-order `Vec`, then the object), so it is the
/// plain-pointer cost of a strong reference. `Vec` index makes one (the
/// index is the order itself) and is the limit: ours should cost about that
/// plus one miss. The `_shuffled_walk` rows (information only) hold the
/// references in a `Vec` already in random order and walk it front to back,
/// as a game walks its entities: one miss per read, so the size of the
/// reference drops out (both are 8 B now; the handle was 24 B before).
fn o3_strong_read(c: &mut Criterion) {
    let order = permutation(READ_LIVE);
    let mut group = c.benchmark_group("O3_strong_read");
    group.throughput(Throughput::Elements(READ_LIVE as u64));
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));

    {
        let mm = ObjectManager::new();
        mm.reserve::<Obj>(READ_LIVE);
        let handles: Vec<Handle<Obj>> = (0..READ_LIVE).map(|i| mm.create(Obj(payload(i)))).collect();
        group.bench_function("mmobject", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &i in &order {
                    sum = sum.wrapping_add(mm[&handles[i as usize]].0[3]);
                }
                black_box(sum)
            })
        });
        group.bench_function("mmobject_view", |b| {
            cpu_iter(b, || {
                let view = mm.view::<Obj>();
                let mut sum = 0u64;
                for &i in &order {
                    sum = sum.wrapping_add(view.get(&handles[i as usize]).0[3]);
                }
                black_box(sum)
            })
        });
        let shuffled: Vec<Handle<Obj>> = order.iter().map(|&i| handles[i as usize].clone()).collect();
        group.bench_function("mmobject_shuffled_walk", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for handle in &shuffled {
                    sum = sum.wrapping_add(mm[handle].0[3]);
                }
                black_box(sum)
            })
        });
        drop(shuffled);
        drop(handles);
    }
    {
        let rcs: Vec<Rc<Payload>> = (0..READ_LIVE).map(|i| Rc::new(payload(i))).collect();
        group.bench_function("rc_deref", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &i in &order {
                    sum = sum.wrapping_add(rcs[i as usize][3]);
                }
                black_box(sum)
            })
        });
        let shuffled: Vec<Rc<Payload>> = order.iter().map(|&i| Rc::clone(&rcs[i as usize])).collect();
        group.bench_function("rc_deref_shuffled_walk", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for rc in &shuffled {
                    sum = sum.wrapping_add(rc[3]);
                }
                black_box(sum)
            })
        });
    }
    {
        let items: Vec<Payload> = (0..READ_LIVE).map(payload).collect();
        group.bench_function("vec_index_limit", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &i in &order {
                    sum = sum.wrapping_add(items[i as usize][3]);
                }
                black_box(sum)
            })
        });
    }
    group.finish();
}

// ---- O4 ---------------------------------------------------------------------

/// O4: one pass over 1M objects in a precomputed random order, summing one
/// field read through a weak handle (`mm.get_weak(w)`), which checks the
/// generation and liveness on every read.
///
/// Why slotmap is the fair peer: `SlotMap::get` is the same checked,
/// generational lookup (key from a `Vec`, version compare, value), without
/// refcounts or a type-erased manager. The `_shuffled_walk` rows
/// (information only) walk keys already stored in random order: one miss
/// per read instead of two. `slotmap_get_16B_keys` (information only)
/// reads with keys padded to a weak handle's 16 bytes. The `mmobject_view` row reads through
/// `mm.view::<Obj>()`, taken once per pass: the typed fast path for hot
/// loops, which finds the store once instead of on every read.
fn o4_weak_read(c: &mut Criterion) {
    let order = permutation(READ_LIVE);
    let mut group = c.benchmark_group("O4_weak_read");
    group.throughput(Throughput::Elements(READ_LIVE as u64));
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));

    {
        let mm = ObjectManager::new();
        mm.reserve::<Obj>(READ_LIVE);
        let handles: Vec<Handle<Obj>> = (0..READ_LIVE).map(|i| mm.create(Obj(payload(i)))).collect();
        let weaks: Vec<WeakHandle<Obj>> = handles.iter().map(Handle::downgrade).collect();
        group.bench_function("mmobject", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &i in &order {
                    if let Some(obj) = mm.get_weak(weaks[i as usize]) {
                        sum = sum.wrapping_add(obj.0[3]);
                    }
                }
                black_box(sum)
            })
        });
        group.bench_function("mmobject_view", |b| {
            cpu_iter(b, || {
                let view = mm.view::<Obj>();
                let mut sum = 0u64;
                for &i in &order {
                    if let Some(obj) = view.get_weak(weaks[i as usize]) {
                        sum = sum.wrapping_add(obj.0[3]);
                    }
                }
                black_box(sum)
            })
        });
        let shuffled: Vec<WeakHandle<Obj>> = order.iter().map(|&i| weaks[i as usize]).collect();
        group.bench_function("mmobject_shuffled_walk", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &weak in &shuffled {
                    if let Some(obj) = mm.get_weak(weak) {
                        sum = sum.wrapping_add(obj.0[3]);
                    }
                }
                black_box(sum)
            })
        });
        drop(handles);
    }
    {
        let mut map: SlotMap<DefaultKey, Payload> = SlotMap::with_capacity(READ_LIVE);
        let keys: Vec<DefaultKey> = (0..READ_LIVE).map(|i| map.insert(payload(i))).collect();
        group.bench_function("slotmap_get", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &i in &order {
                    if let Some(value) = map.get(keys[i as usize]) {
                        sum = sum.wrapping_add(value[3]);
                    }
                }
                black_box(sum)
            })
        });
        // Information only: the same gets with each key padded to 16 bytes,
        // a `WeakHandle`'s size, so the keys' array is as large as ours.
        let padded: Vec<(DefaultKey, u64)> = keys.iter().map(|&key| (key, 0)).collect();
        group.bench_function("slotmap_get_16B_keys", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &i in &order {
                    if let Some(value) = map.get(padded[i as usize].0) {
                        sum = sum.wrapping_add(value[3]);
                    }
                }
                black_box(sum)
            })
        });
        let shuffled: Vec<DefaultKey> = order.iter().map(|&i| keys[i as usize]).collect();
        group.bench_function("slotmap_get_shuffled_walk", |b| {
            cpu_iter(b, || {
                let mut sum = 0u64;
                for &key in &shuffled {
                    if let Some(value) = map.get(key) {
                        sum = sum.wrapping_add(value[3]);
                    }
                }
                black_box(sum)
            })
        });
    }
    group.finish();
}

// ---- O5 ---------------------------------------------------------------------

/// Times `collect_garbage` alone, `iters` times; `prepare` makes the 10 dead
/// objects before each timed call.
fn time_collects(mm: &mut ObjectManager, iters: u64, mut prepare: impl FnMut(&ObjectManager)) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        prepare(mm);
        let start = Instant::now();
        black_box(mm.collect_garbage());
        total += start.elapsed();
    }
    total
}

/// O5: `collect_garbage` with 10 dead objects among N live, N = 1k, 100k, 1M.
/// Only the collection is timed; the 10 objects are created and released
/// before the timer starts (`fresh_dead`, as BENCHMARKS.md specifies).
///
/// The peer is the same call at N = 1k: collection must cost O(dead), so N
/// must not matter. `random_dead` (information only) instead releases 10
/// random live objects, whose slots are cold at large N: it shows the cache
/// misses a real frame adds, which an O(dead) collector still pays.
/// `timer_overhead` is `Instant::now` + `elapsed` around nothing, included in
/// every O5 figure.
fn o5_collect(c: &mut Criterion) {
    let mut group = c.benchmark_group("O5_collect_10_dead");
    group.sample_size(30).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));

    group.bench_function("timer_overhead", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let start = Instant::now();
                total += start.elapsed();
            }
            total
        })
    });
    for live in [1_000usize, 100_000, 1_000_000] {
        let mut mm = ObjectManager::new();
        mm.reserve::<Obj>(live + 16);
        let handles = RefCell::new((0..live).map(|i| mm.create(Obj(payload(i)))).collect::<Vec<Handle<Obj>>>());
        mm.collect_garbage();
        group.bench_with_input(BenchmarkId::new("fresh_dead", live), &live, |b, _| {
            b.iter_custom(|iters| {
                time_collects(&mut mm, iters, |mm| {
                    for n in 0..10 {
                        drop(mm.create(Obj(payload(n))));
                    }
                })
            })
        });
        let picks = picks(live);
        let mut cursor = Cursor::new(&picks);
        group.bench_with_input(BenchmarkId::new("random_dead", live), &live, |b, _| {
            b.iter_custom(|iters| {
                time_collects(&mut mm, iters, |mm| {
                    let mut handles = handles.borrow_mut();
                    for n in 0..10 {
                        let i = cursor.next();
                        handles[i] = mm.create(Obj(payload(n)));
                    }
                })
            })
        });
        drop(handles);
        drop(mm);
    }
    group.finish();
}

// ---- O6 ---------------------------------------------------------------------

/// Handles in the O6 shared set.
const SHARED_SET: usize = 1024;
/// Worker threads cloning and dropping in O6.
const WORKERS: usize = 4;
/// Objects the O6 frame thread creates (and drops) between two collections.
const O6_FRAME: usize = 64;

/// Runs `WORKERS` threads that each clone and drop `iters` random references
/// from `set`, while the calling thread runs `frame` in a loop until they
/// finish. Returns the workers' wall time.
fn contended<R: Clone + Sync>(set: &[R], iters: u64, mut frame: impl FnMut()) -> Duration {
    let finished = AtomicUsize::new(0);
    let picks = picks(SHARED_SET);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for worker in 0..WORKERS {
            let (picks, finished) = (&picks, &finished);
            scope.spawn(move || {
                let mut at = worker * (PICKS / WORKERS);
                for _ in 0..iters {
                    let clone = set[picks[at] as usize].clone();
                    drop(black_box(clone));
                    at = (at + 1) & (PICKS - 1);
                }
                finished.fetch_add(1, Ordering::Release);
            });
        }
        while finished.load(Ordering::Acquire) < WORKERS {
            frame();
        }
    });
    start.elapsed()
}

/// O6: 4 threads clone and drop random handles from a shared set of 1,024
/// while this thread, in a loop, creates 64 objects, drops them and runs
/// `collect_garbage`. Time per round of 4 clone+drops (one per worker).
///
/// Why `Arc` in the same pattern is fair: it is the thread-safe refcount
/// with no manager; its frame thread allocates and frees 64 objects through
/// malloc instead of creating and collecting. The contention on the shared
/// counts is the same in both. The machine has 2 cores for 5 threads, so the
/// figure includes scheduling; only the ratio means anything.
fn o6_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("O6_threads");
    group.throughput(Throughput::Elements(WORKERS as u64));
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(4));

    for (name, mut mm) in [("mmobject", ObjectManager::new()), ("mmobject_owner", owned())] {
        let set: Vec<Handle<Obj>> = (0..SHARED_SET).map(|i| mm.create(Obj(payload(i)))).collect();
        let mut made = Vec::with_capacity(O6_FRAME);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                contended(&set, iters, || {
                    for n in 0..O6_FRAME {
                        made.push(mm.create(Obj(payload(n))));
                    }
                    made.clear();
                    black_box(mm.collect_garbage());
                })
            })
        });
        drop(set);
    }
    {
        let set: Vec<Arc<Payload>> = (0..SHARED_SET).map(|i| Arc::new(payload(i))).collect();
        let mut made = Vec::with_capacity(O6_FRAME);
        group.bench_function("arc", |b| {
            b.iter_custom(|iters| {
                contended(&set, iters, || {
                    for n in 0..O6_FRAME {
                        made.push(Arc::new(payload(n)));
                    }
                    made.clear();
                })
            })
        });
    }
    group.finish();
}

// ---- O8 ---------------------------------------------------------------------

/// Handles each O8 worker keeps, replacing them in turn.
const WORKER_KEPT: usize = 1_000;
/// Objects an O8 worker makes per `create_many` batch.
const WORKER_BATCH: usize = 100;

/// Runs `workers` threads that each make `iters` objects with `make`
/// (replacing, in turn, the `WORKER_KEPT` handles the thread keeps, so the
/// old one drops), while the calling thread runs `frame` once a millisecond
/// until they finish (a fast game's frame, well within a 60 Hz one).
/// Returns the workers' wall time.
fn worker_churn<H: Send>(
    workers: usize,
    iters: u64,
    make: impl Fn(&mut Vec<H>, u64) + Sync,
    mut frame: impl FnMut(),
) -> Duration {
    let finished = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (make, finished) = (&make, &finished);
            scope.spawn(move || {
                let mut kept = Vec::with_capacity(WORKER_KEPT);
                make(&mut kept, iters);
                drop(black_box(kept));
                finished.fetch_add(1, Ordering::Release);
            });
        }
        while finished.load(Ordering::Acquire) < workers {
            frame();
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    start.elapsed()
}

/// Puts `made` into `kept`, replacing from `*at` on once it is full.
fn replace_in_turn<H>(kept: &mut Vec<H>, at: &mut usize, made: H) {
    if kept.len() < WORKER_KEPT {
        kept.push(made);
    } else {
        kept[*at] = made;
        *at = (*at + 1) % WORKER_KEPT;
    }
}

/// O8 (information, no target yet): worker threads create objects while the
/// main thread collects, as a job system spawning entities would. Each of 1
/// or 2 workers keeps 1,000 objects and replaces them in turn, through a
/// [`mmobject::Loader`] (one `create` at a time, or `create_many` batches of
/// 100); the main thread calls `collect_garbage` once a millisecond. Time
/// per object made, per worker. The peer does the same with `Arc::new`, its
/// main thread only sleeping.
fn o8_worker_creates(c: &mut Criterion) {
    let mut group = c.benchmark_group("O8_worker_creates");
    group.sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for workers in [1usize, 2] {
        group.throughput(Throughput::Elements(workers as u64));
        let mut mm = ObjectManager::new();
        let loader = mm.loader();
        group.bench_function(BenchmarkId::new("mmobject_loader", workers), |b| {
            b.iter_custom(|iters| {
                let make = |kept: &mut Vec<Handle<Obj>>, iters: u64| {
                    let mut at = 0;
                    for n in 0..iters as usize {
                        replace_in_turn(kept, &mut at, loader.create(Obj(payload(n))));
                    }
                };
                worker_churn(workers, iters, make, || {
                    black_box(mm.collect_garbage());
                })
            })
        });
        group.bench_function(BenchmarkId::new("mmobject_loader_create_many", workers), |b| {
            b.iter_custom(|iters| {
                let make = |kept: &mut Vec<Handle<Obj>>, iters: u64| {
                    let (mut at, mut made) = (0, 0);
                    while made < iters as usize {
                        let batch = WORKER_BATCH.min(iters as usize - made);
                        for handle in loader.create_many((made..made + batch).map(|n| Obj(payload(n)))) {
                            replace_in_turn(kept, &mut at, handle);
                        }
                        made += batch;
                    }
                };
                worker_churn(workers, iters, make, || {
                    black_box(mm.collect_garbage());
                })
            })
        });
        drop(loader);
        mm.collect_garbage();
        group.bench_function(BenchmarkId::new("arc", workers), |b| {
            b.iter_custom(|iters| {
                let make = |kept: &mut Vec<Arc<Payload>>, iters: u64| {
                    let mut at = 0;
                    for n in 0..iters as usize {
                        replace_in_turn(kept, &mut at, Arc::new(payload(n)));
                    }
                };
                worker_churn(workers, iters, make, || {})
            })
        });
    }
    group.finish();
}

/// O1b, a level load: 100k creates into an empty manager, handles kept in a
/// `Vec` (slotmap: 100k inserts into an empty map, keys kept in a `Vec`).
/// Dropping what was loaded is not timed. `mmobject_create_many` loads the
/// same objects with one `create_many` call, the bulk form a level loader
/// uses (the same `Vec` of handles comes back); `mmobject_loader` and
/// `mmobject_loader_create_many` load them through a [`mmobject::Loader`].
fn o1b_load(c: &mut Criterion) {
    let mut group = c.benchmark_group("O1b_load");
    group.throughput(Throughput::Elements(FRAME_LIVE as u64));
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let load = |mm: ObjectManager| {
        let handles: Vec<Handle<Obj>> = (0..FRAME_LIVE).map(|i| mm.create(Obj(payload(i)))).collect();
        (handles, mm)
    };
    group.bench_function("mmobject", |b| cpu_iter_with_setup(b, ObjectManager::new, load));
    group.bench_function("mmobject_owner", |b| cpu_iter_with_setup(b, owned, load));
    group.bench_function("mmobject_create_many", |b| {
        cpu_iter_with_setup(b, ObjectManager::new, |mm: ObjectManager| {
            let handles: Vec<Handle<Obj>> = mm.create_many((0..FRAME_LIVE).map(|i| Obj(payload(i))));
            (handles, mm)
        })
    });
    group.bench_function("mmobject_global_alloc", |b| cpu_iter_with_setup(b, manager_on_global, load));
    // Through a loader, on this thread: the path a level stream takes, one
    // `create` at a time and as one batch.
    group.bench_function("mmobject_loader", |b| {
        cpu_iter_with_setup(b, ObjectManager::new, |mm: ObjectManager| {
            let loader = mm.loader();
            let handles: Vec<Handle<Obj>> = (0..FRAME_LIVE).map(|i| loader.create(Obj(payload(i)))).collect();
            (handles, mm)
        })
    });
    group.bench_function("mmobject_loader_create_many", |b| {
        cpu_iter_with_setup(b, ObjectManager::new, |mm: ObjectManager| {
            let handles: Vec<Handle<Obj>> = mm.loader().create_many((0..FRAME_LIVE).map(|i| Obj(payload(i))));
            (handles, mm)
        })
    });
    group.bench_function("slotmap_insert", |b| {
        cpu_iter_with_setup(b, SlotMap::<DefaultKey, Payload>::new, |mut map| {
            let keys: Vec<DefaultKey> = (0..FRAME_LIVE).map(|i| map.insert(payload(i))).collect();
            (keys, map)
        })
    });
    group.finish();
}

/// O1c, a level unload: drop 100k handles, `collect_garbage`, drop the empty
/// manager (slotmap: remove 100k keys, drop the map). Loading is not timed.
/// `mmobject_release_many` gives the handles back with one `release_many`
/// call instead of dropping the `Vec`, the bulk form an unload uses.
fn o1c_unload(c: &mut Criterion) {
    let mut group = c.benchmark_group("O1c_unload");
    group.throughput(Throughput::Elements(FRAME_LIVE as u64));
    group.sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let loaded = |mm: ObjectManager| {
        let handles: Vec<Handle<Obj>> = (0..FRAME_LIVE).map(|i| mm.create(Obj(payload(i)))).collect();
        (handles, mm)
    };
    let unload = |(handles, mut mm): (Vec<Handle<Obj>>, ObjectManager)| {
        drop(handles);
        black_box(mm.collect_garbage());
        drop(mm);
    };
    group.bench_function("mmobject", |b| cpu_iter_with_setup(b, || loaded(ObjectManager::new()), unload));
    group.bench_function("mmobject_owner", |b| cpu_iter_with_setup(b, || loaded(owned()), unload));
    group.bench_function("mmobject_deferred", |b| cpu_iter_with_setup(b, || loaded(deferring()), unload));
    group.bench_function("mmobject_release_many", |b| {
        cpu_iter_with_setup(
            b,
            || loaded(ObjectManager::new()),
            |(handles, mut mm): (Vec<Handle<Obj>>, ObjectManager)| {
                mm.release_many(handles);
                black_box(mm.collect_garbage());
                drop(mm);
            },
        )
    });
    group.bench_function("mmobject_global_alloc", |b| cpu_iter_with_setup(b, || loaded(manager_on_global()), unload));
    group.bench_function("slotmap_remove", |b| {
        cpu_iter_with_setup(
            b,
            || {
                let mut map = SlotMap::<DefaultKey, Payload>::new();
                let keys: Vec<DefaultKey> = (0..FRAME_LIVE).map(|i| map.insert(payload(i))).collect();
                (keys, map)
            },
            |(keys, mut map)| {
                for key in keys {
                    black_box(map.remove(key));
                }
                drop(map);
            },
        )
    });
    group.finish();
}

// ---- F1: the leak report at 100k leaked objects -----------------------------------

/// Leaked objects in F1.
const LEAKED: usize = 100_000;

/// A mesh shared by many entities.
#[derive(MMObject)]
struct LeakMesh {
    vertices: Vec<[f32; 3]>,
}

/// One of the 100k leaked entities.
#[derive(MMObject)]
struct LeakEntity {
    mesh: Handle<LeakMesh>,
    hp: u32,
}

/// The root: a level a script still holds at exit.
#[derive(MMObject)]
struct LeakLevel {
    entities: Vec<Handle<LeakEntity>>,
}

/// A manager holding `LEAKED` objects: 4 meshes, a level and its entities,
/// the level held by the returned raw handle.
fn leaky_manager() -> (ObjectManager, mmobject::RawHandle) {
    let mm = ObjectManager::builder().report_leaks(false).build();
    let meshes: Vec<_> = (0..4).map(|i| mm.create(LeakMesh { vertices: vec![[0.0; 3]; 16 << i] })).collect();
    let entities =
        (0..LEAKED - 5).map(|i| mm.create(LeakEntity { mesh: meshes[i % 4].clone(), hp: i as u32 })).collect();
    let raw = mm.create(LeakLevel { entities }).into_raw();
    drop(meshes);
    (mm, raw)
}

/// F1: `shutdown` with 100k leaked objects, then the report as text (the
/// same writer as the shutdown log); the text alone; and, as the peer, the
/// same 100k objects released and destroyed by `collect_garbage` before a
/// clean `shutdown` (the cost of destroying them, without any report).
/// Wall time; each iteration builds its manager first (not timed).
fn f1_leak_report(c: &mut Criterion) {
    let mut group = c.benchmark_group("F1_leak_report_100k");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    group.bench_function("shutdown_and_report", |b| {
        b.iter_batched(
            leaky_manager,
            |(mm, _raw)| {
                let report = mm.shutdown();
                assert_eq!(report.len(), LEAKED);
                black_box(report.to_string().len())
            },
            criterion::BatchSize::PerIteration,
        )
    });
    group.bench_function("report_text_only", |b| {
        let report = leaky_manager().0.shutdown();
        b.iter(|| black_box(report.to_string().len()))
    });
    group.bench_function("release_collect_shutdown_no_leaks", |b| {
        b.iter_batched(
            leaky_manager,
            |(mut mm, raw)| {
                mm.release_raw(raw).expect("held");
                mm.collect_garbage();
                black_box(mm.shutdown().len())
            },
            criterion::BatchSize::PerIteration,
        )
    });
    group.finish();
}

// ---- F2: cycle collection at 100k live objects, whole vs a budget per frame ----------

/// Nodes in F2's garbage cycles: two per 200 entities.
const F2_CYCLE_NODES: usize = 2 * (LEAKED - 1_005).div_ceil(200);

/// A node of F2's garbage cycles.
#[derive(MMObject)]
struct CycleNode {
    next: Option<Handle<CycleNode>>,
    payload: Payload,
}

/// About 100k live objects: the F1 level (held from outside) with 98,995
/// entities, and 495 garbage cycles of two nodes, interleaved with them.
/// The cycles' 990 nodes are the only candidate roots.
fn cyclic_manager() -> (ObjectManager, mmobject::RawHandle) {
    cyclic_manager_with(false)
}

/// As [`cyclic_manager`], with every entity a candidate root too (each lost
/// a handle and kept one): the collector's worst case, 100k candidates.
fn cyclic_manager_all_candidates() -> (ObjectManager, mmobject::RawHandle) {
    cyclic_manager_with(true)
}

fn cyclic_manager_with(all_candidates: bool) -> (ObjectManager, mmobject::RawHandle) {
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let meshes: Vec<_> = (0..4).map(|i| mm.create(LeakMesh { vertices: vec![[0.0; 3]; 16 << i] })).collect();
    let mut entities = Vec::with_capacity(LEAKED);
    for i in 0..LEAKED - 1_005 {
        entities.push(mm.create(LeakEntity { mesh: meshes[i % 4].clone(), hp: i as u32 }));
        if i % 200 == 0 {
            let a = mm.create(CycleNode { next: None, payload: payload(i) });
            let b = mm.create(CycleNode { next: Some(a.clone()), payload: payload(i) });
            mm[&a].next = Some(b);
        }
    }
    if all_candidates {
        entities.iter().for_each(|entity| drop(entity.clone()));
    }
    let raw = mm.create(LeakLevel { entities }).into_raw();
    drop(meshes);
    (mm, raw)
}

/// F2: freeing 495 two-node garbage cycles among 100k live objects:
/// `collect_cycles` at once (the peer), and `CycleCollector` steps of 1 ms
/// until a pass ends; plus one 1 ms step alone. The cycles' nodes are the
/// only candidate roots; the `all_candidates_` rows make every entity one
/// too (the worst case: each step must stay near its 1 ms). Wall time; the
/// manager is built outside the timing.
fn f2_cycles(c: &mut Criterion) {
    let setup = cyclic_manager;
    let mut group = c.benchmark_group("F2_cycles_100k");
    group.sample_size(10).measurement_time(Duration::from_secs(10));
    group.bench_function("collect_cycles_whole", |b| {
        b.iter_batched(
            setup,
            |(mut mm, raw)| {
                assert_eq!(mm.collect_cycles().objects, F2_CYCLE_NODES);
                (mm, raw)
            },
            criterion::BatchSize::PerIteration,
        )
    });
    // The same two rows with the cycles' nodes as the only candidates, then
    // with every entity a candidate too.
    for (prefix, setup) in [("collector", setup as fn() -> _), ("all_candidates", cyclic_manager_all_candidates)] {
        group.bench_function(format!("{prefix}_pass_in_1ms_steps"), |b| {
            b.iter_batched(
                setup,
                |(mut mm, raw)| {
                    let mut collector = mmobject::CycleCollector::new();
                    let mut freed = 0;
                    while collector.passes() == 0 {
                        freed += collector.step(&mut mm, Duration::from_millis(1)).collected.objects;
                    }
                    assert_eq!(freed, F2_CYCLE_NODES);
                    (mm, raw)
                },
                criterion::BatchSize::PerIteration,
            )
        });
        group.bench_function(format!("{prefix}_one_1ms_step"), |b| {
            b.iter_batched(
                setup,
                |(mut mm, raw)| {
                    let step = mmobject::CycleCollector::new().step(&mut mm, Duration::from_millis(1));
                    (mm, raw, step)
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    group.finish();
    let (mut mm, _raw) = setup();
    let mut collector = mmobject::CycleCollector::new();
    let mut steps = 0;
    while collector.passes() == 0 {
        collector.step(&mut mm, Duration::from_millis(1));
        steps += 1;
    }
    println!("F2: a pass in 1 ms steps took {steps} steps");
    let (mut mm, _raw) = cyclic_manager_all_candidates();
    let mut collector = mmobject::CycleCollector::new();
    let (mut steps, mut taken) = (0, 0);
    while collector.passes() == 0 {
        taken += collector.step(&mut mm, Duration::from_millis(1)).candidates;
        steps += 1;
    }
    println!("F2: with every entity a candidate, a pass took {steps} steps of 1 ms ({taken} candidates)");
}

/// O7: the per-frame passes over one type: read every object (`iter`), update
/// every object (`iter_mut`), and write two objects at once (`get_disjoint_mut`
/// on random pairs), against slotmap doing the same.
fn o7_iteration(c: &mut Criterion) {
    let mut group = c.benchmark_group("O7_iteration");
    group.throughput(Throughput::Elements(FRAME_LIVE as u64));
    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let handles: Vec<Handle<Obj>> = (0..FRAME_LIVE).map(|i| mm.create(Obj(payload(i)))).collect();
    let mut map: SlotMap<DefaultKey, Payload> = SlotMap::with_capacity(FRAME_LIVE);
    let keys: Vec<DefaultKey> = (0..FRAME_LIVE).map(|i| map.insert(payload(i))).collect();
    group.bench_function("mmobject_iter", |b| {
        b.iter(|| mm.iter::<Obj>().map(|(_, o)| o.0[1]).fold(0u64, u64::wrapping_add))
    });
    group.bench_function("slotmap_iter", |b| b.iter(|| map.iter().map(|(_, p)| p[1]).fold(0u64, u64::wrapping_add)));
    group.bench_function("mmobject_iter_mut", |b| {
        b.iter(|| {
            for (_, o) in mm.iter_mut::<Obj>() {
                o.0[0] = o.0[0].wrapping_add(o.0[1]);
            }
        })
    });
    group.bench_function("slotmap_iter_mut", |b| {
        b.iter(|| {
            for (_, p) in map.iter_mut() {
                p[0] = p[0].wrapping_add(p[1]);
            }
        })
    });
    // Random pairs of distinct objects, the same for both.
    let pairs: Vec<(u32, u32)> = {
        let mut rng = rng();
        (0..PICKS)
            .map(|_| {
                let a = rng.gen_range(0..FRAME_LIVE as u32);
                let b = (a + rng.gen_range(1..FRAME_LIVE as u32)) % FRAME_LIVE as u32;
                (a, b)
            })
            .collect()
    };
    group.throughput(Throughput::Elements(1));
    let mut at = 0usize;
    group.bench_function("mmobject_get_disjoint_mut_2", |b| {
        b.iter(|| {
            let (x, y) = pairs[at % PICKS];
            at += 1;
            let [p, q] = mm.get_disjoint_mut([&handles[x as usize], &handles[y as usize]]);
            std::mem::swap(&mut p.0[2], &mut q.0[2]);
        })
    });
    let mut at = 0usize;
    group.bench_function("slotmap_get_disjoint_mut_2", |b| {
        b.iter(|| {
            let (x, y) = pairs[at % PICKS];
            at += 1;
            let [p, q] = map.get_disjoint_mut([keys[x as usize], keys[y as usize]]).unwrap();
            std::mem::swap(&mut p[2], &mut q[2]);
        })
    });
    group.finish();
    drop(handles);
    mm.collect_garbage();
}

/// The criterion group, in a private module so its generated `pub fn` needs no docs.
mod harness {
    use super::*;

    criterion_group!(
        benches,
        o1_frame,
        o1b_load,
        o1c_unload,
        o2_clone_drop,
        o2b_clone_drop_other_thread,
        o2c_clone_each_frame,
        o3_strong_read,
        o4_weak_read,
        o5_collect,
        o6_threads,
        o7_iteration,
        o8_worker_creates,
        f1_leak_report,
        f2_cycles
    );
}

criterion_main!(harness::benches);
