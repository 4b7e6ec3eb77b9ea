//! Errors in the representation the client reads: an answer that is a
//! problem+json error (the listener's own, or a manager's) goes to a
//! browser (an `Accept` that prefers `text/html`) as a plain HTML page
//! with the same status, title and detail; API clients keep the
//! problem+json. A page never carries more than the problem did (no
//! trace, no internals). Which representation a *reply* gets is the
//! manager's choice, by the `Accept` the listener forwards (decision
//! 0065): only it knows what the event offers.

use bytes::Bytes;
use http::{HeaderValue, header};
use http_body_util::{BodyExt, Either, Full};
use switchyard_proto::problem::PROBLEM_JSON;
use switchyard_proto::web::negotiate;

use crate::body::Body;

type Answer = http::Response<Either<Body, tonic::body::Body>>;

/// Whether `accept` prefers HTML to problem+json and JSON.
pub(crate) fn prefers_html(accept: Option<&str>) -> bool {
    negotiate(accept, &[PROBLEM_JSON, "application/json", "text/html"]) == Some(2)
}

/// `answer` as an HTML page when it is a problem+json error and the
/// client prefers HTML.
pub(crate) async fn error_page(accept: Option<&str>, answer: Answer) -> Answer {
    let is_problem = answer
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|ct| ct.as_bytes().starts_with(PROBLEM_JSON.as_bytes()));
    if !is_problem || !prefers_html(accept) {
        return answer;
    }
    let (mut parts, body) = answer.into_parts();
    let Either::Left(Either::Left(whole)) = body else {
        return http::Response::from_parts(parts, body);
    };
    let Ok(collected) = whole.collect().await;
    let problem: serde_json::Value = serde_json::from_slice(&collected.to_bytes()).unwrap_or_default();
    let page = switchyard_proto::web::problem_page(parts.status.as_u16(), &problem);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    parts.headers.remove(header::CONTENT_LENGTH);
    parts
        .headers
        .append(header::VARY, HeaderValue::from_static("accept"));
    http::Response::from_parts(parts, Either::Left(Either::Left(Full::new(Bytes::from(page)))))
}
