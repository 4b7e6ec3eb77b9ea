//! The route table: method + path pattern → event type.
//!
//! Routes are merged, not forgotten: when a manager goes down its routes
//! stay, so requests to them get 503 from the router rather than 404 here.
//! Only a manager a reload removed from the group (`RouteTable::retired`)
//! takes its routes with it.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use switchyard_proto::EventType;
use switchyard_proto::control::{DeclaredType, RequestNeeds, RouteEntry, RouteTable};

use crate::metrics::RouteStats;
use switchyard_middleware::paths::EventPaths;

/// A snapshot of the routes, swapped whole on every change.
#[derive(Default)]
pub(crate) struct Routes {
    known: BTreeMap<(String, String), Arc<RouteEntry>>,
    /// Each route with its request counters (`metrics`), found here once
    /// rather than per request.
    by_method: HashMap<String, matchit::Router<Routed>>,
    /// What each request type reads of its request; merged, never
    /// forgotten, like the routes.
    needs: HashMap<EventType, Arc<RequestNeeds>>,
    /// Each routed event type's path templates: what a `prefix` rule
    /// covers when the event comes without a path (a WebSocket message, a
    /// gRPC call), derived once per table rather than per message; and
    /// the count of tables merged, so that what was decided on an older
    /// snapshot is known to be older.
    paths: Arc<EventPaths>,
    /// The request types managers declare and the notification types
    /// they subscribe to or emit, by id: what a client may name
    /// ([`crate::public`]); merged, never forgotten, like the routes.
    types: HashMap<EventType, DeclaredType>,
    notifications: HashMap<EventType, DeclaredType>,
    /// The router's last view of manager health.
    pub(crate) table: RouteTable,
}

#[derive(Clone)]
struct Routed {
    entry: Arc<RouteEntry>,
    stats: &'static RouteStats,
}

/// A matched route and its path parameters.
pub(crate) struct Matched {
    pub(crate) entry: Arc<RouteEntry>,
    /// Its request counters.
    pub(crate) stats: &'static RouteStats,
    pub(crate) params: Vec<(String, String)>,
    /// What its type reads of the request (`None`: nothing).
    pub(crate) needs: Option<Arc<RequestNeeds>>,
}

pub(crate) enum Lookup {
    Found(Matched),
    /// The path exists for these other methods.
    WrongMethod(Vec<String>),
    NotFound,
    /// This parameter decodes to text with a NUL character: refused (400)
    /// before it reaches a handler, where C strings, file names and logs
    /// would cut or mistake it. No route opts in yet (decision 0024).
    NulInParam(String),
}

impl Routes {
    /// This snapshot with `table` merged in.
    pub(crate) fn merged(&self, table: RouteTable) -> Routes {
        let mut known = self.known.clone();
        for entry in &table.routes {
            let key = (entry.route.method.clone(), entry.route.path.clone());
            known.insert(key, Arc::new(entry.clone()));
        }
        let mut needs = self.needs.clone();
        for declared in &table.needs {
            needs.insert(declared.event_type, Arc::new(declared.needs.clone()));
        }
        let mut types = self.types.clone();
        types.extend(table.types.iter().map(|t| (t.event_type, t.clone())));
        let mut notifications = self.notifications.clone();
        notifications.extend(table.notifications.iter().map(|t| (t.event_type, t.clone())));
        known.retain(|_, entry| !table.retired.contains(&entry.manager));
        let mut by_method: HashMap<String, matchit::Router<Routed>> = HashMap::new();
        let mut paths: HashMap<String, Vec<String>> = HashMap::new();
        for ((method, path), entry) in &known {
            let of_type = paths.entry(entry.type_name.clone()).or_default();
            if !of_type.contains(path) {
                of_type.push(path.clone());
            }
            let router = by_method.entry(method.clone()).or_default();
            let routed = Routed {
                entry: entry.clone(),
                stats: crate::metrics::route(method, path),
            };
            if let Err(err) = router.insert(path.clone(), routed) {
                tracing::error!(%method, %path, %err, "route conflicts with another; ignored");
            }
        }
        Routes {
            known,
            by_method,
            needs,
            paths: Arc::new(EventPaths::new(paths, self.paths.generation() + 1)),
            types,
            notifications,
            table,
        }
    }

    /// The path templates of the routes of event type `name` (none for a
    /// type without a route).
    pub(crate) fn paths_of(&self, name: &str) -> &[String] {
        self.paths.paths_of(name)
    }

    /// Each routed event type's path templates: what the middleware's
    /// rules read of the table.
    pub(crate) fn event_paths(&self) -> &Arc<EventPaths> {
        &self.paths
    }

    /// The request headers some type declares, and whether some type
    /// declares a cookie.
    pub(crate) fn declared_headers(&self) -> (std::collections::HashSet<&str>, bool) {
        let mut names = std::collections::HashSet::new();
        let mut cookies = false;
        for needs in self.needs.values() {
            names.extend(needs.headers.iter().map(String::as_str));
            cookies |= !needs.cookies.is_empty();
        }
        (names, cookies)
    }

    /// The request type some manager declares with id `event_type`.
    pub(crate) fn request_type(&self, event_type: EventType) -> Option<&DeclaredType> {
        self.types.get(&event_type)
    }

    /// The notification type some manager subscribes to or emits with id
    /// `event_type`.
    pub(crate) fn notification_type(&self, event_type: EventType) -> Option<&DeclaredType> {
        self.notifications.get(&event_type)
    }

    /// What requests of `event_type` read of their request.
    pub(crate) fn needs(&self, event_type: EventType) -> Option<Arc<RequestNeeds>> {
        if self.needs.is_empty() {
            return None;
        }
        self.needs.get(&event_type).cloned()
    }

    pub(crate) fn lookup(&self, method: &str, path: &str) -> Lookup {
        if let Some(router) = self.by_method.get(method)
            && let Ok(m) = router.at(path)
        {
            let params: Vec<(String, String)> = m
                .params
                .iter()
                .map(|(k, v)| (k.to_owned(), percent_decode(v)))
                .collect();
            if let Some((name, _)) = params.iter().find(|(_, v)| v.contains('\0')) {
                return Lookup::NulInParam(name.clone());
            }
            return Lookup::Found(Matched {
                entry: m.value.entry.clone(),
                stats: m.value.stats,
                params,
                needs: self.needs(m.value.entry.event_type),
            });
        }
        let allowed: Vec<String> = self
            .by_method
            .iter()
            .filter(|(m, r)| m.as_str() != method && r.at(path).is_ok())
            .map(|(m, _)| m.clone())
            .collect();
        if allowed.is_empty() {
            Lookup::NotFound
        } else {
            Lookup::WrongMethod(allowed)
        }
    }
}

/// Why a request path is refused before anything looks at it (400).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BadPath {
    /// `%2F`: one segment would hold two.
    EncodedSlash,
    /// `%5C`: a separator on other systems.
    EncodedBackslash,
    /// `%00`.
    EncodedNul,
    /// `%` not followed by two hex digits.
    Malformed,
}

impl BadPath {
    pub(crate) fn detail(&self) -> &'static str {
        match self {
            BadPath::EncodedSlash => "the path contains an encoded `/` (%2F); send the segments as they are",
            BadPath::EncodedBackslash => "the path contains an encoded backslash (%5C)",
            BadPath::EncodedNul => "the path contains an encoded NUL character (%00)",
            BadPath::Malformed => "the path contains a `%` that is not followed by two hex digits",
        }
    }
}

/// The request path every rule, route and static mount sees (decision
/// 0104): escapes of unreserved characters (RFC 3986 §2.3: letters, digits,
/// `-`, `.`, `_`, `~`) decoded, since they name the same resource as the
/// character itself (`/users/%61dmin` is `/users/admin`); every other
/// escape kept, its hex digits in upper case, so one resource has one
/// spelling. An encoded `/`, `\` or NUL, or a malformed escape, is
/// refused: no rule could say which path it stands for. `None`: the path
/// is already normal.
pub(crate) fn normalize_path(path: &str) -> Result<Option<String>, BadPath> {
    let bytes = path.as_bytes();
    let Some(first) = bytes.iter().position(|&b| b == b'%') else {
        return Ok(None);
    };
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = String::with_capacity(path.len());
    out.push_str(&path[..first]);
    let mut i = first;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'%' {
            // Up to the next escape, as it came (a `%` is ASCII, so this
            // cuts on a character boundary).
            let next = bytes[i..]
                .iter()
                .position(|&c| c == b'%')
                .map_or(bytes.len(), |n| i + n);
            out.push_str(&path[i..next]);
            i = next;
            continue;
        }
        let (Some(hi), Some(lo)) = (
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) else {
            return Err(BadPath::Malformed);
        };
        let value = (hi << 4) | lo;
        match value {
            b'/' => return Err(BadPath::EncodedSlash),
            b'\\' => return Err(BadPath::EncodedBackslash),
            0 => return Err(BadPath::EncodedNul),
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(value as char),
            _ => {
                out.push('%');
                out.push(char::from(b"0123456789ABCDEF"[usize::from(hi)]));
                out.push(char::from(b"0123456789ABCDEF"[usize::from(lo)]));
            }
        }
        i += 3;
    }
    Ok((out != path).then_some(out))
}

/// Decodes `%XX` escapes; invalid escapes are kept raw, and a result that
/// is not UTF-8 leaves the whole input raw. `+` stays `+` (a path is not a
/// form).
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .map_or_else(|_| s.to_owned(), |decoded| decoded.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::control::HttpRoute;

    fn entry(method: &str, path: &str) -> RouteEntry {
        RouteEntry {
            route: HttpRoute {
                method: method.into(),
                path: path.into(),
                stream_body: false,
            },
            event_type: EventType::of(path),
            type_name: path.into(),
            manager: "m".into(),
        }
    }

    #[test]
    fn match_params_methods_and_merge() {
        let table = RouteTable {
            routes: vec![entry("GET", "/hello/{name}"), entry("POST", "/echo")],
            ..Default::default()
        };
        let routes = Routes::default().merged(table);
        match routes.lookup("GET", "/hello/J%C3%BCrgen") {
            Lookup::Found(m) => assert_eq!(m.params, vec![("name".into(), "Jürgen".into())]),
            _ => panic!("no match"),
        }
        assert!(matches!(routes.lookup("GET", "/echo"), Lookup::WrongMethod(m) if m == ["POST"]));
        assert!(matches!(routes.lookup("GET", "/hello/a%00b"), Lookup::NulInParam(p) if p == "name"));
        // Only a decoded NUL: the text `%2500` is `%00`, not NUL.
        match routes.lookup("GET", "/hello/%2500") {
            Lookup::Found(m) => assert_eq!(m.params, vec![("name".into(), "%00".into())]),
            _ => panic!("no match"),
        }
        assert!(matches!(routes.lookup("GET", "/nope"), Lookup::NotFound));
        // A later table without /echo does not forget it.
        let routes = routes.merged(RouteTable {
            routes: vec![entry("GET", "/noop")],
            ..Default::default()
        });
        assert!(matches!(routes.lookup("POST", "/echo"), Lookup::Found(_)));
        assert!(matches!(routes.lookup("GET", "/noop"), Lookup::Found(_)));
        // A manager removed from the group takes its routes with it.
        let routes = routes.merged(RouteTable {
            retired: vec!["m".into()],
            ..Default::default()
        });
        assert!(matches!(routes.lookup("GET", "/noop"), Lookup::NotFound));
    }

    #[test]
    fn paths_are_normalized_once() {
        assert_eq!(normalize_path("/plain/path"), Ok(None));
        assert_eq!(normalize_path("/users/%61dmin"), Ok(Some("/users/admin".into())));
        assert_eq!(
            normalize_path("/files/%70rivate/x"),
            Ok(Some("/files/private/x".into()))
        );
        assert_eq!(normalize_path("/a%7E%2d%2E%5f"), Ok(Some("/a~-._".into())));
        // Reserved and non-ASCII escapes stay escaped, in one spelling.
        assert_eq!(normalize_path("/a%20b"), Ok(None));
        assert_eq!(normalize_path("/caf%c3%a9"), Ok(Some("/caf%C3%A9".into())));
        assert_eq!(normalize_path("/x%3f"), Ok(Some("/x%3F".into())));
        assert_eq!(normalize_path("/a%2fb"), Err(BadPath::EncodedSlash));
        assert_eq!(normalize_path("/a%2Fb"), Err(BadPath::EncodedSlash));
        assert_eq!(normalize_path("/a%5cb"), Err(BadPath::EncodedBackslash));
        assert_eq!(normalize_path("/a%00"), Err(BadPath::EncodedNul));
        assert_eq!(normalize_path("/100%"), Err(BadPath::Malformed));
        assert_eq!(normalize_path("/%zz"), Err(BadPath::Malformed));
        assert_eq!(normalize_path("/%+f"), Err(BadPath::Malformed));
        // Once: a `%25` stays, so `%2561` is the text `%61`, not `a`.
        assert_eq!(normalize_path("/%2561"), Ok(None));
    }

    #[test]
    fn percent_decoding_is_lenient() {
        assert_eq!(percent_decode("a%20b"), "a b");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
        assert_eq!(percent_decode("%ff"), "%ff");
        assert_eq!(percent_decode("caf%C3%A9%zz"), "café%zz");
        assert_eq!(percent_decode("%2"), "%2");
        assert_eq!(percent_decode("a+b%2Bc"), "a+b+c");
        // Two hex digits make an escape, nothing else: not a signed number.
        assert_eq!(percent_decode("%+f"), "%+f");
    }
}
