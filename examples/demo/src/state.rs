//! The demo's routes over the built-in Store and Scheduler, served by
//! `basics`: `PUT/GET /kv/{key}`, `POST /kv/{key}/incr`, `POST /reminders`.
//! Their state lives in the `store` process, so it is the same whichever
//! instance answers and survives a restart of any process.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use switchyard_manager::scheduler::Job;
use switchyard_manager::store::JsonText;
use switchyard_manager::{Context, Error, Event, JSON, Reply, Request, Response, State};

use crate::Basics;

/// Largest `/kv/{key}` key the demo accepts (the Store's own limit is
/// larger; this is the route's).
const MAX_KEY: usize = 256;

/// `PUT /kv/{key}` with any JSON body: stores it (204).
#[derive(Deserialize, Serialize)]
pub struct KvPut {
    pub key: String,
    pub value: JsonText,
}

/// Counted in characters, as `GET /kv/{key}`'s `length` rule and the
/// description's `maxLength` count: at most 4 × 256 bytes, within the
/// Store's own limit.
fn key_of(request: &Request<'_>) -> Result<String, Error> {
    let key = request.path_param("key").unwrap_or_default();
    let chars = key.chars().count();
    if chars == 0 || chars > MAX_KEY {
        return Err(Error::unprocessable(format!(
            "the key must have 1 to {MAX_KEY} characters"
        )));
    }
    Ok(key.to_owned())
}

// Hand-written: any reply (what `#[event]` without `reply` says).
impl<R> switchyard_manager::Returns<R> for KvPut {}

impl Event for KvPut {
    const NAME: &'static str = "demo.KvPut";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("PUT", "/kv/{key}"));
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        if request.is_bincode() {
            return request.body_as();
        }
        let text = std::str::from_utf8(request.body)
            .map_err(|_| Error::bad_request("the body is not UTF-8 JSON"))?;
        let value = JsonText::parse(text).map_err(|e| Error::bad_request(e.to_string()))?;
        Ok(KvPut {
            key: key_of(request)?,
            value,
        })
    }
    // Hand-written, so described by hand: the body is the value, any
    // JSON; the key is the path's.
    fn schema(
        _: &mut switchyard_manager::schema::SchemaGenerator,
    ) -> switchyard_manager::schema::EventSchema {
        crate::whole_body_schema(
            "`PUT /kv/{key}` with any JSON body: stores it (204).",
            serde_json::json!({
                "description": "Any JSON value, stored as it came.",
                "x-switchyard-path-parameters": {
                    "key": { "type": "string", "minLength": 1, "maxLength": MAX_KEY },
                },
            }),
        )
    }
}

/// `GET /kv/{key}` → the stored JSON (200), or 404.
#[derive(Deserialize, Serialize, switchyard_manager::Event)]
#[event(name = "demo.KvGet", http = "GET /kv/{key}")]
pub struct KvGet {
    #[validate(length(min = 1, max = 256))]
    pub key: String,
}

/// `POST /kv/{key}/incr` (optional body `{"by": N}`) → `{"value": N}`.
#[derive(Deserialize, Serialize, switchyard_manager::Event)]
#[event(name = "demo.KvIncr", http = "POST /kv/{key}/incr")]
pub struct KvIncr {
    #[validate(length(min = 1, max = 256))]
    pub key: String,
    #[serde(default = "one")]
    pub by: i64,
}

fn one() -> i64 {
    1
}

#[derive(Serialize, Deserialize, Reply)]
pub struct Counted {
    pub value: i64,
}

/// `POST /reminders` `{"in_ms": 300, "text": "hi"}` → 201 `{"id": ...}`;
/// `in_ms` later every client subscribed to `demo.reminder` gets
/// `{"text": "hi"}`, once.
#[derive(Deserialize, Serialize, switchyard_manager::Event)]
#[event(name = "demo.Remind", http = "POST /reminders")]
pub struct Remind {
    #[validate(range(max = 86_400_000))]
    pub in_ms: u64,
    #[validate(length(max = 1000))]
    pub text: String,
}

#[derive(Serialize, Deserialize, Reply)]
#[reply(status = 201)]
pub struct ReminderSet {
    pub id: String,
}

/// The payload of a reminder job, and the body of `demo.reminder`.
#[derive(Clone, Debug, Serialize, Deserialize, switchyard_manager::Event)]
#[event(name = "demo.reminder")]
pub struct Reminder {
    pub text: String,
}

/// What the reminder job fires at `basics`: a scheduler firing.
#[derive(Deserialize, Serialize, switchyard_manager::Event)]
#[event(name = "demo.ReminderDue")]
pub struct ReminderDue {
    pub job: String,
    pub planned_ms: u64,
    pub payload: Reminder,
}

/// How long a delivered firing is remembered, to drop a repeated delivery.
const SEEN_FOR: Duration = Duration::from_secs(3600);

impl Basics {
    pub(crate) async fn kv_put(_: State<Self>, ev: KvPut, cx: Context) -> Result<(), Error> {
        cx.store().set(&ev.key, &ev.value).await.map(drop)
    }

    pub(crate) async fn kv_get(_: State<Self>, ev: KvGet, cx: Context) -> Result<Response, Error> {
        let entry = cx.store().entry(&ev.key).await?;
        if !entry.found {
            return Err(Error::not_found(format!("no key `{}`", ev.key)));
        }
        Ok(Response::new(200, JSON, entry.value.into_string()))
    }

    pub(crate) async fn kv_incr(_: State<Self>, ev: KvIncr, cx: Context) -> Result<Counted, Error> {
        let value = cx.store().increment(&ev.key, ev.by).await?;
        Ok(Counted { value })
    }

    pub(crate) async fn remind(_: State<Self>, ev: Remind, cx: Context) -> Result<ReminderSet, Error> {
        let job = Job::after(Duration::from_millis(ev.in_ms))
            .request::<ReminderDue>(&Reminder { text: ev.text })?;
        let scheduled = cx.scheduler().schedule(job).await?;
        Ok(ReminderSet { id: scheduled.id })
    }

    /// A reminder's firing: delivered at least once, announced once. The
    /// Store remembers the firings already announced, so a repeated
    /// delivery (after a crash of the scheduler) is dropped by whichever
    /// instance gets it.
    pub(crate) async fn reminder_due(_: State<Self>, ev: ReminderDue, cx: Context) -> Result<(), Error> {
        let seen = format!("demo.reminder:{}:{}", ev.job, ev.planned_ms);
        let first = cx.store().set_if_absent(&seen, &true, Some(SEEN_FOR)).await?;
        if first.swapped {
            cx.notify(&ev.payload)?;
        }
        Ok(())
    }
}

/// `POST /bench/store {"op": "get"|"set"|"incr"|"schedule", "n": N,
/// "concurrency": C, "keys": K}`: runs N operations on the Store (or
/// schedules N far-future jobs) from this manager through the SDK, C in
/// flight at once, over K keys; answers how long they took here. For
/// `switchyard-store-bench` (BENCHMARKS.md).
#[derive(Deserialize, Serialize, switchyard_manager::Event)]
#[event(name = "demo.StoreBench", http = "POST /bench/store")]
pub struct StoreBench {
    pub op: String,
    #[validate(range(min = 1, max = 2_000_000))]
    pub n: u64,
    #[validate(range(min = 1, max = 1024))]
    pub concurrency: u32,
    #[validate(range(min = 1))]
    pub keys: u64,
    /// Operation `i` uses key (and job) number `(from + i) % keys`.
    #[serde(default)]
    pub from: u64,
}

#[derive(Serialize, Deserialize, Reply)]
pub struct StoreBenched {
    pub ops: u64,
    pub elapsed_us: u64,
}

type Op = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>>>>;

impl Basics {
    pub(crate) async fn store_bench(
        _: State<Self>,
        ev: StoreBench,
        cx: Context,
    ) -> Result<StoreBenched, Error> {
        let make = |i: u64| -> Result<Op, Error> {
            let i = ev.from.wrapping_add(i);
            let key = format!("bench:{}", i % ev.keys);
            let store = cx.store();
            Ok(match ev.op.as_str() {
                "get" => Box::pin(async move { store.entry(&key).await.map(drop) }),
                "set" => Box::pin(async move { store.set(&key, &i).await.map(drop) }),
                "incr" => Box::pin(async move { store.increment(&key, 1).await.map(drop) }),
                "schedule" => {
                    let job = Job::after(Duration::from_secs(7 * 86_400))
                        .id(&format!("bench-{}-{i}", cx.instance()))
                        .notify::<Reminder>(&Reminder { text: key })?;
                    let scheduler = cx.scheduler();
                    Box::pin(async move { scheduler.schedule(job).await.map(drop) })
                }
                other => return Err(Error::unprocessable(format!("unknown op `{other}`"))),
            })
        };
        let started = std::time::Instant::now();
        let mut next = 0u64;
        let mut in_flight: Vec<Op> = Vec::new();
        std::future::poll_fn(|task| {
            loop {
                while in_flight.len() < ev.concurrency as usize && next < ev.n {
                    in_flight.push(make(next)?);
                    next += 1;
                }
                let before = in_flight.len();
                let mut failed = None;
                in_flight.retain_mut(|op| match op.as_mut().poll(task) {
                    std::task::Poll::Ready(Ok(())) => false,
                    std::task::Poll::Ready(Err(e)) => {
                        failed = Some(e);
                        false
                    }
                    std::task::Poll::Pending => true,
                });
                if let Some(e) = failed {
                    return std::task::Poll::Ready(Err(e));
                }
                if in_flight.is_empty() && next >= ev.n {
                    return std::task::Poll::Ready(Ok(()));
                }
                if in_flight.len() == before {
                    return std::task::Poll::Pending;
                }
            }
        })
        .await?;
        Ok(StoreBenched {
            ops: ev.n,
            elapsed_us: started.elapsed().as_micros() as u64,
        })
    }
}
