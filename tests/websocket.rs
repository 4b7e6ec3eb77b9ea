//! WebSocket against a real group: `/ws` requests (many in flight on one
//! connection), subscriptions with prefixes and filters, pushes from the
//! `ticker` manager, limits and close codes, slow-consumer isolation, and
//! the `/ws/echo` route. Every wait is on a message or a log line, bounded
//! by PATIENCE; assertions are on counts, never on elapsed time.

mod common;

use std::collections::{HashMap, HashSet};

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_client::{Client, ClientError, Push, Subscription};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

type Raw = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn config(interval_ms: u64, pad_bytes: usize) -> String {
    format!(
        "[[managers]]\nname = \"basics\"\n\n[[managers]]\nname = \"ticker\"\n\
         [managers.config]\ninterval_ms = {interval_ms}\npad_bytes = {pad_bytes}\n"
    )
}

fn group(tag: &'static str) -> Group {
    Group::builder(tag).config(&config(20, 0)).start()
}

fn url(g: &Group, path: &str) -> String {
    format!("ws://{}{path}", g.addr)
}

async fn raw(g: &Group, path: &str) -> Raw {
    tokio_tungstenite::connect_async(url(g, path)).await.unwrap().0
}

/// The next text message as JSON, within PATIENCE.
async fn next_json(ws: &mut Raw) -> Value {
    loop {
        match tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("a message in time")
        {
            Some(Ok(Message::Text(t))) => return serde_json::from_str(t.as_str()).unwrap(),
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
            other => panic!("expected a text message, got {other:?}"),
        }
    }
}

async fn send(ws: &mut Raw, v: Value) {
    ws.send(Message::text(v.to_string())).await.unwrap();
}

/// The next push of a subscription, within PATIENCE.
async fn next_push(sub: &mut Subscription) -> Push {
    tokio::time::timeout(PATIENCE, sub.next())
        .await
        .expect("a push in time")
        .expect("the subscription goes on")
}

fn tick_n(v: &Value) -> u64 {
    v["n"].as_u64().expect("a tick has n")
}

#[tokio::test]
async fn many_requests_in_flight_on_one_connection_are_correlated() {
    let g = group("ws-calls");
    let mut ws = raw(&g, "/ws").await;
    // 200 requests sent before any answer is read, answers in any order.
    for i in 0..200 {
        let ty = if i % 10 == 9 { "demo.Nope" } else { "demo.Hello" };
        send(
            &mut ws,
            json!({"id": format!("c{i}"), "type": ty, "data": {"name": format!("n{i}")}}),
        )
        .await;
    }
    let mut seen = HashSet::new();
    for _ in 0..200 {
        let m = next_json(&mut ws).await;
        let id = m["id"].as_str().unwrap().to_owned();
        let i: usize = id[1..].parse().unwrap();
        if i % 10 == 9 {
            // No manager declares it: 404 naming the type, not a 503 that
            // sends the client waiting for a manager that will never come.
            assert_eq!(m["status"], 404, "{m}");
            assert_eq!(m["error"]["detail"], "no manager declares event type `demo.Nope`");
        } else {
            assert_eq!(m["status"], 200, "{m}");
            assert_eq!(m["data"]["message"], format!("Hello, n{i}!"));
        }
        assert!(seen.insert(id), "one answer per request");
    }
    // Validation errors come back as 422 problems.
    send(
        &mut ws,
        json!({"id": 7, "type": "demo.Hello", "data": {"name": ""}}),
    )
    .await;
    let m = next_json(&mut ws).await;
    assert_eq!(
        (m["id"].clone(), m["status"].clone()),
        (json!(7), json!(422)),
        "{m}"
    );

    // The client crate: concurrent typed calls on one connection.
    let client = Client::connect(&url(&g, "/ws")).await.unwrap();
    let calls = (0..100).map(|i| {
        let c = client.clone();
        async move {
            let r: Value = c
                .call("demo.Hello", &json!({"name": format!("x{i}")}))
                .await
                .unwrap();
            assert_eq!(r["message"], format!("Hello, x{i}!"));
        }
    });
    futures_util::future::join_all(calls).await;
    let err = client
        .call::<_, Value>("demo.Hello", &json!({"name": ""}))
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Status { status: 422, .. }), "{err}");
}

#[tokio::test]
async fn subscribe_push_unsubscribe_and_prefixes() {
    let g = group("ws-subs");
    let client = Client::connect(&url(&g, "/ws")).await.unwrap();
    let mut exact = client.subscribe("demo.tick").await.unwrap();
    let mut prefix = client.subscribe("demo.*").await.unwrap();
    let mut all = client.subscribe("*").await.unwrap();
    let mut other = client.subscribe("order.*").await.unwrap();
    for sub in [&mut exact, &mut prefix, &mut all] {
        let mut last = 0;
        for _ in 0..3 {
            let push = next_push(sub).await;
            assert_eq!(push.event, "demo.tick");
            let n = tick_n(&push.data);
            assert!(n > last, "ticks in order");
            last = n;
            assert!(push.data["at_ms"].as_u64().is_some());
        }
    }
    // Nothing matched order.*.
    assert!(other.rx_is_empty());

    // Unsubscribing (by id) stops that subscription's pushes at once; the
    // other subscriptions of the connection go on.
    let mut ws = raw(&g, "/ws").await;
    send(&mut ws, json!({"id": "a", "subscribe": "demo.tick"})).await;
    send(&mut ws, json!({"id": "b", "subscribe": "demo.tick"})).await;
    // Both acknowledged (pushes may come in between), then a push for both.
    let mut acks = 0;
    loop {
        let m = next_json(&mut ws).await;
        if m.get("subscribed").is_some() {
            acks += 1;
            continue;
        }
        assert_eq!(m["event"], "demo.tick");
        let mut subs: Vec<&str> = m["sub"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        subs.sort();
        if acks == 2 && subs == ["a", "b"] {
            break;
        }
    }
    send(&mut ws, json!({"id": "u", "unsubscribe": "a"})).await;
    let mut after_ack = 0;
    let mut acked = false;
    while after_ack < 5 {
        let m = next_json(&mut ws).await;
        if m["id"] == "u" {
            assert_eq!(m["unsubscribed"], "a");
            acked = true;
            continue;
        }
        let subs: Vec<&str> = m["sub"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap())
            .collect();
        if acked {
            assert_eq!(
                subs,
                vec!["b"],
                "no push for `a` after its unsubscribe was acknowledged"
            );
            after_ack += 1;
        }
    }
    // Unknown subscription: an error, the connection goes on.
    send(&mut ws, json!({"id": "u2", "unsubscribe": "nope"})).await;
    loop {
        let m = next_json(&mut ws).await;
        if m["id"] == "u2" {
            assert_eq!(m["status"], 404);
            break;
        }
    }
}

trait RxEmpty {
    fn rx_is_empty(&mut self) -> bool;
}

impl RxEmpty for Subscription {
    fn rx_is_empty(&mut self) -> bool {
        use futures_util::FutureExt;
        self.next().now_or_never().is_none()
    }
}

#[tokio::test]
async fn filters_deliver_only_matching_pushes() {
    let g = group("ws-filters");
    let mut ws = raw(&g, "/ws").await;
    send(&mut ws, json!({"id": "all", "subscribe": "demo.tick"})).await;
    next_json(&mut ws).await;
    let mut latest = tick_n(&next_json(&mut ws).await["data"]);
    // The filters name ticks a margin ahead of the latest one seen; a tick
    // past the margin before every filter is acknowledged (a loaded machine)
    // means a filter may have missed one of them, so that attempt is not
    // judged: its subscriptions are left and a wider margin is tried.
    let mut margin = 5;
    let (k, counts, seen_ne) = loop {
        let k = latest + margin;
        let attempt = format!("m{margin}-");
        let filters = [
            ("gt", json!({"n": {"gt": k}})),
            ("in", json!({"n": {"in": [k + 2, k + 4]}})),
            ("eq", json!({"n": k + 3})),
            ("range", json!({"n": {"gte": k + 1, "lt": k + 4}})),
            ("ne", json!({"n": {"ne": k + 1}, "at_ms": {"gt": 0}})),
        ];
        for (id, filter) in &filters {
            send(
                &mut ws,
                json!({"id": format!("{attempt}{id}"), "subscribe": "demo.tick", "filter": filter}),
            )
            .await;
        }
        let mut counts: HashMap<String, u64> = HashMap::new();
        let mut acks = 0;
        let mut seen_ne = HashSet::new();
        let mut in_time = true;
        loop {
            let m = next_json(&mut ws).await;
            if m.get("subscribed").is_some() {
                if m["id"].as_str().is_some_and(|id| id.starts_with(&attempt)) {
                    acks += 1;
                }
                continue;
            }
            let n = tick_n(&m["data"]);
            latest = latest.max(n);
            if acks < filters.len() && n > k {
                in_time = false;
            }
            for s in m["sub"].as_array().unwrap() {
                let Some(id) = s.as_str().unwrap().strip_prefix(&attempt) else {
                    continue;
                };
                *counts.entry(id.to_owned()).or_default() += 1;
                if id == "ne" {
                    seen_ne.insert(n);
                }
            }
            if n >= k + 10 && acks == filters.len() {
                break;
            }
        }
        if in_time {
            break (k, counts, seen_ne);
        }
        assert!(margin < 500, "no filter was acknowledged within 500 ticks");
        margin *= 5;
    };
    assert_eq!(counts.get("gt"), Some(&10), "n in k+1..=k+10: {counts:?}");
    assert_eq!(counts.get("in"), Some(&2), "{counts:?}");
    assert_eq!(counts.get("eq"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("range"), Some(&3), "{counts:?}");
    assert!(
        !seen_ne.contains(&(k + 1)) && seen_ne.contains(&(k + 2)),
        "{seen_ne:?}"
    );

    // A bad filter or pattern is refused with an error.
    send(
        &mut ws,
        json!({"id": "bad", "subscribe": "demo.tick", "filter": {"n": {"like": 1}}}),
    )
    .await;
    send(&mut ws, json!({"id": "bad2", "subscribe": "demo*"})).await;
    let mut errors = 0;
    while errors < 2 {
        let m = next_json(&mut ws).await;
        if m["id"] == "bad" || m["id"] == "bad2" {
            assert_eq!(m["status"], 400, "{m}");
            errors += 1;
        }
    }
}

#[tokio::test]
async fn limits_garbage_and_close_codes() {
    let g = Group::builder("ws-limits")
        .config(&format!(
            "{}[listener.ws]\nmax_message_bytes = 4096\nmax_subscriptions = 3\n",
            config(1000, 0)
        ))
        .start();
    let mut ws = raw(&g, "/ws").await;
    // Garbage: an error message, and the connection stays usable.
    ws.send(Message::text("{not json")).await.unwrap();
    let m = next_json(&mut ws).await;
    assert_eq!(m["status"], 400, "{m}");
    send(&mut ws, json!([1, 2])).await;
    assert_eq!(next_json(&mut ws).await["status"], 400);
    send(&mut ws, json!({"id": "x", "what": 1})).await;
    assert_eq!(next_json(&mut ws).await["status"], 400);
    send(
        &mut ws,
        json!({"id": "h", "type": "demo.Hello", "data": {"name": "Ada"}}),
    )
    .await;
    let m = next_json(&mut ws).await;
    assert_eq!(m["data"]["message"], "Hello, Ada!", "{m}");

    // At most 3 subscriptions.
    for i in 0..4 {
        send(
            &mut ws,
            json!({"id": format!("s{i}"), "subscribe": format!("t{i}.x")}),
        )
        .await;
    }
    for i in 0..4 {
        let m = next_json(&mut ws).await;
        assert_eq!(m["id"], format!("s{i}"));
        if i < 3 {
            assert_eq!(m["subscribed"], format!("t{i}.x"));
        } else {
            assert_eq!(m["status"], 429, "{m}");
        }
    }

    // Over the message limit: closed with 1009.
    ws.send(Message::text("x".repeat(5000))).await.unwrap();
    let code = loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(Some(frame)))) => break frame.code,
            Some(Ok(_)) => continue,
            other => panic!("expected a close frame, got {other:?}"),
        }
    };
    assert_eq!(code, CloseCode::Size);
}

#[tokio::test]
async fn a_client_that_never_pongs_is_closed() {
    let g = Group::builder("ws-ping")
        .config(&format!("{}[listener.ws]\nping_ms = 100\n", config(1000, 0)))
        .start();
    // A raw TCP client that completes the handshake, then never reads:
    // it cannot answer pings, so the server closes the connection.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(g.addr).await.unwrap();
    let req = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        g.addr
    );
    tcp.write_all(req.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    // Read until the server ends the connection: the 101, pings, a close
    // frame with 1008, then EOF.
    loop {
        let n = tokio::time::timeout(PATIENCE, tcp.read(&mut buf))
            .await
            .unwrap()
            .unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 101"), "{text}");
    // A close frame (0x88) carrying code 1008 (0x03f0).
    assert!(
        got.windows(4)
            .any(|w| w[0] == 0x88 && w[2] == 0x03 && w[3] == 0xf0),
        "{got:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_consumer_is_dropped_without_affecting_the_others() {
    // A tick every 5 ms with 2 KiB of padding: 400 KB/s to each client.
    // The queue holds 1.3 s of ticks: a fast client whose reader a loaded
    // machine holds back for a moment is not taken for a slow one, while
    // the client that never reads fills it all the same.
    let mut g = Group::builder("ws-slow")
        .config(&format!("{}[listener.ws]\nqueue = 256\n", config(5, 2048)))
        .start();
    let broker = g.pid_of("broker");
    let broker_rss_before = rss_kib(broker);
    // The slow client: a tiny receive buffer, subscribes, then never reads.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(g.addr).await.unwrap();
    let (mut slow, _) =
        tokio_tungstenite::client_async(url(&g, "/ws"), tokio_tungstenite::MaybeTlsStream::Plain(tcp))
            .await
            .unwrap();
    send(&mut slow, json!({"id": "s", "subscribe": "demo.tick"})).await;
    assert_eq!(next_json(&mut slow).await["subscribed"], "demo.tick");

    // Twenty clients that read everything.
    let mut fast = Vec::new();
    for _ in 0..20 {
        let client = Client::connect(&url(&g, "/ws")).await.unwrap();
        let sub = client.subscribe("demo.tick").await.unwrap();
        fast.push((client, sub));
    }
    let dropped = tokio::task::block_in_place(|| g.wait_line("dropping slow websocket client"));
    assert!(dropped.contains("listener"), "{dropped}");

    // Every fast client got every tick, in order, with no gap, before and
    // after the slow one was dropped: counts, not wall time.
    for (_, sub) in &mut fast {
        let mut last = tick_n(&next_push(sub).await.data);
        for _ in 0..100 {
            let n = tick_n(&next_push(sub).await.data);
            assert_eq!(n, last + 1, "a fast client lost a push");
            last = n;
        }
    }

    // The slow client's connection ends: what it buffered, then a close.
    let mut ticks = 0u64;
    loop {
        match tokio::time::timeout(PATIENCE, slow.next())
            .await
            .expect("the slow client is closed")
        {
            Some(Ok(Message::Text(_))) => ticks += 1,
            Some(Ok(Message::Close(frame))) => {
                if let Some(frame) = frame {
                    assert_eq!(frame.code, CloseCode::Policy);
                }
                break;
            }
            Some(Ok(_)) => {}
            Some(Err(_)) | None => break,
        }
    }
    assert!(ticks > 0);
    // The broker sends each tick once per listener pipe, naming its
    // recipients, and queues nothing per client: its memory stays flat.
    let broker_rss_after = rss_kib(broker);
    assert!(
        broker_rss_after <= broker_rss_before + 16 * 1024,
        "broker RSS {broker_rss_before} KiB → {broker_rss_after} KiB"
    );
}

#[tokio::test]
async fn ws_echo_returns_text_and_binary_unchanged() {
    let g = group("ws-echo");
    let mut ws = raw(&g, "/ws/echo").await;
    let texts = ["hello", "", "ünïcødé ✓", &"long ".repeat(10_000)];
    for t in texts {
        ws.send(Message::text(t)).await.unwrap();
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Text(got))) => assert_eq!(got.as_str(), t),
            other => panic!("{other:?}"),
        }
    }
    let binaries: [Vec<u8>; 3] = [
        vec![0, 255, 1, 254],
        vec![],
        (0..=255u8).cycle().take(100_000).collect(),
    ];
    for b in binaries {
        ws.send(Message::binary(b.clone())).await.unwrap();
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Binary(got))) => assert_eq!(got.as_ref(), &b[..]),
            other => panic!("{other:?}"),
        }
    }
    ws.close(None).await.unwrap();
    // The server completes the close handshake.
    loop {
        match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
            Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
            Some(Ok(_)) => {}
        }
    }
}

#[tokio::test]
async fn client_notifications_reach_subscribers_only_when_allowed() {
    // Allowed: one client's notification is pushed to another's subscription.
    let g = Group::builder("ws-notify")
        .config(&format!("{}[listener.ws]\nnotify = true\n", config(1000, 0)))
        .start();
    let listener = Client::connect(&url(&g, "/ws")).await.unwrap();
    let mut sub = listener.subscribe("client.*").await.unwrap();
    let sender = Client::connect(&url(&g, "/ws")).await.unwrap();
    sender.notify("client.ping", &json!({"n": 7})).await.unwrap();
    let push = next_push(&mut sub).await;
    assert_eq!(push.event, "client.ping");
    assert_eq!(push.data, json!({"n": 7}));

    // Off by default: refused with 403, nothing pushed.
    let g = group("ws-notify-off");
    let client = Client::connect(&url(&g, "/ws")).await.unwrap();
    match client.notify("client.ping", &json!({})).await {
        Err(ClientError::Status { status: 403, .. }) => {}
        other => panic!("expected 403, got {other:?}"),
    }
}

#[tokio::test]
async fn binary_bincode_requests_get_bincode_replies() {
    use switchyard_proto::codec;
    use switchyard_proto::control::{WsBinaryReply, WsBinaryRequest};
    #[derive(serde::Serialize)]
    struct Hello {
        name: String,
    }
    #[derive(serde::Deserialize)]
    struct Greeting {
        message: String,
    }
    async fn ask(ws: &mut Raw, id: &str, name: &str) -> WsBinaryReply {
        let payload = codec::encode(&Hello { name: name.into() }).unwrap();
        let request = WsBinaryRequest {
            id: id.into(),
            event_type: "demo.Hello".into(),
            payload,
        };
        ws.send(Message::Binary(codec::encode(&request).unwrap().into()))
            .await
            .unwrap();
        loop {
            match tokio::time::timeout(PATIENCE, ws.next()).await.unwrap() {
                Some(Ok(Message::Binary(bytes))) => return codec::decode(&bytes).unwrap(),
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                other => panic!("expected a binary reply, got {other:?}"),
            }
        }
    }
    let g = group("ws-binary");
    let mut ws = raw(&g, "/ws").await;
    let reply = ask(&mut ws, "b1", "Ada").await;
    assert_eq!((reply.id.as_str(), reply.status), ("b1", 200));
    assert_eq!(reply.content_type, "application/x-bincode");
    let greeting: Greeting = codec::decode(&reply.payload).unwrap();
    assert_eq!(greeting.message, "Hello, Ada!");
    // Validation still names the field; the error body is problem+json.
    let reply = ask(&mut ws, "b2", "").await;
    assert_eq!(reply.status, 422);
    assert!(String::from_utf8_lossy(&reply.payload).contains("\"field\":\"name\""));
    // Bytes that are not a request: an error message, the connection stays.
    ws.send(Message::Binary(vec![0xff, 0x00, 0x13].into()))
        .await
        .unwrap();
    assert_eq!(next_json(&mut ws).await["status"], 400);
    assert_eq!(ask(&mut ws, "b3", "Bob").await.status, 200);
}
