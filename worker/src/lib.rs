//! Worker pools: where a manager sends work too heavy or too blocking for
//! its own event loop.
//!
//! A *job* is an event type and bincode bytes; running it is a plain
//! function of those bytes (a [`Runner`]), so it can run on any thread or in
//! any process that loaded the same plugin. Two kinds of pool, one interface
//! ([`Pool`]):
//!
//! - **thread**: `size` OS threads in the manager process, fed by a bounded
//!   crossbeam channel. For blocking I/O, or CPU work when crash isolation
//!   does not matter.
//! - **process**: worker processes (children of the supervisor, like every
//!   other process of the group) that connect to the manager over a Unix
//!   socket and run one job at a time. A job that aborts takes down only its
//!   worker; the supervisor replaces it.
//!
//! Both are bounded: a job that finds the queue full is refused at once
//! (the caller answers 503 with `Retry-After`), and every job has a deadline
//! after which its caller gets 504 (a process worker still running it is
//! killed and replaced). A job its submitter gives up ([`Pool::cancel`])
//! leaves the queue, or has its process worker killed the same way. Each
//! job gets exactly one [`Done`].
//!
//! The worker side of the process pool is [`process::serve`].

#![forbid(unsafe_code)]

pub mod process;
mod thread;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::{EventType, RequestContext};
use tokio::sync::mpsc;

/// Runs one job: its type and bincode input in, a [`JobOutput`] out. Must
/// not unwind (plugins catch panics at their boundary).
pub type Runner = Arc<dyn Fn(EventType, &[u8]) -> JobOutput + Send + Sync>;

/// What running a job produced: status 200 and the bincode result, or an
/// error status and a UTF-8 message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobOutput {
    pub status: u16,
    pub body: Bytes,
}

impl JobOutput {
    /// An error result with a message.
    pub fn error(status: u16, message: impl Into<String>) -> JobOutput {
        JobOutput {
            status,
            body: Bytes::from(message.into().into_bytes()),
        }
    }
}

/// A job submitted to a pool.
#[derive(Clone, Debug)]
pub struct Job {
    /// The submitter's id for the job; its [`Done`] carries it back.
    pub id: u64,
    pub job_type: EventType,
    pub body: Bytes,
    /// From submission to result, queueing included.
    pub timeout: Duration,
    /// The request the job serves, for log lines: its id and trace
    /// context, empty when it serves none. A process pool sends it with
    /// the job, so the worker's lines name the trace too.
    pub tags: RequestContext,
}

impl Job {
    /// The span a job runs in, wherever it runs: every line written while
    /// it runs names the request's id and trace id (decision 0058).
    pub fn span(&self) -> tracing::Span {
        job_span(self.id, self.job_type, &self.tags)
    }
}

/// The span of job `id` tagged with `tags` (see [`Job::tags`]).
pub fn job_span(id: u64, job_type: EventType, tags: &RequestContext) -> tracing::Span {
    tracing::info_span!(
        "job",
        job = id,
        job_type = ?job_type,
        request_id = tags.request_id_field(),
        trace_id = tags.trace_id_field(),
    )
}

/// Writes the line a job's result deserves: a failure (5xx) at warn with
/// its message, any other result at debug. Call inside the job's span.
pub fn log_result(output: &JobOutput) {
    if output.status >= 500 {
        tracing::warn!(
            status = output.status,
            "job failed: {}",
            String::from_utf8_lossy(&output.body[..output.body.len().min(512)])
        );
    } else {
        tracing::debug!(status = output.status, "job done");
    }
}

/// A job's result, exactly one per accepted job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Done {
    pub id: u64,
    pub status: u16,
    /// The bincode result (status 200) or a UTF-8 message.
    pub body: Bytes,
}

/// Status and message of a job refused because the queue is full.
pub const QUEUE_FULL: (u16, &str) = (503, "the worker pool's queue is full; try again later");
/// Status of a job that outlived its deadline.
pub const TIMED_OUT: u16 = 504;
/// Status and message of a job whose worker process died under it.
pub const WORKER_DIED: (u16, &str) = (502, "worker process died while running the job");
/// Status and message of a job its submitter gave up ([`Pool::cancel`]);
/// 499, nginx's "client closed request", as nobody reads it.
pub const CANCELLED: (u16, &str) = (499, "the job was cancelled: nobody awaits its result");

/// Which kind of pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Thread,
    Process,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Thread => "thread",
            Kind::Process => "process",
        }
    }
}

/// Why a job was not accepted.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("the worker pool's queue is full")]
    Full,
}

/// A pool of either kind.
pub enum Pool {
    Thread(thread::ThreadPool),
    Process(process::ProcessPool),
}

impl Pool {
    /// A pool of `size` threads with room for `queue` waiting jobs. Results
    /// arrive on the returned receiver. Call inside a tokio runtime.
    pub fn threads(size: usize, queue: usize, runner: Runner) -> (Pool, mpsc::UnboundedReceiver<Done>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Pool::Thread(thread::ThreadPool::new(size, queue, runner, tx)), rx)
    }

    /// A process pool whose workers connect to `listener` (see
    /// [`process::bind`]); room for `queue` waiting jobs. Call inside a
    /// tokio runtime.
    pub fn processes(
        listener: std::os::unix::net::UnixListener,
        queue: usize,
        max_frame: usize,
    ) -> std::io::Result<(Pool, mpsc::UnboundedReceiver<Done>)> {
        let (tx, rx) = mpsc::unbounded_channel();
        Ok((
            Pool::Process(process::ProcessPool::new(listener, queue, max_frame, tx)?),
            rx,
        ))
    }

    /// Submits a job; its [`Done`] comes later on the results channel.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        match self {
            Pool::Thread(p) => p.submit(job),
            Pool::Process(p) => p.submit(job),
        }
    }

    /// Gives up job `id` (its submitter no longer awaits it): a queued job
    /// leaves the queue at once; a running process job is stopped as one
    /// past its deadline is (its worker is killed and replaced); a thread
    /// cannot be stopped, so a running thread job runs on and its result
    /// is dropped. The job's [`Done`] is [`CANCELLED`], unless it had one
    /// already. Unknown ids are ignored.
    pub fn cancel(&self, id: u64) {
        match self {
            Pool::Thread(p) => p.cancel(id),
            Pool::Process(p) => p.cancel(id),
        }
    }

    /// Jobs waiting for a worker.
    pub fn queued(&self) -> usize {
        match self {
            Pool::Thread(p) => p.queued(),
            Pool::Process(p) => p.queued(),
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Pool::Thread(_) => Kind::Thread,
            Pool::Process(_) => Kind::Process,
        }
    }
}

fn cancelled(id: u64) -> Done {
    let (status, message) = CANCELLED;
    Done {
        id,
        status,
        body: Bytes::from_static(message.as_bytes()),
    }
}

fn timed_out(id: u64, timeout: Duration) -> Done {
    Done {
        id,
        status: TIMED_OUT,
        body: Bytes::from(format!(
            "the job did not finish within its deadline ({} ms)",
            timeout.as_millis()
        )),
    }
}

#[cfg(test)]
mod tests;
