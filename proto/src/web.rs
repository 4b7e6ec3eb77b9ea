//! HTTP semantics shared by the listener and the manager SDK: choosing a
//! media type by `Accept` (RFC 9110 §12.5.1) and comparing entity tags
//! (§8.8.3), and the plain HTML error page. Pure functions; no I/O.

/// The index in `offered` (most preferred first) of the media type
/// `accept` prefers, or `None` when it accepts none of them (406).
///
/// A range's quality is taken from its most specific match (`text/html`
/// over `text/*` over `*/*`); among offers of equal quality the server's
/// order wins. No `Accept` header (or an empty one) accepts anything: the
/// first offer. A range or parameter that cannot be parsed is skipped,
/// never an error: a client's typo should not cost it an answer.
pub fn negotiate(accept: Option<&str>, offered: &[&str]) -> Option<usize> {
    let ranges = match accept.map(str::trim) {
        None | Some("") => return (!offered.is_empty()).then_some(0),
        Some(text) => parse_accept(text),
    };
    let mut best: Option<(usize, u16)> = None;
    for (i, offer) in offered.iter().enumerate() {
        let q = quality(&ranges, offer);
        if q > 0 && best.is_none_or(|(_, bq)| q > bq) {
            best = Some((i, q));
        }
    }
    best.map(|(i, _)| i)
}

/// One media range of an `Accept` header: type, subtype, quality in
/// thousandths.
struct Range<'a> {
    kind: &'a str,
    sub: &'a str,
    q: u16,
}

fn parse_accept(text: &str) -> Vec<Range<'_>> {
    text.split(',')
        .filter_map(|item| {
            let mut parts = item.split(';');
            let (kind, sub) = parts.next()?.trim().split_once('/')?;
            let (kind, sub) = (kind.trim(), sub.trim());
            if kind.is_empty() || sub.is_empty() || (kind == "*" && sub != "*") {
                return None;
            }
            let mut q = 1000;
            for param in parts {
                if let Some((name, value)) = param.split_once('=')
                    && name.trim().eq_ignore_ascii_case("q")
                {
                    q = parse_q(value.trim())?;
                }
            }
            Some(Range { kind, sub, q })
        })
        .collect()
}

/// A qvalue (`0`, `0.5`, `1.000`) in thousandths.
fn parse_q(text: &str) -> Option<u16> {
    let (whole, frac) = text.split_once('.').unwrap_or((text, ""));
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let thousandths = format!("{frac:0<3}").parse::<u16>().ok()?;
    match whole {
        "0" => Some(thousandths),
        "1" if thousandths == 0 => Some(1000),
        _ => None,
    }
}

/// The quality `ranges` give `offer`: that of the most specific range
/// matching it (0 when none does).
fn quality(ranges: &[Range<'_>], offer: &str) -> u16 {
    let offer = offer.split(';').next().unwrap_or(offer).trim();
    let Some((kind, sub)) = offer.split_once('/') else {
        return 0;
    };
    let mut best: Option<(u8, u16)> = None;
    for r in ranges {
        let specificity = if r.kind.eq_ignore_ascii_case(kind) && r.sub.eq_ignore_ascii_case(sub) {
            3
        } else if r.kind.eq_ignore_ascii_case(kind) && r.sub == "*" {
            2
        } else if r.kind == "*" {
            1
        } else {
            continue;
        };
        if best.is_none_or(|(s, _)| specificity > s) {
            best = Some((specificity, r.q));
        }
    }
    best.map_or(0, |(_, q)| q)
}

/// Whether `header` (an `If-None-Match` or `If-Match` value: `*` or a list
/// of entity tags) matches `etag`. `strong`: the strong comparison
/// (`If-Match`, `If-Range`: a weak tag never matches); otherwise the weak
/// one (`If-None-Match`: `W/"a"` matches `"a"`).
pub fn etag_matches(header: &str, etag: &str, strong: bool) -> bool {
    let header = header.trim();
    if header == "*" {
        return true;
    }
    let (etag_weak, etag_opaque) = split_weak(etag.trim());
    if strong && etag_weak {
        return false;
    }
    header.split(',').any(|tag| {
        let (weak, opaque) = split_weak(tag.trim());
        !(strong && weak) && opaque == etag_opaque && opaque.starts_with('"')
    })
}

fn split_weak(tag: &str) -> (bool, &str) {
    match tag.strip_prefix("W/") {
        Some(rest) => (true, rest),
        None => (false, tag),
    }
}

/// The share of `accept_encoding` a content coding gets: whether `coding`
/// (`gzip`, `br`) is acceptable (named, or `*`, with a quality above 0).
pub fn accepts_encoding(accept_encoding: &str, coding: &str) -> bool {
    let mut star = None;
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';');
        let name = parts.next().unwrap_or("").trim();
        let q = parts
            .find_map(|p| {
                let (k, v) = p.split_once('=')?;
                k.trim().eq_ignore_ascii_case("q").then(|| parse_q(v.trim()))
            })
            .unwrap_or(Some(1000));
        let Some(q) = q else { continue };
        if name.eq_ignore_ascii_case(coding) {
            return q > 0;
        }
        if name == "*" {
            star = Some(q > 0);
        }
    }
    star.unwrap_or(false)
}

/// A plain HTML error page: status, title and detail (already safe to
/// show a client), escaped. Never more than a problem+json would say.
pub fn error_page(status: u16, title: &str, detail: &str) -> String {
    let (title, detail) = (escape_html(title), escape_html(detail));
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{status} {title}</title></head>\n\
         <body><h1>{status} {title}</h1><p>{detail}</p></body></html>\n"
    )
}

/// The page of a problem+json `problem` (its `title`, `detail`, and for a
/// 422 each invalid field of `errors` with why), for a client that asked
/// for HTML and a manager without an `error.html` template. Escaped; says
/// no more than the problem does.
pub fn problem_page(status: u16, problem: &serde_json::Value) -> String {
    let title = problem["title"]
        .as_str()
        .unwrap_or(crate::problem::reason(status));
    let detail = problem["detail"].as_str().unwrap_or("");
    let page = error_page(status, title, detail);
    let fields: Vec<String> = problem["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let field = e["field"].as_str().unwrap_or("");
            let message = escape_html(e["message"].as_str().unwrap_or(""));
            if field.is_empty() {
                format!("<li>{message}</li>")
            } else {
                format!("<li><code>{}</code>: {message}</li>", escape_html(field))
            }
        })
        .collect();
    if fields.is_empty() {
        return page;
    }
    page.replacen(
        "</p></body>",
        &format!("</p>\n<ul>{}</ul></body>", fields.join("")),
        1,
    )
}

/// `text` with `& < > " '` escaped for HTML text and attribute values.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const OFFERS: &[&str] = &["application/json", "text/html", "application/x-bincode"];

    #[test]
    fn a_problem_page_lists_the_invalid_fields_and_why() {
        let problem = serde_json::json!({
            "title": "Unprocessable Content",
            "detail": "2 invalid fields",
            "errors": [
                {"field": "name", "message": "must not be empty"},
                {"field": "age<", "message": "must be at most 150 & more"},
            ],
        });
        let page = problem_page(422, &problem);
        assert!(page.contains("<h1>422 Unprocessable Content</h1>"), "{page}");
        assert!(
            page.contains("<li><code>name</code>: must not be empty</li>"),
            "{page}"
        );
        assert!(
            page.contains("<li><code>age&lt;</code>: must be at most 150 &amp; more</li>"),
            "{page}"
        );
        // No errors: the plain page.
        let plain = serde_json::json!({"title": "Not Found", "detail": "no route"});
        assert_eq!(
            problem_page(404, &plain),
            error_page(404, "Not Found", "no route")
        );
    }

    #[test]
    fn accept_by_quality_and_specificity() {
        assert_eq!(negotiate(None, OFFERS), Some(0));
        assert_eq!(negotiate(Some(""), OFFERS), Some(0));
        assert_eq!(negotiate(Some("*/*"), OFFERS), Some(0));
        assert_eq!(negotiate(Some("text/html"), OFFERS), Some(1));
        // A browser's header: HTML first, everything else at 0.8.
        let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
        assert_eq!(negotiate(Some(browser), OFFERS), Some(1));
        assert_eq!(negotiate(Some("application/x-bincode"), OFFERS), Some(2));
        assert_eq!(negotiate(Some("image/png"), OFFERS), None);
        assert_eq!(negotiate(Some("text/html;q=0"), OFFERS), None);
        // The most specific range decides: text/html refused despite text/*.
        assert_eq!(negotiate(Some("text/*, text/html;q=0"), &["text/html"]), None);
        assert_eq!(
            negotiate(Some("application/json;q=0.5, text/html;q=0.9"), OFFERS),
            Some(1)
        );
        // Equal quality: the server's order.
        assert_eq!(negotiate(Some("text/html, application/json"), OFFERS), Some(0));
        // Junk is skipped, not fatal; a bad q drops that range only.
        assert_eq!(negotiate(Some("garbage, text/html;q=2"), OFFERS), None);
        assert_eq!(negotiate(Some("garbage, TEXT/HTML;Q=0.3"), OFFERS), Some(1));
        assert_eq!(negotiate(Some("*/html"), OFFERS), None);
    }

    #[test]
    fn entity_tags() {
        assert!(etag_matches("\"a\"", "\"a\"", true));
        assert!(etag_matches("\"b\", \"a\"", "\"a\"", true));
        assert!(etag_matches("*", "\"a\"", true));
        assert!(etag_matches("W/\"a\"", "\"a\"", false));
        assert!(!etag_matches("W/\"a\"", "\"a\"", true));
        assert!(!etag_matches("\"a\"", "W/\"a\"", true));
        assert!(!etag_matches("\"ab\"", "\"a\"", false));
        assert!(!etag_matches("a", "a", false));
    }

    #[test]
    fn error_pages_escape() {
        let page = error_page(404, "Not Found", "<script>x</script>");
        assert!(page.contains("&lt;script&gt;") && !page.contains("<script>"));
    }

    #[test]
    fn content_codings() {
        assert!(accepts_encoding("gzip, deflate, br", "br"));
        assert!(accepts_encoding("gzip;q=0.5", "gzip"));
        assert!(!accepts_encoding("gzip;q=0", "gzip"));
        assert!(!accepts_encoding("identity", "gzip"));
        assert!(accepts_encoding("*", "gzip"));
        assert!(!accepts_encoding("*, gzip;q=0", "gzip"));
    }
}
