//! Streamed bodies for plugin authors: a response produced over time
//! ([`Streamed`], written through a [`BodyWriter`]) and a request body read
//! as it arrives ([`BodyReader`], given to [`Registry::upload`] handlers).
//!
//! Both run on a thread of their own, so a 1 GiB download or upload never
//! holds up the manager's other requests, and both go through a shared-memory
//! pipe ([`switchyard_proto::pipe`]): the bytes are copied once into the
//! ring and once out, whatever their size, with the listener's memory flat.
//!
//! [`Registry::upload`]: crate::Registry::upload

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use switchyard_proto::pipe::{self, PipeEnd};
use switchyard_proto::{Meta, StreamHandle};

use crate::reply::{Error, Format, Reply, Response};

/// Streams (producers and upload readers) one manager process runs at once;
/// past it a new one is refused with 503 rather than spawning without bound.
pub const MAX_STREAMS: usize = 256;

/// A streamed response whose reader (the client, through the listener)
/// takes nothing for this long is abandoned: its producer's write fails,
/// so a client that stops reading cannot hold a stream slot forever.
pub const STREAM_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

static STREAMS: AtomicUsize = AtomicUsize::new(0);

/// One of the [`MAX_STREAMS`] a stream thread holds: counted from
/// [`spawn_stream_thread`] until dropped.
pub(crate) struct StreamSlot;

impl StreamSlot {
    fn take() -> Result<StreamSlot, Error> {
        let mut current = STREAMS.load(Ordering::Relaxed);
        loop {
            if current >= MAX_STREAMS {
                return Err(Error::unavailable("too many streams in flight; retry later"));
            }
            match STREAMS.compare_exchange_weak(current, current + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Ok(StreamSlot),
                Err(now) => current = now,
            }
        }
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        STREAMS.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs `work` on a thread of its own, counted against [`MAX_STREAMS`]
/// until `work` drops the slot it is given (at the latest, when it
/// returns). `work` drops it before the step that lets the client go on
/// (publishing the answer, finishing the body): a client that sends its
/// next request at once must not find its finished stream still counted
/// because the thread that ran it has not been given the CPU to exit (200
/// upload clients were refused with 503 that way, well under the limit).
pub(crate) fn spawn_stream_thread(work: impl FnOnce(StreamSlot) + Send + 'static) -> Result<(), Error> {
    let slot = StreamSlot::take()?;
    std::thread::Builder::new()
        .name("switchyard-stream".into())
        .spawn(move || {
            let _io = crate::reactor::enter();
            work(slot);
        })
        .map(drop)
        .map_err(|e| Error::unavailable(format!("cannot start a stream thread: {e}")))
}

type Producer = Box<dyn FnOnce(&mut BodyWriter) -> Result<(), Error> + Send>;

/// A response whose body is produced over time, on its own thread, and
/// streamed to the client with bounded memory however long it is.
///
/// With a known `length` the client gets `Content-Length` (and `Range`
/// works); without, chunked encoding. A producer that returns an error, panics
/// or writes a different number of bytes than announced ends the stream
/// with an error the client can see (a cut connection), never a silently
/// short body. A client that goes away makes the next write fail.
///
/// ```
/// use std::io::Write;
/// use switchyard_manager::{Error, Streamed};
///
/// fn countdown() -> Result<Streamed, Error> {
///     Ok(Streamed::new(None, |out| {
///         for n in (1..=3).rev() {
///             writeln!(out, "{n}")?;
///         }
///         Ok(())
///     })
///     .content_type("text/plain"))
/// }
/// ```
pub struct Streamed {
    length: Option<u64>,
    status: u16,
    meta: Meta,
    producer: Producer,
}

impl Streamed {
    /// A 200 stream of `length` bytes (if known) written by `producer`.
    pub fn new(
        length: Option<u64>,
        producer: impl FnOnce(&mut BodyWriter) -> Result<(), Error> + Send + 'static,
    ) -> Streamed {
        Streamed {
            length,
            status: 200,
            meta: Meta::default(),
            producer: Box::new(producer),
        }
    }

    /// Sets the content type (default `application/octet-stream`).
    pub fn content_type(self, content_type: &str) -> Streamed {
        self.header("content-type", content_type)
    }

    /// Adds a response header.
    pub fn header(mut self, name: &str, value: &str) -> Streamed {
        self.meta.push(name, value);
        self
    }

    /// Sets the status (default 200).
    pub fn status(mut self, status: u16) -> Streamed {
        self.status = status;
        self
    }
}

impl Reply for Streamed {
    fn into_response(self, _: Format) -> Result<Response, Error> {
        let (end, handle) = pipe::pipe(pipe::DEFAULT_CAPACITY, self.length)
            .map_err(|e| Error::unavailable(format!("no shared memory for a stream: {e}")))?;
        let mut writer = BodyWriter {
            end,
            remaining: self.length,
        };
        let producer = self.producer;
        spawn_stream_thread(move |slot| {
            let produced = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| producer(&mut writer)));
            drop(slot);
            if matches!(produced, Ok(Ok(()))) && matches!(writer.remaining, None | Some(0)) {
                writer.end.finish();
            }
            // Anything else: dropping the end aborts the stream.
        })?;
        let mut meta = self.meta;
        if meta.get("content-type").is_none() {
            meta.push("content-type", "application/octet-stream");
        }
        Ok(Response {
            status: self.status,
            meta,
            body: Bytes::new(),
            stream: Some(handle),
        })
    }
}

/// Where a [`Streamed`] producer writes. Writes block while the pipe is
/// full (the client reads slower than we write): that is the backpressure.
pub struct BodyWriter {
    end: PipeEnd,
    remaining: Option<u64>,
}

impl BodyWriter {
    /// Bytes still owed when the length was announced.
    pub fn remaining(&self) -> Option<u64> {
        self.remaining
    }
}

impl io::Write for BodyWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_all(buf).map(|()| buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> io::Result<()> {
        if let Some(remaining) = &mut self.remaining {
            if buf.len() as u64 > *remaining {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "write past the stream's announced length",
                ));
            }
            *remaining -= buf.len() as u64;
        }
        self.end
            .write_all_within(buf, Some(STREAM_IDLE_TIMEOUT))
            .map_err(stream_error)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn stream_error(err: switchyard_proto::Error) -> io::Error {
    match err {
        switchyard_proto::Error::PipeAborted(why) => io::Error::new(io::ErrorKind::BrokenPipe, why),
        switchyard_proto::Error::Io(e) => e,
        other => io::Error::other(other),
    }
}

impl From<io::Error> for Error {
    fn from(err: io::Error) -> Error {
        match err.kind() {
            io::ErrorKind::BrokenPipe => Error::new(499, format!("the stream's other end went away: {err}")),
            _ => Error::internal(format!("stream I/O failed: {err}")),
        }
    }
}

/// A request body read as it arrives, by an upload handler
/// ([`Registry::upload`](crate::Registry::upload)). Over HTTP it comes
/// through a pipe; over WebSocket, gRPC or a manager call it is the whole
/// body at once, behind the same interface.
pub struct BodyReader {
    /// Received and not yet handed out.
    pending: Bytes,
    /// More to come from here; `None` once the stream ended.
    pipe: Option<PipeEnd>,
    length: Option<u64>,
    read: u64,
}

impl BodyReader {
    pub(crate) fn whole(body: Bytes) -> BodyReader {
        BodyReader {
            length: Some(body.len() as u64),
            pending: body,
            pipe: None,
            read: 0,
        }
    }

    pub(crate) fn pipe(handle: StreamHandle) -> Result<BodyReader, Error> {
        let length = handle.length();
        let end = handle
            .open()
            .map_err(|e| Error::bad_request(format!("unusable request body stream: {e}")))?;
        Ok(BodyReader {
            pending: Bytes::new(),
            pipe: Some(end),
            length,
            read: 0,
        })
    }

    /// The body's length, when the client announced it (`Content-Length`).
    pub fn length(&self) -> Option<u64> {
        self.length
    }

    /// Bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// Refills `pending` from the pipe; false at the end of the body.
    fn fill(&mut self) -> Result<bool, Error> {
        while self.pending.is_empty() {
            let Some(end) = &mut self.pipe else {
                return Ok(false);
            };
            let chunk = end
                .read_blocking(pipe::DEFAULT_CAPACITY)
                .map_err(|e| Error::bad_request(format!("the request body broke off: {e}")))?;
            if chunk.is_empty() {
                self.pipe = None;
            }
            self.pending = chunk;
        }
        Ok(true)
    }

    /// The next piece of the body, `None` at its end. An error means the
    /// client went away or broke off mid-body.
    pub fn chunk(&mut self) -> Result<Option<Bytes>, Error> {
        if !self.fill()? {
            return Ok(None);
        }
        let chunk = std::mem::take(&mut self.pending);
        self.read += chunk.len() as u64;
        Ok(Some(chunk))
    }
}

impl io::Read for BodyReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty()
            || !self
                .fill()
                .map_err(|e| io::Error::new(io::ErrorKind::UnexpectedEof, e.message))?
        {
            return Ok(0);
        }
        let n = buf.len().min(self.pending.len());
        buf[..n].copy_from_slice(&self.pending.split_to(n));
        self.read += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A streamed body's slot is free by the time its reader sees the end:
    /// a client that starts its next download at once is not refused for
    /// the one it has finished, however long the finished thread waits
    /// for a CPU to exit on.
    #[test]
    fn a_finished_streams_slot_is_free_when_its_reader_sees_the_end() {
        for round in 0..50 {
            let before = STREAMS.load(Ordering::Acquire);
            let response = Streamed::new(Some(3), |w: &mut BodyWriter| {
                w.write_all(b"abc")?;
                Ok(())
            })
            .into_response(Format::Json)
            .unwrap();
            let mut end = response.stream.expect("a stream").open().unwrap();
            let mut got = Vec::new();
            loop {
                let chunk = end.read_blocking(64).unwrap();
                if chunk.is_empty() {
                    break;
                }
                got.extend_from_slice(&chunk);
            }
            assert_eq!(got, b"abc");
            assert_eq!(
                STREAMS.load(Ordering::Acquire),
                before,
                "round {round}: the finished stream is still counted"
            );
        }
    }
}
