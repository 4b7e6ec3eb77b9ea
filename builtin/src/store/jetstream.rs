//! The Store's operations on a JetStream key-value bucket (decision 0135),
//! for a clustered group: every group's Store serves the same bucket.
//!
//! A key `k` is the subject `$KV.<bucket>.k.<encode(k)>`; its value the
//! message body (the JSON text); its version the stream sequence of its
//! last message (store-wide increasing, like SQLite's); its expiry the
//! header `Switchyard-Expires-Ms`, filtered on every read and purged by a
//! conditional delete (JetStream 2.9 has no per-message TTL). Conditional
//! writes carry `Nats-Expected-Last-Subject-Sequence`; every write a
//! `Nats-Msg-Id`, so a retry after a lost acknowledgement is not applied
//! twice, and conditional writes the chain of writes before them, so such
//! a retry, refused, can tell whether it was its own write that moved the
//! key (decision 0152). Watches are shared: registered under `w.`, followed by every
//! group, and the group that makes a write tells them (decision 0137).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::consumer::{DeliverPolicy, ReplayPolicy, push};
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::kv::Operation;
use async_nats::jetstream::stream::LastRawMessageErrorKind;
use bytes::Bytes;
use futures_util::StreamExt;
use switchyard_manager::store::{
    Changed, Counter, Deleted, Entry, Increment, JsonText, List, Listed, Op, Set, Swapped, Unwatched,
    Watching, Written,
};
use switchyard_manager::{Context, Error};

use super::expires;
use super::keys::shown;
use crate::db::wall_ms;
use crate::nats::{Bucket, BucketSpec, Failure, Link, decode, encode};

const EXPIRES: &str = "Switchyard-Expires-Ms";
const OPERATION: &str = "KV-Operation";
const EXPECTED: &str = "Nats-Expected-Last-Subject-Sequence";
const MSG_ID: &str = "Nats-Msg-Id";
/// Which write made a message: unique per write of any group.
const WRITER: &str = "Switchyard-Write";
/// On a conditional write's message, the writes that led to it, newest
/// first (`<writer>@<sequence>`, space-separated, `?` for a writer not
/// known): how a write whose acknowledgement was lost learns whether it
/// was applied after later writes replaced its message (decision 0152).
const CHAIN: &str = "Switchyard-Chain";
/// How many earlier writes a message records: a write whose outcome is
/// read back after more writes than this followed it answers "unknown".
const CHAIN_LEN: usize = 32;

/// A key's live state.
#[derive(Clone, Debug)]
pub(crate) struct Rec {
    pub(crate) value: String,
    pub(crate) version: u64,
    pub(crate) expires: Option<u64>,
}

/// What the bucket holds for a key: its live value if any, and the
/// sequence of its last message (what a conditional write names; 0 for a
/// key never written).
pub(crate) struct Current {
    pub(crate) live: Option<Rec>,
    pub(crate) last: u64,
    /// The last message's headers (its writer and chain), kept as read:
    /// the chain a write replacing it records is made only when a write
    /// asks ([`Current::prior`]), never for a plain get.
    headers: Option<HeaderMap>,
}

impl Current {
    /// What a write conditional on this state names.
    pub(crate) fn prior(&self) -> Prior {
        let headers = self.headers.as_ref();
        Prior {
            last: self.last,
            chain: chain_after(header(headers, WRITER), self.last, header(headers, CHAIN)),
        }
    }
}

/// The state a conditional write expects: the key's last sequence, and
/// the writes that led to it when they were read with it.
#[derive(Clone, Debug)]
pub(crate) struct Prior {
    pub(crate) last: u64,
    chain: String,
}

impl Prior {
    /// A state known by its sequence only (a listed row, a renewal of
    /// this process's own): a write on it records a writer not known.
    pub(crate) fn bare(last: u64) -> Prior {
        Prior {
            last,
            chain: format!("?@{last}"),
        }
    }
}

/// The chain a write replacing `message` (the key's last, written by
/// `writer`, itself recording `chain`) records: that message first.
fn chain_after(writer: Option<&str>, seq: u64, chain: Option<&str>) -> String {
    let mut out = format!("{}@{seq}", writer.unwrap_or("?"));
    for link in chain
        .into_iter()
        .flat_map(str::split_ascii_whitespace)
        .take(CHAIN_LEN - 1)
    {
        out.push(' ');
        out.push_str(link);
    }
    out
}

/// Whether a write of `writer`'s, conditional on `expect`, was applied,
/// read from the key's last message (its sequence, writer and chain).
#[derive(Debug, PartialEq, Eq)]
enum Landed {
    /// As the message with this sequence.
    Ours(u64),
    /// Not applied: every write after `expect` is known and none is ours.
    NotOurs,
    /// More writes followed than the chain records, or one whose writer
    /// is not known.
    Unknown,
}

fn landed(writer: &str, expect: u64, last: (Option<&str>, u64, Option<&str>)) -> Landed {
    let (last_writer, last_seq, chain) = last;
    let links = chain
        .into_iter()
        .flat_map(str::split_ascii_whitespace)
        .map(|link| {
            // A link that does not read is a write not known, never the
            // end of the walk (which would count it "not ours").
            match link.rsplit_once('@').map(|(w, seq)| (w, seq.parse::<u64>())) {
                Some((w, Ok(seq))) => (w, seq),
                _ => ("?", u64::MAX),
            }
        });
    let mut unknown = false;
    for (w, seq) in std::iter::once((last_writer.unwrap_or("?"), last_seq)).chain(links) {
        if seq <= expect {
            // Every write after `expect` was seen.
            return if unknown { Landed::Unknown } else { Landed::NotOurs };
        }
        if w == writer {
            return Landed::Ours(seq);
        }
        unknown |= w == "?";
    }
    Landed::Unknown
}

/// A listed key.
pub(crate) struct Row {
    pub(crate) key: String,
    pub(crate) version: u64,
    pub(crate) expires: Option<u64>,
    pub(crate) value: Option<String>,
}

/// The shared watch registrations, as this group last heard them.
pub(crate) type Watches = Arc<Mutex<HashMap<String, Option<u64>>>>;

pub(crate) fn key_subject(prefix: &str, key: &str) -> String {
    format!("{prefix}k.{}", encode(key))
}

pub(crate) fn watch_key(prefix: &str) -> String {
    format!("w.p{}", encode(prefix))
}

fn down(what: &str, e: impl std::fmt::Display) -> Failure {
    Failure::Down(format!("{what}: {e}"))
}

fn header<'a>(headers: Option<&'a HeaderMap>, name: &str) -> Option<&'a str> {
    headers.and_then(|h| h.get(name)).map(|v| v.as_str())
}

fn is_marker(headers: Option<&HeaderMap>) -> bool {
    matches!(header(headers, OPERATION), Some("DEL" | "PURGE"))
}

fn expiry(headers: Option<&HeaderMap>) -> Option<u64> {
    header(headers, EXPIRES).and_then(|v| v.parse().ok())
}

fn live_at(expires: Option<u64>, now: u64) -> bool {
    expires.is_none_or(|e| e > now)
}

/// A message id no other write of any group uses, short because every
/// chain repeats 32 of them: 48 bits of this process (its pid and start
/// time, mixed) and a count.
fn msg_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static TAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let tag = TAG.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        // splitmix64's finaliser: nearby pids and times far apart.
        let mut x = (nanos as u64) ^ ((nanos >> 64) as u64) ^ (u64::from(std::process::id()) << 40);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (x ^ (x >> 31)) & 0xffff_ffff_ffff
    });
    format!("{tag:012x}.{:x}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// The key's last message, from the stream's leader (never a replica that
/// may be behind).
pub(crate) async fn read(b: &Bucket, key: &str) -> Result<Current, Failure> {
    let subject = key_subject(&b.prefix, key);
    let msg = match b.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(msg) => msg,
        Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => {
            return Ok(Current {
                live: None,
                last: 0,
                headers: None,
            });
        }
        Err(e) => return Err(down("read", e)),
    };
    let last = msg.sequence;
    let headers = Some(&msg.headers);
    let live = if is_marker(headers) {
        None
    } else {
        let expires = expiry(headers);
        live_at(expires, wall_ms()).then(|| Rec {
            value: String::from_utf8_lossy(&msg.payload).into_owned(),
            version: last,
            expires,
        })
    };
    Ok(Current {
        live,
        last,
        headers: Some(msg.headers),
    })
}

/// A write's outcome: its sequence, or the key had moved on.
pub(crate) enum Wrote {
    Done(u64),
    Moved,
}

/// Publishes one message for `key`: a value (`Some`) or a delete marker,
/// on condition that the key's last message is `expect`'s when given.
/// Retried with the same message id until the operation's time is up, so
/// an election in progress costs time, not the write.
pub(crate) async fn write(
    b: &Bucket,
    key: &str,
    value: Option<&str>,
    expires: Option<u64>,
    expect: Option<Prior>,
    (attempt, budget): (Duration, Duration),
) -> Result<Wrote, Failure> {
    let deadline = tokio::time::Instant::now() + budget;
    let subject = key_subject(&b.prefix, key);
    let writer = msg_id();
    let mut headers = HeaderMap::new();
    headers.insert(WRITER, writer.as_str());
    match &expect {
        // Before 2.9.21 a clustered stream checks the expected sequence
        // before replication only, so two writes expecting the same one
        // may both pass (nats-server#4320). The message id is checked
        // with the writes in flight: naming the expected state makes the
        // second of two such writes a duplicate, which is refused.
        Some(prior) => {
            headers.insert(EXPECTED, prior.last.to_string().as_str());
            headers.insert(MSG_ID, format!("{}@{}", encode(key), prior.last).as_str());
            headers.insert(CHAIN, prior.chain.as_str());
        }
        None => headers.insert(MSG_ID, writer.as_str()),
    }
    if let Some(at) = expires {
        headers.insert(EXPIRES, at.to_string().as_str());
    }
    if value.is_none() {
        headers.insert(OPERATION, "DEL");
    }
    let payload = Bytes::from(value.unwrap_or("").to_owned());
    let mut sent = false;
    let mut tried = false;
    loop {
        let outcome = async {
            b.js.publish_with_headers(subject.clone(), headers.clone(), payload.clone())
                .await?
                .await
        };
        let attempt = attempt.min(deadline.saturating_duration_since(tokio::time::Instant::now()));
        match tokio::time::timeout(attempt, outcome).await {
            Ok(Ok(ack)) if !ack.duplicate => return Ok(Wrote::Done(ack.sequence)),
            // A duplicate: our own earlier attempt, or (for a conditional
            // write) another writer's from the same state; the stored
            // message says which, or, if later writes replaced it, the
            // chain they record.
            Ok(Ok(ack)) => {
                let Some(prior) = &expect else {
                    // The message id is this write's alone.
                    return Ok(Wrote::Done(ack.sequence));
                };
                if let Ok(msg) = b.stream.get_raw_message(ack.sequence).await {
                    let ours = header(Some(&msg.headers), WRITER) == Some(writer.as_str());
                    return Ok(if ours {
                        Wrote::Done(ack.sequence)
                    } else {
                        Wrote::Moved
                    });
                }
                return settle(b, key, &writer, prior.last, (attempt, deadline)).await;
            }
            Ok(Err(e)) => match e.kind() {
                PublishErrorKind::WrongLastSequence => {
                    // After an earlier attempt of ours whose outcome we did
                    // not hear (whatever its error: a server can store a
                    // write and die before it answers), ours may be the
                    // write that moved the key.
                    return match &expect {
                        Some(prior) if tried => {
                            settle(b, key, &writer, prior.last, (attempt, deadline)).await
                        }
                        _ => Ok(Wrote::Moved),
                    };
                }
                PublishErrorKind::MaxPayloadExceeded => {
                    return Err(Failure::Answer(Error::new(
                        413,
                        format!(
                            "a value of {} bytes is over the NATS server's max_payload",
                            payload.len()
                        ),
                    )));
                }
                PublishErrorKind::TimedOut => sent = true,
                // No responders (no leader yet) or the link is between
                // servers: nothing was stored by this attempt.
                _ => {}
            },
            Err(_) => sent = true,
        }
        tried = true;
        if tokio::time::Instant::now() + Duration::from_millis(50) >= deadline {
            let what = format!("the write of `{key}` was not acknowledged in time");
            return Err(if sent {
                Failure::Unknown(what)
            } else {
                Failure::Down(what)
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether `writer`'s write, conditional on `expect`, was applied: read
/// from the key's last message and the chain of writes it records
/// (decision 0152), from the stream's leader, retried until `deadline`
/// while it cannot be read. "Unknown" (504) when the chain does not reach
/// back to `expect`: never "moved" (which would apply it again) on a
/// guess.
async fn settle(
    b: &Bucket,
    key: &str,
    writer: &str,
    expect: u64,
    (attempt, deadline): (Duration, tokio::time::Instant),
) -> Result<Wrote, Failure> {
    let subject = key_subject(&b.prefix, key);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let last = tokio::time::timeout(
            attempt.min(left),
            b.stream.get_last_raw_message_by_subject(&subject),
        )
        .await;
        match last {
            Ok(Ok(msg)) => {
                let h = Some(&msg.headers);
                return match landed(
                    writer,
                    expect,
                    (header(h, WRITER), msg.sequence, header(h, CHAIN)),
                ) {
                    Landed::Ours(seq) => Ok(Wrote::Done(seq)),
                    Landed::NotOurs => Ok(Wrote::Moved),
                    Landed::Unknown => Err(Failure::Unknown(format!(
                        "the write of `{}` may have been applied: its acknowledgement was lost and more writes followed it than can be traced",
                        shown(key)
                    ))),
                };
            }
            // Nothing stored under the key: not ours either.
            Ok(Err(e)) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => {
                return Ok(Wrote::Moved);
            }
            Ok(Err(_)) | Err(_) => {}
        }
        if tokio::time::Instant::now() + Duration::from_millis(50) >= deadline {
            return Err(Failure::Unknown(format!(
                "the write of `{}` was sent and whether it was applied could not be read in time",
                shown(key)
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every live key under `prefix` after `after`, the first `limit + 1` in
/// key order (one more than a page: whether there is a next). One pass
/// over the bucket's last messages: a list costs the bucket's size, not
/// the page's (decision 0135).
pub(crate) async fn scan(
    b: &Bucket,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
    keys_only: bool,
    expired: bool,
) -> Result<Vec<Row>, Failure> {
    let now = wall_ms();
    let mut kept: BTreeMap<String, Row> = BTreeMap::new();
    each_key(b, keys_only, |key, msg_seq, headers, payload| {
        if !key.starts_with(prefix) || after.is_some_and(|a| key.as_str() <= a) {
            return;
        }
        let expires = expiry(headers);
        if live_at(expires, now) == expired {
            return;
        }
        if kept.len() > limit
            && let Some(last) = kept.keys().next_back()
            && key.as_str() > last.as_str()
        {
            return;
        }
        kept.insert(
            key.clone(),
            Row {
                key,
                version: msg_seq,
                expires,
                value: (!keys_only).then(|| String::from_utf8_lossy(payload).into_owned()),
            },
        );
        if kept.len() > limit + 1 {
            kept.pop_last();
        }
    })
    .await?;
    Ok(kept.into_values().collect())
}

/// Calls `each` with every key that has a value (not a delete marker).
pub(crate) async fn each_key(
    b: &Bucket,
    headers_only: bool,
    mut each: impl FnMut(String, u64, Option<&HeaderMap>, &[u8]),
) -> Result<(), Failure> {
    let consumer = b
        .stream
        .create_consumer(push::OrderedConfig {
            deliver_subject: b.js.client().new_inbox(),
            filter_subject: format!("{}k.>", b.prefix),
            headers_only,
            replay_policy: ReplayPolicy::Instant,
            deliver_policy: DeliverPolicy::LastPerSubject,
            ..Default::default()
        })
        .await
        .map_err(|e| down("list", e))?;
    if consumer.cached_info().num_pending == 0 {
        return Ok(());
    }
    let mut messages = consumer.messages().await.map_err(|e| down("list", e))?;
    let key_prefix = format!("{}k.", b.prefix);
    while let Some(msg) = messages.next().await {
        let msg = msg.map_err(|e| down("list", e))?;
        let info = msg.info().map_err(|e| down("list", e))?;
        let (seq, pending) = (info.stream_sequence, info.pending);
        let headers = msg.message.headers.as_ref();
        if !is_marker(headers)
            && let Some(key) = msg.subject.strip_prefix(key_prefix.as_str()).and_then(decode)
        {
            each(key, seq, headers, &msg.payload);
        }
        if pending == 0 {
            return Ok(());
        }
    }
    Err(Failure::Down("list: the listing ended early".into()))
}

/// Keeps `watches` equal to the registrations in the bucket, for as long
/// as the process lives (re-followed after any interruption).
pub(crate) async fn follow_watches(b: Bucket, watches: Watches) {
    loop {
        if let Ok(mut entries) = b.kv.watch_with_history("w.>").await {
            let mut fresh = true;
            while let Some(Ok(entry)) = entries.next().await {
                let mut map = watches.lock().unwrap_or_else(|p| p.into_inner());
                if fresh {
                    // A re-follow starts from every registration again.
                    map.clear();
                    fresh = false;
                }
                let Some(prefix) = entry.key.strip_prefix("w.p").and_then(decode) else {
                    continue;
                };
                match entry.operation {
                    Operation::Put => {
                        let expires = serde_json::from_slice::<serde_json::Value>(&entry.value)
                            .ok()
                            .and_then(|v| v["expires_at_ms"].as_u64());
                        map.insert(prefix, expires);
                    }
                    Operation::Delete | Operation::Purge => {
                        map.remove(&prefix);
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Registers (or renews) a watch in the bucket.
pub(crate) async fn put_watch(b: &Bucket, prefix: &str, expires: Option<u64>) -> Result<(), Failure> {
    let value = serde_json::json!({ "prefix": prefix, "expires_at_ms": expires }).to_string();
    b.kv.put(watch_key(prefix), Bytes::from(value))
        .await
        .map(|_| ())
        .map_err(|e| down("watch", e))
}

/// Ends a watch in the bucket.
pub(crate) async fn delete_watch(b: &Bucket, prefix: &str) -> Result<(), Failure> {
    b.kv.delete(watch_key(prefix))
        .await
        .map_err(|e| down("unwatch", e))
}

/// The Store's JetStream back end: the link, and the watches it follows.
pub(crate) struct JsStore {
    link: Arc<Link>,
    watches: Watches,
}

fn entry(key: String, rec: Option<Rec>) -> Result<Entry, Error> {
    Ok(match rec {
        Some(rec) => Entry {
            key,
            found: true,
            value: JsonText::parse(rec.value)?,
            version: rec.version,
            expires_at_ms: rec.expires,
        },
        None => Entry {
            key,
            ..Entry::default()
        },
    })
}

/// How many times a read-modify-write is tried against other groups'
/// writes to the same key before it answers 503.
const RETRIES: usize = 64;

fn contended(key: &str) -> Failure {
    Failure::Down(format!("`{}` changed under {RETRIES} tries in a row", shown(key)))
}

impl JsStore {
    pub(crate) fn start(
        cluster: &switchyard_cluster::Config,
        spec: BucketSpec,
        timeout: Duration,
    ) -> Result<JsStore, crate::BuiltinError> {
        let watches: Watches = Arc::default();
        let followed = watches.clone();
        let link = Link::start(cluster, spec, timeout, move |link, bucket| {
            link.spawn(follow_watches(bucket.clone(), followed));
        })?;
        Ok(JsStore { link, watches })
    }

    pub(crate) fn link(&self) -> &Link {
        &self.link
    }

    fn budget(&self) -> (Duration, Duration) {
        (
            self.link.attempt_timeout(),
            self.link.timeout.saturating_sub(Duration::from_millis(100)),
        )
    }

    /// Emits `Changed` for each live registration `key` falls under.
    fn changed(&self, cx: &Context, key: &str, op: Op, version: u64, value: &JsonText) {
        let now = wall_ms();
        let map = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        for (prefix, expires) in map.iter() {
            if key.starts_with(prefix.as_str()) && live_at(*expires, now) {
                // As their caller wrote them, without the scope (decision 0114).
                let _ = cx.notify(&Changed {
                    watch: shown(prefix).to_owned(),
                    key: shown(key).to_owned(),
                    op,
                    version,
                    value: value.clone(),
                });
            }
        }
    }

    pub(crate) fn get(&self, key: String) -> Result<Entry, Error> {
        let k = key.clone();
        let current = self.link.run(move |b| async move { read(&b, &k).await })?;
        entry(key, current.live)
    }

    pub(crate) fn set(&self, ev: Set, expires: Option<u64>, cx: &Context) -> Result<Written, Error> {
        let (key, value, budget) = (ev.key.clone(), ev.value.as_str().to_owned(), self.budget());
        let wrote = self
            .link
            .run(move |b| async move { write(&b, &key, Some(&value), expires, None, budget).await })?;
        let Wrote::Done(version) = wrote else {
            return Err(Error::internal("an unconditional write was refused"));
        };
        self.changed(cx, &ev.key, Op::Set, version, &ev.value);
        Ok(Written { version })
    }

    pub(crate) fn delete(&self, key: String, version: Option<u64>, cx: &Context) -> Result<Deleted, Error> {
        let (k, budget) = (key.clone(), self.budget());
        let deleted = self.link.run(move |b| async move {
            for _ in 0..RETRIES {
                let current = read(&b, &k).await?;
                let prior = current.prior();
                let Some(rec) = current.live else { return Ok(None) };
                if version.is_some_and(|v| v != rec.version) {
                    return Ok(None);
                }
                if let Wrote::Done(_) = write(&b, &k, None, None, Some(prior), budget).await? {
                    return Ok(Some(rec.version));
                }
            }
            Err(contended(&k))
        })?;
        if let Some(version) = deleted {
            self.changed(cx, &key, Op::Delete, version, &JsonText::null());
        }
        Ok(Deleted {
            deleted: deleted.is_some(),
        })
    }

    pub(crate) fn increment(&self, ev: Increment, cx: &Context) -> Result<Counter, Error> {
        let (k, by, ttl, budget) = (ev.key.clone(), ev.by, ev.ttl_ms, self.budget());
        let (value, version) = self.link.run(move |b| async move {
            for _ in 0..RETRIES {
                let current = read(&b, &k).await?;
                let now = wall_ms();
                let (old, expiry) = match &current.live {
                    None => (0, None),
                    Some(rec) => {
                        let old = serde_json::from_str::<i64>(&rec.value).map_err(|_| {
                            Error::conflict(format!(
                                "the value of `{}` is not an integer, it cannot be incremented",
                                shown(&k)
                            ))
                        })?;
                        (old, rec.expires)
                    }
                };
                let value = old.checked_add(by).ok_or_else(|| {
                    Error::conflict(format!("incrementing `{}` by {by} overflows", shown(&k)))
                })?;
                let expiry = if ttl.is_some() { expires(ttl, now) } else { expiry };
                let text = value.to_string();
                if let Wrote::Done(version) =
                    write(&b, &k, Some(&text), expiry, Some(current.prior()), budget).await?
                {
                    return Ok((value, version));
                }
            }
            Err(contended(&k))
        })?;
        self.changed(
            cx,
            &ev.key,
            Op::Set,
            version,
            &JsonText::parse(value.to_string())?,
        );
        Ok(Counter { value, version })
    }

    /// Compare-and-set (`absent`: set-if-absent, `version` ignored).
    pub(crate) fn swap(
        &self,
        key: String,
        value: JsonText,
        ttl_ms: Option<u64>,
        version: Option<u64>,
        cx: &Context,
    ) -> Result<Swapped, Error> {
        let (k, text, budget) = (key.clone(), value.as_str().to_owned(), self.budget());
        let swapped = self.link.run(move |b| async move {
            for _ in 0..RETRIES {
                let current = read(&b, &k).await?;
                let live = current.live.as_ref().map_or(0, |r| r.version);
                let wanted = version.unwrap_or(0);
                if live != wanted {
                    return Ok(Swapped {
                        swapped: false,
                        version: live,
                    });
                }
                let expiry = expires(ttl_ms, wall_ms());
                if let Wrote::Done(v) =
                    write(&b, &k, Some(&text), expiry, Some(current.prior()), budget).await?
                {
                    return Ok(Swapped {
                        swapped: true,
                        version: v,
                    });
                }
            }
            Err(contended(&k))
        })?;
        if swapped.swapped {
            self.changed(cx, &key, Op::Set, swapped.version, &value);
        }
        Ok(swapped)
    }

    /// A page of `List`: entries and the key to continue after.
    pub(crate) fn list(&self, ev: &List, limit: u32, max_bytes: usize) -> Result<Listed, Error> {
        let (prefix, keys_only) = (ev.prefix.clone(), ev.keys_only);
        let after = ev.after.clone();
        let rows = self.link.run(move |b| async move {
            scan(&b, &prefix, after.as_deref(), limit as usize, keys_only, false).await
        })?;
        let mut entries = Vec::new();
        let mut next = None;
        let mut bytes = 0usize;
        for (i, row) in rows.into_iter().enumerate() {
            let size = row.value.as_ref().map_or(0, String::len) + row.key.len();
            if i as u32 == limit || (!entries.is_empty() && bytes + size > max_bytes) {
                next = entries.last().map(|e: &Entry| e.key.clone());
                break;
            }
            bytes += size;
            entries.push(Entry {
                key: row.key,
                found: true,
                value: match row.value {
                    Some(v) => JsonText::parse(v)?,
                    None => JsonText::null(),
                },
                version: row.version,
                expires_at_ms: row.expires,
            });
        }
        Ok(Listed { entries, next })
    }

    pub(crate) fn watch(
        &self,
        prefix: String,
        expires_ms: Option<u64>,
        max: usize,
    ) -> Result<Watching, Error> {
        let now = wall_ms();
        {
            let map = self.watches.lock().unwrap_or_else(|p| p.into_inner());
            let live = map.values().filter(|e| live_at(**e, now)).count();
            if !map.contains_key(&prefix) && live >= max {
                return Err(Error::new(
                    429,
                    format!(
                        "the store already has {max} watches (`max_watches`); end one with store.Unwatch"
                    ),
                ));
            }
        }
        let p = prefix.clone();
        self.link
            .run(move |b| async move { put_watch(&b, &p, expires_ms).await })?;
        // Known here at once, not only when the registration comes back.
        self.watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(prefix.clone(), expires_ms);
        Ok(Watching {
            prefix,
            expires_at_ms: expires_ms,
        })
    }

    pub(crate) fn unwatch(&self, prefix: String) -> Result<Unwatched, Error> {
        let known = self
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&prefix)
            .is_some();
        self.link
            .run(move |b| async move { delete_watch(&b, &prefix).await })?;
        Ok(Unwatched { removed: known })
    }

    /// Deletes up to `batch` expired keys, each on condition that it was
    /// not written since (so two groups purging, or a write racing the
    /// purge, lose nothing), and tells the watches of those it deleted.
    pub(crate) fn purge(&self, batch: u32, cx: &Context) -> Result<usize, Error> {
        if self.link.bucket().is_err() {
            return Ok(0);
        }
        let budget = self.budget();
        let purged = self.link.run(move |b| async move {
            let expired = scan(&b, "", None, batch as usize, true, true).await?;
            let mut purged = Vec::new();
            for row in expired {
                if let Wrote::Done(_) =
                    write(&b, &row.key, None, None, Some(Prior::bare(row.version)), budget).await?
                {
                    purged.push((row.key, row.version));
                }
            }
            Ok(purged)
        })?;
        for (key, version) in &purged {
            self.changed(cx, key, Op::Expire, *version, &JsonText::null());
        }
        let now = wall_ms();
        let stale: Vec<String> = self
            .watches
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|(_, e)| !live_at(**e, now))
            .map(|(p, _)| p.clone())
            .collect();
        for prefix in stale {
            self.unwatch(prefix)?;
        }
        Ok(purged.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_records_the_replaced_message_first_and_keeps_its_length() {
        assert_eq!(chain_after(None, 0, None), "?@0");
        assert_eq!(chain_after(Some("a.1"), 7, Some("b.2@5 ?@3")), "a.1@7 b.2@5 ?@3");
        let long: Vec<String> = (0..CHAIN_LEN as u64 + 5).map(|n| format!("w.{n}@{n}")).collect();
        let chain = chain_after(Some("x.0"), 99, Some(&long.join(" ")));
        assert_eq!(chain.split(' ').count(), CHAIN_LEN);
        assert!(chain.starts_with("x.0@99 w.0@0 "));
    }

    #[test]
    fn a_write_whose_answer_was_lost_is_found_in_the_writes_that_followed_it() {
        // Ours is still the last message.
        assert_eq!(
            landed("me.1", 10, (Some("me.1"), 12, Some("?@10"))),
            Landed::Ours(12)
        );
        // Replaced twice since: the last message's chain names it.
        assert_eq!(
            landed("me.1", 10, (Some("c.3"), 20, Some("b.2@15 me.1@12 a.9@10 z.1@4"))),
            Landed::Ours(12)
        );
        // Every write after 10 is known and none is ours: not applied.
        assert_eq!(
            landed("me.1", 10, (Some("c.3"), 20, Some("b.2@15 a.1@12 a.9@10"))),
            Landed::NotOurs
        );
        // The key has not moved past the state we expected.
        assert_eq!(landed("me.1", 10, (Some("a.9"), 10, None)), Landed::NotOurs);
        // The chain stops short of 10 (an unconditional write broke it, or
        // more writes followed than it keeps): a guess would apply the
        // write twice or lose it.
        assert_eq!(
            landed("me.1", 10, (Some("c.3"), 20, Some("b.2@15"))),
            Landed::Unknown
        );
        assert_eq!(landed("me.1", 10, (Some("c.3"), 20, None)), Landed::Unknown);
        // A writer not known after 10 (a purge's marker on a listed row).
        assert_eq!(
            landed("me.1", 10, (Some("c.3"), 20, Some("?@12 x@10"))),
            Landed::Unknown
        );
        // A link that does not read is not taken for the end of the chain.
        assert_eq!(
            landed("me.1", 10, (Some("c.3"), 20, Some("b.2@x a.9@10"))),
            Landed::Unknown
        );
        assert_eq!(
            landed("me.1", 10, (Some("c.3"), 20, Some("junk a.9@10"))),
            Landed::Unknown
        );
        // A writer not known at or before 10 does not matter.
        assert_eq!(
            landed("me.1", 10, (Some("c.3"), 20, Some("?@10"))),
            Landed::NotOurs
        );
    }

    /// One `nats-server -js` of its own on a free loopback port, killed
    /// (and its store removed) when dropped.
    struct Server {
        child: std::process::Child,
        port: u16,
        dir: std::path::PathBuf,
    }

    impl Server {
        fn start() -> Server {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .map(|a| a.port())
                .unwrap();
            let dir = std::env::temp_dir().join(format!("sy-chain-{}-{port}", std::process::id()));
            let child = std::process::Command::new("nats-server")
                .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
                .arg(&dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("nats-server is installed (apt-get install nats-server; .ci/run does)");
            Server { child, port, dir }
        }
    }

    impl Drop for Server {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn done(w: Result<Wrote, Failure>) -> u64 {
        match w {
            Ok(Wrote::Done(seq)) => seq,
            Ok(Wrote::Moved) => panic!("moved"),
            Err(Failure::Down(e) | Failure::Unknown(e)) => panic!("{e}"),
            Err(Failure::Answer(e)) => panic!("{e:?}"),
        }
    }

    /// What a write whose answer was lost finds out, against a real
    /// server: the message it stored has been replaced by other groups'
    /// writes (history 1), and only the chain they carry says it was
    /// applied.
    #[test]
    fn a_retried_write_finds_its_replaced_message_in_the_chain_on_a_real_server() {
        let server = Server::start();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let url = format!("nats://127.0.0.1:{}", server.port);
            let ready = tokio::time::Instant::now() + Duration::from_secs(30);
            let client = loop {
                match async_nats::connect(&url).await {
                    Ok(c) => break c,
                    Err(e) if tokio::time::Instant::now() < ready => {
                        let _ = e;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    Err(e) => panic!("nats-server on {url} did not come up: {e}"),
                }
            };
            let js = async_nats::jetstream::new(client);
            let spec = BucketSpec {
                name: "chain".into(),
                replicas: 1,
                max_value_bytes: 1 << 16,
            };
            js.create_stream(spec.stream("store")).await.unwrap();
            let b = Bucket::of(&spec, js.get_key_value("chain").await.unwrap(), &js);
            let budget = (Duration::from_secs(5), Duration::from_secs(10));
            let within = || (budget.0, tokio::time::Instant::now() + budget.1);

            // "Our" increment from the empty state, acknowledged here; its
            // writer id read back as the retry would know it.
            let empty = read(&b, "n").await.unwrap();
            assert_eq!(empty.last, 0);
            let ours = done(write(&b, "n", Some("1"), None, Some(empty.prior()), budget).await);
            let msg = b.stream.get_raw_message(ours).await.unwrap();
            let mine = header(Some(&msg.headers), WRITER).unwrap().to_owned();
            // Three other increments replace it.
            for n in 2..5 {
                let current = read(&b, "n").await.unwrap();
                done(write(&b, "n", Some(&n.to_string()), None, Some(current.prior()), budget).await);
            }
            assert!(
                b.stream.get_raw_message(ours).await.is_err(),
                "history 1: replaced"
            );

            // The retry, refused, finds it applied, as `ours`.
            assert!(matches!(settle(&b, "n", &mine, 0, within()).await, Ok(Wrote::Done(s)) if s == ours));
            // Another write from the empty state, whose answer was lost too,
            // finds it was not applied.
            assert!(matches!(
                settle(&b, "n", "else.0", 0, within()).await,
                Ok(Wrote::Moved)
            ));
            // Sent again whole: a duplicate of `n@0` whose message is gone;
            // the chain says it is someone else's, so it is moved, not done.
            assert!(matches!(
                write(&b, "n", Some("1"), None, Some(empty.prior()), budget).await,
                Ok(Wrote::Moved)
            ));
            // An unconditional set breaks the chain: not known, so 504,
            // never a second increment.
            done(write(&b, "n", Some("9"), None, None, budget).await);
            assert!(matches!(
                settle(&b, "n", &mine, 0, within()).await,
                Err(Failure::Unknown(_))
            ));
            // The key never written: nothing of ours there.
            assert!(matches!(
                settle(&b, "m", &mine, 0, within()).await,
                Ok(Wrote::Moved)
            ));
        });
        drop(server);
    }

    #[test]
    fn message_ids_are_short_and_distinct() {
        let (a, b) = (msg_id(), msg_id());
        assert_ne!(a, b);
        assert!(a.len() <= 20 && !a.contains([' ', '@']), "{a}");
    }
}
