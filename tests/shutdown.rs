//! SIGTERM: in-flight requests complete, every process exits, the runtime
//! dir is removed, and the supervisor exits 0.

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
}
