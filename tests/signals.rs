//! No signal ends the group silently: SIGHUP reloads the configuration
//! (tests/reload.rs has the rest), the signals Switchyard gives no meaning
//! are logged and ignored by the supervisor, children ignore SIGHUP,
//! SIGQUIT stops at once but cleanly, and every stop names its cause.

mod common;

use common::*;

#[test]
fn sighup_reloads_in_the_supervisor_and_is_ignored_by_every_child() {
    let mut g = Group::start("sighup");
    let pids = g.all_pids();
    let supervisor = g.supervisor_pid();

    kill(supervisor, Signal::SIGHUP);
    let line = g.wait_line("SIGHUP");
    assert!(line.contains("reloading"), "{line}");
    // The zero-configuration group has nothing to change.
    let line = g.wait_line("reloaded:");
    assert!(line.contains("no manager or setting changed"), "{line}");
    // A hang-up sent to the children themselves (`kill -HUP`, or to their
    // process groups) does not kill them either.
    for &pid in pids.iter().filter(|&&p| p != supervisor) {
        kill(pid, Signal::SIGHUP);
    }
    // Another signal with no meaning for Switchyard: logged, ignored.
    kill(supervisor, Signal::SIGUSR1);
    g.wait_line("SIGUSR1");
    // The supervisor handles its signals in order: once it answers status,
    // it has been through both.
    assert_eq!(g.all_pids(), pids, "every process is still the same one");
    for pid in &pids {
        assert!(alive(*pid), "process {pid} died of SIGHUP");
    }
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
    assert_eq!(get(g.addr, "/ready").unwrap().status, 200);

    let status = g.terminate();
    assert!(status.success(), "{status:?}");
    g.wait_line("stopped cause=SIGTERM");
    assert!(!g.runtime_dir.exists());
}

#[test]
fn sigquit_stops_at_once_and_still_cleans_up() {
    let mut g = Group::start("sigquit");
    let pids = g.all_pids();
    let addr = g.addr;
    let in_flight = std::thread::spawn(move || get(addr, "/sleep/20000"));
    g.wait_line("sleeping 20000 ms");

    let status = g.stop_with(Signal::SIGQUIT);
    assert!(status.success(), "{status:?}");
    g.wait_line("stopped cause=SIGQUIT");
    // No drain: the request in flight was cut, not waited for.
    let cut = in_flight.join().unwrap();
    assert!(cut.as_ref().map_or(true, |r| r.status != 200), "{cut:?}");
    for pid in pids {
        assert!(!alive(pid), "process {pid} outlived the group");
    }
    assert!(!g.runtime_dir.exists());
}
