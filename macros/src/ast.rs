//! A typed model of the derive input: the type, its variants and fields, each
//! with its parsed `#[mm(...)]` attributes.

use proc_macro2::Span;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Data as SynData, DeriveInput, Fields, Generics, Ident, Index, LitStr, Member};
use syn::{Meta, Token};

use crate::attr::{self, Kind, MmAttr};
use crate::ctxt::Ctxt;

/// The item `#[derive(MMObject)]` is on.
pub struct Input<'a> {
    /// The type's name.
    pub ident: &'a Ident,
    /// The type's generics, as written.
    pub generics: &'a Generics,
    /// The `#[mm(...)]` keys on the type.
    pub attrs: Vec<MmAttr>,
    /// The `packed` in `#[repr(packed)]`, if present: the derive takes
    /// references to fields, which a packed struct cannot give.
    pub packed: Option<Span>,
    /// What kind of type it is, with its fields.
    pub data: Data<'a>,
}

/// The body of the type.
pub enum Data<'a> {
    /// A struct with named, tuple or no fields.
    Struct(Vec<Field>),
    /// An enum (possibly with no variants).
    Enum(Vec<Variant<'a>>),
    /// A union, which the derive rejects; the span is the `union` keyword.
    Union(Span),
}

/// One enum variant.
pub struct Variant<'a> {
    /// The variant's name.
    pub ident: &'a Ident,
    /// The `#[mm(...)]` keys on the variant (none are allowed).
    pub attrs: Vec<MmAttr>,
    /// The variant's fields, named or positional.
    pub fields: Vec<Field>,
}

/// One field of a struct or enum variant.
pub struct Field {
    /// How the field is named: `name` or `0`.
    pub member: Member,
    /// The `#[mm(...)]` keys on the field.
    pub attrs: Vec<MmAttr>,
}

impl<'a> Input<'a> {
    /// Builds the model, recording attribute syntax errors in `cx`.
    pub fn from_syn(input: &'a DeriveInput, cx: &Ctxt) -> Self {
        // Type attributes first, so their errors come first.
        let attrs = attr::parse(&input.attrs, cx);
        let data = match &input.data {
            SynData::Struct(data) => Data::Struct(fields_from_syn(&data.fields, cx)),
            SynData::Enum(data) => Data::Enum(
                data.variants
                    .iter()
                    .map(|variant| Variant {
                        ident: &variant.ident,
                        attrs: attr::parse(&variant.attrs, cx),
                        fields: fields_from_syn(&variant.fields, cx),
                    })
                    .collect(),
            ),
            SynData::Union(data) => Data::Union(data.union_token.span),
        };
        Input { ident: &input.ident, generics: &input.generics, attrs, packed: packed_repr(&input.attrs), data }
    }

    /// The `tag = "..."` on the type, if any (the first one, should it repeat).
    pub fn tag(&self) -> Option<&LitStr> {
        self.attrs.iter().find_map(|attr| match &attr.kind {
            Kind::Tag(lit) => Some(lit),
            Kind::Skip => None,
        })
    }
}

impl Field {
    /// Whether the field carries `#[mm(skip)]`.
    pub fn is_skipped(&self) -> bool {
        self.attrs.iter().any(|attr| matches!(attr.kind, Kind::Skip))
    }
}

/// The span of `packed` in `#[repr(packed)]` or `#[repr(C, packed(2))]`.
///
/// A `repr` that does not parse is left for the compiler to report.
fn packed_repr(attrs: &[syn::Attribute]) -> Option<Span> {
    attrs
        .iter()
        .filter(|attr| attr.path().is_ident("repr"))
        .filter_map(|attr| attr.parse_args_with(Punctuated::<Meta, Token![,]>::parse_terminated).ok())
        .flatten()
        .find(|meta| meta.path().is_ident("packed"))
        .map(|meta| meta.path().span())
}

fn fields_from_syn(fields: &Fields, cx: &Ctxt) -> Vec<Field> {
    fields
        .iter()
        .enumerate()
        .map(|(i, field)| Field {
            member: match &field.ident {
                Some(ident) => Member::Named(ident.clone()),
                None => Member::Unnamed(Index::from(i)),
            },
            attrs: attr::parse(&field.attrs, cx),
        })
        .collect()
}
