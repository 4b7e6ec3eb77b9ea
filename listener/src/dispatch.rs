//! The front door: which front end serves a request. gRPC by content type
//! (or every request of the gRPC-only port); the listener's own `/health`
//! and `/ready`; WebSocket upgrades of `/ws` and `/ws/echo`; else the route
//! table, whose entry says whether the body is taken whole or streamed.

use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Either;
use hyper::body::Incoming;

use crate::body::Body;
use crate::conn::Conn;
use crate::grpc::{self, Grpc};
use crate::reply::{Reply, error, json};
use crate::routes::Lookup;
use crate::state::State;
use crate::{upload, ws};

/// Serves one request of connection `conn`; `grpc_only` when it came on
/// the gRPC-only port.
pub(crate) async fn serve(
    state: Arc<State>,
    grpc: Arc<Grpc>,
    grpc_only: bool,
    conn: &Arc<Conn>,
    req: Request<Incoming>,
) -> Response<Either<Body, tonic::body::Body>> {
    if grpc_only || grpc::is_grpc(&req) {
        return grpc.serve(req).await.map(Either::Right);
    }
    let reply = match req.uri().path() {
        "/health" => json(StatusCode::OK, serde_json::json!({ "status": "alive" })),
        "/ready" => ready(&state),
        "/ws" if ws::is_upgrade(&req) => ws::upgrade(state, conn, req, false),
        "/ws/echo" if ws::is_upgrade(&req) => ws::upgrade(state, conn, req, true),
        _ => route(&state, req).await,
    };
    reply.map(Either::Left)
}

fn ready(state: &State) -> Reply {
    let routes = state.pool.routes();
    let router = state.pool.router_up();
    let ready = state.pool.ready();
    let managers: Vec<_> = routes
        .table
        .managers
        .iter()
        .map(|m| serde_json::json!({ "name": m.name, "instances_up": m.instances_up }))
        .collect();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(
        status,
        serde_json::json!({ "ready": ready, "router": router, "managers": managers }),
    )
}

async fn route(state: &State, req: Request<Incoming>) -> Reply {
    let routes = state.pool.routes();
    let matched = match routes.lookup(req.method().as_str(), req.uri().path()) {
        Lookup::Found(m) => m,
        Lookup::WrongMethod(allowed) => {
            let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed for this path");
            if let Ok(v) = HeaderValue::from_str(&allowed.join(", ")) {
                reply.headers_mut().insert(header::ALLOW, v);
            }
            return reply;
        }
        Lookup::NotFound => return error(StatusCode::NOT_FOUND, "no route matches this path"),
    };
    drop(routes);
    if matched.entry.route.stream_body {
        upload::upload(state, req, matched).await
    } else {
        crate::http::forward(state, req, matched).await
    }
}
