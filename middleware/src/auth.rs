//! Authentication and the rules that say who may call what.
//!
//! A request's credential (a bearer JWT, an API key, HTTP Basic) is checked
//! when it carries one, whatever the route: a bad credential is a 401, never
//! silently anonymous. The [`Identity`] it proves goes into the request's
//! extensions. Then the first `[[auth.rules]]` entry that matches the
//! request (its path prefix or its event type) decides: nothing required,
//! any identity, or a role or claim (403 when missing).
//!
//! Basic passwords are argon2 hashes, deliberately slow: a verified
//! user-and-password pair is remembered for `cache_s`, and the hashes one
//! client address may have computed are rate-limited, so a client can
//! neither make every request pay the hash nor use it to load the server.
//! Hashes run on the blocking pool, never on the runtime's threads.

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use argon2::password_hash::PasswordHash;
use argon2::{Argon2, PasswordVerifier};
use base64::Engine as _;
use http::HeaderMap;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::config::{AuthConfig, AuthRule, BasicConfig, Require};
use super::jwt::Verifier;
use super::rate::Limiter;
use super::{Pattern, Scope};
use crate::identity::{AuthMethod, Identity};

/// The checkers of `[auth]`, built once per process.
pub(crate) struct Auth {
    pub(crate) realm: String,
    jwt: Option<Verifier>,
    roles_claim: String,
    api_keys: Option<ApiKeys>,
    basic: Option<Basic>,
    rules: Vec<Rule>,
}

/// Why a request is refused.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No credential where one is required (401).
    Missing,
    /// A credential that does not check out (401), and why.
    Invalid(&'static str),
    /// Authenticated, but without the role or claim the rule asks for (403).
    Forbidden(String),
    /// Too many password hashes from this address: 429 after this long.
    Throttled(Duration),
    /// The request is ambiguous about who it is (400), and how.
    Ambiguous(&'static str),
}

struct ApiKeys {
    header: http::HeaderName,
    /// SHA-256 of a key → its subject and roles.
    by_hash: HashMap<[u8; 32], (String, Vec<String>)>,
}

struct Basic {
    users: HashMap<String, (PasswordHash<'static>, Vec<String>)>,
    cache: Mutex<Verified>,
    cache_for: Duration,
    /// Hashes per client address.
    limiter: Limiter,
    /// Hashes at once in this process: as many as there are cores.
    hashing: tokio::sync::Semaphore,
}

/// Recently verified Basic credentials: SHA-256 of `user:password` → when
/// the memory of it ends. Bounded: at [`VERIFIED_MAX`] entries, expired ones
/// go; if none has, the whole cache does (the hashes then get paid again,
/// under the per-address limit).
#[derive(Default)]
struct Verified(HashMap<[u8; 32], Instant>);

const VERIFIED_MAX: usize = 10_000;

struct Rule {
    prefix: Option<String>,
    event: Option<Pattern>,
    require: Require,
    roles: Vec<String>,
    claims: Vec<(String, String)>,
}

impl Auth {
    /// The checkers of `config`; an error names the key at fault.
    pub(crate) fn new(config: &AuthConfig, max_clients: usize, ipv6_prefix: u8) -> Result<Auth, String> {
        let jwt = config.jwt.as_ref().map(Verifier::new).transpose()?;
        let api_keys = match &config.api_keys {
            None => None,
            Some(c) => {
                let header = http::HeaderName::from_bytes(c.header.as_bytes())
                    .map_err(|_| format!("auth.api_keys.header: `{}` is not a header name", c.header))?;
                let mut by_hash = HashMap::new();
                for (i, k) in c.keys.iter().enumerate() {
                    let mut hash = [0u8; 32];
                    let ok = k.sha256.len() == 64
                        && k.sha256.as_bytes().chunks(2).enumerate().all(|(j, pair)| {
                            std::str::from_utf8(pair)
                                .ok()
                                .and_then(|p| u8::from_str_radix(p, 16).ok())
                                .map(|b| hash[j] = b)
                                .is_some()
                        });
                    if !ok {
                        return Err(format!("auth.api_keys.keys[{i}].sha256: 64 hex digits"));
                    }
                    if k.name.is_empty() {
                        return Err(format!("auth.api_keys.keys[{i}].name: must not be empty"));
                    }
                    by_hash.insert(hash, (k.name.clone(), k.roles.clone()));
                }
                Some(ApiKeys { header, by_hash })
            }
        };
        let basic = config
            .basic
            .as_ref()
            .map(|c| basic(c, max_clients, ipv6_prefix))
            .transpose()?;
        let mut rules = Vec::new();
        for (i, r) in config.rules.iter().enumerate() {
            rules.push(rule(i, r)?);
        }
        if rules.iter().any(|r| r.require == Require::Identity) && !config.any_method() {
            return Err(
                "auth.rules: a rule requires an identity, but no method is configured (auth.jwt, auth.api_keys or auth.basic)"
                    .into(),
            );
        }
        Ok(Auth {
            realm: config.realm.clone(),
            roles_claim: config
                .jwt
                .as_ref()
                .map_or_else(|| "roles".to_owned(), |j| j.roles_claim.clone()),
            jwt,
            api_keys,
            basic,
            rules,
        })
    }

    /// Whether a Basic challenge belongs in `WWW-Authenticate`.
    pub(crate) fn offers_basic(&self) -> bool {
        self.basic.is_some()
    }

    /// Whether bearer tokens are accepted.
    pub(crate) fn offers_bearer(&self) -> bool {
        self.jwt.is_some()
    }

    /// The identity the request's credential proves; `Ok(None)` when it
    /// carries none. `token` is a bearer token found elsewhere (a WebSocket
    /// subprotocol or query parameter), tried when the headers have none.
    pub(crate) async fn authenticate(
        &self,
        headers: &HeaderMap,
        token: Option<&str>,
        client: IpAddr,
    ) -> Result<Option<Identity>, Denied> {
        // Two credentials of one kind: which one a proxy in front checked,
        // logged or stripped cannot be known, so neither is taken.
        if headers
            .get_all(http::header::AUTHORIZATION)
            .iter()
            .nth(1)
            .is_some()
        {
            return Err(Denied::Ambiguous(
                "the request has more than one Authorization header",
            ));
        }
        if let Some(keys) = &self.api_keys
            && headers.get_all(&keys.header).iter().nth(1).is_some()
        {
            return Err(Denied::Ambiguous("the request has more than one API key header"));
        }
        if let Some(value) = headers.get(http::header::AUTHORIZATION) {
            let value = value
                .to_str()
                .map_err(|_| Denied::Invalid("malformed Authorization header"))?;
            let (scheme, credential) = value.split_once(' ').unwrap_or((value, ""));
            let credential = credential.trim();
            if scheme.eq_ignore_ascii_case("bearer") && self.jwt.is_some() {
                return self.bearer(credential).map(Some);
            }
            if scheme.eq_ignore_ascii_case("basic")
                && let Some(basic) = &self.basic
            {
                return basic.verify(credential, client).await.map(Some);
            }
            if self.any() {
                return Err(Denied::Invalid("this Authorization scheme is not accepted"));
            }
        }
        if let Some(keys) = &self.api_keys
            && let Some(value) = headers.get(&keys.header)
        {
            return keys.verify(value.as_bytes()).map(Some);
        }
        match token {
            Some(token) if self.jwt.is_some() => self.bearer(token).map(Some),
            Some(_) => Err(Denied::Invalid("bearer tokens are not accepted")),
            None => Ok(None),
        }
    }

    fn any(&self) -> bool {
        self.jwt.is_some() || self.api_keys.is_some() || self.basic.is_some()
    }

    fn bearer(&self, token: &str) -> Result<Identity, Denied> {
        let Some(jwt) = &self.jwt else {
            return Err(Denied::Invalid("bearer tokens are not accepted"));
        };
        let claims = jwt.verify_cached(token).map_err(|r| Denied::Invalid(r.0))?;
        let subject = match claims.get("sub") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(Denied::Invalid("the token has no `sub`")),
        };
        Ok(Identity {
            subject,
            claims,
            method: AuthMethod::Jwt,
        })
    }

    /// Whether `identity` may make a request in `scope`: the first rule
    /// that matches decides.
    pub(crate) fn authorize(&self, scope: &Scope<'_>, identity: Option<&Identity>) -> Result<(), Denied> {
        match self.rules.iter().find(|r| r.matches(scope)) {
            Some(rule) => self.check(rule, identity),
            None => Ok(()),
        }
    }

    /// Whether `identity` may have every event type of the subscription
    /// pattern in `scope`: each rule that could match one of them must
    /// allow it, until a rule that matches all of them (no prefix, an
    /// event pattern that contains the subscription's) ends the search,
    /// since no type of it reaches a later rule. So `public.*` open before
    /// `*` requiring an identity lets anyone subscribe to `public.*`, and
    /// only an identity to `*`.
    pub(crate) fn authorize_every(
        &self,
        scope: &Scope<'_>,
        identity: Option<&Identity>,
    ) -> Result<(), Denied> {
        let Some(Ok(wanted)) = scope.event.map(Pattern::parse) else {
            return Err(Denied::Forbidden("not a subscription pattern".to_owned()));
        };
        for rule in self.rules.iter().filter(|r| r.matches(scope)) {
            self.check(rule, identity)?;
            if rule.prefix.is_none() && rule.event.as_ref().is_none_or(|e| e.contains(&wanted)) {
                break;
            }
        }
        Ok(())
    }

    /// The API key header, when API keys are accepted.
    pub(crate) fn api_key_header(&self) -> Option<&http::HeaderName> {
        self.api_keys.as_ref().map(|k| &k.header)
    }

    /// Whether `identity` meets what `rule` requires.
    fn check(&self, rule: &Rule, identity: Option<&Identity>) -> Result<(), Denied> {
        if rule.require == Require::None {
            return Ok(());
        }
        let Some(identity) = identity else {
            return Err(Denied::Missing);
        };
        if !rule.roles.is_empty() {
            let roles = roles(&identity.claims, &self.roles_claim);
            if !rule
                .roles
                .iter()
                .any(|want| roles.iter().any(|have| have == want))
            {
                return Err(Denied::Forbidden(format!(
                    "this needs one of the roles: {}",
                    rule.roles.join(", ")
                )));
            }
        }
        for (name, want) in &rule.claims {
            let has = match identity.claims.get(name) {
                Some(Value::String(s)) => s == want,
                Some(Value::Array(items)) => items.iter().any(|v| v.as_str() == Some(want)),
                Some(Value::Bool(b)) => b.to_string() == *want,
                Some(Value::Number(n)) => n.to_string() == *want,
                _ => false,
            };
            if !has {
                return Err(Denied::Forbidden(format!("this needs the claim {name} = {want}")));
            }
        }
        Ok(())
    }
}

/// The caller's roles: an array of strings, or one space-separated string
/// (the OAuth `scope` style).
fn roles<'a>(claims: &'a Map<String, Value>, claim: &str) -> Vec<&'a str> {
    match claims.get(claim) {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_str).collect(),
        Some(Value::String(s)) => s.split_whitespace().collect(),
        _ => Vec::new(),
    }
}

/// The claims of a configured caller (API key, Basic user).
fn claims_of(subject: &str, roles: &[String]) -> Arc<Map<String, Value>> {
    let mut claims = Map::new();
    claims.insert("sub".into(), Value::String(subject.to_owned()));
    claims.insert(
        "roles".into(),
        Value::Array(roles.iter().cloned().map(Value::String).collect()),
    );
    Arc::new(claims)
}

impl ApiKeys {
    fn verify(&self, key: &[u8]) -> Result<Identity, Denied> {
        let hash: [u8; 32] = Sha256::digest(key).into();
        let (name, roles) = self
            .by_hash
            .get(&hash)
            .ok_or(Denied::Invalid("unknown API key"))?;
        Ok(Identity {
            subject: name.clone(),
            claims: claims_of(name, roles),
            method: AuthMethod::ApiKey,
        })
    }
}

fn basic(c: &BasicConfig, max_clients: usize, ipv6_prefix: u8) -> Result<Basic, String> {
    let mut users = HashMap::new();
    for (i, u) in c.users.iter().enumerate() {
        // Parsed once; the text lives as long as the process.
        let text: &'static str = Box::leak(u.argon2.clone().into_boxed_str());
        let hash = PasswordHash::new(text)
            .ok()
            .filter(|h| h.algorithm.as_str().starts_with("argon2"))
            .ok_or_else(|| {
                format!("auth.basic.users[{i}].argon2: not an argon2 hash in PHC form ($argon2id$v=19$...)")
            })?;
        if u.name.is_empty() || u.name.contains(':') {
            return Err(format!("auth.basic.users[{i}].name: non-empty, without `:`"));
        }
        users.insert(u.name.clone(), (hash, u.roles.clone()));
    }
    let per_minute = NonZeroU32::new(c.verifications_per_minute)
        .ok_or("auth.basic.verifications_per_minute: must be positive")?;
    let quota = governor::Quota::per_minute(per_minute);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(Basic {
        users,
        cache: Mutex::new(Verified::default()),
        cache_for: Duration::from_secs(c.cache_s),
        limiter: Limiter::new(quota, max_clients, ipv6_prefix),
        hashing: tokio::sync::Semaphore::new(cores),
    })
}

impl Basic {
    async fn verify(&self, credential: &str, client: IpAddr) -> Result<Identity, Denied> {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(credential)
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or(Denied::Invalid("malformed Basic credentials"))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or(Denied::Invalid("malformed Basic credentials"))?;
        let fingerprint: [u8; 32] = Sha256::digest(decoded.as_bytes()).into();
        let (hash, roles) = self
            .users
            .get(user)
            .ok_or(Denied::Invalid("unknown user or wrong password"))?;
        let identity = || Identity {
            subject: user.to_owned(),
            claims: claims_of(user, roles),
            method: AuthMethod::Basic,
        };
        let now = Instant::now();
        if self.cache_for > Duration::ZERO {
            let cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.0.get(&fingerprint).is_some_and(|until| *until > now) {
                return Ok(identity());
            }
        }
        // A hash to pay: counted against this address first.
        if let Err(wait) = self.limiter.check(&super::rate::Key::Address(client)) {
            return Err(Denied::Throttled(wait));
        }
        let Ok(_permit) = self.hashing.acquire().await else {
            return Err(Denied::Invalid("unknown user or wrong password"));
        };
        let hash = hash.clone();
        let password = password.to_owned();
        let ok = tokio::task::spawn_blocking(move || {
            Argon2::default()
                .verify_password(password.as_bytes(), &hash)
                .is_ok()
        })
        .await
        .unwrap_or(false);
        if !ok {
            return Err(Denied::Invalid("unknown user or wrong password"));
        }
        if self.cache_for > Duration::ZERO {
            let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
            if cache.0.len() >= VERIFIED_MAX {
                cache.0.retain(|_, until| *until > now);
                if cache.0.len() >= VERIFIED_MAX {
                    cache.0.clear();
                }
            }
            cache.0.insert(fingerprint, now + self.cache_for);
        }
        Ok(identity())
    }
}

fn rule(i: usize, r: &AuthRule) -> Result<Rule, String> {
    if let Some(prefix) = &r.prefix
        && !prefix.starts_with('/')
    {
        return Err(format!("auth.rules[{i}].prefix: a path prefix starts with `/`"));
    }
    let event = r
        .event
        .as_deref()
        .map(|e| Pattern::parse(e).map_err(|why| format!("auth.rules[{i}].event: {why}")))
        .transpose()?;
    if r.require == Require::None && (!r.roles.is_empty() || !r.claims.is_empty()) {
        return Err(format!(
            "auth.rules[{i}].require: a rule that requires nothing takes no roles or claims"
        ));
    }
    Ok(Rule {
        prefix: r.prefix.clone(),
        event,
        require: r.require,
        roles: r.roles.clone(),
        claims: r.claims.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    })
}

impl Rule {
    fn matches(&self, scope: &Scope<'_>) -> bool {
        super::matches(self.prefix.as_deref(), self.event.as_ref(), scope)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ApiKey, ApiKeysConfig};

    fn key_config() -> AuthConfig {
        let hash = Sha256::digest(b"s3cret");
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        AuthConfig {
            api_keys: Some(ApiKeysConfig {
                keys: vec![ApiKey {
                    name: "ci".into(),
                    sha256: hex,
                    roles: vec!["deploy".into()],
                }],
                ..ApiKeysConfig::default()
            }),
            rules: vec![
                AuthRule {
                    prefix: Some("/admin".into()),
                    roles: vec!["admin".into()],
                    ..AuthRule::default()
                },
                AuthRule {
                    prefix: Some("/open".into()),
                    require: Require::None,
                    ..AuthRule::default()
                },
                AuthRule {
                    event: Some("shop.*".into()),
                    ..AuthRule::default()
                },
            ],
            ..AuthConfig::default()
        }
    }

    fn scope<'a>(path: &'a str, event: Option<&'a str>) -> Scope<'a> {
        Scope {
            path: Some(path),
            event,
            subscription: false,
            routes: None,
        }
    }

    #[test]
    fn a_subscription_meets_every_rule_that_could_decide_it() {
        let rules = |rules: Vec<AuthRule>| {
            let mut c = key_config();
            c.rules = rules;
            Auth::new(&c, 100, 64).unwrap()
        };
        let open = |event: &str| AuthRule {
            event: Some(event.into()),
            require: Require::None,
            ..AuthRule::default()
        };
        let needs = |event: &str, roles: &[&str]| AuthRule {
            event: Some(event.into()),
            roles: roles.iter().map(|r| (*r).to_owned()).collect(),
            ..AuthRule::default()
        };
        let sub = |pattern: &'static str| Scope {
            path: None,
            event: Some(pattern),
            subscription: true,
            routes: None,
        };
        let viewer = Identity {
            subject: "v".into(),
            claims: claims_of("v", &["viewer".into()]),
            method: AuthMethod::ApiKey,
        };
        let exception_first = rules(vec![
            open("public.*"),
            needs("admin.*", &["admin"]),
            needs("*", &[]),
        ]);
        let a = &exception_first;
        assert_eq!(a.authorize_every(&sub("public.*"), None), Ok(()));
        assert_eq!(a.authorize_every(&sub("public.News"), None), Ok(()));
        assert_eq!(a.authorize_every(&sub("*"), None), Err(Denied::Missing));
        assert!(matches!(
            a.authorize_every(&sub("*"), Some(&viewer)),
            Err(Denied::Forbidden(_))
        ));
        assert_eq!(a.authorize_every(&sub("user.*"), Some(&viewer)), Ok(()));
        // The first matching rule alone would have let both through.
        assert_eq!(a.authorize(&sub("*"), None), Ok(()));
        let broad_first = rules(vec![needs("*", &[]), open("public.*")]);
        assert_eq!(
            broad_first.authorize_every(&sub("public.*"), None),
            Err(Denied::Missing)
        );
        assert_eq!(
            broad_first.authorize_every(&sub("public.*"), Some(&viewer)),
            Ok(())
        );
    }

    #[tokio::test]
    async fn api_keys_and_rules() {
        let auth = Auth::new(&key_config(), 100, 64).unwrap();
        let ip = IpAddr::from([127, 0, 0, 1]);
        let mut headers = HeaderMap::new();
        assert_eq!(auth.authenticate(&headers, None, ip).await, Ok(None));
        headers.insert("x-api-key", "wrong".parse().unwrap());
        assert_eq!(
            auth.authenticate(&headers, None, ip).await,
            Err(Denied::Invalid("unknown API key"))
        );
        headers.insert("x-api-key", "s3cret".parse().unwrap());
        let who = auth.authenticate(&headers, None, ip).await.unwrap().unwrap();
        assert_eq!(who.subject, "ci");
        assert_eq!(who.claims["roles"], serde_json::json!(["deploy"]));

        assert_eq!(
            auth.authorize(&scope("/admin/x", None), None),
            Err(Denied::Missing)
        );
        assert!(matches!(
            auth.authorize(&scope("/admin", None), Some(&who)),
            Err(Denied::Forbidden(_))
        ));
        // Segment by segment: `/administrator` is not under `/admin`.
        assert_eq!(auth.authorize(&scope("/administrator", None), None), Ok(()));
        assert_eq!(auth.authorize(&scope("/open", Some("shop.Buy")), None), Ok(()));
        assert_eq!(
            auth.authorize(&scope("/buy", Some("shop.Buy")), None),
            Err(Denied::Missing)
        );
        assert_eq!(
            auth.authorize(&scope("/buy", Some("shop.Buy")), Some(&who)),
            Ok(())
        );
        assert_eq!(auth.authorize(&scope("/buy", Some("shopping.Buy")), None), Ok(()));
    }

    #[test]
    fn roles_from_an_array_or_a_string() {
        let claims = serde_json::json!({"roles": ["a", "b"], "scope": "read write"});
        let claims = claims.as_object().unwrap();
        assert_eq!(roles(claims, "roles"), ["a", "b"]);
        assert_eq!(roles(claims, "scope"), ["read", "write"]);
        assert!(roles(claims, "nope").is_empty());
    }

    #[test]
    fn configuration_errors_name_the_key() {
        let mut c = key_config();
        c.api_keys.as_mut().unwrap().keys[0].sha256 = "xyz".into();
        assert!(
            Auth::new(&c, 1, 64)
                .err()
                .unwrap()
                .starts_with("auth.api_keys.keys[0].sha256")
        );
        let c = AuthConfig {
            rules: vec![AuthRule::default()],
            ..AuthConfig::default()
        };
        assert!(Auth::new(&c, 1, 64).err().unwrap().starts_with("auth.rules"));
        let mut c = key_config();
        c.rules[0].prefix = Some("admin".into());
        assert!(
            Auth::new(&c, 1, 64)
                .err()
                .unwrap()
                .starts_with("auth.rules[0].prefix")
        );
    }
}
