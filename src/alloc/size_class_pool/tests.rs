//! Unit tests of the size-class pool.

use super::*;
use proptest::prelude::*;

fn small() -> SizeClassPool {
    SizeClassPool::new(&[(8, 16), (16, 8), (64, 4), (256, 2), (4096, 2), (8192, 1)])
}

#[test]
fn default_total() {
    let total: usize = DEFAULT_CLASSES.iter().map(|(s, c)| s * c).sum();
    assert_eq!(total, 8_716_288);
    if !cfg!(miri) {
        let pool = SizeClassPool::default();
        assert_eq!(pool.capacity(), total);
        assert_eq!(pool.class_stats().len(), 18);
    }
}

#[test]
fn classes_alignment_and_zero_size() {
    let pool = small();
    for (size, align) in [(0, 1), (1, 1), (9, 8), (8, 64), (10, 4096), (5000, 4096)] {
        let p = pool.alloc(Layout::from_size_align(size, align).unwrap());
        assert_eq!(p.as_ptr() as usize % align, 0);
    }
    assert_eq!(
        pool.try_alloc(Layout::from_size_align(8, 8192).unwrap()),
        Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
    );
    assert!(matches!(
        pool.try_alloc(Layout::from_size_align(9000, 8).unwrap()),
        Err(Error::OutOfMemory { requested: 9000, available: 0 })
    ));
}

#[test]
fn falls_back_to_larger_class_then_fails() {
    let pool = SizeClassPool::new(&[(8, 1), (16, 1)]);
    let a = pool.alloc(Layout::new::<u8>());
    let b = pool.alloc(Layout::new::<u8>());
    assert_eq!(pool.stats().fallbacks, 1);
    assert_eq!(pool.try_alloc(Layout::new::<u8>()), Err(Error::OutOfMemory { requested: 1, available: 0 }));
    let st = pool.stats();
    assert_eq!((st.in_use, st.peak, st.live, st.failures), (24, 24, 2, 1));
    // SAFETY: both blocks are ours and unused afterwards.
    unsafe {
        pool.free(a);
        pool.free(b);
    }
    assert_eq!(pool.stats().in_use, 0);
}

#[test]
fn bad_frees() {
    let pool = small();
    let p = pool.alloc(Layout::new::<[u8; 64]>());
    let mut outside = 0u64;
    let outside = NonNull::from(&mut outside).cast::<u8>();
    // SAFETY: each bad free is detected before memory is touched; `p` is ours.
    unsafe {
        assert_eq!(pool.try_free(outside), Err(Error::ForeignPointer { addr: outside.as_ptr() as usize }));
        assert_eq!(
            pool.try_free(p.add(3)),
            Err(Error::NotBlockStart { addr: p.as_ptr() as usize + 3, block_start: p.as_ptr() as usize })
        );
        pool.free(p);
        assert_eq!(pool.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
        // A never-used block is "not handed out" too.
        let q = pool.alloc(Layout::new::<[u8; 64]>());
        assert_eq!(q, p, "LIFO reuse");
        assert_eq!(pool.try_free(q.add(64)), Err(Error::DoubleFree { addr: q.as_ptr() as usize + 64 }));
        pool.free(q);
    }
}

#[test]
fn padding_between_classes_is_foreign() {
    // The 16-byte class fills bytes 0..16; the 8-byte class starts on the next granule.
    let pool = SizeClassPool::new(&[(8, 3), (16, 1)]);
    assert_eq!(pool.capacity(), 40);
    let a = pool.alloc(Layout::new::<u64>());
    let base = a.as_ptr() as usize - GRANULE;
    // Unaligned ones too: the one-compare check must not take them for blocks.
    let a_addr = a.as_ptr() as usize;
    for addr in [base + 16, base + 17, base + GRANULE - 8, base + GRANULE - 1, a_addr + 24, a_addr + 25, a_addr + 32] {
        let p = NonNull::new(addr as *mut u8).unwrap();
        // SAFETY: not blocks of the pool: refused before memory is touched.
        assert_eq!(unsafe { pool.try_free(p) }, Err(Error::ForeignPointer { addr }));
    }
    // SAFETY: ours, freed once.
    unsafe { pool.free(a) };
}

#[test]
fn addresses_a_table_span_from_a_block_are_foreign() {
    // The free's page lookup wraps granule numbers around the table: an address one whole
    // table span above or below a block lands on that block's page, and must be refused.
    let pool = small();
    let span = pool.map.span();
    for class in pool.class_stats() {
        let p = pool.alloc(Layout::from_size_align(class.block_size, 8).unwrap());
        for alias in [p.as_ptr().wrapping_add(span), p.as_ptr().wrapping_sub(span)] {
            let alias = NonNull::new(alias).unwrap();
            // SAFETY: not the pool's (the error under test); never dereferenced.
            let refused = unsafe { pool.try_free(alias) };
            let addr = alias.as_ptr() as usize;
            assert_eq!(refused, Err(Error::ForeignPointer { addr }), "{}-byte class", class.block_size);
        }
        assert_eq!(pool.stats().live, 1, "the block itself stays handed out");
        // SAFETY: ours, freed once.
        unsafe { pool.free(p) };
    }
}

#[test]
fn peak_is_the_most_blocks_out_at_once() {
    let pool = SizeClassPool::new(&[(8, 64)]);
    let blocks: Vec<_> = (0..5).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    // SAFETY: ours, each freed once.
    unsafe {
        for &p in &blocks[1..4] {
            pool.free(p);
        }
    }
    let again: Vec<_> = (0..3).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    let st = pool.stats();
    assert_eq!((st.in_use, st.peak, st.allocations), (5 * 8, 5 * 8, 8));
    let extra = pool.alloc(Layout::new::<u8>());
    assert_eq!(pool.stats().peak, 6 * 8);
    // SAFETY: ours, each freed once.
    unsafe {
        for p in again.into_iter().chain([blocks[0], blocks[4], extra]) {
            pool.free(p);
        }
    }
    assert_eq!(pool.class_stats()[0].peak, 6);
}

#[test]
fn refill_takes_the_own_page_with_the_most_free_blocks() {
    let pool = SizeClassPool::new(&[(8, 256)]); // 4 pages of 64 blocks
    let blocks: Vec<_> = (0..192).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    let page_of = |p: NonNull<u8>| blocks.iter().position(|&b| b == p).map(|i| i / 64);
    // SAFETY: ours, each freed once.
    unsafe {
        for i in std::iter::once(0).chain(64..74) {
            pool.free(blocks[i]);
        }
    }
    // The active page (the third) is full: the refill picks the second page (10 free
    // blocks) over the first (1).
    let p = pool.alloc(Layout::new::<u8>());
    assert_eq!(page_of(p), Some(1));
    // SAFETY: ours, each freed once.
    unsafe {
        pool.free(p);
        for (i, &b) in blocks.iter().enumerate() {
            if i != 0 && !(64..74).contains(&i) {
                pool.free(b);
            }
        }
    }
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn refills_take_the_pages_a_scan_found_before_scanning_again() {
    let pool = SizeClassPool::new(&[(8, 512)]); // 8 pages of 64 blocks
    let blocks: Vec<_> = (0..256).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    let page_of = |p: NonNull<u8>| blocks.iter().position(|&b| b == p).map(|i| i / 64);
    let freed = |i: usize| (0..4).contains(&i) || (64..69).contains(&i) || (128..137).contains(&i);
    // SAFETY: ours, each freed once (the ones taken again are freed at the end).
    unsafe {
        for &b in blocks[0..4].iter().chain(&blocks[64..69]) {
            pool.free(b);
        }
    }
    // The scan finds 9 free blocks on 4 pages (not scarce: no fresh page) and takes the
    // second page (5 free); the first (4 free) waits in the ready list.
    let mut again: Vec<_> = (0..5).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    assert!(again.iter().all(|&p| page_of(p) == Some(1)));
    // SAFETY: as above.
    unsafe {
        for &b in &blocks[128..137] {
            pool.free(b);
        }
    }
    // The third page now has the most free blocks (9), but the refill takes the ready
    // page without scanning; the one after that scans and finds the third (9 free
    // blocks on 4 pages: not scarce either).
    let from_ready: Vec<_> = (0..4).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    assert!(from_ready.iter().all(|&p| page_of(p) == Some(0)));
    let third = pool.alloc(Layout::new::<u8>());
    assert_eq!(page_of(third), Some(2));
    again.extend(from_ready);
    again.push(third);
    // SAFETY: as above: every block still handed out, once.
    unsafe {
        for p in again {
            pool.free(p);
        }
        for (i, &b) in blocks.iter().enumerate() {
            if !freed(i) {
                pool.free(b);
            }
        }
    }
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn a_scan_that_finds_scattered_free_blocks_takes_a_fresh_page_too() {
    let pool = SizeClassPool::new(&[(8, 512)]); // 8 pages of 64 blocks
    let blocks: Vec<_> = (0..384).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    let page_of = |p: NonNull<u8>| blocks.iter().position(|&b| b == p).map(|i| i / 64);
    // SAFETY: ours, each freed once.
    unsafe {
        pool.free(blocks[0]);
        pool.free(blocks[64]);
    }
    // 2 free blocks on 6 pages: the scan takes a fresh page, and keeps the two.
    let fresh: Vec<_> = (0..64).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    assert!(fresh.iter().all(|&p| page_of(p).is_none()), "all from the fresh page");
    let kept: Vec<_> = (0..2).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    let mut pages: Vec<_> = kept.iter().map(|&p| page_of(p)).collect();
    pages.sort();
    assert_eq!(pages, [Some(0), Some(1)]);
    // SAFETY: as above.
    unsafe {
        for p in fresh.into_iter().chain(kept) {
            pool.free(p);
        }
        for (i, &b) in blocks.iter().enumerate() {
            if i != 0 && i != 64 {
                pool.free(b);
            }
        }
    }
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn a_full_class_is_passed_over_and_looked_at_again() {
    let pool = SizeClassPool::new(&[(8, 256), (16, 64)]); // 4 pages of 64, then 1
    let small = Layout::new::<u8>();
    let blocks: Vec<_> = (0..256).map(|_| pool.alloc(small)).collect();
    // The class is full: the request spills to the next class, and the class is passed
    // over for its 4 pages' worth of requests.
    let spilled = pool.alloc(small);
    assert!(!blocks.contains(&spilled));
    // SAFETY: ours, each freed once (the one taken again is freed at the end).
    unsafe { pool.free(blocks[70]) };
    let passed_over: Vec<_> = (0..4).map(|_| pool.alloc(small)).collect();
    assert!(passed_over.iter().all(|p| !blocks.contains(p)), "served by the next class");
    assert_eq!(pool.stats().fallbacks, 5);
    assert_eq!(pool.alloc(small), blocks[70], "then the class is looked at again");
    // SAFETY: as above.
    unsafe {
        for p in blocks.into_iter().chain(passed_over).chain([spilled]) {
            pool.free(p);
        }
    }
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn a_class_passed_over_is_looked_at_before_a_request_fails() {
    let pool = SizeClassPool::new(&[(8, 128), (16, 1)]); // 2 pages of 64, then 1 block
    let small = Layout::new::<u8>();
    let blocks: Vec<_> = (0..128).map(|_| pool.alloc(small)).collect();
    // The class is full: the request takes the next class's one block, and the class
    // is passed over for a while.
    let spilled = pool.alloc(small);
    // SAFETY: ours, each freed once (the one taken again is freed at the end).
    unsafe { pool.free(blocks[3]) };
    // Both classes are passed over or full now, but the request looks again before it
    // fails, and finds the block freed in its own page.
    assert_eq!(pool.try_alloc(small), Ok(blocks[3]));
    // SAFETY: as above.
    unsafe {
        for p in blocks.into_iter().chain([spilled]) {
            pool.free(p);
        }
    }
    assert_eq!(pool.stats().live, 0);
}

#[test]
fn thread_local_destroyed_after_the_caches_allocates_and_frees() {
    use std::cell::RefCell;
    use std::sync::Arc;
    struct Late(Arc<SizeClassPool>);
    impl Drop for Late {
        fn drop(&mut self) {
            let p = self.0.alloc(Layout::new::<u8>());
            // SAFETY: ours, freed once.
            unsafe { self.0.free(p) };
        }
    }
    std::thread_local!(static LATE: RefCell<Option<Late>> = const { RefCell::new(None) });
    let pool = Arc::new(SizeClassPool::new(&[(8, 4)]));
    let shared = Arc::clone(&pool);
    std::thread::spawn(move || {
        // Registered before the pool's caches, so destroyed after them: `Late`'s drop
        // runs with the caches gone and must not reach them.
        LATE.with(|late| late.borrow_mut().take());
        let p = shared.alloc(Layout::new::<u8>());
        // SAFETY: ours, freed once.
        unsafe { shared.free(p) };
        LATE.with(|late| *late.borrow_mut() = Some(Late(shared)));
    })
    .join()
    .unwrap();
    let st = pool.stats();
    assert_eq!((st.live, st.allocations), (0, 2));
}

#[test]
fn exclusive_paths_match_shared_ones() {
    let mut pool = small();
    let a = pool.try_alloc_mut(Layout::new::<[u8; 60]>()).unwrap();
    let b = pool.alloc(Layout::new::<[u8; 60]>());
    assert_ne!(a, b);
    // SAFETY: ours; the bad frees are caught.
    unsafe {
        assert!(matches!(pool.try_free_mut(a.add(1)), Err(Error::NotBlockStart { .. })));
        pool.try_free_mut(a).unwrap();
        assert_eq!(pool.try_free_mut(a), Err(Error::DoubleFree { addr: a.as_ptr() as usize }));
        pool.free(b);
    }
    assert_eq!(
        pool.try_alloc_mut(Layout::from_size_align(1, 8192).unwrap()),
        Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
    );
    let mut one = SizeClassPool::new(&[(8, 1)]);
    let _p = one.try_alloc_mut(Layout::new::<u8>()).unwrap();
    assert!(matches!(one.try_alloc_mut(Layout::new::<u8>()), Err(Error::OutOfMemory { .. })));
    assert_eq!(one.stats().failures, 1);
}

#[test]
#[should_panic(expected = "double free of")]
fn double_free_panics() {
    let pool = small();
    let p = pool.alloc(Layout::new::<u8>());
    // SAFETY: the second free is the bug under test; it is detected.
    unsafe {
        pool.free(p);
        pool.free(p);
    }
}

#[test]
#[cfg(debug_assertions)]
fn use_after_free_is_caught() {
    let pool = SizeClassPool::new(&[(16, 2)]);
    let p = pool.alloc(Layout::new::<u64>());
    // SAFETY: freed, then written through the stale pointer (the bug under test); the
    // memory is still the pool's, so this is not UB, only wrong.
    unsafe {
        pool.free(p);
        p.add(8).as_ptr().write(1);
    }
    assert_eq!(pool.try_alloc(Layout::new::<u64>()), Err(Error::UseAfterFree { addr: p.as_ptr() as usize }));
    let refused = pool.stats();
    assert_eq!((refused.allocations, refused.failures, refused.live), (1, 1, 0), "a refusal is no allocation");
    assert_eq!(pool.class_stats()[0].allocations, 1);
    assert_eq!(pool.try_alloc(Layout::new::<u64>()), Ok(p), "refilled and handed out");
    assert_eq!(pool.stats().allocations, 2);
}

/// A block never handed out, whose fill a write past the end of the block below it
/// overwrote, is refused without raising the peak.
#[test]
#[cfg(debug_assertions)]
fn a_refused_fresh_block_is_no_peak() {
    let pool = SizeClassPool::new(&[(8, 64)]);
    let p = pool.alloc(Layout::new::<u64>());
    // SAFETY: a write past the end of `p` (the bug under test) into block 1, never handed
    // out: memory the pool owns, so not UB, only wrong.
    unsafe { p.add(8).as_ptr().write(1) };
    let next = p.as_ptr() as usize + 8;
    assert_eq!(pool.try_alloc(Layout::new::<u64>()), Err(Error::UseAfterFree { addr: next }));
    let st = pool.stats();
    assert_eq!((st.allocations, st.failures, st.live, st.in_use, st.peak), (1, 1, 1, 8, 8));
    assert_eq!(pool.class_stats()[0].peak, 1, "block 1 was never in use");
    let q = pool.alloc(Layout::new::<u64>());
    assert_eq!(q.as_ptr() as usize, next, "refilled and handed out");
    assert_eq!((pool.stats().allocations, pool.stats().peak), (2, 16));
    // SAFETY: ours, each freed once.
    unsafe { [p, q].into_iter().for_each(|b| pool.free(b)) };
}

#[test]
fn frees_on_other_threads_and_double_frees_there() {
    let pool = small();
    let a = pool.alloc(Layout::new::<u64>());
    let b = pool.alloc(Layout::new::<u64>());
    // SAFETY: `b` is freed once here; the rest are the bad frees under test, caught.
    unsafe { pool.free(b) };
    let (a_addr, b_addr) = (a.as_ptr() as usize, b.as_ptr() as usize);
    std::thread::scope(|s| {
        s.spawn(|| {
            let (a, b) = (NonNull::new(a_addr as *mut u8).unwrap(), NonNull::new(b_addr as *mut u8).unwrap());
            // SAFETY: `a` is live and ours to free (remote free); the others are caught.
            unsafe {
                assert_eq!(pool.try_free(b), Err(Error::DoubleFree { addr: b_addr }), "freed on the owner");
                pool.free(a);
                assert_eq!(pool.try_free(a), Err(Error::DoubleFree { addr: a_addr }), "freed here twice");
                assert!(matches!(pool.try_free(a.add(1)), Err(Error::NotBlockStart { .. })));
            }
        });
    });
    // SAFETY: `a` was freed on the other thread: caught here too.
    assert_eq!(unsafe { pool.try_free(a) }, Err(Error::DoubleFree { addr: a_addr }));
    assert_eq!(pool.stats().live, 0);
    // The owner collects the remote free when its page runs dry; the block comes back.
    let got: Vec<_> = (0..16).map(|_| pool.alloc(Layout::new::<u64>())).collect();
    assert!(got.contains(&a));
    for p in got {
        // SAFETY: ours, freed once.
        unsafe { pool.free(p) };
    }
}

#[test]
fn exited_threads_hand_their_pages_back() {
    let pool = std::sync::Arc::new(SizeClassPool::new(&[(8, 4)]));
    let shared = std::sync::Arc::clone(&pool);
    // `join` (not a scope) waits for the thread's locals to be destroyed.
    std::thread::spawn(move || {
        let p = shared.alloc(Layout::new::<u8>());
        // SAFETY: ours, freed once; the thread then exits holding the page.
        unsafe { shared.free(p) };
    })
    .join()
    .unwrap();
    let all: Vec<_> = (0..4).map(|_| pool.alloc(Layout::new::<u8>())).collect();
    assert!(pool.try_alloc(Layout::new::<u8>()).is_err());
    for p in all {
        // SAFETY: ours, freed once.
        unsafe { pool.free(p) };
    }
}

#[test]
fn pressure_makes_owners_free_where_others_can_claim() {
    let pool = SizeClassPool::new(&[(8, 32)]);
    let (go, wait) = std::sync::mpsc::channel::<()>();
    let (done, finished) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            let blocks: Vec<_> = (0..32).map(|_| pool.alloc(Layout::new::<u8>())).collect();
            // SAFETY: ours, freed once (the first one now, into our own pages).
            unsafe { pool.free(blocks[0]) };
            done.send(()).unwrap();
            wait.recv().unwrap();
            for &p in &blocks[1..] {
                // SAFETY: as above; the class is under pressure now.
                unsafe { pool.free(p) };
            }
            done.send(()).unwrap();
            wait.recv().unwrap(); // keep the pages until the main thread is done
        });
        finished.recv().unwrap();
        // The free block sits in the other thread's page: out of reach, so this fails
        // and puts the class under pressure.
        assert!(matches!(pool.try_alloc(Layout::new::<u8>()), Err(Error::OutOfMemory { available: 8, .. })));
        go.send(()).unwrap();
        finished.recv().unwrap();
        // The owner freed the rest through the remote masks: claimable.
        let taken: Vec<_> = (0..31).map(|_| pool.alloc(Layout::new::<u8>())).collect();
        for p in taken {
            // SAFETY: ours, freed once.
            unsafe { pool.free(p) };
        }
        go.send(()).unwrap();
    });
}

#[test]
fn pools_dropped_while_caches_name_them() {
    // Pools dropped on another thread, one forgotten, and ids never reused: the caches
    // of this thread stay sound and new pools start clean.
    for _ in 0..3 {
        let pool = SizeClassPool::new(&[(8, 2)]);
        let p = pool.alloc(Layout::new::<u8>());
        // SAFETY: ours, freed once.
        unsafe { pool.free(p) };
        std::thread::spawn(move || drop(pool)).join().unwrap();
    }
    if !cfg!(miri) {
        // Miri would report the forgotten region as a leak.
        let forgotten = SizeClassPool::new(&[(8, 2)]);
        let _ = forgotten.alloc(Layout::new::<u8>());
        std::mem::forget(forgotten);
    }
    let pool = SizeClassPool::new(&[(8, 2)]);
    let a = pool.alloc(Layout::new::<u8>());
    let b = pool.alloc(Layout::new::<u8>());
    assert_ne!(a, b);
    assert!(pool.try_alloc(Layout::new::<u8>()).is_err());
    // SAFETY: ours, freed once.
    unsafe {
        pool.free(a);
        pool.free(b);
    }
}

#[test]
fn pools_used_in_turn_keep_their_own_caches() {
    // The fast path reaches the cache of the pool used last: alternating pools must each
    // find their own (a cache used for the wrong pool hands out the other's pages).
    // Unlike layouts: `a`'s first page is of 64-byte blocks, `b`'s of 8-byte ones, so a
    // cache of `a`'s used for `b` hands out 8-byte blocks for 64-byte requests.
    let (a, b) = (SizeClassPool::new(&[(64, 256)]), SizeClassPool::new(&[(8, 256), (64, 256)]));
    let mut taken = Vec::new();
    for n in 0..300 {
        let (pool, other) = if n % 3 == 0 { (&a, &b) } else { (&b, &a) };
        let l = Layout::from_size_align(if n % 2 == 0 { 8 } else { 64 }, 8).unwrap();
        let p = pool.alloc(l);
        assert!(pool.contains(p) && !other.contains(p), "allocation {n} from its own pool");
        taken.push((p, n % 3 == 0));
    }
    assert_eq!((a.stats().allocations, a.stats().live), (100, 100));
    assert_eq!((b.stats().allocations, b.stats().live), (200, 200));
    // Each request from its own class: `a` has only 64-byte blocks, `b` took 100 of each.
    let in_use = |pool: &SizeClassPool| pool.class_stats().iter().map(|c| c.blocks - c.free).collect::<Vec<_>>();
    assert_eq!((in_use(&a), in_use(&b)), (vec![100], vec![100, 100]));
    for (p, from_a) in taken {
        let pool = if from_a { &a } else { &b };
        // SAFETY: ours, freed once, to the pool it came from.
        unsafe { pool.free(p) };
    }
    assert_eq!((a.stats().live, b.stats().live), (0, 0));
}

proptest! {
    #![proptest_config(crate::alloc::model_config())]
    #[test]
    fn model(ops in proptest::collection::vec((any::<bool>(), 0usize..300, 0u32..8, any::<usize>()),
                                              0..if cfg!(miri) { 30 } else { 200 })) {
        let pool = SizeClassPool::new(&[(8, 8), (16, 8), (32, 4), (64, 4), (128, 2), (256, 2)]);
        let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
        for (n, (alloc, size, a, pick)) in ops.into_iter().enumerate() {
            if alloc || live.is_empty() {
                let align = 1usize << a;
                match pool.try_alloc(Layout::from_size_align(size, align).unwrap()) {
                    Ok(p) => {
                        let addr = p.as_ptr() as usize;
                        prop_assert_eq!(addr % align, 0);
                        for &(q, l, _) in &live {
                            let b = q.as_ptr() as usize;
                            prop_assert!(addr >= b + l.max(1) || addr + size.max(1) <= b, "overlap");
                        }
                        // SAFETY: a fresh block of at least `size` bytes.
                        unsafe { p.as_ptr().write_bytes(n as u8, size) };
                        live.push((p, size, n as u8));
                    }
                    Err(Error::OutOfMemory { .. }) => {}
                    Err(e) => prop_assert!(false, "unexpected {e}"),
                }
            } else {
                let (p, size, fill) = live.swap_remove(pick % live.len());
                // SAFETY: a live block from the model, read then freed once.
                unsafe {
                    prop_assert!(std::slice::from_raw_parts(p.as_ptr(), size).iter().all(|&b| b == fill));
                    prop_assert_eq!(pool.try_free(p), Ok(()));
                    prop_assert_eq!(pool.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
                }
            }
            let st = pool.stats();
            prop_assert_eq!(st.live, live.len());
            prop_assert!(st.in_use <= st.peak && st.peak <= st.capacity);
        }
        for (p, _, _) in live {
            // SAFETY: live blocks from the model, freed once.
            unsafe { pool.free(p) };
        }
        prop_assert_eq!(pool.stats().in_use, 0);
    }
}

#[test]
fn a_thread_lives_on_blocks_freed_into_an_idle_owners_pages() {
    // One class of 640 blocks in pages of 64: another thread takes every block and then
    // idles, holding all ten pages, while this one frees and allocates.
    let pool = SizeClassPool::new(&[(8, 640)]);
    let (held, wait) = std::sync::mpsc::channel();
    let (go, idle) = std::sync::mpsc::channel::<()>();
    std::thread::scope(|s| {
        let pool = &pool;
        s.spawn(move || {
            let blocks: Vec<usize> = (0..640).map(|_| pool.alloc(Layout::new::<u8>()).as_ptr() as usize).collect();
            held.send(blocks).unwrap();
            let _ = idle.recv();
        });
        let go = go; // dropped if this thread panics, so the owner stops idling
        let mut blocks: Vec<usize> = wait.recv().unwrap();
        let block = |addr: usize| NonNull::new(addr as *mut u8).unwrap();
        // Freed before any thread starved: no page is hinted, so only the walk finds them.
        let early: Vec<usize> = blocks.iter().copied().step_by(97).collect();
        blocks.retain(|p| !early.contains(p));
        for &p in &early {
            // SAFETY: handed out by the pool, freed once.
            unsafe { pool.free(block(p)) };
        }
        let mut taken: Vec<usize> =
            (0..early.len()).map(|_| pool.alloc(Layout::new::<u8>()).as_ptr() as usize).collect();
        taken.sort_unstable();
        let mut early = early;
        early.sort_unstable();
        assert_eq!(taken, early, "every block freed before the pressure is claimed");
        assert!(matches!(pool.try_alloc(Layout::new::<u8>()), Err(Error::OutOfMemory { .. })));
        // Under pressure now: blocks freed one by one, from pages all over the class.
        for round in 0..200 {
            let i = round * 37 % blocks.len();
            let freed = std::mem::replace(&mut blocks[i], 0);
            // SAFETY: as above.
            unsafe { pool.free(block(freed)) };
            let again = pool.alloc(Layout::new::<u8>()).as_ptr() as usize;
            assert_eq!(again, freed, "the one free block is claimed");
            blocks[i] = again;
        }
        assert!(pool.try_alloc(Layout::new::<u8>()).is_err());
        assert_eq!(pool.stats().live, 640);
        for &p in blocks.iter().chain(&taken) {
            // SAFETY: as above.
            unsafe { pool.free(block(p)) };
        }
        go.send(()).unwrap();
    });
    assert_eq!(pool.stats().live, 0);
}

/// A refill through another pool's cache would collect and hand out pages this thread
/// does not own in the pool it is called on.
#[test]
#[should_panic(expected = "another pool's cache")]
fn refill_refuses_another_pools_cache() {
    let (a, b) = (small(), small());
    let mut cache = PoolCache::new(a.id, &a.table, a.classes.len(), a.map.empty());
    let _ = b.refill(0, &mut cache);
}
