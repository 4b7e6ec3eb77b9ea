//! The demo application: what `switchyard up` serves with no configuration.
//!
//! A plugin library with three managers, so that the group shows routing
//! between processes and both kinds of worker pool: `basics` answers
//! `/noop`, `/echo`, `/hello/{name}` and `/panic`; `payload` answers
//! `/payload/{size}`, `/stream/{size}` (a body streamed through a
//! shared-memory pipe), `POST /upload` (a body read as it streams in) and
//! `/sleep/{ms}` (a blocking job on its thread pool);
//! `compute` answers `/cpu/{ms}` (CPU work in its process pool),
//! `/cpu-inline/{ms}` (the same work in the manager itself) and
//! `/crash/{mode}` (a job that panics or aborts its worker process).
//! `basics` also serves `/kv/{key}` and `/reminders` over the group's
//! built-in Store and Scheduler (`state`).
//! The `switchyard` binary links this crate in; `switchyard-demo-plugin`
//! (plugin/) is the same managers as a `cdylib` that loads like any other
//! plugin.

#![forbid(unsafe_code)]

mod state;
pub use state::{
    Counted, KvGet, KvIncr, KvPut, Remind, Reminder, ReminderDue, ReminderSet, StoreBench, StoreBenched,
};

use serde::{Deserialize, Serialize};
use switchyard_manager::{
    AutoEtag, Binary, BodyReader, Config, Context, Error, Event, Json, Manager, Registry, Reply, Request,
    State, Streamed, WithHeaders, shared_body, tracing,
};

/// `GET /noop` → `{"ok":true}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Noop", http = "GET /noop")]
pub struct Noop {}

/// `POST /echo` → the JSON body, echoed.
#[derive(Deserialize, Serialize)]
pub struct Echo(pub serde_json::Value);

// Hand-written: any reply (what `#[event]` without `reply` says).
impl<R> switchyard_manager::Returns<R> for Echo {}

impl Event for Echo {
    const NAME: &'static str = "demo.Echo";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("POST", "/echo"));
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        request.body_as().map(Echo)
    }
    // Hand-written, so described by hand: the body is the event, any JSON.
    fn schema(
        _: &mut switchyard_manager::schema::SchemaGenerator,
    ) -> switchyard_manager::schema::EventSchema {
        whole_body_schema(
            "`POST /echo` → the JSON body, echoed.",
            serde_json::json!({ "description": "Any JSON document; answered as it came." }),
        )
    }
}

/// The description of a hand-written event whose body is the whole event.
pub(crate) fn whole_body_schema(
    description: &str,
    schema: serde_json::Value,
) -> switchyard_manager::schema::EventSchema {
    switchyard_manager::schema::EventSchema {
        description: description.to_owned(),
        whole_body: true,
        schema: switchyard_manager::schema::Schema::try_from(schema).unwrap_or_default(),
        ..switchyard_manager::schema::EventSchema::any()
    }
}

/// `GET /hello/{name}` → `{"message":"Hello, NAME!"}`; a browser gets
/// the page `templates/hello.html` renders from it (docs/web.md).
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Hello", http = "GET /hello/{name}", template = "hello.html")]
pub struct Hello {
    #[validate(length(min = 1, max = 100))]
    pub name: String,
}

/// `GET /whoami` → what the handler knows of its request: the caller's
/// `sub` (from authentication's scope, when `[auth]` is on), client
/// address, request id, `User-Agent`, and a `visits` cookie it counts up
/// (answered with `Set-Cookie`).
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Whoami", http = "GET /whoami")]
pub struct Whoami {
    /// Only ever from the scope: `?sub=` or a body cannot set it.
    #[from(scope = "sub")]
    pub sub: Option<String>,
    #[from(client)]
    pub client: Option<std::net::IpAddr>,
    #[from(header = "user-agent")]
    pub user_agent: Option<String>,
    /// The count so far; not a number counts as none.
    #[from(cookie = "visits")]
    pub visits: Option<String>,
}

#[derive(Serialize, Deserialize, Reply)]
pub struct Known {
    pub sub: Option<String>,
    pub client: Option<String>,
    pub request_id: Option<String>,
    pub user_agent: Option<String>,
    pub visits: u64,
}

/// `GET /hi/{name}` → 308 to `/hello/{name}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Hi", http = "GET /hi/{name}")]
pub struct Hi {
    #[validate(length(min = 1, max = 100))]
    pub name: String,
}

/// What the `/ws/echo` WebSocket route sends for each message: its raw
/// bytes (text or binary); the reply is the same bytes.
#[derive(Deserialize, Serialize)]
pub struct WsEcho(pub bytes::Bytes);

// Hand-written: any reply (what `#[event]` without `reply` says).
impl<R> switchyard_manager::Returns<R> for WsEcho {}

impl Event for WsEcho {
    const NAME: &'static str = "demo.WsEcho";
    // No HTTP route, but `/ws/echo` clients send it: public (decision 0108).
    const PUBLIC: bool = true;
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        Ok(WsEcho(bytes::Bytes::copy_from_slice(request.body)))
    }
}

/// `GET /me` → `{"sub": SUBJECT}`: who called. The demo group's `[auth]`
/// requires a bearer token here (`switchyard token --sub NAME` makes one),
/// so only an authenticated call reaches the handler.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Me", http = "GET /me")]
pub struct Me {
    /// The verified token's subject; never from the query or a body.
    #[from(scope = "sub")]
    pub sub: Option<String>,
}

/// The answer of `GET /me`.
#[derive(Serialize, Deserialize, Reply)]
pub struct Subject {
    /// The caller's subject, from the request's scope.
    pub sub: Option<String>,
}

/// `GET /panic` → the handler panics; the client gets 500.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Panic", http = "GET /panic")]
pub struct Panic {}

/// `{"ok": true}`: done, nothing more to say.
#[derive(Serialize, Deserialize, Reply)]
pub struct Done {
    pub ok: bool,
}

#[derive(Serialize, Deserialize, Reply)]
pub struct Greeting {
    pub message: String,
}

/// `GET /upload`: the upload form (`templates/upload.html`); as JSON,
/// what the form posts to.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.UploadForm", http = "GET /upload", template = "upload.html")]
pub struct UploadForm {}

#[derive(Serialize, Deserialize, Reply)]
pub struct UploadPage {
    pub action: String,
}

/// `POST /files` (`multipart/form-data`): for each file part, its field
/// name, file name, content type, length and SHA-256; `note` from the
/// form's text field before the files.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Files", http = "POST /files")]
pub struct Files {
    #[serde(default)]
    #[validate(length(max = 200))]
    pub note: Option<String>,
}

#[derive(Serialize, Deserialize, Debug, PartialEq, Eq)]
pub struct FilePart {
    pub field: Option<String>,
    pub filename: Option<String>,
    pub content_type: Option<String>,
    pub length: u64,
    pub sha256: String,
}

#[derive(Serialize, Deserialize, Reply)]
pub struct FilesReceived {
    pub note: Option<String>,
    pub files: Vec<FilePart>,
}

/// The demo's limits for `POST /files`: parts up to 8 MiB (the body as a
/// whole is bounded by `listener.max_upload_bytes`).
pub const FILES_LIMITS: switchyard_manager::MultipartLimits = switchyard_manager::MultipartLimits {
    max_part_bytes: 8 << 20,
    max_field_bytes: 64 << 10,
    max_parts: 32,
    max_header_bytes: 16 << 10,
};

/// `POST /greet` with a JSON body or an HTML form (`name=Ada&excited=true`).
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Greet", http = "POST /greet", template = "hello.html")]
pub struct Greet {
    #[validate(length(min = 1, max = 100))]
    pub name: String,
    #[serde(default)]
    pub excited: bool,
}

/// `GET /note` → `{"text": ..}` with an entity tag (404 until a note is
/// written); `PUT /note` writes it, refused with 412 when its `If-Match`
/// names an older note (a lost update) or its `If-None-Match` names the
/// current one (`*`: any note, so that a create never overwrites).
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.GetNote", http = "GET /note")]
pub struct GetNote {}

/// `PUT /note`: the note's new text.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.PutNote", http = "PUT /note")]
pub struct PutNote {
    #[validate(length(max = 1000))]
    pub text: String,
    #[from(header = "if-match")]
    pub if_match: Option<String>,
    #[from(header = "if-none-match")]
    pub if_none_match: Option<String>,
}

#[derive(Serialize, Deserialize, Reply, Clone)]
pub struct Note {
    pub text: String,
}

/// Whether an `If-None-Match` value (`*` or a list of entity tags) names
/// `etag`, by the weak comparison RFC 9110 §13.1.2 asks for.
fn names_weakly(header: &str, etag: &str) -> bool {
    let opaque = |tag: &str| tag.trim().trim_start_matches("W/").to_owned();
    header.trim() == "*" || header.split(',').any(|tag| opaque(tag) == opaque(etag))
}

/// Reads every part of the form as it streams in, hashing it: nothing is
/// held whole, nothing is written to disk.
fn files(ev: Files, form: &mut switchyard_manager::Multipart) -> Result<FilesReceived, Error> {
    use sha2::Digest;
    let mut files = Vec::new();
    while let Some(mut part) = form.next_part()? {
        let mut hash = sha2::Sha256::new();
        while let Some(chunk) = part.chunk()? {
            hash.update(&chunk);
        }
        files.push(FilePart {
            field: part.name().map(str::to_owned),
            filename: part.filename().map(str::to_owned),
            content_type: part.content_type().map(str::to_owned),
            length: part.bytes_read(),
            sha256: hash.finalize().iter().map(|b| format!("{b:02x}")).collect(),
        });
    }
    Ok(FilesReceived { note: ev.note, files })
}

/// The `basics` manager.
pub struct Basics {
    /// `GET`/`PUT /note`: none until the first `PUT`.
    note: Option<Note>,
}

impl Manager for Basics {
    const NAME: &'static str = "basics";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(Basics { note: None })
    }
    fn register(r: &mut Registry<Self>) {
        r.handle(Self::noop)
            .handle(Self::echo)
            .handle(Self::hello)
            .handle(Self::upload_form)
            .handle(Self::greet)
            .handle(Self::get_note)
            .handle(Self::put_note)
            .multipart_with(FILES_LIMITS, files)
            .handle(Self::panic)
            .handle(Self::whoami)
            .handle(Self::hi)
            .handle(Self::me)
            .handle(Self::ws_echo)
            // Over the built-in Store and Scheduler (`state`).
            .handle(Self::kv_put)
            .handle(Self::kv_get)
            .handle(Self::kv_incr)
            .handle(Self::remind)
            .handle(Self::reminder_due)
            .handle(Self::store_bench)
            .emits::<state::Reminder>();
    }
}

impl Basics {
    fn noop(&mut self, _: Noop, _: &mut Context) -> Result<Done, Error> {
        Ok(Done { ok: true })
    }

    fn echo(&mut self, ev: Echo, _: &mut Context) -> Result<Json<serde_json::Value>, Error> {
        Ok(Json(ev.0))
    }

    /// Revalidated by its client on every use (`no-cache`), with a tag
    /// from the reply's bytes: an unchanged greeting is a 304.
    fn hello(&mut self, ev: Hello, _: &mut Context) -> Result<WithHeaders<AutoEtag<Greeting>>, Error> {
        let greeting = Greeting {
            message: format!("Hello, {}!", ev.name),
        };
        Ok(greeting.with_auto_etag().with_cache_control("no-cache"))
    }

    fn greet(&mut self, ev: Greet, _: &mut Context) -> Result<Greeting, Error> {
        let end = if ev.excited { "!!!" } else { "!" };
        Ok(Greeting {
            message: format!("Hello, {}{end}", ev.name),
        })
    }

    fn get_note(&mut self, _: GetNote, _: &mut Context) -> Result<AutoEtag<Note>, Error> {
        match &self.note {
            Some(note) => Ok(note.clone().with_auto_etag()),
            None => Err(Error::not_found("no note yet; PUT /note writes one")),
        }
    }

    /// The preconditions of RFC 9110 §13.2.2, in its order, against the
    /// note as it is now; only then the write.
    fn put_note(&mut self, ev: PutNote, cx: &mut Context) -> Result<AutoEtag<Note>, Error> {
        let current = match &self.note {
            Some(note) => Some(switchyard_manager::etag_of(
                &serde_json::to_vec(note).map_err(|e| Error::internal(e.to_string()))?,
            )),
            None => None,
        };
        match &current {
            Some(tag) => cx.if_match(tag)?,
            // `If-Match` (even `*`) needs a current note to match.
            None if ev.if_match.is_some() => {
                return Err(Error::precondition_failed("there is no note yet (If-Match)"));
            }
            None => {}
        }
        if let (Some(tags), Some(tag)) = (&ev.if_none_match, &current)
            && names_weakly(tags, tag)
        {
            return Err(Error::precondition_failed(
                "a note exists and If-None-Match asks that none does (or names it)",
            ));
        }
        let note = Note { text: ev.text };
        self.note = Some(note.clone());
        Ok(note.with_auto_etag())
    }

    fn upload_form(&mut self, _: UploadForm, _: &mut Context) -> Result<UploadPage, Error> {
        Ok(UploadPage {
            action: Files::ROUTE.map_or("/files", |(_, path)| path).to_owned(),
        })
    }

    fn whoami(&mut self, ev: Whoami, cx: &mut Context) -> Result<WithHeaders<Known>, Error> {
        let visits = ev.visits.and_then(|v| v.parse::<u64>().ok()).unwrap_or(0) + 1;
        let cookie = switchyard_manager::cookie::Cookie::build(("visits", visits.to_string()))
            .path("/")
            .http_only(true)
            .build();
        Ok(Known {
            sub: ev.sub,
            client: ev.client.map(|ip| ip.to_string()),
            request_id: cx.request_id().map(str::to_owned),
            user_agent: ev.user_agent,
            visits,
        }
        .with_cookie(cookie))
    }

    fn hi(&mut self, ev: Hi, _: &mut Context) -> Result<switchyard_manager::Response, Error> {
        // Path parameters arrive decoded: encode the name again.
        let name: String = ev
            .name
            .bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                    (b as char).to_string()
                }
                other => format!("%{other:02X}"),
            })
            .collect();
        switchyard_manager::Response::redirect(
            switchyard_manager::Redirect::Permanent,
            &format!("/hello/{name}"),
        )
    }

    fn me(&mut self, ev: Me, _: &mut Context) -> Result<Subject, Error> {
        Ok(Subject { sub: ev.sub })
    }

    fn ws_echo(&mut self, ev: WsEcho, _: &mut Context) -> Result<Binary, Error> {
        Ok(Binary(ev.0))
    }

    fn panic(&mut self, _: Panic, _: &mut Context) -> Result<Done, Error> {
        panic!("the /panic route panics on purpose")
    }
}

/// `GET /payload/{size}` → exactly `size` bytes.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Payload", http = "GET /payload/{size}")]
pub struct Payload {
    /// At most [`MAX_PAYLOAD`] (16 MiB).
    #[validate(range(max = 16_777_216))]
    pub size: u64,
    /// `?copy=true`: answered from a plain buffer, so that the body is
    /// copied into shared memory for each response, as any body a handler
    /// makes per request is (the default answers from a shared body).
    #[serde(default)]
    pub copy: bool,
}

/// Largest `/payload/{size}`.
pub const MAX_PAYLOAD: u64 = 16 * 1024 * 1024;

/// `GET /sleep/{ms}` → a job that blocks a worker thread for `ms`
/// milliseconds (at most 60 s); the manager keeps serving meanwhile.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Sleep", http = "GET /sleep/{ms}")]
pub struct Sleep {
    #[validate(range(max = 60_000))]
    pub ms: u64,
}

#[derive(Serialize, Deserialize, Reply)]
pub struct Slept {
    pub slept_ms: u64,
}

/// The job behind `/sleep/{ms}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.SleepJob")]
pub struct SleepJob {
    pub ms: u64,
}

fn sleep_job(job: SleepJob) -> Result<Slept, Error> {
    std::thread::sleep(std::time::Duration::from_millis(job.ms));
    Ok(Slept { slept_ms: job.ms })
}

/// The `payload` manager. Keeps one body of the largest size asked for,
/// sealed in shared memory ([`shared_body`]), and answers with prefixes
/// of it: a repeated request costs no allocation and no copy of the body
/// in the manager or the listener.
pub struct Payloads {
    shared: bytes::Bytes,
    plain: bytes::Bytes,
}

impl Manager for Payloads {
    const NAME: &'static str = "payload";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(Payloads {
            shared: bytes::Bytes::new(),
            plain: bytes::Bytes::new(),
        })
    }
    fn register(r: &mut Registry<Self>) {
        r.handle(Self::payload)
            .handle(Self::stream)
            .handle(upload)
            .handle(Self::echo_bytes)
            .handle(Self::sleep)
            .job(sleep_job);
    }
}

/// `GET /stream/{size}` → `size` bytes (any size; the pattern of
/// [`stream_byte`]) produced on a thread and streamed through a pipe;
/// `?chunked=true` does not announce the length (chunked encoding).
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Stream", http = "GET /stream/{size}")]
pub struct Stream {
    /// At most [`MAX_STREAM`] (64 GiB).
    #[validate(range(max = 68_719_476_736.0))]
    pub size: u64,
    #[serde(default)]
    pub chunked: bool,
}

/// Largest `/stream/{size}`: 64 GiB, far past any one segment.
pub const MAX_STREAM: u64 = 64 << 30;

/// Byte `i` of every `/stream/{size}` body: a pattern that catches a lost,
/// repeated or reordered chunk.
pub fn stream_byte(i: u64) -> u8 {
    (i % 251) as u8
}

/// `POST /upload` → `{"length": n, "sha256": "<hex>"}` of the raw body, read
/// as it streams in (any size up to `listener.max_upload_bytes`).
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Upload", http = "POST /upload")]
pub struct Upload {}

fn upload(_: Upload, body: &mut BodyReader) -> Result<Uploaded, Error> {
    use sha2::Digest;
    let mut hasher = sha2::Sha256::new();
    let mut length = 0u64;
    while let Some(chunk) = body.chunk()? {
        hasher.update(&chunk);
        length += chunk.len() as u64;
    }
    let sha256 = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(Uploaded { length, sha256 })
}

#[derive(Serialize, Deserialize, Reply)]
pub struct Uploaded {
    pub length: u64,
    pub sha256: String,
}

/// `POST /echo-bytes` → the raw body back, byte for byte.
#[derive(Deserialize, Serialize)]
pub struct EchoBytes(pub bytes::Bytes);

// Hand-written: any reply (what `#[event]` without `reply` says).
impl<R> switchyard_manager::Returns<R> for EchoBytes {}

impl Event for EchoBytes {
    const NAME: &'static str = "demo.EchoBytes";
    const ROUTE: Option<(&'static str, &'static str)> = Some(("POST", "/echo-bytes"));
    fn from_request(request: &Request<'_>) -> Result<Self, Error> {
        Ok(EchoBytes(bytes::Bytes::copy_from_slice(request.body)))
    }
    // Any bytes, whatever the content type says: described as raw.
    fn schema(
        _: &mut switchyard_manager::schema::SchemaGenerator,
    ) -> switchyard_manager::schema::EventSchema {
        whole_body_schema(
            "`POST /echo-bytes` → the raw body back, byte for byte.",
            serde_json::json!({
                "description": "Any bytes (empty too); answered as they came.",
                "type": "string",
                "contentMediaType": "application/octet-stream",
            }),
        )
    }
}

impl Payloads {
    fn payload(&mut self, ev: Payload, _: &mut Context) -> Result<Binary, Error> {
        if ev.size > MAX_PAYLOAD {
            return Err(Error::bad_request(format!(
                "size must be at most {MAX_PAYLOAD} bytes"
            )));
        }
        let size = ev.size as usize;
        if ev.copy {
            if self.plain.len() < size {
                self.plain = bytes::Bytes::from(vec![b'x'; size]);
            }
            return Ok(Binary(self.plain.slice(..size)));
        }
        if self.shared.len() < size {
            self.shared = shared_body(&vec![b'x'; size])?;
        }
        Ok(Binary(self.shared.slice(..size)))
    }

    fn stream(&mut self, ev: Stream, _: &mut Context) -> Result<Streamed, Error> {
        if ev.size > MAX_STREAM {
            return Err(Error::bad_request(format!(
                "size must be at most {MAX_STREAM} bytes"
            )));
        }
        let length = (!ev.chunked).then_some(ev.size);
        Ok(Streamed::new(length, move |out| {
            use std::io::Write;
            // One period of the pattern, 251 × 261 bytes (~64 KiB), written
            // from the right phase each time.
            let period: Vec<u8> = (0..251 * 262).map(stream_byte).collect();
            let mut at = 0u64;
            while at < ev.size {
                let phase = (at % 251) as usize;
                let n = (ev.size - at).min(251 * 261) as usize;
                out.write_all(&period[phase..phase + n])?;
                at += n as u64;
            }
            Ok(())
        }))
    }

    fn echo_bytes(&mut self, ev: EchoBytes, _: &mut Context) -> Result<Binary, Error> {
        Ok(Binary(ev.0))
    }

    async fn sleep(_: State<Self>, ev: Sleep, cx: Context) -> Result<Slept, Error> {
        // Logged here: job functions have no context.
        tracing::info!("sleeping {} ms", ev.ms);
        cx.spawn_job(&SleepJob { ms: ev.ms }).await
    }
}

/// Largest `ms` of `/cpu/{ms}` and `/cpu-inline/{ms}`.
pub const MAX_CPU_MS: u64 = 60_000;

/// `GET /cpu/{ms}` → burns about `ms` of CPU in a worker process.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Cpu", http = "GET /cpu/{ms}")]
pub struct Cpu {
    #[validate(range(max = 60_000))]
    pub ms: u64,
}

/// `GET /cpu-inline/{ms}` → burns about `ms` of CPU in the manager itself,
/// which serves nothing else meanwhile.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.CpuInline", http = "GET /cpu-inline/{ms}")]
pub struct CpuInline {
    #[validate(range(max = 60_000))]
    pub ms: u64,
}

/// `GET /crash/{mode}` → a job that panics (`panic`: the job fails with 500,
/// the worker lives on) or aborts its worker process (`abort`: the job fails
/// with 502, the supervisor replaces the worker). The manager is unaffected.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Crash", http = "GET /crash/{mode}")]
pub struct Crash {
    #[validate(custom = "crash_mode")]
    pub mode: String,
}

fn crash_mode(mode: &str) -> Result<(), String> {
    match mode {
        "panic" | "abort" => Ok(()),
        _ => Err("must be `panic` or `abort`".into()),
    }
}

/// The job behind `/cpu/{ms}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.Burn")]
pub struct Burn {
    pub ms: u64,
}

/// The job behind `/crash/{mode}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.CrashJob")]
pub struct CrashJob {
    pub mode: String,
}

/// What `/cpu` and `/cpu-inline` answer: the CPU asked for, the wall-clock
/// time it took, and the pid of the process that burned it (a worker's, or
/// the manager's for `/cpu-inline`).
#[derive(Debug, Serialize, Deserialize, Reply)]
pub struct Burned {
    pub ms: u64,
    pub elapsed_ms: f64,
    pub pid: u32,
}

fn thread_cpu() -> std::time::Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(std::time::Duration::from)
        .unwrap_or_default()
}

/// Spins until this thread has used `ms` of CPU time (not wall time: on a
/// busy machine it takes longer, as real CPU work would).
fn burn(ms: u64) -> Burned {
    let start = std::time::Instant::now();
    let target = thread_cpu() + std::time::Duration::from_millis(ms.min(MAX_CPU_MS));
    let mut x = 0u64;
    while thread_cpu() < target {
        for i in 0..1000u64 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(i));
        }
    }
    std::hint::black_box(x);
    Burned {
        ms,
        elapsed_ms: start.elapsed().as_secs_f64() * 1000.0,
        pid: std::process::id(),
    }
}

fn burn_job(job: Burn) -> Result<Burned, Error> {
    Ok(burn(job.ms))
}

fn crash_job(job: CrashJob) -> Result<Done, Error> {
    match job.mode.as_str() {
        "abort" => std::process::abort(),
        _ => panic!("the /crash/panic job panics on purpose"),
    }
}

/// The `compute` manager: CPU work, in its worker pool or inline.
pub struct Compute;

impl Manager for Compute {
    const NAME: &'static str = "compute";
    fn create(_: &Config) -> Result<Self, Error> {
        Ok(Compute)
    }
    fn register(r: &mut Registry<Self>) {
        r.handle(Self::cpu)
            .handle(Self::cpu_inline)
            .handle(Self::crash)
            .job(burn_job)
            .job(crash_job);
    }
}

impl Compute {
    async fn cpu(_: State<Self>, ev: Cpu, cx: Context) -> Result<Burned, Error> {
        cx.spawn_job(&Burn { ms: ev.ms }).await
    }

    fn cpu_inline(&mut self, ev: CpuInline, _: &mut Context) -> Result<Burned, Error> {
        Ok(burn(ev.ms))
    }

    async fn crash(_: State<Self>, ev: Crash, cx: Context) -> Result<Done, Error> {
        cx.spawn_job(&CrashJob { mode: ev.mode }).await
    }
}

switchyard_manager::export_managers!(Basics, Payloads, Compute, Ticker);

/// The manager types of this plugin, as `switchyard.toml` names them.
/// The demo's templates (`hello.html`, `upload.html`, `error.html`), read
/// from the source tree this crate was built in (docs/web.md).
pub const TEMPLATES_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/templates");
/// The demo's `/static/` mount.
pub const STATIC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/static");

pub const MANAGERS: &[&str] = &[Basics::NAME, Payloads::NAME, Compute::NAME, Ticker::NAME];

/// The notification the `ticker` manager emits: `{"n":1,"at_ms":...}`.
#[derive(Deserialize, Serialize, Event)]
#[event(name = "demo.tick")]
pub struct Tick {
    /// 1, 2, 3, ... per ticker instance.
    pub n: u64,
    /// Wall-clock milliseconds since the Unix epoch.
    pub at_ms: u64,
    /// `pad_bytes` of padding (absent by default): makes pushes big, for
    /// slow-consumer tests.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pad: String,
}

/// The `ticker` manager's config: `interval_ms` (default 1000) and
/// `pad_bytes` (default 0).
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TickerConfig {
    pub interval_ms: u64,
    pub pad_bytes: usize,
}

impl Default for TickerConfig {
    fn default() -> Self {
        TickerConfig {
            interval_ms: 1000,
            pad_bytes: 0,
        }
    }
}

/// The `ticker` manager: emits `demo.tick` every `interval_ms`, to show
/// WebSocket pushes (`{"subscribe":"demo.tick"}` on `/ws`).
pub struct Ticker {
    every: std::time::Duration,
    n: u64,
    pad: String,
}

impl Manager for Ticker {
    const NAME: &'static str = "ticker";
    fn create(config: &Config) -> Result<Self, Error> {
        let c: TickerConfig = config.get_or_default()?;
        if c.interval_ms == 0 {
            return Err(Error::bad_request("ticker: interval_ms must be at least 1"));
        }
        Ok(Ticker {
            every: std::time::Duration::from_millis(c.interval_ms),
            n: 0,
            pad: "x".repeat(c.pad_bytes),
        })
    }
    fn register(r: &mut Registry<Self>) {
        // Declared so that `/docs` lists it with its fields.
        r.every(|t| t.every, Self::tick).emits::<Tick>();
    }
}

impl Ticker {
    fn tick(&mut self, cx: &mut Context) -> Result<(), Error> {
        self.n += 1;
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        cx.notify(&Tick {
            n: self.n,
            at_ms,
            pad: self.pad.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_manager::testing::TestManager;

    #[test]
    fn basics_in_process() {
        let mut m = TestManager::<Basics>::new();
        assert_eq!(m.http::<Noop>(&[], "", b"").text(), r#"{"ok":true}"#);
        assert_eq!(
            m.http::<Hello>(&[("name", "Ada")], "", b"").text(),
            r#"{"message":"Hello, Ada!"}"#
        );
        // A query key cannot override a path parameter.
        assert_eq!(
            m.http::<Hello>(&[("name", "Ada")], "name=Eve", b"").text(),
            r#"{"message":"Hello, Ada!"}"#
        );
        let r = m.http::<Hello>(&[("name", "")], "", b"");
        assert_eq!(r.status, 422);
        assert!(r.text().contains(r#""field":"name""#), "{}", r.text());
        assert_eq!(
            m.http::<Echo>(&[], "", br#"{"a":[1,2]}"#).text(),
            r#"{"a":[1,2]}"#
        );
        assert_eq!(m.http::<Echo>(&[], "", b"{nope").status, 400);
        assert_eq!(m.http::<Panic>(&[], "", b"").status, 500);
        let r = m
            .build::<Whoami>()
            .query("sub=forged")
            .cookie("visits", "4")
            .header("user-agent", "curl/8")
            .send();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            r.text(),
            r#"{"sub":null,"client":null,"request_id":null,"user_agent":"curl/8","visits":5}"#
        );
        assert_eq!(r.meta.get("set-cookie"), Some("visits=5; HttpOnly; Path=/"));
        let r = m.build::<Hi>().param("name", "Ada Lovelace").send();
        assert_eq!(
            (r.status, r.meta.get("location")),
            (308, Some("/hello/Ada%20Lovelace"))
        );
        assert_eq!(
            m.http::<Noop>(&[], "", b"").status,
            200,
            "still serving after a panic"
        );
    }

    #[test]
    fn payloads_in_process() {
        let mut m = TestManager::<Payloads>::new();
        let r = m.http::<Payload>(&[("size", "1000")], "", b"");
        assert_eq!((r.status, r.body.len()), (200, 1000));
        assert_eq!(m.http::<Payload>(&[("size", "10")], "", b"").body.len(), 10);
        // 1 MiB crosses in shared memory: the shared body's descriptor, or a
        // copy of the plain buffer (`?copy=true`).
        for query in ["", "copy=true"] {
            let r = m.http::<Payload>(&[("size", "1048576")], query, b"");
            assert_eq!((r.status, r.aborted), (200, false), "{query}");
            assert!(r.body == vec![b'x'; 1 << 20], "{query}");
        }
        let r = m.http::<Payload>(&[("size", "16777217")], "", b"");
        assert_eq!(r.status, 422, "over the documented maximum: {}", r.text());
        assert!(r.text().contains(r#""field":"size""#), "{}", r.text());
        let r = m.http::<Payload>(&[("size", "-1")], "", b"");
        assert_eq!(r.status, 422);
        assert!(r.text().contains(r#""field":"size""#), "{}", r.text());
        assert_eq!(m.http::<Sleep>(&[("ms", "60001")], "", b"").status, 422);
        let r = m.http::<Sleep>(&[("ms", "1")], "", b"");
        assert_eq!(r.text(), r#"{"slept_ms":1}"#);
        assert_eq!(m.jobs_run, 1, "the sleep ran as a job");
        assert_eq!(m.logs[0].1, "sleeping 1 ms");

        // Streams: produced on their thread, read whole by the harness.
        let r = m.http::<Stream>(&[("size", "200000")], "", b"");
        assert_eq!((r.status, r.body.len(), r.aborted), (200, 200_000, false));
        assert!(
            r.body
                .iter()
                .enumerate()
                .all(|(i, b)| *b == stream_byte(i as u64))
        );
        assert_eq!(m.http::<Stream>(&[("size", "0")], "", b"").body.len(), 0);
        // An upload handler gets the whole body when it is not streamed.
        let r = m.http::<Upload>(&[], "application/octet-stream", b"abc");
        assert_eq!(r.status, 200, "{}", r.text());
        let up: Uploaded = r.json();
        assert_eq!(up.length, 3);
        assert_eq!(
            up.sha256,
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn compute_in_process() {
        let mut m = TestManager::<Compute>::new();
        let r = m.http::<Cpu>(&[("ms", "2")], "", b"");
        assert_eq!(r.status, 200, "{}", r.text());
        let burned: serde_json::Value = r.json();
        assert_eq!(burned["ms"], 2);
        assert!(burned["elapsed_ms"].as_f64().unwrap() >= 2.0, "{burned}");
        assert_eq!(burned["pid"], std::process::id());
        assert_eq!(m.http::<CpuInline>(&[("ms", "1")], "", b"").status, 200);
        assert_eq!(m.http::<Cpu>(&[("ms", "60001")], "", b"").status, 422);
        // A panicking job fails alone, with a message saying so.
        let r = m.http::<Crash>(&[("mode", "panic")], "", b"");
        assert_eq!(r.status, 500);
        assert!(r.text().contains("the job panicked"), "{}", r.text());
        assert_eq!(m.http::<Crash>(&[("mode", "nope")], "", b"").status, 422);
        let direct: Burned = m.run_job(&Burn { ms: 1 }).unwrap();
        assert_eq!(direct.ms, 1);
    }

    #[test]
    fn ticker_ticks_on_its_interval_and_ws_echo_echoes() {
        let mut t = TestManager::<Ticker>::with_config(serde_json::json!({"interval_ms": 1000}));
        t.advance(std::time::Duration::from_millis(500));
        assert!(t.notified::<Tick>().is_empty());
        // Due at 1 s and 2 s.
        t.advance(std::time::Duration::from_millis(2500));
        let ticks = t.notified::<Tick>();
        assert_eq!(ticks.iter().map(|t| t.n).collect::<Vec<_>>(), vec![1, 2]);
        assert!(TestManager::<Ticker>::try_with_config(serde_json::json!({"interval_ms": 0})).is_err());

        let mut b = TestManager::<Basics>::new();
        let r = b.http::<WsEcho>(&[], "", b"\x00\xffhi");
        assert_eq!(r.body.as_ref(), b"\x00\xffhi");
    }
}
