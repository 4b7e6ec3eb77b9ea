//! The scenarios: what each starts, what load it drives, and the section of
//! output it produces.

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
use super::server::{Group, ManagerEntry, Pool, Server, check_config, config_toml};
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
    !matches!(name, "routing" | "middleware")
}

pub(crate) fn run(name: &str, ctx: &Ctx) -> anyhow::Result<Outcome> {
    match name {
        "rest" => rest(ctx),
        "payload" => payload(ctx),
        "routing" => routing(ctx),
        "managers" => managers(ctx),
        "workers" => workers(ctx),
        "middleware" => Ok(Outcome::Skipped("middleware has not landed".to_owned())),
        "slow" => slow(ctx),
        "ws" => ws(ctx),
        "grpc" => grpc(ctx),
        "listener-workers" => listener_workers(ctx),
        other => bail!("no scenario {other}"),
    }
}

fn rest(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let load = Load {
        route: "/noop".to_owned(),
        rows: [1, 8, 32].map(|c| (c.to_string(), c)).to_vec(),
        transport: &[],
    };
    let comparison = compare(
        ctx,
        "rest",
        "clients",
        [Contender::default_group(), Contender::Baseline],
        &[load],
    )?;
    let mut body = String::new();
    let _ = writeln!(
        body,
        "- Switchyard: `switchyard up` with no configuration (the demo group)"
    );
    let _ = writeln!(
        body,
        "- baseline: `switchyard-baseline`, the same route in-process\n"
    );
    body.push_str(&render_comparison(&comparison));
    body.push_str(&targets(
        &comparison,
        "issue #7",
        &[("1", 0.3), ("8", 0.5), ("32", 0.5)],
    ));
    Ok(Outcome::Done {
        title: "rest: GET /noop".to_owned(),
        body,
    })
}

fn payload(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let loads = [(1024, "1 KiB"), (102_400, "100 KiB"), (1_048_576, "1 MiB")].map(|(size, key)| Load {
        route: format!("/payload/{size}"),
        rows: vec![(key.to_owned(), 8)],
        transport: &[],
    });
    let comparison = compare(
        ctx,
        "payload",
        "body, 8 clients",
        [Contender::default_group(), Contender::Baseline],
        &loads,
    )?;
    let mut body = String::new();
    let _ = writeln!(
        body,
        "- GET /payload/1024, /payload/102400, /payload/1048576, one load run each"
    );
    let _ = writeln!(
        body,
        "- Switchyard: `switchyard up` with no configuration (the demo group)"
    );
    let _ = writeln!(
        body,
        "- baseline: `switchyard-baseline`, the same route in-process\n"
    );
    body.push_str(&render_comparison(&comparison));
    body.push_str(&targets(&comparison, "issues #4 and #7", &[("1 MiB", 0.67)]));
    Ok(Outcome::Done {
        title: "payload: GET /payload/{size}".to_owned(),
        body,
    })
}

/// Round trips per second the event transports must reach at 32 clients
/// (issue #5).
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
        "Target (issue #5) ≥ {TRANSPORT_TARGET_RPS:.0} round trips/s at {key}: {verdict} ({best:.0}/s).\n"
    )
}

fn ws(ctx: &Ctx) -> anyhow::Result<Outcome> {
    let load = Load {
        route: "/noop".to_owned(),
        rows: [1, 8, 32].map(|c| (c.to_string(), c)).to_vec(),
        transport: &["--ws"],
    };
    let comparison = compare(
        ctx,
        "ws",
        "clients",
        [Contender::default_group(), Contender::Baseline],
        &[load],
    )?;
    let mut body = String::from(
        "- WebSocket request/response: `demo.Noop` as `{\"id\",\"type\",\"data\"}` on `/ws`, one \
         connection per client, closed loop (switchyard-client)\n\
         - Switchyard: `switchyard up` with no configuration; baseline: `switchyard-baseline`, \
         which answers the same messages on its own `/ws` in-process\n\n",
    );
    body.push_str(&render_comparison(&comparison));
    body.push_str(&absolute_target(&comparison, "32"));
    Ok(Outcome::Done {
        title: "ws: WebSocket round trips".to_owned(),
        body,
    })
}

fn grpc(ctx: &Ctx) -> anyhow::Result<Outcome> {
    const UNARY: &[&str] = &["--grpc"];
    const BIDI: &[&str] = &["--grpc-bidi"];
    let loads = [("unary", UNARY), ("bidi", BIDI)].map(|(kind, transport)| Load {
        route: "/noop".to_owned(),
        rows: [1, 8, 32].map(|c| (format!("{kind} {c}"), c)).to_vec(),
        transport,
    });
    let comparison = compare(
        ctx,
        "grpc",
        "call, clients",
        [Contender::default_group(), Contender::Baseline],
        &loads,
    )?;
    let mut body = String::from(
        "- `switchyard.v1.Events`: unary `Call` (one HTTP/2 stream per call) and bidi `Session` \
         (calls on one stream per client), `demo.Noop`, one channel per client, closed loop \
         (switchyard-client)\n\
         - Switchyard: `switchyard up` with no configuration; baseline: `switchyard-baseline`, \
         the same service answered in-process by tonic\n\n",
    );
    body.push_str(&render_comparison(&comparison));
    body.push_str(&targets(
        &comparison,
        "issue #5, within 1.5× of in-process tonic",
        &[("unary 32", 1.0 / 1.5), ("bidi 32", 1.0 / 1.5)],
    ));
    body.push_str(&absolute_target(&comparison, "unary 32"));
    body.push_str(&absolute_target(&comparison, "bidi 32"));
    Ok(Outcome::Done {
        title: "grpc: gRPC round trips".to_owned(),
        body,
    })
}

/// Subscribers that never read, in the `slow` scenario.
const STALLED_CONSUMERS: usize = 4;

fn slow(ctx: &Ctx) -> anyhow::Result<Outcome> {
    // A fast ticker with padding, so that a consumer that does not read
    // fills its queue within the run.
    let config = "[[managers]]\nname = \"basics\"\n\n[[managers]]\nname = \"ticker\"\n\
                  [managers.config]\ninterval_ms = 2\npad_bytes = 4096\n";
    let load = Load {
        route: "/noop".to_owned(),
        rows: [8, 32].map(|c| (c.to_string(), c)).to_vec(),
        transport: &[],
    };
    let stalled = Contender::Group {
        label: format!("{STALLED_CONSUMERS} stalled subscribers"),
        config: Some(config.to_owned()),
        stalled: STALLED_CONSUMERS,
    };
    let calm = Contender::Group {
        label: "none".to_owned(),
        config: Some(config.to_owned()),
        stalled: 0,
    };
    let comparison = compare(ctx, "slow", "clients", [stalled, calm], &[load])?;
    let mut body = format!(
        "- GET /noop from normal clients while {STALLED_CONSUMERS} WebSocket clients subscribed to \
         `demo.tick` (every 2 ms, 4 KiB each) never read (4 KiB receive buffers), against the \
         same group without them; a stalled client is dropped once its queue is full \
         (`listener.ws.queue`), so the first second carries the cost\n\n"
    );
    body.push_str(&render_comparison(&comparison));
    Ok(Outcome::Done {
        title: "slow: latency next to consumers that do not drain".to_owned(),
        body,
    })
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
        "- compared with the target of issue #7, ≥ {TARGET_ROUND_TRIPS:.0} round trips/s (the \
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
            "\nTarget (issue #7) ≥ {TARGET_ROUND_TRIPS:.0} round trips/s: {verdict} (best median: \
             {best:.0}/s with {window} outstanding)."
        );
    }
    Ok(Outcome::Done {
        title: "routing: router round trips, no HTTP".to_owned(),
        body,
    })
}

fn managers(ctx: &Ctx) -> anyhow::Result<Outcome> {
    const PROBE: &str = "/cpu-inline/0";
    let Some(found) = probe(ctx, PROBE)? else {
        return Ok(not_available("GET /cpu-inline/{ms}"));
    };
    let with_instances = |n: u32| found.config_with(|m| m.instances = n);
    let variants = [
        ("instances = 2", with_instances(2)?),
        ("instances = 1", with_instances(1)?),
    ];
    let comparison = match compare_variants(ctx, "managers", "/cpu-inline/2", variants)? {
        Ok(comparison) => comparison,
        Err(message) => {
            return Ok(Outcome::Skipped(format!(
                "this build refuses manager instances: {message}"
            )));
        }
    };
    let mut body = String::new();
    let _ = writeln!(
        body,
        "- GET /cpu-inline/2: 2 ms of CPU in the manager process itself, served by `{}`",
        found.manager
    );
    let _ = writeln!(
        body,
        "- both contenders are Switchyard groups with the default group's managers (read from \
         `switchyard status`), `{}` at 2 instances vs 1; no baseline (the in-process baseline \
         does not serve /cpu-inline)\n",
        found.manager
    );
    body.push_str(&render_comparison(&comparison));
    Ok(Outcome::Done {
        title: "managers: CPU inline, 1 vs 2 instances".to_owned(),
        body,
    })
}

fn workers(ctx: &Ctx) -> anyhow::Result<Outcome> {
    const PROBE: &str = "/cpu/0";
    let Some(found) = probe(ctx, PROBE)? else {
        return Ok(not_available("GET /cpu/{ms}"));
    };
    let pool = found
        .managers
        .iter()
        .find(|m| m.name == found.manager)
        .and_then(|m| m.workers.clone());
    // The same size for both kinds, so that only the kind differs.
    let (size, queue) = pool.map_or((2, 256), |p| (p.size, p.queue));
    let with_pool = |kind: &str| {
        found.config_with(|m| {
            m.workers = Some(Pool {
                kind: kind.to_owned(),
                size,
                queue,
            })
        })
    };
    let variants = [
        ("process pool", with_pool("process")?),
        ("thread pool", with_pool("thread")?),
    ];
    let comparison = match compare_variants(ctx, "workers", "/cpu/2", variants)? {
        Ok(comparison) => comparison,
        Err(message) => {
            return Ok(Outcome::Skipped(format!(
                "this build has no `[managers.workers]` kind and size: {message}"
            )));
        }
    };
    let mut body = String::new();
    let _ = writeln!(
        body,
        "- GET /cpu/2: a job of 2 ms of CPU in `{}`'s worker pool",
        found.manager
    );
    let _ = writeln!(
        body,
        "- both contenders are Switchyard groups with the default group's managers (read from \
         `switchyard status`), `{}` with {size} worker processes vs {size} worker threads \
         (queue {queue}); no baseline (the in-process baseline does not serve /cpu)\n",
        found.manager
    );
    body.push_str(&render_comparison(&comparison));
    Ok(Outcome::Done {
        title: "workers: thread vs process pool".to_owned(),
        body,
    })
}

fn listener_workers(ctx: &Ctx) -> anyhow::Result<Outcome> {
    // The key decides: once `switchyard check` takes it, the feature is there.
    let (two, one) = (
        "[listener]\nworkers = 2\n".to_owned(),
        "[listener]\nworkers = 1\n".to_owned(),
    );
    if let Err(message) = check_config(&ctx.switchyard, &two)? {
        return Ok(Outcome::Skipped(format!(
            "listener.workers has not landed: {message}"
        )));
    }
    let load = Load {
        route: "/noop".to_owned(),
        rows: vec![("8".to_owned(), 8), ("32".to_owned(), 32)],
        transport: &[],
    };
    let comparison = compare(
        ctx,
        "listener-workers",
        "clients",
        [
            Contender::group("2 listener processes", two),
            Contender::group("1 listener process", one),
        ],
        &[load],
    )?;
    let mut body = String::from(
        "- GET /noop; both contenders are the demo group, with `listener.workers` 2 vs 1 \
         (each listener process with one runtime thread per core); no baseline\n\n",
    );
    body.push_str(&render_comparison(&comparison));
    Ok(Outcome::Done {
        title: "listener-workers: 1 vs 2 listener processes".to_owned(),
        body,
    })
}

/// Two configurations of the default group's managers under GET `route`
/// at 32 clients; `Err` with `switchyard check`'s message when this build
/// refuses either configuration.
fn compare_variants(
    ctx: &Ctx,
    scenario: &str,
    route: &str,
    variants: [(&str, String); 2],
) -> anyhow::Result<Result<Comparison, String>> {
    for (_, config) in &variants {
        if let Err(message) = check_config(&ctx.switchyard, config)? {
            return Ok(Err(message));
        }
    }
    let load = Load {
        route: route.to_owned(),
        rows: vec![("32".to_owned(), 32)],
        transport: &[],
    };
    let contenders = variants.map(|(label, config)| Contender::group(label, config));
    compare(ctx, scenario, "clients", contenders, &[load]).map(Ok)
}

fn not_available(route: &str) -> Outcome {
    Outcome::Skipped(format!(
        "not available in this build (the default group does not serve {route})"
    ))
}

/// What a probe of the default group found: the manager that answered, and
/// every manager of the group.
struct Found {
    manager: String,
    managers: Vec<ManagerEntry>,
}

impl Found {
    /// The default group's configuration with the probed manager changed by `edit`.
    fn config_with(&self, edit: impl Fn(&mut ManagerEntry)) -> anyhow::Result<String> {
        let mut managers = self.managers.clone();
        managers
            .iter_mut()
            .filter(|m| m.name == self.manager)
            .for_each(edit);
        config_toml(&managers)
    }
}

/// Starts the default group and asks it for `path`, a demo route that
/// answers with the `pid` of the process that served it; `None` when the
/// group has no such route.
fn probe(ctx: &Ctx, path: &str) -> anyhow::Result<Option<Found>> {
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
        label: String,
        config: Option<String>,
        /// WebSocket subscribers opened after start that never read.
        stalled: usize,
    },
    Baseline,
}

impl Contender {
    fn default_group() -> Contender {
        Contender::Group {
            label: "Switchyard".to_owned(),
            config: None,
            stalled: 0,
        }
    }

    fn group(label: &str, config: String) -> Contender {
        Contender::Group {
            label: label.to_owned(),
            config: Some(config),
            stalled: 0,
        }
    }

    fn label(&self) -> &str {
        match self {
            Contender::Group { label, .. } => label,
            Contender::Baseline => "baseline",
        }
    }

    fn start(&self, ctx: &Ctx) -> anyhow::Result<Running> {
        Ok(match self {
            Contender::Group { config, .. } => {
                Running::Group(Group::start(&ctx.switchyard, config.as_deref())?)
            }
            Contender::Baseline => {
                let mut command = std::process::Command::new(&ctx.baseline);
                command.args(["--bind", "127.0.0.1:0"]);
                Running::Baseline(Server::start("switchyard-baseline", command)?)
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

/// One load run per server start: a route and its concurrency steps, each
/// step a row keyed as given.
struct Load {
    route: String,
    rows: Vec<(String, u32)>,
    /// Transport flags of the load generator (`--ws`, `--grpc`, ...).
    transport: &'static [&'static str],
}

/// Runs `loads` against both contenders `ctx.runs` times, each time on fresh
/// servers, alternating and flipping the order every round.
fn compare(
    ctx: &Ctx,
    scenario: &str,
    key_header: &str,
    contenders: [Contender; 2],
    loads: &[Load],
) -> anyhow::Result<Comparison> {
    let mut rows: Vec<Row> = loads
        .iter()
        .flat_map(|load| &load.rows)
        .map(|(key, _)| Row {
            key: key.clone(),
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
            for load in loads {
                let concurrency: Vec<u32> = load.rows.iter().map(|&(_, c)| c).collect();
                let report = ctx
                    .runtime
                    .block_on(load::run(load_options(
                        &url,
                        &load.route,
                        &concurrency,
                        ctx.duration,
                        load.transport,
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
    Ok(Cli::try_parse_from(argv)
        .map_err(|err| anyhow::anyhow!("bad load options: {err}"))?
        .options)
}

/// "Targets (issue #7), req/s ratio: ≥ 0.30 at 1: met (0.47); ..." for the
/// rows named in `targets`.
fn targets(c: &Comparison, issue: &str, targets: &[(&str, f64)]) -> String {
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
        format!("Targets ({issue}), req/s ratio: {}.\n", verdicts.join("; "))
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
                "issue #7",
                &[("1", 0.3), ("8", 0.5), ("32", 0.5), ("64", 0.5)]
            ),
            "Targets (issue #7), req/s ratio: ≥ 0.30 at 1: met (0.47); ≥ 0.50 at 8: missed by 0.20 (0.30).\n"
        );
        assert_eq!(targets(&c, "issue #7", &[("64", 0.5)]), "");
    }

    #[test]
    fn load_options_parse() {
        let o = load_options(
            "http://127.0.0.1:1",
            "/noop",
            &[1, 8],
            Duration::from_millis(2500),
            &["--ws"],
        )
        .unwrap();
        assert_eq!(o.routes, [load::Route::get("/noop")]);
        assert_eq!(o.concurrency, [1, 8]);
        assert_eq!(o.duration, Duration::from_millis(2500));
        assert_eq!(o.warmup, Duration::from_secs(1));
        assert!(o.ws);
    }
}
