//! Authentication against a real group: bearer JWTs (RS256, ES256 and
//! EdDSA from a JWKS, an RSA public key file), API keys, HTTP Basic, the
//! rules per route prefix and event type, and the same rules at a
//! WebSocket upgrade and on gRPC calls. The bad input: no credential,
//! forged, expired and `alg: none` tokens, an HS256 token signed with the
//! RSA public key (algorithm confusion), a wrong API key, wrong passwords
//! until they are throttled. Keys are made at test time with `openssl`.
//! The demo group's `/me` and `switchyard token` are at the end.

mod common;

use std::path::Path;
use std::process::Command;

use base64::Engine as _;
use common::*;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const B64URL: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// A private key made by `openssl genpkey`, and its public half, as PEM.
struct KeyPair {
    private: Vec<u8>,
    public: Vec<u8>,
    /// The public key as DER (SubjectPublicKeyInfo).
    public_der: Vec<u8>,
}

fn openssl(args: &[&str]) -> Vec<u8> {
    let out = Command::new("openssl").args(args).output().expect("run openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn keypair(dir: &Path, name: &str, genpkey: &[&str]) -> KeyPair {
    let path = dir.join(format!("{name}.pem"));
    let path_s = path.to_str().unwrap();
    let mut args = vec!["genpkey"];
    args.extend_from_slice(genpkey);
    args.extend_from_slice(&["-out", path_s]);
    openssl(&args);
    KeyPair {
        private: std::fs::read(&path).unwrap(),
        public: openssl(&["pkey", "-in", path_s, "-pubout"]),
        public_der: openssl(&["pkey", "-in", path_s, "-pubout", "-outform", "DER"]),
    }
}

fn rsa(dir: &Path, name: &str) -> KeyPair {
    keypair(
        dir,
        name,
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    )
}

fn ec(dir: &Path, name: &str) -> KeyPair {
    keypair(
        dir,
        name,
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    )
}

fn ed(dir: &Path, name: &str) -> KeyPair {
    keypair(dir, name, &["-algorithm", "ED25519"])
}

fn now() -> u64 {
    jsonwebtoken::get_current_timestamp()
}

/// A token for `sub` signed with `key` as `alg`, naming `kid`.
fn sign(alg: Algorithm, kid: Option<&str>, key: &EncodingKey, claims: Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, &claims, key).unwrap()
}

/// The `iss` and `aud` the group accepts: required with public keys
/// (decision 0112).
const ISSUER: &str = "https://id.test";
const AUDIENCE: &str = "switchyard-tests";

fn claims(sub: &str, roles: &[&str]) -> Value {
    json!({ "sub": sub, "exp": now() + 600, "roles": roles, "iss": ISSUER, "aud": AUDIENCE })
}

/// A JWKS of the three public keys, each under its kid.
fn jwks(rsa: &KeyPair, ec: &KeyPair, ed: &KeyPair) -> Value {
    let jwk = |alg, key: EncodingKey, kid: &str| {
        let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&key, alg).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        serde_json::to_value(jwk).unwrap()
    };
    // jsonwebtoken cannot describe an Ed25519 key itself: its JWK is the
    // last 32 bytes of the SubjectPublicKeyInfo (RFC 8037).
    let x = B64URL.encode(&ed.public_der[ed.public_der.len() - 32..]);
    json!({ "keys": [
        jwk(Algorithm::RS256, EncodingKey::from_rsa_pem(&rsa.private).unwrap(), "rsa-1"),
        jwk(Algorithm::ES256, EncodingKey::from_ec_pem(&ec.private).unwrap(), "ec-1"),
        { "kty": "OKP", "crv": "Ed25519", "x": x, "alg": "EdDSA", "kid": "ed-1" },
    ]})
}

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn argon2_hash(password: &str) -> String {
    use argon2::PasswordHasher;
    use argon2::password_hash::SaltString;
    let salt = SaltString::encode_b64(b"a fixed test salt").unwrap();
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .unwrap()
        .to_string()
}

/// Everything the tests below sign with, and the group that trusts it.
struct Setup {
    group: Group,
    rsa: KeyPair,
    ec: KeyPair,
    ed: KeyPair,
    _keys: tempfile::TempDir,
}

const API_KEY: &str = "k-3f9a2c71e0b54d8c";

fn setup(tag: &'static str) -> Setup {
    let keys = scratch_dir("keys");
    let (rsa, ec, ed) = (
        rsa(keys.path(), "rsa"),
        ec(keys.path(), "ec"),
        ed(keys.path(), "ed"),
    );
    std::fs::write(keys.path().join("jwks.json"), jwks(&rsa, &ec, &ed).to_string()).unwrap();
    std::fs::write(keys.path().join("rsa.pub.pem"), &rsa.public).unwrap();
    let config = format!(
        r#"[[managers]]
name = "basics"

[auth.jwt]
algorithms = ["RS256", "ES256", "EdDSA"]
jwks_file = "{dir}/jwks.json"
public_key_file = "{dir}/rsa.pub.pem"
issuer = ["{ISSUER}"]
audience = ["{AUDIENCE}"]

[auth.api_keys]
[[auth.api_keys.keys]]
name = "deployer"
sha256 = "{key}"
roles = ["admin"]

[auth.basic]
verifications_per_minute = 3
[[auth.basic.users]]
name = "ada"
argon2 = "{hash}"
roles = ["admin"]

[auth.websocket]
token_from = ["header", "subprotocol", "query"]

[[auth.rules]]
event = "demo.Hello"
roles = ["admin"]

[[auth.rules]]
prefix = "/ws"

[[auth.rules]]
event = "demo.*"
"#,
        dir = keys.path().display(),
        key = sha256_hex(API_KEY),
        hash = argon2_hash("correct horse"),
    );
    let group = Group::builder(tag).config(&config).start();
    Setup {
        group,
        rsa,
        ec,
        ed,
        _keys: keys,
    }
}

/// `GET path` with `headers`.
fn get_with(addr: std::net::SocketAddr, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    let mut req = format!("GET {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    raw(addr, req.as_bytes()).unwrap()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[test]
fn tokens_of_each_algorithm_and_every_forgery() {
    let s = setup("auth-jwt");
    let addr = s.group.addr;
    let rs = EncodingKey::from_rsa_pem(&s.rsa.private).unwrap();
    let es = EncodingKey::from_ec_pem(&s.ec.private).unwrap();
    let eddsa = EncodingKey::from_ed_pem(&s.ed.private).unwrap();

    // No credential: 401 with the Bearer challenge.
    let r = get_with(addr, "/noop", &[]);
    assert_eq!(r.status, 401, "{}", r.text());
    assert_eq!(r.header("www-authenticate"), Some(r#"Bearer realm="switchyard""#));

    // Each algorithm, from the JWKS by kid; RS256 also from the PEM file
    // (no kid).
    for (alg, kid, key) in [
        (Algorithm::RS256, Some("rsa-1"), &rs),
        (Algorithm::RS256, None, &rs),
        (Algorithm::ES256, Some("ec-1"), &es),
        (Algorithm::EdDSA, Some("ed-1"), &eddsa),
    ] {
        let token = sign(alg, kid, key, claims("ada", &[]));
        let r = get_with(addr, "/noop", &[("authorization", &bearer(&token))]);
        assert_eq!(r.status, 200, "{alg:?} {kid:?}: {}", r.text());
    }

    let refused = |token: &str, why: &str| {
        let r = get_with(addr, "/noop", &[("authorization", &bearer(token))]);
        assert_eq!(r.status, 401, "{why}: {}", r.text());
        let challenge = r.header("www-authenticate").unwrap_or_default();
        assert!(
            challenge.contains(r#"error="invalid_token""#),
            "{why}: {challenge}"
        );
        challenge.to_owned()
    };
    // Signed by another key under a trusted kid.
    let other = rsa(s._keys.path(), "other");
    let forged = sign(
        Algorithm::RS256,
        Some("rsa-1"),
        &EncodingKey::from_rsa_pem(&other.private).unwrap(),
        claims("ada", &[]),
    );
    assert!(refused(&forged, "forged").contains("signature"));
    // Expired (past the leeway), and not valid yet.
    let expired = sign(
        Algorithm::ES256,
        Some("ec-1"),
        &es,
        json!({"sub": "ada", "exp": now() - 3600, "iss": ISSUER, "aud": AUDIENCE}),
    );
    assert!(refused(&expired, "expired").contains("expired"));
    let early = sign(
        Algorithm::ES256,
        Some("ec-1"),
        &es,
        json!({"sub": "ada", "exp": now() + 7200, "nbf": now() + 3600, "iss": ISSUER, "aud": AUDIENCE}),
    );
    refused(&early, "nbf in the future");
    // Signed by the right key for another service of the same identity
    // provider (another audience), or by another issuer of the same key.
    let elsewhere = sign(
        Algorithm::ES256,
        Some("ec-1"),
        &es,
        json!({"sub": "ada", "exp": now() + 600, "iss": ISSUER, "aud": "billing"}),
    );
    assert!(refused(&elsewhere, "another audience").contains("audience"));
    let other_issuer = sign(
        Algorithm::ES256,
        Some("ec-1"),
        &es,
        json!({"sub": "ada", "exp": now() + 600, "iss": "https://other.test", "aud": AUDIENCE}),
    );
    assert!(refused(&other_issuer, "another issuer").contains("issuer"));
    // `alg: none`, unsigned.
    let none = format!(
        "{}.{}.",
        B64URL.encode(br#"{"alg":"none","typ":"JWT"}"#),
        B64URL.encode(claims("ada", &["admin"]).to_string())
    );
    refused(&none, "alg none");
    // Algorithm confusion: HS256 with the RSA public key as the secret.
    let confused = sign(
        Algorithm::HS256,
        None,
        &EncodingKey::from_secret(&s.rsa.public),
        claims("ada", &["admin"]),
    );
    refused(&confused, "HS256 with the public key");
    // A token's claims must not be trusted before its signature: a valid
    // signature over other claims, with the payload swapped.
    let good = sign(Algorithm::ES256, Some("ec-1"), &es, claims("ada", &[]));
    let parts: Vec<&str> = good.split('.').collect();
    let swapped = format!(
        "{}.{}.{}",
        parts[0],
        B64URL.encode(claims("root", &["admin"]).to_string()),
        parts[2]
    );
    refused(&swapped, "payload swapped");

    // The group kept serving throughout.
    s.group.eventually_status("/health", 200);
    let token = sign(Algorithm::EdDSA, Some("ed-1"), &eddsa, claims("ada", &[]));
    assert_eq!(
        get_with(addr, "/noop", &[("authorization", &bearer(&token))]).status,
        200
    );
}

#[test]
fn roles_api_keys_and_basic() {
    let s = setup("auth-roles");
    let addr = s.group.addr;
    let es = EncodingKey::from_ec_pem(&s.ec.private).unwrap();
    let user = sign(Algorithm::ES256, Some("ec-1"), &es, claims("bob", &["reader"]));
    let admin = sign(Algorithm::ES256, Some("ec-1"), &es, claims("ada", &["admin"]));

    // A rule by event type with a role: 401 without, 403 without the role.
    assert_eq!(get_with(addr, "/hello/x", &[]).status, 401);
    let r = get_with(addr, "/hello/x", &[("authorization", &bearer(&user))]);
    assert_eq!(r.status, 403, "{}", r.text());
    assert!(r.text().contains("admin"), "{}", r.text());
    let r = get_with(addr, "/hello/x", &[("authorization", &bearer(&admin))]);
    assert_eq!(r.status, 200, "{}", r.text());

    // API keys: the hash matches, a wrong key is a 401 (not anonymous).
    assert_eq!(get_with(addr, "/hello/x", &[("x-api-key", API_KEY)]).status, 200);
    let r = get_with(addr, "/noop", &[("x-api-key", "k-guessed")]);
    assert_eq!(r.status, 401, "{}", r.text());

    // Basic: the right password; then a wrong one, refused...
    let basic = |pw: &str| {
        format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("ada:{pw}"))
        )
    };
    let r = get_with(addr, "/hello/x", &[("authorization", &basic("correct horse"))]);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = get_with(addr, "/noop", &[("authorization", &basic("wrong"))]);
    assert_eq!(r.status, 401, "{}", r.text());
    let challenges: Vec<&str> = r
        .headers
        .iter()
        .filter(|(k, _)| k.eq_ignore_ascii_case("www-authenticate"))
        .map(|(_, v)| v.as_str())
        .collect();
    assert!(
        challenges.iter().any(|c| c.starts_with("Basic realm=")),
        "{challenges:?}"
    );
    // ... until this address has had its 3 hashes a minute: 429, without
    // paying another hash. The good password, verified before, is
    // remembered and still passes.
    let mut throttled = None;
    for _ in 0..4 {
        let r = get_with(addr, "/noop", &[("authorization", &basic("guess"))]);
        if r.status == 429 {
            throttled = Some(r);
            break;
        }
        assert_eq!(r.status, 401, "{}", r.text());
    }
    let throttled = throttled.expect("wrong passwords are throttled");
    let retry: u64 = throttled.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    let r = get_with(addr, "/hello/x", &[("authorization", &basic("correct horse"))]);
    assert_eq!(r.status, 200, "the verified password is cached: {}", r.text());
}

async fn within<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("in time")
}

async fn ws_connect(
    addr: std::net::SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
        http::Response<Option<Vec<u8>>>,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let mut req = format!("ws://{addr}{path}").into_client_request().unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(req))
        .await
        .expect("in time")
}

async fn ws_call(
    ws: &mut tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>,
    ty: &str,
) -> Value {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    ws.send(Message::text(
        json!({"id": 1, "type": ty, "data": {}}).to_string(),
    ))
    .await
    .unwrap();
    loop {
        let msg = tokio::time::timeout(PATIENCE, ws.next())
            .await
            .expect("an answer in time")
            .expect("open")
            .unwrap();
        if let Message::Text(t) = msg {
            return serde_json::from_str(t.as_str()).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrades_need_credentials() {
    let s = setup("auth-ws");
    let addr = s.group.addr;
    let es = EncodingKey::from_ec_pem(&s.ec.private).unwrap();
    let token = sign(Algorithm::ES256, Some("ec-1"), &es, claims("ada", &[]));

    // No credential: the upgrade is refused with 401.
    match ws_connect(addr, "/ws", &[]).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("upgrade without a token: {:?}", other.map(|(_, r)| r.status())),
    }
    // A bad token in the query: 401 too.
    match ws_connect(addr, "/ws?access_token=nope", &[]).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 401),
        other => panic!("upgrade with a bad token: {:?}", other.map(|(_, r)| r.status())),
    }

    // The token in each configured place.
    let (mut ws, _) = ws_connect(addr, "/ws", &[("authorization", &bearer(&token))])
        .await
        .unwrap();
    assert_eq!(ws_call(&mut ws, "demo.Noop").await["status"], 200);
    // The session's identity meets the rules per message: no admin role.
    assert_eq!(ws_call(&mut ws, "demo.Hello").await["status"], 403);

    let (mut ws, _) = ws_connect(addr, &format!("/ws?access_token={token}"), &[])
        .await
        .unwrap();
    assert_eq!(ws_call(&mut ws, "demo.Noop").await["status"], 200);

    let offered = format!("switchyard.v1, bearer.{token}");
    let (mut ws, answer) = ws_connect(addr, "/ws", &[("sec-websocket-protocol", &offered)])
        .await
        .unwrap();
    // The protocol chosen is the real one, never the credential.
    assert_eq!(
        answer.headers().get("sec-websocket-protocol").unwrap(),
        "switchyard.v1"
    );
    assert_eq!(ws_call(&mut ws, "demo.Noop").await["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_need_credentials() {
    use switchyard_client::proto::CallRequest;
    use switchyard_client::proto::events_client::EventsClient;
    use tonic::Code;

    let s = setup("auth-grpc");
    let es = EncodingKey::from_ec_pem(&s.ec.private).unwrap();
    let user = sign(Algorithm::ES256, Some("ec-1"), &es, claims("bob", &["reader"]));
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", s.group.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = EventsClient::new(channel.clone());
    let call = |ty: &str, token: Option<&str>| {
        let mut req = tonic::Request::new(CallRequest {
            r#type: ty.into(),
            content_type: "application/json".into(),
            payload: b"{}".to_vec().into(),
            deadline_ms: 0,
        });
        if let Some(token) = token {
            req.metadata_mut()
                .insert("authorization", bearer(token).parse().unwrap());
        }
        req
    };

    let err = within(client.call(call("demo.Noop", None))).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = within(client.call(call("demo.Noop", Some("x.y.z"))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let ok = within(client.call(call("demo.Noop", Some(&user)))).await.unwrap();
    assert_eq!(ok.get_ref().status, 200);
    let err = within(client.call(call("demo.Hello", Some(&user))))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::PermissionDenied, "{err:?}");

    // Health checks need no credential.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let status = within(health.check(tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    }))
    .await
    .unwrap();
    assert_eq!(status.get_ref().status, 1, "SERVING");
}

/// The demo group (no configuration): `/me` takes a token from `switchyard
/// token`, and nothing else.
#[test]
fn demo_me_takes_the_token_switchyard_token_prints() {
    let g = Group::start("auth-demo");
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["token", "--sub", "ada"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let token = String::from_utf8(out.stdout).unwrap().trim().to_owned();

    assert_eq!(get_with(g.addr, "/me", &[]).status, 401);
    let r = get_with(g.addr, "/me", &[("authorization", &bearer(&token))]);
    assert_eq!(r.status, 200, "{}", r.text());
    // The handler sees the verified subject (its field is bound to the
    // scope), and a `sub` in the query cannot replace it.
    assert_eq!(r.json()["sub"], "ada", "{}", r.text());
    let r = get_with(g.addr, "/me?sub=admin", &[("authorization", &bearer(&token))]);
    assert_eq!(r.json()["sub"], "ada", "{}", r.text());
    // Routes without a rule stay open.
    assert_eq!(get_with(g.addr, "/noop", &[]).status, 200);

    // The demo's key is public (it is in the source): these are what a
    // caller without it could do.
    let demo = EncodingKey::from_secret(b"switchyard-demo-development-key-do-not-use-in-production");
    let other = EncodingKey::from_secret(b"some-other-key-of-thirty-two-bytes-or-more");
    for (what, token) in [
        (
            "another key",
            sign(Algorithm::HS256, None, &other, claims("ada", &[])),
        ),
        (
            "expired",
            sign(
                Algorithm::HS256,
                None,
                &demo,
                json!({"sub": "ada", "exp": now() - 3600}),
            ),
        ),
        (
            "alg none",
            format!(
                "{}.{}.",
                B64URL.encode(br#"{"alg":"none"}"#),
                B64URL.encode(claims("ada", &[]).to_string())
            ),
        ),
    ] {
        let r = get_with(g.addr, "/me", &[("authorization", &bearer(&token))]);
        assert_eq!(r.status, 401, "{what}: {}", r.text());
    }
}

/// Without `-c`, `switchyard token` signs with the demo's public key, and
/// says so; beside a project configuration with its own `[auth.jwt]` it
/// refuses (that group would answer 401 "signature does not verify"), and
/// with `-c` it signs with that configuration's secret.
#[test]
fn switchyard_token_says_which_key_and_refuses_the_demo_key_beside_a_project() {
    let project = scratch_dir("token-project");
    let secret = "a-project-secret-of-thirty-two-bytes-or-more";
    std::fs::write(
        project.path().join("switchyard.toml"),
        format!("[auth.jwt]\nalgorithms = [\"HS256\"]\nsecret = \"{secret}\"\n"),
    )
    .unwrap();
    let token = |dir: &std::path::Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .current_dir(dir)
            .args(["token", "--sub", "ada"])
            .args(args)
            .output()
            .unwrap()
    };
    let refused = token(project.path(), &[]);
    assert!(!refused.status.success());
    let why = String::from_utf8_lossy(&refused.stderr);
    assert!(
        why.contains("configures its own [auth.jwt]") && why.contains("-c switchyard.toml"),
        "{why}"
    );
    assert!(refused.stdout.is_empty());

    let signed = token(project.path(), &["-c", "switchyard.toml"]);
    let said = String::from_utf8_lossy(&signed.stderr);
    assert!(signed.status.success(), "{said}");
    assert!(
        said.contains("signed with the HS256 secret of switchyard.toml"),
        "{said}"
    );
    let jwt = String::from_utf8(signed.stdout).unwrap().trim().to_owned();
    let mut check = jsonwebtoken::Validation::new(Algorithm::HS256);
    check.required_spec_claims.clear();
    check.validate_aud = false;
    jsonwebtoken::decode::<Value>(
        &jwt,
        &jsonwebtoken::DecodingKey::from_secret(secret.as_bytes()),
        &check,
    )
    .expect("signed with the project's secret");

    // Elsewhere, the demo key, named as such.
    let elsewhere = scratch_dir("token-elsewhere");
    let demo = token(elsewhere.path(), &[]);
    assert!(demo.status.success());
    assert!(String::from_utf8_lossy(&demo.stderr).contains("the demo group's configuration"));
}
