//! The scenarios: what each starts, what load it drives, and the section of
//! output it produces.
//!
//! All but one compare two contenders under the same loads. Those are rows
//! of [`COMPARISONS`] (routes, transports, contenders, targets, the words
//! above the table), and [`Scenario::run`] runs any of them. `routing`
//! measures the router alone and has code of its own.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::routing::{self, RoutingRun, TARGET_ROUND_TRIPS};
use super::server::{Group, ManagerEntry, Pool, Readiness, Server, check_config, config_toml, token};
use super::stats::{median, ratio};
use super::table::{Comparison, Row, Sample, render_comparison, render_routing};
use crate::load;

/// Unrecorded load before each load run's steps, per fresh server.
pub(crate) const WARMUP_S: &str = "1";
/// Unrecorded round trips before each routing measurement.
const ROUTING_WARMUP: Duration = Duration::from_millis(500);
/// Outstanding requests of the routing scenario's rows.
const ROUTING_WINDOWS: [usize; 3] = [1, 32, 256];

/// What the scenarios share.
pub(crate) struct Ctx {
    pub(crate) switchyard: PathBuf,
    pub(crate) baseline: PathBuf,
    pub(crate) runs: u32,
    pub(crate) duration: Duration,
    /// The load generator's runtime: the servers never run on it.
    pub(crate) runtime: tokio::runtime::Runtime,
}

/// A scenario's part of the output.
pub(crate) enum Outcome {
    /// A title and the text under it.
    Done { title: String, body: String },
    /// Why the scenario did not run.
    Skipped(String),
}

/// Whether scenario `name` starts Switchyard groups or the baseline.
pub(crate) fn needs_servers(name: &str) -> bool {
    comparison(name).is_some() || name == "middleware" || name == "http3"
}

pub(crate) fn run(name: &str, ctx: &Ctx) -> anyhow::Result<Outcome> {
    match name {
        "routing" => routing(ctx),
        "middleware" => middleware(ctx),
        "http3" => http3(ctx),
        other => match comparison(other) {
            Some(scenario) => scenario.run(ctx),
            None => bail!("no scenario {other}"),
        },
    }
}

fn comparison(name: &str) -> Option<&'static Scenario> {
    COMPARISONS.iter().find(|s| s.name == name)
}

/// Steps keyed by their clients.
const CLIENTS: &[(&str, u32)] = &[("1", 1), ("8", 8), ("32", 32)];
/// The busier steps of [`CLIENTS`].
const BUSY: &[(&str, u32)] = &[("8", 8), ("32", 32)];

const DEMO_GROUP: &str = "- Switchyard: `switchyard up` with no configuration (the demo group)";
const DEMO_BASELINE: &str = "- baseline: `switchyard-baseline`, the same route in-process";

/// The demo's basics and a fast ticker with padding, so that a consumer
/// that does not read fills its queue within the run.
const TICKING: &str = "[[managers]]\nname = \"basics\"\n\n[[managers]]\nname = \"ticker\"\n\
                       [managers.config]\ninterval_ms = 2\npad_bytes = 4096\n";

/// The scenarios that compare two contenders, in no particular order
/// ([`SCENARIOS`](super::SCENARIOS) orders a run).
const COMPARISONS: &[Scenario] = &[
    Scenario {
        name: "tls",
        title: "tls: HTTPS, GET /noop",
        about: &[
            "- HTTPS on both sides: rustls on ring, TLS 1.3, an ECDSA P-256 certificate made for the \
             run (rcgen), the client verifying it against the run's CA",
            "- keep-alive rows: one connection per client, so req/s over TLS; new-connection rows: \
             a TCP connection and a full TLS handshake before every request (`--new-connection`), \
             so req/s is the handshake rate",
            "- Switchyard: `switchyard up` with `[listener.tls]` and the demo's managers; baseline: \
             `switchyard-baseline --tls-cert --tls-key`, the same route in-process",
        ],
        key: "connections, clients",
        loads: &[
            Load::http(
                "/noop",
                &[("keep-alive 1", 1), ("keep-alive 8", 8), ("keep-alive 32", 32)],
            ),
            Load {
                route: "/noop",
                rows: &[("new connection 8", 8), ("new connection 32", 32)],
                transport: &["--new-connection"],
            },
        ],
        contenders: Contenders::TlsDemoAndBaseline,
        targets: &[],
    },
    Scenario {
        name: "rest",
        title: "rest: GET /noop",
        about: &[DEMO_GROUP, DEMO_BASELINE],
        key: "clients",
        loads: &[Load::http("/noop", CLIENTS)],
        contenders: Contenders::DemoAndBaseline,
        targets: &[Target::Ratio {
            source: "the price of isolation",
            at: &[("1", 0.40), ("8", 0.40), ("32", 0.45)],
        }],
    },
    Scenario {
        name: "payload",
        title: "payload: GET /payload/{size}",
        about: &[
            "- GET /payload/1024, /payload/102400, /payload/1048576, one load run each",
            DEMO_GROUP,
            DEMO_BASELINE,
        ],
        key: "body, 8 clients",
        loads: &[
            Load::http("/payload/1024", &[("1 KiB", 8)]),
            Load::http("/payload/102400", &[("100 KiB", 8)]),
            Load::http("/payload/1048576", &[("1 MiB", 8)]),
        ],
        contenders: Contenders::DemoAndBaseline,
        targets: &[Target::Ratio {
            source: "large bodies through shared memory",
            at: &[("1 MiB", 0.67)],
        }],
    },
    Scenario {
        name: "ws",
        title: "ws: WebSocket round trips",
        about: &[
            "- WebSocket request/response: `demo.Noop` as `{\"id\",\"type\",\"data\"}` on `/ws`, one \
             connection per client, closed loop (switchyard-client)",
            "- Switchyard: `switchyard up` with no configuration; baseline: `switchyard-baseline`, \
             which answers the same messages on its own `/ws` in-process",
        ],
        key: "clients",
        loads: &[Load {
            route: "/noop",
            rows: CLIENTS,
            transport: &["--ws"],
        }],
        contenders: Contenders::DemoAndBaseline,
        targets: &[Target::RoundTrips("32")],
    },
    Scenario {
        name: "grpc",
        title: "grpc: gRPC round trips",
        about: &[
            "- `switchyard.v1.Events`: unary `Call` (one HTTP/2 stream per call) and bidi `Session` \
             (calls on one stream per client), `demo.Noop`, one channel per client, closed loop \
             (switchyard-client)",
            "- Switchyard: `switchyard up` with no configuration; baseline: `switchyard-baseline`, \
             the same service answered in-process by tonic",
        ],
        key: "call, clients",
        loads: &[
            Load {
                route: "/noop",
                rows: &[("unary 1", 1), ("unary 8", 8), ("unary 32", 32)],
                transport: &["--grpc"],
            },
            Load {
                route: "/noop",
                rows: &[("bidi 1", 1), ("bidi 8", 8), ("bidi 32", 32)],
                transport: &["--grpc-bidi"],
            },
        ],
        contenders: Contenders::DemoAndBaseline,
        targets: &[
            Target::Ratio {
                source: "within 1.5× of in-process tonic",
                at: &[("unary 32", 1.0 / 1.5), ("bidi 32", 1.0 / 1.5)],
            },
            Target::RoundTrips("unary 32"),
            Target::RoundTrips("bidi 32"),
        ],
    },
    Scenario {
        name: "slow",
        title: "slow: latency next to consumers that do not drain",
        about: &[
            "- GET /noop from normal clients while 4 WebSocket clients subscribed to `demo.tick` \
             (every 2 ms, 4 KiB each) never read (4 KiB receive buffers), against the same group \
             without them; a stalled client is dropped once its queue is full \
             (`listener.ws.queue`), so the first second carries the cost",
        ],
        key: "clients",
        loads: &[Load::http("/noop", BUSY)],
        contenders: Contenders::Groups {
            groups: [("4 stalled subscribers", TICKING, 4), ("none", TICKING, 0)],
            refused: None,
        },
        targets: &[],
    },
    Scenario {
        name: "managers",
        title: "managers: CPU inline, 1 vs 2 instances",
        about: &[
            "- GET /cpu-inline/2: 2 ms of CPU in the manager process itself, served by `{manager}`",
            "- both contenders are Switchyard groups with the default group's managers (read from \
             `switchyard status`), `{manager}` at 2 instances vs 1; no baseline (the in-process \
             baseline does not serve /cpu-inline)",
        ],
        key: "clients",
        loads: &[Load::http("/cpu-inline/2", &[("32", 32)])],
        contenders: Contenders::Variants {
            probe: "/cpu-inline/0",
            serves: "GET /cpu-inline/{ms}",
            edits: [
                ("instances = 2", Edit::Instances(2)),
                ("instances = 1", Edit::Instances(1)),
            ],
            refused: "this build refuses manager instances",
        },
        targets: &[],
    },
    Scenario {
        name: "workers",
        title: "workers: thread vs process pool",
        about: &[
            "- GET /cpu/2: a job of 2 ms of CPU in `{manager}`'s worker pool",
            "- both contenders are Switchyard groups with the default group's managers (read from \
             `switchyard status`), `{manager}` with {size} worker processes vs {size} worker \
             threads (queue {queue}); no baseline (the in-process baseline does not serve /cpu)",
        ],
        key: "clients",
        loads: &[Load::http("/cpu/2", &[("32", 32)])],
        contenders: Contenders::Variants {
            probe: "/cpu/0",
            serves: "GET /cpu/{ms}",
            edits: [
                ("process pool", Edit::Pool("process")),
                ("thread pool", Edit::Pool("thread")),
            ],
            refused: "this build has no `[managers.workers]` kind and size",
        },
        targets: &[],
    },
    Scenario {
        name: "listener-workers",
        title: "listener-workers: 1 vs 2 listener processes",
        about: &[
            "- GET /noop; both contenders are the demo group, with `listener.workers` 2 vs 1 \
             (each listener process with one runtime thread per core); no baseline",
        ],
        key: "clients",
        loads: &[Load::http("/noop", BUSY)],
        // The key decides: once `switchyard check` takes it, the feature is there.
        contenders: Contenders::Groups {
            groups: [
                ("2 listener processes", "[listener]\nworkers = 2\n", 0),
                ("1 listener process", "[listener]\nworkers = 1\n", 0),
            ],
            refused: Some("listener.workers has not landed"),
        },
        targets: &[],
    },
    Scenario {
        name: "transport",
        title: "transport: shared-memory rings vs sockets between the hops",
        about: &[
            "- GET /noop; both contenders are the demo group, with `group.transport` \
             \"ring\" vs \"socket\" (decision 0040); no baseline (the rest scenario \
             compares the default, the ring, with it)",
        ],
        key: "clients",
        loads: &[Load::http("/noop", CLIENTS)],
        contenders: Contenders::Groups {
            groups: [
                ("ring", "[group]\ntransport = \"ring\"\n", 0),
                ("socket", "[group]\ntransport = \"socket\"\n", 0),
            ],
            refused: Some("group.transport has not landed"),
        },
        targets: &[],
    },
    Scenario {
        name: "metrics",
        title: "metrics: GET /noop with and without request metrics",
        about: &[
            "- GET /noop to two groups of the demo's basics: one counting every request for \
             `/metrics` (route, method, status, latency histogram; the default) with its admin \
             endpoint bound, so every process also sends its figures to the supervisor once a \
             second; the other with `[metrics] enabled = false`; trace context off in both \
             (`[tracing] enabled = false`: its cost is the request path's, not the metrics'), the \
             access log off in both (its default); no baseline",
        ],
        key: "clients",
        loads: &[Load::http("/noop", CLIENTS)],
        // The key decides: once `switchyard check` takes it, the feature is there.
        contenders: Contenders::Groups {
            groups: [
                (
                    "metrics",
                    "[admin]\nbind = \"127.0.0.1:0\"\n\n[tracing]\nenabled = false\n\n[[managers]]\nname = \"basics\"\n",
                    0,
                ),
                (
                    "none",
                    "[metrics]\nenabled = false\n\n[tracing]\nenabled = false\n\n[[managers]]\nname = \"basics\"\n",
                    0,
                ),
            ],
            refused: Some("request metrics have not landed"),
        },
        targets: &[Target::Ratio {
            source: "the cost of metrics",
            at: &[("1", 0.95), ("8", 0.95), ("32", 0.95)],
        }],
    },
];

/// A scenario that runs the same loads against two contenders, alternating,
/// and prints their comparison.
struct Scenario {
    name: &'static str,
    /// The section's heading.
    title: &'static str,
    /// The lines above the table: what runs, against what. In a
    /// [`Contenders::Variants`] scenario `{manager}` stands for the probed
    /// manager, `{size}` and `{queue}` for its worker pool's.
    about: &'static [&'static str],
    /// Heading of the key column.
    key: &'static str,
    /// Run one after the other against each fresh server.
    loads: &'static [Load],
    contenders: Contenders,
    /// Verdicts under the table.
    targets: &'static [Target],
}

/// One load run per server start: a route and its concurrency steps, each
/// step a row keyed as given.
struct Load {
    route: &'static str,
    rows: &'static [(&'static str, u32)],
    /// Transport flags of the load generator (`--ws`, `--grpc`, ...).
    transport: &'static [&'static str],
}

impl Load {
    /// Plain HTTP/1.1 requests.
    const fn http(route: &'static str, rows: &'static [(&'static str, u32)]) -> Load {
        Load {
            route,
            rows,
            transport: &[],
        }
    }
}

/// Whom a scenario measures.
enum Contenders {
    /// The demo group (`switchyard up` with no configuration) against the
    /// baseline.
    DemoAndBaseline,
    /// The same, both serving HTTPS with a certificate made for the run.
    TlsDemoAndBaseline,
    /// Two groups, each with its label, its configuration, and the
    /// WebSocket subscribers opened after start that never read. With
    /// `refused`, the scenario is skipped (saying it, and `switchyard
    /// check`'s message) when this build refuses either configuration.
    Groups {
        groups: [(&'static str, &'static str, usize); 2],
        refused: Option<&'static str>,
    },
    /// The default group's managers twice, as `switchyard status` shows
    /// them, with the manager that answers GET `probe` changed by each edit.
    /// Skipped when the default group does not serve `probe` (saying it
    /// lacks `serves`), or when this build refuses an edit (saying
    /// `refused`, and `switchyard check`'s message).
    Variants {
        probe: &'static str,
        serves: &'static str,
        edits: [(&'static str, Edit); 2],
        refused: &'static str,
    },
}

/// How a variant changes the probed manager's `[[managers]]` entry.
#[derive(Clone, Copy)]
enum Edit {
    /// This many instances.
    Instances(u32),
    /// A worker pool of this kind, of the size and queue it had.
    Pool(&'static str),
}

/// A verdict under a comparison's table.
enum Target {
    /// Contender 0's req/s over contender 1's, at least the given ratio on
    /// each row named; `source` says what the target is for.
    Ratio {
        source: &'static str,
        at: &'static [(&'static str, f64)],
    },
    /// Contender 0 at [`TRANSPORT_TARGET_RPS`] round trips per second or
    /// more, on the row named.
    RoundTrips(&'static str),
}

impl Target {
    fn verdict(&self, c: &Comparison) -> String {
        match *self {
            Target::Ratio { source, at } => targets(c, source, at),
            Target::RoundTrips(key) => absolute_target(c, key),
        }
    }
}

impl Scenario {
    fn run(&self, ctx: &Ctx) -> anyhow::Result<Outcome> {
        // Certificates for a TLS scenario, kept for its whole run.
        let certificates = match self.contenders {
            Contenders::TlsDemoAndBaseline => {
                let dir = super::tmp::scratch("tls")?;
                let files = crate::tls::TestCertificates::create(dir.path())?;
                Some((dir, files))
            }
            _ => None,
        };
        let (contenders, about) = match certificates.as_ref() {
            Some((_, files)) => (
                Contender::tls_pair(files),
                self.about.iter().map(|l| format!("{l}\n")).collect(),
            ),
            None => match self.prepare(ctx)? {
                Ok(ready) => ready,
                Err(why) => return Ok(Outcome::Skipped(why)),
            },
        };
        let trust: Vec<String> = match certificates.as_ref() {
            Some((_, files)) => vec!["--cacert".to_owned(), files.ca.display().to_string()],
            None => Vec::new(),
        };
        let comparison = compare(ctx, self.name, self.key, contenders, self.loads, &trust)?;
        let mut body = about;
        body.push('\n');
        body.push_str(&render_comparison(&comparison));
        for target in self.targets {
            body.push_str(&target.verdict(&comparison));
        }
        Ok(Outcome::Done {
            title: self.title.to_owned(),
            body,
        })
    }

    /// The contenders, and the lines above the table; `Err` with the reason
    /// when this build cannot run the scenario.
    fn prepare(&self, ctx: &Ctx) -> anyhow::Result<Result<([Contender; 2], String), String>> {
        let about = |fill: &dyn Fn(&str) -> String| -> String {
            self.about.iter().map(|line| fill(line) + "\n").collect()
        };
        let verbatim = |line: &str| line.to_owned();
        match self.contenders {
            Contenders::DemoAndBaseline | Contenders::TlsDemoAndBaseline => {
                let demo = Contender::Group {
                    label: "Switchyard",
                    config: None,
                    stalled: 0,
                    transport: &[],
                };
                Ok(Ok(([demo, Contender::Baseline(None)], about(&verbatim))))
            }
            Contenders::Groups { groups, refused } => {
                let contenders = groups.map(|(label, config, stalled)| Contender::Group {
                    label,
                    config: Some(config.to_owned()),
                    stalled,
                    transport: &[],
                });
                if let Some(refused) = refused
                    && let Err(why) = accepted(ctx, &contenders, refused)?
                {
                    return Ok(Err(why));
                }
                Ok(Ok((contenders, about(&verbatim))))
            }
            Contenders::Variants {
                probe,
                serves,
                edits,
                refused,
            } => {
                let Some(found) = probe_default_group(ctx, probe)? else {
                    return Ok(Err(format!(
                        "not available in this build (the default group does not serve {serves})"
                    )));
                };
                let [(a, edit_a), (b, edit_b)] = edits;
                let contenders = [(a, found.config_with(edit_a)?), (b, found.config_with(edit_b)?)].map(
                    |(label, config)| Contender::Group {
                        label,
                        config: Some(config),
                        stalled: 0,
                        transport: &[],
                    },
                );
                if let Err(why) = accepted(ctx, &contenders, refused)? {
                    return Ok(Err(why));
                }
                Ok(Ok((contenders, about(&|line| found.fill(line)))))
            }
        }
    }
}

/// Whether this build takes the configuration of every group in
/// `contenders`; `Err` with `refused` and `switchyard check`'s message when
/// it does not.
fn accepted(ctx: &Ctx, contenders: &[Contender; 2], refused: &str) -> anyhow::Result<Result<(), String>> {
    for contender in contenders {
        if let Contender::Group {
            config: Some(config), ..
        } = contender
            && let Err(message) = check_config(&ctx.switchyard, config)?
        {
            return Ok(Err(format!("{refused}: {message}")));
        }
    }
    Ok(Ok(()))
}

/// Round trips per second the event transports must reach at 32 clients
/// (the event transports' target).
const TRANSPORT_TARGET_RPS: f64 = 20_000.0;

/// "≥ 20000/s at 32: met (31234/s)" for contender 0 on row `key`.
fn absolute_target(c: &Comparison, key: &str) -> String {
    let Some(best) = c
        .rows
        .iter()
        .find(|r| r.key == key)
        .and_then(|r| median(&r.samples[0].iter().map(|s| s.rps).collect::<Vec<_>>()))
    else {
        return String::new();
    };
    let verdict = if best >= TRANSPORT_TARGET_RPS {
        "met".to_owned()
    } else {
        format!("missed by {:.0} %", (1.0 - best / TRANSPORT_TARGET_RPS) * 100.0)
    };
    format!(
        "Target (event transports) ≥ {TRANSPORT_TARGET_RPS:.0} round trips/s at {key}: {verdict} ({best:.0}/s).\n"
    )
}

/// Opens `n` WebSocket subscriptions to `demo.tick` that are never read.
async fn stall_consumers(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<StalledConsumer>> {
    use futures_util::SinkExt;
    let mut held = Vec::new();
    for i in 0..n {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.set_recv_buffer_size(4096)?;
        let tcp = socket.connect(addr).await?;
        let (mut ws, _) = tokio_tungstenite::client_async(
            format!("ws://{addr}/ws"),
            tokio_tungstenite::MaybeTlsStream::Plain(tcp),
        )
        .await
        .context("stalled consumer: websocket handshake")?;
        let subscribe = serde_json::json!({"id": format!("s{i}"), "subscribe": "demo.tick"});
        ws.send(tokio_tungstenite::tungstenite::Message::text(
            subscribe.to_string(),
        ))
        .await?;
        held.push(ws);
    }
    Ok(held)
}

type StalledConsumer =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// The demo's basics, as both middleware contenders run it.
const MIDDLEWARE_BASE: &str = "[[managers]]\nname = \"basics\"\n";

/// The middleware the `middleware` scenario turns on: a bearer JWT
/// verified on every request (HS256), CORS for one origin, and a rate
/// limit per address high enough never to refuse (its bucket is still
/// taken from on every request).
const MIDDLEWARE_ON: &str = "[[managers]]\nname = \"basics\"\n\n\
     [auth.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"suite-middleware-scenario-secret-0123456789\"\n\n\
     [[auth.rules]]\nprefix = \"/noop\"\n\n\
     [cors]\nallow_origins = [\"https://app.example\"]\n\n\
     [[rate_limit.limits]]\nrequests = 1000000\n";

/// `/noop` with the middleware of [`MIDDLEWARE_ON`] against the same group
/// without it, both sent the same token and `Origin`.
fn middleware(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let contenders = [
        Contender::Group {
            label: "JWT + CORS + rate limit",
            config: Some(MIDDLEWARE_ON.to_owned()),
            stalled: 0,
            transport: &[],
        },
        Contender::Group {
            label: "none",
            config: Some(MIDDLEWARE_BASE.to_owned()),
            stalled: 0,
            transport: &[],
        },
    ];
    if let Err(why) = accepted(ctx, &contenders, "middleware has not landed")? {
        return Ok(Outcome::Skipped(why));
    }
    let token = match token(&ctx.switchyard, MIDDLEWARE_ON, "bench")? {
        Ok(token) => token,
        Err(why) => return Ok(Outcome::Skipped(format!("this build makes no token: {why}"))),
    };
    // The load's flags are static, as every other scenario's: this one's
    // token is made at run time, once per run.
    let transport: &'static [&'static str] = Box::leak(Box::new([
        "--token",
        Box::leak(token.into_boxed_str()),
        "-H",
        "origin: https://app.example",
    ]));
    let loads = [Load {
        route: "/noop",
        rows: CLIENTS,
        transport,
    }];
    let comparison = compare(ctx, "middleware", "clients", contenders, &loads, &[])?;
    let mut body = String::new();
    let _ = writeln!(
        body,
        "- GET /noop with `Authorization: Bearer <HS256 JWT>` and `Origin: https://app.example` on \
         every request, to two groups of the demo's basics: one verifying the token (`[auth.jwt]`, a \
         rule on `/noop`), answering CORS for that origin and taking from a per-address token bucket \
         (`[[rate_limit.limits]]`, never exhausted); the other with none of it (compression and \
         security headers are on in both, as by default)"
    );
    let _ = writeln!(
        body,
        "- request ids and W3C trace context are on in both (their defaults), so the ratio is the \
         cost of authentication, CORS and the rate limit alone\n"
    );
    body.push_str(&render_comparison(&comparison));
    body.push_str(&targets(
        &comparison,
        "the middleware chain",
        &[("1", 0.85), ("8", 0.85), ("32", 0.85)],
    ));
    Ok(Outcome::Done {
        title: "middleware: GET /noop with and without the built-in middleware".to_owned(),
        body,
    })
}

/// HTTP/3 against h2 over TLS, both served by one configuration (one
/// listener process, the certificates made for the run), the client
/// verifying them: the ratio is HTTP/3's own cost.
fn http3(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let dir = super::tmp::scratch("http3")?;
    let files = crate::tls::TestCertificates::create(dir.path())?;
    let config = format!(
        "[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n\n[listener.http3]\nenabled = true\n",
        files.cert.display(),
        files.key.display()
    );
    let contenders = [
        Contender::Group {
            label: "HTTP/3",
            config: Some(config.clone()),
            stalled: 0,
            transport: &["--http3"],
        },
        Contender::Group {
            label: "h2 over TLS",
            config: Some(config),
            stalled: 0,
            transport: &["--http2"],
        },
    ];
    if let Err(why) = accepted(ctx, &contenders, "HTTP/3 has not landed")? {
        return Ok(Outcome::Skipped(why));
    }
    let loads = [
        Load::http("/noop", &[("/noop 1", 1), ("/noop 8", 8), ("/noop 32", 32)]),
        Load::http("/payload/1048576", &[("1 MiB 1", 1), ("1 MiB 8", 8)]),
    ];
    let trust = ["--cacert".to_owned(), files.ca.display().to_string()];
    let comparison = compare(ctx, "http3", "route, clients", contenders, &loads, &trust)?;
    let mut body = String::new();
    let _ = writeln!(
        body,
        "- one group configuration serving both (`[listener.tls]` with an ECDSA P-256 certificate \
         made for the run, `[listener.http3] enabled = true`, the demo's managers, one listener \
         process), a fresh group per round; HTTP/3: `switchyard bench --http3` (quinn + h3, one \
         QUIC connection and UDP socket per client); h2: `--http2` over TLS (ALPN h2, one \
         connection per client); both verify the certificate"
    );
    let _ = writeln!(
        body,
        "- the ratio is HTTP/3's req/s over h2's: the hops behind the listener are the same\n"
    );
    body.push_str(&render_comparison(&comparison));
    Ok(Outcome::Done {
        title: "http3: HTTP/3 against h2 over TLS, GET /noop and GET /payload/1048576".to_owned(),
        body,
    })
}

fn routing(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let mut rows: Vec<(usize, Vec<RoutingRun>)> = ROUTING_WINDOWS.iter().map(|&w| (w, Vec::new())).collect();
    for round in 0..ctx.runs {
        // Reversed every other round, as the contenders of the other
        // scenarios alternate: no window always runs on a warmer machine.
        let mut order: Vec<usize> = (0..rows.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let window = rows[i].0;
            eprintln!(
                "suite: routing: round {}/{}: {window} outstanding for {} s",
                round + 1,
                ctx.runs,
                ctx.duration.as_secs_f64()
            );
            let run = routing::measure(window, ROUTING_WARMUP, ctx.duration)
                .with_context(|| format!("routing with {window} outstanding"))?;
            rows[i].1.push(run);
        }
    }
    let mut body = String::new();
    let _ = writeln!(
        body,
        "- no HTTP and no baseline (the router has no zero-hop counterpart): the real router \
         (`switchyard_router::run`) on a current-thread runtime and thread of its own, in the \
         suite's process; two fake managers, each on a current-thread runtime and thread of its \
         own, speak the real frames over Unix sockets"
    );
    let _ = writeln!(
        body,
        "- manager 1 keeps N requests outstanding (closed loop), manager 2 answers each; a round \
         trip is request → router → manager 2 → router → manager 1; {} s of warm-up per run",
        ROUTING_WARMUP.as_secs_f64()
    );
    let _ = writeln!(
        body,
        "- compared with the raw routing target, ≥ {TARGET_ROUND_TRIPS:.0} round trips/s (the \
         Python system: 12–18 k)\n"
    );
    body.push_str(&render_routing(&rows, TARGET_ROUND_TRIPS));
    let best = rows
        .iter()
        .filter_map(|(window, runs)| {
            median(&runs.iter().map(RoutingRun::per_second).collect::<Vec<_>>()).map(|m| (*window, m))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((window, best)) = best {
        let verdict = if best >= TARGET_ROUND_TRIPS {
            "met".to_owned()
        } else {
            format!("missed by {:.0} %", (1.0 - best / TARGET_ROUND_TRIPS) * 100.0)
        };
        let _ = writeln!(
            body,
            "\nTarget (raw routing) ≥ {TARGET_ROUND_TRIPS:.0} round trips/s: {verdict} (best median: \
             {best:.0}/s with {window} outstanding)."
        );
    }
    Ok(Outcome::Done {
        title: "routing: router round trips, no HTTP".to_owned(),
        body,
    })
}

/// What a probe of the default group found: the manager that answered, and
/// every manager of the group.
struct Found {
    manager: String,
    managers: Vec<ManagerEntry>,
}

impl Found {
    /// The default group's configuration with the probed manager changed by `edit`.
    fn config_with(&self, edit: Edit) -> anyhow::Result<String> {
        let (size, queue) = self.pool();
        let mut managers = self.managers.clone();
        for m in managers.iter_mut().filter(|m| m.name == self.manager) {
            match edit {
                Edit::Instances(n) => m.instances = n,
                Edit::Pool(kind) => {
                    m.workers = Some(Pool {
                        kind: kind.to_owned(),
                        size,
                        queue,
                    })
                }
            }
        }
        config_toml(&managers)
    }

    /// The size and queue of the probed manager's worker pool (2 and 256
    /// when it has none): a pool edit keeps them, so that only the kind differs.
    fn pool(&self) -> (usize, usize) {
        self.managers
            .iter()
            .find(|m| m.name == self.manager)
            .and_then(|m| m.workers.as_ref())
            .map_or((2, 256), |p| (p.size, p.queue))
    }

    /// `line` with `{manager}`, `{size}` and `{queue}` filled in.
    fn fill(&self, line: &str) -> String {
        let (size, queue) = self.pool();
        line.replace("{manager}", &self.manager)
            .replace("{size}", &size.to_string())
            .replace("{queue}", &queue.to_string())
    }
}

/// Starts the default group and asks it for `path`, a demo route that
/// answers with the `pid` of the process that served it; `None` when the
/// group has no such route.
fn probe_default_group(ctx: &Ctx, path: &str) -> anyhow::Result<Option<Found>> {
    eprintln!("suite: probing the default group for GET {path}");
    let mut group = Group::start(&ctx.switchyard, None)?;
    let (status, body) = ctx.runtime.block_on(get(group.server.addr(), path))?;
    if status == 404 {
        return Ok(None);
    }
    if status != 200 {
        bail!("GET {path} answered {status}: {}", String::from_utf8_lossy(&body));
    }
    let answer: serde_json::Value =
        serde_json::from_slice(&body).with_context(|| format!("GET {path} answered no JSON"))?;
    let pid = answer["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .with_context(|| format!("GET {path} answered no pid: {answer}"))?;
    let status = group.status()?;
    let manager = status
        .manager_of(pid)
        .with_context(|| format!("no manager of the group has pid {pid}"))?
        .to_owned();
    let managers = status.managers();
    group.server.stop()?;
    Ok(Some(Found { manager, managers }))
}

/// One GET: status and body.
async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, Bytes)> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: http::Uri = format!("http://{addr}{path}").parse()?;
    let patience = Duration::from_secs(10);
    let response = tokio::time::timeout(patience, client.get(uri))
        .await
        .with_context(|| format!("GET {path}: no answer in time"))??;
    let status = response.status().as_u16();
    let body = tokio::time::timeout(patience, response.into_body().collect())
        .await
        .with_context(|| format!("GET {path}: body not in time"))??
        .to_bytes();
    Ok((status, body))
}

/// A server a scenario measures.
enum Contender {
    Group {
        label: &'static str,
        config: Option<String>,
        /// WebSocket subscribers opened after start that never read.
        stalled: usize,
        /// Load generator flags for this contender alone (`--http3`),
        /// after the load's own.
        transport: &'static [&'static str],
    },
    /// `switchyard-baseline`, over TLS with this certificate and key.
    Baseline(Option<(PathBuf, PathBuf)>),
}

impl Contender {
    fn label(&self) -> &'static str {
        match self {
            Contender::Group { label, .. } => label,
            Contender::Baseline(_) => "baseline",
        }
    }

    /// The demo group and the baseline, both on HTTPS with `files`.
    fn tls_pair(files: &crate::tls::TestCertificates) -> [Contender; 2] {
        let config = format!(
            "[listener.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            files.cert.display(),
            files.key.display()
        );
        [
            Contender::Group {
                label: "Switchyard",
                config: Some(config),
                stalled: 0,
                transport: &[],
            },
            Contender::Baseline(Some((files.cert.clone(), files.key.clone()))),
        ]
    }

    fn start(&self, ctx: &Ctx) -> anyhow::Result<Running> {
        Ok(match self {
            Contender::Group { config, .. } => {
                Running::Group(Group::start(&ctx.switchyard, config.as_deref())?)
            }
            Contender::Baseline(tls) => {
                let mut command = std::process::Command::new(&ctx.baseline);
                command.args(["--bind", "127.0.0.1:0"]);
                if let Some((cert, key)) = tls {
                    command.arg("--tls-cert").arg(cert).arg("--tls-key").arg(key);
                }
                Running::Baseline(Server::start("switchyard-baseline", command, Readiness::Line)?)
            }
        })
    }
}

enum Running {
    Group(Group),
    Baseline(Server),
}

impl Running {
    fn server(&mut self) -> &mut Server {
        match self {
            Running::Group(group) => &mut group.server,
            Running::Baseline(server) => server,
        }
    }
}

/// Runs `loads` against both contenders `ctx.runs` times, each time on fresh
/// servers, alternating and flipping the order every round.
fn compare(
    ctx: &Ctx,
    scenario: &str,
    key_header: &str,
    contenders: [Contender; 2],
    loads: &[Load],
    extra: &[String],
) -> anyhow::Result<Comparison> {
    let mut rows: Vec<Row> = loads
        .iter()
        .flat_map(|load| load.rows)
        .map(|&(key, _)| Row {
            key: key.to_owned(),
            samples: [Vec::new(), Vec::new()],
        })
        .collect();
    for round in 0..ctx.runs {
        // Neither contender always runs on a warmer (or more tired) machine.
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let contender = &contenders[side];
            let mut running = contender.start(ctx)?;
            let url = running.server().url();
            let _stalled = match contender {
                Contender::Group { stalled, .. } if *stalled > 0 => ctx
                    .runtime
                    .block_on(stall_consumers(running.server().addr(), *stalled))?,
                _ => Vec::new(),
            };
            eprintln!(
                "suite: {scenario}: round {}/{}: {} on {url}",
                round + 1,
                ctx.runs,
                contender.label()
            );
            let mut row = 0;
            let mut flags = extra.to_vec();
            if let Contender::Group { transport, .. } = contender {
                flags.extend(transport.iter().map(|f| f.to_string()));
            }
            for load in loads {
                let concurrency: Vec<u32> = load.rows.iter().map(|&(_, c)| c).collect();
                let report = ctx
                    .runtime
                    .block_on(load::run(load_options(
                        &url,
                        load.route,
                        &concurrency,
                        ctx.duration,
                        load.transport,
                        &flags,
                    )?))
                    .with_context(|| format!("{} against {}", load.route, contender.label()))?;
                anyhow::ensure!(
                    report.steps.len() == concurrency.len(),
                    "the load generator ran {} steps, not {}",
                    report.steps.len(),
                    concurrency.len()
                );
                for step in &report.steps {
                    rows[row].samples[side].push(Sample::of(step));
                    row += 1;
                }
            }
            running.server().stop()?;
        }
    }
    Ok(Comparison {
        key_header: key_header.to_owned(),
        labels: contenders.map(|c| c.label().to_owned()),
        rows,
    })
}

/// The load generator's options, as its command line would give them.
fn load_options(
    url: &str,
    route: &str,
    concurrency: &[u32],
    duration: Duration,
    transport: &[&str],
    extra: &[String],
) -> anyhow::Result<load::Options> {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        options: load::Options,
    }
    let route = format!("GET {route}");
    let concurrency = concurrency
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let duration = duration.as_secs_f64().to_string();
    // Thresholds out of reach: break detection is not what the suite reports.
    let mut argv = vec![
        "switchyard-load",
        url,
        "-r",
        &route,
        "-c",
        &concurrency,
        "-d",
        &duration,
        "--warmup",
        WARMUP_S,
        "--max-p99-ms",
        "1e9",
        "--max-error-rate",
        "1",
    ];
    argv.extend_from_slice(transport);
    argv.extend(extra.iter().map(String::as_str));
    Ok(Cli::try_parse_from(argv)
        .map_err(|err| anyhow::anyhow!("bad load options: {err}"))?
        .options)
}

/// "Targets (the middleware chain), req/s ratio: ≥ 0.30 at 1: met (0.47); ..." for the
/// rows named in `targets`.
fn targets(c: &Comparison, source: &str, targets: &[(&str, f64)]) -> String {
    let verdicts: Vec<String> = targets
        .iter()
        .filter_map(|&(key, target)| {
            let row = c.rows.iter().find(|r| r.key == key)?;
            let [a, b] = row
                .samples
                .each_ref()
                .map(|s| median(&s.iter().map(|s| s.rps).collect::<Vec<_>>()));
            let r = ratio(a?, b?)?;
            let verdict = if r >= target {
                "met".to_owned()
            } else {
                format!("missed by {:.2}", target - r)
            };
            Some(format!("≥ {target:.2} at {key}: {verdict} ({r:.2})"))
        })
        .collect();
    if verdicts.is_empty() {
        String::new()
    } else {
        format!("Targets ({source}), req/s ratio: {}.\n", verdicts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, a: f64, b: f64) -> Row {
        let sample = |rps| Sample {
            rps,
            ..Sample::default()
        };
        Row {
            key: key.to_owned(),
            samples: [vec![sample(a)], vec![sample(b)]],
        }
    }

    #[test]
    fn target_verdicts() {
        let c = Comparison {
            key_header: "clients".to_owned(),
            labels: ["Switchyard".to_owned(), "baseline".to_owned()],
            rows: vec![row("1", 47.0, 100.0), row("8", 30.0, 100.0), row("32", 1.0, 0.0)],
        };
        assert_eq!(
            targets(
                &c,
                "raw routing",
                &[("1", 0.3), ("8", 0.5), ("32", 0.5), ("64", 0.5)]
            ),
            "Targets (raw routing), req/s ratio: ≥ 0.30 at 1: met (0.47); ≥ 0.50 at 8: missed by 0.20 (0.30).\n"
        );
        assert_eq!(targets(&c, "raw routing", &[("64", 0.5)]), "");
    }

    /// Every scenario the command line offers has its code, and the table
    /// is sound: row keys unique within a scenario, every target on a row.
    #[test]
    fn the_table_covers_every_scenario() {
        for name in super::super::SCENARIOS {
            assert!(
                comparison(name).is_some() || matches!(name, "routing" | "middleware" | "http3"),
                "{name} runs nothing"
            );
        }
        for s in COMPARISONS {
            assert!(
                super::super::SCENARIOS.contains(&s.name),
                "{} is not offered",
                s.name
            );
            let keys: Vec<&str> = s.loads.iter().flat_map(|l| l.rows).map(|&(k, _)| k).collect();
            for (i, key) in keys.iter().enumerate() {
                assert!(!keys[..i].contains(key), "{}: row {key} twice", s.name);
            }
            for target in s.targets {
                let named = match *target {
                    Target::Ratio { at, .. } => at.iter().map(|&(k, _)| k).collect(),
                    Target::RoundTrips(key) => vec![key],
                };
                for key in named {
                    assert!(keys.contains(&key), "{}: a target on no row: {key}", s.name);
                }
            }
        }
    }

    #[test]
    fn variants_edit_and_name_the_probed_manager() {
        let entry = |name: &str, workers: Option<Pool>| ManagerEntry {
            name: name.to_owned(),
            instances: 1,
            workers,
        };
        let pool = Pool {
            kind: "process".to_owned(),
            size: 3,
            queue: 64,
        };
        let found = |manager: &str| Found {
            manager: manager.to_owned(),
            managers: vec![entry("basics", None), entry("compute", Some(pool.clone()))],
        };
        let compute = found("compute");
        assert_eq!(
            compute.fill("`{manager}`: {size} vs {size} (queue {queue}), {\"id\"}"),
            "`compute`: 3 vs 3 (queue 64), {\"id\"}"
        );
        let threads = compute.config_with(Edit::Pool("thread")).unwrap();
        assert!(
            threads.contains("name = \"compute\"\ninstances = 1\n\n[managers.workers]\nkind = \"thread\"\nsize = 3\nqueue = 64\n"),
            "{threads}"
        );
        let two = compute.config_with(Edit::Instances(2)).unwrap();
        assert!(two.contains("name = \"basics\"\ninstances = 1\n"), "{two}");
        assert!(two.contains("name = \"compute\"\ninstances = 2\n"), "{two}");
        // A manager without a pool gets the default shape.
        assert_eq!(found("basics").pool(), (2, 256));
    }

    #[test]
    fn load_options_parse() {
        let o = load_options(
            "http://127.0.0.1:1",
            "/noop",
            &[1, 8],
            Duration::from_millis(2500),
            &["--ws"],
            &[],
        )
        .unwrap();
        assert_eq!(o.routes, [load::Route::get("/noop")]);
        assert_eq!(o.concurrency, [1, 8]);
        assert_eq!(o.duration, Duration::from_millis(2500));
        assert_eq!(o.warmup, Duration::from_secs(1));
        assert!(o.ws);
    }
}
