//! A randomized, multi-threaded stress test of the object layer.
//!
//! Each run builds one to three managers (owner thread on or off, deferred
//! drops on or off where there is no owner, some with
//! a per-type cap, tiny or default segments) and plays a few frames. In a
//! frame, worker threads share the managers (`&ObjectManager`): they create,
//! read, upgrade, clone, drop, make raw handles and pass handles to each
//! other, while the main thread reads and iterates. Then the main thread
//! takes the managers mutably and collects, releases, links and unlinks
//! cyclic objects and writes through views, while the workers only create
//! through loaders, clone, drop and pass handles. After the joins, every
//! count is checked exactly. At the end every handle goes, cycles are
//! collected, and shutdown must report nothing (or, in some runs, handles
//! outlive the manager on a thread that keeps cloning and dropping them).
//!
//! Every object carries a shared `Life` record: a unique id, an alive flag,
//! its drop count, and a lower bound of the strong references the test holds
//! on it (raised after a reference is made, lowered before one is given up),
//! so its `Drop` can tell if it runs while a reference exists. Every read
//! checks the object is alive and is the one expected.
//!
//! `MMOBJECT_STRESS_ITERS` sets the number of runs (default small),
//! `MMOBJECT_STRESS_SEED` the first seed. A failing run prints its seed.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, Once};
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use mmobject::object::RawHandle;
use mmobject::{CycleCollector, Handle, Loader, MMObject, ObjectManager, WeakHandle};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Totals over the runs of this process, printed at the end.
static CREATED: AtomicUsize = AtomicUsize::new(0);
static PANICS_CAUGHT: AtomicUsize = AtomicUsize::new(0);
static OUTLIVED: AtomicUsize = AtomicUsize::new(0);

const PANIC_MESSAGE: &str = "stress: a Drop that panics on purpose";

/// What every object of one manager shares: failures seen in `Drop`, and
/// whether the manager is being shut down with handles still out.
#[derive(Default)]
struct Shared {
    errors: Mutex<Vec<String>>,
    outliving: AtomicBool,
}

impl Shared {
    fn fail(&self, message: String) {
        self.errors.lock().unwrap().push(message);
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Plain,
    Node,
}

struct Life {
    id: u64,
    kind: Kind,
    panics: bool,
    /// Set once the manager accepted the object (a refused value drops uncounted).
    registered: AtomicBool,
    alive: AtomicBool,
    drops: AtomicU32,
    /// Strong references the test holds outside objects: handles in `Held`
    /// and raw references. Never more than the real count.
    held: AtomicU32,
    /// Set once a raw handle of the object exists (at most one `Raw` per object,
    /// since every raw handle of an object is the same number).
    has_raw: AtomicBool,
    shared: Arc<Shared>,
}

fn payload(id: u64) -> u64 {
    id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA5A5_5A5A
}

/// The field whose `Drop` checks the object's life.
struct Token(Arc<Life>);

impl Drop for Token {
    fn drop(&mut self) {
        let life = &self.0;
        if !life.registered.load(SeqCst) {
            return;
        }
        let held = life.held.load(SeqCst);
        if held != 0 && !life.shared.outliving.load(SeqCst) {
            life.shared.fail(format!("object {} ({:?}) dropped while {held} reference(s) held", life.id, life.kind));
        }
        if !life.alive.swap(false, SeqCst) {
            life.shared.fail(format!("object {} dropped while not alive", life.id));
        }
        let before = life.drops.fetch_add(1, SeqCst);
        if before != 0 {
            life.shared.fail(format!("object {} dropped {} times", life.id, before + 1));
        }
        if life.panics && !std::thread::panicking() {
            panic!("{PANIC_MESSAGE} (object {})", life.id);
        }
    }
}

#[derive(MMObject)]
struct Plain {
    id: u64,
    payload: u64,
    touched: u64,
    #[mm(skip)]
    token: Token,
}

#[derive(MMObject)]
struct Node {
    id: u64,
    payload: u64,
    next: Option<Handle<Node>>,
    item: Option<Handle<Plain>>,
    #[mm(skip)]
    token: Token,
}

/// The handles a new node starts with.
#[derive(Default)]
struct Links {
    next: Option<Handle<Node>>,
    item: Option<Handle<Plain>>,
}

impl Links {
    /// Clones of random handles of `hand`.
    fn pick(hand: &Hand, rng: &mut SmallRng) -> Links {
        Links {
            next: pick(rng, &hand.nodes).map(|i| hand.nodes[i].h().clone()),
            item: pick(rng, &hand.plains).filter(|_| rng.gen_bool(0.5)).map(|i| hand.plains[i].h().clone()),
        }
    }
}

trait Tracked: MMObject + Sized {
    const KIND: Kind;
    fn id(&self) -> u64;
    fn payload(&self) -> u64;
    fn life(&self) -> &Arc<Life>;
    fn make(life: Arc<Life>, links: Links) -> Self;
}

impl Tracked for Plain {
    const KIND: Kind = Kind::Plain;
    fn id(&self) -> u64 {
        self.id
    }
    fn payload(&self) -> u64 {
        self.payload
    }
    fn life(&self) -> &Arc<Life> {
        &self.token.0
    }
    fn make(life: Arc<Life>, _links: Links) -> Self {
        Plain { id: life.id, payload: payload(life.id), touched: 0, token: Token(life) }
    }
}

impl Tracked for Node {
    const KIND: Kind = Kind::Node;
    fn id(&self) -> u64 {
        self.id
    }
    fn payload(&self) -> u64 {
        self.payload
    }
    fn life(&self) -> &Arc<Life> {
        &self.token.0
    }
    fn make(life: Arc<Life>, links: Links) -> Self {
        Node { id: life.id, payload: payload(life.id), next: links.next, item: links.item, token: Token(life) }
    }
}

/// Checks an object read through a handle: alive, and the one expected.
#[track_caller]
fn check<T: Tracked>(value: &T, expected: &Life, how: &str) {
    let life = value.life();
    assert!(life.alive.load(SeqCst), "{how}: read object {} after its Drop", life.id);
    assert!(life.drops.load(SeqCst) == 0, "{how}: read object {} after its Drop", life.id);
    assert_eq!(value.id(), expected.id, "{how}: read another object than expected");
    assert_eq!(life.id, expected.id, "{how}: the object's life is another's");
    assert_eq!(value.payload(), payload(expected.id), "{how}: payload of object {} changed", expected.id);
}

/// Checks an object found without a handle (iteration): alive and self-consistent.
#[track_caller]
fn check_self<T: Tracked>(value: &T, how: &str) {
    let life = Arc::clone(value.life());
    check(value, &life, how);
}

/// A strong handle the test tracks in its object's life.
struct Held<T: Tracked> {
    life: Arc<Life>,
    handle: Option<Handle<T>>,
}

impl<T: Tracked> Held<T> {
    /// Takes over a handle (its reference is counted in `held` from now on).
    fn new(life: Arc<Life>, handle: Handle<T>) -> Self {
        life.held.fetch_add(1, SeqCst);
        Held { life, handle: Some(handle) }
    }

    fn h(&self) -> &Handle<T> {
        self.handle.as_ref().expect("present")
    }

    fn into_handle(mut self) -> Handle<T> {
        self.life.held.fetch_sub(1, SeqCst);
        self.handle.take().expect("present")
    }
}

impl<T: Tracked> Clone for Held<T> {
    fn clone(&self) -> Self {
        Held::new(Arc::clone(&self.life), self.h().clone())
    }
}

impl<T: Tracked> Drop for Held<T> {
    fn drop(&mut self) {
        if self.handle.is_some() {
            // Before the handle goes (the field drops after this).
            self.life.held.fetch_sub(1, SeqCst);
        }
    }
}

/// References held through one raw handle.
struct Raw {
    life: Arc<Life>,
    raw: RawHandle,
    refs: u32,
}

/// One manager's weak handles, as a worker sees them.
type WeakLists = (Vec<Weak<Plain>>, Vec<Weak<Node>>);

struct Weak<T: MMObject> {
    life: Arc<Life>,
    weak: WeakHandle<T>,
}

impl<T: MMObject> Clone for Weak<T> {
    fn clone(&self) -> Self {
        Weak { life: Arc::clone(&self.life), weak: self.weak }
    }
}

/// What one thread holds of one manager.
struct Hand {
    plains: Vec<Held<Plain>>,
    nodes: Vec<Held<Node>>,
    raws: Vec<Raw>,
}

impl Hand {
    fn new() -> Self {
        Hand { plains: Vec::new(), nodes: Vec::new(), raws: Vec::new() }
    }

    fn take(&mut self, rng: &mut SmallRng, share: f64) -> Hand {
        Hand {
            plains: take_share(&mut self.plains, rng, share),
            nodes: take_share(&mut self.nodes, rng, share),
            raws: take_share(&mut self.raws, rng, share),
        }
    }

    fn absorb(&mut self, other: Hand) {
        self.plains.extend(other.plains);
        self.nodes.extend(other.nodes);
        self.raws.extend(other.raws);
    }
}

struct World {
    mm: ObjectManager,
    index: usize,
    owner: bool,
    capped: bool,
    panic_rate: f64,
    shared: Arc<Shared>,
    next_id: Arc<AtomicU64>,
    lives: Arc<Mutex<Vec<Arc<Life>>>>,
    hand: Hand,
    weak_plains: Vec<Weak<Plain>>,
    weak_nodes: Vec<Weak<Node>>,
    collector: CycleCollector,
}

/// What a thread needs to create objects of one manager.
#[derive(Clone)]
struct Maker {
    capped: bool,
    panic_rate: f64,
    shared: Arc<Shared>,
    next_id: Arc<AtomicU64>,
    lives: Arc<Mutex<Vec<Arc<Life>>>>,
}

impl Maker {
    fn life(&self, kind: Kind, rng: &mut SmallRng) -> Arc<Life> {
        Arc::new(Life {
            id: self.next_id.fetch_add(1, SeqCst),
            kind,
            panics: rng.gen_bool(self.panic_rate),
            registered: AtomicBool::new(false),
            alive: AtomicBool::new(true),
            drops: AtomicU32::new(0),
            held: AtomicU32::new(0),
            has_raw: AtomicBool::new(false),
            shared: Arc::clone(&self.shared),
        })
    }

    fn register(&self, life: &Arc<Life>) {
        life.registered.store(true, SeqCst);
        CREATED.fetch_add(1, SeqCst);
        self.lives.lock().unwrap().push(Arc::clone(life));
    }

    /// Creates through `create`, the function given (a manager's or a loader's `try_create`).
    fn create<T: Tracked>(
        &self,
        rng: &mut SmallRng,
        links: Links,
        create: impl FnOnce(T) -> Result<Handle<T>, mmobject::object::TryCreateError<T>>,
    ) -> Option<Held<T>> {
        let life = self.life(T::KIND, rng);
        match create(T::make(Arc::clone(&life), links)) {
            Ok(h) => {
                self.register(&life);
                let held = Held::new(life, h);
                Some(held)
            }
            Err(e) => {
                assert!(self.capped, "a create failed without a cap: {}", e.error);
                assert!(
                    matches!(e.error, mmobject::Error::CapacityExceeded { .. }),
                    "a capped create failed with {}",
                    e.error
                );
                None
            }
        }
    }

    fn create_on<T: Tracked>(&self, mm: &ObjectManager, rng: &mut SmallRng, links: Links) -> Option<Held<T>> {
        if self.capped || rng.gen_bool(0.5) {
            self.create(rng, links, |v| mm.try_create(v))
        } else {
            self.create(rng, links, |v| Ok(mm.create(v)))
        }
    }

    fn create_by<T: Tracked>(&self, loader: &Loader, rng: &mut SmallRng, links: Links) -> Option<Held<T>> {
        if self.capped || rng.gen_bool(0.5) {
            self.create(rng, links, |v| loader.try_create(v))
        } else {
            self.create(rng, links, |v| Ok(loader.create(v)))
        }
    }

    fn create_many(&self, mm: &ObjectManager, rng: &mut SmallRng, n: usize) -> Vec<Held<Plain>> {
        let lives: Vec<Arc<Life>> = (0..n).map(|_| self.life(Kind::Plain, rng)).collect();
        let values = lives.iter().map(|l| Plain::make(Arc::clone(l), Links::default()));
        let handles = if self.capped || rng.gen_bool(0.3) {
            let mut handles = Vec::new();
            // A filter makes the size hint a range, which the batch must cope with.
            let mut values = values.filter(|_| true);
            if let Err(e) = mm.try_create_many(&mut values, &mut handles) {
                assert!(self.capped, "create_many failed without a cap: {}", e.error);
            }
            handles
        } else {
            mm.create_many(values)
        };
        assert!(handles.len() <= n);
        handles
            .into_iter()
            .zip(lives)
            .map(|(h, life)| {
                self.register(&life);
                let held = Held::new(life, h);
                check(&mm[held.h()], &held.life, "create_many");
                held
            })
            .collect()
    }
}

impl World {
    fn maker(&self) -> Maker {
        Maker {
            capped: self.capped,
            panic_rate: self.panic_rate,
            shared: Arc::clone(&self.shared),
            next_id: Arc::clone(&self.next_id),
            lives: Arc::clone(&self.lives),
        }
    }
}

/// Sizes of a run.
struct Sizes {
    frames: usize,
    workers: usize,
    main_ops: usize,
    worker_ops: usize,
    start: usize,
}

fn sizes() -> Sizes {
    if cfg!(miri) {
        Sizes { frames: 1, workers: 2, main_ops: 12, worker_ops: 12, start: 6 }
    } else {
        Sizes { frames: 4, workers: 3, main_ops: 300, worker_ops: 300, start: 60 }
    }
}

/// A handle passed from one worker to another.
enum Parcel {
    Plain(usize, Held<Plain>),
    Node(usize, Held<Node>),
}

/// Runs `f` until it returns without a panic from a `Drop` that panics on
/// purpose (the docs promise the manager stays consistent and the next call
/// carries on). Any other panic propagates.
fn retry<R>(mut f: impl FnMut() -> R) -> R {
    for _ in 0..10_000 {
        match catch_unwind(AssertUnwindSafe(&mut f)) {
            Ok(r) => return r,
            Err(payload) => {
                let text = panic_text(&*payload);
                if !text.contains(PANIC_MESSAGE) {
                    std::panic::resume_unwind(payload);
                }
                PANICS_CAUGHT.fetch_add(1, SeqCst);
            }
        }
    }
    panic!("a call kept panicking");
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        String::new()
    }
}

fn quiet_intended_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let text = panic_text(info.payload());
            if !text.contains(PANIC_MESSAGE) {
                default(info);
            }
        }));
    });
}

/// Prints the seed if the run panics.
struct SeedGuard(u64);

impl Drop for SeedGuard {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "object_stress: FAILED with seed {} (rerun with MMOBJECT_STRESS_SEED={} MMOBJECT_STRESS_ITERS=1)",
                self.0, self.0
            );
        }
    }
}

fn build_world(index: usize, rng: &mut SmallRng, next_id: &Arc<AtomicU64>) -> World {
    let owner = rng.gen_bool(0.5);
    // Deferred drops exclude an owner thread.
    let deferred = !owner && rng.gen_bool(0.5);
    let capped = rng.gen_bool(0.25);
    let mut builder = ObjectManager::builder().owner_thread(owner).deferred_drops(deferred).report_leaks(false);
    if capped {
        builder = builder.max_objects_per_type(rng.gen_range(8..200));
    }
    if rng.gen_bool(0.5) {
        builder = builder.segment_base(1 << rng.gen_range(2..7));
    }
    if rng.gen_bool(0.3) {
        builder = builder.destroy_events(true);
    }
    let mut mm = builder.build();
    if rng.gen_bool(0.3) {
        mm.on_destroy::<Plain>(|_, value| {
            check_self(&*value, "on_destroy");
            let life = value.life();
            if life.held.load(SeqCst) != 0 && !life.shared.outliving.load(SeqCst) {
                life.shared.fail(format!("on_destroy of object {} while a reference is held", life.id));
            }
        });
    }
    World {
        mm,
        index,
        owner,
        capped,
        panic_rate: if rng.gen_bool(0.5) { 0.0 } else { 0.02 },
        shared: Arc::new(Shared::default()),
        next_id: Arc::clone(next_id),
        lives: Arc::new(Mutex::new(Vec::new())),
        hand: Hand::new(),
        weak_plains: Vec::new(),
        weak_nodes: Vec::new(),
        collector: CycleCollector::with_max_group(rng.gen_range(1..64)),
    }
}

// ---------------------------------------------------------------------------
// Operations shared by every thread that holds `&ObjectManager`.

fn pick<T>(rng: &mut SmallRng, v: &[T]) -> Option<usize> {
    (!v.is_empty()).then(|| rng.gen_range(0..v.len()))
}

/// One random operation through `&ObjectManager`.
fn shared_op(
    mm: &ObjectManager,
    maker: &Maker,
    hand: &mut Hand,
    weak_plains: &[Weak<Plain>],
    weak_nodes: &[Weak<Node>],
    rng: &mut SmallRng,
) {
    match rng.gen_range(0..20) {
        0 => {
            if let Some(h) = maker.create_on::<Plain>(mm, rng, Links::default()) {
                check(&mm[h.h()], &h.life, "create");
                hand.plains.push(h);
            }
        }
        1 => {
            let links = Links::pick(hand, rng);
            if let Some(h) = maker.create_on::<Node>(mm, rng, links) {
                check(mm.get(h.h()), &h.life, "create node");
                hand.nodes.push(h);
            }
        }
        2 => {
            let n = rng.gen_range(0..12);
            let made = maker.create_many(mm, rng, n);
            hand.plains.extend(made);
        }
        3 | 4 => {
            if let Some(i) = pick(rng, &hand.plains) {
                let c = hand.plains[i].clone();
                check(&mm[c.h()], &c.life, "clone");
                hand.plains.push(c);
            }
            if let Some(i) = pick(rng, &hand.nodes) {
                let c = hand.nodes[i].clone();
                hand.nodes.push(c);
            }
        }
        5 | 6 => {
            if let Some(i) = pick(rng, &hand.plains) {
                drop(hand.plains.swap_remove(i));
            }
            if let Some(i) = pick(rng, &hand.nodes) {
                drop(hand.nodes.swap_remove(i));
            }
        }
        7 => {
            for h in &hand.plains {
                check(&mm[h.h()], &h.life, "mm[&h]");
            }
            for h in &hand.nodes {
                let node = mm.get(h.h());
                check(node, &h.life, "get node");
                if let Some(next) = &node.next {
                    check_self(&mm[next], "node.next");
                }
            }
        }
        8 => {
            let view = mm.view::<Plain>();
            for h in &hand.plains {
                check(view.get(h.h()), &h.life, "view.get");
            }
            for w in weak_plains.iter().take(32) {
                if let Some(v) = view.get_weak(w.weak) {
                    check(v, &w.life, "view.get_weak");
                }
            }
        }
        9 | 10 => {
            if let Some(i) = pick(rng, weak_plains) {
                let w = &weak_plains[i];
                if let Some(h) = mm.upgrade(w.weak) {
                    check(&mm[&h], &w.life, "upgrade");
                    hand.plains.push(Held::new(Arc::clone(&w.life), h));
                }
                if let Some(v) = mm.get_weak(w.weak) {
                    check(v, &w.life, "get_weak");
                }
            }
            if let Some(i) = pick(rng, weak_nodes) {
                let w = &weak_nodes[i];
                if let Some(h) = mm.view::<Node>().upgrade(w.weak) {
                    check(&mm[&h], &w.life, "upgrade node");
                    hand.nodes.push(Held::new(Arc::clone(&w.life), h));
                }
            }
        }
        11 => {
            // An iterator never yields an object created after it began
            // (ids are taken before creating, so an id taken after the
            // iterator began belongs to an object created after it).
            let mut it = mm.iter::<Plain>();
            let first_later = maker.next_id.load(SeqCst);
            let mut made = Vec::new();
            for step in 0.. {
                if step % 4 == 1 && made.len() < 8 {
                    if let Some(h) = maker.create_on::<Plain>(mm, rng, Links::default()) {
                        made.push(h);
                    }
                }
                let Some((_, v)) = it.next() else { break };
                check_self(v, "iter");
                assert!(v.id < first_later, "an iterator yielded object {} created after it began", v.id);
            }
            assert_eq!(it.len(), 0);
            hand.plains.extend(made);
            for (_, v) in mm.iter::<Node>() {
                check_self(v, "iter node");
            }
        }
        12 => {
            // Into a raw handle.
            if let Some(i) = pick(rng, &hand.plains).filter(|&i| !hand.plains[i].life.has_raw.swap(true, SeqCst)) {
                let held = hand.plains.swap_remove(i);
                let life = Arc::clone(&held.life);
                // The reference moves from the handle to the raw handle: `held` stays the same.
                let h = held.into_handle();
                life.held.fetch_add(1, SeqCst);
                let raw = h.into_raw();
                hand.raws.push(Raw { life, raw, refs: 1 });
            }
        }
        13 => {
            if let Some(i) = pick(rng, &hand.raws) {
                let r = &mut hand.raws[i];
                match mm.add_ref_raw(r.raw) {
                    Ok(()) => {
                        r.life.held.fetch_add(1, SeqCst);
                        r.refs += 1;
                    }
                    Err(e) => assert!(r.refs == 0, "add_ref_raw failed while the raw handle held {}: {e}", r.refs),
                }
                if let Some(v) = mm.get_raw::<Plain>(r.raw) {
                    check(v, &r.life, "get_raw");
                } else {
                    assert!(r.refs == 0, "get_raw found nothing while the raw handle holds a reference");
                }
            }
        }
        14 => {
            if let Some(i) = pick(rng, &hand.raws) {
                let r = &mut hand.raws[i];
                if r.refs > 0 {
                    r.life.held.fetch_sub(1, SeqCst);
                    if let Err(e) = mm.release_raw(r.raw) {
                        panic!("release_raw failed while the raw handle held {}: {e}", r.refs);
                    }
                    r.refs -= 1;
                } else {
                    assert!(mm.release_raw(r.raw).is_err(), "an over-release was accepted");
                    assert!(mm.handle_from_raw::<Plain>(r.raw).is_err(), "handle_from_raw without a reference");
                }
            }
        }
        15 => {
            if let Some(i) = pick(rng, &hand.raws) {
                let r = &mut hand.raws[i];
                if r.refs > 0 {
                    let h = mm.handle_from_raw::<Plain>(r.raw).expect("the raw handle holds a reference");
                    r.refs -= 1;
                    check(&mm[&h], &r.life, "handle_from_raw");
                    // The reference moves from the raw handle to the handle.
                    r.life.held.fetch_sub(1, SeqCst);
                    hand.plains.push(Held::new(Arc::clone(&r.life), h));
                    assert!(mm.handle_from_raw::<Node>(r.raw).is_err(), "handle_from_raw to the wrong type");
                }
            }
        }
        16 => {
            if let Some(i) = pick(rng, &hand.plains) {
                let h = &hand.plains[i];
                assert!(h.h().ref_count() >= 1);
                let w = h.h().downgrade();
                assert_eq!(w.key(), h.h().key());
                assert!(mm.is_alive(w) || h.life.kind == Kind::Plain, "weak of a held object");
                check(mm.get_weak(w).expect("a held object's weak handle reads"), &h.life, "fresh weak");
            }
        }
        _ => {
            // Let time pass for other threads.
            std::thread::yield_now();
        }
    }
}

// ---------------------------------------------------------------------------
// Main thread under `&mut ObjectManager`.

fn exclusive_op(w: &mut World, rng: &mut SmallRng) {
    let maker = w.maker();
    match rng.gen_range(0..18) {
        0..=2 => {
            retry(|| w.mm.collect_garbage());
        }
        3 => {
            let n = rng.gen_range(0..=w.hand.plains.len().min(20));
            let handles: Vec<Handle<Plain>> = (0..n)
                .map(|_| {
                    let i = rng.gen_range(0..w.hand.plains.len());
                    w.hand.plains.swap_remove(i).into_handle()
                })
                .collect();
            let mm = &mut w.mm;
            let mut handles = Some(handles);
            retry(|| mm.release_many(handles.take().unwrap_or_default()));
        }
        4 => {
            let n = rng.gen_range(0..=w.hand.nodes.len().min(5));
            let handles: Vec<Handle<Node>> = (0..n)
                .map(|_| {
                    let i = rng.gen_range(0..w.hand.nodes.len());
                    w.hand.nodes.swap_remove(i).into_handle()
                })
                .collect();
            let mm = &mut w.mm;
            let mut handles = Some(handles);
            retry(|| mm.release_many(handles.take().unwrap_or_default()));
        }
        5 | 6 => {
            // Link a node to another (or itself): cycles.
            if let (Some(a), Some(b)) = (pick(rng, &w.hand.nodes), pick(rng, &w.hand.nodes)) {
                let target = w.hand.nodes[b].h().clone();
                let node = w.mm.get_mut(w.hand.nodes[a].h());
                check(&*node, &w.hand.nodes[a].life, "get_mut node");
                node.next = Some(target);
            }
        }
        7 => {
            if let Some(a) = pick(rng, &w.hand.nodes) {
                let item = pick(rng, &w.hand.plains).map(|i| w.hand.plains[i].h().clone());
                let node = w.mm.get_mut(w.hand.nodes[a].h());
                if rng.gen_bool(0.5) {
                    node.next = None;
                } else {
                    // Drops the handle it replaces on this thread (the owner, if any).
                    node.item = item;
                }
            }
        }
        8 => {
            for (_, v) in w.mm.iter_mut::<Plain>() {
                check_self(&*v, "iter_mut");
                v.touched += 1;
            }
        }
        9 => {
            let views = w.mm.views();
            let mut plains = views.view_mut::<Plain>();
            let nodes = views.view::<Node>();
            for (_, v) in plains.iter_mut() {
                check_self(&*v, "view_mut iter");
                v.touched += 1;
            }
            for h in &w.hand.plains {
                check(plains.get(h.h()), &h.life, "view_mut get");
            }
            for h in &w.hand.nodes {
                check(nodes.get(h.h()), &h.life, "view get node");
            }
        }
        10 => {
            if let (Some(a), Some(b)) = (pick(rng, &w.hand.plains), pick(rng, &w.hand.plains)) {
                if w.hand.plains[a].life.id != w.hand.plains[b].life.id {
                    let [x, y] = w.mm.get_disjoint_mut([w.hand.plains[a].h(), w.hand.plains[b].h()]);
                    x.touched += 1;
                    y.touched += 1;
                    check(&*x, &w.hand.plains[a].life, "disjoint a");
                    check(&*y, &w.hand.plains[b].life, "disjoint b");
                }
            }
        }
        11 => {
            let budget = Duration::from_micros(rng.gen_range(0..300));
            let (collector, mm) = (&mut w.collector, &mut w.mm);
            retry(|| collector.step(mm, budget));
        }
        12 => {
            if rng.gen_bool(0.3) {
                let mm = &mut w.mm;
                retry(|| mm.collect_cycles());
            }
        }
        13 => {
            let max = rng.gen_range(0..10);
            let mm = &mut w.mm;
            retry(|| mm.collect_garbage_budgeted(max));
        }
        14 => {
            if let Some(h) = maker.create_on::<Plain>(&w.mm, rng, Links::default()) {
                w.weak_plains.push(Weak { life: Arc::clone(&h.life), weak: h.h().downgrade() });
                w.hand.plains.push(h);
            }
        }
        15 => {
            for weak in w.weak_plains.iter().take(64) {
                if let Some(v) = w.mm.get_weak(weak.weak) {
                    check(v, &weak.life, "get_weak (exclusive)");
                }
            }
            for weak in w.weak_nodes.iter().take(64) {
                if let Some(v) = w.mm.get_weak(weak.weak) {
                    check(v, &weak.life, "get_weak node (exclusive)");
                }
            }
        }
        16 => {
            let _ = w.mm.drain_destroyed().count();
        }
        _ => {
            let mut hand = std::mem::replace(&mut w.hand, Hand::new());
            shared_op(&w.mm, &maker, &mut hand, &w.weak_plains, &w.weak_nodes, rng);
            w.hand = hand;
        }
    }
}

// ---------------------------------------------------------------------------
// Workers.

fn worker_shared_phase(
    worlds: &[&ObjectManager],
    makers: &[Maker],
    weaks: &[WeakLists],
    mut hands: Vec<Hand>,
    seed: u64,
    ops: usize,
    (tx, rx): (Sender<Parcel>, Receiver<Parcel>),
) -> Vec<Hand> {
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..ops {
        let k = rng.gen_range(0..worlds.len());
        if rng.gen_bool(0.1) {
            pass(&mut hands, k, &mut rng, &tx);
        } else {
            shared_op(worlds[k], &makers[k], &mut hands[k], &weaks[k].0, &weaks[k].1, &mut rng);
        }
        receive(&mut hands, &rx);
    }
    finish_worker(hands, &mut rng, tx, rx)
}

fn worker_exclusive_phase(
    loaders: &[Loader],
    makers: &[Maker],
    mut hands: Vec<Hand>,
    seed: u64,
    ops: usize,
    (tx, rx): (Sender<Parcel>, Receiver<Parcel>),
) -> Vec<Hand> {
    let mut rng = SmallRng::seed_from_u64(seed);
    for _ in 0..ops {
        let k = rng.gen_range(0..loaders.len());
        let hand = &mut hands[k];
        match rng.gen_range(0..8) {
            0 => {
                if let Some(h) = makers[k].create_by::<Plain>(&loaders[k], &mut rng, Links::default()) {
                    hand.plains.push(h);
                }
            }
            1 => {
                let links = Links::pick(hand, &mut rng);
                if let Some(h) = makers[k].create_by::<Node>(&loaders[k], &mut rng, links) {
                    hand.nodes.push(h);
                }
            }
            2 | 3 => {
                if let Some(i) = pick(&mut rng, &hand.plains) {
                    let c = hand.plains[i].clone();
                    hand.plains.push(c);
                }
                if let Some(i) = pick(&mut rng, &hand.nodes) {
                    let c = hand.nodes[i].clone();
                    hand.nodes.push(c);
                }
            }
            4 | 5 => {
                if let Some(i) = pick(&mut rng, &hand.plains) {
                    drop(hand.plains.swap_remove(i));
                }
                if let Some(i) = pick(&mut rng, &hand.nodes) {
                    drop(hand.nodes.swap_remove(i));
                }
            }
            6 => pass(&mut hands, k, &mut rng, &tx),
            _ => std::thread::yield_now(),
        }
        receive(&mut hands, &rx);
    }
    finish_worker(hands, &mut rng, tx, rx)
}

fn pass(hands: &mut [Hand], k: usize, rng: &mut SmallRng, tx: &Sender<Parcel>) {
    let hand = &mut hands[k];
    if let Some(i) = pick(rng, &hand.plains) {
        let h = if rng.gen_bool(0.5) { hand.plains.swap_remove(i) } else { hand.plains[i].clone() };
        let _ = tx.send(Parcel::Plain(k, h));
    }
    if let Some(i) = pick(rng, &hand.nodes) {
        let h = if rng.gen_bool(0.5) { hand.nodes.swap_remove(i) } else { hand.nodes[i].clone() };
        let _ = tx.send(Parcel::Node(k, h));
    }
}

fn receive(hands: &mut [Hand], rx: &Receiver<Parcel>) {
    while let Ok(parcel) = rx.try_recv() {
        match parcel {
            Parcel::Plain(k, h) => hands[k].plains.push(h),
            Parcel::Node(k, h) => hands[k].nodes.push(h),
        }
    }
}

/// Stops sending, takes what others still send, then gives back what it
/// holds or drops it all (a thread that exits with its handles dropped).
fn finish_worker(mut hands: Vec<Hand>, rng: &mut SmallRng, tx: Sender<Parcel>, rx: Receiver<Parcel>) -> Vec<Hand> {
    drop(tx);
    for parcel in rx.iter() {
        match parcel {
            Parcel::Plain(k, h) => hands[k].plains.push(h),
            Parcel::Node(k, h) => hands[k].nodes.push(h),
        }
    }
    if rng.gen_bool(0.3) {
        for hand in &mut hands {
            hand.plains.clear();
            hand.nodes.clear();
        }
    }
    hands
}

/// A ring of channels: worker `i` sends to worker `i + 1`.
fn ring(n: usize) -> Vec<(Sender<Parcel>, Receiver<Parcel>)> {
    let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| crossbeam_channel::unbounded::<Parcel>()).unzip();
    (0..n).map(|i| (txs[(i + 1) % n].clone(), rxs[i].clone())).collect()
}

// ---------------------------------------------------------------------------
// Checks at quiescent points.

/// After the joins, on the collecting thread: every count is exact.
fn check_quiescent(w: &mut World, what: &str) {
    retry(|| w.mm.collect_garbage());
    check_errors(w);
    let lives = w.lives.lock().unwrap().clone();
    let mm = &w.mm;
    assert_eq!(mm.dead_count(), 0, "{what}: dead objects left after a collection");

    // Handles held inside nodes.
    let mut node_in = std::collections::HashMap::<u64, u32>::new();
    let mut plain_in = std::collections::HashMap::<u64, u32>::new();
    for (_, node) in mm.iter::<Node>() {
        check_self(node, "quiescent node iter");
        if let Some(next) = &node.next {
            *node_in.entry(mm[next].id).or_default() += 1;
        }
        if let Some(item) = &node.item {
            check_self(&mm[item], "node.item");
            *plain_in.entry(mm[item].id).or_default() += 1;
        }
    }
    // Plain objects: held by the test and by nodes, so their count is exact.
    let mut live_plain = 0;
    let mut live_node = 0;
    let (mut created_plain, mut created_node) = (0u64, 0u64);
    let (mut dropped_plain, mut dropped_node) = (0u64, 0u64);
    for life in &lives {
        let dropped = life.drops.load(SeqCst);
        assert!(dropped <= 1);
        match life.kind {
            Kind::Plain => {
                created_plain += 1;
                dropped_plain += u64::from(dropped);
                if dropped == 0 {
                    live_plain += 1;
                    assert!(
                        life.held.load(SeqCst) + plain_in.get(&life.id).copied().unwrap_or(0) > 0,
                        "{what}: plain object {} has no reference left but was not destroyed",
                        life.id
                    );
                }
            }
            Kind::Node => {
                created_node += 1;
                dropped_node += u64::from(dropped);
                if dropped == 0 {
                    live_node += 1;
                }
            }
        }
    }
    assert_eq!(mm.count::<Plain>(), live_plain, "{what}: count::<Plain>");
    assert_eq!(mm.count::<Node>(), live_node, "{what}: count::<Node>");
    assert_eq!(mm.len(), live_plain + live_node, "{what}: len");
    let mut it = mm.iter::<Plain>();
    assert_eq!(it.len(), live_plain, "{what}: iter len");
    let mut left = live_plain;
    while let Some((_, v)) = it.next() {
        check_self(v, "quiescent iter");
        left -= 1;
        assert_eq!(it.len(), left, "{what}: iter len while iterating");
    }
    assert_eq!(left, 0, "{what}: iter count");
    assert_eq!(mm.view::<Node>().iter().count(), live_node, "{what}: node iter count");
    let report = mm.report();
    if let Some(r) = report.get("Plain") {
        assert_eq!((r.live, r.dead_pending), (live_plain, 0), "{what}: Plain report");
        assert_eq!((r.created, r.destroyed), (created_plain, dropped_plain), "{what}: Plain report created/destroyed");
    } else {
        assert_eq!(created_plain, 0);
    }
    if let Some(r) = report.get("Node") {
        assert_eq!((r.live, r.dead_pending), (live_node, 0), "{what}: Node report");
        assert_eq!((r.created, r.destroyed), (created_node, dropped_node), "{what}: Node report created/destroyed");
    } else {
        assert_eq!(created_node, 0);
    }

    // Exact reference counts.
    for h in &w.hand.plains {
        let expected = h.life.held.load(SeqCst) + plain_in.get(&h.life.id).copied().unwrap_or(0);
        assert_eq!(h.h().ref_count(), expected, "{what}: ref_count of plain {}", h.life.id);
        check(&mm[h.h()], &h.life, "quiescent read");
    }
    for h in &w.hand.nodes {
        let expected = h.life.held.load(SeqCst) + node_in.get(&h.life.id).copied().unwrap_or(0);
        assert_eq!(h.h().ref_count(), expected, "{what}: ref_count of node {}", h.life.id);
    }
    for r in &w.hand.raws {
        match mm.get_raw::<Plain>(r.raw) {
            Some(v) => check(v, &r.life, "quiescent get_raw"),
            None => assert_eq!(r.life.drops.load(SeqCst), 1, "{what}: a raw handle's live object did not read"),
        }
    }

    // Weak handles upgrade exactly while their object lives.
    for weak in &w.weak_plains {
        let alive = weak.life.drops.load(SeqCst) == 0;
        match mm.upgrade(weak.weak) {
            Some(h) => {
                assert!(alive, "{what}: a weak handle upgraded after its object was destroyed");
                check(&mm[&h], &weak.life, "quiescent upgrade");
            }
            None => assert!(!alive, "{what}: a weak handle of live object {} did not upgrade", weak.life.id),
        }
        assert_eq!(mm.is_alive(weak.weak), alive, "{what}: is_alive");
    }
    for weak in &w.weak_nodes {
        let alive = weak.life.drops.load(SeqCst) == 0;
        assert_eq!(mm.get_weak(weak.weak).is_some(), alive, "{what}: node get_weak of {}", weak.life.id);
    }
}

fn check_errors(w: &World) {
    let errors = w.shared.errors.lock().unwrap();
    assert!(errors.is_empty(), "manager {} (owner thread: {}): {:?}", w.index, w.owner, &*errors);
}

/// Remembers weak handles of what the main thread holds.
fn note_weaks(w: &mut World, rng: &mut SmallRng) {
    for h in &w.hand.plains {
        if rng.gen_bool(0.2) {
            w.weak_plains.push(Weak { life: Arc::clone(&h.life), weak: h.h().downgrade() });
        }
    }
    for h in &w.hand.nodes {
        if rng.gen_bool(0.2) {
            w.weak_nodes.push(Weak { life: Arc::clone(&h.life), weak: h.h().downgrade() });
        }
    }
    if w.weak_plains.len() > 400 {
        w.weak_plains.drain(..200);
    }
    if w.weak_nodes.len() > 400 {
        w.weak_nodes.drain(..200);
    }
}

// ---------------------------------------------------------------------------
// One run.

fn run(seed: u64) {
    let _guard = SeedGuard(seed);
    let sizes = sizes();
    let mut rng = SmallRng::seed_from_u64(seed);
    let next_id = Arc::new(AtomicU64::new(0));
    let n_worlds = rng.gen_range(1..=3);
    let mut worlds: Vec<World> = (0..n_worlds).map(|i| build_world(i, &mut rng, &next_id)).collect();
    let workers = rng.gen_range(1..=sizes.workers);

    for w in &mut worlds {
        let maker = w.maker();
        let start = w.maker().create_many(&w.mm, &mut rng, sizes.start);
        w.hand.plains.extend(start);
        for _ in 0..sizes.start / 4 {
            let links = Links::pick(&w.hand, &mut rng);
            if let Some(h) = maker.create_on::<Node>(&w.mm, &mut rng, links) {
                w.hand.nodes.push(h);
            }
        }
        note_weaks(w, &mut rng);
    }

    for frame in 0..sizes.frames {
        // Cross-manager reads are refused.
        if worlds.len() > 1 {
            if let Some(h) = worlds[0].hand.plains.first() {
                assert!(worlds[1].mm.try_get(h.h()).is_err(), "another manager's handle was accepted");
            }
        }

        // Shared phase: workers and main all hold `&ObjectManager`.
        let mut shares: Vec<Vec<Hand>> =
            (0..workers).map(|_| worlds.iter_mut().map(|w| w.hand.take(&mut rng, 0.3)).collect()).collect();
        let seeds: Vec<u64> = (0..workers).map(|_| rng.gen()).collect();
        let makers: Vec<Maker> = worlds.iter().map(World::maker).collect();
        let weaks: Vec<_> = worlds.iter().map(|w| (w.weak_plains.clone(), w.weak_nodes.clone())).collect();
        let (main_hands, returned): (Vec<Hand>, Vec<Vec<Hand>>) = {
            let mms: Vec<&ObjectManager> = worlds.iter().map(|w| &w.mm).collect();
            let (mms, makers, weaks) = (&mms, &makers, &weaks);
            std::thread::scope(|s| {
                let threads: Vec<_> = ring(workers)
                    .into_iter()
                    .zip(shares.drain(..))
                    .zip(&seeds)
                    .map(|((chan, hands), &seed)| {
                        s.spawn(move || worker_shared_phase(mms, makers, weaks, hands, seed, sizes.worker_ops, chan))
                    })
                    .collect();
                // Main: read, iterate and create alongside.
                let mut local: Vec<Hand> = (0..mms.len()).map(|_| Hand::new()).collect();
                for _ in 0..sizes.main_ops / 2 {
                    let k = rng.gen_range(0..mms.len());
                    shared_op(mms[k], &makers[k], &mut local[k], &weaks[k].0, &weaks[k].1, &mut rng);
                }
                let out = threads.into_iter().map(|t| t.join().expect("a worker panicked")).collect();
                (local, out)
            })
        };
        for (k, hand) in main_hands.into_iter().enumerate() {
            worlds[k].hand.absorb(hand);
        }
        for hands in returned {
            for (k, hand) in hands.into_iter().enumerate() {
                worlds[k].hand.absorb(hand);
            }
        }
        for (k, w) in worlds.iter_mut().enumerate() {
            note_weaks(w, &mut rng);
            check_quiescent(w, &format!("frame {frame}, manager {k}, after the shared phase"));
        }

        // Exclusive phase: main holds `&mut ObjectManager`, workers use loaders.
        let mut shares: Vec<Vec<Hand>> =
            (0..workers).map(|_| worlds.iter_mut().map(|w| w.hand.take(&mut rng, 0.3)).collect()).collect();
        let seeds: Vec<u64> = (0..workers).map(|_| rng.gen()).collect();
        let loaders: Vec<Loader> = worlds.iter().map(|w| w.mm.loader()).collect();
        let makers: Vec<Maker> = worlds.iter().map(World::maker).collect();
        let done = AtomicUsize::new(0);
        let returned: Vec<Vec<Hand>> = std::thread::scope(|s| {
            let (loaders, makers, done) = (&loaders, &makers, &done);
            let threads: Vec<_> = ring(workers)
                .into_iter()
                .zip(shares.drain(..))
                .zip(&seeds)
                .map(|((chan, hands), &seed)| {
                    s.spawn(move || {
                        let out = worker_exclusive_phase(loaders, makers, hands, seed, sizes.worker_ops, chan);
                        done.fetch_add(1, SeqCst);
                        out
                    })
                })
                .collect();
            let mut ops = 0;
            while ops < sizes.main_ops {
                let k = rng.gen_range(0..worlds.len());
                exclusive_op(&mut worlds[k], &mut rng);
                ops += 1;
            }
            // Keep collecting while the loaders run.
            while done.load(SeqCst) < workers {
                let k = rng.gen_range(0..worlds.len());
                retry(|| worlds[k].mm.collect_garbage());
                std::thread::yield_now();
            }
            threads.into_iter().map(|t| t.join().expect("a worker panicked")).collect()
        });
        for hands in returned {
            for (k, hand) in hands.into_iter().enumerate() {
                worlds[k].hand.absorb(hand);
            }
        }
        for (k, w) in worlds.iter_mut().enumerate() {
            note_weaks(w, &mut rng);
            check_quiescent(w, &format!("frame {frame}, manager {k}, after the exclusive phase"));
        }
    }

    // The end: release everything (or let some handles outlive the manager).
    for (k, mut w) in worlds.into_iter().enumerate() {
        let outlive = rng.gen_bool(0.25) && !cfg!(miri);
        let mut kept = Hand::new();
        if outlive {
            kept = w.hand.take(&mut rng, 0.5);
            // Raw references cannot be given back after shutdown: keep none.
            w.hand.raws.append(&mut kept.raws);
        }
        for mut r in w.hand.raws.drain(..) {
            while r.refs > 0 {
                r.life.held.fetch_sub(1, SeqCst);
                w.mm.release_raw(r.raw).expect("release of a held raw reference");
                r.refs -= 1;
            }
            assert!(w.mm.release_raw(r.raw).is_err(), "an over-release was accepted");
        }
        w.hand.plains.clear();
        w.hand.nodes.clear();
        retry(|| w.mm.collect_garbage());
        retry(|| w.mm.collect_cycles());
        retry(|| w.mm.collect_garbage());
        check_errors(&w);
        let kept_ids: std::collections::HashSet<u64> =
            kept.plains.iter().map(|h| h.life.id).chain(kept.nodes.iter().map(|h| h.life.id)).collect();
        if kept_ids.is_empty() {
            check_quiescent(&mut w, &format!("manager {k} at the end"));
            assert_eq!(w.mm.len(), 0, "manager {k}: objects left after every handle went");
        }
        let lives = w.lives.lock().unwrap().clone();
        let panicky_alive = lives.iter().filter(|l| l.panics && l.drops.load(SeqCst) == 0).count();
        let shared = Arc::clone(&w.shared);
        if !kept_ids.is_empty() {
            OUTLIVED.fetch_add(1, SeqCst);
            shared.outliving.store(true, SeqCst);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let keeper = (!kept_ids.is_empty()).then(|| {
            let stop = Arc::clone(&stop);
            let kept = std::mem::replace(&mut kept, Hand::new());
            std::thread::spawn(move || {
                let mut kept = kept;
                let mut rng = SmallRng::seed_from_u64(seed ^ 0x0u64.wrapping_sub(1));
                let mut spins = 0u64;
                // Clone and drop before, during and after the shutdown.
                loop {
                    let stopping = stop.load(SeqCst);
                    for _ in 0..64 {
                        if let Some(i) = pick(&mut rng, &kept.plains) {
                            if rng.gen_bool(0.5) {
                                let c = kept.plains[i].clone();
                                kept.plains.push(c);
                            } else if kept.plains.len() > 1 {
                                kept.plains.swap_remove(i);
                            }
                        }
                        if let Some(i) = pick(&mut rng, &kept.nodes) {
                            if rng.gen_bool(0.5) {
                                let c = kept.nodes[i].clone();
                                kept.nodes.push(c);
                            } else if kept.nodes.len() > 1 {
                                kept.nodes.swap_remove(i);
                            }
                        }
                    }
                    spins += 1;
                    if stopping && spins > 10 {
                        break;
                    }
                }
                drop(kept);
            })
        });
        let report = w.mm.shutdown();
        stop.store(true, SeqCst);
        if let Some(t) = keeper {
            t.join().expect("a thread holding handles past shutdown panicked");
        }
        let errors = shared.errors.lock().unwrap().clone();
        assert!(errors.is_empty(), "manager {k} at shutdown: {errors:?}");
        if kept_ids.is_empty() {
            assert!(report.is_empty(), "manager {k}: leaks reported at shutdown: {report}");
            assert_eq!(report.outliving_handles(), 0, "manager {k}");
            assert_eq!(report.leaked_bytes(), 0, "manager {k}");
            assert_eq!(report.drop_panics(), 0, "manager {k}: nothing was left to destroy");
        } else {
            assert!(!report.is_empty(), "manager {k}: handles outlived the manager and nothing was reported");
            assert_eq!(report.drop_panics(), panicky_alive, "manager {k}: panics in Drop at shutdown");
        }
        for life in lives.iter() {
            assert_eq!(
                life.drops.load(SeqCst),
                1,
                "manager {k}: object {} was dropped {} times in all",
                life.id,
                life.drops.load(SeqCst)
            );
        }
    }
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

#[test]
fn object_stress() {
    quiet_intended_panics();
    let iterations = env_u64("MMOBJECT_STRESS_ITERS").unwrap_or(if cfg!(miri) { 1 } else { 12 });
    let first = env_u64("MMOBJECT_STRESS_SEED").unwrap_or(0x5eed_0000);
    let start = std::time::Instant::now();
    for i in 0..iterations {
        run(first.wrapping_add(i));
        if (i + 1) % 500 == 0 {
            eprintln!("object_stress: {} run(s) in {:?}", i + 1, start.elapsed());
        }
    }
    eprintln!(
        "object_stress: {iterations} run(s) from seed {first} in {:?}: {} objects, {} panics in Drop caught, {} managers outlived",
        start.elapsed(),
        CREATED.load(SeqCst),
        PANICS_CAUGHT.load(SeqCst),
        OUTLIVED.load(SeqCst)
    );
}

/// Moves each element of `items` out with probability `share`.
fn take_share<T>(items: &mut Vec<T>, rng: &mut SmallRng, share: f64) -> Vec<T> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < items.len() {
        if rng.gen_bool(share) {
            out.push(items.swap_remove(i));
        } else {
            i += 1;
        }
    }
    out
}
