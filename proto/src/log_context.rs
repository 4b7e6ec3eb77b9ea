//! The request a log line belongs to, without a span per request.
//!
//! A `tracing` span made for every request costs its fields formatted
//! into a string when it is made (the fmt layer stores them), a slot in
//! the registry, and an enter and an exit at every poll: 3 % of the
//! listener's samples at 8 clients, whether or not any line is written
//! while it lives. Instead the request's future runs inside
//! [`in_request`], which only points a thread-local at its
//! [`RequestContext`] while it is polled; the event formatter installed
//! by [`crate::process::init_child_logging`] ([`WithRequest`]) reads it
//! and writes `request_id` and `trace_id` on the line, as the other hops
//! write them as fields. Nothing is formatted unless a line is written
//! (decision 0161).

use std::cell::Cell;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::ptr;
use std::task::{Context, Poll};

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

use crate::context::RequestContext;

thread_local! {
    /// The context of the request being polled on this thread, if any.
    static CURRENT: Cell<*const RequestContext> = const { Cell::new(ptr::null()) };
}

/// `future`, with every line it writes naming the request of `context`
/// (an empty context names none).
pub fn in_request<F: Future>(context: &RequestContext, future: F) -> InRequest<'_, F> {
    InRequest { future, context }
}

/// The future of [`in_request`].
pub struct InRequest<'c, F> {
    future: F,
    context: &'c RequestContext,
}

impl<F: Future> Future for InRequest<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        // SAFETY: `future` is structurally pinned (never moved out of
        // `self`, and `InRequest` has no `Drop` and no `Unpin` impl of its
        // own); `context` is only read.
        let this = unsafe { self.get_unchecked_mut() };
        let future = unsafe { Pin::new_unchecked(&mut this.future) };
        let context: *const RequestContext = if this.context.is_empty() {
            ptr::null()
        } else {
            this.context
        };
        // Restored on the way out, unwinding included, so that a line
        // written after this poll never names a request that is not
        // running, and a nested one gives its parent's back.
        struct Restore(*const RequestContext);
        impl Drop for Restore {
            fn drop(&mut self) {
                CURRENT.with(|c| c.set(self.0));
            }
        }
        let _restore = Restore(CURRENT.with(|c| c.replace(context)));
        future.poll(cx)
    }
}

/// Calls `f` with the context of the request being polled on this thread.
pub fn with_current<R>(f: impl FnOnce(Option<&RequestContext>) -> R) -> R {
    let current = CURRENT.with(Cell::get);
    // SAFETY: the pointer is set only for the duration of an
    // `InRequest::poll`, which borrows the context for that long, and is
    // reset when that poll returns or unwinds.
    f(unsafe { current.as_ref() })
}

/// An event formatter that adds the current request's `request_id` and
/// `trace_id` to what `inner` writes: after the fields in the compact
/// text format, as top-level members of a JSON line.
pub struct WithRequest<F> {
    inner: F,
    json: bool,
}

impl<F> WithRequest<F> {
    /// Around a text formatter (one line ending in `\n`).
    pub fn text(inner: F) -> Self {
        WithRequest { inner, json: false }
    }

    /// Around a JSON formatter (one object ending in `}\n`).
    pub fn json(inner: F) -> Self {
        WithRequest { inner, json: true }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithRequest<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        with_current(|request| {
            let Some(request) = request else {
                return self.inner.format_event(ctx, writer, event);
            };
            // Only when a line is written: the inner line, then the
            // request's fields spliced in before its end.
            let mut line = String::new();
            self.inner.format_event(ctx, Writer::new(&mut line), event)?;
            let end = line.trim_end_matches('\n').len();
            let (head, tail) = line.split_at(end);
            if self.json {
                let Some(head) = head.strip_suffix('}') else {
                    return writer.write_str(&line);
                };
                writer.write_str(head)?;
                if let Some(id) = &request.request_id {
                    // A client's id may hold `"` or `\`: serde_json escapes.
                    let id = serde_json::to_string(&id.to_string()).map_err(|_| fmt::Error)?;
                    write!(writer, ",\"request_id\":{id}")?;
                }
                if let Some(trace) = &request.trace {
                    write!(writer, ",\"trace_id\":\"{}\"", trace.trace_id())?;
                }
                writer.write_char('}')?;
            } else {
                writer.write_str(head)?;
                if let Some(id) = &request.request_id {
                    write!(writer, " request_id={id}")?;
                }
                if let Some(trace) = &request.trace {
                    write!(writer, " trace_id={}", trace.trace_id())?;
                }
            }
            writer.write_str(tail)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context::RequestId;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::fmt::MakeWriter;

    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Lines {
        type Writer = Lines;
        fn make_writer(&'a self) -> Lines {
            self.clone()
        }
    }

    fn context(id: &str) -> RequestContext {
        RequestContext {
            request_id: RequestId::given(id.as_bytes()),
            trace: None,
        }
    }

    /// Polls `future` to its end on this thread (it never waits).
    fn run<F: Future>(future: F) -> F::Output {
        let mut future = std::pin::pin!(future);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        loop {
            if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
                return out;
            }
        }
    }

    #[test]
    fn lines_name_the_request_being_polled_and_no_other() {
        let lines = Lines::default();
        let text = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .with_ansi(false)
            .without_time()
            .with_target(false)
            .compact()
            .event_format(WithRequest::text(
                tracing_subscriber::fmt::format()
                    .with_ansi(false)
                    .without_time()
                    .with_target(false)
                    .compact(),
            ))
            .finish();
        tracing::subscriber::with_default(text, || {
            tracing::info!("before");
            run(in_request(&context("outer-1"), async {
                tracing::info!(status = 200, "inside");
                run(in_request(&context("inner-2"), async {
                    tracing::info!("nested")
                }));
                tracing::info!("after nested");
            }));
            tracing::info!("after");
        });
        let out = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let out: Vec<&str> = out.lines().collect();
        assert_eq!(
            out,
            [
                " INFO before",
                " INFO inside status=200 request_id=outer-1",
                " INFO nested request_id=inner-2",
                " INFO after nested request_id=outer-1",
                " INFO after",
            ]
        );
    }

    #[test]
    fn json_lines_carry_the_request_as_members() {
        let lines = Lines::default();
        let json = tracing_subscriber::fmt()
            .with_writer(lines.clone())
            .json()
            .event_format(WithRequest::json(
                tracing_subscriber::fmt::format()
                    .json()
                    .flatten_event(true)
                    .with_target(false),
            ))
            .finish();
        tracing::subscriber::with_default(json, || {
            run(in_request(&context("a\"b\\c"), async {
                tracing::warn!(n = 1, "inside")
            }));
        });
        let out = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let line: serde_json::Value = serde_json::from_str(out.trim_end()).unwrap();
        assert_eq!(line["request_id"], "a\"b\\c");
        assert_eq!(line["message"], "inside");
        assert_eq!(line["n"], 1);
        assert!(out.ends_with("}\n"), "{out:?}");
    }
}
