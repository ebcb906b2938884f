//! `#[derive(MMObject)]` for the `mmobject` crate.
use proc_macro::TokenStream;

/// Derives `mmobject::MMObject`.
#[proc_macro_derive(MMObject, attributes(mm))]
pub fn derive_mmobject(input: TokenStream) -> TokenStream {
    let _ = input;
    TokenStream::new()
}
