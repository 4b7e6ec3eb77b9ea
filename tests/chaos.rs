//! Chaos: mixed load — `GET /noop`, `/payload/{size}` across the
//! shared-memory threshold, `POST /upload` and `/echo-bytes` with
//! checksummed bodies, `/cpu/{ms}` in worker processes — while random
//! children (listener, broker, router, managers, workers) are killed with
//! SIGKILL. Asserts: no wrong 200 (every 200 body is exactly the expected
//! one), no hang (every request is answered or refused within a bound),
//! and afterwards the same processes, the supervisor's descriptors and
//! `/dev/shm` as before.
//!
//! Errors are allowed: a request in flight on a killed process gets 502,
//! 503 or 504, or its connection is reset. Only silence and wrong bytes
//! are failures. The seed is printed; `CHAOS_SEED=N` replays a run's
//! choices (the timing of a real group never replays exactly).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use sha2::Digest;

/// How long the killing goes on.
const CHAOS: Duration = Duration::from_secs(12);
/// Pause between two kills.
const BETWEEN_KILLS: Duration = Duration::from_millis(900);
/// A request not answered (or refused) within this is a hang. Well above
/// the group's request timeout (5 s here), after which it must answer 504.
const HANG: Duration = Duration::from_secs(20);
const CLIENTS: usize = 4;

const CONFIG: &str = "[listener]\nrequest_timeout_ms = 5000\nmax_body_bytes = 4000000\n\n\
                      [restart]\nmax_restarts = 100\nwindow_s = 30\n";

/// A small deterministic generator (xorshift64*): the run's choices follow
/// from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed | 1);
    (0..len).map(|_| rng.next() as u8).collect()
}

fn hex_sha256(body: &[u8]) -> String {
    sha2::Sha256::digest(body)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

enum Outcome {
    /// A whole response: its status and body.
    Answered(u16, Vec<u8>),
    /// The connection was refused or reset (a killed listener): allowed.
    Refused,
    /// Nothing within [`HANG`].
    Hung(String),
}

/// One request on a fresh connection, bounded by [`HANG`] as a whole.
fn exchange(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Outcome {
    let started = Instant::now();
    let mut stream = match TcpStream::connect_timeout(&addr, HANG) {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::TimedOut => return Outcome::Hung(format!("connect: {e}")),
        Err(_) => return Outcome::Refused,
    };
    let _ = stream.set_write_timeout(Some(HANG));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: chaos\r\nconnection: close\r\n\
         content-type: application/octet-stream\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    if let Err(e) = stream.write_all(&request) {
        return match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => {
                Outcome::Hung(format!("{method} {path}: write: {e}"))
            }
            _ => Outcome::Refused,
        };
    }
    let mut response = Vec::new();
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let left = HANG.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Outcome::Hung(format!("{method} {path}: {} bytes in {HANG:?}", response.len()));
        }
        let _ = stream.set_read_timeout(Some(left));
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => response.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Outcome::Hung(format!("{method} {path}: {} bytes in {HANG:?}", response.len()));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(_) => return Outcome::Refused,
        }
    }
    if response.is_empty() {
        return Outcome::Refused;
    }
    match parse_response(&response) {
        Ok(r) => {
            // A response cut short by a dying listener is a reset, not a
            // wrong 200: hyper announced its length.
            let announced = r.header("content-length").and_then(|v| v.parse::<usize>().ok());
            if announced.is_some_and(|n| n != r.body.len()) {
                return Outcome::Refused;
            }
            Outcome::Answered(r.status, r.body)
        }
        Err(_) => Outcome::Refused,
    }
}

/// Says why a 200 body is wrong, if it is.
type Check = Box<dyn Fn(&[u8]) -> Result<(), String> + Send>;

/// One request of the mix, and what a 200 must carry.
struct Ask {
    method: &'static str,
    path: String,
    body: Vec<u8>,
    check: Check,
}

fn ask(rng: &mut Rng, uploads: &[Vec<u8>]) -> Ask {
    match rng.below(6) {
        0 => Ask {
            method: "GET",
            path: "/noop".into(),
            body: Vec::new(),
            check: Box::new(|b| {
                (b == br#"{"ok":true}"#)
                    .then_some(())
                    .ok_or_else(|| "not {\"ok\":true}".into())
            }),
        },
        1 | 2 => {
            // Inline, at the threshold, pooled shared memory.
            let size = [1000usize, 65_536, 300_000, 1_048_576][rng.below(4)];
            Ask {
                method: "GET",
                path: format!("/payload/{size}"),
                body: Vec::new(),
                check: Box::new(move |b| {
                    if b.len() != size {
                        return Err(format!("{} bytes, not {size}", b.len()));
                    }
                    b.iter()
                        .all(|&c| c == b'x')
                        .then_some(())
                        .ok_or_else(|| "bytes other than x".into())
                }),
            }
        }
        3 => {
            let body = uploads[rng.below(uploads.len())].clone();
            let want = serde_json::json!({ "length": body.len(), "sha256": hex_sha256(&body) });
            Ask {
                method: "POST",
                path: "/upload".into(),
                body,
                check: Box::new(move |b| {
                    let got: serde_json::Value = serde_json::from_slice(b).map_err(|e| e.to_string())?;
                    (got == want)
                        .then_some(())
                        .ok_or_else(|| format!("{got} is not {want}"))
                }),
            }
        }
        4 => {
            let body = uploads[rng.below(uploads.len())].clone();
            let want = body.clone();
            Ask {
                method: "POST",
                path: "/echo-bytes".into(),
                body,
                check: Box::new(move |b| {
                    (b == want.as_slice())
                        .then_some(())
                        .ok_or_else(|| format!("{} bytes echoed, not the {} sent", b.len(), want.len()))
                }),
            }
        }
        _ => Ask {
            method: "GET",
            path: "/cpu/2".into(),
            body: Vec::new(),
            check: Box::new(|b| {
                let got: serde_json::Value = serde_json::from_slice(b).map_err(|e| e.to_string())?;
                (got["ms"] == 2)
                    .then_some(())
                    .ok_or_else(|| format!("{got} is not 2 ms of CPU"))
            }),
        },
    }
}

#[derive(Default)]
struct Tally {
    ok: AtomicU64,
    errors: AtomicU64,
    refused: AtomicU64,
    wrong: Mutex<Vec<String>>,
    hangs: Mutex<Vec<String>>,
}

/// The group's children as `switchyard status` lists them: (name, role, pid).
fn children(g: &Group) -> Vec<(String, String, u32)> {
    g.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] != "supervisor")
        .map(|p| {
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                p["role"].as_str().unwrap_or_default().to_owned(),
                p["pid"].as_u64().unwrap_or(0) as u32,
            )
        })
        .collect()
}

/// Direct children of `pid`, from /proc.
fn proc_children(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("children")).ok())
        .map(|c| c.split_whitespace().count())
        .sum()
}

/// The supervisor's descriptors once they hold still: a `switchyard
/// status` just made leaves its control connection open for a moment.
fn quiet_fds(pid: u32) -> usize {
    let mut last = open_fds(pid);
    let mut same = 0;
    let deadline = Instant::now() + PATIENCE;
    while same < 5 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        let now = open_fds(pid);
        same = if now == last { same + 1 } else { 0 };
        last = now;
    }
    last
}

/// Waits, within [`PATIENCE`], until `probe` gives `want`; the last value
/// otherwise.
fn settles<T: PartialEq + std::fmt::Debug>(want: &T, mut probe: impl FnMut() -> T) -> Result<(), T> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = probe();
        if &now == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(now);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kill_9_chaos_under_load_never_gives_a_wrong_200_or_a_hang() {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::process::id() as u64 ^ 0x9e37_79b9_7f4a_7c15);
    eprintln!("chaos seed: {seed} (CHAOS_SEED={seed} replays the choices)");

    let shm_before = dev_shm_listing();
    let g = Group::builder("chaos").config(CONFIG).start();
    let supervisor = g.supervisor_pid();
    g.eventually_status("/cpu/1", 200);
    let before = children(&g);
    let mut names_before: Vec<(String, String)> =
        before.iter().map(|(n, r, _)| (n.clone(), r.clone())).collect();
    names_before.sort();
    let direct_before = proc_children(supervisor);
    let fds_before = quiet_fds(supervisor);
    eprintln!("{} children, {fds_before} supervisor descriptors", before.len());

    let uploads: Arc<Vec<Vec<u8>>> = Arc::new(
        [10usize, 70_000, 300_000, 1_500_000]
            .iter()
            .enumerate()
            .map(|(i, &n)| bytes(n, seed ^ i as u64))
            .collect(),
    );
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, uploads, tally, stop) = (g.addr, uploads.clone(), tally.clone(), stop.clone());
            let mut rng = Rng(seed.wrapping_add(c as u64 + 1) | 1);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let a = ask(&mut rng, &uploads);
                    match exchange(addr, a.method, &a.path, &a.body) {
                        Outcome::Answered(200, body) => match (a.check)(&body) {
                            Ok(()) => tally.ok.fetch_add(1, Ordering::Relaxed),
                            Err(why) => {
                                tally
                                    .wrong
                                    .lock()
                                    .unwrap()
                                    .push(format!("{} {}: {why}", a.method, a.path));
                                0
                            }
                        },
                        Outcome::Answered(..) => tally.errors.fetch_add(1, Ordering::Relaxed),
                        Outcome::Refused => {
                            // A refused connection comes back at once while
                            // a listener restarts: do not spin on it.
                            std::thread::sleep(Duration::from_millis(5));
                            tally.refused.fetch_add(1, Ordering::Relaxed)
                        }
                        Outcome::Hung(what) => {
                            tally.hangs.lock().unwrap().push(what);
                            0
                        }
                    };
                }
            })
        })
        .collect();

    // The killing: every BETWEEN_KILLS a random child of the next role, the
    // roles in a random order, so that every role dies at least once.
    let mut rng = Rng(seed | 1);
    let mut roles: Vec<String> = before.iter().map(|(_, r, _)| r.clone()).collect();
    roles.sort();
    roles.dedup();
    for i in (1..roles.len()).rev() {
        roles.swap(i, rng.below(i + 1));
    }
    let mut killed = Vec::new();
    let chaos_started = Instant::now();
    while chaos_started.elapsed() < CHAOS {
        std::thread::sleep(BETWEEN_KILLS);
        let role = &roles[killed.len() % roles.len()];
        let now: Vec<_> = children(&g)
            .into_iter()
            .filter(|(_, r, pid)| *pid != 0 && r == role)
            .collect();
        if now.is_empty() {
            continue; // that role's only process is still coming back
        }
        let (name, role, pid) = now[rng.below(now.len())].clone();
        kill(pid, Signal::SIGKILL);
        killed.push(format!("{role} {name} ({pid})"));
    }
    // The load goes on a little while the last victim comes back.
    std::thread::sleep(Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().unwrap();
    }
    eprintln!("killed {}: {}", killed.len(), killed.join(", "));
    eprintln!(
        "answers: {} right 200s, {} errors, {} refused connections",
        tally.ok.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed)
    );

    let wrong = tally.wrong.lock().unwrap();
    assert!(wrong.is_empty(), "wrong 200s: {wrong:#?}");
    let hangs = tally.hangs.lock().unwrap();
    assert!(hangs.is_empty(), "requests left hanging: {hangs:#?}");
    assert!(
        tally.ok.load(Ordering::Relaxed) > 0,
        "the group served nothing right"
    );
    assert!(!killed.is_empty());

    // Afterwards: every child back, serving, nothing leaked.
    let running = |g: &Group| {
        let mut names: Vec<(String, String)> = children(g)
            .into_iter()
            .filter(|(_, _, pid)| *pid != 0 && alive(*pid))
            .map(|(n, r, _)| (n, r))
            .collect();
        names.sort();
        names
    };
    if let Err(now) = settles(&names_before, || running(&g)) {
        panic!("children before {names_before:?}, after {now:?}");
    }
    if let Err(now) = settles(&direct_before, || proc_children(supervisor)) {
        panic!("the supervisor had {direct_before} child processes, now {now}");
    }
    g.eventually_status("/noop", 200);
    g.eventually_status("/cpu/1", 200);
    if let Err(now) = settles(&fds_before, || open_fds(supervisor)) {
        panic!("the supervisor held {fds_before} descriptors, now {now}");
    }
    let shm_now: Vec<String> = dev_shm_listing()
        .into_iter()
        .filter(|n| !shm_before.contains(n))
        .collect();
    assert!(shm_now.is_empty(), "new in /dev/shm: {shm_now:?}");
}
