//! The Scheduler on JetStream (docs/scheduler.md, docs/cluster.md): three
//! real `nats-server -js` processes clustered on loopback, replicas 3, and
//! real groups joined to them, each running its own Scheduler on the one
//! bucket. A due job fires once across the groups, whichever scheduled it;
//! when the group holding the lease is killed with `kill -9`, under a load
//! of Store increments that stays exact, another takes the lease and fires
//! what was due, its `missed` policy applied; a holder stopped cleanly
//! releases the lease, and another group fires at once; a job due
//! while a server is down fires once; two servers lost answer 503 at once,
//! and the jobs due meanwhile fire once when they are back, without a
//! restart of any group.
//!
//! Firings are counted twice: as pushes to a subscriber of the job's
//! notification on every group (delivery), and as the Scheduler's own
//! `job `<id>`: firing` debug line in every group's log (sends). A
//! client's request job shows whom it fired as in the answer the
//! Scheduler logs.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use common::jetstream::*;
use common::*;
use futures_util::StreamExt;
use serde_json::json;
use switchyard_client::scheduler::{Job, Kind, Missed, Schedule};
use switchyard_client::{Client, Subscription};

/// The lease's length in these tests: a take-over comes at least two
/// thirds of it after the holder's death (its last renewal, a third of it
/// at most before, lasts a whole one).
const LEASE_MS: u64 = 3000;
/// What a job fires: a client's notification, fired as that client.
const FIRED: &str = "test.fired";
/// A firing later than this is missed (the job's `missed` policy applies).
const GRACE_MS: u64 = 500;
/// A client's API key, and its SHA-256 as the groups know it.
const KEY: &str = "sched-client-key-5c1e";
const KEY_SHA256: &str = "3013e8b20e94316469a5d2cf8db6693a8632d78656db21ead42952652ee78bd9";

/// A group joined to `js` running the Scheduler (on JetStream, as
/// `[cluster]` makes it), open to clients, which may send notifications
/// (a client's notification job needs it, decision 0110); its firings are
/// logged (debug lines of the managers' host).
fn group(tag: &'static str, js: &JsCluster, name: &str, extra: &str) -> Group {
    group_leasing(tag, js, name, extra, LEASE_MS)
}

/// [`group`] with a lease of `lease_ms`.
fn group_leasing(tag: &'static str, js: &JsCluster, name: &str, extra: &str, lease_ms: u64) -> Group {
    Group::builder(tag)
        .env("SWITCHYARD_LISTENER__WS__NOTIFY", "true")
        .env("SWITCHYARD_LOG", "info,switchyard_manager_host=debug")
        .config(&format!(
            "[auth]\nexpose = [\"scheduler.*\", \"store.*\"]\n\
             [cluster]\nnats = [{}]\nname = \"{name}\"\n\
             [[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n\
             [managers.config]\nreplicas = 3\nop_timeout_ms = 3000\nlease_ms = {lease_ms}\n\
             misfire_grace_ms = {GRACE_MS}\n{extra}",
            js.urls()
        ))
        .start()
}

/// A notification job firing [`FIRED`] with `{"n": id}`.
fn job(id: &str, when: Duration) -> Schedule {
    Job::after(when)
        .id(id)
        .build(FIRED, Kind::Notification, &json!({ "n": id }))
        .unwrap()
}

/// Waits until the Scheduler of `g` answers (JetStream elected its
/// leaders and the bucket exists).
async fn until_served(g: &Group) {
    let client = Client::connect(&ws(g)).await.unwrap();
    let scheduler = client.scheduler();
    eventually_async("the scheduler answers", || async {
        let r = tokio::time::timeout(PATIENCE, scheduler.get("ready?"))
            .await
            .expect("answered, not held");
        match status_of(&r) {
            200 => Ok(()),
            503 => Err(r),
            _ => panic!("get answered {r:?}"),
        }
    })
    .await;
}

/// Schedules `job` through `g`, retrying what was refused (503: not done).
async fn schedule(g: &Group, job: &Schedule) {
    let client = Client::connect(&ws(g)).await.unwrap();
    let scheduler = client.scheduler();
    eventually_async("the job is scheduled", || async {
        let r = tokio::time::timeout(PATIENCE, scheduler.schedule(job))
            .await
            .expect("answered, not held");
        match status_of(&r) {
            200 => Ok(()),
            503 => Err(r),
            _ => panic!("schedule answered {r:?}"),
        }
    })
    .await;
}

/// The jobs of the pushes `sub` receives until it has one of each of
/// `expected`, then for `quiet` more (a second firing would come right
/// after the first): job id → pushes.
async fn firings(sub: &mut Subscription, expected: &[&str], quiet: Duration) -> BTreeMap<String, u32> {
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let deadline = Instant::now() + PATIENCE * 2;
    while !expected.iter().all(|id| seen.contains_key(*id)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let push = tokio::time::timeout(left, sub.next())
            .await
            .unwrap_or_else(|_| panic!("not every job fired: {expected:?}, seen {seen:?}"))
            .expect("the subscription goes on");
        *seen.entry(job_of(&push.data)).or_default() += 1;
    }
    while let Ok(Some(push)) = tokio::time::timeout(quiet, sub.next()).await {
        *seen.entry(job_of(&push.data)).or_default() += 1;
    }
    seen
}

fn job_of(firing: &serde_json::Value) -> String {
    firing["job"].as_str().unwrap_or("?").to_owned()
}

/// How many times the groups' Schedulers sent a firing of `id`.
fn sent(groups: &[&Group], id: &str) -> usize {
    let needle = format!("job `{id}`: firing {FIRED}");
    groups.iter().map(|g| g.count_lines(&needle)).sum()
}

const HOLDS: &str = "this group holds the lease";

/// Which of `groups` took the lease (one, once it is taken).
fn lease_holder(groups: &[Group]) -> usize {
    eventually("a group takes the lease", PATIENCE, || {
        let holding: Vec<usize> = (0..groups.len()).filter(|&i| groups[i].has_line(HOLDS)).collect();
        match holding[..] {
            [i] => Ok(i),
            _ => Err(holding),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_due_job_fires_once_across_groups_and_on_another_group_when_its_holder_is_killed() {
    let js = JsCluster::start("js-sched");
    let name = format!("jsq-{}", std::process::id());
    // `basics` answers `demo.Whoami` with the caller's `sub`: what a
    // client's job fires as. The client with the key is `deployer`.
    // The Store too, so that its counter runs under the kill.
    let extra = format!(
        "[[managers]]\nname = \"basics\"\n\
         [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\
         [managers.config]\nreplicas = 3\nop_timeout_ms = 3000\n\
         [auth.api_keys]\n[[auth.api_keys.keys]]\nname = \"deployer\"\nsha256 = \"{KEY_SHA256}\"\n"
    );
    let mut groups = vec![
        group("js-sched-a", &js, &name, &extra),
        group("js-sched-b", &js, &name, &extra),
        group("js-sched-c", &js, &name, &extra),
    ];
    for g in &groups {
        until_served(g).await;
    }
    let holder = lease_holder(&groups);
    let mut clients = Vec::new();
    let mut subs = Vec::new();
    for g in &groups {
        let client = Client::connect(&ws(g)).await.unwrap();
        subs.push(client.subscribe(FIRED).await.unwrap());
        clients.push(client);
    }

    // Scheduled through a group that does not hold the lease: fired once,
    // by the holder, seen once on every group.
    let other = (holder + 1) % groups.len();
    schedule(&groups[other], &job("once", Duration::from_millis(1000))).await;
    for sub in &mut subs {
        let seen = firings(sub, &["once"], Duration::from_secs(1)).await;
        assert_eq!(seen, BTreeMap::from([("once".to_owned(), 1)]));
    }
    let all: Vec<&Group> = groups.iter().collect();
    assert_eq!(sent(&all, "once"), 1);
    assert_eq!(
        groups[holder].count_lines("job `once`: firing"),
        1,
        "the holder fired it"
    );
    // Done, for every group.
    let third = (holder + 2) % groups.len();
    let scheduler = clients[third].scheduler();
    eventually_async("the fired job is gone", || async {
        let found = scheduler.get("once").await.unwrap();
        found.is_none().then_some(()).ok_or(found)
    })
    .await;

    // Scheduled through the holder, which then dies with every process of
    // its group: another group takes the lease and fires it, once.
    schedule(
        &groups[holder],
        &job("orphan", Duration::from_millis(2 * LEASE_MS)),
    )
    .await;
    // A client's job, scheduled through the holder with the client's
    // key: it fires as that client wherever it fires (decision 0113).
    let keyed = Client::builder(&ws(&groups[holder]))
        .api_key(KEY)
        .connect()
        .await
        .unwrap();
    let who = Job::after(Duration::from_millis(2 * LEASE_MS))
        .id("who")
        .build("demo.Whoami", Kind::Request, &json!({}))
        .unwrap();
    assert!(keyed.scheduler().schedule(&who).await.unwrap().created);
    drop(keyed);
    // Under load: clients of every group increment one counter while the
    // holder's group is killed. Its clients lose their connection; every
    // increment acknowledged anywhere is kept.
    let urls: Vec<String> = groups.iter().map(ws).collect();
    let load = tokio::spawn(hammer_urls(urls, "under-kill".to_owned(), 4, 40));
    let watcher = &groups[(holder + 1) % groups.len()];
    eventually_async("the load started", || async {
        let n = counter(watcher, "under-kill").await;
        (n >= 20).then_some(()).ok_or(n)
    })
    .await;
    let dead = groups.remove(holder);
    drop(subs.remove(holder));
    drop(clients.remove(holder));
    let pids = dead.all_pids();
    kill(dead.supervisor_pid(), Signal::SIGKILL);
    for pid in pids {
        kill(pid, Signal::SIGKILL);
    }
    let killed = Instant::now();
    let killed_wall = SystemTime::now();
    // Due just after the death, while no group holds the lease: late by
    // more than the grace when the next holder sees them, so their
    // `missed` policy applies — once fires, skip drops.
    let at = killed_wall + Duration::from_millis(100);
    for (id, missed) in [("late-once", Missed::Once), ("late-skip", Missed::Skip)] {
        let job = Job::at(at)
            .id(id)
            .missed(missed)
            .build(FIRED, Kind::Notification, &json!({ "n": id }))
            .unwrap();
        schedule(&groups[0], &job).await;
    }
    let survivors: Vec<&Group> = groups.iter().collect();
    let moved = eventually("a survivor takes the lease", PATIENCE, || {
        survivors
            .iter()
            .position(|g| g.has_line(HOLDS))
            .map(|i| (i, killed.elapsed()))
            .ok_or("not yet")
    });
    eprintln!(
        "the lease moved to survivor {} in {:?} (lease_ms = {LEASE_MS})",
        moved.0, moved.1
    );
    for sub in &mut subs {
        let seen = firings(sub, &["orphan", "late-once"], Duration::from_secs(1)).await;
        assert_eq!(
            seen,
            BTreeMap::from([("late-once".to_owned(), 1), ("orphan".to_owned(), 1)]),
            "each fired once, the skipped one never"
        );
    }
    assert_eq!(sent(&survivors, "orphan"), 1);
    assert_eq!(sent(&[&dead], "orphan"), 0, "the dead holder had not fired it");
    assert_eq!(sent(&survivors, "late-once"), 1);
    assert_eq!(sent(&survivors, "late-skip"), 0);
    let answered = "job `who`: demo.Whoami answered 200";
    let line = eventually("the client's job fired on a survivor", PATIENCE, || {
        survivors.iter().find_map(|g| g.line(answered)).ok_or("not yet")
    });
    assert!(
        line.contains(r#"\"sub\":\"deployer\""#) || line.contains(r#""sub":"deployer""#),
        "{line}"
    );
    let fired: usize = survivors.iter().map(|g| g.count_lines(answered)).sum();
    assert_eq!(fired, 1, "the client's job fired once");
    let load = load.await.unwrap();
    let total = counter(&groups[0], "under-kill").await as u64;
    eprintln!("the counter under the kill: {total} kept, {load:?}");
    assert!(
        total >= load.acked && total <= load.acked + load.unknown,
        "{total} increments kept, {load:?}"
    );
    // The survivors' clients made every increment; the killed group's
    // stopped at the kill.
    let answered = load.acked + load.unknown;
    assert!(
        (2 * 4 * 40..=3 * 4 * 40).contains(&answered) && load.lost_clients <= 4,
        "{load:?}"
    );
    let scheduler = clients[0].scheduler();
    for id in ["orphan", "late-once", "late-skip", "who"] {
        eventually_async("the job is done", || async {
            let found = scheduler.get(id).await.unwrap();
            found.is_none().then_some(()).ok_or(found)
        })
        .await;
    }
    drop((subs, clients));
    drop(dead);
    for g in groups {
        stop(g).await;
    }
    drop(js);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_due_while_a_server_is_down_fires_once_and_without_quorum_calls_answer_503() {
    let mut js = JsCluster::start("js-sched-q");
    let name = format!("jsq-q-{}", std::process::id());
    // `basics` for `/reminders`: the Scheduler's 503 as an HTTP client sees it.
    let basics = "[[managers]]\nname = \"basics\"\n";
    let a = group("js-sched-qa", &js, &name, basics);
    let b = group("js-sched-qb", &js, &name, basics);
    until_served(&a).await;
    until_served(&b).await;
    let both = [&a, &b];
    let mut subs = Vec::new();
    let mut clients = Vec::new();
    for g in both {
        let client = Client::connect(&ws(g)).await.unwrap();
        subs.push(client.subscribe(FIRED).await.unwrap());
        clients.push(client);
    }

    // Load: clients of both groups schedule and cancel far-off jobs, each
    // call answered (503 while a leader is elected: retried).
    let stop_load = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicU64::new(0));
    let mut load = Vec::new();
    for (i, g) in both.iter().enumerate() {
        for n in 0..4 {
            let (stop_load, answered) = (stop_load.clone(), answered.clone());
            let (g, prefix) = (ws(g), format!("load-{i}-{n}"));
            load.push(tokio::spawn(async move {
                let client = Client::connect(&g).await.unwrap();
                let scheduler = client.scheduler();
                let mut i = 0u64;
                while !stop_load.load(Ordering::Relaxed) {
                    i += 1;
                    let id = format!("{prefix}-{i}");
                    let r = tokio::time::timeout(
                        PATIENCE,
                        scheduler.schedule(&job(&id, Duration::from_secs(3600))),
                    )
                    .await
                    .expect("a call is answered, never held");
                    match status_of(&r) {
                        200 => {
                            let r = tokio::time::timeout(PATIENCE, scheduler.cancel(&id))
                                .await
                                .expect("a call is answered, never held");
                            assert!(matches!(status_of(&r), 200 | 503 | 504), "{r:?}");
                        }
                        503 | 504 => tokio::time::sleep(Duration::from_millis(50)).await,
                        other => panic!("schedule answered {other}: {r:?}"),
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }

    // One server of three killed under load: the job due during the
    // outage fires once.
    eventually("the load runs", PATIENCE, || {
        let n = answered.load(Ordering::Relaxed);
        (n >= 20).then_some(()).ok_or(n)
    });
    schedule(&a, &job("outage", Duration::from_millis(2000))).await;
    js.servers[0].kill();
    for sub in &mut subs {
        let seen = firings(sub, &["outage"], Duration::from_secs(1)).await;
        assert_eq!(seen, BTreeMap::from([("outage".to_owned(), 1)]));
    }
    assert_eq!(sent(&both, "outage"), 1);
    stop_load.store(true, Ordering::Relaxed);
    for task in load {
        task.await.unwrap();
    }

    // Two of three gone: no quorum. A call finds out within the
    // operation's timeout; from then on every call is refused at once,
    // until the bucket acknowledges a write again. The job due meanwhile
    // waits.
    schedule(&a, &job("after-quorum", Duration::from_millis(1500))).await;
    js.servers[1].kill();
    for client in &clients {
        let scheduler = client.scheduler();
        eventually_async("a call is refused without quorum", || async {
            let r = tokio::time::timeout(
                PATIENCE,
                scheduler.schedule(&job("probe", Duration::from_secs(3600))),
            )
            .await
            .expect("answered, not held");
            matches!(status_of(&r), 503 | 504).then_some(()).ok_or(r)
        })
        .await;
        let r = tokio::time::timeout(PATIENCE, scheduler.get("after-quorum"))
            .await
            .expect("answered, not held");
        assert_eq!(status_of(&r), 503, "{r:?}");
    }
    eventually("A's /reminders answers 503 with Retry-After", PATIENCE, || {
        let body = json!({"in_ms": 1000, "text": "no quorum"}).to_string();
        let r = request(a.addr, "POST", "/reminders", body.as_bytes()).map_err(|e| e.to_string())?;
        (r.status == 503 && r.header("retry-after").is_some())
            .then_some(())
            .ok_or(format!("{} {}", r.status, r.text()))
    });
    let pids = (a.pid_of("scheduler"), b.pid_of("scheduler"));

    // Both back: the Schedulers serve again by themselves, and the job due
    // during the outage fires, once.
    js.servers[0].spawn();
    js.servers[1].spawn();
    until_served(&a).await;
    until_served(&b).await;
    for sub in &mut subs {
        let seen = firings(sub, &["after-quorum"], Duration::from_secs(1)).await;
        assert_eq!(seen, BTreeMap::from([("after-quorum".to_owned(), 1)]));
    }
    assert_eq!(sent(&both, "after-quorum"), 1);
    assert_eq!(
        (a.pid_of("scheduler"), b.pid_of("scheduler")),
        pids,
        "no scheduler was restarted"
    );
    drop((subs, clients));
    stop(a).await;
    stop(b).await;
}

/// A lease far longer than any wait of the test below (each bounded by
/// [`PATIENCE`] or twice it): a take-over within them after the holder's
/// clean stop is the release's doing, not the lease running out.
const LONG_LEASE_MS: u64 = 120_000;

/// The holder's group stopped cleanly (SIGTERM) gives the lease up, so
/// another group takes it and fires a job due just after — long before
/// the lease would have lapsed (decision 0141).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cleanly_stopped_holder_releases_the_lease_and_another_group_fires_at_once() {
    let js = JsCluster::start("js-sched-rel");
    let name = format!("jsq-rel-{}", std::process::id());
    let mut groups = vec![
        group_leasing("js-sched-rel-a", &js, &name, "", LONG_LEASE_MS),
        group_leasing("js-sched-rel-b", &js, &name, "", LONG_LEASE_MS),
    ];
    for g in &groups {
        until_served(g).await;
    }
    let holder = lease_holder(&groups);
    let mut stopped = groups.remove(holder);
    let survivor = groups.remove(0);
    let client = Client::connect(&ws(&survivor)).await.unwrap();
    let mut sub = client.subscribe(FIRED).await.unwrap();
    // Scheduled before the stop, due after it (on a loaded machine the
    // holder may still fire it while stopping: once either way).
    schedule(
        &survivor,
        &job("before-stop", Duration::from_millis(LONG_LEASE_MS / 8)),
    )
    .await;

    assert!(
        !survivor.has_line(HOLDS),
        "the survivor holds no lease before the stop"
    );
    let stopped = tokio::task::spawn_blocking(move || {
        let status = stopped.terminate();
        assert!(status.success(), "the holder's group stopped cleanly: {status:?}");
        stopped
    })
    .await
    .unwrap();
    // Well within the lease: only the release lets the survivor take it.
    eventually("the survivor takes the released lease", PATIENCE, || {
        survivor.has_line(HOLDS).then_some(()).ok_or("not yet")
    });
    // Its log may still be draining after its exit.
    eventually("the stopping holder says it released the lease", PATIENCE, || {
        stopped
            .has_line("released the lease of")
            .then_some(())
            .ok_or("not said")
    });
    schedule(&survivor, &job("after-stop", Duration::from_millis(1000))).await;
    let seen = firings(&mut sub, &["after-stop", "before-stop"], Duration::from_secs(1)).await;
    assert_eq!(
        seen,
        BTreeMap::from([("after-stop".to_owned(), 1), ("before-stop".to_owned(), 1)]),
        "each fired once"
    );
    assert_eq!(sent(&[&survivor], "after-stop"), 1, "the survivor fired it");
    assert_eq!(sent(&[&survivor, &stopped], "before-stop"), 1);
    drop((sub, client));
    drop(stopped);
    stop(survivor).await;
    drop(js);
}

#[test]
fn scheduler_jetstream_settings_are_checked_before_anything_starts() {
    let scratch = scratch_dir("js-sched-check");
    let check = |toml: &str| check_config(scratch.path(), toml);
    let (code, text) = check(
        "[[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n\
         [managers.config]\nbackend = \"jetstream\"\n",
    );
    assert_eq!(code, Some(64), "{text}");
    assert!(
        text.contains("managers[0].config.backend: `jetstream` needs `[cluster]`"),
        "{text}"
    );
    let (code, text) = check(
        "[cluster]\nnats = \"nats://127.0.0.1:1\"\n\
         [[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n\
         [managers.config]\nlease_ms = 10\n",
    );
    assert_eq!(code, Some(64), "{text}");
    assert!(text.contains("config.lease_ms: must be 1000 to 600000"), "{text}");
}
