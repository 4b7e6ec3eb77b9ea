//! A pooled body its consumer cannot afford to read (the shared-memory
//! budget takes neither its mapping nor its copy) is refused, and its
//! segment is freed for the producer all the same: left busy, it held the
//! producer's budget for the whole lease, and every large answer after it
//! was refused that long.
//!
//! The budget is per process and this file's one test changes it: it runs
//! in a process of its own under nextest and `cargo test` alike.

use std::time::Duration;

use switchyard_proto::ShmBody;
use switchyard_proto::pool::{MAX_POOLED_BODY, SegmentPool};
use switchyard_proto::shm::{in_use, set_budget};

const LEASE: Duration = Duration::from_secs(60);
/// The header page in front of every segment's body.
const PAGE: u64 = 4096;

/// `body` placed by `pool`, as the consumer receives it (the producer's
/// handle is gone: it was sent).
fn received(pool: &mut SegmentPool, body: &[u8], once: bool) -> ShmBody {
    let sent = if once {
        pool.place_once(body).unwrap()
    } else {
        pool.place(body).unwrap().unwrap()
    };
    let received = ShmBody::adopt_pooled(sent.fd_clone().unwrap(), body.len() as u64).unwrap();
    drop(sent);
    received
}

#[test]
fn a_body_its_consumer_cannot_afford_frees_its_segment() {
    let mut pool = SegmentPool::new(4 << 20, LEASE);
    let body = vec![7u8; 100_000];
    let room = (body.len() as u64).next_power_of_two();

    // No room to map the segment.
    let refused = received(&mut pool, &body, false);
    set_budget(in_use());
    refused.map().unwrap_err();
    assert_eq!(pool.counts(), (1, 1), "the refused body's segment is free again");

    // Room to map it, none to copy the body out.
    let refused = received(&mut pool, &body, false);
    set_budget(in_use() + PAGE + room);
    refused.map().unwrap_err();
    assert_eq!(pool.counts(), (1, 1));

    // A one-body segment (too large for the pool): released at the next
    // call on the pool, as a body read is.
    set_budget(u64::MAX);
    let large = vec![8u8; MAX_POOLED_BODY + 1];
    let refused = received(&mut pool, &large, true);
    set_budget(in_use() + PAGE + (large.len() as u64).next_multiple_of(PAGE));
    refused.map().unwrap_err();
    set_budget(u64::MAX);
    pool.trim(LEASE);
    assert_eq!(pool.once_count(), 0, "the refused one-body segment is released");

    // With room again, the same segment carries the next body.
    let next = received(&mut pool, &body, false);
    assert_eq!(next.map().unwrap(), body);
    assert_eq!(pool.counts(), (1, 1));
}
