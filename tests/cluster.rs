//! Groups joined through NATS (docs/cluster.md): real `nats-server`
//! processes on free loopback ports, and two or three real groups on this
//! machine joined through them.

mod common;

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::Value;
use switchyard_client::Client;

/// A `nats-server` on a loopback port, killed on drop.
struct Nats {
    child: Option<Child>,
    port: u16,
    args: Vec<String>,
}

impl Nats {
    fn start(args: &[&str]) -> Nats {
        let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        // A free port, found by binding port 0 and letting go: another
        // process may take it in between, so a server that cannot listen
        // is started again on another.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut nats = Nats {
                child: None,
                port,
                args: args.clone(),
            };
            if nats.spawn() {
                return nats;
            }
        }
        panic!("nats-server did not start on any of 5 free ports");
    }

    /// A server not started yet, on a port that was free a moment ago.
    fn not_started() -> Nats {
        Nats {
            child: None,
            port: TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port(),
            args: Vec::new(),
        }
    }

    /// Starts the server on `self.port`; true once it accepts clients.
    fn spawn(&mut self) -> bool {
        let child = Command::new("nats-server")
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server is installed (apt-get install nats-server; .ci/run does)");
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                return false;
            }
            // Ready once it greets a client with INFO.
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
                let mut line = String::new();
                if BufReader::new(stream).read_line(&mut line).is_ok() && line.starts_with("INFO") {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("nats-server on port {} not ready within {PATIENCE:?}", self.port);
    }

    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port (as an operator restarting it).
    fn restart(&mut self) {
        assert!(
            self.spawn(),
            "nats-server did not start again on port {}",
            self.port
        );
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A group running `managers` (demo managers, by name) joined to `nats`
/// in cluster `cluster`; `extra` is more TOML.
fn group(tag: &'static str, nats: &Nats, cluster: &str, managers: &[&str], extra: &str) -> Group {
    Group::builder(tag)
        .config(&config(nats, cluster, managers, extra))
        .start()
}

fn config(nats: &Nats, cluster: &str, managers: &[&str], extra: &str) -> String {
    let mut toml = format!(
        "[listener]\nmax_body_bytes = 4194304\n[cluster]\nnats = \"{}\"\nname = \"{cluster}\"\n{extra}\n",
        nats.url()
    );
    for m in managers {
        toml.push_str(&format!("[[managers]]\nname = \"{m}\"\n"));
        if *m == "store" {
            // Its keys in its own SQLite file: these servers run without
            // JetStream (tests/store_jetstream.rs has the Store on it).
            toml.push_str("builtin = \"store\"\n[managers.config]\nbackend = \"sqlite\"\n");
        }
        if *m == "ticker" {
            toml.push_str("[managers.config]\ninterval_ms = 50\n");
        }
    }
    toml
}

/// A cluster name of its own per test: the tests may share nothing.
fn cluster_name(tag: &str) -> String {
    format!("{tag}-{}", std::process::id())
}

fn ready(g: &Group) -> Value {
    get(g.addr, "/ready").unwrap().json()
}

/// The cluster link's state as `switchyard status` shows it.
fn router_state(g: &Group) -> Value {
    g.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "router")
        .map(|p| p["load"]["cluster"]["state"].clone())
        .unwrap_or_default()
}

#[test]
fn calls_bodies_and_notifications_cross_groups_and_a_group_that_leaves_gets_503() {
    let nats = Nats::start(&[]);
    let name = cluster_name("calls");
    let a = group("cluster-a", &nats, &name, &["basics"], "");
    let mut b = group("cluster-b", &nats, &name, &["payload", "ticker"], "");
    let c = group("cluster-c", &nats, &name, &["basics"], "");

    // The demo: a route only B serves answers on A, served by B.
    a.eventually_status("/payload/100", 200);
    let r = get(a.addr, "/payload/100").unwrap();
    assert_eq!(r.body.len(), 100);
    // A body past the shared-memory threshold crosses as bytes and is
    // handed to A's listener in shared memory again.
    let r = get(a.addr, "/payload/300000").unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), 300_000);
    // Past the server's max_payload (1 MiB by default): the serving group
    // cannot send it, and says so (docs/cluster.md#bodies).
    let r = get(a.addr, "/payload/2000000").unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("max_payload"), "{}", r.text());
    // A request body past it: refused at the caller with 413.
    let big = vec![b'x'; 1_500_000];
    let r = request(a.addr, "POST", "/echo-bytes", &big).unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    let r = request(a.addr, "POST", "/echo-bytes", b"across").unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, &b"across"[..]));
    // A request body in shared memory on A is copied into the message,
    // and put in shared memory again on B.
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let r = request(a.addr, "POST", "/echo-bytes", &body).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.body == body, "the 200 KB body came back intact");
    // A's own routes are A's.
    assert_eq!(get(a.addr, "/noop").unwrap().status, 200);
    eventually("A has heard from B and C", PATIENCE, || {
        let link = ready(&a)["cluster"].clone();
        (link["state"] == "connected" && link["peers"] == 2)
            .then_some(())
            .ok_or(link)
    });

    // B's ticks reach WebSocket clients on A and on C, each exactly once:
    // consecutive numbers, no repeats (a loop or a double delivery would
    // repeat one).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        for g in [&a, &c] {
            let client = Client::connect(&format!("ws://{}/ws", g.addr)).await.unwrap();
            let mut sub = client.subscribe("demo.tick").await.unwrap();
            let mut seen = Vec::new();
            while seen.len() < 20 {
                let push = tokio::time::timeout(PATIENCE, sub.next())
                    .await
                    .expect("a tick from the other group in time")
                    .expect("the subscription goes on");
                assert_eq!(push.event, "demo.tick");
                seen.push(push.data["n"].as_u64().unwrap());
            }
            for pair in seen.windows(2) {
                assert_eq!(pair[1], pair[0] + 1, "each tick once, in order: {seen:?}");
            }
        }
    });

    // B leaves for good: kill -9 of every process it has.
    let mut pids = b.all_pids();
    pids.push(b.supervisor_pid());
    for &pid in &pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGKILL);
    }
    let _ = b.wait_exit();
    // Every one of them gone, the router's NATS connection with it: a call
    // that reached NATS while B's router still held its subscription would
    // be delivered to it and wait out its whole deadline (504), which is
    // not what this checks.
    eventually("B's processes are gone", PATIENCE, || {
        let left: Vec<u32> = pids.iter().copied().filter(|&pid| alive(pid)).collect();
        left.is_empty().then_some(()).ok_or(left)
    });
    // NATS sees its connection close and drops its subscriptions: A's
    // calls to B's types get 503 at once (no responders), not a timeout.
    // A call NATS still handed to B's subscription in the moment it took
    // to see B's connection close would wait for its deadline: each try
    // gives up after a few seconds and the next one is asked afresh.
    eventually("A's calls to B's types get 503", PATIENCE, || {
        let r = get_within(a.addr, "/payload/100", Duration::from_secs(3)).map_err(|e| e.to_string())?;
        (r.status == 503).then_some(()).ok_or(r.status.to_string())
    });
    let started = Instant::now();
    let r = get(a.addr, "/payload/100").unwrap();
    assert_eq!(r.status, 503);
    // The issue's bound (503 within 1 s), not a performance budget: a call
    // held for responders would wait for the 30 s request deadline.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "no responders is immediate, took {:?}",
        started.elapsed()
    );
    assert_eq!(get(a.addr, "/noop").unwrap().status, 200);
    assert_eq!(get(c.addr, "/noop").unwrap().status, 200);
}

#[test]
fn local_traffic_survives_nats_and_the_link_comes_back() {
    let mut nats = Nats::start(&[]);
    let name = cluster_name("outage");
    let a = group("cluster-outage-a", &nats, &name, &["basics"], "");
    let _b = group("cluster-outage-b", &nats, &name, &["payload"], "");
    a.eventually_status("/payload/100", 200);

    nats.kill();
    // The link's loss shows; local routes do not care.
    eventually("A sees the link down", PATIENCE, || {
        let link = ready(&a)["cluster"]["state"].clone();
        (link == "disconnected").then_some(()).ok_or(link)
    });
    for _ in 0..20 {
        assert_eq!(get(a.addr, "/noop").unwrap().status, 200);
    }
    let r = get(a.addr, "/ready").unwrap();
    assert_eq!(
        r.status,
        200,
        "this group still serves its own routes: {}",
        r.text()
    );
    // A call across groups is answered at once, not held for a reconnection.
    let started = Instant::now();
    let r = get(a.addr, "/payload/100").unwrap();
    assert_eq!(r.status, 503, "{}", r.text());
    // Made by the cluster link, and said so (decision 0116).
    assert_eq!(r.header("switchyard-error"), Some("cluster"), "{}", r.text());
    assert_eq!(r.json()["hop"], "cluster", "{}", r.text());
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.text());
    // As above: at once (the issue's 1 s), not after the 30 s deadline.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "took {:?}",
        started.elapsed()
    );
    let status = a.status();
    let router = status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "router")
        .unwrap()
        .clone();
    eventually("status shows the link down", PATIENCE, || {
        let link = router_state(&a);
        (link == "disconnected").then_some(()).ok_or(link)
    });

    // NATS back on its port: the groups reconnect and resubscribe on
    // their own, nobody restarts them.
    nats.restart();
    a.eventually_status("/payload/100", 200);
    eventually("A sees the link up", PATIENCE, || {
        let link = ready(&a)["cluster"]["state"].clone();
        (link == "connected").then_some(()).ok_or(link)
    });
    let after = a.status();
    let router_after = after["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["role"] == "router")
        .unwrap()
        .clone();
    assert_eq!(router["pid"], router_after["pid"], "the router was not restarted");
    eventually("status shows the link up", PATIENCE, || {
        let link = router_state(&a);
        (link == "connected").then_some(()).ok_or(link)
    });
}

#[test]
fn a_manager_calls_a_manager_of_another_group() {
    let nats = Nats::start(&[]);
    let name = cluster_name("mm");
    // `basics` keeps /kv in the built-in Store, which only B runs: each
    // request is basics (A) → A's router → NATS → B's router → store (B).
    let a = group("cluster-mm-a", &nats, &name, &["basics"], "");
    let _b = group("cluster-mm-b", &nats, &name, &["store"], "");
    eventually("A's basics reaches B's store", PATIENCE, || {
        let r = request(a.addr, "PUT", "/kv/across", br#"{"from":"a"}"#).map_err(|e| e.to_string())?;
        (r.status == 204)
            .then_some(())
            .ok_or(format!("{} {}", r.status, r.text()))
    });
    let r = get(a.addr, "/kv/across").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["from"], "a", "{}", r.text());
}

#[test]
fn groups_started_before_nats_link_up_when_it_comes() {
    let mut nats = Nats::not_started();
    let name = cluster_name("late");
    let a = group("cluster-late-a", &nats, &name, &["basics"], "");
    let _b = group("cluster-late-b", &nats, &name, &["payload"], "");
    assert_eq!(ready(&a)["cluster"]["state"], "connecting");
    assert_eq!(get(a.addr, "/noop").unwrap().status, 200);
    // The listener knows no /payload route yet: nobody has told it.
    assert_eq!(get(a.addr, "/payload/100").unwrap().status, 404);
    nats.restart();
    a.eventually_status("/payload/100", 200);
}

#[test]
fn credentials_are_checked_at_start() {
    let nats = Nats::start(&["--user", "sy", "--pass", "s3cret"]);
    let name = cluster_name("auth");
    let wrong = config(&nats, &name, &["basics"], "user = \"sy\"\npassword = \"wrong\"");
    let out = Group::builder("cluster-auth-wrong")
        .config(&wrong)
        .try_start()
        .err()
        .expect("a group with wrong credentials does not start");
    assert!(out.contains("refused the credentials"), "{out}");
    assert!(!out.contains("wrong"), "the password is not logged:\n{out}");

    let right = config(&nats, &name, &["basics"], "user = \"sy\"\npassword = \"s3cret\"");
    let g = Group::builder("cluster-auth-right").config(&right).start();
    eventually("the link is up", PATIENCE, || {
        let link = ready(&g)["cluster"]["state"].clone();
        (link == "connected").then_some(()).ok_or(link)
    });
}

#[test]
fn a_shared_type_is_balanced_over_groups_and_a_bad_section_is_refused() {
    let nats = Nats::start(&[]);
    let name = cluster_name("shared");
    let shared = "shared = [\"demo.Hello\"]";
    let a = group("cluster-shared-a", &nats, &name, &["basics"], shared);
    // B's router says when it routes a request (debug), and B is called
    // by nobody but A here.
    let b = Group::builder("cluster-shared-b")
        .config(&config(&nats, &name, &["basics"], shared))
        .env("SWITCHYARD_LOG", "info,switchyard_router=debug")
        .start();
    // Both serve demo.Hello, a shared type: A's calls go through NATS's
    // queue group, which spreads them over both groups (local first would
    // keep every one on A).
    let mut ids = Vec::new();
    eventually("a call on A is served by B", PATIENCE, || {
        let r = get(a.addr, &format!("/hello/s{}", ids.len())).map_err(|e| e.to_string())?;
        if r.status != 200 {
            return Err(format!("status {}: {}", r.status, r.text()));
        }
        ids.push(r.header("x-request-id").unwrap_or_default().to_owned());
        // Any call so far: B's log line may come a moment after the answer.
        match ids.iter().any(|id| b.has_line(id)) {
            true => Ok(()),
            false => Err(format!("{} calls, all served by A", ids.len())),
        }
    });

    let bad = "[cluster]\nnats = \"http://x\"\nname = \"a.b\"\n";
    let out = Group::builder("cluster-bad")
        .config(bad)
        .try_start()
        .err()
        .expect("a bad [cluster] is refused");
    assert!(
        out.contains("cluster.nats[0]") && out.contains("cluster.name"),
        "{out}"
    );
}

#[test]
fn tls_by_url_scheme_with_a_private_ca_and_a_token() {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    let dir = scratch_dir("cluster-tls");
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "cluster test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let write = |name: &str, text: String| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    };
    let ca_file = write("ca.pem", ca.pem());
    let cert_file = write("cert.pem", leaf.pem());
    let key_file = write("key.pem", key.serialize_pem());
    let nats = Nats::start(&[
        "--tls",
        "--tlscert",
        &cert_file,
        "--tlskey",
        &key_file,
        "--auth",
        "t0ken",
    ]);
    let name = cluster_name("tls");
    let tls_config = |managers: &[&str]| {
        config(
            &nats,
            &name,
            managers,
            &format!("token = \"t0ken\"\ntls_ca_file = \"{ca_file}\""),
        )
        .replace("nats://", "tls://")
    };
    let a = Group::builder("cluster-tls-a")
        .config(&tls_config(&["basics"]))
        .start();
    let _b = Group::builder("cluster-tls-b")
        .config(&tls_config(&["payload"]))
        .start();
    a.eventually_status("/payload/100", 200);
    assert_eq!(get(a.addr, "/payload/100").unwrap().body.len(), 100);

    // Without the CA, the server's certificate does not verify: the
    // group starts (the server may be fixed) but never links up.
    let untrusted = config(&nats, &name, &["basics"], "token = \"t0ken\"").replace("nats://", "tls://");
    let g = Group::builder("cluster-tls-untrusted").config(&untrusted).start();
    assert_eq!(ready(&g)["cluster"]["state"], "connecting");
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

/// Local routes win over another group's (docs/security-trust.md): B
/// serves `GET /hello/{any}`, which would take A's `GET /hello/{name}` at
/// A's listener, and `GET /bait`, which A has not. A serves B's `/bait`,
/// never B's `/hello/{any}`.
#[test]
fn another_groups_route_never_takes_a_local_one() {
    let nats = Nats::start(&[]);
    let name = cluster_name("shadow");
    let a = group("cluster-shadow-a", &nats, &name, &["basics"], "");
    let rogue = plugin("switchyard-fixture-rogue");
    let scratch = scratch_dir("cluster-shadow-rt");
    let runtime_dir = scratch.path().join("rt");
    let b = Group::builder("cluster-shadow-b")
        .config(&format!(
            "{}[[managers]]\nname = \"rogue\"\nplugin = \"{}\"\n[managers.config]\nruntime_dir = \"{}\"\n",
            config(&nats, &name, &[], ""),
            rogue.display(),
            runtime_dir.display()
        ))
        .runtime_dir(&runtime_dir)
        .start();
    for what in ["serve-hello", "bait"] {
        let r = request(b.addr, "POST", &format!("/attack/{what}"), b"{}").unwrap();
        assert_eq!(r.json()["outcome"], "welcomed", "{}", r.text());
    }
    assert_eq!(get(b.addr, "/hello/x").unwrap().text(), "bait");

    // A has heard B's routes once it serves `/bait`.
    eventually("A serves B's /bait", PATIENCE, || {
        let r = get(a.addr, "/bait").map_err(|e| e.to_string())?;
        (r.status == 200 && r.text() == "bait")
            .then_some(())
            .ok_or(r.status.to_string())
    });
    let r = get(a.addr, "/hello/x").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.text().contains("Hello, x!"),
        "A's own route answers: {}",
        r.text()
    );

    // By name, over A's `/ws`, as by path (decision 0115): B's type with a
    // route on A is reached; B's type whose route A does not serve is as
    // undeclared.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::connect(&format!("ws://{}/ws", a.addr)).await.unwrap();
        let reached = client
            .call::<_, Value>("rogue.Bait", &serde_json::json!({}))
            .await;
        assert!(
            !matches!(reached, Err(switchyard_client::ClientError::Status { .. })),
            "{reached:?}"
        );
        match client
            .call::<_, Value>("rogue.Hello", &serde_json::json!({}))
            .await
        {
            Err(switchyard_client::ClientError::Status { status, .. }) => assert_eq!(status, 404),
            other => panic!("expected 404, got {other:?}"),
        }
    });
}

/// A group that stops cleanly says goodbye: the others forget its routes
/// at once (404, not the 503 of a route remembered for a group that is
/// unreachable) and count it no more, long before `MANIFEST_EXPIRY`
/// (90 s) would have (decision 0102).
#[test]
fn a_group_that_stops_cleanly_is_forgotten_by_the_others_at_once() {
    let nats = Nats::start(&[]);
    let name = cluster_name("leave");
    let a = group("cluster-leave-a", &nats, &name, &["basics"], "");
    let mut b = group("cluster-leave-b", &nats, &name, &["payload"], "");
    a.eventually_status("/payload/100", 200);
    eventually("A hears from B", PATIENCE, || {
        let link = ready(&a)["cluster"].clone();
        (link["peers"] == 1).then_some(()).ok_or(link)
    });
    assert!(b.terminate().success());
    a.eventually_status("/payload/100", 404);
    eventually("A counts no other group", PATIENCE, || {
        let link = ready(&a)["cluster"].clone();
        (link["peers"] == 0).then_some(()).ok_or(link)
    });
    assert_eq!(get(a.addr, "/noop").unwrap().status, 200);
}

/// `GET path`, giving up after `patience`.
fn get_within(addr: std::net::SocketAddr, path: &str, patience: Duration) -> std::io::Result<HttpResponse> {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(patience))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n"
    )?;
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf)?;
    parse_response(&buf)
}
