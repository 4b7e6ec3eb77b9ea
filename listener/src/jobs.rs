//! Clients' scheduled jobs, admitted here when they fire (decision 0113).
//!
//! The built-in Scheduler fires a job a client scheduled with the client's
//! identity as recorded then (meta [`META_JOB`]); the router takes that key
//! only from the process the supervisor started as the Scheduler and sends
//! the job through the broker to one listener process, here. It meets
//! what the same client's own message would meet now: its token's `exp`,
//! the `[[auth.rules]]` for its type with that identity, public or
//! exposed (`crate::public`), `listener.ws.notify` for a notification;
//! then it goes on as the client's request or notification, so that its
//! handler sees `from_client()` and the identity. A request's answer, or
//! the refusal, goes back to the Scheduler as the answer to its call.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use serde_json::Value;
use switchyard_proto::control::{META_EVENT, META_JOB};
use switchyard_proto::{Envelope, Hop, Kind, Meta, Payload, Refusal, problem};
use tokio::sync::{Semaphore, mpsc, watch};

use crate::context::{Client, Front};
use crate::state::State;
use switchyard_middleware::identity::{AuthMethod, Identity};

/// Jobs being admitted or awaiting their answer at once in this process;
/// more wait in the pool's queue (which refuses past its own bound).
const IN_FLIGHT: usize = 256;

/// Serves the jobs the pipes receive, each under the newest configuration
/// (`states`: a reload's rules hold for the next firing).
pub(crate) async fn serve(mut jobs: mpsc::Receiver<Envelope>, states: watch::Receiver<Arc<State>>) {
    let room = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(env) = jobs.recv().await {
        let Ok(permit) = room.clone().acquire_owned().await else {
            return;
        };
        let state = states.borrow().clone();
        tokio::spawn(async move {
            fire(&state, env).await;
            drop(permit);
        });
    }
}

/// Why a job may not fire as its client now.
struct Refused {
    status: u16,
    detail: String,
}

/// The client a job was scheduled by, from meta `:job`: `Ok(None)` for an
/// anonymous one.
fn identity_of(job: Option<&str>) -> Result<Option<Identity>, Refused> {
    let malformed = |why: &str| Refused {
        status: 400,
        detail: format!("a job's client is malformed: {why}"),
    };
    let job: Value = serde_json::from_str(job.unwrap_or_default()).map_err(|_| malformed("not JSON"))?;
    let who = match job.get("identity") {
        None | Some(Value::Null) => return Ok(None),
        Some(who) => who,
    };
    let subject = who
        .get("sub")
        .and_then(Value::as_str)
        .ok_or_else(|| malformed("no `sub`"))?;
    let method = match who.get("method").and_then(Value::as_str) {
        Some("jwt") => AuthMethod::Jwt,
        Some("api_key") => AuthMethod::ApiKey,
        Some("basic") => AuthMethod::Basic,
        _ => return Err(malformed("no known `method`")),
    };
    let claims = match who.get("claims") {
        Some(Value::Object(claims)) => claims.clone(),
        None => Default::default(),
        Some(_) => return Err(malformed("`claims` is not an object")),
    };
    Ok(Some(Identity {
        subject: subject.to_owned(),
        claims: Arc::new(claims),
        method,
    }))
}

/// What the listener would say to the job's client sending `name` now, as
/// far as the job's identity goes: a token past its `exp` is no longer a
/// credential (a session ends there too), and the rules apply as they
/// read now. Public/exposed and `ws.notify` are checked where the request
/// or notification is sent on, exactly as for a message.
fn authorize(state: &State, name: &str, identity: Option<&Identity>) -> Result<(), Refused> {
    if let Some(who) = identity
        && let Some(exp) = who.claims.get("exp").and_then(Value::as_u64)
    {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if exp <= now {
            return Err(Refused {
                status: 401,
                detail: "the token this job was scheduled with has expired".to_owned(),
            });
        }
    }
    let routes = state.pool.routes();
    state
        .policy()
        .authorize_event(identity, name, routes.event_paths())
        .map_err(|r| Refused {
            status: r.status(),
            detail: r.detail(),
        })
}

async fn fire(state: &State, env: Envelope) {
    let name = env.meta.get(META_EVENT).unwrap_or_default().to_owned();
    let admitted = identity_of(env.meta.get(META_JOB)).and_then(|identity| {
        authorize(state, &name, identity.as_ref())?;
        Ok(identity)
    });
    if env.kind == Kind::Notification {
        let refused = match admitted {
            Ok(_) => match env.payload.clone().into_bytes() {
                Ok(body) => crate::exchange::emit_notification(state, &name, body)
                    .err()
                    .map(|r| (r.status, r.detail.into_owned())),
                Err(_) => Some((503, "the job's body is unavailable".to_owned())),
            },
            Err(r) => Some((r.status, r.detail)),
        };
        if let Some((status, detail)) = refused {
            tracing::warn!(event = %name, status, %detail, "a client's notification job refused");
        }
        return;
    }
    let (status, content_type, body) = match admitted {
        Err(r) => (
            r.status,
            Some(problem::PROBLEM_JSON.to_owned()),
            Refusal::new(Hop::Listener, r.status, r.detail).parts().1,
        ),
        Ok(identity) => {
            let body = match env.payload.clone().into_bytes() {
                Ok(body) => body,
                Err(_) => {
                    let body = Refusal::new(Hop::Listener, 503, "the job's body is unavailable")
                        .parts()
                        .1;
                    return answer(state, &env, 503, Some(problem::PROBLEM_JSON), body);
                }
            };
            let client = Client {
                ip: None,
                context: switchyard_proto::RequestContext {
                    request_id: env.context.request_id.clone(),
                    trace: None,
                },
                timing: false,
            };
            let headers = HeaderMap::new();
            let front = Front {
                headers: &headers,
                method: None,
                path: None,
                client: &client,
                identity: identity.as_ref(),
            };
            let timeout = env
                .deadline
                .remaining()
                .unwrap_or(state.config.request_timeout)
                .max(Duration::from_millis(1));
            crate::exchange::call(state, &name, env.meta.get("content-type"), body, timeout, &front).await
        }
    };
    answer(state, &env, status, content_type.as_deref(), body);
}

/// The answer to the Scheduler's call, through any pipe: the broker sends
/// it on to the router by its origin.
fn answer(state: &State, job: &Envelope, status: u16, content_type: Option<&str>, body: Bytes) {
    let mut meta = Meta::default();
    if let Some(ct) = content_type {
        meta.push("content-type", ct);
    }
    let mut response = Envelope::response_to(job, status, meta, Bytes::new());
    response.payload = match Payload::for_body(body, state.config.shm_threshold) {
        Ok(payload) => payload,
        Err(_) => Payload::Inline(
            Refusal::new(Hop::Listener, 503, "shared-memory budget exhausted")
                .parts()
                .1,
        ),
    };
    state.pool.answer(response);
}
