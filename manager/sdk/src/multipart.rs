//! `multipart/form-data` bodies, parsed (by `multer`) as they stream in
//! through the upload pipe: a form's text fields fill the event's fields,
//! its files reach the handler as [`Part`]s it reads like any stream.
//! Nothing is buffered whole and nothing is written to disk by the SDK, so
//! there is no temporary file to leak: a part the handler does not read is
//! skipped, and a body cut off (client gone, limit passed, handler error)
//! ends with the pipe, whose shared memory vanishes with its descriptors
//! (decision 0068).

use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::reply::Error;
use crate::stream::BodyReader;

/// The limits a multipart body is parsed under; each one passed is 413.
/// The whole body's limit is the listener's (`listener.max_upload_bytes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MultipartLimits {
    /// Largest part (a file), in bytes. Default 64 MiB.
    pub max_part_bytes: u64,
    /// Largest text field (a part without a file name), in bytes: these
    /// are held in memory to fill the event. Default 64 KiB.
    pub max_field_bytes: u64,
    /// Most parts in one body. Default 128.
    pub max_parts: usize,
    /// Largest preamble (what comes before the first boundary) and largest
    /// header block of one part, in bytes. Default 16 KiB. Without it, a
    /// body whose headers never end would be buffered, and rescanned per
    /// chunk, up to the whole upload limit.
    pub max_header_bytes: usize,
}

impl Default for MultipartLimits {
    fn default() -> Self {
        MultipartLimits {
            max_part_bytes: 64 << 20,
            max_field_bytes: 64 << 10,
            max_parts: 128,
            max_header_bytes: 16 << 10,
        }
    }
}

/// A multipart body being read: the parts after the text fields that
/// filled the event, in order ([`Multipart::next_part`]).
pub struct Multipart {
    inner: multer::Multipart<'static>,
    /// The part that ended the event's fields (the first file).
    held: Option<multer::Field<'static>>,
    limits: MultipartLimits,
    parts: usize,
}

impl Multipart {
    /// Starts reading `body`, whose `content_type` names the boundary.
    pub(crate) fn new(
        body: BodyReader,
        content_type: Option<&str>,
        limits: MultipartLimits,
    ) -> Result<Multipart, Error> {
        let boundary = content_type
            .and_then(|ct| multer::parse_boundary(ct).ok())
            .ok_or_else(|| Error::new(415, "expected a multipart/form-data body with a boundary"))?;
        let mut body = body;
        let mut framing = Framing::new(&boundary, limits.max_header_bytes);
        // Each poll reads the pipe (blocking): this runs on the upload's
        // own thread, never on the manager's.
        let chunks = futures_util::stream::iter(std::iter::from_fn(move || {
            let chunk = match body.chunk() {
                Ok(chunk) => chunk?,
                Err(err) => return Some(Err(BoxError::from(err))),
            };
            Some(match framing.feed(&chunk) {
                Ok(()) => Ok(chunk),
                Err(too_long) => Err(BoxError::from(too_long)),
            })
        }));
        let constraints =
            multer::Constraints::new().size_limit(multer::SizeLimit::new().per_field(limits.max_part_bytes));
        Ok(Multipart {
            inner: multer::Multipart::with_constraints(chunks, boundary, constraints),
            held: None,
            limits,
            parts: 0,
        })
    }

    /// Reads the text fields up to the first file part (which is kept for
    /// [`next_part`](Self::next_part)): the fields that fill the event. A
    /// name given twice becomes an array.
    pub(crate) fn leading_fields(&mut self) -> Result<Map<String, Value>, Error> {
        let mut fields = Map::new();
        while let Some(field) = self.next_field()? {
            if field.file_name().is_some() {
                self.held = Some(field);
                break;
            }
            let name = field.name().unwrap_or_default().to_owned();
            let text = self.field_text(field)?;
            match fields.get_mut(&name) {
                None => {
                    fields.insert(name, Value::String(text));
                }
                Some(Value::Array(values)) => values.push(text.into()),
                Some(first) => *first = Value::Array(vec![first.take(), text.into()]),
            }
        }
        Ok(fields)
    }

    fn next_field(&mut self) -> Result<Option<multer::Field<'static>>, Error> {
        let field = block_on(self.inner.next_field()).map_err(refused)?;
        if field.is_some() {
            self.parts += 1;
            if self.parts > self.limits.max_parts {
                return Err(Error::new(
                    413,
                    format!("more than {} parts in the form", self.limits.max_parts),
                ));
            }
        }
        Ok(field)
    }

    fn field_text(&self, mut field: multer::Field<'static>) -> Result<String, Error> {
        let name = field.name().unwrap_or_default().to_owned();
        let mut text = Vec::new();
        while let Some(chunk) = block_on(field.chunk()).map_err(refused)? {
            if (text.len() + chunk.len()) as u64 > self.limits.max_field_bytes {
                return Err(Error::new(
                    413,
                    format!(
                        "form field `{name}` is larger than {} bytes",
                        self.limits.max_field_bytes
                    ),
                ));
            }
            text.extend_from_slice(&chunk);
        }
        String::from_utf8(text).map_err(|_| Error::bad_request(format!("form field `{name}` is not UTF-8")))
    }

    /// The next part (a file, or a text field that came after the first
    /// file), `None` at the end of the body. The part before it, if not
    /// read to its end, is skipped.
    pub fn next_part(&mut self) -> Result<Option<Part<'_>>, Error> {
        let field = match self.held.take() {
            Some(field) => field,
            None => match self.next_field()? {
                Some(field) => field,
                None => return Ok(None),
            },
        };
        Ok(Some(Part {
            name: field.name().map(str::to_owned),
            filename: field.file_name().map(str::to_owned),
            content_type: field.content_type().map(ToString::to_string),
            field,
            pending: Bytes::new(),
            read: 0,
            _multipart: PhantomData,
        }))
    }
}

/// One part of a multipart body: its field name, file name and content
/// type as the client sent them (untrusted: never use a file name as a
/// path), and its bytes as a stream (`chunk`, or `std::io::Read`).
pub struct Part<'m> {
    field: multer::Field<'static>,
    name: Option<String>,
    filename: Option<String>,
    content_type: Option<String>,
    pending: Bytes,
    read: u64,
    /// A part is read before the next is asked for.
    _multipart: PhantomData<&'m mut Multipart>,
}

impl Part<'_> {
    /// The form field's name.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The file's name, as the client gave it (`None`: a text field).
    pub fn filename(&self) -> Option<&str> {
        self.filename.as_deref()
    }

    /// The part's `Content-Type`, as the client gave it.
    pub fn content_type(&self) -> Option<&str> {
        self.content_type.as_deref()
    }

    /// Bytes of this part read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// The next piece of the part, `None` at its end. 413 past
    /// [`MultipartLimits::max_part_bytes`]; 400 for a malformed or cut body.
    pub fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        if !self.pending.is_empty() {
            return Ok(Some(std::mem::take(&mut self.pending)));
        }
        let chunk = block_on(self.field.chunk()).map_err(refused)?;
        if let Some(chunk) = &chunk {
            self.read += chunk.len() as u64;
        }
        Ok(chunk)
    }
}

impl io::Read for Part<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pending.is_empty() {
            match self.chunk() {
                Ok(Some(chunk)) => self.pending = chunk,
                Ok(None) => return Ok(0),
                Err(err) => return Err(io::Error::new(io::ErrorKind::InvalidData, err.message)),
            }
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending.split_to(n));
        Ok(n)
    }
}

/// A parse failure as the client's error: 413 for a limit, 400 otherwise.
fn refused(err: multer::Error) -> Error {
    match err {
        multer::Error::FieldSizeExceeded { limit, field_name } => Error::new(
            413,
            format!(
                "part `{}` is larger than {limit} bytes",
                field_name.unwrap_or_default()
            ),
        ),
        multer::Error::StreamSizeExceeded { limit } => {
            Error::new(413, format!("the form is larger than {limit} bytes"))
        }
        multer::Error::StreamReadFailed(cause) => match cause.downcast_ref::<TooLong>() {
            Some(too_long) => Error::new(413, too_long.to_string()),
            None => Error::bad_request(format!("the request body broke off: {cause}")),
        },
        other => Error::bad_request(format!("malformed multipart body: {other}")),
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A preamble or a part's header block past [`MultipartLimits::max_header_bytes`].
#[derive(Debug, thiserror::Error)]
#[error("the multipart {what} is longer than {max} bytes")]
struct TooLong {
    what: &'static str,
    max: usize,
}

/// Where the guard is in the body's framing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Before the first boundary.
    Preamble,
    /// After a boundary, up to the blank line that ends the part's headers.
    Headers,
    /// A part's content, up to the next boundary.
    Content,
    /// After the closing boundary: nothing more is parsed.
    Epilogue,
}

/// Follows the body's boundaries as the chunks go to multer, which buffers
/// a preamble and a part's headers until they end, however long: this
/// refuses either past its bound before multer sees the chunk. One
/// substring search per chunk, over bytes multer searches anyway.
struct Framing {
    /// `\r\n--BOUNDARY`: a delimiter line, as it follows content.
    delimiter: Vec<u8>,
    stage: Stage,
    /// Bytes of the current preamble or header block seen so far.
    run: usize,
    /// The end of the previous chunk, where a delimiter split between two
    /// chunks begins (not yet counted in `run`).
    tail: Vec<u8>,
    max: usize,
}

impl Framing {
    fn new(boundary: &str, max: usize) -> Framing {
        let mut delimiter = b"\r\n--".to_vec();
        delimiter.extend_from_slice(boundary.as_bytes());
        Framing {
            delimiter,
            stage: Stage::Preamble,
            run: 0,
            // A body may open with its first boundary, with no line break
            // before it: as if one came first.
            tail: b"\r\n".to_vec(),
            max,
        }
    }

    fn feed(&mut self, chunk: &[u8]) -> Result<(), TooLong> {
        let mut buf = std::mem::take(&mut self.tail);
        buf.extend_from_slice(chunk);
        let delimiter = std::mem::take(&mut self.delimiter);
        let fed = self.scan(&buf, &delimiter);
        self.delimiter = delimiter;
        fed
    }

    fn scan(&mut self, buf: &[u8], delimiter: &[u8]) -> Result<(), TooLong> {
        let mut at = 0;
        loop {
            let rest = &buf[at..];
            let (needle, keep): (&[u8], usize) = match self.stage {
                Stage::Epilogue => return Ok(()),
                Stage::Preamble | Stage::Content => (delimiter, delimiter.len() - 1),
                Stage::Headers if self.run == 0 && rest.len() < 2 => {
                    self.tail = rest.to_vec();
                    return Ok(());
                }
                Stage::Headers if self.run == 0 && rest.starts_with(b"--") => {
                    self.stage = Stage::Epilogue;
                    return Ok(());
                }
                Stage::Headers => (b"\r\n\r\n", 3),
            };
            match memchr::memmem::find(rest, needle) {
                Some(i) => {
                    self.count(i)?;
                    at += i + needle.len();
                    self.run = 0;
                    self.stage = match self.stage {
                        Stage::Headers => Stage::Content,
                        _ => Stage::Headers,
                    };
                }
                None => {
                    let kept = keep.min(rest.len());
                    self.count(rest.len() - kept)?;
                    self.tail = rest[rest.len() - kept..].to_vec();
                    return Ok(());
                }
            }
        }
    }

    /// Counts `n` more bytes of the stage, refusing past the bound where
    /// the stage is bounded.
    fn count(&mut self, n: usize) -> Result<(), TooLong> {
        let (what, limit) = match self.stage {
            // The line break assumed before the first boundary is ours,
            // not the client's.
            Stage::Preamble => ("preamble", self.max + 2),
            Stage::Headers => ("part's header block", self.max),
            Stage::Content | Stage::Epilogue => return Ok(()),
        };
        self.run += n;
        if self.run > limit {
            return Err(TooLong { what, max: self.max });
        }
        Ok(())
    }
}

/// Runs `future` on this thread. The body stream never returns `Pending`
/// (its reads block), so this is a loop of polls, not a scheduler.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fed(framing: &mut Framing, body: &[u8], chunk: usize) -> Result<(), TooLong> {
        body.chunks(chunk).try_for_each(|c| framing.feed(c))
    }

    /// A well-formed body passes in any chunking, however large its parts'
    /// content; what comes after the closing boundary is not parsed.
    #[test]
    fn well_formed_bodies_pass_in_any_chunking() {
        let mut body = b"preamble\r\n--XyZ\r\ncontent-disposition: form-data; name=\"a\"\r\n\r\n".to_vec();
        body.extend(std::iter::repeat_n(b'x', 100_000));
        body.extend_from_slice(b"\r\n--XyZ\r\n\r\nno headers\r\n--XyZ--\r\n");
        body.extend(std::iter::repeat_n(b'e', 100_000));
        for chunk in [1, 2, 3, 7, 64, 4096, body.len()] {
            let mut framing = Framing::new("XyZ", 64);
            assert!(fed(&mut framing, &body, chunk).is_ok(), "chunks of {chunk}");
            assert_eq!(framing.stage, Stage::Epilogue, "chunks of {chunk}");
        }
        // A body that opens with its boundary.
        let mut framing = Framing::new("XyZ", 64);
        framing.feed(b"--XyZ\r\n\r\nv\r\n--XyZ--").unwrap();
        assert_eq!(framing.stage, Stage::Epilogue);
    }

    /// A preamble or a header block that never ends is refused at the
    /// bound, whatever the chunking, not buffered to the upload's limit.
    #[test]
    fn endless_preambles_and_headers_are_refused_at_the_bound() {
        let flood = vec![b'a'; 1 << 20];
        for chunk in [1, 1000, 1 << 20] {
            let mut framing = Framing::new("XyZ", 16 << 10);
            let err = fed(&mut framing, &flood, chunk).unwrap_err();
            assert_eq!(err.what, "preamble");
            let mut framing = Framing::new("XyZ", 16 << 10);
            let mut body = b"--XyZ\r\ncontent-type: text/plain\r\nx-pad: ".to_vec();
            body.extend_from_slice(&flood);
            let err = fed(&mut framing, &body, chunk).unwrap_err();
            assert_eq!(err.what, "part's header block");
        }
        // Just within the bound passes.
        let mut framing = Framing::new("XyZ", 16);
        framing.feed(b"0123456789abcdef\r\n--XyZ\r\n").unwrap();
        let mut framing = Framing::new("XyZ", 16);
        assert!(framing.feed(b"0123456789abcdefg\r\n--XyZ\r\n").is_err());
    }
}
