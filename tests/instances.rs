//! Manager instances: the router spreads requests over every instance of a
//! manager, and an instance that dies fails only what it had in flight.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;

/// Pids of the running instances of manager `name`.
fn instance_pids(g: &Group, name: &str) -> HashSet<u64> {
    g.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "manager" && p["name"] == name)
        .filter_map(|p| p["pid"].as_u64())
        .collect()
}

#[test]
fn requests_reach_every_instance_and_their_workers() {
    let config = "\
[[managers]]
name = \"compute\"
instances = 2
[managers.workers]
kind = \"process\"
size = 1
";
    let g = Group::builder("instances-spread").config(config).start();
    let managers = instance_pids(&g, "compute");
    assert_eq!(managers.len(), 2);
    let status = g.status();
    let instances: Vec<u64> = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == "compute")
        .map(|p| p["instance"].as_u64().unwrap())
        .collect();
    // Two managers, then one worker of each.
    assert_eq!(instances, [0, 1, 0, 1], "{status}");

    // With nothing outstanding the instances tie, and ties go round-robin:
    // even one request at a time reaches both.
    let mut inline = HashSet::new();
    let mut pooled = HashSet::new();
    for _ in 0..8 {
        let r = get(g.addr, "/cpu-inline/1").unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        inline.insert(body["pid"].as_u64().unwrap());
        let r = get(g.addr, "/cpu/1").unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        pooled.insert(body["pid"].as_u64().unwrap());
    }
    assert_eq!(inline, managers, "/cpu-inline answered by both instances");
    assert_eq!(pooled.len(), 2, "each instance's own worker ran jobs: {pooled:?}");
    assert!(pooled.is_disjoint(&managers));
}

#[test]
fn killing_one_instance_fails_only_its_in_flight_requests() {
    // A long restart delay keeps the killed instance down for a while; the
    // deadline is far beyond the test's patience, so nothing passes as 504.
    let config = "\
[listener]
request_timeout_ms = 120000
[restart]
initial_backoff_ms = 2000
[[managers]]
name = \"payload\"
instances = 2
";
    let mut g = Group::builder("instances-kill").config(config).start();
    assert_eq!(instance_pids(&g, "payload").len(), 2);

    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (addr, stop) = (g.addr, stop.clone());
            std::thread::spawn(move || {
                let (mut ok, mut unavailable) = (0u32, 0u32);
                while !stop.load(Ordering::Relaxed) {
                    let r = get(addr, "/payload/10").expect("no connection fails");
                    match r.status {
                        200 => ok += 1,
                        503 => unavailable += 1,
                        other => panic!("unexpected status {other}: {}", r.text()),
                    }
                }
                (ok, unavailable)
            })
        })
        .collect();

    // A request in flight on one instance (its job sleeps on the thread
    // pool); its log line names the instance's pid.
    let addr = g.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/sleep/20000").unwrap());
    let line = g.wait_line("sleeping 20000 ms");
    let victim: u32 = line
        .split('[')
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid in {line:?}"));
    assert!(instance_pids(&g, "payload").contains(&(victim as u64)));
    kill(victim, Signal::SIGKILL);

    let r = in_flight.join().unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("went down"), "{}", r.text());
    // The router has dropped the dead instance (it answered the 503): the
    // survivor takes everything now.
    for _ in 0..20 {
        let r = get(g.addr, "/payload/10").unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    g.eventually_status("/ready", 200);
    eventually("the instance is restarted", PATIENCE, || {
        let pids = instance_pids(&g, "payload");
        if pids.len() < 2 || pids.contains(&(victim as u64)) {
            Err(pids)
        } else {
            Ok(())
        }
    });
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        let (ok, _unavailable) = c.join().unwrap();
        assert!(ok > 0);
    }
}
