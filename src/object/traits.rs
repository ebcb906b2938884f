//! The [`MMObject`] trait and the field helpers that `#[derive(MMObject)]` uses.

use super::key::ObjectKey;
use super::release::ReleaseHandles;

/// A type that can live in an [`ObjectManager`](crate::ObjectManager).
///
/// Implement it with `#[derive(MMObject)]`:
///
/// ```
/// use mmobject::{Handle, MMObject};
///
/// #[derive(MMObject)]
/// #[mm(tag = "Textures")]
/// struct Texture { width: u32, height: u32, pixels: Vec<u8> }
///
/// #[derive(MMObject)]
/// struct Material { albedo: Handle<Texture>, detail: Option<Handle<Texture>> }
///
/// assert_eq!(Texture::TYPE_NAME, "Texture");
/// assert_eq!(Texture::TAG, "Textures");
/// assert_eq!(Material::TAG, "Material");
/// let t = Texture { width: 2, height: 2, pixels: Vec::with_capacity(16) };
/// assert_eq!(t.size(), std::mem::size_of::<Texture>() + 16);
/// ```
///
/// Objects are `Send + Sync` because the manager hands out `&T` to any thread
/// that holds `&ObjectManager`, and destroys objects on whichever thread calls
/// [`collect_garbage`](crate::ObjectManager::collect_garbage).
///
/// # What `Drop`, `size()` and `visit_handles` may do
///
/// The manager runs them itself: `Drop` when it destroys an object
/// (collection, [`release_many`](crate::ObjectManager::release_many),
/// [`CycleCollector`](crate::CycleCollector), shutdown), `size()` when it
/// creates one under a tracker, destroys one, and in reports, and
/// `visit_handles` in the cycle collector and leak forensics. None of them
/// runs under a lock that the manager's other operations need, so they may:
///
/// - create objects of any type through a [`Loader`](crate::Loader) (the
///   manager itself is borrowed by the collection): during shutdown its
///   [`try_create`](crate::Loader::try_create) returns
///   [`Error::ManagerShutDown`](crate::Error::ManagerShutDown) and
///   [`create`](crate::Loader::create) panics with that message, which the
///   shutdown report counts among the `Drop` panics;
/// - clone and drop handles, including the last handle of another object,
///   which the same collection then destroys (cascades finish in one call).
///
/// A `size()` run by `create`, `report` or `remeasure` (through
/// `&ObjectManager`) may also use the manager itself. A panic in any of them
/// propagates after the object is destroyed all the same (see
/// [`collect_garbage`](crate::ObjectManager::collect_garbage)). For the
/// store allocator, see
/// [`ObjectManagerBuilder::allocator`](crate::ObjectManagerBuilder::allocator).
pub trait MMObject: Send + Sync + 'static {
    /// The type's name, as shown in reports and `Debug` output.
    const TYPE_NAME: &'static str;
    /// The memory category the type's bytes are counted under (default: the type name).
    const TAG: &'static str;

    /// The object's size in bytes: `size_of::<Self>()` plus the heap bytes it owns
    /// that the derive can see (`Vec`, `String`, `Box`, … fields).
    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    /// Calls `visitor` with the key of every strong [`Handle`](crate::Handle) the
    /// object holds, including those inside `Option`, `Vec`, arrays, tuples and `Box`.
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        let _ = visitor;
    }

    /// Like [`visit_handles`](Self::visit_handles), with the name of the
    /// field that holds each handle (`"albedo"`, or `"0"` for a tuple field),
    /// for retention paths such as `Material#7.albedo -> Texture#3`.
    ///
    /// The derive implements both. The default calls `visit_handles` with an
    /// empty name, so a hand-written `visit_handles` is all a type needs.
    fn visit_handles_named(&self, visitor: &mut dyn FnMut(&'static str, ObjectKey)) {
        self.visit_handles(&mut |key| visitor("", key));
    }

    /// False if no object of this type can ever hold a strong handle (the
    /// derive answers from the fields' types; the default is `true`).
    ///
    /// Read once, when the type's store is made. Only for types that may
    /// hold handles does a handle drop that leaves references behind queue
    /// the object as a candidate root for the
    /// [`CycleCollector`](crate::CycleCollector), which costs such a drop
    /// one compare-exchange instead of a `fetch_sub`, and the first such
    /// drop since the collector last looked at the object a lock. A wrong
    /// `false` only hides cycles through this type from the `CycleCollector`
    /// ([`collect_cycles`](crate::ObjectManager::collect_cycles) still
    /// finds them).
    fn may_hold_handles() -> bool
    where
        Self: Sized,
    {
        true
    }

    /// Drops the strong handles the object holds that can be removed
    /// (`Option<Handle<T>>` set to `None`, `Vec`s of handles cleared).
    ///
    /// [`ObjectManager::collect_cycles`](crate::ObjectManager::collect_cycles)
    /// calls it on the members of garbage cycles, instead of dropping them, so
    /// that a wrong `visit_handles` can never destroy a value still in use.
    /// The derive implements it for every field whose type implements
    /// [`ReleaseHandles`](crate::ReleaseHandles). The default does nothing.
    fn release_handles(&mut self) {}
}

/// Heap bytes owned by a value, beyond its own `size_of`.
///
/// The derive sums this over an object's fields to compute
/// [`MMObject::size`]. Field types that do not implement it count as owning no
/// heap memory. Implement it for your own field types to make sizes exact.
pub trait HeapSize {
    /// Bytes this value owns on the heap (not counting `size_of::<Self>()`).
    fn heap_size(&self) -> usize;
}

/// Visiting the strong handles a value holds.
///
/// Leak forensics ([`holders`](crate::ObjectManager::holders),
/// [`retention_path`](crate::ObjectManager::retention_path), cycle finding and
/// collection, the shutdown report) see exactly the handles that
/// `visit_handles` reports. It is implemented for [`Handle`](crate::Handle),
/// for the types that cannot hold one (numbers, `String`, …), and for every
/// std container and wrapper of types that implement it:
///
/// - `Option`, `Result`, `Box`, arrays, slices, tuples (up to 8), `Vec`,
///   `VecDeque`, `LinkedList`, `BinaryHeap`, `BTreeMap`, `BTreeSet`, and
///   `HashMap` / `HashSet` with any hasher, with handles as keys or values;
/// - `Arc`, `Rc`, and the locks and cells that can be read without
///   waiting: `std::sync::{Mutex, RwLock}`, `parking_lot::{Mutex, RwLock}`
///   and `RefCell`.
///
/// **Locks are never waited for.** A lock is read with `try_lock` /
/// `try_read` (`try_borrow` for a `RefCell`). If it is held right now (by
/// this thread or another), its contents are *not* visited: their handles
/// then count as references from outside the manager, which makes the
/// analysis err towards "alive" (no cycle is reported or collected through
/// it). A poisoned std lock is visited as usual.
///
/// **`Arc`/`Rc` are visited from every holder.** If two objects share one
/// `Arc` holding a handle, both report it, as if each held its own; an object
/// can then look held by the manager alone when it is not. That never frees
/// an object in use (see [`ReleaseHandles`](crate::ReleaseHandles), which
/// releases through an `Arc` only when it is unique), but share handles
/// between objects as handles, not through an `Arc`, for exact answers.
///
/// [`WeakHandle`](crate::WeakHandle) holds nothing and visits nothing, on
/// purpose: weak references keep nothing alive.
///
/// For your own types that are not objects, `#[derive(VisitHandles)]`
/// implements this trait (and [`ReleaseHandles`](crate::ReleaseHandles)) by
/// visiting every field; see the derive for the rules.
///
/// # Examples
///
/// ```
/// use std::collections::HashMap;
/// use mmobject::{Handle, MMObject, ObjectManager, VisitHandles};
///
/// #[derive(MMObject)]
/// struct Texture { pixels: Vec<u8> }
///
/// /// Not an object: a plain struct inside one.
/// #[derive(VisitHandles)]
/// struct Slots { by_name: HashMap<String, Handle<Texture>> }
///
/// #[derive(MMObject)]
/// struct Cache { slots: Slots }
///
/// let mm = ObjectManager::new();
/// let tex = mm.create(Texture { pixels: vec![0; 16] });
/// let cache = mm.create(Cache { slots: Slots { by_name: HashMap::from([("grass".into(), tex.clone())]) } });
/// assert_eq!(mm.holders(tex.key()), vec![cache.key()]);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` may hold handles, but it does not implement `VisitHandles`",
    label = "leak forensics cannot see the handles in this field",
    note = "write `#[mm(skip)]` on the field if it holds no handles, `#[mm(visit_with = path)]` to visit it with a function, or implement `VisitHandles` for the type (`#[derive(VisitHandles)]`)"
)]
pub trait VisitHandles {
    /// False if no value of this type can ever hold a strong handle: `false`
    /// for the leaf types (numbers, `String`, `WeakHandle`, …), the item
    /// types' answer for containers, and `true` by default. The derive of
    /// [`MMObject`] reads it to answer [`MMObject::may_hold_handles`]. (The
    /// derive of `VisitHandles` cannot see through a field of a non-generic
    /// type that does not name `Handle`, and answers `true` for it.)
    const MAY_HOLD_HANDLES: bool = true;

    /// Calls `visitor` with the key of every strong handle in `self`.
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey));
}

macro_rules! no_heap {
    ($($t:ty),* $(,)?) => {$(
        impl HeapSize for $t {
            #[inline]
            fn heap_size(&self) -> usize { 0 }
        }
    )*};
}

no_heap!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    &'static str,
    ObjectKey
);

impl HeapSize for String {
    fn heap_size(&self) -> usize {
        self.capacity()
    }
}

impl<T: HeapSize> HeapSize for Vec<T> {
    fn heap_size(&self) -> usize {
        self.capacity() * std::mem::size_of::<T>() + self.iter().map(HeapSize::heap_size).sum::<usize>()
    }
}

impl<T: HeapSize + ?Sized> HeapSize for Box<T> {
    fn heap_size(&self) -> usize {
        std::mem::size_of_val::<T>(self) + (**self).heap_size()
    }
}

impl<T: HeapSize> HeapSize for [T] {
    fn heap_size(&self) -> usize {
        self.iter().map(HeapSize::heap_size).sum()
    }
}

impl HeapSize for str {
    fn heap_size(&self) -> usize {
        0
    }
}

impl<T: HeapSize> HeapSize for Option<T> {
    fn heap_size(&self) -> usize {
        self.as_ref().map_or(0, HeapSize::heap_size)
    }
}

impl<T: HeapSize, const N: usize> HeapSize for [T; N] {
    fn heap_size(&self) -> usize {
        self.iter().map(HeapSize::heap_size).sum()
    }
}

impl<K: HeapSize, V: HeapSize, S> HeapSize for std::collections::HashMap<K, V, S> {
    fn heap_size(&self) -> usize {
        // Buckets plus roughly one control byte per bucket.
        self.capacity() * (std::mem::size_of::<(K, V)>() + 1)
            + self.iter().map(|(k, v)| k.heap_size() + v.heap_size()).sum::<usize>()
    }
}

macro_rules! no_handles {
    ($($t:ty),* $(,)?) => {$(
        impl VisitHandles for $t {
            const MAY_HOLD_HANDLES: bool = false;
            #[inline]
            fn visit_handles(&self, _visitor: &mut dyn FnMut(ObjectKey)) {}
        }
        impl ReleaseHandles for $t {
            #[inline]
            fn release_handles(&mut self) {}
        }
    )*};
}

no_handles!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    &'static str,
    String,
    str,
    ObjectKey,
    std::time::Duration,
    std::time::Instant,
    std::path::PathBuf,
    std::ffi::OsString,
    std::num::NonZeroU32,
    std::num::NonZeroU64,
    std::num::NonZeroUsize,
    std::sync::atomic::AtomicBool,
    std::sync::atomic::AtomicU32,
    std::sync::atomic::AtomicU64,
    std::sync::atomic::AtomicUsize,
    std::sync::atomic::AtomicI32,
    std::sync::atomic::AtomicI64,
);

impl<T: ?Sized> VisitHandles for std::marker::PhantomData<T> {
    const MAY_HOLD_HANDLES: bool = false;
    #[inline]
    fn visit_handles(&self, _visitor: &mut dyn FnMut(ObjectKey)) {}
}

impl<T> VisitHandles for super::WeakHandle<T> {
    const MAY_HOLD_HANDLES: bool = false;
    /// Visits nothing: a weak handle keeps nothing alive, so it is not an
    /// edge of the handle graph.
    #[inline]
    fn visit_handles(&self, _visitor: &mut dyn FnMut(ObjectKey)) {}
}

impl<T> ReleaseHandles for super::WeakHandle<T> {
    /// Does nothing: a weak handle holds no reference to release.
    #[inline]
    fn release_handles(&mut self) {}
}

impl<T> HeapSize for super::WeakHandle<T> {
    fn heap_size(&self) -> usize {
        0
    }
}

impl<T: VisitHandles> VisitHandles for Option<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        if let Some(v) = self {
            v.visit_handles(visitor);
        }
    }
}

impl<T: VisitHandles, E: VisitHandles> VisitHandles for Result<T, E> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES || E::MAY_HOLD_HANDLES;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        match self {
            Ok(v) => v.visit_handles(visitor),
            Err(e) => e.visit_handles(visitor),
        }
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for Box<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        (**self).visit_handles(visitor);
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for std::sync::Arc<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    /// Visits the shared value: see the trait docs on sharing.
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        (**self).visit_handles(visitor);
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for std::rc::Rc<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    /// Visits the shared value: see the trait docs on sharing.
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        (**self).visit_handles(visitor);
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for std::cell::RefCell<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    /// Visits the value unless it is mutably borrowed right now (then nothing).
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        if let Ok(value) = self.try_borrow() {
            value.visit_handles(visitor);
        }
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for std::sync::Mutex<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    /// Visits the value unless the mutex is locked right now (then nothing:
    /// never waits, so it cannot deadlock). A poisoned mutex is visited.
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        match self.try_lock() {
            Ok(value) => value.visit_handles(visitor),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().visit_handles(visitor),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for std::sync::RwLock<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    /// Visits the value unless it is write-locked right now (then nothing:
    /// never waits). A poisoned lock is visited.
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        match self.try_read() {
            Ok(value) => value.visit_handles(visitor),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner().visit_handles(visitor),
            Err(std::sync::TryLockError::WouldBlock) => {}
        }
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for parking_lot::Mutex<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    /// Visits the value unless the mutex is locked right now (then nothing:
    /// never waits, so it cannot deadlock).
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        if let Some(value) = self.try_lock() {
            value.visit_handles(visitor);
        }
    }
}

impl<T: VisitHandles + ?Sized> VisitHandles for parking_lot::RwLock<T> {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    /// Visits the value unless it is write-locked right now (then nothing:
    /// never waits).
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        if let Some(value) = self.try_read() {
            value.visit_handles(visitor);
        }
    }
}

/// `VisitHandles` for containers whose `iter()` yields `&T`.
macro_rules! visit_items {
    ($($container:ident)::+ <$t:ident $(, $extra:ident)?>) => {
        impl<$t: VisitHandles $(, $extra)?> VisitHandles for $($container)::+<$t $(, $extra)?> {
            const MAY_HOLD_HANDLES: bool = $t::MAY_HOLD_HANDLES;
            fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
                self.iter().for_each(|v| v.visit_handles(visitor));
            }
        }
    };
}

visit_items!(Vec<T>);
visit_items!(std::collections::VecDeque<T>);
visit_items!(std::collections::LinkedList<T>);
visit_items!(std::collections::BinaryHeap<T>);
visit_items!(std::collections::BTreeSet<T>);
visit_items!(std::collections::HashSet<T, S>);

impl<K: VisitHandles, V: VisitHandles> VisitHandles for std::collections::BTreeMap<K, V> {
    const MAY_HOLD_HANDLES: bool = K::MAY_HOLD_HANDLES || V::MAY_HOLD_HANDLES;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        for (k, v) in self {
            k.visit_handles(visitor);
            v.visit_handles(visitor);
        }
    }
}

impl<K: VisitHandles, V: VisitHandles, S> VisitHandles for std::collections::HashMap<K, V, S> {
    const MAY_HOLD_HANDLES: bool = K::MAY_HOLD_HANDLES || V::MAY_HOLD_HANDLES;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        for (k, v) in self {
            k.visit_handles(visitor);
            v.visit_handles(visitor);
        }
    }
}

impl<T: VisitHandles> VisitHandles for [T] {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        self.iter().for_each(|v| v.visit_handles(visitor));
    }
}

impl<T: VisitHandles, const N: usize> VisitHandles for [T; N] {
    const MAY_HOLD_HANDLES: bool = T::MAY_HOLD_HANDLES;
    fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
        self.iter().for_each(|v| v.visit_handles(visitor));
    }
}

macro_rules! tuples {
    ($($name:ident)+) => {
        impl<$($name: HeapSize),+> HeapSize for ($($name,)+) {
            #[allow(non_snake_case)]
            fn heap_size(&self) -> usize {
                let ($($name,)+) = self;
                0 $(+ $name.heap_size())+
            }
        }
        impl<$($name: VisitHandles),+> VisitHandles for ($($name,)+) {
            const MAY_HOLD_HANDLES: bool = false $(|| $name::MAY_HOLD_HANDLES)+;
            #[allow(non_snake_case)]
            fn visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
                let ($($name,)+) = self;
                $($name.visit_handles(visitor);)+
            }
        }
        impl<$($name: ReleaseHandles),+> ReleaseHandles for ($($name,)+) {
            #[allow(non_snake_case)]
            fn release_handles(&mut self) {
                let ($($name,)+) = self;
                $($name.release_handles();)+
            }
        }
    };
}

tuples!(A);
tuples!(A B);
tuples!(A B C);
tuples!(A B C D);
tuples!(A B C D E);
tuples!(A B C D E F);
tuples!(A B C D E F G);
tuples!(A B C D E F G H);

/// Support for the derive's generated code. Not public API.
///
/// The derive calls `(&Probe(&field)).mm_heap_size()`: method resolution first
/// tries receiver `&Probe<T>`, which only the `HeapSize`-based impl (on
/// `Probe<T>`) offers, then autorefs to `&&Probe<T>`, the fallback (zero) on
/// `&Probe<T>` ("autoref specialization"). Calling on `&&Probe` would always
/// pick the fallback. The same holds for handle visiting.
#[doc(hidden)]
pub mod probe {
    use super::{HeapSize, ObjectKey, VisitHandles};

    #[allow(missing_debug_implementations)]
    pub struct Probe<'a, T: ?Sized>(pub &'a T);

    pub trait ViaHeapSize {
        fn mm_heap_size(&self) -> usize;
    }
    impl<T: HeapSize + ?Sized> ViaHeapSize for Probe<'_, T> {
        #[inline]
        fn mm_heap_size(&self) -> usize {
            self.0.heap_size()
        }
    }

    pub trait NoHeapSize {
        fn mm_heap_size(&self) -> usize;
    }
    impl<T: ?Sized> NoHeapSize for &Probe<'_, T> {
        #[inline]
        fn mm_heap_size(&self) -> usize {
            0
        }
    }

    pub trait ViaVisitHandles {
        fn mm_visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey));
    }
    impl<T: VisitHandles + ?Sized> ViaVisitHandles for Probe<'_, T> {
        #[inline]
        fn mm_visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey)) {
            self.0.visit_handles(visitor);
        }
    }

    pub trait NoVisitHandles {
        fn mm_visit_handles(&self, visitor: &mut dyn FnMut(ObjectKey));
    }
    impl<T: ?Sized> NoVisitHandles for &Probe<'_, T> {
        #[inline]
        fn mm_visit_handles(&self, _visitor: &mut dyn FnMut(ObjectKey)) {}
    }

    /// A probe on a type rather than a value, for `may_hold_handles`.
    #[allow(missing_debug_implementations)]
    pub struct TypeProbe<T: ?Sized> {
        /// `fn() -> *const T`: names `T` without owning one, so the probe is
        /// `Send + Sync` whatever `T` is. Covariant in `T`, which is harmless:
        /// it holds no data and only reads a constant of `T`.
        _type: std::marker::PhantomData<fn() -> *const T>,
    }

    impl<T: ?Sized> TypeProbe<T> {
        pub const NEW: Self = TypeProbe { _type: std::marker::PhantomData };
    }

    pub trait ViaMayHoldHandles {
        fn mm_may_hold_handles(&self) -> bool;
    }
    impl<T: VisitHandles + ?Sized> ViaMayHoldHandles for TypeProbe<T> {
        #[inline]
        fn mm_may_hold_handles(&self) -> bool {
            T::MAY_HOLD_HANDLES
        }
    }

    /// A type without `VisitHandles` is visited as holding nothing, so it holds no handle the forensics see.
    pub trait NoMayHoldHandles {
        fn mm_may_hold_handles(&self) -> bool;
    }
    impl<T: ?Sized> NoMayHoldHandles for &TypeProbe<T> {
        #[inline]
        fn mm_may_hold_handles(&self) -> bool {
            false
        }
    }
}
