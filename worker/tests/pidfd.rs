//! A process pool kills a runaway job's worker through the pidfd the
//! kernel gave for it when it connected, never by pid: once the process
//! that connected is gone, its pid may belong to an unrelated process, and
//! that one must survive.
//!
//! The test recycles a pid on purpose: a helper process connects as a
//! worker, hands its connection to the test and exits; the test starts a
//! bystander under the helper's pid (`/proc/sys/kernel/ns_last_pid`, which
//! needs CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE; without it the test says
//! so and stops), then lets the job on that connection pass its deadline.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use bytes::Bytes;
use switchyard_proto::EventType;
use switchyard_worker::{Job, Pool, TIMED_OUT};

const HELPER_ENV: &str = "SWITCHYARD_TEST_WORKER_HELPER";
const TEST_NAME: &str = "a_deadline_kills_the_worker_that_connected_not_whoever_has_its_pid_now";
const PATIENCE: Duration = Duration::from_secs(30);
/// Long enough to recycle a pid, short enough for a test.
const JOB_TIMEOUT: Duration = Duration::from_secs(3);

/// The helper: connect to the pool as a worker, wait until the pool has
/// accepted us (it sends the queued job), hand the connection over, exit.
fn helper(spec: &str) -> ! {
    let (pool, handoff) = spec.split_once('|').unwrap();
    let mut worker = UnixStream::connect(pool).unwrap();
    worker.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut first = [0u8; 1];
    worker.read_exact(&mut first).unwrap();
    let handoff = UnixStream::connect(handoff).unwrap();
    let fds = [worker.as_raw_fd()];
    let cmsg = [nix::sys::socket::ControlMessage::ScmRights(&fds)];
    let iov = [std::io::IoSlice::new(b"w")];
    nix::sys::socket::sendmsg::<()>(
        handoff.as_raw_fd(),
        &iov,
        &cmsg,
        nix::sys::socket::MsgFlags::empty(),
        None,
    )
    .unwrap();
    std::process::exit(0)
}

/// Receives the descriptor the helper hands over.
fn receive_fd(handoff: &UnixListener) -> OwnedFd {
    let (stream, _) = handoff.accept().unwrap();
    let mut buf = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut space = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = nix::sys::socket::recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        nix::sys::socket::MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .unwrap();
    for cmsg in msg.cmsgs().unwrap() {
        if let nix::sys::socket::ControlMessageOwned::ScmRights(fds) = cmsg {
            // SAFETY: the kernel just installed this descriptor for us.
            return unsafe { OwnedFd::from_raw_fd(fds[0]) };
        }
    }
    panic!("the helper sent no descriptor");
}

/// Starts a bystander process whose pid is `pid`, if this process may
/// choose the next pid; `None` if it may not.
fn bystander_with_pid(pid: u32) -> Option<Child> {
    for _ in 0..50 {
        if let Err(err) = std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()) {
            eprintln!(
                "SKIPPED: cannot recycle a pid without CAP_SYS_ADMIN ({err}); the pidfd path is untested here"
            );
            return None;
        }
        let child = Command::new("sleep").arg("60").spawn().unwrap();
        if child.id() == pid {
            return Some(child);
        }
        // Another process of the machine took the pid first: again.
        let mut child = child;
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("pid {pid} could not be recycled in 50 tries");
}

fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("switchyard-pidfd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run_helper(pool: &Path, handoff: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([TEST_NAME, "--exact", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, format!("{}|{}", pool.display(), handoff.display()))
        .spawn()
        .unwrap()
}

#[test]
fn a_deadline_kills_the_worker_that_connected_not_whoever_has_its_pid_now() {
    if let Ok(spec) = std::env::var(HELPER_ENV) {
        helper(&spec);
    }
    let dir = scratch();
    let pool_path = dir.join("workers.sock");
    let handoff_path = dir.join("handoff.sock");
    let handoff = UnixListener::bind(&handoff_path).unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let (pool, mut results) =
        Pool::processes(switchyard_worker::process::bind(&pool_path).unwrap(), 8, 1 << 20).unwrap();
    // Queued now, sent to the helper the moment the pool accepts it.
    pool.submit(Job {
        id: 1,
        job_type: EventType::of("t.Job"),
        body: Bytes::from_static(b"never answered"),
        timeout: JOB_TIMEOUT,
        tags: Default::default(),
    })
    .unwrap();
    let submitted = Instant::now();

    let mut helper = run_helper(&pool_path, &handoff_path);
    let helper_pid = helper.id();
    // Drive the pool while the helper connects and hands over.
    let held = runtime.block_on(async {
        let handoff = tokio::task::spawn_blocking(move || receive_fd(&handoff));
        tokio::time::timeout(PATIENCE, handoff).await.unwrap().unwrap()
    });
    assert!(helper.wait().unwrap().success());

    let Some(mut bystander) = bystander_with_pid(helper_pid) else {
        return;
    };
    assert!(
        submitted.elapsed() < JOB_TIMEOUT && results.try_recv().is_err(),
        "the job's deadline passed before the pid was recycled; the test proves nothing"
    );
    // The deadline passes: the pool kills the worker running the job.
    let done = runtime.block_on(async {
        tokio::time::timeout(PATIENCE, results.recv())
            .await
            .unwrap()
            .unwrap()
    });
    assert_eq!((done.id, done.status), (1, TIMED_OUT));

    // The kill was sent before the result; give a wrongly killed bystander
    // time to be reaped before looking.
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        assert!(
            bystander.try_wait().unwrap().is_none(),
            "the pool killed pid {helper_pid}, which was no longer its worker"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = bystander.kill();
    let _ = bystander.wait();
    drop(held);
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}
