//! The access log (`[log] access`) and JSON logs (`[log] format`), issue
//! 15 §2, decision 0057.

mod common;

use common::{Group, PATIENCE, eventually, get, request_with};

#[test]
fn a_request_gets_one_access_line_with_its_id_and_status() {
    let group = Group::builder("access-stdout")
        .config("[log]\naccess = \"stdout\"\n")
        .start();
    let reply = request_with(
        group.addr,
        "GET",
        "/hello/ada",
        &[("x-request-id", "acc-0001")],
        b"",
    )
    .unwrap();
    assert_eq!(reply.status, 200);
    let missing = request_with(
        group.addr,
        "GET",
        "/no/such",
        &[("x-request-id", "acc-0002")],
        b"",
    )
    .unwrap();
    assert_eq!(missing.status, 404);
    let line = eventually("the access line", PATIENCE, || {
        group
            .lines_with("id=acc-0001")
            .into_iter()
            .next()
            .ok_or("not yet")
    });
    // `listener[PID] | TIME CLIENT "METHOD PATH" STATUS BYTES DURATION id=.. trace=..`
    let (process, entry) = line.split_once(" | ").unwrap();
    assert!(process.starts_with("listener["), "{line}");
    let fields: Vec<&str> = entry.split(' ').collect();
    assert!(
        fields[0].ends_with('Z') && fields[0].contains('T'),
        "time: {line}"
    );
    assert_eq!(fields[1], "127.0.0.1", "{line}");
    assert_eq!(&fields[2..4], ["\"GET", "/hello/ada\""], "{line}");
    assert_eq!(fields[4], "200", "{line}");
    assert_eq!(fields[5], reply.body.len().to_string(), "bytes: {line}");
    assert!(fields[6].ends_with("ms"), "{line}");
    assert_eq!(fields[7], "id=acc-0001");
    assert!(
        fields[8].starts_with("trace=") && fields[8].len() == 6 + 32,
        "{line}"
    );
    let missing_line = eventually("the 404's line", PATIENCE, || {
        group
            .lines_with("id=acc-0002")
            .into_iter()
            .next()
            .ok_or("not yet")
    });
    assert!(missing_line.contains("\"GET /no/such\" 404 "), "{missing_line}");
    // One line per request.
    assert_eq!(group.lines_with("id=acc-0001").len(), 1);
}

#[test]
fn access_off_by_default() {
    let group = Group::start("access-default");
    let reply = request_with(
        group.addr,
        "GET",
        "/hello/x",
        &[("x-request-id", "acc-off-1")],
        b"",
    )
    .unwrap();
    assert_eq!(reply.status, 200);
    // Another request answered after it: its line would have come first.
    group.eventually_status("/health", 200);
    assert!(group.lines_with("\"GET /hello/x\"").is_empty());
}

#[test]
fn json_logs_and_an_access_log_file_parse() {
    let dir = common::scratch_dir("access-file");
    let file = dir.path().join("access.log");
    let mut group = Group::builder("access-json")
        .config(&format!(
            "[log]\nformat = \"json\"\naccess = \"{}\"\n",
            file.display()
        ))
        .start();
    let reply = request_with(
        group.addr,
        "GET",
        "/hello/json",
        &[("x-request-id", "json-0001")],
        b"",
    )
    .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(get(group.addr, "/nowhere").unwrap().status, 404);
    let entries = eventually("two access lines in the file", PATIENCE, || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect();
        if lines.len() >= 2 {
            Ok(lines)
        } else {
            Err(lines.len())
        }
    });
    let hello = entries
        .iter()
        .find(|e| e["request_id"] == "json-0001")
        .expect("the request's entry");
    assert_eq!(hello["status"], 200);
    assert_eq!(hello["method"], "GET");
    assert_eq!(hello["path"], "/hello/json");
    assert_eq!(hello["client"], "127.0.0.1");
    assert_eq!(hello["bytes"], reply.body.len());
    assert!(hello["duration_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(hello["trace_id"].as_str().unwrap().len(), 32);
    assert!(
        entries
            .iter()
            .any(|e| e["path"] == "/nowhere" && e["status"] == 404)
    );
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&file).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o640);
    group.terminate();
    // Every line the group printed is a JSON object but the two start-up
    // lines scripts wait for; a child's carry the process they came from.
    let lines = group.lines_with("");
    let mut from_children = 0;
    for line in &lines {
        if line.starts_with("switchyard listening on") || line.starts_with("admin on") {
            continue;
        }
        let value: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert!(value.is_object(), "{line}");
        assert!(
            value["level"].is_string() || value["message"].is_string(),
            "{line}"
        );
        if value["process"].is_string() {
            from_children += 1;
        }
    }
    assert!(
        from_children > 5,
        "{from_children} lines from children in {lines:?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("\"process\":\"listener[") && l.contains("accepting connections")),
        "{lines:?}"
    );
}

#[test]
fn a_bad_access_log_path_is_refused_at_start() {
    let out = Group::builder("access-bad")
        .config("[log]\naccess = \"/no/such/dir/access.log\"\nformat = \"yaml\"\n")
        .try_start()
        .map(|_| ())
        .unwrap_err();
    assert!(out.contains("log.format") || out.contains("format"), "{out}");
    let out = Group::builder("access-bad-dir")
        .config("[log]\naccess = \"/no/such/dir/access.log\"\n")
        .try_start()
        .map(|_| ())
        .unwrap_err();
    assert!(out.contains("log.access"), "{out}");
}

#[test]
fn reload_turns_the_access_log_on_and_reopens_its_file() {
    let dir = common::scratch_dir("access-reload");
    let config = dir.path().join("switchyard.toml");
    let file = dir.path().join("access.log");
    std::fs::write(&config, "[log]\naccess = \"off\"\n").unwrap();
    let group = Group::builder("access-reload").config_file(&config).start();
    let reload = || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["reload", "--runtime-dir"])
            .arg(&group.runtime_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    assert_eq!(
        request_with(group.addr, "GET", "/hello/a", &[("x-request-id", "rl-1")], b"")
            .unwrap()
            .status,
        200
    );
    std::fs::write(&config, format!("[log]\naccess = \"{}\"\n", file.display())).unwrap();
    reload();
    assert_eq!(
        request_with(group.addr, "GET", "/hello/b", &[("x-request-id", "rl-2")], b"")
            .unwrap()
            .status,
        200
    );
    eventually("the line after the reload", PATIENCE, || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if text.contains("id=rl-2") {
            Ok(text)
        } else {
            Err(text)
        }
    });
    assert!(!std::fs::read_to_string(&file).unwrap().contains("id=rl-1"));
    // Rotation: move the file away, reload, and the next line is in a new one.
    let rotated = dir.path().join("access.log.1");
    std::fs::rename(&file, &rotated).unwrap();
    reload();
    assert_eq!(
        request_with(group.addr, "GET", "/hello/c", &[("x-request-id", "rl-3")], b"")
            .unwrap()
            .status,
        200
    );
    eventually("the line in the new file", PATIENCE, || {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        if text.contains("id=rl-3") {
            Ok(())
        } else {
            Err(text)
        }
    });
    assert!(!std::fs::read_to_string(&rotated).unwrap().contains("id=rl-3"));
}
