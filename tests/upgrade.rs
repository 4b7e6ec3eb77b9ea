//! `switchyard upgrade` under load: a new supervisor takes over the
//! listening socket while the old group drains and exits, and no client
//! connection is refused or reset meanwhile. The built-in Store, which
//! one group at a time may hold, comes back in the new group.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::*;

/// One request on its own connection: the status, or what went wrong
/// (refused, reset, cut short).
fn one_request(addr: SocketAddr) -> Result<u16, String> {
    let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(PATIENCE))
        .map_err(|e| e.to_string())?;
    stream
        .write_all(b"GET /noop HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n")
        .map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).map_err(|e| format!("read: {e}"))?;
    parse_response(&buf)
        .map(|r| r.status)
        .map_err(|e| format!("response: {e} ({} bytes)", buf.len()))
}

#[test]
fn upgrade_under_load_refuses_and_resets_nothing() {
    let mut g = Group::builder("upgrade")
        .config(
            "[[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
             [[managers]]\nname = \"basics\"\n",
        )
        .start();
    let old = g.supervisor_pid();
    assert_eq!(request(g.addr, "PUT", "/kv/kept", b"1").unwrap().status, 204);

    // Closed-loop clients, a new connection per request: every accept
    // during the hand-over is tested, not just kept-alive connections.
    let stop = Arc::new(AtomicBool::new(false));
    let addr = g.addr;
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    outcomes.push(one_request(addr));
                }
                outcomes
            })
        })
        .collect();

    // Whatever happens next, the new supervisor is stopped at the end.
    let new_supervisor = common::upgrade(&g.runtime_dir);
    let new = new_supervisor.pid;
    assert_ne!(new, old);

    // The old group drains and exits cleanly while the load goes on.
    let status = g.wait_exit();
    assert!(status.success(), "the old supervisor exited with {status}");
    g.wait_line("stopped cause=upgraded");
    // The new group serves the Store again, with what the old one kept.
    eventually("GET /kv/kept in the new group", PATIENCE, || {
        match get(addr, "/kv/kept") {
            Ok(r) if r.status == 200 => Ok(r.text()),
            other => Err(other.map(|r| r.status)),
        }
    });
    stop.store(true, Ordering::Relaxed);
    let outcomes: Vec<Result<u16, String>> = clients.into_iter().flat_map(|c| c.join().unwrap()).collect();
    let bad: Vec<_> = outcomes.iter().filter(|o| !matches!(o, Ok(200))).collect();
    assert!(
        bad.is_empty(),
        "{} of {} requests failed: {:?}",
        bad.len(),
        outcomes.len(),
        &bad[..bad.len().min(5)]
    );
    assert!(outcomes.len() > 16, "the load hardly ran");

    // `status` on the same runtime dir reaches the new supervisor.
    let status = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["status", "--json", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .output()
        .unwrap();
    let tree: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    let supervisor = tree["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "supervisor")
        .unwrap();
    assert_eq!(supervisor["pid"], new);

    // It stops like any group, and takes the runtime dir with it.
    drop(new_supervisor);
    assert!(!g.runtime_dir.exists(), "the runtime dir was left behind");
}
