//! `switchyard status` shows each process's load: requests in flight and
//! jobs queued for workers, as the processes report them; and what
//! `--ready-file` says of a group once it serves.

mod common;

use common::*;

#[test]
fn queued_jobs_and_requests_in_flight_show_in_status() {
    // A long deadline: on a loaded machine the queued CPU work takes a while.
    let config = "[listener]\nrequest_timeout_ms = 120000\n\
                  [[managers]]\nname = \"compute\"\n[managers.workers]\nkind = \"process\"\nsize = 1\nqueue = 16\n";
    let g = Group::builder("status-load").config(config).start();
    // One worker, four 1 s jobs: one runs, three wait in the queue for
    // longer than the 1 s reporting interval.
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let addr = g.addr;
            std::thread::spawn(move || get(addr, "/cpu/1000").unwrap().status)
        })
        .collect();
    // (in flight, queued) of the process called `name`, polled until
    // `done` says so.
    let load_until = |name: &str, what: &str, done: &dyn Fn(u64, u64) -> bool| -> (u64, u64) {
        eventually(&format!("{what} of {name} in status"), PATIENCE, || {
            let status = g.status();
            let compute = status["processes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .cloned();
            let load = compute.map(|c| {
                (
                    c["load"]["in_flight"].as_u64().unwrap_or(0),
                    c["load"]["queued"].as_u64().unwrap_or(0),
                )
            });
            // Seen: (in flight, queued), or None when `name` is not listed.
            load.filter(|&(i, q)| done(i, q)).ok_or(load)
        })
    };
    let (in_flight, queued) = load_until("compute", "queued jobs", &|_, queued| queued > 0);
    assert!(
        in_flight >= queued,
        "queued jobs belong to requests in flight ({in_flight} < {queued})"
    );
    // The router counts the same requests as routed and unanswered.
    load_until("router", "requests in flight at the router", &|in_flight, _| {
        in_flight > 0
    });
    for c in clients {
        assert_eq!(c.join().unwrap(), 200);
    }
    // Drained: the gauges go back to zero.
    for name in ["compute", "router", "broker"] {
        load_until(name, "a drained load", &|in_flight, queued| {
            in_flight == 0 && queued == 0
        });
    }
}

/// A command whose reader goes away (`switchyard status | head -1`) ends
/// quietly, as any Unix tool does: not exit 101 with a panic's backtrace.
#[test]
fn a_command_whose_reader_leaves_ends_quietly() {
    use std::os::unix::process::ExitStatusExt;
    use std::process::{Command, Stdio};
    let g = Group::start("status-pipe");
    let mut child = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["status", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before the first line is written.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc_sigpipe()),
        "{:?}: {stderr}",
        out.status
    );
}

/// SIGPIPE's number on Linux.
fn libc_sigpipe() -> i32 {
    nix::sys::signal::Signal::SIGPIPE as i32
}

/// `--ready-file`: once the group serves, every door it bound (port 0
/// resolved) and its pid, as JSON; gone when the group has stopped.
#[test]
fn the_ready_file_names_every_door_and_goes_with_the_group() {
    let mut g = Group::builder("ready-file")
        .arg("--admin-bind")
        .arg("127.0.0.1:0")
        .start();
    let ready = g.ready.clone();
    assert_eq!(ready.pid, g.supervisor_pid());
    assert!(!ready.tls);
    assert_eq!(ready.http, g.addr);
    assert_ne!(ready.http.port(), 0);
    assert_eq!((ready.grpc, ready.http3), (None, None));
    assert_eq!(ready.runtime_dir, g.runtime_dir);
    assert_eq!(get(ready.http, "/hello/Ada").unwrap().status, 200);
    let admin = ready.admin.expect("--admin-bind");
    assert_eq!(get(admin, "/metrics").unwrap().status, 200);
    // The human lines are still printed, for people.
    assert!(g.has_line(&format!("switchyard listening on http://{}", ready.http)));

    assert!(g.terminate().success());
    assert!(!g.ready_file.exists(), "removed on exit");
}
