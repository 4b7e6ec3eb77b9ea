//! The two return paths side by side (`group.return_path`, decision
//! 0143): through router and broker, and straight from the manager
//! instance into the listener pipe's return link. Both answer small,
//! large (shared-memory) and streamed bodies byte-exact, and on both the
//! router ends with nothing in flight; only the direct one opens return
//! links, and its answers do not pass through the router at all.

mod common;

use std::net::SocketAddr;

use common::*;

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The group and its admin endpoint (for `/metrics`).
fn group(tag: &'static str, config: &str, probe: &str) -> (Group, SocketAddr) {
    let mut g = Group::builder(tag)
        .config(config)
        .arg("--admin-bind")
        .arg("127.0.0.1:0")
        .start();
    let line = g.wait_line("admin on http://");
    let admin = line
        .split("admin on http://")
        .nth(1)
        .and_then(|rest| {
            rest.split(|c: char| c.is_whitespace() || c == '"' || c == '/')
                .next()
        })
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in {line}"));
    g.eventually_status(probe, 200);
    (g, admin)
}

/// The listener's open return links, from `/metrics`.
fn return_links(admin: SocketAddr) -> u64 {
    let r = get(admin, "/metrics").unwrap();
    r.text()
        .lines()
        .filter(|l| l.starts_with("switchyard_return_links"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

fn router_in_flight(g: &Group) -> Option<u64> {
    g.status()["processes"]
        .as_array()?
        .iter()
        .find(|p| p["role"] == "router")
        .and_then(|p| p["load"]["in_flight"].as_u64())
}

fn post(addr: SocketAddr, path: &str, body: &[u8]) -> HttpResponse {
    let mut req = format!(
        "POST {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\ncontent-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(body);
    raw(addr, &req).unwrap()
}

fn serves_every_kind_of_body(tag: &'static str, path: &str) {
    let config = format!("[group]\nreturn_path = \"{path}\"\n[listener]\nmax_body_bytes = 8000000\n");
    let (g, admin) = group(tag, &config, "/noop");
    for _ in 0..50 {
        let r = get(g.addr, "/noop").unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
    }
    for (i, size) in [1000usize, 64 * 1024, 1 << 20, 5 << 20].into_iter().enumerate() {
        let body = random_bytes(size, i as u64 + 3);
        let r = post(g.addr, "/echo-bytes", &body);
        assert_eq!(r.status, 200, "{path}, {size} bytes: {}", r.text());
        assert!(r.body == body, "{path}, {size} bytes: the echo differs");
    }
    let r = get(g.addr, "/payload/1048576").unwrap();
    assert_eq!((r.status, r.body.len()), (200, 1 << 20), "{path}");
    let r = get(g.addr, "/stream/300000").unwrap();
    assert_eq!((r.status, r.body.len()), (200, 300_000), "{path}");
    // Every request is closed at the router, whichever way its answer went.
    eventually("the router holds nothing in flight", PATIENCE, || {
        let n = router_in_flight(&g);
        (n == Some(0)).then_some(()).ok_or(n)
    });
    // Gauges reach `/metrics` once a second.
    if path == "direct" {
        eventually("a return link is open", PATIENCE, || {
            let links = return_links(admin);
            (links >= 1).then_some(()).ok_or(links)
        });
    } else {
        assert_eq!(return_links(admin), 0, "a return link on the router path");
    }
}

#[test]
fn both_return_paths_answer_small_large_and_streamed_bodies() {
    serves_every_kind_of_body("return-path-router", "router");
    serves_every_kind_of_body("return-path-direct", "direct");
}

/// Stops the router (SIGSTOP) while a request is with its manager: the
/// answer still reaches the client, so it did not go through the router.
/// The router is continued whatever happens.
#[test]
fn a_direct_answer_does_not_pass_through_the_router() {
    // One pipe and one instance: one return link, the one this uses.
    let config = "[group]\nreturn_path = \"direct\"\n[listener]\npipes = 1\n\
                  [[managers]]\nname = \"payload\"\ninstances = 1\n";
    let (g, admin) = group("return-path-bypass", config, "/sleep/1");
    // The instance offers its link with its first answer to the pipe.
    eventually("payload's return link is open", PATIENCE, || {
        let r = get(g.addr, "/sleep/1").unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let links = return_links(admin);
        (links >= 1).then_some(()).ok_or(links)
    });
    let addr = g.addr;
    let slow = std::thread::spawn(move || get(addr, "/sleep/1500"));
    eventually("the request is with payload", PATIENCE, || {
        let n = router_in_flight(&g);
        (n >= Some(1)).then_some(()).ok_or(n)
    });
    let router = g.pid_of("router");
    struct Continue(u32);
    impl Drop for Continue {
        fn drop(&mut self) {
            kill(self.0, Signal::SIGCONT);
        }
    }
    kill(router, Signal::SIGSTOP);
    let cont = Continue(router);
    let r = slow
        .join()
        .unwrap()
        .expect("the answer came while the router was stopped");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("slept_ms"), "{}", r.text());
    drop(cont);
    // The router, continued, learns the request is done.
    eventually("the router holds nothing in flight", PATIENCE, || {
        let n = router_in_flight(&g);
        (n == Some(0)).then_some(()).ok_or(n)
    });
}

/// The router's count of an instance's requests lags the answers given
/// straight back by a bounded amount (decision 0149), however busy the
/// router is: 32 keep-alive clients keep one manager's instance fed
/// while its cap is 512 requests in flight, sixteen times what they can
/// have, and nothing is refused. (A ring reader that always found frames
/// once kept the router's thread: it routed requests while the records
/// that close them waited on the instance's link, and the cap was
/// reached with 32 requests in flight.)
#[test]
fn a_busy_router_still_reads_the_completions_that_close_its_requests() {
    let g = Group::builder("return-path-completions")
        .config("[group]\nmax_outstanding_per_instance = 512\n")
        .start();
    g.eventually_status("/noop", 200);
    common::load::noop_load(g.addr, 48_000, 32);
}
