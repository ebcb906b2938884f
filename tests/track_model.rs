//! Property test: the tracker's explicit API against a `HashMap` model.

use std::collections::HashMap;

use mmobject::track::{Mode, TagId, Tracker};
use mmobject::Error;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Track { slot: usize, size: usize, tag: usize },
    Untrack { slot: usize },
    Charge { tag: usize, size: usize },
    Credit { tag: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..32usize, 1..5000usize, 0..3usize).prop_map(|(slot, size, tag)| Op::Track { slot, size, tag }),
        (0..32usize).prop_map(|slot| Op::Untrack { slot }),
        (0..3usize, 1..100usize).prop_map(|(tag, size)| Op::Charge { tag, size }),
        (0..3usize).prop_map(|tag| Op::Credit { tag }),
    ]
}

fn config() -> ProptestConfig {
    let mut config = ProptestConfig::with_cases(if cfg!(miri) { 4 } else { 256 });
    if cfg!(miri) {
        // No file system under Miri's isolation: keep failures in memory.
        config.failure_persistence = None;
    }
    config
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn explicit_api_matches_a_model(ops in proptest::collection::vec(op(), 1..200)) {
        let t = Tracker::with_mode(Mode::Records);
        let tags: Vec<TagId> = ["model-a", "model-b", "model-c"].iter().map(|n| t.tag_named(n)).collect();
        let memory = [0u8; 32];
        // Model: live blocks by slot, charges by tag (a stack of sizes), bytes by tag.
        let mut live: HashMap<usize, (usize, usize)> = HashMap::new();
        let mut freed: std::collections::HashSet<usize> = Default::default();
        let mut charges: Vec<Vec<usize>> = vec![Vec::new(); 3];
        let mut bytes = [0usize; 3];
        let mut count = [0usize; 3];
        let mut errors = (0usize, 0usize);
        for op in ops {
            match op {
                Op::Track { slot, size, tag } => {
                    if live.contains_key(&slot) {
                        continue; // tracking twice is not a case the model covers
                    }
                    t.try_track(&memory[slot], size, tags[tag]).unwrap();
                    live.insert(slot, (size, tag));
                    freed.remove(&slot);
                    bytes[tag] += size;
                    count[tag] += 1;
                }
                Op::Untrack { slot } => {
                    let addr = &memory[slot] as *const u8 as usize;
                    match live.remove(&slot) {
                        Some((size, tag)) => {
                            prop_assert_eq!(t.try_untrack(&memory[slot]), Ok(size));
                            bytes[tag] -= size;
                            count[tag] -= 1;
                            freed.insert(slot);
                        }
                        None if freed.contains(&slot) => {
                            prop_assert_eq!(t.try_untrack(&memory[slot]), Err(Error::DoubleFree { addr }));
                            errors.1 += 1;
                        }
                        None => {
                            prop_assert_eq!(t.try_untrack(&memory[slot]), Err(Error::UntrackedFree { addr }));
                            errors.0 += 1;
                        }
                    }
                }
                Op::Charge { tag, size } => {
                    t.try_charge(tags[tag], size).unwrap();
                    charges[tag].push(size);
                    bytes[tag] += size;
                    count[tag] += 1;
                }
                Op::Credit { tag } => {
                    if let Some(size) = charges[tag].pop() {
                        t.credit(tags[tag], size);
                        bytes[tag] -= size;
                        count[tag] -= 1;
                    }
                }
            }
            for i in 0..3 {
                let s = t.tag_stats(tags[i]);
                prop_assert_eq!((s.bytes, s.count), (bytes[i], count[i]));
                prop_assert!(s.peak_bytes >= s.bytes && s.peak_count >= s.count);
            }
        }
        prop_assert_eq!(t.live_records(), live.len());
        let e = t.error_counts();
        prop_assert_eq!((e.untracked_frees, e.double_frees), errors);
        let leaks = t.leak_report();
        prop_assert_eq!(leaks.total_count, live.len());
        prop_assert_eq!(leaks.total_bytes, live.values().map(|v| v.0).sum::<usize>());
    }
}
