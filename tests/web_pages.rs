//! Content negotiation, HTML templates, error pages, forms and conditional
//! replies against the real group (docs/web.md, decisions 0065, 0066,
//! 0069).

mod common;

use std::path::Path;

use common::{Group, HttpResponse, request_with};

const BROWSER: &str = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";

fn get(group: &Group, path: &str, headers: &[(&str, &str)]) -> HttpResponse {
    request_with(group.addr, "GET", path, headers, b"").unwrap()
}

/// `method path` with a body of `content_type`.
fn send(
    group: &Group,
    method: &str,
    path: &str,
    content_type: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: test\r\nconnection: close\r\ncontent-length: {}\r\ncontent-type: {content_type}\r\n",
        body.len()
    );
    for (name, value) in headers {
        req.push_str(&format!("{name}: {value}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    common::raw(group.addr, &bytes).unwrap()
}

#[test]
fn one_event_as_html_json_or_bincode() {
    let group = Group::start("web-negotiate");

    // A browser gets the page, with the name escaped.
    let r = get(&group, "/hello/%3Cscript%3E", &[("accept", "text/html")]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = r.text();
    assert!(page.contains("Hello, &lt;script&gt;!"), "{page}");
    assert!(!page.contains("<script>"), "{page}");
    // Inheritance (base.html), an include (nav.html) and url_for.
    assert!(
        page.contains("<link rel=\"stylesheet\" href=\"/static/demo.css\">"),
        "{page}"
    );
    assert!(page.contains("href=\"/hello/world\""), "{page}");
    assert!(
        r.header_all("vary")
            .iter()
            .any(|v| v.eq_ignore_ascii_case("accept"))
    );
    assert_eq!(
        get(&group, "/hello/Ada", &[("accept", BROWSER)]).header("content-type"),
        Some("text/html; charset=utf-8")
    );

    // An API client gets today's JSON; so does one that says nothing.
    for accept in [Some("application/json"), Some("*/*"), None] {
        let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
        let r = get(&group, "/hello/Ada", &headers);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("content-type"), Some("application/json"), "{accept:?}");
        assert_eq!(r.json(), serde_json::json!({ "message": "Hello, Ada!" }));
        assert!(
            r.header_all("vary")
                .iter()
                .any(|v| v.eq_ignore_ascii_case("accept"))
        );
    }
    // Rust clients: bincode.
    let r = get(&group, "/hello/Ada", &[("accept", "application/x-bincode")]);
    assert_eq!(r.header("content-type"), Some("application/x-bincode"));
    assert!(r.body.ends_with(b"Hello, Ada!"));
    // q-values: JSON preferred over HTML.
    let r = get(
        &group,
        "/hello/Ada",
        &[("accept", "text/html;q=0.5, application/json")],
    );
    assert_eq!(r.header("content-type"), Some("application/json"));

    // Nothing offered fits: 406 listing what is.
    let r = get(&group, "/hello/Ada", &[("accept", "image/png")]);
    assert_eq!(r.status, 406, "{}", r.text());
    let offered = r.json()["offered"].clone();
    assert_eq!(
        offered,
        serde_json::json!(["application/json", "text/html", "application/x-bincode"])
    );
    // An event without a template offers no HTML (said as a page, since
    // HTML is what this client reads); a browser's `*/*` takes the JSON.
    let r = get(&group, "/noop", &[("accept", "text/html")]);
    assert_eq!(r.status, 406);
    assert!(
        r.text()
            .contains("offered as application/json, application/x-bincode"),
        "{}",
        r.text()
    );
    let r = get(&group, "/noop", &[("accept", BROWSER)]);
    assert_eq!(
        (r.status, r.header("content-type")),
        (200, Some("application/json"))
    );
}

#[test]
fn errors_as_pages_for_browsers_and_problems_for_the_rest() {
    let group = Group::start("web-errors");
    let long = "a".repeat(150);

    // A handler's 422: the demo's error.html for a browser, naming the field.
    let r = get(&group, &format!("/hello/{long}"), &[("accept", BROWSER)]);
    assert_eq!(r.status, 422);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = r.text();
    assert!(
        page.contains("<h1 class=\"error\">422 Unprocessable Content</h1>"),
        "{page}"
    );
    assert!(page.contains("<code>name</code>"), "{page}");
    // problem+json for an API client.
    let r = get(&group, &format!("/hello/{long}"), &[]);
    assert_eq!(
        (r.status, r.header("content-type")),
        (422, Some("application/problem+json"))
    );

    // The listener's own errors: a plain page, or problem+json.
    let r = get(&group, "/no/such/route", &[("accept", BROWSER)]);
    assert_eq!(
        (r.status, r.header("content-type")),
        (404, Some("text/html; charset=utf-8"))
    );
    assert!(r.text().contains("<h1>404 Not Found</h1>"), "{}", r.text());
    let r = get(&group, "/no/such/route", &[("accept", "application/json")]);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));

    // A panic is a page that says nothing of it.
    let r = get(&group, "/panic", &[("accept", BROWSER)]);
    assert_eq!(r.status, 500);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = r.text().to_lowercase();
    assert!(page.contains("internal error"), "{page}");
    for leak in ["panick", "src/", ".rs:", "backtrace", "thread"] {
        assert!(!page.contains(leak), "the page shows {leak:?}: {page}");
    }
}

#[test]
fn conditional_replies_and_forms() {
    let group = Group::start("web-caching");

    // A reply with an entity tag derived from its bytes: 304 on revalidation.
    let r = get(&group, "/hello/Ada", &[]);
    let etag = r.header("etag").expect("an ETag").to_owned();
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let r = get(&group, "/hello/Ada", &[("if-none-match", &etag)]);
    assert_eq!(r.status, 304);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), Some(etag.as_str()));
    assert_eq!(r.header("cache-control"), Some("no-cache"));
    let r = request_with(group.addr, "HEAD", "/hello/Ada", &[("if-none-match", &etag)], b"").unwrap();
    assert_eq!(r.status, 304);
    // Another reply, another tag; the HTML page has its own.
    let other = get(&group, "/hello/Eve", &[]);
    assert_ne!(other.header("etag"), Some(etag.as_str()));
    assert_eq!(get(&group, "/hello/Eve", &[("if-none-match", &etag)]).status, 200);
    let html = get(&group, "/hello/Ada", &[("accept", "text/html")]);
    let html_etag = html.header("etag").unwrap().to_owned();
    assert_ne!(html_etag, etag);
    assert_eq!(
        get(
            &group,
            "/hello/Ada",
            &[("accept", "text/html"), ("if-none-match", &html_etag)]
        )
        .status,
        304
    );
    assert_eq!(
        get(
            &group,
            "/hello/Ada",
            &[("accept", "text/html"), ("if-none-match", &etag)]
        )
        .status,
        200
    );

    // If-Range on a manager's answer: the range while the tag holds.
    let r = get(
        &group,
        "/hello/Ada",
        &[("range", "bytes=0-9"), ("if-range", &etag)],
    );
    assert_eq!((r.status, r.body.len()), (206, 10));
    let r = get(
        &group,
        "/hello/Ada",
        &[("range", "bytes=0-9"), ("if-range", "\"old\"")],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), serde_json::json!({ "message": "Hello, Ada!" }));

    // If-Match: a stale update is refused, a current one goes through.
    let form = "application/x-www-form-urlencoded";
    let r = send(&group, "PUT", "/note", form, &[], b"text=first");
    assert_eq!(r.status, 200, "{}", r.text());
    let first = r.header("etag").unwrap().to_owned();
    let r = send(
        &group,
        "PUT",
        "/note",
        form,
        &[("if-match", &first)],
        b"text=second",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = send(
        &group,
        "PUT",
        "/note",
        form,
        &[("if-match", &first)],
        b"text=lost+update",
    );
    assert_eq!(r.status, 412, "{}", r.text());
    assert_eq!(get(&group, "/note", &[]).json()["text"], "second");

    // Forms fill event fields like JSON, with coercion and validation.
    let r = send(
        &group,
        "POST",
        "/greet",
        form,
        &[],
        b"name=Ada+L%C3%B6we&excited=true",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["message"], "Hello, Ada Löwe!!!");
    let r = send(
        &group,
        "POST",
        "/greet",
        "application/json",
        &[],
        br#"{"name":"Ada"}"#,
    );
    assert_eq!(r.json()["message"], "Hello, Ada!");
    let r = send(&group, "POST", "/greet", form, &[], b"excited=true");
    assert_eq!(r.status, 422);
    assert_eq!(r.json()["errors"][0]["field"], "name");
    let r = send(&group, "POST", "/greet", form, &[], b"name=Ada&excited=maybe");
    assert_eq!(r.status, 422);
    // A form posted by a browser gets the page.
    let r = send(
        &group,
        "POST",
        "/greet",
        form,
        &[("accept", BROWSER)],
        b"name=%3Cb%3E",
    );
    assert!(r.text().contains("Hello, &lt;b&gt;!"), "{}", r.text());
}

/// Copies the demo's templates into `dir`.
fn templates_in(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let demo = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/demo/templates");
    for entry in std::fs::read_dir(demo).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
}

/// The demo's `basics` manager alone, with its templates in `dir`.
fn group_with_templates(tag: &'static str, dir: &Path, development: bool) -> Group {
    let config = format!(
        "[web]\ndevelopment = {development}\n\n[[managers]]\nname = \"basics\"\ntemplates = \"{}\"\n",
        dir.display()
    );
    Group::builder(tag).config(&config).start()
}

#[test]
fn templates_reload_in_development_mode_only() {
    for development in [true, false] {
        let scratch = common::scratch_dir("web-templates");
        let dir = scratch.path().join("templates");
        templates_in(&dir);
        let group = group_with_templates("web-templates", &dir, development);
        let page = |group: &Group| get(group, "/hello/Ada", &[("accept", "text/html")]);
        assert!(page(&group).text().contains("<h1>Hello, Ada!</h1>"));
        std::fs::write(dir.join("hello.html"), "<em>{{ message }}</em> edited").unwrap();
        let after = page(&group);
        if development {
            assert_eq!(after.text(), "<em>Hello, Ada!</em> edited");
        } else {
            assert!(after.text().contains("<h1>Hello, Ada!</h1>"), "{}", after.text());
        }
    }
}

#[test]
fn a_broken_template_is_a_plain_500_and_a_log_line() {
    let scratch = common::scratch_dir("web-broken");
    let dir = scratch.path().join("templates");
    templates_in(&dir);
    std::fs::write(
        dir.join("hello.html"),
        "{% extends \"base.html\" %}{% block content %}{{ message | nosuchfilter }}{% endblock %}",
    )
    .unwrap();
    let mut group = group_with_templates("web-broken", &dir, false);
    let r = get(&group, "/hello/Ada", &[("accept", "text/html")]);
    assert_eq!(r.status, 500);
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    assert!(!r.text().contains("nosuchfilter"), "{}", r.text());
    let line = group.wait_line("template `hello.html` failed");
    assert!(line.contains("nosuchfilter"), "{line}");
    // JSON is unaffected, and the group goes on serving.
    assert_eq!(get(&group, "/hello/Ada", &[]).status, 200);
}

#[test]
fn a_form_with_invalid_fields_gets_a_page_that_lists_them_and_why() {
    let form = "application/x-www-form-urlencoded";
    // A manager without templates: the listener's page for the problem.
    let shop = common::plugin("switchyard-example-shop");
    let config = format!(
        "[[managers]]\nname = \"orders\"\nplugin = \"{p}\"\n[[managers]]\nname = \"inventory\"\nplugin = \"{p}\"\n",
        p = shop.display()
    );
    let group = Group::builder("web-invalid-plain").config(&config).start();
    let r = send(
        &group,
        "POST",
        "/orders",
        form,
        &[("accept", BROWSER)],
        b"sku=&qty=0&customer_id=1",
    );
    assert_eq!(r.status, 422, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("text/html; charset=utf-8"));
    let page = r.text();
    assert!(page.contains("2 invalid fields"), "{page}");
    for field in ["sku", "qty"] {
        let item = page
            .split(&format!("<li><code>{field}</code>: "))
            .nth(1)
            .unwrap_or_else(|| panic!("`{field}` is not listed: {page}"));
        let why = item.split("</li>").next().unwrap_or_default();
        assert!(!why.trim().is_empty(), "no reason for `{field}`: {page}");
    }
    drop(group);

    // A manager with templates but no `error.html`: the SDK's page.
    let scratch = common::scratch_dir("web-invalid-templated");
    let dir = scratch.path().join("templates");
    templates_in(&dir);
    std::fs::remove_file(dir.join("error.html")).unwrap();
    let group = group_with_templates("web-invalid-templated", &dir, false);
    let r = send(&group, "POST", "/greet", form, &[("accept", BROWSER)], b"name=");
    assert_eq!(r.status, 422, "{}", r.text());
    assert!(r.text().contains("<li><code>name</code>: "), "{}", r.text());
}
