//! The `scheduler` manager: the jobs of `switchyard_manager::scheduler`,
//! kept in the Store's database and fired from there — or, when the group
//! is clustered, in a JetStream bucket every group serves and the holder
//! of its lease fires (`jetstream`, decision 0140).
//!
//! Nothing but the jobs in flight is held in memory: each tick asks the
//! database (an index on the due time) for what is due, so a million
//! pending jobs take the memory of none. A firing is recorded as started
//! before it is sent and as done only once it was answered, which makes
//! delivery at least once across a `kill -9`.
//!
//! Two clocks: a job planned by a delay (`after`, `every`) is timed on the
//! monotonic clock, a job planned by the calendar (`at`, `cron`) on the
//! wall clock. Times are stored as wall-clock milliseconds (they must
//! survive a restart); when the wall clock steps while the scheduler runs,
//! the delay jobs are moved by the step so that they keep their distance,
//! and calendar jobs overdue by more than the grace fire at most once
//! (their `missed` policy), never once per missed occurrence.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

use rusqlite::{OptionalExtension, params};
use serde::{Deserialize, Serialize};
use switchyard_manager::scheduler::{
    Cancel, Cancelled, Found, GetJob, JobInfo, Jobs, Kind, ListJobs, Missed, Schedule, Scheduled, Update,
    When,
};
use switchyard_manager::store::JsonText;
use switchyard_manager::{Config, Context, Error, Json, LogLevel, Manager, Registry};

use crate::db::{self, Db, Durability};
use crate::store::Backend;
use crate::{BuiltinError, positive, settings};

/// Largest job id and event name, in bytes.
const MAX_ID_BYTES: usize = 256;
/// A wall clock that moves this far from the monotonic one is a step.
const STEP_MS: i64 = 1000;
/// Smaller drifts (slewing) just re-anchor the monotonic timeline.
const REANCHOR_MS: i64 = 50;
/// Firings started per tick at most, so that a backlog (after a long stop)
/// is spread over ticks instead of sent in one burst.
const FIRINGS_PER_TICK: usize = 256;
/// The largest `List` page.
const LIST_MAX: u32 = 1000;

/// The answer of a request firing (status, body), undecoded.
type Body = (u16, bytes::Bytes);

/// The `scheduler` manager's `[managers.config]` table (docs/scheduler.md).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SchedulerSettings {
    /// Set by the supervisor from `--data-dir` / `[data] dir`.
    pub(crate) data_dir: Option<PathBuf>,
    /// `fsync` (default) or `group`, as for the store.
    pub(crate) durability: Durability,
    /// With `group`: how often the log is fsynced, in milliseconds.
    pub(crate) group_commit_ms: u64,
    /// SQLite page cache, in KiB.
    pub(crate) cache_kib: u64,
    /// A firing later than this (ms) counts as missed: its job's `missed`
    /// policy applies.
    pub(crate) misfire_grace_ms: u64,
    /// Deadline of a request firing, in milliseconds.
    pub(crate) call_timeout_ms: u64,
    /// A request firing answered 502/503/504 (or not at all) is sent
    /// again, this many times in all at most.
    pub(crate) max_attempts: u32,
    /// First retry delay in ms; doubles per attempt, at most 30 s.
    pub(crate) retry_initial_ms: u64,
    /// Request firings awaiting their answer at once, at most.
    pub(crate) max_in_flight: usize,
    /// Largest payload, in bytes of JSON; larger → 413.
    pub(crate) max_payload_bytes: usize,
    /// The shortest `every_ms` accepted, from anyone; shorter → 422.
    pub(crate) min_every_ms: u64,
    /// Jobs one client (an identity, or all anonymous clients together)
    /// may hold at once; more → 429. Managers are not counted.
    pub(crate) max_jobs_per_client: u64,
    /// What a client's job may fire: event names, `prefix.*` or `*`
    /// (default: anything the client may send itself, which the listener
    /// checks when the job is scheduled).
    pub(crate) client_targets: Vec<String>,
    /// Where the jobs live: `auto` (JetStream when the group has
    /// `[cluster]`, else SQLite), `sqlite` or `jetstream`, as the Store's.
    pub(crate) backend: Backend,
    /// JetStream: the bucket's replicas (1 to 5).
    pub(crate) replicas: usize,
    /// JetStream: the bucket's name (default `scheduler-<cluster name>`).
    pub(crate) bucket: Option<String>,
    /// JetStream: the longest an operation waits for the bucket.
    pub(crate) op_timeout_ms: u64,
    /// JetStream: how long the lease of the group that fires the jobs
    /// lasts unrenewed; another group takes over after it (decision 0140).
    pub(crate) lease_ms: u64,
    /// Set by the supervisor from `[cluster]`.
    pub(crate) cluster: Option<switchyard_cluster::Config>,
}

impl Default for SchedulerSettings {
    fn default() -> Self {
        SchedulerSettings {
            data_dir: None,
            durability: Durability::Fsync,
            group_commit_ms: 50,
            cache_kib: 2 * 1024,
            misfire_grace_ms: 60_000,
            call_timeout_ms: 10_000,
            max_attempts: 10,
            retry_initial_ms: 100,
            max_in_flight: 256,
            max_payload_bytes: 256 * 1024,
            min_every_ms: 100,
            max_jobs_per_client: 100,
            client_targets: Vec::new(),
            backend: Backend::Auto,
            replicas: 3,
            bucket: None,
            op_timeout_ms: 2000,
            lease_ms: 5000,
            cluster: None,
        }
    }
}

impl SchedulerSettings {
    pub(crate) fn parse(value: &serde_json::Value) -> Result<SchedulerSettings, BuiltinError> {
        let s: SchedulerSettings = settings(value)?;
        positive("cache_kib", s.cache_kib)?;
        positive("group_commit_ms", s.group_commit_ms)?;
        positive("call_timeout_ms", s.call_timeout_ms)?;
        positive("max_attempts", s.max_attempts as u64)?;
        positive("retry_initial_ms", s.retry_initial_ms)?;
        positive("max_in_flight", s.max_in_flight as u64)?;
        positive("max_payload_bytes", s.max_payload_bytes as u64)?;
        positive("min_every_ms", s.min_every_ms)?;
        positive("max_jobs_per_client", s.max_jobs_per_client)?;
        positive("op_timeout_ms", s.op_timeout_ms)?;
        if s.op_timeout_ms > 10_000 {
            // A handler waits this long, and the watchdog ends a manager
            // whose handlers take `group.handler_timeout_ms` (30 s).
            return Err(BuiltinError::Config {
                key: "op_timeout_ms".into(),
                message: "must be at most 10000".into(),
            });
        }
        if !(1..=5).contains(&s.replicas) {
            return Err(BuiltinError::Config {
                key: "replicas".into(),
                message: "must be 1 to 5 (JetStream's limit)".into(),
            });
        }
        if s.lease_ms < 1000 || s.lease_ms > 600_000 {
            // Renewed every third of it, each renewal a round trip that
            // may take `op_timeout_ms` while a leader is elected.
            return Err(BuiltinError::Config {
                key: "lease_ms".into(),
                message: "must be 1000 to 600000".into(),
            });
        }
        if let Some(bucket) = &s.bucket
            && (bucket.is_empty()
                || !bucket
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
        {
            return Err(BuiltinError::Config {
                key: "bucket".into(),
                message: format!("`{bucket}` must be letters, digits, `-` or `_`"),
            });
        }
        for (i, pattern) in s.client_targets.iter().enumerate() {
            switchyard_proto::control::pattern_prefix(pattern).map_err(|message| BuiltinError::Config {
                key: format!("client_targets[{i}]"),
                message,
            })?;
        }
        Ok(s)
    }

    /// `[cluster]`, when the jobs live in JetStream.
    pub(crate) fn jetstream(&self) -> Option<&switchyard_cluster::Config> {
        match self.backend {
            Backend::Sqlite => None,
            Backend::Auto | Backend::Jetstream => self.cluster.as_ref().filter(|c| c.enabled()),
        }
    }
}

/// The clocks the scheduler reads (a fake one in tests).
pub(crate) trait Clock {
    /// Milliseconds since the Unix epoch.
    fn wall_ms(&self) -> u64;
    /// A monotonic instant, as time since an arbitrary origin.
    fn mono(&self) -> Duration;
}

/// The system's clocks.
pub(crate) struct SystemClock(Instant);

impl Clock for SystemClock {
    fn wall_ms(&self) -> u64 {
        db::wall_ms()
    }
    fn mono(&self) -> Duration {
        self.0.elapsed()
    }
}

/// What a job does, as stored (JSON in the `spec` column).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Spec {
    when: When,
    event: String,
    kind: Kind,
    payload: JsonText,
    missed: Missed,
    #[serde(default)]
    tz: Option<String>,
    /// Who scheduled it: `client:<subject>` (`client:` when anonymous),
    /// or empty for the group's managers (decision 0110). Only its owner
    /// sees, changes or cancels it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    owner: String,
    /// A client's identity as the listener verified it when the job was
    /// scheduled or last changed (`{"sub", "method", "claims"}`; none for
    /// anonymous clients): the job fires as that client, admitted by a
    /// listener then (decision 0113).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    identity: Option<serde_json::Value>,
}

impl Spec {
    /// The same job, whoever's credential last scheduled it.
    fn same_job(&self, other: &Spec) -> bool {
        let bare = |s: &Spec| Spec {
            identity: None,
            ..s.clone()
        };
        bare(self) == bare(other)
    }

    /// Meta `:job` for a client's job: whom a listener admits it as.
    /// `None` for the managers' jobs, which fire as the Scheduler's calls.
    fn client(&self) -> Option<String> {
        self.owner
            .starts_with(CLIENT)
            .then(|| serde_json::json!({ "identity": self.identity }).to_string())
    }

    /// Timed by the wall clock (`at`, `cron`) rather than the monotonic one.
    fn calendar(&self) -> bool {
        matches!(self.when, When::AtMs(_) | When::Cron(_))
    }
}

/// A firing decided by [`Engine::due`]: what to send.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Fire {
    pub(crate) id: String,
    pub(crate) token: u64,
    pub(crate) event: String,
    pub(crate) kind: Kind,
    pub(crate) planned_ms: u64,
    /// The JSON body: `{"job", "planned_ms", "payload"}`.
    pub(crate) body: Vec<u8>,
    /// For a client's job, its client (meta `:job`, decision 0113).
    pub(crate) client: Option<String>,
}

/// The jobs, their database and their timing; no I/O but SQLite, so that
/// tests drive it with a fake clock.
pub(crate) struct Engine<C: Clock> {
    db: Db,
    clock: C,
    settings: SchedulerSettings,
    /// The monotonic timeline: wall-clock ms at `origin_mono`.
    origin_wall: u64,
    origin_mono: Duration,
    /// Firings sent and not yet settled: job id → token.
    in_flight: HashMap<String, u64>,
    next_token: u64,
    next_id: u64,
    /// The earliest due time of each timeline (delay, calendar), or `None`
    /// when it must be read again.
    earliest: Option<(Option<u64>, Option<u64>)>,
}

fn unprocessable(message: impl Into<String>) -> Error {
    Error::unprocessable(message)
}

fn tz_of(tz: Option<&str>) -> Result<jiff::tz::TimeZone, Error> {
    match tz {
        None => Ok(jiff::tz::TimeZone::UTC),
        Some(name) => jiff::tz::TimeZone::get(name)
            .map_err(|e| unprocessable(format!("unknown time zone `{name}`: {e}"))),
    }
}

fn cron_of(expr: &str) -> Result<croner::Cron, Error> {
    croner::Cron::from_str(expr).map_err(|e| unprocessable(format!("bad cron expression `{expr}`: {e}")))
}

/// The first occurrence of `expr` after `after_ms` (exclusive), in ms.
fn cron_next(expr: &str, tz: Option<&str>, after_ms: u64) -> Result<u64, Error> {
    let cron = cron_of(expr)?;
    let zone = tz_of(tz)?;
    let start = jiff::Timestamp::from_millisecond(after_ms as i64)
        .map_err(|e| unprocessable(e.to_string()))?
        .to_zoned(zone);
    let next = cron
        .find_next_occurrence(&start, false)
        .map_err(|e| unprocessable(format!("cron expression `{expr}` has no next occurrence: {e}")))?;
    Ok(next.timestamp().as_millisecond().max(0) as u64)
}

/// The last occurrence of `expr` at or before `at_ms`.
fn cron_previous(expr: &str, tz: Option<&str>, at_ms: u64) -> Option<u64> {
    let cron = cron_of(expr).ok()?;
    let start = jiff::Timestamp::from_millisecond(at_ms as i64)
        .ok()?
        .to_zoned(tz_of(tz).ok()?);
    let prev = cron.find_previous_occurrence(&start, true).ok()?;
    Some(prev.timestamp().as_millisecond().max(0) as u64)
}

/// Whether `patterns` (names, `prefix.*`, `*`) take `name`.
fn matches_any(patterns: &[String], name: &str) -> bool {
    patterns
        .iter()
        .any(|p| match switchyard_proto::control::pattern_prefix(p) {
            Ok(Some(prefix)) => name.starts_with(prefix),
            Ok(None) => p == name,
            Err(_) => false,
        })
}

fn check_spec(spec: &Spec, settings: &SchedulerSettings) -> Result<(), Error> {
    if spec.event.is_empty() || spec.event.len() > MAX_ID_BYTES {
        return Err(unprocessable(format!(
            "`event` must name an event type (1 to {MAX_ID_BYTES} bytes)"
        )));
    }
    if spec.payload.len() > settings.max_payload_bytes {
        return Err(Error::new(
            413,
            format!(
                "a payload of {} bytes is over the scheduler's limit (`max_payload_bytes` = {})",
                spec.payload.len(),
                settings.max_payload_bytes
            ),
        ));
    }
    if !spec.owner.is_empty()
        && !settings.client_targets.is_empty()
        && !matches_any(&settings.client_targets, &spec.event)
    {
        return Err(Error::new(
            403,
            format!(
                "a client's job may not fire `{}` (the scheduler's `client_targets`)",
                spec.event
            ),
        ));
    }
    match &spec.when {
        When::EveryMs(ms) if *ms < settings.min_every_ms => {
            return Err(unprocessable(format!(
                "`every_ms` must be at least {} (the scheduler's `min_every_ms`)",
                settings.min_every_ms
            )));
        }
        When::Cron(expr) => {
            cron_of(expr)?;
        }
        _ => {}
    }
    if spec.tz.is_some() && !matches!(spec.when, When::Cron(_)) {
        return Err(unprocessable("`tz` applies to cron jobs only"));
    }
    tz_of(spec.tz.as_deref())?;
    Ok(())
}

fn firing_body(id: &str, planned_ms: u64, payload: &JsonText) -> Vec<u8> {
    let id = serde_json::to_string(id).unwrap_or_else(|_| "\"\"".into());
    format!(
        r#"{{"job":{id},"planned_ms":{planned_ms},"payload":{}}}"#,
        payload.as_str()
    )
    .into_bytes()
}

/// The latest occurrence of a repeating job at or before `now`, from
/// its planned `next_ms` (for a collapsed backlog).
fn latest_missed(spec: &Spec, next_ms: u64, now: u64) -> u64 {
    match &spec.when {
        When::EveryMs(every) => next_ms + (now - next_ms) / every * every,
        When::Cron(expr) => cron_previous(expr, spec.tz.as_deref(), now)
            .unwrap_or(next_ms)
            .max(next_ms),
        _ => next_ms,
    }
}

/// Where a job goes once its firing planned at `next_ms` is settled: a
/// one-shot job is done (`None`), a repeating one is planned at its first
/// occurrence after `now` (never a burst of catch-up firings).
fn next_after(spec: &Spec, next_ms: u64, now: u64) -> Result<Option<u64>, Error> {
    Ok(match &spec.when {
        When::AfterMs(_) | When::AtMs(_) => None,
        When::EveryMs(every) => {
            let base = next_ms.max(1);
            let periods = now.saturating_sub(base) / every + 1;
            Some(base + periods * every)
        }
        When::Cron(expr) => Some(cron_next(expr, spec.tz.as_deref(), now.max(next_ms))?),
    })
}

/// The job `ev` asks for, checked, owned by `owner` and firing as
/// `identity`.
fn spec_of(
    ev: &Schedule,
    owner: &str,
    identity: Option<serde_json::Value>,
    settings: &SchedulerSettings,
) -> Result<Spec, Error> {
    let spec = Spec {
        when: ev.when.clone(),
        event: ev.event.clone(),
        kind: ev.kind,
        payload: ev.payload.clone(),
        missed: ev.missed,
        tz: ev.tz.clone(),
        owner: owner.to_owned(),
        identity,
    };
    check_spec(&spec, settings)?;
    if let Some(id) = &ev.id
        && (id.is_empty() || id.len() > MAX_ID_BYTES)
    {
        return Err(unprocessable(format!("`id` must have 1 to {MAX_ID_BYTES} bytes")));
    }
    Ok(spec)
}

/// `spec` changed as `ev` asks, checked, and whether its plan changes
/// (`when` or `tz` given). A client names the target (`event`) whenever
/// it sets `kind`: the listener checks the target it names against its
/// rules.
fn updated(
    spec: &Spec,
    ev: Update,
    owner: &str,
    identity: Option<serde_json::Value>,
    settings: &SchedulerSettings,
) -> Result<(Spec, bool), Error> {
    if !owner.is_empty() && ev.kind.is_some() && ev.event.is_none() {
        return Err(unprocessable(
            "a client's update that sets `kind` names `event` too",
        ));
    }
    let mut spec = spec.clone();
    let replan = ev.when.is_some() || ev.tz.is_some();
    if let Some(when) = ev.when {
        spec.when = when;
    }
    if let Some(event) = ev.event {
        spec.event = event;
    }
    if let Some(kind) = ev.kind {
        spec.kind = kind;
    }
    if let Some(payload) = ev.payload {
        spec.payload = payload;
    }
    if let Some(missed) = ev.missed {
        spec.missed = missed;
    }
    if ev.tz.is_some() {
        spec.tz = ev.tz;
    }
    if !owner.is_empty() {
        spec.identity = identity;
    }
    check_spec(&spec, settings)?;
    Ok((spec, replan))
}

struct Row {
    id: String,
    spec: Spec,
    next_ms: u64,
    attempts: u32,
    fired: u64,
}

impl<C: Clock> Engine<C> {
    pub(crate) fn new(db: Db, clock: C, settings: SchedulerSettings) -> Result<Engine<C>, BuiltinError> {
        db.conn
            .execute_batch(
                "CREATE TABLE IF NOT EXISTS jobs (
                    id BLOB PRIMARY KEY,
                    spec TEXT NOT NULL,
                    next_ms INTEGER NOT NULL,
                    due_ms INTEGER NOT NULL,
                    calendar INTEGER NOT NULL,
                    attempts INTEGER NOT NULL DEFAULT 0,
                    fired INTEGER NOT NULL DEFAULT 0
                 ) WITHOUT ROWID;
                 CREATE INDEX IF NOT EXISTS jobs_due ON jobs(calendar, due_ms);",
            )
            .map_err(|e| BuiltinError::Database {
                path: db.path.clone(),
                message: e.to_string(),
            })?;
        // Firings in flight when the last process died are sent again now,
        // not when their answer would have been overdue.
        db.conn
            .execute("UPDATE jobs SET due_ms = next_ms WHERE attempts > 0", [])
            .map_err(|e| BuiltinError::Database {
                path: db.path.clone(),
                message: e.to_string(),
            })?;
        let (origin_wall, origin_mono) = (clock.wall_ms(), clock.mono());
        Ok(Engine {
            db,
            clock,
            settings,
            origin_wall,
            origin_mono,
            in_flight: HashMap::new(),
            next_token: 1,
            next_id: 0,
            earliest: None,
        })
    }

    fn failed(&self, e: rusqlite::Error) -> Error {
        self.db.failed(e)
    }

    /// Now on the monotonic timeline, in wall-clock milliseconds.
    fn mono_ms(&self) -> u64 {
        self.origin_wall + (self.clock.mono().saturating_sub(self.origin_mono)).as_millis() as u64
    }

    /// Follows the wall clock: a step moves the delay jobs with it (they
    /// keep their distance); a slow drift re-anchors the timeline. Returns
    /// the step, if there was one.
    pub(crate) fn follow_clock(&mut self) -> Result<Option<i64>, Error> {
        let wall = self.clock.wall_ms() as i64;
        let drift = wall - self.mono_ms() as i64;
        if drift.abs() <= REANCHOR_MS {
            return Ok(None);
        }
        let origin = (self.clock.wall_ms(), self.clock.mono());
        if drift.abs() > STEP_MS {
            self.db
                .conn
                .execute(
                    "UPDATE jobs SET next_ms = MAX(next_ms + ?1, 0), due_ms = MAX(due_ms + ?1, 0) WHERE calendar = 0",
                    [drift],
                )
                .map_err(|e| self.failed(e))?;
            self.earliest = None;
        }
        (self.origin_wall, self.origin_mono) = origin;
        Ok((drift.abs() > STEP_MS).then_some(drift))
    }

    /// The first firing of `spec`, planned now.
    fn first(&self, spec: &Spec) -> Result<u64, Error> {
        let mono = self.mono_ms();
        Ok(match &spec.when {
            When::AfterMs(d) | When::EveryMs(d) => mono.saturating_add(*d),
            When::AtMs(at) => *at,
            When::Cron(expr) => cron_next(expr, spec.tz.as_deref(), self.clock.wall_ms())?,
        })
    }

    fn now_for(&self, calendar: bool) -> u64 {
        if calendar {
            self.clock.wall_ms()
        } else {
            self.mono_ms()
        }
    }

    fn read(&self, id: &str) -> Result<Option<Row>, Error> {
        let row = self
            .db
            .conn
            .prepare_cached("SELECT spec, next_ms, attempts, fired FROM jobs WHERE id = ?1")
            .and_then(|mut stmt| {
                stmt.query_row([id.as_bytes()], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, u64>(1)?,
                        r.get::<_, u32>(2)?,
                        r.get::<_, u64>(3)?,
                    ))
                })
                .optional()
            })
            .map_err(|e| self.failed(e))?;
        row.map(|(spec, next_ms, attempts, fired)| {
            Ok(Row {
                id: id.to_owned(),
                spec: serde_json::from_str(&spec)
                    .map_err(|e| Error::internal(format!("job `{id}` is stored unreadably: {e}")))?,
                next_ms,
                attempts,
                fired,
            })
        })
        .transpose()
    }

    /// Stores a job's definition, planned anew at `next_ms`; a firing in
    /// flight for the old definition then settles nothing.
    fn write(&mut self, id: &str, spec: &Spec, next_ms: u64) -> Result<(), Error> {
        let text = serde_json::to_string(spec).map_err(|e| Error::internal(e.to_string()))?;
        self.db
            .conn
            .prepare_cached(
                "INSERT INTO jobs(id, spec, next_ms, due_ms, calendar, attempts, fired)
                 VALUES (?1, ?2, ?3, ?3, ?4, 0, 0)
                 ON CONFLICT(id) DO UPDATE SET spec = excluded.spec, next_ms = excluded.next_ms,
                   due_ms = excluded.due_ms, calendar = excluded.calendar, attempts = 0",
            )
            .and_then(|mut stmt| stmt.execute(params![id.as_bytes(), text, next_ms, spec.calendar()]))
            .map_err(|e| self.failed(e))?;
        self.in_flight.remove(id);
        self.earliest = None;
        Ok(())
    }

    /// Changes what a job fires, not when: its plan and a firing in
    /// flight stay as they are.
    fn rewrite(&mut self, id: &str, spec: &Spec) -> Result<(), Error> {
        let text = serde_json::to_string(spec).map_err(|e| Error::internal(e.to_string()))?;
        self.db
            .conn
            .prepare_cached("UPDATE jobs SET spec = ?2 WHERE id = ?1")
            .and_then(|mut stmt| stmt.execute(params![id.as_bytes(), text]))
            .map_err(|e| self.failed(e))?;
        Ok(())
    }

    fn info(row: Row) -> JobInfo {
        JobInfo {
            id: row.id,
            when: row.spec.when,
            event: row.spec.event,
            kind: row.spec.kind,
            payload: row.spec.payload,
            missed: row.spec.missed,
            tz: row.spec.tz,
            next_ms: row.next_ms,
            fired: row.fired,
        }
    }

    /// As the group's managers (tests).
    #[cfg(test)]
    pub(crate) fn schedule(&mut self, ev: Schedule) -> Result<Scheduled, Error> {
        self.schedule_as(ev, MANAGERS)
    }

    /// [`Self::schedule`] for `owner`: a client's job is counted against
    /// its bound, and an id another owner holds is taken.
    #[cfg(test)]
    pub(crate) fn schedule_as(&mut self, ev: Schedule, owner: &str) -> Result<Scheduled, Error> {
        self.schedule_for(ev, owner, None)
    }

    /// [`Self::schedule_as`] recording the client's `identity`, which the
    /// job fires as.
    pub(crate) fn schedule_for(
        &mut self,
        ev: Schedule,
        owner: &str,
        identity: Option<serde_json::Value>,
    ) -> Result<Scheduled, Error> {
        let spec = spec_of(&ev, owner, identity, &self.settings)?;
        let id = match ev.id {
            Some(id) => {
                if let Some(existing) = self.read(&id)? {
                    if existing.spec.owner != spec.owner {
                        return Err(Error::conflict(format!("the job id `{id}` is taken")));
                    }
                    if existing.spec.same_job(&spec) {
                        // The client's newer credential is the one the
                        // job fires with from now on.
                        if existing.spec.identity != spec.identity {
                            self.rewrite(&id, &spec)?;
                        }
                        return Ok(Scheduled {
                            id,
                            next_ms: existing.next_ms,
                            created: false,
                        });
                    }
                    if !ev.replace {
                        return Err(Error::conflict(format!(
                            "a different job `{id}` exists: cancel it, update it, or schedule with `replace`"
                        )));
                    }
                }
                id
            }
            None => self.fresh_id()?,
        };
        if !owner.is_empty() && self.read(&id)?.is_none() {
            let held = self.count_owned(owner)?;
            if held >= self.settings.max_jobs_per_client {
                return Err(Error::new(
                    429,
                    format!(
                        "a client holds at most {} jobs (the scheduler's `max_jobs_per_client`); cancel one first",
                        self.settings.max_jobs_per_client
                    ),
                ));
            }
        }
        let next_ms = self.first(&spec)?;
        self.write(&id, &spec, next_ms)?;
        Ok(Scheduled {
            id,
            next_ms,
            created: true,
        })
    }

    fn fresh_id(&mut self) -> Result<String, Error> {
        loop {
            self.next_id += 1;
            let id = format!(
                "job-{:x}-{:x}-{:x}",
                self.clock.wall_ms(),
                std::process::id(),
                self.next_id
            );
            if self.read(&id)?.is_none() {
                return Ok(id);
            }
        }
    }

    /// How many jobs `owner` holds.
    fn count_owned(&self, owner: &str) -> Result<u64, Error> {
        self.db
            .conn
            .prepare_cached(
                "SELECT COUNT(*) FROM jobs WHERE COALESCE(json_extract(spec, '$.owner'), '') = ?1",
            )
            .and_then(|mut stmt| stmt.query_row([owner], |r| r.get::<_, u64>(0)))
            .map_err(|e| self.failed(e))
    }

    /// Job `id` if `owner` holds it: another owner's job is as absent.
    fn read_owned(&self, id: &str, owner: &str) -> Result<Option<Row>, Error> {
        Ok(self.read(id)?.filter(|row| row.spec.owner == owner))
    }

    /// As the group's managers (tests).
    #[cfg(test)]
    pub(crate) fn update(&mut self, ev: Update) -> Result<Scheduled, Error> {
        self.update_as(ev, MANAGERS)
    }

    /// [`Self::update`] of `owner`'s job. A client names the target
    /// (`event`) whenever it sets `kind`: the listener checks the target
    /// it names against its rules.
    #[cfg(test)]
    pub(crate) fn update_as(&mut self, ev: Update, owner: &str) -> Result<Scheduled, Error> {
        self.update_for(ev, owner, None)
    }

    /// [`Self::update_as`] by a client whose `identity` the job fires as
    /// from now on (the listener admitted the change with it).
    pub(crate) fn update_for(
        &mut self,
        ev: Update,
        owner: &str,
        identity: Option<serde_json::Value>,
    ) -> Result<Scheduled, Error> {
        let Some(row) = self.read_owned(&ev.id, owner)? else {
            return Err(Error::not_found(format!("no job `{}`", ev.id)));
        };
        let id = ev.id.clone();
        let (spec, replan) = updated(&row.spec, ev, owner, identity, &self.settings)?;
        let next_ms = if replan {
            let next_ms = self.first(&spec)?;
            self.write(&id, &spec, next_ms)?;
            next_ms
        } else {
            self.rewrite(&id, &spec)?;
            row.next_ms
        };
        Ok(Scheduled {
            id,
            next_ms,
            created: false,
        })
    }

    /// Cancels `owner`'s job `id`; another owner's is as absent.
    pub(crate) fn cancel_as(&mut self, id: &str, owner: &str) -> Result<bool, Error> {
        if self.read_owned(id, owner)?.is_none() {
            return Ok(false);
        }
        self.cancel(id)
    }

    pub(crate) fn cancel(&mut self, id: &str) -> Result<bool, Error> {
        let n = self
            .db
            .conn
            .prepare_cached("DELETE FROM jobs WHERE id = ?1")
            .and_then(|mut stmt| stmt.execute([id.as_bytes()]))
            .map_err(|e| self.failed(e))?;
        self.in_flight.remove(id);
        self.earliest = None;
        Ok(n > 0)
    }

    /// As the group's managers (tests).
    #[cfg(test)]
    pub(crate) fn get(&self, id: &str) -> Result<Option<JobInfo>, Error> {
        self.get_as(id, MANAGERS)
    }

    pub(crate) fn get_as(&self, id: &str, owner: &str) -> Result<Option<JobInfo>, Error> {
        Ok(self.read_owned(id, owner)?.map(Self::info))
    }

    /// As the group's managers (tests).
    #[cfg(test)]
    pub(crate) fn list(&self, ev: &ListJobs) -> Result<Jobs, Error> {
        self.list_as(ev, MANAGERS)
    }

    /// `owner`'s jobs only.
    pub(crate) fn list_as(&self, ev: &ListJobs, owner: &str) -> Result<Jobs, Error> {
        let limit = ev.limit.unwrap_or(LIST_MAX).clamp(1, LIST_MAX);
        let lower = match &ev.after {
            Some(after) if after.as_str() >= ev.prefix.as_str() => after.clone(),
            _ => ev.prefix.clone(),
        };
        let inclusive = ev.after.as_ref().is_none_or(|a| a.as_str() < ev.prefix.as_str());
        let sql = format!(
            "SELECT id FROM jobs WHERE id {} ?1 AND substr(id, 1, ?2) = ?3 \
             AND COALESCE(json_extract(spec, '$.owner'), '') = ?5 ORDER BY id LIMIT ?4",
            if inclusive { ">=" } else { ">" }
        );
        let ids: Vec<Vec<u8>> = self
            .db
            .conn
            .prepare_cached(&sql)
            .and_then(|mut stmt| {
                stmt.query_map(
                    params![
                        lower.as_bytes(),
                        ev.prefix.len(),
                        ev.prefix.as_bytes(),
                        limit + 1,
                        owner
                    ],
                    |r| r.get(0),
                )?
                .collect()
            })
            .map_err(|e| self.failed(e))?;
        let mut jobs = Vec::new();
        let mut next = None;
        for (i, id) in ids.into_iter().enumerate() {
            let id = String::from_utf8_lossy(&id).into_owned();
            if i as u32 == limit {
                next = jobs.last().map(|j: &JobInfo| j.id.clone());
                break;
            }
            if let Some(row) = self.read(&id)? {
                jobs.push(Self::info(row));
            }
        }
        Ok(Jobs { jobs, next })
    }

    fn earliest(&mut self) -> Result<(Option<u64>, Option<u64>), Error> {
        if let Some(e) = self.earliest {
            return Ok(e);
        }
        let min = |calendar: bool| -> Result<Option<u64>, Error> {
            self.db
                .conn
                .prepare_cached("SELECT MIN(due_ms) FROM jobs WHERE calendar = ?1")
                .and_then(|mut stmt| stmt.query_row([calendar], |r| r.get::<_, Option<u64>>(0)))
                .map_err(|e| self.failed(e))
        };
        let e = (min(false)?, min(true)?);
        self.earliest = Some(e);
        Ok(e)
    }

    /// Decides what fires now, records each firing as started (its job is
    /// not due again until it is settled or its answer is overdue), and
    /// returns them. At most `room` firings.
    pub(crate) fn due(&mut self, room: usize) -> Result<Vec<Fire>, Error> {
        let (delay, calendar) = self.earliest()?;
        let (mono, wall) = (self.mono_ms(), self.clock.wall_ms());
        let mut fires = Vec::new();
        for (is_calendar, earliest, now) in [(false, delay, mono), (true, calendar, wall)] {
            if earliest.is_none_or(|e| e > now) {
                continue;
            }
            let limit = room.saturating_sub(fires.len()).min(FIRINGS_PER_TICK);
            if limit == 0 {
                break;
            }
            let ids: Vec<Vec<u8>> = self
                .db
                .conn
                .prepare_cached(
                    "SELECT id FROM jobs WHERE calendar = ?1 AND due_ms <= ?2 ORDER BY due_ms LIMIT ?3",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(params![is_calendar, now, limit as u64], |r| r.get(0))?
                        .collect()
                })
                .map_err(|e| self.failed(e))?;
            for id in ids {
                let id = String::from_utf8_lossy(&id).into_owned();
                if let Some(row) = self.read(&id)?
                    && let Some(fire) = self.start(row, now)?
                {
                    fires.push(fire);
                }
            }
        }
        if !fires.is_empty() {
            self.earliest = None;
        }
        Ok(fires)
    }

    /// Starts one due job's firing, or applies its `missed` policy.
    fn start(&mut self, row: Row, now: u64) -> Result<Option<Fire>, Error> {
        let mut planned = row.next_ms;
        if row.attempts == 0 && now.saturating_sub(row.next_ms) > self.settings.misfire_grace_ms {
            match row.spec.missed {
                Missed::Skip => {
                    self.advance(&row, now, false)?;
                    return Ok(None);
                }
                Missed::Once => planned = latest_missed(&row.spec, row.next_ms, now),
            }
        }
        // Sent, not yet answered: not due again before the answer is
        // overdue; after a crash it is sent again from here.
        let ack_by = now + self.settings.call_timeout_ms + 1000;
        self.db
            .conn
            .prepare_cached(
                "UPDATE jobs SET next_ms = ?2, due_ms = ?3, attempts = attempts + 1 WHERE id = ?1",
            )
            .and_then(|mut stmt| stmt.execute(params![row.id.as_bytes(), planned, ack_by]))
            .map_err(|e| self.failed(e))?;
        let token = self.next_token;
        self.next_token += 1;
        self.in_flight.insert(row.id.clone(), token);
        Ok(Some(Fire {
            body: firing_body(&row.id, planned, &row.spec.payload),
            client: row.spec.client(),
            id: row.id,
            token,
            event: row.spec.event,
            kind: row.spec.kind,
            planned_ms: planned,
        }))
    }

    /// Moves a job past its current firing: a one-shot job is done, a
    /// repeating one is planned at its first occurrence after `now`
    /// (never a burst of catch-up firings).
    fn advance(&mut self, row: &Row, now: u64, delivered: bool) -> Result<(), Error> {
        let next = next_after(&row.spec, row.next_ms, now)?;
        let fired = u64::from(delivered);
        let result = match next {
            None => self
                .db
                .conn
                .prepare_cached("DELETE FROM jobs WHERE id = ?1")
                .and_then(|mut stmt| stmt.execute([row.id.as_bytes()])),
            Some(next) => self
                .db
                .conn
                .prepare_cached(
                    "UPDATE jobs SET next_ms = ?2, due_ms = ?2, attempts = 0, fired = fired + ?3 WHERE id = ?1",
                )
                .and_then(|mut stmt| stmt.execute(params![row.id.as_bytes(), next, fired])),
        };
        result.map_err(|e| self.failed(e))?;
        self.earliest = None;
        Ok(())
    }

    /// Whether `token` is still the firing in flight of job `id`.
    fn current(&self, id: &str, token: u64) -> bool {
        self.in_flight.get(id) == Some(&token)
    }

    /// The firing was delivered: advance its job.
    pub(crate) fn delivered(&mut self, id: &str, token: u64) -> Result<(), Error> {
        if !self.current(id, token) {
            return Ok(());
        }
        self.in_flight.remove(id);
        if let Some(row) = self.read(id)? {
            let now = self.now_for(row.spec.calendar());
            self.advance(&row, now, true)?;
        }
        Ok(())
    }

    /// The firing failed with `status`: retried later if it may help and
    /// attempts are left, else given up (the job moves on). Returns
    /// whether it will be retried.
    pub(crate) fn failed_firing(&mut self, id: &str, token: u64, status: u16) -> Result<bool, Error> {
        if !self.current(id, token) {
            return Ok(false);
        }
        self.in_flight.remove(id);
        let Some(row) = self.read(id)? else {
            return Ok(false);
        };
        let now = self.now_for(row.spec.calendar());
        let retry = matches!(status, 502..=504) && row.attempts < self.settings.max_attempts;
        if retry {
            let delay = self
                .settings
                .retry_initial_ms
                .saturating_mul(1 << row.attempts.saturating_sub(1).min(20))
                .min(30_000);
            self.db
                .conn
                .prepare_cached("UPDATE jobs SET due_ms = ?2 WHERE id = ?1")
                .and_then(|mut stmt| stmt.execute(params![id.as_bytes(), now + delay]))
                .map_err(|e| self.failed(e))?;
            self.earliest = None;
        } else {
            self.advance(&row, now, false)?;
        }
        Ok(retry)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

type Answer = Pin<Box<dyn Future<Output = Body>>>;

/// A request firing awaiting its answer.
struct Pending {
    id: String,
    token: u64,
    event: String,
    /// A client's job: fired as its client (decision 0113).
    client: bool,
    answer: Answer,
}

/// The owner of the group's managers' jobs.
const MANAGERS: &str = "";
/// How a client owner begins.
const CLIENT: &str = "client:";

/// Who a request's jobs belong to: a client by its identity's subject
/// (all anonymous clients share one owner), the managers together.
fn owner(cx: &Context) -> String {
    if !cx.from_client() {
        return MANAGERS.to_owned();
    }
    let sub = cx.identity().map(|i| i.sub).unwrap_or_default();
    format!("{CLIENT}{sub}")
}

/// The identity a client's job fires as: the caller's, as the listener
/// verified it (`None` for managers and anonymous clients).
fn identity(cx: &Context) -> Option<serde_json::Value> {
    if !cx.from_client() {
        return None;
    }
    cx.identity().and_then(|i| serde_json::to_value(i).ok())
}

/// Where the jobs live.
enum Home {
    /// This group's SQLite file: this group fires them.
    Local(Engine<SystemClock>),
    /// The cluster's JetStream bucket: the group holding its lease fires
    /// them (decision 0140).
    Shared(jetstream::JsJobs),
}

impl Home {
    fn delivered(&mut self, id: &str, token: u64) -> Result<(), Error> {
        match self {
            Home::Local(e) => e.delivered(id, token),
            Home::Shared(j) => j.delivered(id, token),
        }
    }

    fn failed_firing(&mut self, id: &str, token: u64, status: u16) -> Result<bool, Error> {
        match self {
            Home::Local(e) => e.failed_firing(id, token, status),
            Home::Shared(j) => j.failed_firing(id, token, status),
        }
    }

    fn in_flight(&self) -> usize {
        match self {
            Home::Local(e) => e.in_flight(),
            Home::Shared(j) => j.in_flight(),
        }
    }

    fn due(&mut self, room: usize) -> Result<Vec<Fire>, Error> {
        match self {
            Home::Local(e) => e.due(room),
            Home::Shared(j) => j.due(room),
        }
    }
}

/// The `scheduler` manager.
pub struct Scheduler {
    settings: SchedulerSettings,
    /// `None` only in the validation child, which serves nothing.
    jobs: Option<Home>,
    pending: Vec<Pending>,
    /// Notifications emitted at the last tick: settled at the next one,
    /// once the host has sent them on.
    emitted: Vec<(String, u64)>,
    /// `group` durability: the syncer's flag, and the database's change
    /// count when the last tick raised it.
    dirty: Option<(std::sync::Arc<std::sync::atomic::AtomicBool>, u64)>,
    /// On JetStream: the last failure a tick logged, so that an outage is
    /// logged once, not every tick.
    last_failure: Option<String>,
}

impl Manager for Scheduler {
    const NAME: &'static str = "scheduler";

    fn create(config: &Config) -> Result<Self, Error> {
        let settings = SchedulerSettings::parse(&config.value)?;
        let mut dirty = None;
        let jobs = if config.validation {
            None
        } else if settings.backend == Backend::Jetstream && settings.jetstream().is_none() {
            // Checked here, not in `parse`: the validation child is not
            // given `[cluster]` (the supervisor's check names this case).
            return Err(BuiltinError::Config {
                key: "backend".into(),
                message: "`jetstream` needs `[cluster]` (the NATS servers to reach JetStream through)".into(),
            }
            .into());
        } else if let Some(cluster) = settings.jetstream() {
            Some(Home::Shared(jetstream::JsJobs::start(cluster, settings.clone())?))
        } else {
            let dir = settings.data_dir.clone().ok_or_else(|| BuiltinError::Config {
                key: crate::DATA_DIR_KEY.into(),
                message: "no data directory was given (the supervisor sets it from --data-dir)".into(),
            })?;
            let db = db::open(&dir, Self::NAME, settings.durability, settings.cache_kib)?;
            if settings.durability == Durability::Group {
                let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                db::spawn_group_commit(
                    db::wal_path(&db.path),
                    flag.clone(),
                    Duration::from_millis(settings.group_commit_ms),
                );
                dirty = Some((flag, db.conn.total_changes()));
            }
            Some(Home::Local(Engine::new(
                db,
                SystemClock(Instant::now()),
                settings.clone(),
            )?))
        };
        Ok(Scheduler {
            settings,
            jobs,
            pending: Vec::new(),
            emitted: Vec::new(),
            dirty,
            last_failure: None,
        })
    }

    fn register(r: &mut Registry<Self>) {
        r.handle(Self::schedule)
            .handle(Self::update)
            .handle(Self::cancel)
            .handle(Self::get)
            .handle(Self::list)
            .every(|_| switchyard_manager::TICK_PERIOD, Self::tick);
    }
}

impl Scheduler {
    fn jobs(&mut self) -> Result<&mut Home, Error> {
        self.jobs
            .as_mut()
            .ok_or_else(|| Error::unavailable("the scheduler is not open"))
    }

    fn schedule(&mut self, ev: Schedule, cx: &mut Context) -> Result<Json<Scheduled>, Error> {
        let (owner, identity) = (owner(cx), identity(cx));
        match self.jobs()? {
            Home::Local(e) => e.schedule_for(ev, &owner, identity),
            Home::Shared(j) => j.schedule_for(ev, &owner, identity),
        }
        .map(Json)
    }

    fn update(&mut self, ev: Update, cx: &mut Context) -> Result<Json<Scheduled>, Error> {
        let (owner, identity) = (owner(cx), identity(cx));
        match self.jobs()? {
            Home::Local(e) => e.update_for(ev, &owner, identity),
            Home::Shared(j) => j.update_for(ev, &owner, identity),
        }
        .map(Json)
    }

    fn cancel(&mut self, ev: Cancel, cx: &mut Context) -> Result<Json<Cancelled>, Error> {
        let owner = owner(cx);
        let cancelled = match self.jobs()? {
            Home::Local(e) => e.cancel_as(&ev.id, &owner)?,
            Home::Shared(j) => j.cancel_as(&ev.id, &owner)?,
        };
        Ok(Json(Cancelled { cancelled }))
    }

    fn get(&mut self, ev: GetJob, cx: &mut Context) -> Result<Json<Found>, Error> {
        let owner = owner(cx);
        let job = match self.jobs()? {
            Home::Local(e) => e.get_as(&ev.id, &owner)?,
            Home::Shared(j) => j.get_as(&ev.id, &owner)?,
        };
        Ok(Json(Found { job }))
    }

    fn list(&mut self, ev: ListJobs, cx: &mut Context) -> Result<Json<Jobs>, Error> {
        let owner = owner(cx);
        match self.jobs()? {
            Home::Local(e) => e.list_as(&ev, &owner),
            Home::Shared(j) => j.list_as(&ev, &owner),
        }
        .map(Json)
    }

    /// A failure of a tick's step. The SQLite engine's end the tick (the
    /// host logs them); JetStream's are an outage, logged once when it
    /// starts: what was not recorded is done at a later tick, once the
    /// bucket answers again.
    fn tolerate<T: Default>(&mut self, cx: &Context, r: Result<T, Error>) -> Result<T, Error> {
        match r {
            Ok(v) => Ok(v),
            Err(e) if matches!(self.jobs, Some(Home::Shared(_))) => {
                let text = e.to_string();
                if self.last_failure.as_deref() != Some(text.as_str()) {
                    cx.log_at(LogLevel::Warn, &format!("scheduler: {text}"));
                    self.last_failure = Some(text);
                }
                Ok(T::default())
            }
            Err(e) => Err(e),
        }
    }

    /// Every tick: settle what was answered, then start what is due.
    fn tick(&mut self, cx: &mut Context) -> Result<(), Error> {
        let Some(jobs) = self.jobs.as_mut() else {
            return Ok(());
        };
        match jobs {
            Home::Local(engine) => {
                if let Some(step) = engine.follow_clock()? {
                    cx.log_at(
                        LogLevel::Warn,
                        &format!("the wall clock stepped by {step} ms: delay jobs keep their distance, calendar jobs follow it"),
                    );
                }
            }
            Home::Shared(js) => js.keep_lease(cx),
        }
        for (id, token) in std::mem::take(&mut self.emitted) {
            let r = self.jobs()?.delivered(&id, token);
            self.tolerate(cx, r)?;
        }
        // The answers arrived between ticks; their slots wait to be read.
        let mut waker_cx = std::task::Context::from_waker(Waker::noop());
        let mut still = Vec::with_capacity(self.pending.len());
        for mut p in std::mem::take(&mut self.pending) {
            match p.answer.as_mut().poll(&mut waker_cx) {
                Poll::Pending => still.push(p),
                Poll::Ready((status, body)) if status < 500 => {
                    if status < 400 && p.client {
                        let shown = &body[..body.len().min(256)];
                        cx.log_at(
                            LogLevel::Debug,
                            &format!(
                                "job `{}`: {} answered {status} ({}), fired as its client",
                                p.id,
                                p.event,
                                String::from_utf8_lossy(shown)
                            ),
                        );
                    }
                    if status >= 400 {
                        cx.log_at(
                            LogLevel::Warn,
                            &format!(
                                "job `{}`: {} answered {status} ({}); not retried",
                                p.id,
                                p.event,
                                String::from_utf8_lossy(&body)
                            ),
                        );
                    }
                    let r = self.jobs()?.delivered(&p.id, p.token);
                    self.tolerate(cx, r)?;
                }
                Poll::Ready((status, body)) => {
                    let r = self.jobs()?.failed_firing(&p.id, p.token, status);
                    let retry = self.tolerate(cx, r)?;
                    cx.log_at(
                        if retry { LogLevel::Info } else { LogLevel::Error },
                        &format!(
                            "job `{}`: {} failed with {status} ({}); {}",
                            p.id,
                            p.event,
                            String::from_utf8_lossy(&body),
                            if retry { "will retry" } else { "given up" }
                        ),
                    );
                }
            }
        }
        self.pending = still;
        let (max_in_flight, timeout) = (
            self.settings.max_in_flight,
            Duration::from_millis(self.settings.call_timeout_ms),
        );
        let jobs = self.jobs()?;
        let room = max_in_flight.saturating_sub(jobs.in_flight());
        let r = jobs.due(room);
        let fires = self.tolerate(cx, r)?;
        if fires.is_empty() {
            // Served again (or never failed): the next outage is logged.
            if let Some(Home::Shared(js)) = &self.jobs
                && js.answering()
            {
                self.last_failure = None;
            }
        }
        // Every change since the last tick (handlers' and this tick's) is
        // in the next group commit, at most a tick late.
        if let (Some((flag, seen)), Some(Home::Local(engine))) = (&mut self.dirty, &self.jobs) {
            let total = engine.db.conn.total_changes();
            if total != *seen {
                *seen = total;
                flag.store(true, std::sync::atomic::Ordering::Release);
            }
        }
        for fire in fires {
            cx.log_at(
                LogLevel::Debug,
                &format!(
                    "job `{}`: firing {} planned at {} ms",
                    fire.id, fire.event, fire.planned_ms
                ),
            );
            match fire.kind {
                Kind::Notification => {
                    cx.notify_json_for(&fire.event, fire.body, fire.client.as_deref());
                    self.emitted.push((fire.id, fire.token));
                }
                Kind::Request => {
                    let answer = cx.call_json_for(&fire.event, fire.body, timeout, fire.client.as_deref());
                    self.pending.push(Pending {
                        id: fire.id,
                        token: fire.token,
                        event: fire.event,
                        client: fire.client.is_some(),
                        answer: Box::pin(answer),
                    });
                }
            }
        }
        Ok(())
    }
}

mod jetstream;

#[cfg(test)]
mod tests;
