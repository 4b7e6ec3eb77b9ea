//! The admin endpoint (`[admin] bind`, `--admin-bind`): `/metrics` in the
//! Prometheus text format for the whole group, the live dashboard at `/`,
//! and `/api/status`, the JSON the dashboard polls.
//!
//! The supervisor serves it: it knows every process of the group, and
//! each child already reports its load over its control channel; request
//! figures ride the same channel once a second ([`GroupFigures`], decision
//! 0055). CPU and memory are read from `/proc` at each scrape, off the
//! supervisor's loop. Nothing here is on a request's path.
//!
//! # Layout
//! - this module: the HTTP server and its routes.
//! - `exposition`: the group's figures as Prometheus text
//!   (prometheus-client's encoder).
//! - `procfs`: a process's CPU time and resident memory.
//! - `dashboard.html`: the dashboard, one self-contained page.

mod exposition;
mod procfs;

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use switchyard_proto::supervision::{LATENCY_BUCKETS, RouteFigures};
use tokio::sync::{mpsc, oneshot};

use crate::supervisor::events::{Event, GroupFigures, ProcessFigures};

/// Adds `more` (one process's cumulative figures) into `total`.
pub(crate) fn add_route(total: &mut RouteFigures, more: &RouteFigures) {
    for &(status, count) in &more.statuses {
        match total.statuses.iter_mut().find(|(s, _)| *s == status) {
            Some((_, c)) => *c += count,
            None => total.statuses.push((status, count)),
        }
    }
    total.statuses.sort_unstable();
    if total.buckets.len() < more.buckets.len() {
        total.buckets.resize(more.buckets.len(), 0);
    }
    for (t, m) in total.buckets.iter_mut().zip(&more.buckets) {
        *t += m;
    }
    total.sum_us += more.sum_us;
}

/// A process as `/metrics` and the dashboard label it, with what `/proc`
/// says of it.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Sampled {
    #[serde(flatten)]
    pub(crate) process: ProcessFigures,
    /// Tells apart processes of the same role, name and instance (the
    /// worker processes of one manager instance, a replacement beside
    /// what it replaces): `0`, then `0.1`, `0.2`...
    pub(crate) replica: String,
    pub(crate) cpu_seconds: Option<f64>,
    pub(crate) rss_bytes: Option<u64>,
}

/// The group's figures with each live process sampled from `/proc`.
fn sample(figures: GroupFigures) -> (Vec<Sampled>, Vec<RouteFigures>) {
    let mut seen: Vec<(String, String, u32)> = Vec::new();
    let processes = figures
        .processes
        .into_iter()
        .map(|process| {
            let info = &process.info;
            let key = (info.role.clone(), info.name.clone(), info.instance);
            let before = seen.iter().filter(|k| **k == key).count();
            seen.push(key);
            let replica = if before == 0 {
                info.instance.to_string()
            } else {
                format!("{}.{before}", info.instance)
            };
            let usage = info.pid.and_then(procfs::usage);
            Sampled {
                replica,
                cpu_seconds: usage.map(|u| u.cpu_seconds),
                rss_bytes: usage.map(|u| u.rss_bytes),
                process,
            }
        })
        .collect();
    (processes, figures.routes)
}

/// Serves the admin endpoint on `listener` for the life of the supervisor.
/// `hosts` are the `Host` names it answers to besides IP literals and
/// `localhost` (`[admin] hosts`).
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    hosts: Vec<String>,
    events: mpsc::UnboundedSender<Event>,
) {
    let hosts: std::sync::Arc<[String]> = hosts.iter().map(|h| h.to_ascii_lowercase()).collect();
    let listener = match listener
        .set_nonblocking(true)
        .and_then(|()| tokio::net::TcpListener::from_std(listener))
    {
        Ok(l) => l,
        Err(err) => return tracing::error!(%err, "admin endpoint unusable"),
    };
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors, most likely: try again shortly.
                tracing::warn!(%err, "admin endpoint: accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let events = events.clone();
        let builder = builder.clone();
        let hosts = hosts.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let events = events.clone();
                let hosts = hosts.clone();
                async move {
                    if !host_allowed(&req, &hosts) {
                        return Ok::<_, Infallible>(plain(
                            StatusCode::FORBIDDEN,
                            "forbidden: this Host is not the admin endpoint's; \
                             add it to [admin] hosts to reach it by that name\n",
                        ));
                    }
                    Ok::<_, Infallible>(respond(req, &events).await)
                }
            });
            let _ = builder.serve_connection(TokioIo::new(stream), service).await;
        });
    }
}

type Reply = Response<Full<Bytes>>;

/// Whether a request names the endpoint by an address (an IP literal),
/// `localhost`, or one of `hosts`. A browser sends the name it resolved,
/// so a page of another site whose name was rebound to this address is
/// refused; a request with no `Host` (HTTP/1.0 tools) is not a browser's.
fn host_allowed<B>(req: &Request<B>, hosts: &[String]) -> bool {
    let named = req.uri().authority().map(|a| a.as_str().to_owned()).or_else(|| {
        req.headers()
            .get(header::HOST)
            .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
    });
    let Some(named) = named else {
        return true;
    };
    let Ok(authority) = named.parse::<http::uri::Authority>() else {
        return false;
    };
    let host = authority.host().to_ascii_lowercase();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.parse::<std::net::IpAddr>().is_ok()
        || host == "localhost"
        || host.ends_with(".localhost")
        || hosts.contains(&host)
}

async fn respond(req: Request<hyper::body::Incoming>, events: &mpsc::UnboundedSender<Event>) -> Reply {
    let path = req.uri().path();
    if !matches!(path, "/" | "/metrics" | "/api/status") {
        return plain(
            StatusCode::NOT_FOUND,
            "not found: try /, /metrics or /api/status\n",
        );
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut reply = plain(StatusCode::METHOD_NOT_ALLOWED, "only GET\n");
        reply
            .headers_mut()
            .insert(header::ALLOW, http::HeaderValue::from_static("GET, HEAD"));
        return reply;
    }
    if path == "/" {
        return reply(StatusCode::OK, "text/html; charset=utf-8", DASHBOARD);
    }
    let (tx, rx) = oneshot::channel();
    let _ = events.send(Event::Metrics(tx));
    let Ok(figures) = rx.await else {
        return plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "the group is starting or stopping\n",
        );
    };
    // `/proc` is read here, on the connection's task, not the supervisor's loop.
    let (processes, routes) = sample(figures);
    if path == "/metrics" {
        return match exposition::encode(&processes, &routes) {
            Ok(text) => reply(StatusCode::OK, exposition::CONTENT_TYPE, text),
            Err(err) => plain(StatusCode::INTERNAL_SERVER_ERROR, &format!("{err}\n")),
        };
    }
    let body = serde_json::json!({
        "processes": processes,
        "routes": routes,
        "latency_buckets": LATENCY_BUCKETS,
    });
    reply(StatusCode::OK, "application/json", body.to_string())
}

/// The dashboard: one page, its script and style inline, no outside
/// resource (docs/operations.md#the-dashboard).
const DASHBOARD: &str = include_str!("dashboard.html");

fn plain(status: StatusCode, text: &str) -> Reply {
    reply(status, "text/plain; charset=utf-8", text.to_owned())
}

fn reply(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut reply = Response::new(Full::new(body.into()));
    *reply.status_mut() = status;
    let headers = reply.headers_mut();
    headers.insert(header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, http::HeaderValue::from_static("no-store"));
    reply
}

/// Binds the admin address before any child starts, so that a bad one
/// stops `up` at once. With `SO_REUSEPORT`: during `switchyard upgrade`
/// the new supervisor binds the same address while the old one still
/// holds it (both are the same user's), so the endpoint never refuses.
pub(crate) fn bind(addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
    let failed = |e: std::io::Error| {
        anyhow::anyhow!("cannot listen for the admin endpoint (admin.bind) on {addr}: {e}")
    };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(failed)?;
    socket.set_reuseaddr(true).map_err(failed)?;
    socket.set_reuseport(true).map_err(failed)?;
    socket.bind(addr).map_err(failed)?;
    socket.listen(128).map_err(failed)?.into_std().map_err(failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_localhost_and_listed_names_reach_the_endpoint() {
        let hosts = vec!["metrics.internal".to_owned()];
        let with = |host: &str| {
            Request::get("/metrics")
                .header(header::HOST, host)
                .body(())
                .unwrap()
        };
        for ok in [
            "127.0.0.1:9100",
            "[::1]:9100",
            "10.1.2.3",
            "localhost:9100",
            "LOCALHOST",
            "metrics.internal:9100",
        ] {
            assert!(host_allowed(&with(ok), &hosts), "{ok}");
        }
        for refused in [
            "evil.example:9100",
            "rebind.attacker.test",
            "metrics.internal.evil",
            "a b",
        ] {
            assert!(!host_allowed(&with(refused), &hosts), "{refused}");
        }
        assert!(host_allowed(&Request::get("/").body(()).unwrap(), &hosts));
    }

    #[test]
    fn routes_add_up() {
        let mut total = RouteFigures::default();
        let one = RouteFigures {
            route: "/a".into(),
            method: "GET".into(),
            statuses: vec![(200, 3), (404, 1)],
            buckets: vec![1, 2, 1],
            sum_us: 10,
        };
        add_route(&mut total, &one);
        add_route(
            &mut total,
            &RouteFigures {
                statuses: vec![(200, 1), (500, 2)],
                buckets: vec![0, 3, 0],
                sum_us: 5,
                ..one.clone()
            },
        );
        assert_eq!(total.statuses, vec![(200, 4), (404, 1), (500, 2)]);
        assert_eq!(total.buckets, vec![1, 5, 1]);
        assert_eq!(total.sum_us, 15);
    }
}
