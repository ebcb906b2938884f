//! Writing the `impl MMObject` for a checked [`Input`].
//!
//! The generated code names `mmobject` only through `::mmobject::__private`,
//! and sits inside `const _: () = { ... };` so nothing it declares leaks into
//! the user's namespace.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{GenericParam, Generics, Ident, Member};

use crate::ast::{Data, Field, Input};

/// The full impl for a valid input.
pub fn derive(input: &Input<'_>) -> TokenStream {
    let name = input.ident.unraw().to_string();
    let tag = input.tag().map_or_else(|| name.clone(), syn::LitStr::value);
    let params = input.type_params();
    let (size, visit, release) = match &input.data {
        Data::Struct(fields) => (
            Some(struct_size(fields)),
            struct_visit(fields, &params).map(|visit| {
                let named = struct_visit_named(fields, &params);
                quote!(#visit #named)
            }),
            struct_release(fields),
        ),
        Data::Enum(variants) if variants.is_empty() => (None, None, None),
        Data::Enum(variants) => {
            let arms: Vec<(&Ident, Vec<&Field>)> = variants
                .iter()
                .map(|variant| (variant.ident, variant.fields.iter().filter(|f| !f.is_skipped()).collect()))
                .collect();
            let named = enum_visit_named(&arms, &params);
            let visit = enum_visit(&arms, &params).map(|visit| quote!(#visit #named));
            (Some(enum_size(&arms)), visit, enum_release(&arms))
        }
        Data::Union(_) => (None, None, None),
    };
    let may_hold = may_hold_fn(&visited_fields(input), &params);
    let methods = size.into_iter().chain(visit).chain(release).chain(Some(may_hold)).collect();
    wrap(input.ident, &field_bounds(input), &name, &tag, methods)
}

/// Every field that is visited (not `#[mm(skip)]`), over all variants.
fn visited_fields<'a>(input: &'a Input<'_>) -> Vec<&'a Field> {
    let fields: Vec<&Field> = match &input.data {
        Data::Struct(fields) => fields.iter().collect(),
        Data::Enum(variants) => variants.iter().flat_map(|variant| &variant.fields).collect(),
        Data::Union(_) => Vec::new(),
    };
    fields.into_iter().filter(|field| !field.is_skipped()).collect()
}

/// Whether a field's type may hold handles, as a `bool` expression:
/// `true` with `visit_with` (the function may find any). Otherwise, with
/// `probe_fields`, the type probe: a runtime call that reads
/// `VisitHandles::MAY_HOLD_HANDLES`, or is false for a type without
/// `VisitHandles` (visited as holding nothing; a type that names `Handle`
/// and lacks it is already a compile error at its visit). Without it (a
/// constant), the constant of a type that involves a type parameter (the
/// impl bounds it by `VisitHandles`), and `true` for the others, which a
/// constant cannot probe.
fn field_may_hold(field: &Field, params: &[&Ident], probe_fields: bool) -> TokenStream {
    let ty = &field.ty;
    if field.visit_with().is_some() {
        quote!(true)
    } else if probe_fields {
        quote!((&::mmobject::__private::TypeProbe::<#ty>::NEW).mm_may_hold_handles())
    } else if field.mentions_type_param(params) {
        quote!(<#ty as ::mmobject::__private::VisitHandles>::MAY_HOLD_HANDLES)
    } else {
        quote!(true)
    }
}

/// `MMObject::may_hold_handles`: any visited field's type may hold handles.
fn may_hold_fn(fields: &[&Field], params: &[&Ident]) -> TokenStream {
    if fields.is_empty() {
        return quote!(
            fn may_hold_handles() -> bool {
                false
            }
        );
    }
    let each = fields.iter().map(|field| field_may_hold(field, params, true));
    quote! {
        fn may_hold_handles() -> bool {
            #[allow(unused_imports)]
            use ::mmobject::__private::{NoMayHoldHandles as _, ViaMayHoldHandles as _};
            false #(|| #each)*
        }
    }
}

/// The `impl VisitHandles` and `impl ReleaseHandles` of `#[derive(VisitHandles)]`.
pub fn derive_visit_handles(input: &Input<'_>) -> TokenStream {
    let params = input.type_params();
    let (visit, release) = match &input.data {
        Data::Struct(fields) => (struct_visit(fields, &params), struct_release(fields)),
        Data::Enum(variants) => {
            let arms: Vec<(&Ident, Vec<&Field>)> = variants
                .iter()
                .map(|variant| (variant.ident, variant.fields.iter().filter(|f| !f.is_skipped()).collect()))
                .collect();
            (enum_visit(&arms, &params), enum_release(&arms))
        }
        Data::Union(_) => (None, None),
    };
    let visit = visit.unwrap_or_else(|| visit_fn(TokenStream::new()));
    let release = release.unwrap_or_else(|| release_fn(TokenStream::new()));
    let each = visited_fields(input).into_iter().map(|field| field_may_hold(field, &params, false)).collect::<Vec<_>>();
    let may_hold = quote!(const MAY_HOLD_HANDLES: bool = false #(|| #each)*;);
    wrap_visit_handles(input.ident, &field_bounds(input), quote!(#may_hold #visit), release)
}

/// The stub of `#[derive(VisitHandles)]`, emitted next to its errors.
pub fn stub_visit_handles(input: &Input<'_>) -> TokenStream {
    wrap_visit_handles(input.ident, input.generics, visit_fn(TokenStream::new()), release_fn(TokenStream::new()))
}

fn wrap_visit_handles(ident: &Ident, generics: &Generics, visit: TokenStream, release: TokenStream) -> TokenStream {
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl #impl_generics ::mmobject::__private::VisitHandles for #ident #ty_generics #where_clause {
                #[allow(unused_variables)]
                #visit
            }
            #[automatically_derived]
            impl #impl_generics ::mmobject::__private::ReleaseHandles for #ident #ty_generics #where_clause {
                #release
            }
        };
    }
}

/// The input's generics plus `FieldType: VisitHandles` for every visited
/// field whose type involves a type parameter, so that `Wrapper<Handle<T>>`
/// visits its handle (the probe cannot see through a type parameter).
fn field_bounds(input: &Input<'_>) -> Generics {
    let params = input.type_params();
    let mut generics = input.generics.clone();
    if params.is_empty() {
        return generics;
    }
    let mut seen: Vec<String> = Vec::new();
    let bounds: Vec<syn::WherePredicate> = visited_fields(input)
        .into_iter()
        .filter(|field| field.visit_with().is_none())
        .filter(|field| field.mentions_type_param(&params))
        .filter(|field| {
            let key = field.ty.to_token_stream().to_string();
            !seen.contains(&key) && {
                seen.push(key);
                true
            }
        })
        .map(|field| {
            let ty = &field.ty;
            syn::parse_quote!(#ty: ::mmobject::__private::VisitHandles)
        })
        .collect();
    generics.make_where_clause().predicates.extend(bounds);
    generics
}

/// An impl with the constants and the trait's default methods, emitted next to
/// `compile_error!` so that one mistake in the attributes does not also cause
/// "`MMObject` is not implemented" errors wherever the type is used.
pub fn stub(input: &Input<'_>) -> TokenStream {
    let name = input.ident.unraw().to_string();
    wrap(input.ident, input.generics, &name, &name, TokenStream::new())
}

fn wrap(ident: &Ident, generics: &Generics, name: &str, tag: &str, methods: TokenStream) -> TokenStream {
    let generics = with_bounds(generics);
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();
    quote! {
        #[doc(hidden)]
        const _: () = {
            #[automatically_derived]
            impl #impl_generics ::mmobject::__private::MMObject for #ident #ty_generics #where_clause {
                const TYPE_NAME: &'static str = #name;
                const TAG: &'static str = #tag;
                #methods
            }
        };
    }
}

/// `generics` plus `T: Send + Sync + 'static` for each type parameter and
/// `'a: 'static` for each lifetime, since `MMObject: Send + Sync + 'static`.
fn with_bounds(generics: &Generics) -> Generics {
    let mut generics = generics.clone();
    let bounds: Vec<syn::WherePredicate> = generics
        .params
        .iter()
        .filter_map(|param| match param {
            GenericParam::Type(param) => {
                let ident = &param.ident;
                Some(syn::parse_quote!(#ident: ::core::marker::Send + ::core::marker::Sync + 'static))
            }
            GenericParam::Lifetime(param) => {
                let lifetime = &param.lifetime;
                Some(syn::parse_quote!(#lifetime: 'static))
            }
            GenericParam::Const(_) => None,
        })
        .collect();
    generics.make_where_clause().predicates.extend(bounds);
    generics
}

/// `(&Probe(place)).mm_heap_size()`: autoref specialization picks
/// `ViaHeapSize` (on `Probe<T>`, receiver `&Probe<T>`) when the field type
/// implements `HeapSize`, and `NoHeapSize` (on `&Probe<T>`, reached by one
/// more autoref) otherwise.
fn heap_size_of(place: &TokenStream) -> TokenStream {
    quote!((&::mmobject::__private::Probe(#place)).mm_heap_size())
}

/// Visits one field's handles, passing `sink` (a `&mut dyn FnMut(ObjectKey)`):
///
/// - with `#[mm(visit_with = f)]`: `f(place, sink)`;
/// - if the field's type names `Handle` or a type parameter: through the
///   `VisitHandles` trait itself, so a type that does not implement it is a
///   compile error pointing at the field (never a silent "no handles");
/// - otherwise through the probe: `VisitHandles` if the type implements it,
///   else nothing (the type is taken to hold no handles).
fn visit_field(field: &Field, place: &TokenStream, sink: &TokenStream, params: &[&Ident]) -> TokenStream {
    if let Some(path) = field.visit_with() {
        quote_spanned!(path.span()=> #path(#place, #sink);)
    } else if field.may_hold_handles(params) {
        // A single identifier located at the field's type is what an unmet
        // bound points at, so the error names the field.
        let span = field.ty.span();
        let binding = Ident::new("__mm_place", span);
        quote_spanned! {span=>
            {
                let #binding = #place;
                ::mmobject::__private::VisitHandles::visit_handles(#binding, #sink);
            }
        }
    } else {
        quote!((&::mmobject::__private::Probe(#place)).mm_visit_handles(#sink);)
    }
}

/// `(&mut ProbeMut(place)).mm_release_handles()`: `ViaReleaseHandles` when
/// the field type implements `ReleaseHandles`, else the no-op `NoReleaseHandles`.
fn release_of(place: &TokenStream) -> TokenStream {
    quote!((&mut ::mmobject::__private::ProbeMut(#place)).mm_release_handles();)
}

fn release_fn(body: TokenStream) -> TokenStream {
    quote! {
        fn release_handles(&mut self) {
            #[allow(unused_imports)]
            use ::mmobject::__private::{NoReleaseHandles as _, ViaReleaseHandles as _};
            #body
        }
    }
}

fn struct_release(fields: &[Field]) -> Option<TokenStream> {
    let places: Vec<TokenStream> = fields
        .iter()
        .filter(|field| !field.is_skipped())
        .map(|field| {
            let member = &field.member;
            quote!(&mut self.#member)
        })
        .collect();
    if places.is_empty() {
        return None;
    }
    let releases = places.iter().map(release_of);
    Some(release_fn(quote!(#(#releases)*)))
}

fn enum_release(arms: &[(&Ident, Vec<&Field>)]) -> Option<TokenStream> {
    let matched = enum_arms(
        arms,
        |places, _| {
            let releases = places.iter().map(release_of);
            quote!({ #(#releases)* })
        },
        quote!({}),
    )?;
    Some(release_fn(matched))
}

/// The name a field is reported under: `albedo`, or `0` for a tuple field.
fn field_label(field: &Field) -> String {
    match &field.member {
        Member::Named(ident) => ident.unraw().to_string(),
        Member::Unnamed(index) => index.index.to_string(),
    }
}

/// Visits one field, passing each key on with the field's name:
/// `&mut |key| visitor("label", key)`.
fn visit_named_of(field: &Field, place: &TokenStream, visitor: &Ident, params: &[&Ident]) -> TokenStream {
    let key = Ident::new("key", Span::mixed_site());
    let label = field_label(field);
    visit_field(field, place, &quote!(&mut |#key| #visitor(#label, #key)), params)
}

fn visit_named_fn(body: TokenStream) -> TokenStream {
    let visitor = visitor_ident();
    quote! {
        fn visit_handles_named(
            &self,
            #visitor: &mut dyn ::core::ops::FnMut(&'static str, ::mmobject::__private::ObjectKey),
        ) {
            #[allow(unused_imports)]
            use ::mmobject::__private::{NoVisitHandles as _, ViaVisitHandles as _};
            #body
        }
    }
}

fn struct_visit_named(fields: &[Field], params: &[&Ident]) -> Option<TokenStream> {
    let visitor = visitor_ident();
    let visits: Vec<TokenStream> = fields
        .iter()
        .filter(|field| !field.is_skipped())
        .map(|field| {
            let member = &field.member;
            visit_named_of(field, &quote!(&self.#member), &visitor, params)
        })
        .collect();
    (!visits.is_empty()).then(|| visit_named_fn(quote!(#(#visits)*)))
}

fn enum_visit_named(arms: &[(&Ident, Vec<&Field>)], params: &[&Ident]) -> Option<TokenStream> {
    let visitor = visitor_ident();
    let matched = enum_arms(
        arms,
        |places, fields| {
            let visits = places.iter().zip(fields).map(|(place, field)| visit_named_of(field, place, &visitor, params));
            quote!({ #(#visits)* })
        },
        quote!({}),
    )?;
    Some(visit_named_fn(matched))
}

fn visitor_ident() -> Ident {
    Ident::new("visitor", Span::mixed_site())
}

fn size_fn(extra: Option<TokenStream>) -> TokenStream {
    let extra = extra.map(|extra| {
        quote! {
            + {
                #[allow(unused_imports)]
                use ::mmobject::__private::{NoHeapSize as _, ViaHeapSize as _};
                #extra
            }
        }
    });
    quote! {
        #[inline]
        fn size(&self) -> usize {
            ::mmobject::__private::size_of::<Self>() #extra
        }
    }
}

fn visit_fn(body: TokenStream) -> TokenStream {
    let visitor = visitor_ident();
    quote! {
        fn visit_handles(&self, #visitor: &mut dyn ::core::ops::FnMut(::mmobject::__private::ObjectKey)) {
            #[allow(unused_imports)]
            use ::mmobject::__private::{NoVisitHandles as _, ViaVisitHandles as _};
            #body
        }
    }
}

fn struct_places(fields: &[Field]) -> Vec<TokenStream> {
    fields
        .iter()
        .filter(|field| !field.is_skipped())
        .map(|field| {
            let member = &field.member;
            quote!(&self.#member)
        })
        .collect()
}

fn struct_size(fields: &[Field]) -> TokenStream {
    let places = struct_places(fields);
    let sizes = places.iter().map(heap_size_of);
    size_fn((!places.is_empty()).then(|| quote!(#(#sizes)+*)))
}

fn struct_visit(fields: &[Field], params: &[&Ident]) -> Option<TokenStream> {
    let places = struct_places(fields);
    if places.is_empty() {
        return None;
    }
    let visitor = visitor_ident();
    let visited = fields.iter().filter(|field| !field.is_skipped());
    let visits = places.iter().zip(visited).map(|(place, field)| visit_field(field, place, &quote!(#visitor), params));
    Some(visit_fn(quote!(#(#visits)*)))
}

/// `Self::V { a: __mm_field_0, 1: __mm_field_1, .. }` and the bindings, in order.
/// The braced form with `..` fits named, tuple and unit variants alike.
fn variant_pattern(variant: &Ident, fields: &[&Field]) -> (TokenStream, Vec<TokenStream>) {
    let bindings: Vec<Ident> =
        (0..fields.len()).map(|i| format_ident!("__mm_field_{}", i, span = Span::mixed_site())).collect();
    let members: Vec<&Member> = fields.iter().map(|field| &field.member).collect();
    let pattern = quote!(Self::#variant { #(#members: #bindings,)* .. });
    (pattern, bindings.iter().map(|binding| quote!(#binding)).collect())
}

/// Match arms for variants with counted fields; `_` covers the others.
fn enum_arms(
    arms: &[(&Ident, Vec<&Field>)],
    arm_body: impl Fn(&[TokenStream], &[&Field]) -> TokenStream,
    fallback: TokenStream,
) -> Option<TokenStream> {
    let mut out = TokenStream::new();
    for (variant, fields) in arms.iter().filter(|(_, fields)| !fields.is_empty()) {
        let (pattern, places) = variant_pattern(variant, fields);
        let body = arm_body(&places, fields);
        out.extend(quote!(#pattern => #body,));
    }
    if out.is_empty() {
        return None;
    }
    if arms.iter().any(|(_, fields)| fields.is_empty()) {
        out.extend(quote!(_ => #fallback,));
    }
    Some(quote!(match self { #out }))
}

fn enum_size(arms: &[(&Ident, Vec<&Field>)]) -> TokenStream {
    let matched = enum_arms(
        arms,
        |places, _| {
            let sizes = places.iter().map(heap_size_of);
            quote!(#(#sizes)+*)
        },
        quote!(0),
    );
    size_fn(matched)
}

fn enum_visit(arms: &[(&Ident, Vec<&Field>)], params: &[&Ident]) -> Option<TokenStream> {
    let visitor = visitor_ident();
    let matched = enum_arms(
        arms,
        |places, fields| {
            let visits =
                places.iter().zip(fields).map(|(place, field)| visit_field(field, place, &quote!(#visitor), params));
            quote!({ #(#visits)* })
        },
        quote!({}),
    )?;
    Some(visit_fn(matched))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctxt::Ctxt;
    use syn::{parse_quote, DeriveInput};

    fn expand(input: DeriveInput) -> String {
        let cx = Ctxt::default();
        let model = Input::from_syn(&input, &cx);
        cx.finish().unwrap();
        derive(&model).to_string()
    }

    #[test]
    fn names_the_crate_only_through_private() {
        let out = expand(parse_quote!(
            struct S {
                a: Vec<u8>,
            }
        ));
        assert!(out.starts_with("# [doc (hidden)] const _ : () ="), "{out}");
        for path in out.match_indices(":: mmobject ::") {
            assert!(out[path.0..].starts_with(":: mmobject :: __private ::"), "{out}");
        }
    }

    #[test]
    fn uses_the_bare_name_and_tag() {
        let out = expand(parse_quote!(
            #[mm(tag = r"Tex")]
            struct r#Wrapper<T, const N: usize> {
                a: [T; N],
            }
        ));
        assert!(out.contains("const TYPE_NAME : & 'static str = \"Wrapper\""), "{out}");
        assert!(out.contains("const TAG : & 'static str = \"Tex\""), "{out}");
        assert!(out.contains("T : :: core :: marker :: Send + :: core :: marker :: Sync + 'static"), "{out}");
    }

    #[test]
    fn skips_methods_with_nothing_to_do() {
        let out = expand(parse_quote!(
            struct Unit;
        ));
        assert!(out.contains("fn size"), "{out}");
        assert!(!out.contains("mm_heap_size"), "{out}");
        assert!(!out.contains("visit_handles"), "{out}");
        assert!(out.contains("fn may_hold_handles () -> bool { false }"), "{out}");
        let out = expand(parse_quote!(
            enum Never {}
        ));
        assert_eq!(out.matches("fn ").count(), 1, "{out}");
        assert!(out.contains("fn may_hold_handles () -> bool { false }"), "{out}");
    }

    #[test]
    fn names_fields_when_visiting() {
        let out = expand(parse_quote!(
            struct S {
                r#albedo: H,
                #[mm(skip)]
                hidden: H,
            }
        ));
        assert!(out.contains("fn visit_handles_named"), "{out}");
        assert!(out.contains("visitor (\"albedo\" , key)"), "{out}");
        assert!(!out.contains("\"hidden\""), "{out}");
        let out = expand(parse_quote!(
            enum E {
                A(H, #[mm(skip)] H, H),
            }
        ));
        assert!(out.contains("visitor (\"0\" , key)") && out.contains("visitor (\"2\" , key)"), "{out}");
    }

    #[test]
    fn releases_through_the_mutable_probe() {
        let out = expand(parse_quote!(
            struct S {
                a: Option<H>,
                #[mm(skip)]
                b: Option<H>,
            }
        ));
        assert!(out.contains("fn release_handles (& mut self)"), "{out}");
        assert!(out.contains(":: mmobject :: __private :: ProbeMut (& mut self . a)"), "{out}");
        assert!(!out.contains("self . b"), "{out}");
        let out = expand(parse_quote!(
            enum E {
                A(Vec<H>),
                B,
            }
        ));
        assert!(out.contains("ProbeMut (__mm_field_0)"), "{out}");
    }

    #[test]
    fn enum_arms_cover_fieldless_variants_with_a_wildcard() {
        let out = expand(parse_quote!(
            enum E {
                A(u8),
                B,
                C {
                    #[mm(skip)]
                    x: u8,
                },
            }
        ));
        assert!(out.contains("Self :: A { 0 : __mm_field_0 , .. }"), "{out}");
        assert!(!out.contains("Self :: C"), "{out}");
        assert!(out.contains("_ => 0"), "{out}");
    }
}
