//! The `/docs` page: the routes, events and notification types of the
//! group with their fields and descriptions, as one static HTML page.

use std::fmt::Write;

use serde_json::Value;
use switchyard_proto::api::{Catalog, TypeDoc, TypeRole};

use crate::ApiConfig;
// One HTML escape for every page the group makes.
use switchyard_proto::web::escape_html as escape;

/// An anchor id for a type name.
fn anchor(name: &str) -> String {
    name.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// A short type for a field's schema: `string`, `integer[]`, `Line`, ….
fn type_of(schema: &Value) -> String {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        return r.rsplit('/').next().unwrap_or(r).to_owned();
    }
    match schema.get("type") {
        Some(Value::String(t)) if t == "array" => {
            format!("{}[]", schema.get("items").map_or("any".to_owned(), type_of))
        }
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .filter(|t| *t != "null")
            .collect::<Vec<_>>()
            .join(" | "),
        _ => match schema
            .get("anyOf")
            .or_else(|| schema.get("oneOf"))
            .and_then(Value::as_array)
        {
            Some(options) => options
                .iter()
                .map(type_of)
                .filter(|t| t != "null")
                .collect::<Vec<_>>()
                .join(" | "),
            None => "any".to_owned(),
        },
    }
}

/// The validation keywords of a field, as text.
fn rules_of(schema: &Value) -> String {
    let keys = [
        ("minLength", "length ≥"),
        ("maxLength", "length ≤"),
        ("minItems", "items ≥"),
        ("maxItems", "items ≤"),
        ("minimum", "≥"),
        ("maximum", "≤"),
    ];
    keys.iter()
        .filter_map(|(k, label)| schema.get(*k).map(|v| format!("{label} {v}")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn fields_table(out: &mut String, schema: &Value) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        let _ = writeln!(out, "<p class=any>Any JSON value.</p>");
        return;
    };
    if props.is_empty() {
        let _ = writeln!(out, "<p class=any>No fields.</p>");
        return;
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str(
        "<table><tr><th>field</th><th>type</th><th>required</th><th>rules</th><th>description</th></tr>\n",
    );
    for (name, field) in props {
        let _ = writeln!(
            out,
            "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(name),
            escape(&type_of(field)),
            if required.contains(&name.as_str()) {
                "yes"
            } else {
                "no"
            },
            escape(&rules_of(field)),
            escape(
                field
                    .get("description")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
            ),
        );
    }
    out.push_str("</table>\n");
}

fn type_section(out: &mut String, doc: &TypeDoc, route: Option<String>) {
    let _ = writeln!(out, "<section id=\"{}\" class=type>", anchor(&doc.name));
    let _ = write!(out, "<h3><code>{}</code>", escape(&doc.name));
    if let Some(route) = route {
        let _ = write!(out, " <span class=route>{}</span>", escape(&route));
    }
    out.push_str("</h3>\n");
    if !doc.description.is_empty() {
        for para in doc.description.split("\n\n") {
            let _ = writeln!(out, "<p>{}</p>", escape(para));
        }
    }
    let schema: Value = serde_json::from_str(&doc.schema).unwrap_or(Value::Bool(true));
    if doc.role == TypeRole::Upload {
        out.push_str("<p>The body is streamed to the handler as it arrives.</p>\n");
    }
    if doc.role == TypeRole::Form {
        out.push_str(
            "<p>A <code>multipart/form-data</code> form: these fields come first, then its files, streamed to the handler as they arrive.</p>\n",
        );
    }
    fields_table(out, &schema);
    for p in &doc.params {
        let _ = writeln!(
            out,
            "<p>From {} <code>{}</code>{}.</p>",
            escape(&p.location),
            escape(&p.name),
            if p.required { " (required)" } else { "" }
        );
    }
    if let Some(reply) = &doc.reply {
        let _ = writeln!(
            out,
            "<h4>Reply: {}{}</h4>",
            reply.status,
            if reply.content_type.is_empty() {
                String::new()
            } else {
                format!(" <code>{}</code>", escape(&reply.content_type))
            }
        );
        if !reply.description.is_empty() {
            let _ = writeln!(out, "<p>{}</p>", escape(&reply.description));
        }
        if let Ok(schema) = serde_json::from_str::<Value>(&reply.schema) {
            fields_table(out, &schema);
        }
    }
    out.push_str("</section>\n");
}

/// The whole page.
pub(super) fn page(catalog: &Catalog, settings: &ApiConfig) -> String {
    let mut out = String::new();
    let title = escape(&settings.title);
    let _ = writeln!(
        out,
        "<!doctype html>\n<html lang=en><head><meta charset=utf-8>\
         <meta name=viewport content=\"width=device-width, initial-scale=1\">\
         <title>{title}: API</title><style>{STYLE}</style></head><body>\n<h1>{title}</h1>"
    );
    if settings.openapi {
        out.push_str("<p>Machine-readable: <a href=\"/openapi.json\">/openapi.json</a> (OpenAPI 3.1).</p>\n");
    }
    out.push_str(
        "<h2>Routes</h2>\n<table><tr><th>method</th><th>path</th><th>event</th><th>manager</th></tr>\n",
    );
    for m in &catalog.managers {
        for h in &m.handles {
            if let Some(r) = &h.route {
                let _ = writeln!(
                    out,
                    "<tr><td>{}</td><td><code>{}</code></td><td><a href=\"#{}\">{}</a></td><td>{}</td></tr>",
                    escape(&r.method),
                    escape(&r.path),
                    anchor(&h.name),
                    escape(&h.name),
                    escape(&m.name)
                );
            }
        }
    }
    out.push_str("</table>\n<h2>Events</h2>\n");
    let mut notifications: Vec<&TypeDoc> = Vec::new();
    for m in &catalog.managers {
        let requests: Vec<&TypeDoc> = m
            .types
            .iter()
            .filter(|t| t.role != TypeRole::Notification)
            .collect();
        for t in m.types.iter().filter(|t| t.role == TypeRole::Notification) {
            if !notifications.iter().any(|n| n.name == t.name) {
                notifications.push(t);
            }
        }
        if requests.is_empty() {
            continue;
        }
        let _ = writeln!(
            out,
            "<h2 class=manager>Manager <code>{}</code></h2>",
            escape(&m.name)
        );
        for t in requests {
            let route = m
                .handles
                .iter()
                .find(|h| h.name == t.name)
                .and_then(|h| h.route.as_ref())
                .map(|r| format!("{} {}", r.method, r.path));
            type_section(&mut out, t, route);
        }
    }
    out.push_str("<h2>Notification types</h2>\n");
    if notifications.is_empty() {
        out.push_str("<p>None declared.</p>\n");
    }
    for t in notifications {
        type_section(&mut out, t, None);
    }
    out.push_str("</body></html>\n");
    out
}

const STYLE: &str = "body{font:15px/1.5 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}\
table{border-collapse:collapse;margin:.5rem 0 1rem}td,th{border:1px solid #ccc;padding:.2rem .5rem;text-align:left;vertical-align:top}\
th{background:#f3f3f3}code{font:13px ui-monospace,monospace}.route{font-weight:normal;color:#555;margin-left:1rem}\
section.type{border-top:1px solid #ddd;padding-top:.5rem}.any{color:#666}";
