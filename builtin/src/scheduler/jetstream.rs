//! The Scheduler's jobs in the cluster's JetStream bucket (decision 0140):
//! every group's Scheduler serves the same jobs, and the one group that
//! holds the bucket's lease fires them.
//!
//! A job `id` is the subject `$KV.<bucket>.j.k.<encode(id)>`, its message
//! the job's [`Record`]; the lease is `$KV.<bucket>.k.lease`. Every change
//! is one of the Store's conditional writes (`store::jetstream::write`: on
//! the subject's last sequence, retried with the same message id while a
//! leader is elected), so of two groups changing one job, or taking the
//! lease, one succeeds and the other reads again.
//!
//! The lease: its holder renews it every third of `lease_ms` and fires only
//! while its last renewal, counted from when it was sent, is younger than
//! four fifths of `lease_ms`; another group takes it over once it has seen
//! the same lease message for a whole `lease_ms` on its own monotonic
//! clock, so no two machines' wall clocks are compared. A firing is
//! recorded as started (a conditional write naming the firing) before it is
//! sent, and settled only by the firing it names: a group that lost the
//! lease settles nothing. A new holder sends the firings its predecessor
//! left in flight again at once, as a restarted SQLite Scheduler does:
//! delivery stays at least once across a take-over, and is once when
//! nothing was in flight.
//!
//! Every group follows the jobs with a watch and keeps their due times in
//! memory: a hint, never trusted (each firing reads its job from the
//! stream's leader first), so that the holder finds what is due without a
//! pass over the bucket every tick, and a take-over starts at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv::{self, Operation};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use switchyard_manager::scheduler::{JobInfo, Jobs, ListJobs, Missed, Schedule, Scheduled, Update, When};
use switchyard_manager::{Context, Error, LogLevel};

use super::{
    FIRINGS_PER_TICK, Fire, LIST_MAX, SchedulerSettings, Spec, cron_next, firing_body, latest_missed,
    next_after, spec_of, updated,
};
use crate::BuiltinError;
use crate::db::wall_ms;
use crate::nats::{Bucket, BucketSpec, Failure, Link, decode};
use crate::store::jetstream::{Prior, Wrote, each_key, key_subject, read, write};

/// Where the jobs are under the bucket's prefix.
const JOBS: &str = "j.";
/// The lease's key (beside the jobs, not among them; a name no one gives
/// a job, since a job created under it in the same two minutes as the
/// lease would share the lease's first message id).
const LEASE: &str = "switchyard.scheduler.lease";
/// Conditional writes tried against other groups' writes to one job
/// before the call answers 503.
const RETRIES: usize = 64;

/// A job as stored.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct Record {
    spec: Spec,
    /// The planned time of its next firing (wall-clock ms).
    next_ms: u64,
    /// When it is next looked at: `next_ms`, a retry's time, or while a
    /// firing is in flight the time its answer is overdue.
    due_ms: u64,
    #[serde(default)]
    attempts: u32,
    #[serde(default)]
    fired: u64,
    /// The firing in flight, `<holder>#<n>`: only it settles the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    firing: Option<String>,
}

impl Record {
    fn info(self, id: String) -> JobInfo {
        JobInfo {
            id,
            when: self.spec.when,
            event: self.spec.event,
            kind: self.spec.kind,
            payload: self.spec.payload,
            missed: self.spec.missed,
            tz: self.spec.tz,
            next_ms: self.next_ms,
            fired: self.fired,
        }
    }

    /// The job once its current firing is settled: `None` when it is done.
    fn advanced(&self, now: u64, delivered: bool) -> Result<Option<Record>, Error> {
        Ok(next_after(&self.spec, self.next_ms, now)?.map(|next| Record {
            spec: self.spec.clone(),
            next_ms: next,
            due_ms: next,
            attempts: 0,
            fired: self.fired + u64::from(delivered),
            firing: None,
        }))
    }
}

/// The lease's value: who holds it (read by people, and by the groups to
/// know whether it is their own).
#[derive(Serialize, Deserialize)]
struct LeaseValue {
    holder: String,
    renewed_ms: u64,
    lease_ms: u64,
}

/// The first firing of `spec`, planned at `now`. On JetStream every job is
/// timed on the wall clock: the jobs outlive any one machine's monotonic
/// clock (decision 0140).
fn first(spec: &Spec, now: u64) -> Result<u64, Error> {
    Ok(match &spec.when {
        When::AfterMs(d) | When::EveryMs(d) => now.saturating_add(*d),
        When::AtMs(at) => *at,
        When::Cron(expr) => cron_next(expr, spec.tz.as_deref(), now)?,
    })
}

fn jobs_of(b: &Bucket) -> Bucket {
    Bucket {
        prefix: format!("{}{JOBS}", b.prefix),
        ..b.clone()
    }
}

fn contended(id: &str) -> Failure {
    Failure::Down(format!("job `{id}` changed under {RETRIES} tries in a row"))
}

/// Job `id` (none if absent) and the state a write on it expects.
async fn job(jb: &Bucket, id: &str) -> Result<(Option<Record>, Prior), Failure> {
    let current = read(jb, id).await?;
    let prior = current.prior();
    let record = current
        .live
        .map(|rec| {
            serde_json::from_str::<Record>(&rec.value).map_err(|e| {
                Failure::Answer(Error::internal(format!("job `{id}` is stored unreadably: {e}")))
            })
        })
        .transpose()?;
    Ok((record, prior))
}

/// Writes job `id` (`None`: deletes it) if its state is still `last`.
async fn put(
    jb: &Bucket,
    id: &str,
    record: Option<&Record>,
    last: Prior,
    budget: (Duration, Duration),
) -> Result<Wrote, Failure> {
    let text = record
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| Failure::Answer(Error::internal(e.to_string())))?;
    write(jb, id, text.as_deref(), None, Some(last), budget).await
}

/// What this group knows of a job from the watch (or its own writes).
struct Hint {
    seq: u64,
    due_ms: u64,
    in_flight: bool,
    owner: String,
}

/// The jobs' due times, as this group last heard them.
#[derive(Default)]
struct Index {
    jobs: HashMap<String, Hint>,
    due: BTreeSet<(u64, String)>,
}

impl Index {
    fn put(&mut self, id: &str, seq: u64, record: &Record) {
        if let Some(old) = self.jobs.get(id) {
            if old.seq > seq {
                return;
            }
            self.due.remove(&(old.due_ms, id.to_owned()));
        }
        self.due.insert((record.due_ms, id.to_owned()));
        self.jobs.insert(
            id.to_owned(),
            Hint {
                seq,
                due_ms: record.due_ms,
                in_flight: record.firing.is_some(),
                owner: record.spec.owner.clone(),
            },
        );
    }

    fn remove(&mut self, id: &str, seq: u64) {
        if self.jobs.get(id).is_some_and(|old| old.seq <= seq)
            && let Some(old) = self.jobs.remove(id)
        {
            self.due.remove(&(old.due_ms, id.to_owned()));
        }
    }

    fn set(&mut self, id: &str, seq: u64, record: Option<&Record>) {
        match record {
            Some(record) => self.put(id, seq, record),
            None => self.remove(id, seq),
        }
    }
}

type SharedIndex = Arc<Mutex<Index>>;

fn lock(index: &SharedIndex) -> MutexGuard<'_, Index> {
    index.lock().unwrap_or_else(|p| p.into_inner())
}

/// Hands every change of `key` (a KV key, or a wildcard) in `b` to
/// `on_entry` for as long as the process lives: followed again after any
/// interruption, and whenever the link comes back up (a watch may have
/// stalled through the outage). `history`: the current entries first.
async fn follow_key(
    b: Bucket,
    link: Arc<Link>,
    key: String,
    history: bool,
    mut on_entry: impl FnMut(kv::Entry) + Send,
) {
    loop {
        let watch = if history {
            b.kv.watch_with_history(&key).await
        } else {
            b.kv.watch(&key).await
        };
        if let Ok(mut entries) = watch {
            loop {
                let entry = tokio::select! {
                    next = entries.next() => match next {
                        Some(Ok(entry)) => entry,
                        _ => break,
                    },
                    () = link.revived() => break,
                };
                on_entry(entry);
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Keeps `index` equal to the jobs in the bucket for as long as the
/// process lives.
async fn follow(b: Bucket, link: Arc<Link>, index: SharedIndex) {
    let key_prefix = format!("{JOBS}k.");
    let jobs = format!("{key_prefix}>");
    follow_key(b, link, jobs, true, move |entry| {
        let Some(id) = entry.key.strip_prefix(key_prefix.as_str()).and_then(decode) else {
            return;
        };
        let mut index = lock(&index);
        match entry.operation {
            Operation::Put => {
                if let Ok(record) = serde_json::from_slice::<Record>(&entry.value) {
                    index.put(&id, entry.revision, &record);
                }
            }
            Operation::Delete | Operation::Purge => index.remove(&id, entry.revision),
        }
    })
    .await;
}

/// Tells `released` whenever the lease is deleted (its holder gave it up
/// on a planned stop), so that this group looks at it at once instead of
/// at its next quarter of `lease_ms` (decision 0141). A release missed
/// while the watch is interrupted costs the wait for the lease to lapse,
/// as a holder's death does.
async fn follow_releases(b: Bucket, link: Arc<Link>, released: Arc<AtomicBool>) {
    follow_key(b, link, key_subject("", LEASE), false, move |entry| {
        if matches!(entry.operation, Operation::Delete | Operation::Purge) {
            released.store(true, Ordering::Release);
        }
    })
    .await;
}

/// The lease, as this group knows it.
struct Lease {
    /// Held until then, on this process's monotonic clock.
    held_until: Option<Instant>,
    /// The sequence of this process's last acknowledged renewal: what a
    /// release deletes the lease on condition of, so that it never
    /// deletes another holder's (decision 0141).
    renewal: Option<u64>,
    /// Set by the lease's follower when its holder released it: look at
    /// once rather than at the next quarter of `lease_ms`.
    released: Arc<AtomicBool>,
    /// Another holder's lease message and when this group first saw it.
    seen: Option<(u64, Instant)>,
    next_look: Instant,
    /// The last failure logged (an outage is logged once).
    failure: Option<String>,
}

/// What a look at the lease found.
enum Look {
    /// This group holds it (its renewal's sequence).
    Mine(u64),
    /// Another group holds it: the lease message's sequence, the holder.
    Other(u64, String),
    /// Another group wrote it between this group's read and write.
    Lost,
}

/// What starting a due job's firing came to.
enum Started {
    Fire(Record, u64),
    /// Not due (the hint was stale), skipped by its `missed` policy, or
    /// gone: the index is told.
    Known(Option<Record>, u64),
}

/// The Scheduler's JetStream back end.
pub(crate) struct JsJobs {
    link: Arc<Link>,
    index: SharedIndex,
    settings: SchedulerSettings,
    /// This process among every group's Schedulers (the lease's holder).
    me: String,
    bucket: String,
    lease: Lease,
    /// Firings this process sent and has not settled: job id → token.
    in_flight: HashMap<String, u64>,
    next_token: u64,
    next_id: u64,
    /// Just took the lease: the previous holder's firings in flight are
    /// sent again at the next due round.
    resend: bool,
}

impl JsJobs {
    pub(crate) fn start(
        cluster: &switchyard_cluster::Config,
        settings: SchedulerSettings,
    ) -> Result<JsJobs, BuiltinError> {
        let bucket = settings
            .bucket
            .clone()
            .unwrap_or_else(|| format!("scheduler-{}", cluster.name));
        let spec = BucketSpec {
            name: bucket.clone(),
            replicas: settings.replicas,
            // A job's record is its payload and the client's identity.
            max_value_bytes: settings.max_payload_bytes + 64 * 1024,
        };
        let index = SharedIndex::default();
        let followed = index.clone();
        let released = Arc::new(AtomicBool::new(false));
        let told = released.clone();
        let link = Link::start_as(
            "scheduler",
            cluster,
            spec,
            Duration::from_millis(settings.op_timeout_ms),
            move |link, bucket| {
                link.spawn(follow(jobs_of(bucket), link.clone(), followed));
                link.spawn(follow_releases(bucket.clone(), link.clone(), told));
            },
        )?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros())
            .unwrap_or(0);
        Ok(JsJobs {
            link,
            index,
            me: format!("{host}:{}:{started:x}", std::process::id()),
            bucket,
            settings,
            lease: Lease {
                held_until: None,
                renewal: None,
                released,
                seen: None,
                next_look: Instant::now(),
                failure: None,
            },
            in_flight: HashMap::new(),
            next_token: 1,
            next_id: 0,
            resend: false,
        })
    }

    fn budget(&self) -> (Duration, Duration) {
        (
            self.link.attempt_timeout(),
            self.link.timeout.saturating_sub(Duration::from_millis(100)),
        )
    }

    fn period(&self) -> Duration {
        Duration::from_millis(self.settings.lease_ms)
    }

    fn holding(&self) -> bool {
        self.lease.held_until.is_some_and(|t| Instant::now() < t)
    }

    pub(crate) fn answering(&self) -> bool {
        self.link.answering()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn firing(&self, token: u64) -> String {
        format!("{}#{token}", self.me)
    }

    /// Takes, renews or watches the lease, every third (holder) or quarter
    /// (the others) of `lease_ms`.
    pub(crate) fn keep_lease(&mut self, cx: &Context) {
        let now = Instant::now();
        let released = self.lease.released.swap(false, Ordering::AcqRel);
        if now < self.lease.next_look && !released {
            return;
        }
        let period = self.period();
        let was = self.holding();
        self.lease.next_look = now + if was { period / 3 } else { period / 4 };
        if !self.link.answering() {
            return;
        }
        let (me, budget, seen) = (self.me.clone(), self.budget(), self.lease.seen);
        let lease_ms = self.settings.lease_ms;
        let sent = Instant::now();
        let looked = self.link.run(move |b| async move {
            let current = read(&b, LEASE).await?;
            let holder = current
                .live
                .as_ref()
                .and_then(|r| serde_json::from_str::<LeaseValue>(&r.value).ok())
                .map(|v| v.holder);
            let mine = holder.as_deref() == Some(me.as_str());
            let lapsed = seen.is_some_and(|(seq, at)| seq == current.last && at.elapsed() >= period);
            if let Some(holder) = holder
                && !mine
                && !lapsed
            {
                return Ok(Look::Other(current.last, holder));
            }
            let value = LeaseValue {
                holder: me,
                renewed_ms: wall_ms(),
                lease_ms,
            };
            let text =
                serde_json::to_string(&value).map_err(|e| Failure::Answer(Error::internal(e.to_string())))?;
            Ok(
                match write(&b, LEASE, Some(&text), None, Some(current.prior()), budget).await? {
                    Wrote::Done(seq) => Look::Mine(seq),
                    Wrote::Moved => Look::Lost,
                },
            )
        });
        match looked {
            Ok(Look::Mine(seq)) => {
                self.lease.held_until = Some(sent + period * 4 / 5);
                self.lease.renewal = Some(seq);
                self.lease.seen = None;
                if !was {
                    self.resend = true;
                    cx.log_at(
                        LogLevel::Info,
                        &format!(
                            "scheduler: this group holds the lease of `{}` ({}): it fires the cluster's jobs",
                            self.bucket, self.me
                        ),
                    );
                }
            }
            Ok(look) => {
                if let Look::Other(seq, holder) = &look {
                    if self.lease.seen.is_none_or(|(s, _)| s != *seq) {
                        self.lease.seen = Some((*seq, now));
                    }
                    if was {
                        cx.log_at(
                            LogLevel::Warn,
                            &format!("scheduler: the lease of `{}` went to {holder}", self.bucket),
                        );
                    }
                }
                self.lease.held_until = None;
                self.lease.renewal = None;
            }
            // The renewal's outcome is unknown or it failed: the lease
            // lapses here at its time unless a later look renews it.
            Err(e) => {
                let text = e.to_string();
                if self.lease.failure.as_deref() != Some(text.as_str()) {
                    cx.log_at(
                        LogLevel::Warn,
                        &format!("scheduler: the lease of `{}`: {text}", self.bucket),
                    );
                    self.lease.failure = Some(text);
                }
                return;
            }
        }
        self.lease.failure = None;
    }

    /// Gives the lease up on a planned stop, so that another group takes
    /// it at once rather than `lease_ms` after the last renewal (decision
    /// 0141): a delete on condition that the lease's last message is this
    /// process's own last renewal, so a lease another group has taken
    /// meanwhile is never deleted. Bounded by `op_timeout_ms`; one that
    /// fails leaves the lease to lapse as a holder's death does.
    fn release(&mut self) {
        let Some(seq) = self.lease.renewal.take() else {
            return;
        };
        self.lease.held_until = None;
        let budget = self.budget();
        let released = self
            .link
            .run(move |b| async move { write(&b, LEASE, None, None, Some(Prior::bare(seq)), budget).await });
        // No `Context` outlives the manager: the host logs its stderr.
        match released {
            Ok(Wrote::Done(_)) => eprintln!(
                "switchyard: scheduler: released the lease of `{}` on stopping",
                self.bucket
            ),
            // Another group holds it already.
            Ok(Wrote::Moved) => {}
            Err(e) => eprintln!(
                "switchyard: scheduler: the lease of `{}` was not released ({e}): another group takes it over once it lapses",
                self.bucket
            ),
        }
    }

    pub(crate) fn schedule_for(
        &mut self,
        ev: Schedule,
        owner: &str,
        identity: Option<serde_json::Value>,
    ) -> Result<Scheduled, Error> {
        let spec = spec_of(&ev, owner, identity, &self.settings)?;
        if !owner.is_empty() {
            // Counted from this group's index: as current as the watch.
            let index = lock(&self.index);
            let has = ev
                .id
                .as_ref()
                .is_some_and(|id| index.jobs.get(id).is_some_and(|h| h.owner == owner));
            let max = self.settings.max_jobs_per_client;
            if !has && index.jobs.values().filter(|h| h.owner == owner).count() as u64 >= max {
                return Err(Error::new(
                    429,
                    format!(
                        "a client holds at most {max} jobs (the scheduler's `max_jobs_per_client`); cancel one first"
                    ),
                ));
            }
        }
        self.next_id += 1;
        let fresh = format!("job-{:x}-{:x}-{:x}", wall_ms(), std::process::id(), self.next_id);
        let (given, replace, budget) = (ev.id, ev.replace, self.budget());
        let (scheduled, written) = self.link.run(move |b| async move {
            let jb = jobs_of(&b);
            for n in 0..RETRIES {
                let id = given.clone().unwrap_or_else(|| format!("{fresh}-{n}"));
                let (existing, last) = job(&jb, &id).await?;
                let mut fired = 0;
                if let Some(existing) = existing {
                    if given.is_none() {
                        continue;
                    }
                    if existing.spec.owner != spec.owner {
                        return Err(Error::conflict(format!("the job id `{id}` is taken")).into());
                    }
                    if existing.spec.same_job(&spec) {
                        let next_ms = existing.next_ms;
                        if existing.spec.identity == spec.identity {
                            return Ok((
                                Scheduled {
                                    id,
                                    next_ms,
                                    created: false,
                                },
                                None,
                            ));
                        }
                        // The client's newer credential is the one the job
                        // fires with from now on.
                        let record = Record {
                            spec: spec.clone(),
                            ..existing
                        };
                        if let Wrote::Done(seq) = put(&jb, &id, Some(&record), last, budget).await? {
                            let scheduled = Scheduled {
                                id,
                                next_ms,
                                created: false,
                            };
                            return Ok((scheduled, Some((record, seq))));
                        }
                        continue;
                    }
                    if !replace {
                        return Err(Error::conflict(format!(
                            "a different job `{id}` exists: cancel it, update it, or schedule with `replace`"
                        ))
                        .into());
                    }
                    fired = existing.fired;
                }
                let next_ms = first(&spec, wall_ms())?;
                let record = Record {
                    spec: spec.clone(),
                    next_ms,
                    due_ms: next_ms,
                    attempts: 0,
                    fired,
                    firing: None,
                };
                if let Wrote::Done(seq) = put(&jb, &id, Some(&record), last, budget).await? {
                    let scheduled = Scheduled {
                        id,
                        next_ms,
                        created: true,
                    };
                    return Ok((scheduled, Some((record, seq))));
                }
            }
            Err(contended(given.as_deref().unwrap_or(&fresh)))
        })?;
        if let Some((record, seq)) = written {
            if scheduled.created {
                self.in_flight.remove(&scheduled.id);
            }
            lock(&self.index).put(&scheduled.id, seq, &record);
        }
        Ok(scheduled)
    }

    pub(crate) fn update_for(
        &mut self,
        ev: Update,
        owner: &str,
        identity: Option<serde_json::Value>,
    ) -> Result<Scheduled, Error> {
        let (id, owner) = (ev.id.clone(), owner.to_owned());
        let (settings, budget) = (self.settings.clone(), self.budget());
        let (record, seq, replan) = self.link.run({
            let id = id.clone();
            move |b| async move {
                let jb = jobs_of(&b);
                for _ in 0..RETRIES {
                    let (existing, last) = job(&jb, &id).await?;
                    let Some(existing) = existing.filter(|r| r.spec.owner == owner) else {
                        return Err(Error::not_found(format!("no job `{id}`")).into());
                    };
                    let (spec, replan) =
                        updated(&existing.spec, ev.clone(), &owner, identity.clone(), &settings)?;
                    let record = if replan {
                        let next_ms = first(&spec, wall_ms())?;
                        Record {
                            spec,
                            next_ms,
                            due_ms: next_ms,
                            attempts: 0,
                            fired: existing.fired,
                            firing: None,
                        }
                    } else {
                        Record { spec, ..existing }
                    };
                    if let Wrote::Done(seq) = put(&jb, &id, Some(&record), last, budget).await? {
                        return Ok((record, seq, replan));
                    }
                }
                Err(contended(&id))
            }
        })?;
        if replan {
            // A firing in flight for the old plan settles nothing.
            self.in_flight.remove(&id);
        }
        lock(&self.index).put(&id, seq, &record);
        Ok(Scheduled {
            id,
            next_ms: record.next_ms,
            created: false,
        })
    }

    /// Cancels `owner`'s job `id`; another owner's is as absent.
    pub(crate) fn cancel_as(&mut self, id: &str, owner: &str) -> Result<bool, Error> {
        let (k, owner, budget) = (id.to_owned(), owner.to_owned(), self.budget());
        let deleted = self.link.run(move |b| async move {
            let jb = jobs_of(&b);
            for _ in 0..RETRIES {
                let (existing, last) = job(&jb, &k).await?;
                if existing.filter(|r| r.spec.owner == owner).is_none() {
                    return Ok(None);
                }
                if let Wrote::Done(seq) = put(&jb, &k, None, last, budget).await? {
                    return Ok(Some(seq));
                }
            }
            Err(contended(&k))
        })?;
        self.in_flight.remove(id);
        if let Some(seq) = deleted {
            lock(&self.index).remove(id, seq);
        }
        Ok(deleted.is_some())
    }

    pub(crate) fn get_as(&self, id: &str, owner: &str) -> Result<Option<JobInfo>, Error> {
        let k = id.to_owned();
        let (record, _) = self
            .link
            .run(move |b| async move { job(&jobs_of(&b), &k).await })?;
        Ok(record
            .filter(|r| r.spec.owner == owner)
            .map(|r| r.info(id.to_owned())))
    }

    /// `owner`'s jobs only: one pass over the bucket's jobs, keeping the
    /// page's `limit + 1` smallest ids.
    pub(crate) fn list_as(&self, ev: &ListJobs, owner: &str) -> Result<Jobs, Error> {
        let limit = ev.limit.unwrap_or(LIST_MAX).clamp(1, LIST_MAX) as usize;
        let (prefix, after, owner) = (ev.prefix.clone(), ev.after.clone(), owner.to_owned());
        let kept = self.link.run(move |b| async move {
            let mut kept: BTreeMap<String, Record> = BTreeMap::new();
            each_key(&jobs_of(&b), false, |id, _, _, payload| {
                if !id.starts_with(prefix.as_str())
                    || after.as_ref().is_some_and(|a| id.as_str() <= a.as_str())
                {
                    return;
                }
                if kept.len() > limit
                    && let Some(last) = kept.keys().next_back()
                    && id.as_str() > last.as_str()
                {
                    return;
                }
                let Ok(record) = serde_json::from_slice::<Record>(payload) else {
                    return;
                };
                if record.spec.owner == owner {
                    kept.insert(id, record);
                    if kept.len() > limit + 1 {
                        kept.pop_last();
                    }
                }
            })
            .await?;
            Ok(kept)
        })?;
        let more = kept.len() > limit;
        let jobs: Vec<JobInfo> = kept
            .into_iter()
            .take(limit)
            .map(|(id, record)| record.info(id))
            .collect();
        let next = more.then(|| jobs.last().map(|j| j.id.clone())).flatten();
        Ok(Jobs { jobs, next })
    }

    /// The firings to send now, each recorded as started first; none
    /// unless this group holds the lease. At most `room`.
    pub(crate) fn due(&mut self, room: usize) -> Result<Vec<Fire>, Error> {
        if !self.holding() {
            return Ok(Vec::new());
        }
        let now = wall_ms();
        let limit = room.min(FIRINGS_PER_TICK);
        let resend = std::mem::take(&mut self.resend);
        let candidates: Vec<String> = {
            let index = lock(&self.index);
            let mut ids: Vec<String> = index
                .due
                .iter()
                .take_while(|(due, _)| *due <= now)
                .map(|(_, id)| id.clone())
                .take(limit)
                .collect();
            if resend {
                for (id, hint) in &index.jobs {
                    if ids.len() >= limit {
                        break;
                    }
                    if hint.in_flight && !self.in_flight.contains_key(id) && !ids.contains(id) {
                        ids.push(id.clone());
                    }
                }
            }
            ids
        };
        let mut fires = Vec::new();
        for id in candidates {
            // Each start is a round trip or two: the lease may run out
            // meanwhile, and then another group may be firing.
            if !self.holding() {
                break;
            }
            let token = self.next_token;
            self.next_token += 1;
            let firing = self.firing(token);
            let (k, budget) = (id.clone(), self.budget());
            let (grace, ack_by) = (
                self.settings.misfire_grace_ms,
                now + self.settings.call_timeout_ms + 1000,
            );
            // A firing left in flight by a previous holder is due now.
            let left = resend && !self.in_flight.contains_key(&id);
            let started = self.link.run(move |b| async move {
                let jb = jobs_of(&b);
                for _ in 0..RETRIES {
                    let (record, last) = job(&jb, &k).await?;
                    let Some(mut record) = record else {
                        // Gone, whatever this group heard of it last.
                        return Ok(Started::Known(None, u64::MAX));
                    };
                    if record.due_ms > now && !(left && record.firing.is_some()) {
                        return Ok(Started::Known(Some(record), last.last));
                    }
                    let mut planned = record.next_ms;
                    if record.attempts == 0 && now.saturating_sub(record.next_ms) > grace {
                        match record.spec.missed {
                            Missed::Skip => {
                                let next = record.advanced(now, false)?;
                                if let Wrote::Done(seq) = put(&jb, &k, next.as_ref(), last, budget).await? {
                                    return Ok(Started::Known(next, seq));
                                }
                                continue;
                            }
                            Missed::Once => planned = latest_missed(&record.spec, record.next_ms, now),
                        }
                    }
                    record.next_ms = planned;
                    record.due_ms = ack_by;
                    record.attempts += 1;
                    record.firing = Some(firing.clone());
                    if let Wrote::Done(seq) = put(&jb, &k, Some(&record), last, budget).await? {
                        return Ok(Started::Fire(record, seq));
                    }
                }
                Err(contended(&k))
            });
            match started {
                Ok(Started::Fire(record, seq)) => {
                    lock(&self.index).put(&id, seq, &record);
                    self.in_flight.insert(id.clone(), token);
                    fires.push(Fire {
                        body: firing_body(&id, record.next_ms, &record.spec.payload),
                        client: record.spec.client(),
                        id,
                        token,
                        event: record.spec.event,
                        kind: record.spec.kind,
                        planned_ms: record.next_ms,
                    });
                }
                Ok(Started::Known(record, seq)) => lock(&self.index).set(&id, seq, record.as_ref()),
                // What was started is sent; the rest waits for a later tick.
                Err(e) if fires.is_empty() => return Err(e),
                Err(_) => break,
            }
        }
        Ok(fires)
    }

    /// Settles a firing of this process as `next` says, unless its job
    /// changed hands or plans meanwhile (then it settles nothing).
    fn settle(
        &mut self,
        id: &str,
        token: u64,
        next: impl Fn(&Record, u64) -> Result<Option<Record>, Error> + Send + 'static,
    ) -> Result<(), Error> {
        if self.in_flight.get(id) != Some(&token) {
            return Ok(());
        }
        self.in_flight.remove(id);
        let (k, firing, budget) = (id.to_owned(), self.firing(token), self.budget());
        let written = self.link.run(move |b| async move {
            let jb = jobs_of(&b);
            for _ in 0..RETRIES {
                let (record, last) = job(&jb, &k).await?;
                let Some(record) = record.filter(|r| r.firing.as_deref() == Some(firing.as_str())) else {
                    return Ok(None);
                };
                let after = next(&record, wall_ms())?;
                if let Wrote::Done(seq) = put(&jb, &k, after.as_ref(), last, budget).await? {
                    return Ok(Some((after, seq)));
                }
            }
            Err(contended(&k))
        })?;
        if let Some((record, seq)) = written {
            lock(&self.index).set(id, seq, record.as_ref());
        }
        Ok(())
    }

    pub(crate) fn delivered(&mut self, id: &str, token: u64) -> Result<(), Error> {
        self.settle(id, token, |record, now| record.advanced(now, true))
    }

    /// As the SQLite engine's: retried later if it may help and attempts
    /// are left, else given up.
    pub(crate) fn failed_firing(&mut self, id: &str, token: u64, status: u16) -> Result<bool, Error> {
        if self.in_flight.get(id) != Some(&token) {
            return Ok(false);
        }
        let (max, initial) = (self.settings.max_attempts, self.settings.retry_initial_ms);
        let retry = Arc::new(Mutex::new(false));
        let retried = retry.clone();
        self.settle(id, token, move |record, now| {
            let again = matches!(status, 502..=504) && record.attempts < max;
            *retried.lock().unwrap_or_else(|p| p.into_inner()) = again;
            if !again {
                return record.advanced(now, false);
            }
            let delay = initial
                .saturating_mul(1 << record.attempts.saturating_sub(1).min(20))
                .min(30_000);
            Ok(Some(Record {
                due_ms: now + delay,
                firing: None,
                ..record.clone()
            }))
        })?;
        Ok(*retry.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for JsJobs {
    /// The manager is dropped on a planned stop only (a stopping or
    /// reloading group, a drained instance): a crash never gets here.
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_manager::scheduler::Kind;
    use switchyard_manager::store::JsonText;

    fn record(due_ms: u64, owner: &str, firing: bool) -> Record {
        Record {
            spec: Spec {
                when: When::AfterMs(1),
                event: "e".into(),
                kind: Kind::Notification,
                payload: JsonText::null(),
                missed: Missed::Once,
                tz: None,
                owner: owner.into(),
                identity: None,
            },
            next_ms: due_ms,
            due_ms,
            attempts: 0,
            fired: 0,
            firing: firing.then(|| "g#1".into()),
        }
    }

    fn due(index: &Index) -> Vec<(u64, &str)> {
        index.due.iter().map(|(d, id)| (*d, id.as_str())).collect()
    }

    #[test]
    fn the_index_keeps_the_newest_state_of_each_job_whatever_the_order_heard() {
        let mut index = Index::default();
        index.put("a", 5, &record(100, "", false));
        index.put("b", 6, &record(50, "client:x", true));
        // The watch brings an older message after this group's own write.
        index.put("a", 3, &record(10, "", false));
        assert_eq!(due(&index), [(50, "b"), (100, "a")]);
        assert!(index.jobs["b"].in_flight);
        index.put("a", 7, &record(20, "", false));
        assert_eq!(due(&index), [(20, "a"), (50, "b")]);
        // An older delete marker leaves a newer job; a newer one removes it.
        index.remove("a", 6);
        assert_eq!(index.jobs.len(), 2);
        index.remove("a", 8);
        assert_eq!(due(&index), [(50, "b")]);
        // A job found gone removes its hint whatever it was.
        index.set("b", u64::MAX, None);
        assert!(index.jobs.is_empty() && index.due.is_empty());
    }

    #[test]
    fn a_settled_firing_moves_a_repeating_job_on_and_ends_a_one_shot_one() {
        let mut every = record(1000, "", true);
        every.spec.when = When::EveryMs(100);
        every.attempts = 1;
        let next = every.advanced(1250, true).unwrap().unwrap();
        assert_eq!(
            (next.next_ms, next.due_ms, next.attempts, next.fired),
            (1300, 1300, 0, 1)
        );
        assert!(next.firing.is_none());
        assert!(record(1000, "", true).advanced(1250, true).unwrap().is_none());
        assert_eq!(first(&every.spec, 5000).unwrap(), 5100);
    }
}
