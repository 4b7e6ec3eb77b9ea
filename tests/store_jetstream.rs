//! The Store on JetStream (docs/store.md, docs/cluster.md): three real
//! `nats-server -js` processes clustered on loopback, replicas 3, and two
//! real groups joined to them, each running its own Store on the one
//! bucket. Counters stay exact across groups and across the loss of one
//! server; two servers lost answer 503 at once and the service comes back
//! by itself when they do.
//!
//! The Store's contract — every operation's answers as clients and the
//! SDK's `cx.store()` see them — is one test body run against a group on
//! SQLite and a group on JetStream.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::jetstream::*;
use common::*;
use futures_util::StreamExt;
use serde_json::json;
use switchyard_client::store::{Changed, List, Op};
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
    // TTLs, listing and the answers of each operation: the contract
    // below, the same on both back ends.

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
    let (acked, unknown) = hammer(&[&a, &b], "hits", 16, 10).await.counted();
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
    let (load, ()) = tokio::join!(load, killer);
    let (acked, unknown) = load.counted();
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
    let (acked, unknown) = hammer(&[&a, &b], "hits", 4, 5).await.counted();
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

/// A group whose Store runs on SQLite (`js`: none) or on the bucket of
/// one JetStream server, with `basics` (`/kv`, the SDK's `cx.store()`)
/// and a purge round every 100 ms (expiries are seen soon).
fn contract_group(tag: &'static str, js: Option<&Server>) -> Group {
    let cluster = js.map_or(String::new(), |s| {
        format!(
            "[cluster]\nnats = \"{}\"\nname = \"contract-{}\"\n",
            s.url(),
            std::process::id()
        )
    });
    Group::builder(tag)
        .config(&format!(
            "[auth]\nexpose = [\"store.*\"]\n{cluster}\
             [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
             [managers.config]\nreplicas = 1\npurge_interval_ms = 100\nmax_key_bytes = 64\n\
             [[managers]]\nname = \"basics\"\n"
        ))
        .start()
}

/// The problem a refused call answered: its status and detail.
fn refusal<T: std::fmt::Debug>(r: Result<T, ClientError>) -> (u16, String) {
    match r {
        Err(ClientError::Status { status, problem }) => (status, problem.to_string()),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// One Store contract, whatever the back end: each operation's answer
/// (status, body) through a real group, to a WebSocket client and over
/// HTTP through `basics`' `cx.store()`. Versions are compared, never
/// spelled: SQLite counts writes, JetStream numbers the bucket's messages
/// (watch records and deletions too, decision 0135) — both only grow.
async fn store_contract(g: &Group) {
    let client = Client::connect(&ws(g)).await.unwrap();
    let store = client.store();

    // Get / set / delete.
    let absent = store.entry("k").await.unwrap();
    assert!(
        !absent.found && absent.version == 0 && absent.expires_at_ms.is_none(),
        "{absent:?}"
    );
    let v1 = store.set("k", &json!({"a": 1}), None).await.unwrap();
    let e = store.entry("k").await.unwrap();
    assert!(e.found && e.version == v1 && e.expires_at_ms.is_none(), "{e:?}");
    assert_eq!(e.value.decode::<serde_json::Value>().unwrap(), json!({"a": 1}));
    let v2 = store.set("k", &"two", None).await.unwrap();
    assert!(v2 > v1, "{v2} after {v1}");
    assert!(store.delete("k").await.unwrap());
    assert!(!store.delete("k").await.unwrap(), "deleting an absent key");
    assert_eq!(store.get::<String>("k").await.unwrap(), None);

    // A TTL: the entry shows its expiry, then is gone for reads, lists and
    // conditional writes alike.
    let before = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    store
        .set("ttl", &1, Some(Duration::from_millis(300)))
        .await
        .unwrap();
    let e = store.entry("ttl").await.unwrap();
    let at = e.expires_at_ms.expect("an expiry");
    assert!(at >= before + 300, "expires at {at}, set after {before}");
    eventually_async("the key expires", || async {
        let v: Option<i64> = store.get("ttl").await.unwrap();
        v.is_none().then_some(()).ok_or(v)
    })
    .await;
    assert!(
        store.set_if_absent("ttl", &2, None).await.unwrap().swapped,
        "an expired key is absent"
    );

    // Increment: from nothing, by any amount, on a non-integer refused.
    assert_eq!(store.increment("n", 1).await.unwrap(), 1);
    assert_eq!(store.increment("n", 5).await.unwrap(), 6);
    assert_eq!(store.increment("n", -7).await.unwrap(), -1);
    store.set("word", &"text", None).await.unwrap();
    let (status, problem) = refusal(store.increment("word", 1).await);
    assert_eq!(status, 409);
    assert!(problem.contains("`word` is not an integer"), "{problem}");
    store.set("max", &i64::MAX, None).await.unwrap();
    let (status, problem) = refusal(store.increment("max", 1).await);
    assert_eq!(status, 409);
    assert!(problem.contains("overflows"), "{problem}");

    // Compare-and-set: a stale version is refused with the current one;
    // version 0 means absent.
    let v = store.set("cas", &"a", None).await.unwrap();
    let stale = store.compare_and_set("cas", v + 1000, &"x").await.unwrap();
    assert!(!stale.swapped && stale.version == v, "{stale:?}");
    let zero = store.compare_and_set("cas", 0, &"x").await.unwrap();
    assert!(!zero.swapped && zero.version == v, "{zero:?}");
    let done = store.compare_and_set("cas", v, &"b").await.unwrap();
    assert!(done.swapped && done.version > v, "{done:?}");
    assert_eq!(store.get::<String>("cas").await.unwrap().as_deref(), Some("b"));
    let again = store.compare_and_set("cas", v, &"c").await.unwrap();
    assert!(!again.swapped && again.version == done.version, "{again:?}");
    let created = store.compare_and_set("cas-new", 0, &"new").await.unwrap();
    assert!(created.swapped, "version 0 creates an absent key: {created:?}");

    // Set-if-absent as a lock: one holder, refused with the holder's
    // version, released by it only, free once it expires.
    let lock = store
        .set_if_absent("lock", &"me", Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(lock.swapped);
    let other = store.set_if_absent("lock", &"you", None).await.unwrap();
    assert!(!other.swapped && other.version == lock.version, "{other:?}");
    assert!(!store.delete_version("lock", lock.version + 1000).await.unwrap());
    assert!(store.delete_version("lock", lock.version).await.unwrap());
    let brief = store
        .set_if_absent("lock", &"brief", Some(Duration::from_millis(200)))
        .await
        .unwrap();
    assert!(brief.swapped);
    eventually_async("the lock expires and is taken again", || async {
        let r = store.set_if_absent("lock", &"next", None).await.unwrap();
        r.swapped.then_some(()).ok_or(r)
    })
    .await;

    // List by prefix, in key order, paged; keys only; expired keys left out.
    for i in 0..5 {
        store.set(&format!("list:{i}"), &i, None).await.unwrap();
    }
    store
        .set("list:gone", &0, Some(Duration::from_millis(1)))
        .await
        .unwrap();
    store.set("listless", &0, None).await.unwrap();
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = store
            .list(&List {
                prefix: "list:".into(),
                limit: Some(2),
                after: after.clone(),
                ..List::default()
            })
            .await
            .unwrap();
        let keys: Vec<String> = page.entries.iter().map(|e| e.key.clone()).collect();
        let values: Vec<i64> = page.entries.iter().map(|e| e.value.decode().unwrap()).collect();
        pages.push((keys, values));
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        pages,
        [
            (vec!["list:0".to_owned(), "list:1".to_owned()], vec![0, 1]),
            (vec!["list:2".to_owned(), "list:3".to_owned()], vec![2, 3]),
            (vec!["list:4".to_owned()], vec![4]),
        ]
    );
    let keys_only = store
        .list(&List {
            prefix: "list:".into(),
            keys_only: true,
            after: Some("list:3".into()),
            ..List::default()
        })
        .await
        .unwrap();
    assert_eq!(keys_only.entries.len(), 1);
    assert_eq!(keys_only.entries[0].key, "list:4");
    assert_eq!(keys_only.entries[0].value.as_str(), "null", "keys only");
    assert_eq!(keys_only.next, None);

    // Watch: each change under the prefix once, in order — set, delete,
    // expiry — and nothing outside it; unwatched once.
    let mut changes = store.changes("w:").await.unwrap();
    let set = store.set("w:1", &json!({"n": 1}), None).await.unwrap();
    store.set("x:1", &1, None).await.unwrap();
    assert!(store.delete("w:1").await.unwrap());
    let brief = store
        .set("w:2", &2, Some(Duration::from_millis(100)))
        .await
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..4 {
        let push = tokio::time::timeout(PATIENCE, changes.next())
            .await
            .expect("each change is told")
            .unwrap();
        let c: Changed = push.data_as().unwrap();
        assert_eq!(c.watch, "w:");
        seen.push((
            c.key,
            c.op,
            c.version,
            c.value.decode::<serde_json::Value>().unwrap(),
        ));
    }
    assert_eq!(
        seen,
        [
            ("w:1".to_owned(), Op::Set, set, json!({"n": 1})),
            ("w:1".to_owned(), Op::Delete, set, json!(null)),
            ("w:2".to_owned(), Op::Set, brief, json!(2)),
            ("w:2".to_owned(), Op::Expire, brief, json!(null)),
        ]
    );
    assert!(store.unwatch("w:").await.unwrap());
    assert!(!store.unwatch("w:").await.unwrap());

    // Bad input: the same statuses and reasons.
    let (status, problem) = refusal(store.set(&"k".repeat(65), &1, None).await);
    assert_eq!(status, 413);
    assert!(problem.contains("max_key_bytes"), "{problem}");
    let (status, problem) = refusal(store.set("", &1, None).await);
    assert_eq!(status, 422);
    assert!(problem.contains("must not be empty"), "{problem}");

    // The SDK's `cx.store()` through `basics`' routes.
    let r = get(g.addr, "/kv/nothing").unwrap();
    assert_eq!(r.status, 404, "{}", r.text());
    assert!(r.text().contains("no key `nothing`"), "{}", r.text());
    let r = request(g.addr, "PUT", "/kv/doc", br#"{"title":"x"}"#).unwrap();
    assert!(r.status == 200 || r.status == 204, "{} {}", r.status, r.text());
    let r = get(g.addr, "/kv/doc").unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"title": "x"})));
    let r = request(g.addr, "POST", "/kv/hits/incr", br#"{"by":3}"#).unwrap();
    assert_eq!((r.status, r.json()), (200, json!({"value": 3})), "{}", r.text());
    let r = request(g.addr, "POST", "/kv/doc/incr", br#"{"by":1}"#).unwrap();
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("not an integer"), "{}", r.text());
    drop(client);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_sqlite() {
    let g = contract_group("store-contract-sqlite", None);
    store_contract(&g).await;
    stop(g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_contract_holds_on_jetstream() {
    let scratch = scratch_dir("store-contract-js");
    let js = Server::alone("contract", scratch.path());
    let g = contract_group("store-contract-js", Some(&js));
    until_served(&g).await;
    store_contract(&g).await;
    stop(g).await;
    drop(js);
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
    // One server is enough here: replicas = 1.
    let js = Server::alone("move", dir);
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
    let check = |toml: &str| check_config(scratch.path(), toml);
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
