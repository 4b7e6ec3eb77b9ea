//! A raw peer attaching descriptors where no frame claims them (decision
//! 0032): the reader refuses the connection instead of keeping them or
//! handing them to a later frame.
//!
//! The tests count this process's open descriptors: nextest runs each in a
//! process of its own (`cargo test` would need `--test-threads 1`).

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use bytes::Bytes;
use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
use switchyard_proto::frame::{self, DEFAULT_MAX_FRAME};
use switchyard_proto::transport::FrameReader;
use switchyard_proto::{Envelope, EventType, Payload, ShmBody};
use tokio::net::UnixStream;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// A sealed body's descriptor, and the body.
fn memfd(fill: u8) -> (OwnedFd, ShmBody) {
    let body = ShmBody::create(&vec![fill; 70_000]).unwrap();
    (body.fd_clone().unwrap(), body)
}

fn inline_frame(correlation: u64) -> Vec<u8> {
    let env = Envelope::request(EventType::of("t"), correlation, Bytes::from_static(b"inline"));
    frame::encode(&env, DEFAULT_MAX_FRAME).unwrap().to_vec()
}

fn shm_frame(correlation: u64, body: ShmBody) -> Vec<u8> {
    let mut env = Envelope::request(EventType::of("t"), correlation, Bytes::new());
    env.payload = Payload::Shm(body);
    frame::encode(&env, DEFAULT_MAX_FRAME).unwrap().to_vec()
}

fn send(socket: RawFd, bytes: &[u8], fds: &[RawFd]) {
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsgs };
    let n = sendmsg::<()>(socket, &[IoSlice::new(bytes)], cmsgs, MsgFlags::empty(), None).unwrap();
    assert_eq!(n, bytes.len());
}

/// Reads until the reader errs or the stream ends; every frame it gave.
async fn read_all(reader: &mut FrameReader<UnixStream>) -> (Vec<Envelope>, bool) {
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(10), reader.read_batch(&mut got)).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => return (got, false),
            Ok(Err(_)) => return (got, true),
            Err(_) => panic!("the reader neither answered nor failed"),
        }
    }
}

/// Descriptors attached to a frame that carries none used to wait in the
/// queue and be claimed by the next shared-memory frame: that frame's
/// body was the stray descriptor's bytes.
#[tokio::test]
async fn stray_descriptors_never_shift_onto_a_later_frame() {
    let baseline = open_fds();
    let (peer, ours) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let mut reader = FrameReader::new(UnixStream::from_std(ours).unwrap(), DEFAULT_MAX_FRAME);

    let (stray_a, _a) = memfd(b'a');
    let (stray_b, _b) = memfd(b'b');
    let (fd, body) = memfd(b'x');
    send(
        peer.as_raw_fd(),
        &inline_frame(1),
        &[stray_a.as_raw_fd(), stray_b.as_raw_fd()],
    );
    send(peer.as_raw_fd(), &shm_frame(2, body), &[fd.as_raw_fd()]);
    drop(peer);
    drop((stray_a, stray_b, fd, _a, _b));

    let (got, failed) = read_all(&mut reader).await;
    for env in &got {
        if let Payload::Shm(body) = &env.payload {
            let bytes = body.clone().map().unwrap();
            assert!(
                bytes.iter().all(|&b| b == b'x'),
                "frame {} got another frame's descriptor",
                env.correlation
            );
        }
    }
    assert!(failed, "the peer's stray descriptors were accepted");
    assert!(
        got.iter().all(|env| env.correlation != 2),
        "no frame after the stray descriptors is delivered"
    );
    drop(got);
    drop(reader);
    assert_eq!(open_fds(), baseline, "every received descriptor is closed");
}

/// A peer that keeps attaching descriptors to the bytes of one frame that
/// never completes used to make the reader hold every one of them.
#[tokio::test]
async fn a_descriptor_flood_closes_the_connection() {
    let baseline = open_fds();
    let (peer, ours) = std::os::unix::net::UnixStream::pair().unwrap();
    ours.set_nonblocking(true).unwrap();
    let mut reader = FrameReader::new(UnixStream::from_std(ours).unwrap(), DEFAULT_MAX_FRAME);
    let (fd, body) = memfd(b'f');
    // A frame announced at 900 000 bytes, then its bytes one at a time,
    // each with 8 descriptors: a reader waiting for the frame to complete
    // would take all of them.
    send(peer.as_raw_fd(), &900_000u32.to_le_bytes(), &[]);
    let sender = std::thread::spawn(move || {
        let fds = [fd.as_raw_fd(); 8];
        let mut sent = 0;
        for _ in 0..64 {
            let cmsgs = [ControlMessage::ScmRights(&fds)];
            match sendmsg::<()>(
                peer.as_raw_fd(),
                &[IoSlice::new(&[0])],
                &cmsgs,
                MsgFlags::empty(),
                None,
            ) {
                Ok(_) => sent += 1,
                Err(_) => break, // the reader closed
            }
        }
        (sent, peer)
    });
    let result = tokio::time::timeout(Duration::from_secs(10), reader.next()).await;
    let (sent, peer) = sender.join().unwrap();
    assert!(
        matches!(result, Ok(Err(_))),
        "the reader kept waiting while the peer sent {} descriptors",
        sent * 8
    );
    drop((reader, peer, body));
    assert_eq!(open_fds(), baseline, "every received descriptor is closed");
}

/// The writer's own batches pass: many shared-memory bodies, more than one
/// `sendmsg` carries, interleaved with inline frames, each body intact.
#[tokio::test]
async fn the_writer_s_batches_pair_every_descriptor_with_its_frame() {
    use switchyard_proto::transport::spawn_writer;
    let (a, b) = UnixStream::pair().unwrap();
    let (sink, writer) = spawn_writer(a, 4096, DEFAULT_MAX_FRAME);
    let mut reader = FrameReader::new(b, DEFAULT_MAX_FRAME);
    let total = 500u64;
    let send = async {
        for i in 0..total {
            let mut env = Envelope::request(EventType::of("t"), i, Bytes::from(vec![i as u8; 100]));
            if i % 4 != 0 {
                env.payload = Payload::Shm(ShmBody::create(&vec![i as u8; 65_536 + i as usize]).unwrap());
            }
            sink.send_wait(env).await.unwrap();
        }
        drop(sink);
    };
    let receive = async {
        let mut got = Vec::new();
        while reader.read_batch(&mut got).await.unwrap() {}
        got
    };
    let ((), got) = tokio::join!(send, receive);
    assert_eq!(got.len(), total as usize);
    for env in got {
        let i = env.correlation;
        let want = if i % 4 == 0 { 100 } else { 65_536 + i as usize };
        let bytes = match env.payload {
            Payload::Shm(body) => body.map().unwrap(),
            Payload::Inline(bytes) => bytes,
            Payload::Stream(_) => unreachable!(),
        };
        assert_eq!(bytes.len(), want, "frame {i}");
        assert!(bytes.iter().all(|&b| b == i as u8), "frame {i}");
    }
    assert_eq!(reader.unclaimed_descriptors(), 0);
    writer.await.unwrap().unwrap();
}
