//! The boundaries of the group's processes: a manager's configuration
//! (secrets included) never shows in any process's command line or
//! environment, the supervisor's control socket cannot be made to buffer
//! without bound, and the runtime dir is neither quietly re-permissioned
//! nor left with the group's files in it.

mod common;

use std::io::Write;
use std::os::unix::fs::PermissionsExt;

use common::*;

const SECRET: &str = "sy-SECRET-7f3a9c1e";
const OTHER_SECRET: &str = "sy-SECRET-compute-55d0";

#[test]
fn manager_configuration_never_shows_in_a_command_line_or_environment() {
    let plugin = plugin("switchyard-fixture-stuck");
    let config = format!(
        "[[managers]]\nname = \"stuck\"\nplugin = \"{}\"\n[managers.config]\napi_token = \"{SECRET}\"\n\
         [[managers]]\nname = \"compute\"\n[managers.config]\npassword = \"{OTHER_SECRET}\"\n\
         [managers.workers]\nkind = \"process\"\nsize = 1\n",
        plugin.display()
    );
    let g = Group::builder("secrets").config(&config).start();

    // The manager got its configuration...
    let r = get(g.addr, "/setting/api_token").unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), format!("\"{SECRET}\""));
    // ... and no process shows it (or the other manager's) where every
    // local user can look.
    let pids = g.all_pids();
    assert_eq!(
        pids.len(),
        7,
        "supervisor, broker, router, two managers, a worker, listener"
    );
    for pid in pids {
        for what in ["cmdline", "environ"] {
            let bytes = std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
            let text = String::from_utf8_lossy(&bytes);
            for secret in [SECRET, OTHER_SECRET] {
                assert!(
                    !text.contains(secret),
                    "/proc/{pid}/{what} shows {secret}: {text}"
                );
            }
            assert!(!text.contains("--spec"), "/proc/{pid}/{what}: {text}");
        }
    }
}

#[test]
fn an_endless_control_line_is_cut_off_and_the_supervisor_stays_small() {
    let g = Group::start("control-line");
    let supervisor = g.supervisor_pid();
    let before = rss_kib(supervisor);
    let processes = g.status()["processes"].as_array().unwrap().len();

    let mut stream = std::os::unix::net::UnixStream::connect(g.runtime_dir.join("control.sock")).unwrap();
    stream.set_write_timeout(Some(PATIENCE)).unwrap();
    // 64 MiB without a newline: the supervisor drops the connection long
    // before the end instead of holding it all.
    let chunk = vec![b'x'; 1 << 20];
    let mut sent = 0usize;
    let refused = loop {
        if sent >= 64 << 20 {
            break None;
        }
        match stream.write_all(&chunk) {
            Ok(()) => sent += chunk.len(),
            Err(err) => break Some(err),
        }
    };
    assert!(refused.is_some(), "the supervisor took all {sent} bytes");
    assert!(
        sent < 16 << 20,
        "the supervisor took {sent} bytes before cutting off"
    );
    let grown = rss_kib(supervisor).saturating_sub(before);
    assert!(grown < 16 * 1024, "supervisor RSS grew by {grown} KiB");

    // It serves on: status, and the group.
    assert_eq!(g.status()["processes"].as_array().unwrap().len(), processes);
    assert_eq!(get(g.addr, "/noop").unwrap().status, 200);
}

#[test]
fn a_runtime_dir_open_to_others_is_refused_and_left_as_it_was() {
    let scratch = scratch_dir("open-runtime-dir");
    let dir = scratch.path().join("rt");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();

    let out = match Group::builder("open-runtime-dir").runtime_dir(&dir).try_start() {
        Ok(_group) => panic!("the group started in a directory others can enter"),
        Err(out) => out,
    };
    assert!(out.contains("exit status: 1"), "{out}");
    assert!(out.contains("open to other users (mode 0755)"), "{out}");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o755, "the directory's mode was changed");
    std::fs::remove_dir(&dir).unwrap();
}

#[test]
fn a_clean_stop_removes_only_what_the_group_made_in_an_existing_runtime_dir() {
    let scratch = scratch_dir("own-runtime-dir");
    let dir = scratch.path().join("rt");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::write(dir.join("keep.txt"), "not the group's").unwrap();

    // The zero-config group: `compute` has process workers, whose socket
    // its manager makes in the runtime dir.
    let mut g = Group::builder("own-runtime-dir").runtime_dir(&dir).start();
    assert!(dir.join("workers-compute-0.sock").exists());
    let status = g.terminate();
    assert!(status.success(), "{status:?}");

    let mut left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left, ["keep.txt"]);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700);
    drop(g);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn inherited_descriptors_do_not_leak_into_what_a_plugin_starts() {
    let g = Group::start("cloexec");
    let supervisor = g.supervisor_pid();
    for pid in g.all_pids().into_iter().filter(|&p| p != supervisor) {
        // The control socket (3) and a listening socket (4, 5) may not
        // survive an exec; the spec (6) is closed at start (its number may
        // be reused by then, by a descriptor of the process's own).
        for fd in 3..=6 {
            let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
                assert_ne!(fd, 3, "process {pid} has no control socket");
                continue;
            };
            let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).unwrap_or_default();
            assert!(
                !target.to_string_lossy().contains("switchyard-spec"),
                "process {pid} kept its spec open at fd {fd}"
            );
            let flags = info
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .map(|f| u32::from_str_radix(f.trim(), 8).unwrap())
                .unwrap();
            assert!(
                flags & libc::O_CLOEXEC as u32 != 0,
                "process {pid}: fd {fd} would be inherited by any process a plugin starts ({info})"
            );
        }
    }
}
