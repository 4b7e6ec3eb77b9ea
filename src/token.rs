//! `switchyard token --sub NAME`: a bearer token the demo group's `GET /me`
//! accepts. For development: it signs with the HMAC secret of `[auth.jwt]`
//! (the demo's is public), never with a private key, and a real deployment
//! gets its tokens from its identity provider.

use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header};

use crate::config::Config;

/// The file `switchyard new` scaffolds, which a project's commands are run
/// beside.
const PROJECT_CONFIG: &str = "switchyard.toml";

/// Without `-c`, the demo's key signs: refused when a configuration in
/// the current directory has an `[auth.jwt]` of its own, since a token
/// signed with the demo key would only come back 401 ("signature does not
/// verify") from that group.
pub(crate) fn demo_key_is_meant() -> Result<(), String> {
    let here = std::path::Path::new(PROJECT_CONFIG);
    let Ok(text) = std::fs::read_to_string(here) else {
        return Ok(());
    };
    let has_jwt = text
        .parse::<toml::Table>()
        .ok()
        .and_then(|t| t.get("auth")?.as_table()?.get("jwt").cloned())
        .is_some();
    if has_jwt {
        return Err(format!(
            "./{PROJECT_CONFIG} configures its own [auth.jwt]; without -c this command signs with the \
             demo group's key, which that group would refuse: run `switchyard token -c {PROJECT_CONFIG} …`"
        ));
    }
    Ok(())
}

/// A token for `sub` with `roles`, valid for `ttl_s` seconds, signed with
/// the first HMAC algorithm `[auth.jwt]` accepts (returned with it).
pub(crate) fn sign(
    config: &Config,
    sub: &str,
    roles: &[String],
    ttl_s: u64,
) -> Result<(String, Algorithm), String> {
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
        .map(|token| (token, alg))
        .map_err(|e| format!("cannot sign: {e}"))
}
