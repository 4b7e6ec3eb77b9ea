//! The thread pool: `size` OS threads fed by a bounded crossbeam channel.
//!
//! A job's result and its deadline race for one slot in `live`: whichever
//! removes the job's entry first reports it, so each job gets exactly one
//! [`Done`]. A thread cannot be killed; a job past its deadline is answered
//! with 504 and its eventual result dropped (a job still queued at its
//! deadline is skipped).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::{Done, Job, Refused, Runner, timed_out};

/// Accepted jobs without a result yet, with their deadline timers.
type Live = Arc<Mutex<HashMap<u64, Option<AbortHandle>>>>;

pub struct ThreadPool {
    jobs: Sender<Job>,
    live: Live,
    results: mpsc::UnboundedSender<Done>,
}

impl ThreadPool {
    pub(crate) fn new(
        size: usize,
        queue: usize,
        runner: Runner,
        results: mpsc::UnboundedSender<Done>,
    ) -> ThreadPool {
        let (jobs, rx) = crossbeam_channel::bounded::<Job>(queue);
        let live: Live = Arc::default();
        for i in 0..size.max(1) {
            let (rx, runner, live, results) = (rx.clone(), runner.clone(), live.clone(), results.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("job-worker-{i}"))
                .spawn(move || work(rx, runner, live, results));
            if let Err(err) = spawned {
                tracing::error!(%err, "cannot start a worker thread");
            }
        }
        ThreadPool { jobs, live, results }
    }

    pub(crate) fn submit(&self, job: Job) -> Result<(), Refused> {
        let (id, timeout) = (job.id, job.timeout);
        lock(&self.live).insert(id, None);
        match self.jobs.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                lock(&self.live).remove(&id);
                return Err(Refused::Full);
            }
        }
        let (live, results) = (self.live.clone(), self.results.clone());
        let timer = tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if lock(&live).remove(&id).is_some() {
                let _ = results.send(timed_out(id, timeout));
            }
        });
        // The job may have finished already; then its timer is not needed.
        match lock(&self.live).get_mut(&id) {
            Some(slot) => *slot = Some(timer.abort_handle()),
            None => timer.abort(),
        }
        Ok(())
    }

    pub(crate) fn queued(&self) -> usize {
        self.jobs.len()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn work(jobs: Receiver<Job>, runner: Runner, live: Live, results: mpsc::UnboundedSender<Done>) {
    // Ends when the pool (the only sender) is dropped.
    while let Ok(job) = jobs.recv() {
        if !lock(&live).contains_key(&job.id) {
            continue; // its deadline passed while it waited
        }
        let output = runner(job.job_type, &job.body);
        if let Some(timer) = lock(&live).remove(&job.id) {
            if let Some(timer) = timer {
                timer.abort();
            }
            let _ = results.send(Done {
                id: job.id,
                status: output.status,
                body: output.body,
            });
        }
    }
}
