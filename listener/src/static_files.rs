//! `[[static]]` mounts: files served by the listener itself, with no hop.
//!
//! A request under a mount's prefix never reaches the route table. Its
//! path is checked segment by segment before anything touches the disk
//! (no `..`, `.`, dot files, empty segments, backslashes, NUL, or encoded
//! `/` and `\`), then opened beneath the mount's directory with
//! `openat2(RESOLVE_BENEATH)`, so that neither a `..` nor a symlink can
//! leave it, whatever races with the check. Names are used byte for byte:
//! no case folding, no Unicode normalisation. Answers carry `ETag`,
//! `Last-Modified`, `Cache-Control` and `Accept-Ranges`; conditional
//! requests are evaluated in RFC 9110's order (§13.2.2), and a `Range` is
//! honoured only when its `If-Range` (if any) still names this file.
//! Precompressed `.br`/`.gz` siblings are chosen by `Accept-Encoding`.
//! Small files are read in one blocking call; large ones are streamed in
//! chunks, never loaded whole (docs/web.md, decision 0067).

use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Read, Seek};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body_util::{Either, Full};
use switchyard_proto::web::{accepts_encoding, etag_matches};

use crate::body::{Body, RangeAsk, parse_range};
use crate::reply::error;

/// One `[[static]]` mount: URL prefix → directory.
#[derive(Clone, Debug)]
pub struct StaticMount {
    /// The URL prefix, starting and ending with `/` (`/static/`).
    pub prefix: String,
    /// The directory served; nothing outside it ever is.
    pub dir: PathBuf,
    /// The file answered for a directory (`index.html`); none: a directory
    /// is 404.
    pub index: Option<String>,
    /// `Cache-Control` of every answer (none: no header).
    pub cache_control: Option<String>,
    /// Whether a `NAME.br` / `NAME.gz` beside a file is sent instead of it
    /// to clients that accept that coding.
    pub precompressed: bool,
}

impl StaticMount {
    /// Why this mount cannot be served, naming the key (`static[i]`).
    pub fn check(&self, key: &str) -> Result<(), String> {
        if !self.prefix.starts_with('/') || !self.prefix.ends_with('/') {
            return Err(format!(
                "{key}.prefix: `{}` must start and end with `/`",
                self.prefix
            ));
        }
        if self.prefix == "/" {
            return Err(format!(
                "{key}.prefix: `/` would hide every route, /health and /ready; mount under a prefix"
            ));
        }
        if safe_relative(&self.prefix[1..]).is_none() {
            return Err(format!(
                "{key}.prefix: `{}` has an empty, `.`, `..` or encoded segment",
                self.prefix
            ));
        }
        if !self.dir.is_dir() {
            return Err(format!("{key}.dir: `{}` is not a directory", self.dir.display()));
        }
        if let Some(index) = &self.index
            && (index.is_empty() || index.contains('/') || index.starts_with('.'))
        {
            return Err(format!("{key}.index: `{index}` must be a plain file name"));
        }
        if let Some(cc) = &self.cache_control
            && HeaderValue::from_str(cc).is_err()
        {
            return Err(format!("{key}.cache_control: not a valid header value"));
        }
        Ok(())
    }
}

/// The mount whose prefix `path` is under (the longest), and the rest of
/// the path after it. `/static` alone counts as `/static/`.
pub(crate) fn mount_for<'m, 'p>(
    mounts: &'m [StaticMount],
    path: &'p str,
) -> Option<(&'m StaticMount, &'p str)> {
    mounts
        .iter()
        .filter_map(|m| {
            if let Some(rest) = path.strip_prefix(m.prefix.as_str()) {
                Some((m, rest))
            } else if path.len() + 1 == m.prefix.len() && m.prefix.starts_with(path) {
                Some((m, ""))
            } else {
                None
            }
        })
        .max_by_key(|(m, _)| m.prefix.len())
}

/// Files up to this size are read in one call and sent whole; larger ones
/// are streamed in [`CHUNK`]s.
const WHOLE: u64 = 256 * 1024;
const CHUNK: usize = 64 * 1024;

type Answer = Response<Either<Body, tonic::body::Body>>;

/// Serves `rest` (the raw request path after the mount's prefix).
pub(crate) async fn serve(mount: &StaticMount, rest: &str, method: &Method, headers: &HeaderMap) -> Answer {
    let head = match *method {
        Method::GET => false,
        Method::HEAD => true,
        Method::OPTIONS => {
            let mut reply = Response::new(Full::new(Bytes::new()));
            *reply.status_mut() = StatusCode::NO_CONTENT;
            reply
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, OPTIONS"));
            return reply.map(|b| Either::Left(Either::Left(b)));
        }
        _ => {
            let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, "static files are read-only");
            reply
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, OPTIONS"));
            return reply.map(Either::Left);
        }
    };
    let Some(relative) = safe_relative(rest) else {
        return not_found();
    };
    let ask = Ask::of(headers, mount.precompressed);
    let dir = mount.dir.clone();
    let index = mount.index.clone();
    // One trip through the blocking pool: the open, and for a small file
    // that will be sent, its bytes.
    let opened = tokio::task::spawn_blocking(move || {
        let mut entity = open(&dir, &relative, index.as_deref(), &ask)?;
        if !head && entity.len <= WHOLE && ask.verdict(&entity).is_none() {
            let mut buf = BytesMut::zeroed(entity.len as usize);
            entity.file.read_exact(&mut buf)?;
            entity.whole = Some(buf.freeze());
        }
        Ok::<_, io::Error>((entity, ask))
    })
    .await;
    let (entity, ask) = match opened {
        Ok(Ok(found)) => found,
        Ok(Err(err)) => {
            if err.kind() != io::ErrorKind::NotFound {
                tracing::debug!(%err, path = rest, "static file refused");
            }
            return not_found();
        }
        Err(err) => {
            tracing::error!(%err, "static file task failed");
            return error(StatusCode::INTERNAL_SERVER_ERROR, "internal error").map(Either::Left);
        }
    };
    respond(mount, entity, &ask, head).await
}

/// The request headers that decide the answer.
struct Ask {
    if_match: Option<String>,
    if_none_match: Option<String>,
    if_modified_since: Option<SystemTime>,
    if_unmodified_since: Option<SystemTime>,
    range: Option<String>,
    if_range: Option<String>,
    /// Codings to try, in order (`br`, then `gzip`).
    codings: Vec<(&'static str, &'static str)>,
}

impl Ask {
    fn of(headers: &HeaderMap, precompressed: bool) -> Ask {
        let text = |name: header::HeaderName| {
            let mut values = headers.get_all(name).iter().filter_map(|v| v.to_str().ok());
            let first = values.next()?.to_owned();
            Some(values.fold(first, |all, v| all + ", " + v))
        };
        let date = |name| text(name).and_then(|v| httpdate::parse_http_date(&v).ok());
        let range = text(header::RANGE);
        let mut codings = Vec::new();
        // A range is served from the file itself: offsets into a
        // compressed variant would surprise most clients.
        if precompressed
            && range.is_none()
            && let Some(ae) = text(header::ACCEPT_ENCODING)
        {
            for (coding, ext) in [("br", "br"), ("gzip", "gz")] {
                if accepts_encoding(&ae, coding) {
                    codings.push((coding, ext));
                }
            }
        }
        Ask {
            if_match: text(header::IF_MATCH),
            if_none_match: text(header::IF_NONE_MATCH),
            if_modified_since: date(header::IF_MODIFIED_SINCE),
            if_unmodified_since: date(header::IF_UNMODIFIED_SINCE),
            range,
            if_range: text(header::IF_RANGE),
            codings,
        }
    }
}

impl Ask {
    /// The answer the preconditions give without the body (RFC 9110
    /// §13.2.2: `If-Match`, else `If-Unmodified-Since` → 412; then
    /// `If-None-Match`, else `If-Modified-Since` → 304), if any.
    fn verdict(&self, entity: &Entity) -> Option<StatusCode> {
        let modified = secs(entity.modified);
        let failed = match (&self.if_match, self.if_unmodified_since) {
            (Some(tags), _) => !etag_matches(tags, &entity.etag, true),
            (None, Some(date)) => modified > secs(date),
            (None, None) => false,
        };
        if failed {
            return Some(StatusCode::PRECONDITION_FAILED);
        }
        let unchanged = match (&self.if_none_match, self.if_modified_since) {
            (Some(tags), _) => etag_matches(tags, &entity.etag, false),
            (None, Some(date)) => modified <= secs(date),
            (None, None) => false,
        };
        unchanged.then_some(StatusCode::NOT_MODIFIED)
    }
}

/// What is sent: the open file (or its precompressed sibling) and what
/// describes it.
struct Entity {
    file: File,
    /// The whole file, read with its open (a small file that is sent).
    whole: Option<Bytes>,
    len: u64,
    modified: SystemTime,
    etag: String,
    /// The file's name, for its media type (a sibling's is its original's).
    name: PathBuf,
    encoding: Option<&'static str>,
}

/// `rest` as a relative path of plain segments, or `None` when any segment
/// could name something outside the mount or something other than what it
/// reads as: `..`, `.`, an empty segment (`//`, an absolute path), a dot
/// file, a backslash, a NUL, or an encoded `/` or `\` (which would let one
/// segment hold two). A trailing `/` (a directory) is allowed.
fn safe_relative(rest: &str) -> Option<PathBuf> {
    let mut path = PathBuf::new();
    let trimmed = rest.strip_suffix('/').unwrap_or(rest);
    if trimmed.is_empty() {
        return Some(path);
    }
    for raw in trimmed.split('/') {
        if raw.contains('\\') {
            return None;
        }
        let decoded: Vec<u8> = percent_encoding::percent_decode_str(raw).collect();
        if decoded.is_empty()
            || decoded.starts_with(b".")
            || decoded.iter().any(|b| matches!(b, b'/' | b'\\' | b'\0'))
        {
            return None;
        }
        path.push(OsStr::from_bytes(&decoded));
    }
    Some(path)
}

/// Opens `relative` beneath `dir` (its index when it is a directory), or
/// the precompressed sibling `ask` prefers; only regular files.
fn open(dir: &Path, relative: &Path, index: Option<&str>, ask: &Ask) -> io::Result<Entity> {
    let root = File::open(dir)?;
    // The mount's own directory (`/static/`) is `.` beneath itself.
    let mut name = if relative.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        relative.to_path_buf()
    };
    let mut file = open_beneath(&root, dir, &name)?;
    let mut meta = file.metadata()?;
    if meta.is_dir() {
        let Some(index) = index else {
            return Err(io::ErrorKind::NotFound.into());
        };
        name.push(index);
        file = open_beneath(&root, dir, &name)?;
        meta = file.metadata()?;
    }
    if !meta.is_file() {
        return Err(io::ErrorKind::NotFound.into());
    }
    for (coding, ext) in &ask.codings {
        let mut sibling = name.clone().into_os_string();
        sibling.push(".");
        sibling.push(ext);
        let Ok(variant) = open_beneath(&root, dir, Path::new(&sibling)) else {
            continue;
        };
        let Ok(vmeta) = variant.metadata() else { continue };
        if vmeta.is_file() {
            return Ok(entity(variant, &vmeta, name, Some(coding)));
        }
    }
    Ok(entity(file, &meta, name, None))
}

fn entity(file: File, meta: &std::fs::Metadata, name: PathBuf, encoding: Option<&'static str>) -> Entity {
    let modified = meta.modified().unwrap_or(UNIX_EPOCH);
    let nanos = modified.duration_since(UNIX_EPOCH).unwrap_or_default().as_nanos();
    // Length and modification time, like most servers; a coded variant
    // is another representation, so another tag.
    let etag = match encoding {
        Some(coding) => format!("\"{:x}-{nanos:x}-{coding}\"", meta.len()),
        None => format!("\"{:x}-{nanos:x}\"", meta.len()),
    };
    Entity {
        file,
        whole: None,
        len: meta.len(),
        modified,
        etag,
        name,
        encoding,
    }
}

/// Opens `relative` for reading beneath `root` (the directory `dir`): no
/// `..` or symlink resolution may leave it. Kernels without `openat2`
/// (before 5.6, or where a sandbox forbids it) get the same rule by
/// resolving the path and checking its prefix, which a concurrent rename
/// inside the mount could race; the log says so once.
fn open_beneath(root: &File, dir: &Path, relative: &Path) -> io::Result<File> {
    use rustix::fs::{Mode, OFlags, ResolveFlags, openat2};
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK;
    match openat2(
        root,
        relative,
        flags,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS,
    ) {
        Ok(fd) => Ok(File::from(fd)),
        Err(rustix::io::Errno::NOSYS | rustix::io::Errno::PERM) => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                tracing::warn!("openat2 is unavailable; static files are confined by resolving their paths")
            });
            let base = dir.canonicalize()?;
            let full = base.join(relative).canonicalize()?;
            if !full.starts_with(&base) {
                return Err(io::Error::new(io::ErrorKind::NotFound, "outside the mount"));
            }
            File::open(full)
        }
        // EXDEV: the path would leave the mount.
        Err(errno) => Err(io::Error::from(errno)),
    }
}

/// The answer for `entity`, after the conditional headers of `ask`.
async fn respond(mount: &StaticMount, entity: Entity, ask: &Ask, head: bool) -> Answer {
    let mut headers = HeaderMap::new();
    if let Ok(v) = HeaderValue::from_str(&entity.etag) {
        headers.insert(header::ETAG, v);
    }
    if let Ok(v) = HeaderValue::from_str(&httpdate::fmt_http_date(entity.modified)) {
        headers.insert(header::LAST_MODIFIED, v);
    }
    if let Some(cc) = mount
        .cache_control
        .as_deref()
        .and_then(|v| HeaderValue::from_str(v).ok())
    {
        headers.insert(header::CACHE_CONTROL, cc);
    }
    if mount.precompressed {
        headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    // RFC 9110 §13.2.2: the preconditions, then Range with If-Range.
    match ask.verdict(&entity) {
        Some(StatusCode::PRECONDITION_FAILED) => {
            return error(StatusCode::PRECONDITION_FAILED, "the file has changed").map(Either::Left);
        }
        Some(status) => {
            let mut reply = Response::new(Either::Left(Either::Left(Full::new(Bytes::new()))));
            *reply.status_mut() = status;
            *reply.headers_mut() = headers;
            return reply;
        }
        None => {}
    }
    headers.insert(header::CONTENT_TYPE, content_type(&entity.name));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if let Some(coding) = entity.encoding {
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_static(coding));
    }
    let range_applies = match (&ask.range, &ask.if_range) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some(_), Some(validator)) => if_range_holds(validator, &entity),
    };
    let mut status = StatusCode::OK;
    let (mut start, mut len) = (0, entity.len);
    if range_applies && let Some(range) = &ask.range {
        match parse_range(range, entity.len) {
            RangeAsk::Bytes(first, last) => {
                status = StatusCode::PARTIAL_CONTENT;
                (start, len) = (first, last - first + 1);
                let content_range = format!("bytes {first}-{last}/{}", entity.len);
                if let Ok(v) = HeaderValue::from_str(&content_range) {
                    headers.insert(header::CONTENT_RANGE, v);
                }
            }
            RangeAsk::Unsatisfiable => {
                let mut reply = error(
                    StatusCode::RANGE_NOT_SATISFIABLE,
                    "the range lies outside the file",
                );
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{}", entity.len)) {
                    reply.headers_mut().insert(header::CONTENT_RANGE, v);
                }
                return reply.map(Either::Left);
            }
            // Several ranges, or a unit we do not serve: the whole file.
            RangeAsk::Ignore => {}
        }
    }
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    let body = if head {
        Either::Left(Either::Left(Full::new(Bytes::new())))
    } else if let Some(whole) = &entity.whole {
        let slice = whole.slice(start as usize..(start + len) as usize);
        Either::Left(Either::Left(Full::new(slice)))
    } else {
        match body(entity.file, start, len).await {
            Ok(body) => body,
            Err(err) => {
                tracing::error!(%err, "cannot read a static file");
                return error(StatusCode::INTERNAL_SERVER_ERROR, "internal error").map(Either::Left);
            }
        }
    };
    let mut reply = Response::new(body);
    *reply.status_mut() = status;
    *reply.headers_mut() = headers;
    reply
}

/// Whether an `If-Range` still names this representation: an entity tag
/// by the strong comparison, or exactly its `Last-Modified` date (RFC 9110
/// §13.1.5). Anything else sends the whole file.
fn if_range_holds(validator: &str, entity: &Entity) -> bool {
    let validator = validator.trim();
    if validator.starts_with('"') || validator.starts_with("W/") {
        return etag_matches(validator, &entity.etag, true);
    }
    httpdate::parse_http_date(validator).is_ok_and(|date| secs(date) == secs(entity.modified))
}

fn secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO).as_secs()
}

/// The media type by extension; text gets `charset=utf-8`.
fn content_type(name: &Path) -> HeaderValue {
    let mime = mime_guess::from_path(name).first_or_octet_stream();
    let text = mime.type_() == mime_guess::mime::TEXT
        || matches!(mime.subtype().as_str(), "javascript" | "json" | "xml" | "svg+xml");
    let value = if text && mime.get_param("charset").is_none() {
        format!("{mime}; charset=utf-8")
    } else {
        mime.to_string()
    };
    HeaderValue::from_str(&value).unwrap_or(HeaderValue::from_static("application/octet-stream"))
}

/// `len` bytes of `file` from `start`: read whole when small, else
/// streamed in chunks as the client takes them.
async fn body(mut file: File, start: u64, len: u64) -> io::Result<Either<Body, tonic::body::Body>> {
    if len <= WHOLE {
        let bytes = tokio::task::spawn_blocking(move || {
            file.seek(io::SeekFrom::Start(start))?;
            let mut buf = BytesMut::zeroed(len as usize);
            file.read_exact(&mut buf)?;
            Ok::<_, io::Error>(buf.freeze())
        })
        .await
        .map_err(io::Error::other)??;
        return Ok(Either::Left(Either::Left(Full::new(bytes))));
    }
    file.seek(io::SeekFrom::Start(start))?;
    let file = tokio::fs::File::from_std(file);
    let stream = futures_util::stream::unfold((file, len), |(mut file, left)| async move {
        use tokio::io::AsyncReadExt;
        if left == 0 {
            return None;
        }
        let mut buf = BytesMut::zeroed(CHUNK.min(left as usize));
        match file.read_exact(&mut buf).await {
            Ok(_) => {
                let chunk = buf.freeze();
                let left = left - chunk.len() as u64;
                Some((Ok(http_body::Frame::data(chunk)), (file, left)))
            }
            // A file cut short under us ends the response with an error
            // (the client sees a broken body, never a silently short one).
            Err(err) => Some((Err(err), (file, 0))),
        }
    });
    Ok(Either::Right(tonic::body::Body::new(
        http_body_util::StreamBody::new(stream),
    )))
}

fn not_found() -> Answer {
    error(StatusCode::NOT_FOUND, "no such file").map(Either::Left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_could_leave_the_mount_are_refused() {
        let ok = |p: &str| safe_relative(p).unwrap_or_else(|| panic!("{p} refused"));
        assert_eq!(ok("demo.css"), PathBuf::from("demo.css"));
        assert_eq!(ok("a/b%20c.txt"), PathBuf::from("a/b c.txt"));
        assert_eq!(ok("dir/"), PathBuf::from("dir"));
        assert_eq!(ok(""), PathBuf::new());
        // Case is kept: `Demo.CSS` is another file.
        assert_eq!(ok("Demo.CSS"), PathBuf::from("Demo.CSS"));
        for bad in [
            "..",
            "../Cargo.toml",
            "a/../../x",
            "%2e%2e/Cargo.toml",
            "%2E%2E/x",
            ".%2e/x",
            "a%2f..%2fb",
            "..%2fCargo.toml",
            "..%5cCargo.toml",
            "a\\..\\b",
            "/etc/passwd",
            "a//b",
            "./a",
            ".env",
            "a/.git/config",
            "a%00.css",
            "%2fetc%2fpasswd",
        ] {
            assert!(safe_relative(bad).is_none(), "{bad} accepted");
        }
    }

    #[test]
    fn longest_prefix_wins() {
        let mount = |prefix: &str| StaticMount {
            prefix: prefix.into(),
            dir: PathBuf::from("/nonexistent"),
            index: None,
            cache_control: None,
            precompressed: false,
        };
        let mounts = [mount("/static/"), mount("/static/img/")];
        let (m, rest) = mount_for(&mounts, "/static/img/a.png").unwrap();
        assert_eq!((m.prefix.as_str(), rest), ("/static/img/", "a.png"));
        let (m, rest) = mount_for(&mounts, "/static").unwrap();
        assert_eq!((m.prefix.as_str(), rest), ("/static/", ""));
        assert!(mount_for(&mounts, "/staticx").is_none());
    }
}
