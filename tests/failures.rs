//! Failures are answered at once and the rest of the group keeps serving:
//! panics, killed managers, killed router, broker and listener, and the
//! restart-intensity limit of the core processes.
//!
//! The request deadline is set far beyond the test's patience, so a request
//! that waited for its deadline would fail the test instead of passing as 504.

mod common;

use common::*;
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
