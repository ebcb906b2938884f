//! Checks that the model makes sense: unions are rejected, each key sits
//! where it belongs and appears once, and the tag is not empty.

use proc_macro2::Span;

use crate::ast::{Data, Field, Input};
use crate::attr::{Kind, MmAttr};
use crate::ctxt::Ctxt;

/// Where a `#[mm(...)]` attribute was written.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Type,
    Variant,
    Field,
}

impl Place {
    const fn name(self) -> &'static str {
        match self {
            Self::Type => "the type",
            Self::Variant => "an enum variant",
            Self::Field => "a field",
        }
    }
}

/// Records in `cx` every problem with `input`.
pub fn check(input: &Input<'_>, cx: &Ctxt) {
    check_attrs(&input.attrs, Place::Type, cx);
    if let Some(span) = input.packed {
        cx.error_at(
            span,
            "`#[derive(MMObject)]` does not support `#[repr(packed)]` types: it reads fields by reference",
        );
    }
    match &input.data {
        Data::Struct(fields) => check_fields(fields, cx),
        Data::Enum(variants) => {
            for variant in variants {
                check_attrs(&variant.attrs, Place::Variant, cx);
                check_fields(&variant.fields, cx);
            }
        }
        Data::Union(span) => cx.error_at(*span, "`#[derive(MMObject)]` does not support unions"),
    }
}

/// Like [`check`], for `#[derive(VisitHandles)]`, which has no memory tag.
pub fn check_visit_handles(input: &Input<'_>, cx: &Ctxt) {
    for attr in &input.attrs {
        if let Kind::Tag(_) = attr.kind {
            cx.error_at(attr.span, "`#[mm(tag = ...)]` belongs to `#[derive(MMObject)]`; `VisitHandles` has no tag");
        }
    }
    let attrs: Vec<&MmAttr> = input.attrs.iter().filter(|attr| !matches!(attr.kind, Kind::Tag(_))).collect();
    for attr in attrs {
        check_attrs(std::slice::from_ref(attr), Place::Type, cx);
    }
    if let Some(span) = input.packed {
        cx.error_at(
            span,
            "`#[derive(VisitHandles)]` does not support `#[repr(packed)]` types: it reads fields by reference",
        );
    }
    match &input.data {
        Data::Struct(fields) => check_fields(fields, cx),
        Data::Enum(variants) => {
            for variant in variants {
                check_attrs(&variant.attrs, Place::Variant, cx);
                check_fields(&variant.fields, cx);
            }
        }
        Data::Union(span) => cx.error_at(*span, "`#[derive(VisitHandles)]` does not support unions"),
    }
}

fn check_fields(fields: &[Field], cx: &Ctxt) {
    for field in fields {
        check_attrs(&field.attrs, Place::Field, cx);
        let skip = field.attrs.iter().find(|attr| matches!(attr.kind, Kind::Skip));
        let visit_with = field.attrs.iter().find(|attr| matches!(attr.kind, Kind::VisitWith(_)));
        if let (Some(_), Some(visit_with)) = (skip, visit_with) {
            cx.error_at(visit_with.span, "`visit_with` on a skipped field: write `skip` or `visit_with`, not both");
        }
    }
}

fn check_attrs(attrs: &[MmAttr], place: Place, cx: &Ctxt) {
    let mut seen_tag = false;
    let mut seen_skip = false;
    let mut seen_visit_with = false;
    for attr in attrs {
        match &attr.kind {
            Kind::Tag(lit) => {
                if place != Place::Type {
                    misplaced(cx, attr.span, "`#[mm(tag = ...)]` goes on the type", place);
                } else if std::mem::replace(&mut seen_tag, true) {
                    cx.error_at(attr.span, "duplicate `tag` attribute; a type has one memory tag");
                } else if lit.value().trim().is_empty() {
                    cx.error_at(lit.span(), "`tag` must not be empty");
                }
            }
            Kind::Skip => {
                if place != Place::Field {
                    misplaced(cx, attr.span, "`#[mm(skip)]` goes on a field", place);
                } else if std::mem::replace(&mut seen_skip, true) {
                    cx.error_at(attr.span, "duplicate `skip` attribute");
                }
            }
            Kind::VisitWith(_) => {
                if place != Place::Field {
                    misplaced(cx, attr.span, "`#[mm(visit_with = ...)]` goes on a field", place);
                } else if std::mem::replace(&mut seen_visit_with, true) {
                    cx.error_at(attr.span, "duplicate `visit_with` attribute; a field is visited by one function");
                }
            }
        }
    }
}

fn misplaced(cx: &Ctxt, span: Span, rule: &str, place: Place) {
    cx.error_at(span, format_args!("{rule}, not on {}", place.name()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::{parse_quote, DeriveInput};

    fn errors(input: DeriveInput) -> Vec<String> {
        let cx = Ctxt::default();
        let model = Input::from_syn(&input, &cx);
        check(&model, &cx);
        match cx.finish() {
            Ok(()) => Vec::new(),
            Err(error) => error.into_iter().map(|e| e.to_string()).collect(),
        }
    }

    #[test]
    fn accepts_well_placed_attributes() {
        let input = parse_quote! {
            #[mm(tag = "Textures")]
            enum E { A(#[mm(skip)] u8), B { #[mm(skip)] x: u8 }, C }
        };
        assert!(errors(input).is_empty());
    }

    #[test]
    fn reports_every_problem_at_once() {
        let input = parse_quote! {
            #[mm(skip, tag = "A", tag = "B")]
            struct S { #[mm(tag = "C")] a: u8, #[mm(skip)] #[mm(skip)] b: u8 }
        };
        assert_eq!(
            errors(input),
            [
                "`#[mm(skip)]` goes on a field, not on the type",
                "duplicate `tag` attribute; a type has one memory tag",
                "`#[mm(tag = ...)]` goes on the type, not on a field",
                "duplicate `skip` attribute",
            ]
        );
    }

    #[test]
    fn rejects_attributes_on_variants() {
        let input = parse_quote! { enum E { #[mm(skip)] A, #[mm(tag = "T")] B } };
        assert_eq!(
            errors(input),
            [
                "`#[mm(skip)]` goes on a field, not on an enum variant",
                "`#[mm(tag = ...)]` goes on the type, not on an enum variant",
            ]
        );
    }

    #[test]
    fn rejects_misplaced_or_conflicting_visit_with() {
        let input = parse_quote! {
            #[mm(visit_with = f)]
            struct S { #[mm(skip, visit_with = f)] a: u8, #[mm(visit_with = f, visit_with = g)] b: u8 }
        };
        assert_eq!(
            errors(input),
            [
                "`#[mm(visit_with = ...)]` goes on a field, not on the type",
                "`visit_with` on a skipped field: write `skip` or `visit_with`, not both",
                "duplicate `visit_with` attribute; a field is visited by one function",
            ]
        );
    }

    #[test]
    fn rejects_packed_structs_only() {
        let packed = "`#[derive(MMObject)]` does not support `#[repr(packed)]` types: it reads fields by reference";
        assert_eq!(errors(parse_quote! { #[repr(C, packed(2))] struct S { a: u32 } }), [packed]);
        assert_eq!(errors(parse_quote! { #[repr(packed)] struct S; }), [packed]);
        assert!(errors(parse_quote! { #[repr(C, align(8))] struct S { a: u32 } }).is_empty());
    }

    #[test]
    fn rejects_blank_tags_and_unions() {
        assert_eq!(errors(parse_quote! { #[mm(tag = " ")] struct S; }), ["`tag` must not be empty"]);
        assert_eq!(errors(parse_quote! { union U { a: u8 } }), ["`#[derive(MMObject)]` does not support unions"]);
    }
}
