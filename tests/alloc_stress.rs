//! Multi-threaded stress for the `Sync` allocators: threads allocate, write a pattern, hand
//! blocks to another thread over a channel, which checks the pattern and frees them.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::thread;

use crossbeam_channel::{unbounded, Receiver, Sender};
use mmobject::alloc::{AlignedAlloc, SizeClassPool, SmallObjectAllocator, SmallObjectConfig, SystemRaw};

const THREADS: usize = if cfg!(miri) { 2 } else { 4 };
const PER_THREAD: usize = if cfg!(miri) { 40 } else { 20_000 };

/// A block in flight between threads.
struct Block {
    ptr: NonNull<u8>,
    size: usize,
    fill: u8,
}

// SAFETY: a `Block` is the unique owner of its allocation while in flight; the allocators
// under test are `Sync`, so the block may be checked and freed on any thread.
unsafe impl Send for Block {}

/// Runs the ring: thread `t` allocates and sends to thread `t + 1`, which verifies and frees.
fn ring<A: Sync>(
    alloc: &A,
    try_alloc: impl Fn(&A, Layout) -> Option<NonNull<u8>> + Sync,
    free: impl Fn(&A, NonNull<u8>) + Sync,
) {
    let channels: Vec<(Sender<Block>, Receiver<Block>)> = (0..THREADS).map(|_| unbounded()).collect();
    thread::scope(|s| {
        for t in 0..THREADS {
            let tx = channels[(t + 1) % THREADS].0.clone();
            let rx = channels[t].1.clone();
            let (try_alloc, free) = (&try_alloc, &free);
            s.spawn(move || {
                let mut received = 0;
                for i in 0..PER_THREAD {
                    let size = 1 + (i * 7 + t * 13) % 120;
                    let fill = (i + t) as u8;
                    let ptr = loop {
                        if let Some(p) = try_alloc(alloc, Layout::from_size_align(size, 8).unwrap()) {
                            break p;
                        }
                        // Full: free what others sent us (if anything), then retry.
                        match rx.try_recv() {
                            Ok(b) => {
                                check_and_free(alloc, free, b);
                                received += 1;
                            }
                            Err(_) => thread::yield_now(),
                        }
                    };
                    // SAFETY: a fresh block of `size` bytes owned by this thread.
                    unsafe { ptr.as_ptr().write_bytes(fill, size) };
                    tx.send(Block { ptr, size, fill }).unwrap();
                    while let Ok(b) = rx.try_recv() {
                        check_and_free(alloc, free, b);
                        received += 1;
                    }
                }
                drop(tx);
                while received < PER_THREAD {
                    check_and_free(alloc, free, rx.recv().unwrap());
                    received += 1;
                }
            });
        }
    });
}

fn check_and_free<A>(alloc: &A, free: &impl Fn(&A, NonNull<u8>), b: Block) {
    // SAFETY: the block is ours (received over the channel) and was written before sending.
    let bytes = unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.size) };
    assert!(bytes.iter().all(|&x| x == b.fill), "a block was overwritten while in flight");
    free(alloc, b.ptr);
}

#[test]
fn size_class_pool_across_threads() {
    let pool = SizeClassPool::new(&[(8, 64), (16, 64), (32, 64), (64, 64), (128, 64)]);
    ring(
        &pool,
        |p, l| p.try_alloc(l).ok(),
        // SAFETY: each block is freed once, by the thread that received it.
        |p, ptr| unsafe { p.free(ptr) },
    );
    let st = pool.stats();
    assert_eq!((st.in_use, st.live), (0, 0));
    assert_eq!(st.allocations, (THREADS * PER_THREAD) as u64);
}

#[test]
fn small_object_allocator_across_threads() {
    // Small classes so some requests fall back to the system under contention.
    let small = SmallObjectAllocator::new(SmallObjectConfig { slots: [16, 16, 16, 16, 16, 16, 16] });
    ring(
        &small,
        |a, l| a.try_alloc(l).ok(),
        // SAFETY: each block is freed once, by the thread that received it.
        |a, ptr| unsafe { a.free(ptr) },
    );
    let st = small.stats();
    assert_eq!((st.in_use, st.live), (0, 0));
    assert_eq!(st.allocations, (THREADS * PER_THREAD) as u64);
}

#[test]
fn aligned_alloc_across_threads() {
    let aligned = AlignedAlloc::new(SystemRaw);
    ring(
        &aligned,
        |a, l| a.try_alloc(Layout::from_size_align(l.size(), 64).unwrap()).ok(),
        // SAFETY: each block is freed once, by the thread that received it.
        |a, ptr| unsafe { a.free(ptr) },
    );
    assert_eq!(aligned.stats().live, 0);
}

#[test]
fn shared_collections() {
    let pool = SizeClassPool::new(&[(64, 256), (256, 64), (1024, 32), (4096, 16)]);
    thread::scope(|s| {
        for t in 0..THREADS {
            let pool = &pool;
            s.spawn(move || {
                let mut v = allocator_api2::vec::Vec::new_in(pool);
                let mut m = hashbrown::HashMap::new_in(pool);
                for i in 0..if cfg!(miri) { 10 } else { 100 } {
                    v.push(i * t);
                    m.insert(i, t);
                }
                assert_eq!(m[&3], t);
                assert_eq!(v[3], 3 * t);
            });
        }
    });
    assert_eq!(pool.stats().in_use, 0);
}

/// Frees a block of the tests below, each freed once by the thread holding it.
fn free_once(pool: &SizeClassPool, ptr: NonNull<u8>) {
    // SAFETY: the callers pass each live block once.
    unsafe { pool.free(ptr) }
}

/// Larson-style: each thread keeps an array of live blocks and replaces random ones; every
/// few rounds the threads swap arrays, so most blocks are freed on a thread other than the
/// one that allocated them. Each block carries its fill byte, checked before it is freed.
#[test]
fn size_class_pool_larson() {
    use rand::{Rng, SeedableRng};
    const SLOTS: usize = if cfg!(miri) { 8 } else { 256 };
    const ROUNDS: usize = if cfg!(miri) { 3 } else { 40 };
    const STEPS: usize = if cfg!(miri) { 8 } else { 500 };
    let pool = SizeClassPool::new(&[(8, 4096), (16, 4096), (32, 2048), (64, 2048), (128, 1024), (256, 1024)]);
    type Batch = Vec<Block>;
    let channels: Vec<(Sender<Batch>, Receiver<Batch>)> = (0..THREADS).map(|_| unbounded()).collect();
    thread::scope(|s| {
        for t in 0..THREADS {
            let tx = channels[(t + 1) % THREADS].0.clone();
            let rx = channels[t].1.clone();
            let pool = &pool;
            s.spawn(move || {
                let mut rng = rand::rngs::SmallRng::seed_from_u64(t as u64);
                let alloc = |rng: &mut rand::rngs::SmallRng| {
                    let size = rng.gen_range(8..=256);
                    let fill = rng.gen::<u8>();
                    // Under a tight budget a class can run dry here while other threads'
                    // pages hold free blocks; they come back as those threads go on.
                    let ptr = loop {
                        match pool.try_alloc(Layout::from_size_align(size, 8).unwrap()) {
                            Ok(p) => break p,
                            Err(_) => thread::yield_now(),
                        }
                    };
                    // SAFETY: a fresh block of `size` bytes.
                    unsafe { ptr.as_ptr().write_bytes(fill, size) };
                    Block { ptr, size, fill }
                };
                let mut live: Vec<Block> = (0..SLOTS).map(|_| alloc(&mut rng)).collect();
                for _ in 0..ROUNDS {
                    for _ in 0..STEPS {
                        let i = rng.gen_range(0..SLOTS);
                        let fresh = alloc(&mut rng);
                        check_and_free(pool, &free_once, std::mem::replace(&mut live[i], fresh));
                    }
                    tx.send(live).unwrap();
                    live = rx.recv().unwrap();
                }
                for b in live {
                    check_and_free(pool, &free_once, b);
                }
            });
        }
    });
    let st = pool.stats();
    assert_eq!((st.in_use, st.live), (0, 0));
}

/// Producer / consumer: every free happens on the other thread.
#[test]
fn size_class_pool_producer_consumer() {
    let pool = SizeClassPool::new(&[(16, 256), (64, 256), (256, 128)]);
    let (tx, rx) = crossbeam_channel::bounded::<Block>(64);
    thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            for i in 0..THREADS * PER_THREAD {
                let size = [12, 50, 200][i % 3];
                let fill = i as u8;
                let ptr = loop {
                    match pool.try_alloc(Layout::from_size_align(size, 8).unwrap()) {
                        Ok(p) => break p,
                        Err(_) => thread::yield_now(), // the consumer is behind
                    }
                };
                // SAFETY: a fresh block of `size` bytes.
                unsafe { ptr.as_ptr().write_bytes(fill, size) };
                tx.send(Block { ptr, size, fill }).unwrap();
            }
        });
        s.spawn(move || {
            for b in rx {
                check_and_free(pool, &free_once, b);
            }
        });
    });
    let st = pool.stats();
    assert_eq!((st.in_use, st.live), (0, 0));
    assert_eq!(st.allocations, (THREADS * PER_THREAD) as u64);
}

/// Bad frees made on threads that do not own the block's page: foreign, interior and
/// double frees are all reported as errors there, and two threads freeing one block at
/// once succeed exactly once.
#[test]
fn size_class_pool_bad_frees_on_other_threads() {
    use mmobject::Error;
    let rounds = if cfg!(miri) { 3 } else { 500 };
    let pool = SizeClassPool::new(&[(8, 64), (64, 64)]);
    let mut outside = [0u64; 2];
    let foreign = outside.as_mut_ptr() as usize;
    for _ in 0..rounds {
        let p = pool.alloc(Layout::new::<[u8; 40]>());
        let addr = p.as_ptr() as usize;
        let results: Vec<_> = thread::scope(|s| {
            let pool = &pool;
            let frees: Vec<_> = (0..2)
                .map(|_| {
                    s.spawn(move || {
                        let ptr = |a: usize| NonNull::new(a as *mut u8).unwrap();
                        // SAFETY: the foreign and interior frees are caught before memory
                        // is touched; of the two racing frees of `addr`, one is the bug
                        // under test and is caught.
                        unsafe {
                            assert_eq!(pool.try_free(ptr(foreign)), Err(Error::ForeignPointer { addr: foreign }));
                            assert!(matches!(pool.try_free(ptr(addr + 8)), Err(Error::NotBlockStart { .. })));
                            pool.try_free(ptr(addr))
                        }
                    })
                })
                .collect();
            frees.into_iter().map(|t| t.join().unwrap()).collect()
        });
        assert_eq!(results.iter().filter(|r| r.is_ok()).count(), 1, "{results:?}");
        assert!(results.contains(&Err(Error::DoubleFree { addr })));
        // SAFETY: freed already: caught on the owner too.
        assert_eq!(unsafe { pool.try_free(p) }, Err(Error::DoubleFree { addr }));
    }
    // Every block is free exactly once: all 64 can be taken, and no 65th.
    let all: Vec<_> = (0..64).map(|_| pool.alloc(Layout::new::<[u8; 40]>())).collect();
    let mut sorted = all.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 64);
    assert!(pool.try_alloc(Layout::new::<[u8; 40]>()).is_err());
    for p in all {
        // SAFETY: ours, freed once.
        unsafe { pool.free(p) };
    }
    assert_eq!(pool.stats().live, 0);
}
