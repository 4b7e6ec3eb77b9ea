//! Supervision that a client cannot turn against the group: a handler
//! stuck forever is killed by its manager's watchdog and replaced.
//!
//! Every wait is on readiness (status, log lines, answers) and bounded by
//! PATIENCE; no test depends on how fast the machine is.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use std::time::Instant;

use common::*;

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
