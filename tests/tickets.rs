//! The tickets example application (examples/tickets) end to end, against
//! a real PostgreSQL the test starts on a private directory: migrations,
//! 422 validation, the HTML pages and form, a call to the `staff` manager,
//! `ticket.opened` pushed to a WebSocket client, the webhook posted with
//! reqwest to a local server, a JWT-only route, the Scheduler's reminder,
//! and the typed gRPC services (`tickets.v1.Tickets`, `ticket.v1.Notifications`)
//! called by a client that knows only the wire format, with integer ids.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::sync::mpsc;

use common::grpc::{self, Wire};
use common::postgres::Postgres;
use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use switchyard_listener::api::proto::field_numbers;
use tokio_tungstenite::tungstenite::Message;

type Ws = tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

const SECRET: &str = "tickets-test-secret-0123456789abcdef";

/// A webhook receiver: each POST's body goes to the channel, answered 204.
fn webhook() -> (u16, mpsc::Receiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            let mut reader = BufReader::new(conn);
            let mut length = 0;
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap_or(0) == 0 {
                    break;
                }
                if let Some((name, value)) = line.split_once(':')
                    && name.eq_ignore_ascii_case("content-length")
                {
                    length = value.trim().parse().unwrap_or(0);
                }
                if line == "\r\n" {
                    break;
                }
            }
            let mut body = vec![0; length];
            if reader.read_exact(&mut body).is_err() {
                continue;
            }
            let _ = reader
                .get_mut()
                .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n");
            if let Ok(value) = serde_json::from_slice(&body) {
                let _ = tx.send(value);
            }
        }
    });
    (port, rx)
}

fn config(pg: &Postgres, hook_port: u16) -> String {
    let plugin = plugin("switchyard-example-tickets");
    let templates = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tickets/templates");
    format!(
        r#"
[[managers]]
name = "tickets"
plugin = "{plugin}"
templates = "{templates}"
[managers.config]
database = "{database}"
webhook = "http://127.0.0.1:{hook_port}/hook"
remind_after_ms = 300

[[managers]]
name = "staff"
plugin = "{plugin}"
[managers.config]
people = ["ada", "grace"]

[[managers]]
name = "scheduler"
builtin = "scheduler"

[auth.jwt]
algorithms = ["HS256"]
secret = "{SECRET}"

[[auth.rules]]
event = "tickets.Close"
roles = ["staff"]
"#,
        plugin = plugin.display(),
        templates = templates.display(),
        database = pg.conninfo("tickets"),
    )
}

/// A token from the real CLI, signed with the configuration's key.
fn token(config: &Path, sub: &str, roles: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchyard"));
    cmd.args(["token", "--sub", sub, "-c"]).arg(config);
    for role in roles {
        cmd.args(["--role", role]);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

fn post_json(g: &Group, path: &str, body: Value, headers: &[(&str, &str)]) -> HttpResponse {
    request_with(g.addr, "POST", path, headers, body.to_string().as_bytes()).unwrap()
}

/// The next push of `event` on the WebSocket, skipping others.
async fn next_push(ws: &mut Ws, event: &str) -> Value {
    loop {
        let message = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {event} push in time"));
        if let Some(Ok(Message::Text(text))) = message {
            let v: Value = serde_json::from_str(text.as_str()).unwrap();
            if v["event"] == event {
                return v["data"].clone();
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tickets_application_end_to_end() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    pg.create_database("tickets");
    let (hook_port, hooks) = webhook();
    let dir = scratch_dir("tickets-config");
    let config_path = dir.path().join("switchyard.toml");
    std::fs::write(&config_path, config(&pg, hook_port)).unwrap();
    let g = Group::builder("tickets").config_file(&config_path).start();

    // The schema was migrated in `create`, once.
    assert_eq!(pg.psql("tickets", "SELECT version FROM schema_version"), "2");

    let (mut ws, _) = tokio_tungstenite::connect_async(format!("ws://{}/ws", g.addr))
        .await
        .unwrap();
    ws.send(Message::text(
        json!({"id": "s", "subscribe": "ticket.*"}).to_string(),
    ))
    .await
    .unwrap();
    loop {
        let reply = tokio::time::timeout(PATIENCE, ws.next()).await.unwrap();
        if let Some(Ok(Message::Text(text))) = reply {
            assert!(text.as_str().contains("subscribed"), "{text}");
            break;
        }
    }

    // Invalid input: 422 naming the field (the derive's rules, then the
    // handler's own), nothing stored.
    for (body, field) in [
        (json!({"title": "x", "email": "ada@example.org"}), "title"),
        (json!({"title": "Printer on fire", "email": "nobody"}), "email"),
    ] {
        let r = post_json(&g, "/tickets", body, &[]);
        assert_eq!(r.status, 422, "{}", r.text());
        assert_eq!(r.json()["errors"][0]["field"], field, "{}", r.text());
    }
    assert_eq!(pg.psql("tickets", "SELECT count(*) FROM tickets"), "0");

    // A ticket: stored, assigned by `staff`, announced, posted to the hook.
    let r = post_json(
        &g,
        "/tickets",
        json!({"title": "Printer on fire", "body": "Again.", "email": "ada@example.org"}),
        &[],
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let first = r.json();
    let id = first["id"].as_i64().expect("an integer id");
    assert_eq!(r.header("location"), Some(format!("/tickets/{id}").as_str()));
    assert_eq!(first["assignee"], "ada");
    assert_eq!(first["status"], "open");
    assert_eq!(
        pg.psql(
            "tickets",
            &format!("SELECT title, email FROM tickets WHERE id = {id}")
        ),
        "Printer on fire|ada@example.org"
    );
    let opened = next_push(&mut ws, "ticket.opened").await;
    assert_eq!(opened["id"], id);
    let hooked = tokio::task::spawn_blocking(move || hooks.recv_timeout(PATIENCE).map(|v| (v, hooks)))
        .await
        .unwrap()
        .expect("the webhook was posted");
    assert_eq!(hooked.0["id"], id, "{}", hooked.0);

    // Read back, as JSON and as a page; the list page carries the form.
    let r = get(g.addr, &format!("/tickets/{id}")).unwrap();
    assert_eq!(r.json()["title"], "Printer on fire");
    let page = request_with(
        g.addr,
        "GET",
        &format!("/tickets/{id}"),
        &[("accept", "text/html")],
        b"",
    )
    .unwrap();
    assert_eq!(page.status, 200);
    assert!(
        page.text().contains("<h1>#1 Printer on fire</h1>"),
        "{}",
        page.text()
    );
    let list = request_with(g.addr, "GET", "/tickets", &[("accept", "text/html")], b"").unwrap();
    assert!(
        list.text().contains(r#"<form method="post" action="/tickets">"#),
        "{}",
        list.text()
    );

    // The form, as a browser posts it: the second ticket goes to grace.
    let form = b"title=Coffee+machine&email=grace%40example.org&body=Empty";
    let mut raw_request = format!(
        "POST /tickets HTTP/1.1\r\nhost: t\r\nconnection: close\r\naccept: text/html\r\n\
         content-type: application/x-www-form-urlencoded\r\ncontent-length: {}\r\n\r\n",
        form.len()
    )
    .into_bytes();
    raw_request.extend_from_slice(form);
    let r = raw(g.addr, &raw_request).unwrap();
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(r.text().contains("is with grace"), "{}", r.text());
    let second: i64 = pg
        .psql("tickets", "SELECT id FROM tickets WHERE title = 'Coffee machine'")
        .parse()
        .unwrap();

    // Closing is for staff with a token (a POST without a body, as the
    // README's curl sends it).
    let close = |auth: Option<&str>| {
        let path = format!("/tickets/{id}/close");
        let headers: Vec<(&str, &str)> = auth.map(|a| ("authorization", a)).into_iter().collect();
        request_with(g.addr, "POST", &path, &headers, b"").unwrap()
    };
    assert_eq!(close(None).status, 401);
    let customer = format!("Bearer {}", token(&config_path, "bob", &[]));
    assert_eq!(close(Some(&customer)).status, 403);
    let staff = format!("Bearer {}", token(&config_path, "ada", &["staff"]));
    let r = close(Some(&staff));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["closed_by"], "ada");
    assert_eq!(close(Some(&staff)).status, 409, "closed once");
    assert_eq!(
        pg.psql(
            "tickets",
            &format!("SELECT status, closed_by FROM tickets WHERE id = {id}")
        ),
        "closed|ada"
    );

    // The Scheduler's reminder for the ticket still open.
    loop {
        let reminder = next_push(&mut ws, "ticket.reminder").await;
        if reminder["id"] == second {
            break;
        }
    }
    assert_eq!(
        pg.psql(
            "tickets",
            &format!("SELECT reminded FROM tickets WHERE id = {second}")
        ),
        "t"
    );

    // Typed gRPC, as a client generated from `switchyard proto` calls it:
    // every id a varint both ways (a `google.protobuf.Value` would carry
    // it as a double inside a nested message).
    let channel = grpc::channel(g.addr).await;
    let ticket_fields = field_numbers([
        "assignee",
        "body",
        "closed_by",
        "email",
        "id",
        "reminded",
        "status",
        "title",
    ]);
    let id_field = field_numbers(["id"])["id"];
    let reply = grpc::unary(
        &channel,
        "/tickets.v1.Tickets/Get",
        grpc::message(&[(id_field, Wire::Varint(u64::try_from(second).unwrap()))]),
    )
    .await
    .unwrap();
    let got = grpc::fields(&reply);
    assert_eq!(
        grpc::field(&got, ticket_fields["id"]),
        Some(&Wire::Varint(u64::try_from(second).unwrap())),
        "{got:?}"
    );
    assert_eq!(
        grpc::field(&got, ticket_fields["title"])
            .and_then(Wire::text)
            .as_deref(),
        Some("Coffee machine"),
        "{got:?}"
    );

    // `ticket.opened` as a typed stream, then a ticket opened over gRPC:
    // `Created<Ticket>` answers a `Ticket` message, and the stream gets
    // the notification with the same integer id.
    let mut opened =
        grpc::server_stream(&channel, "/ticket.v1.Notifications/opened", grpc::message(&[])).await;
    let open = field_numbers(["body", "email", "title"]);
    let reply = grpc::unary(
        &channel,
        "/tickets.v1.Tickets/Open",
        grpc::message(&[
            (open["title"], grpc::text("Badge reader")),
            (open["email"], grpc::text("linus@example.org")),
        ]),
    )
    .await
    .unwrap();
    let made = grpc::fields(&reply);
    let Some(Wire::Varint(third)) = grpc::field(&made, ticket_fields["id"]).cloned() else {
        panic!("no integer id in the Open reply: {made:?}");
    };
    assert_eq!(
        grpc::field(&made, ticket_fields["status"])
            .and_then(Wire::text)
            .as_deref(),
        Some("open"),
        "{made:?}"
    );
    assert_eq!(
        pg.psql(
            "tickets",
            &format!("SELECT title FROM tickets WHERE id = {third}")
        ),
        "Badge reader"
    );
    let notified = field_numbers(["assignee", "id", "title"]);
    loop {
        let message = grpc::fields(&grpc::next_message(&mut opened).await);
        if grpc::field(&message, notified["id"]) == Some(&Wire::Varint(third)) {
            assert_eq!(
                grpc::field(&message, notified["title"])
                    .and_then(Wire::text)
                    .as_deref(),
                Some("Badge reader")
            );
            break;
        }
    }
    // A 422 over gRPC: INVALID_ARGUMENT, nothing stored.
    let refused = grpc::unary(
        &channel,
        "/tickets.v1.Tickets/Open",
        grpc::message(&[
            (open["title"], grpc::text("Badge reader")),
            (open["email"], grpc::text("nobody")),
        ]),
    )
    .await
    .expect_err("an invalid email");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");

    // The list: a repeated `Ticket` message, each id a varint.
    let reply = grpc::unary(&channel, "/tickets.v1.Tickets/List", grpc::message(&[]))
        .await
        .unwrap();
    let tickets_field = field_numbers(["tickets"])["tickets"];
    let listed: Vec<u64> = grpc::fields(&reply)
        .into_iter()
        .filter(|(k, _)| *k == tickets_field)
        .map(|(_, v)| match v {
            Wire::Bytes(item) => match grpc::field(&grpc::fields(&item), ticket_fields["id"]) {
                Some(Wire::Varint(id)) => *id,
                other => panic!("a listed ticket's id is {other:?}"),
            },
            other => panic!("a listed ticket is {other:?}"),
        })
        .collect();
    // The open ones, newest first (the first was closed above).
    assert_eq!(listed, [third, u64::try_from(second).unwrap()]);

    // Closing over gRPC takes the same token, as metadata.
    let close_field = field_numbers(["id"])["id"];
    let close = |auth: Option<&str>| {
        let mut request = tonic::Request::new(grpc::message(&[(close_field, Wire::Varint(third))]));
        if let Some(auth) = auth {
            request
                .metadata_mut()
                .insert("authorization", auth.parse().unwrap());
        }
        grpc::unary_with(&channel, "/tickets.v1.Tickets/Close", request)
    };
    let anonymous = close(None).await.expect_err("no token");
    assert_eq!(anonymous.code(), tonic::Code::Unauthenticated, "{anonymous:?}");
    let closed = grpc::fields(&close(Some(&staff)).await.unwrap());
    assert_eq!(
        grpc::field(&closed, ticket_fields["closed_by"])
            .and_then(Wire::text)
            .as_deref(),
        Some("ada"),
        "{closed:?}"
    );
    drop(g);
    drop(pg);
}
