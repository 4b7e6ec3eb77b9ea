//! Async handlers await the tokio ecosystem as any tokio program does
//! (decision 0120): a tokio timer, a tokio `TcpStream` to a local server,
//! and tokio-postgres queries on a pool made in `create`, against a real PostgreSQL.
//! A query that hangs holds up nothing else the manager serves, and ends
//! with its request; a handler that panics after awaiting is a 500.
//!
//! Before the SDK owned a runtime each of these answered 500 ("there is
//! no reactor running"), and the pool made in `create` failed the start.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};

use common::postgres::Postgres;
use common::*;

/// A line echo server on an ephemeral port: answers `echo: LINE` to each
/// line. Its thread ends with the test's process.
fn echo_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().map_while(Result::ok) {
            std::thread::spawn(move || {
                let mut write = conn.try_clone()?;
                for line in BufReader::new(conn).lines() {
                    writeln!(write, "echo: {}", line?)?;
                }
                Ok::<_, std::io::Error>(())
            });
        }
    });
    port
}

fn value(g: &Group, path: &str) -> serde_json::Value {
    let r = get(g.addr, path).unwrap();
    assert_eq!(r.status, 200, "GET {path}: {}", r.text());
    r.json()["value"].clone()
}

#[test]
fn async_handlers_await_tokio_timers_sockets_and_postgres() {
    let Some(pg) = Postgres::start() else {
        return;
    };
    let port = echo_server();
    let config = format!(
        "[[managers]]\nname = \"tokio-io\"\nplugin = \"{}\"\n[managers.config]\ndatabase = \"{}\"\n",
        plugin("switchyard-fixture-tokio-io").display(),
        pg.conninfo("postgres"),
    );
    // The pool is made, and a first query awaited, in `create`.
    let g = Group::builder("tokio-io").config(&config).start();

    assert_eq!(value(&g, "/sleep/20"), 20, "a tokio timer");
    assert_eq!(
        value(&g, &format!("/echo?port={port}&text=hello")),
        "echo: hello",
        "a tokio TcpStream"
    );
    assert_eq!(value(&g, "/double/21"), 42, "a PostgreSQL query");

    let r = get(g.addr, "/panic").unwrap();
    assert_eq!(r.status, 500, "a panic after an await: {}", r.text());
    assert_eq!(value(&g, "/double/1"), 2, "served on after the panic");

    // A query that hangs: its request stays open...
    let mut hung = TcpStream::connect(g.addr).unwrap();
    write!(hung, "GET /hang HTTP/1.1\r\nhost: test\r\n\r\n").unwrap();
    // ... while the manager answers other queries, timers and sockets
    // (this very check is a query, run while the hung one is in flight).
    eventually("the hung query runs in PostgreSQL", PATIENCE, || {
        let stats = get(g.addr, "/stats").map_err(|e| e.to_string())?.json();
        if stats["sleeping"] == 1 {
            Ok(())
        } else {
            Err(stats.to_string())
        }
    });
    assert_eq!(value(&g, "/double/5"), 10);
    assert_eq!(value(&g, "/sleep/1"), 1);
    assert_eq!(
        value(&g, &format!("/echo?port={port}&text=meanwhile")),
        "echo: meanwhile"
    );

    // Its client leaves: the handler is dropped with its query, which
    // PostgreSQL then stops.
    drop(hung);
    eventually(
        "the hung handler is dropped and its query ended",
        PATIENCE,
        || {
            let stats = get(g.addr, "/stats").map_err(|e| e.to_string())?.json();
            if stats["abandoned"] == 1 && stats["sleeping"] == 0 {
                Ok(())
            } else {
                Err(stats.to_string())
            }
        },
    );
    assert_eq!(value(&g, "/double/7"), 14, "the pool serves on");
    drop(g);
    drop(pg);
}
