//! Model tests: random sequences of handle operations against a simple
//! reference model (refcounts, liveness and drop counts per object id),
//! checked after every step. Objects hold handles to other objects, so
//! collection cascades.

use std::sync::{Arc, Mutex};

use mmobject::{Error, Handle, MMObject, ObjectManager, RawHandle, WeakHandle};
use proptest::prelude::*;

/// Drop counts by model id, shared by every object of one test case.
type DropLog = Arc<Mutex<Vec<usize>>>;

struct Token {
    id: usize,
    log: DropLog,
}

impl Drop for Token {
    fn drop(&mut self) {
        self.log.lock().unwrap()[self.id] += 1;
    }
}

#[derive(MMObject)]
struct Leaf {
    token: Token,
}

#[derive(MMObject)]
struct Node {
    leaves: Vec<Handle<Leaf>>,
    nodes: Vec<Handle<Node>>,
    token: Token,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Leaf,
    Node,
}

enum Strong {
    Leaf(Handle<Leaf>),
    Node(Handle<Node>),
}

#[derive(Clone, Copy)]
enum Weak {
    Leaf(WeakHandle<Leaf>),
    Node(WeakHandle<Node>),
}

impl Strong {
    fn ref_count(&self) -> u32 {
        match self {
            Strong::Leaf(h) => h.ref_count(),
            Strong::Node(h) => h.ref_count(),
        }
    }

    fn clone_handle(&self) -> Strong {
        match self {
            Strong::Leaf(h) => Strong::Leaf(h.clone()),
            Strong::Node(h) => Strong::Node(h.clone()),
        }
    }

    fn downgrade(&self) -> Weak {
        match self {
            Strong::Leaf(h) => Weak::Leaf(h.downgrade()),
            Strong::Node(h) => Weak::Node(h.downgrade()),
        }
    }

    fn into_raw(self) -> RawHandle {
        match self {
            Strong::Leaf(h) => h.into_raw(),
            Strong::Node(h) => h.into_raw(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Live,
    Dead,
    Destroyed,
}

#[derive(Debug)]
struct Obj {
    kind: Kind,
    /// Strong references: user handles, raw references and handles held by other objects.
    refs: u32,
    /// Raw references outstanding.
    raw: u32,
    state: State,
    /// Objects this one holds a handle to (released when it is destroyed).
    holds: Vec<usize>,
}

#[derive(Debug, Clone)]
enum Op {
    CreateLeaf,
    /// A node holding clones of the user's strong handles at these positions.
    CreateNode(Vec<usize>),
    Clone(usize),
    Drop(usize),
    Downgrade(usize),
    Upgrade(usize),
    GetWeak(usize),
    IntoRaw(usize),
    AddRefRaw(usize),
    ReleaseRaw(usize),
    HandleFromRaw(usize),
    HandleFromRawWrongType(usize),
    Collect,
    CollectBudgeted(usize),
}

fn op() -> impl Strategy<Value = Op> {
    let i = 0..64usize;
    prop_oneof![
        3 => Just(Op::CreateLeaf),
        3 => proptest::collection::vec(i.clone(), 0..4).prop_map(Op::CreateNode),
        2 => i.clone().prop_map(Op::Clone),
        4 => i.clone().prop_map(Op::Drop),
        2 => i.clone().prop_map(Op::Downgrade),
        2 => i.clone().prop_map(Op::Upgrade),
        1 => i.clone().prop_map(Op::GetWeak),
        2 => i.clone().prop_map(Op::IntoRaw),
        1 => i.clone().prop_map(Op::AddRefRaw),
        2 => i.clone().prop_map(Op::ReleaseRaw),
        1 => i.clone().prop_map(Op::HandleFromRaw),
        1 => i.clone().prop_map(Op::HandleFromRawWrongType),
        2 => Just(Op::Collect),
        2 => (0..6usize).prop_map(Op::CollectBudgeted),
    ]
}

struct Harness {
    mm: ObjectManager,
    log: DropLog,
    objs: Vec<Obj>,
    /// The user's strong handles, with the model id they name.
    strong: Vec<(usize, Strong)>,
    weak: Vec<(usize, Weak)>,
    /// Every raw handle ever made (raw bits repeat for add_ref_raw).
    raws: Vec<(usize, RawHandle)>,
}

impl Harness {
    /// With `owner_thread`, this (the test's) thread owns the manager: its
    /// clones and drops go through the owner's reservations, and the model
    /// must not see a difference.
    fn new(owner_thread: bool) -> Self {
        Harness {
            mm: ObjectManager::builder().report_leaks(false).segment_base(2).owner_thread(owner_thread).build(),
            log: Arc::default(),
            objs: Vec::new(),
            strong: Vec::new(),
            weak: Vec::new(),
            raws: Vec::new(),
        }
    }

    fn token(&mut self, kind: Kind, holds: Vec<usize>) -> Token {
        let id = self.objs.len();
        self.log.lock().unwrap().push(0);
        self.objs.push(Obj { kind, refs: 1, raw: 0, state: State::Live, holds });
        Token { id, log: Arc::clone(&self.log) }
    }

    fn release(&mut self, id: usize) {
        let obj = &mut self.objs[id];
        assert!(obj.refs > 0 && obj.state == State::Live, "model: releasing {id} {obj:?}");
        obj.refs -= 1;
        if obj.refs == 0 {
            obj.state = State::Dead;
        }
    }

    /// Marks `id` destroyed and releases what it held.
    fn destroy(&mut self, id: usize) {
        assert_eq!(self.objs[id].state, State::Dead);
        self.objs[id].state = State::Destroyed;
        for held in std::mem::take(&mut self.objs[id].holds) {
            self.release(held);
        }
    }

    fn live(&self, id: usize) -> bool {
        self.objs[id].state == State::Live
    }

    /// Every dead object plus everything its destruction would free, transitively.
    fn garbage_total(&self) -> usize {
        let mut refs: Vec<u32> = self.objs.iter().map(|o| o.refs).collect();
        let mut stack: Vec<usize> = (0..self.objs.len()).filter(|&i| self.objs[i].state == State::Dead).collect();
        let mut total = 0;
        while let Some(id) = stack.pop() {
            total += 1;
            for &held in &self.objs[id].holds {
                refs[held] -= 1;
                if refs[held] == 0 {
                    stack.push(held);
                }
            }
        }
        total
    }

    fn pick<T>(items: &[T], at: usize) -> Option<usize> {
        (!items.is_empty()).then(|| at % items.len())
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::CreateLeaf => {
                let token = self.token(Kind::Leaf, vec![]);
                let id = token.id;
                let h = self.mm.create(Leaf { token });
                self.strong.push((id, Strong::Leaf(h)));
            }
            Op::CreateNode(ref picks) => {
                let mut leaves = Vec::new();
                let mut nodes = Vec::new();
                let mut holds = Vec::new();
                for &p in picks {
                    let Some(at) = Self::pick(&self.strong, p) else { break };
                    let (id, ref h) = self.strong[at];
                    match h.clone_handle() {
                        Strong::Leaf(h) => leaves.push(h),
                        Strong::Node(h) => nodes.push(h),
                    }
                    self.objs[id].refs += 1;
                    holds.push(id);
                }
                let token = self.token(Kind::Node, holds);
                let id = token.id;
                let h = self.mm.create(Node { leaves, nodes, token });
                self.strong.push((id, Strong::Node(h)));
            }
            Op::Clone(p) => {
                if let Some(at) = Self::pick(&self.strong, p) {
                    let (id, ref h) = self.strong[at];
                    let c = h.clone_handle();
                    self.objs[id].refs += 1;
                    self.strong.push((id, c));
                }
            }
            Op::Drop(p) => {
                if let Some(at) = Self::pick(&self.strong, p) {
                    let (id, h) = self.strong.swap_remove(at);
                    drop(h);
                    self.release(id);
                }
            }
            Op::Downgrade(p) => {
                if let Some(at) = Self::pick(&self.strong, p) {
                    let (id, ref h) = self.strong[at];
                    let w = h.downgrade();
                    self.weak.push((id, w));
                }
            }
            Op::Upgrade(p) => {
                if let Some(at) = Self::pick(&self.weak, p) {
                    let (id, w) = self.weak[at];
                    let up = match w {
                        Weak::Leaf(w) => self.mm.upgrade(w).map(Strong::Leaf),
                        Weak::Node(w) => self.mm.upgrade(w).map(Strong::Node),
                    };
                    assert_eq!(up.is_some(), self.live(id), "upgrade of {id}: {:?}", self.objs[id]);
                    if let Some(h) = up {
                        self.objs[id].refs += 1;
                        self.strong.push((id, h));
                    }
                }
            }
            Op::GetWeak(p) => {
                if let Some(at) = Self::pick(&self.weak, p) {
                    let (id, w) = self.weak[at];
                    let found = match w {
                        Weak::Leaf(w) => self.mm.get_weak(w).map(|v| v.token.id),
                        Weak::Node(w) => self.mm.get_weak(w).map(|v| v.token.id),
                    };
                    assert_eq!(found, self.live(id).then_some(id));
                }
            }
            Op::IntoRaw(p) => {
                if let Some(at) = Self::pick(&self.strong, p) {
                    let (id, h) = self.strong.swap_remove(at);
                    let raw = h.into_raw();
                    self.objs[id].raw += 1;
                    self.raws.push((id, raw));
                }
            }
            Op::AddRefRaw(p) => {
                if let Some(at) = Self::pick(&self.raws, p) {
                    let (id, raw) = self.raws[at];
                    let result = self.mm.add_ref_raw(raw);
                    assert_eq!(result.is_ok(), self.live(id), "add_ref_raw of {id}: {result:?}");
                    if result.is_ok() {
                        self.objs[id].refs += 1;
                        self.objs[id].raw += 1;
                        self.raws.push((id, raw));
                    } else {
                        assert!(matches!(result, Err(Error::StaleHandle { .. })), "{result:?}");
                    }
                }
            }
            Op::ReleaseRaw(p) => {
                if let Some(at) = Self::pick(&self.raws, p) {
                    let (id, raw) = self.raws[at];
                    let result = self.mm.release_raw(raw);
                    assert_eq!(result.is_ok(), self.objs[id].raw > 0, "release_raw of {id}: {result:?}");
                    if result.is_ok() {
                        self.objs[id].raw -= 1;
                        self.release(id);
                    }
                }
            }
            Op::HandleFromRaw(p) => {
                if let Some(at) = Self::pick(&self.raws, p) {
                    let (id, raw) = self.raws[at];
                    let back = match self.objs[id].kind {
                        Kind::Leaf => self.mm.handle_from_raw::<Leaf>(raw).map(Strong::Leaf),
                        Kind::Node => self.mm.handle_from_raw::<Node>(raw).map(Strong::Node),
                    };
                    assert_eq!(back.is_ok(), self.objs[id].raw > 0, "handle_from_raw of {id}");
                    if let Ok(h) = back {
                        self.objs[id].raw -= 1;
                        self.strong.push((id, h));
                    }
                }
            }
            Op::HandleFromRawWrongType(p) => {
                if let Some(at) = Self::pick(&self.raws, p) {
                    let (id, raw) = self.raws[at];
                    let result = match self.objs[id].kind {
                        Kind::Leaf => self.mm.handle_from_raw::<Node>(raw).map(drop),
                        Kind::Node => self.mm.handle_from_raw::<Leaf>(raw).map(drop),
                    };
                    assert!(result.is_err());
                    if self.objs[id].state != State::Destroyed {
                        assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
                    }
                }
            }
            Op::Collect => {
                let expected = self.garbage_total();
                let stats = self.mm.collect_garbage();
                assert_eq!(stats.objects, expected);
                assert_eq!(stats.rounds > 0, expected > 0);
                self.sync_destroyed();
                assert!(self.objs.iter().all(|o| o.state != State::Dead), "everything dead was destroyed");
            }
            Op::CollectBudgeted(budget) => {
                let expected = self.garbage_total().min(budget);
                let before = self.destroyed();
                let stats = self.mm.collect_garbage_budgeted(budget);
                assert_eq!(stats.objects, expected);
                self.sync_destroyed();
                assert_eq!(self.destroyed() - before, expected);
            }
        }
    }

    fn destroyed(&self) -> usize {
        self.objs.iter().filter(|o| o.state == State::Destroyed).count()
    }

    /// Which dead objects a collection destroyed depends on list order; read it
    /// from the drop log and cascade in the model.
    fn sync_destroyed(&mut self) {
        loop {
            let log = self.log.lock().unwrap().clone();
            let next = (0..self.objs.len()).find(|&i| self.objs[i].state == State::Dead && log[i] > 0);
            match next {
                Some(id) => self.destroy(id),
                None => break,
            }
        }
    }

    fn check(&self) {
        let log = self.log.lock().unwrap().clone();
        for (id, obj) in self.objs.iter().enumerate() {
            let want = usize::from(obj.state == State::Destroyed);
            assert_eq!(log[id], want, "drop count of {id}: {obj:?}");
            assert!(obj.raw <= obj.refs || obj.state == State::Destroyed);
        }
        for (id, h) in &self.strong {
            assert_eq!(h.ref_count(), self.objs[*id].refs, "ref_count of {id}");
        }
        for &(id, w) in &self.weak {
            let alive = match w {
                Weak::Leaf(w) => self.mm.is_alive(w),
                Weak::Node(w) => self.mm.is_alive(w),
            };
            assert_eq!(alive, self.live(id), "liveness of {id}");
        }
        let count = |kind: Kind, state: State| self.objs.iter().filter(|o| o.kind == kind && o.state == state).count();
        let dead = count(Kind::Leaf, State::Dead) + count(Kind::Node, State::Dead);
        assert_eq!(self.mm.dead_count(), dead);
        assert_eq!(self.mm.count::<Leaf>(), count(Kind::Leaf, State::Live));
        assert_eq!(self.mm.count::<Node>(), count(Kind::Node, State::Live));
        assert_eq!(self.mm.len(), count(Kind::Leaf, State::Live) + count(Kind::Node, State::Live));
        let mut seen: Vec<usize> = self.mm.iter::<Leaf>().map(|(_, l)| l.token.id).collect();
        seen.extend(self.mm.iter::<Node>().map(|(_, n)| n.token.id));
        seen.sort_unstable();
        let live: Vec<usize> = (0..self.objs.len()).filter(|&i| self.live(i)).collect();
        assert_eq!(seen, live);
        for (_, n) in self.mm.iter::<Node>() {
            for l in &n.leaves {
                assert!(self.live(self.mm[l].token.id), "a live node holds live leaves");
            }
        }
        let report = self.mm.report();
        for (name, kind) in [("Leaf", Kind::Leaf), ("Node", Kind::Node)] {
            if let Some(t) = report.get(name) {
                assert_eq!(t.destroyed as usize, count(kind, State::Destroyed));
                assert_eq!(t.created as usize, self.objs.iter().filter(|o| o.kind == kind).count());
                assert_eq!(t.dead_pending, count(kind, State::Dead));
            }
        }
    }

    /// Gives everything back and checks that every object is destroyed exactly once.
    fn finish(mut self) {
        self.strong.clear();
        for (id, raw) in std::mem::take(&mut self.raws) {
            if self.objs[id].raw > 0 {
                self.mm.release_raw(raw).unwrap();
                self.objs[id].raw -= 1;
            }
        }
        self.mm.collect_garbage();
        let report = self.mm.shutdown();
        assert!(report.is_empty(), "{report}");
        assert_eq!(report.outliving_handles(), 0);
        assert!(self.log.lock().unwrap().iter().all(|&n| n == 1), "every object dropped exactly once");
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 256 },
        failure_persistence: None,
        ..Default::default()
    })]

    #[test]
    fn manager_matches_the_model(
        ops in proptest::collection::vec(op(), 1..if cfg!(miri) { 40 } else { 120 }),
        owner_thread in proptest::bool::ANY,
    ) {
        let mut h = Harness::new(owner_thread);
        for op in &ops {
            h.apply(op);
            h.check();
        }
        h.finish();
    }
}
