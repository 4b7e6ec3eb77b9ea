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
//! The events below are the whole protocol, defined once in
//! `switchyard-events` (re-exported here, decision 0144) for the built-in
//! manager, [`Scheduler`] (`cx.scheduler()`), `switchyard-client`, and
//! WebSocket or gRPC clients (as JSON).
//!
//! ```
//! use std::time::Duration;
//! use serde::{Deserialize, Serialize};
//! use switchyard_manager::scheduler::{Firing, Job};
//! use switchyard_manager::{Context, Error, Event, State};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Reminder { text: String }
//!
//! /// What the job fires: a request whose body is a `Firing`.
//! #[derive(Serialize, Deserialize, Event)]
//! #[event(name = "demo.Remind")]
//! struct Remind { job: String, planned_ms: u64, payload: Reminder }
//!
//! async fn later(_: State<()>, cx: Context) -> Result<String, Error> {
//!     let job = Job::after(Duration::from_millis(300))
//!         .request::<Remind>(&Reminder { text: "hi".into() })?;
//!     Ok(cx.scheduler().schedule(job).await?.id)
//! }
//! # let _ = std::marker::PhantomData::<Firing<Reminder>>;
//! ```

use std::future::Future;

pub use switchyard_events::scheduler::*;

use crate::context::Context;
use crate::event::builtin_events;
use crate::reply::Error;

builtin_events! {
    Schedule, Update, Cancel, GetJob, ListJobs => identity;
}

/// The Scheduler seen from a handler: `cx.scheduler()`. Each method is one
/// call to the `scheduler` manager (use them from `async`
/// handlers). Errors: 422 for a bad schedule (cron expression, time zone,
/// a zero interval), 409 for a different job under a taken id, 404 for an
/// unknown job in `update`, 503 while the scheduler is down.
#[derive(Clone)]
pub struct Scheduler {
    cx: Context,
}

// Here rather than in `context`: the handle sits on top of the call
// machinery, which never needs to know of it.
impl Context {
    /// The group's Scheduler (the built-in `scheduler` manager): timed
    /// events. See [`crate::scheduler`].
    pub fn scheduler(&self) -> Scheduler {
        Scheduler { cx: self.clone() }
    }
}

impl Scheduler {
    /// Schedules `job` (made with [`Job`]).
    pub fn schedule(&self, job: Schedule) -> impl Future<Output = Result<Scheduled, Error>> + use<> {
        self.cx.call_for_handle(&job)
    }

    /// Changes a job.
    pub fn update(&self, update: Update) -> impl Future<Output = Result<Scheduled, Error>> + use<> {
        self.cx.call_for_handle(&update)
    }

    /// Cancels a job; answers whether it existed.
    pub fn cancel(&self, id: &str) -> impl Future<Output = Result<bool, Error>> + use<> {
        let call = self
            .cx
            .call_for_handle::<_, Cancelled>(&Cancel { id: id.to_owned() });
        async move { Ok(call.await?.cancelled) }
    }

    /// One job, if it exists.
    pub fn get(&self, id: &str) -> impl Future<Output = Result<Option<JobInfo>, Error>> + use<> {
        let call = self.cx.call_for_handle::<_, Found>(&GetJob { id: id.to_owned() });
        async move { Ok(call.await?.job) }
    }

    /// A page of jobs.
    pub fn list(&self, list: &ListJobs) -> impl Future<Output = Result<Jobs, Error>> + use<> {
        self.cx.call_for_handle(list)
    }
}
