//! The web side of a manager: which representation a request gets (JSON,
//! HTML through the event's template, or bincode), and the templates that
//! render HTML (docs/web.md, decisions 0065 and 0066).
//!
//! Templates render here, in the manager's process: they are the plugin's
//! own files, they see the reply's values before anything else does, and a
//! template that loops forever or fails takes down no listener. The
//! listener only forwards `Accept` and writes what comes back.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;

use bytes::Bytes;
use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, ErrorKind};
use switchyard_proto::{Meta, problem};

use crate::reply::{BINCODE, Format, JSON, Response};

/// The key of a manager's config under which the supervisor passes its
/// template directory and development mode; the SDK takes it out before
/// `Manager::create` sees the config.
pub const WEB_CONFIG_KEY: &str = "switchyard.web";

/// Content type of rendered pages.
pub const HTML: &str = "text/html; charset=utf-8";

/// What a request is answered in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Choice {
    /// JSON or bincode, as the handler encodes it.
    Encoded(Format),
    /// HTML: the handler's reply (as JSON) rendered by the event's template.
    Html(&'static str),
}

/// The representation `accept` prefers among those the event offers
/// (JSON first, then HTML when it names a template, then bincode), or the
/// 406 that lists them.
pub(crate) fn choose(accept: Option<&str>, template: Option<&'static str>) -> Result<Choice, Response> {
    let offered: &[&str] = if template.is_some() {
        &[JSON, "text/html", BINCODE]
    } else {
        &[JSON, BINCODE]
    };
    match switchyard_proto::web::negotiate(accept, offered).map(|i| offered[i]) {
        Some(JSON) => Ok(Choice::Encoded(Format::Json)),
        Some(BINCODE) => Ok(Choice::Encoded(Format::Bincode)),
        Some(_) => Ok(Choice::Html(template.unwrap_or_default())),
        None => {
            let (meta, body) = problem::problem_with(
                406,
                &format!("this resource is offered as {}", offered.join(", ")),
                Some(("offered", serde_json::json!(offered))),
            );
            Err(Response {
                status: 406,
                meta,
                body,
                stream: None,
            })
        }
    }
}

/// The manager's templates: a directory (its own or the group's, from
/// `switchyard.toml`), autoescaped by extension (`.html`, `.htm`, `.xml`),
/// with `url_for(event, **params)` for the routes this plugin knows.
pub(crate) struct Templates {
    env: RefCell<Environment<'static>>,
    /// Whether a directory is configured: without one no event offers HTML.
    available: bool,
    /// Development mode: read again before every render.
    reload: bool,
}

impl Templates {
    /// Templates from the supervisor's `settings` (the value of
    /// [`WEB_CONFIG_KEY`], if any); `routes`: event name → route path.
    pub(crate) fn new(settings: Option<&serde_json::Value>, routes: HashMap<String, String>) -> Templates {
        let dir = settings
            .and_then(|s| s.get("templates"))
            .and_then(|d| d.as_str())
            .map(PathBuf::from);
        let reload = settings
            .and_then(|s| s.get("development"))
            .and_then(serde_json::Value::as_bool)
            .unwrap_or(false);
        let mut env = Environment::new();
        if let Some(dir) = &dir {
            env.set_loader(minijinja::path_loader(dir));
        }
        env.add_function("url_for", move |name: String, params: Kwargs| {
            // Every piece is percent-encoded: nothing in it needs escaping.
            url_for(&routes, &name, &params).map(Value::from_safe_string)
        });
        Templates {
            env: RefCell::new(env),
            available: dir.is_some(),
            reload,
        }
    }

    /// Whether this manager has a template directory (else its events
    /// offer no HTML, whatever templates they name).
    pub(crate) fn available(&self) -> bool {
        self.available
    }

    /// Renders `name` with `context`.
    fn render(&self, name: &str, context: Value) -> Result<String, minijinja::Error> {
        let mut env = self.env.borrow_mut();
        if self.reload {
            env.clear_templates();
        }
        env.get_template(name)?.render(context)
    }

    fn has(&self, name: &str) -> bool {
        self.env.borrow().get_template(name).is_ok()
    }

    /// Marks the answer of a templated event as varying by `Accept`,
    /// whichever representation it got, so that no cache hands a browser
    /// the JSON (or a script the page).
    pub(crate) fn vary(response: &mut Response) {
        if !response
            .meta
            .iter()
            .any(|(k, v)| k == "vary" && v.eq_ignore_ascii_case("accept"))
        {
            response.meta.push("vary", "accept");
        }
    }

    /// `response` (the handler's answer, encoded as JSON) as the page
    /// `template` renders; an error answer as the `error.html` template or
    /// the built-in error page. A template that fails is logged through
    /// `log` with its cause and answered with a plain 500 page.
    pub(crate) fn html(&self, template: &str, mut response: Response, log: impl Fn(&str)) -> Response {
        if response.stream.is_some() {
            return response;
        }
        let content_type = response.meta.get("content-type").unwrap_or("");
        let media = content_type.split(';').next().unwrap_or("").trim();
        let rendered = if media == problem::PROBLEM_JSON {
            let detail: serde_json::Value = serde_json::from_slice(&response.body).unwrap_or_default();
            Ok(self.error_page(response.status, &detail, &log))
        } else if media == JSON && response.status < 300 {
            let value: serde_json::Value = match serde_json::from_slice(&response.body) {
                Ok(value) => value,
                Err(_) => return response,
            };
            let mut context = match &value {
                serde_json::Value::Object(map) => map.clone(),
                _ => serde_json::Map::new(),
            };
            context.insert("reply".to_owned(), value);
            self.render(template, Value::from_serialize(&context))
                .map_err(|err| {
                    log(&format!("template `{template}` failed: {err:#}"));
                })
        } else {
            // A redirect, a 204, raw bytes: nothing to render.
            return response;
        };
        let page = match rendered {
            Ok(page) => page,
            Err(()) => {
                response.status = 500;
                builtin_page(500, problem::reason(500), "internal error")
            }
        };
        let body = Bytes::from(page);
        let had_etag = response.meta.get("etag").is_some();
        let mut meta = Meta(
            response
                .meta
                .0
                .into_iter()
                .filter(|(k, _)| !matches!(k.as_str(), "content-type" | "etag"))
                .collect(),
        );
        meta.push("content-type", HTML);
        if had_etag {
            // Another representation: its own tag, from its own bytes.
            meta.push("etag", etag_of(&body));
        }
        response.meta = meta;
        response.body = body;
        response
    }

    /// The error page for `status` with the problem `detail`: the
    /// `error.html` template (given `status`, `title`, `detail`, `errors`)
    /// when the directory has one, else the built-in page. Never a trace.
    fn error_page(&self, status: u16, problem: &serde_json::Value, log: &impl Fn(&str)) -> String {
        let title = problem["title"].as_str().unwrap_or(problem::reason(status));
        let detail = problem["detail"].as_str().unwrap_or("");
        if self.has("error.html") {
            let context = minijinja::context! {
                status => status,
                title => title,
                detail => detail,
                errors => Value::from_serialize(&problem["errors"]),
            };
            match self.render("error.html", context) {
                Ok(page) => return page,
                Err(err) => log(&format!("template `error.html` failed: {err:#}")),
            }
        }
        switchyard_proto::web::problem_page(status, problem)
    }
}

pub use crate::reply::etag_of;

/// The page shown when no template is at hand (shared with the
/// listener's own error pages).
pub use switchyard_proto::web::error_page as builtin_page;

/// `url_for("demo.Hello", name="Ada")` → `/hello/Ada`: the route of the
/// event named, its `{param}`s filled (percent-encoded; a `{*rest}` keeps
/// its slashes) and the other arguments as the query string.
fn url_for(
    routes: &HashMap<String, String>,
    name: &str,
    params: &Kwargs,
) -> Result<String, minijinja::Error> {
    let pattern = routes.get(name).ok_or_else(|| {
        minijinja::Error::new(
            ErrorKind::InvalidOperation,
            format!("url_for: no route known for event `{name}` (declare it, or r.link::<E>())"),
        )
    })?;
    let mut used = Vec::new();
    let mut url = String::new();
    let mut rest = pattern.as_str();
    while let Some(open) = rest.find('{') {
        url.push_str(&rest[..open]);
        let close = rest[open..].find('}').map(|c| open + c).ok_or_else(|| {
            minijinja::Error::new(ErrorKind::InvalidOperation, "url_for: a malformed route")
        })?;
        let param = &rest[open + 1..close];
        let (param, catch_all) = match param.strip_prefix('*') {
            Some(p) => (p, true),
            None => (param, false),
        };
        let value: Value = params.get(param).map_err(|_| {
            minijinja::Error::new(
                ErrorKind::MissingArgument,
                format!("url_for(`{name}`): missing parameter `{param}`"),
            )
        })?;
        let text = value.as_str().map_or_else(|| value.to_string(), str::to_owned);
        url.push_str(&encode(&text, catch_all));
        used.push(param.to_owned());
        rest = &rest[close + 1..];
    }
    url.push_str(rest);
    let mut query = Vec::new();
    for arg in params.args() {
        if used.iter().any(|u| u == arg) {
            continue;
        }
        let value: Value = params.get(arg)?;
        query.push((
            arg.to_owned(),
            value.as_str().map_or_else(|| value.to_string(), str::to_owned),
        ));
    }
    if !query.is_empty() {
        let encoded = serde_urlencoded::to_string(&query)
            .map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
        url.push('?');
        url.push_str(&encoded);
    }
    Ok(url)
}

/// Percent-encodes a path segment (everything but RFC 3986 unreserved
/// characters; `/` too unless `keep_slash`).
fn encode(text: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) || (keep_slash && b == b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_by_accept() {
        let html = Some("hello.html");
        assert_eq!(choose(None, html), Ok(Choice::Encoded(Format::Json)));
        assert_eq!(choose(Some("text/html"), html), Ok(Choice::Html("hello.html")));
        assert_eq!(choose(Some("text/html"), None).unwrap_err().status, 406);
        assert_eq!(choose(Some("*/*"), None), Ok(Choice::Encoded(Format::Json)));
        assert_eq!(
            choose(Some("application/x-bincode"), None),
            Ok(Choice::Encoded(Format::Bincode))
        );
        let refused = choose(Some("image/png"), html).unwrap_err();
        let body: serde_json::Value = serde_json::from_slice(&refused.body).unwrap();
        assert_eq!(body["offered"][1], "text/html");
    }

    #[test]
    fn urls_from_routes() {
        let routes = HashMap::from([
            ("demo.Hello".to_owned(), "/hello/{name}".to_owned()),
            ("demo.File".to_owned(), "/files/{*path}".to_owned()),
        ]);
        let env = {
            let mut env = Environment::new();
            env.add_function("url_for", move |name: String, params: Kwargs| {
                url_for(&routes, &name, &params)
            });
            env
        };
        let render = |src: &str| env.render_str(src, ()).map_err(|e| e.to_string());
        assert_eq!(
            render("{{ url_for('demo.Hello', name='a b/<c>') }}").unwrap(),
            "/hello/a%20b%2F%3Cc%3E"
        );
        assert_eq!(
            render("{{ url_for('demo.File', path='x/y z') }}").unwrap(),
            "/files/x/y%20z"
        );
        assert_eq!(
            render("{{ url_for('demo.Hello', name='a', lang='fr') }}").unwrap(),
            "/hello/a?lang=fr"
        );
        assert!(
            render("{{ url_for('demo.Nope') }}")
                .unwrap_err()
                .contains("no route")
        );
        assert!(
            render("{{ url_for('demo.Hello') }}")
                .unwrap_err()
                .contains("missing parameter")
        );
    }
}
