//! `[cluster]`: how this group joins others through NATS (docs/cluster.md).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// `[cluster]`. Off (an empty `nats`) by default: a group alone needs no
/// NATS.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// The NATS server URL, or a list of them (the client picks one and
    /// fails over to the others): `nats://host:4222`, or `tls://host:4222`
    /// to require TLS. Credentials may be in the URL
    /// (`nats://user:pass@host`). Default: none, clustering off.
    #[serde(deserialize_with = "one_or_many")]
    pub nats: Vec<String>,
    /// The cluster's name: the first token of every subject this group
    /// uses, so several clusters can share one NATS. Letters, digits, `-`
    /// and `_`, at most 64. Default `switchyard`.
    pub name: String,
    /// User name for user/password authentication; needs `password`.
    pub user: Option<String>,
    /// Password for `user`.
    pub password: Option<String>,
    /// Token authentication (exclusive with `user` and the nkey).
    pub token: Option<String>,
    /// A file holding an nkey seed (`SU...`), for nkey authentication
    /// (exclusive with `user` and `token`). A file, not the seed inline, so
    /// the configuration can be shared without the secret.
    pub nkey_seed_file: Option<PathBuf>,
    /// A PEM file of extra root certificates for `tls://` servers signed by
    /// a private CA. Default: the system's roots only.
    pub tls_ca_file: Option<PathBuf>,
    /// Event types sent through NATS even when a local manager serves them,
    /// so every group serving them shares the load (NATS's queue group
    /// picks one). Default none: local managers are preferred.
    pub shared: Vec<String>,
    /// How long a call across groups may take when the request carries no
    /// deadline, in milliseconds. Default 30000.
    pub request_timeout_ms: u64,
    /// How long one connection attempt may take, in milliseconds.
    /// Default 2000.
    pub connect_timeout_ms: u64,
    /// Longest wait between reconnection attempts, in milliseconds (the
    /// wait doubles from 50 ms up to this). Default 2000.
    pub max_reconnect_delay_ms: u64,
    /// Frames queued towards the bridge before cross-group calls get 503.
    /// Default 4096.
    pub queue: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nats: Vec::new(),
            name: "switchyard".to_owned(),
            user: None,
            password: None,
            token: None,
            nkey_seed_file: None,
            tls_ca_file: None,
            shared: Vec::new(),
            request_timeout_ms: 30_000,
            connect_timeout_ms: 2_000,
            max_reconnect_delay_ms: 2_000,
            queue: 4096,
        }
    }
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(url) => vec![url],
        OneOrMany::Many(urls) => urls,
    })
}

impl Config {
    /// Whether clustering is on.
    pub fn enabled(&self) -> bool {
        !self.nats.is_empty()
    }

    /// Every problem with the section, each naming its key
    /// (`cluster.name: ...`).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.enabled() {
            return problems;
        }
        for (i, url) in self.nats.iter().enumerate() {
            let scheme = url.split_once("://").map(|(s, _)| s);
            if !matches!(scheme, Some("nats" | "tls")) {
                problems.push(format!(
                    "cluster.nats[{i}]: `{url}` is not a nats:// or tls:// URL"
                ));
            }
        }
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            problems.push(format!(
                "cluster.name: `{}` must be 1 to 64 letters, digits, `-` or `_` (it is a NATS subject token)",
                self.name
            ));
        }
        match (&self.user, &self.password) {
            (Some(_), None) => problems.push("cluster.password: `cluster.user` needs a password".to_owned()),
            (None, Some(_)) => problems.push("cluster.user: `cluster.password` needs a user".to_owned()),
            _ => {}
        }
        let methods = [
            self.user.is_some(),
            self.token.is_some(),
            self.nkey_seed_file.is_some(),
        ]
        .iter()
        .filter(|&&m| m)
        .count();
        if methods > 1 {
            problems
                .push("cluster: choose one of `user`/`password`, `token` and `nkey_seed_file`".to_owned());
        }
        if let Some(path) = &self.nkey_seed_file
            && let Err(err) = self.nkey_seed()
        {
            problems.push(format!("cluster.nkey_seed_file: {}: {err}", path.display()));
        }
        if let Some(path) = &self.tls_ca_file
            && let Err(err) = std::fs::metadata(path)
        {
            problems.push(format!("cluster.tls_ca_file: {}: {err}", path.display()));
        }
        for (i, ty) in self.shared.iter().enumerate() {
            if ty.is_empty() || ty.contains('*') {
                problems.push(format!("cluster.shared[{i}]: `{ty}` is not an event type name"));
            }
        }
        for (key, value) in [
            ("request_timeout_ms", self.request_timeout_ms),
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("max_reconnect_delay_ms", self.max_reconnect_delay_ms),
            ("queue", self.queue as u64),
        ] {
            if value == 0 {
                problems.push(format!("cluster.{key}: must be positive"));
            }
        }
        problems
    }

    /// The nkey seed read from `nkey_seed_file`, trimmed.
    pub(crate) fn nkey_seed(&self) -> Result<Option<String>, String> {
        let Some(path) = &self.nkey_seed_file else {
            return Ok(None);
        };
        let seed = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
        let seed = seed.trim();
        if !seed.starts_with('S') {
            return Err("not an nkey seed (a seed starts with `S`)".to_owned());
        }
        Ok(Some(seed.to_owned()))
    }

    pub(crate) fn request_timeout(&self) -> Duration {
        Duration::from_millis(self.request_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The section from JSON of the same shape as the TOML (the crate has
    /// no TOML parser; src/config.rs's tests cover the TOML side).
    fn parse(json: &str) -> Config {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn off_by_default_and_valid() {
        let c = Config::default();
        assert!(!c.enabled());
        assert!(c.problems().is_empty());
    }

    #[test]
    fn one_url_or_many() {
        assert_eq!(parse(r#"{"nats":"nats://a:1"}"#).nats, ["nats://a:1"]);
        assert_eq!(
            parse(r#"{"nats":["nats://a:1","tls://b:2"]}"#).nats,
            ["nats://a:1", "tls://b:2"]
        );
    }

    #[test]
    fn every_bad_key_is_named() {
        let c = parse(
            r#"{"nats":["http://a"],"name":"a.b","user":"u","token":"t","shared":["x.*"],"request_timeout_ms":0}"#,
        );
        let p = c.problems().join("\n");
        for key in [
            "cluster.nats[0]",
            "cluster.name",
            "cluster.password",
            "cluster: choose one",
            "cluster.shared[0]",
            "cluster.request_timeout_ms",
        ] {
            assert!(p.contains(key), "{key} missing from:\n{p}");
        }
    }
}
