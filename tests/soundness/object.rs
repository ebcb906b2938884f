//! Adversarial cases for the object layer: handles, stores and the manager.
//!
//! Variance and `Send` are refused at compile time (`tests/ui/soundness/object_*`).
//! Cases that leak on purpose (forgotten handles, a count at its limit) are in
//! `tests/soundness_leaks.rs`, and the end of the manager ids, which is
//! process-wide, in `tests/soundness_manager_ids.rs`.

use std::collections::HashSet;

use mmobject::alloc::SegmentAlloc;
use mmobject::{Error, MMObject, ObjectKey, ObjectManager, RawHandle, VisitHandles};
use slotmap::SecondaryMap;

#[derive(MMObject, Debug, PartialEq)]
struct Item {
    id: u32,
    payload: Vec<u32>,
}

fn item(id: u32) -> Item {
    Item { id, payload: vec![id; 4] }
}

/// Generations stop below 2^31: the slot is retired, not wrapped, so a stale
/// weak or raw handle never validates again. Before the fix, generations
/// wrapped after 2^32 uses and a stale key named the new object.
#[test]
fn generations_retire_a_slot_instead_of_wrapping() {
    let limit = 1u32 << 31;
    let mut mm = ObjectManager::builder().segment_base(1).first_generation_for_tests(limit - 4).build();

    let first = mm.create(item(1));
    let first_key = first.key();
    let first_weak = first.downgrade();
    assert_eq!(first_key.generation(), limit - 3);
    drop(first);
    mm.collect_garbage();

    // The slot is reused once more, at the last generation a key can carry.
    let second = mm.create(item(2));
    assert_eq!(second.key().index(), first_key.index());
    assert_eq!(second.key().generation(), limit - 1);
    let second_weak = second.downgrade();
    let second_raw = second.clone().into_raw();
    assert!(mm.get_weak(first_weak).is_none());
    mm.release_raw(second_raw).unwrap();
    drop(second);
    mm.collect_garbage();

    // Retired: the next object gets another slot, and no old key validates.
    let third = mm.create(item(3));
    assert_ne!(third.key().index(), first_key.index());
    for weak in [first_weak, second_weak] {
        assert!(mm.get_weak(weak).is_none());
        assert!(mm.upgrade(weak).is_none());
        assert!(!mm.is_alive(weak));
        assert!(mm.view::<Item>().get_weak(weak).is_none());
    }
    assert!(matches!(mm.release_raw(second_raw), Err(Error::StaleHandle { .. })));
    assert!(matches!(mm.handle_from_raw::<Item>(second_raw), Err(Error::StaleHandle { .. })));
    assert_eq!(mm.count::<Item>(), 1);
    assert_eq!(mm.iter::<Item>().count(), 1);
    drop(third);
    mm.collect_garbage();
    assert_eq!(mm.count::<Item>(), 0);
    assert!(mm.shutdown().is_empty());
}

/// Many retirements in a row: every slot ends retired, counts stay exact and
/// shutdown frees everything (Miri checks the memory).
#[test]
fn retired_slots_are_counted_and_freed() {
    let limit = 1u32 << 31;
    let mut mm = ObjectManager::builder().segment_base(4).first_generation_for_tests(limit - 2).build();
    let mut keys = HashSet::new();
    for round in 0..3 {
        let handles: Vec<_> = (0..4).map(|i| mm.create(item(round * 4 + i))).collect();
        for h in &handles {
            assert!(h.key().generation() < limit);
            assert!(keys.insert(h.key()), "a key is never handed out twice");
        }
        assert_eq!(mm.count::<Item>(), 4);
        drop(handles);
        assert_eq!(mm.collect_garbage().objects, 4);
        assert_eq!(mm.count::<Item>(), 0);
        assert_eq!(mm.report().types[0].live, 0);
    }
    assert!(mm.shutdown().is_empty());
}

/// Keys of every manager work with `SecondaryMap::entry`, which takes versions
/// at or above 2^31 for older than an empty slot.
#[test]
fn keys_of_many_managers_work_with_secondary_map_entry() {
    let managers: Vec<ObjectManager> = (0..6).map(|_| ObjectManager::new()).collect();
    for mm in &managers {
        let h = mm.create(item(7));
        assert!(h.key().generation() < 1 << 31, "generation {:#x}", h.key().generation());
        let mut side: SecondaryMap<ObjectKey, u32> = SecondaryMap::new();
        *side.entry(h.key()).expect("a live key has an entry").or_insert(0) += 1;
        assert_eq!(side.get(h.key()), Some(&1));
    }
    let mut seeds: Vec<u32> = managers.iter().map(|mm| mm.create(item(0)).key().generation()).collect();
    seeds.sort_unstable();
    seeds.dedup();
    assert_eq!(seeds.len(), managers.len(), "each manager starts its generations elsewhere");
}

/// A refused segment is an `Err` with the value handed back, never an abort,
/// and nothing that was alive changes.
#[test]
fn refused_segment_is_an_error_and_nothing_is_lost() {
    static TIGHT: SegmentAlloc = SegmentAlloc::with_limit(4096);
    // A slot: its 16-byte header, then the value.
    let slot = std::mem::size_of::<Item>() + 16;
    let mm = ObjectManager::builder().segment_base(2).allocator(&TIGHT).build();
    let a = mm.create(item(1));
    let b = mm.create(item(2));
    let c = b.clone();
    let held = TIGHT.stats().in_use;
    // The next segment (a 2 KiB chunk prefix and 4 slots) no longer fits.
    let _room = TIGHT.alloc(std::alloc::Layout::from_size_align(4096 - held - 3 * slot, 8).unwrap());

    let refused = mm.try_create(item(3)).unwrap_err();
    assert!(
        matches!(refused.error, Error::StoreOutOfMemory { type_name: "Item", part: "a new segment", bytes, .. } if bytes == 2048 + 4 * slot),
        "{:?}",
        refused.error
    );
    assert!(refused.error.to_string().contains("SegmentAlloc"), "{}", refused.error);
    assert_eq!(refused.into_value(), item(3), "the value comes back intact");
    assert!(matches!(mm.try_reserve::<Item>(10), Err(Error::StoreOutOfMemory { .. })));

    assert_eq!((mm[&a].id, mm[&b].id), (1, 2));
    assert_eq!((a.ref_count(), b.ref_count()), (1, 2));
    assert_eq!(mm.count::<Item>(), 2);
    drop((a, b, c));
    assert!(mm.shutdown().is_empty());
    // SAFETY: the block is ours and unused.
    unsafe { TIGHT.free(_room) };
    assert_eq!(TIGHT.stats().in_use, 0);
}

#[test]
fn create_panics_with_the_refusal() {
    static NOTHING: SegmentAlloc = SegmentAlloc::with_limit(0);
    let mm = ObjectManager::builder().allocator_for::<Item, _>(&NOTHING).build();
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(mm.create(item(1))))).unwrap_err();
    let message = panic.downcast_ref::<String>().expect("a formatted message");
    assert!(message.contains("out of memory") && message.contains("Item"), "{message}");
    assert_eq!(mm.count::<Item>(), 0);
}

/// A segment whose size does not fit the address space is refused before
/// the allocator is asked.
#[test]
fn segment_too_large_for_the_address_space_is_an_error() {
    #[derive(MMObject)]
    struct Huge {
        bytes: [u8; 1 << 57],
    }
    // 64 slots of 2^57 bytes do not fit in `isize`.
    let mm = ObjectManager::new();
    assert!(matches!(mm.try_reserve::<Huge>(1), Err(Error::StoreOutOfMemory { type_name: "Huge", .. })));
    let other = mm.create(item(1));
    assert_eq!(mm[&other].id, 1);
}

/// The system allocator's own refusal (a petabyte) is an error too.
#[test]
#[cfg_attr(miri, ignore = "Miri stops on allocations it cannot serve instead of returning null")]
fn system_refusal_is_an_error() {
    #[derive(MMObject)]
    struct Huge {
        bytes: [u8; 1 << 44],
    }
    let mm = ObjectManager::new();
    assert!(matches!(mm.try_reserve::<Huge>(1), Err(Error::StoreOutOfMemory { type_name: "Huge", .. })));
}

/// An object whose `visit_handles` lies (keys of live objects it does not
/// hold, garbage keys, keys of another manager) can make the forensics wrong,
/// but never frees a live object.
#[test]
fn lying_visit_handles_never_frees_a_live_object() {
    struct Liar {
        claims: Vec<ObjectKey>,
    }
    impl VisitHandles for Liar {
        fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
            for &key in &self.claims {
                visitor(key);
                visitor(key);
            }
        }
    }
    impl MMObject for Liar {
        const TYPE_NAME: &'static str = "Liar";
        const TAG: &'static str = "Liar";
        fn size(&self) -> usize {
            usize::MAX
        }
        fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
            VisitHandles::visit_handles(self, visitor);
        }
    }

    let other = ObjectManager::new();
    let foreign = other.create(item(9));
    let mut mm = ObjectManager::new();
    let target = mm.create(item(1));
    let garbage = slotmap::KeyData::from_ffi(u64::MAX).into();
    let liar = mm.create(Liar { claims: vec![target.key(), garbage, foreign.key()] });
    let target_weak = target.downgrade();
    let liar_weak = liar.downgrade();
    let target_raw = target.into_raw();
    drop(liar);
    let liar_again = mm.upgrade(liar_weak);
    assert!(liar_again.is_none(), "the liar is dead once its last handle is gone");

    let _ = mm.find_cycles();
    mm.collect_cycles();
    mm.collect_garbage();
    let _ = mm.report();
    assert_eq!(mm.get_weak(target_weak).map(|i| i.id), Some(1), "the object held by a raw handle is alive");
    mm.release_raw(target_raw).unwrap();
    mm.collect_garbage();
    assert!(mm.get_weak(target_weak).is_none());
    drop(foreign);
    assert!(mm.shutdown().is_empty());
}

/// `size()` is a safe method and may claim anything: with two objects of `usize::MAX`
/// bytes each, every byte total saturates instead of overflowing (in debug builds that was
/// a panic in the report, in `collect_cycles`, in a `CycleCollector` step, and in the
/// shutdown's leak report, which also runs from `Drop`).
#[test]
fn byte_totals_saturate_when_sizes_claim_the_maximum() {
    struct Huge {
        next: Option<mmobject::Handle<Huge>>,
    }
    impl MMObject for Huge {
        const TYPE_NAME: &'static str = "Huge";
        const TAG: &'static str = "Huge";
        fn size(&self) -> usize {
            usize::MAX
        }
        fn may_hold_handles() -> bool {
            true
        }
        fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
            if let Some(next) = &self.next {
                visitor(next.key());
            }
        }
        fn release_handles(&mut self) {
            self.next = None;
        }
    }
    let cycle = |mm: &mut ObjectManager| {
        let a = mm.create(Huge { next: None });
        let b = mm.create(Huge { next: Some(a.clone()) });
        mm.get_mut(&a).next = Some(b.clone());
    };

    let mut mm = ObjectManager::builder().report_leaks(false).build();
    let held = [mm.create(Huge { next: None }), mm.create(Huge { next: None })];
    assert_eq!(mm.report().total_bytes(), usize::MAX);
    // A dead object first: the first collection inside each cycle pass already counts
    // `usize::MAX` bytes, and the cycle's adds more.
    drop(mm.create(Huge { next: None }));
    cycle(&mut mm);
    let freed = mm.collect_cycles();
    assert_eq!((freed.objects, freed.bytes), (3, usize::MAX));
    drop(mm.create(Huge { next: None }));
    cycle(&mut mm);
    let mut collector = mmobject::CycleCollector::new();
    let mut collected = 0;
    for _ in 0..100 {
        collected += collector.step(&mut mm, std::time::Duration::from_millis(5)).collected.objects;
        if collected >= 3 {
            break;
        }
    }
    assert_eq!(collected, 3, "the collector frees the dead object and the cycle");
    assert_eq!(mm.report().total_bytes(), usize::MAX);
    // Held by raw references at shutdown: reported as leaks, and (no handle outlives the
    // manager) their memory is freed.
    let _raws = held.map(mmobject::Handle::into_raw);
    let report = mm.shutdown();
    assert_eq!(report.len(), 2);
    assert_eq!(report.total_bytes(), usize::MAX);
    assert_eq!((report.outliving_handles(), report.leaked_bytes()), (0, 0));
}

/// Raw handles made of garbage are refused, never followed.
#[test]
fn forged_raw_handles_are_refused() {
    let mm = ObjectManager::new();
    let live = mm.create(item(1));
    let raw = live.clone().into_raw();
    let bits = u64::from(raw);
    for forged in [0, u64::MAX, bits ^ 1, bits ^ (1 << 33), bits + (1 << 32), bits ^ (0xff << 56), bits & 0xffff_ffff] {
        let forged = RawHandle(forged);
        if forged == raw {
            continue;
        }
        assert!(mm.add_ref_raw(forged).is_err(), "{forged:?}");
        assert!(mm.release_raw(forged).is_err(), "{forged:?}");
        assert!(mm.handle_from_raw::<Item>(forged).is_err(), "{forged:?}");
    }
    assert_eq!(live.ref_count(), 2, "failed calls change no count");
    mm.release_raw(raw).unwrap();
    assert!(matches!(mm.release_raw(raw), Err(Error::DoubleRelease { .. })));
    assert_eq!(live.ref_count(), 1);
}

/// A store writes a slot's header only when it first hands the slot out, so
/// the rest of a new segment is memory nothing has written. Keys and raw
/// handles forged to name such slots (same manager, same store, an index
/// past every slot used) are unknown to every call that takes one: none of
/// them reads such a header, which holds whatever the memory held before
/// (with the check removed, the lookup by key reads one and calls the key
/// stale instead).
#[test]
fn keys_to_slots_never_handed_out_are_unknown() {
    let mut mm = ObjectManager::new();
    let live = mm.create(item(1));
    let key = live.key();
    let raw = live.clone().into_raw();
    let raw_bits = u64::from(raw);
    // Under Miri a few indices, spread over the first segment (slow there).
    let aheads: Vec<u64> = if cfg!(miri) { vec![1, 2, 31, 79] } else { (1..80).collect() };
    for ahead in aheads {
        for generation in [key.generation(), key.generation() - 1, key.generation() + 1] {
            let index = u64::from(key.index()) + ahead;
            let forged: ObjectKey = slotmap::KeyData::from_ffi(index | u64::from(generation) << 32).into();
            assert_eq!(mm.get_by_key::<Item>(forged), None, "{forged:?}");
            assert!(
                matches!(mm.try_get_by_key::<Item>(forged), Err(Error::UnknownKey { .. })),
                "{forged:?}: {:?}",
                mm.try_get_by_key::<Item>(forged)
            );
            assert!(mm.holders(forged).is_empty(), "{forged:?}");
            assert!(mm.retention_path(forged).is_none(), "{forged:?}");
            let forged_raw = RawHandle(raw_bits & !(0xff_ffff << 32) | index << 32);
            assert!(mm.add_ref_raw(forged_raw).is_err(), "{forged_raw:?}");
            assert!(mm.release_raw(forged_raw).is_err(), "{forged_raw:?}");
            assert!(mm.try_get_raw::<Item>(forged_raw).is_err(), "{forged_raw:?}");
            assert!(mm.handle_from_raw::<Item>(forged_raw).is_err(), "{forged_raw:?}");
        }
    }
    assert_eq!(mm.get_by_key::<Item>(key).map(|i| i.id), Some(1), "the real key still reads");
    assert_eq!(live.ref_count(), 2, "failed calls change no count");
    mm.release_raw(raw).unwrap();
    drop(live);
    assert_eq!(mm.collect_garbage().objects, 1);
}

/// Handles are `Send + Sync` for every object type: clones and drops on
/// other threads, with the last drop racing the collector.
#[test]
fn handles_cross_threads_for_every_object_type() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<mmobject::Handle<Item>>();
    assert_send_sync::<mmobject::WeakHandle<Item>>();
    assert_send_sync::<ObjectManager>();

    let mut mm = ObjectManager::new();
    let handles: Vec<_> = (0..8).map(|i| mm.create(item(i))).collect();
    std::thread::scope(|s| {
        for h in handles {
            s.spawn(move || {
                let copies: Vec<_> = (0..4).map(|_| h.clone()).collect();
                drop(copies);
                drop(h);
            });
        }
    });
    assert_eq!(mm.collect_garbage().objects, 8);
}

/// The per-frame types: their auto traits, and `mem::forget` of an
/// iterator (the only one with a `Drop`: views have none, so forgetting one
/// is dropping it), which leaves the manager whole.
#[test]
fn frame_access_types_cross_threads_and_survive_forget() {
    fn assert_send_sync<T: Send + Sync>() {}
    fn assert_send<T: Send>() {}
    assert_send_sync::<mmobject::Iter<'static, Item>>();
    assert_send_sync::<mmobject::IterMut<'static, Item>>();
    assert_send_sync::<mmobject::ObjectViewMut<'static, Item>>();
    assert_send_sync::<mmobject::Loader>();
    assert_send::<mmobject::Views<'static>>();

    let mut mm = ObjectManager::new();
    let a = mm.create(item(1));
    let b = mm.create(item(2));
    std::mem::forget(mm.iter_mut::<Item>());
    std::mem::forget(mm.iter::<Item>());
    mm.get_mut(&a).id = 10;
    let [x, y] = mm.get_disjoint_mut([&a, &b]);
    std::mem::swap(&mut x.payload, &mut y.payload);
    std::thread::scope(|s| {
        let it = mm.iter::<Item>();
        s.spawn(move || assert_eq!(it.map(|(_, i)| i.id).sum::<u32>(), 12));
    });
    assert_eq!(mm[&a].payload, vec![2; 4]);
    drop((a, b));
    assert_eq!(mm.collect_garbage().objects, 2);
}
