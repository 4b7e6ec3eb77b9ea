//! The Store on JetStream (docs/store.md, docs/cluster.md): three real
//! `nats-server -js` processes clustered on loopback, replicas 3, and two
//! real groups joined to them, each running its own Store on the one
//! bucket. Counters stay exact across groups and across the loss of one
//! server; two servers lost answer 503 at once and the service comes back
//! by itself when they do.

mod common;

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::jetstream::*;
use common::*;
use futures_util::StreamExt;
use serde_json::json;
use switchyard_client::store::{Changed, List};
use switchyard_client::{Client, ClientError};

/// A group joined to `js` running the Store (on JetStream, as `[cluster]`
/// makes it) and `basics` (`/kv` routes), the Store open to clients.
fn group(tag: &'static str, js: &JsCluster, name: &str) -> Group {
    Group::builder(tag)
        .config(&format!(
            "[auth]\nexpose = [\"store.*\"]\n\
             [cluster]\nnats = [{}]\nname = \"{name}\"\n\
             [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
             [managers.config]\nreplicas = 3\nop_timeout_ms = 3000\n\
             [[managers]]\nname = \"basics\"\n",
            js.urls()
        ))
        .start()
}

fn ws(g: &Group) -> String {
    format!("ws://{}/ws", g.addr)
}

fn status_of<T>(r: &Result<T, ClientError>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(ClientError::Status { status, .. }) => *status,
        Err(e) => panic!("not an answer: {e}"),
    }
}

/// Increments `key` `n` times from each of `clients` WebSocket clients of
/// each group, retrying what was refused (503: not applied). Returns the
/// increments acknowledged and those whose outcome is unknown (504).
async fn hammer(groups: &[&Group], key: &str, clients: usize, n: usize) -> (u64, u64) {
    let acked = Arc::new(AtomicU64::new(0));
    let unknown = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for g in groups {
        for _ in 0..clients {
            let (url, key) = (ws(g), key.to_owned());
            let (acked, unknown) = (acked.clone(), unknown.clone());
            tasks.push(tokio::spawn(async move {
                let client = Client::connect(&url).await.unwrap();
                let store = client.store();
                for _ in 0..n {
                    let deadline = Instant::now() + PATIENCE * 2;
                    loop {
                        let r = tokio::time::timeout(PATIENCE, store.increment(&key, 1))
                            .await
                            .expect("an increment is answered, never held");
                        match status_of(&r) {
                            200 => {
                                acked.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            504 => {
                                unknown.fetch_add(1, Ordering::Relaxed);
                                break;
                            }
                            503 => {
                                assert!(Instant::now() < deadline, "the store did not come back");
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                            other => panic!("increment answered {other}: {r:?}"),
                        }
                    }
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    (acked.load(Ordering::Relaxed), unknown.load(Ordering::Relaxed))
}

/// The counter's value, once the store of `g` answers (503: not yet).
async fn counter(g: &Group, key: &str) -> i64 {
    let client = Client::connect(&ws(g)).await.unwrap();
    let store = client.store();
    eventually_async("the store answers", || async {
        let r = tokio::time::timeout(PATIENCE, store.get::<i64>(key))
            .await
            .expect("answered, not held");
        match r {
            Ok(v) => Ok(v.unwrap_or(0)),
            Err(ClientError::Status { status: 503, problem }) => Err(problem),
            Err(e) => panic!("reading `{key}`: {e}"),
        }
    })
    .await
}

/// Waits until the store of `g` answers (JetStream elected its leaders).
async fn until_served(g: &Group) {
    let client = Client::connect(&ws(g)).await.unwrap();
    let store = client.store();
    let deadline = Instant::now() + PATIENCE * 2;
    loop {
        let r = tokio::time::timeout(PATIENCE, store.get::<serde_json::Value>("ready?"))
            .await
            .expect("answered");
        if r.is_ok() {
            return;
        }
        assert_eq!(status_of(&r), 503, "{r:?}");
        assert!(Instant::now() < deadline, "the store never came up: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn stop(g: Group) {
    tokio::task::spawn_blocking(move || drop(g)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_store_across_groups_survives_one_server_and_answers_503_without_quorum() {
    let mut js = JsCluster::start("js-store");
    let name = format!("jss-{}", std::process::id());
    let a = group("js-store-a", &js, &name);
    let b = group("js-store-b", &js, &name);
    until_served(&a).await;
    until_served(&b).await;

    // A value written through one group is read through the other.
    let ca = Client::connect(&ws(&a)).await.unwrap();
    let cb = Client::connect(&ws(&b)).await.unwrap();
    let (sa, sb) = (ca.store(), cb.store());
    sa.set("greeting", &json!({"text": "hi"}), None).await.unwrap();
    let seen: Option<serde_json::Value> = sb.get("greeting").await.unwrap();
    assert_eq!(seen, Some(json!({"text": "hi"})));
    // Compare-and-set and set-if-absent across groups.
    let entry = sb.entry("greeting").await.unwrap();
    assert!(
        sb.compare_and_set("greeting", entry.version, &"b")
            .await
            .unwrap()
            .swapped
    );
    assert!(
        !sa.compare_and_set("greeting", entry.version, &"a")
            .await
            .unwrap()
            .swapped
    );
    assert!(
        sa.set_if_absent("lock", &"a", Some(Duration::from_secs(60)))
            .await
            .unwrap()
            .swapped
    );
    assert!(!sb.set_if_absent("lock", &"b", None).await.unwrap().swapped);
    // A TTL: gone for both once it passes (the purge or the read's filter).
    sa.set("brief", &1, Some(Duration::from_millis(200)))
        .await
        .unwrap();
    eventually_async("the short-lived key expires", || async {
        let v: Option<i64> = sb.get("brief").await.unwrap();
        v.is_none().then_some(()).ok_or(v)
    })
    .await;
    // Listing by prefix, paged, in key order.
    for i in 0..5 {
        sb.set(&format!("list:{i}"), &i, None).await.unwrap();
    }
    let page = sa
        .list(&List {
            prefix: "list:".into(),
            limit: Some(3),
            ..List::default()
        })
        .await
        .unwrap();
    let keys: Vec<&str> = page.entries.iter().map(|e| e.key.as_str()).collect();
    assert_eq!(keys, ["list:0", "list:1", "list:2"]);
    assert_eq!(page.next.as_deref(), Some("list:2"));
    let rest = sa
        .list(&List {
            prefix: "list:".into(),
            after: page.next.clone(),
            ..List::default()
        })
        .await
        .unwrap();
    assert_eq!(rest.entries.len(), 2);
    assert_eq!(rest.next, None);

    // A watch made in B sees a write made through A.
    let mut changes = sb.changes("cart:").await.unwrap();
    sa.set("cart:1", &json!({"items": 2}), None).await.unwrap();
    let push = tokio::time::timeout(PATIENCE, changes.next())
        .await
        .expect("B's watch hears of A's write")
        .unwrap();
    let c: Changed = push.data_as().unwrap();
    assert_eq!(c.key, "cart:1");
    assert_eq!(c.value_as::<serde_json::Value>().unwrap(), json!({"items": 2}));
    drop(changes);

    // 16 clients on each group increment one counter: exact.
    let (acked, unknown) = hammer(&[&a, &b], "hits", 16, 10).await;
    assert_eq!((acked, unknown), (320, 0));
    assert_eq!(counter(&a, "hits").await, 320);
    assert_eq!(counter(&b, "hits").await, 320);

    // One server of three killed under load: every acknowledged increment
    // is kept; what was refused (503) was not applied.
    let both = [&a, &b];
    let load = hammer(&both, "under-load", 8, 25);
    let killer = async {
        // Some increments made first, so the kill lands mid-load.
        eventually_async("the load started", || async {
            let n = counter(&a, "under-load").await;
            (n >= 20).then_some(()).ok_or(n)
        })
        .await;
        js.servers[0].kill();
    };
    let ((acked, unknown), ()) = tokio::join!(load, killer);
    let total = counter(&b, "under-load").await as u64;
    assert!(
        total >= acked && total <= acked + unknown,
        "{total} increments kept, {acked} acknowledged, {unknown} unknown"
    );
    assert_eq!(acked + unknown, 400, "every increment answered");

    // Two of three gone: no quorum. A write finds out within the
    // operation's timeout (what the last leader still answers of reads is
    // the last committed state); from then on every call is refused at
    // once, reads too, until a write is acknowledged again.
    js.servers[1].kill();
    for store in [&sa, &sb] {
        eventually_async("a write is refused without quorum", || async {
            let r = tokio::time::timeout(PATIENCE, store.increment("hits", 1))
                .await
                .expect("answered, not held");
            matches!(status_of(&r), 503 | 504).then_some(()).ok_or(r)
        })
        .await;
        let r = tokio::time::timeout(PATIENCE, store.get::<i64>("hits"))
            .await
            .expect("answered, not held");
        assert_eq!(status_of(&r), 503, "{r:?}");
    }
    eventually("A's /kv answers 503 with Retry-After", PATIENCE, || {
        let r = get(a.addr, "/kv/hits").map_err(|e| e.to_string())?;
        (r.status == 503 && r.header("retry-after").is_some())
            .then_some(())
            .ok_or(format!("{} {}", r.status, r.text()))
    });
    let pids = (a.pid_of("store"), b.pid_of("store"));

    // Both back: the stores serve again by themselves.
    js.servers[0].spawn();
    js.servers[1].spawn();
    until_served(&a).await;
    until_served(&b).await;
    let before = counter(&a, "hits").await;
    assert!(before >= 320, "{before}");
    let (acked, unknown) = hammer(&[&a, &b], "hits", 4, 5).await;
    assert_eq!(acked + unknown, 40);
    let after = counter(&b, "hits").await;
    assert!(
        after >= before + acked as i64 && after <= before + (acked + unknown) as i64,
        "{before} + {acked} (+{unknown} unknown) != {after}"
    );
    assert_eq!(
        (a.pid_of("store"), b.pid_of("store")),
        pids,
        "no store was restarted"
    );
    drop((ca, cb));
    stop(a).await;
    stop(b).await;
}

/// `switchyard store export|import` with `args`; its stderr on success.
fn store_cli(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("store")
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("switchyard runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "switchyard store {args:?} failed: {stderr}");
    stderr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_and_import_move_a_store_from_sqlite_to_a_bucket_and_back() {
    let scratch = scratch_dir("js-move");
    let dir = scratch.path();
    let js = {
        // One server is enough here: replicas = 1.
        let mut s = Server {
            child: None,
            name: format!("move-{}", std::process::id()),
            port: free_port(),
            routes_port: 0,
            store: dir.join("js"),
            routes: String::new(),
            cluster: String::new(),
        };
        s.spawn();
        s
    };
    let store_only = "[auth]\nexpose = [\"store.*\"]\n[[managers]]\nname = \"store\"\nbuiltin = \"store\"\n";
    let sqlite_cfg = dir.join("sqlite.toml");
    std::fs::write(&sqlite_cfg, store_only).unwrap();
    let js_cfg = dir.join("js.toml");
    std::fs::write(
        &js_cfg,
        format!(
            "{store_only}[managers.config]\nreplicas = 1\n[cluster]\nnats = \"{}\"\nname = \"move-{}\"\n",
            js.url(),
            std::process::id()
        ),
    )
    .unwrap();

    // Keys in a SQLite store, written through a group that is then stopped.
    let first = dir.join("first");
    let g = Group::builder("js-move-sqlite")
        .config_file(&sqlite_cfg)
        .data_dir(&first)
        .start();
    {
        let client = Client::connect(&ws(&g)).await.unwrap();
        let store = client.store();
        store.set("user:1", &json!({"name": "Ada"}), None).await.unwrap();
        store
            .set("user:2", &json!({"name": "Grace"}), None)
            .await
            .unwrap();
        store.increment("visits", 41).await.unwrap();
        store
            .set("session:x", &"soon gone", Some(Duration::from_secs(3600)))
            .await
            .unwrap();
    }
    stop(g).await;

    let lines = dir.join("keys.jsonl");
    let (first_s, lines_s, js_s) = (
        first.to_str().unwrap(),
        lines.to_str().unwrap(),
        js_cfg.to_str().unwrap(),
    );
    let said = store_cli(&[
        "export",
        "-c",
        sqlite_cfg.to_str().unwrap(),
        "--data-dir",
        first_s,
        "--file",
        lines_s,
    ]);
    assert!(said.contains("exported 4 keys"), "{said}");
    let exported = std::fs::read_to_string(&lines).unwrap();
    assert!(
        // Keys move as stored, each in its caller's scope (decision 0114):
        // an anonymous client wrote these.
        exported.contains(r#""key":"\u0000client:\u0000session:x""#) && exported.contains("expires_at_ms"),
        "{exported}"
    );
    // The JetStream commands open no database; a data directory of the
    // test's own keeps them out of the default one.
    let unused = dir.join("unused");
    let unused_s = unused.to_str().unwrap();
    let said = store_cli(&["import", "-c", js_s, "--data-dir", unused_s, "--file", lines_s]);
    assert!(said.contains("imported 4 keys"), "{said}");

    // A clustered group finds them in the bucket, and adds one.
    let g = Group::builder("js-move-bucket")
        .config_file(&js_cfg)
        .data_dir(&unused)
        .start();
    until_served(&g).await;
    {
        let client = Client::connect(&ws(&g)).await.unwrap();
        let store = client.store();
        let ada: Option<serde_json::Value> = store.get("user:1").await.unwrap();
        assert_eq!(ada, Some(json!({"name": "Ada"})));
        assert_eq!(store.increment("visits", 1).await.unwrap(), 42);
        let session = store.entry("session:x").await.unwrap();
        assert!(session.expires_at_ms.is_some(), "the expiry moved with the key");
        store.set("from-bucket", &true, None).await.unwrap();
    }
    stop(g).await;

    // And back into a fresh SQLite store.
    let back = dir.join("back.jsonl");
    let said = store_cli(&[
        "export",
        "-c",
        js_s,
        "--data-dir",
        unused_s,
        "--file",
        back.to_str().unwrap(),
    ]);
    assert!(said.contains("exported 5 keys"), "{said}");
    let second = dir.join("second");
    let said = store_cli(&[
        "import",
        "-c",
        js_s,
        "--backend",
        "sqlite",
        "--data-dir",
        second.to_str().unwrap(),
        "--file",
        back.to_str().unwrap(),
    ]);
    assert!(said.contains("imported 5 keys"), "{said}");
    let g = Group::builder("js-move-back")
        .config_file(&sqlite_cfg)
        .data_dir(&second)
        .start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let store = client.store();
    assert_eq!(store.get::<i64>("visits").await.unwrap(), Some(42));
    assert_eq!(store.get::<bool>("from-bucket").await.unwrap(), Some(true));
    drop(client);
    stop(g).await;
    drop(js);
}

#[test]
fn jetstream_settings_are_checked_before_anything_starts() {
    let scratch = scratch_dir("js-check");
    let path = scratch.path().join("switchyard.toml");
    let check = |toml: &str| {
        std::fs::write(&path, toml).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(["check", "-c"])
            .arg(&path)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, text) = check(
        "[[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
         [managers.config]\nbackend = \"jetstream\"\ncluster = { nats = \"nats://127.0.0.1:1\" }\n",
    );
    assert_eq!(code, Some(64), "{text}");
    for needle in [
        "managers[0].config.backend: `jetstream` needs `[cluster]`",
        "managers[0].config.cluster: the built-ins take the NATS servers from `[cluster]`",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let (code, text) = check(
        "[cluster]\nnats = \"nats://127.0.0.1:1\"\n\
         [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
         [managers.config]\nreplicas = 7\nbackend = \"cloud\"\n",
    );
    assert_eq!(code, Some(64), "{text}");
    assert!(text.contains("config.backend: unknown variant `cloud`"), "{text}");
    let (code, text) = check(
        "[cluster]\nnats = \"nats://127.0.0.1:1\"\n\
         [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
         [managers.config]\nreplicas = 7\n",
    );
    assert_eq!(code, Some(64), "{text}");
    assert!(text.contains("config.replicas: must be 1 to 5"), "{text}");
}
