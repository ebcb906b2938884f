//! `#[derive(MMObject)]` and `#[derive(VisitHandles)]` for the `mmobject` crate.
//!
//! Use it through `mmobject::MMObject`; the generated code refers to the
//! `mmobject` crate by name, so this crate is not useful on its own.
//!
//! The derive is a pipeline: [`ast`] builds a typed model of the input with
//! the `#[mm(...)]` attributes [`attr`] parsed, [`valid`] checks it, and
//! [`expand`] writes the impl. Errors from every stage are collected in one
//! [`ctxt::Ctxt`]; if there are any, the output is those errors as
//! `compile_error!`s plus a stub impl, so the user sees only the real mistakes.

mod ast;
mod attr;
mod ctxt;
mod expand;
mod valid;

use proc_macro::TokenStream;
use syn::{parse_macro_input, DeriveInput};

/// Derives `mmobject::MMObject` for a struct or enum.
///
/// The generated impl sets:
///
/// - `TYPE_NAME` to the type's name, without generics;
/// - `TAG` to `#[mm(tag = "...")]` on the type, or to the type's name;
/// - `size()` to `size_of::<Self>()` plus the [`HeapSize`] of every field
///   whose type implements it (fields of other types count as 0);
/// - `visit_handles()` to visit the handles in every field (for an enum, the
///   fields of the current variant), by these rules:
///   1. a field with `#[mm(visit_with = f)]` is visited by calling
///      `f(&field, visitor)`, where `f: fn(&FieldType, &mut dyn FnMut(ObjectKey))`;
///   2. a field whose type names `Handle` anywhere (`Handle<T>`,
///      `HashMap<String, Handle<T>>`, `other_crate::Map<Handle<T>>`) or one of
///      the type's type parameters **must** implement [`VisitHandles`]: if it
///      does not, that is a compile error at the field, suggesting
///      `#[mm(skip)]` or `#[mm(visit_with = ...)]`;
///   3. any other field is visited if its type implements [`VisitHandles`],
///      and is otherwise taken to hold no handles. A type of your own that
///      holds handles (directly or in a collection) must therefore implement
///      it: `#[derive(VisitHandles)]`. (A type alias hides `Handle` from
///      rule 2: the derive reads the type as written.)
/// - `release_handles()` to release every field whose type implements
///   [`ReleaseHandles`] (`Option<Handle<T>>` becomes `None`, `Vec`s of
///   handles are cleared), for cycle collection. Plain `Handle<T>` fields
///   cannot be released.
///
/// Type parameters must be `Send + Sync + 'static` for the impl to apply, and
/// lifetimes `'static`. A field whose type involves a type parameter `T`
/// adds the bound `FieldType: VisitHandles` to the impl (so
/// `Wrapper<Handle<T>>` visits its handle), and is sized as if `T`
/// implemented no `HeapSize`.
///
/// [`HeapSize`]: https://docs.rs/mmobject/latest/mmobject/trait.HeapSize.html
/// [`VisitHandles`]: https://docs.rs/mmobject/latest/mmobject/trait.VisitHandles.html
/// [`ReleaseHandles`]: https://docs.rs/mmobject/latest/mmobject/trait.ReleaseHandles.html
///
/// # Attributes
///
/// - `#[mm(tag = "Textures")]` on the type: the memory category its bytes
///   count under. The string must not be empty.
/// - `#[mm(skip)]` on a field (of a struct or of an enum variant): leave it out
///   of `size()`, `visit_handles()` and `release_handles()`.
/// - `#[mm(visit_with = path::to::function)]` on a field: visit its handles
///   with `function(&field, visitor)`.
///
/// Unions, `#[repr(packed)]` structs, unknown keys, keys in the wrong place,
/// repeated keys and empty tags are compile errors, each pointing at the mistake.
///
/// # Examples
///
/// ```
/// use mmobject::MMObject;
///
/// #[derive(MMObject)]
/// #[mm(tag = "Textures")]
/// struct Texture {
///     width: u32,
///     height: u32,
///     pixels: Vec<u8>,
///     #[mm(skip)]
///     scratch: Vec<u8>,
/// }
///
/// let t = Texture { width: 2, height: 2, pixels: vec![0; 16], scratch: vec![0; 64] };
/// assert_eq!(Texture::TYPE_NAME, "Texture");
/// assert_eq!(Texture::TAG, "Textures");
/// assert_eq!(t.size(), std::mem::size_of::<Texture>() + 16);
/// ```
#[proc_macro_derive(MMObject, attributes(mm))]
pub fn derive_mmobject(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    let cx = ctxt::Ctxt::default();
    let model = ast::Input::from_syn(&input, &cx);
    valid::check(&model, &cx);
    match cx.finish() {
        Ok(()) => expand::derive(&model),
        Err(error) => {
            let mut out = error.to_compile_error();
            out.extend(expand::stub(&model));
            out
        }
    }
    .into()
}

/// Derives `mmobject::VisitHandles` and `mmobject::ReleaseHandles` for a
/// struct or enum that is not an object but may sit inside one (a cache, a
/// slot table, a component).
///
/// Fields are visited and released as by `#[derive(MMObject)]`, with the same
/// `#[mm(skip)]` and `#[mm(visit_with = ...)]` keys and the same rules; a
/// field whose type names `Handle` but does not implement `VisitHandles` is a
/// compile error. `#[mm(tag)]` is not allowed: the type has no memory tag.
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
/// #[derive(VisitHandles)]
/// struct Slots { by_name: HashMap<String, Handle<Texture>>, hits: u64 }
///
/// let mm = ObjectManager::new();
/// let tex = mm.create(Texture { pixels: Vec::new() });
/// let slots = Slots { by_name: HashMap::from([("a".to_string(), tex.clone())]), hits: 0 };
/// let mut seen = Vec::new();
/// slots.visit_handles(&mut |key| seen.push(key));
/// assert_eq!(seen, [tex.key()]);
/// ```
#[proc_macro_derive(VisitHandles, attributes(mm))]
pub fn derive_visit_handles(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    let cx = ctxt::Ctxt::default();
    let model = ast::Input::from_syn(&input, &cx);
    valid::check_visit_handles(&model, &cx);
    match cx.finish() {
        Ok(()) => expand::derive_visit_handles(&model),
        Err(error) => {
            let mut out = error.to_compile_error();
            out.extend(expand::stub_visit_handles(&model));
            out
        }
    }
    .into()
}
