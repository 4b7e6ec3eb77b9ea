//! What keeps one process of the group from reading another's secrets
//! (docs/decisions/0101-child-environment-and-secrets.md): children start
//! with an allow-listed environment, never the supervisor's whole one, and
//! every process of the group is non-dumpable, so that no other process of
//! the same user (a plugin in a manager) can read its memory, environment
//! or descriptors through /proc or ptrace.

use std::ffi::OsString;

/// The variables every child gets from the supervisor's environment, when
/// set: where programs and libraries are found, the locale and time zone,
/// the temporary and state directories (the Store's default data directory
/// is found from these), the logging and backtrace switches, and the
/// system's TLS trust store. None of them is a secret by convention.
/// `LC_*` passes every locale category.
pub(crate) const PASSED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "XDG_RUNTIME_DIR",
    "XDG_STATE_HOME",
    "STATE_DIRECTORY",
    "RUST_LOG",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "NO_COLOR",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    switchyard_proto::process::ENV_LOG,
];

/// Whether `name` is allowed by `pattern`: equal, or beginning with what
/// comes before a final `*`.
fn allowed_by(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == pattern,
    }
}

/// The environment a child starts with: the variables of `from` that
/// [`PASSED`] or the operator's `extra` (`group.pass_env`) allow.
pub(crate) fn child_env(
    from: impl IntoIterator<Item = (OsString, OsString)>,
    extra: &[String],
) -> Vec<(OsString, OsString)> {
    from.into_iter()
        .filter(|(name, _)| {
            let Some(name) = name.to_str() else { return false };
            PASSED.iter().any(|p| allowed_by(p, name)) || extra.iter().any(|p| allowed_by(p, name))
        })
        .collect()
}

/// Makes this process non-dumpable (`PR_SET_DUMPABLE` 0): its /proc files
/// belong to root from now on and only a process with `CAP_SYS_PTRACE`
/// may attach to it or read its memory, environment, maps or descriptors.
/// Survives nothing: an exec resets it, so every role sets it at start.
/// Transparent huge pages off for this process and every process it
/// starts (the setting is inherited across fork and exec). mimalloc asks
/// for them on its arenas, and each 2 MiB page it touches is then resident
/// whole: about 6 MiB per process of the group, most of its memory, for no
/// throughput measured (decision 0157).
pub(crate) fn no_huge_pages() -> std::io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no
    // memory of ours.
    let done = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if done == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub(crate) fn not_dumpable() -> std::io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(std::io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_allowed_variables_pass() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(OsString, OsString)> {
            pairs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
        };
        let passed = child_env(
            env(&[
                ("PATH", "/bin"),
                ("LC_TIME", "C"),
                ("SWITCHYARD_AUTH__JWT__SECRET", "s3cret"),
                ("SWITCHYARD_CLUSTER__PASSWORD", "pw"),
                ("DATABASE_URL", "postgres://u:p@db/app"),
                ("MYAPP_KEY", "k"),
                ("AWS_SECRET_ACCESS_KEY", "x"),
            ]),
            &["DATABASE_URL".into(), "MYAPP_*".into()],
        );
        let names: Vec<_> = passed.iter().map(|(k, _)| k.to_str().unwrap()).collect();
        assert_eq!(names, ["PATH", "LC_TIME", "DATABASE_URL", "MYAPP_KEY"]);
        assert!(child_env(env(&[("DATABASE_URL", "x")]), &[]).is_empty());
    }

    #[test]
    fn a_process_made_non_dumpable_says_so() {
        not_dumpable().unwrap();
        assert!(!nix::sys::prctl::get_dumpable().unwrap());
    }
}
