//! Whose a key is (decision 0114): the one mapping from a caller's key to
//! the key stored, so that one manager cannot read or overwrite another's
//! keys, and the namespaces the configuration shares (`shared`) are the
//! whole group's.
//!
//! A caller is a manager, by the name the router stamps on its requests
//! (`Context::calling_manager`), or a client the operator let in with
//! `[auth] expose`, by its identity's subject (all anonymous clients
//! together). Its keys are stored as `NUL scope NUL key`; a key under a
//! shared prefix is stored as it is. Keys never contain NUL (the Store
//! refuses them), so no caller's key can spell another scope's.

use switchyard_manager::Context;

/// Where one caller's keys live.
pub(crate) struct Keys {
    /// `\0manager:NAME\0` or `\0client:SUB\0`.
    scoped: String,
    shared: Vec<String>,
}

impl Keys {
    /// The keys of the request `cx` is handling; `shared`: the prefixes
    /// every caller shares.
    pub(crate) fn of(cx: &Context, shared: &[String]) -> Keys {
        let scope = if cx.from_client() {
            let sub = cx.identity().map(|i| i.sub).unwrap_or_default();
            format!("client:{sub}")
        } else {
            format!("manager:{}", cx.calling_manager().unwrap_or_default())
        };
        Keys::in_scope(&scope, shared)
    }

    pub(crate) fn in_scope(scope: &str, shared: &[String]) -> Keys {
        Keys {
            scoped: format!("\0{scope}\0"),
            shared: shared.to_vec(),
        }
    }

    /// What goes before `key` (or a prefix of keys) as stored: nothing
    /// under a shared namespace, else the caller's scope. A prefix is
    /// listed or watched in one place: a prefix under a shared namespace
    /// there, any other in the caller's own keys.
    fn place(&self, key: &str) -> &str {
        if self.shared.iter().any(|p| key.starts_with(p.as_str())) {
            ""
        } else {
            &self.scoped
        }
    }

    /// The stored form of the caller's `key` (or prefix).
    pub(crate) fn stored(&self, key: &str) -> String {
        let mut out = String::with_capacity(self.scoped.len() + key.len());
        out.push_str(self.place(key));
        out.push_str(key);
        out
    }
}

/// The key as its caller knows it: without its scope.
pub(crate) fn shown(stored: &str) -> &str {
    match stored.strip_prefix('\0') {
        Some(rest) => rest.split_once('\0').map_or(rest, |(_, key)| key),
        None => stored,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn managers_are_kept_apart_and_share_only_shared_namespaces() {
        let shared = ["counters/".to_owned()];
        let a = Keys::in_scope("manager:a", &shared);
        let b = Keys::in_scope("manager:b", &shared);
        assert_ne!(a.stored("k"), b.stored("k"));
        assert_eq!(a.stored("counters/hits"), "counters/hits");
        assert_eq!(b.stored("counters/hits"), "counters/hits");
        assert_eq!(shown(&a.stored("k")), "k");
        assert_eq!(shown("counters/hits"), "counters/hits");
        // A client's scope is not a manager's of the same name.
        let c = Keys::in_scope("client:a", &shared);
        assert_ne!(a.stored("k"), c.stored("k"));
        // One scope's key never starts with another's prefix.
        assert!(!b.stored("x").starts_with(&a.stored("")));
    }
}
