//! What a reload changes: the new configuration compared with the running
//! one, key by key, and manager by manager (its entry and its plugin
//! file's content).
//!
//! Three kinds of change (docs/operations.md, "Reload"):
//! - **managers** added, removed, or replaced (entry or plugin changed):
//!   the supervisor starts the new instances, switches routing once they
//!   are ready and drains the old ones;
//! - **live** settings: the listener's limits, timeouts and certificates,
//!   the supervisor's own timeouts and restart policy;
//! - settings baked into running processes at their start (addresses,
//!   process counts, frame and shared-memory sizes, the data directory):
//!   **restart needed**. The group keeps running with their old values, so
//!   that a child restarted later still agrees with its peers.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::config::{Config, ManagerConfig};

/// What `switchyard reload` answers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ReloadReport {
    /// Managers started because the configuration now lists them.
    pub(crate) added: Vec<String>,
    /// Managers whose entry or plugin file changed: new instances serve,
    /// the old ones drained.
    pub(crate) replaced: Vec<String>,
    /// Managers no longer listed: drained and stopped.
    pub(crate) removed: Vec<String>,
    /// Changed keys applied while running.
    pub(crate) live: Vec<String>,
    /// Changed keys that apply only to a new group (`switchyard upgrade`,
    /// or a stop and start); the running group keeps their old values.
    pub(crate) restart_needed: Vec<String>,
    /// Listener processes that re-read their certificates and settings.
    pub(crate) listeners: usize,
}

impl ReloadReport {
    /// What a person reads after `switchyard reload`.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        for (what, names) in [
            ("replaced", &self.replaced),
            ("added", &self.added),
            ("removed", &self.removed),
        ] {
            if !names.is_empty() {
                parts.push(format!("{what} {}", names.join(", ")));
            }
        }
        if !self.live.is_empty() {
            parts.push(format!("applied live: {}", self.live.join(", ")));
        }
        if parts.is_empty() {
            parts.push("no manager or setting changed".to_owned());
        }
        let mut text = format!(
            "reloaded: {}; {} listener process(es) re-read their settings and certificates",
            parts.join("; "),
            self.listeners
        );
        if !self.restart_needed.is_empty() {
            text.push_str(&format!(
                "\nnot applied, they need a restart (switchyard upgrade): {}",
                self.restart_needed.join(", ")
            ));
        }
        text
    }
}

/// What a plugin file holds, to tell a rebuilt library from the one
/// running. `None`: the built-in demo or a built-in manager (part of the
/// binary), or a file that cannot be read (the validation already failed
/// on it).
pub(crate) type Fingerprint = Option<[u8; 32]>;

/// The SHA-256 of `m`'s plugin file. Read, never opened as a library: the
/// supervisor runs no plugin code.
pub(crate) fn fingerprint(m: &ManagerConfig) -> Fingerprint {
    let path = m.plugin.as_deref()?;
    let bytes = std::fs::read(path).ok()?;
    Some(sha2::Sha256::digest(&bytes).into())
}

/// The fingerprints of every manager of `config`, by name.
pub(crate) fn fingerprints(config: &Config) -> HashMap<String, Fingerprint> {
    config
        .managers
        .iter()
        .map(|m| (m.name.clone(), fingerprint(m)))
        .collect()
}

/// Keys whose change applies only to processes started anew.
const RESTART_KEYS: &[&str] = &[
    "listener.bind",
    "listener.grpc_bind",
    // The supervisor binds HTTP/3's UDP socket at start.
    "listener.http3.enabled",
    "listener.http3.bind",
    "listener.workers",
    "listener.threads",
    "listener.pipes",
    "listener.park_spin_us",
    "group.max_frame_bytes",
    "group.queue_capacity",
    "group.max_outstanding_per_instance",
    "group.expose_errors",
    "group.shm_threshold_bytes",
    "group.shm_budget_bytes",
    "group.handler_timeout_ms",
    "data.dir",
    // The supervisor binds the admin endpoint and sets the children's log
    // format at start.
    "admin.bind",
    "log.format",
];

/// The outcome of comparing two configurations.
pub(crate) struct Plan {
    /// What the group runs with from now on: the new configuration with
    /// the old values of the restart-needed keys.
    pub(crate) effective: Config,
    pub(crate) report: ReloadReport,
    /// The fingerprints of the effective configuration's plugins.
    pub(crate) fingerprints: HashMap<String, Fingerprint>,
}

/// Compares the running configuration with `new`.
pub(crate) fn plan(running: &Config, running_prints: &HashMap<String, Fingerprint>, new: Config) -> Plan {
    let mut report = ReloadReport::default();
    let mut keys = Vec::new();
    for (section, old, new) in [
        (
            "listener",
            serde_json::to_value(&running.listener),
            serde_json::to_value(&new.listener),
        ),
        (
            "group",
            serde_json::to_value(&running.group),
            serde_json::to_value(&new.group),
        ),
        (
            "restart",
            serde_json::to_value(&running.restart),
            serde_json::to_value(&new.restart),
        ),
        (
            "data",
            serde_json::to_value(&running.data),
            serde_json::to_value(&new.data),
        ),
        (
            "admin",
            serde_json::to_value(&running.admin),
            serde_json::to_value(&new.admin),
        ),
        (
            "log",
            serde_json::to_value(&running.log),
            serde_json::to_value(&new.log),
        ),
        (
            "tracing",
            serde_json::to_value(&running.tracing),
            serde_json::to_value(&new.tracing),
        ),
        (
            "metrics",
            serde_json::to_value(&running.metrics),
            serde_json::to_value(&new.metrics),
        ),
        // What the listeners apply live: the middleware, the API
        // documents and the web side. Only key names are reported, never
        // a value (a changed `auth.jwt.secret` is named, not echoed).
        (
            "request_id",
            serde_json::to_value(&running.request_id),
            serde_json::to_value(&new.request_id),
        ),
        (
            "auth",
            serde_json::to_value(&running.auth),
            serde_json::to_value(&new.auth),
        ),
        (
            "cors",
            serde_json::to_value(&running.cors),
            serde_json::to_value(&new.cors),
        ),
        (
            "rate_limit",
            serde_json::to_value(&running.rate_limit),
            serde_json::to_value(&new.rate_limit),
        ),
        (
            "compression",
            serde_json::to_value(&running.compression),
            serde_json::to_value(&new.compression),
        ),
        (
            "security_headers",
            serde_json::to_value(&running.security_headers),
            serde_json::to_value(&new.security_headers),
        ),
        (
            "api",
            serde_json::to_value(&running.api),
            serde_json::to_value(&new.api),
        ),
        (
            "static",
            serde_json::to_value(&running.statics),
            serde_json::to_value(&new.statics),
        ),
        (
            "web",
            serde_json::to_value(&running.web),
            serde_json::to_value(&new.web),
        ),
    ] {
        changed_keys(
            section,
            &old.unwrap_or_default(),
            &new.unwrap_or_default(),
            &mut keys,
        );
    }
    for key in keys {
        if RESTART_KEYS.contains(&key.as_str()) {
            report.restart_needed.push(key);
        } else {
            report.live.push(key);
        }
    }

    let mut effective = new;
    let (l, old) = (&mut effective.listener, &running.listener);
    l.bind = old.bind;
    l.grpc_bind = old.grpc_bind;
    l.http3.enabled = old.http3.enabled;
    l.http3.bind = old.http3.bind;
    l.workers = old.workers;
    l.threads = old.threads;
    l.pipes = old.pipes;
    let shutdown_grace_ms = effective.group.shutdown_grace_ms;
    let start_timeout_ms = effective.group.start_timeout_ms;
    effective.group = running.group.clone();
    effective.group.shutdown_grace_ms = shutdown_grace_ms;
    effective.group.start_timeout_ms = start_timeout_ms;
    effective.data = running.data.clone();
    // The router's NATS link is built once (docs/cluster.md): a changed
    // `[cluster]` takes a restart. Named as a whole, so no credential is
    // echoed.
    if effective.cluster != running.cluster {
        report.restart_needed.push("cluster".to_owned());
        effective.cluster = running.cluster.clone();
    }
    effective.admin = running.admin.clone();
    effective.log.format = running.log.format;

    let fingerprints = self::fingerprints(&effective);
    let old_by_name: HashMap<&str, &ManagerConfig> =
        running.managers.iter().map(|m| (m.name.as_str(), m)).collect();
    for m in &effective.managers {
        match old_by_name.get(m.name.as_str()) {
            None => report.added.push(m.name.clone()),
            Some(old) => {
                let entry_changed = serde_json::to_value(old).ok() != serde_json::to_value(m).ok();
                let plugin_changed = running_prints.get(&m.name) != fingerprints.get(&m.name);
                if entry_changed || plugin_changed {
                    report.replaced.push(m.name.clone());
                }
            }
        }
    }
    for m in &running.managers {
        if !effective.managers.iter().any(|n| n.name == m.name) {
            report.removed.push(m.name.clone());
        }
    }
    Plan {
        effective,
        report,
        fingerprints,
    }
}

/// Appends the dotted keys under `prefix` whose values differ.
fn changed_keys(prefix: &str, old: &serde_json::Value, new: &serde_json::Value, out: &mut Vec<String>) {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(a), Value::Object(b)) => {
            let mut names: Vec<&String> = a.keys().chain(b.keys()).collect();
            names.sort();
            names.dedup();
            for name in names {
                changed_keys(
                    &format!("{prefix}.{name}"),
                    a.get(name).unwrap_or(&Value::Null),
                    b.get(name).unwrap_or(&Value::Null),
                    out,
                );
            }
        }
        (a, b) if a != b => out.push(prefix.to_owned()),
        _ => {}
    }
}

/// Whether a manager must stop before its replacement starts: a built-in
/// holds its database's lock for as long as it runs, so two instances
/// cannot overlap (its routes answer 503 with `Retry-After` meanwhile).
pub(crate) fn exclusive(m: &ManagerConfig) -> bool {
    m.builtin.is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(text: &str) -> Config {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn keys_are_sorted_into_live_and_restart_needed() {
        let old = config("[listener]\nmax_body_bytes = 1000\n[[managers]]\nname = \"a\"\n");
        let new = config(
            "[listener]\nmax_body_bytes = 2000\nbind = \"127.0.0.1:9999\"\n[group]\nmax_frame_bytes = 2097152\n\
             shutdown_grace_ms = 5\n[[managers]]\nname = \"a\"\n",
        );
        let plan = plan(&old, &fingerprints(&old), new);
        assert_eq!(
            plan.report.live,
            ["listener.max_body_bytes", "group.shutdown_grace_ms"]
        );
        assert_eq!(
            plan.report.restart_needed,
            ["listener.bind", "group.max_frame_bytes"]
        );
        // The running group keeps what it cannot change.
        assert_eq!(plan.effective.listener.bind, old.listener.bind);
        assert_eq!(plan.effective.group.max_frame_bytes, old.group.max_frame_bytes);
        assert_eq!(plan.effective.group.shutdown_grace_ms, 5);
        assert_eq!(plan.effective.listener.max_body_bytes, 2000);
        assert!(plan.report.replaced.is_empty());
    }

    #[test]
    fn a_changed_cluster_section_needs_a_restart() {
        let old = config("[cluster]\nnats = \"nats://127.0.0.1:4222\"\n[[managers]]\nname = \"a\"\n");
        let new = config(
            "[cluster]\nnats = \"nats://127.0.0.1:4222\"\npassword = \"p\"\nuser = \"u\"\n[[managers]]\nname = \"a\"\n",
        );
        let plan = plan(&old, &fingerprints(&old), new);
        assert_eq!(plan.report.restart_needed, ["cluster"]);
        assert_eq!(plan.effective.cluster, old.cluster);
    }

    #[test]
    fn managers_are_added_removed_and_replaced_by_entry_or_plugin_content() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("libx.so");
        std::fs::write(&lib, b"one").unwrap();
        let text = |version: u32| {
            format!(
                "[[managers]]\nname = \"keep\"\n[[managers]]\nname = \"x\"\nplugin = \"{}\"\n\
                 [[managers]]\nname = \"cfg\"\n[managers.config]\nversion = {version}\n",
                lib.display()
            )
        };
        let old = config(&(text(1) + "[[managers]]\nname = \"gone\"\n"));
        let prints = fingerprints(&old);
        // Same entries, same file: nothing.
        let same = plan(
            &old,
            &prints,
            config(&(text(1) + "[[managers]]\nname = \"gone\"\n")),
        );
        assert_eq!(same.report, ReloadReport::default());
        // The library rebuilt in place, a config value, one manager gone,
        // one new.
        std::fs::write(&lib, b"two").unwrap();
        let changed = plan(
            &old,
            &prints,
            config(&(text(2) + "[[managers]]\nname = \"new\"\n")),
        );
        assert_eq!(changed.report.replaced, ["x", "cfg"]);
        assert_eq!(changed.report.added, ["new"]);
        assert_eq!(changed.report.removed, ["gone"]);
    }

    #[test]
    fn the_admin_address_and_log_format_need_a_restart_the_access_log_and_tracing_do_not() {
        let old = config("[admin]\nbind = \"127.0.0.1:0\"\n[[managers]]\nname = \"a\"\n");
        let new = config(
            "[admin]\nbind = \"127.0.0.1:9100\"\n[log]\nformat = \"json\"\naccess = \"stdout\"\n\
             [tracing]\nserver_timing = true\n[[managers]]\nname = \"a\"\n",
        );
        let plan = plan(&old, &fingerprints(&old), new);
        assert_eq!(plan.report.restart_needed, ["admin.bind", "log.format"]);
        assert_eq!(plan.report.live, ["log.access", "tracing.server_timing"]);
        assert_eq!(plan.effective.admin.bind, old.admin.bind);
        assert_eq!(plan.effective.log.format, old.log.format);
        assert_eq!(plan.effective.log.access, "stdout");
        assert!(plan.effective.tracing.server_timing);
    }

    #[test]
    fn auth_rules_the_api_title_and_the_web_side_are_reported_as_applied_live() {
        let old = config("[api]\ntitle = \"Old\"\n[[managers]]\nname = \"a\"\n");
        let new = config(
            "[api]\ntitle = \"New\"\n[[auth.rules]]\nprefix = \"/admin\"\nrequire = \"identity\"\n\
             [cors]\nallow_origins = [\"https://a.example\"]\n[[managers]]\nname = \"a\"\n",
        );
        let plan = plan(&old, &fingerprints(&old), new);
        assert_eq!(
            plan.report.live,
            ["auth.rules", "cors.allow_origins", "api.title"]
        );
        assert!(plan.report.restart_needed.is_empty());
        let said = plan.report.describe();
        assert!(
            said.contains("applied live: auth.rules, cors.allow_origins, api.title"),
            "{said}"
        );
    }
}
