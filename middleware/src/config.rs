//! The middleware's settings, as `switchyard.toml` spells them: the
//! top-level sections `[auth]` (with `[auth.jwt]`, `[auth.api_keys]`,
//! `[auth.basic]`, `[auth.websocket]` and `[[auth.rules]]`), `[cors]`,
//! `[rate_limit]` (with `[[rate_limit.limits]]`), `[compression]` and
//! `[security_headers]`. The supervisor parses them (serde, unknown keys
//! refused) and checks them with [`check`](crate::check), which builds
//! the very stack the listener will run, so a bad key file or value is
//! reported, naming its key, before any process starts. Every key and
//! status is described in docs/middleware.md.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use switchyard_proto::control::pattern_prefix;

/// Every built-in middleware's settings.
#[derive(Clone, Debug, Default)]
pub struct MiddlewareConfig {
    /// `[auth]`: who may call what.
    pub auth: AuthConfig,
    /// `[cors]`: which browser origins may call.
    pub cors: CorsConfig,
    /// `[rate_limit]`: how often a client may call.
    pub rate_limit: RateLimitConfig,
    /// `[compression]`: response compression, request decoding.
    pub compression: CompressionConfig,
    /// `[security_headers]`: headers added to every HTTP response.
    pub security_headers: SecurityHeadersConfig,
}

/// `[auth]`. With no `[[auth.rules]]` nothing is required; a credential a
/// client sends is still checked (a bad one gets 401), so handlers can see
/// who called on public routes too.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The realm named in `WWW-Authenticate`. Default `"switchyard"`.
    pub realm: String,
    /// Bearer JSON Web Tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwt: Option<JwtConfig>,
    /// API keys in a header, stored as SHA-256 hashes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_keys: Option<ApiKeysConfig>,
    /// HTTP Basic, passwords stored as argon2 hashes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicConfig>,
    /// Where a WebSocket client may put its token.
    pub websocket: WsAuthConfig,
    /// What each route prefix or event type requires; the first rule that
    /// matches decides, and a request no rule matches requires nothing.
    pub rules: Vec<AuthRule>,
    /// Internal event types opened to WebSocket and gRPC clients: exact
    /// names, `prefix.*` or `*` (`["store.Get", "scheduler.*"]`). The
    /// rules then apply to them as to public ones. Default: none, so the
    /// built-in `store.*` and `scheduler.*` answer managers only
    /// (decision 0108).
    pub expose: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            realm: "switchyard".to_owned(),
            jwt: None,
            api_keys: None,
            basic: None,
            websocket: WsAuthConfig::default(),
            rules: Vec::new(),
            expose: Vec::new(),
        }
    }
}

impl AuthConfig {
    /// Whether any credential can be checked at all.
    pub fn any_method(&self) -> bool {
        self.jwt.is_some() || self.api_keys.is_some() || self.basic.is_some()
    }
}

/// Whether `expose` (`[auth] expose`: exact names, `prefix.*` or `*`)
/// opens `name` to clients.
pub fn exposed(expose: &[String], name: &str) -> bool {
    expose.iter().any(|pattern| match pattern_prefix(pattern) {
        Ok(Some(prefix)) => name.starts_with(prefix),
        Ok(None) => pattern == name,
        Err(_) => false,
    })
}

/// Checks the `[auth] expose` patterns; the error names the key at fault.
pub fn check_expose(expose: &[String]) -> Result<(), String> {
    for (i, pattern) in expose.iter().enumerate() {
        pattern_prefix(pattern).map_err(|why| format!("auth.expose[{i}]: {why}"))?;
    }
    Ok(())
}

/// `[auth.jwt]`: `Authorization: Bearer <JWT>`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct JwtConfig {
    /// The algorithms accepted (`HS256`, `HS384`, `HS512`, `RS256`,
    /// `RS384`, `RS512`, `PS256`, `PS384`, `PS512`, `ES256`, `ES384`,
    /// `EdDSA`); a token signed with any other, `none` included, gets 401.
    /// Each key verifies only the algorithms of its own family, so an RSA
    /// public key is never used as an HMAC secret. Required.
    pub algorithms: Vec<String>,
    /// The HMAC secret (HS*), as text. Prefer `secret_file`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// A file holding the HMAC secret (HS*); trailing newlines are not part
    /// of it. Relative to the configuration file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// A PEM public key (RSA, EC P-256/P-384 or Ed25519). Relative to the
    /// configuration file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub public_key_file: Option<PathBuf>,
    /// A JWKS document (`{"keys": [...]}`); a token's `kid` picks its key.
    /// Relative to the configuration file.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub jwks_file: Option<PathBuf>,
    /// Accepted `iss` values; when set, a token must carry one of them.
    pub issuer: Vec<String>,
    /// Accepted `aud` values; when set, a token must carry one of them.
    pub audience: Vec<String>,
    /// With `public_key_file` or `jwks_file` (an identity provider's keys,
    /// which sign tokens for every service it serves), `issuer` must be
    /// set unless this waives it. Default false.
    pub any_issuer: bool,
    /// Likewise for `audience`: without it, a token the provider minted
    /// for another service verifies here. Default false.
    pub any_audience: bool,
    /// Seconds of clock skew allowed on `exp` and `nbf`. Default 30.
    pub leeway_s: u64,
    /// Whether a token without `exp` is refused. Default true.
    pub require_exp: bool,
    /// The claim that lists the caller's roles (an array of strings, or
    /// one string of space-separated roles). Default `"roles"`.
    pub roles_claim: String,
    /// Seconds a token that verified is remembered, so that the same
    /// token on the next requests skips its signature and claims checks;
    /// never past the token's `exp`, and forgotten on reload. 0: verify
    /// every request. Default 60, at most 3600 (decision 0085).
    pub cache_s: u64,
}

impl Default for JwtConfig {
    fn default() -> Self {
        JwtConfig {
            algorithms: Vec::new(),
            secret: None,
            secret_file: None,
            public_key_file: None,
            jwks_file: None,
            issuer: Vec::new(),
            audience: Vec::new(),
            any_issuer: false,
            any_audience: false,
            leeway_s: 30,
            require_exp: true,
            roles_claim: "roles".to_owned(),
            cache_s: 60,
        }
    }
}

/// `[auth.api_keys]`: a key in a request header.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ApiKeysConfig {
    /// The header carrying the key. Default `"x-api-key"`.
    pub header: String,
    /// The accepted keys.
    pub keys: Vec<ApiKey>,
}

impl Default for ApiKeysConfig {
    fn default() -> Self {
        ApiKeysConfig {
            header: "x-api-key".to_owned(),
            keys: Vec::new(),
        }
    }
}

/// `[[auth.api_keys.keys]]`: one key, never stored in clear.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKey {
    /// The caller's subject when this key is used.
    pub name: String,
    /// SHA-256 of the key, 64 hex digits (`printf %s KEY | sha256sum`).
    pub sha256: String,
    /// The caller's roles.
    #[serde(default)]
    pub roles: Vec<String>,
}

/// `[auth.basic]`: `Authorization: Basic`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BasicConfig {
    /// The accepted users.
    pub users: Vec<BasicUser>,
    /// Seconds a verified user-and-password pair is remembered, so that the
    /// slow hash is not paid on every request. Default 60; 0 turns the
    /// cache off.
    pub cache_s: u64,
    /// Password hashes one client address may have computed per minute
    /// (cache misses: new or wrong passwords); past it, 429. Default 10.
    pub verifications_per_minute: u32,
}

impl Default for BasicConfig {
    fn default() -> Self {
        BasicConfig {
            users: Vec::new(),
            cache_s: 60,
            verifications_per_minute: 10,
        }
    }
}

/// `[[auth.basic.users]]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicUser {
    /// The user name (and subject).
    pub name: String,
    /// The password's argon2 hash in PHC form (`$argon2id$v=19$...`).
    pub argon2: String,
    /// The user's roles.
    #[serde(default)]
    pub roles: Vec<String>,
}

/// Where a WebSocket upgrade's token may come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenSource {
    /// `Authorization: Bearer <token>` (or Basic, or the API key header).
    Header,
    /// `Sec-WebSocket-Protocol: bearer.<token>` beside a real protocol name.
    Subprotocol,
    /// `?<query_param>=<token>` on the upgrade's URL.
    Query,
}

/// `[auth.websocket]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WsAuthConfig {
    /// Where a token may come from, in order. Default `["header"]`
    /// (browsers cannot set headers on a WebSocket: add `"subprotocol"` or
    /// `"query"` for them; a query parameter may end up in access logs).
    pub token_from: Vec<TokenSource>,
    /// The query parameter of `"query"`. Default `"access_token"`.
    pub query_param: String,
}

impl Default for WsAuthConfig {
    fn default() -> Self {
        WsAuthConfig {
            token_from: vec![TokenSource::Header],
            query_param: "access_token".to_owned(),
        }
    }
}

/// What a rule requires.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Require {
    /// An authenticated caller (with `roles` and `claims`, when given).
    #[default]
    Identity,
    /// Nothing: an exception before a broader rule.
    None,
}

/// `[[auth.rules]]`: what a route prefix or event type requires.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthRule {
    /// A path prefix, matched segment by segment (`/admin` covers `/admin`
    /// and `/admin/x`, not `/administrator`). HTTP requests and WebSocket
    /// upgrades.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// An event type (`shop.Checkout`) or a prefix of types ending in `*`
    /// (`shop.*`). HTTP routes by their event, WebSocket messages, gRPC
    /// calls and subscriptions.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// `"identity"` (default) or `"none"`.
    pub require: Require,
    /// The caller must have at least one of these roles (else 403).
    pub roles: Vec<String>,
    /// The caller's claims must have these values (a claim that is an
    /// array must contain it; else 403).
    pub claims: BTreeMap<String, String>,
}

/// `[cors]`. Off while `allow_origins` is empty.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CorsConfig {
    /// Origins allowed (`https://app.example`), or `["*"]` for any.
    pub allow_origins: Vec<String>,
    /// Methods a preflight allows. Default GET, HEAD, POST, PUT, PATCH,
    /// DELETE.
    pub allow_methods: Vec<String>,
    /// Request headers a preflight allows. Default `content-type`,
    /// `authorization`, `x-api-key`, `x-request-id`.
    pub allow_headers: Vec<String>,
    /// Response headers scripts may read. Default none.
    pub expose_headers: Vec<String>,
    /// Whether cookies and `Authorization` may be sent cross-origin (not
    /// with the `*` origin). Default false.
    pub allow_credentials: bool,
    /// Seconds a browser may cache a preflight answer. Default 600.
    pub max_age_s: u64,
}

impl Default for CorsConfig {
    fn default() -> Self {
        CorsConfig {
            allow_origins: Vec::new(),
            allow_methods: ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE"]
                .map(str::to_owned)
                .to_vec(),
            allow_headers: ["content-type", "authorization", "x-api-key", "x-request-id"]
                .map(str::to_owned)
                .to_vec(),
            expose_headers: Vec::new(),
            allow_credentials: false,
            max_age_s: 600,
        }
    }
}

/// `[rate_limit]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimitConfig {
    /// The limits; every one that matches a request applies.
    pub limits: Vec<RateLimit>,
    /// Clients each limit tracks at once per listener process. Clients
    /// idle long enough to have a full bucket again are forgotten first;
    /// past the bound, new clients share one bucket until room is made.
    /// Default 100 000 (a few MiB).
    pub max_clients: usize,
    /// An IPv6 client is counted by this many leading bits of its address
    /// (a client usually holds a whole /64); 128 counts every address on
    /// its own. Default 64.
    pub ipv6_prefix: u8,
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            limits: Vec::new(),
            max_clients: 100_000,
            ipv6_prefix: 64,
        }
    }
}

/// Whose requests a limit counts together.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateKey {
    /// The client's address (IP).
    #[default]
    Address,
    /// The API key's name; a request without one counts by address.
    ApiKey,
    /// The authenticated subject; an anonymous request counts by address.
    Identity,
}

/// `[[rate_limit.limits]]`: a token bucket per client.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RateLimit {
    /// A path prefix this limit covers (default: every path).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// An event type or `prefix.*` this limit covers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Whose requests count together.
    pub key: RateKey,
    /// Requests allowed per `per_s` seconds, sustained.
    pub requests: u32,
    /// The window of `requests`, in seconds. Default 1.
    pub per_s: u64,
    /// Requests allowed at once after a quiet period (the bucket's size).
    /// Default: `requests`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit {
            prefix: None,
            event: None,
            key: RateKey::Address,
            requests: 0,
            per_s: 1,
            burst: None,
        }
    }
}

/// `[compression]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompressionConfig {
    /// Whether responses are compressed for clients that accept it.
    /// Default true.
    pub enabled: bool,
    /// Encodings offered, in the server's preference for equal client
    /// weights: `zstd`, `br`, `gzip`. Default all three.
    pub algorithms: Vec<String>,
    /// Smallest response compressed, in bytes (at most 65535). Default 1024.
    pub min_bytes: u16,
    /// Content types compressed (a type, or a prefix ending in `/`).
    /// Default: `text/`, JSON, JavaScript, XML, SVG, problem+json, wasm.
    pub content_types: Vec<String>,
    /// Whether request bodies with `Content-Encoding` gzip, deflate, br or
    /// zstd are decoded; the body limits then count decoded bytes. Other
    /// encodings get 415. Default true.
    pub decode_requests: bool,
    /// A decoded request body may be at most this many times the bytes
    /// received (past its first MiB); more is refused with 413. Default
    /// 200, Apache's `DeflateInflateRatioLimit`.
    pub max_decode_ratio: u32,
}

impl Default for CompressionConfig {
    fn default() -> Self {
        CompressionConfig {
            enabled: true,
            algorithms: ["zstd", "br", "gzip"].map(str::to_owned).to_vec(),
            min_bytes: 1024,
            content_types: [
                "text/",
                "application/json",
                "application/problem+json",
                "application/javascript",
                "application/xml",
                "image/svg+xml",
                "application/wasm",
            ]
            .map(str::to_owned)
            .to_vec(),
            decode_requests: true,
            max_decode_ratio: 200,
        }
    }
}

/// `[security_headers]`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecurityHeadersConfig {
    /// Whether the headers are added. Default true.
    pub enabled: bool,
    /// Headers added to every HTTP response that does not set them itself.
    /// Defaults: `x-content-type-options = "nosniff"`, `referrer-policy =
    /// "no-referrer"`, `x-frame-options = "DENY"`,
    /// `content-security-policy = "frame-ancestors 'none'"`,
    /// `cross-origin-opener-policy = "same-origin"`. A key given here
    /// replaces the default of that name; an empty value removes it.
    pub headers: BTreeMap<String, String>,
}

impl Default for SecurityHeadersConfig {
    fn default() -> Self {
        SecurityHeadersConfig {
            enabled: true,
            headers: BTreeMap::new(),
        }
    }
}

/// The security headers before `[security_headers.headers]` changes them.
pub const DEFAULT_SECURITY_HEADERS: &[(&str, &str)] = &[
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
    ("content-security-policy", "frame-ancestors 'none'"),
    ("cross-origin-opener-policy", "same-origin"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expose_patterns() {
        let expose = ["store.Get".to_owned(), "scheduler.*".to_owned()];
        assert!(exposed(&expose, "store.Get"));
        assert!(!exposed(&expose, "store.GetMany"));
        assert!(exposed(&expose, "scheduler.Schedule"));
        assert!(!exposed(&expose, "schedulers.X"));
        assert!(check_expose(&expose).is_ok());
        assert!(
            check_expose(&["store*".to_owned()])
                .unwrap_err()
                .starts_with("auth.expose[0]")
        );
    }
}
