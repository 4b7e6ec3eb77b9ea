//! Derive macros of the manager SDK: `#[derive(Event)]` declares an event
//! type's name, route and validation; `#[derive(Reply)]` makes a serializable
//! struct a handler's return value. They expand to plain trait impls in
//! `switchyard_manager`; nothing here is needed at run time.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::{Data, DeriveInput, Fields, LitInt, LitStr, parse_macro_input, spanned::Spanned};

/// Implements `switchyard_manager::Event`.
///
/// ```ignore
/// #[derive(Serialize, Deserialize, Event)]
/// #[event(name = "shop.GetItem", http = "GET /items/{id}")]
/// struct GetItem {
///     #[validate(range(min = 1))]
///     id: u64,
///     #[validate(length(min = 1, max = 64))]
///     lang: String,
/// }
/// ```
///
/// `#[event(body)]` takes the whole request body as the event (for newtypes
/// over arbitrary JSON); otherwise the event's fields come from the path
/// parameters, the query string and the JSON body's fields.
#[proc_macro_derive(Event, attributes(event, validate))]
pub fn derive_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand_event(&input)
        .unwrap_or_else(|e| e.to_compile_error())
        .into()
}

/// Implements `switchyard_manager::Reply` for a `Serialize` type: JSON for
/// HTTP callers, bincode for other managers. `#[reply(status = 201)]` sets
/// the status (default 200).
#[proc_macro_derive(Reply, attributes(reply))]
pub fn derive_reply(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    expand_reply(&input)
        .unwrap_or_else(|e| e.to_compile_error())
        .into()
}

fn expand_event(input: &DeriveInput) -> syn::Result<Tokens> {
    let ident = &input.ident;
    let mut name = ident.to_string();
    let mut route = quote!(::core::option::Option::None);
    let mut whole_body = false;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("event")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("name") {
                name = meta.value()?.parse::<LitStr>()?.value();
            } else if meta.path.is_ident("http") {
                let lit: LitStr = meta.value()?.parse()?;
                let text = lit.value();
                let (method, path) = text
                    .split_once(' ')
                    .filter(|(m, p)| !m.is_empty() && p.starts_with('/'))
                    .ok_or_else(|| syn::Error::new(lit.span(), "expected \"METHOD /path\""))?;
                let method = method.to_ascii_uppercase();
                let path = path.trim();
                route = quote!(::core::option::Option::Some((#method, #path)));
            } else if meta.path.is_ident("body") {
                whole_body = true;
            } else {
                return Err(meta.error("expected `name`, `http` or `body`"));
            }
            Ok(())
        })?;
    }
    let checks = validations(input)?;
    let from_request = whole_body.then(|| {
        quote! {
            fn from_request(request: &::switchyard_manager::Request<'_>) -> ::core::result::Result<Self, ::switchyard_manager::Error> {
                request.body_as()
            }
        }
    });
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        impl #impl_generics ::switchyard_manager::Event for #ident #ty_generics #where_clause {
            const NAME: &'static str = #name;
            const ROUTE: ::core::option::Option<(&'static str, &'static str)> = #route;
            #from_request
            fn validate(&self) -> ::core::result::Result<(), ::switchyard_manager::Invalid> {
                let mut invalid = ::switchyard_manager::Invalid::default();
                #(#checks)*
                invalid.into_result()
            }
        }
    })
}

fn validations(input: &DeriveInput) -> syn::Result<Vec<Tokens>> {
    let Data::Struct(data) = &input.data else {
        return Ok(Vec::new());
    };
    let Fields::Named(fields) = &data.fields else {
        return Ok(Vec::new());
    };
    let mut checks = Vec::new();
    for field in &fields.named {
        let Some(ident) = &field.ident else { continue };
        let key = ident.to_string();
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("validate")) {
            attr.parse_nested_meta(|meta| {
                let (min, max) = if meta.path.is_ident("length") || meta.path.is_ident("range") {
                    let mut min = quote!(::core::option::Option::None);
                    let mut max = quote!(::core::option::Option::None);
                    meta.parse_nested_meta(|bound| {
                        let value: syn::Expr = bound.value()?.parse()?;
                        let value = quote!(::core::option::Option::Some(#value));
                        if bound.path.is_ident("min") {
                            min = value;
                        } else if bound.path.is_ident("max") {
                            max = value;
                        } else {
                            return Err(bound.error("expected `min` or `max`"));
                        }
                        Ok(())
                    })?;
                    (min, max)
                } else {
                    (quote!(), quote!())
                };
                if meta.path.is_ident("length") {
                    checks.push(quote! {
                        ::switchyard_manager::validate::length(&mut invalid, #key, &self.#ident, #min, #max);
                    });
                } else if meta.path.is_ident("range") {
                    checks.push(quote! {
                        ::switchyard_manager::validate::range(&mut invalid, #key, &self.#ident, #min, #max);
                    });
                } else if meta.path.is_ident("non_empty") {
                    checks.push(quote! {
                        ::switchyard_manager::validate::length(&mut invalid, #key, &self.#ident, ::core::option::Option::Some(1), ::core::option::Option::None);
                    });
                } else if meta.path.is_ident("custom") {
                    let path: syn::ExprPath = meta.value()?.parse::<LitStr>()?.parse()?;
                    checks.push(quote! {
                        if let ::core::result::Result::Err(message) = #path(&self.#ident) {
                            invalid.add(#key, message);
                        }
                    });
                } else {
                    return Err(meta.error("expected `length(..)`, `range(..)`, `non_empty` or `custom = \"fn\"`"));
                }
                Ok(())
            })?;
        }
    }
    Ok(checks)
}

fn expand_reply(input: &DeriveInput) -> syn::Result<Tokens> {
    let ident = &input.ident;
    let mut status: u16 = 200;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("reply")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("status") {
                let lit: LitInt = meta.value()?.parse()?;
                status = lit.base10_parse()?;
                if !(100..=599).contains(&status) {
                    return Err(syn::Error::new(lit.span(), "status must be 100..=599"));
                }
                Ok(())
            } else {
                Err(meta.error("expected `status`"))
            }
        })?;
    }
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let _ = input.span();
    Ok(quote! {
        impl #impl_generics ::switchyard_manager::Reply for #ident #ty_generics #where_clause {
            fn into_response(self, format: ::switchyard_manager::Format) -> ::core::result::Result<::switchyard_manager::Response, ::switchyard_manager::Error> {
                ::switchyard_manager::Response::encode(#status, &self, format)
            }
        }
    })
}
