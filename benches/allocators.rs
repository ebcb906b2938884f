//! Allocator benchmarks A1–A5 (see `BENCHMARKS.md`). Each group runs our allocator and its
//! peers on the same workload, so criterion's report gives the ratio directly.
//!
//! Run: `cargo bench --bench allocators -- --warm-up-time 1 --measurement-time 3`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant};

use bumpalo::Bump;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use mimalloc::MiMalloc;
use mmobject::alloc::{FrameAllocator, SizeClassPool, SmallObjectAllocator, SmallObjectConfig, StackAllocator};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Live blocks kept in the steady-state ring (alloc one, free the oldest).
const RING: usize = 1024;
/// Allocations per frame in A3 and between markers in A4.
const PER_FRAME: usize = 1000;

/// Layouts in each list from [`layouts`]: a power of two, so the loops step through a list
/// with a mask. A `%` by the list's length (not a constant) compiled to a 64-bit `div`, whose
/// latency (up to ~40 cycles on Zen 1) sat on every loop's carried chain and added the same
/// nanoseconds to ours and to every peer.
const LAYOUTS: usize = 4096;

/// A fixed pseudo-random list of [`LAYOUTS`] layouts, sizes in `lo..=hi`, alignment 8.
fn layouts(lo: usize, hi: usize) -> Vec<Layout> {
    let mut rng = SmallRng::seed_from_u64(0x5EED);
    (0..LAYOUTS).map(|_| Layout::from_size_align(rng.gen_range(lo..=hi), 8).unwrap()).collect()
}

/// The steady-state loop shared by A1 and A2: each iteration frees the oldest of `RING` live
/// blocks and allocates a new one, so one iteration is one alloc + one free.
fn ring_bench(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    layouts: &[Layout],
    alloc: impl Fn(Layout) -> NonNull<u8>,
    free: impl Fn(NonNull<u8>, Layout),
) {
    assert_eq!(layouts.len(), LAYOUTS, "the loop steps through the layouts with a mask");
    let mut ring: Vec<(NonNull<u8>, Layout)> =
        (0..RING).map(|i| (alloc(layouts[i % LAYOUTS]), layouts[i % LAYOUTS])).collect();
    let (mut slot, mut next) = (0usize, 0usize);
    c.bench_function(name, |b| {
        b.iter(|| {
            let (old, old_layout) = ring[slot];
            free(old, old_layout);
            let layout = layouts[next];
            let p = alloc(layout);
            ring[slot] = (black_box(p), layout);
            slot = (slot + 1) % RING;
            next = (next + 1) % LAYOUTS;
        })
    });
    for (p, l) in ring {
        free(p, l);
    }
}

fn system_alloc(l: Layout) -> NonNull<u8> {
    // SAFETY: every layout in these benches has a non-zero size.
    NonNull::new(unsafe { GlobalAlloc::alloc(&System, l) }).expect("system out of memory")
}

fn system_free(p: NonNull<u8>, l: Layout) {
    // SAFETY: `p` came from `System.alloc(l)` and is freed once.
    unsafe { GlobalAlloc::dealloc(&System, p.as_ptr(), l) }
}

fn mimalloc_alloc(l: Layout) -> NonNull<u8> {
    // SAFETY: non-zero size, as above.
    NonNull::new(unsafe { GlobalAlloc::alloc(&MiMalloc, l) }).expect("mimalloc out of memory")
}

fn mimalloc_free(p: NonNull<u8>, l: Layout) {
    // SAFETY: `p` came from `MiMalloc.alloc(l)` and is freed once.
    unsafe { GlobalAlloc::dealloc(&MiMalloc, p.as_ptr(), l) }
}

/// The near-physical limit for a pool (BENCHMARKS.md): 64-byte slots in a `Vec<[u64; 8]>`
/// and a `Vec<u32>` of free indices. No checks, no stats, one size, one thread.
struct FreeListLimit {
    slots: Vec<[u64; 8]>,
    free: Vec<u32>,
}

impl FreeListLimit {
    fn new(n: usize) -> Self {
        FreeListLimit { slots: vec![[0; 8]; n], free: (0..n as u32).rev().collect() }
    }

    #[inline]
    fn alloc(&mut self) -> u32 {
        self.free.pop().expect("limit pool full")
    }

    #[inline]
    fn free(&mut self, i: u32) {
        self.free.push(i)
    }
}

/// A lock-free single size class, for the "lock vs lock-free" measurement behind
/// `SizeClassPool`'s design: a Treiber stack with a tagged head (32-bit ABA tag + 32-bit
/// index) and links in a side array of atomics (a lock-free pop cannot read an in-block link
/// without racing the new owner's writes), plus an atomic "handed out" bitmap for the
/// double-free check.
struct LockFreeClass {
    _memory: Vec<[u64; 8]>,
    base: NonNull<u8>,
    links: Box<[AtomicU32]>,
    bits: Box<[AtomicU64]>,
    head: AtomicU64,
}

impl LockFreeClass {
    const NIL: u32 = u32::MAX;

    fn new(n: usize) -> Self {
        let mut memory = vec![[0u64; 8]; n];
        let base = NonNull::new(memory.as_mut_ptr().cast::<u8>()).unwrap();
        let links = (0..n).map(|i| AtomicU32::new(if i + 1 < n { i as u32 + 1 } else { Self::NIL })).collect();
        let bits = (0..n.div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        LockFreeClass { _memory: memory, base, links, bits, head: AtomicU64::new(0) }
    }

    #[inline]
    fn alloc(&self) -> Option<NonNull<u8>> {
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            let index = head as u32;
            if index == Self::NIL {
                return None;
            }
            let next = self.links[index as usize].load(Ordering::Relaxed);
            let new = ((head >> 32) + 1) << 32 | next as u64;
            match self.head.compare_exchange_weak(head, new, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.bits[index as usize / 64].fetch_or(1 << (index % 64), Ordering::Relaxed);
                    // SAFETY: `index < n`, inside `_memory`.
                    return Some(unsafe { self.base.add(index as usize * 64) });
                }
                Err(h) => head = h,
            }
        }
    }

    #[inline]
    fn free(&self, p: NonNull<u8>) {
        let index = ((p.as_ptr() as usize - self.base.as_ptr() as usize) / 64) as u32;
        let old = self.bits[index as usize / 64].fetch_and(!(1 << (index % 64)), Ordering::Relaxed);
        assert!(old & (1 << (index % 64)) != 0, "double free");
        let mut head = self.head.load(Ordering::Relaxed);
        loop {
            self.links[index as usize].store(head as u32, Ordering::Relaxed);
            let new = ((head >> 32) + 1) << 32 | index as u64;
            match self.head.compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed) {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }
}

/// A1: `SizeClassPool` alloc + free, sizes 8–256 B mixed, 1,024 live blocks, one thread.
///
/// Peers: glibc `System` and mimalloc through `GlobalAlloc` (general allocators doing the same
/// mixed-size job), and the free-list pool limit (one 64-byte size, no checks: the floor for
/// any pool). Ours pays for its checks (the double-free bit, class lookup from the address)
/// and for being usable from any thread (a thread-local cache lookup keyed by the pool).
fn a1_size_class_pool(c: &mut Criterion) {
    let ls = layouts(8, 256);
    let mut g = c.benchmark_group("A1_size_class_pool_8_256B");
    g.throughput(Throughput::Elements(1));
    let pool = SizeClassPool::new(&[(8, 2048), (16, 2048), (32, 2048), (64, 2048), (128, 2048), (256, 2048)]);
    ring_bench(
        &mut g,
        "SizeClassPool",
        &ls,
        |l| pool.alloc(l),
        // SAFETY: every freed block came from this allocator's `alloc` and is freed once.
        |p, _| unsafe { pool.free(p) },
    );
    drop(pool);
    ring_bench(&mut g, "System", &ls, system_alloc, system_free);
    ring_bench(&mut g, "mimalloc", &ls, mimalloc_alloc, mimalloc_free);
    let mut limit = FreeListLimit::new(RING * 2);
    let mut ring: Vec<u32> = (0..RING).map(|_| limit.alloc()).collect();
    let mut slot = 0;
    g.bench_function("free_list_limit_64B", |b| {
        b.iter(|| {
            limit.free(ring[slot]);
            let i = limit.alloc();
            limit.slots[i as usize][0] = 1;
            ring[slot] = black_box(i);
            slot = (slot + 1) % RING;
        })
    });
    g.finish();
}

/// How many blocks A1f keeps live.
const FRAGMENTED_LIVE: usize = 200_000;

/// 65,536 random indices below [`FRAGMENTED_LIVE`], from `seed`: the blocks A1f and A1i
/// replace, in turn.
fn fragmented_picks(seed: u64) -> Vec<u32> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..1 << 16).map(|_| rng.gen_range(0..FRAGMENTED_LIVE as u32)).collect()
}

/// A1f: a long-lived, fragmented class. 200k live 64-byte blocks (a particle or entity
/// pool), each step frees one at random and allocates one in its place: every page of the
/// class is full but for scattered free blocks. Until the thirty-fifth session a refill
/// here scanned every page the thread owned to find one or two blocks (24 µs a step; see
/// BENCHMARKS.md).
fn a1f_fragmented(c: &mut Criterion) {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("A1f_fragmented_200k_live_64B");
    g.throughput(Throughput::Elements(1));
    let picks = fragmented_picks(0xF4A6);
    let pool = SizeClassPool::new(&[(64, FRAGMENTED_LIVE * 2)]);
    fragmented_bench(
        &mut g,
        "SizeClassPool",
        &picks,
        || pool.alloc(layout),
        |p| {
            // SAFETY: every freed block came from this pool's `alloc` and is freed once.
            unsafe { pool.free(p) }
        },
    );
    drop(pool);
    fragmented_bench(&mut g, "System", &picks, || system_alloc(layout), |p| system_free(p, layout));
    fragmented_bench(&mut g, "mimalloc", &picks, || mimalloc_alloc(layout), |p| mimalloc_free(p, layout));
    g.finish();
}

/// A1s: a full class. 200k live 64-byte blocks fill their class; a ring of 1,000 more
/// 64-byte requests spills to the 128-byte class (each a fallback), or, for
/// `SmallObjectAllocator`, to the system. Until the thirty-fifth session every spilled
/// request visited every page of the full class (13 µs a step), or every bitmap word
/// (6 µs; see BENCHMARKS.md). The peers just allocate 64 bytes with the same 200k live.
fn a1s_full_class(c: &mut Criterion) {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("A1s_full_class_spills_200k_live_64B");
    g.throughput(Throughput::Elements(1));
    let pool = SizeClassPool::new(&[(64, FRAGMENTED_LIVE), (128, 4096)]);
    spill_bench(
        &mut g,
        "SizeClassPool",
        || pool.alloc(layout),
        |p| {
            // SAFETY: every freed block came from this pool's `alloc` and is freed once.
            unsafe { pool.free(p) }
        },
    );
    assert!(pool.stats().fallbacks > 0, "the ring's requests spilled");
    drop(pool);
    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [0, 0, 0, 0, FRAGMENTED_LIVE, 0, 0] });
    spill_bench(
        &mut g,
        "SmallObjectAllocator",
        || small.alloc(layout),
        |p| {
            // SAFETY: every freed block came from this allocator's `alloc` and is freed once.
            unsafe { small.free(p) }
        },
    );
    assert!(small.stats().fallbacks > 0, "the ring's requests went to the system");
    drop(small);
    spill_bench(&mut g, "System", || system_alloc(layout), |p| system_free(p, layout));
    spill_bench(&mut g, "mimalloc", || mimalloc_alloc(layout), |p| mimalloc_free(p, layout));
    g.finish();
}

/// A1i: a thread that lives on blocks another, idle thread owns. A loader thread takes all
/// 200k 64-byte blocks of the class (every page becomes its own) and then idles; this
/// thread frees one of them at random each step and allocates one, which it can only
/// claim from the remote masks of the loader's pages. Until the thirty-sixth session each
/// such request visited every page of the class three times (8–13 µs a step; see
/// BENCHMARKS.md). The peers run the same pattern.
fn a1i_idle_owner(c: &mut Criterion) {
    let layout = Layout::from_size_align(64, 8).unwrap();
    let mut g = c.benchmark_group("A1i_idle_owner_200k_64B");
    g.throughput(Throughput::Elements(1));
    let picks = fragmented_picks(0x1D1E);
    let pool = SizeClassPool::new(&[(64, FRAGMENTED_LIVE)]);
    idle_owner_bench(
        &mut g,
        "SizeClassPool",
        &picks,
        || pool.alloc(layout),
        |p| {
            // SAFETY: every freed block came from this pool's `alloc` and is freed once.
            unsafe { pool.free(p) }
        },
    );
    assert_eq!(pool.stats().live, 0);
    drop(pool);
    idle_owner_bench(&mut g, "System", &picks, || system_alloc(layout), |p| system_free(p, layout));
    idle_owner_bench(&mut g, "mimalloc", &picks, || mimalloc_alloc(layout), |p| mimalloc_free(p, layout));
    g.finish();
}

/// One A1i row: another thread takes [`FRAGMENTED_LIVE`] blocks from `alloc` and idles
/// until the row ends; each step here frees the block `picks` names next and allocates
/// one in its place.
fn idle_owner_bench(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    picks: &[u32],
    alloc: impl Fn() -> NonNull<u8> + Sync,
    free: impl Fn(NonNull<u8>),
) {
    let block = |addr: usize| NonNull::new(addr as *mut u8).expect("a block's address");
    let (send, taken) = std::sync::mpsc::channel::<Vec<usize>>();
    let (done, idle) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let alloc = &alloc;
        s.spawn(move || {
            send.send((0..FRAGMENTED_LIVE).map(|_| alloc().as_ptr() as usize).collect()).unwrap();
            let _ = idle.recv();
        });
        let mut live = taken.recv().unwrap();
        let mut at = 0usize;
        g.bench_function(name, |b| {
            b.iter(|| {
                let i = picks[at] as usize;
                at = (at + 1) % picks.len();
                free(block(live[i]));
                live[i] = black_box(alloc()).as_ptr() as usize;
            })
        });
        for &p in &live {
            free(block(p));
        }
        drop(done);
    });
}

/// One A1s row: [`FRAGMENTED_LIVE`] blocks held from `alloc`, then a ring of 1,000 more,
/// each step freeing the oldest and allocating one.
fn spill_bench(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    alloc: impl Fn() -> NonNull<u8>,
    free: impl Fn(NonNull<u8>),
) {
    let held: Vec<NonNull<u8>> = (0..FRAGMENTED_LIVE).map(|_| alloc()).collect();
    let mut ring: Vec<NonNull<u8>> = (0..1000).map(|_| alloc()).collect();
    let mut at = 0usize;
    g.bench_function(name, |b| {
        b.iter(|| {
            free(ring[at]);
            ring[at] = black_box(alloc());
            at = (at + 1) % ring.len();
        })
    });
    for p in held.into_iter().chain(ring) {
        free(p);
    }
}

/// One A1f row: [`FRAGMENTED_LIVE`] blocks from `alloc`, then each step replaces the block
/// `picks` names next.
fn fragmented_bench(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    picks: &[u32],
    alloc: impl Fn() -> NonNull<u8>,
    free: impl Fn(NonNull<u8>),
) {
    let mut live: Vec<NonNull<u8>> = (0..FRAGMENTED_LIVE).map(|_| alloc()).collect();
    let mut at = 0usize;
    g.bench_function(name, |b| {
        b.iter(|| {
            let i = picks[at] as usize;
            at = (at + 1) % picks.len();
            free(live[i]);
            live[i] = black_box(alloc());
        })
    });
    for p in live {
        free(p);
    }
}

/// A1b: the same steady state with one 64-byte size: `SizeClassPool` (per-thread pages)
/// against a lock-free tagged-head class (bench-local prototype of the design it replaced
/// the per-class lock with; kept as a reference point).
fn a1b_lock_vs_lock_free(c: &mut Criterion) {
    let ls = vec![Layout::from_size_align(64, 8).unwrap(); LAYOUTS];
    let mut g = c.benchmark_group("A1b_lock_vs_lock_free_64B");
    g.throughput(Throughput::Elements(1));
    let pool = SizeClassPool::new(&[(64, 4096)]);
    ring_bench(
        &mut g,
        "SizeClassPool",
        &ls,
        |l| pool.alloc(l),
        // SAFETY: every freed block came from this allocator's `alloc` and is freed once.
        |p, _| unsafe { pool.free(p) },
    );
    let lock_free = LockFreeClass::new(4096);
    ring_bench(&mut g, "lock_free_tagged_head", &ls, |_| lock_free.alloc().unwrap(), |p, _| lock_free.free(p));
    g.finish();
}

/// The allocators the threaded benches compare, behind one interface.
trait BenchAlloc: Sync {
    fn alloc(&self, l: Layout) -> NonNull<u8>;
    fn free(&self, p: NonNull<u8>, l: Layout);
}

impl BenchAlloc for SizeClassPool {
    #[inline]
    fn alloc(&self, l: Layout) -> NonNull<u8> {
        SizeClassPool::alloc(self, l)
    }

    #[inline]
    fn free(&self, p: NonNull<u8>, _: Layout) {
        // SAFETY: the benches free each block they allocated once.
        unsafe { SizeClassPool::free(self, p) }
    }
}

impl BenchAlloc for System {
    #[inline]
    fn alloc(&self, l: Layout) -> NonNull<u8> {
        system_alloc(l)
    }

    #[inline]
    fn free(&self, p: NonNull<u8>, l: Layout) {
        system_free(p, l)
    }
}

impl BenchAlloc for MiMalloc {
    #[inline]
    fn alloc(&self, l: Layout) -> NonNull<u8> {
        mimalloc_alloc(l)
    }

    #[inline]
    fn free(&self, p: NonNull<u8>, l: Layout) {
        mimalloc_free(p, l)
    }
}

/// A block in flight between bench threads (an address, so it is `Send`).
#[derive(Clone, Copy)]
struct Sent(usize, Layout);

impl Sent {
    fn ptr(self) -> NonNull<u8> {
        NonNull::new(self.0 as *mut u8).expect("a live block")
    }
}

/// Live blocks per thread in A1t.
const LARSON_SLOTS: usize = 256;

/// One A1t run of `ops` alloc + free pairs over `threads` threads; returns the time between
/// the start barrier and the moment every thread is done (set-up and tear-down excluded).
fn larson<A: BenchAlloc>(alloc: &A, threads: usize, ops: u64, ls: &[Layout]) -> Duration {
    assert_eq!(ls.len(), LAYOUTS, "the threads step through the layouts with a mask");
    let rounds = (ops as usize / threads).div_ceil(LARSON_SLOTS).max(1);
    let (start, done) = (Barrier::new(threads + 1), Barrier::new(threads + 1));
    let channels: Vec<_> = (0..threads).map(|_| crossbeam_channel::unbounded::<Vec<Sent>>()).collect();
    thread::scope(|s| {
        for t in 0..threads {
            let (tx, rx) = (channels[(t + 1) % threads].0.clone(), channels[t].1.clone());
            let (start, done) = (&start, &done);
            s.spawn(move || {
                let mut next = t * 977;
                let mut take = || {
                    next = (next + 1) % LAYOUTS;
                    ls[next]
                };
                let mut live: Vec<Sent> = (0..LARSON_SLOTS)
                    .map(|_| {
                        let l = take();
                        Sent(alloc.alloc(l).as_ptr() as usize, l)
                    })
                    .collect();
                start.wait();
                for _ in 0..rounds {
                    // Replace every block once, then pass the array on: with two threads or
                    // more, every free is of a block another thread allocated.
                    for slot in live.iter_mut() {
                        alloc.free(slot.ptr(), slot.1);
                        let l = take();
                        *slot = Sent(black_box(alloc.alloc(l)).as_ptr() as usize, l);
                    }
                    tx.send(live).unwrap();
                    live = rx.recv().unwrap();
                }
                done.wait();
                for slot in live {
                    alloc.free(slot.ptr(), slot.1);
                }
            });
        }
        start.wait();
        let began = Instant::now();
        done.wait();
        began.elapsed()
    })
}

/// A1t: larson-style, 1, 2 and 4 threads, sizes 8–256 B, 256 live blocks per thread;
/// each round replaces every block of a thread's array and passes the array to the next
/// thread, so with 2+ threads every free is of a block allocated on another thread.
/// Throughput is alloc + free pairs (all threads together).
///
/// Peers: `System` and mimalloc doing the same job in the same run.
fn a1t_larson(c: &mut Criterion) {
    let ls = layouts(8, 256);
    let mut g = c.benchmark_group("A1t_larson_8_256B");
    g.throughput(Throughput::Elements(1));
    let pool = SizeClassPool::new(&[(8, 4096), (16, 4096), (32, 4096), (64, 4096), (128, 4096), (256, 4096)]);
    for threads in [1, 2, 4] {
        g.bench_with_input(BenchmarkId::new("SizeClassPool", threads), &threads, |b, &n| {
            b.iter_custom(|ops| larson(&pool, n, ops, &ls))
        });
        g.bench_with_input(BenchmarkId::new("System", threads), &threads, |b, &n| {
            b.iter_custom(|ops| larson(&System, n, ops, &ls))
        });
        g.bench_with_input(BenchmarkId::new("mimalloc", threads), &threads, |b, &n| {
            b.iter_custom(|ops| larson(&MiMalloc, n, ops, &ls))
        });
    }
    g.finish();
    assert_eq!(pool.stats().live, 0);
}

/// One A1x run: a producer allocates `ops` blocks in batches of 64 and a consumer frees
/// them; returns the time until the consumer has freed the last.
fn producer_consumer<A: BenchAlloc>(alloc: &A, ops: u64, ls: &[Layout]) -> Duration {
    assert_eq!(ls.len(), LAYOUTS, "the producer steps through the layouts with a mask");
    const BATCH: usize = 64;
    let (tx, rx) = crossbeam_channel::bounded::<Vec<Sent>>(16);
    let began = Instant::now();
    thread::scope(|s| {
        s.spawn(move || {
            let mut left = ops as usize;
            let mut next = 0;
            while left > 0 {
                let n = left.min(BATCH);
                let batch = (0..n)
                    .map(|_| {
                        next = (next + 1) % LAYOUTS;
                        Sent(black_box(alloc.alloc(ls[next])).as_ptr() as usize, ls[next])
                    })
                    .collect();
                tx.send(batch).unwrap();
                left -= n;
            }
        });
        s.spawn(move || {
            for batch in rx {
                for b in batch {
                    alloc.free(b.ptr(), b.1);
                }
            }
        });
    });
    began.elapsed()
}

/// A1x: producer / consumer, sizes 8–256 B: one thread allocates, another frees every block
/// (batches of 64 over a bounded channel, at most 1,088 in flight). Throughput is blocks.
///
/// Peers: `System` and mimalloc in the same run.
fn a1x_producer_consumer(c: &mut Criterion) {
    let ls = layouts(8, 256);
    let mut g = c.benchmark_group("A1x_producer_consumer_8_256B");
    g.throughput(Throughput::Elements(1));
    let pool = SizeClassPool::new(&[(8, 4096), (16, 4096), (32, 4096), (64, 4096), (128, 4096), (256, 4096)]);
    g.bench_function("SizeClassPool", |b| b.iter_custom(|ops| producer_consumer(&pool, ops, &ls)));
    g.bench_function("System", |b| b.iter_custom(|ops| producer_consumer(&System, ops, &ls)));
    g.bench_function("mimalloc", |b| b.iter_custom(|ops| producer_consumer(&MiMalloc, ops, &ls)));
    g.finish();
    assert_eq!(pool.stats().live, 0);
}

/// A2: `SmallObjectAllocator` alloc + free, sizes 8–128 B mixed, with every class about half
/// full and its free slots scattered (allocate all, free a random half) before measuring.
///
/// Peers: `System` and mimalloc, the general allocators a small-object allocator replaces.
fn a2_small_object(c: &mut Criterion) {
    let ls = layouts(8, 128);
    let mut g = c.benchmark_group("A2_small_object_8_128B_half_full");
    g.throughput(Throughput::Elements(1));
    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [4096; 7] });
    let mut rng = SmallRng::seed_from_u64(7);
    let mut filler = Vec::new();
    for (i, &size) in [8usize, 16, 32, 48, 64, 96, 128].iter().enumerate() {
        let l = Layout::from_size_align(size, 8).unwrap();
        let all: Vec<_> = (0..4096).map(|_| small.alloc(l)).collect();
        for p in all {
            if rng.gen_bool(0.5) {
                // SAFETY: ours, freed once.
                unsafe { small.free(p) };
            } else {
                filler.push(p);
            }
        }
        assert_eq!(small.stats().fallbacks, 0, "class {i} overflowed while filling");
    }
    // SAFETY (in the closure): every freed block came from `small.alloc` and is freed once.
    ring_bench(
        &mut g,
        "SmallObjectAllocator",
        &ls,
        |l| small.alloc(l),
        // SAFETY: every freed block came from this allocator's `alloc` and is freed once.
        |p, _| unsafe { small.free(p) },
    );
    ring_bench(&mut g, "System", &ls, system_alloc, system_free);
    ring_bench(&mut g, "mimalloc", &ls, mimalloc_alloc, mimalloc_free);
    g.finish();
    assert_eq!(small.stats().fallbacks, 0, "the measured loop stayed inside the region");
    for p in filler {
        // SAFETY: ours, freed once.
        unsafe { small.free(p) };
    }
}

/// A3: `FrameAllocator`: 1,000 allocations of a 64-byte value, then `reset`, per frame.
/// Throughput is per allocation (the reset is amortised over the frame).
///
/// Peer: bumpalo `alloc` + `reset`, the standard Rust bump arena doing the same job (it also
/// never drops values and also resets in O(1)); both have a region large enough for a frame.
fn a3_frame(c: &mut Criterion) {
    let mut g = c.benchmark_group("A3_frame_alloc_64B_and_reset");
    g.throughput(Throughput::Elements(PER_FRAME as u64));
    let mut frame = FrameAllocator::with_capacity(PER_FRAME * 64);
    g.bench_function(BenchmarkId::new("FrameAllocator", PER_FRAME), |b| {
        b.iter(|| {
            for i in 0..PER_FRAME {
                black_box(frame.alloc([i as u64; 8]));
            }
            frame.reset();
        })
    });
    let mut bump = Bump::with_capacity(PER_FRAME * 64);
    g.bench_function(BenchmarkId::new("bumpalo", PER_FRAME), |b| {
        b.iter(|| {
            for i in 0..PER_FRAME {
                black_box(bump.alloc([i as u64; 8]));
            }
            bump.reset();
        })
    });
    g.finish();
}

/// A4: `StackAllocator`: take a marker, 1,000 allocations of a 64-byte value, free to the
/// marker (one level of a level-load stack).
///
/// Peer: bumpalo `alloc` + `reset` (bumpalo has no markers; `reset` is its way back to a
/// known point, and is the closest equivalent of freeing to the bottom marker).
///
/// Both lay their blocks out alike: an 8-byte block first (below the blocks in the stack,
/// above them in bumpalo, which bumps downwards), so every 64-byte block starts 8 bytes
/// into a cache line in both. Bumpalo's `reset` drops its 8 bytes, so it allocates them
/// again each frame (one allocation in 1,001). Where the blocks sit moves both by 10–15 %
/// on some hosts (BENCHMARKS.md, A4), so a peer laid out differently measures the layout.
fn a4_stack(c: &mut Criterion) {
    let mut g = c.benchmark_group("A4_stack_alloc_64B_free_to_marker");
    g.throughput(Throughput::Elements(PER_FRAME as u64));
    let mut stack = StackAllocator::with_capacity(PER_FRAME * 64 + 64);
    stack.alloc(0u64); // something below the marker
    g.bench_function(BenchmarkId::new("StackAllocator", PER_FRAME), |b| {
        b.iter(|| {
            let m = stack.marker();
            for i in 0..PER_FRAME {
                black_box(stack.alloc([i as u64; 8]));
            }
            stack.free_to_marker(m);
        })
    });
    let mut bump = Bump::with_capacity(PER_FRAME * 64 + 64);
    g.bench_function(BenchmarkId::new("bumpalo", PER_FRAME), |b| {
        b.iter(|| {
            black_box(bump.alloc(0u64)); // the stack's 8 bytes, at the other end
            for i in 0..PER_FRAME {
                black_box(bump.alloc([i as u64; 8]));
            }
            bump.reset();
        })
    });
    g.finish();
}

/// A5: an `allocator_api2` `Vec<u8>` pushed to 4 KB in a `FrameAllocator`, then `reset`.
/// The Vec is the last block, so every growth is in place; the bytes the frame holds at the
/// end (the A5 target, at most 1.1× the final 4,096) are printed once, and checked in
/// `tests/alloc_collections.rs`.
///
/// Peer: the same `Vec` in a bumpalo `Bump` (whose `grow` is also in place for the last
/// block), then `reset`.
fn a5_vec_grow(c: &mut Criterion) {
    const BYTES: usize = 4096;
    let mut g = c.benchmark_group("A5_vec_grow_to_4KB");
    g.throughput(Throughput::Bytes(BYTES as u64));
    let mut frame = FrameAllocator::with_capacity(4 * BYTES);
    {
        let mut v = allocator_api2::vec::Vec::new_in(&frame);
        v.extend((0..BYTES).map(|i| i as u8));
        eprintln!("A5: a {BYTES}-byte Vec holds {} bytes of the frame", frame.allocated_bytes());
    }
    frame.reset();
    g.bench_function(BenchmarkId::new("FrameAllocator", BYTES), |b| {
        b.iter(|| {
            {
                let mut v = allocator_api2::vec::Vec::new_in(&frame);
                for i in 0..BYTES {
                    v.push(i as u8);
                }
                black_box(&v);
            }
            frame.reset();
        })
    });
    let mut bump = Bump::with_capacity(4 * BYTES);
    g.bench_function(BenchmarkId::new("bumpalo", BYTES), |b| {
        b.iter(|| {
            {
                let mut v = allocator_api2::vec::Vec::new_in(&bump);
                for i in 0..BYTES {
                    v.push(i as u8);
                }
                black_box(&v);
            }
            bump.reset();
        })
    });
    g.finish();
}

/// The generated group function carries no docs of its own.
#[allow(missing_docs)]
mod run {
    use super::*;
    criterion_group!(
        benches,
        a1_size_class_pool,
        a1f_fragmented,
        a1s_full_class,
        a1i_idle_owner,
        a1b_lock_vs_lock_free,
        a1t_larson,
        a1x_producer_consumer,
        a2_small_object,
        a3_frame,
        a4_stack,
        a5_vec_grow
    );
}
criterion_main!(run::benches);
