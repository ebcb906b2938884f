//! `Loader`: creating objects from other threads while the main thread holds
//! `&mut ObjectManager`, visibility, shutdown, and creates from inside a
//! collection.

mod support;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;

use mmobject::{Error, Handle, Loader, MMObject};
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
    let mut frames = 0u32;
    loop {
        frames += 1;
        let mut disconnected = false;
        loop {
            match loaded.try_recv() {
                // Visible at once: read through the handle on this thread.
                Ok(h) => {
                    assert_eq!(mm[&h].payload, vec![mm[&h].id; 4]);
                    // Keep half; the other half dies and is collected while
                    // the loaders pop freed slots.
                    if mm[&h].id % 2 == 0 {
                        kept.push(h);
                    }
                }
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        for (_, p) in mm.iter_mut::<Prop>() {
            p.payload[0] = p.id;
        }
        mm.collect_garbage();
        if disconnected {
            break;
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    mm.collect_garbage();
    assert!(frames > 0);
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
