//! The thread pool: `size` OS threads fed with job ids through a crossbeam
//! channel; the jobs themselves wait in `slots`.
//!
//! A job's result and its deadline race for its entry in `slots`: whichever
//! removes it first reports it, so each job gets exactly one [`Done`]. A
//! thread cannot be killed; a job past its deadline is answered with 504 and
//! its eventual result dropped; so is a job cancelled while it runs. A job
//! still queued at its deadline (or cancelled) leaves
//! at once — its queue place and its body are freed then, not when a thread
//! gets to its id — so a queue full of expired jobs never refuses new ones.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::{Done, Job, Refused, Runner, timed_out};

enum Slot {
    /// Waiting for a thread (the timer is set right after submission).
    Queued { job: Job, timer: Option<AbortHandle> },
    /// On a thread, in `span` (its request's id and trace), which the
    /// deadline's line is written in too.
    Running {
        timer: Option<AbortHandle>,
        span: tracing::Span,
    },
}

#[derive(Default)]
struct Slots {
    /// Accepted jobs without a result yet.
    jobs: HashMap<u64, Slot>,
    /// How many of them are queued (what `queue` bounds).
    queued: usize,
}

type Shared = Arc<Mutex<Slots>>;

pub struct ThreadPool {
    ids: Sender<u64>,
    slots: Shared,
    queue: usize,
    results: mpsc::UnboundedSender<Done>,
}

impl ThreadPool {
    pub(crate) fn new(
        size: usize,
        queue: usize,
        runner: Runner,
        results: mpsc::UnboundedSender<Done>,
    ) -> ThreadPool {
        // Unbounded, but it only ever holds ids: `queue` bounds the jobs.
        let (ids, rx) = crossbeam_channel::unbounded::<u64>();
        let slots: Shared = Arc::default();
        for i in 0..size.max(1) {
            let (rx, runner, slots, results) = (rx.clone(), runner.clone(), slots.clone(), results.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("job-worker-{i}"))
                .spawn(move || work(rx, runner, slots, results));
            if let Err(err) = spawned {
                tracing::error!(%err, "cannot start a worker thread");
            }
        }
        ThreadPool {
            ids,
            slots,
            queue,
            results,
        }
    }

    pub(crate) fn submit(&self, job: Job) -> Result<(), Refused> {
        let (id, timeout) = (job.id, job.timeout);
        {
            let mut slots = lock(&self.slots);
            if slots.queued >= self.queue {
                return Err(Refused::Full);
            }
            slots.queued += 1;
            slots.jobs.insert(id, Slot::Queued { job, timer: None });
        }
        if self.ids.send(id).is_err() {
            let mut slots = lock(&self.slots);
            slots.jobs.remove(&id);
            slots.queued -= 1;
            return Err(Refused::Full);
        }
        let (slots, results) = (self.slots.clone(), self.results.clone());
        let timer = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            let mut slots = lock(&slots);
            let (span, what) = match slots.jobs.remove(&id) {
                Some(Slot::Queued { job, .. }) => {
                    slots.queued -= 1;
                    (job.span(), "job past its deadline while queued")
                }
                Some(Slot::Running { span, .. }) => (
                    span,
                    "job past its deadline; its thread runs on and its result will be dropped",
                ),
                None => return,
            };
            drop(slots);
            span.in_scope(|| tracing::warn!("{what}"));
            let _ = results.send(timed_out(id, timeout));
        });
        // The job may have finished already; then its timer is not needed.
        match lock(&self.slots).jobs.get_mut(&id) {
            Some(Slot::Queued { timer: slot, .. } | Slot::Running { timer: slot, .. }) => {
                *slot = Some(timer.abort_handle())
            }
            None => timer.abort(),
        }
        Ok(())
    }

    /// A queued job leaves at once; a running one runs on (a thread
    /// cannot be stopped) and its result is dropped.
    pub(crate) fn cancel(&self, id: u64) {
        let mut slots = lock(&self.slots);
        let (timer, span) = match slots.jobs.remove(&id) {
            Some(Slot::Queued { job, timer }) => {
                slots.queued -= 1;
                (timer, job.span())
            }
            Some(Slot::Running { timer, span }) => (timer, span),
            None => return,
        };
        drop(slots);
        if let Some(timer) = timer {
            timer.abort();
        }
        span.in_scope(|| tracing::debug!("job cancelled"));
        let _ = self.results.send(crate::cancelled(id));
    }

    pub(crate) fn queued(&self) -> usize {
        lock(&self.slots).queued
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn work(ids: Receiver<u64>, runner: Runner, slots: Shared, results: mpsc::UnboundedSender<Done>) {
    // Ends when the pool (the only sender) is dropped.
    while let Ok(id) = ids.recv() {
        let (job, span) = {
            let mut slots = lock(&slots);
            let Some(slot) = slots.jobs.get_mut(&id) else {
                continue; // its deadline passed while it waited
            };
            let Slot::Queued { job, timer } = slot else {
                continue;
            };
            let span = job.span();
            let running = Slot::Running {
                timer: timer.take(),
                span: span.clone(),
            };
            let Slot::Queued { job, .. } = std::mem::replace(slot, running) else {
                unreachable!("checked above")
            };
            slots.queued -= 1;
            (job, span)
        };
        let _running = span.enter();
        let output = runner(job.job_type, &job.body);
        crate::log_result(&output);
        let slot = lock(&slots).jobs.remove(&id);
        if let Some(Slot::Running { timer, .. }) = slot {
            if let Some(timer) = timer {
                timer.abort();
            }
            let _ = results.send(Done {
                id,
                status: output.status,
                body: output.body,
            });
        }
    }
}
