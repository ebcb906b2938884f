//! `#[derive(MMObject)]` as a user writes it: names, tags, sizes and handle visits.

// Skipped fields and some variants exist only to be skipped or matched.
#![allow(dead_code)]
#![deny(unused_qualifications, unused_results, unreachable_patterns, unused_imports)]

use std::mem::size_of;

use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap, HashSet, LinkedList, VecDeque};
use std::sync::{Arc, Mutex, RwLock};

use mmobject::{HeapSize, MMObject, ObjectKey, ReleaseHandles, VisitHandles};
use slotmap::KeyData;

/// Stands in for a strong handle: a field type that holds one key and owns no
/// heap memory, so it implements both traits (as `Handle<T>` must for a
/// `Vec<Handle<T>>` to count its buffer and visit its handles).
#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
struct FakeHandle(ObjectKey);

impl HeapSize for FakeHandle {
    fn heap_size(&self) -> usize {
        0
    }
}

impl VisitHandles for FakeHandle {
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        visitor(self.0);
    }
}

/// A distinct key per `n` (slotmap's FFI layout: index in the low 32 bits).
fn key(n: u64) -> ObjectKey {
    KeyData::from_ffi(n).into()
}

fn keys<const N: usize>(ns: [u64; N]) -> Vec<ObjectKey> {
    ns.into_iter().map(key).collect()
}

fn handle(n: u64) -> FakeHandle {
    FakeHandle(key(n))
}

fn visited(object: &impl MMObject) -> Vec<ObjectKey> {
    let mut out = Vec::new();
    object.visit_handles(&mut |k| out.push(k));
    out
}

/// A field type that implements neither `HeapSize` nor `VisitHandles`.
struct Opaque {
    _bytes: Vec<u8>,
}

// --- Structs -----------------------------------------------------------------

#[derive(MMObject)]
#[mm(tag = "Textures")]
struct Texture {
    width: u32,
    height: u32,
    pixels: Vec<u8>,
}

#[derive(MMObject)]
struct Pair(u32, String);

#[derive(MMObject)]
struct Marker;

#[derive(MMObject)]
struct Empty {}

#[test]
fn type_name_is_the_bare_ident() {
    assert_eq!(Texture::TYPE_NAME, "Texture");
    assert_eq!(Pair::TYPE_NAME, "Pair");
    assert_eq!(Marker::TYPE_NAME, "Marker");
    assert_eq!(Wrapper::<u8>::TYPE_NAME, "Wrapper");
    assert_eq!(r#type::TYPE_NAME, "type");
}

#[test]
fn tag_defaults_to_the_type_name() {
    assert_eq!(Texture::TAG, "Textures");
    assert_eq!(Pair::TAG, "Pair");
    assert_eq!(Marker::TAG, "Marker");
    assert_eq!(Shape::TAG, "Geometry");
}

#[test]
fn size_counts_vec_string_and_box_capacity() {
    let t = Texture { width: 4, height: 4, pixels: Vec::with_capacity(64) };
    assert_eq!(t.size(), size_of::<Texture>() + 64);

    let mut s = String::with_capacity(10);
    s.push_str("abc");
    let p = Pair(1, s);
    assert_eq!(p.size(), size_of::<Pair>() + 10);

    #[derive(MMObject)]
    struct Boxed {
        one: Box<u64>,
        #[allow(clippy::box_collection)] // Box counts its pointee, then the pointee's heap.
        nested: Box<Vec<u32>>,
        words: Vec<String>,
    }
    let b = Boxed {
        one: Box::new(1),
        nested: Box::new(Vec::with_capacity(3)),
        words: vec![String::with_capacity(5), String::with_capacity(7)],
    };
    let words = b.words.capacity() * size_of::<String>() + 5 + 7;
    assert_eq!(b.size(), size_of::<Boxed>() + 8 + size_of::<Vec<u32>>() + 3 * 4 + words);
}

#[test]
fn unit_and_empty_structs_are_just_their_size() {
    assert_eq!(Marker.size(), 0);
    assert_eq!(Empty {}.size(), 0);
    assert!(visited(&Marker).is_empty());
}

#[test]
fn skip_leaves_a_field_out() {
    #[derive(MMObject)]
    struct Cached {
        data: Vec<u8>,
        #[mm(skip)]
        cache: Vec<u8>,
        #[mm(skip)]
        borrowed: FakeHandle,
        owned: FakeHandle,
    }
    let c =
        Cached { data: Vec::with_capacity(8), cache: Vec::with_capacity(1000), borrowed: handle(1), owned: handle(2) };
    assert_eq!(c.size(), size_of::<Cached>() + 8);
    assert_eq!(visited(&c), keys([2]));

    #[derive(MMObject)]
    struct Tuple(#[mm(skip)] String, String);
    let t = Tuple(String::with_capacity(100), String::with_capacity(3));
    assert_eq!(t.size(), size_of::<Tuple>() + 3);
}

#[test]
fn fields_without_the_traits_count_zero_and_hold_no_handles() {
    #[derive(MMObject)]
    struct WithOpaque {
        opaque: Opaque,
        opaques: Vec<Opaque>,
        pixels: Vec<u8>,
    }
    let w = WithOpaque {
        opaque: Opaque { _bytes: vec![0; 100] },
        opaques: Vec::with_capacity(4),
        pixels: Vec::with_capacity(2),
    };
    assert_eq!(w.size(), size_of::<WithOpaque>() + 2);
    assert!(visited(&w).is_empty());
}

#[test]
fn user_heap_size_impls_are_used() {
    struct Blob(usize);
    impl HeapSize for Blob {
        fn heap_size(&self) -> usize {
            self.0
        }
    }
    #[derive(MMObject)]
    struct HasBlob {
        blob: Blob,
        blobs: Option<Blob>,
    }
    assert_eq!(HasBlob { blob: Blob(40), blobs: Some(Blob(2)) }.size(), size_of::<HasBlob>() + 42);
}

// --- Handle visiting ----------------------------------------------------------

#[test]
fn visits_through_option_vec_array_tuple_and_box() {
    #[derive(MMObject)]
    struct Material {
        albedo: FakeHandle,
        detail: Option<FakeHandle>,
        none: Option<FakeHandle>,
        layers: Vec<FakeHandle>,
        corners: [FakeHandle; 2],
        pair: (FakeHandle, Option<FakeHandle>),
        boxed: Box<FakeHandle>,
        nested: Vec<Option<Box<FakeHandle>>>,
        plain: u32,
    }
    let m = Material {
        albedo: handle(1),
        detail: Some(handle(2)),
        none: None,
        layers: vec![handle(3), handle(4)],
        corners: [handle(5), handle(6)],
        pair: (handle(7), Some(handle(8))),
        boxed: Box::new(handle(9)),
        nested: vec![None, Some(Box::new(handle(10)))],
        plain: 0,
    };
    assert_eq!(visited(&m), keys([1, 2, 3, 4, 5, 6, 7, 8, 9, 10]));
}

#[test]
fn a_field_named_visitor_does_not_clash() {
    #[derive(MMObject)]
    struct Named {
        visitor: FakeHandle,
    }
    #[derive(MMObject)]
    enum Shadow {
        A { visitor: FakeHandle, __mm_field_0: FakeHandle },
    }
    assert_eq!(visited(&Named { visitor: handle(3) }), keys([3]));
    assert_eq!(visited(&Shadow::A { visitor: handle(1), __mm_field_0: handle(2) }), keys([1, 2]));
}

// --- Enums --------------------------------------------------------------------

#[derive(MMObject)]
#[mm(tag = "Geometry")]
enum Shape {
    Point,
    Mesh { vertices: Vec<[f32; 3]>, material: FakeHandle },
    Instances(Vec<FakeHandle>, #[mm(skip)] Vec<u8>),
    Skipped(#[mm(skip)] String),
}

#[test]
fn enums_count_and_visit_the_current_variant() {
    assert_eq!(Shape::Point.size(), size_of::<Shape>());
    assert!(visited(&Shape::Point).is_empty());

    let mesh = Shape::Mesh { vertices: Vec::with_capacity(2), material: handle(7) };
    assert_eq!(mesh.size(), size_of::<Shape>() + 2 * 12);
    assert_eq!(visited(&mesh), keys([7]));

    let instances = Shape::Instances(vec![handle(1), handle(2)], Vec::with_capacity(99));
    let vec_bytes = 2 * size_of::<FakeHandle>();
    assert_eq!(instances.size(), size_of::<Shape>() + vec_bytes);
    assert_eq!(visited(&instances), keys([1, 2]));

    let skipped = Shape::Skipped(String::with_capacity(50));
    assert_eq!(skipped.size(), size_of::<Shape>());
}

#[test]
fn fieldless_and_empty_enums() {
    #[derive(MMObject, Clone, Copy)]
    enum State {
        Idle,
        Running,
    }
    #[derive(MMObject)]
    enum Never {}
    assert_eq!(State::Idle.size(), size_of::<State>());
    assert!(visited(&State::Running).is_empty());
    assert_eq!(Never::TAG, "Never");
}

// --- Generics -----------------------------------------------------------------

#[derive(MMObject)]
struct Wrapper<T> {
    inner: T,
}

#[derive(MMObject)]
struct Grid<T: Copy, const N: usize = 4>
where
    T: Default,
{
    cells: [T; N],
    names: Vec<String>,
}

#[derive(MMObject)]
struct Named<'a> {
    name: &'a str,
    label: String,
}

#[derive(MMObject)]
enum Either<L, R> {
    Left(L),
    Right(R),
}

#[allow(non_camel_case_types)]
#[derive(MMObject)]
struct r#type;

#[test]
fn generics_pass_through() {
    let w = Wrapper { inner: 5u64 };
    assert_eq!(w.size(), size_of::<Wrapper<u64>>());

    let g: Grid<u8> = Grid { cells: [0; 4], names: Vec::with_capacity(2) };
    assert_eq!(g.size(), size_of::<Grid<u8>>() + 2 * size_of::<String>());
    let g: Grid<u16, 8> = Grid { cells: [0; 8], names: Vec::new() };
    assert_eq!(Grid::<u16, 8>::TYPE_NAME, "Grid");
    assert_eq!(g.size(), 16 + size_of::<Vec<String>>());

    let n = Named { name: "static", label: String::with_capacity(6) };
    assert_eq!(n.size(), size_of::<Named<'static>>() + 6);

    assert_eq!(Either::<u8, u16>::Left(1).size(), size_of::<Either<u8, u16>>());
}

#[test]
fn generic_fields_are_visited_through_a_bound_and_sized_as_opaque() {
    // In a generic impl the probe cannot see through `T`, so a `Vec` held as a
    // type parameter counts no heap bytes: the documented limit of `size()`.
    let w = Wrapper { inner: Vec::<u8>::with_capacity(32) };
    assert_eq!(w.size(), size_of::<Wrapper<Vec<u8>>>());
    // Visiting adds the bound `T: VisitHandles` instead, so nothing is missed.
    let w = Wrapper { inner: handle(1) };
    assert_eq!(visited(&w), keys([1]));
    let nested = Wrapper { inner: Generic { items: vec![Some(handle(2)), None, Some(handle(3))] } };
    assert_eq!(visited(&nested), keys([2, 3]));
    assert_eq!(visited(&Either::<FakeHandle, u8>::Left(handle(4))), keys([4]));
}

fn assert_mmobject<T: MMObject>() {}

#[test]
fn generic_impls_require_send_sync_static() {
    assert_mmobject::<Wrapper<String>>();
    assert_mmobject::<Either<Vec<u8>, Box<u32>>>();
    assert_mmobject::<Named<'static>>();
}

// --- Every std container --------------------------------------------------------

#[test]
fn visits_every_std_container_with_handles_as_keys_or_values() {
    #[derive(Default)]
    struct Fnv;
    impl std::hash::BuildHasher for Fnv {
        type Hasher = std::collections::hash_map::DefaultHasher;
        fn build_hasher(&self) -> Self::Hasher {
            std::collections::hash_map::DefaultHasher::new()
        }
    }
    #[derive(MMObject)]
    struct Everything {
        by_name: HashMap<String, FakeHandle>,
        by_handle: HashMap<FakeHandle, u32, Fnv>,
        set: HashSet<FakeHandle, Fnv>,
        tree: BTreeMap<FakeHandle, Vec<FakeHandle>>,
        tree_set: BTreeSet<FakeHandle>,
        queue: VecDeque<FakeHandle>,
        list: LinkedList<Option<FakeHandle>>,
        heap: BinaryHeap<FakeHandle>,
        result: Result<FakeHandle, (u8, FakeHandle)>,
        shared: Arc<Mutex<Vec<FakeHandle>>>,
        locked: parking_lot::RwLock<Box<[FakeHandle]>>,
        std_rw: RwLock<Option<FakeHandle>>,
        wide: (u8, u8, u8, u8, u8, u8, u8, FakeHandle),
    }
    let mut by_handle = HashMap::with_hasher(Fnv);
    let _ = by_handle.insert(handle(2), 7);
    let mut set = HashSet::with_hasher(Fnv);
    let _ = set.insert(handle(3));
    let e = Everything {
        by_name: HashMap::from([("a".to_string(), handle(1))]),
        by_handle,
        set,
        tree: BTreeMap::from([(handle(4), vec![handle(5)])]),
        tree_set: BTreeSet::from([handle(6)]),
        queue: VecDeque::from([handle(7)]),
        list: LinkedList::from([None, Some(handle(8))]),
        heap: BinaryHeap::from([handle(9)]),
        result: Err((0, handle(10))),
        shared: Arc::new(Mutex::new(vec![handle(11)])),
        locked: parking_lot::RwLock::new(Box::new([handle(12)])),
        std_rw: RwLock::new(Some(handle(13))),
        wide: (0, 0, 0, 0, 0, 0, 0, handle(14)),
    };
    let mut seen = visited(&e);
    seen.sort();
    assert_eq!(seen, keys([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]));
}

#[test]
fn a_locked_lock_is_skipped_not_waited_for() {
    // Documented: the contents of a lock held right now are not visited (they
    // then count as references from outside the manager), and nothing blocks.
    let m = Mutex::new(vec![handle(1)]);
    let guard = m.lock().unwrap();
    let mut seen = Vec::new();
    m.visit_handles(&mut |k| seen.push(k));
    assert!(seen.is_empty());
    drop(guard);
    m.visit_handles(&mut |k| seen.push(k));
    assert_eq!(seen, keys([1]));

    let p = parking_lot::Mutex::new(Some(handle(2)));
    let guard = p.lock();
    seen.clear();
    p.visit_handles(&mut |k| seen.push(k));
    assert!(seen.is_empty());
    drop(guard);

    // A read lock does not stop visiting; a write lock does.
    let rw = parking_lot::RwLock::new(Some(handle(3)));
    let read = rw.read();
    rw.visit_handles(&mut |k| seen.push(k));
    assert_eq!(seen, keys([3]));
    drop(read);
    let _write = rw.write();
    seen.clear();
    rw.visit_handles(&mut |k| seen.push(k));
    assert!(seen.is_empty());
}

#[test]
fn a_poisoned_mutex_is_still_visited() {
    let m = Arc::new(Mutex::new(Some(handle(5))));
    let poisoner = Arc::clone(&m);
    let _ = std::thread::spawn(move || {
        let _guard = poisoner.lock().unwrap();
        panic!("poison it");
    })
    .join();
    assert!(m.is_poisoned());
    let mut seen = Vec::new();
    m.visit_handles(&mut |k| seen.push(k));
    assert_eq!(seen, keys([5]));
}

// --- #[derive(VisitHandles)] and visit_with -----------------------------------------

#[derive(VisitHandles)]
struct Slots {
    by_name: HashMap<String, FakeHandle>,
    #[mm(skip)]
    ignored: FakeHandle,
    hits: u64,
}

#[derive(VisitHandles)]
enum Slot {
    Empty,
    One(FakeHandle),
    Many { all: Vec<FakeHandle> },
}

#[derive(VisitHandles)]
struct Generic<T> {
    items: Vec<T>,
}

fn visit_pair(pair: &(u32, ObjectKey), visitor: &mut dyn FnMut(ObjectKey)) {
    visitor(pair.1);
}

#[test]
fn derive_visit_handles_for_plain_structs_and_enums() {
    let slots = Slots { by_name: HashMap::from([("x".to_string(), handle(1))]), ignored: handle(9), hits: 0 };
    let mut seen = Vec::new();
    slots.visit_handles(&mut |k| seen.push(k));
    assert_eq!(seen, keys([1]));

    #[derive(MMObject)]
    struct Cache {
        slots: Slots,
        kinds: Vec<Slot>,
        generic: Generic<FakeHandle>,
        #[mm(visit_with = visit_pair)]
        raw: (u32, ObjectKey),
    }
    let cache = Cache {
        slots,
        kinds: vec![Slot::Empty, Slot::One(handle(2)), Slot::Many { all: vec![handle(3), handle(4)] }],
        generic: Generic { items: vec![handle(5)] },
        raw: (0, key(6)),
    };
    assert_eq!(visited(&cache), keys([1, 2, 3, 4, 5, 6]));
    let mut named = Vec::new();
    cache.visit_handles_named(&mut |field, k| named.push((field, k)));
    assert_eq!(named[0], ("slots", key(1)));
    assert_eq!(named[5], ("raw", key(6)));
}

#[test]
fn derive_visit_handles_releases_what_it_can() {
    #[derive(VisitHandles)]
    struct Links {
        map: HashMap<u32, FakeHandle>,
        plain: u32,
    }
    let mut links = Links { map: HashMap::from([(1, handle(1))]), plain: 7 };
    links.release_handles();
    assert!(links.map.is_empty(), "a map holding handles is cleared");
    assert_eq!(links.plain, 7);
    let mut untouched: HashMap<u32, String> = HashMap::from([(1, "kept".to_string())]);
    untouched.release_handles();
    assert_eq!(untouched.len(), 1, "a map without handles is left alone");
}
