//! Control messages between the processes of a group, carried in
//! [`Kind::Control`](crate::Kind::Control) frames on the same connections as events.
//!
//! ```text
//! listener pipe ──HelloPipe──▶ broker ──Welcome──▶ pipe
//! router ───────HelloRouter──▶ broker
//! manager ─────HelloManager──▶ router ──Welcome──▶ manager
//! router ──RouteTable──▶ broker ──RouteTable──▶ every listener's first pipe
//! broker ──RouterLost──▶ every pipe (fail in-flight requests at once)
//! ```

use serde::{Deserialize, Serialize};

use crate::EventType;

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
}

/// One request type a manager answers, with its HTTP route if it has one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandledType {
    pub name: String,
    pub event_type: EventType,
    pub route: Option<HttpRoute>,
}

/// `GET /hello/{name}`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HttpRoute {
    pub method: String,
    pub path: String,
}

/// The routes the listener serves and the health of the managers behind them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteTable {
    /// Increases with every change the router makes.
    pub version: u64,
    pub routes: Vec<RouteEntry>,
    pub managers: Vec<ManagerHealth>,
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
