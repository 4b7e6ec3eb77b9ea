//! The Store: the group's shared key/value state, served by the built-in
//! `store` manager (crate `switchyard-builtin`) on SQLite or JetStream.
//!
//! The events below are the Store's whole protocol, defined once: the
//! built-in manager serves them, the SDK's `Store` handle (from a handler,
//! `cx.store()`) and `switchyard-client` send them, and WebSocket or gRPC
//! clients send their JSON. Values are JSON ([`JsonText`]), whoever writes
//! them, so a value set by a browser reads back as a Rust type and the
//! other way round. Every operation answers, including those that change
//! nothing (an absent key is a `found: false`, not a 404).

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub use crate::json::JsonText;
use crate::{JsonError, event_names};

/// `store.Get`: the current value of `key`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Get {
    pub key: String,
}

/// `store.Set`: writes `value` under `key`, replacing what was there.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Set {
    pub key: String,
    pub value: JsonText,
    /// The key expires this many milliseconds after the write (absent:
    /// never).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// `store.Delete`: removes `key`; with `version`, only if the key is at
/// that version (a lock's release by its holder).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Delete {
    pub key: String,
    #[serde(default)]
    pub version: Option<u64>,
}

/// `store.Increment`: adds `by` to the integer under `key` (absent: 0) and
/// answers the new value. A value that is not an integer is a 409.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Increment {
    pub key: String,
    #[serde(default = "one")]
    pub by: i64,
    /// Sets the key's expiry (absent: a new key never expires, an existing
    /// one keeps its expiry).
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

fn one() -> i64 {
    1
}

/// `store.CompareAndSet`: writes `value` only if `key` is at `version`
/// (0: only if the key is absent).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct CompareAndSet {
    pub key: String,
    pub version: u64,
    pub value: JsonText,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// `store.SetIfAbsent`: writes `value` only if `key` is absent (or
/// expired): a lock, released by its expiry or by a `Delete` with the
/// version it answered.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct SetIfAbsent {
    pub key: String,
    pub value: JsonText,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// `store.List`: the entries whose key starts with `prefix`, in key order,
/// a page at a time: pass the answer's `next` as `after` for the next page.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct List {
    #[serde(default)]
    pub prefix: String,
    /// Start after this key (exclusive).
    #[serde(default)]
    pub after: Option<String>,
    /// At most this many entries (default and maximum 1000; the page also
    /// ends before it would pass 1 MiB of values).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Keys and versions only, no values.
    #[serde(default)]
    pub keys_only: bool,
}

/// `store.Watch`: from now on, every change of a key under `prefix` (a
/// whole key watches that key, `""` everything) is emitted as a
/// [`Changed`] notification. Watching an already watched prefix renews it.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Watch {
    pub prefix: String,
    /// The watch ends this long after the call unless renewed (absent:
    /// when `store.Unwatch` ends it).
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// `store.Unwatch`: ends the watch of `prefix`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Unwatch {
    pub prefix: String,
}

/// A key's state, as `Get` and `List` answer it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Entry {
    pub key: String,
    /// Whether the key exists (an expired key does not).
    pub found: bool,
    /// The value (`null` when not found, or with `keys_only`).
    #[serde(default)]
    pub value: JsonText,
    /// Increases on every write of any key (0: not found); what
    /// `CompareAndSet` and `Delete` compare.
    pub version: u64,
    /// When the key expires, in milliseconds since the Unix epoch.
    #[serde(default)]
    pub expires_at_ms: Option<u64>,
}

/// The answer to `Set`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Written {
    pub version: u64,
}

/// The answer to `Delete`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Deleted {
    /// Whether a key was removed (false: absent, or at another version).
    pub deleted: bool,
}

/// The answer to `Increment`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Counter {
    pub value: i64,
    pub version: u64,
}

/// The answer to `CompareAndSet` and `SetIfAbsent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Swapped {
    /// Whether the value was written.
    pub swapped: bool,
    /// The key's version now: the new one, or the one that made it fail
    /// (0: absent).
    pub version: u64,
}

/// The answer to `List`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Listed {
    pub entries: Vec<Entry>,
    /// More entries follow: pass this as `after`.
    #[serde(default)]
    pub next: Option<String>,
}

/// The answer to `Watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Watching {
    pub prefix: String,
    /// When the watch ends unless renewed (ms since the Unix epoch).
    #[serde(default)]
    pub expires_at_ms: Option<u64>,
}

/// The answer to `Unwatch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Unwatched {
    pub removed: bool,
}

/// What happened to a watched key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Set,
    Delete,
    /// Its TTL ran out.
    Expire,
}

/// `store.Changed`, the notification of a change under a watched prefix.
/// Subscribe to it like any notification (`r.on(handler)` in a manager,
/// `{"subscribe":"store.Changed","filter":{"watch":"cart:"}}` on
/// WebSocket); `watch` names the watch it matched, one notification per
/// matching watch. Delivery is at most once, like every notification.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct Changed {
    /// The watched prefix this change fell under.
    pub watch: String,
    pub key: String,
    pub op: Op,
    /// The version the write gave (for a delete or an expiry: the last one).
    pub version: u64,
    /// The new value (`null` for a delete or an expiry).
    #[serde(default)]
    pub value: JsonText,
}

impl Changed {
    /// The new value as `T`.
    pub fn value_as<T: DeserializeOwned>(&self) -> Result<T, JsonError> {
        self.value.decode_stored(&self.key)
    }
}

event_names! {
    Get => "store.Get",
    Set => "store.Set",
    Delete => "store.Delete",
    Increment => "store.Increment",
    CompareAndSet => "store.CompareAndSet",
    SetIfAbsent => "store.SetIfAbsent",
    List => "store.List",
    Watch => "store.Watch",
    Unwatch => "store.Unwatch",
    Changed => "store.Changed",
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_text_is_the_document_in_json_and_text_in_bincode() {
        let set = Set {
            key: "k".into(),
            value: JsonText::encode(&serde_json::json!({"a": [1, 2]})).unwrap(),
            ttl_ms: None,
        };
        let json = serde_json::to_value(&set).unwrap();
        assert_eq!(json["value"], serde_json::json!({"a": [1, 2]}));
        let back: Set = serde_json::from_value(json).unwrap();
        assert_eq!(back.value.decode::<serde_json::Value>().unwrap()["a"][1], 2);
        let bytes = switchyard_proto::codec::encode(&set).unwrap();
        let back: Set = switchyard_proto::codec::decode(&bytes).unwrap();
        assert_eq!(back.value, set.value);
    }
}
