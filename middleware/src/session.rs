//! What a long-lived session (a `/ws` connection, a gRPC `Subscribe` or
//! `Session` stream) keeps of its caller, so that the policy holds for as
//! long as the session does (decision 0106):
//! - each notification is checked against the rules before it is pushed,
//!   the decision remembered per event type until the rules or the routes
//!   change, so a delivery costs a map lookup;
//! - the session ends at its token's `exp` (WebSocket close 1008, gRPC
//!   `UNAUTHENTICATED`): the client reconnects with a fresh token;
//! - a reload checks the session's credential again with the new keys,
//!   and its subscriptions with the new rules; what no longer holds ends
//!   the session the same way.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::paths::EventPaths;
use super::{Credential, Middleware};
use crate::identity::Identity;

/// Why the listener ends a WebSocket session: close code and reason.
pub type CloseReason = Option<(u16, &'static str)>;

/// The policy in force: the newest configuration's middleware. Sessions
/// opened under an older one follow it too.
#[derive(Clone)]
pub struct Policy {
    pub middleware: Arc<Middleware>,
    /// Bumped by every reload.
    pub generation: u64,
}

/// The token's `exp` passed.
pub const EXPIRED: (u16, &str) = (1008, "the token expired; open a new session with a fresh one");
/// After a reload, the credential no longer checks out (a key removed, a
/// user gone).
pub const REJECTED: (u16, &str) = (1008, "the credential is no longer accepted; authenticate again");
/// After a reload, a subscription is no longer allowed.
pub const RULES_CHANGED: (u16, &str) = (1008, "the rules changed: a subscription is no longer allowed");

/// The gRPC status a session ended by the policy gets, or `None` when
/// `reason` is not the policy's.
pub fn grpc_status(reason: (u16, &str)) -> Option<tonic::Status> {
    if reason == EXPIRED || reason == REJECTED {
        Some(tonic::Status::unauthenticated(reason.1))
    } else if reason == RULES_CHANGED {
        Some(tonic::Status::permission_denied(reason.1))
    } else {
        None
    }
}

/// Event types whose decision one session remembers; past it the memory
/// starts afresh (notification types are declared, so this is rarely met).
const MAX_DECISIONS: usize = 1024;

/// A session's caller and what it may receive.
pub struct SessionAuth {
    pub identity: Option<Identity>,
    credential: Credential,
    decisions: Mutex<Decisions>,
}

#[derive(Default)]
struct Decisions {
    /// The policy generation and route table the decisions were made
    /// under; either changing forgets them.
    under: (u64, u64),
    allowed: HashMap<String, bool>,
}

impl SessionAuth {
    pub fn new(identity: Option<Identity>, credential: Credential) -> Arc<SessionAuth> {
        Arc::new(SessionAuth {
            identity,
            credential,
            decisions: Mutex::new(Decisions::default()),
        })
    }

    /// Whether a notification of type `event` may be pushed to this
    /// session under `policy`: the rules, as for sending it.
    pub fn may_receive(&self, policy: &Policy, event: &str, routes: &EventPaths) -> bool {
        let under = (policy.generation, routes.generation());
        let mut d = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
        if d.under != under || d.allowed.len() >= MAX_DECISIONS {
            d.under = under;
            d.allowed.clear();
        }
        if let Some(&allowed) = d.allowed.get(event) {
            return allowed;
        }
        let allowed = policy
            .middleware
            .authorize_event(self.identity.as_ref(), event, routes)
            .is_ok();
        d.allowed.insert(event.to_owned(), allowed);
        allowed
    }

    /// How long until the token's `exp`, when it has one.
    fn expires_in(&self) -> Option<Duration> {
        let exp = self.identity.as_ref()?.claims.get("exp")?.as_u64()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        Some(Duration::from_secs(exp.saturating_sub(now)))
    }

    /// Whether the credential, checked again under `policy`, still proves
    /// the same caller.
    async fn still_holds(&self, policy: &Policy) -> bool {
        match policy.middleware.reauthenticate(&self.credential).await {
            Ok(Some(who)) => self
                .identity
                .as_ref()
                .is_some_and(|was| was.subject == who.subject),
            Ok(None) => self.identity.is_none(),
            Err(_) => false,
        }
    }
}

/// Where the sessions live: what a session's watch reads of the pool of
/// return pipes, which holds them and sits above this module (decision
/// 0153).
pub trait SessionHost: Send + Sync + 'static {
    /// Changes with every reload's policy.
    fn watch_policy(&self) -> watch::Receiver<Policy>;
    /// The route table in force: its event types' paths.
    fn event_paths(&self) -> Arc<EventPaths>;
    /// The patterns session `session` is subscribed to.
    fn patterns(&self, session: u64) -> Vec<String>;
}

/// Watches a session for as long as it lives (until every receiver of
/// `kill` is gone): ends it at its token's `exp`, and after each reload
/// unless its credential and the subscriptions of `session` (its number in
/// the pool, if it has subscriptions there) still hold.
pub fn watch(
    pool: Arc<impl SessionHost>,
    session: Option<u64>,
    auth: Arc<SessionAuth>,
    kill: watch::Sender<CloseReason>,
) {
    let mut policies = pool.watch_policy();
    policies.borrow_and_update();
    tokio::spawn(async move {
        let expiry = auth.expires_in();
        let expired = async {
            match expiry {
                Some(after) => tokio::time::sleep(after).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(expired);
        loop {
            tokio::select! {
                () = kill.closed() => return,
                () = &mut expired => {
                    kill.send_replace(Some(EXPIRED));
                    return;
                }
                changed = policies.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    let policy = policies.borrow_and_update().clone();
                    if !auth.still_holds(&policy).await {
                        kill.send_replace(Some(REJECTED));
                        return;
                    }
                    let routes = pool.event_paths();
                    let patterns = session.map(|s| pool.patterns(s)).unwrap_or_default();
                    let refused = patterns.iter().any(|pattern| {
                        policy
                            .middleware
                            .authorize_subscription(auth.identity.as_ref(), pattern, &routes)
                            .is_err()
                    });
                    if refused {
                        kill.send_replace(Some(RULES_CHANGED));
                        return;
                    }
                }
            }
        }
    });
}
