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
        for ((method, path), entry) in &known {
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
            types,
            notifications,
            table,
        }
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
