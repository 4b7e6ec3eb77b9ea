//! One way to write a handler (decision 0125), through the real plugin ABI
//! (`TestManager`): `Registry::handle` takes every shape, a call's reply
//! type follows from the event, request context is a typed field, and
//! `tracing` records reach the log tagged with their request.

use serde::{Deserialize, Serialize};
use switchyard_manager::testing::TestManager;
use switchyard_manager::{
    BodyReader, Config, Context, Error, Event, Identity, Manager, Multipart, Registry, Reply, RequestInfo,
    State,
};

/// What the stubbed `stock` manager answers: `reply` names it.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Reserve", reply = Reserved)]
struct Reserve {
    qty: u32,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
struct Reserved {
    left: u32,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Count", http = "POST /count", reply = Counted)]
struct Count {}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Peek", http = "GET /peek", reply = Counted)]
struct Peek {}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Order", http = "POST /order", reply = Ordered)]
struct Order {
    qty: u32,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
struct Counted {
    count: u64,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
struct Ordered {
    count: u64,
    left: u32,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Put", http = "PUT /put")]
struct Put {}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Form", http = "POST /form")]
struct Form {
    title: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, Reply)]
struct Bytes {
    bytes: u64,
}

/// Every kind of request context, each a typed field: the field is the
/// declaration and the read.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Who", http = "GET /who")]
struct Who {
    #[from(method)]
    method: Option<String>,
    #[from(path)]
    path: Option<String>,
    #[from(client)]
    client: Option<std::net::IpAddr>,
    #[from(identity)]
    identity: Option<Identity>,
    #[from(header = "user-agent")]
    agent: Option<String>,
}

/// The identity required: absent, 401.
#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "h.Mine", http = "GET /mine")]
struct Mine {
    #[from(identity)]
    identity: Identity,
}

#[derive(Default)]
struct Shop {
    count: u64,
}

impl Manager for Shop {
    const NAME: &'static str = "shop";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(Shop::default())
    }
    fn register(r: &mut Registry<Self>) {
        r.handle(Self::count)
            .handle(Self::peek)
            .handle(Self::order)
            .handle(put)
            .handle(form)
            .handle(Self::who)
            .handle(Self::mine);
    }
}

impl Shop {
    /// The state to itself.
    fn count(&mut self, _: Count, _: &mut Context) -> Result<Counted, Error> {
        self.count += 1;
        Ok(Counted { count: self.count })
    }

    /// Sync, with the same parameters as the async one below.
    fn peek(state: State<Self>, _: Peek, _: Context) -> Result<Counted, Error> {
        tracing::debug!(shape = "ready", "peeking");
        Ok(Counted {
            count: state.with(|s| s.count),
        })
    }

    async fn order(state: State<Self>, ev: Order, cx: Context) -> Result<Ordered, Error> {
        tracing::info!(qty = ev.qty, "ordering");
        // No annotation: `Reserve` names its reply.
        let reserved = cx.call(&Reserve { qty: ev.qty }).await?;
        tracing::warn!(left = reserved.left, "reserved");
        let count = state.with(|s| {
            s.count += 1;
            s.count
        });
        Ok(Ordered {
            count,
            left: reserved.left,
        })
    }

    fn who(
        &mut self,
        ev: Who,
        _: &mut Context,
    ) -> Result<switchyard_manager::Json<serde_json::Value>, Error> {
        Ok(switchyard_manager::Json(serde_json::json!({
            "method": ev.method,
            "path": ev.path,
            "client": ev.client,
            "sub": ev.identity.map(|i| i.sub),
            "agent": ev.agent,
        })))
    }

    fn mine(&mut self, ev: Mine, _: &mut Context) -> Result<Counted, Error> {
        Ok(Counted {
            count: ev.identity.sub.len() as u64,
        })
    }
}

fn put(_: Put, body: &mut BodyReader) -> Result<Bytes, Error> {
    Ok(Bytes {
        bytes: std::io::copy(body, &mut std::io::sink())?,
    })
}

fn form(_: Form, form: &mut Multipart) -> Result<Bytes, Error> {
    let mut bytes = 0;
    while let Some(mut part) = form.next_part()? {
        bytes += std::io::copy(&mut part, &mut std::io::sink())?;
    }
    Ok(Bytes { bytes })
}

#[test]
fn handle_takes_every_shape() {
    let mut m = TestManager::<Shop>::new();
    m.stub(|r: Reserve| Ok(Reserved { left: 10 - r.qty }));
    assert_eq!(m.http::<Count>(&[], "", b"").text(), r#"{"count":1}"#);
    assert_eq!(m.http::<Peek>(&[], "", b"").text(), r#"{"count":1}"#);
    let r = m.http::<Order>(&[], "", br#"{"qty":3}"#);
    assert_eq!(r.text(), r#"{"count":2,"left":7}"#);
    assert_eq!(m.http::<Peek>(&[], "", b"").text(), r#"{"count":2}"#);
    let r = m.http::<Put>(&[], "application/octet-stream", b"12345");
    assert_eq!(r.text(), r#"{"bytes":5}"#);
    let body = b"--b\r\nContent-Disposition: form-data; name=\"title\"\r\n\r\nhi\r\n--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\nabc\r\n--b--\r\n";
    let r = m
        .build::<Form>()
        .body("multipart/form-data; boundary=b", body)
        .send();
    assert_eq!(r.text(), r#"{"bytes":3}"#, "{}", r.text());
    // Each is declared with its route, as `request` and friends did.
    let routes: Vec<_> = m
        .description()
        .handles
        .iter()
        .filter_map(|h| h.route.as_ref().map(|r| (r.path.clone(), r.stream_body)))
        .collect();
    for (path, streamed) in [
        ("/count", false),
        ("/order", false),
        ("/put", true),
        ("/form", true),
    ] {
        assert!(
            routes.contains(&(path.to_owned(), streamed)),
            "{path}: {routes:?}"
        );
    }
}

#[test]
fn tracing_records_are_logged_with_their_request() {
    let mut m = TestManager::<Shop>::new();
    m.stub(|r: Reserve| Ok(Reserved { left: 10 - r.qty }));
    assert_eq!(m.http::<Order>(&[], "", br#"{"qty":1}"#).status, 200);
    assert_eq!(m.http::<Peek>(&[], "", b"").status, 200);
    let logs = m.logs.clone();
    let find = |what: &str| {
        logs.iter()
            .find(|(_, line)| line.starts_with(what))
            .unwrap_or_else(|| panic!("no `{what}` line in {logs:?}"))
            .clone()
    };
    // Before the call and after it (a later poll of the handler's future),
    // with the fields after the message.
    let (before, line) = find("ordering");
    assert_eq!(line, "ordering qty=1");
    let (after, line) = find("reserved");
    assert_eq!(line, "reserved left=9");
    assert_ne!(before, 0, "tagged with the request's correlation");
    assert_eq!(before, after, "both lines are the same request's");
    let (peek, _) = find("peeking");
    assert_ne!(peek, 0);
    assert_ne!(peek, before, "another request");
    // Outside a handler no request is current: a record there goes to the
    // host's log untagged, not as the last request's.
    tracing::info!("from the test itself");
    m.advance(std::time::Duration::from_millis(1));
    let outside: Vec<_> = m
        .logs
        .iter()
        .filter(|(_, l)| l == "from the test itself")
        .collect();
    assert_eq!(outside, [&(0, "from the test itself".to_owned())]);
}

#[test]
fn context_fields_declare_what_they_read() {
    const WHO: RequestInfo = Who::REQUEST;
    const { assert!(WHO.method && WHO.path && WHO.client && WHO.identity) };
    let who = WHO;
    assert_eq!(who.headers, ["user-agent"]);
    const { assert!(Mine::REQUEST.identity && !Mine::REQUEST.method) };

    let mut m = TestManager::<Shop>::new();
    let identity = Identity {
        sub: "ada".into(),
        method: "jwt".into(),
        claims: Default::default(),
    };
    let r = m
        .build::<Who>()
        .context(":method", "GET")
        .context(":path", "/who?x=1")
        .context(":client", "2001:db8::7")
        .identity(&identity)
        .header("user-agent", "curl/8")
        // A client cannot set them through the query.
        .query("method=POST&sub=eve&agent=forged")
        .send();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json::<serde_json::Value>(),
        serde_json::json!({"method": "GET", "path": "/who?x=1", "client": "2001:db8::7", "sub": "ada", "agent": "curl/8"})
    );
    let r = m
        .build::<Who>()
        .query("method=POST&path=/x&client=1.2.3.4")
        .send();
    assert_eq!(
        r.json::<serde_json::Value>(),
        serde_json::json!({"method": null, "path": null, "client": null, "sub": null, "agent": null})
    );
    let r = m.build::<Mine>().send();
    assert_eq!(r.status, 401, "{}", r.text());
    let r = m.build::<Mine>().identity(&identity).send();
    assert_eq!(r.text(), r#"{"count":3}"#);
}
