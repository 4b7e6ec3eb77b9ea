//! Typed gRPC from the catalog: one `.proto` file per event-name package
//! (`demo.Hello` → package `demo.v1`), one service per manager with one
//! rpc per request type, a message per event and per reply, and a
//! `Notifications` service whose rpcs stream each notification type.
//! The files are compiled (protox) into the descriptors the listener
//! transcodes with and serves by reflection (decision 0064).
//!
//! Field numbers come from a hash of the field's name, so adding,
//! removing or reordering fields never renumbers the others: a client
//! built before a field was added keeps working (decision 0064).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use serde_json::{Map, Value};
use switchyard_proto::api::{Catalog, TypeDoc, TypeRole};

/// One generated `.proto` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtoFile {
    /// Its path, from its package (`demo/v1/api.proto`).
    pub path: String,
    pub package: String,
    pub text: String,
}

/// What an rpc is, for the listener.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Method {
    /// `/demo.v1.Basics/Hello`.
    pub path: String,
    /// The event type (`demo.Hello`).
    pub event: String,
    /// Full names of the request and reply messages.
    pub input: String,
    pub output: String,
    /// A notification stream (the request is a filter).
    pub stream: bool,
}

const WKT_VALUE: &str = "google.protobuf.Value";
const WKT_EMPTY: &str = "google.protobuf.Empty";
/// The reply of a route that may answer something other than JSON.
pub const HTTP_BODY: &str = "google.api.HttpBody";

/// `google/api/httpbody.proto` as Google publishes it (googleapis): the
/// standard message for a body of any content type, which gRPC-to-HTTP
/// gateways and their clients already know.
const HTTP_BODY_PROTO: &str = r#"// Copyright 2025 Google LLC
//
// Licensed under the Apache License, Version 2.0 (the "License");
// you may not use this file except in compliance with the License.
// You may obtain a copy of the License at
//
//     http://www.apache.org/licenses/LICENSE-2.0
//
// Unless required by applicable law or agreed to in writing, software
// distributed under the License is distributed on an "AS IS" BASIS,
// WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
// See the License for the specific language governing permissions and
// limitations under the License.

syntax = "proto3";

package google.api;

import "google/protobuf/any.proto";

option cc_enable_arenas = true;
option go_package = "google.golang.org/genproto/googleapis/api/httpbody;httpbody";
option java_multiple_files = true;
option java_outer_classname = "HttpBodyProto";
option java_package = "com.google.api";
option objc_class_prefix = "GAPI";

// Message that represents an arbitrary HTTP body. It should only be used for
// payload formats that can't be represented as JSON, such as raw binary or
// an HTML page.
message HttpBody {
  // The HTTP Content-Type header value specifying the content type of the body.
  string content_type = 1;

  // The HTTP request/response body as raw binary.
  bytes data = 2;

  // Application specific response metadata. Must be set in the first response
  // for streaming APIs.
  repeated google.protobuf.Any extensions = 3;
}
"#;

/// The proto3 scalar types the generator uses: a field of one of these
/// has no presence unless it is declared `optional`.
const SCALARS: [&str; 7] = ["string", "bool", "double", "int32", "uint32", "int64", "uint64"];

/// The field numbers of a message's fields: `1 + hash(name) mod 262 143`
/// (tags of at most three bytes), skipping 19000–19999 (reserved by
/// protobuf); a collision takes the next free number, fields taken in
/// name order.
pub fn field_numbers<'a>(names: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, u32> {
    const SPAN: u32 = (1 << 18) - 1;
    let mut sorted: Vec<&str> = names.into_iter().collect();
    sorted.sort_unstable();
    sorted.dedup();
    let mut used = BTreeSet::new();
    let mut out = BTreeMap::new();
    for name in sorted {
        // FNV-1a, 32 bits: stable across builds and platforms.
        let hash = name.bytes().fold(0x811c_9dc5_u32, |h, b| {
            (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
        });
        let mut n = 1 + hash % SPAN;
        while used.contains(&n) || (19000..=19999).contains(&n) {
            n = n % SPAN + 1;
        }
        used.insert(n);
        out.insert(name.to_owned(), n);
    }
    out
}

/// A protobuf identifier made of `text`.
fn ident(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if out.is_empty() || out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// `my-shop` → `MyShop`.
fn pascal(text: &str) -> String {
    let joined: String = text
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect();
    if joined.is_empty() {
        "Manager".to_owned()
    } else {
        ident(&joined)
    }
}

/// `demo.Hello` → (`demo.v1`, `Hello`); a name without a dot goes to
/// `events.v1`.
fn split(event: &str) -> (String, String) {
    match event.rsplit_once('.') {
        Some((prefix, last)) => {
            let package = prefix.split('.').map(ident).collect::<Vec<_>>().join(".");
            (format!("{package}.v1"), ident(last))
        }
        None => ("events.v1".to_owned(), ident(event)),
    }
}

/// The messages of one package, as text, by name.
#[derive(Default)]
struct Package {
    messages: BTreeMap<String, String>,
    /// service → rpc lines.
    services: BTreeMap<String, Vec<String>>,
    wkt: bool,
    /// Whether it uses `google.api.HttpBody`.
    http_body: bool,
}

/// A schema's definitions (`$defs`), to resolve `$ref`s.
type Defs = Map<String, Value>;

impl Package {
    /// Declares message `name` for object `schema` (or leaves it to a
    /// well-known type); returns the type to use.
    fn message(&mut self, name: &str, schema: &Value, defs: &Defs) -> String {
        let Some(props) = schema.get("properties").and_then(Value::as_object) else {
            self.wkt = true;
            return WKT_VALUE.to_owned();
        };
        if self.messages.contains_key(name) {
            return name.to_owned();
        }
        // Reserve the name first: a type may refer to itself.
        self.messages.insert(name.to_owned(), String::new());
        let numbers = field_numbers(props.keys().map(String::as_str));
        let required: BTreeSet<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut body = String::new();
        if let Some(d) = schema.get("description").and_then(Value::as_str) {
            comment(&mut body, "", d);
        }
        let _ = writeln!(body, "message {name} {{");
        for (field, prop) in props {
            let (mut label, ty) = self.field_type(prop, defs);
            // A field the type may leave out (`#[serde(default)]`, an
            // `Option`) keeps its presence, so one the client leaves out
            // is left out of the event's JSON too and gets its serde
            // default, as over HTTP, instead of the protobuf zero.
            if label.is_empty() && !required.contains(field.as_str()) && SCALARS.contains(&ty.as_str()) {
                label = "optional ";
            }
            if let Some(d) = prop.get("description").and_then(Value::as_str) {
                comment(&mut body, "  ", d);
            }
            let json = field.replace('\\', "\\\\").replace('"', "\\\"");
            let _ = writeln!(
                body,
                "  {label}{ty} {} = {} [json_name = \"{json}\"];",
                ident(field),
                numbers[field]
            );
        }
        body.push_str("}\n");
        self.messages.insert(name.to_owned(), body);
        name.to_owned()
    }

    /// (`optional ` / `repeated ` / ``, type) of a field's schema.
    fn field_type(&mut self, schema: &Value, defs: &Defs) -> (&'static str, String) {
        // `Option<T>`: `type: [T, "null"]`, or `anyOf: [T, {type: null}]`.
        if let Some(Value::Array(types)) = schema.get("type") {
            let real: Vec<&Value> = types.iter().filter(|t| *t != "null").collect();
            if real.len() == 1 {
                let mut single = schema.clone();
                single["type"] = real[0].clone();
                let (label, ty) = self.field_type(&single, defs);
                return (if label.is_empty() { "optional " } else { label }, ty);
            }
            self.wkt = true;
            return ("", WKT_VALUE.to_owned());
        }
        if let Some(Value::Array(options)) = schema.get("anyOf").or_else(|| schema.get("oneOf")) {
            let real: Vec<&Value> = options
                .iter()
                .filter(|o| o.get("type") != Some(&"null".into()))
                .collect();
            if real.len() == 1 && real.len() < options.len() {
                let (label, ty) = self.field_type(real[0], defs);
                return (if label.is_empty() { "optional " } else { label }, ty);
            }
        }
        if let Some(name) = schema
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.strip_prefix("#/$defs/"))
        {
            return match defs.get(name) {
                Some(def) => {
                    let def = def.clone();
                    ("", self.message(&ident(name), &def, defs))
                }
                None => {
                    self.wkt = true;
                    ("", WKT_VALUE.to_owned())
                }
            };
        }
        let scalar = match schema.get("type").and_then(Value::as_str) {
            Some("string") => "string",
            Some("boolean") => "bool",
            Some("number") => "double",
            Some("integer") => match schema.get("format").and_then(Value::as_str) {
                Some("uint8" | "uint16" | "uint32") => "uint32",
                Some("int8" | "int16" | "int32") => "int32",
                Some("uint64" | "uint" | "uint128") => "uint64",
                _ => "int64",
            },
            Some("array") => {
                let items = schema.get("items").cloned().unwrap_or(Value::Bool(true));
                let (label, ty) = self.field_type(&items, defs);
                if label.is_empty() {
                    return ("repeated ", ty);
                }
                // A list of optional values or of lists: JSON values.
                self.wkt = true;
                return ("repeated ", WKT_VALUE.to_owned());
            }
            _ => {
                self.wkt = true;
                return ("", WKT_VALUE.to_owned());
            }
        };
        ("", scalar.to_owned())
    }
}

fn comment(out: &mut String, indent: &str, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "{indent}// {line}");
    }
}

fn parse(schema: &str) -> Value {
    serde_json::from_str(schema).unwrap_or(Value::Bool(true))
}

/// A message type as a method names it: the well-known `google.*` types
/// as they are, the rest in `package`.
fn qualified(package: &str, ty: &str) -> String {
    if ty.starts_with("google.") {
        ty.to_owned()
    } else {
        format!("{package}.{ty}")
    }
}

/// The `.proto` files of `catalog`, and the rpcs they declare.
pub fn files(catalog: &Catalog) -> (Vec<ProtoFile>, Vec<Method>) {
    let mut packages: BTreeMap<String, Package> = BTreeMap::new();
    let mut methods = Vec::new();
    let mut event_names = BTreeSet::new();
    for m in &catalog.managers {
        for t in &m.types {
            event_names.insert(split(&t.name));
        }
    }
    let mut notifications: BTreeMap<String, &TypeDoc> = BTreeMap::new();
    for m in &catalog.managers {
        for t in &m.types {
            if t.role == TypeRole::Notification {
                notifications.entry(t.name.clone()).or_insert(t);
                continue;
            }
            // A streamed body (raw or a form) is HTTP's alone.
            if matches!(t.role, TypeRole::Upload | TypeRole::Form) {
                continue;
            }
            let (package, name) = split(&t.name);
            let p = packages.entry(package.clone()).or_default();
            let schema = parse(&t.schema);
            let defs = schema
                .get("$defs")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            let input = if t.whole_body {
                p.wkt = true;
                WKT_VALUE.to_owned()
            } else {
                p.message(&name, &schema, &defs)
            };
            let output = match &t.reply {
                Some(r) if r.status == 204 => {
                    p.wkt = true;
                    WKT_EMPTY.to_owned()
                }
                // Bytes, text, a stream, or a reply whose type does not
                // say what it is: only a body of any content type is
                // sure to fit what the route answers.
                Some(r) if !is_json(&r.content_type) => {
                    p.http_body = true;
                    HTTP_BODY.to_owned()
                }
                None => {
                    p.http_body = true;
                    HTTP_BODY.to_owned()
                }
                Some(r) if !r.schema.is_empty() => {
                    let schema = parse(&r.schema);
                    let defs = schema
                        .get("$defs")
                        .and_then(Value::as_object)
                        .cloned()
                        .unwrap_or_default();
                    let mut reply = format!("{name}Reply");
                    while event_names.contains(&(package.clone(), reply.clone())) {
                        reply.push('_');
                    }
                    p.message(&reply, &schema, &defs)
                }
                Some(_) => {
                    p.wkt = true;
                    WKT_VALUE.to_owned()
                }
            };
            let service = pascal(&m.name);
            let mut line = String::new();
            if !t.description.is_empty() {
                comment(&mut line, "  ", &t.description);
            }
            let _ = write!(line, "  rpc {name}({input}) returns ({output});");
            p.services.entry(service.clone()).or_default().push(line);
            methods.push(Method {
                path: format!("/{package}.{service}/{name}"),
                event: t.name.clone(),
                input: qualified(&package, &input),
                output: qualified(&package, &output),
                stream: false,
            });
        }
    }
    for (event, t) in notifications {
        let (package, name) = split(&event);
        let p = packages.entry(package.clone()).or_default();
        let schema = parse(&t.schema);
        let defs = schema
            .get("$defs")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default();
        let output = p.message(&name, &schema, &defs);
        p.messages.entry("Filter".to_owned()).or_insert_with(|| {
            "// Which notifications to receive: `filter_json` as on `/ws`\n\
             // (`{\"customer_id\": 42}`, `{\"qty\": {\"gt\": 2}}`); empty: all.\n\
             message Filter {\n  string filter_json = 1;\n}\n"
                .to_owned()
        });
        let mut line = String::new();
        if !t.description.is_empty() {
            comment(&mut line, "  ", &t.description);
        }
        let _ = write!(line, "  rpc {name}(Filter) returns (stream {output});");
        p.services
            .entry("Notifications".to_owned())
            .or_default()
            .push(line);
        methods.push(Method {
            path: format!("/{package}.Notifications/{name}"),
            event,
            input: format!("{package}.Filter"),
            output: qualified(&package, &output),
            stream: true,
        });
    }
    // A service may not share its name with a message of its package.
    for (package, p) in &mut packages {
        let clashing: Vec<String> = p
            .services
            .keys()
            .filter(|s| p.messages.contains_key(*s))
            .cloned()
            .collect();
        for service in clashing {
            let rpcs = p.services.remove(&service).unwrap_or_default();
            let renamed = format!("{service}Service");
            let (old, new) = (format!("/{package}.{service}/"), format!("/{package}.{renamed}/"));
            for m in methods.iter_mut().filter(|m| m.path.starts_with(&old)) {
                m.path = m.path.replacen(&old, &new, 1);
            }
            p.services.insert(renamed, rpcs);
        }
    }
    let http_body = packages.values().any(|p| p.http_body);
    let mut files: Vec<ProtoFile> = packages
        .into_iter()
        .map(|(package, p)| {
            let path = format!("{}/api.proto", package.replace('.', "/"));
            let mut text = String::from(
                "// Generated by Switchyard from the group's event types (docs/grpc.md).\n\
                 // Field numbers are a hash of each field's name: adding a field never\n\
                 // renumbers the others.\nsyntax = \"proto3\";\n\n",
            );
            let _ = writeln!(text, "package {package};\n");
            if p.http_body {
                text.push_str("import \"google/api/httpbody.proto\";\n");
            }
            if p.wkt {
                text.push_str(
                    "import \"google/protobuf/empty.proto\";\nimport \"google/protobuf/struct.proto\";\n",
                );
            }
            if p.http_body || p.wkt {
                text.push('\n');
            }
            for (service, rpcs) in &p.services {
                let _ = writeln!(text, "service {service} {{\n{}\n}}\n", rpcs.join("\n"));
            }
            for body in p.messages.values() {
                text.push_str(body);
                text.push('\n');
            }
            ProtoFile { path, package, text }
        })
        .collect();
    if http_body {
        files.push(ProtoFile {
            path: "google/api/httpbody.proto".to_owned(),
            package: "google.api".to_owned(),
            text: HTTP_BODY_PROTO.to_owned(),
        });
    }
    (files, methods)
}

/// Whether a reply's content type is JSON (`application/json`,
/// `application/problem+json`, `…; charset=utf-8`).
fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("application/json") || essence.to_ascii_lowercase().ends_with("+json")
}

/// Compiles generated files into a descriptor pool and its encoded
/// `FileDescriptorSet` (for reflection), imports included.
pub fn compile(files: &[ProtoFile]) -> Result<(prost_reflect::DescriptorPool, Vec<u8>), String> {
    struct Memory(Vec<ProtoFile>);
    impl protox::file::FileResolver for Memory {
        fn resolve_path(&self, path: &std::path::Path) -> Option<String> {
            path.to_str().map(str::to_owned)
        }
        fn open_file(&self, name: &str) -> Result<protox::file::File, protox::Error> {
            match self.0.iter().find(|f| f.path == name) {
                Some(f) => protox::file::File::from_source(name, &f.text),
                None => Err(protox::Error::file_not_found(name)),
            }
        }
    }
    let mut chain = protox::file::ChainFileResolver::new();
    chain.add(Memory(files.to_vec()));
    chain.add(protox::file::GoogleFileResolver::new());
    let mut compiler = protox::Compiler::with_file_resolver(chain);
    compiler.include_imports(true);
    for f in files {
        compiler
            .open_file(&f.path)
            .map_err(|e| format!("{}: {e}", f.path))?;
    }
    Ok((compiler.descriptor_pool(), compiler.encode_file_descriptor_set()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_a_field_keeps_the_others_numbers() {
        let before = field_numbers(["name", "qty", "sku"]);
        let after = field_numbers(["name", "qty", "sku", "gift", "note", "a"]);
        for (field, n) in &before {
            assert_eq!(after[field], *n, "{field}");
        }
        let all: BTreeSet<u32> = after.values().copied().collect();
        assert_eq!(all.len(), after.len());
        assert!(
            all.iter()
                .all(|n| (1..1 << 18).contains(n) && !(19000..=19999).contains(n))
        );
    }

    #[test]
    fn names() {
        assert_eq!(split("demo.Hello"), ("demo.v1".to_owned(), "Hello".to_owned()));
        assert_eq!(split("a.b.c-d"), ("a.b.v1".to_owned(), "c_d".to_owned()));
        assert_eq!(split("Solo"), ("events.v1".to_owned(), "Solo".to_owned()));
        assert_eq!(pascal("my-shop"), "MyShop");
        assert_eq!(pascal("basics"), "Basics");
    }
}

#[cfg(test)]
mod catalog_tests {
    use super::*;
    use switchyard_proto::api::{ManagerDoc, ReplyDoc};

    fn doc(name: &str, schema: &str) -> TypeDoc {
        TypeDoc {
            name: name.to_owned(),
            role: TypeRole::Request,
            description: String::new(),
            schema: schema.to_owned(),
            whole_body: false,
            params: Vec::new(),
            reply: Some(ReplyDoc {
                status: 200,
                content_type: "application/json".to_owned(),
                description: String::new(),
                schema: r#"{"type":"object","properties":{"ok":{"type":"boolean"}}}"#.to_owned(),
            }),
        }
    }

    #[test]
    fn a_service_named_like_a_message_is_renamed_and_everything_compiles() {
        let catalog = Catalog {
            managers: vec![ManagerDoc {
                name: "payload".to_owned(),
                kind: "payload".to_owned(),
                handles: Vec::new(),
                types: vec![doc(
                    "demo.Payload",
                    r##"{"type":"object","properties":{"size":{"type":"integer","format":"uint64"},
                        "note":{"type":["string","null"]},"tags":{"type":"array","items":{"type":"string"}},
                        "line":{"$ref":"#/$defs/Line"}},
                        "$defs":{"Line":{"type":"object","properties":{"sku":{"type":"string"}}}}}"##,
                )],
            }],
        };
        let (files, methods) = files(&catalog);
        assert_eq!(methods[0].path, "/demo.v1.PayloadService/Payload");
        let (pool, _) = compile(&files).unwrap_or_else(|e| panic!("{e}\n{}", files[0].text));
        let message = pool.get_message_by_name("demo.v1.Payload").unwrap();
        let field = |n: &str| message.get_field_by_name(n).unwrap();
        assert_eq!(field("size").kind(), prost_reflect::Kind::Uint64);
        assert!(field("note").supports_presence());
        assert!(field("tags").is_list());
        assert_eq!(
            field("line").kind().as_message().unwrap().full_name(),
            "demo.v1.Line"
        );
    }

    #[test]
    fn defaulted_fields_have_presence_and_unjson_replies_are_http_bodies() {
        let mut incr = doc(
            "demo.KvIncr",
            r#"{"type":"object","required":["key"],"properties":{"key":{"type":"string"},
                "by":{"type":"integer","format":"int64"},"tags":{"type":"array","items":{"type":"string"}}}}"#,
        );
        incr.reply = None;
        let mut bytes = doc("demo.Bytes", r#"{"type":"object","properties":{}}"#);
        if let Some(r) = &mut bytes.reply {
            r.content_type = "application/octet-stream".to_owned();
            r.schema = String::new();
        }
        let catalog = Catalog {
            managers: vec![ManagerDoc {
                name: "basics".to_owned(),
                kind: "basics".to_owned(),
                handles: Vec::new(),
                types: vec![
                    incr,
                    bytes,
                    doc("demo.Json", r#"{"type":"object","properties":{}}"#),
                ],
            }],
        };
        let (files, methods) = files(&catalog);
        let (pool, _) = compile(&files).unwrap_or_else(|e| panic!("{e}\n{}", files[0].text));
        let message = pool.get_message_by_name("demo.v1.KvIncr").unwrap();
        let field = |n: &str| message.get_field_by_name(n).unwrap();
        assert!(field("by").supports_presence());
        assert!(!field("key").supports_presence());
        assert!(field("tags").is_list());
        let output = |event: &str| &methods.iter().find(|m| m.event == event).unwrap().output;
        assert_eq!(output("demo.KvIncr"), HTTP_BODY);
        assert_eq!(output("demo.Bytes"), HTTP_BODY);
        assert_eq!(output("demo.Json"), "demo.v1.JsonReply");
        assert!(pool.get_message_by_name(HTTP_BODY).is_some());
    }
}
