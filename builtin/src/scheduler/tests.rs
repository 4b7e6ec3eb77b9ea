//! The engine's timing, on a fake clock and a real database.

use std::cell::Cell;
use std::rc::Rc;

use super::*;

/// A clock the test moves: wall and monotonic apart, so a test can step
/// one without the other.
#[derive(Clone)]
struct Fake {
    wall: Rc<Cell<u64>>,
    mono: Rc<Cell<u64>>,
}

impl Fake {
    fn new() -> Fake {
        Fake {
            wall: Rc::new(Cell::new(1_700_000_000_000)),
            mono: Rc::new(Cell::new(0)),
        }
    }
    /// Time passes: both clocks move.
    fn pass(&self, ms: u64) {
        self.wall.set(self.wall.get() + ms);
        self.mono.set(self.mono.get() + ms);
    }
    /// The wall clock steps (by an operator or NTP); the monotonic one does not.
    fn step(&self, ms: i64) {
        self.wall.set((self.wall.get() as i64 + ms) as u64);
    }
}

impl Clock for Fake {
    fn wall_ms(&self) -> u64 {
        self.wall.get()
    }
    fn mono(&self) -> Duration {
        Duration::from_millis(self.mono.get())
    }
}

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(tag: &str) -> Dir {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Dir(std::env::temp_dir().join(format!("switchyard-sched-{}-{tag}-{n}", std::process::id())))
}

fn engine(dir: &Dir, clock: &Fake) -> Engine<Fake> {
    let db = db::open(&dir.0, "scheduler", Durability::Group, 1024).unwrap();
    Engine::new(db, clock.clone(), SchedulerSettings::default()).unwrap()
}

fn job(id: &str, when: When, missed: Missed) -> Schedule {
    Schedule {
        id: Some(id.into()),
        when,
        event: "t.Fired".into(),
        kind: Kind::Notification,
        payload: JsonText::encode(&serde_json::json!({"n": 1})).unwrap(),
        missed,
        tz: None,
        replace: false,
    }
}

fn fire_all(e: &mut Engine<Fake>) -> Vec<Fire> {
    let fires = e.due(1000).unwrap();
    for f in &fires {
        e.delivered(&f.id, f.token).unwrap();
    }
    fires
}

#[test]
fn a_delay_fires_when_due_and_carries_its_job_and_planned_time() {
    let (d, clock) = (dir("delay"), Fake::new());
    let mut e = engine(&d, &clock);
    let t0 = clock.wall_ms();
    let s = e.schedule(job("j", When::AfterMs(300), Missed::Once)).unwrap();
    assert_eq!(s.next_ms, t0 + 300);
    clock.pass(299);
    assert!(fire_all(&mut e).is_empty());
    clock.pass(1);
    let fires = fire_all(&mut e);
    assert_eq!(fires.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&fires[0].body).unwrap();
    assert_eq!(
        body,
        serde_json::json!({"job": "j", "planned_ms": t0 + 300, "payload": {"n": 1}})
    );
    // One-shot: gone once delivered.
    assert!(e.get("j").unwrap().is_none());
}

#[test]
fn a_wall_clock_step_does_not_move_delay_jobs() {
    let (d, clock) = (dir("step"), Fake::new());
    let mut e = engine(&d, &clock);
    e.schedule(job("later", When::AfterMs(10_000), Missed::Once))
        .unwrap();
    e.schedule(job("every", When::EveryMs(1_000), Missed::Once))
        .unwrap();
    // The wall clock jumps a day ahead: nothing is due by the monotonic clock.
    clock.step(86_400_000);
    clock.pass(10);
    assert_eq!(e.follow_clock().unwrap(), Some(86_400_000));
    assert!(fire_all(&mut e).is_empty(), "a step fired delay jobs");
    clock.pass(990);
    let fires = fire_all(&mut e);
    assert_eq!(fires.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(), ["every"]);
    // Stored times follow the new wall clock, so a restart keeps the distance.
    let later = e.get("later").unwrap().unwrap();
    assert_eq!(later.next_ms, clock.wall_ms() + 9_000);
}

#[test]
fn missed_calendar_firings_fire_once_or_are_skipped_never_in_a_burst() {
    let (d, clock) = (dir("missed"), Fake::new());
    let mut e = engine(&d, &clock);
    // Every minute, by the calendar.
    e.schedule(job("once", When::Cron("* * * * *".into()), Missed::Once))
        .unwrap();
    e.schedule(job("skip", When::Cron("* * * * *".into()), Missed::Skip))
        .unwrap();
    // The wall clock steps 10 minutes ahead (or the scheduler was down).
    clock.step(600_000);
    e.follow_clock().unwrap();
    let fires = fire_all(&mut e);
    assert_eq!(fires.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(), ["once"]);
    // The one firing is the latest missed occurrence, a whole minute.
    assert_eq!(fires[0].planned_ms % 60_000, 0);
    assert!(clock.wall_ms() - fires[0].planned_ms < 60_000);
    // Both are planned at the next minute, nothing else is due now.
    assert!(fire_all(&mut e).is_empty());
    for id in ["once", "skip"] {
        let next = e.get(id).unwrap().unwrap().next_ms;
        assert!(
            next > clock.wall_ms() && next - clock.wall_ms() <= 60_000,
            "{id}: {next}"
        );
    }
}

#[test]
fn an_interval_that_fell_behind_fires_once_then_keeps_its_grid() {
    let (d, clock) = (dir("grid"), Fake::new());
    let mut e = engine(&d, &clock);
    let t0 = clock.wall_ms();
    e.schedule(job("tick", When::EveryMs(100), Missed::Once)).unwrap();
    clock.pass(1_050);
    let fires = fire_all(&mut e);
    assert_eq!(fires.len(), 1, "no catch-up burst");
    assert_eq!(e.get("tick").unwrap().unwrap().next_ms, t0 + 1_100);
}

#[test]
fn an_unsettled_firing_is_sent_again_after_a_crash() {
    let (d, clock) = (dir("crash"), Fake::new());
    let mut e = engine(&d, &clock);
    e.schedule(job("j", When::AfterMs(100), Missed::Once)).unwrap();
    clock.pass(100);
    let first = e.due(10).unwrap();
    assert_eq!(first.len(), 1);
    // Not due again while in flight.
    assert!(e.due(10).unwrap().is_empty());
    drop(e); // killed before the answer
    clock.pass(5);
    let mut e = engine(&d, &clock);
    let again = e.due(10).unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(
        again[0].planned_ms, first[0].planned_ms,
        "same firing, same planned time"
    );
    e.delivered(&again[0].id, again[0].token).unwrap();
    assert!(e.get("j").unwrap().is_none());
}

#[test]
fn unavailable_targets_are_retried_with_backoff_then_given_up() {
    let (d, clock) = (dir("retry"), Fake::new());
    let mut e = engine(&d, &clock);
    e.schedule(job("j", When::AfterMs(0), Missed::Once)).unwrap();
    let mut sent = 0;
    for _ in 0..200 {
        for f in e.due(10).unwrap() {
            sent += 1;
            e.failed_firing(&f.id, f.token, 503).unwrap();
        }
        clock.pass(1_000);
    }
    assert_eq!(sent, SchedulerSettings::default().max_attempts);
    assert!(
        e.get("j").unwrap().is_none(),
        "given up, the one-shot job is done"
    );
}

#[test]
fn ids_make_scheduling_idempotent() {
    let (d, clock) = (dir("ids"), Fake::new());
    let mut e = engine(&d, &clock);
    let a = e
        .schedule(job("same", When::AfterMs(1_000), Missed::Once))
        .unwrap();
    clock.pass(10);
    let b = e
        .schedule(job("same", When::AfterMs(1_000), Missed::Once))
        .unwrap();
    assert!(a.created && !b.created);
    assert_eq!(a.next_ms, b.next_ms);
    let err = e
        .schedule(job("same", When::AfterMs(5), Missed::Once))
        .unwrap_err();
    assert_eq!(err.status, 409);
    let mut replace = job("same", When::AfterMs(5), Missed::Once);
    replace.replace = true;
    assert!(e.schedule(replace).unwrap().created);
    let bad = e
        .schedule(job("bad", When::Cron("61 * * * *".into()), Missed::Once))
        .unwrap_err();
    assert_eq!(bad.status, 422, "{}", bad.message);
    let zero = e
        .schedule(job("zero", When::EveryMs(0), Missed::Once))
        .unwrap_err();
    assert_eq!(zero.status, 422);
}

#[test]
fn pending_jobs_are_rows_not_memory() {
    // The engine keeps only what is in flight; the due query is indexed.
    let (d, clock) = (dir("many"), Fake::new());
    let mut e = engine(&d, &clock);
    e.db.conn.execute_batch("BEGIN").unwrap();
    for i in 0..20_000u64 {
        e.schedule(job(
            &format!("j{i:06}"),
            When::AfterMs(3_600_000 + i),
            Missed::Once,
        ))
        .unwrap();
    }
    e.db.conn.execute_batch("COMMIT").unwrap();
    assert_eq!(e.in_flight(), 0);
    assert!(e.due(1000).unwrap().is_empty());
    let page = e
        .list(&ListJobs {
            limit: Some(10),
            ..ListJobs::default()
        })
        .unwrap();
    assert_eq!(page.jobs.len(), 10);
    assert_eq!(page.next.as_deref(), Some("j000009"));
}

#[test]
fn an_update_of_the_payload_keeps_the_plan_and_the_firing_in_flight() {
    let (d, clock) = (dir("update"), Fake::new());
    let mut e = engine(&d, &clock);
    let t0 = clock.wall_ms();
    e.schedule(job("j", When::EveryMs(100), Missed::Once)).unwrap();
    clock.pass(100);
    let fires = e.due(10).unwrap();
    assert_eq!(fires.len(), 1);
    e.update(Update {
        id: "j".into(),
        payload: Some(JsonText::encode(&2).unwrap()),
        ..Update::default()
    })
    .unwrap();
    assert!(
        e.due(10).unwrap().is_empty(),
        "the firing in flight was sent again"
    );
    e.delivered(&fires[0].id, fires[0].token).unwrap();
    let job = e.get("j").unwrap().unwrap();
    assert_eq!((job.fired, job.next_ms), (1, t0 + 200));
    assert_eq!(job.payload.decode::<i64>().unwrap(), 2);
}

#[test]
fn a_client_sees_changes_and_cancels_only_its_own_jobs() {
    let (d, clock) = (dir("owners"), Fake::new());
    let mut e = engine(&d, &clock);
    let (ada, bob) = ("client:ada", "client:bob");
    e.schedule_as(job("ada-1", When::AfterMs(1000), Missed::Once), ada)
        .unwrap();
    e.schedule_as(job("bob-1", When::AfterMs(1000), Missed::Once), bob)
        .unwrap();
    e.schedule(job("mgr-1", When::AfterMs(1000), Missed::Once))
        .unwrap();
    let ids = |e: &Engine<Fake>, owner: &str| -> Vec<String> {
        let all = ListJobs::default();
        e.list_as(&all, owner)
            .unwrap()
            .jobs
            .into_iter()
            .map(|j| j.id)
            .collect()
    };
    assert_eq!(ids(&e, ada), ["ada-1"]);
    assert_eq!(ids(&e, bob), ["bob-1"]);
    assert_eq!(ids(&e, MANAGERS), ["mgr-1"]);
    // Another owner's job is as absent: not found, not changed, not
    // cancelled; its id is taken.
    assert_eq!(e.get_as("ada-1", bob).unwrap(), None);
    let update = Update {
        id: "ada-1".into(),
        event: Some("t.Other".into()),
        ..Update::default()
    };
    assert_eq!(e.update_as(update, bob).unwrap_err().status, 404);
    assert!(!e.cancel_as("ada-1", bob).unwrap());
    assert!(!e.cancel_as("ada-1", MANAGERS).unwrap());
    let taken = e
        .schedule_as(job("ada-1", When::AfterMs(1000), Missed::Once), bob)
        .unwrap_err();
    assert_eq!(taken.status, 409);
    assert_eq!(e.get_as("ada-1", ada).unwrap().unwrap().event, "t.Fired");
    assert!(e.cancel_as("ada-1", ada).unwrap());
    // A client's `kind` names its target.
    let kind_only = Update {
        id: "bob-1".into(),
        kind: Some(Kind::Request),
        ..Update::default()
    };
    assert_eq!(e.update_as(kind_only, bob).unwrap_err().status, 422);
}

#[test]
fn a_client_holds_a_bounded_number_of_jobs_at_a_bounded_rate() {
    let (d, clock) = (dir("bounds"), Fake::new());
    let db = db::open(&d.0, "scheduler", Durability::Group, 1024).unwrap();
    let settings = SchedulerSettings {
        max_jobs_per_client: 2,
        min_every_ms: 1000,
        client_targets: vec!["t.*".into()],
        ..SchedulerSettings::default()
    };
    let mut e = Engine::new(db, clock.clone(), settings).unwrap();
    let owner = "client:";
    for id in ["a", "b"] {
        e.schedule_as(job(id, When::AfterMs(1000), Missed::Once), owner)
            .unwrap();
    }
    let third = e
        .schedule_as(job("c", When::AfterMs(1000), Missed::Once), owner)
        .unwrap_err();
    assert_eq!(third.status, 429, "{}", third.message);
    // The same job again is no new job; another client and the managers
    // are not counted against this one.
    e.schedule_as(job("a", When::AfterMs(1000), Missed::Once), owner)
        .unwrap();
    e.schedule_as(job("c", When::AfterMs(1000), Missed::Once), "client:x")
        .unwrap();
    for i in 0..3 {
        e.schedule(job(&format!("m{i}"), When::AfterMs(1000), Missed::Once))
            .unwrap();
    }
    // Faster than `min_every_ms`: 422, from anyone.
    let fast = e
        .schedule(job("fast", When::EveryMs(1), Missed::Once))
        .unwrap_err();
    assert_eq!(fast.status, 422, "{}", fast.message);
    // A client's target outside `client_targets`: 403.
    let mut elsewhere = job("d", When::AfterMs(1000), Missed::Once);
    elsewhere.event = "demo.Panic".into();
    assert!(e.cancel_as("a", owner).unwrap());
    assert_eq!(e.schedule_as(elsewhere, owner).unwrap_err().status, 403);
}
