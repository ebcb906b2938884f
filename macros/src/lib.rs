//! `#[derive(MMObject)]` for the `mmobject` crate.
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
/// - `visit_handles()` to visit every field whose type implements
///   [`VisitHandles`] (other fields hold no handles). For an enum, only the
///   fields of the current variant are counted and visited.
/// - `release_handles()` to release every field whose type implements
///   [`ReleaseHandles`] (`Option<Handle<T>>` becomes `None`, `Vec`s of
///   handles are cleared), for cycle collection. Plain `Handle<T>` fields
///   cannot be released.
///
/// Type parameters must be `Send + Sync + 'static` for the impl to apply, and
/// lifetimes `'static`. Inside a generic type, a field whose type involves a
/// type parameter `T` is sized and visited as if `T` implemented neither
/// trait, since the derive cannot add bounds for them.
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
