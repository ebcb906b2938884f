//! Parsing `#[mm(...)]` attributes into [`MmAttr`]s.
//!
//! This stage only reads syntax: which keys are written and what values they
//! carry. Whether a key is allowed where it is written, and whether it
//! repeats, is decided later in [`valid`](crate::valid).

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Attribute, Expr, ExprLit, Lit, LitStr, Meta, Token};

use crate::ctxt::Ctxt;

/// One key from a `#[mm(...)]` list.
#[derive(Debug)]
pub struct MmAttr {
    /// What the key says.
    pub kind: Kind,
    /// The span of the key itself (`tag`, `skip`), for placement errors.
    pub span: Span,
}

/// The keys `#[mm(...)]` understands.
#[derive(Debug)]
pub enum Kind {
    /// `tag = "Textures"`: the memory category of the type.
    Tag(LitStr),
    /// `skip`: leave a field out of `size()` and `visit_handles()`.
    Skip,
    /// `visit_with = path`: visit the field's handles by calling
    /// `path(&field, visitor)`.
    VisitWith(syn::Path),
}

/// Parses every `#[mm(...)]` among `attrs`, recording syntax errors in `cx`.
///
/// Keys that parse before an error in the same list are still returned, so
/// later checks can report on them too.
pub fn parse(attrs: &[Attribute], cx: &Ctxt) -> Vec<MmAttr> {
    let mut out = Vec::new();
    for attr in attrs.iter().filter(|attr| attr.path().is_ident("mm")) {
        let list = match &attr.meta {
            Meta::List(list) => list,
            Meta::Path(_) | Meta::NameValue(_) => {
                cx.push(syn::Error::new_spanned(
                    &attr.meta,
                    "expected a list of mm attributes: `#[mm(tag = \"...\")]` or `#[mm(skip)]`",
                ));
                continue;
            }
        };
        let result = list.parse_nested_meta(|meta| {
            let span = meta.path.span();
            if meta.path.is_ident("tag") {
                if !meta.input.peek(Token![=]) {
                    return Err(meta.error("expected a value: `tag = \"...\"`"));
                }
                let value: Expr = meta.value()?.parse()?;
                match value {
                    Expr::Lit(ExprLit { lit: Lit::Str(lit), .. }) => {
                        out.push(MmAttr { kind: Kind::Tag(lit), span });
                        Ok(())
                    }
                    other => Err(syn::Error::new_spanned(
                        other,
                        "expected a string literal for `tag`, as in `tag = \"Textures\"`",
                    )),
                }
            } else if meta.path.is_ident("skip") {
                if !meta.input.is_empty() && !meta.input.peek(Token![,]) {
                    return Err(meta.error("`skip` takes no value: write `#[mm(skip)]`"));
                }
                out.push(MmAttr { kind: Kind::Skip, span });
                Ok(())
            } else if meta.path.is_ident("visit_with") {
                if !meta.input.peek(Token![=]) {
                    return Err(meta.error("expected a function: `visit_with = path::to::function`"));
                }
                let value: Expr = meta.value()?.parse()?;
                match value {
                    Expr::Path(path) if path.qself.is_none() => {
                        out.push(MmAttr { kind: Kind::VisitWith(path.path), span });
                        Ok(())
                    }
                    other => Err(syn::Error::new_spanned(
                        other,
                        "expected a path to a function for `visit_with`, as in `visit_with = visit_cache`",
                    )),
                }
            } else {
                Err(meta.error(format_args!(
                    "unknown mm attribute `{}`; expected `tag`, `skip` or `visit_with`",
                    path_to_string(&meta.path),
                )))
            }
        });
        if let Err(error) = result {
            cx.push(error);
        }
    }
    out
}

/// `a::b` for a path, without the spaces that `quote` would put in.
fn path_to_string(path: &syn::Path) -> String {
    let segments: Vec<String> = path.segments.iter().map(|segment| segment.ident.to_string()).collect();
    let prefix = if path.leading_colon.is_some() { "::" } else { "" };
    format!("{prefix}{}", segments.join("::"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use syn::parse_quote;

    fn parse_ok(attrs: Vec<Attribute>) -> Vec<MmAttr> {
        let cx = Ctxt::default();
        let out = parse(&attrs, &cx);
        cx.finish().expect("no errors");
        out
    }

    fn parse_err(attrs: Vec<Attribute>) -> String {
        let cx = Ctxt::default();
        let _ = parse(&attrs, &cx);
        cx.finish().expect_err("an error").to_string()
    }

    #[test]
    fn reads_tag_and_skip() {
        let out = parse_ok(vec![parse_quote!(#[mm(tag = "Textures")]), parse_quote!(#[mm(skip)])]);
        assert!(matches!(&out[0].kind, Kind::Tag(lit) if lit.value() == "Textures"));
        assert!(matches!(out[1].kind, Kind::Skip));
    }

    #[test]
    fn reads_visit_with() {
        let out = parse_ok(vec![parse_quote!(#[mm(visit_with = my::visit)])]);
        assert!(matches!(&out[0].kind, Kind::VisitWith(path) if path_to_string(path) == "my::visit"));
        assert!(parse_err(vec![parse_quote!(#[mm(visit_with)])]).starts_with("expected a function"));
        assert!(parse_err(vec![parse_quote!(#[mm(visit_with = 3)])]).starts_with("expected a path to a function"));
    }

    #[test]
    fn reads_several_keys_in_one_list() {
        let out = parse_ok(vec![parse_quote!(#[mm(skip, tag = r"Raw")])]);
        assert_eq!(out.len(), 2);
        assert!(matches!(&out[1].kind, Kind::Tag(lit) if lit.value() == "Raw"));
    }

    #[test]
    fn ignores_other_attributes() {
        assert!(parse_ok(vec![parse_quote!(#[doc = "x"]), parse_quote!(#[serde(skip)])]).is_empty());
    }

    #[test]
    fn rejects_unknown_keys_by_full_path() {
        assert_eq!(
            parse_err(vec![parse_quote!(#[mm(a::b)])]),
            "unknown mm attribute `a::b`; expected `tag`, `skip` or `visit_with`"
        );
    }

    #[test]
    fn rejects_bad_forms() {
        assert!(parse_err(vec![parse_quote!(#[mm])]).starts_with("expected a list"));
        assert!(parse_err(vec![parse_quote!(#[mm = "x"])]).starts_with("expected a list"));
        assert!(parse_err(vec![parse_quote!(#[mm(tag)])]).starts_with("expected a value"));
        assert!(parse_err(vec![parse_quote!(#[mm(tag = 5)])]).starts_with("expected a string literal"));
        assert!(parse_err(vec![parse_quote!(#[mm(skip = true)])]).starts_with("`skip` takes no value"));
    }

    #[test]
    fn collects_errors_from_every_attribute() {
        let cx = Ctxt::default();
        let attrs: Vec<Attribute> = vec![parse_quote!(#[mm(one)]), parse_quote!(#[mm(two)])];
        let _ = parse(&attrs, &cx);
        assert_eq!(cx.finish().unwrap_err().into_iter().count(), 2);
    }
}
