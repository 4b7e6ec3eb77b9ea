//! SIGTERM: in-flight requests complete, every process exits, the runtime
//! dir is removed, and the supervisor exits 0; a process that overruns its
//! stop is killed and named.

mod common;

use common::*;

#[test]
fn sigterm_drains_in_flight_requests_and_leaves_nothing_behind() {
    let mut g = Group::start("shutdown");
    let pids = g.all_pids();
    // supervisor, broker, router, store, scheduler, basics, payload,
    // compute and its two worker processes, ticker, listener.
    assert_eq!(pids.len(), 12);
    let addr = g.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/sleep/1000").unwrap());
    g.wait_line("sleeping 1000 ms");

    let status = g.terminate();
    assert!(status.success(), "exit status {status:?}");
    let r = in_flight.join().unwrap();
    assert_eq!(r.status, 200, "the in-flight request completed: {}", r.text());
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived the group");
    }
    assert!(
        !g.runtime_dir.exists(),
        "runtime dir {} left behind",
        g.runtime_dir.display()
    );
    // The port is closed.
    assert!(std::net::TcpStream::connect(addr).is_err());
    // A planned stop is no failure: neither a manager's leaving nor the
    // router's is logged as a warning (each says it left as planned).
    let warned: Vec<String> = g
        .lines_with("manager disconnected")
        .into_iter()
        .chain(g.lines_with("router connection lost"))
        .collect();
    assert!(warned.is_empty(), "{warned:#?}");
    assert!(g.has_line("manager left after draining"));
}

#[test]
fn a_stop_that_overruns_names_the_process_it_kills() {
    // A manager stuck in a handler cannot stop when told to; its watchdog
    // is set far beyond the test, so only the supervisor's patience ends it.
    let plugin = plugin("switchyard-fixture-stuck");
    let config = format!(
        "[listener]\nrequest_timeout_ms = 120000\n[group]\nhandler_timeout_ms = 600000\nshutdown_grace_ms = 500\n\
         [[managers]]\nname = \"stuck\"\nplugin = \"{}\"\n",
        plugin.display()
    );
    let mut g = Group::builder("shutdown-overrun").config(&config).start();
    let pids = g.all_pids();
    let stuck = g.pid_of("stuck");
    let addr = g.addr;
    let hung = std::thread::spawn(move || get(addr, "/hang"));
    g.wait_line("a handler hangs from now on");

    let status = g.terminate();
    assert!(status.success(), "{status:?}");
    let line = g.wait_line("did not stop within");
    assert!(
        line.contains("manager `stuck`")
            && line.contains(&format!("pid {stuck}"))
            && line.contains("killing it"),
        "the log names the process it kills: {line}"
    );
    g.wait_line("stopped cause=SIGTERM");
    // Its client was answered (503 when its manager went) or cut, not left
    // waiting.
    let answer = hung.join().unwrap();
    assert!(answer.as_ref().map_or(true, |r| r.status == 503), "{answer:?}");
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived the group");
    }
    assert!(!g.runtime_dir.exists());
}
