//! Control messages between the processes of a group, carried in
//! [`Kind::Control`](crate::Kind::Control) frames on the same connections as events.
//!
//! ```text
//! listener pipe ──HelloPipe──▶ broker ──Welcome──▶ pipe
//! router ───────HelloRouter──▶ broker
//! manager ─────HelloManager──▶ router ──Welcome──▶ manager
//! router ──RouteTable──▶ broker ──RouteTable──▶ every listener's first pipe
//! broker ──RouterLost──▶ every pipe (fail in-flight requests at once)
//! listener pipe ──Subscribe/Unsubscribe/SessionClosed──▶ broker (WebSocket sessions)
//! broker ──Notification frame, meta `to`──▶ the pipe holding the sessions
//! manager ──Draining──▶ router ──Draining──▶ manager (no request follows it)
//! listener pipe ──Cancel──▶ broker ──Cancel──▶ router ──Cancel──▶ manager
//! manager ──Cancel (its own call)──▶ router ──Cancel──▶ the callee
//! manager ──return-link offer──▶ router ──▶ broker ──▶ the listener pipe (crate::returns)
//! manager ──Completed──▶ router (requests it answered straight back)
//! listener ──ReturnPipes──▶ manager, on the return link (which pipes it answers for)
//! ```

use serde::{Deserialize, Serialize};

use bytes::Bytes;

use crate::event::{Deadline, Kind, Meta, Origin, Payload};
use crate::{Envelope, EventType};

/// A control message.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Control {
    /// A listener opens return pipe number `index` of its pool.
    HelloPipe { pid: u32, index: u32 },
    /// The router connects to the broker.
    HelloRouter { pid: u32 },
    /// A manager instance connects to the router and declares what it serves.
    HelloManager(ManagerDescription),
    /// Accepted; `id` is the return address the peer was given.
    Welcome { id: u64 },
    /// The current route table (router → broker → listeners).
    RouteTable(RouteTable),
    /// The broker lost the router: every request in flight through it is lost.
    RouterLost,
    /// A WebSocket session (numbered by its listener process, on the pipe
    /// this arrives on) wants notifications whose type matches `pattern`
    /// (an exact type, `prefix.*`, or `*`) and, when `filter_json` is not
    /// empty, whose JSON body passes the [`Filter`]. `sub` names the
    /// subscription within the session; pushes list it.
    Subscribe {
        session: u64,
        sub: u64,
        pattern: String,
        filter_json: String,
    },
    /// Ends one subscription of a session.
    Unsubscribe { session: u64, sub: u64 },
    /// The session is gone: drop all its subscriptions.
    SessionClosed { session: u64 },
    /// Manager → router: this instance is being replaced (`switchyard
    /// reload`); route no new request or notification to it. The router
    /// answers with the same message once it has taken the instance out:
    /// every request routed to it before comes ahead of that answer on the
    /// connection, so the manager can tell when what it must finish is all
    /// there.
    Draining,
    /// The request this frame names is no longer wanted (its client went
    /// away, gave up, or its deadline passed): the envelope's `correlation`
    /// and `origin` are the request's, as for its response. The hop that
    /// stamps origins stamps this one too (the broker for pipes, the router
    /// for managers), so a process can cancel only its own requests. The
    /// router forgets the request and tells the instance serving it, which
    /// drops its handler and stops its jobs; an answer that still comes is
    /// dropped (docs/decisions/0092-cancellation-as-a-control-frame.md).
    Cancel,
    /// Manager → router: requests of listener pipes this instance
    /// answered straight into the listener's return link, as (pipe,
    /// correlation). The router closes their in-flight entries as it would
    /// on their responses, without passing anything on; one it did not
    /// send to this instance is ignored (decision 0143).
    Completed { requests: Vec<(u64, u64)> },
    /// Listener → manager instance, on a return link: the broker's ids of
    /// every pipe of this listener process now. The instance answers the
    /// requests of all of them on this one link (one link per listener
    /// process and instance; decision 0143); sent when the link opens and
    /// whenever a pipe reconnects under a new id.
    ReturnPipes { pipes: Vec<u64> },
}

/// Control frames are envelopes of their own kind; built and read here,
/// so the envelope's module does not name this one.
impl Envelope {
    /// A control frame carrying `message`.
    pub fn control(message: &Control) -> crate::Result<Envelope> {
        Ok(Envelope {
            event_type: EventType::CONTROL,
            kind: Kind::Control,
            correlation: 0,
            origin: Origin::Unset,
            deadline: Deadline::NONE,
            status: 0,
            token: 0,
            context: Default::default(),
            meta: Meta::default(),
            payload: Payload::Inline(Bytes::from(crate::codec::encode(message)?)),
        })
    }

    /// Decodes the control message of a [`Kind::Control`] frame.
    pub fn decode_control(&self) -> crate::Result<Control> {
        match &self.payload {
            Payload::Inline(bytes) => crate::codec::decode(bytes),
            _ => Err(crate::Error::Malformed("control frame with shm payload")),
        }
    }
}

impl Control {
    /// The frame that cancels request `correlation` of `origin`.
    pub fn cancel(origin: crate::Origin, correlation: u64) -> crate::Result<crate::Envelope> {
        let mut env = crate::Envelope::control(&Control::Cancel)?;
        env.origin = origin;
        env.correlation = correlation;
        Ok(env)
    }
}

/// The meta key that names an event's type (`order.created`): set by the
/// SDK when a manager notifies (prefix subscriptions need it), and by the
/// listener on requests whose type a WebSocket or gRPC client named (so
/// the router can say which type no manager declares).
pub const META_EVENT: &str = "event";

/// The meta key of a push frame (broker → listener pipe): the recipients,
/// `session:sub` pairs separated by `,`.
pub const META_TO: &str = "to";

/// The meta key of a client's scheduled job as the built-in Scheduler
/// fires it: `{"identity": null | {"sub", "method", "claims"}}`, the
/// client it was scheduled by. The router keeps it only from the process
/// the roster marks [`Member::fires_jobs`] (from anyone else it is request
/// context and stripped) and sends such a request or notification to a
/// listener, which admits it as that client and sends it on as the
/// client's own (decision 0113).
pub const META_JOB: &str = ":job";

/// The meta key the router sets on every request a manager sends: the
/// sending manager's configured name, after stripping whatever `:` keys
/// the manager set itself, so that the callee can trust it (the built-in
/// Store keeps each manager's keys apart by it; decision 0114).
pub const META_MANAGER: &str = ":manager";

/// Whether a subscription pattern is well formed: an event type name, a
/// prefix ending in `.*`, or `*` alone. Returns the prefix for wildcards.
pub fn pattern_prefix(pattern: &str) -> Result<Option<&str>, String> {
    if pattern.is_empty() || pattern.len() > 256 {
        return Err("a pattern is 1 to 256 characters".into());
    }
    if pattern == "*" {
        return Ok(Some(""));
    }
    match pattern.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('.') && !prefix.contains('*') => Ok(Some(prefix)),
        Some(_) => Err("`*` may only end a pattern, right after a `.` (`order.*`), or stand alone".into()),
        None if pattern.contains('*') => Err("`*` may only end a pattern".into()),
        None => Ok(None),
    }
}

/// A field filter on a notification's JSON body: every condition must hold.
///
/// Written as a JSON object; each key names a top-level field of the body;
/// its value is either the value the field must equal, or an object of
/// operators: `eq`, `ne`, `in` (an array), `gt`, `gte`, `lt`, `lte`
/// (numbers compare as numbers, strings lexicographically).
/// `{"customer_id": 42}`, `{"qty": {"gt": 2, "lte": 10}}`,
/// `{"status": {"in": ["paid", "sent"]}}`.
#[derive(Clone, Debug, PartialEq)]
pub struct Filter {
    conditions: Vec<(String, Op, serde_json::Value)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    In,
    Gt,
    Gte,
    Lt,
    Lte,
}

impl Filter {
    /// Parses a filter object; the error says what is wrong.
    pub fn parse(value: &serde_json::Value) -> Result<Filter, String> {
        let serde_json::Value::Object(fields) = value else {
            return Err("a filter is a JSON object of field conditions".into());
        };
        if fields.len() > 32 {
            return Err("a filter has at most 32 fields".into());
        }
        let mut conditions = Vec::new();
        for (field, cond) in fields {
            match cond {
                serde_json::Value::Object(ops) if !ops.is_empty() => {
                    for (op, operand) in ops {
                        let op = match op.as_str() {
                            "eq" => Op::Eq,
                            "ne" => Op::Ne,
                            "in" => Op::In,
                            "gt" => Op::Gt,
                            "gte" => Op::Gte,
                            "lt" => Op::Lt,
                            "lte" => Op::Lte,
                            other => {
                                return Err(format!(
                                    "unknown operator `{other}` on field `{field}` \
                                     (eq, ne, in, gt, gte, lt, lte)"
                                ));
                            }
                        };
                        match (op, operand) {
                            (Op::In, serde_json::Value::Array(_)) => {}
                            (Op::In, _) => return Err(format!("`in` on field `{field}` takes an array")),
                            (Op::Gt | Op::Gte | Op::Lt | Op::Lte, v) if !(v.is_number() || v.is_string()) => {
                                return Err(format!(
                                    "`{field}`: ordering operators take a number or a string"
                                ));
                            }
                            _ => {}
                        }
                        conditions.push((field.clone(), op, operand.clone()));
                    }
                }
                other => conditions.push((field.clone(), Op::Eq, other.clone())),
            }
        }
        Ok(Filter { conditions })
    }

    /// Parses the JSON text of a filter.
    pub fn parse_str(text: &str) -> Result<Filter, String> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| format!("filter is not JSON: {e}"))?;
        Filter::parse(&value)
    }

    /// Whether `body` (a JSON object) passes every condition. A missing field
    /// fails every condition but `ne`.
    pub fn matches(&self, body: &serde_json::Value) -> bool {
        self.conditions.iter().all(|(field, op, operand)| {
            let Some(value) = body.get(field) else {
                return *op == Op::Ne;
            };
            match op {
                Op::Eq => json_eq(value, operand),
                Op::Ne => !json_eq(value, operand),
                Op::In => operand
                    .as_array()
                    .is_some_and(|items| items.iter().any(|item| json_eq(value, item))),
                Op::Gt => compare(value, operand).is_some_and(|o| o.is_gt()),
                Op::Gte => compare(value, operand).is_some_and(|o| o.is_ge()),
                Op::Lt => compare(value, operand).is_some_and(|o| o.is_lt()),
                Op::Lte => compare(value, operand).is_some_and(|o| o.is_le()),
            }
        })
    }
}

/// Equality where `42` equals `42.0`.
fn json_eq(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_number() && b.is_number() => x == y,
        _ => a == b,
    }
}

fn compare(a: &serde_json::Value, b: &serde_json::Value) -> Option<std::cmp::Ordering> {
    match (a, b) {
        (serde_json::Value::Number(x), serde_json::Value::Number(y)) => x.as_f64()?.partial_cmp(&y.as_f64()?),
        (serde_json::Value::String(x), serde_json::Value::String(y)) => Some(x.cmp(y)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn patterns() {
        assert_eq!(pattern_prefix("order.created"), Ok(None));
        assert_eq!(pattern_prefix("order.*"), Ok(Some("order.")));
        assert_eq!(pattern_prefix("*"), Ok(Some("")));
        for bad in ["", "order*", "or*der.x", "*.created", "order.**"] {
            assert!(pattern_prefix(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn filters() {
        let body = json!({"customer_id": 42, "qty": 3, "sku": "apple"});
        let yes = [
            json!({}),
            json!({"customer_id": 42}),
            json!({"customer_id": 42.0}),
            json!({"qty": {"gt": 2}}),
            json!({"qty": {"gte": 3, "lt": 4}}),
            json!({"qty": {"lte": 3}}),
            json!({"sku": {"in": ["pear", "apple"]}}),
            json!({"sku": {"ne": "pear"}}),
            json!({"missing": {"ne": 1}}),
            json!({"sku": {"gt": "aaa"}}),
        ];
        for f in yes {
            assert!(Filter::parse(&f).unwrap().matches(&body), "{f}");
        }
        let no = [
            json!({"customer_id": 7}),
            json!({"qty": {"gt": 3}}),
            json!({"qty": {"lt": 3}}),
            json!({"sku": {"in": ["pear"]}}),
            json!({"missing": 1}),
            json!({"qty": {"gt": "a"}}),
            json!({"customer_id": 42, "qty": {"gt": 5}}),
        ];
        for f in no {
            assert!(!Filter::parse(&f).unwrap().matches(&body), "{f}");
        }
        for bad in [
            json!(1),
            json!({"a": {"like": 1}}),
            json!({"a": {"in": 1}}),
            json!({"a": {"gt": []}}),
        ] {
            assert!(Filter::parse(&bad).is_err(), "{bad}");
        }
        assert!(Filter::parse_str("{nope").is_err());
    }
}

/// What a manager instance serves, sent once when it connects.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerDescription {
    /// The manager's configured name (its instances share it).
    pub name: String,
    pub pid: u32,
    /// Request types it answers.
    pub handles: Vec<HandledType>,
    /// Notification types it wants.
    pub subscribes: Vec<EventType>,
    /// The notification types it subscribes to or declares it emits, by
    /// name, with whether clients may send them (decision 0108).
    pub notifications: Vec<DeclaredType>,
}

/// A type a manager declares, by name, and whether a client (WebSocket,
/// gRPC) may send it: only a type its manager marks public
/// (`#[event(public)]`, or an HTTP route) is reachable from outside; any
/// other answers only the group's managers (decision 0108).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeclaredType {
    pub name: String,
    pub event_type: EventType,
    pub public: bool,
}

/// One request type a manager answers, with its HTTP route if it has one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandledType {
    pub name: String,
    pub event_type: EventType,
    pub route: Option<HttpRoute>,
    /// What its handler (and the manager's middleware) reads of the
    /// request besides the body; the listener copies exactly this.
    pub needs: RequestNeeds,
    /// Clients may send it (`#[event(public)]` or an HTTP route); else
    /// only other managers may (decision 0108).
    pub public: bool,
}

/// What a request type needs to know about its request besides its body,
/// path parameters and query: the listener copies exactly this into the
/// event's meta ([`crate::event::META_METHOD`] and the other `:` keys),
/// so a type that declares nothing travels as small as before
/// (docs/http.md, decision 0041).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RequestNeeds {
    /// The request method (`GET`, `HEAD`, ...).
    pub method: bool,
    /// The request path, as received (not decoded).
    pub path: bool,
    /// The client's address (through trusted proxies).
    pub client: bool,
    /// The whole authenticated identity: subject, method and claims.
    pub identity: bool,
    /// Request headers, by lowercase name; several lines are joined with `, `.
    pub headers: Vec<String>,
    /// Cookies, by name.
    pub cookies: Vec<String>,
    /// Claims of the authenticated identity ("scope"), by name.
    pub scope: Vec<String>,
}

impl RequestNeeds {
    /// Whether nothing is declared.
    pub fn is_empty(&self) -> bool {
        !(self.method || self.path || self.client || self.identity)
            && self.headers.is_empty()
            && self.cookies.is_empty()
            && self.scope.is_empty()
    }

    /// Adds what `other` declares.
    pub fn merge(&mut self, other: &RequestNeeds) {
        self.method |= other.method;
        self.path |= other.path;
        self.client |= other.client;
        self.identity |= other.identity;
        for (mine, theirs) in [
            (&mut self.headers, &other.headers),
            (&mut self.cookies, &other.cookies),
            (&mut self.scope, &other.scope),
        ] {
            for name in theirs {
                if !mine.contains(name) {
                    mine.push(name.clone());
                }
            }
        }
    }
}

/// A request type's [`RequestNeeds`], in the route table: for requests
/// that name their type (WebSocket, gRPC) as well as HTTP routes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeNeeds {
    pub event_type: EventType,
    pub needs: RequestNeeds,
}

/// `GET /hello/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HttpRoute {
    pub method: String,
    pub path: String,
    /// The handler reads the body as a stream (an upload): the listener
    /// pipes it through shared memory instead of buffering it.
    pub stream_body: bool,
}

/// The routes the listener serves and the health of the managers behind them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteTable {
    /// Increases with every change the router makes.
    pub version: u64,
    pub routes: Vec<RouteEntry>,
    pub managers: Vec<ManagerHealth>,
    /// The request types that declare [`RequestNeeds`] (the others need
    /// nothing).
    pub needs: Vec<TypeNeeds>,
    /// Managers a reload removed from the group, and now gone: listeners
    /// forget their routes (404), which they otherwise keep while a
    /// manager is down (503).
    #[serde(default)]
    pub retired: Vec<String>,
    /// The link to the other groups (`[cluster]`), when the group has one:
    /// `/ready` shows it.
    #[serde(default)]
    pub cluster: Option<ClusterLink>,
    /// Every request type the group's managers declare, by name, with
    /// whether clients may send it: the listener refuses a type a client
    /// names that is not here, or not public (decision 0108).
    #[serde(default)]
    pub types: Vec<DeclaredType>,
    /// The notification types they subscribe to or emit, likewise (a
    /// client's `Notify`).
    #[serde(default)]
    pub notifications: Vec<DeclaredType>,
}

/// The state of a group's link to the cluster (docs/cluster.md), as
/// `/ready` and `switchyard status` show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterLink {
    pub state: LinkState,
    /// Other groups this one has heard from since it started.
    pub peers: u32,
}

/// Whether the NATS connection is up.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkState {
    /// Not connected yet since the router started.
    Connecting,
    Connected,
    /// Lost; reconnecting with back-off.
    Disconnected,
}

impl RouteTable {
    /// Whether every declared manager has at least one instance up.
    pub fn all_up(&self) -> bool {
        self.managers.iter().all(|m| m.instances_up > 0)
    }
}

/// One HTTP route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteEntry {
    pub route: HttpRoute,
    pub event_type: EventType,
    pub type_name: String,
    pub manager: String,
}

/// A manager and how many of its instances are connected.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerHealth {
    pub name: String,
    pub instances_up: u32,
}

/// A binary `/ws` request: the bincode of this, with `payload` the bincode
/// of the event (docs/websocket.md). The manager receives it as
/// `application/x-bincode` and answers in bincode.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsBinaryRequest {
    pub id: String,
    /// The event type's name, e.g. `demo.Hello`.
    pub event_type: String,
    pub payload: Vec<u8>,
}

/// The answer to a [`WsBinaryRequest`], as the bincode of this: the reply's
/// bincode on success, a problem+json body on an error status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WsBinaryReply {
    pub id: String,
    pub status: u16,
    pub content_type: String,
    pub payload: Vec<u8>,
}

/// Which process of the group plays which role, as the supervisor (which
/// spawned each of them) knows it: the broker and the router check every
/// hello against it, by the pid the kernel reports for the connection
/// (`SO_PEERCRED`), never by what the hello says
/// (docs/decisions/0100-roles-by-pid.md).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roster {
    /// Increases with every roster the supervisor sends: a process keeps
    /// the newest it has seen.
    pub version: u64,
    pub members: Vec<Member>,
}

/// One process of the group.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub pid: u32,
    pub role: GroupRole,
    /// A manager's (or its worker's) configured name; the role's name for
    /// the others.
    pub name: String,
    /// The built-in Scheduler: the one process whose requests and
    /// notifications may carry [`META_JOB`], a client's job to be admitted
    /// by a listener as that client when it fires (decision 0113).
    #[serde(default)]
    pub fires_jobs: bool,
}

/// A process's role, as the roster names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupRole {
    Broker,
    Router,
    Listener,
    Manager,
    Worker,
}

impl Roster {
    /// The member with this pid.
    pub fn member(&self, pid: u32) -> Option<&Member> {
        self.members.iter().find(|m| m.pid == pid)
    }
}

/// Removes from `meta` the request context only the listener may set:
/// every `:` key. A manager names the request it serves in the
/// envelope's typed context instead (decision 0146), which grants
/// nothing. Returns how many entries went.
pub fn strip_listener_context(meta: &mut crate::Meta) -> usize {
    let before = meta.0.len();
    meta.0.retain(|(key, _)| !crate::event::is_context_key(key));
    before - meta.0.len()
}

#[cfg(test)]
mod trust_tests {
    use super::*;
    use crate::event::META_IDENTITY;

    #[test]
    fn no_listener_context_survives_from_a_manager() {
        let mut meta = crate::Meta::default();
        for key in [
            META_IDENTITY,
            ":s:sub",
            ":client",
            ":h:authorization",
            ":request-id",
            ":traceparent",
            "content-type",
            META_EVENT,
        ] {
            meta.push(key, "v");
        }
        assert_eq!(strip_listener_context(&mut meta), 6);
        let kept: Vec<&str> = meta.0.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kept, ["content-type", META_EVENT]);
    }

    #[test]
    fn a_roster_finds_members_by_pid() {
        let roster = Roster {
            version: 1,
            members: vec![Member {
                pid: 42,
                role: GroupRole::Manager,
                name: "shop".into(),
                fires_jobs: false,
            }],
        };
        assert_eq!(
            roster.member(42).map(|m| (m.role, m.name.as_str())),
            Some((GroupRole::Manager, "shop"))
        );
        assert!(roster.member(43).is_none());
    }
}
