//! The Store: the group's shared key/value state, served by the built-in
//! `store` manager (crate `switchyard-builtin`) on SQLite.
//!
//! The events below are the Store's whole protocol, defined once: the
//! built-in manager serves them, [`Store`] (from a handler,
//! `cx.store()`) and `switchyard-client` send them, and WebSocket or gRPC
//! clients send their JSON. Values are JSON ([`JsonText`]), whoever writes
//! them, so a value set by a browser reads back as a Rust type and the
//! other way round. Every operation answers, including those that change
//! nothing (an absent key is a `found: false`, not a 404).
//!
//! ```
//! use serde::{Deserialize, Serialize};
//! use switchyard_manager::{Context, Error, State};
//!
//! #[derive(Serialize, Deserialize)]
//! struct Cart { items: Vec<String> }
//!
//! async fn add(_: State<()>, cx: Context) -> Result<u64, Error> {
//!     let store = cx.store();
//!     let mut cart: Cart = store.get("cart:7").await?.unwrap_or(Cart { items: vec![] });
//!     cart.items.push("apple".into());
//!     store.set("cart:7", &cart).await?;
//!     store.increment("carts.updated", 1).await.map(|n| n as u64)
//! }
//! ```

use std::future::Future;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::context::Context;
use crate::reply::Error;

/// A JSON document as text. Over JSON (HTTP, WebSocket, gRPC) it is the
/// document itself; over bincode (calls between managers) it is its text,
/// because bincode cannot carry a self-describing value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct JsonText(String);

impl JsonText {
    /// `value` as JSON.
    pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<JsonText, Error> {
        serde_json::to_string(value)
            .map(JsonText)
            .map_err(|e| Error::internal(format!("cannot encode the value as JSON: {e}")))
    }

    /// Takes `text` as it is, after checking that it is one JSON document.
    pub fn parse(text: impl Into<String>) -> Result<JsonText, Error> {
        let text = text.into();
        serde_json::from_str::<serde::de::IgnoredAny>(&text)
            .map_err(|e| Error::unprocessable(format!("not a JSON document: {e}")))?;
        Ok(JsonText(text))
    }

    /// JSON `null`.
    pub fn null() -> JsonText {
        JsonText("null".to_owned())
    }

    /// The value as `T`.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.0)
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// Length of the JSON text in bytes (what the Store's size limit counts).
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the text is empty (never, for a parsed document).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The JSON text, owned.
    pub fn into_string(self) -> String {
        self.0
    }
}

impl Default for JsonText {
    fn default() -> Self {
        JsonText::null()
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            let value: serde_json::Value =
                serde_json::from_str(&self.0).map_err(serde::ser::Error::custom)?;
            value.serialize(serializer)
        } else {
            serializer.serialize_str(&self.0)
        }
    }
}

impl<'de> Deserialize<'de> for JsonText {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let value = serde_json::Value::deserialize(deserializer)?;
            Ok(JsonText(value.to_string()))
        } else {
            let text = String::deserialize(deserializer)?;
            serde_json::from_str::<serde::de::IgnoredAny>(&text)
                .map_err(|e| serde::de::Error::custom(format!("not a JSON document: {e}")))?;
            Ok(JsonText(text))
        }
    }
}

/// `store.Get`: the current value of `key`.
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.Get", request(identity))]
pub struct Get {
    pub key: String,
}

/// `store.Set`: writes `value` under `key`, replacing what was there.
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.Set", request(identity))]
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
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.Delete", request(identity))]
pub struct Delete {
    pub key: String,
    #[serde(default)]
    pub version: Option<u64>,
}

/// `store.Increment`: adds `by` to the integer under `key` (absent: 0) and
/// answers the new value. A value that is not an integer is a 409.
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.Increment", request(identity))]
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
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.CompareAndSet", request(identity))]
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
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.SetIfAbsent", request(identity))]
pub struct SetIfAbsent {
    pub key: String,
    pub value: JsonText,
    #[serde(default)]
    pub ttl_ms: Option<u64>,
}

/// `store.List`: the entries whose key starts with `prefix`, in key order,
/// a page at a time: pass the answer's `next` as `after` for the next page.
#[derive(Clone, Debug, Default, Serialize, Deserialize, crate::Event)]
#[event(name = "store.List", request(identity))]
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
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.Watch", request(identity))]
pub struct Watch {
    pub prefix: String,
    /// The watch ends this long after the call unless renewed (absent:
    /// when `store.Unwatch` ends it).
    #[serde(default)]
    pub lease_ms: Option<u64>,
}

/// `store.Unwatch`: ends the watch of `prefix`.
#[derive(Clone, Debug, Serialize, Deserialize, crate::Event)]
#[event(name = "store.Unwatch", request(identity))]
pub struct Unwatch {
    pub prefix: String,
}

/// A key's state, as `Get` and `List` answer it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
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
pub struct Written {
    pub version: u64,
}

/// The answer to `Delete`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deleted {
    /// Whether a key was removed (false: absent, or at another version).
    pub deleted: bool,
}

/// The answer to `Increment`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counter {
    pub value: i64,
    pub version: u64,
}

/// The answer to `CompareAndSet` and `SetIfAbsent`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Swapped {
    /// Whether the value was written.
    pub swapped: bool,
    /// The key's version now: the new one, or the one that made it fail
    /// (0: absent).
    pub version: u64,
}

/// The answer to `List`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Listed {
    pub entries: Vec<Entry>,
    /// More entries follow: pass this as `after`.
    #[serde(default)]
    pub next: Option<String>,
}

/// The answer to `Watch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Watching {
    pub prefix: String,
    /// When the watch ends unless renewed (ms since the Unix epoch).
    #[serde(default)]
    pub expires_at_ms: Option<u64>,
}

/// The answer to `Unwatch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unwatched {
    pub removed: bool,
}

/// What happened to a watched key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, crate::Event)]
#[event(name = "store.Changed")]
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
    pub fn value_as<T: DeserializeOwned>(&self) -> Result<T, Error> {
        decode_value(&self.key, &self.value)
    }
}

/// What a value of `key` that does not fit `T` is: a 500, because the
/// program's idea of the key and the stored data disagree.
pub(crate) fn decode_value<T: DeserializeOwned>(key: &str, value: &JsonText) -> Result<T, Error> {
    value.decode().map_err(|e| {
        Error::internal(format!(
            "the stored value of `{key}` is not a `{}`: {e}",
            std::any::type_name::<T>()
        ))
    })
}

fn ttl(ttl: Option<Duration>) -> Option<u64> {
    ttl.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1))
}

/// The Store seen from a handler: `cx.store()`. Each method is one call to
/// the `store` manager (so use them from `async` handlers); values
/// are any serde type, stored as JSON. Errors: 413 for a key or value over
/// the Store's limits, 409 for an increment of a value that is not an
/// integer, 503 while the store is down, 404 when the group has no store.
#[derive(Clone)]
pub struct Store {
    cx: Context,
}

impl Store {
    pub(crate) fn new(cx: Context) -> Store {
        Store { cx }
    }

    /// The value of `key` as `T`, or `None` when absent or expired. A value
    /// that is not a `T` is an error naming the key and the type.
    pub fn get<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<Option<T>, Error>> + use<T> {
        let entry = self.entry(key);
        async move {
            let entry = entry.await?;
            if !entry.found {
                return Ok(None);
            }
            decode_value(&entry.key, &entry.value).map(Some)
        }
    }

    /// The whole entry of `key`: value, version and expiry.
    pub fn entry(&self, key: &str) -> impl Future<Output = Result<Entry, Error>> + use<> {
        self.cx.call_for_handle(&Get { key: key.to_owned() })
    }

    /// Writes `value` under `key`; answers the new version.
    pub fn set<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
    ) -> impl Future<Output = Result<u64, Error>> + use<T> {
        self.set_with_ttl(key, value, None)
    }

    /// [`set`](Self::set) with an expiry.
    pub fn set_with_ttl<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
        ttl_after: Option<Duration>,
    ) -> impl Future<Output = Result<u64, Error>> + use<T> {
        let call = JsonText::encode(value).map(|value| {
            self.cx.call_for_handle::<_, Written>(&Set {
                key: key.to_owned(),
                value,
                ttl_ms: ttl(ttl_after),
            })
        });
        async move { Ok(call?.await?.version) }
    }

    /// Removes `key`; answers whether it existed.
    pub fn delete(&self, key: &str) -> impl Future<Output = Result<bool, Error>> + use<> {
        let call = self.cx.call_for_handle::<_, Deleted>(&Delete {
            key: key.to_owned(),
            version: None,
        });
        async move { Ok(call.await?.deleted) }
    }

    /// Removes `key` only if it is at `version` (releases a lock taken with
    /// [`set_if_absent`](Self::set_if_absent)).
    pub fn delete_version(
        &self,
        key: &str,
        version: u64,
    ) -> impl Future<Output = Result<bool, Error>> + use<> {
        let call = self.cx.call_for_handle::<_, Deleted>(&Delete {
            key: key.to_owned(),
            version: Some(version),
        });
        async move { Ok(call.await?.deleted) }
    }

    /// Adds `by` to the integer under `key` (absent counts as 0), atomically
    /// for the whole group; answers the new value.
    pub fn increment(&self, key: &str, by: i64) -> impl Future<Output = Result<i64, Error>> + use<> {
        let call = self.cx.call_for_handle::<_, Counter>(&Increment {
            key: key.to_owned(),
            by,
            ttl_ms: None,
        });
        async move { Ok(call.await?.value) }
    }

    /// Writes `value` only if `key` is at `version` (0: absent).
    pub fn compare_and_set<T: Serialize + ?Sized>(
        &self,
        key: &str,
        version: u64,
        value: &T,
    ) -> impl Future<Output = Result<Swapped, Error>> + use<T> {
        let call = JsonText::encode(value).map(|value| {
            self.cx.call_for_handle::<_, Swapped>(&CompareAndSet {
                key: key.to_owned(),
                version,
                value,
                ttl_ms: None,
            })
        });
        async move { call?.await }
    }

    /// Writes `value` only if `key` is absent, expiring after `ttl_after`:
    /// a lock. `swapped` says whether this caller holds it; release it with
    /// [`delete_version`](Self::delete_version) and the answered version.
    pub fn set_if_absent<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
        ttl_after: Option<Duration>,
    ) -> impl Future<Output = Result<Swapped, Error>> + use<T> {
        let call = JsonText::encode(value).map(|value| {
            self.cx.call_for_handle::<_, Swapped>(&SetIfAbsent {
                key: key.to_owned(),
                value,
                ttl_ms: ttl(ttl_after),
            })
        });
        async move { call?.await }
    }

    /// One page of the entries under `prefix` (see [`List`]).
    pub fn list(&self, list: &List) -> impl Future<Output = Result<Listed, Error>> + use<> {
        self.cx.call_for_handle(list)
    }

    /// Starts (or renews) a watch of `prefix`: changes under it arrive as
    /// [`Changed`] notifications to whoever subscribes to them (`r.on`).
    /// The call is sent when this is called; dropping the future only
    /// forgoes the answer, so a timer can renew a watch without awaiting.
    pub fn watch(
        &self,
        prefix: &str,
        lease: Option<Duration>,
    ) -> impl Future<Output = Result<Watching, Error>> + use<> {
        self.cx.call_for_handle(&Watch {
            prefix: prefix.to_owned(),
            lease_ms: ttl(lease),
        })
    }

    /// Ends the watch of `prefix`.
    pub fn unwatch(&self, prefix: &str) -> impl Future<Output = Result<bool, Error>> + use<> {
        let call = self.cx.call_for_handle::<_, Unwatched>(&Unwatch {
            prefix: prefix.to_owned(),
        });
        async move { Ok(call.await?.removed) }
    }
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

    #[test]
    fn a_value_of_another_type_names_the_key_and_the_type() {
        let err = decode_value::<u64>("n", &JsonText::encode("text").unwrap()).unwrap_err();
        assert_eq!(err.status, 500);
        assert!(
            err.message.contains("`n`") && err.message.contains("u64"),
            "{}",
            err.message
        );
    }
}
