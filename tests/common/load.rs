//! Load and CPU accounting for the tests that measure (`perf_budget`,
//! `feature_cost`): keep-alive `GET /noop` from plain threads, and the CPU
//! time of a process tree as the scheduler counts it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};

use super::PATIENCE;

/// Sends `requests` keep-alive `GET /noop` requests over `clients`
/// connections, one thread each, and asserts that every answer is a 200.
pub fn noop_load(addr: SocketAddr, requests: usize, clients: usize) {
    let per = requests / clients;
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            std::thread::spawn(move || {
                let stream = TcpStream::connect(addr).unwrap();
                stream.set_nodelay(true).unwrap();
                stream.set_read_timeout(Some(PATIENCE)).unwrap();
                let mut writer = stream.try_clone().unwrap();
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                for _ in 0..per {
                    writer
                        .write_all(b"GET /noop HTTP/1.1\r\nhost: bench\r\n\r\n")
                        .unwrap();
                    let mut length = 0usize;
                    let mut status = String::new();
                    loop {
                        line.clear();
                        reader.read_line(&mut line).unwrap();
                        if line.starts_with("HTTP/1.1 ") {
                            status = line.trim_end().to_owned();
                        } else if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            length = v.trim().parse().unwrap();
                        } else if line == "\r\n" {
                            break;
                        }
                    }
                    let mut body = vec![0; length];
                    reader.read_exact(&mut body).unwrap();
                    assert!(
                        status.starts_with("HTTP/1.1 200"),
                        "{status} during the load: {}",
                        String::from_utf8_lossy(&body)
                    );
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Nanoseconds on a CPU of every thread of `pid` (`/proc/<pid>/task/*/schedstat`,
/// the scheduler's own account): the clock ticks of `/proc/<pid>/stat` are
/// 10 ms, coarser than a slice of the router's CPU.
pub fn process_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|s| s.split(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// [`process_ns`] of `root` and all its descendants.
pub fn tree_ns(root: u32) -> u64 {
    let mut parent = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(close) = stat.rfind(')') else { continue };
        // After the command: state, then ppid.
        let ppid: u32 = stat[close + 2..]
            .split(' ')
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or(0);
        parent.insert(pid, ppid);
    }
    let in_tree = |mut p: u32| loop {
        if p == root {
            return true;
        }
        match parent.get(&p) {
            Some(&pp) if pp != 0 && pp != p => p = pp,
            _ => return false,
        }
    };
    parent
        .keys()
        .filter(|&&pid| in_tree(pid))
        .map(|&pid| process_ns(pid))
        .sum()
}
