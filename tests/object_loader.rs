//! `Loader`: creating objects from other threads while the main thread holds
//! `&mut ObjectManager`, visibility, shutdown, and creates from inside a
//! collection.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

use mmobject::{Error, Handle, Loader, MMObject, ObjectManager};
use support::quiet_with;

#[derive(MMObject, Debug)]
struct Prop {
    id: u32,
    payload: Vec<u32>,
}

fn prop(id: u32) -> Prop {
    Prop { id, payload: vec![id; 4] }
}

#[derive(MMObject)]
struct Late(u32);

#[test]
fn loader_is_send_sync_clone() {
    fn check<T: Send + Sync + Clone + std::fmt::Debug + 'static>() {}
    check::<Loader>();
}

/// The main thread's frames while loader threads send it what they made:
/// each frame takes what arrived (`take`), writes every `Prop` and collects,
/// until the loaders hang up. Runs at least one frame.
fn frames_until_loaded<T>(mm: &mut ObjectManager, loaded: &mpsc::Receiver<T>, mut take: impl FnMut(&ObjectManager, T)) {
    loop {
        let disconnected = loop {
            match loaded.try_recv() {
                Ok(made) => take(mm, made),
                Err(mpsc::TryRecvError::Empty) => break false,
                Err(mpsc::TryRecvError::Disconnected) => break true,
            }
        };
        for (_, p) in mm.iter_mut::<Prop>() {
            p.payload[0] = p.id;
        }
        mm.collect_garbage();
        if disconnected {
            return;
        }
    }
}

#[test]
fn loader_threads_create_while_the_main_thread_updates_and_collects() {
    let mut mm = quiet_with(2);
    let per_thread = if cfg!(miri) { 30 } else { 2000 };
    let (send, loaded) = mpsc::channel::<Handle<Prop>>();
    let threads: Vec<_> = (0..2u32)
        .map(|t| {
            let loader = mm.loader();
            let send = send.clone();
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    send.send(loader.create(prop(t * 1_000_000 + i))).unwrap();
                }
            })
        })
        .collect();
    drop(send);
    let mut kept = Vec::new();
    frames_until_loaded(&mut mm, &loaded, |mm, h| {
        // Visible at once: read through the handle on this thread.
        assert_eq!(mm[&h].payload, vec![mm[&h].id; 4]);
        // Keep half; the other half dies and is collected while the loaders
        // pop freed slots.
        if mm[&h].id % 2 == 0 {
            kept.push(h);
        }
    });
    for t in threads {
        t.join().unwrap();
    }
    mm.collect_garbage();
    assert_eq!(mm.count::<Prop>(), kept.len());
    assert_eq!(kept.len(), per_thread as usize);
    for h in &kept {
        assert_eq!(mm[h].payload, vec![mm[h].id; 4], "no slot was handed out twice");
    }
    let report = mm.report();
    let line = report.get("Prop").unwrap();
    assert_eq!(line.created, 2 * u64::from(per_thread));
    assert_eq!(line.destroyed, u64::from(per_thread));
}

#[test]
fn loader_objects_are_visible_at_once_but_not_to_a_running_iteration() {
    let mut mm = quiet_with(2);
    let loader = mm.loader();
    let first: Vec<_> = (0..4).map(|i| mm.create(prop(i))).collect();
    drop(first);
    mm.collect_garbage(); // free slots ahead of any cursor
    let a = mm.create(prop(10));
    let b = loader.create(prop(11));
    assert_eq!(mm[&b].id, 11);
    assert!(mm.upgrade(b.downgrade()).is_some());
    assert_eq!(mm.iter::<Prop>().count(), 2);
    let mut made = Vec::new();
    for (_, p) in mm.iter_mut::<Prop>() {
        made.push(loader.create(prop(p.id + 100)));
    }
    assert_eq!(made.len(), 2, "the iteration saw only what existed when it began");
    assert_eq!(mm.count::<Prop>(), 4);
    drop((a, b, made));
}

#[test]
fn a_type_first_registered_by_a_loader_is_seen_by_views_made_before() {
    let mut mm = quiet_with(2);
    let loader = mm.loader();
    let view = mm.view_mut::<Late>();
    let late = std::thread::spawn(move || loader.create(Late(5))).join().unwrap();
    assert_eq!(view.get_weak(late.downgrade()).map(|l| l.0), Some(5));
    assert_eq!(view.iter().count(), 1);
    assert_eq!(mm.count::<Late>(), 1);
}

#[test]
fn loader_after_shutdown_gives_the_value_back() {
    let mm = quiet_with(2);
    let loader = mm.loader();
    // Alive at shutdown, held by a raw handle only (so its memory is freed;
    // handles that outlive a manager are tested in object_outliving.rs).
    let _kept = loader.create(prop(1)).into_raw();
    assert!(loader.is_open());
    let id = mm.id();
    let report = mm.shutdown();
    assert_eq!(report.len(), 1, "loader objects are reported like any other");
    assert!(report.iter().next().unwrap().site.file().ends_with("object_loader.rs"));
    assert!(!loader.is_open());
    let err = loader.try_create(prop(2)).unwrap_err();
    assert_eq!(err.error, Error::ManagerShutDown { manager: id });
    assert_eq!(err.into_value().id, 2);
    let caught = catch_unwind(AssertUnwindSafe(|| loader.create(prop(3))));
    let message = caught.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains("has shut down"), "{message}");
    assert_eq!(loader.manager_id(), id);
    assert!(format!("{loader:?}").contains("open: false"));
}

/// A value whose `Drop` creates through a loader: it runs inside a
/// collection, which must not hold the lock a loader takes.
struct Respawn(Option<Loader>);

impl Drop for Respawn {
    fn drop(&mut self) {
        if let Some(loader) = self.0.take() {
            let _held_by_raw = loader.create(prop(99)).into_raw();
        }
    }
}

#[derive(MMObject)]
struct Spawner {
    #[mm(skip)]
    _respawn: Respawn,
}

#[test]
fn a_drop_inside_collection_may_create_through_a_loader() {
    let mut mm = quiet_with(2);
    for i in 0..4 {
        drop(mm.create(prop(i)));
    }
    mm.collect_garbage(); // free Prop slots for the loader to pop
    drop(mm.create(Spawner { _respawn: Respawn(Some(mm.loader())) }));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(mm.count::<Prop>(), 1);
    assert_eq!(mm.iter::<Prop>().next().unwrap().1.id, 99);
}

// ---- batches ----------------------------------------------------------------

#[test]
fn loader_batches_create_while_the_main_thread_collects() {
    let mut mm = quiet_with(2);
    let (batches, per_batch) = if cfg!(miri) { (3, 10) } else { (60, 50) };
    let (send, loaded) = mpsc::channel::<Vec<Handle<Prop>>>();
    let threads: Vec<_> = (0..2u32)
        .map(|t| {
            let loader = mm.loader();
            let send = send.clone();
            std::thread::spawn(move || {
                for b in 0..batches {
                    let first = t * 1_000_000 + b * per_batch;
                    send.send(loader.create_many((first..first + per_batch).map(prop))).unwrap();
                }
            })
        })
        .collect();
    drop(send);
    let mut kept = Vec::new();
    frames_until_loaded(&mut mm, &loaded, |mm, batch| {
        assert_eq!(batch.len(), per_batch as usize);
        // Keep half; the other half dies, and the loaders pop its slots.
        kept.extend(batch.into_iter().filter(|h| mm[h].id % 2 == 0));
    });
    for t in threads {
        t.join().unwrap();
    }
    mm.collect_garbage();
    let made = 2 * u64::from(batches * per_batch);
    assert_eq!(kept.len() as u64, made / 2);
    assert_eq!(mm.count::<Prop>(), kept.len());
    for h in &kept {
        assert_eq!(mm[h].payload, vec![mm[h].id; 4], "no slot was handed out twice");
    }
    let line = mm.report().get("Prop").unwrap().clone();
    assert_eq!((line.created, line.destroyed), (made, made / 2));
    drop(kept);
    mm.collect_garbage();
    let report = mm.shutdown();
    assert!(report.is_empty(), "{report}");
    assert_eq!(report.leaked_bytes(), 0);
}

/// An iterator whose `size_hint` promises far more than it yields.
struct Promises {
    next: u32,
    yields: u32,
}

impl Iterator for Promises {
    type Item = Prop;
    fn next(&mut self) -> Option<Prop> {
        (self.next < self.yields).then(|| {
            self.next += 1;
            prop(500 + self.next)
        })
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        (1000, Some(1000))
    }
}

/// A value whose `Drop` runs a loader batch that takes more never-used slots
/// than it fills: inside a collection, on the thread that collects.
struct RespawnMany(Option<Loader>);

impl Drop for RespawnMany {
    fn drop(&mut self) {
        if let Some(loader) = self.0.take() {
            for h in loader.create_many(Promises { next: 0, yields: 2 }) {
                let _held_by_raw = h.into_raw();
            }
        }
    }
}

#[derive(MMObject)]
struct ManySpawner {
    #[mm(skip)]
    _respawn: RespawnMany,
}

/// A loader batch that a `Drop` runs inside a collection, on the collecting
/// thread, and that takes more never-used slots than it fills, leaves the
/// store consistent: the counts see its two objects only, and no slot is
/// handed out twice afterwards. (Whether it takes that thread's own slots is
/// not observable here: a version that did passed too.)
#[test]
fn a_drop_inside_collection_may_create_many_through_a_loader() {
    let mut mm = quiet_with(2);
    // This thread's run of fresh slots is used up, and a collection keeps
    // it 16 freed slots: the state a batch must leave alone.
    let mut first: Vec<Handle<Prop>> = (0..64).map(prop).map(|p| mm.create(p)).collect();
    first.truncate(48);
    mm.collect_garbage();
    drop(mm.create(ManySpawner { _respawn: RespawnMany(Some(mm.loader())) }));
    assert_eq!(mm.collect_garbage().objects, 1);
    assert_eq!(mm.count::<Prop>(), 50);
    mm.collect_garbage();
    let more: Vec<Handle<Prop>> = (0..300).map(|i| mm.create(prop(1000 + i))).collect();
    assert_eq!(mm.count::<Prop>(), 350);
    let mut ids: Vec<u32> = mm.iter::<Prop>().map(|(_, p)| p.id).collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 350, "every object has a slot of its own");
    drop((first, more));
    mm.collect_garbage();
    assert_eq!(mm.count::<Prop>(), 2, "the batch's two, held by raw handles");
}

#[test]
fn a_loader_batch_after_shutdown_gives_the_first_value_back() {
    let mm = quiet_with(2);
    let loader = mm.loader();
    let id = mm.id();
    drop(mm);
    let mut handles = Vec::new();
    let mut stream = (0..5).map(prop);
    let err = loader.try_create_many(stream.by_ref(), &mut handles).unwrap_err();
    assert_eq!(err.error, Error::ManagerShutDown { manager: id });
    assert_eq!(err.into_value().id, 0);
    assert_eq!(stream.map(|p| p.id).collect::<Vec<_>>(), [1, 2, 3, 4], "the rest stay in the iterator");
    assert!(handles.is_empty());
    let caught = catch_unwind(AssertUnwindSafe(|| loader.create_many((0..3).map(prop))));
    let message = caught.unwrap_err().downcast::<String>().unwrap();
    assert!(message.contains("has shut down"), "{message}");
}

/// A loader batch whose iterator panics part way, with freed slots and a
/// run of fresh ones in play: the objects made so far go with the unwind,
/// and no slot is lost (the type's limit is reached again exactly).
#[test]
fn a_loader_batch_whose_iterator_panics_loses_no_capacity() {
    let limit = 64;
    let mut mm = ObjectManager::builder().max_objects_per_type(limit).report_leaks(false).build();
    drop(mm.create_many((0..20).map(prop)));
    mm.collect_garbage(); // 20 freed slots wait on the free list
    let loader = mm.loader();
    let unwound = std::thread::spawn(move || {
        let values = (0..40).map(|i| if i == 30 { panic!("the level file is corrupt") } else { prop(i) });
        catch_unwind(AssertUnwindSafe(|| loader.create_many(values))).is_err()
    })
    .join()
    .unwrap();
    assert!(unwound);
    mm.collect_garbage();
    assert_eq!(mm.count::<Prop>(), 0, "the 30 made before the panic went with the unwind");
    let mut all = Vec::new();
    assert!(mm.loader().try_create_many((0..limit).map(prop), &mut all).is_ok());
    assert_eq!(all.len(), limit as usize, "every slot is back");
    assert!(mm.try_create(prop(99)).is_err(), "and no more");
    drop(all);
}

#[test]
fn a_loader_batch_that_promises_too_much_loses_no_capacity() {
    let limit = 64;
    let mut mm = ObjectManager::builder().max_objects_per_type(limit).report_leaks(false).build();
    let loader = mm.loader();
    let two = std::thread::spawn(move || loader.create_many(Promises { next: 0, yields: 2 })).join().unwrap();
    assert_eq!(mm.count::<Prop>(), 2, "counts see no phantom objects");
    mm.collect_garbage(); // the unfilled slots go back
    let mut rest = Vec::new();
    assert!(mm.loader().try_create_many((0..limit).map(prop), &mut rest).is_err());
    assert_eq!(rest.len(), limit as usize - 2, "every slot but the two objects' is back");
    drop((two, rest));
}

/// The slot indices of `handles`, sorted.
fn indices(handles: &[Handle<Prop>]) -> Vec<u32> {
    let mut indices: Vec<u32> = handles.iter().map(|h| h.key().index()).collect();
    indices.sort_unstable();
    indices
}

/// A loader thread driven a frame at a time: each message makes `n` props
/// through the loader, drops the props the message before made (so the main
/// thread's next collection frees their slots), and sends back the new
/// props' slot indices. Hangs up when the sender does.
fn frame_worker(loader: Loader, n: u32) -> (mpsc::Sender<()>, mpsc::Receiver<Vec<u32>>, std::thread::JoinHandle<()>) {
    let (go, frames) = mpsc::channel::<()>();
    let (send, made) = mpsc::channel();
    let worker = std::thread::spawn(move || {
        let mut held: Vec<Handle<Prop>> = Vec::new();
        while frames.recv().is_ok() {
            let new: Vec<Handle<Prop>> = (0..n).map(|id| loader.create(prop(id))).collect();
            let made = indices(&new);
            held = new; // the previous frame's drop here, before the reply
            send.send(made).unwrap();
        }
        drop(held);
    });
    (go, made, worker)
}

/// A loader thread that replaces its objects every frame creates them in
/// the very slots the last collection freed: the collection hands them to
/// the thread's shard at once (not a collection later, through the owner's
/// kept slots and the free list), so the store holds two frames' objects.
#[test]
fn a_loader_thread_creates_in_the_slots_the_last_collection_freed() {
    let mut mm = quiet_with(2);
    let n = 16;
    let (go, made, worker) = frame_worker(mm.loader(), n);
    // The slots each frame made its objects in.
    let mut frames: Vec<Vec<u32>> = Vec::new();
    for frame in 0..12 {
        go.send(()).unwrap();
        let now = made.recv().unwrap();
        if frame >= 2 {
            // Frames 0 and 1 take fresh slots (the first slots are freed
            // by the collection after frame 1). The collection after frame
            // f - 1 freed the slots of frame f - 2's objects, which frame
            // f - 1 replaced, and handed them to the thread.
            assert_eq!(now, frames[frame - 2], "frame {frame}: the slots the last collection freed");
        }
        // The worker dropped its previous frame's objects before it replied.
        let freed = mm.collect_garbage().objects;
        assert_eq!(freed, if frame == 0 { 0 } else { n as usize });
        assert_eq!(mm.count::<Prop>(), n as usize, "held slots are not objects");
        let report = mm.report();
        let props = report.get("Prop").unwrap();
        assert_eq!((props.live, props.dead_pending), (n as usize, 0));
        assert_eq!(props.created - props.destroyed, u64::from(n));
        frames.push(now);
    }
    drop(go);
    worker.join().unwrap();
    assert_eq!(mm.collect_garbage().objects, n as usize);
    let report = mm.shutdown();
    assert!(report.is_empty(), "{report}");
    assert_eq!((report.outliving_handles(), report.leaked_bytes()), (0, 0));
}

/// Slots handed to a loader thread that then makes nothing go back to every
/// thread at the next collection: here the main thread's creates reuse them
/// instead of growing the store. While held, they count as free.
#[test]
fn an_idle_loader_threads_slots_go_back_to_every_thread() {
    let mut mm = quiet_with(2);
    let n = 16;
    let (go, made, worker) = frame_worker(mm.loader(), n);
    go.send(()).unwrap();
    let made_first = made.recv().unwrap();
    go.send(()).unwrap();
    let made_second = made.recv().unwrap();
    // The first frame's objects are dead; this collection frees their slots
    // and hands them all to the worker's shard (its last frame made `n`).
    assert_eq!(mm.collect_garbage().objects, n as usize);
    let report = mm.report();
    let props = report.get("Prop").unwrap();
    assert_eq!((props.live, props.dead_pending, props.created - props.destroyed), (n as usize, 0, u64::from(n)));
    // The worker makes nothing in this frame: the next collection gives its
    // slots back, and the main thread's creates take them.
    assert_eq!(mm.collect_garbage().objects, 0);
    let mine: Vec<Handle<Prop>> = (0..n).map(|id| mm.create(prop(100 + id))).collect();
    assert_eq!(indices(&mine), made_first, "the idle thread's slots, not fresh ones");
    assert!(indices(&mine).iter().all(|i| !made_second.contains(i)));
    drop((go, mine));
    worker.join().unwrap();
    assert_eq!(mm.collect_garbage().objects, 2 * n as usize);
    assert_eq!(mm.count::<Prop>(), 0);
}

/// Shutdown while a loader thread's shard holds slots: every slot is
/// accounted for, nothing is reported or leaked.
#[test]
fn shutdown_accounts_for_the_slots_held_for_loader_threads() {
    let mut mm = quiet_with(2);
    let (go, made, worker) = frame_worker(mm.loader(), 8);
    for _ in 0..3 {
        go.send(()).unwrap();
        made.recv().unwrap();
        mm.collect_garbage();
    }
    // One more frame, uncollected: the worker's shard holds slots and has
    // made objects since the last collection, so shutdown's collection
    // keeps them there. The worker drops the third frame's 8 objects in the
    // fourth, and the fourth's as it exits.
    go.send(()).unwrap();
    made.recv().unwrap();
    drop(go);
    worker.join().unwrap();
    assert_eq!(mm.dead_count(), 16);
    let report = mm.shutdown();
    assert!(report.is_empty(), "{report}");
    assert_eq!((report.outliving_handles(), report.leaked_bytes()), (0, 0));
}
