//! The manager host: one process, one manager instance.
//!
//! Connects to the router, declares what the manager serves, then answers
//! requests in the order they arrive. Handlers run on this task: a manager is
//! single-threaded by design (its state needs no locks); scale by instances.
//! If the router goes away the host reconnects and declares itself again.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use switchyard_proto::control::Control;
use switchyard_proto::transport::{FrameReader, FrameSink, spawn_writer};
use switchyard_proto::{Envelope, Kind, Payload};
use tokio::net::UnixStream;
use tokio::net::unix::OwnedReadHalf;
use tokio::sync::oneshot;

use crate::service::Service;

/// Errors that stop the host.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("router refused the manager")]
    Refused,
}

/// The host's settings.
#[derive(Clone, Debug)]
pub struct Config {
    /// The router's socket.
    pub router_socket: PathBuf,
    /// Largest frame accepted or sent, in bytes.
    pub max_frame: usize,
    /// Responses queued towards the router.
    pub queue_capacity: usize,
}

/// Serves `service` until `shutdown` resolves. `ready` fires once the router
/// has accepted the manager's declaration.
pub async fn run(
    mut service: Box<dyn Service>,
    config: Config,
    ready: oneshot::Sender<()>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), HostError> {
    let mut ready = Some(ready);
    tokio::pin!(shutdown);
    let mut backoff = Duration::from_millis(5);
    loop {
        let link = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            link = connect(&*service, &config) => link,
        };
        match link {
            Ok((reader, sink, id)) => {
                backoff = Duration::from_millis(5);
                tracing::info!(instance = id, "registered with router");
                if let Some(ready) = ready.take() {
                    let _ = ready.send(());
                }
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = serve(&mut *service, &config, reader, sink) => {
                        tracing::warn!("router connection lost; reconnecting");
                    }
                }
            }
            Err(err) => {
                tracing::debug!(%err, "router not reachable yet");
                tokio::select! {
                    _ = &mut shutdown => return Ok(()),
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

async fn connect(
    service: &dyn Service,
    config: &Config,
) -> Result<(FrameReader<OwnedReadHalf>, FrameSink, u64), switchyard_proto::Error> {
    let stream = UnixStream::connect(&config.router_socket).await?;
    let (read, write) = stream.into_split();
    let (sink, _writer) = spawn_writer(write, config.queue_capacity, config.max_frame);
    let mut reader = FrameReader::new(read, config.max_frame);
    sink.send_wait(Envelope::control(&Control::HelloManager(service.describe()))?)
        .await?;
    match reader.next().await? {
        Some(env) if env.kind == Kind::Control => match env.decode_control()? {
            Control::Welcome { id } => Ok((reader, sink, id)),
            _ => Err(switchyard_proto::Error::Malformed("expected welcome")),
        },
        _ => Err(switchyard_proto::Error::Closed),
    }
}

/// Bytes of frame overhead we leave room for when checking a response size.
const FRAME_HEADROOM: usize = 4096;

async fn serve(
    service: &mut dyn Service,
    config: &Config,
    mut reader: FrameReader<OwnedReadHalf>,
    sink: FrameSink,
) {
    let mut batch = Vec::with_capacity(64);
    loop {
        match reader.read_batch(&mut batch).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(err) => return tracing::warn!(%err, "closing router connection"),
        }
        for env in batch.drain(..) {
            match env.kind {
                Kind::Request => {
                    let body: &[u8] = match &env.payload {
                        Payload::Inline(bytes) => bytes,
                        Payload::Shm(_) => {
                            let _ = sink.send(Envelope::error_to(
                                &env,
                                501,
                                "shared-memory payloads are not supported yet",
                            ));
                            continue;
                        }
                    };
                    let response = service.handle(env.event_type, env.correlation, &env.meta, body);
                    let reply = if response.body.len() + FRAME_HEADROOM > config.max_frame {
                        tracing::error!(len = response.body.len(), "response larger than the frame limit");
                        Envelope::error_to(&env, 500, "response too large")
                    } else {
                        Envelope::response_to(&env, response.status, response.meta, response.body)
                    };
                    if let Err(refused) = sink.send(reply) {
                        tracing::warn!(%refused, "response dropped");
                    }
                }
                Kind::Notification => {
                    // Subscriptions arrive with the plugin SDK issue.
                }
                other => tracing::debug!(?other, "ignoring frame from router"),
            }
        }
    }
}
