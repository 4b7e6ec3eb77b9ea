//! The request's context: who the client is (through trusted proxies),
//! the request id, and the part of the request an event declares it reads
//! ([`RequestNeeds`]), copied into the event's meta.
//!
//! Only what the event's type declares is copied: a type that declares
//! nothing travels with its body, path parameters, query and content type
//! alone (plus the request id when `[request_id]` is on). Every key this
//! module writes begins with `:`, which no HTTP header name can, so no
//! client can forge one and no response can leak one as a header
//! (docs/http.md, decision 0041).

use std::net::{IpAddr, SocketAddr};

use http::{HeaderMap, HeaderName};
use ipnet::IpNet;
use switchyard_proto::control::RequestNeeds;
use switchyard_proto::event::{
    META_CLIENT, META_COOKIE_PREFIX, META_HEADER_PREFIX, META_IDENTITY, META_METHOD, META_PATH,
    META_SCOPE_PREFIX, META_TIMING,
};
use switchyard_proto::{Envelope, RequestContext, RequestId, TraceContext};

use crate::routes::Routes;
use switchyard_middleware::identity::{AuthMethod, Identity};

/// `[request_id]`: take or make an id per request, carried through every
/// hop into the logs and back in the reply.
#[derive(Clone, Debug)]
pub struct RequestIdConfig {
    /// Whether requests get an id at all.
    pub enabled: bool,
    /// The header it is read from and answered in (`x-request-id`).
    pub header: HeaderName,
    /// Whether a client's own id (1 to 128 visible ASCII characters) is
    /// kept; otherwise every request gets a fresh one.
    pub accept_incoming: bool,
}

impl Default for RequestIdConfig {
    fn default() -> Self {
        RequestIdConfig {
            enabled: true,
            header: HeaderName::from_static("x-request-id"),
            accept_incoming: true,
        }
    }
}

/// What the listener knows of a request before it picks a front end, kept
/// in the request's extensions.
#[derive(Clone, Debug)]
pub(crate) struct Client {
    /// The client's address: the peer's, or behind trusted proxies the one
    /// they forwarded.
    pub(crate) ip: Option<IpAddr>,
    /// The request id (when `[request_id]` is on) and W3C trace context
    /// (the listener's span, when `[tracing]` is on): made here once,
    /// printed only where shown (decision 0146).
    pub(crate) context: RequestContext,
    /// Whether the manager is asked to time the request
    /// (`[tracing] server_timing`).
    pub(crate) timing: bool,
}

impl Client {
    /// The context of a request from `peer` with `headers`.
    pub(crate) fn of(
        peer: Option<SocketAddr>,
        headers: &HeaderMap,
        trusted: &[IpNet],
        header: ForwardedHeader,
        ids: &RequestIdConfig,
        tracing: &crate::trace::TracingConfig,
    ) -> Client {
        Client {
            ip: peer.map(|p| client_ip(p.ip(), headers, trusted, header)),
            context: RequestContext {
                request_id: ids.enabled.then(|| take_or_make(headers, ids)),
                trace: tracing.enabled.then(|| crate::trace::take_or_make(headers)),
            },
            timing: tracing.enabled && tracing.server_timing,
        }
    }

    /// The same client, another request (a WebSocket message, a gRPC
    /// stream message): a fresh request id.
    pub(crate) fn next_request(&self) -> Client {
        Client {
            ip: self.ip,
            context: RequestContext {
                request_id: self.context.request_id.as_ref().map(|_| RequestId::make()),
                trace: self.context.trace.map(TraceContext::child),
            },
            timing: self.timing,
        }
    }
}

/// The client's request id if it is acceptable (1 to 128 visible ASCII
/// characters), else a new one.
fn take_or_make(headers: &HeaderMap, ids: &RequestIdConfig) -> RequestId {
    if ids.accept_incoming
        && let Some(value) = headers.get(&ids.header)
        && let Some(id) = RequestId::given(value.as_bytes())
    {
        return id;
    }
    RequestId::make()
}

/// Which header the trusted proxies name the client in
/// (`listener.forwarded_header`). One, never "whichever is there": a
/// proxy appends to the header it knows and passes the other through as
/// the client wrote it, so reading the other would let a client pick its
/// own address (nginx's defaults write `X-Forwarded-For` and pass a
/// client's `Forwarded` on untouched).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForwardedHeader {
    /// `X-Forwarded-For` (nginx, HAProxy, most load balancers).
    #[default]
    XForwardedFor,
    /// `Forwarded` (RFC 7239).
    Forwarded,
}

/// The client's address. A peer in `trusted` is a proxy: the addresses it
/// forwarded (in the `header` they write) are read from the right,
/// skipping trusted proxies; the first one that is not trusted is the
/// client. A client cannot make itself look like another: what it writes
/// into that header is at the left, past an untrusted hop.
pub(crate) fn client_ip(
    peer: IpAddr,
    headers: &HeaderMap,
    trusted: &[IpNet],
    header: ForwardedHeader,
) -> IpAddr {
    let peer = peer.to_canonical();
    let is_trusted = |ip: &IpAddr| trusted.iter().any(|net| net.contains(ip));
    if !is_trusted(&peer) {
        return peer;
    }
    let chain = match header {
        ForwardedHeader::Forwarded => forwarded_for(headers),
        ForwardedHeader::XForwardedFor => x_forwarded_for(headers),
    };
    let mut client = peer;
    for hop in chain.into_iter().rev() {
        match hop {
            // An address we cannot read ("unknown", an obfuscated name):
            // the last proxy we trust is as far as we can tell.
            None => return client,
            Some(ip) => {
                client = ip.to_canonical();
                if !is_trusted(&client) {
                    return client;
                }
            }
        }
    }
    client
}

/// The `for=` addresses of every `Forwarded` element, in order.
fn forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    let mut hops = Vec::new();
    for value in headers.get_all(http::header::FORWARDED) {
        let Ok(value) = value.to_str() else {
            hops.push(None);
            continue;
        };
        for element in value.split(',') {
            let node = element.split(';').find_map(|pair| {
                let (key, value) = pair.split_once('=')?;
                key.trim().eq_ignore_ascii_case("for").then(|| value.trim())
            });
            // An element without `for=` says nothing of the client.
            if let Some(node) = node {
                hops.push(parse_node(node.trim_matches('"')));
            }
        }
    }
    hops
}

fn x_forwarded_for(headers: &HeaderMap) -> Vec<Option<IpAddr>> {
    headers
        .get_all("x-forwarded-for")
        .iter()
        .flat_map(|value| match value.to_str() {
            Ok(text) => text.split(',').map(|h| parse_node(h.trim())).collect::<Vec<_>>(),
            Err(_) => vec![None],
        })
        .collect()
}

/// An address of a forwarding header: `192.0.2.1`, `192.0.2.1:80`,
/// `[2001:db8::1]`, `[2001:db8::1]:80` or a bare IPv6 address.
fn parse_node(node: &str) -> Option<IpAddr> {
    if let Ok(ip) = node.parse::<IpAddr>() {
        return Some(ip);
    }
    if let Some(rest) = node.strip_prefix('[') {
        return rest.split_once(']').and_then(|(ip, _)| ip.parse().ok());
    }
    node.parse::<SocketAddr>().ok().map(|s| s.ip())
}

/// What a front end knows of one request, for [`push`].
pub(crate) struct Front<'a> {
    pub(crate) headers: &'a HeaderMap,
    pub(crate) method: Option<&'a str>,
    pub(crate) path: Option<&'a str>,
    pub(crate) client: &'a Client,
    pub(crate) identity: Option<&'a Identity>,
}

/// What a long-lived front end (a WebSocket session, a gRPC call or
/// stream) knows of its client from the request that opened it: its
/// headers (gRPC metadata; a WebSocket's upgrade), address, request id and
/// identity.
pub(crate) struct Opener {
    pub(crate) headers: HeaderMap,
    pub(crate) client: Client,
    pub(crate) identity: Option<Identity>,
}

impl Opener {
    /// From the opening request's headers and extensions, keeping only the
    /// headers some route declares (`routes`): a session lives long, and a
    /// header value cloned from hyper's would keep its whole read buffer
    /// (kilobytes) alive for as long.
    pub(crate) fn of(headers: &HeaderMap, extensions: &http::Extensions, routes: &Routes) -> Opener {
        let (names, cookies) = routes.declared_headers();
        let mut kept = HeaderMap::new();
        for (name, value) in headers {
            let wanted = names.contains(name.as_str()) || (cookies && name == http::header::COOKIE);
            if wanted && let Ok(copy) = http::HeaderValue::from_bytes(value.as_bytes()) {
                kept.append(name.clone(), copy);
            }
        }
        Opener {
            headers: kept,
            client: extensions.get::<Client>().cloned().unwrap_or(Client {
                ip: None,
                context: RequestContext::default(),
                timing: false,
            }),
            identity: extensions.get::<Identity>().cloned(),
        }
    }

    /// The context of one request made through it, named by `client`'s
    /// request id.
    pub(crate) fn front<'a>(&'a self, client: &'a Client) -> Front<'a> {
        Front {
            headers: &self.headers,
            method: None,
            path: None,
            client,
            identity: self.identity.as_ref(),
        }
    }
}

/// Adds the request's context to an event: its request id and trace
/// context (typed, copied as bytes), and in its meta what `needs`
/// declares (nothing else).
pub(crate) fn push(env: &mut Envelope, needs: Option<&RequestNeeds>, front: &Front<'_>) {
    env.context = front.client.context.clone();
    let meta = &mut env.meta;
    if front.client.timing && front.client.context.trace.is_some() {
        meta.push(META_TIMING, "1");
    }
    let Some(needs) = needs else { return };
    if needs.method
        && let Some(method) = front.method
    {
        meta.push(META_METHOD, method);
    }
    if needs.path
        && let Some(path) = front.path
    {
        meta.push(META_PATH, path);
    }
    if needs.client
        && let Some(ip) = front.client.ip
    {
        meta.push(META_CLIENT, ip.to_string());
    }
    for name in &needs.headers {
        let mut values = front.headers.get_all(name.as_str()).iter();
        let Some(first) = values.next() else { continue };
        let mut joined = String::from_utf8_lossy(first.as_bytes()).into_owned();
        for more in values {
            joined.push_str(", ");
            joined.push_str(&String::from_utf8_lossy(more.as_bytes()));
        }
        meta.push(format!("{META_HEADER_PREFIX}{name}"), joined);
    }
    if !needs.cookies.is_empty() {
        for name in &needs.cookies {
            if let Some(value) = cookie(front.headers, name) {
                meta.push(format!("{META_COOKIE_PREFIX}{name}"), value);
            }
        }
    }
    let Some(identity) = front.identity else { return };
    if needs.identity {
        let value = serde_json::json!({
            "sub": identity.subject,
            "method": method_name(identity.method),
            "claims": &*identity.claims,
        });
        meta.push(META_IDENTITY, value.to_string());
    }
    for name in &needs.scope {
        let claim = identity
            .claims
            .get(name)
            .cloned()
            .or_else(|| (name == "sub").then(|| serde_json::Value::String(identity.subject.clone())));
        if let Some(claim) = claim {
            meta.push(format!("{META_SCOPE_PREFIX}{name}"), claim.to_string());
        }
    }
}

fn method_name(method: AuthMethod) -> &'static str {
    match method {
        AuthMethod::Jwt => "jwt",
        AuthMethod::ApiKey => "api_key",
        AuthMethod::Basic => "basic",
    }
}

/// The first cookie named `name` in the request's `Cookie` headers
/// (malformed pairs are skipped).
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(cookie::Cookie::split_parse)
        .filter_map(Result::ok)
        .find(|c| c.name() == name)
        .map(|c| c.value().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        map
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn forwarded_addresses_count_only_from_trusted_proxies() {
        const XFF: ForwardedHeader = ForwardedHeader::XForwardedFor;
        const FWD: ForwardedHeader = ForwardedHeader::Forwarded;
        let trusted: Vec<IpNet> = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
        let spoof = headers(&[("x-forwarded-for", "1.2.3.4")]);
        // Not from a proxy: the header is the client's word, ignored.
        assert_eq!(
            client_ip(ip("198.51.100.7"), &spoof, &trusted, XFF),
            ip("198.51.100.7")
        );
        assert_eq!(client_ip(ip("10.0.0.1"), &spoof, &trusted, XFF), ip("1.2.3.4"));
        // The client's own forged entry is left of the real one.
        let chain = headers(&[("x-forwarded-for", "6.6.6.6, 203.0.113.5, 10.1.1.1")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &chain, &trusted, XFF),
            ip("203.0.113.5")
        );
        // Every hop trusted: the leftmost.
        let inner = headers(&[("x-forwarded-for", "10.9.9.9, 10.1.1.1")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &inner, &trusted, XFF), ip("10.9.9.9"));
        // Nothing forwarded: the proxy itself.
        assert_eq!(
            client_ip(ip("10.0.0.1"), &HeaderMap::new(), &trusted, XFF),
            ip("10.0.0.1")
        );
        // Only the configured header is read: behind a proxy that writes
        // X-Forwarded-For, a client's own `Forwarded` passes through
        // untouched and must not pick its address (and the other way).
        let both = headers(&[
            (
                "forwarded",
                r#"for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711""#,
            ),
            ("x-forwarded-for", "1.2.3.4"),
        ]);
        assert_eq!(client_ip(ip("::1"), &both, &trusted, XFF), ip("1.2.3.4"));
        assert_eq!(
            client_ip(ip("::1"), &both, &trusted, FWD),
            ip("2001:db8:cafe::17")
        );
        // Forwarded: quoted, bracketed, ports.
        let ported = headers(&[("forwarded", "for=198.51.100.1:8080;by=10.0.0.2")]);
        assert_eq!(
            client_ip(ip("10.0.0.1"), &ported, &trusted, FWD),
            ip("198.51.100.1")
        );
        assert_eq!(client_ip(ip("10.0.0.1"), &ported, &trusted, XFF), ip("10.0.0.1"));
        // An unreadable hop stops the walk at the last trusted proxy.
        let unknown = headers(&[("forwarded", "for=unknown, for=10.2.2.2")]);
        assert_eq!(client_ip(ip("10.0.0.1"), &unknown, &trusted, FWD), ip("10.2.2.2"));
        // IPv4-mapped IPv6 peers are IPv4.
        assert_eq!(
            client_ip(ip("::ffff:10.0.0.1"), &spoof, &trusted, XFF),
            ip("1.2.3.4"),
            "a mapped address of a trusted proxy is trusted"
        );
        assert_eq!(client_ip(ip("10.0.0.1"), &spoof, &[], XFF), ip("10.0.0.1"));
    }

    #[test]
    fn request_ids_are_taken_when_sane_else_made() {
        let cfg = RequestIdConfig::default();
        let id = take_or_make(&headers(&[("x-request-id", "abc-123")]), &cfg).to_string();
        assert_eq!(id, "abc-123");
        for bad in ["a b", &"x".repeat(129), "é"] {
            let mut map = HeaderMap::new();
            map.insert(
                "x-request-id",
                http::HeaderValue::from_bytes(bad.as_bytes()).unwrap(),
            );
            let id = take_or_make(&map, &cfg).to_string();
            assert_ne!(id, bad);
            assert_eq!(id.len(), 26, "{id}");
        }
        let no = RequestIdConfig {
            accept_incoming: false,
            ..RequestIdConfig::default()
        };
        assert_ne!(
            take_or_make(&headers(&[("x-request-id", "abc")]), &no).to_string(),
            "abc"
        );
        let (a, b) = (RequestId::make(), RequestId::make());
        assert_ne!(a, b);
        assert!(RequestId::given(a.to_string().as_bytes()).is_some());
    }

    #[test]
    fn only_what_is_declared_is_copied() {
        let h = headers(&[
            ("user-agent", "curl"),
            ("accept-language", "en"),
            ("accept-language", "fr"),
            ("cookie", "a=1; session=s1"),
            ("cookie", "theme=dark"),
        ]);
        let client = Client {
            ip: Some(ip("192.0.2.1")),
            context: RequestContext {
                request_id: RequestId::given(b"r1"),
                trace: None,
            },
            timing: false,
        };
        let identity = Identity {
            subject: "ada".into(),
            claims: std::sync::Arc::new(
                serde_json::json!({"roles": ["admin"], "sub": "ada"})
                    .as_object()
                    .cloned()
                    .unwrap(),
            ),
            method: AuthMethod::Jwt,
        };
        let front = Front {
            headers: &h,
            method: Some("GET"),
            path: Some("/x"),
            client: &client,
            identity: Some(&identity),
        };
        let mut env = Envelope::request(switchyard_proto::EventType::of("t.X"), 1, bytes::Bytes::new());
        push(&mut env, None, &front);
        assert!(env.meta.0.is_empty(), "{:?}", env.meta);
        assert_eq!(
            env.context.request_id.map(|id| id.to_string()).as_deref(),
            Some("r1")
        );
        let needs = RequestNeeds {
            method: true,
            client: true,
            headers: vec!["accept-language".into(), "x-absent".into()],
            cookies: vec!["session".into(), "theme".into()],
            scope: vec!["roles".into()],
            ..RequestNeeds::default()
        };
        let mut env = Envelope::request(switchyard_proto::EventType::of("t.X"), 1, bytes::Bytes::new());
        push(&mut env, Some(&needs), &front);
        let meta = env.meta;
        assert_eq!(meta.get(":method"), Some("GET"));
        assert_eq!(meta.get(":path"), None);
        assert_eq!(meta.get(":client"), Some("192.0.2.1"));
        assert_eq!(meta.get(":h:accept-language"), Some("en, fr"));
        assert_eq!(meta.get(":h:user-agent"), None);
        assert_eq!(meta.get(":c:session"), Some("s1"));
        assert_eq!(meta.get(":c:theme"), Some("dark"));
        assert_eq!(meta.get(":s:roles"), Some(r#"["admin"]"#));
        assert_eq!(meta.get(":identity"), None);
    }
}
