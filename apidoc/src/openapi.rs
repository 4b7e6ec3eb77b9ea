//! The OpenAPI 3.1 document of a group, from its [`Catalog`].

use serde_json::{Map, Value, json};
use switchyard_proto::api::{Catalog, TypeDoc, TypeRole};
use switchyard_proto::problem::reason;

use crate::ApiConfig;
use switchyard_middleware::config::{AuthConfig, Require};

/// Names of the security schemes, by credential.
const BEARER: &str = "bearer";
const API_KEY: &str = "apiKey";
const BASIC: &str = "basic";

/// The OpenAPI 3.1 document describing every HTTP route of `catalog`,
/// with the authentication `auth`'s rules require of each.
pub fn document(catalog: &Catalog, settings: &ApiConfig, auth: &AuthConfig) -> Value {
    let mut schemas = Map::new();
    schemas.insert("Problem".to_owned(), problem_schema());
    let mut paths: Map<String, Value> = Map::new();
    let schemes = security_schemes(auth);
    let mut tags = Vec::new();
    for manager in &catalog.managers {
        let mut tagged = false;
        for handled in &manager.handles {
            let Some(route) = &handled.route else { continue };
            let doc = manager
                .types
                .iter()
                .find(|t| t.name == handled.name && t.role != TypeRole::Notification);
            let (path, path_params) = template(&route.path);
            let security = required_auth(auth, &route.path, Some(&handled.name), &schemes);
            let operation = operation(
                &Route {
                    manager: &manager.name,
                    name: &handled.name,
                    method: &route.method,
                    path_params: &path_params,
                    stream_body: route.stream_body,
                },
                doc,
                security,
                &mut schemas,
            );
            let item = paths.entry(path).or_insert_with(|| json!({}));
            item[route.method.to_ascii_lowercase()] = operation;
            tagged = true;
        }
        if tagged {
            tags.push(json!({ "name": manager.name, "description": format!("Manager `{}` ({})", manager.name, manager.kind) }));
        }
    }
    tags.push(json!({ "name": "switchyard", "description": "The listener's own routes." }));
    builtin_routes(&mut paths, settings, auth, &schemes);
    let mut components = json!({ "schemas": schemas, "responses": standard_responses() });
    if !schemes.is_empty() {
        components["securitySchemes"] = Value::Object(schemes.into_iter().collect());
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": settings.title,
            "version": settings.version,
            "description": "Every HTTP route of the group, described from its event types (docs/api.md).",
        },
        "jsonSchemaDialect": "https://json-schema.org/draft/2020-12/schema",
        "tags": tags,
        "paths": paths,
        "components": components,
    })
}

/// The listener's own routes, which shadow a manager's on the same path
/// (marked `x-switchyard-builtin`, which `switchyard bench` leaves out):
/// `/health` and `/ready` (never behind authentication), and the
/// description endpoints that are on (behind the rules that cover them).
fn builtin_routes(
    paths: &mut Map<String, Value>,
    settings: &ApiConfig,
    auth: &AuthConfig,
    schemes: &[(String, Value)],
) {
    let tag = "switchyard";
    let health = json!({
        "operationId": "switchyard.health",
        "x-switchyard-builtin": true,
        "summary": "Liveness: the listener answers.",
        "tags": [tag],
        "responses": {
            "200": {
                "description": "The listener is alive.",
                "content": { "application/json": { "schema": {
                    "type": "object",
                    "properties": { "status": { "const": "alive" } },
                    "required": ["status"],
                } } },
            },
            "default": { "$ref": "#/components/responses/OtherError" },
        },
    });
    let readiness = json!({
        "type": "object",
        "properties": {
            "ready": { "type": "boolean", "description": "Every configured manager has an instance up and the router is connected." },
            "router": { "type": "boolean", "description": "The listener is connected to the router." },
            "managers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": { "type": "string" },
                        "instances_up": { "type": "integer", "minimum": 0 },
                    },
                    "required": ["name", "instances_up"],
                },
            },
            "cluster": { "description": "The link to the other groups, when the group has one (shown, not required)." },
        },
        "required": ["ready", "router", "managers"],
    });
    let ready = json!({
        "operationId": "switchyard.ready",
        "x-switchyard-builtin": true,
        "summary": "Readiness: every manager has an instance up.",
        "tags": [tag],
        "responses": {
            "200": { "description": "Ready.", "content": { "application/json": { "schema": readiness } } },
            "503": { "description": "Not ready (yet): a manager or the router is down.", "content": { "application/json": { "schema": readiness } } },
            "default": { "$ref": "#/components/responses/OtherError" },
        },
    });
    paths.insert("/health".to_owned(), json!({ "get": health }));
    paths.insert("/ready".to_owned(), json!({ "get": ready }));
    let endpoints = [
        (
            settings.openapi,
            "/openapi.json",
            "switchyard.openapi",
            "This document (OpenAPI 3.1).",
            "application/json",
            json!({ "type": "object" }),
        ),
        (
            settings.docs,
            "/docs",
            "switchyard.docs",
            "The routes, events and notification types, as an HTML page.",
            "text/html",
            json!({ "type": "string" }),
        ),
    ];
    for (on, path, id, summary, media, schema) in endpoints {
        if !on {
            continue;
        }
        let security = required_auth(auth, path, None, schemes);
        let mut responses = json!({
            "200": { "description": summary, "content": { media: { "schema": schema } } },
            "default": { "$ref": "#/components/responses/OtherError" },
        });
        if security.is_some() {
            for code in ["401", "403"] {
                responses[code] =
                    json!({ "$ref": format!("#/components/responses/{}", response_name(code)) });
            }
        }
        let mut op = json!({
            "operationId": id,
            "summary": summary,
            "tags": [tag],
            "x-switchyard-builtin": true,
            "responses": responses,
        });
        if let Some(security) = security {
            op["security"] = security;
        }
        paths.insert(path.to_owned(), json!({ "get": op }));
    }
}

/// `/files/{*rest}` → (`/files/{rest}`, [`rest`]).
fn template(path: &str) -> (String, Vec<String>) {
    let mut names = Vec::new();
    let mut out = String::new();
    let mut rest = path;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        let name = rest[open + 1..open + close].trim_start_matches('*');
        out.push_str(&rest[..open]);
        out.push('{');
        out.push_str(name);
        out.push('}');
        names.push(name.to_owned());
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    (out, names)
}

/// A manager's route, as the route table has it.
struct Route<'a> {
    manager: &'a str,
    name: &'a str,
    method: &'a str,
    path_params: &'a [String],
    /// The listener streams the body to the handler: an upload (raw
    /// bytes) or a multipart form.
    stream_body: bool,
}

/// How a route takes its request body.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Body {
    /// None: `GET`, `HEAD`, `DELETE`, `OPTIONS`; the fields are query parameters.
    Query,
    /// A JSON object of the event's fields.
    Fields,
    /// The whole body is the event (`#[event(body)]`, or a hand-written
    /// `Event` that says so), in the media type its schema names.
    Whole,
    /// Raw bytes streamed to the handler (`Registry::upload`).
    Upload,
    /// `multipart/form-data` streamed to the handler (`Registry::multipart`).
    Multipart,
}

/// The keyword a hand-written whole-body event's schema may carry to
/// describe its path parameters (a whole-body schema describes the body,
/// so it cannot list them as properties); taken out of the body schema.
const PATH_PARAMETERS: &str = "x-switchyard-path-parameters";

fn operation(
    route: &Route<'_>,
    doc: Option<&TypeDoc>,
    security: Option<Value>,
    schemas: &mut Map<String, Value>,
) -> Value {
    let Route {
        manager,
        name,
        method,
        path_params,
        stream_body,
    } = *route;
    let mut schema = doc
        .and_then(|d| serde_json::from_str::<Value>(&d.schema).ok())
        .map(|s| hoist(s, schemas))
        .unwrap_or_else(|| json!({}));
    let declared_params = schema
        .as_object_mut()
        .and_then(|s| s.remove(PATH_PARAMETERS))
        .and_then(|p| match p {
            Value::Object(map) => Some(map),
            _ => None,
        })
        .unwrap_or_default();
    let description = doc.map(|d| d.description.as_str()).unwrap_or_default();
    let summary = description.lines().next().unwrap_or(name).trim().to_owned();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    // The SDK registers a streamed body either as an upload or as a
    // multipart form (documented as such since decision 0125; a plugin
    // built before it documents no form).
    let body = if doc.is_some_and(|d| d.role == TypeRole::Upload) {
        Body::Upload
    } else if stream_body {
        Body::Multipart
    } else if doc.is_some_and(|d| d.whole_body) {
        Body::Whole
    } else if matches!(method, "GET" | "HEAD" | "DELETE" | "OPTIONS") {
        Body::Query
    } else {
        Body::Fields
    };

    let mut parameters = Vec::new();
    for p in path_params {
        let schema = declared_params
            .get(p)
            .or_else(|| (body != Body::Whole).then(|| properties.get(p)).flatten())
            .cloned()
            .unwrap_or_else(|| json!({ "type": "string" }));
        parameters.push(parameter("path", p, true, schema));
    }
    if body == Body::Query {
        for (key, schema) in &properties {
            if !path_params.contains(key) {
                parameters.push(parameter(
                    "query",
                    key,
                    required.contains(&key.as_str()),
                    schema.clone(),
                ));
            }
        }
    }
    // A handler that reads a precondition header answers 412 when it fails:
    // a status the document then names, since a client sending any value
    // the schema allows can meet it.
    let conditional = doc.is_some_and(|d| {
        d.params.iter().any(|b| {
            b.location == "header"
                && (b.name.eq_ignore_ascii_case("if-match") || b.name.eq_ignore_ascii_case("if-none-match"))
        })
    });
    for bound in doc.map(|d| d.params.as_slice()).unwrap_or_default() {
        parameters.push(parameter(
            &bound.location,
            &bound.name,
            bound.required,
            json!({ "type": "string" }),
        ));
    }

    let mut op = json!({
        "operationId": name,
        "summary": summary,
        "tags": [manager],
        "x-switchyard-event": name,
    });
    if !description.is_empty() {
        op["description"] = description.into();
    }
    if !parameters.is_empty() {
        op["parameters"] = parameters.into();
    }
    match body {
        Body::Query => {}
        // An empty upload is an upload of zero bytes: the body is optional.
        Body::Upload => {
            op["requestBody"] = json!({
                "required": false,
                "description": "The raw body, streamed to the handler as it arrives.",
                "content": { "application/octet-stream": { "schema": { "type": "string", "contentMediaType": "application/octet-stream" } } },
            });
        }
        Body::Multipart => {
            // The event's fields are the form's text fields; any other part
            // is a file the handler reads.
            let mut fields = serde_json::Map::new();
            for (key, schema) in &properties {
                if !path_params.contains(key) {
                    fields.insert(key.clone(), schema.clone());
                }
            }
            let required: Vec<&str> = required
                .iter()
                .copied()
                .filter(|r| !path_params.iter().any(|p| p == *r))
                .collect();
            let mut form = json!({
                "type": "object",
                // A part's name is a quoted header parameter: no control
                // characters, no quote.
                "propertyNames": { "pattern": "^[^\\u0000-\\u001f\\u007f\"]*$" },
                "additionalProperties": { "type": "string", "contentMediaType": "application/octet-stream" },
            });
            if !fields.is_empty() {
                form["properties"] = fields.into();
            }
            if !required.is_empty() {
                form["required"] = required.into();
            }
            op["requestBody"] = json!({
                "required": true,
                "description": "An HTML form: its text fields up to the first file fill the event's fields; the parts are streamed to the handler as they arrive.",
                "content": { "multipart/form-data": { "schema": form } },
            });
        }
        Body::Whole => {
            // A schema that names a media type other than JSON describes
            // raw bytes, which may be empty; a JSON document may not.
            let media = schema
                .get("contentMediaType")
                .and_then(Value::as_str)
                .filter(|m| !m.eq_ignore_ascii_case("application/json"))
                .map(str::to_owned);
            let mut described = json!({ "content": {} });
            if let Some(object) = schema.as_object_mut()
                && let Some(Value::String(d)) = object.remove("description")
            {
                described["description"] = d.into();
            }
            described["required"] = media.is_none().into();
            let media = media.unwrap_or_else(|| "application/json".to_owned());
            described["content"][media] = json!({ "schema": schema });
            op["requestBody"] = described;
        }
        Body::Fields => {
            let mut fields = schema.clone();
            let mut required = false;
            if let Some(object) = fields.as_object_mut() {
                object.remove("description");
                if let Some(Value::Object(props)) = object.get_mut("properties") {
                    props.retain(|k, _| !path_params.contains(k));
                }
                if let Some(Value::Array(req)) = object.get_mut("required") {
                    req.retain(|k| !k.as_str().is_some_and(|k| path_params.iter().any(|p| p == k)));
                    required = !req.is_empty();
                }
            }
            // A required field needs a body: the query could set it too,
            // but this document describes the body for these methods.
            op["requestBody"] = json!({
                "required": required,
                "description": "The event's fields as a JSON object (the query string may set them too; path parameters win).",
                "content": { "application/json": { "schema": fields } },
            });
        }
    }

    let mut responses = Map::new();
    let reply = doc.and_then(|d| d.reply.as_ref());
    match reply {
        Some(reply) => {
            let mut answer = json!({
                "description": if reply.description.is_empty() { success(reply.status).to_owned() } else { reply.description.clone() },
            });
            if reply.status != 204 {
                let schema = serde_json::from_str::<Value>(&reply.schema)
                    .map(|s| hoist(s, schemas))
                    .unwrap_or_else(|_| json!({}));
                answer["content"] = json!({ reply.content_type.clone(): { "schema": schema } });
            }
            responses.insert(reply.status.to_string(), answer);
        }
        None => {
            responses.insert(
                "200".to_owned(),
                json!({ "description": "The handler's answer.", "content": { "application/json": { "schema": {} } } }),
            );
        }
    }
    let mut errors = vec!["400", "404", "422", "500", "503", "504"];
    if body != Body::Query {
        errors.extend(["413", "415"]);
    }
    if security.is_some() {
        errors.extend(["401", "403"]);
    }
    if conditional {
        errors.push("412");
    }
    errors.push("429");
    errors.sort_unstable();
    for code in errors {
        responses.insert(
            code.to_owned(),
            json!({ "$ref": format!("#/components/responses/{}", response_name(code)) }),
        );
    }
    // A handler may answer any error status it chooses (409 for a
    // conflict, 412 for a failed precondition, ...): the document cannot
    // know which, so it says that any other one is a problem+json too.
    responses.insert(
        "default".to_owned(),
        json!({ "$ref": "#/components/responses/OtherError" }),
    );
    op["responses"] = Value::Object(responses);
    if let Some(security) = security {
        op["security"] = security;
    }
    op
}

fn success(status: u16) -> &'static str {
    match status {
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        _ => "OK",
    }
}

fn parameter(location: &str, name: &str, required: bool, mut schema: Value) -> Value {
    let description = schema
        .as_object_mut()
        .and_then(|s| s.remove("description"))
        .unwrap_or(Value::Null);
    let mut p = json!({ "name": name, "in": location, "required": required, "schema": schema });
    if let Value::String(d) = description {
        p["description"] = d.into();
    }
    p
}

/// Moves a standalone schema's `$defs` into the document's components and
/// points its references there.
fn hoist(mut schema: Value, schemas: &mut Map<String, Value>) -> Value {
    if let Some(Value::Object(defs)) = schema.as_object_mut().and_then(|s| s.remove("$defs")) {
        for (name, mut def) in defs {
            rewrite_refs(&mut def);
            schemas.entry(name).or_insert(def);
        }
    }
    rewrite_refs(&mut schema);
    schema
}

fn rewrite_refs(value: &mut Value) {
    match value {
        Value::Object(map) => {
            for (key, v) in map.iter_mut() {
                if key == "$ref"
                    && let Value::String(r) = v
                    && let Some(name) = r.strip_prefix("#/$defs/")
                {
                    *r = format!("#/components/schemas/{name}");
                } else {
                    rewrite_refs(v);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(rewrite_refs),
        _ => {}
    }
}

/// RFC 9457 problem details, as every error of the group is answered.
fn problem_schema() -> Value {
    json!({
        "type": "object",
        "description": "An error (RFC 9457 problem details). 422 lists the invalid fields in `errors`.",
        "properties": {
            "type": { "type": "string", "description": "Always `about:blank`." },
            "title": { "type": "string", "description": "The status's reason phrase." },
            "status": { "type": "integer", "description": "The HTTP status." },
            "detail": { "type": "string", "description": "What went wrong, for a person." },
            "hop": {
                "type": "string",
                "enum": ["listener", "broker", "router", "manager-host", "cluster"],
                "description": "The part of the group that made this answer (as the `switchyard-error` header); absent from a handler's own error.",
            },
            "errors": {
                "type": "array",
                "description": "The invalid fields (422).",
                "items": {
                    "type": "object",
                    "properties": {
                        "field": { "type": "string", "description": "The field's path (`name`, `items[2].qty`); empty for the whole input." },
                        "message": { "type": "string" },
                    },
                    "required": ["field", "message"],
                },
            },
        },
        "required": ["type", "title", "status"],
    })
}

fn response_name(code: &str) -> String {
    reason(code.parse().unwrap_or(500)).replace(' ', "")
}

fn standard_responses() -> Value {
    let why = [
        (
            "400",
            "The request is malformed (a header, cookie or parameter it needs is missing or bad).",
        ),
        (
            "401",
            "A credential is needed, or the one given is not valid (`WWW-Authenticate` says which).",
        ),
        ("403", "The caller lacks a role or claim the route requires."),
        ("404", "No such route."),
        ("413", "The body is larger than the listener accepts."),
        (
            "415",
            "The body's `Content-Type` or `Content-Encoding` is not one the route takes.",
        ),
        (
            "412",
            "A precondition header (`If-Match`, `If-None-Match`) does not hold for the resource as it is now.",
        ),
        ("422", "The input does not validate; `errors` names each field."),
        ("429", "Over a rate limit; `Retry-After` says when to retry."),
        (
            "500",
            "The handler failed (details only when the group exposes errors).",
        ),
        (
            "503",
            "The manager is down or the group is overloaded; `Retry-After` may say when to retry.",
        ),
        ("504", "No answer within the request deadline."),
    ];
    let mut out = Map::new();
    let problem = |description: &str| {
        json!({
            "description": description,
            "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } },
        })
    };
    for (code, description) in why {
        out.insert(response_name(code), problem(description));
    }
    out.insert(
        "OtherError".to_owned(),
        problem("Another error the handler answers (409 Conflict, 412 Precondition Failed, ...)."),
    );
    Value::Object(out)
}

fn security_schemes(auth: &AuthConfig) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if auth.jwt.is_some() {
        out.push((
            BEARER.to_owned(),
            json!({ "type": "http", "scheme": "bearer", "bearerFormat": "JWT" }),
        ));
    }
    if let Some(keys) = &auth.api_keys {
        out.push((
            API_KEY.to_owned(),
            json!({ "type": "apiKey", "in": "header", "name": keys.header }),
        ));
    }
    if auth.basic.is_some() {
        out.push((BASIC.to_owned(), json!({ "type": "http", "scheme": "basic" })));
    }
    out
}

/// The `security` of a route: any one configured credential, with the
/// roles the first matching rule asks for; `None` when no rule requires
/// an identity.
///
/// A route whose template no rule covers but whose event a rule reaches
/// (a `prefix` naming one value of a parameter, which covers those paths
/// and the event over WebSocket and gRPC) lists the credentials after an
/// empty requirement: some of its requests need one, others none.
fn required_auth(
    auth: &AuthConfig,
    path: &str,
    event: Option<&str>,
    schemes: &[(String, Value)],
) -> Option<Value> {
    let covering = auth
        .rules
        .iter()
        .find(|r| switchyard_middleware::rule_covers(r, path, event));
    let (rule, optional) = match (covering, event) {
        (Some(rule), _) => (rule, false),
        (None, Some(event)) => (
            auth.rules
                .iter()
                .find(|r| switchyard_middleware::rule_reaches(r, path, event))?,
            true,
        ),
        (None, None) => return None,
    };
    if rule.require == Require::None {
        return None;
    }
    let mut alternatives: Vec<Value> = Vec::new();
    if optional {
        alternatives.push(json!({}));
    }
    alternatives.extend(
        schemes
            .iter()
            .map(|(name, _)| json!({ name.clone(): rule.roles })),
    );
    Some(Value::Array(alternatives))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rule_on_one_value_of_a_parameter_makes_the_route_optionally_protected() {
        let auth: AuthConfig = serde_json::from_value(json!({
            "jwt": { "algorithms": ["HS256"], "secret": "0123456789abcdef0123456789abcdef" },
            "rules": [
                { "prefix": "/users/admin", "roles": ["admin"] },
                { "prefix": "/me" },
            ],
        }))
        .unwrap();
        let schemes = security_schemes(&auth);
        assert_eq!(
            required_auth(&auth, "/users/{name}", Some("u.Get"), &schemes),
            Some(json!([{}, { BEARER: ["admin"] }]))
        );
        assert_eq!(
            required_auth(&auth, "/me", Some("u.Me"), &schemes),
            Some(json!([{ BEARER: [] }]))
        );
        assert_eq!(required_auth(&auth, "/other", Some("u.Other"), &schemes), None);
    }

    #[test]
    fn templates() {
        assert_eq!(
            template("/a/{x}/b"),
            ("/a/{x}/b".to_owned(), vec!["x".to_owned()])
        );
        assert_eq!(
            template("/f/{*rest}"),
            ("/f/{rest}".to_owned(), vec!["rest".to_owned()])
        );
        assert_eq!(template("/plain"), ("/plain".to_owned(), vec![]));
    }

    #[test]
    fn refs_move_to_components() {
        let mut schemas = Map::new();
        let s = hoist(
            json!({ "properties": { "l": { "$ref": "#/$defs/Line" } }, "$defs": { "Line": { "type": "object" } } }),
            &mut schemas,
        );
        assert_eq!(s["properties"]["l"]["$ref"], "#/components/schemas/Line");
        assert!(s.get("$defs").is_none());
        assert!(schemas.contains_key("Line"));
    }
}
