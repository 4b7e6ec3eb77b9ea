//! `switchyard token --sub NAME`: a bearer token the demo group's `GET /me`
//! accepts. For development: it signs with the HMAC secret of `[auth.jwt]`
//! (the demo's is public), never with a private key, and a real deployment
//! gets its tokens from its identity provider.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};

use crate::config::Config;

/// A token for `sub` with `roles`, valid for `ttl_s` seconds, signed with
/// the first HMAC algorithm `[auth.jwt]` accepts.
pub(crate) fn sign(config: &Config, sub: &str, roles: &[String], ttl_s: u64) -> Result<String, String> {
    let jwt = config
        .auth
        .jwt
        .as_ref()
        .ok_or("the configuration has no [auth.jwt]")?;
    let alg = jwt
        .algorithms
        .iter()
        .find_map(|a| match a.as_str() {
            "HS256" => Some(Algorithm::HS256),
            "HS384" => Some(Algorithm::HS384),
            "HS512" => Some(Algorithm::HS512),
            _ => None,
        })
        .ok_or("auth.jwt.algorithms lists no HMAC algorithm (HS256, HS384, HS512): this command signs only with a shared secret")?;
    let secret = match (&jwt.secret, &jwt.secret_file) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(path)) => {
            let mut bytes =
                std::fs::read(path).map_err(|e| format!("auth.jwt.secret_file: {}: {e}", path.display()))?;
            while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                bytes.pop();
            }
            bytes
        }
        (None, None) => return Err("auth.jwt has no secret to sign with".into()),
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_err(|e| e.to_string())?
        .as_secs();
    let mut claims = serde_json::json!({ "sub": sub, "iat": now, "exp": now + ttl_s });
    if !roles.is_empty() {
        claims["roles"] = serde_json::json!(roles);
    }
    if let Some(iss) = jwt.issuer.first() {
        claims["iss"] = serde_json::json!(iss);
    }
    if let Some(aud) = jwt.audience.first() {
        claims["aud"] = serde_json::json!(aud);
    }
    jsonwebtoken::encode(&Header::new(alg), &claims, &EncodingKey::from_secret(&secret))
        .map_err(|e| format!("cannot sign: {e}"))
}
