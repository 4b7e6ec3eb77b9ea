//! The demo group's `/openapi.json` tells the truth: schemathesis (PyPI;
//! `.ci/run` installs it), a client nobody here wrote, generates requests
//! from the document alone — valid ones that must be accepted, invalid
//! ones that must be refused, undeclared methods that must be 405 — and
//! checks every answer against the documented statuses, content types,
//! headers and schemas (`--checks all`). Zero failures, within a fixed
//! number of cases per route and a time bound.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Group;

/// Routes left out, and why: each does on purpose what a fuzzer counts
/// as a failure, or spends what a test cannot (the limits stay described).
const EXCLUDED: &[(&str, &str)] = &[
    ("/panic", "answers 500 by design"),
    ("/crash/{mode}", "kills a worker by design (500, 502)"),
    ("/sleep/{ms}", "up to 60 s per case"),
    ("/cpu/{ms}", "up to 60 s of CPU per case"),
    ("/cpu-inline/{ms}", "up to 60 s of CPU per case"),
    ("/stream/{size}", "up to 64 GiB per case"),
    ("/bench/store", "up to 2 million Store operations per case"),
];

/// Cases per route, and the bound on the whole run (not a performance
/// threshold: a run that does not finish in it is a hung one).
const EXAMPLES_PER_ROUTE: &str = "25";
const RUN_BOUND: Duration = Duration::from_secs(600);

#[test]
fn schemathesis_finds_no_failure_in_the_demo_groups_description() {
    let group = Group::start("schemathesis");
    // /me needs a bearer token: with one, its 200 is checked too (and
    // schemathesis checks that it is refused without).
    let token = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["token", "--sub", "schemathesis"])
        .output()
        .expect("run switchyard token");
    assert!(token.status.success());
    let token = String::from_utf8(token.stdout).unwrap();
    let scratch = common::scratch_dir("schemathesis");
    // A valid request may still fail a precondition it sends (`PUT /note`
    // with an `If-Match` that names another version): 412 is the right
    // answer there, so it joins the statuses schemathesis accepts for
    // schema-valid data (its defaults, plus 412).
    std::fs::write(
        scratch.path().join("schemathesis.toml"),
        "[checks.positive_data_acceptance]\n\
         expected-statuses = [\"2xx\", \"3xx\", \"401\", \"403\", \"404\", \"409\", \"412\", \"429\", \"5xx\"]\n",
    )
    .unwrap();
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "schemathesis.cli", "run"])
        .arg(format!("http://{}/openapi.json", group.addr))
        .args(["--checks", "all"])
        .args(["--max-examples", EXAMPLES_PER_ROUTE])
        // Reproducible: the same cases each run, for the same document.
        .args(["--seed", "20261202"])
        .args(["--workers", "1"])
        .args(["--request-timeout", "30"])
        .args(["--header", &format!("Authorization: Bearer {}", token.trim())])
        // Whatever it writes beside itself goes with the scratch dir.
        .current_dir(scratch.path())
        // No colours: the log is for a person.
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (path, _why) in EXCLUDED {
        cmd.args(["--exclude-path", path]);
    }
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .expect("run python3 -m schemathesis.cli (pip install schemathesis; .ci/run installs it)");
    let out = loop {
        if child.try_wait().unwrap().is_some() {
            break child.wait_with_output().unwrap();
        }
        if started.elapsed() > RUN_BOUND {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "schemathesis still running after {RUN_BOUND:?}:\n{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "schemathesis found failures (exit {:?}):\n{stdout}\n{stderr}",
        out.status.code()
    );
    // It did test every operation but the excluded ones.
    let count = |label: &str| -> (usize, Option<usize>) {
        let line = stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(label))
            .unwrap_or_else(|| panic!("no `{label}` line:\n{stdout}"));
        let mut numbers = line.trim().split('/').map(|n| n.trim().parse::<usize>().unwrap());
        (numbers.next().unwrap(), numbers.next())
    };
    let (selected, total) = count("Selected:");
    let (tested, _) = count("Tested:");
    assert_eq!(tested, selected, "{stdout}");
    assert_eq!(total.unwrap() - selected, EXCLUDED.len(), "{stdout}");
    assert!(tested >= 20, "{stdout}");
    assert_eq!(
        common::get(group.addr, "/noop").unwrap().status,
        200,
        "the group serves on"
    );
}
