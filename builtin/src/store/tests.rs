//! The store through the plugin boundary (`TestManager`), on a real
//! database in a temporary directory.

use std::path::PathBuf;

use switchyard_manager::store::*;
use switchyard_manager::testing::TestManager;

use super::Store;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Dir(std::env::temp_dir().join(format!("switchyard-store-{}-{tag}-{n}", std::process::id())))
}

fn store(dir: &Dir, extra: serde_json::Value) -> TestManager<Store> {
    let mut config = serde_json::json!({ "data_dir": dir.0 });
    if let (Some(c), Some(e)) = (config.as_object_mut(), extra.as_object()) {
        c.extend(e.clone());
    }
    TestManager::with_config(config)
}

fn json(v: serde_json::Value) -> JsonText {
    JsonText::encode(&v).unwrap()
}

fn set(s: &mut TestManager<Store>, key: &str, value: serde_json::Value) -> u64 {
    let r = s.request(&Set {
        key: key.into(),
        value: json(value),
        ttl_ms: None,
    });
    assert_eq!(r.status, 200, "{}", r.text());
    r.json::<Written>().version
}

fn get(s: &mut TestManager<Store>, key: &str) -> Entry {
    s.request(&Get { key: key.into() }).json()
}

#[test]
fn every_operation_answers() {
    let d = dir("ops");
    let mut s = store(&d, serde_json::json!({}));
    assert!(!get(&mut s, "a").found);
    let v1 = set(&mut s, "a", serde_json::json!({"x": 1}));
    let e = get(&mut s, "a");
    assert!(e.found);
    assert_eq!(e.version, v1);
    assert_eq!(
        e.value.decode::<serde_json::Value>().unwrap(),
        serde_json::json!({"x": 1})
    );

    let miss: Swapped = s
        .request(&CompareAndSet {
            key: "a".into(),
            version: v1 + 100,
            value: json(2.into()),
            ttl_ms: None,
        })
        .json();
    assert_eq!(
        miss,
        Swapped {
            swapped: false,
            version: v1
        }
    );
    let hit: Swapped = s
        .request(&CompareAndSet {
            key: "a".into(),
            version: v1,
            value: json(2.into()),
            ttl_ms: None,
        })
        .json();
    assert!(hit.swapped && hit.version > v1);

    let lock: Swapped = s
        .request(&SetIfAbsent {
            key: "lock".into(),
            value: json("me".into()),
            ttl_ms: Some(60_000),
        })
        .json();
    assert!(lock.swapped);
    let again: Swapped = s
        .request(&SetIfAbsent {
            key: "lock".into(),
            value: json("you".into()),
            ttl_ms: None,
        })
        .json();
    assert_eq!(
        again,
        Swapped {
            swapped: false,
            version: lock.version
        }
    );
    let wrong: Deleted = s
        .request(&Delete {
            key: "lock".into(),
            version: Some(1),
        })
        .json();
    assert!(!wrong.deleted);
    let released: Deleted = s
        .request(&Delete {
            key: "lock".into(),
            version: Some(lock.version),
        })
        .json();
    assert!(released.deleted);
    let absent: Deleted = s
        .request(&Delete {
            key: "lock".into(),
            version: None,
        })
        .json();
    assert!(!absent.deleted);

    for i in 1..=3 {
        let c: Counter = s
            .request(&Increment {
                key: "n".into(),
                by: 1,
                ttl_ms: None,
            })
            .json();
        assert_eq!(c.value, i);
    }
    set(&mut s, "text", "not a number".into());
    let r = s.request(&Increment {
        key: "text".into(),
        by: 1,
        ttl_ms: None,
    });
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(r.text().contains("not an integer"), "{}", r.text());
}

#[test]
fn limits_are_413_naming_the_setting() {
    let d = dir("limits");
    let mut s = store(&d, serde_json::json!({"max_key_bytes": 8, "max_value_bytes": 16}));
    let r = s.request(&Get { key: "k".repeat(9) });
    assert_eq!(r.status, 413);
    assert!(r.text().contains("max_key_bytes"), "{}", r.text());
    let r = s.request(&Set {
        key: "k".into(),
        value: json("x".repeat(20).into()),
        ttl_ms: None,
    });
    assert_eq!(r.status, 413);
    assert!(r.text().contains("max_value_bytes"), "{}", r.text());
    // Nothing was written, and the store goes on.
    assert!(!get(&mut s, "k").found);
    set(&mut s, "k", serde_json::json!(1));
}

#[test]
fn versions_never_repeat_across_restarts() {
    let d = dir("versions");
    let last = {
        let mut s = store(&d, serde_json::json!({}));
        set(&mut s, "a", 1.into());
        let last = set(&mut s, "b", 2.into());
        let del: Deleted = s
            .request(&Delete {
                key: "b".into(),
                version: None,
            })
            .json();
        assert!(del.deleted);
        last
    };
    let mut s = store(&d, serde_json::json!({}));
    // The deleted key held the highest version; a new write goes past it.
    assert!(set(&mut s, "b", 3.into()) > last);
    assert_eq!(get(&mut s, "a").value.decode::<i64>().unwrap(), 1);
}

#[test]
fn expired_keys_are_not_returned_and_are_purged() {
    let d = dir("ttl");
    let mut s = store(&d, serde_json::json!({}));
    set(&mut s, "keep", 1.into());
    let r = s.request(&Set {
        key: "gone".into(),
        value: json(1.into()),
        ttl_ms: Some(1),
    });
    assert_eq!(r.status, 200);
    // Let the 1 ms TTL run out (a time-based expiry, not a synchronisation).
    std::thread::sleep(std::time::Duration::from_millis(5));
    assert!(!get(&mut s, "gone").found);
    let listed: Listed = s.request(&List::default()).json();
    assert_eq!(
        listed.entries.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        ["keep"]
    );
    let w: Watching = s
        .request(&Watch {
            prefix: "go".into(),
            lease_ms: None,
        })
        .json();
    assert_eq!(w.prefix, "go");
    s.advance(std::time::Duration::from_secs(1));
    let changes = s.notified::<Changed>();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!((changes[0].key.as_str(), changes[0].op), ("gone", Op::Expire));
    let rows: u64 = {
        let conn = rusqlite::Connection::open(d.0.join(crate::db::DB_FILE)).unwrap();
        conn.query_row("SELECT COUNT(*) FROM kv", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(rows, 1, "the expired row was purged");
}

#[test]
fn list_pages_through_a_prefix() {
    let d = dir("list");
    let mut s = store(&d, serde_json::json!({}));
    for k in ["a", "b:1", "b:2", "b:3", "b;", "c"] {
        set(&mut s, k, k.into());
    }
    let first: Listed = s
        .request(&List {
            prefix: "b:".into(),
            limit: Some(2),
            ..List::default()
        })
        .json();
    assert_eq!(
        first.entries.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        ["b:1", "b:2"]
    );
    assert_eq!(first.next.as_deref(), Some("b:2"));
    let rest: Listed = s
        .request(&List {
            prefix: "b:".into(),
            after: first.next,
            limit: Some(2),
            keys_only: true,
        })
        .json();
    assert_eq!(
        rest.entries.iter().map(|e| e.key.as_str()).collect::<Vec<_>>(),
        ["b:3"]
    );
    assert_eq!(rest.next, None);
    assert_eq!(rest.entries[0].value, JsonText::null());
}

#[test]
fn watches_announce_changes_under_their_prefix() {
    let d = dir("watch");
    let mut s = store(&d, serde_json::json!({}));
    set(&mut s, "cart:1", 0.into());
    assert!(s.notified::<Changed>().is_empty(), "no watch, no notification");
    s.request(&Watch {
        prefix: "cart:".into(),
        lease_ms: None,
    });
    set(&mut s, "cart:1", 1.into());
    set(&mut s, "other", 1.into());
    s.request(&Delete {
        key: "cart:1".into(),
        version: None,
    });
    let changes = s.notified::<Changed>();
    let seen: Vec<(&str, &str, Op)> = changes
        .iter()
        .map(|c| (c.watch.as_str(), c.key.as_str(), c.op))
        .collect();
    assert_eq!(
        seen,
        [("cart:", "cart:1", Op::Set), ("cart:", "cart:1", Op::Delete)]
    );
    assert_eq!(changes[0].value_as::<i64>().unwrap(), 1);
    let un: Unwatched = s
        .request(&Unwatch {
            prefix: "cart:".into(),
        })
        .json();
    assert!(un.removed);
    set(&mut s, "cart:2", 1.into());
    assert_eq!(s.notified::<Changed>().len(), 2);
}

#[test]
fn a_second_store_on_the_same_data_refuses_to_start() {
    let d = dir("twice");
    let _first = store(&d, serde_json::json!({}));
    let err = TestManager::<Store>::try_with_config(serde_json::json!({ "data_dir": d.0 }))
        .err()
        .expect("the second store must refuse");
    assert!(err.message.contains("in use"), "{}", err.message);
}

#[test]
fn bad_settings_name_their_key() {
    let d = dir("settings");
    let err =
        TestManager::<Store>::try_with_config(serde_json::json!({ "data_dir": d.0, "durability": "never" }))
            .err()
            .unwrap();
    assert!(err.message.contains("config.durability"), "{}", err.message);
    let err = TestManager::<Store>::try_with_config(serde_json::json!({ "data_dir": d.0, "max_watches": 0 }))
        .err()
        .unwrap();
    assert!(
        err.message.contains("config.max_watches: must be positive"),
        "{}",
        err.message
    );
}

/// Decision 0114: a manager's keys are its own, a client's its own, and a
/// shared namespace is everyone's; lists, watches and their changes speak
/// the caller's keys.
#[test]
fn each_caller_has_its_own_keys_and_shares_only_shared_namespaces() {
    let d = dir("scopes");
    let mut s = store(&d, serde_json::json!({"shared": ["counters/"]}));
    fn as_manager<E: switchyard_manager::Event>(
        s: &mut TestManager<Store>,
        who: &str,
        body: serde_json::Value,
    ) -> serde_json::Value {
        let r = s
            .build::<E>()
            .json(body.to_string().as_bytes())
            .context(":manager", who)
            .from_manager()
            .send();
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    }
    let set = serde_json::json!({"key": "secret", "value": "a's"});
    as_manager::<Set>(&mut s, "a", set);
    // B neither reads nor overwrites A's key: its own `secret` is another.
    let got = as_manager::<Get>(&mut s, "b", serde_json::json!({"key": "secret"}));
    assert_eq!(got["found"], false, "{got}");
    as_manager::<Set>(&mut s, "b", serde_json::json!({"key": "secret", "value": "b's"}));
    let got = as_manager::<Get>(&mut s, "a", serde_json::json!({"key": "secret"}));
    assert_eq!(got["value"], "a's", "{got}");
    let gone = as_manager::<Delete>(&mut s, "b", serde_json::json!({"key": "secret"}));
    assert_eq!(gone["deleted"], true);
    let got = as_manager::<Get>(&mut s, "a", serde_json::json!({"key": "secret"}));
    assert_eq!(got["value"], "a's", "{got}");
    // A client (through `[auth] expose`) is neither.
    let r = s.build::<Get>().json(br#"{"key": "secret"}"#).send();
    assert!(!r.json::<Entry>().found);

    // The shared namespace: one counter for both.
    let inc = serde_json::json!({"key": "counters/hits", "by": 1});
    as_manager::<Increment>(&mut s, "a", inc.clone());
    let n = as_manager::<Increment>(&mut s, "b", inc);
    assert_eq!(n["value"], 2);
    // Lists show each caller its own keys, as it wrote them.
    as_manager::<Set>(&mut s, "a", serde_json::json!({"key": "list:1", "value": 1}));
    let listed = as_manager::<List>(&mut s, "a", serde_json::json!({"prefix": "list:"}));
    let keys: Vec<&str> = listed["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert_eq!(keys, ["list:1"]);
    let listed = as_manager::<List>(&mut s, "b", serde_json::json!({"prefix": "list:"}));
    assert_eq!(listed["entries"], serde_json::json!([]));
    // A key may not spell a scope.
    let r = s
        .build::<Get>()
        .json(br#"{"key": "\u0000manager:a\u0000secret"}"#)
        .context(":manager", "b")
        .from_manager()
        .send();
    assert_eq!(r.status, 422, "{}", r.text());
}
