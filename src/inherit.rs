//! File descriptors a child inherits from the supervisor at fixed numbers.
//! The only unsafe code of the binary: adopting raw fds as owned sockets.

use std::io::{Read, Seek};
use std::os::fd::{FromRawFd, OwnedFd};

use switchyard_proto::process::{GRPC_LISTEN_FD, LISTEN_FD, QUIC_FD, SPEC_FD};

fn owned(fd: i32) -> std::io::Result<OwnedFd> {
    // Refuse a closed fd instead of adopting garbage.
    // SAFETY: the borrow lives only for these two calls on fd flags.
    let probe = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    nix::fcntl::fcntl(probe, nix::fcntl::FcntlArg::F_GETFD).map_err(std::io::Error::from)?;
    // dup2 cleared close-on-exec for our exec; set it again, or every
    // process a plugin starts would inherit the group's sockets.
    nix::fcntl::fcntl(
        probe,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(std::io::Error::from)?;
    // SAFETY: the process that started this one placed a descriptor at `fd`
    // for it alone (the supervisor's pre_exec dup2, or an upgrading
    // supervisor's handover socket), nothing else in this process refers
    // to it, and it is adopted exactly once per process.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A descriptor this process inherited at `fd` (the handover socket of
/// `switchyard upgrade`), close-on-exec from now on.
pub(crate) fn adopt(fd: i32) -> std::io::Result<OwnedFd> {
    if fd <= 2 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a handover descriptor",
        ));
    }
    owned(fd)
}

/// The spec the supervisor wrote into a memfd at [`SPEC_FD`]. The
/// descriptor is closed on return.
pub(crate) fn spec() -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::from(owned(SPEC_FD)?);
    // The supervisor's writes left the shared offset at the end.
    file.rewind()?;
    let mut spec = Vec::new();
    file.read_to_end(&mut spec)?;
    Ok(spec)
}

/// The inherited listening Unix socket (broker, router).
pub(crate) fn unix_listener() -> std::io::Result<tokio::net::UnixListener> {
    let std = std::os::unix::net::UnixListener::from(owned(LISTEN_FD)?);
    std.set_nonblocking(true)?;
    tokio::net::UnixListener::from_std(std)
}

/// The inherited listening TCP socket (listener).
pub(crate) fn tcp_listener() -> std::io::Result<tokio::net::TcpListener> {
    tcp_listener_at(LISTEN_FD)
}

/// The inherited gRPC-only listening socket (listener, `listener.grpc_bind`).
pub(crate) fn grpc_listener() -> std::io::Result<tokio::net::TcpListener> {
    tcp_listener_at(GRPC_LISTEN_FD)
}

/// The inherited UDP socket of HTTP/3 (the listener that serves it).
pub(crate) fn quic_socket() -> std::io::Result<std::net::UdpSocket> {
    let socket = std::net::UdpSocket::from(owned(QUIC_FD)?);
    socket.set_nonblocking(true)?;
    Ok(socket)
}

fn tcp_listener_at(fd: i32) -> std::io::Result<tokio::net::TcpListener> {
    let std = std::net::TcpListener::from(owned(fd)?);
    std.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(std)
}
