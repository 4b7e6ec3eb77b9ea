//! The admin endpoint's `/metrics`: Prometheus text for the whole group,
//! counters that move by exactly the requests sent, restarts, bounded
//! labels (decision 0055).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use common::{Group, PATIENCE, eventually, get};

/// Starts the demo group with `--admin-bind 127.0.0.1:0`; returns it and
/// the admin address it bound (from its readiness file).
fn group_with_admin(tag: &'static str) -> (Group, SocketAddr) {
    let group = Group::builder(tag).arg("--admin-bind").arg("127.0.0.1:0").start();
    let addr = group.ready.admin.expect("the admin endpoint is on");
    (group, addr)
}

/// One sample: metric name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses the Prometheus text format (0.0.4) strictly: every line is a
/// `# HELP`, a `# TYPE` or a sample; every sample belongs to a family
/// declared by a `TYPE` line before it (histograms through their
/// `_bucket`, `_sum` and `_count`, counters ending in `_total`); names and
/// label names are well formed; label values are quoted with only `\\`,
/// `\"` and `\n` escaped; values are numbers; no series appears twice.
fn parse(text: &str) -> Vec<Sample> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c.is_ascii_alphabetic() || c == '_' || c == ':' || (i > 0 && c.is_ascii_digit())
            })
    };
    let mut types: BTreeMap<String, String> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    assert!(text.ends_with('\n'), "the exposition ends with a newline");
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap(), parts.next().unwrap_or(""));
            assert!(name_ok(name), "bad name in {line:?}");
            match kind {
                "HELP" => assert!(parts.next().is_some_and(|h| !h.is_empty()), "{line:?}"),
                "TYPE" => {
                    let t = parts.next().unwrap_or("");
                    assert!(
                        ["counter", "gauge", "histogram", "summary", "untyped"].contains(&t),
                        "{line:?}"
                    );
                    assert!(
                        types.insert(name.to_owned(), t.to_owned()).is_none(),
                        "TYPE twice: {line:?}"
                    );
                }
                _ => panic!("unexpected comment {line:?}"),
            }
            continue;
        }
        assert!(!line.is_empty(), "empty line in the exposition");
        let (name, rest) = match line.find(['{', ' ']) {
            Some(i) => line.split_at(i),
            None => panic!("no value: {line:?}"),
        };
        assert!(name_ok(name), "bad metric name in {line:?}");
        let mut labels = BTreeMap::new();
        let rest = if let Some(body) = rest.strip_prefix('{') {
            let mut i = 0;
            loop {
                if body[i..].starts_with('}') {
                    i += 1;
                    break;
                }
                let eq = i + body[i..].find('=').expect("label =");
                let key = &body[i..eq];
                assert!(
                    name_ok(key) && !key.contains(':'),
                    "bad label name {key:?} in {line:?}"
                );
                assert_eq!(&body[eq + 1..eq + 2], "\"", "unquoted label value in {line:?}");
                let mut value = String::new();
                i = eq + 2;
                loop {
                    let c = body[i..].chars().next().expect("unterminated label value");
                    i += c.len_utf8();
                    match c {
                        '"' => break,
                        '\\' => {
                            let e = body[i..].chars().next().unwrap();
                            i += 1;
                            value.push(match e {
                                '\\' => '\\',
                                '"' => '"',
                                'n' => '\n',
                                other => panic!("bad escape \\{other} in {line:?}"),
                            });
                        }
                        c => value.push(c),
                    }
                }
                assert!(
                    labels.insert(key.to_owned(), value).is_none(),
                    "label twice in {line:?}"
                );
                match &body[i..i + 1] {
                    "," => i += 1,
                    "}" => {
                        i += 1;
                        break;
                    }
                    other => panic!("unexpected {other:?} after a label in {line:?}"),
                }
            }
            &body[i..]
        } else {
            rest
        };
        let value_text = rest
            .strip_prefix(' ')
            .unwrap_or_else(|| panic!("no space before the value: {line:?}"));
        let value: f64 = match value_text {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|base| types.get(*base).is_some_and(|t| t == "histogram"))
            })
            .unwrap_or(name);
        let kind = types
            .get(family)
            .unwrap_or_else(|| panic!("sample before its TYPE line: {line:?}"));
        if kind == "counter" {
            assert!(
                name.ends_with("_total"),
                "a counter's name ends in _total: {line:?}"
            );
            assert!(value >= 0.0, "{line:?}");
        }
        if name.ends_with("_bucket") {
            assert!(labels.contains_key("le"), "a bucket has `le`: {line:?}");
        }
        let key = format!("{name}{labels:?}");
        assert!(seen.insert(key), "series twice: {line:?}");
        out.push(Sample {
            name: name.to_owned(),
            labels,
            value,
        });
    }
    out
}

fn scrape(admin: SocketAddr) -> Vec<Sample> {
    let reply = get(admin, "/metrics").unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply
            .header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        reply.header("content-type")
    );
    parse(&reply.text())
}

/// The value of the one sample of `name` whose labels include `want`
/// (0 when there is none).
fn value(samples: &[Sample], name: &str, want: &[(&str, &str)]) -> f64 {
    let found: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && want
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert!(
        found.len() <= 1,
        "several series match {name} {want:?}: {found:?}"
    );
    found.first().map_or(0.0, |s| s.value)
}

const HELLO: [(&str, &str); 3] = [("route", "/hello/{name}"), ("method", "GET"), ("status", "200")];
const NOT_FOUND: [(&str, &str); 3] = [("route", "unmatched"), ("method", "GET"), ("status", "404")];

#[test]
fn counters_move_by_exactly_the_requests_sent() {
    let (group, admin) = group_with_admin("metrics-count");
    let before = scrape(admin);
    let hello_before = value(&before, "switchyard_http_requests_total", &HELLO);
    for i in 0..25 {
        assert_eq!(get(group.addr, &format!("/hello/n{i}")).unwrap().status, 200);
    }
    for i in 0..3 {
        assert_eq!(get(group.addr, &format!("/no/such/{i}")).unwrap().status, 404);
    }
    // Figures reach the supervisor within a second or so.
    let after = eventually("the requests counted", PATIENCE, || {
        let now = scrape(admin);
        let hello = value(&now, "switchyard_http_requests_total", &HELLO) - hello_before;
        let missing = value(&now, "switchyard_http_requests_total", &NOT_FOUND);
        if hello >= 25.0 && missing >= 3.0 {
            Ok(now)
        } else {
            Err(format!("{hello} hello, {missing} not found"))
        }
    });
    // Exactly: nothing else was sent (a second scrape cannot add any).
    std::thread::sleep(Duration::from_millis(1500));
    let settled = scrape(admin);
    for samples in [&after, &settled] {
        assert_eq!(
            value(samples, "switchyard_http_requests_total", &HELLO) - hello_before,
            25.0
        );
        assert_eq!(value(samples, "switchyard_http_requests_total", &NOT_FOUND), 3.0);
    }
    let route = [("route", "/hello/{name}"), ("method", "GET")];
    let count = value(&settled, "switchyard_http_request_duration_seconds_count", &route);
    assert_eq!(count - hello_before, 25.0);
    let inf = value(
        &settled,
        "switchyard_http_request_duration_seconds_bucket",
        &[("route", "/hello/{name}"), ("method", "GET"), ("le", "+Inf")],
    );
    assert_eq!(inf, count, "the +Inf bucket holds every request");
    let sum = value(&settled, "switchyard_http_request_duration_seconds_sum", &route);
    assert!(sum > 0.0 && sum < 25.0 * 30.0, "{sum}");
    // Every process of the group is there, with its memory and CPU.
    let status = group.status();
    for p in status["processes"].as_array().unwrap() {
        let labels = [
            ("role", p["role"].as_str().unwrap()),
            ("name", p["name"].as_str().unwrap()),
        ];
        assert!(
            settled
                .iter()
                .any(|s| s.name == "switchyard_process_resident_memory_bytes"
                    && labels.iter().all(|(k, v)| s.labels[*k] == *v)
                    && s.value > 0.0),
            "no memory for {p}"
        );
    }
    let listener = [("role", "listener"), ("name", "listener"), ("replica", "0")];
    assert_eq!(value(&settled, "switchyard_process_up", &listener), 1.0);
    assert!(value(&settled, "switchyard_process_cpu_seconds_total", &listener) >= 0.0);
    // The supervisor's own figures, and a worker pool's size.
    assert!(
        settled
            .iter()
            .any(|s| s.name == "switchyard_workers" && s.value > 0.0)
    );
    assert!(settled.iter().any(|s| s.name == "switchyard_shm_bytes_in_use"));
    assert!(
        settled
            .iter()
            .any(|s| s.name == "switchyard_websocket_subscriptions")
    );
}

#[test]
fn restarts_count_after_a_manager_is_killed() {
    let (group, admin) = group_with_admin("metrics-restarts");
    let basics = [("role", "manager"), ("name", "basics"), ("replica", "0")];
    assert_eq!(
        value(&scrape(admin), "switchyard_process_restarts_total", &basics),
        0.0
    );
    let old = group.kill9("basics");
    group.eventually_restarted("basics", old);
    eventually("the restart counted", PATIENCE, || {
        let samples = scrape(admin);
        let restarts = value(&samples, "switchyard_process_restarts_total", &basics);
        let up = value(&samples, "switchyard_process_up", &basics);
        if restarts == 1.0 && up == 1.0 {
            Ok(())
        } else {
            Err(format!("{restarts} restarts, up {up}"))
        }
    });
}

#[test]
fn labels_stay_bounded_under_a_thousand_distinct_paths() {
    let (group, admin) = group_with_admin("metrics-cardinality");
    let series = |samples: &[Sample]| {
        samples
            .iter()
            .filter(|s| s.name.starts_with("switchyard_http_"))
            .count()
    };
    let before = series(&scrape(admin));
    for i in 0..1000 {
        let reply = get(group.addr, &format!("/probe/{i}/x{}", i * 7)).unwrap();
        assert_eq!(reply.status, 404);
    }
    let samples = eventually("the 404s counted", PATIENCE, || {
        let samples = scrape(admin);
        match value(&samples, "switchyard_http_requests_total", &NOT_FOUND) {
            1000.0 => Ok(samples),
            other => Err(other),
        }
    });
    // One counter, one histogram (18 buckets, sum, count) for all of them.
    let added = series(&samples) - before;
    assert!(added <= 21, "{added} series for 1000 paths");
    assert!(
        !samples
            .iter()
            .any(|s| s.labels.values().any(|v| v.starts_with("/probe/")))
    );
}

#[test]
fn counters_never_go_back_when_a_listener_restarts() {
    let (group, admin) = group_with_admin("metrics-listener-restart");
    for i in 0..10 {
        assert_eq!(get(group.addr, &format!("/hello/a{i}")).unwrap().status, 200);
    }
    eventually("ten counted", PATIENCE, || {
        match value(&scrape(admin), "switchyard_http_requests_total", &HELLO) {
            10.0 => Ok(()),
            other => Err(other),
        }
    });
    let old = group.kill9("listener");
    group.eventually_restarted("listener", old);
    group.eventually_status("/hello/again", 200);
    eventually(
        "the new listener's added to the old one's",
        PATIENCE,
        || match value(&scrape(admin), "switchyard_http_requests_total", &HELLO) {
            v if v >= 11.0 => Ok(()),
            other => Err(other),
        },
    );
}

#[test]
fn the_admin_endpoint_answers_only_what_it_serves() {
    let (_group, admin) = group_with_admin("metrics-admin");
    assert_eq!(get(admin, "/nope").unwrap().status, 404);
    let post = common::request(admin, "POST", "/metrics", b"").unwrap();
    assert_eq!(post.status, 405);
    let status = get(admin, "/api/status").unwrap().json();
    assert!(status["processes"].as_array().unwrap().len() > 3);
}

#[test]
fn request_metrics_can_be_turned_off() {
    let mut group = Group::builder("metrics-off")
        .config("[admin]\nbind = \"127.0.0.1:0\"\n\n[metrics]\nenabled = false\n")
        .start();
    let line = group.wait_line("admin on http://");
    let admin: SocketAddr = line.rsplit("http://").next().unwrap().trim().parse().unwrap();
    for i in 0..5 {
        assert_eq!(get(group.addr, &format!("/hello/off{i}")).unwrap().status, 200);
    }
    // The listener's in-flight gauge is reported with the same tick as
    // request figures: once it is there, so would they be.
    let listener = [("role", "listener"), ("name", "listener"), ("replica", "0")];
    eventually("the listener's figures reported", PATIENCE, || {
        let samples = scrape(admin);
        if samples
            .iter()
            .any(|s| s.name == "switchyard_websocket_connections" && s.labels["role"] == "listener")
        {
            Ok(samples)
        } else {
            Err("not yet")
        }
    });
    std::thread::sleep(Duration::from_millis(1200));
    let samples = scrape(admin);
    assert_eq!(value(&samples, "switchyard_process_up", &listener), 1.0);
    assert!(
        !samples.iter().any(|s| s.name.starts_with("switchyard_http_")),
        "request series with metrics off"
    );
}

#[test]
fn the_admin_endpoint_is_handed_over_by_an_upgrade() {
    let (mut group, admin) = group_with_admin("metrics-upgrade");
    let old = group.supervisor_pid();
    let upgraded = common::upgrade(&group.runtime_dir);
    let new = upgraded.pid;
    assert_ne!(new, old);
    assert!(group.wait_exit().success());
    // The same address, now the new supervisor's.
    eventually("the new supervisor's /api/status", PATIENCE, || {
        let status = get(admin, "/api/status").map_err(|e| e.to_string())?.json();
        let supervisor = status["processes"][0]["pid"].as_u64();
        if supervisor == Some(u64::from(new)) {
            Ok(())
        } else {
            Err(format!("{supervisor:?}"))
        }
    });
    assert!(!scrape(admin).is_empty());
}
