//! The documentation's `curl` examples do what they say, as written: each
//! `curl` line of a shell block in README.md, docs/web.md and
//! docs/middleware.md that talks to the demo group is run with the real
//! `curl` against a real demo group (its address in place of
//! `127.0.0.1:8080`), and its answer checked against its comment: a
//! status the comment starts with (`# 401`, `# 308 to ...`), else a 2xx;
//! a JSON value the comment starts with (`# {"ok":true}`) is the body.
//! `NAME=$(switchyard ...)` and `$(cargo run ... -- ...)` run this build.

mod common;

use std::collections::HashMap;
use std::process::Command;

use common::Group;

/// The pages whose examples run against the demo group with no
/// configuration (docs/cluster.md needs two groups, docs/tls.md a
/// certificate, docs/writing-managers.md a plugin of one's own); a block
/// that starts another application (`up -c`, the shop) is left out too.
const PAGES: &[&str] = &["README.md", "docs/web.md", "docs/middleware.md"];

/// One example: its page and line, its words, and its comment.
struct Example {
    at: String,
    line: String,
    comment: String,
}

/// The shell lines of `text`'s ```sh blocks, but for blocks that start a
/// group of their own (`up -c FILE`: another application than the demo).
fn shell_lines(text: &str) -> Vec<(usize, &str)> {
    let mut block: Option<Vec<(usize, &str)>> = None;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            match block.take() {
                Some(lines) if !lines.iter().any(|(_, l)| l.contains(" up -c ")) => out.extend(lines),
                Some(_) => {}
                None if trimmed == "```sh" => block = Some(Vec::new()),
                None => {}
            }
            continue;
        }
        if let Some(lines) = &mut block {
            lines.push((i + 1, trimmed));
        }
    }
    out
}

/// `line` split at its comment (a `#` after whitespace, outside quotes).
fn split_comment(line: &str) -> (&str, &str) {
    let mut quote = None;
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match (quote, b) {
            (None, b'\'' | b'"') => quote = Some(b),
            (Some(q), _) if q == b => quote = None,
            (None, b'#') if i > 0 && bytes[i - 1].is_ascii_whitespace() => {
                return (line[..i].trim(), line[i + 1..].trim());
            }
            _ => {}
        }
    }
    (line.trim(), "")
}

/// What `$(...)` runs: `switchyard ARGS` or `cargo run ... -- ARGS`, as
/// this build of the binary.
fn substitute(command: &str) -> String {
    let args: Vec<String> = match command.split_once(" -- ") {
        Some((cargo, rest)) if cargo.starts_with("cargo run") => words(rest, &HashMap::new()),
        _ => {
            let all = words(command, &HashMap::new());
            assert_eq!(all.first().map(String::as_str), Some("switchyard"), "{command}");
            all[1..].to_vec()
        }
    };
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{command}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A shell line's words: single and double quotes, `$NAME` and `$(...)`
/// (outside single quotes).
fn words(line: &str, vars: &HashMap<String, String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, c) if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    out.push(w);
                }
            }
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (Some(q), c) if c == q => quote = None,
            (q, '$') if q != Some('\'') => {
                let w = word.get_or_insert_with(String::new);
                if chars.peek() == Some(&'(') {
                    chars.next();
                    let mut depth = 1;
                    let mut inner = String::new();
                    for c in chars.by_ref() {
                        depth += match c {
                            '(' => 1,
                            ')' => -1,
                            _ => 0,
                        };
                        if depth == 0 {
                            break;
                        }
                        inner.push(c);
                    }
                    w.push_str(&substitute(&inner));
                } else {
                    let mut name = String::new();
                    while let Some(&c) = chars.peek() {
                        if !(c.is_ascii_alphanumeric() || c == '_') {
                            break;
                        }
                        name.push(c);
                        chars.next();
                    }
                    let value = vars
                        .get(&name)
                        .unwrap_or_else(|| panic!("`${name}` is not set in {line}"));
                    w.push_str(value);
                }
            }
            (_, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    out.extend(word);
    out
}

/// The examples of every page, with `NAME=$(...)` lines run as they come.
fn examples(root: &std::path::Path, vars: &mut HashMap<String, String>) -> Vec<(Example, Vec<String>)> {
    let mut out = Vec::new();
    for page in PAGES {
        let text = std::fs::read_to_string(root.join(page)).unwrap();
        for (number, line) in shell_lines(&text) {
            let (command, comment) = split_comment(line);
            if let Some((name, value)) = command.split_once("=$(")
                && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            {
                let value = substitute(value.strip_suffix(')').unwrap());
                vars.insert(name.to_owned(), value);
                continue;
            }
            // Only requests to the demo group; a placeholder
            // (`<the ETag>`) is for a person to fill in.
            if !command.starts_with("curl ") || !command.contains("127.0.0.1:8080") || command.contains('<') {
                continue;
            }
            let argv = words(command, vars);
            out.push((
                Example {
                    at: format!("{page}:{number}"),
                    line: line.to_owned(),
                    comment: comment.to_owned(),
                },
                argv,
            ));
        }
    }
    out
}

/// The status a comment promises (`401`, `308 to ...`, `201;`), if any;
/// `100 ms of CPU` is not one (no example promises a 1xx).
fn promised_status(comment: &str) -> Option<u16> {
    let digits: String = comment.chars().take_while(char::is_ascii_digit).collect();
    let after = comment[digits.len()..].chars().next();
    (digits.len() == 3 && after.is_none_or(|c| !c.is_ascii_alphanumeric()))
        .then(|| digits.parse().ok())
        .flatten()
        .filter(|s| (200..600).contains(s))
}

/// The JSON value a comment starts with (`{"ok":true}`, `{"a":1}, after
/// restarts too`), if it starts with a whole one.
fn promised_json(comment: &str) -> Option<serde_json::Value> {
    if !comment.starts_with('{') {
        return None;
    }
    serde_json::Deserializer::from_str(comment)
        .into_iter::<serde_json::Value>()
        .next()?
        .ok()
}

#[test]
fn every_documented_curl_example_does_what_it_says() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let group = Group::start("readme-examples");
    let base = format!("http://{}", group.addr);
    let mut vars = HashMap::new();
    let examples = examples(root, &mut vars);
    assert!(examples.len() >= 20, "only {} examples found", examples.len());
    let scratch = common::scratch_dir("readme-examples");
    let headers = scratch.path().join("headers");
    let body = scratch.path().join("body");
    let mut failures = Vec::new();
    for (example, argv) in &examples {
        let argv: Vec<String> = argv[1..]
            .iter()
            .map(|w| w.replace("http://127.0.0.1:8080", &base))
            .collect();
        // Where the example sends its output nowhere, it stays so; else
        // the body is kept to compare with the comment.
        let mut cmd = Command::new("curl");
        cmd.args(["--silent", "--show-error", "--max-time", "60", "--dump-header"])
            .arg(&headers)
            .args(&argv);
        if !argv.iter().any(|a| a == "-o") {
            cmd.arg("-o").arg(&body);
        }
        let out = cmd.output().expect("run curl");
        if !out.status.success() {
            failures.push(format!(
                "{}: curl failed: {}\n  {}",
                example.at,
                String::from_utf8_lossy(&out.stderr),
                example.line
            ));
            continue;
        }
        let head = std::fs::read_to_string(&headers).unwrap();
        // The last status line: after a 100 Continue, the answer's.
        let status: u16 = head
            .lines()
            .rfind(|l| l.starts_with("HTTP/"))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{}: no status in {head:?}", example.at));
        let wanted = promised_status(&example.comment);
        let ok = match wanted {
            Some(code) => status == code,
            None => (200..300).contains(&status),
        };
        let sent = std::fs::read(&body).unwrap_or_default();
        if !ok {
            failures.push(format!(
                "{}: answered {status} (wanted {}): {}\n  {}",
                example.at,
                wanted.map_or("2xx".to_owned(), |c| c.to_string()),
                String::from_utf8_lossy(&sent),
                example.line
            ));
            continue;
        }
        if let Some(json) = promised_json(&example.comment) {
            let got: Option<serde_json::Value> = serde_json::from_slice(&sent).ok();
            if got.as_ref() != Some(&json) {
                failures.push(format!(
                    "{}: the body is {}, the comment says {json}\n  {}",
                    example.at,
                    String::from_utf8_lossy(&sent),
                    example.line
                ));
            }
        }
        let _ = std::fs::remove_file(&body);
    }
    assert!(
        failures.is_empty(),
        "{} of {} examples do not do what they say:\n{}",
        failures.len(),
        examples.len(),
        failures.join("\n")
    );
    assert_eq!(
        common::get(group.addr, "/noop").unwrap().status,
        200,
        "the group serves on"
    );
}

#[test]
fn the_parser_reads_quotes_comments_and_statuses() {
    let page = "```sh\ncurl a\n```\n```sh\nswitchyard up -c shop.toml\ncurl b\n```\n```\ncurl c\n```\n";
    assert_eq!(shell_lines(page), [(2, "curl a")]);
    let (command, comment) = split_comment(r#"curl -H 'a: #1' "x # y" http://h/p   # 308 to /q"#);
    assert_eq!(comment, "308 to /q");
    assert_eq!(
        words(command, &HashMap::new()),
        ["curl", "-H", "a: #1", "x # y", "http://h/p"]
    );
    let vars = HashMap::from([("T".to_owned(), "tok".to_owned())]);
    assert_eq!(
        words(r#"-H "authorization: Bearer $T" '$T'"#, &vars),
        ["-H", "authorization: Bearer tok", "$T"]
    );
    assert_eq!(promised_status("201; demo.reminder pushed"), Some(201));
    assert_eq!(promised_status("100 ms of CPU in a worker process"), None);
    assert_eq!(promised_status("1 GiB, streamed"), None);
    assert_eq!(
        promised_json(r#"{"a":1}, after restarts too"#),
        Some(serde_json::json!({"a": 1}))
    );
    assert_eq!(promised_json(r#"{"ready":true,...}: every"#), None);
}
