//! The link to JetStream a built-in keeps when the group is clustered
//! (decision 0135): one NATS connection made from `[cluster]`, a tokio
//! runtime on a thread of its own, the bucket, and whether it answers.
//!
//! Handlers are synchronous and run inside the manager host's runtime, so
//! an operation is spawned on this runtime and waited for on a channel,
//! never with `block_on`. Every wait is bounded by `op_timeout_ms`. While
//! JetStream does not answer (no quorum, no leader, no link) the link is
//! down: calls answer 503 at once, without a round trip, and a prober
//! looks every quarter second until a leader-served read succeeds again.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream::Stream};
use switchyard_manager::Error;
use tokio::sync::Notify;

use crate::BuiltinError;

/// How often a down link is probed.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// The bucket once it exists: its KV handle and its stream.
#[derive(Clone)]
pub(crate) struct Bucket {
    pub(crate) kv: kv::Store,
    pub(crate) stream: Stream,
    pub(crate) js: jetstream::Context,
    /// `$KV.<bucket>.`: what subjects in the bucket start with.
    pub(crate) prefix: String,
}

/// Why an operation on the bucket failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// JetStream did not answer, or answered that it cannot now: nothing
    /// was written. 503.
    Down(String),
    /// A write was sent and its acknowledgement never came: it may or may
    /// not have been applied. 504, so a client never takes it for "not
    /// done" and retries a non-idempotent write blindly (decision 0136).
    Unknown(String),
    /// An answer for the caller (409, 413, 422 ...).
    Answer(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Answer(e)
    }
}

/// What the bucket is created with.
#[derive(Clone, Debug)]
pub(crate) struct BucketSpec {
    pub(crate) name: String,
    pub(crate) replicas: usize,
    pub(crate) max_value_bytes: usize,
}

impl BucketSpec {
    /// The stream a KV bucket is, made directly: the client's
    /// `create_key_value` first reads the account's info, which it cannot
    /// parse from a 2.9 server.
    pub(crate) fn stream(&self, role: &str) -> jetstream::stream::Config {
        jetstream::stream::Config {
            name: format!("KV_{}", self.name),
            description: Some(format!("Switchyard {role} (docs/{role}.md)")),
            subjects: vec![format!("$KV.{}.>", self.name)],
            max_messages_per_subject: 1,
            num_replicas: self.replicas,
            // Room for the headers (a write's chain among them) beside the
            // largest value.
            max_message_size: i32::try_from(self.max_value_bytes + 4096).unwrap_or(i32::MAX),
            storage: jetstream::stream::StorageType::File,
            discard: jetstream::stream::DiscardPolicy::New,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        }
    }
}

impl Bucket {
    pub(crate) fn of(spec: &BucketSpec, kv: kv::Store, js: &jetstream::Context) -> Bucket {
        Bucket {
            prefix: format!("$KV.{}.", spec.name),
            stream: kv.stream.clone(),
            kv,
            js: js.clone(),
        }
    }
}

/// The link: shared by the handlers (through [`Link::run`]) and the tasks.
pub(crate) struct Link {
    handle: tokio::runtime::Handle,
    bucket: OnceLock<Bucket>,
    up: AtomicBool,
    /// The last reason it went down (for the 503's message).
    why: Mutex<String>,
    wake: Notify,
    /// Told each time the link comes up again: a follower re-follows then
    /// (a watch may have stalled through the outage).
    revived: Notify,
    pub(crate) timeout: Duration,
    /// Whose bucket it is (`store`, `scheduler`), for the 503s' message.
    role: &'static str,
}

impl Link {
    /// Starts the runtime and the connection (in the background: a NATS
    /// that is down at start is waited for, as the cluster bridge does),
    /// then creates or opens the bucket, and calls `ready` once with it.
    pub(crate) fn start(
        cluster: &switchyard_cluster::Config,
        spec: BucketSpec,
        timeout: Duration,
        ready: impl FnOnce(&Arc<Link>, &Bucket) + Send + 'static,
    ) -> Result<Arc<Link>, BuiltinError> {
        Link::start_as("store", cluster, spec, timeout, ready)
    }

    /// [`Link::start`] for the built-in `role`.
    pub(crate) fn start_as(
        role: &'static str,
        cluster: &switchyard_cluster::Config,
        spec: BucketSpec,
        timeout: Duration,
        ready: impl FnOnce(&Arc<Link>, &Bucket) + Send + 'static,
    ) -> Result<Arc<Link>, BuiltinError> {
        let options = switchyard_cluster::options(cluster)
            .map_err(|e| BuiltinError::Config {
                key: "cluster".into(),
                message: e.to_string(),
            })?
            .retry_on_initial_connect();
        let urls = cluster.nats.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("jetstream".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("jetstream-io")
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = tx.send(Ok(rt.handle().clone()));
                // Lives as long as the process: dropping a runtime inside
                // the host's would panic, and nothing needs it stopped.
                rt.block_on(std::future::pending::<()>());
            })
            .map_err(|e| BuiltinError::Config {
                key: "cluster".into(),
                message: format!("cannot start the JetStream thread: {e}"),
            })?;
        let handle = rx
            .recv()
            .map_err(|e| e.to_string())
            .and_then(|r| r)
            .map_err(|e| BuiltinError::Config {
                key: "cluster".into(),
                message: format!("cannot start the JetStream runtime: {e}"),
            })?;
        let link = Arc::new(Link {
            handle: handle.clone(),
            bucket: OnceLock::new(),
            up: AtomicBool::new(false),
            why: Mutex::new("connecting to JetStream".into()),
            wake: Notify::new(),
            revived: Notify::new(),
            timeout,
            role,
        });
        let keeper = link.clone();
        handle.spawn(async move {
            let client = match options.connect(urls).await {
                Ok(client) => client,
                Err(e) => {
                    keeper.set_why(format!("cannot connect to NATS: {e}"));
                    eprintln!("switchyard: {}: cannot connect to NATS: {e}", spec.name);
                    return;
                }
            };
            let mut js = jetstream::new(client);
            // Creating a listing's consumer goes through the meta leader:
            // it gets the operation's whole time; writes bound their
            // attempts themselves.
            js.set_timeout(keeper.timeout);
            let bucket = keeper.open_bucket(&js, &spec, role).await;
            let _ = keeper.bucket.set(bucket.clone());
            ready(&keeper, &bucket);
            keeper.probe_forever(bucket).await;
        });
        Ok(link)
    }

    /// One attempt's share of the operation's time: a write is retried
    /// (with the same message id) while a new leader is elected.
    pub(crate) fn attempt_timeout(&self) -> Duration {
        (self.timeout / 4).max(Duration::from_millis(250))
    }

    fn set_why(&self, why: String) {
        *self.why.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    fn why(&self) -> String {
        self.why.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Creates the bucket, or opens it when another group did; retried
    /// until it works, the reason kept for the 503s meanwhile.
    async fn open_bucket(&self, js: &jetstream::Context, spec: &BucketSpec, role: &str) -> Bucket {
        let mut logged = String::new();
        loop {
            let opened = match js.get_key_value(&spec.name).await {
                Ok(kv) => Ok(kv),
                Err(_) => match js.create_stream(spec.stream(role)).await {
                    Ok(_) => js.get_key_value(&spec.name).await.map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                },
            };
            match opened {
                Ok(kv) => return Bucket::of(spec, kv, js),
                Err(e) => {
                    let why = format!(
                        "cannot open or create the JetStream bucket `{}` (replicas = {}): {e}",
                        spec.name, spec.replicas
                    );
                    if why != logged {
                        eprintln!("switchyard: {why}");
                        logged = why.clone();
                    }
                    self.set_why(why);
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    /// While down, a write every [`PROBE_EVERY`]: up again when one is
    /// acknowledged. A write, not a read: a leader cut off from the others
    /// still answers reads for a while, and only a quorum acknowledges.
    async fn probe_forever(&self, bucket: Bucket) {
        let probe = format!("{}probe", bucket.prefix);
        loop {
            if !self.up.load(Ordering::Acquire) {
                let answered = tokio::time::timeout(self.attempt_timeout(), async {
                    bucket.js.publish(probe.clone(), bytes::Bytes::new()).await?.await
                })
                .await;
                match answered {
                    Ok(Ok(_)) => {
                        self.up.store(true, Ordering::Release);
                        self.revived.notify_waiters();
                    }
                    Ok(Err(e)) => self.set_why(format!("JetStream does not answer: {e}")),
                    Err(_) => self.set_why("JetStream does not answer (no quorum or no leader)".into()),
                }
            }
            let _ = tokio::time::timeout(PROBE_EVERY, self.wake.notified()).await;
        }
    }

    /// Resolves the next time the link comes up again after being down.
    pub(crate) async fn revived(&self) {
        self.revived.notified().await
    }

    fn down(&self, why: &str) {
        self.set_why(why.to_owned());
        self.up.store(false, Ordering::Release);
        self.wake.notify_one();
    }

    fn unavailable(&self) -> Error {
        Error::unavailable(format!(
            "the {}'s JetStream bucket is unavailable: {}",
            self.role,
            self.why()
        ))
    }

    /// Whether the bucket is open and answering, as last seen.
    pub(crate) fn answering(&self) -> bool {
        self.bucket.get().is_some() && self.up.load(Ordering::Acquire)
    }

    /// The bucket, if it is open and answering.
    pub(crate) fn bucket(&self) -> Result<Bucket, Error> {
        match self.bucket.get() {
            Some(b) if self.up.load(Ordering::Acquire) => Ok(b.clone()),
            _ => Err(self.unavailable()),
        }
    }

    /// Runs `op` on the link's runtime, bounded by the operation timeout;
    /// a failure of JetStream takes the link down (503 from then on,
    /// without waiting) until the prober sees it answer.
    pub(crate) fn run<T, F>(&self, op: impl FnOnce(Bucket) -> F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, Failure>> + Send + 'static,
    {
        let bucket = self.bucket()?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let timeout = self.timeout;
        let fut = op(bucket);
        self.handle.spawn(async move {
            let result = match tokio::time::timeout(timeout, fut).await {
                Ok(r) => r,
                Err(_) => Err(Failure::Unknown(format!(
                    "no answer within {} ms",
                    timeout.as_millis()
                ))),
            };
            let _ = tx.send(result);
        });
        let result = rx
            .recv_timeout(timeout + Duration::from_secs(1))
            .unwrap_or_else(|_| Err(Failure::Unknown("the JetStream runtime did not answer".into())));
        match result {
            Ok(v) => Ok(v),
            Err(Failure::Answer(e)) => Err(e),
            Err(Failure::Down(why)) => {
                self.down(&why);
                Err(self.unavailable())
            }
            Err(Failure::Unknown(why)) => {
                self.down(&why);
                Err(Error::new(
                    504,
                    format!(
                        "the {}'s JetStream bucket did not confirm the write ({why}): it may or may not have been applied",
                        self.role
                    ),
                ))
            }
        }
    }

    /// Spawns a background task on the link's runtime.
    pub(crate) fn spawn(&self, fut: impl Future<Output = ()> + Send + 'static) {
        self.handle.spawn(fut);
    }
}

/// Key bytes as one subject token: letters, digits, `-`, `_` and `/` as
/// they are, every other byte `=XX`. Order is not kept; listing sorts the
/// decoded keys.
pub(crate) fn encode(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'/' {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    out
}

/// The key [`encode`] made `token` from; `None` for a token no store wrote.
pub(crate) fn decode(token: &str) -> Option<String> {
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'=' {
            let hex = token.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_as_one_valid_token() {
        for key in ["a", "user:42/cart", "a.b c", "é=x", "-_/", "="] {
            let token = encode(key);
            assert!(
                token
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_/=".contains(&b)),
                "{token}"
            );
            assert_eq!(decode(&token).as_deref(), Some(key));
        }
        assert_eq!(decode("=Z1"), None);
        assert_eq!(decode("=4"), None);
    }
}
