use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use switchyard_proto::EventType;
use tokio::sync::{mpsc, oneshot};

use crate::{Done, Job, JobOutput, Pool, Refused, Runner};

/// Patience for any wait: a bound against hangs, not a performance limit.
const PATIENCE: Duration = Duration::from_secs(30);

/// Echoes the input reversed; "block" waits for the gate to open.
fn runner(gate: Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>) -> Runner {
    Arc::new(move |_ty: EventType, body: &[u8]| {
        if body == b"block" {
            let _ = gate.lock().unwrap().recv_timeout(PATIENCE);
        }
        let mut out = body.to_vec();
        out.reverse();
        JobOutput {
            status: 200,
            body: Bytes::from(out),
        }
    })
}

fn job(id: u64, body: &'static [u8], timeout: Duration) -> Job {
    Job {
        id,
        job_type: EventType::of("t.Job"),
        body: Bytes::from_static(body),
        timeout,
        tags: Default::default(),
    }
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Done>) -> Done {
    tokio::time::timeout(PATIENCE, rx.recv()).await.unwrap().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thread_pool_runs_jobs_refuses_when_full_and_times_out() {
    let (open, gate) = std::sync::mpsc::channel();
    let (pool, mut rx) = Pool::threads(1, 1, runner(Arc::new(std::sync::Mutex::new(gate))));
    pool.submit(job(1, b"abc", PATIENCE)).unwrap();
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status, &done.body[..]), (1, 200, &b"cba"[..]));

    // One running (blocked), one queued, the third refused. No deadline is
    // short here: a loaded machine must not turn "queued" into "expired".
    pool.submit(job(2, b"block", PATIENCE)).unwrap();
    // Wait until the thread took job 2, so the queue is empty.
    while pool.queued() != 0 {
        tokio::task::yield_now().await;
    }
    pool.submit(job(3, b"xy", PATIENCE)).unwrap();
    assert_eq!(pool.submit(job(4, b"z", PATIENCE)), Err(Refused::Full));
    open.send(()).unwrap();
    assert_eq!(next(&mut rx).await.id, 2);
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status, &done.body[..]), (3, 200, &b"yx"[..]));

    // A deadline that passes while the job waits behind a blocked one.
    pool.submit(job(6, b"block", PATIENCE)).unwrap();
    while pool.queued() != 0 {
        tokio::task::yield_now().await;
    }
    pool.submit(job(7, b"late", Duration::from_millis(1))).unwrap();
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status), (7, 504));
    open.send(()).unwrap();
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status), (6, 200));
    // Job 7 is skipped, not run late: the next result is job 8's.
    pool.submit(job(8, b"q", PATIENCE)).unwrap();
    assert_eq!(next(&mut rx).await.id, 8);

    // An expired queued job frees its place at once, even while the only
    // thread is still busy: the queue takes the next job.
    pool.submit(job(9, b"block", PATIENCE)).unwrap();
    while pool.queued() != 0 {
        tokio::task::yield_now().await;
    }
    pool.submit(job(10, b"late", Duration::from_millis(1))).unwrap();
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status), (10, 504));
    assert_eq!(pool.queued(), 0);
    pool.submit(job(11, b"ok", PATIENCE)).unwrap();
    open.send(()).unwrap();
    assert_eq!(next(&mut rx).await.id, 9);
    assert_eq!(next(&mut rx).await.id, 11);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_pool_dispatches_to_connected_workers_and_fails_a_dead_workers_job() {
    let dir = std::env::temp_dir().join(format!("switchyard-worker-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("w.sock");
    let listener = crate::process::bind(&socket).unwrap();
    let (pool, mut rx) = Pool::processes(listener, 4, 1 << 20).unwrap();

    // Queued before any worker connects: served once one does.
    pool.submit(job(1, b"abc", PATIENCE)).unwrap();
    let (open, gate) = std::sync::mpsc::channel();
    let run = runner(Arc::new(std::sync::Mutex::new(gate)));
    let (ready, is_ready) = oneshot::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let path = socket.clone();
    let worker = tokio::spawn(async move {
        crate::process::serve(&path, 1 << 20, run, ready, async move {
            let _ = stopped.await;
            switchyard_proto::supervision::Stop::Now
        })
        .await
    });
    is_ready.await.unwrap();
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status, &done.body[..]), (1, 200, &b"cba"[..]));

    // A worker that goes away mid-job fails that job.
    pool.submit(job(2, b"block", PATIENCE)).unwrap();
    while pool.queued() != 0 {
        tokio::task::yield_now().await;
    }
    // The worker is blocked in the job on its own runtime thread; stopping
    // it ends its connection once the job returns.
    let _ = stop.send(());
    open.send(()).unwrap();
    let done = next(&mut rx).await;
    assert_eq!(done.id, 2);
    assert!(done.status == 200 || done.status == 502, "{done:?}");
    worker.await.unwrap();
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_thread_job_leaves_the_queue_or_its_result_is_dropped() {
    let (open, gate) = std::sync::mpsc::channel();
    let (pool, mut rx) = Pool::threads(1, 1, runner(Arc::new(std::sync::Mutex::new(gate))));
    pool.submit(job(1, b"block", PATIENCE)).unwrap();
    while pool.queued() != 0 {
        tokio::task::yield_now().await;
    }
    pool.submit(job(2, b"queued", PATIENCE)).unwrap();

    // The queued one leaves at once, and its place with it.
    pool.cancel(2);
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status), (2, crate::CANCELLED.0));
    assert_eq!(pool.queued(), 0);
    pool.submit(job(3, b"next", PATIENCE)).unwrap();

    // The running one runs on; its only Done is the cancel's.
    pool.cancel(1);
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status), (1, crate::CANCELLED.0));
    open.send(()).unwrap();
    assert_eq!(next(&mut rx).await.id, 3, "job 1's own result is dropped");
    // Unknown and finished ids are nothing.
    pool.cancel(1);
    pool.cancel(77);
    pool.submit(job(4, b"z", PATIENCE)).unwrap();
    assert_eq!(next(&mut rx).await.id, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_process_job_leaves_the_queue() {
    let dir = std::env::temp_dir().join(format!("switchyard-worker-cancel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("w.sock");
    let listener = crate::process::bind(&socket).unwrap();
    let (pool, mut rx) = Pool::processes(listener, 4, 1 << 20).unwrap();
    // No worker yet: both wait in the queue.
    pool.submit(job(1, b"abc", PATIENCE)).unwrap();
    pool.submit(job(2, b"def", PATIENCE)).unwrap();
    pool.cancel(1);
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status), (1, crate::CANCELLED.0));
    assert_eq!(pool.queued(), 1);

    let (_open, gate) = std::sync::mpsc::channel();
    let run = runner(Arc::new(std::sync::Mutex::new(gate)));
    let (ready, is_ready) = oneshot::channel();
    let (stop, stopped) = oneshot::channel::<()>();
    let path = socket.clone();
    let worker = tokio::spawn(async move {
        crate::process::serve(&path, 1 << 20, run, ready, async move {
            let _ = stopped.await;
            switchyard_proto::supervision::Stop::Now
        })
        .await
    });
    is_ready.await.unwrap();
    let done = next(&mut rx).await;
    assert_eq!((done.id, done.status, &done.body[..]), (2, 200, &b"fed"[..]));
    let _ = stop.send(());
    worker.await.unwrap();
    drop(pool);
    let _ = std::fs::remove_dir_all(&dir);
}
