//! The live dashboard at the admin endpoint's `/`, in a real headless
//! Chromium (Debian's package, installed by `.ci/run`): it loads without a
//! console message or an exception, shows every process of the group,
//! and its numbers move under load (decision 0056).
//!
//! Chromium is driven over the DevTools protocol (CDP): JSON messages on
//! a WebSocket, spoken here with the tokio-tungstenite the tests already
//! use, so the page runs in real time (`--dump-dom` runs it in virtual
//! time, where a second of polling passes in a few real milliseconds).

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use common::{Group, PATIENCE, get};

/// Chromium, or `None` when it is not installed and this is not CI (where
/// `.ci/run` installs it, so its absence fails the test).
fn chromium() -> Option<PathBuf> {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if let Ok(out) = Command::new("which").arg(name).output()
            && out.status.success()
        {
            return Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()));
        }
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "Chromium is not installed: .ci/run installs it (apt-get install chromium)"
    );
    eprintln!("SKIPPED: no Chromium here (apt-get install chromium); CI installs it");
    None
}

/// A headless Chromium with one page, driven over CDP.
struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    out: mpsc::UnboundedSender<Message>,
    pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>>,
    /// Console messages, exceptions and error log entries of the page.
    problems: Arc<Mutex<Vec<Value>>>,
    next: u64,
    session: String,
}

impl Browser {
    async fn launch(chromium: &PathBuf) -> Browser {
        let profile = common::scratch_dir("chromium-profile");
        let mut child = Command::new(chromium)
            .args([
                "--headless",
                // Root in a container has no user namespace for the sandbox.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run chromium");
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let stderr = child.stderr.take().unwrap();
        let (found, url) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut found = Some(found);
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(at) = line.find("ws://")
                    && let Some(tx) = found.take()
                {
                    let _ = tx.send(line[at..].trim().to_owned());
                }
            }
        });
        let url = url.recv_timeout(PATIENCE).expect("chromium's DevTools address");
        let (ws, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("connect to DevTools");
        let (mut sink, mut stream) = ws.split();
        let (out, mut outgoing) = mpsc::unbounded_channel::<Message>();
        tokio::spawn(async move {
            while let Some(m) = outgoing.recv().await {
                if sink.send(m).await.is_err() {
                    break;
                }
            }
        });
        let pending: Arc<Mutex<HashMap<u64, oneshot::Sender<Value>>>> = Arc::default();
        let problems: Arc<Mutex<Vec<Value>>> = Arc::default();
        let (p, q) = (pending.clone(), problems.clone());
        tokio::spawn(async move {
            while let Some(Ok(Message::Text(text))) = stream.next().await {
                let Ok(msg) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if let Some(id) = msg["id"].as_u64() {
                    if let Some(tx) = p.lock().unwrap().remove(&id) {
                        let _ = tx.send(msg);
                    }
                    continue;
                }
                let method = msg["method"].as_str().unwrap_or("");
                let bad = match method {
                    "Runtime.consoleAPICalled" | "Runtime.exceptionThrown" => true,
                    "Log.entryAdded" => matches!(
                        msg["params"]["entry"]["level"].as_str(),
                        Some("error" | "warning")
                    ),
                    _ => false,
                };
                if bad {
                    q.lock().unwrap().push(msg);
                }
            }
        });
        let mut browser = Browser {
            child,
            _profile: profile,
            out,
            pending,
            problems,
            next: 0,
            session: String::new(),
        };
        let target = browser
            .call("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let target = target["targetId"].as_str().unwrap().to_owned();
        let attached = browser
            .call(
                "Target.attachToTarget",
                json!({ "targetId": target, "flatten": true }),
            )
            .await;
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            browser.call(domain, json!({})).await;
        }
        browser
    }

    /// Sends a command (to the page once attached) and waits for its result.
    async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let id = self.next;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if !self.session.is_empty() {
            msg["sessionId"] = json!(self.session);
        }
        let (tx, rx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, tx);
        self.out.send(Message::text(msg.to_string())).unwrap();
        let reply = tokio::time::timeout(PATIENCE, rx)
            .await
            .unwrap_or_else(|_| panic!("no answer to {method}"))
            .unwrap();
        assert!(reply["error"].is_null(), "{method}: {reply}");
        reply["result"].clone()
    }

    /// The value of a JavaScript expression in the page.
    async fn eval(&mut self, expression: &str) -> Value {
        let result = self
            .call(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true }),
            )
            .await;
        assert!(result["exceptionDetails"].is_null(), "{expression}: {result}");
        result["result"]["value"].clone()
    }

    /// Polls `expression` until `done` holds, with a bounded patience.
    async fn until(&mut self, what: &str, expression: &str, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let value = self.eval(expression).await;
            if done(&value) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: still {value} after {PATIENCE:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn problems(&self) -> Vec<Value> {
        self.problems.lock().unwrap().clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Browser.close lets it end its own helpers; the kill is a backstop.
        let close = json!({ "id": u64::MAX, "method": "Browser.close" });
        let _ = self.out.send(Message::text(close.to_string()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `/noop` row's request count and rate, if the page shows it.
const NOOP_ROW: &str = r#"(() => {
    const tr = document.querySelector('#routes tr[data-route="/noop"][data-method="GET"]');
    if (!tr) return null;
    const field = (f) => tr.querySelector('[data-field="' + f + '"]').textContent;
    return { count: Number(field("count")), rate: parseFloat(field("rate")), p50: field("p50") };
})()"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_the_group_and_moves_under_load() {
    let Some(chromium) = chromium() else { return };
    let mut group = Group::builder("dashboard")
        .arg("--admin-bind")
        .arg("127.0.0.1:0")
        .start();
    let line = group.wait_line("admin on http://");
    let admin: SocketAddr = line.rsplit("http://").next().unwrap().trim().parse().unwrap();

    let mut browser = Browser::launch(&chromium).await;
    browser
        .call("Page.navigate", json!({ "url": format!("http://{admin}/") }))
        .await;
    browser
        .until(
            "two polls",
            "Number(document.getElementById('updated')?.dataset.polls || 0)",
            |v| v.as_u64().unwrap_or(0) >= 2,
        )
        .await;
    assert_eq!(
        browser.eval("document.getElementById('error').textContent").await,
        ""
    );
    // Every process of the group, by pid.
    let status = group.status();
    let processes = status["processes"].as_array().unwrap();
    let shown = browser
        .eval("[...document.querySelectorAll('#processes tr')].map(tr => Number(tr.dataset.pid))")
        .await;
    for p in processes {
        assert!(
            shown.as_array().unwrap().contains(&p["pid"]),
            "process {p} is not shown: {shown}"
        );
    }
    assert_eq!(
        browser
            .eval("document.getElementById('process-count').textContent")
            .await,
        processes.len().to_string()
    );
    let before = browser.eval(NOOP_ROW).await;
    let before = before["count"].as_f64().unwrap_or(0.0);

    // Load while the page polls: its counters and rates move.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let (stop, sent, addr) = (stop.clone(), sent.clone(), group.addr);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    assert_eq!(get(addr, "/noop").unwrap().status, 200);
                    sent.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let busy = browser
        .until("/noop moving", NOOP_ROW, |v| {
            v["count"].as_f64().is_some_and(|c| c > before) && v["rate"].as_f64().is_some_and(|r| r > 0.0)
        })
        .await;
    let total = browser
        .until(
            "a total rate",
            "parseFloat(document.getElementById('total-rate').textContent)",
            |v| v.as_f64().is_some_and(|r| r > 0.0),
        )
        .await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    assert!(sent.load(Ordering::Relaxed) > 0);
    assert!(
        busy["p50"]
            .as_str()
            .is_some_and(|p| p.ends_with(" ms") || p.ends_with(" s")),
        "{busy}"
    );
    assert!(total.as_f64().unwrap() > 0.0);
    assert_eq!(
        browser.eval("document.getElementById('error').textContent").await,
        ""
    );
    let problems = browser.problems();
    assert!(
        problems.is_empty(),
        "console messages or exceptions: {problems:#?}"
    );
    drop(browser);
    group.terminate();
}
