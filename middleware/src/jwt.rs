//! Bearer JWT verification on `jsonwebtoken`: the configured keys (an HMAC
//! secret, a PEM public key, a JWKS), each with the algorithms of its own
//! family only, and the registered claims checked with a small leeway.
//!
//! Algorithm confusion cannot happen: a key verifies only algorithms of its
//! family (an RSA key never serves as an HMAC secret), the token's `alg`
//! must be one the configuration lists, and `alg: none` is not an
//! algorithm `jsonwebtoken` knows.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation, errors::ErrorKind};
use serde_json::{Map, Value};

use super::config::JwtConfig;

/// One key and the validation that goes with it.
struct Key {
    /// A JWKS key's `kid`: a token naming another kid skips it.
    kid: Option<String>,
    key: DecodingKey,
    validation: Validation,
}

/// The configured keys.
pub(crate) struct Verifier {
    keys: Vec<Key>,
    /// Tokens verified lately (`auth.jwt.cache_s`; decision 0085).
    verified: Mutex<HashMap<Box<str>, Verified>>,
    cache_for: Duration,
}

/// A token that verified: its claims, and until when they may be reused
/// without verifying it again (never past its `exp`).
struct Verified {
    claims: Arc<Map<String, Value>>,
    until: Instant,
}

/// At most this many tokens are remembered: at the bound, expired ones
/// go; if none has, all do (the signatures then get checked again).
/// Only tokens that verified get in, so a flood of forged ones cannot
/// push the good ones out.
const VERIFIED_MAX: usize = 10_000;

/// Why a token was refused: the `error_description` of the 401.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refused(pub(crate) &'static str);

impl Verifier {
    /// The verifier of `[auth.jwt]`, reading its key files; an error names
    /// the key (`auth.jwt.*`) at fault.
    pub(crate) fn new(config: &JwtConfig) -> Result<Verifier, String> {
        if config.algorithms.is_empty() {
            return Err("auth.jwt.algorithms: list the algorithms accepted (e.g. [\"RS256\"])".into());
        }
        if config.cache_s > 3600 {
            return Err("auth.jwt.cache_s: at most 3600 seconds".into());
        }
        let mut algorithms = Vec::new();
        for name in &config.algorithms {
            let alg = Algorithm::from_str(name).map_err(|_| {
                format!(
                    "auth.jwt.algorithms: `{name}` is not one of HS256, HS384, HS512, RS256, RS384, \
                     RS512, PS256, PS384, PS512, ES256, ES384, EdDSA"
                )
            })?;
            algorithms.push(alg);
        }
        let mut keys = Vec::new();
        let secret = match (&config.secret, &config.secret_file) {
            (Some(_), Some(_)) => {
                return Err("auth.jwt.secret_file: give `secret` or `secret_file`, not both".into());
            }
            (Some(text), None) => Some(text.as_bytes().to_vec()),
            (None, Some(path)) => {
                let mut bytes = std::fs::read(path)
                    .map_err(|e| format!("auth.jwt.secret_file: cannot read {}: {e}", path.display()))?;
                while bytes.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    bytes.pop();
                }
                Some(bytes)
            }
            (None, None) => None,
        };
        if let Some(secret) = secret {
            // Short HMAC secrets can be brute-forced from one token
            // (RFC 7518 §3.2: at least the hash's size).
            if secret.len() < 32 {
                return Err("auth.jwt.secret: an HMAC secret must be at least 32 bytes".into());
            }
            keys.push(key(
                None,
                DecodingKey::from_secret(&secret),
                &algorithms,
                config,
                "auth.jwt.secret",
            )?);
        }
        if let Some(path) = &config.public_key_file {
            let pem = std::fs::read(path)
                .map_err(|e| format!("auth.jwt.public_key_file: cannot read {}: {e}", path.display()))?;
            let decoding = pem_key(&pem).ok_or_else(|| {
                format!(
                    "auth.jwt.public_key_file: {} holds no RSA, EC or Ed25519 public key in PEM",
                    path.display()
                )
            })?;
            keys.push(key(
                None,
                decoding,
                &algorithms,
                config,
                "auth.jwt.public_key_file",
            )?);
        }
        if let Some(path) = &config.jwks_file {
            let text = std::fs::read(path)
                .map_err(|e| format!("auth.jwt.jwks_file: cannot read {}: {e}", path.display()))?;
            let set: JwkSet = serde_json::from_slice(&text).map_err(|e| {
                format!(
                    "auth.jwt.jwks_file: {} is not a JWKS document: {e}",
                    path.display()
                )
            })?;
            for jwk in &set.keys {
                keys.push(jwk_key(jwk, &algorithms, config)?);
            }
        }
        if keys.is_empty() {
            return Err(
                "auth.jwt: give a key: `secret`, `secret_file`, `public_key_file` or `jwks_file`".into(),
            );
        }
        // A provider's public keys sign tokens for every service it serves:
        // without `iss` and `aud`, a token minted for another API verifies
        // here. An HMAC secret is this group's own, so it is not asked.
        let provider = config.public_key_file.is_some() || config.jwks_file.is_some();
        if provider && config.issuer.is_empty() && !config.any_issuer {
            return Err(
                "auth.jwt.issuer: required with public_key_file or jwks_file (a token the same \
                        keys signed for another issuer would verify); list the accepted `iss`, or set \
                        any_issuer = true to accept any"
                    .into(),
            );
        }
        if provider && config.audience.is_empty() && !config.any_audience {
            return Err(
                "auth.jwt.audience: required with public_key_file or jwks_file (a token the \
                        identity provider minted for another service would verify); list the accepted \
                        `aud`, or set any_audience = true to accept any"
                    .into(),
            );
        }
        Ok(Verifier {
            keys,
            verified: Mutex::default(),
            cache_for: Duration::from_secs(config.cache_s),
        })
    }

    /// [`Verifier::verify`], remembering a token that verified for up to
    /// `auth.jwt.cache_s` seconds and never past its `exp`, so a client
    /// that sends the same token on every request pays for its signature
    /// and claims once. A reload builds a new verifier: rotated keys and
    /// changed rules never meet an old verdict.
    pub(crate) fn verify_cached(&self, token: &str) -> Result<Arc<Map<String, Value>>, Refused> {
        if self.cache_for.is_zero() {
            return self.verify(token).map(Arc::new);
        }
        let now = Instant::now();
        {
            let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = verified.get(token)
                && hit.until > now
            {
                return Ok(hit.claims.clone());
            }
        }
        let claims = Arc::new(self.verify(token)?);
        let mut keep = self.cache_for;
        if let Some(exp) = claims.get("exp").and_then(Value::as_u64) {
            // Wall-clock seconds to a monotonic instant; the leeway is not
            // extended from memory: past `exp` the token is verified anew.
            let unix_now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            keep = keep.min(Duration::from_secs(exp.saturating_sub(unix_now)));
        }
        if !keep.is_zero() {
            let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            if verified.len() >= VERIFIED_MAX {
                verified.retain(|_, v| v.until > now);
                if verified.len() >= VERIFIED_MAX {
                    verified.clear();
                }
            }
            verified.insert(
                token.into(),
                Verified {
                    claims: claims.clone(),
                    until: now + keep,
                },
            );
        }
        Ok(claims)
    }

    /// The token's claims, once its signature, algorithm and registered
    /// claims check out.
    pub(crate) fn verify(&self, token: &str) -> Result<Map<String, Value>, Refused> {
        // Malformed, or an `alg` jsonwebtoken does not know (`none`).
        let header = jsonwebtoken::decode_header(token).map_err(|_| Refused("malformed token"))?;
        let mut refused = Refused("the token's algorithm is not accepted");
        for k in &self.keys {
            if !k.validation.algorithms.contains(&header.alg) {
                continue;
            }
            if let (Some(want), Some(have)) = (&header.kid, &k.kid)
                && want != have
            {
                refused = Refused("no key has the token's kid");
                continue;
            }
            match jsonwebtoken::decode::<Map<String, Value>>(token, &k.key, &k.validation) {
                Ok(data) => return Ok(data.claims),
                Err(err) => refused = describe(err.kind()),
            }
        }
        Err(refused)
    }
}

fn describe(kind: &ErrorKind) -> Refused {
    Refused(match kind {
        ErrorKind::ExpiredSignature => "the token has expired",
        ErrorKind::ImmatureSignature => "the token is not valid yet (nbf)",
        ErrorKind::InvalidIssuer => "the token's issuer is not accepted",
        ErrorKind::InvalidAudience => "the token's audience is not accepted",
        ErrorKind::MissingRequiredClaim(_) => "the token lacks a required claim",
        ErrorKind::InvalidSignature => "the token's signature does not verify",
        ErrorKind::InvalidAlgorithm => "the token's algorithm is not accepted",
        _ => "malformed token",
    })
}

/// A PEM public key of whichever kind it is.
fn pem_key(pem: &[u8]) -> Option<DecodingKey> {
    DecodingKey::from_rsa_pem(pem)
        .or_else(|_| DecodingKey::from_ec_pem(pem))
        .or_else(|_| DecodingKey::from_ed_pem(pem))
        .ok()
}

fn jwk_key(jwk: &Jwk, algorithms: &[Algorithm], config: &JwtConfig) -> Result<Key, String> {
    let decoding =
        DecodingKey::from_jwk(jwk).map_err(|e| format!("auth.jwt.jwks_file: an unusable key ({e})"))?;
    // A key that names its algorithm verifies only that one.
    let pinned: Vec<Algorithm> = match jwk.common.key_algorithm {
        Some(ka) => {
            let Ok(alg) = Algorithm::from_str(&ka.to_string()) else {
                return Err(format!(
                    "auth.jwt.jwks_file: key algorithm {ka} cannot sign a JWT"
                ));
            };
            algorithms.iter().copied().filter(|a| *a == alg).collect()
        }
        None => algorithms.to_vec(),
    };
    let mut k = key(
        jwk.common.key_id.clone(),
        decoding,
        &pinned,
        config,
        "auth.jwt.jwks_file",
    )?;
    k.kid = jwk.common.key_id.clone();
    Ok(k)
}

/// `decoding` with the configured algorithms of its family.
fn key(
    kid: Option<String>,
    decoding: DecodingKey,
    algorithms: &[Algorithm],
    config: &JwtConfig,
    what: &str,
) -> Result<Key, String> {
    let family = decoding.family();
    let own: Vec<Algorithm> = algorithms
        .iter()
        .copied()
        .filter(|a| a.family() == family)
        .collect();
    if own.is_empty() && kid.is_none() {
        return Err(format!(
            "{what}: a {family:?} key, but auth.jwt.algorithms lists no algorithm of that family"
        ));
    }
    let mut validation = Validation::new(own.first().copied().unwrap_or(Algorithm::HS256));
    validation.algorithms = own;
    validation.leeway = config.leeway_s;
    validation.validate_nbf = true;
    validation.validate_exp = true;
    let mut required = Vec::new();
    if config.require_exp {
        required.push("exp");
    }
    if config.issuer.is_empty() {
        // Only an HMAC secret, or waived (`any_issuer`).
        validation.iss = None;
    } else {
        validation.set_issuer(&config.issuer);
        required.push("iss");
    }
    if config.audience.is_empty() {
        // No audience configured: a token's `aud` is not ours to judge.
        validation.validate_aud = false;
    } else {
        validation.set_audience(&config.audience);
        required.push("aud");
    }
    validation.set_required_spec_claims(&required);
    Ok(Key {
        kid,
        key: decoding,
        validation,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use jsonwebtoken::{EncodingKey, Header, encode};

    const SECRET: &str = "0123456789abcdef0123456789abcdef";

    fn hs_config() -> JwtConfig {
        JwtConfig {
            algorithms: vec!["HS256".into()],
            secret: Some(SECRET.into()),
            ..JwtConfig::default()
        }
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    fn token(claims: Value, secret: &str) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(secret.as_bytes()),
        )
        .unwrap()
    }

    /// A token that verified is remembered (the same claims come back, not
    /// verified again), a forgery of it is not, the memory is off with
    /// `cache_s = 0`, and it never outlives the token's `exp`.
    #[test]
    fn verified_tokens_are_remembered_until_their_exp_at_most() {
        let v = Verifier::new(&JwtConfig {
            leeway_s: 0,
            ..hs_config()
        })
        .unwrap();
        let good = token(serde_json::json!({"sub": "ada", "exp": now() + 600}), SECRET);
        let first = v.verify_cached(&good).unwrap();
        assert!(Arc::ptr_eq(&first, &v.verify_cached(&good).unwrap()), "a hit");
        let mut forged = good.clone();
        forged.pop();
        forged.push(if good.ends_with('A') { 'B' } else { 'A' });
        assert!(
            v.verify_cached(&forged).is_err(),
            "a tampered signature is checked"
        );

        let off = Verifier::new(&JwtConfig {
            cache_s: 0,
            ..hs_config()
        })
        .unwrap();
        assert!(!Arc::ptr_eq(
            &off.verify_cached(&good).unwrap(),
            &off.verify_cached(&good).unwrap()
        ));
        assert_eq!(
            Verifier::new(&JwtConfig {
                cache_s: 3601,
                ..hs_config()
            })
            .err()
            .unwrap(),
            "auth.jwt.cache_s: at most 3600 seconds"
        );

        // Expiring in a second or two: accepted now, refused once `exp`
        // has passed, although it was remembered for up to 60 s.
        let exp = now() + 2;
        let short = token(serde_json::json!({"sub": "ada", "exp": exp}), SECRET);
        assert!(v.verify_cached(&short).is_ok());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let before = now();
            let verdict = v.verify_cached(&short);
            if before > exp {
                assert_eq!(verdict, Err(Refused("the token has expired")));
                break;
            }
            if now() <= exp {
                assert!(verdict.is_ok(), "refused before its exp");
            }
            assert!(Instant::now() < deadline, "the clock did not pass exp");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    #[test]
    fn accepts_good_and_refuses_bad_tokens() {
        let v = Verifier::new(&hs_config()).unwrap();
        let good = token(serde_json::json!({"sub": "ada", "exp": now() + 60}), SECRET);
        assert_eq!(v.verify(&good).unwrap()["sub"], "ada");
        let forged = token(
            serde_json::json!({"sub": "ada", "exp": now() + 60}),
            "another-secret-another-secret-xx",
        );
        assert_eq!(
            v.verify(&forged),
            Err(Refused("the token's signature does not verify"))
        );
        let expired = token(serde_json::json!({"sub": "ada", "exp": now() - 120}), SECRET);
        assert_eq!(v.verify(&expired), Err(Refused("the token has expired")));
        // Within the leeway.
        let just = token(serde_json::json!({"sub": "ada", "exp": now() - 5}), SECRET);
        assert!(v.verify(&just).is_ok());
        let early = token(
            serde_json::json!({"sub": "ada", "exp": now() + 600, "nbf": now() + 300}),
            SECRET,
        );
        assert_eq!(v.verify(&early), Err(Refused("the token is not valid yet (nbf)")));
        let no_exp = token(serde_json::json!({"sub": "ada"}), SECRET);
        assert_eq!(
            v.verify(&no_exp),
            Err(Refused("the token lacks a required claim"))
        );
        // alg: none, unsigned.
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let none = format!(
            "{}.{}.",
            b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
            b64.encode(format!(r#"{{"sub":"ada","exp":{}}}"#, now() + 60))
        );
        assert!(v.verify(&none).is_err());
        assert!(v.verify("not a token").is_err());
    }

    #[test]
    fn issuer_and_audience() {
        let mut config = hs_config();
        config.issuer = vec!["https://issuer".into()];
        config.audience = vec!["api".into()];
        let v = Verifier::new(&config).unwrap();
        let exp = now() + 60;
        let ok = token(
            serde_json::json!({"sub": "a", "exp": exp, "iss": "https://issuer", "aud": "api"}),
            SECRET,
        );
        assert!(v.verify(&ok).is_ok());
        let wrong_iss = token(
            serde_json::json!({"sub": "a", "exp": exp, "iss": "https://evil", "aud": "api"}),
            SECRET,
        );
        assert_eq!(
            v.verify(&wrong_iss),
            Err(Refused("the token's issuer is not accepted"))
        );
        let wrong_aud = token(
            serde_json::json!({"sub": "a", "exp": exp, "iss": "https://issuer", "aud": "other"}),
            SECRET,
        );
        assert_eq!(
            v.verify(&wrong_aud),
            Err(Refused("the token's audience is not accepted"))
        );
        let no_aud = token(
            serde_json::json!({"sub": "a", "exp": exp, "iss": "https://issuer"}),
            SECRET,
        );
        assert!(v.verify(&no_aud).is_err());
    }

    #[test]
    fn configuration_errors_name_the_key() {
        let mut c = hs_config();
        c.algorithms = vec!["none".into()];
        assert!(
            Verifier::new(&c)
                .err()
                .unwrap()
                .starts_with("auth.jwt.algorithms")
        );
        let mut c = hs_config();
        c.secret = Some("short".into());
        assert!(Verifier::new(&c).err().unwrap().starts_with("auth.jwt.secret"));
        let mut c = hs_config();
        c.algorithms = vec!["RS256".into()];
        assert!(
            Verifier::new(&c)
                .err()
                .unwrap()
                .contains("no algorithm of that family")
        );
        let c = JwtConfig {
            algorithms: vec!["RS256".into()],
            ..JwtConfig::default()
        };
        assert!(Verifier::new(&c).err().unwrap().contains("give a key"));
    }

    /// A provider's keys (a JWKS, a public key) need `iss` and `aud`, or an
    /// explicit waiver: otherwise a token it signed for another service
    /// would verify here.
    #[test]
    fn provider_keys_need_an_issuer_and_an_audience() {
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        let k = "c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0LXNlY3JldC0xMg";
        std::fs::write(
            &jwks,
            serde_json::json!({"keys": [{"kty": "oct", "kid": "k1", "alg": "HS256", "k": k}]}).to_string(),
        )
        .unwrap();
        let base = JwtConfig {
            algorithms: vec!["HS256".into()],
            jwks_file: Some(jwks),
            ..JwtConfig::default()
        };
        let err = Verifier::new(&base).err().unwrap();
        assert!(err.starts_with("auth.jwt.issuer: required"), "{err}");
        let c = JwtConfig {
            issuer: vec!["https://id".into()],
            ..base.clone()
        };
        let err = Verifier::new(&c).err().unwrap();
        assert!(err.starts_with("auth.jwt.audience: required"), "{err}");
        let c = JwtConfig {
            audience: vec!["api".into()],
            ..c
        };
        assert!(Verifier::new(&c).is_ok());
        let waived = JwtConfig {
            any_issuer: true,
            any_audience: true,
            ..base
        };
        assert!(Verifier::new(&waived).is_ok());
        // A secret of the group's own needs neither.
        assert!(Verifier::new(&hs_config()).is_ok());
    }
}
