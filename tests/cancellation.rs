//! Deadlines and cancellation reach the work: a gRPC call's `grpc-timeout`
//! is its deadline (DEADLINE_EXCEEDED at it, the handler dropped); a gRPC
//! client that resets its calls, and an HTTP client that hangs up, stop the
//! jobs they started (queued ones leave the queue, running ones have their
//! worker process stopped), on the zero-config demo group. Every wait is
//! on an event (a reply, a log line, a process gone), bounded by PATIENCE.

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::raw_codec::Raw;
use common::*;
use switchyard_listener::api::proto::field_numbers;
use tonic::Code;
use tonic::transport::Channel;

/// `{ms: N}` as the typed message of `demo.Sleep` and `demo.Cpu` (one
/// field, numbered by its name: decision 0064).
fn ms_message(ms: u64) -> Bytes {
    let number = field_numbers(["ms"])["ms"];
    let mut out = Vec::new();
    let varint = |mut v: u64, out: &mut Vec<u8>| {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    };
    varint(u64::from(number) << 3, &mut out);
    varint(ms, &mut out);
    Bytes::from(out)
}

/// The demo group, with the worker pools' and manager hosts' debug lines
/// (each cancelled job and handler says so).
fn group(tag: &'static str) -> Group {
    Group::builder(tag)
        .env(
            "SWITCHYARD_LOG",
            "info,switchyard_worker=debug,switchyard_manager_host=debug",
        )
        .start()
}

async fn channel(g: &Group) -> Channel {
    Channel::from_shared(format!("http://{}", g.addr))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

/// One typed unary call; `timeout` is sent as `grpc-timeout`.
async fn typed_call(
    channel: Channel,
    path: &'static str,
    message: Bytes,
    grpc_timeout: Option<&str>,
) -> Result<Bytes, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let mut request = tonic::Request::new(message);
    if let Some(value) = grpc_timeout {
        request
            .metadata_mut()
            .insert("grpc-timeout", value.parse().unwrap());
    }
    let path = http::uri::PathAndQuery::from_static(path);
    grpc.unary(request, path, Raw)
        .await
        .map(tonic::Response::into_inner)
}

/// CPU time (user + system, in clock ticks) a process has used; `None`
/// once it is gone. With `children`, that of its reaped children too.
fn cpu_ticks(pid: u32, children: bool) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which may hold spaces: state is 3rd.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<u64>().ok());
    let own = field(14)? + field(15)?;
    Some(if children {
        own + field(16)? + field(17)?
    } else {
        own
    })
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).unwrap_or(100)
}

/// The pids of the compute manager's worker processes.
fn workers(g: &Group) -> Vec<u32> {
    g.status()["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["role"] == "worker" && p["name"] == "compute" && p["state"] == "running")
        .filter_map(|p| p["pid"].as_u64().map(|pid| pid as u32))
        .collect()
}

/// CPU burned so far by every worker the group ever ran: the live ones
/// plus what the supervisor reaped of the killed ones (nothing else of
/// this group exits while it runs).
fn worker_cpu(g: &Group) -> u64 {
    let live: u64 = workers(g).iter().filter_map(|&pid| cpu_ticks(pid, false)).sum();
    let own = cpu_ticks(g.supervisor_pid(), false).unwrap();
    let with_reaped = cpu_ticks(g.supervisor_pid(), true).unwrap();
    live + (with_reaped - own)
}

/// Waits until every worker in `pids` has burned some CPU since `base`:
/// the jobs are running, not merely sent.
fn wait_until_burning(pids: &[u32], base: &[u64]) {
    eventually("the jobs are running in the workers", PATIENCE, || {
        let now: Vec<Option<u64>> = pids.iter().map(|&pid| cpu_ticks(pid, false)).collect();
        let burning = now
            .iter()
            .zip(base)
            .all(|(now, base)| now.is_some_and(|n| n >= base + 5));
        if burning { Ok(()) } else { Err(now) }
    });
}

fn count(g: &Group, needles: &[&str]) -> usize {
    needles.iter().map(|n| g.lines_with(n).len()).sum()
}

/// How the group says a worker job was given up: taken from the queue,
/// or its worker stopped.
const JOB_CANCELLED: [&str; 2] = ["job cancelled while queued", "job cancelled; killing its worker"];

/// One unary gRPC call over a bare h2 connection, with `grpc-timeout`
/// sent as given: a tonic client would enforce the deadline itself and
/// answer CANCELLED on its own, hiding what the server does. The
/// `grpc-status` and `grpc-message` of the answer.
async fn raw_call(g: &Group, path: &str, message: Bytes, grpc_timeout: &str) -> (u32, String) {
    use http_body_util::BodyExt;
    let tcp = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut framed = vec![0u8];
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    let request = http::Request::post(format!("http://{}{path}", g.addr))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .header("grpc-timeout", grpc_timeout)
        .body(http_body_util::Full::new(Bytes::from(framed)))
        .unwrap();
    let answer = tokio::time::timeout(PATIENCE, async {
        let (parts, body) = send.send_request(request).await.unwrap().into_parts();
        let trailers = body
            .collect()
            .await
            .unwrap()
            .trailers()
            .cloned()
            .unwrap_or_default();
        // A trailers-only answer has them in its headers.
        let field = |name: &str| {
            trailers
                .get(name)
                .or_else(|| parts.headers.get(name))
                .map(|v| v.to_str().unwrap().to_owned())
        };
        let status = field("grpc-status").expect("a grpc-status").parse().unwrap();
        (status, field("grpc-message").unwrap_or_default())
    });
    answer.await.expect("answered")
}

const DEADLINE_EXCEEDED: u32 = Code::DeadlineExceeded as u32;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_timeout_is_the_calls_deadline() {
    let mut g = group("cancel-deadline");
    const SLEEP: &str = "/demo.v1.PayloadService/Sleep";

    // The issue's call: a 4 s sleep under a 100 ms deadline.
    let started = Instant::now();
    let (status, message) = raw_call(&g, SLEEP, ms_message(4_000), "100m").await;
    let took = started.elapsed();
    assert_eq!(status, DEADLINE_EXCEEDED, "{message}");
    assert!(
        took < Duration::from_secs(4),
        "answered at the deadline, not when the handler would have finished: {took:?}"
    );
    // The handler was dropped at the deadline, and the job it awaited given
    // up (a thread job runs on, its result dropped).
    g.wait_line("request cancelled; dropping its handler");
    g.wait_line("job cancelled");

    // The same through the generic service: the header tightens the
    // call's own `deadline_ms`.
    let call = switchyard_client::proto::CallRequest {
        r#type: "demo.Sleep".into(),
        content_type: "application/json".into(),
        payload: br#"{"ms":4000}"#.to_vec().into(),
        deadline_ms: 20_000,
    };
    let (status, message) = raw_call(
        &g,
        "/switchyard.v1.Events/Call",
        Bytes::from(prost::Message::encode_to_vec(&call)),
        "100m",
    )
    .await;
    assert_eq!(status, DEADLINE_EXCEEDED, "{message}");

    // A looser deadline: the call is served.
    let (status, message) = raw_call(&g, SLEEP, ms_message(1), "20S").await;
    assert_eq!(status, Code::Ok as u32, "{message}");

    // A malformed deadline is the client's error, named.
    for bad in ["1.5S", "100", "123456789m", "5x"] {
        let (status, message) = raw_call(&g, SLEEP, ms_message(1), bad).await;
        assert_eq!(status, Code::InvalidArgument as u32, "{bad}: {message}");
        assert!(message.contains("grpc-timeout"), "{bad}: {message}");
    }
    // ...and the group serves on.
    assert_eq!(get(g.addr, "/health").unwrap().status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_the_client_resets_stop_their_jobs() {
    let g = group("cancel-grpc");
    let ch = channel(&g).await;
    let pids = eventually("two compute workers", PATIENCE, || {
        let pids = workers(&g);
        if pids.len() == 2 { Ok(pids) } else { Err(pids) }
    });
    let base: Vec<u64> = pids.iter().map(|&pid| cpu_ticks(pid, false).unwrap()).collect();
    let before = worker_cpu(&g);

    // Four calls of 3 s of CPU each on two workers: two run, two queue.
    const CALLS: usize = 4;
    const CPU_MS: u64 = 3_000;
    let calls: Vec<_> = (0..CALLS)
        .map(|_| {
            tokio::spawn(typed_call(
                ch.clone(),
                "/demo.v1.Compute/Cpu",
                ms_message(CPU_MS),
                None,
            ))
        })
        .collect();
    wait_until_burning(&pids, &base);
    // The client gives up: each call's stream is reset (RST_STREAM).
    for call in &calls {
        call.abort();
    }
    for call in calls {
        assert!(call.await.unwrap_err().is_cancelled());
    }

    eventually("every job is cancelled", PATIENCE, || {
        match count(&g, &JOB_CANCELLED) {
            CALLS => Ok(()),
            n => Err(n),
        }
    });
    // The workers that ran them were stopped (and are replaced).
    for pid in &pids {
        eventually("the worker running a cancelled job is gone", PATIENCE, || {
            if alive(*pid) { Err(pid) } else { Ok(()) }
        });
    }
    // Far less CPU than finishing them would have cost (12 s).
    let burned_ms = (worker_cpu(&g) - before) * 1000 / ticks_per_second();
    assert!(
        burned_ms < CALLS as u64 * CPU_MS / 2,
        "the workers burned {burned_ms} ms of CPU for {CALLS} cancelled calls"
    );
    assert!(
        !g.has_line("plugin answered an unknown request"),
        "a cancel never turns into an error line"
    );

    // The pool serves on with its replacements.
    let served = tokio::time::timeout(
        PATIENCE,
        typed_call(ch.clone(), "/demo.v1.Compute/Cpu", ms_message(1), None),
    )
    .await
    .expect("answered");
    assert!(served.is_ok(), "{served:?}");
}

#[test]
fn an_http_client_that_hangs_up_stops_its_job() {
    let g = group("cancel-http");
    let pids = eventually("two compute workers", PATIENCE, || {
        let pids = workers(&g);
        if pids.len() == 2 { Ok(pids) } else { Err(pids) }
    });
    let base: Vec<u64> = pids.iter().map(|&pid| cpu_ticks(pid, false).unwrap()).collect();

    // HTTP/1.1, one connection per request; both workers busy.
    let mut clients: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(g.addr).unwrap();
            s.write_all(b"GET /cpu/20000 HTTP/1.1\r\nhost: x\r\n\r\n")
                .unwrap();
            s
        })
        .collect();
    wait_until_burning(&pids, &base);
    // Both clients hang up before their answer.
    for s in clients.drain(..) {
        s.shutdown(std::net::Shutdown::Both).unwrap();
    }

    eventually("both jobs are cancelled", PATIENCE, || {
        match count(&g, &JOB_CANCELLED) {
            2 => Ok(()),
            n => Err(n),
        }
    });
    for pid in &pids {
        eventually("the worker running a cancelled job is gone", PATIENCE, || {
            if alive(*pid) { Err(pid) } else { Ok(()) }
        });
    }

    // A client that waits is served as ever.
    let mut s = std::net::TcpStream::connect(g.addr).unwrap();
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    s.write_all(b"GET /cpu/1 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer).unwrap();
    let answer = parse_response(&answer).unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// A WebSocket client that sends requests and goes away before their
/// answers: its requests are dropped, and so cancelled through the group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_websocket_client_that_leaves_stops_its_jobs() {
    use futures_util::SinkExt;
    use tokio_tungstenite::tungstenite::Message;

    let g = group("cancel-ws");
    let pids = eventually("two compute workers", PATIENCE, || {
        let pids = workers(&g);
        if pids.len() == 2 { Ok(pids) } else { Err(pids) }
    });
    let base: Vec<u64> = pids.iter().map(|&pid| cpu_ticks(pid, false).unwrap()).collect();

    let (mut ws, _) = tokio::time::timeout(
        PATIENCE,
        tokio_tungstenite::connect_async(format!("ws://{}/ws", g.addr)),
    )
    .await
    .expect("in time")
    .expect("a WebSocket session");
    for id in 0..2 {
        let call = serde_json::json!({ "id": id, "type": "demo.Cpu", "data": { "ms": 20000 } });
        ws.send(Message::text(call.to_string())).await.unwrap();
    }
    tokio::task::spawn_blocking({
        let pids = pids.clone();
        move || wait_until_burning(&pids, &base)
    })
    .await
    .unwrap();
    // The client leaves without a word: the connection is simply gone.
    drop(ws);

    tokio::task::spawn_blocking(move || {
        eventually("both jobs are cancelled", PATIENCE, || {
            match count(&g, &JOB_CANCELLED) {
                2 => Ok(()),
                n => Err(n),
            }
        });
        for pid in &pids {
            eventually("the worker running a cancelled job is gone", PATIENCE, || {
                if alive(*pid) { Err(pid) } else { Ok(()) }
            });
        }
    })
    .await
    .unwrap();
}
