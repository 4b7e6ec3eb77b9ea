//! Secrets stay with the process they are for (docs/security-trust.md,
//! decision 0101): a group started with a JWT secret and a NATS password
//! in its environment, an API key and a manager's secret in its file.
//! No other process has them in its environment, command line or memory
//! (where the spec it was given went), and neither `/metrics`, the
//! dashboard, `status --json` nor the log shows them. The NATS server is
//! unreachable on purpose: the group starts without its link, and the
//! router still holds the password it would use.

mod common;

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};

use common::*;
use sha2::Digest;

const JWT_SECRET: &str = "jwt-secret-4f1c9a7e2b8d6053a1c4e7f90b2d5e8c";
const NATS_PASSWORD: &str = "nats-password-8e21b7c4d9a3f605";
const API_KEY: &str = "api-key-0c5e9b2a7d4f1863";
const MANAGER_SECRET: &str = "manager-secret-5d3a8c1f6b9e2470";

fn sha256_hex(text: &str) -> String {
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Every secret with a name, and the hashed API key as configured.
fn secrets() -> Vec<(&'static str, String)> {
    vec![
        ("jwt", JWT_SECRET.to_owned()),
        ("nats", NATS_PASSWORD.to_owned()),
        ("api key", API_KEY.to_owned()),
        ("api key hash", sha256_hex(API_KEY)),
        ("manager", MANAGER_SECRET.to_owned()),
    ]
}

/// Which secrets a process may hold: its own role's.
fn may_hold(role: &str, name: &str) -> &'static [&'static str] {
    match (role, name) {
        // The key itself: a client sent it to the listener.
        ("listener", _) => &["jwt", "api key", "api key hash"],
        ("router", _) => &["nats"],
        ("manager", "rogue") => &["manager"],
        _ => &[],
    }
}

/// The pages `pid` has in memory, in runs of contiguous pages, from its
/// readable private mappings (heap, stacks, data; where the spec it was
/// given went). Pages never touched are skipped (`/proc/PID/pagemap`):
/// allocators reserve far more than they use.
fn memory(pid: u32) -> Vec<Vec<u8>> {
    const PAGE: u64 = 4096;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let (Ok(mut mem), Ok(mut pagemap)) = (
        std::fs::File::open(format!("/proc/{pid}/mem")),
        std::fs::File::open(format!("/proc/{pid}/pagemap")),
    ) else {
        return Vec::new();
    };
    let mut runs = Vec::new();
    for line in maps.lines() {
        let mut parts = line.split_whitespace();
        let (Some(range), Some(perms)) = (parts.next(), parts.next()) else {
            continue;
        };
        if !perms.starts_with('r')
            || !perms.ends_with('p')
            || line.contains("[vvar")
            || line.contains("[vsyscall")
        {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16)) else {
            continue;
        };
        let pages = ((end - start) / PAGE) as usize;
        let mut entries = vec![0u8; pages * 8];
        if pagemap.seek(SeekFrom::Start(start / PAGE * 8)).is_err()
            || pagemap.read_exact(&mut entries).is_err()
        {
            continue;
        }
        let present: Vec<bool> = entries
            .chunks_exact(8)
            .map(|e| u64::from_le_bytes(e.try_into().unwrap()) >> 63 == 1)
            .collect();
        let mut i = 0;
        while i < pages {
            if !present[i] {
                i += 1;
                continue;
            }
            let first = i;
            while i < pages && present[i] {
                i += 1;
            }
            let mut buf = vec![0u8; (i - first) * PAGE as usize];
            if mem.seek(SeekFrom::Start(start + first as u64 * PAGE)).is_ok()
                && mem.read_exact(&mut buf).is_ok()
            {
                runs.push(buf);
            }
        }
    }
    runs
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    memchr::memmem::find(haystack, needle.as_bytes()).is_some()
}

fn in_memory(runs: &[Vec<u8>], needle: &str) -> bool {
    runs.iter().any(|run| contains(run, needle))
}

#[test]
fn secrets_stay_with_their_role_and_out_of_every_report() {
    let rogue = plugin("switchyard-fixture-rogue");
    let config = format!(
        "[auth.jwt]\nalgorithms = [\"HS256\"]\n\
         [auth.api_keys]\nheader = \"x-api-key\"\n\
         [[auth.api_keys.keys]]\nname = \"deployer\"\nsha256 = \"{}\"\nroles = [\"admin\"]\n\
         [cluster]\nnats = \"nats://127.0.0.1:1\"\nname = \"secrets\"\nuser = \"switchyard\"\n\
         [[managers]]\nname = \"basics\"\n\
         [[managers]]\nname = \"rogue\"\nplugin = \"{}\"\n\
         [managers.config]\nruntime_dir = \"/nonexistent\"\ntoken = \"{MANAGER_SECRET}\"\n",
        sha256_hex(API_KEY),
        rogue.display()
    );
    let mut g = Group::builder("secrets")
        .config(&config)
        .env("SWITCHYARD_AUTH__JWT__SECRET", JWT_SECRET)
        .env("SWITCHYARD_CLUSTER__PASSWORD", NATS_PASSWORD)
        .arg("--admin-bind")
        .arg("127.0.0.1:0")
        .start();
    let admin: std::net::SocketAddr = g
        .wait_line("admin on http://")
        .rsplit("http://")
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    g.eventually_status("/noop", 200);
    // The key works: the listener has what it needs.
    let r = request_with(g.addr, "GET", "/me", &[("x-api-key", API_KEY)], b"").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["sub"], "deployer", "{}", r.text());

    let status = g.status();
    let processes: Vec<(u32, String, String)> = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] != "supervisor")
        .map(|p| {
            (
                p["pid"].as_u64().unwrap() as u32,
                p["role"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(processes.len() >= 5, "{status}");
    for (pid, role, name) in &processes {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let memory = memory(*pid);
        let read: usize = memory.iter().map(Vec::len).sum();
        assert!(read > 1 << 20, "{role} {name} [{pid}]: its memory was read");
        for (secret, value) in secrets() {
            assert!(
                !contains(&environ, &value),
                "{role} {name} [{pid}] has the {secret} in its environment"
            );
            assert!(
                !contains(&cmdline, &value),
                "{role} {name} [{pid}] has the {secret} on its command line"
            );
            if !may_hold(role, name).contains(&secret) {
                assert!(
                    !in_memory(&memory, &value),
                    "{role} {name} [{pid}] holds the {secret}, not its own"
                );
            }
        }
        // The spec descriptor was read and closed.
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().flatten() {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            assert!(
                !target.to_string_lossy().contains("switchyard-spec"),
                "{role} {name} [{pid}] still holds its spec"
            );
        }
    }
    // What each role must hold it does (so the scan above can see one).
    let router = processes.iter().find(|p| p.1 == "router").unwrap().0;
    assert!(
        in_memory(&memory(router), NATS_PASSWORD),
        "the router holds the NATS password"
    );

    // Nothing the group shows or writes has them.
    let mut shown: HashMap<&str, String> = HashMap::new();
    shown.insert("status --json", status.to_string());
    for path in ["/metrics", "/", "/api/status"] {
        let r = get(admin, path).unwrap();
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        shown.insert(path, r.text());
    }
    for dir_entry in walk(&g.runtime_dir) {
        if let Ok(text) = std::fs::read(&dir_entry) {
            shown.insert("a runtime dir file", String::from_utf8_lossy(&text).into_owned());
        }
    }
    for (what, text) in &shown {
        for (secret, value) in secrets() {
            assert!(!text.contains(&value), "{what} shows the {secret}");
        }
    }
    // Memory and CPU per process are still read from /proc.
    let metrics = &shown["/metrics"];
    let memory_lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("switchyard_process_resident_memory_bytes{"))
        .collect();
    assert!(memory_lines.len() >= processes.len(), "{metrics}");
    for line in &memory_lines {
        let value: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(value > 0.0, "{line}");
    }
    assert!(
        metrics.contains("switchyard_process_cpu_seconds_total{"),
        "{metrics}"
    );
    // And in the dashboard's JSON.
    let api: serde_json::Value = serde_json::from_str(&shown["/api/status"]).unwrap();
    let mut rss = Vec::new();
    find_all(&api, "rss_bytes", &mut rss);
    assert!(rss.len() >= processes.len(), "{api}");
    assert!(rss.iter().all(|v| v.as_u64() > Some(0)), "{api}");

    g.terminate();
    for (secret, value) in secrets() {
        assert!(!g.has_line(&value), "the log shows the {secret}");
    }
}

/// Every value under `key`, at any depth.
fn find_all(value: &serde_json::Value, key: &str, out: &mut Vec<serde_json::Value>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                if k == key {
                    out.push(v.clone());
                }
                find_all(v, key, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| find_all(v, key, out)),
        _ => {}
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => files.extend(walk(&path)),
            Ok(t) if t.is_file() => files.push(path),
            _ => {}
        }
    }
    files
}

/// The processes whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: the name may hold spaces and parentheses.
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        if after.split_whitespace().nth(1).and_then(|p| p.parse().ok()) == Some(parent) {
            out.push(pid);
        }
    }
    out
}

const NOBODY: u32 = 65534;

/// `cat PATH` as `nobody`, no other group: whether it could read it.
fn read_as_nobody(path: &str) -> std::process::Output {
    std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "cat",
            path,
        ])
        .output()
        .unwrap()
}

/// Every process of the group is non-dumpable (decision 0101), so that
/// another process of the same user — a plugin in a manager — cannot read
/// its environment or memory through /proc. Root reads any process, so
/// the group runs as `nobody` here and so does the reader; the same reader
/// reads a dumpable process of that user (the control), and no process of
/// the group.
#[test]
fn no_process_of_the_groups_own_user_reads_another_ones_proc_files() {
    let g = Group::builder("secrets-dumpable").user(NOBODY).start();
    let supervisor = g.supervisor_pid();
    let mut pids = vec![supervisor];
    pids.extend(children_of(supervisor));
    // Supervisor, broker, router, a listener, the demo's managers.
    assert!(pids.len() >= 5, "{pids:?}");

    let mut control = std::process::Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "sleep",
            "600",
        ])
        .spawn()
        .unwrap();
    let readable = eventually("the control process runs as nobody", PATIENCE, || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", control.id())).unwrap_or_default();
        if status.contains(&format!("Uid:\t{NOBODY}\t")) && status.contains("Name:\tsleep") {
            Ok(read_as_nobody(&format!("/proc/{}/environ", control.id())))
        } else {
            Err(status)
        }
    });
    let _ = control.kill();
    let _ = control.wait();
    assert!(
        readable.status.success(),
        "the reader cannot read even a dumpable process of its user: {}",
        String::from_utf8_lossy(&readable.stderr)
    );

    for pid in pids {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(
            status.contains(&format!("Uid:\t{NOBODY}\t")),
            "{pid} is not nobody's: {status}"
        );
        for file in ["environ", "maps", "mem"] {
            let out = read_as_nobody(&format!("/proc/{pid}/{file}"));
            assert!(
                !out.status.success(),
                "/proc/{pid}/{file} of the group was read by another process of its user"
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("Permission denied"), "/proc/{pid}/{file}: {err}");
        }
    }
}
