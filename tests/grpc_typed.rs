//! Typed gRPC services made from the event schemas: a client that knows
//! only the address finds `demo.v1.Basics/Hello` by reflection and calls it
//! with typed fields; a 422 decodes with the standard `google.rpc.Status`
//! tooling; notification types stream as typed messages; and a client
//! built before a field was added keeps working against the new build.

mod common;

use std::process::Command;

use bytes::Bytes;
use common::grpc::{Wire, channel, field, fields, message, next_message, server_stream, unary};
use common::{Group, plugin};
use serde_json::Value;
use switchyard_listener::api::proto::field_numbers;

fn config() -> &'static str {
    "[[managers]]\nname = \"basics\"\n\n[[managers]]\nname = \"ticker\"\n\
     [managers.config]\ninterval_ms = 20\npad_bytes = 0\n"
}

#[test]
fn a_python_client_calls_a_typed_rpc_knowing_only_the_address() {
    // The zero-configuration group: every demo manager and the Store.
    let group = Group::start("grpc-typed-python");
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/grpc_typed_client.py"))
        .arg(group.addr.to_string())
        .output()
        .expect("run python3 (pip install grpcio grpcio-reflection grpcio-status)");
    assert!(
        out.status.success(),
        "the Python client failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    let services: Vec<&str> = result["services"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for service in ["demo.v1.Basics", "demo.v1.Notifications", "switchyard.v1.Events"] {
        assert!(
            services.contains(&service),
            "reflection lacks {service}: {services:?}"
        );
    }
    assert_eq!(result["input"], "demo.v1.Hello");
    assert_eq!(result["output"], "demo.v1.HelloReply");
    assert_eq!(result["message"], "Hello, Ada!");
    // The 422, decoded by grpcio-status: a BadRequest naming the field.
    let error = &result["error"];
    assert_eq!(error["code"], "INVALID_ARGUMENT", "{result}");
    assert_eq!(error["violations"][0][0], "name", "{result}");
    assert_eq!(error["reasons"][0], "UNPROCESSABLE_CONTENT", "{result}");
    // `KvIncr.by` defaults to 1 (`#[serde(default = "one")]`): left
    // unset it adds 1, as `POST /kv/{key}/incr` without it does; set to 0
    // it adds 0.
    assert_eq!(
        (
            &result["incr_default"],
            &result["incr_zero"],
            &result["incr_five"]
        ),
        (&Value::from(1), &Value::from(1), &Value::from(6)),
        "{result}"
    );
    // A route that answers bytes succeeds, as a google.api.HttpBody.
    let payload = &result["payload"];
    assert_eq!(payload["output"], "google.api.HttpBody", "{result}");
    assert_eq!(payload["content_type"], "application/octet-stream", "{result}");
    assert_eq!(payload["length"], 1000, "{result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_type_streams_as_typed_messages() {
    let group = Group::builder("grpc-typed-stream").config(config()).start();
    let channel = channel(group.addr).await;
    // `demo.v1.Filter{filter_json = 1}`: only ticks whose n > 2.
    let filter = message(&[(1, common::grpc::text(r#"{"n": {"gt": 2}}"#))]);
    let mut stream = server_stream(&channel, "/demo.v1.Notifications/tick", filter).await;
    let numbers = field_numbers(["n", "at_ms", "pad"]);
    for _ in 0..3 {
        let fields = fields(&next_message(&mut stream).await);
        let n = field(&fields, numbers["n"]);
        assert!(matches!(n, Some(Wire::Varint(n)) if *n > 2), "{fields:?}");
        assert!(
            fields
                .iter()
                .any(|(k, v)| *k == numbers["at_ms"] && matches!(v, Wire::Varint(ms) if *ms > 0))
        );
    }
}

fn proto_of(config: &std::path::Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["proto", "-c"])
        .arg(config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_the_old_build_keeps_working_when_fields_are_added() {
    let dir = common::scratch_dir("grpc-typed-drift");
    let write = |name: &str, package: &str| {
        let path = dir.path().join(name);
        let text = format!(
            "[[managers]]\nname = \"versioned\"\nplugin = \"{}\"\n",
            plugin(package).display()
        );
        std::fs::write(&path, text).unwrap();
        path
    };
    let one = write("one.toml", "switchyard-fixture-versioned-one");
    let two = write("two.toml", "switchyard-fixture-versioned-two");
    // The .proto of build two has every field of build one, with the
    // same number, and the added ones.
    let (old, new) = (proto_of(&one), proto_of(&two));
    let field_lines = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.contains(" = ") && l.contains("json_name"))
            .map(str::to_owned)
            .collect()
    };
    for line in field_lines(&old) {
        assert!(
            new.contains(&line),
            "build two renumbered or lost `{line}`:\n{new}"
        );
    }
    assert!(
        new.contains("bool detail = ") && new.contains("string added = "),
        "{new}"
    );
    assert!(!old.contains("detail"), "{old}");

    // A client of build one: an empty `Version`, a `Which` read by the
    // numbers of build one's .proto.
    let group = Group::builder("grpc-typed-drift").config_file(&two).start();
    let channel = channel(group.addr).await;
    let reply = unary(&channel, "/versioned.v1.Versioned/Version", Bytes::new())
        .await
        .unwrap();
    let old_numbers = field_numbers(["build", "label"]);
    let fields = fields(&reply);
    let text = |number: u32| {
        fields.iter().find_map(|(k, v)| match v {
            Wire::Bytes(b) if *k == number => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        })
    };
    assert_eq!(
        text(old_numbers["build"]).as_deref(),
        Some("switchyard-fixture-versioned-two"),
        "{fields:?}"
    );
    // The field build one does not know is there, under a number of its
    // own, which an old decoder skips.
    let added = field_numbers(["added", "build", "label"])["added"];
    assert!(!old_numbers.values().any(|n| *n == added));
    assert_eq!(text(added).as_deref(), Some("only in build two"));
}

/// A route that answers bytes streamed from a producer (`demo.Stream`)
/// is a typed rpc that succeeds: its reply is a `google.api.HttpBody`
/// (content type 1, data 2) with every byte, up to the message limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_that_answers_bytes_replies_an_http_body() {
    let group = Group::start("grpc-typed-bytes");
    let channel = channel(group.addr).await;
    let size: u64 = 300_000;
    let request = message(&[(field_numbers(["chunked", "size"])["size"], Wire::Varint(size))]);
    let reply = unary(&channel, "/demo.v1.PayloadService/Stream", request)
        .await
        .unwrap();
    let fields = fields(&reply);
    assert_eq!(
        fields.iter().find(|(k, _)| *k == 1).map(|(_, v)| v),
        Some(&Wire::Bytes(b"application/octet-stream".to_vec()))
    );
    let Some((_, Wire::Bytes(data))) = fields.iter().find(|(k, _)| *k == 2) else {
        panic!("no data in {:?}", &fields[..1]);
    };
    assert_eq!(data.len() as u64, size);
    assert!(data.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
}

/// The generated `.proto` says which fields may be left out: one with a
/// serde default is `optional` (so an unset one is told apart from 0),
/// a required one is not; and a bytes reply is a `google.api.HttpBody`,
/// whose file comes with the others.
#[test]
fn the_proto_marks_defaulted_fields_optional_and_bytes_replies_http_body() {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("proto")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    let kv = field_numbers(["by", "key"]);
    assert!(
        text.contains(&format!("optional int64 by = {} [json_name = \"by\"];", kv["by"])),
        "{text}"
    );
    assert!(
        text.contains(&format!("  string key = {} [json_name = \"key\"];", kv["key"])),
        "{text}"
    );
    assert!(
        text.contains("rpc Payload(Payload) returns (google.api.HttpBody);")
            && text.contains("rpc Stream(Stream) returns (google.api.HttpBody);"),
        "{text}"
    );
    assert!(text.contains("// ---- google/api/httpbody.proto"), "{text}");
}

#[test]
fn a_plugin_derives_json_schema_through_the_sdk_alone() {
    // The fixture derives `JsonSchema` on a nested type with no schemars
    // dependency of its own: it compiles (`plugin` builds it), and the
    // type is described field by field, its integer an integer.
    let manifest = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/examples/fixtures/versioned-one/Cargo.toml"
    ))
    .unwrap();
    assert!(!manifest.contains("schemars"), "{manifest}");
    let dir = common::scratch_dir("grpc-typed-schemars");
    let path = dir.path().join("switchyard.toml");
    std::fs::write(
        &path,
        format!(
            "[[managers]]\nname = \"versioned\"\nplugin = \"{}\"\n",
            plugin("switchyard-fixture-versioned-one").display()
        ),
    )
    .unwrap();
    let proto = proto_of(&path);
    let notes = proto
        .split("message ReleaseNotes {")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .unwrap_or_else(|| panic!("no ReleaseNotes message:\n{proto}"));
    assert!(notes.contains("repeated string lines = "), "{notes}");
    assert!(notes.contains("uint32 build_number = "), "{notes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_and_no_content_are_described_with_their_schema_and_status() {
    let config = format!(
        "[[managers]]\nname = \"versioned\"\nplugin = \"{}\"\n",
        plugin("switchyard-fixture-versioned-one").display()
    );
    let group = Group::builder("grpc-typed-created").config(&config).start();
    let doc = common::get(group.addr, "/openapi.json").unwrap().json();
    let created = &doc["paths"]["/releases"]["post"]["responses"];
    assert!(created.get("200").is_none(), "{created}");
    let schema = &created["201"]["content"]["application/json"]["schema"];
    assert_eq!(schema["properties"]["number"]["type"], "integer", "{created}");
    assert_eq!(schema["properties"]["build"]["type"], "string", "{created}");
    let withdrawn = &doc["paths"]["/releases/{number}"]["delete"]["responses"];
    assert!(
        withdrawn["204"].is_object() && withdrawn.get("200").is_none(),
        "{withdrawn}"
    );

    // The typed rpc answers a message whose integer is a varint, not a
    // `google.protobuf.Value`'s double.
    let channel = channel(group.addr).await;
    let number = field_numbers(["number"])["number"];
    let request = message(&[(number, Wire::Varint(7))]);
    let reply = unary(&channel, "/versioned.v1.Versioned/Release", request)
        .await
        .unwrap();
    let numbers = field_numbers(["build", "number"]);
    let fields = fields(&reply);
    assert!(
        fields
            .iter()
            .any(|(k, v)| *k == numbers["number"] && matches!(v, Wire::Varint(7))),
        "{fields:?}"
    );
}

/// `NoContent` with cookies and a header added (what a handler once built
/// with the deprecated `Response::no_content()`) is described as 204 with
/// no body in `/openapi.json`, and as `google.protobuf.Empty` in the typed
/// gRPC service; a handler that returns a bare `Response` could only be
/// described as 200 with any body.
#[test]
fn no_content_with_headers_is_described_as_204_and_an_empty_message() {
    let dir = common::scratch_dir("grpc-typed-no-content");
    let path = dir.path().join("switchyard.toml");
    std::fs::write(
        &path,
        format!(
            "[[managers]]\nname = \"ctx\"\nplugin = \"{}\"\n",
            plugin("switchyard-fixture-middleware").display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["openapi", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let responses = &doc["paths"]["/ctx/set"]["get"]["responses"];
    assert!(responses.get("200").is_none(), "{responses}");
    assert!(responses["204"].is_object(), "{responses}");
    assert!(responses["204"].get("content").is_none(), "{responses}");

    let proto = proto_of(&path);
    assert!(
        proto.contains("rpc Set(Set) returns (google.protobuf.Empty);"),
        "{proto}"
    );
}
