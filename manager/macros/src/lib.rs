//! Derive macros of the manager SDK: `#[derive(Event)]` declares an event
//! type's name, route and validation; `#[derive(Reply)]` makes a serializable
//! struct a handler's return value. They expand to plain trait impls in
//! `switchyard_manager`; nothing here is needed at run time.

use proc_macro::TokenStream;
use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::{Data, DeriveInput, Fields, LitInt, LitStr, parse_macro_input, spanned::Spanned};

/// Implements `switchyard_manager::Event` and `switchyard_manager::EventName`.
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
/// `#[event(public)]` lets WebSocket and gRPC clients send the event; an
/// event with an `http` route is public anyway. Any other event is
/// internal: only the group's managers may send it (decision 0108).
///
/// `#[event(template = "hello.html")]` names the template that renders the
/// reply as HTML for clients that prefer it (docs/web.md).
///
/// `#[event(body)]` takes the whole request body as the event (for newtypes
/// over arbitrary JSON); otherwise the event's fields come from the path
/// parameters, the query string and the JSON body's fields.
///
/// `#[event(reply = Reserved)]` names the reply: `cx.call` of the event
/// gives a `Reserved`, and `Registry::handle` accepts only a handler that
/// returns one (`switchyard_manager::Returns`).
///
/// What the handler reads of its request besides the body, query and path
/// parameters is a field bound with `#[from(...)]`: `#[from(header =
/// "x-api-key")]`, `#[from(cookie = "session")]`, `#[from(scope = "sub")]`,
/// `#[from(method)]`, `#[from(path)]`, `#[from(client)]` (an `IpAddr`) or
/// `#[from(identity)]` (an `Identity`). The field is both the declaration
/// (only what is declared travels with the event) and the read; it takes
/// its value from there and nowhere else: a client's body, query or path
/// cannot set it. Make it an `Option` to accept its absence (otherwise 400,
/// or 401 for the scope and the identity).
///
/// The older `#[event(request(method, path, client, identity, headers =
/// ["user-agent"], cookies = ["theme"], scope = ["roles"]))]` declares the
/// same for reading through `Context`'s getters.
#[proc_macro_derive(Event, attributes(event, validate, from))]
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

/// What `#[event(request(...))]` declares.
#[derive(Default)]
struct Declared {
    method: bool,
    path: bool,
    client: bool,
    identity: bool,
    headers: Vec<String>,
    cookies: Vec<String>,
    scope: Vec<String>,
}

fn push_unique(list: &mut Vec<String>, name: String) {
    if !list.contains(&name) {
        list.push(name);
    }
}

fn parse_names(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Vec<String>> {
    let array: syn::ExprArray = meta.value()?.parse()?;
    array
        .elems
        .iter()
        .map(|e| match e {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) if !s.value().is_empty() => Ok(s.value()),
            other => Err(syn::Error::new(other.span(), "expected a non-empty string")),
        })
        .collect()
}

/// The sources of `#[from(...)]` that take no name.
const NAMELESS: [&str; 4] = ["Method", "Path", "Client", "Identity"];

/// A field bound to a source of the request with `#[from(...)]`.
struct Bound {
    ident: syn::Ident,
    ty: syn::Type,
    /// The key serde reads the field from.
    key: String,
    kind: &'static str,
    name: String,
}

fn expand_event(input: &DeriveInput) -> syn::Result<Tokens> {
    let ident = &input.ident;
    let mut name = ident.to_string();
    let mut route = quote!(::core::option::Option::None);
    let mut route_path = String::new();
    let mut whole_body = false;
    let mut public = false;
    let mut template = quote!(::core::option::Option::None);
    let mut declared = Declared::default();
    let mut reply: Option<syn::Type> = None;
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
                route_path = path.to_owned();
                route = quote!(::core::option::Option::Some((#method, #path)));
            } else if meta.path.is_ident("reply") {
                reply = Some(meta.value()?.parse()?);
            } else if meta.path.is_ident("body") {
                whole_body = true;
            } else if meta.path.is_ident("public") {
                public = true;
            } else if meta.path.is_ident("template") {
                let lit: LitStr = meta.value()?.parse()?;
                if lit.value().is_empty() {
                    return Err(syn::Error::new(lit.span(), "expected a template name"));
                }
                template = quote!(::core::option::Option::Some(#lit));
            } else if meta.path.is_ident("request") {
                meta.parse_nested_meta(|item| {
                    if item.path.is_ident("method") {
                        declared.method = true;
                    } else if item.path.is_ident("path") {
                        declared.path = true;
                    } else if item.path.is_ident("client") {
                        declared.client = true;
                    } else if item.path.is_ident("identity") {
                        declared.identity = true;
                    } else if item.path.is_ident("headers") {
                        for h in parse_names(&item)? {
                            push_unique(&mut declared.headers, h.to_ascii_lowercase());
                        }
                    } else if item.path.is_ident("cookies") {
                        for c in parse_names(&item)? {
                            push_unique(&mut declared.cookies, c);
                        }
                    } else if item.path.is_ident("scope") {
                        for c in parse_names(&item)? {
                            push_unique(&mut declared.scope, c);
                        }
                    } else {
                        return Err(item.error(
                            "expected `method`, `path`, `client`, `identity`, `headers = [..]`, `cookies = [..]` or `scope = [..]`",
                        ));
                    }
                    Ok(())
                })?;
            } else {
                return Err(meta.error(
                    "expected `name`, `http`, `reply`, `body`, `public`, `template` or `request(..)`",
                ));
            }
            Ok(())
        })?;
    }
    let checks = validations(input)?;
    let schema = event_schema(input, whole_body)?;
    let bound = bound_fields(input, &route_path)?;
    for b in &bound {
        match b.kind {
            "Header" => push_unique(&mut declared.headers, b.name.clone()),
            "Cookie" => push_unique(&mut declared.cookies, b.name.clone()),
            "Scope" => push_unique(&mut declared.scope, b.name.clone()),
            "Method" => declared.method = true,
            "Path" => declared.path = true,
            "Client" => declared.client = true,
            _ => declared.identity = true,
        }
    }
    let from_request = if bound.is_empty() {
        whole_body.then(|| {
            quote! {
                fn from_request(request: &::switchyard_manager::Request<'_>) -> ::core::result::Result<Self, ::switchyard_manager::Error> {
                    request.body_as()
                }
            }
        })
    } else {
        let sources: Vec<Tokens> = bound
            .iter()
            .map(|b| {
                let kind = syn::Ident::new(b.kind, proc_macro2::Span::call_site());
                let name = &b.name;
                if NAMELESS.contains(&b.kind) {
                    quote!(::switchyard_manager::Source::#kind)
                } else {
                    quote!(::switchyard_manager::Source::#kind(#name))
                }
            })
            .collect();
        let keys = bound.iter().map(|b| &b.key);
        let idents: Vec<_> = bound.iter().map(|b| &b.ident).collect();
        let types = bound.iter().map(|b| &b.ty);
        let values: Vec<_> = (0..bound.len())
            .map(|i| syn::Ident::new(&format!("__bound_{i}"), proc_macro2::Span::call_site()))
            .collect();
        let sources_again = sources.clone();
        Some(quote! {
            fn from_request(request: &::switchyard_manager::Request<'_>) -> ::core::result::Result<Self, ::switchyard_manager::Error> {
                if !request.from_client() {
                    return ::switchyard_manager::bound::decode(request, &[], #whole_body);
                }
                // A client's request sets these from their sources alone,
                // whatever its body, query or path say.
                #(let #values: #types = ::switchyard_manager::bound::value(request, #sources_again)?;)*
                let mut event: Self = ::switchyard_manager::bound::decode(
                    request,
                    &[#((#keys, #sources)),*],
                    #whole_body,
                )?;
                #(event.#idents = #values;)*
                ::core::result::Result::Ok(event)
            }
        })
    };
    let Declared {
        method,
        path,
        client,
        identity,
        headers,
        cookies,
        scope,
    } = declared;
    let request_info = quote! {
        const REQUEST: ::switchyard_manager::RequestInfo = ::switchyard_manager::RequestInfo {
            method: #method,
            path: #path,
            client: #client,
            identity: #identity,
            headers: &[#(#headers),*],
            cookies: &[#(#cookies),*],
            scope: &[#(#scope),*],
        };
    };
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let returns = match reply {
        Some(reply) => quote! {
            impl #impl_generics ::switchyard_manager::Returns<#reply> for #ident #ty_generics #where_clause {}
            impl #impl_generics ::switchyard_manager::DeclaredReply for #ident #ty_generics #where_clause {
                type Reply = #reply;
            }
        },
        None => {
            // No reply named: any handler, and a call's result as the
            // caller annotates it.
            let mut generics = input.generics.clone();
            generics.params.push(syn::parse_quote!(__SwitchyardReply));
            let (impl_generics, _, _) = generics.split_for_impl();
            quote! {
                impl #impl_generics ::switchyard_manager::Returns<__SwitchyardReply> for #ident #ty_generics #where_clause {}
            }
        }
    };
    Ok(quote! {
        #returns
        // The name again for what links the shared event vocabulary
        // without the SDK: a client's typed calls (decision 0144).
        impl #impl_generics ::switchyard_manager::EventName for #ident #ty_generics #where_clause {
            const EVENT_NAME: &'static str = #name;
        }
        impl #impl_generics ::switchyard_manager::Event for #ident #ty_generics #where_clause {
            const NAME: &'static str = #name;
            const ROUTE: ::core::option::Option<(&'static str, &'static str)> = #route;
            const TEMPLATE: ::core::option::Option<&'static str> = #template;
            const PUBLIC: bool = #public;
            #request_info
            #from_request
            fn validate(&self) -> ::core::result::Result<(), ::switchyard_manager::Invalid> {
                let mut invalid = ::switchyard_manager::Invalid::default();
                #(#checks)*
                invalid.into_result()
            }
            #schema
        }
    })
}

/// Serde's `rename_all` rules, applied to a snake_case field name.
fn rename(rule: &str, field: &str) -> Option<String> {
    let words = field.split('_').filter(|w| !w.is_empty());
    let capital = |w: &str| {
        let mut c = w.chars();
        c.next()
            .map(|f| f.to_uppercase().chain(c).collect::<String>())
            .unwrap_or_default()
    };
    Some(match rule {
        "lowercase" | "snake_case" => field.to_owned(),
        "UPPERCASE" | "SCREAMING_SNAKE_CASE" => field.to_ascii_uppercase(),
        "PascalCase" => words.map(capital).collect(),
        "camelCase" => {
            let pascal: String = words.map(capital).collect();
            let mut c = pascal.chars();
            c.next()
                .map(|f| f.to_lowercase().chain(c).collect())
                .unwrap_or_default()
        }
        "kebab-case" => field.replace('_', "-"),
        "SCREAMING-KEBAB-CASE" => field.to_ascii_uppercase().replace('_', "-"),
        _ => return None,
    })
}

/// Skips the value of a serde attribute item this derive does not need.
fn skip_value(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<()> {
    if meta.input.peek(syn::Token![=]) {
        let _: syn::Expr = meta.value()?.parse()?;
    } else if meta.input.peek(syn::token::Paren) {
        let content;
        syn::parenthesized!(content in meta.input);
        let _: Tokens = content.parse()?;
    }
    Ok(())
}

/// A serde `rename`-like item: `= "x"` or `(deserialize = "x", ..)`; the
/// name deserialization uses.
fn deserialize_name(meta: &syn::meta::ParseNestedMeta<'_>) -> syn::Result<Option<String>> {
    if meta.input.peek(syn::Token![=]) {
        return Ok(Some(meta.value()?.parse::<LitStr>()?.value()));
    }
    let mut name = None;
    meta.parse_nested_meta(|inner| {
        let value = inner.value()?.parse::<LitStr>()?.value();
        if inner.path.is_ident("deserialize") {
            name = Some(value);
        }
        Ok(())
    })?;
    Ok(name)
}

/// The fields bound with `#[from(...)]`, with the key serde reads each
/// from. A bound field may not have a serde alias (a second name a client
/// could use), be flattened, or share its name with a path parameter.
fn bound_fields(input: &DeriveInput, route_path: &str) -> syn::Result<Vec<Bound>> {
    let Data::Struct(data) = &input.data else {
        return Ok(Vec::new());
    };
    let Fields::Named(fields) = &data.fields else {
        return Ok(Vec::new());
    };
    let mut rename_all: Option<(String, proc_macro2::Span)> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                let span = meta.path.span();
                if let Some(rule) = deserialize_name(&meta)? {
                    rename_all = Some((rule, span));
                }
                Ok(())
            } else {
                skip_value(&meta)
            }
        })?;
    }
    let mut bound = Vec::new();
    for field in &fields.named {
        let Some(ident) = &field.ident else { continue };
        let mut source: Option<(&'static str, String)> = None;
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("from")) {
            attr.parse_nested_meta(|meta| {
                let nameless = [
                    ("method", "Method"),
                    ("path", "Path"),
                    ("client", "Client"),
                    ("identity", "Identity"),
                ];
                if let Some((_, kind)) = nameless.iter().find(|(word, _)| meta.path.is_ident(word)) {
                    if source.replace((*kind, String::new())).is_some() {
                        return Err(meta.error("a field takes its value from one source"));
                    }
                    return Ok(());
                }
                let kind = if meta.path.is_ident("header") {
                    "Header"
                } else if meta.path.is_ident("cookie") {
                    "Cookie"
                } else if meta.path.is_ident("scope") {
                    "Scope"
                } else {
                    return Err(meta.error(
                        "expected `header = \"..\"`, `cookie = \"..\"`, `scope = \"..\"`, `method`, `path`, `client` or `identity`",
                    ));
                };
                let lit: LitStr = meta.value()?.parse()?;
                let mut name = lit.value();
                if name.is_empty() {
                    return Err(syn::Error::new(lit.span(), "a name is needed"));
                }
                if kind == "Header" {
                    name = name.to_ascii_lowercase();
                }
                if source.replace((kind, name)).is_some() {
                    return Err(meta.error("a field takes its value from one source"));
                }
                Ok(())
            })?;
        }
        let Some((kind, name)) = source else { continue };
        let plain = ident.to_string().trim_start_matches("r#").to_owned();
        let mut key = match &rename_all {
            Some((rule, span)) => rename(rule, &plain).ok_or_else(|| {
                syn::Error::new(
                    *span,
                    format!("unknown rename_all rule `{rule}` on an event with #[from] fields"),
                )
            })?,
            None => plain.clone(),
        };
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("serde")) {
            attr.parse_nested_meta(|meta| {
                if meta.path.is_ident("rename") {
                    if let Some(renamed) = deserialize_name(&meta)? {
                        key = renamed;
                    }
                    Ok(())
                } else if meta.path.is_ident("alias") || meta.path.is_ident("flatten") {
                    Err(meta.error(
                        "a #[from] field cannot have a serde alias or be flattened: a client could set it under that name",
                    ))
                } else {
                    skip_value(&meta)
                }
            })?;
        }
        if route_path.contains(&format!("{{{key}}}")) || route_path.contains(&format!("{{*{key}}}")) {
            return Err(syn::Error::new(
                ident.span(),
                format!(
                    "`{key}` is a path parameter of the route; a #[from] field takes its value from its source alone"
                ),
            ));
        }
        bound.push(Bound {
            ident: ident.clone(),
            ty: field.ty.clone(),
            key,
            kind,
            name,
        });
    }
    Ok(bound)
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
    let own_schema = json_schema_impl(input)?;
    let schema = reply_schema(input, status, own_schema.is_some())?;
    Ok(quote! {
        #own_schema

        impl #impl_generics ::switchyard_manager::Reply for #ident #ty_generics #where_clause {
            #schema

            fn into_response(self, format: ::switchyard_manager::Format) -> ::core::result::Result<::switchyard_manager::Response, ::switchyard_manager::Error> {
                ::switchyard_manager::Response::encode(#status, &self, format)
            }
        }
    })
}

// ---- JSON Schemas (the API description, decision 0060) ----

/// A type's doc comment, lines joined.
fn doc_of(attrs: &[syn::Attribute]) -> String {
    let mut lines = Vec::new();
    for attr in attrs.iter().filter(|a| a.path().is_ident("doc")) {
        if let syn::Meta::NameValue(nv) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
        {
            let line = s.value();
            lines.push(line.strip_prefix(' ').unwrap_or(&line).trim_end().to_owned());
        }
    }
    lines.join("\n").trim().to_owned()
}

/// What serde does with a struct as a whole, for one direction.
struct SerdeContainer {
    rename_all: Option<String>,
    default: bool,
}

fn serde_container(input: &DeriveInput, serialize: bool) -> syn::Result<SerdeContainer> {
    let mut container = SerdeContainer {
        rename_all: None,
        default: false,
    };
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("rename_all") {
                container.rename_all = directional_name(&meta, serialize)?;
                Ok(())
            } else if meta.path.is_ident("default") {
                container.default = true;
                skip_value(&meta)
            } else {
                skip_value(&meta)
            }
        })?;
    }
    Ok(container)
}

/// A serde `rename`-like item's name for one direction.
fn directional_name(meta: &syn::meta::ParseNestedMeta<'_>, serialize: bool) -> syn::Result<Option<String>> {
    if meta.input.peek(syn::Token![=]) {
        return Ok(Some(meta.value()?.parse::<LitStr>()?.value()));
    }
    let mut name = None;
    meta.parse_nested_meta(|inner| {
        let value = inner.value()?.parse::<LitStr>()?.value();
        if inner
            .path
            .is_ident(if serialize { "serialize" } else { "deserialize" })
        {
            name = Some(value);
        }
        Ok(())
    })?;
    Ok(name)
}

/// What serde does with one field, for one direction.
struct SerdeField {
    key: String,
    skip: bool,
    flatten: bool,
    optional: bool,
}

fn serde_field(field: &syn::Field, container: &SerdeContainer, serialize: bool) -> syn::Result<SerdeField> {
    let plain = field
        .ident
        .as_ref()
        .map(|i| i.to_string().trim_start_matches("r#").to_owned())
        .unwrap_or_default();
    let mut info = SerdeField {
        key: container
            .rename_all
            .as_deref()
            .and_then(|rule| rename(rule, &plain))
            .unwrap_or_else(|| plain.clone()),
        skip: false,
        flatten: false,
        optional: container.default || is_option(&field.ty),
    };
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("serde")) {
        attr.parse_nested_meta(|meta| {
            let path = &meta.path;
            if path.is_ident("rename") {
                if let Some(name) = directional_name(&meta, serialize)? {
                    info.key = name;
                }
                return Ok(());
            }
            if path.is_ident("skip")
                || (serialize && path.is_ident("skip_serializing"))
                || (!serialize && path.is_ident("skip_deserializing"))
            {
                info.skip = true;
            } else if path.is_ident("flatten") {
                info.flatten = true;
            } else if (!serialize && path.is_ident("default"))
                || (serialize && path.is_ident("skip_serializing_if"))
            {
                info.optional = true;
            }
            skip_value(&meta)
        })?;
    }
    Ok(info)
}

fn is_option(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(p) if p.qself.is_none()
        && p.path.segments.last().is_some_and(|s| s.ident == "Option"))
}

/// A field type's schema: its `JsonSchema` if it has one, else any value.
fn field_schema(ty: &syn::Type) -> Tokens {
    quote! {{
        #[allow(unused_imports)]
        use ::switchyard_manager::schema::{ViaAny as _, ViaJsonSchema as _};
        #[allow(clippy::needless_borrow)]
        let schema = (&&::switchyard_manager::schema::Probe::<#ty>::new()).schema_of(generator);
        schema
    }}
}

/// `#[validate(...)]` of a field as schema rules.
fn schema_rules(field: &syn::Field) -> syn::Result<Vec<Tokens>> {
    let mut rules = Vec::new();
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("validate")) {
        attr.parse_nested_meta(|meta| {
            let none = quote!(::core::option::Option::None);
            if meta.path.is_ident("length") || meta.path.is_ident("range") {
                let (mut min, mut max) = (none.clone(), none.clone());
                meta.parse_nested_meta(|bound| {
                    let value: syn::Expr = bound.value()?.parse()?;
                    let value = quote!(::switchyard_manager::schema::bound(#value));
                    if bound.path.is_ident("min") {
                        min = value;
                    } else if bound.path.is_ident("max") {
                        max = value;
                    }
                    Ok(())
                })?;
                let kind = if meta.path.is_ident("length") {
                    quote!(Length)
                } else {
                    quote!(Range)
                };
                rules.push(quote!(::switchyard_manager::schema::Rule::#kind(#min, #max)));
            } else if meta.path.is_ident("non_empty") {
                rules.push(quote!(::switchyard_manager::schema::Rule::Length(
                    ::switchyard_manager::schema::bound(1), #none
                )));
            } else {
                // `custom = "fn"`: not expressible as a schema keyword.
                skip_value(&meta)?;
            }
            Ok(())
        })?;
    }
    Ok(rules)
}

/// The statements that fill `object` (a `schema::Object`) with the fields
/// of a named struct; fields bound with `#[from]` become `params` instead.
fn object_fields(input: &DeriveInput, serialize: bool) -> syn::Result<Option<Vec<Tokens>>> {
    let Data::Struct(data) = &input.data else {
        return Ok(None);
    };
    let Fields::Named(fields) = &data.fields else {
        return Ok(None);
    };
    let container = serde_container(input, serialize)?;
    let mut statements = Vec::new();
    for field in &fields.named {
        let info = serde_field(field, &container, serialize)?;
        if info.skip {
            continue;
        }
        if info.flatten {
            statements.push(quote!(object.open();));
            continue;
        }
        if !serialize && field.attrs.iter().any(|a| a.path().is_ident("from")) {
            let mut param = None;
            for attr in field.attrs.iter().filter(|a| a.path().is_ident("from")) {
                attr.parse_nested_meta(|meta| {
                    let location = if meta.path.is_ident("header") {
                        Some("header")
                    } else if meta.path.is_ident("cookie") {
                        Some("cookie")
                    } else {
                        None
                    };
                    if !meta.input.peek(syn::Token![=]) {
                        return Ok(());
                    }
                    let name = meta.value()?.parse::<LitStr>()?.value();
                    if let Some(location) = location {
                        let name = if location == "header" {
                            name.to_ascii_lowercase()
                        } else {
                            name
                        };
                        param = Some((location, name));
                    }
                    Ok(())
                })?;
            }
            if let Some((location, name)) = param {
                let required = !is_option(&field.ty);
                statements.push(quote! {
                    params.push(::switchyard_manager::schema::BoundParam {
                        location: #location.to_owned(),
                        name: #name.to_owned(),
                        required: #required,
                    });
                });
            }
            continue;
        }
        let key = info.key;
        let doc = doc_of(&field.attrs);
        let schema = field_schema(&field.ty);
        let required = !info.optional;
        let rules = if serialize {
            Vec::new()
        } else {
            schema_rules(field)?
        };
        statements.push(quote! {
            object.field(#key, #doc, #schema, #required, &[#(#rules),*]);
        });
    }
    Ok(Some(statements))
}

/// `Event::schema` for the derive.
fn event_schema(input: &DeriveInput, whole_body: bool) -> syn::Result<Tokens> {
    let doc = doc_of(&input.attrs);
    let body = match object_fields(input, false)? {
        Some(statements) => quote! {
            let mut object = ::switchyard_manager::schema::Object::new(#doc);
            let mut params: ::std::vec::Vec<::switchyard_manager::schema::BoundParam> = ::std::vec::Vec::new();
            #(#statements)*
            (object.into_schema(), params)
        },
        None => {
            let schema = field_schema(&syn::parse_quote!(Self));
            quote!((#schema, ::std::vec::Vec::new()))
        }
    };
    Ok(quote! {
        fn schema(generator: &mut ::switchyard_manager::schema::SchemaGenerator) -> ::switchyard_manager::schema::EventSchema {
            let (schema, params) = { #body };
            ::switchyard_manager::schema::EventSchema {
                description: #doc.to_owned(),
                schema,
                whole_body: #whole_body,
                params,
            }
        }
    })
}

/// A `#[derive(Reply)]` struct with named fields and no generics is its
/// own `JsonSchema` too, so that a reply nested in another (`Vec<Ticket>`,
/// `Created<Ticket>`'s body inside a list) is described by its fields and
/// not as any value: the typed gRPC service then carries its integers as
/// integers. Other shapes (and generic structs, whose parameters would
/// need bounds of their own) derive `JsonSchema` themselves if they nest.
fn json_schema_impl(input: &DeriveInput) -> syn::Result<Option<Tokens>> {
    if !input.generics.params.is_empty() {
        return Ok(None);
    }
    let Some(statements) = object_fields(input, true)? else {
        return Ok(None);
    };
    let ident = &input.ident;
    let name = ident.to_string();
    let doc = doc_of(&input.attrs);
    Ok(Some(quote! {
        impl ::switchyard_manager::schemars::JsonSchema for #ident {
            fn schema_name() -> ::std::borrow::Cow<'static, str> {
                ::std::borrow::Cow::Borrowed(#name)
            }

            fn schema_id() -> ::std::borrow::Cow<'static, str> {
                ::std::borrow::Cow::Borrowed(::core::concat!(::core::module_path!(), "::", #name))
            }

            fn json_schema(generator: &mut ::switchyard_manager::schema::SchemaGenerator) -> ::switchyard_manager::schema::Schema {
                let mut object = ::switchyard_manager::schema::Object::new(#doc);
                #(#statements)*
                object.into_schema()
            }
        }
    }))
}

/// `Reply::describe` for the derive.
fn reply_schema(input: &DeriveInput, status: u16, own_schema: bool) -> syn::Result<Tokens> {
    let doc = doc_of(&input.attrs);
    let body = match object_fields(input, true)? {
        // Inline, not a `$ref` to itself: the reply's top-level schema.
        Some(_) if own_schema => quote! {
            <Self as ::switchyard_manager::schemars::JsonSchema>::json_schema(generator)
        },
        Some(statements) => quote! {
            let mut object = ::switchyard_manager::schema::Object::new(#doc);
            #(#statements)*
            object.into_schema()
        },
        None => field_schema(&syn::parse_quote!(Self)),
    };
    Ok(quote! {
        fn describe(generator: &mut ::switchyard_manager::schema::SchemaGenerator) -> ::core::option::Option<::switchyard_manager::schema::ReplyDoc> {
            let schema = { #body };
            let schema = ::switchyard_manager::schema::standalone(schema, generator);
            ::core::option::Option::Some(::switchyard_manager::schema::reply(#status, #doc, ::core::option::Option::Some(schema)))
        }
    })
}
