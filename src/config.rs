//! `switchyard.toml`: the group's static configuration.
//!
//! Every key has a default, so no file is needed (`switchyard up` serves the
//! demo). Unknown keys and bad values are errors naming the key, reported
//! before any process starts.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The whole group's configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Config {
    pub(crate) listener: ListenerConfig,
    pub(crate) group: GroupConfig,
    pub(crate) restart: RestartConfig,
    /// The managers to run; the demo's when absent.
    pub(crate) managers: Vec<ManagerConfig>,
}

/// The HTTP front end.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ListenerConfig {
    /// Address to listen on. Port 0 picks a free port (printed at start).
    pub(crate) bind: SocketAddr,
    /// Runtime threads of the listener process (0: one per core).
    pub(crate) threads: usize,
    /// Return pipes to the broker (0: one per thread).
    pub(crate) pipes: usize,
    /// Largest request head in bytes (at least 8192); larger gets 431/400.
    pub(crate) max_header_bytes: usize,
    /// Largest request body in bytes; larger gets 413.
    pub(crate) max_body_bytes: usize,
    /// Milliseconds a client has to send its request head.
    pub(crate) header_read_timeout_ms: u64,
    /// Milliseconds from request to response before 504.
    pub(crate) request_timeout_ms: u64,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        ListenerConfig {
            bind: SocketAddr::from(([127, 0, 0, 1], 8080)),
            threads: 0,
            pipes: 0,
            max_header_bytes: 16 * 1024,
            max_body_bytes: 1024 * 1024,
            header_read_timeout_ms: 10_000,
            request_timeout_ms: 30_000,
        }
    }
}

/// Settings shared by every process of the group.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct GroupConfig {
    /// Largest frame between processes, in bytes. Bodies up to this size
    /// travel inline (see docs/decisions/0002-frame-limit.md).
    pub(crate) max_frame_bytes: usize,
    /// Frames queued per connection before new requests get 503.
    pub(crate) queue_capacity: usize,
    /// Requests in flight per manager instance before new ones get 503.
    pub(crate) max_outstanding_per_instance: u32,
    /// Milliseconds in-flight requests get to finish on SIGTERM.
    pub(crate) shutdown_grace_ms: u64,
    /// Milliseconds a child gets to report ready before start-up fails.
    pub(crate) start_timeout_ms: u64,
}

impl Default for GroupConfig {
    fn default() -> Self {
        GroupConfig {
            max_frame_bytes: 32 * 1024 * 1024,
            queue_capacity: 16 * 1024,
            max_outstanding_per_instance: 4096,
            shutdown_grace_ms: 10_000,
            start_timeout_ms: 10_000,
        }
    }
}

/// One-for-one restart policy.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct RestartConfig {
    /// First restart delay in milliseconds; doubles per quick failure.
    pub(crate) initial_backoff_ms: u64,
    /// Largest restart delay in milliseconds.
    pub(crate) max_backoff_ms: u64,
    /// At most this many restarts of one child within `window_s` ...
    pub(crate) max_restarts: u32,
    /// ... seconds; more stops the group with an error.
    pub(crate) window_s: u64,
}

impl Default for RestartConfig {
    fn default() -> Self {
        RestartConfig {
            initial_backoff_ms: 10,
            max_backoff_ms: 5_000,
            max_restarts: 10,
            window_s: 30,
        }
    }
}

/// A manager to run.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ManagerConfig {
    /// The manager's name; today one of the built-in demo managers.
    pub(crate) name: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listener: ListenerConfig::default(),
            group: GroupConfig::default(),
            restart: RestartConfig::default(),
            managers: switchyard_demo::MANAGERS
                .iter()
                .map(|name| ManagerConfig {
                    name: (*name).to_owned(),
                })
                .collect(),
        }
    }
}

/// A configuration error, naming the key.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {message}")]
    Parse { path: String, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Reads and validates `path`.
    pub(crate) fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        config.validate()?;
        Ok(config)
    }

    /// Checks values serde cannot; reports every problem at once.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        let l = &self.listener;
        if l.max_header_bytes < 8192 {
            problems.push("listener.max_header_bytes: must be at least 8192".to_owned());
        }
        if l.max_body_bytes + 64 * 1024 > self.group.max_frame_bytes {
            problems.push(format!(
                "listener.max_body_bytes: must be at least 64 KiB below group.max_frame_bytes ({})",
                self.group.max_frame_bytes
            ));
        }
        if l.request_timeout_ms == 0 {
            problems.push("listener.request_timeout_ms: must be positive".to_owned());
        }
        if l.header_read_timeout_ms == 0 {
            problems.push("listener.header_read_timeout_ms: must be positive".to_owned());
        }
        if self.group.max_frame_bytes < 64 * 1024 || self.group.max_frame_bytes > u32::MAX as usize {
            problems.push("group.max_frame_bytes: must be between 65536 and 4294967295".to_owned());
        }
        if self.group.queue_capacity == 0 {
            problems.push("group.queue_capacity: must be positive".to_owned());
        }
        if self.managers.is_empty() {
            problems.push("managers: at least one manager is needed".to_owned());
        }
        let mut seen = std::collections::HashSet::new();
        for (i, m) in self.managers.iter().enumerate() {
            if switchyard_demo::service(&m.name).is_none() {
                problems.push(format!(
                    "managers[{i}].name: unknown manager `{}` (built in: {})",
                    m.name,
                    switchyard_demo::MANAGERS.join(", ")
                ));
            }
            if !seen.insert(&m.name) {
                problems.push(format!("managers[{i}].name: `{}` is listed twice", m.name));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(problems.join("\n")))
        }
    }

    pub(crate) fn threads(&self) -> usize {
        if self.listener.threads > 0 {
            self.listener.threads
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        }
    }

    pub(crate) fn pipes(&self) -> usize {
        if self.listener.pipes > 0 {
            self.listener.pipes
        } else {
            self.threads()
        }
    }

    pub(crate) fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.group.shutdown_grace_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_round_trip() {
        let config = Config::default();
        config.validate().unwrap();
        let text = toml::to_string(&config).unwrap();
        let back: Config = toml::from_str(&text).unwrap();
        assert_eq!(back.listener.bind, config.listener.bind);
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let err = toml::from_str::<Config>("[listener]\nbnd = \"x\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bnd"), "{err}");
        let err = toml::from_str::<Config>("[listener]\nbind = \"nope\"\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("bind"), "{err}");
        let config: Config =
            toml::from_str("[listener]\nmax_header_bytes = 10\n[[managers]]\nname = \"zzz\"\n").unwrap();
        let err = config.validate().unwrap_err().to_string();
        assert!(
            err.contains("listener.max_header_bytes") && err.contains("managers[0].name"),
            "{err}"
        );
    }
}
