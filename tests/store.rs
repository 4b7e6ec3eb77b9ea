//! The built-in Store against a real group: the demo's `/kv` routes across
//! a `kill -9` of the store and a restart of the group on the same data
//! directory, the operations from the WebSocket and gRPC clients, watches,
//! atomic increments from two instances of a manager, bad input, and a
//! database the store must refuse. Waits are on answers and on the
//! supervisor's status, bounded by PATIENCE.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::json;
use switchyard_client::store::{Changed, List, Op};
use switchyard_client::{Client, ClientError, GrpcClient};

/// A data directory that outlives one group (removed at the end).
/// A data directory (not made yet) that outlives the groups a test starts
/// on it, removed with its scratch directory.
struct DataDir(std::path::PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl DataDir {
    fn new(tag: &str) -> DataDir {
        let scratch = scratch_dir(tag);
        DataDir(scratch.path().join("data"), scratch)
    }
}

fn put(g: &Group, key: &str, body: &str) -> HttpResponse {
    request(g.addr, "PUT", &format!("/kv/{key}"), body.as_bytes()).unwrap()
}

fn incr(g: &Group, key: &str) -> HttpResponse {
    request(g.addr, "POST", &format!("/kv/{key}/incr"), b"").unwrap()
}

/// `POST /kv/{key}/incr` once the store answers again after a restart
/// (503 while it is down: nothing was applied then).
fn incr_when_back(g: &Group, key: &str) -> i64 {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let r = incr(g, key);
        if r.status == 200 {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            return v["value"].as_i64().unwrap();
        }
        assert_eq!(r.status, 503, "{}", r.text());
        assert!(Instant::now() < deadline, "the store did not come back");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Stops the group off the runtime, so that the clients already dropped
/// can close their connections meanwhile (an open one would hold the
/// listener's drain for its whole grace period).
async fn stop(g: Group) {
    tokio::task::spawn_blocking(move || drop(g)).await.unwrap();
}

/// Clients reach the Store only where the operator opens it (decision
/// 0108; tests/internal_events.rs shows the default).
const EXPOSE: (&str, &str) = ("SWITCHYARD_AUTH__EXPOSE", r#"["store.*"]"#);

fn ws(g: &Group) -> String {
    format!("ws://{}/ws", g.addr)
}

#[test]
fn kv_routes_survive_kill9_of_the_store_and_a_restart_of_the_group() {
    let data = DataDir::new("kv-data");
    let mut g = Group::builder("kv").data_dir(&data.0).start();
    assert_eq!(put(&g, "greeting", r#"{"text":"hi","n":[1,2]}"#).status, 204);
    let r = get(g.addr, "/kv/greeting").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap(),
        json!({"text":"hi","n":[1,2]})
    );
    assert_eq!(get(g.addr, "/kv/absent").unwrap().status, 404);
    for n in 1..=3 {
        assert_eq!(incr_when_back(&g, "visits"), n);
    }

    let old = g.kill9("store");
    g.eventually_restarted("store", old);
    assert_eq!(
        incr_when_back(&g, "visits"),
        4,
        "an acknowledged increment was lost"
    );
    assert_eq!(get(g.addr, "/kv/greeting").unwrap().status, 200);

    assert!(g.terminate().success());
    let g = Group::builder("kv-again").data_dir(&data.0).start();
    assert_eq!(incr_when_back(&g, "visits"), 5);
    let r = get(g.addr, "/kv/greeting").unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text().contains("\"hi\""), "{}", r.text());
}

#[test]
fn group_commit_acknowledged_writes_survive_kill9_of_the_store() {
    let g = Group::builder("kv-group")
        .config(
            "[[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
             [managers.config]\ndurability = \"group\"\ngroup_commit_ms = 1000\n\n\
             [[managers]]\nname = \"basics\"\n",
        )
        .start();
    for n in 1..=50 {
        assert_eq!(incr_when_back(&g, "n"), n);
    }
    // Killed well within one group-commit period: the writes were not
    // fsynced yet, but they are in the kernel, which a kill -9 leaves.
    let old = g.kill9("store");
    g.eventually_restarted("store", old);
    assert_eq!(incr_when_back(&g, "n"), 51);
}

#[tokio::test]
async fn operations_from_websocket_and_grpc_clients() {
    let g = Group::builder("store-ops").env(EXPOSE.0, EXPOSE.1).start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let store = client.store();
    assert_eq!(store.get::<u64>("n").await.unwrap(), None);
    store.set("n", &41u64, None).await.unwrap();
    assert_eq!(store.get::<u64>("n").await.unwrap(), Some(41));
    assert_eq!(store.increment("n", 1).await.unwrap(), 42);

    // The same data from the gRPC client.
    let grpc = GrpcClient::connect(&format!("http://{}", g.addr)).await.unwrap();
    assert_eq!(grpc.store().get::<i64>("n").await.unwrap(), Some(42));

    // A lock: one holder, released by its version.
    let lock = store
        .set_if_absent("lock", &"a", Some(Duration::from_secs(60)))
        .await
        .unwrap();
    assert!(lock.swapped);
    let other = grpc.store().set_if_absent("lock", &"b", None).await.unwrap();
    assert!(!other.swapped);
    assert!(store.delete_version("lock", lock.version).await.unwrap());
    assert!(
        grpc.store()
            .set_if_absent("lock", &"b", None)
            .await
            .unwrap()
            .swapped
    );

    // Compare-and-set by version.
    let e = store.entry("n").await.unwrap();
    assert!(
        !store
            .compare_and_set("n", e.version + 1, &0)
            .await
            .unwrap()
            .swapped
    );
    assert!(store.compare_and_set("n", e.version, &0).await.unwrap().swapped);

    // A short TTL: gone once it runs out (polled, bounded by PATIENCE).
    store
        .set("brief", &true, Some(Duration::from_millis(50)))
        .await
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    while store.get::<bool>("brief").await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the key never expired");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    for i in 0..5 {
        store.set(&format!("list:{i}"), &i, None).await.unwrap();
    }
    let page = store
        .list(&List {
            prefix: "list:".into(),
            limit: Some(3),
            ..List::default()
        })
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 3);
    assert_eq!(page.next.as_deref(), Some("list:2"));

    // Watches: the changes under a prefix reach a subscribed client.
    let mut changes = store.changes("cart:").await.unwrap();
    store.set("cart:7", &json!({"items": 1}), None).await.unwrap();
    store.set("elsewhere", &1, None).await.unwrap();
    store.delete("cart:7").await.unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let push = tokio::time::timeout(PATIENCE, changes.next())
            .await
            .unwrap()
            .unwrap();
        let c: Changed = push.data_as().unwrap();
        seen.push((c.key, c.op));
    }
    assert_eq!(
        seen,
        [("cart:7".to_owned(), Op::Set), ("cart:7".to_owned(), Op::Delete)]
    );
    assert!(store.unwatch("cart:").await.unwrap());

    // The same over gRPC, for a single key.
    let mut on_grpc = grpc.store().changes("profile:1").await.unwrap();
    store
        .set("profile:1", &json!({"name": "Ada"}), None)
        .await
        .unwrap();
    let push = tokio::time::timeout(PATIENCE, on_grpc.next())
        .await
        .unwrap()
        .unwrap();
    let c: Changed = push.data_as().unwrap();
    assert_eq!(
        (c.key.as_str(), c.value_as::<serde_json::Value>().unwrap()),
        ("profile:1", json!({"name": "Ada"}))
    );
    drop((changes, on_grpc, client, grpc));
    stop(g).await;
}

#[tokio::test]
async fn bad_input_gets_a_status_and_the_store_keeps_serving() {
    let g = Group::builder("store-bad")
        .config(
            "[auth]\nexpose = [\"store.*\"]\n\n\
             [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
             [managers.config]\nmax_key_bytes = 64\nmax_value_bytes = 1024\n\n\
             [[managers]]\nname = \"basics\"\n",
        )
        .start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let store = client.store();
    let status = |r: Result<u64, ClientError>| match r {
        Err(ClientError::Status { status, problem }) => (status, problem.to_string()),
        other => panic!("expected an error status, got {other:?}"),
    };
    let (code, problem) = status(store.set(&"k".repeat(65), &1, None).await);
    assert_eq!(code, 413);
    assert!(problem.contains("max_key_bytes"), "{problem}");
    let (code, problem) = status(store.set("big", &"x".repeat(2000), None).await);
    assert_eq!(code, 413);
    assert!(problem.contains("max_value_bytes"), "{problem}");

    store.set("word", &"text", None).await.unwrap();
    match store.increment("word", 1).await {
        Err(ClientError::Status { status: 409, problem }) => {
            assert!(problem.to_string().contains("not an integer"), "{problem}")
        }
        other => panic!("expected 409, got {other:?}"),
    }
    match store.get::<u64>("word").await {
        Err(ClientError::Decode(message)) => assert!(message.contains("`word`"), "{message}"),
        other => panic!("expected a decode error, got {other:?}"),
    }
    // Over HTTP: a body that is not JSON is 400, a missing field 422.
    let r = put(&g, "x", "{not json");
    assert_eq!(r.status, 400, "{}", r.text());
    let r = request(g.addr, "POST", "/kv/x/incr", br#"{"by":"many"}"#).unwrap();
    assert_eq!(r.status, 422, "{}", r.text());
    // And the store goes on.
    assert_eq!(store.increment("fine", 2).await.unwrap(), 2);
    drop(client);
    stop(g).await;
}

#[tokio::test]
async fn increments_from_two_instances_are_atomic() {
    let g = Group::builder("store-two")
        .config(
            "[[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\n\
             [[managers]]\nname = \"basics\"\ninstances = 2\n",
        )
        .start();
    let addr = g.addr;
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::task::spawn_blocking(move || {
                (0..25)
                    .map(|_| {
                        let r = request(addr, "POST", "/kv/ids/incr", b"").unwrap();
                        assert_eq!(r.status, 200, "{}", r.text());
                        serde_json::from_slice::<serde_json::Value>(&r.body).unwrap()["value"]
                            .as_i64()
                            .unwrap()
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let mut ids = Vec::new();
    for t in tasks {
        ids.extend(t.await.unwrap());
    }
    ids.sort_unstable();
    assert_eq!(ids, (1..=200).collect::<Vec<_>>(), "every id handed out once");
}

#[test]
fn a_corrupted_database_stops_the_start_with_its_reason() {
    let data = DataDir::new("corrupt");
    std::fs::create_dir_all(&data.0).unwrap();
    std::fs::write(data.0.join("store.db"), vec![0x5a; 8192]).unwrap();
    let out = Group::builder("corrupt")
        .data_dir(&data.0)
        .try_start()
        .err()
        .expect("the group must not start on a corrupted database");
    assert!(out.contains("store.db"), "{out}");
    assert!(out.contains("file is not a database"), "{out}");
    assert!(out.contains("store exited during start-up"), "{out}");
}

#[test]
fn an_unusable_database_stops_the_start_with_its_reason() {
    // Where the database file should be there is a directory: SQLite cannot
    // open it (root ignores permission bits, so a read-only file would not
    // show this here).
    let data = DataDir::new("unusable");
    std::fs::create_dir_all(data.0.join("store.db")).unwrap();
    let out = Group::builder("unusable")
        .data_dir(&data.0)
        .try_start()
        .err()
        .expect("the group must not start on an unusable database");
    assert!(out.contains("cannot use the database"), "{out}");
    assert!(out.contains("store.db"), "{out}");
}

#[test]
fn a_data_directory_serves_one_group_at_a_time() {
    let data = DataDir::new("shared");
    let _first = Group::builder("first").data_dir(&data.0).start();
    let out = Group::builder("second")
        .data_dir(&data.0)
        .try_start()
        .err()
        .expect("a second group on the same data must not start");
    assert!(out.contains("in use by another store"), "{out}");
}

#[test]
fn bad_builtin_settings_are_configuration_errors_naming_the_key() {
    let scratch = scratch_dir("check");
    let path = scratch.path().join("switchyard.toml");
    std::fs::write(
        &path,
        "[[managers]]\nname = \"store\"\nbuiltin = \"store\"\ninstances = 2\n\
         [managers.config]\ndurability = \"sometimes\"\n\n\
         [[managers]]\nname = \"kv\"\nbuiltin = \"kv\"\n\n\
         [[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n\
         [managers.config]\ndata_dir = \"/elsewhere\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["check", "-c"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    let _ = std::fs::remove_file(&path);
    assert_eq!(out.status.code(), Some(64), "{text}");
    for needle in [
        "managers[0].instances: the built-in `store` runs as one instance",
        "managers[1].builtin: no built-in manager `kv`",
        "config.durability: unknown variant `sometimes`",
        "managers[2].config.data_dir: set the data directory with `data.dir` or `--data-dir`",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
}

#[test]
fn a_data_directory_that_cannot_be_made_stops_up_before_any_process() {
    let scratch = scratch_dir("blocker");
    let blocker = scratch.path().join("blocker");
    std::fs::write(&blocker, b"a file, not a directory").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["up", "--bind", "127.0.0.1:0", "--data-dir"])
        .arg(blocker.join("data"))
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&blocker);
    let text = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("data.dir: cannot create"), "{text}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("started"),
        "a process started"
    );
}

/// Decision 0114: what a manager keeps in the Store is its own. A client
/// the operator lets in (`[auth] expose`) neither reads nor overwrites the
/// demo's `/kv` keys, which are the `basics` manager's; a namespace the
/// configuration shares is one for both.
#[tokio::test]
async fn a_managers_keys_are_its_own_and_shared_namespaces_everyones() {
    let g = Group::builder("store-scopes")
        .config(
            "[auth]\nexpose = [\"store.*\"]\n\n\
             [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
             [managers.config]\nshared = [\"counters:\"]\n\n\
             [[managers]]\nname = \"basics\"\n",
        )
        .start();
    assert_eq!(put(&g, "greeting", r#""from basics""#).status, 204);
    let client = Client::connect(&ws(&g)).await.unwrap();
    let store = client.store();
    // Not the client's to read, nor to overwrite.
    assert_eq!(store.get::<String>("greeting").await.unwrap(), None);
    store.set("greeting", &"from a client", None).await.unwrap();
    let r = get(g.addr, "/kv/greeting").unwrap();
    assert_eq!(r.text(), r#""from basics""#);
    assert!(!store.delete("nothing-of-mine").await.unwrap());
    assert_eq!(
        store.get::<String>("greeting").await.unwrap().as_deref(),
        Some("from a client")
    );
    // One counter in the shared namespace, whoever counts.
    assert_eq!(incr(&g, "counters:hits").status, 200);
    assert_eq!(store.increment("counters:hits", 1).await.unwrap(), 2);
    let r = incr(&g, "counters:hits");
    assert_eq!(r.json()["value"], 3, "{}", r.text());
    drop(client);
    stop(g).await;
}
