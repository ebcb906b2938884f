//! `#[derive(MMObject)]` as a user writes it: names, tags, sizes and handle visits.

// Skipped fields and some variants exist only to be skipped or matched.
#![allow(dead_code)]
#![deny(unused_qualifications, unused_results, unreachable_patterns, unused_imports)]

use std::mem::size_of;

use mmobject::{HeapSize, MMObject, ObjectKey, VisitHandles};
use slotmap::KeyData;

/// Stands in for a strong handle: a field type that holds one key and owns no
/// heap memory, so it implements both traits (as `Handle<T>` must for a
/// `Vec<Handle<T>>` to count its buffer and visit its handles).
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
fn generic_fields_count_as_opaque() {
    // In a generic impl the probe cannot see through `T`, so a `Vec` held as a
    // type parameter counts no heap bytes and visits nothing: the documented
    // limit of the derive.
    let w = Wrapper { inner: Vec::<u8>::with_capacity(32) };
    assert_eq!(w.size(), size_of::<Wrapper<Vec<u8>>>());
    let w = Wrapper { inner: handle(1) };
    assert!(visited(&w).is_empty());
}

fn assert_mmobject<T: MMObject>() {}

#[test]
fn generic_impls_require_send_sync_static() {
    assert_mmobject::<Wrapper<String>>();
    assert_mmobject::<Either<Vec<u8>, Box<u32>>>();
    assert_mmobject::<Named<'static>>();
}
