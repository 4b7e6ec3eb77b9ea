//! `switchyard reload` and SIGHUP against a real group: a plugin swapped
//! between two builds five times under a closed-loop load of 32
//! connections with nothing but 2xx, each reload's replies from the new
//! build; an invalid configuration refused with `check`'s messages while
//! the group runs on untouched; managers added and removed; listener
//! limits changed live; a new address reported as needing a restart.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use common::*;

fn reload(g: &Group) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["reload", "--runtime-dir"])
        .arg(&g.runtime_dir)
        .output()
        .unwrap()
}

#[track_caller]
fn reload_ok(g: &Group) -> String {
    let out = reload(g);
    assert!(
        out.status.success(),
        "reload failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn versioned(plugin: &Path, label: &str, instances: u32) -> String {
    format!(
        "[[managers]]\nname = \"versioned\"\nplugin = \"{}\"\ninstances = {instances}\n\
         [managers.config]\nlabel = \"{label}\"\n",
        plugin.display()
    )
}

/// One request on a kept-alive HTTP/1.1 connection: status and body.
fn keep_alive_get(stream: &mut BufReader<TcpStream>, path: &str) -> std::io::Result<(u16, String)> {
    stream
        .get_mut()
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: t\r\n\r\n").as_bytes())?;
    let mut status_line = String::new();
    if stream.read_line(&mut status_line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {status_line:?}")))?;
    let mut length = None;
    loop {
        let mut line = String::new();
        stream.read_line(&mut line)?;
        if line == "\r\n" || line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse::<usize>().ok();
        }
    }
    let length = length.ok_or_else(|| std::io::Error::other("no content-length"))?;
    let mut body = vec![0; length];
    stream.read_exact(&mut body)?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// What one client saw: when each request started, and its answer (or
/// the error instead).
type Seen = Vec<(Instant, Result<(u16, String), String>)>;

/// A closed-loop client per connection, each sending `GET /version` as
/// soon as the previous answer is in, until `stop`.
fn load(addr: SocketAddr, connections: usize, stop: Arc<AtomicBool>) -> Vec<std::thread::JoinHandle<Seen>> {
    (0..connections)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut seen = Seen::new();
                let mut stream = BufReader::new(TcpStream::connect(addr).unwrap());
                stream.get_ref().set_read_timeout(Some(PATIENCE)).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let started = Instant::now();
                    let answer = keep_alive_get(&mut stream, "/version").map_err(|e| e.to_string());
                    let failed = answer.is_err();
                    seen.push((started, answer));
                    if failed {
                        // Counted; go on with a new connection.
                        match TcpStream::connect(addr) {
                            Ok(s) => stream = BufReader::new(s),
                            Err(_) => break,
                        }
                    }
                }
                seen
            })
        })
        .collect()
}

fn build_of(body: &str) -> String {
    let v: serde_json::Value = serde_json::from_str(body).unwrap();
    v["build"].as_str().unwrap().to_owned()
}

#[test]
fn five_reloads_under_load_swap_builds_with_nothing_but_2xx() {
    let builds = [
        plugin("switchyard-fixture-versioned-one"),
        plugin("switchyard-fixture-versioned-two"),
    ];
    let names = [
        "switchyard-fixture-versioned-one",
        "switchyard-fixture-versioned-two",
    ];
    let dir = scratch_dir("reload-files");
    let config: PathBuf = dir.path().join("switchyard.toml");
    std::fs::write(&config, versioned(&builds[0], "start", 2)).unwrap();
    let g = Group::builder("reload-load").config_file(&config).start();
    assert_eq!(build_of(&get(g.addr, "/version").unwrap().text()), names[0]);

    let stop = Arc::new(AtomicBool::new(false));
    let clients = load(g.addr, 32, stop.clone());
    // Each reload: when it was asked for, when it had been applied, and
    // which build it installed.
    let mut applied = Vec::new();
    for round in 1..=5 {
        let next = round % 2;
        std::fs::write(&config, versioned(&builds[next], &format!("round {round}"), 2)).unwrap();
        let asked = Instant::now();
        let said = reload_ok(&g);
        assert!(said.contains("replaced versioned"), "{said}");
        applied.push((asked, Instant::now(), names[next]));
        // A new connection now gets the new build.
        let fresh = get(g.addr, "/version").unwrap();
        assert_eq!(fresh.status, 200);
        assert_eq!(build_of(&fresh.text()), names[next], "round {round}");
        assert!(fresh.text().contains(&format!("round {round}")));
    }
    stop.store(true, Ordering::Relaxed);
    let seen: Vec<Seen> = clients.into_iter().map(|c| c.join().unwrap()).collect();

    let total: usize = seen.iter().map(Vec::len).sum();
    let failures: Vec<_> = seen
        .iter()
        .flatten()
        .filter(|(_, answer)| !matches!(answer, Ok((status, _)) if (200..300).contains(status)))
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {total} requests were not 2xx: {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    // Every request that started after a reload was applied (and before
    // the next was asked for; meanwhile both builds serve) was answered by
    // the build that reload installed.
    for (i, (_, at, build)) in applied.iter().enumerate() {
        let until = applied.get(i + 1).map(|(asked, _, _)| *asked);
        for (started, answer) in seen.iter().flatten() {
            if *started > *at && until.is_none_or(|u| *started < u) {
                let (_, body) = answer.as_ref().unwrap();
                assert_eq!(
                    &build_of(body),
                    build,
                    "a request after reload {} got the old build",
                    i + 1
                );
            }
        }
    }
    assert!(total > 32 * 5, "the load hardly ran: {total} requests");
    // Two instances of the last build; the replaced ones are gone.
    let status = g.status();
    let processes = status["processes"].as_array().unwrap();
    let instances: Vec<_> = processes.iter().filter(|p| p["name"] == "versioned").collect();
    assert_eq!(instances.len(), 2, "{processes:?}");
    assert!(instances.iter().all(|p| p["state"] == "running"));
}

#[test]
fn an_invalid_configuration_is_refused_with_checks_messages_and_the_group_runs_on() {
    let build = plugin("switchyard-fixture-versioned-one");
    let dir = scratch_dir("reload-files");
    let config = dir.path().join("switchyard.toml");
    std::fs::write(&config, versioned(&build, "good", 1)).unwrap();
    let g = Group::builder("reload-invalid").config_file(&config).start();
    let pids = g.all_pids();

    // Two problems: a bad value and a plugin that does not exist.
    let bad = format!(
        "[listener]\nmax_header_bytes = 10\n{}",
        versioned(Path::new("/nonexistent/libnope.so"), "bad", 1)
    );
    std::fs::write(&config, bad).unwrap();
    let out = reload(&g);
    assert_eq!(out.status.code(), Some(64));
    let refused = String::from_utf8_lossy(&out.stderr);
    let check = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("check")
        .arg("-c")
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(check.status.code(), Some(64));
    let checked = String::from_utf8_lossy(&check.stderr);
    for line in checked.lines().skip(1) {
        assert!(
            refused.contains(line),
            "`check` says {line:?}; reload said:\n{refused}"
        );
    }
    assert!(refused.contains("listener.max_header_bytes"), "{refused}");
    assert!(refused.contains("managers[0].plugin"), "{refused}");

    // Untouched: same processes, same answers.
    assert_eq!(g.all_pids(), pids);
    assert!(get(g.addr, "/version").unwrap().text().contains("good"));
}

#[test]
fn a_replacement_that_does_not_start_undoes_the_reload() {
    let build = plugin("switchyard-fixture-versioned-one");
    let dir = scratch_dir("reload-files");
    let config = dir.path().join("switchyard.toml");
    std::fs::write(&config, versioned(&build, "kept", 1)).unwrap();
    let g = Group::builder("reload-undo").config_file(&config).start();
    let pids = g.all_pids();

    // Valid (the validation child creates it fine), but it cannot start.
    std::fs::write(
        &config,
        format!("{}fail_to_start = true\n", versioned(&build, "broken", 1)),
    )
    .unwrap();
    let out = reload(&g);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("undone"), "{said}");
    assert!(said.contains("versioned"), "{said}");
    assert_eq!(g.all_pids(), pids, "the running processes were touched");
    assert!(get(g.addr, "/version").unwrap().text().contains("kept"));

    // The next good reload goes through.
    std::fs::write(&config, versioned(&build, "fixed", 1)).unwrap();
    reload_ok(&g);
    assert!(get(g.addr, "/version").unwrap().text().contains("fixed"));
}

#[test]
fn a_manager_is_replaced_with_its_worker_processes() {
    let dir = scratch_dir("reload-files");
    let config = dir.path().join("switchyard.toml");
    let compute = |size: u32| {
        format!("[[managers]]\nname = \"compute\"\n[managers.workers]\nkind = \"process\"\nsize = {size}\n")
    };
    std::fs::write(&config, compute(1)).unwrap();
    let g = Group::builder("reload-workers").config_file(&config).start();
    assert_eq!(get(g.addr, "/cpu/1").unwrap().status, 200);
    let workers = |g: &Group| -> Vec<u64> {
        g.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["role"] == "worker")
            .filter_map(|p| p["pid"].as_u64())
            .collect()
    };
    let old = workers(&g);
    assert_eq!(old.len(), 1);

    std::fs::write(&config, compute(2)).unwrap();
    let said = reload_ok(&g);
    assert!(said.contains("replaced compute"), "{said}");
    // The new pool: two new worker processes, jobs run on them.
    let new = workers(&g);
    assert_eq!(new.len(), 2, "{new:?}");
    assert!(new.iter().all(|pid| !old.contains(pid)));
    assert!(
        old.iter().all(|&pid| !alive(pid as u32)),
        "an old worker lives on"
    );
    for _ in 0..4 {
        assert_eq!(get(g.addr, "/cpu/1").unwrap().status, 200);
    }
}

#[test]
fn managers_come_and_go_and_listener_limits_change_live() {
    let build = plugin("switchyard-fixture-versioned-one");
    let dir = scratch_dir("reload-files");
    let config = dir.path().join("switchyard.toml");
    let basics = "[[managers]]\nname = \"basics\"\n";
    std::fs::write(&config, basics).unwrap();
    let mut g = Group::builder("reload-managers").config_file(&config).start();
    assert_eq!(get(g.addr, "/version").unwrap().status, 404);
    let basics_pid = g.pid_of("basics");

    // Added, by SIGHUP this time.
    std::fs::write(&config, format!("{basics}{}", versioned(&build, "added", 1))).unwrap();
    kill(g.supervisor_pid(), Signal::SIGHUP);
    g.wait_line("reloaded: added versioned");
    assert_eq!(get(g.addr, "/version").unwrap().status, 200);
    g.eventually_status("/ready", 200);
    assert_eq!(
        g.pid_of("basics"),
        basics_pid,
        "an unchanged manager keeps running"
    );

    // A listener limit, live; the bind address needs a restart.
    let body = vec![b'x'; 2000];
    let echo = request(g.addr, "POST", "/echo", &body).unwrap();
    assert_ne!(echo.status, 413);
    std::fs::write(
        &config,
        format!(
            "[listener]\nmax_body_bytes = 1000\ngrpc_bind = \"127.0.0.1:0\"\n{basics}{}",
            versioned(&build, "added", 1)
        ),
    )
    .unwrap();
    let said = reload_ok(&g);
    assert!(said.contains("applied live: listener.max_body_bytes"), "{said}");
    assert!(
        said.contains("need a restart") && said.contains("listener.grpc_bind"),
        "{said}"
    );
    let echo = request(g.addr, "POST", "/echo", &body).unwrap();
    assert_eq!(echo.status, 413);

    // Removed: drained, stopped, and its route forgotten.
    let versioned_pid = g.pid_of("versioned");
    std::fs::write(&config, basics).unwrap();
    let said = reload_ok(&g);
    assert!(said.contains("removed versioned"), "{said}");
    eventually("the removed manager exits", PATIENCE, || {
        if alive(versioned_pid) {
            Err(versioned_pid)
        } else {
            Ok(())
        }
    });
    assert!(
        !g.status()["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "versioned")
    );
    assert_eq!(get(g.addr, "/version").unwrap().status, 404);
    g.eventually_status("/ready", 200);
}

#[test]
fn the_report_names_every_change_applied_and_a_planned_replacement_is_no_warning() {
    let build = plugin("switchyard-fixture-versioned-one");
    let dir = scratch_dir("reload-report");
    let config = dir.path().join("switchyard.toml");
    let basics = "[[managers]]\nname = \"basics\"\n";
    let jwt = "[auth.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"reload-report-test-secret-32-bytes-long\"\n";
    std::fs::write(
        &config,
        format!(
            "[api]\ntitle = \"Before\"\n{jwt}{basics}{}",
            versioned(&build, "one", 1)
        ),
    )
    .unwrap();
    let mut g = Group::builder("reload-report").config_file(&config).start();
    assert_eq!(get(g.addr, "/hello/Ada").unwrap().status, 200);
    let old = g.pid_of("versioned");

    // A new rule, a new title, a manager's configuration.
    std::fs::write(
        &config,
        format!(
            "[api]\ntitle = \"After\"\n{jwt}[[auth.rules]]\nprefix = \"/hello\"\n{basics}{}",
            versioned(&build, "two", 1)
        ),
    )
    .unwrap();
    let said = reload_ok(&g);
    assert!(said.contains("replaced versioned"), "{said}");
    assert!(
        said.contains("auth.rules") && said.contains("api.title"),
        "{said}"
    );
    assert!(!said.contains("no manager or setting changed"), "{said}");
    // And each was applied.
    assert_eq!(get(g.addr, "/hello/Ada").unwrap().status, 401);
    assert_eq!(
        get(g.addr, "/openapi.json").unwrap().json()["info"]["title"],
        "After"
    );
    assert!(get(g.addr, "/version").unwrap().text().contains("two"));

    // The replaced instance drained and left: the router says so without
    // a warning.
    g.wait_line("manager left after draining manager=versioned");
    eventually("the old instance exits", PATIENCE, || {
        if alive(old) { Err(old) } else { Ok(()) }
    });
    let warned: Vec<String> = g.lines_with("manager disconnected");
    assert!(warned.is_empty(), "{warned:?}");
}
