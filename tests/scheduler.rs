//! The built-in Scheduler against a real group: the demo's `/reminders`
//! reaching a WebSocket subscriber once, a reminder that outlives a
//! `kill -9` of the scheduler and a restart of the group, a request firing
//! retried while its manager is down, repeating and cron jobs, and the job
//! API (idempotent ids, update, cancel, list) from
//! a client. Waits are on pushes and answers, bounded by PATIENCE; the
//! only timing checked is the issue's window for a 300 ms reminder
//! (300 ms to 1.5 s), whose upper end is also loose enough for a loaded
//! machine.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::{Value, json};
use switchyard_client::scheduler::{Job, Kind, ListJobs, Update, When};
use switchyard_client::{Client, ClientError, Push, Subscription};

/// A data directory (not made yet) that outlives the groups a test starts
/// on it, removed with its scratch directory.
struct DataDir(std::path::PathBuf, #[allow(dead_code)] tempfile::TempDir);

impl DataDir {
    fn new(tag: &str) -> DataDir {
        let scratch = scratch_dir(tag);
        DataDir(scratch.path().join("data"), scratch)
    }
}

/// Clients reach the Scheduler only where the operator opens it
/// (decision 0108; tests/internal_events.rs shows the default).
const EXPOSE: (&str, &str) = ("SWITCHYARD_AUTH__EXPOSE", r#"["scheduler.*"]"#);

fn ws(g: &Group) -> String {
    format!("ws://{}/ws", g.addr)
}

async fn stop(g: Group) {
    tokio::task::spawn_blocking(move || drop(g)).await.unwrap();
}

async fn next_push(sub: &mut Subscription) -> Push {
    tokio::time::timeout(PATIENCE, sub.next())
        .await
        .expect("a push in time")
        .expect("the subscription goes on")
}

/// No push within `window` (for "once": a second delivery would come
/// right after the first).
async fn no_push_within(sub: &mut Subscription, window: Duration) {
    if let Ok(Some(push)) = tokio::time::timeout(window, sub.next()).await {
        panic!("unexpected push {} {}", push.event, push.data);
    }
}

fn remind(g: &Group, in_ms: u64, text: &str) -> String {
    let body = json!({"in_ms": in_ms, "text": text}).to_string();
    let r = request(g.addr, "POST", "/reminders", body.as_bytes()).unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body).unwrap();
    v["id"].as_str().expect("a job id").to_owned()
}

#[tokio::test]
async fn a_reminder_reaches_a_subscriber_once_in_its_window() {
    let g = Group::builder("remind").env(EXPOSE.0, EXPOSE.1).start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let mut sub = client.subscribe("demo.reminder").await.unwrap();
    let sent = Instant::now();
    let id = remind(&g, 300, "hi");
    assert!(!id.is_empty());
    let push = next_push(&mut sub).await;
    let after = sent.elapsed();
    assert_eq!(push.data, json!({"text": "hi"}));
    assert!(after >= Duration::from_millis(300), "fired early: {after:?}");
    assert!(after <= Duration::from_millis(1500), "fired late: {after:?}");
    no_push_within(&mut sub, Duration::from_millis(500)).await;
    // The job is done: the scheduler no longer holds it.
    assert_eq!(client.scheduler().get(&id).await.unwrap(), None);
    drop((sub, client));
    stop(g).await;
}

#[tokio::test]
async fn a_reminder_outlives_a_kill9_of_the_scheduler_and_a_group_restart() {
    let data = DataDir::new("remind-data");
    let g = Group::builder("remind-kill").data_dir(&data.0).start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let mut sub = client.subscribe("demo.reminder").await.unwrap();
    remind(&g, 1500, "after the crash");
    let old = g.kill9("scheduler");
    g.eventually_restarted("scheduler", old);
    assert_eq!(next_push(&mut sub).await.data, json!({"text": "after the crash"}));
    no_push_within(&mut sub, Duration::from_millis(500)).await;

    // Scheduled, then the whole group stops and starts on the same data.
    remind(&g, 2000, "after the restart");
    drop((sub, client));
    stop(g).await;
    let g = Group::builder("remind-again").data_dir(&data.0).start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let mut sub = client.subscribe("demo.reminder").await.unwrap();
    assert_eq!(
        next_push(&mut sub).await.data,
        json!({"text": "after the restart"})
    );
    drop((sub, client));
    stop(g).await;
}

#[tokio::test]
async fn jobs_repeat_carry_their_firing_and_can_be_changed_and_cancelled() {
    // A client's notification job needs client notifications on, as a
    // notification it sent itself would (decision 0110).
    let g = Group::builder("jobs")
        .env(EXPOSE.0, EXPOSE.1)
        .env("SWITCHYARD_LISTENER__WS__NOTIFY", "true")
        .start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let scheduler = client.scheduler();
    let mut sub = client.subscribe("test.beat").await.unwrap();

    let every = Job::every(Duration::from_millis(100))
        .id("beat")
        .build("test.beat", Kind::Notification, &json!({"v": 1}))
        .unwrap();
    let first = scheduler.schedule(&every).await.unwrap();
    assert!(first.created);
    // The same definition again is the same job; another one is a conflict.
    let again = scheduler.schedule(&every).await.unwrap();
    assert!(!again.created);
    let mut other = every.clone();
    other.when = When::EveryMs(5000);
    match scheduler.schedule(&other).await {
        Err(ClientError::Status { status: 409, .. }) => {}
        r => panic!("expected 409, got {r:?}"),
    }

    let mut planned = Vec::new();
    for _ in 0..3 {
        let push = next_push(&mut sub).await;
        assert_eq!(push.data["job"], "beat");
        assert_eq!(push.data["payload"], json!({"v": 1}));
        planned.push(push.data["planned_ms"].as_u64().unwrap());
    }
    // Each firing has its own planned time, on the job's 100 ms grid.
    assert!(
        planned
            .windows(2)
            .all(|w| w[1] > w[0] && (w[1] - w[0]) % 100 == 0),
        "{planned:?}"
    );

    let updated = scheduler
        .update(&Update {
            id: "beat".into(),
            payload: Some(switchyard_client::store::JsonText::encode(&json!({"v": 2})).unwrap()),
            ..Update::default()
        })
        .await
        .unwrap();
    assert_eq!(updated.id, "beat");
    loop {
        let push = next_push(&mut sub).await;
        if push.data["payload"] == json!({"v": 2}) {
            break;
        }
    }
    let listed = scheduler.list(&ListJobs::default()).await.unwrap();
    assert!(
        listed.jobs.iter().any(|j| j.id == "beat" && j.fired >= 3),
        "{listed:?}"
    );

    assert!(scheduler.cancel("beat").await.unwrap());
    let cancelled_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(!scheduler.cancel("beat").await.unwrap());
    // Firings planned before the cancel may still be on their way (on a
    // loaded machine, several); none planned after it may come.
    for _ in 0..100 {
        match tokio::time::timeout(Duration::from_millis(500), sub.next()).await {
            Ok(Some(push)) => {
                let planned = push.data["planned_ms"].as_u64().unwrap();
                assert!(
                    planned <= cancelled_ms,
                    "a firing planned {} ms after the cancel",
                    planned - cancelled_ms
                );
            }
            _ => break,
        }
    }

    // Cron (with seconds): fires within a couple of seconds; a bad one is 422.
    let cron = Job::cron("* * * * * *")
        .build("test.beat", Kind::Notification, &json!("cron"))
        .unwrap();
    let scheduled = scheduler.schedule(&cron).await.unwrap();
    let push = next_push(&mut sub).await;
    assert_eq!(push.data["payload"], "cron");
    assert_eq!(
        push.data["planned_ms"].as_u64().unwrap() % 1000,
        0,
        "on a whole second"
    );
    scheduler.cancel(&scheduled.id).await.unwrap();
    let bad = Job::cron("every tuesday")
        .build("test.beat", Kind::Notification, &())
        .unwrap();
    match scheduler.schedule(&bad).await {
        Err(ClientError::Status { status: 422, problem }) => {
            assert!(problem.to_string().contains("cron"), "{problem}")
        }
        r => panic!("expected 422, got {r:?}"),
    }
    drop((sub, client));
    stop(g).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_firing_is_retried_until_its_manager_is_back() {
    // basics comes back 1.5 s after it dies: the firing meets it down.
    // The client schedules the demo's internal `demo.ReminderDue`, which
    // the operator opens to clients for it (decisions 0108, 0110).
    let mut g = Group::builder("retry")
        .config(
            "[restart]\ninitial_backoff_ms = 1500\n\n\
             [auth]\nexpose = [\"scheduler.*\", \"demo.ReminderDue\"]\n\n\
             [[managers]]\nname = \"store\"\nbuiltin = \"store\"\n\n\
             [[managers]]\nname = \"scheduler\"\nbuiltin = \"scheduler\"\n\n\
             [[managers]]\nname = \"basics\"\n",
        )
        .start();
    let client = Client::connect(&ws(&g)).await.unwrap();
    let mut sub = client.subscribe("demo.reminder").await.unwrap();
    let old = g.kill9("basics");
    let job = Job::after(Duration::ZERO)
        .id("while-down")
        .build("demo.ReminderDue", Kind::Request, &json!({"text": "retried"}))
        .unwrap();
    client.scheduler().schedule(&job).await.unwrap();
    assert_eq!(next_push(&mut sub).await.data, json!({"text": "retried"}));
    let retried =
        tokio::task::block_in_place(|| g.wait_line("job `while-down`: demo.ReminderDue failed with 503"));
    assert!(retried.contains("will retry"), "{retried}");
    g.eventually_restarted("basics", old);
    drop((sub, client));
    stop(g).await;
}
