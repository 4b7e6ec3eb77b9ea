//! A process's CPU time and resident memory, from `/proc/PID/stat` and
//! `/proc/PID/statm` (proc(5)).

/// What `/proc` says of one process.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Usage {
    /// User and system CPU time since it started, in seconds.
    pub(super) cpu_seconds: f64,
    /// Resident set size, in bytes.
    pub(super) rss_bytes: u64,
}

/// The usage of `pid`, or `None` when it is gone (or `/proc` is not
/// mounted).
pub(super) fn usage(pid: u32) -> Option<Usage> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
    parse(&stat, &statm, clock_ticks(), page_size())
}

fn parse(stat: &str, statm: &str, ticks: u64, page: u64) -> Option<Usage> {
    // The command name (field 2) is in parentheses and may hold spaces and
    // parentheses itself: the fields after it start past the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(Usage {
        cpu_seconds: (utime + stime) as f64 / ticks.max(1) as f64,
        rss_bytes: resident * page,
    })
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf reads a constant of the system; no memory is passed.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(ticks).ok().filter(|&t| t > 0).unwrap_or(100)
}

fn page_size() -> u64 {
    // SAFETY: as above.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(page).ok().filter(|&p| p > 0).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_lines() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 1 0 100 1000 50";
        let u = parse(stat, "2000 300 100 1 0 50 0", 100, 4096).unwrap();
        assert_eq!(u.cpu_seconds, 3.0);
        assert_eq!(u.rss_bytes, 300 * 4096);
        assert!(parse("garbage", "", 100, 4096).is_none());
        let me = usage(std::process::id()).unwrap();
        assert!(me.rss_bytes > 0);
    }
}
