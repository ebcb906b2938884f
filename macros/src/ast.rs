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
    /// The field's type, as written.
    pub ty: syn::Type,
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
            Kind::Skip | Kind::VisitWith(_) => None,
        })
    }

    /// The names of the type's type parameters.
    pub fn type_params(&self) -> Vec<&Ident> {
        self.generics.type_params().map(|param| &param.ident).collect()
    }
}

impl Field {
    /// Whether the field carries `#[mm(skip)]`.
    pub fn is_skipped(&self) -> bool {
        self.attrs.iter().any(|attr| matches!(attr.kind, Kind::Skip))
    }

    /// The function in `#[mm(visit_with = ...)]`, if any.
    pub fn visit_with(&self) -> Option<&syn::Path> {
        self.attrs.iter().find_map(|attr| match &attr.kind {
            Kind::VisitWith(path) => Some(path),
            _ => None,
        })
    }

    /// Whether the field's type names `Handle` anywhere (`Handle<T>`,
    /// `HashMap<K, Handle<T>>`, `foreign::Map<Handle<T>>`), or one of the
    /// type's own type parameters. Such a field must implement
    /// `VisitHandles` (or be skipped or visited by hand): it is never taken to
    /// hold no handles.
    pub fn may_hold_handles(&self, type_params: &[&Ident]) -> bool {
        struct Finder {
            found: bool,
        }
        impl<'ast> syn::visit::Visit<'ast> for Finder {
            fn visit_path(&mut self, path: &'ast syn::Path) {
                if let Some(last) = path.segments.last() {
                    if last.ident == "Handle" {
                        self.found = true;
                    }
                }
                syn::visit::visit_path(self, path);
            }
        }
        let mut finder = Finder { found: false };
        syn::visit::Visit::visit_type(&mut finder, &self.ty);
        finder.found || self.mentions_type_param(type_params)
    }

    /// Whether the field's type names one of the type's own type parameters.
    pub fn mentions_type_param(&self, type_params: &[&Ident]) -> bool {
        struct Finder<'a> {
            type_params: &'a [&'a Ident],
            found: bool,
        }
        impl<'ast> syn::visit::Visit<'ast> for Finder<'_> {
            fn visit_path(&mut self, path: &'ast syn::Path) {
                if path.leading_colon.is_none() && path.segments.len() == 1 {
                    let ident = &path.segments[0].ident;
                    self.found |= self.type_params.contains(&ident);
                }
                syn::visit::visit_path(self, path);
            }
        }
        let mut finder = Finder { type_params, found: false };
        syn::visit::Visit::visit_type(&mut finder, &self.ty);
        finder.found
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
            ty: field.ty.clone(),
            attrs: attr::parse(&field.attrs, cx),
        })
        .collect()
}
