//! Failures are answered at once and the rest of the group keeps serving:
//! panics, killed managers, killed router, broker and listener, and the
//! restart-intensity limit of the core processes. An answer the group made
//! itself names the hop that made it (`switchyard-error`, decision 0116); a
//! handler's own does not.
//!
//! The request deadline is set far beyond the test's patience, so a request
//! that waited for its deadline would fail the test instead of passing as 504.

mod common;

use common::*;
use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

const LONG_DEADLINE: &str = "[listener]\nrequest_timeout_ms = 120000\n";

#[test]
fn a_panicking_handler_gets_500_and_the_manager_stays_up() {
    let g = Group::builder("panic").config(LONG_DEADLINE).start();
    let before = g.pid_of("basics");
    let r = get(g.addr, "/panic").unwrap();
    assert_eq!(r.status, 500);
    assert!(
        !r.text().contains("on purpose"),
        "panic detail must not leak: {}",
        r.text()
    );
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
    assert_eq!(g.pid_of("basics"), before);
}

#[test]
fn a_killed_manager_fails_its_requests_with_503_and_others_keep_serving() {
    // A long restart delay keeps the manager down long enough to look at.
    let config = format!("{LONG_DEADLINE}[restart]\ninitial_backoff_ms = 3000\n");
    let mut g = Group::builder("kill-manager").config(&config).start();
    let addr = g.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/sleep/20000").unwrap());
    g.wait_line("sleeping 20000 ms");
    g.kill9("payload");

    let r = in_flight.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("went down"), "{}", r.text());
    // While it is down: its routes get 503 at once, the other manager serves.
    let r = get(g.addr, "/payload/10").unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
    assert_eq!(get(g.addr, "/ready").unwrap().status, 503);
    // And it comes back.
    g.eventually_status("/payload/10", 200);
    g.eventually_status("/ready", 200);
}

/// Clients hammer `/noop` while `victim` is killed: every answer is 200 or
/// 503 (none waits for a deadline), and the group serves again afterwards.
fn survive_kill(tag: &'static str, victim: &str, allow_transport_errors: bool) {
    let g = Group::builder(tag).config(LONG_DEADLINE).start();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (addr, stop) = (g.addr, stop.clone());
            std::thread::spawn(move || {
                let (mut ok, mut unavailable, mut transport) = (0u32, 0u32, 0u32);
                while !stop.load(Ordering::Relaxed) {
                    match get(addr, "/noop") {
                        Ok(r) if r.status == 200 => ok += 1,
                        Ok(r) if r.status == 503 => unavailable += 1,
                        Ok(r) => panic!("unexpected status {} {}", r.status, r.text()),
                        Err(_) => transport += 1,
                    }
                }
                (ok, unavailable, transport)
            })
        })
        .collect();
    g.eventually_status("/noop", 200);
    let old = g.kill9(victim);
    // Serving again, by a new process.
    g.eventually_restarted(victim, old);
    g.eventually_status("/ready", 200);
    g.eventually_status("/noop", 200);
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let (ok, _unavailable, transport) = c.join().unwrap();
        assert!(ok > 0);
        if !allow_transport_errors {
            assert_eq!(transport, 0, "connections must not fail when {victim} dies");
        }
    }
    let restarts = g.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == victim)
        .unwrap()["restarts"]
        .as_u64()
        .unwrap();
    assert_eq!(restarts, 1);
}

#[test]
fn the_group_survives_kill_9_of_a_manager_under_load() {
    survive_kill("kill-basics", "basics", false);
}

#[test]
fn the_group_survives_kill_9_of_the_router() {
    survive_kill("kill-router", "router", false);
}

#[test]
fn the_group_survives_kill_9_of_the_broker() {
    survive_kill("kill-broker", "broker", false);
}

#[test]
fn the_group_survives_kill_9_of_the_listener() {
    // Connections held by the killed listener are reset; new ones queue on
    // the supervisor-held socket until the new listener accepts them.
    survive_kill("kill-listener", "listener", true);
}

/// Past its restart intensity a core process (here the router) stops the
/// group; a manager or worker only crash-loops (tests/supervision.rs).
#[test]
fn too_many_restarts_of_a_core_process_stop_the_group_with_an_error() {
    let config = "[restart]\nmax_restarts = 2\nwindow_s = 60\n";
    let mut g = Group::builder("intensity").config(config).start();
    for _ in 0..2 {
        let old = g.kill9("router");
        g.eventually_restarted("router", old);
        g.eventually_status("/noop", 200);
    }
    g.kill9("router");
    g.wait_line("restarts within 60 s");
    let status = g.terminate();
    assert_eq!(
        status.code(),
        Some(1),
        "the supervisor reports the failure in its exit code"
    );
}

/// The hop `r` says made it, in the header and in the problem member; both
/// must agree.
fn hop_of(r: &HttpResponse) -> Option<String> {
    let header = r.header("switchyard-error").map(str::to_owned);
    let member = serde_json::from_slice::<serde_json::Value>(&r.body)
        .ok()
        .and_then(|v| v["hop"].as_str().map(str::to_owned));
    assert_eq!(header, member, "header and problem member agree: {}", r.text());
    header
}

/// Asserts `r` is the group's `status` answer made by `hop`, with
/// `Retry-After: 1` when `retry` is set and none otherwise.
#[track_caller]
fn assert_refusal(r: &HttpResponse, status: u16, hop: &str, retry: bool) {
    assert_eq!(r.status, status, "{}", r.text());
    assert_eq!(hop_of(r).as_deref(), Some(hop), "{}", r.text());
    assert_eq!(r.header("retry-after"), retry.then_some("1"), "{}", r.text());
}

#[test]
fn the_listeners_own_answers_name_the_listener() {
    let g = Group::builder("hop-listener")
        .config("[listener]\nmax_connections = 1\nidle_timeout_ms = 600000\n")
        .start();
    // No route: the listener's 404, nothing to wait for.
    let r = get(g.addr, "/no/such/route").unwrap();
    assert_refusal(&r, 404, "listener", false);
    // Over the connection limit: its 503, come back in a second.
    let _held = std::net::TcpStream::connect(g.addr).unwrap();
    let mut over = std::net::TcpStream::connect(g.addr).unwrap();
    over.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut got = Vec::new();
    over.read_to_end(&mut got)
        .expect("refused and closed, not left hanging");
    let r = parse_response(&got).unwrap();
    assert_refusal(&r, 503, "listener", true);
}

#[test]
fn the_brokers_refusal_names_the_broker() {
    // A long restart delay keeps the router down long enough to look.
    let config = format!("{LONG_DEADLINE}[restart]\ninitial_backoff_ms = 5000\n");
    let g = Group::builder("hop-broker").config(&config).start();
    g.kill9("router");
    let r = eventually("the broker refuses for the missing router", PATIENCE, || {
        let r = get(g.addr, "/noop").map_err(|e| e.to_string())?;
        if r.header("switchyard-error") == Some("broker") {
            Ok(r)
        } else {
            Err(format!("{} {:?}", r.status, r.header("switchyard-error")))
        }
    });
    assert_refusal(&r, 503, "broker", true);
    assert!(r.text().contains("router is not available"), "{}", r.text());
}

#[test]
fn the_routers_refusal_names_the_router() {
    let config = format!("{LONG_DEADLINE}[restart]\ninitial_backoff_ms = 5000\n");
    let g = Group::builder("hop-router").config(&config).start();
    g.kill9("payload");
    g.eventually_status("/payload/10", 503);
    let r = get(g.addr, "/payload/10").unwrap();
    assert_refusal(&r, 503, "router", true);
    assert!(
        r.text().contains("manager `payload` is not running"),
        "{}",
        r.text()
    );
}

#[test]
fn the_manager_hosts_refusal_names_the_manager_host() {
    // A response body past the manager's shared-memory budget cannot be
    // handed over: the manager's process answers 503 itself.
    let config = format!("{LONG_DEADLINE}max_body_bytes = 65536\n[group]\nshm_budget_bytes = 200000\n");
    let g = Group::builder("hop-host").config(&config).start();
    let r = get(g.addr, "/payload/300000?copy=true").unwrap();
    assert_refusal(&r, 503, "manager-host", true);
    assert!(r.text().contains("response body unavailable"), "{}", r.text());
    // The manager keeps serving what fits.
    assert_eq!(get(g.addr, "/payload/100").unwrap().status, 200);
}

fn shop(tag: &'static str, extra: &str) -> Group {
    let p = plugin("switchyard-example-shop");
    let config = format!(
        "{LONG_DEADLINE}{extra}\n[[managers]]\nname = \"orders\"\nplugin = \"{p}\"\n[[managers]]\nname = \"inventory\"\nplugin = \"{p}\"\n[managers.config]\nstock = {{ apple = 10 }}\n",
        p = p.display()
    );
    Group::builder(tag).config(&config).start()
}

#[test]
fn a_handlers_own_error_carries_no_hop() {
    let g = shop("hop-none", "");
    // The inventory's own 409, forwarded by orders with `?`: as it was said.
    let r = request(
        g.addr,
        "POST",
        "/orders",
        br#"{"sku":"apple","qty":50,"customer_id":1}"#,
    )
    .unwrap();
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(hop_of(&r), None, "{}", r.text());
    assert!(r.text().contains("left"), "the callee's message: {}", r.text());
    // A handler's own 404 next to the listener's.
    let r = get(g.addr, "/orders/999").unwrap();
    assert_eq!((r.status, hop_of(&r)), (404, None), "{}", r.text());
    let r = get(g.addr, "/no/such/route").unwrap();
    assert_eq!(
        (r.status, hop_of(&r).as_deref()),
        (404, Some("listener")),
        "{}",
        r.text()
    );
}

#[test]
fn a_failed_call_forwarded_with_question_mark_does_not_leak_topology() {
    let g = shop("hop-forward", "[restart]\ninitial_backoff_ms = 5000\n");
    g.kill9("inventory");
    g.eventually_status("/inventory/apple", 503);
    // Called directly, the router's refusal says what is wrong.
    let direct = get(g.addr, "/inventory/apple").unwrap();
    assert_refusal(&direct, 503, "router", true);
    assert!(direct.text().contains("inventory"), "{}", direct.text());
    // Through orders' `cx.call(..).await?`: fast, generic, marked, and
    // without the callee's name.
    let r = request(
        g.addr,
        "POST",
        "/orders",
        br#"{"sku":"apple","qty":1,"customer_id":1}"#,
    )
    .unwrap();
    assert_refusal(&r, 503, "router", true);
    assert!(!r.text().contains("inventory"), "topology leaked: {}", r.text());
    assert!(!r.text().contains("not running"), "topology leaked: {}", r.text());
}
