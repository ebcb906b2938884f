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
