//! What a handler knows of its request, through the real plugin ABI
//! (`TestManager`): fields bound to a header, a cookie or the scope, the
//! context accessors, reply builders, and middleware.

use serde::{Deserialize, Serialize};
use switchyard_manager::testing::TestManager;
use switchyard_manager::{
    Config, Context, Created, Error, Event, Flow, Identity, Incoming, Json, Manager, Middleware, Redirect,
    Registry, Reply, RequestHead, RequestInfo, Response, cookie::Cookie,
};

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "t.Keyed", http = "POST /keyed/{id}")]
struct Keyed {
    id: u32,
    #[from(header = "X-Api-Key")]
    api_key: Option<String>,
    #[from(cookie = "session")]
    session: Option<String>,
    #[from(scope = "sub")]
    sub: Option<String>,
    note: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "t.Strict", http = "GET /strict")]
#[serde(rename_all = "camelCase")]
struct Strict {
    #[from(header = "x-tenant")]
    tenant_id: String,
    #[from(scope = "user_id")]
    user_id: u64,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(
    name = "t.Whoami",
    http = "GET /whoami",
    request(method, path, client, identity, headers = ["User-Agent"], cookies = ["theme"], scope = ["roles"])
)]
struct Whoami {}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "t.Go", http = "GET /go")]
struct Go {
    to: String,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "t.Make", http = "POST /things")]
struct Make {
    name: String,
}

#[derive(Serialize, Deserialize, Reply)]
struct Thing {
    name: String,
}

struct App;

impl Manager for App {
    const NAME: &'static str = "app";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(App)
    }
    fn register(r: &mut Registry<Self>) {
        r.handle(Self::keyed)
            .handle(Self::strict)
            .handle(Self::whoami)
            .handle(Self::go)
            .handle(Self::make);
    }
}

impl App {
    fn keyed(&mut self, ev: Keyed, _: &mut Context) -> Result<Json<serde_json::Value>, Error> {
        Ok(Json(serde_json::to_value(&ev).unwrap()))
    }

    fn strict(&mut self, ev: Strict, _: &mut Context) -> Result<Json<serde_json::Value>, Error> {
        Ok(Json(
            serde_json::json!({"tenant": ev.tenant_id, "user": ev.user_id}),
        ))
    }

    fn whoami(&mut self, _: Whoami, cx: &mut Context) -> Result<Json<serde_json::Value>, Error> {
        Ok(Json(serde_json::json!({
            "method": cx.method(),
            "path": cx.path(),
            "client": cx.client_ip().map(|ip| ip.to_string()),
            "request_id": cx.request_id(),
            "agent": cx.header("user-agent"),
            "theme": cx.cookie("theme"),
            "roles": cx.scope("roles"),
            "sub": cx.identity().map(|i| i.sub),
            "undeclared": cx.header("x-other"),
        })))
    }

    fn go(&mut self, ev: Go, _: &mut Context) -> Result<Response, Error> {
        Response::redirect(Redirect::SeeOther, &ev.to)
            .map(|r| r.with_cookie(Cookie::build(("seen", "1")).path("/").build()))
    }

    fn make(&mut self, ev: Make, _: &mut Context) -> Result<impl Reply + use<>, Error> {
        if ev.name.contains('!') {
            // A handler bug: a header value with a line break.
            return Ok(Created::at("/things/x", Thing { name: ev.name }).with_header("x-note", "a\r\nb"));
        }
        Ok(
            Created::at(format!("/things/{}", ev.name), Thing { name: ev.name })
                .with_cookie(Cookie::new("a", "1"))
                .with_cookie(Cookie::new("b", "2")),
        )
    }
}

fn json(r: &switchyard_manager::testing::TestResponse) -> serde_json::Value {
    r.json()
}

#[test]
fn declarations_travel_in_the_route() {
    assert_eq!(Keyed::REQUEST.headers, ["x-api-key"]);
    assert_eq!(Keyed::REQUEST.cookies, ["session"]);
    assert_eq!(Keyed::REQUEST.scope, ["sub"]);
    const { assert!(!Keyed::REQUEST.method) };
    const WHOAMI: RequestInfo = Whoami::REQUEST;
    const { assert!(WHOAMI.method && WHOAMI.path && WHOAMI.client && WHOAMI.identity) };
    let whoami = WHOAMI;
    assert_eq!(whoami.headers, ["user-agent"]);
    assert_eq!(Go::REQUEST, RequestInfo::NONE);
}

/// A bound field is never set from the body, the query or the path: not
/// in JSON, not in a client's bincode, whatever the names.
#[test]
fn bound_fields_cannot_be_spoofed() {
    let mut m = TestManager::<App>::new();
    let forged = br#"{"api_key":"forged","session":"forged","sub":"admin","note":"hi"}"#;
    let r = m
        .build::<Keyed>()
        .param("id", "7")
        .query("api_key=forged&sub=admin&session=forged")
        .json(forged)
        .send();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        json(&r),
        serde_json::json!({"id": 7, "api_key": null, "session": null, "sub": null, "note": "hi"})
    );
    let r = m
        .build::<Keyed>()
        .param("id", "7")
        .json(forged)
        .header("x-api-key", "real-key")
        .cookie("session", "s1")
        .scope("sub", serde_json::json!("ada"))
        .send();
    assert_eq!(
        json(&r),
        serde_json::json!({"id": 7, "api_key": "real-key", "session": "s1", "sub": "ada", "note": "hi"})
    );
    // A client may send bincode (binary WebSocket, gRPC): same rule.
    let event = Keyed {
        id: 1,
        api_key: Some("forged".into()),
        session: Some("forged".into()),
        sub: Some("admin".into()),
        note: None,
    };
    let r = m.build::<Keyed>().bincode(&event).send();
    assert_eq!(json(&r)["api_key"], serde_json::Value::Null, "{}", r.text());
    assert_eq!(json(&r)["sub"], serde_json::Value::Null);
    // Another manager of the group is trusted: its fields stand.
    let r = m.build::<Keyed>().bincode(&event).from_manager().send();
    assert_eq!(json(&r)["sub"], "admin", "{}", r.text());
}

#[test]
fn required_bound_fields_answer_400_and_401() {
    let mut m = TestManager::<App>::new();
    let r = m.build::<Strict>().query("tenantId=t9&userId=1").send();
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("missing header `x-tenant`"), "{}", r.text());
    let r = m.build::<Strict>().header("x-tenant", "t1").send();
    assert_eq!(r.status, 401, "{}", r.text());
    let r = m
        .build::<Strict>()
        .header("x-tenant", "t1")
        .scope("user_id", serde_json::json!(42))
        .query("tenantId=t9&userId=1")
        .send();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(json(&r), serde_json::json!({"tenant": "t1", "user": 42}));
    let r = m
        .build::<Strict>()
        .header("x-tenant", "t1")
        .scope("user_id", serde_json::json!("not a number"))
        .send();
    assert_eq!(r.status, 422, "{}", r.text());
}

#[test]
fn the_context_shows_what_the_event_declares() {
    let mut m = TestManager::<App>::new();
    let identity = Identity {
        sub: "ada".into(),
        method: "jwt".into(),
        claims: serde_json::Map::new(),
    };
    let r = m
        .build::<Whoami>()
        .context(":method", "HEAD")
        .context(":path", "/whoami")
        .context(":client", "203.0.113.9")
        .context(":request-id", "r-1")
        .header("user-agent", "curl/8")
        .header("x-other", "never declared but sent")
        .cookie("theme", "dark")
        .scope("roles", serde_json::json!(["admin"]))
        .identity(&identity)
        .send();
    assert_eq!(
        json(&r),
        serde_json::json!({
            "method": "HEAD", "path": "/whoami", "client": "203.0.113.9", "request_id": "r-1",
            "agent": "curl/8", "theme": "dark", "roles": ["admin"], "sub": "ada",
            "undeclared": "never declared but sent",
        })
    );
    let r = m.build::<Whoami>().send();
    assert_eq!(json(&r)["sub"], serde_json::Value::Null);
}

#[test]
fn redirects_cookies_and_created() {
    let mut m = TestManager::<App>::new();
    let r = m.build::<Go>().query("to=/next").send();
    assert_eq!(r.status, 303);
    assert_eq!(r.meta.get("location"), Some("/next"));
    assert_eq!(r.meta.get("set-cookie"), Some("seen=1; Path=/"));
    // A header smuggled into the target is refused, not written.
    for bad in ["/x%0D%0ASet-Cookie:%20evil=1", "/x%0Aa", "/x%00"] {
        let r = m.build::<Go>().query(&format!("to={bad}")).send();
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert_eq!(r.meta.get("location"), None);
    }
    let r = m.build::<Make>().json(br#"{"name":"cup"}"#).send();
    assert_eq!(r.status, 201);
    assert_eq!(r.meta.get("location"), Some("/things/cup"));
    let cookies: Vec<&str> = r
        .meta
        .iter()
        .filter(|(k, _)| *k == "set-cookie")
        .map(|(_, v)| v)
        .collect();
    assert_eq!(cookies, ["a=1", "b=2"], "one Set-Cookie line per cookie");
    let r = m.build::<Make>().json(br#"{"name":"bad!"}"#).send();
    assert_eq!(r.status, 500, "an invalid header never leaves: {:?}", r.meta);
    assert!(m.logs.iter().any(|(_, l)| l.contains("x-note")), "{:?}", m.logs);
}

// ---- middleware ----

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "mw.Account", http = "GET /account")]
struct Account {
    #[from(scope = "user_id")]
    user_id: u64,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "mw.Old", http = "GET /old")]
struct Old {}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "mw.Legacy", http = "POST /legacy")]
struct Legacy {
    n: u32,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "mw.Modern")]
struct Modern {
    n: u32,
    via: String,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "mw.Remote")]
struct Remote {
    n: u32,
}

#[derive(Debug, Serialize, Deserialize, Event)]
#[event(name = "mw.Boom", http = "GET /boom/{when}")]
struct Boom {
    when: String,
}

/// Resolves the `session` cookie into a user id.
struct Sessions;

impl Middleware for Sessions {
    const REQUEST: RequestInfo = RequestInfo {
        cookies: &["session"],
        ..RequestInfo::NONE
    };
    fn before(&mut self, req: &mut Incoming<'_>, _: &mut Context) -> Result<Flow, Error> {
        if let Some(id) = req.cookie("session").and_then(|s| s.strip_prefix("user-")) {
            let id: u64 = id.parse().map_err(|_| Error::bad_request("bad session"))?;
            req.set_scope("user_id", id);
        }
        if req.is::<Account>() && req.scope("user_id").is_none() {
            return Flow::redirect(Redirect::Found, "/login");
        }
        Ok(Flow::Continue)
    }
}

/// Rewrites, answers, panics, and stamps every answer.
#[derive(Default)]
struct Routing {
    seen: u32,
}

impl Middleware for Routing {
    fn before(&mut self, req: &mut Incoming<'_>, cx: &mut Context) -> Result<Flow, Error> {
        self.seen += 1;
        if req.is::<Old>() {
            return Flow::respond(Json(serde_json::json!({"answered": "by middleware"})), cx);
        }
        if req.is::<Legacy>() {
            let legacy: Legacy = req.decode()?;
            if legacy.n > 100 {
                return Flow::replace(&Remote { n: legacy.n });
            }
            return Flow::replace(&Modern {
                n: legacy.n,
                via: "replaced".into(),
            });
        }
        if req.is::<Boom>() && req.decode::<Boom>()?.when == "before" {
            panic!("middleware panics on purpose");
        }
        Ok(Flow::Continue)
    }

    fn after(&mut self, req: &RequestHead, response: &mut Response, _: &mut Context) {
        if req.event_name() == Some("mw.Boom") && response.status == 200 {
            panic!("after panics on purpose");
        }
        response.meta.push("x-seen", self.seen.to_string());
    }
}

struct Guarded;

impl Manager for Guarded {
    const NAME: &'static str = "guarded";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(Guarded)
    }
    fn register(r: &mut Registry<Self>) {
        r.middleware(Sessions)
            .middleware(Routing::default())
            .handle(Self::account)
            .handle(Self::old)
            .handle(Self::legacy)
            .handle(Self::modern)
            .handle(Self::boom);
    }
}

impl Guarded {
    fn account(&mut self, ev: Account, _: &mut Context) -> Result<Json<u64>, Error> {
        Ok(Json(ev.user_id))
    }
    fn old(&mut self, _: Old, _: &mut Context) -> Result<Json<&'static str>, Error> {
        Ok(Json("the handler"))
    }
    fn legacy(&mut self, _: Legacy, _: &mut Context) -> Result<Json<&'static str>, Error> {
        Ok(Json("legacy handler: never reached"))
    }
    fn modern(&mut self, ev: Modern, _: &mut Context) -> Result<Json<serde_json::Value>, Error> {
        Ok(Json(serde_json::json!({"n": ev.n, "via": ev.via})))
    }
    fn boom(&mut self, _: Boom, _: &mut Context) -> Result<Json<&'static str>, Error> {
        Ok(Json("ok"))
    }
}

#[test]
fn middleware_adds_scope_and_redirects() {
    let mut m = TestManager::<Guarded>::new();
    let r = m.build::<Account>().cookie("session", "user-42").send();
    assert_eq!((r.status, r.text()), (200, "42".to_owned()));
    assert_eq!(r.meta.get("x-seen"), Some("1"), "the after hook ran");
    // No session: Sessions redirects; Routing never saw it, its after
    // does not run.
    let r = m.build::<Account>().send();
    assert_eq!(r.status, 302);
    assert_eq!(r.meta.get("location"), Some("/login"));
    assert_eq!(r.meta.get("x-seen"), None);
    // A client cannot put the scope value in the query.
    let r = m.build::<Account>().query("user_id=1").send();
    assert_eq!(r.status, 302);
    assert_eq!(
        Guarded::describe_needs("mw.Account").cookies,
        ["session"],
        "the middleware's cookie travels for every route"
    );
}

#[test]
fn middleware_answers_replaces_and_forwards() {
    let mut m = TestManager::<Guarded>::new();
    let r = m.build::<Old>().send();
    assert_eq!(r.json::<serde_json::Value>()["answered"], "by middleware");
    assert_eq!(r.meta.get("x-seen"), None, "it answered itself: no after");
    let r = m.build::<Legacy>().json(br#"{"n":3}"#).send();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json::<serde_json::Value>(),
        serde_json::json!({"n": 3, "via": "replaced"})
    );
    assert!(
        r.meta.get("x-seen").is_some(),
        "the replacing middleware's after runs"
    );
    // A type this manager does not serve goes through the router.
    m.stub(|ev: Remote| Ok(serde_json::json!({"remote": ev.n})));
    let r = m.build::<Legacy>().json(br#"{"n":300}"#).send();
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.meta.get("x-seen").is_some());
}

#[test]
fn a_panicking_middleware_is_a_500_and_the_manager_serves_on() {
    let mut m = TestManager::<Guarded>::new();
    let r = m.build::<Boom>().param("when", "before").send();
    assert_eq!(r.status, 500, "{}", r.text());
    assert!(
        m.logs
            .iter()
            .any(|(_, l)| l.contains("middleware") && l.contains("panics on purpose")),
        "{:?}",
        m.logs
    );
    let r = m.build::<Boom>().param("when", "after").send();
    assert_eq!(r.status, 500, "{}", r.text());
    // Sessions (outer) still stamps nothing; Routing's state survived.
    let r = m.build::<Account>().cookie("session", "user-1").send();
    assert_eq!(r.status, 200);
    assert_eq!(r.meta.get("x-seen"), Some("3"));
}

impl Guarded {
    fn describe_needs(name: &str) -> switchyard_proto::control::RequestNeeds {
        TestManager::<Guarded>::new()
            .description()
            .handles
            .clone()
            .into_iter()
            .find(|h| h.name == name)
            .map(|h| h.needs)
            .unwrap_or_default()
    }
}
