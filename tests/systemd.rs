//! The supervisor under systemd's notification protocol, with a fake
//! `NOTIFY_SOCKET` the test binds: `READY=1` once the group serves,
//! `WATCHDOG=1` at half of `WATCHDOG_USEC`, `RELOADING=1` then `READY=1`
//! around a reload, `STOPPING=1` when it drains; and no child can speak
//! for the service (their environment has no `NOTIFY_SOCKET`).

mod common;

use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};

use common::*;

/// The datagrams received so far, in order.
fn listen(socket: UnixDatagram) -> Arc<Mutex<Vec<String>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let store = seen.clone();
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        while let Ok(n) = socket.recv(&mut buf) {
            store
                .lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    });
    seen
}

/// The index of the first message after `from` with the line `line`.
fn position(seen: &Mutex<Vec<String>>, from: usize, line: &str) -> Result<usize, Vec<String>> {
    let seen = seen.lock().unwrap();
    seen.iter()
        .enumerate()
        .skip(from)
        .find(|(_, m)| m.lines().any(|l| l == line))
        .map(|(i, _)| i)
        .ok_or_else(|| seen.clone())
}

#[test]
fn ready_watchdog_reloading_and_stopping_reach_systemd() {
    let dir = scratch_dir("notify");
    let path = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&path).unwrap();
    let seen = listen(socket);
    let mut g = Group::builder("systemd")
        .config("[[managers]]\nname = \"basics\"\n")
        .env("NOTIFY_SOCKET", path.to_str().unwrap())
        // Every 100 ms, then.
        .env("WATCHDOG_USEC", "200000")
        .start();

    let ready = eventually("READY=1", PATIENCE, || position(&seen, 0, "READY=1"));
    eventually("three WATCHDOG=1 after READY=1", PATIENCE, || {
        let seen = seen.lock().unwrap();
        let pings = seen[ready..]
            .iter()
            .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
            .count();
        if pings >= 3 { Ok(()) } else { Err(pings) }
    });

    // No child may tell systemd anything.
    let listener = g.pid_of("listener");
    let environ = std::fs::read(format!("/proc/{listener}/environ")).unwrap();
    let environ = String::from_utf8_lossy(&environ);
    assert!(!environ.contains("NOTIFY_SOCKET"), "a child has NOTIFY_SOCKET");
    assert!(!environ.contains("WATCHDOG_USEC"));

    // A reload (SIGHUP): RELOADING=1 with the monotonic time, then READY=1.
    kill(g.supervisor_pid(), Signal::SIGHUP);
    let reloading = eventually("RELOADING=1", PATIENCE, || {
        position(&seen, ready + 1, "RELOADING=1")
    });
    let message = seen.lock().unwrap()[reloading].clone();
    assert!(
        message.lines().any(|l| l.starts_with("MONOTONIC_USEC=")),
        "{message}"
    );
    eventually("READY=1 after the reload", PATIENCE, || {
        position(&seen, reloading + 1, "READY=1")
    });

    // Draining: STOPPING=1.
    assert!(g.terminate().success());
    let stopping = eventually("STOPPING=1", PATIENCE, || position(&seen, 0, "STOPPING=1"));
    assert!(stopping > reloading);
}
