//! HTTP/3's UDP port, shared by the listener processes without misrouting
//! a connection's packets (docs/decisions/0076-quic-steered-by-connection-id.md).
//!
//! One `SO_REUSEPORT` socket per listener process, all bound here, in
//! order, and kept for the group's life, so each keeps its index in the
//! kernel's reuseport group across listener restarts. A classic BPF
//! program on the group picks the socket of every datagram from the first
//! byte of its destination connection id, modulo the number of sockets;
//! each listener issues connection ids whose first byte is its own index
//! modulo that number (`switchyard_listener::quic`), so every packet of a
//! connection (after the client's first flight, whose random id only
//! decides which process takes the connection) reaches the process that
//! holds it, whatever the client's address does. The unsafe
//! `setsockopt` that attaches the program is the module's only unsafe code.

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, SockFlag, SockType, SockaddrIn, SockaddrIn6, bind, setsockopt, socket, sockopt,
};

/// Largest number of listener processes sharing the port: the index must
/// fit a connection id's first byte with room for randomness beside it.
pub(crate) const MAX_PROCESSES: u32 = 64;

/// `count` sockets on `at` (its port 0: one the kernel picks, shared by
/// all), steered by connection id when there is more than one.
pub(crate) fn bind_steered(at: SocketAddr, count: u32) -> anyhow::Result<Vec<UdpSocket>> {
    anyhow::ensure!(
        (1..=MAX_PROCESSES).contains(&count),
        "listener.workers: at most {MAX_PROCESSES} with [listener.http3]"
    );
    let mut sockets = Vec::with_capacity(count as usize);
    let mut at = at;
    for _ in 0..count {
        let family = if at.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let fd: OwnedFd = socket(family, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)?;
        if count > 1 {
            setsockopt(&fd, sockopt::ReusePort, &true)?;
        }
        let bound = match at {
            SocketAddr::V4(v4) => bind(fd.as_raw_fd(), &SockaddrIn::from(v4)),
            SocketAddr::V6(v6) => bind(fd.as_raw_fd(), &SockaddrIn6::from(v6)),
        };
        bound.map_err(|e| anyhow::anyhow!("cannot listen for HTTP/3 on udp {at}: {e}"))?;
        let socket = UdpSocket::from(fd);
        // Port 0: the others join the port the first one got.
        at = socket.local_addr()?;
        sockets.push(socket);
    }
    if count > 1 {
        attach_steering(&sockets[0], count)?;
    }
    Ok(sockets)
}

/// The program: A = first byte; long header (bit 0x80): the destination
/// connection id's first byte is at offset 6 (flags, version, id length),
/// short header: at offset 1; return A % count, the socket's index. A
/// datagram too short for the load makes the program return 0.
fn program(count: u32) -> [libc::sock_filter; 7] {
    const LDB_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
    const JA: u16 = 0x05; // BPF_JMP | BPF_JA
    const MOD_K: u16 = 0x94; // BPF_ALU | BPF_MOD | BPF_K
    const RET_A: u16 = 0x16; // BPF_RET | BPF_A
    let op = |code, jt, jf, k| libc::sock_filter { code, jt, jf, k };
    [
        op(LDB_ABS, 0, 0, 0),
        op(JSET_K, 0, 2, 0x80),
        op(LDB_ABS, 0, 0, 6),
        op(JA, 0, 0, 1),
        op(LDB_ABS, 0, 0, 1),
        op(MOD_K, 0, 0, count),
        op(RET_A, 0, 0, 0),
    ]
}

fn attach_steering(socket: &UdpSocket, count: u32) -> anyhow::Result<()> {
    let mut filter = program(count);
    let prog = libc::sock_fprog {
        len: filter.len() as u16,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `filter`, which outlives the call; the
    // kernel copies the program during it. The length is the array's.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            (&raw const prog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        anyhow::bail!(
            "cannot steer HTTP/3 packets between the listener processes (SO_ATTACH_REUSEPORT_CBPF): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
