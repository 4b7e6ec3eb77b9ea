//! `application/problem+json` (RFC 9457) bodies for errors a hop synthesizes.

use bytes::Bytes;

use crate::Meta;

/// Content type of problem bodies.
pub const PROBLEM_JSON: &str = "application/problem+json";

/// The canonical reason phrase of an HTTP status, for problem titles.
pub fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        409 => "Conflict",
        412 => "Precondition Failed",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        416 => "Range Not Satisfiable",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}

/// The meta (content type) and body of a problem with `status` and `detail`.
pub fn problem(status: u16, detail: &str) -> (Meta, Bytes) {
    problem_with(status, detail, None)
}

/// Like [`problem`], with optional extension members (e.g. `errors`).
pub fn problem_with(status: u16, detail: &str, extra: Option<(&str, serde_json::Value)>) -> (Meta, Bytes) {
    let mut body = serde_json::json!({
        "type": "about:blank",
        "title": reason(status),
        "status": status,
        "detail": detail,
    });
    if let (Some((key, value)), Some(map)) = (extra, body.as_object_mut()) {
        map.insert(key.to_owned(), value);
    }
    let mut meta = Meta::default();
    meta.push("content-type", PROBLEM_JSON);
    // Serializing a Value cannot fail.
    let bytes = serde_json::to_vec(&body).unwrap_or_default();
    (meta, Bytes::from(bytes))
}
