//! The Store: the group's shared key/value state, served by the built-in
//! `store` manager (crate `switchyard-builtin`) on SQLite.
//!
//! The events below are the Store's whole protocol, defined once in
//! `switchyard-events` (re-exported here, decision 0144): the built-in
//! manager serves them, [`Store`] (from a handler, `cx.store()`) and
//! `switchyard-client` send them, and WebSocket or gRPC clients send
//! their JSON. Values are JSON ([`JsonText`]), whoever writes
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

use serde::Serialize;
use serde::de::DeserializeOwned;
pub use switchyard_events::store::*;

use crate::context::Context;
use crate::event::builtin_events;
use crate::reply::Error;

builtin_events! {
    Get, Set, Delete, Increment, CompareAndSet, SetIfAbsent, List, Watch, Unwatch => identity;
    Changed => notification;
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

// Here rather than in `context`: the handle sits on top of the call
// machinery, which never needs to know of it.
impl Context {
    /// The group's Store (the built-in `store` manager): shared key/value
    /// state that survives restarts. See [`crate::store`].
    pub fn store(&self) -> Store {
        Store { cx: self.clone() }
    }
}

impl Store {
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
            Ok(Some(entry.value.decode_stored(&entry.key)?))
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
    fn a_value_of_another_type_is_a_500_naming_the_key_and_the_type() {
        let err: Error = JsonText::encode("text")
            .unwrap()
            .decode_stored::<u64>("n")
            .unwrap_err()
            .into();
        assert_eq!(err.status, 500);
        assert!(
            err.message.contains("`n`") && err.message.contains("u64"),
            "{}",
            err.message
        );
    }

    #[test]
    fn the_store_events_keep_their_names_and_read_the_identity() {
        assert_eq!(<Get as crate::Event>::NAME, "store.Get");
        assert_eq!(<Changed as crate::Event>::NAME, "store.Changed");
        const { assert!(<Set as crate::Event>::REQUEST.identity) };
        const { assert!(!<Changed as crate::Event>::REQUEST.identity) };
    }
}
