//! The API description of a running group: `GET /openapi.json` (OpenAPI
//! 3.1, checked by a real validator) lists every route with its
//! parameters, bodies, replies, problem answers and authentication;
//! `switchyard openapi` prints the same without starting the group;
//! `GET /docs` renders the routes, events and notification types; both
//! can be turned off.

mod common;

use std::process::Command;

use common::{Group, get, request_with};
use serde_json::Value;

/// Every HTTP route of the demo group (README.md, "Demo routes").
const DEMO_ROUTES: &[(&str, &str)] = &[
    ("get", "/noop"),
    ("post", "/echo"),
    ("get", "/hello/{name}"),
    ("get", "/hi/{name}"),
    ("get", "/whoami"),
    ("get", "/me"),
    ("get", "/panic"),
    ("get", "/payload/{size}"),
    ("get", "/sleep/{ms}"),
    ("get", "/stream/{size}"),
    ("post", "/upload"),
    ("get", "/cpu/{ms}"),
    ("get", "/crash/{mode}"),
    ("get", "/kv/{key}"),
];

/// Checks `document` with `openapi-spec-validator` (PyPI; `.ci/run`
/// installs it): a real OpenAPI 3.1 validator, not ours.
fn validate(document: &str) {
    let dir = common::scratch_dir("openapi-doc");
    let path = dir.path().join("openapi.json");
    std::fs::write(&path, document).unwrap();
    let out = Command::new("python3")
        .args(["-m", "openapi_spec_validator"])
        .arg(&path)
        .output()
        .expect("run python3 (openapi-spec-validator: pip install openapi-spec-validator)");
    assert!(
        out.status.success(),
        "the document does not validate:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn switchyard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("run switchyard")
}

#[test]
fn the_demo_group_describes_every_route_and_the_document_validates() {
    let group = Group::start("openapi-demo");
    let answer = get(group.addr, "/openapi.json").unwrap();
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let text = answer.text();
    validate(&text);
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    for (method, path) in DEMO_ROUTES {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is missing"
        );
    }

    // A path parameter, with the event's validation rules.
    let hello = &doc["paths"]["/hello/{name}"]["get"];
    assert_eq!(hello["operationId"], "demo.Hello");
    let name = &hello["parameters"][0];
    assert_eq!(
        (name["in"].as_str(), name["name"].as_str()),
        (Some("path"), Some("name"))
    );
    assert_eq!(name["schema"]["minLength"], 1);
    assert_eq!(name["schema"]["maxLength"], 100);
    // The reply's fields, and the problem+json answers.
    assert_eq!(
        hello["responses"]["200"]["content"]["application/json"]["schema"]["properties"]["message"]["type"],
        "string"
    );
    assert_eq!(
        hello["responses"]["422"]["$ref"],
        "#/components/responses/UnprocessableContent"
    );
    let problem =
        &doc["components"]["responses"]["UnprocessableContent"]["content"]["application/problem+json"];
    assert_eq!(problem["schema"]["$ref"], "#/components/schemas/Problem");
    assert!(doc["components"]["schemas"]["Problem"]["properties"]["errors"].is_object());
    // Doc comments become descriptions.
    assert!(
        doc["paths"]["/me"]["get"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("who called")),
        "{}",
        doc["paths"]["/me"]["get"]
    );
    // The demo's [auth] requires a bearer token on /me, and nothing on /hello.
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    assert_eq!(
        doc["paths"]["/me"]["get"]["security"],
        serde_json::json!([{ "bearer": [] }])
    );
    assert!(doc["paths"]["/me"]["get"]["responses"]["401"].is_object());
    assert!(hello.get("security").is_none());
    // A cookie the handler reads, declared on the event, is not a field.
    let upload = &doc["paths"]["/upload"]["post"];
    assert!(upload["requestBody"]["content"]["application/octet-stream"].is_object());
    // An empty upload is one of zero bytes.
    assert_eq!(upload["requestBody"]["required"], false);

    // Each body as the route takes it: a multipart form, raw bytes, a
    // JSON object whose required fields make it required, any JSON.
    let body = |method: &str, path: &str| doc["paths"][path][method]["requestBody"].clone();
    let files = body("post", "/files");
    assert!(files["content"]["multipart/form-data"].is_object(), "{files}");
    assert_eq!(files["content"].as_object().unwrap().len(), 1, "{files}");
    // The form's text fields are the event's, with their rules; any other
    // part is a file (decision 0125).
    let form = &files["content"]["multipart/form-data"]["schema"];
    assert_eq!(form["properties"]["note"]["maxLength"], 200, "{form}");
    assert_eq!(
        form["additionalProperties"]["contentMediaType"], "application/octet-stream",
        "{form}"
    );
    // The files' reply is described too.
    assert!(
        doc["paths"]["/files"]["post"]["responses"]["200"]["content"]["application/json"].is_object(),
        "{}",
        doc["paths"]["/files"]["post"]["responses"]
    );
    let raw = body("post", "/echo-bytes");
    assert!(raw["content"]["application/octet-stream"].is_object(), "{raw}");
    assert_eq!(raw["required"], false);
    for (method, path) in [
        ("post", "/greet"),
        ("post", "/reminders"),
        ("put", "/note"),
        ("put", "/kv/{key}"),
        ("post", "/echo"),
    ] {
        let b = body(method, path);
        assert_eq!(b["required"], true, "{method} {path}: {b}");
        assert!(
            b["content"]["application/json"].is_object(),
            "{method} {path}: {b}"
        );
    }
    // Only optional fields: no body is fine.
    assert_eq!(body("post", "/kv/{key}/incr")["required"], false);
    // The limits the handlers enforce are in the schemas.
    let size = &doc["paths"]["/payload/{size}"]["get"]["parameters"][0]["schema"];
    assert_eq!(size["maximum"], 16 * 1024 * 1024, "{size}");
    let key = &doc["paths"]["/kv/{key}"]["put"]["parameters"][0]["schema"];
    assert_eq!(key["maxLength"], 256, "{key}");
    // 415 where there is a body; any other status a handler picks (409,
    // 412) is a problem+json too.
    let files_responses = &doc["paths"]["/files"]["post"]["responses"];
    assert_eq!(
        files_responses["415"]["$ref"],
        "#/components/responses/UnsupportedMediaType"
    );
    assert_eq!(
        files_responses["default"]["$ref"],
        "#/components/responses/OtherError"
    );
    assert!(hello["responses"].get("415").is_none());
    // The listener's own routes.
    for path in ["/health", "/ready", "/openapi.json", "/docs"] {
        assert!(
            doc["paths"][path]["get"]["responses"]["200"].is_object(),
            "{path}"
        );
    }
    assert!(doc["paths"]["/ready"]["get"]["responses"]["503"].is_object());

    // `switchyard openapi` prints the same document without a group.
    let printed = switchyard(&["openapi"]);
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    assert_eq!(printed, doc);
}

#[test]
fn the_docs_page_lists_routes_events_fields_and_descriptions() {
    let group = Group::start("openapi-docs");
    let page = get(group.addr, "/docs").unwrap();
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let html = page.text();
    for needle in [
        "<code>demo.Hello</code>",
        "GET /hello/{name}",
        "<code>name</code>",
        "length ≥ 1, length ≤ 100",
        "from the request&#x27;s scope",
        "Notification types",
        // Declared with `r.emits::<Tick>()`, with its fields' doc comments.
        "<code>demo.tick</code>",
        "Wall-clock milliseconds since the Unix epoch.",
        "href=\"/openapi.json\"",
    ] {
        assert!(html.contains(needle), "the page lacks {needle:?}");
    }
    // HEAD has the length and no body; other methods are refused.
    let head = request_with(group.addr, "HEAD", "/docs", &[], b"").unwrap();
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty());
    assert_eq!(
        request_with(group.addr, "POST", "/openapi.json", &[], b"{}")
            .unwrap()
            .status,
        405
    );
}

#[test]
fn a_config_file_describes_its_managers_auth_rules_and_can_turn_both_off() {
    let on = r#"
[[managers]]
name = "basics"

[api]
title = "Basics API"
version = "2.3.4"

[auth.api_keys]
header = "x-key"
[[auth.api_keys.keys]]
name = "ops"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
roles = ["admin"]

[[auth.rules]]
event = "demo.Hello"
roles = ["admin"]
"#;
    let dir = common::scratch_dir("openapi-config");
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, on).unwrap();
    let group = Group::builder("openapi-config").config(on).start();
    let doc = get(group.addr, "/openapi.json").unwrap().json();
    assert_eq!(doc["info"]["title"], "Basics API");
    assert_eq!(doc["info"]["version"], "2.3.4");
    assert_eq!(doc["components"]["securitySchemes"]["apiKey"]["name"], "x-key");
    assert_eq!(
        doc["paths"]["/hello/{name}"]["get"]["security"],
        serde_json::json!([{ "apiKey": ["admin"] }])
    );
    assert!(doc["paths"]["/noop"]["get"].get("security").is_none());
    // Only the configured manager's routes.
    assert!(doc["paths"].get("/cpu/{ms}").is_none());
    let printed = switchyard(&["openapi", "-c", file.to_str().unwrap()]);
    assert!(
        printed.status.success(),
        "{}",
        String::from_utf8_lossy(&printed.stderr)
    );
    assert_eq!(serde_json::from_slice::<Value>(&printed.stdout).unwrap(), doc);
    drop(group);

    let off = "[[managers]]\nname = \"basics\"\n[api]\nopenapi = false\ndocs = false\n";
    let group = Group::builder("openapi-off").config(off).start();
    assert_eq!(get(group.addr, "/openapi.json").unwrap().status, 404);
    assert_eq!(get(group.addr, "/docs").unwrap().status, 404);
    assert_eq!(get(group.addr, "/noop").unwrap().status, 200);
}

#[test]
fn a_bad_api_key_is_a_configuration_error_naming_it() {
    let dir = common::scratch_dir("openapi-bad");
    let file = dir.path().join("switchyard.toml");
    std::fs::write(&file, "[api]\ntitle = \"\"\n").unwrap();
    let out = switchyard(&["check", "-c", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("api.title"));
}

#[test]
fn switchyard_bench_takes_its_routes_from_openapi_json() {
    let group = Group::start("openapi-bench");
    let url = format!("http://{}", group.addr);
    let out = switchyard(&["bench", &url, "-c", "1", "-d", "0.2", "--warmup", "0", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["routes_from"], "openapi", "{report}");
    let routes: Vec<&str> = report["routes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(routes.contains(&"GET /noop"), "{routes:?}");
    // /me needs a token (its `security`), /panic answers 500: neither is load.
    assert!(
        !routes.contains(&"GET /me") && !routes.contains(&"GET /panic"),
        "{routes:?}"
    );
    assert_eq!(report["steps"][0]["error_rate"], 0.0, "{report}");
}

#[test]
fn a_reload_with_a_new_plugin_build_describes_its_new_fields() {
    let dir = common::scratch_dir("openapi-reload");
    let file = dir.path().join("switchyard.toml");
    let config = |package: &str| {
        format!(
            "[[managers]]\nname = \"versioned\"\nplugin = \"{}\"\n",
            common::plugin(package).display()
        )
    };
    std::fs::write(&file, config("switchyard-fixture-versioned-one")).unwrap();
    let group = Group::builder("openapi-reload").config_file(&file).start();
    let query_params = |doc: &Value| -> Vec<String> {
        doc["paths"]["/version"]["get"]["parameters"]
            .as_array()
            .map(|ps| {
                ps.iter()
                    .filter_map(|p| p["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = get(group.addr, "/openapi.json").unwrap().json();
    assert!(
        query_params(&before).is_empty(),
        "{}",
        before["paths"]["/version"]
    );

    // Build two has a `detail` field: after the reload, the description has it.
    std::fs::write(&file, config("switchyard-fixture-versioned-two")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&group.runtime_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let after = common::eventually("the new description", std::time::Duration::from_secs(20), || {
        let doc = get(group.addr, "/openapi.json")
            .map_err(|e| e.to_string())?
            .json();
        if query_params(&doc) == ["detail"] {
            Ok(doc)
        } else {
            Err(doc["paths"]["/version"].to_string())
        }
    });
    let reply =
        &after["paths"]["/version"]["get"]["responses"]["200"]["content"]["application/json"]["schema"];
    assert!(reply["properties"]["added"].is_object(), "{reply}");
}

#[test]
fn an_auth_rule_on_the_endpoints_protects_them() {
    let config = r#"
[[managers]]
name = "basics"

[auth.api_keys]
[[auth.api_keys.keys]]
name = "ops"
sha256 = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"

[[auth.rules]]
prefix = "/docs"

[[auth.rules]]
prefix = "/openapi.json"
"#;
    let group = Group::builder("openapi-protected").config(config).start();
    assert_eq!(get(group.addr, "/docs").unwrap().status, 401);
    assert_eq!(get(group.addr, "/openapi.json").unwrap().status, 401);
    // sha256("test") above.
    let with_key = request_with(group.addr, "GET", "/openapi.json", &[("x-api-key", "test")], b"").unwrap();
    assert_eq!(with_key.status, 200);
    assert_eq!(get(group.addr, "/noop").unwrap().status, 200);
}
