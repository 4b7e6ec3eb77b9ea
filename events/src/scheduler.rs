//! The Scheduler: timed events, served by the built-in `scheduler` manager
//! (crate `switchyard-builtin`), with its jobs in the Store's database.
//!
//! A job fires a named event — a request to whichever manager serves it,
//! or a notification — at a time, after a delay, every interval, or by a
//! cron expression. The event's body is a [`Firing`]: the job's id, the
//! firing's planned time and the job's payload, so a handler can tell a
//! repeated delivery apart. Delivery is **at least once**: a firing whose
//! request failed with 502/503/504, or whose scheduler died before it
//! recorded the firing, is sent again.
//!
//! The events below are the whole protocol, defined once for the built-in
//! manager, the SDK's `Scheduler` handle (`cx.scheduler()`), `switchyard-client`, and
//! WebSocket or gRPC clients (as JSON).
//!
//! A handler schedules with `cx.scheduler()` (the SDK's `scheduler`
//! module has an example), a client with `client.scheduler()`.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::store::JsonText;
use crate::{EventName, JsonError, event_names};

/// When a job fires.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum When {
    /// Once, this many milliseconds after it is scheduled (monotonic clock:
    /// a step of the wall clock does not move it).
    AfterMs(u64),
    /// Once, at this wall-clock time (milliseconds since the Unix epoch).
    AtMs(u64),
    /// Every this many milliseconds, the first one interval after it is
    /// scheduled (monotonic clock).
    EveryMs(u64),
    /// By a cron expression (five fields, or six with seconds first;
    /// `croner` syntax), in UTC unless the job names a time zone.
    Cron(String),
}

/// Whether a job fires a request or a notification.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A request to whichever manager serves the event; retried on 502,
    /// 503 and 504 (with backoff, up to the scheduler's `max_attempts`).
    #[default]
    Request,
    /// A notification to every subscriber (managers and clients); at most
    /// once per subscriber, like every notification.
    Notification,
}

/// What happens to a firing missed by more than the scheduler's
/// `misfire_grace_ms` (the scheduler was down, or the wall clock stepped
/// past it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Missed {
    /// Fire once now for everything missed, with the latest missed planned
    /// time; then keep to the schedule.
    #[default]
    Once,
    /// Drop what was missed (a one-shot job is then done without firing).
    Skip,
}

/// `scheduler.Schedule`: creates a job. With an `id` the caller chose,
/// scheduling is idempotent: the same definition again answers the
/// existing job (`created: false`); a different one is a 409 unless
/// `replace` is set.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Schedule {
    /// The job's id (absent: the scheduler makes one). At most 256 bytes.
    #[serde(default)]
    pub id: Option<String>,
    pub when: When,
    /// The event type the job fires, e.g. `demo.Remind`.
    pub event: String,
    #[serde(default)]
    pub kind: Kind,
    /// The payload the firing carries (JSON; default `null`).
    #[serde(default)]
    pub payload: JsonText,
    #[serde(default)]
    pub missed: Missed,
    /// IANA time zone of a cron job (default UTC).
    #[serde(default)]
    pub tz: Option<String>,
    /// Replace an existing job of the same id instead of refusing a
    /// different definition.
    #[serde(default)]
    pub replace: bool,
}

/// `scheduler.Update`: changes some of a job's settings; what is absent
/// stays. A changed `when` plans the next firing anew. 404 if no such job.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Update {
    pub id: String,
    #[serde(default)]
    pub when: Option<When>,
    #[serde(default)]
    pub event: Option<String>,
    #[serde(default)]
    pub kind: Option<Kind>,
    #[serde(default)]
    pub payload: Option<JsonText>,
    #[serde(default)]
    pub missed: Option<Missed>,
    #[serde(default)]
    pub tz: Option<String>,
}

/// `scheduler.Cancel`: removes a job; answers whether it existed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Cancel {
    pub id: String,
}

/// `scheduler.Get`: one job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct GetJob {
    pub id: String,
}

/// `scheduler.List`: the jobs in id order, a page at a time (pass the
/// answer's `next` as `after`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ListJobs {
    /// Only ids starting with this.
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many (default and maximum 1000).
    #[serde(default)]
    pub limit: Option<u32>,
}

/// A job as the scheduler holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct JobInfo {
    pub id: String,
    pub when: When,
    pub event: String,
    pub kind: Kind,
    pub payload: JsonText,
    pub missed: Missed,
    #[serde(default)]
    pub tz: Option<String>,
    /// Planned time of the next firing (ms since the Unix epoch).
    pub next_ms: u64,
    /// Firings delivered so far.
    pub fired: u64,
}

/// The answer to `Schedule` and `Update`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Scheduled {
    pub id: String,
    /// Planned time of the next firing (ms since the Unix epoch).
    pub next_ms: u64,
    /// False when an identical job of this id already existed.
    pub created: bool,
}

/// The answer to `Cancel`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Cancelled {
    pub cancelled: bool,
}

/// The answer to `Get`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Found {
    #[serde(default)]
    pub job: Option<JobInfo>,
}

/// The answer to `List`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Jobs {
    pub jobs: Vec<JobInfo>,
    #[serde(default)]
    pub next: Option<String>,
}

/// The body of every firing (JSON): declare the fired event with these
/// three fields (`job`, `planned_ms`, `payload`), or as `Firing<P>` itself
/// in a wrapper. `(job, planned_ms)` is unique per firing: a handler that
/// must act once keeps the last one it saw.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Firing<P> {
    /// The job's id.
    pub job: String,
    /// When this firing was planned (ms since the Unix epoch).
    pub planned_ms: u64,
    pub payload: P,
}

/// A job to schedule: [`Job::after`], [`Job::at`], [`Job::every`] or
/// [`Job::cron`], then [`request`](JobBuilder::request) or
/// [`notify`](JobBuilder::notify) with the payload.
pub struct Job;

/// A job being built (see [`Job`]).
#[derive(Clone, Debug)]
pub struct JobBuilder {
    when: When,
    id: Option<String>,
    missed: Missed,
    tz: Option<String>,
    replace: bool,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Job {
    /// Once, `delay` from now.
    pub fn after(delay: Duration) -> JobBuilder {
        JobBuilder::new(When::AfterMs(millis(delay)))
    }

    /// Once, at `time`.
    pub fn at(time: std::time::SystemTime) -> JobBuilder {
        let ms = time
            .duration_since(std::time::UNIX_EPOCH)
            .map(millis)
            .unwrap_or(0);
        JobBuilder::new(When::AtMs(ms))
    }

    /// Every `interval`, starting one interval from now.
    pub fn every(interval: Duration) -> JobBuilder {
        JobBuilder::new(When::EveryMs(millis(interval)))
    }

    /// By a cron expression (checked by the scheduler: 422 if it is bad).
    pub fn cron(expression: &str) -> JobBuilder {
        JobBuilder::new(When::Cron(expression.to_owned()))
    }
}

impl JobBuilder {
    fn new(when: When) -> JobBuilder {
        JobBuilder {
            when,
            id: None,
            missed: Missed::default(),
            tz: None,
            replace: false,
        }
    }

    /// Chooses the job's id: scheduling the same job again is then a no-op.
    pub fn id(mut self, id: &str) -> Self {
        self.id = Some(id.to_owned());
        self
    }

    /// What to do with firings missed while the scheduler was down.
    pub fn missed(mut self, missed: Missed) -> Self {
        self.missed = missed;
        self
    }

    /// The time zone of a cron job (IANA name, e.g. `Europe/Paris`).
    pub fn tz(mut self, tz: &str) -> Self {
        self.tz = Some(tz.to_owned());
        self
    }

    /// Replaces a job of the same id with this one.
    pub fn replace(mut self) -> Self {
        self.replace = true;
        self
    }

    /// The job fires a request of event type `E` whose body is a
    /// [`Firing`] carrying `payload`.
    pub fn request<E: EventName>(self, payload: &impl Serialize) -> Result<Schedule, JsonError> {
        self.build(E::EVENT_NAME, Kind::Request, payload)
    }

    /// The job fires a notification of event type `E` whose body is a
    /// [`Firing`] carrying `payload`.
    pub fn notify<E: EventName>(self, payload: &impl Serialize) -> Result<Schedule, JsonError> {
        self.build(E::EVENT_NAME, Kind::Notification, payload)
    }

    /// The job fires `event` (a type name) as `kind`.
    pub fn build(self, event: &str, kind: Kind, payload: &impl Serialize) -> Result<Schedule, JsonError> {
        Ok(Schedule {
            id: self.id,
            when: self.when,
            event: event.to_owned(),
            kind,
            payload: JsonText::encode(payload)?,
            missed: self.missed,
            tz: self.tz,
            replace: self.replace,
        })
    }
}

event_names! {
    Schedule => "scheduler.Schedule",
    Update => "scheduler.Update",
    Cancel => "scheduler.Cancel",
    GetJob => "scheduler.Get",
    ListJobs => "scheduler.List",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_read_as_json_and_bincode() {
        let json = serde_json::json!({
            "id": "r1", "when": {"after_ms": 300}, "event": "demo.Remind",
            "payload": {"text": "hi"}
        });
        let s: Schedule = serde_json::from_value(json).unwrap();
        assert_eq!(s.when, When::AfterMs(300));
        assert_eq!(s.kind, Kind::Request);
        assert_eq!(s.missed, Missed::Once);
        let bytes = switchyard_proto::codec::encode(&s).unwrap();
        let back: Schedule = switchyard_proto::codec::decode(&bytes).unwrap();
        assert_eq!(back, s);
        let cron: When = serde_json::from_value(serde_json::json!({"cron": "*/5 * * * *"})).unwrap();
        assert_eq!(cron, When::Cron("*/5 * * * *".into()));
    }
}
