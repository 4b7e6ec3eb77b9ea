//! Where and how a run happened: machine, toolchain, commit, date and
//! command, for the header of the suite's output.

use std::path::Path;
use std::process::Command;

/// "2 cores, AMD EPYC 7B13, 24 GiB, Linux 6.18.44".
pub(crate) fn machine() -> String {
    // Like `nproc`: the cores this process may run on.
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = field(&cpuinfo, "model name").unwrap_or("unknown CPU");
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = field(&meminfo, "MemTotal")
        .and_then(|v| v.trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or_else(String::new, |kib| format!(", {:.0} GiB", kib / 1024.0 / 1024.0));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "unknown".to_owned(), |k| k.trim().to_owned());
    format!("{cores} cores, {model}{memory}, Linux {kernel}")
}

/// The 1-minute load average: a busy machine (a build next door) makes
/// every figure of the run lower and noisier.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The value of the first `key : value` line of a /proc file.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(':')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// `rustc --version`, if there is a rustc on the PATH.
pub(crate) fn rustc() -> String {
    output(Command::new("rustc").arg("--version"))
        .unwrap_or_else(|| "unknown (no rustc on the PATH)".to_owned())
}

/// The short commit of `repo`, marked when the tree has uncommitted changes:
/// the figures then belong to code no commit holds.
pub(crate) fn commit(repo: &Path) -> String {
    let git = |args: &[&str]| {
        let mut command = Command::new("git");
        command.arg("-C").arg(repo).args(args);
        output(&mut command)
    };
    match git(&["rev-parse", "--short", "HEAD"]) {
        None => "unknown".to_owned(),
        Some(commit) => match git(&["status", "--porcelain", "--untracked-files=no"]) {
            Some(changes) if !changes.is_empty() => format!("{commit} (+ uncommitted changes)"),
            _ => commit,
        },
    }
}

/// Trimmed stdout of a command that succeeded.
fn output(command: &mut Command) -> Option<String> {
    let out = command.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The command line as a shell would take it back.
pub fn shell_words(args: &[String]) -> String {
    args.iter()
        .map(|arg| {
            let plain = !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_./:=,@+-%".contains(c));
            if plain {
                arg.clone()
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Seconds since the Unix epoch as a UTC date and time: ("2026-11-30", "14:05").
pub fn utc(epoch_seconds: u64) -> (String, String) {
    let days = (epoch_seconds / 86_400) as i64;
    let seconds = epoch_seconds % 86_400;
    // Howard Hinnant's days-to-civil: the proleptic Gregorian calendar,
    // counted in 400-year eras from 0000-03-01.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (
        format!("{year:04}-{month:02}-{day:02}"),
        format!("{:02}:{:02}", seconds / 3600, seconds / 60 % 60),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(utc(0), ("1970-01-01".to_owned(), "00:00".to_owned()));
        assert_eq!(utc(951_782_400), ("2000-02-29".to_owned(), "00:00".to_owned()));
        // 2026-11-30 14:05:59 UTC
        assert_eq!(utc(1_796_047_559), ("2026-11-30".to_owned(), "14:05".to_owned()));
        assert_eq!(utc(4_107_542_399), ("2100-02-28".to_owned(), "23:59".to_owned()));
    }

    #[test]
    fn commands_quote_what_a_shell_would_split() {
        let args = [
            "target/release/switchyard-suite",
            "--runs",
            "3",
            "a b",
            "it's",
            "",
        ];
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        assert_eq!(
            shell_words(&args),
            r"target/release/switchyard-suite --runs 3 'a b' 'it'\''s' ''"
        );
    }

    #[test]
    fn proc_fields() {
        let cpuinfo = "processor\t: 0\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n";
        assert_eq!(field(cpuinfo, "model name"), Some("AMD EPYC 7B13"));
        assert_eq!(field(cpuinfo, "model"), None);
    }
}
