//! The NATS bridge's frames, applied to the routing table.

use switchyard_cluster::{Bridge, FromCluster};
use tokio::sync::mpsc;

use crate::Shared;

/// Starts the bridge and the task that hands what it receives to the
/// table. The link comes up in the background: a NATS that is down delays
/// nothing here.
pub(crate) async fn start(shared: &Shared) {
    let config = shared.config.cluster.clone();
    let shared_types = config
        .shared
        .iter()
        .map(|n| switchyard_proto::EventType::of(n))
        .collect();
    let (from_tx, mut from) = mpsc::channel(config.queue);
    let bridge = match Bridge::start(config, shared.config.shm_threshold, from_tx).await {
        Ok(bridge) => bridge,
        Err(err) => {
            // Only a configuration the client cannot use at all (the
            // supervisor checked it before starting the group): serve
            // alone rather than not at all.
            return tracing::error!(%err, "cluster bridge not started; serving this group alone");
        }
    };
    shared.lock().set_cluster(bridge, shared_types);
    let shared = shared.clone();
    tokio::spawn(async move {
        let mut batch = Vec::with_capacity(64);
        while from.recv_many(&mut batch, 64).await > 0 {
            let mut table = shared.lock();
            for frame in batch.drain(..) {
                match frame {
                    FromCluster::Response(env) => table.complete(env, switchyard_cluster::BRIDGE_ID),
                    FromCluster::Request(env) => table.route_request(env),
                    FromCluster::Notification(env) => {
                        table.route_notification(env, Some(switchyard_cluster::BRIDGE_ID))
                    }
                    FromCluster::Routes { group, manifest } => table.set_remote(group, manifest),
                    FromCluster::Left { group } => table.remote_left(&group),
                    FromCluster::Status(state) => table.set_cluster_link(state),
                }
            }
        }
    });
}
