//! The built-in Store and Scheduler from a client: `client.store()` and
//! `client.scheduler()`, on either client, with the events of
//! `switchyard-events` (re-exported here as [`store`](crate::store) and
//! [`scheduler`](crate::scheduler)), sent as JSON.

use std::future::Future;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use switchyard_events::EventName;
use switchyard_events::scheduler::{
    Cancel, Cancelled, Found, GetJob, JobInfo, Jobs, ListJobs, Schedule, Scheduled, Update,
};
use switchyard_events::store::{
    CompareAndSet, Counter, Delete, Deleted, Entry, Get, Increment, JsonText, List, Listed, Set, SetIfAbsent,
    Swapped, Unwatch, Unwatched, Watch, Watching, Written,
};

use crate::{Client, ClientError, GrpcClient};

/// A client that makes typed JSON calls: [`Client`] and [`GrpcClient`].
pub trait Caller: Sync {
    /// Sends `event` as a request of its type and decodes the answer.
    fn request<E: EventName + Serialize + Sync, R: DeserializeOwned>(
        &self,
        event: &E,
    ) -> impl Future<Output = Result<R, ClientError>> + Send;
}

impl Caller for Client {
    fn request<E: EventName + Serialize + Sync, R: DeserializeOwned>(
        &self,
        event: &E,
    ) -> impl Future<Output = Result<R, ClientError>> + Send {
        self.call(E::EVENT_NAME, event)
    }
}

impl Caller for GrpcClient {
    fn request<E: EventName + Serialize + Sync, R: DeserializeOwned>(
        &self,
        event: &E,
    ) -> impl Future<Output = Result<R, ClientError>> + Send {
        self.call(E::EVENT_NAME, event)
    }
}

fn encode<T: Serialize + ?Sized>(value: &T) -> Result<JsonText, ClientError> {
    JsonText::parse(serde_json::to_string(value)?).map_err(|e| ClientError::Decode(e.to_string()))
}

fn ms(d: Option<Duration>) -> Option<u64> {
    d.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1))
}

/// The group's Store, from a client (see [`store`](crate::store)).
pub struct Store<'a, C> {
    client: &'a C,
}

impl<C: Caller> Store<'_, C> {
    /// The value of `key` as `T` (`None`: absent or expired). A stored value
    /// that is not a `T` is [`ClientError::Decode`], naming the key.
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>, ClientError> {
        let entry = self.entry(key).await?;
        if !entry.found {
            return Ok(None);
        }
        entry
            .value
            .decode_stored(key)
            .map(Some)
            .map_err(|e| ClientError::Decode(e.to_string()))
    }

    /// The whole entry: value, version, expiry.
    pub async fn entry(&self, key: &str) -> Result<Entry, ClientError> {
        self.client.request(&Get { key: key.to_owned() }).await
    }

    /// Writes `value` (as JSON) under `key`, expiring after `ttl` if given;
    /// answers the new version.
    pub async fn set<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
        ttl: Option<Duration>,
    ) -> Result<u64, ClientError> {
        let set = Set {
            key: key.to_owned(),
            value: encode(value)?,
            ttl_ms: ms(ttl),
        };
        Ok(self.client.request::<_, Written>(&set).await?.version)
    }

    /// Removes `key`; answers whether it existed.
    pub async fn delete(&self, key: &str) -> Result<bool, ClientError> {
        let delete = Delete {
            key: key.to_owned(),
            version: None,
        };
        Ok(self.client.request::<_, Deleted>(&delete).await?.deleted)
    }

    /// Removes `key` only at `version` (releases a lock).
    pub async fn delete_version(&self, key: &str, version: u64) -> Result<bool, ClientError> {
        let delete = Delete {
            key: key.to_owned(),
            version: Some(version),
        };
        Ok(self.client.request::<_, Deleted>(&delete).await?.deleted)
    }

    /// Adds `by` to the integer under `key`; answers the new value.
    pub async fn increment(&self, key: &str, by: i64) -> Result<i64, ClientError> {
        let incr = Increment {
            key: key.to_owned(),
            by,
            ttl_ms: None,
        };
        Ok(self.client.request::<_, Counter>(&incr).await?.value)
    }

    /// Writes `value` only if `key` is at `version` (0: absent).
    pub async fn compare_and_set<T: Serialize + ?Sized>(
        &self,
        key: &str,
        version: u64,
        value: &T,
    ) -> Result<Swapped, ClientError> {
        let cas = CompareAndSet {
            key: key.to_owned(),
            version,
            value: encode(value)?,
            ttl_ms: None,
        };
        self.client.request(&cas).await
    }

    /// Writes `value` only if `key` is absent: a lock expiring after `ttl`.
    pub async fn set_if_absent<T: Serialize + ?Sized>(
        &self,
        key: &str,
        value: &T,
        ttl: Option<Duration>,
    ) -> Result<Swapped, ClientError> {
        let set = SetIfAbsent {
            key: key.to_owned(),
            value: encode(value)?,
            ttl_ms: ms(ttl),
        };
        self.client.request(&set).await
    }

    /// A page of the entries under a prefix.
    pub async fn list(&self, list: &List) -> Result<Listed, ClientError> {
        self.client.request(list).await
    }

    /// Starts (or renews) a watch of `prefix`; subscribe to its changes
    /// with [`Client::subscribe_filtered`]`("store.Changed",
    /// {"watch": prefix})`, or use `changes`.
    pub async fn watch(&self, prefix: &str, lease: Option<Duration>) -> Result<Watching, ClientError> {
        let watch = Watch {
            prefix: prefix.to_owned(),
            lease_ms: ms(lease),
        };
        self.client.request(&watch).await
    }

    /// Ends the watch of `prefix`.
    pub async fn unwatch(&self, prefix: &str) -> Result<bool, ClientError> {
        let unwatch = Unwatch {
            prefix: prefix.to_owned(),
        };
        Ok(self.client.request::<_, Unwatched>(&unwatch).await?.removed)
    }
}

/// The filter that picks the changes of one watch.
fn changes_filter(prefix: &str) -> serde_json::Value {
    serde_json::json!({ "watch": prefix })
}

impl Store<'_, Client> {
    /// Watches `prefix` (until unwatched) and subscribes to its changes:
    /// a stream of `store.Changed` pushes (`Push::data_as::<Changed>()`).
    pub async fn changes(&self, prefix: &str) -> Result<crate::Subscription, ClientError> {
        let sub = self
            .client
            .subscribe_filtered(
                <switchyard_events::store::Changed as EventName>::EVENT_NAME,
                Some(changes_filter(prefix)),
            )
            .await?;
        self.watch(prefix, None).await?;
        Ok(sub)
    }
}

impl Store<'_, GrpcClient> {
    /// As [`Store::<Client>::changes`], over gRPC.
    pub async fn changes(&self, prefix: &str) -> Result<crate::GrpcSubscription, ClientError> {
        let sub = self
            .client
            .subscribe_filtered(
                <switchyard_events::store::Changed as EventName>::EVENT_NAME,
                Some(changes_filter(prefix)),
            )
            .await?;
        self.watch(prefix, None).await?;
        Ok(sub)
    }
}

/// The group's Scheduler, from a client (see [`scheduler`](crate::scheduler)).
pub struct Scheduler<'a, C> {
    client: &'a C,
}

impl<C: Caller> Scheduler<'_, C> {
    /// Schedules a job (made with [`Job`](crate::scheduler::Job)).
    pub async fn schedule(&self, job: &Schedule) -> Result<Scheduled, ClientError> {
        self.client.request(job).await
    }

    /// Changes a job.
    pub async fn update(&self, update: &Update) -> Result<Scheduled, ClientError> {
        self.client.request(update).await
    }

    /// Cancels a job; answers whether it existed.
    pub async fn cancel(&self, id: &str) -> Result<bool, ClientError> {
        let cancel = Cancel { id: id.to_owned() };
        Ok(self.client.request::<_, Cancelled>(&cancel).await?.cancelled)
    }

    /// One job.
    pub async fn get(&self, id: &str) -> Result<Option<JobInfo>, ClientError> {
        let get = GetJob { id: id.to_owned() };
        Ok(self.client.request::<_, Found>(&get).await?.job)
    }

    /// A page of jobs.
    pub async fn list(&self, list: &ListJobs) -> Result<Jobs, ClientError> {
        self.client.request(list).await
    }
}

impl Client {
    /// The group's Store (the built-in `store` manager).
    pub fn store(&self) -> Store<'_, Client> {
        Store { client: self }
    }

    /// The group's Scheduler (the built-in `scheduler` manager).
    pub fn scheduler(&self) -> Scheduler<'_, Client> {
        Scheduler { client: self }
    }
}

impl GrpcClient {
    /// The group's Store (the built-in `store` manager).
    pub fn store(&self) -> Store<'_, GrpcClient> {
        Store { client: self }
    }

    /// The group's Scheduler (the built-in `scheduler` manager).
    pub fn scheduler(&self) -> Scheduler<'_, GrpcClient> {
        Scheduler { client: self }
    }
}
