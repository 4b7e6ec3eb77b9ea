//! `grpc.health.v1.Health`, as the health checking protocol says: `Check`
//! on an unknown name is `NOT_FOUND`; `Watch` on one streams
//! `SERVICE_UNKNOWN` and stays open, then the status if the name becomes
//! known (a manager added by a reload), as load balancers expect.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use tokio::sync::watch;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use super::{EventsService, MANAGER_PREFIX};
use crate::state::State;
use switchyard_proto::grpc::events_server::EventsServer;

/// Every known service name and its status.
type Statuses = Arc<HashMap<String, ServingStatus>>;

pub(crate) struct Health {
    statuses: watch::Receiver<Statuses>,
}

/// The health service, its statuses kept in step with the group.
pub(crate) fn service(state: Arc<State>) -> HealthServer<Health> {
    let (tx, rx) = watch::channel(Arc::new(statuses(&state)));
    tokio::spawn(track(state, tx));
    HealthServer::new(Health { statuses: rx })
}

/// The statuses now: `""` and `switchyard.v1.Events` are SERVING when the
/// group is ready (as `/ready`), each manager when the router is up and
/// the manager has an instance up.
fn statuses(state: &State) -> HashMap<String, ServingStatus> {
    let status = |up: bool| {
        if up {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        }
    };
    let ready = status(state.pool.ready());
    let router = state.pool.router_up();
    let mut now = HashMap::new();
    now.insert(String::new(), ready);
    now.insert(
        <EventsServer<EventsService> as NamedService>::NAME.to_owned(),
        ready,
    );
    for m in &state.pool.routes().table.managers {
        now.insert(
            format!("{MANAGER_PREFIX}{}", m.name),
            status(router && m.instances_up > 0),
        );
    }
    now
}

/// Keeps the statuses in step with the route table and the router as the
/// listener learns of changes (no polling). Ends once no service or watch
/// is left to tell.
async fn track(state: Arc<State>, tx: watch::Sender<Statuses>) {
    let mut changes = state.pool.watch_changes();
    loop {
        let now = statuses(&state);
        tx.send_if_modified(|current| {
            let changed = **current != now;
            if changed {
                *current = Arc::new(now);
            }
            changed
        });
        tokio::select! {
            changed = changes.changed() => if changed.is_err() { return },
            () = tx.closed() => return,
        }
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

fn response(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse {
        status: status as i32,
    }
}

#[tonic::async_trait]
impl tonic_health::pb::health_server::Health for Health {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        match self.statuses.borrow().get(&service) {
            Some(status) => Ok(Response::new(response(*status))),
            None => Err(Status::not_found(format!("no service `{service}` to check"))),
        }
    }

    type WatchStream = WatchStream;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<WatchStream>, Status> {
        let service = request.into_inner().service;
        let mut statuses = self.statuses.clone();
        statuses.mark_changed();
        // Each change of this service's status, the first one at once.
        let stream = futures_util::stream::unfold(
            (statuses, service, None),
            |(mut statuses, service, last)| async move {
                loop {
                    if statuses.changed().await.is_err() {
                        return None;
                    }
                    let status = statuses
                        .borrow_and_update()
                        .get(&service)
                        .copied()
                        .unwrap_or(ServingStatus::ServiceUnknown);
                    if last != Some(status) {
                        return Some((Ok(response(status)), (statuses, service, Some(status))));
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(stream)))
    }
}
