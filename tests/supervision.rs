//! Supervision that a client cannot turn against the group: a crash-looping
//! manager or worker is backed off and shown as such while everything else
//! keeps serving (only the core processes stop the group: tests/failures.rs),
//! and a handler stuck forever is killed by its manager's watchdog and
//! replaced.
//!
//! Every wait is on readiness (status, log lines, answers) and bounded by
//! PATIENCE; no test depends on how fast the machine is.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use common::*;

/// The status entries of the processes called `name` with role `role`.
fn entries(g: &Group, role: &str, name: &str) -> Vec<serde_json::Value> {
    g.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == role && p["name"] == name)
        .cloned()
        .collect()
}

/// Clients that keep asking `paths` until stopped, and collect every answer
/// that is not 200 (a transport error included).
struct Bystanders {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<Vec<String>>>,
}

impl Bystanders {
    fn start(g: &Group, paths: &[&'static str]) -> Bystanders {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = paths
            .iter()
            .map(|&path| {
                let (addr, stop) = (g.addr, stop.clone());
                std::thread::spawn(move || {
                    let mut bad = Vec::new();
                    let mut asked = 0;
                    while !stop.load(Ordering::Relaxed) || asked == 0 {
                        asked += 1;
                        match get(addr, path) {
                            Ok(r) if r.status == 200 => {}
                            Ok(r) => bad.push(format!("{path}: {} {}", r.status, r.text())),
                            Err(err) => bad.push(format!("{path}: {err}")),
                        }
                    }
                    bad
                })
            })
            .collect();
        Bystanders { stop, threads }
    }

    /// Stops them; every answer they got was 200.
    fn all_served(self) {
        self.stop.store(true, Ordering::Relaxed);
        let bad: Vec<String> = self.threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        assert!(bad.is_empty(), "other routes failed: {bad:#?}");
    }
}

/// A 503 for a route whose process is down says when to come back.
fn assert_retry_later(r: &HttpResponse) {
    assert_eq!(r.status, 503, "{}", r.text());
    let after = r
        .header("retry-after")
        .unwrap_or_else(|| panic!("503 without Retry-After: {r:?}"));
    assert!(after.parse::<u64>().is_ok_and(|s| s >= 1), "Retry-After: {after}");
}

#[test]
fn nineteen_quick_worker_crashes_keep_the_group_and_other_routes_up() {
    // The zero-configuration group, as the report found it: `compute` runs
    // `/crash/abort` in two worker processes.
    let g = Group::start("crash-loop-workers");
    let supervisor = g.supervisor_pid();
    let others = Bystanders::start(&g, &["/noop", "/payload/10"]);

    let mut answers = Vec::new();
    for _ in 0..19 {
        let r = get(g.addr, "/crash/abort").unwrap();
        match r.status {
            // The worker died under the job.
            502 => {}
            // No worker is up right now: come back later.
            503 => assert_retry_later(&r),
            other => panic!("/crash/abort answered {other}: {}", r.text()),
        }
        answers.push(r.status);
    }
    assert!(answers.contains(&502), "{answers:?}");
    assert!(alive(supervisor), "the supervisor stopped the group");

    // Crash on until both workers are crash-looping (the 19 may have
    // crashed one more than the other): then the pool's routes say 503
    // with Retry-After, and status shows why. Getting there takes the
    // default backoffs (10 ms doubling to 5 s, about 10 s a worker), so the
    // bound is wider than one patience.
    let deadline = Instant::now() + 2 * PATIENCE;
    loop {
        let workers = entries(&g, "worker", "compute");
        assert_eq!(workers.len(), 2);
        if workers
            .iter()
            .all(|w| w["state"] == "crash-looping" && w["crash_looping"] == true)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "workers never shown crash-looping: {workers:#?}"
        );
        let r = get(g.addr, "/crash/abort").unwrap();
        assert!(matches!(r.status, 502 | 503), "{}", r.text());
    }
    assert_retry_later(&get(g.addr, "/cpu/1").unwrap());
    // The manager itself never went down.
    let manager = entries(&g, "manager", "compute");
    assert_eq!(manager[0]["state"], "running");
    assert_eq!(manager[0]["restarts"], 0);

    others.all_served();
    assert!(alive(supervisor));
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[test]
fn a_crash_looping_manager_is_backed_off_and_shown_and_comes_back() {
    // Two restarts a minute are allowed; the third crash makes `basics`
    // crash-looping, restarted after 10 s instead of stopping the group.
    let config = "[restart]\nmax_restarts = 2\nwindow_s = 60\ncrash_loop_backoff_ms = 10000\n";
    let g = Group::builder("crash-loop-manager").config(config).start();
    let supervisor = g.supervisor_pid();
    let others = Bystanders::start(&g, &["/payload/10"]);
    for _ in 0..2 {
        let old = g.kill9("basics");
        g.eventually_restarted("basics", old);
    }
    g.kill9("basics");

    let deadline = Instant::now() + PATIENCE;
    let basics = loop {
        let basics = entries(&g, "manager", "basics").remove(0);
        if basics["state"] == "crash-looping" {
            break basics;
        }
        assert!(Instant::now() < deadline, "never shown crash-looping: {basics:#}");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(basics["crash_looping"], true, "{basics:#}");
    assert!(basics["pid"].is_null(), "{basics:#}");
    assert_eq!(basics["restarts"], 3, "{basics:#}");
    // Its routes: 503 at once, not a hang — with Retry-After once the
    // router has seen the connection close. The supervisor may show the
    // state a moment before that, and a request routed in that moment is
    // answered "went down while handling" (503 without Retry-After: it
    // was sent to the process, so a retry is the client's call).
    let answer = eventually(
        "the router refuses basics' routes with Retry-After",
        PATIENCE,
        || {
            let r = get(g.addr, "/noop").unwrap();
            assert_eq!(r.status, 503, "{}", r.text());
            if r.header("retry-after").is_some() {
                Ok(r)
            } else {
                Err(r.text())
            }
        },
    );
    assert_retry_later(&answer);
    assert!(alive(supervisor));

    // It is restarted after its long delay, and serves again.
    g.eventually_status("/noop", 200);
    let basics = entries(&g, "manager", "basics").remove(0);
    assert_eq!(basics["state"], "running", "{basics:#}");
    others.all_served();
    assert!(alive(supervisor));
}

/// The `stuck` fixture's manager, with a 1 s watchdog.
fn stuck_config(extra: &str) -> String {
    let plugin = plugin("switchyard-fixture-stuck");
    format!(
        "[listener]\nrequest_timeout_ms = 120000\n\
         [group]\nhandler_timeout_ms = 1000\n{extra}\n\
         [[managers]]\nname = \"basics\"\n\
         [[managers]]\nname = \"stuck\"\nplugin = \"{}\"\n",
        plugin.display()
    )
}

#[test]
fn a_handler_stuck_forever_is_killed_by_the_watchdog_and_replaced() {
    let mut g = Group::builder("watchdog").config(&stuck_config("")).start();
    let before = g.pid_of("stuck");
    let others = Bystanders::start(&g, &["/noop"]);

    // The request in flight gets 503 when the watchdog kills its manager.
    let r = get(g.addr, "/hang").unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    assert!(r.text().contains("went down"), "{}", r.text());
    let line = g.wait_line("watchdog: ");
    assert!(
        line.contains("stuck.Hang"),
        "the log names the handler's event type: {line}"
    );
    assert!(line.contains(&format!("[{before}]")), "{line}");
    // Gone: its sockets closed as it exited, which may be a moment before
    // it is a zombie.
    let deadline = Instant::now() + PATIENCE;
    while alive(before) {
        assert!(Instant::now() < deadline, "the stuck process {before} lives on");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }

    // Replaced, and serving.
    g.eventually_restarted("stuck", before);
    g.eventually_status("/alive", 200);
    others.all_served();
}
