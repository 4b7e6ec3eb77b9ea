//! The OpenAPI 3.1 document of a group, from its [`Catalog`].

use serde_json::{Map, Value, json};
use switchyard_proto::api::{Catalog, TypeDoc, TypeRole};
use switchyard_proto::problem::reason;

use super::ApiConfig;
use crate::middleware::config::{AuthConfig, Require};

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
            let security = required_auth(auth, &route.path, &handled.name, &schemes);
            let operation = operation(
                &manager.name,
                &handled.name,
                &route.method,
                &path_params,
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

fn operation(
    manager: &str,
    name: &str,
    method: &str,
    path_params: &[String],
    doc: Option<&TypeDoc>,
    security: Option<Value>,
    schemas: &mut Map<String, Value>,
) -> Value {
    let schema = doc
        .and_then(|d| serde_json::from_str::<Value>(&d.schema).ok())
        .map(|s| hoist(s, schemas))
        .unwrap_or_else(|| json!({}));
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
    let has_body = !matches!(method, "GET" | "HEAD" | "DELETE" | "OPTIONS");
    let whole_body = doc.is_some_and(|d| d.whole_body);
    let upload = doc.is_some_and(|d| d.role == TypeRole::Upload);

    let mut parameters = Vec::new();
    for p in path_params {
        let schema = properties
            .get(p)
            .cloned()
            .unwrap_or_else(|| json!({ "type": "string" }));
        parameters.push(parameter("path", p, true, schema));
    }
    if !has_body && !whole_body {
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
    if upload {
        op["requestBody"] = json!({
            "required": true,
            "description": "The raw body, streamed to the handler as it arrives.",
            "content": { "application/octet-stream": { "schema": { "type": "string", "contentMediaType": "application/octet-stream" } } },
        });
    } else if whole_body {
        op["requestBody"] =
            json!({ "required": true, "content": { "application/json": { "schema": schema } } });
    } else if has_body {
        let mut body = schema.clone();
        if let Some(object) = body.as_object_mut() {
            object.remove("description");
            if let Some(Value::Object(props)) = object.get_mut("properties") {
                props.retain(|k, _| !path_params.contains(k));
            }
            if let Some(Value::Array(req)) = object.get_mut("required") {
                req.retain(|k| !k.as_str().is_some_and(|k| path_params.iter().any(|p| p == k)));
            }
        }
        op["requestBody"] = json!({
            "description": "The event's fields as a JSON object (the query string may set them too; path parameters win).",
            "content": { "application/json": { "schema": body } },
        });
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
    if has_body || upload {
        errors.push("413");
    }
    if security.is_some() {
        errors.extend(["401", "403"]);
    }
    errors.push("429");
    errors.sort_unstable();
    for code in errors {
        responses.insert(
            code.to_owned(),
            json!({ "$ref": format!("#/components/responses/{}", response_name(code)) }),
        );
    }
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
    for (code, description) in why {
        out.insert(
            response_name(code),
            json!({
                "description": description,
                "content": { "application/problem+json": { "schema": { "$ref": "#/components/schemas/Problem" } } },
            }),
        );
    }
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
fn required_auth(auth: &AuthConfig, path: &str, event: &str, schemes: &[(String, Value)]) -> Option<Value> {
    let rule = auth
        .rules
        .iter()
        .find(|r| crate::middleware::rule_covers(r, path, event))?;
    if rule.require == Require::None {
        return None;
    }
    Some(Value::Array(
        schemes
            .iter()
            .map(|(name, _)| json!({ name.clone(): rule.roles }))
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
