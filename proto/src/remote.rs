//! The port between the router and a link to other groups: what the
//! router hands the link and what the link hands back, as frames on two
//! queues. The router owns its end and decides local or remote; the NATS
//! bridge (`switchyard-cluster`, decision 0070) is one implementation of
//! the other end, and a test's in-memory peer another. Neither side names
//! the other's crate: this module is their whole contract.

use std::collections::BTreeSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::Envelope;
use crate::EventType;
use crate::control::{LinkState, RouteEntry, TypeNeeds};

/// The origin id the router gives requests that came from the link: never
/// a manager instance's (those count up from 1).
pub const REMOTE_ID: u64 = u64::MAX;

/// A group whose manifest has not come for this long, while the link was
/// up, has left: its routes and types are forgotten (three of the bridge's
/// 30-second heartbeats).
pub const MANIFEST_EXPIRY: Duration = Duration::from_secs(90);

/// Router → link.
#[derive(Debug)]
pub enum ToRemote {
    /// A request no local manager takes (or of a shared type): call the
    /// other groups. Answered with [`FromRemote::Response`], always.
    Request(Envelope),
    /// The response to a request that came from the link
    /// ([`FromRemote::Request`], origin `Manager(REMOTE_ID)`).
    Response(Envelope),
    /// A notification emitted in this group (never one that came from the
    /// link: that would loop).
    Notification(Envelope),
    /// What this group serves now.
    Local(Manifest),
    /// The router is stopping cleanly: tell the other groups, so they
    /// forget this one's routes at once; answer `done` once that is out
    /// (or could not be sent).
    Leave(oneshot::Sender<()>),
}

/// Link → router.
#[derive(Debug)]
pub enum FromRemote {
    /// The answer to a [`ToRemote::Request`].
    Response(Envelope),
    /// A call from another group, for a type this group serves; its origin
    /// is `Manager(REMOTE_ID)`. Route it locally only.
    Request(Envelope),
    /// A notification emitted in another group: deliver it here only.
    Notification(Envelope),
    /// Another group's routes: the listeners here accept them too.
    Routes { group: String, manifest: Manifest },
    /// Another group stopped cleanly and said so: forget its routes now,
    /// not after [`MANIFEST_EXPIRY`].
    Left { group: String },
    /// The link's state changed.
    Status(LinkState),
}

/// What a group serves: the request types its managers answer now, and the
/// HTTP routes and needs of those types.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub serves: BTreeSet<EventType>,
    pub routes: Vec<RouteEntry>,
    pub needs: Vec<TypeNeeds>,
}
