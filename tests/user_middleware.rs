//! Middleware users write, in the manager of the routes it wraps, against
//! the real group: continue, answer, replace (here and in another
//! manager), redirect, the reply hook, and the crashes: a panicking
//! middleware is a 500 and the group serves on; an aborting one is a 503
//! and its manager is restarted, the listener and broker untouched.

mod common;

use common::{Group, PATIENCE, eventually, request_with};
use serde_json::json;

fn group(tag: &'static str) -> Group {
    let plugin = common::plugin("switchyard-fixture-middleware");
    let mut config = String::new();
    for (name, kind) in [
        ("plain", "plain"),
        ("wrapped", "wrapped"),
        ("aborting", "aborting"),
    ] {
        config.push_str(&format!(
            "[[managers]]\nname = \"{name}\"\nplugin = \"{}\"\nmanager = \"{kind}\"\n",
            plugin.display()
        ));
    }
    Group::builder(tag).config(&config).start()
}

fn get(group: &Group, path: &str, headers: &[(&str, &str)]) -> common::HttpResponse {
    request_with(group.addr, "GET", path, headers, b"").unwrap()
}

#[test]
fn middleware_continues_answers_replaces_and_redirects() {
    let group = group("mw-flows");
    let r = get(&group, "/mw/noop", &[]);
    assert_eq!(
        (r.status, r.header("x-wrapped")),
        (200, Some("1")),
        "{}",
        r.text()
    );
    // The session cookie becomes the scope's user id.
    let r = get(&group, "/mw/account", &[("cookie", "session=user-42")]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"user_id": 42}));
    // Without it: redirected; the query cannot stand in for the scope.
    for path in ["/mw/account", "/mw/account?user_id=1"] {
        let r = get(&group, path, &[]);
        assert_eq!((r.status, r.header("location")), (302, Some("/login")), "{path}");
    }
    let r = get(&group, "/mw/account", &[("cookie", "session=user-x")]);
    assert_eq!(r.status, 400, "{}", r.text());
    // Answered by the middleware: the handler never runs.
    let r = get(&group, "/mw/answered", &[]);
    assert_eq!(r.json(), json!({"answered_by": "middleware"}));
    // Replaced: by an event this manager serves, or another's.
    let r = get(&group, "/mw/legacy/3", &[]);
    assert_eq!(r.json(), json!({"served_by": "wrapped", "n": 3}), "{}", r.text());
    assert_eq!(r.header("x-wrapped"), Some("1"), "the reply hook saw it");
    let r = get(&group, "/mw/legacy/300", &[]);
    assert_eq!(r.json(), json!({"served_by": "plain", "n": 300}), "{}", r.text());
    // No middleware on the other manager.
    let r = get(&group, "/mw/plain", &[]);
    assert_eq!((r.status, r.header("x-wrapped")), (200, None));
}

#[test]
fn a_panicking_middleware_is_a_500_and_the_group_keeps_serving() {
    let group = group("mw-panic");
    let pid = group.pid_of("wrapped");
    for when in ["before", "after"] {
        let r = get(&group, &format!("/mw/panic/{when}"), &[]);
        assert_eq!(r.status, 500, "{when}: {}", r.text());
        assert_eq!(
            r.header("content-type"),
            Some("application/problem+json"),
            "{when}"
        );
    }
    let r = get(&group, "/mw/noop", &[]);
    assert_eq!(r.status, 200);
    assert_eq!(group.pid_of("wrapped"), pid, "caught at the plugin boundary");
    assert!(
        group
            .lines_with("panics on purpose")
            .iter()
            .any(|l| l.contains("middleware")),
        "the panic is logged"
    );
}

#[test]
fn an_aborting_middleware_is_a_503_and_its_manager_is_restarted() {
    let group = group("mw-abort");
    let (listener, broker, aborting) = (
        group.pid_of("listener"),
        group.pid_of("broker"),
        group.pid_of("aborting"),
    );
    let r = get(&group, "/mw/abort", &[]);
    assert_eq!(r.status, 503, "{}", r.text());
    // The rest of the group serves on, and the manager comes back.
    assert_eq!(get(&group, "/mw/noop", &[]).status, 200);
    group.eventually_restarted("aborting", aborting);
    eventually("/mw/alive answers again", PATIENCE, || {
        let r = get(&group, "/mw/alive", &[]);
        if r.status == 200 { Ok(()) } else { Err(r.status) }
    });
    assert_eq!(group.pid_of("listener"), listener);
    assert_eq!(group.pid_of("broker"), broker);
}
