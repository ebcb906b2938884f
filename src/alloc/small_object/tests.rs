//! Unit tests of the small-object allocator.

use super::*;
use proptest::prelude::*;

fn config(slots: [usize; 7]) -> SmallObjectAllocator {
    SmallObjectAllocator::new(SmallObjectConfig { slots })
}

#[test]
fn eight_thousand_one_hundred_twenty_five() {
    let small = config([1000, 0, 0, 0, 0, 0, 0]);
    let blocks: Vec<_> = (0..1000).map(|_| small.alloc(Layout::new::<u64>())).collect();
    let st = small.stats();
    assert_eq!((st.fallbacks, st.live, st.in_use, st.capacity), (0, 1000, 8000, 8000));
    let f = small.footprint()[0];
    assert_eq!((f.data_bytes, f.bitmap_bytes, f.total()), (8000, 125, 8125));
    assert_eq!(small.footprint()[1].total(), 0);
    // The 1001st goes to the system.
    let extra = small.alloc(Layout::new::<u64>());
    assert_eq!(small.stats().fallbacks, 1);
    assert_eq!(small.histogram().peak_live[0], 1001);
    // SAFETY: every block is ours, freed once.
    unsafe {
        small.free(extra);
        for p in blocks {
            small.free(p);
        }
    }
    assert_eq!(small.stats().in_use, 0);
}

#[test]
fn a_full_class_goes_to_the_system_for_a_while_then_is_looked_at_again() {
    let small = config([128, 0, 0, 0, 0, 0, 0]); // 2 words
    let layout = Layout::new::<u64>();
    let blocks: Vec<_> = (0..128).map(|_| small.alloc(layout)).collect();
    // Full: the request goes to the system, and the class is passed over for 2 requests.
    let extra = small.alloc(layout);
    assert_eq!(small.stats().fallbacks, 1);
    // SAFETY: every block is ours, freed once (the one taken again is freed at the end).
    unsafe { small.free(blocks[5]) };
    let passed_over: Vec<_> = (0..2).map(|_| small.alloc(layout)).collect();
    assert_eq!(small.stats().fallbacks, 3, "served by the system");
    assert_eq!(small.alloc(layout), blocks[5], "then the class is looked at again");
    assert_eq!(small.stats().fallbacks, 3);
    // SAFETY: as above.
    unsafe {
        for p in blocks.into_iter().chain(passed_over).chain([extra]) {
            small.free(p);
        }
    }
    assert_eq!(small.stats().in_use, 0);
}

#[test]
fn default_config_figures() {
    let c = SmallObjectConfig::default();
    assert_eq!(c.slots, [37440, 18688, 9344, 6208, 4672, 3072, 2304]);
    assert_eq!(c.data_bytes(), 2_084_352);
    let bitmap: usize = c.slots.iter().map(|s| s.div_ceil(8)).sum();
    assert_eq!(bitmap, 10_216);
    if !cfg!(miri) {
        let small = SmallObjectAllocator::default();
        assert_eq!(small.capacity(), 2_084_352);
        // 64 KiB granules, 35 of them: each class but the last is padded to 5 granules.
        assert_eq!((small.record_shift + RECORD_SHIFT, small.region.len()), (16, 6 * 5 * 65_536 + 294_912));
    }
}

#[test]
fn routing_and_alignment() {
    let small = config([4, 4, 4, 4, 4, 4, 4]);
    let cases =
        [(0, 1, 8), (1, 1, 8), (9, 8, 16), (40, 8, 48), (40, 32, 64), (65, 8, 96), (65, 64, 128), (100, 128, 128)];
    for (size, align, slot) in cases {
        let p = small.alloc(Layout::from_size_align(size, align).unwrap());
        assert_eq!(p.as_ptr() as usize % align, 0);
        let i = SMALL_OBJECT_CLASSES.iter().position(|&s| s == slot).unwrap();
        let c = &small.classes[i];
        let off = p.as_ptr() as usize - small.region.addr();
        assert!(c.start <= off && off < c.end, "{size}/{align} should use the {slot} B class");
    }
    assert_eq!(small.stats().fallbacks, 0);
    let aligned = small.alloc(Layout::from_size_align(8, 4096).unwrap());
    assert_eq!(aligned.as_ptr() as usize % 4096, 0);
    assert_eq!(small.stats().fallbacks, 1);
    assert_eq!(small.histogram().larger, 1);
    assert_eq!(
        small.try_alloc(Layout::from_size_align(8, 8192).unwrap()),
        Err(Error::UnsupportedAlignment { align: 8192, max: 4096 })
    );
    // SAFETY: ours, freed once.
    unsafe { small.free(aligned) };
}

#[test]
fn bitmap_scan_crosses_words_and_hint_moves_back() {
    let small = config([200, 0, 0, 0, 0, 0, 0]);
    let blocks: Vec<_> = (0..200).map(|_| small.alloc(Layout::new::<u8>())).collect();
    for (i, p) in blocks.iter().enumerate() {
        assert_eq!(p.as_ptr() as usize - small.region.addr(), i * 8, "lowest free slot first");
    }
    // SAFETY: ours, freed once.
    unsafe { small.free(blocks[3]) };
    assert_eq!(small.alloc(Layout::new::<u8>()), blocks[3]);
    assert_eq!(small.free_slots()[0], 0);
}

#[test]
fn bad_frees() {
    let small = config([8, 0, 0, 8, 0, 0, 0]);
    let p = small.alloc(Layout::new::<[u8; 48]>());
    let big = small.alloc(Layout::new::<[u8; 200]>());
    let mut local = 0u64;
    let local = NonNull::from(&mut local).cast::<u8>();
    // SAFETY: each bad free is caught before memory is touched; the good ones free ours.
    unsafe {
        assert_eq!(small.try_free(local), Err(Error::ForeignPointer { addr: local.as_ptr() as usize }));
        assert_eq!(
            small.try_free(p.add(8)),
            Err(Error::NotBlockStart { addr: p.as_ptr() as usize + 8, block_start: p.as_ptr() as usize })
        );
        // Padding between the 8-byte class (64 bytes) and the 48-byte class (at 128), inside
        // the region.
        let pad = small.region.at(100);
        assert!(matches!(small.try_free(pad), Err(Error::ForeignPointer { .. })));
        small.free(p);
        assert_eq!(small.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
        small.free(big);
        assert!(matches!(small.try_free(big), Err(Error::ForeignPointer { .. })));
    }
}

/// Classes too large for 64 granules of 128 bytes get larger granules; every slot is
/// still found from its address, and the padding after each class is no slot.
#[test]
fn classes_on_larger_granules() {
    let small = config([3000, 10, 0, 2000, 0, 0, 5]);
    assert_eq!(small.record_shift + RECORD_SHIFT, 11, "24,000 + 160 + 96,000 + 640 bytes in 61 granules of 2 KiB");
    let starts: Vec<usize> = small.classes.iter().map(|c| c.start).collect();
    assert_eq!(starts, [0, 24_576, 26_624, 26_624, 122_880, 122_880, 122_880]);
    assert_eq!(small.capacity(), 24_000 + 160 + 96_000 + 640);
    assert_eq!(small.region.len(), 122_880 + 640, "no padding after the last class");
    let layouts =
        [Layout::new::<u64>(), Layout::new::<[u8; 16]>(), Layout::new::<[u8; 48]>(), Layout::new::<[u8; 128]>()];
    let blocks: Vec<_> = layouts.iter().flat_map(|&l| (0..5).map(move |_| l)).map(|l| small.alloc(l)).collect();
    assert_eq!(small.stats().fallbacks, 0);
    for (i, c) in small.classes.iter().enumerate().filter(|(_, c)| c.slots > 0) {
        // SAFETY: `at` is called with offsets inside the region (`c.end < len`, `c.start + 3 <
        // c.end`); none of these is a live block, and each bad free is caught before memory
        // is touched.
        unsafe {
            let at = |offset: usize| small.region.at(offset);
            if c.end < small.region.len() {
                assert!(matches!(small.try_free(at(c.end)), Err(Error::ForeignPointer { .. })), "class {i}");
            }
            assert!(matches!(small.try_free(at(c.start + 3)), Err(Error::NotBlockStart { .. })), "class {i}");
        }
    }
    // Just past the region, in its last granule (whose record is the last class's).
    // SAFETY: one past the end is allowed.
    let end = unsafe { small.region.at(small.region.len()) };
    // SAFETY: not a block; caught before memory is touched.
    assert_eq!(unsafe { small.try_free(end) }, Err(Error::ForeignPointer { addr: end.as_ptr() as usize }));
    for p in blocks {
        // SAFETY: ours, freed once; the second free is caught.
        unsafe {
            small.free(p);
            assert_eq!(small.try_free(p), Err(Error::DoubleFree { addr: p.as_ptr() as usize }));
        }
    }
    assert_eq!(small.stats().live, 0);
}

#[test]
fn allocators_used_in_turn_keep_their_own_caches() {
    // The fast path reaches the cache of the allocator used last: alternating allocators
    // must each find their own (a cache used for the wrong one hands out slots its counts
    // and words do not record).
    let l = Layout::new::<u64>();
    let (a, b) = (config([256; 7]), config([256; 7]));
    let mut taken = Vec::new();
    for n in 0..300 {
        let (small, other) = if n % 3 == 0 { (&a, &b) } else { (&b, &a) };
        let p = small.alloc(l);
        let addr = p.as_ptr() as usize;
        assert!(small.region.contains(addr) && !other.region.contains(addr), "allocation {n} from its own region");
        taken.push((p, n % 3 == 0));
    }
    assert_eq!((a.stats().allocations, a.stats().live), (100, 100));
    assert_eq!((b.stats().allocations, b.stats().live), (200, 200));
    for (p, from_a) in taken {
        let small = if from_a { &a } else { &b };
        // SAFETY: ours, freed once, to the allocator it came from.
        unsafe { small.free(p) };
    }
    assert_eq!((a.stats().live, b.stats().live), (0, 0));
    assert_eq!((a.stats().failures, b.stats().failures), (0, 0), "no free was refused");
}

#[test]
fn addresses_a_table_span_from_a_slot_are_foreign() {
    // The free's table lookup wraps granule numbers around the table: an address one whole
    // table span above or below a slot lands on that slot's record, and must be refused.
    let small = config([64; 7]);
    let span = GRANULES << (small.record_shift + RECORD_SHIFT);
    for size in SMALL_OBJECT_CLASSES {
        let p = small.alloc(Layout::from_size_align(size, 8).unwrap());
        for alias in [p.as_ptr().wrapping_add(span), p.as_ptr().wrapping_sub(span)] {
            let alias = NonNull::new(alias).unwrap();
            // SAFETY: not the allocator's (the error under test); never dereferenced.
            let refused = unsafe { small.try_free(alias) };
            assert_eq!(refused, Err(Error::ForeignPointer { addr: alias.as_ptr() as usize }), "{size}-byte class");
        }
        assert_eq!(small.stats().live, 1, "the slot itself stays handed out");
        // SAFETY: ours, freed once.
        unsafe { small.free(p) };
    }
}

#[test]
fn slot_of_divides_and_rejects_non_multiples() {
    let small = config([1; 7]);
    for (i, size) in SMALL_OBJECT_CLASSES.into_iter().enumerate() {
        let record = GranuleClass::new(Some(&small.classes[i]), i, &small.shared.lanes[i]);
        let start = small.classes[i].start;
        let slot_of = |rel: usize| record.slot_of(start.wrapping_add(rel));
        let last = ((1usize << 32) - 1) * size; // the start of the last possible slot
        for rel in [0, size, 5 * size, 1000 * size, last - size, last] {
            assert_eq!(slot_of(rel), (rel / size) as u64, "class {i}, {rel} bytes in");
        }
        // Inside a slot, or past the most slots a class can have: never below 2^32.
        for rel in [1, 7, size - 1, size + 1, 5 * size + 3, last - 1, last + 1, last + size, 1 << 40, usize::MAX] {
            assert!(slot_of(rel) >= 1 << 32, "class {i}, {rel} bytes in");
        }
    }
}

/// A class whose slots end inside a bitmap word: its records send only the whole words'
/// slots down the free's fast path, and the partial last word's slots are freed, and caught
/// freed twice, by the checked path, on the owner's thread and on another.
#[test]
fn slots_of_the_partial_last_word_take_the_checked_free() {
    let small = config([200, 0, 0, 0, 0, 0, 0]);
    let record = small.granule_class[0];
    assert_eq!((record.whole_slots, record.slots()), (192, 200), "three whole words and 8 slots");
    let l = Layout::new::<u64>();
    let mut blocks: Vec<_> = (0..200).map(|_| small.alloc(l)).collect();
    assert_eq!(small.stats().fallbacks, 0, "every slot of the class handed out");
    let first = small.classes[0].first.as_ptr() as usize;
    blocks.sort_by_key(|p| p.as_ptr() as usize);
    let slots: Vec<usize> = blocks.iter().map(|p| (p.as_ptr() as usize - first) / 8).collect();
    assert_eq!(slots, (0..200).collect::<Vec<_>>());
    let (tail, whole) = (blocks[199], blocks[0]);
    // SAFETY: ours, each freed once before its second free, which is caught.
    unsafe {
        small.free(tail);
        assert_eq!(small.try_free(tail), Err(Error::DoubleFree { addr: tail.as_ptr() as usize }));
        small.free(whole);
        assert_eq!(small.try_free(whole), Err(Error::DoubleFree { addr: whole.as_ptr() as usize }));
    }
    // Another tail slot freed on another thread, then again on this one.
    let other = blocks[198];
    let addr = other.as_ptr() as usize;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: ours, freed once.
            unsafe { small.free(NonNull::new(addr as *mut u8).unwrap()) };
        });
    });
    // SAFETY: freed already: caught.
    assert_eq!(unsafe { small.try_free(other) }, Err(Error::DoubleFree { addr }));
    for &p in &blocks[1..198] {
        // SAFETY: ours, freed once.
        unsafe { small.free(p) };
    }
    assert_eq!(small.stats().live, 0);
    // All 200 again: the partial word's slots came back too.
    let again: Vec<_> = (0..200).map(|_| small.alloc(l)).collect();
    assert_eq!(small.stats().fallbacks, 0);
    for p in again {
        // SAFETY: ours, freed once.
        unsafe { small.free(p) };
    }
}

/// The owner's alloc and free in its own lane take no lock: only the first allocation
/// (which takes the lane) and the refill after the word fills up do.
#[test]
fn owner_fast_paths_take_no_lock() {
    let small = config([200, 0, 0, 0, 0, 0, 0]);
    let lanes = &small.shared.lanes[0];
    let first = small.alloc(Layout::new::<u64>());
    let taken = lanes.locks_taken();
    assert_eq!(taken, 1, "the lane was taken under the lock");
    for _ in 0..100 {
        let p = small.alloc(Layout::new::<u64>());
        // SAFETY: ours, freed once.
        unsafe { small.free(p) };
    }
    assert_eq!(lanes.locks_taken(), taken, "alloc and free in an owned lane");
    // SAFETY: ours, freed once.
    unsafe { small.free(first) };
    assert_eq!(small.stats().live, 0);
}

/// Blocks freed on another thread go back to the owner's lane; a double free is caught
/// whichever thread makes either free.
#[test]
fn frees_on_another_thread() {
    let small = config([64, 0, 0, 0, 0, 0, 0]);
    let blocks: Vec<_> = (0..64).map(|_| small.alloc(Layout::new::<u64>())).collect();
    let addrs: Vec<usize> = blocks.iter().map(|p| p.as_ptr() as usize).collect();
    let here = |addr: usize| NonNull::new(addr as *mut u8).unwrap();
    // SAFETY: the owner frees block 0; the rest are bad frees, caught.
    unsafe { small.free(blocks[0]) };
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: blocks 1..32 are ours, handed over and freed once; the rest are the
            // double frees under test.
            unsafe {
                assert_eq!(small.try_free(here(addrs[0])), Err(Error::DoubleFree { addr: addrs[0] }));
                for &addr in &addrs[1..32] {
                    small.free(here(addr));
                }
                assert_eq!(small.try_free(here(addrs[1])), Err(Error::DoubleFree { addr: addrs[1] }));
            }
        });
    });
    assert_eq!(small.stats().live, 32);
    // SAFETY: freed on the other thread (queued for this owner): a double free.
    assert_eq!(unsafe { small.try_free(blocks[2]) }, Err(Error::DoubleFree { addr: addrs[2] }));
    // The 32 freed slots are the owner's again.
    let again: Vec<_> = (0..32).map(|_| small.alloc(Layout::new::<u64>())).collect();
    assert_eq!(small.stats().fallbacks, 0);
    let mut sorted: Vec<_> = again.iter().map(|p| p.as_ptr() as usize).collect();
    sorted.sort_unstable();
    assert_eq!(sorted, addrs[..32]);
    // SAFETY: ours, freed once.
    unsafe {
        for p in again.into_iter().chain(blocks.into_iter().skip(32)) {
            small.free(p);
        }
    }
    assert_eq!(small.stats().live, 0);
    assert_eq!(small.stats().failures, 0, "every double free was caught at its call");
}

/// A thread that exits gives its lanes back, with the slots it still holds: another
/// thread then allocates the free ones and frees the held ones (no owner: under the lock),
/// and a second free of those is still caught.
#[test]
fn exiting_thread_gives_its_lanes_back() {
    let small = config([128, 0, 0, 0, 0, 0, 0]);
    let kept = std::thread::scope(|s| {
        s.spawn(|| {
            let blocks: Vec<_> = (0..128).map(|_| small.alloc(Layout::new::<u64>())).collect();
            let kept: Vec<usize> = blocks[..10].iter().map(|p| p.as_ptr() as usize).collect();
            for p in &blocks[10..] {
                // SAFETY: ours, freed once.
                unsafe { small.free(*p) };
            }
            kept
        })
        .join()
        .unwrap()
    });
    // The scoped thread's locals are gone once the scope returns.
    let blocks: Vec<_> = (0..118).map(|_| small.alloc(Layout::new::<u64>())).collect();
    assert_eq!(small.stats().fallbacks, 0, "the lanes came back");
    for addr in kept {
        let p = NonNull::new(addr as *mut u8).unwrap();
        // SAFETY: handed over from the exited thread, freed once; the second is caught.
        unsafe {
            small.free(p);
            assert_eq!(small.try_free(p), Err(Error::DoubleFree { addr }));
        }
    }
    // SAFETY: ours, freed once.
    unsafe { blocks.into_iter().for_each(|p| small.free(p)) };
    let st = small.stats();
    assert_eq!((st.live, st.allocations), (0, 246));
    // The first thread's peak was 128 and this one's own is 118 (the 10 it took over
    // count in the first's): the sum is an upper bound, capped at the class's slots.
    assert_eq!(small.histogram().peak_live[0], 128);
}

#[test]
#[should_panic(expected = "double free of")]
fn double_free_panics() {
    let small = config([8; 7]);
    let p = small.alloc(Layout::new::<u8>());
    // SAFETY: the second free is the bug under test; it is caught.
    unsafe {
        small.free(p);
        small.free(p);
    }
}

#[test]
#[cfg(debug_assertions)]
fn use_after_free_is_caught() {
    let small = config([1, 0, 0, 0, 0, 0, 0]);
    let p = small.alloc(Layout::new::<u64>());
    // SAFETY: a write through a stale pointer (the bug under test) into memory the
    // allocator still owns.
    unsafe {
        small.free(p);
        p.as_ptr().write(0);
    }
    assert_eq!(small.try_alloc(Layout::new::<u64>()), Err(Error::UseAfterFree { addr: p.as_ptr() as usize }));
    let refused = small.stats();
    assert_eq!((refused.allocations, refused.failures, refused.live), (1, 1, 0), "a refusal is no allocation");
    assert_eq!(small.try_alloc(Layout::new::<u64>()), Ok(p));
    assert_eq!(small.stats().allocations, 2);
}

/// A slot refused by the use-after-free check is no allocation and raises no peak,
/// whether it was never handed out (its fill overwritten by a write past the slot below)
/// or freed before.
#[test]
#[cfg(debug_assertions)]
fn a_refused_slot_is_no_peak() {
    let l = Layout::new::<u64>();
    let small = config([64, 0, 0, 0, 0, 0, 0]);
    let p = small.alloc(l);
    // SAFETY: a write past the end of `p` (the bug under test) into slot 1, never handed
    // out: memory the allocator owns.
    unsafe { p.add(8).as_ptr().write(0) };
    let next = p.as_ptr() as usize + 8;
    assert_eq!(small.try_alloc(l), Err(Error::UseAfterFree { addr: next }));
    let st = small.stats();
    assert_eq!((st.allocations, st.failures, st.live, st.peak), (1, 1, 1, 8));
    assert_eq!(small.histogram().peak_live[0], 1);
    let q = small.alloc(l);
    assert_eq!(q.as_ptr() as usize, next, "refilled and handed out");
    assert_eq!((small.stats().allocations, small.histogram().peak_live[0]), (2, 2), "exact: no frees");
    // SAFETY: ours, each freed once.
    unsafe { [p, q].into_iter().for_each(|b| small.free(b)) };

    let small = config([64, 0, 0, 0, 0, 0, 0]);
    let p = small.alloc(l);
    // SAFETY: freed, then written through the stale pointer (the bug under test) into
    // memory the allocator still owns.
    unsafe {
        small.free(p);
        p.as_ptr().write(0);
    }
    assert!(matches!(small.try_alloc(l), Err(Error::UseAfterFree { .. })));
    let st = small.stats();
    assert_eq!((st.allocations, st.failures, st.live, st.peak), (1, 1, 0, 8));
    assert_eq!(small.histogram().peak_live[0], 1);
}

#[test]
fn peak_is_exact_without_frees_and_bounded_with_them() {
    let small = config([256, 0, 0, 0, 0, 0, 0]);
    let l = Layout::new::<u64>();
    let mut live: Vec<_> = (0..10).map(|_| small.alloc(l)).collect();
    assert_eq!(small.histogram().peak_live[0], 10);
    // SAFETY: ours, each freed once.
    unsafe { live.drain(..5).for_each(|p| small.free(p)) };
    live.extend((0..3).map(|_| small.alloc(l)));
    // The true peak is 10; frees since the word was taken may be counted (up to 5).
    let peak = small.histogram().peak_live[0];
    assert!((10..=15).contains(&peak), "{peak}");
    // Filling the word starts a new bound: 64 slots of the first word, then 20 more.
    live.extend((0..76).map(|_| small.alloc(l)));
    assert_eq!(live.len(), 84);
    let peak = small.histogram().peak_live[0];
    assert!((84..=89).contains(&peak), "{peak}");
    // SAFETY: ours, each freed once.
    unsafe { live.into_iter().for_each(|p| small.free(p)) };
}

#[test]
fn slots_left_by_an_exited_thread_count_once_in_the_peak() {
    let small = config([256, 0, 0, 0, 0, 0, 0]);
    let l = Layout::new::<u64>();
    let left: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| (0..100).map(|_| small.alloc(l).as_ptr() as usize).collect()).join().unwrap()
    });
    // The thread's peak counted them; as loose slots they used to count again (200).
    assert_eq!(small.histogram().peak_live[0], 100);
    for addr in left {
        // SAFETY: each came from `small` and is freed once.
        unsafe { small.free(NonNull::new(addr as *mut u8).unwrap()) };
    }
    assert_eq!(small.histogram().peak_live[0], 100);
    assert_eq!(small.stats().live, 0);
}

/// A thread that takes over a lane an exited thread left live slots in does not count
/// them in its own peak: the exited thread's peak counted them already.
#[test]
fn slots_in_a_lane_taken_over_count_once_in_the_peak() {
    let small = config([128, 0, 0, 0, 0, 0, 0]); // two lanes of one word
    let l = Layout::new::<u64>();
    let left: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| (0..100).map(|_| small.alloc(l).as_ptr() as usize).collect()).join().unwrap()
    });
    // The only lane with a free slot holds 36 of the exited thread's slots.
    let mine = small.alloc(l);
    assert_eq!(small.stats().fallbacks, 0);
    assert_eq!(small.histogram().peak_live[0], 101, "no frees: exact");
    assert_eq!(small.stats().peak, 101 * 8);
    // SAFETY: each came from `small` and is freed once.
    unsafe {
        small.free(mine);
        left.into_iter().for_each(|addr| small.free(NonNull::new(addr as *mut u8).unwrap()));
    }
    assert_eq!(small.histogram().peak_live[0], 101);
}

/// The same after the exited thread freed some: the peaks of the two threads may add up
/// past the true peak (100) only by what the second one allocated itself.
#[test]
fn slots_taken_over_after_frees_stay_within_the_bound() {
    let small = config([128, 0, 0, 0, 0, 0, 0]); // two lanes of one word
    let l = Layout::new::<u64>();
    let left: Vec<usize> = std::thread::scope(|s| {
        s.spawn(|| {
            let mut blocks: Vec<_> = (0..100).map(|_| small.alloc(l)).collect();
            // SAFETY: ours, each freed once.
            unsafe { blocks.drain(60..).for_each(|p| small.free(p)) };
            blocks.into_iter().map(|p| p.as_ptr() as usize).collect()
        })
        .join()
        .unwrap()
    });
    // The first lane holds the 60 left; the second is empty.
    let mine: Vec<_> = (0..4).map(|_| small.alloc(l)).collect();
    assert!(mine.iter().all(|p| p.as_ptr() as usize - small.region.addr() < 64 * 8));
    let peak = small.histogram().peak_live[0];
    assert!((100..=104).contains(&peak), "{peak}");
    // SAFETY: each came from `small` and is freed once.
    unsafe {
        mine.into_iter().for_each(|p| small.free(p));
        left.into_iter().for_each(|addr| small.free(NonNull::new(addr as *mut u8).unwrap()));
    }
    assert_eq!(small.stats().live, 0);
}

proptest! {
    #![proptest_config(crate::alloc::model_config())]
    #[test]
    fn model(ops in proptest::collection::vec((any::<bool>(), 0usize..160, 0u32..8, any::<usize>()),
                                              0..if cfg!(miri) { 30 } else { 200 })) {
        let small = config([3, 2, 2, 3, 2, 2, 2]);
        let mut live: Vec<(NonNull<u8>, usize, u8)> = Vec::new();
        for (n, (alloc, size, a, pick)) in ops.into_iter().enumerate() {
            if alloc || live.is_empty() {
                let align = 1usize << a;
                let p = small.try_alloc(Layout::from_size_align(size, align).unwrap());
                prop_assert!(p.is_ok());
                let p = p.unwrap();
                let addr = p.as_ptr() as usize;
                prop_assert_eq!(addr % align, 0);
                for &(q, l, _) in &live {
                    let b = q.as_ptr() as usize;
                    prop_assert!(addr >= b + l.max(1) || addr + size.max(1) <= b, "overlap");
                }
                // SAFETY: a fresh block of at least `size` bytes.
                unsafe { p.as_ptr().write_bytes(n as u8, size) };
                live.push((p, size, n as u8));
            } else {
                let (p, size, fill) = live.swap_remove(pick % live.len());
                // SAFETY: a live block of the model, read then freed once.
                unsafe {
                    prop_assert!(std::slice::from_raw_parts(p.as_ptr(), size).iter().all(|&b| b == fill));
                    prop_assert_eq!(small.try_free(p), Ok(()));
                    prop_assert!(small.try_free(p).is_err());
                }
            }
            let st = small.stats();
            prop_assert_eq!(st.live, live.len());
            prop_assert!(st.in_use <= st.peak && st.peak <= st.capacity);
        }
        for (p, _, _) in live {
            // SAFETY: live blocks of the model, freed once.
            unsafe { small.free(p) };
        }
        prop_assert_eq!(small.stats().in_use, 0);
    }
}
