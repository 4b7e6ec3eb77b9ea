//! The direct return path (decision 0143): a manager instance answers a
//! listener's request straight into its return link to that listener process
//! instead of back through router and broker.
//!
//! A return link is a [`crate::link`] like any other (shared-memory rings,
//! the socket for descriptors and death), set up once per listener
//! process and manager instance: the instance makes a socket pair, keeps
//! one end and sends the other as an offer ([`offer`]) through router and
//! broker, which pass it on to the pipe it names like a response; the
//! listener takes it ([`accept`]), both sides open the link on it, and the
//! listener tells the instance which of its pipes the link answers for
//! (`Control::ReturnPipes`).
//!
//! Trust: any process that can reach the router can offer a link, so the
//! link proves nothing. What proves an answer is its token: the listener
//! gives every request 64 bits keyed from its correlation with a secret
//! only the listener holds ([`Tokens`]); the forward frame carries them
//! to the one instance the router picked, and an answer on a return link
//! is taken only if it echoes them. An instance therefore answers only the
//! requests it was sent, as the router's own check ensures on the router
//! path.

use std::hash::{BuildHasher, Hasher};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use crate::pipe::StreamHandle;
use crate::{Envelope, Error, EventType, Kind, Origin, Payload, Result};

/// How answers to listeners' requests travel (`group.return_path`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReturnPath {
    /// From the manager straight into its return link to the listener;
    /// the router is told in batches which requests are done.
    #[default]
    Direct,
    /// Back the way the request came: manager → router → broker →
    /// listener.
    Router,
}

static DIRECT: AtomicBool = AtomicBool::new(false);

/// Sets this process's return path (every process of a group uses the
/// same; set once at start by the role's entry).
pub fn set_return_path(path: ReturnPath) {
    DIRECT.store(path == ReturnPath::Direct, Ordering::Relaxed);
}

/// Whether answers go straight back to listeners in this process's group.
pub fn direct() -> bool {
    DIRECT.load(Ordering::Relaxed)
}

/// The event type of a return-link offer: a [`Kind::Control`] frame with
/// this type (every other control frame has [`EventType::CONTROL`]),
/// origin the listener pipe it is for, and the link's socket riding as a
/// two-descriptor payload.
pub const OFFER: EventType = EventType(u64::MAX);

/// Whether `env` is a return-link offer.
pub fn is_offer(env: &Envelope) -> bool {
    env.kind == Kind::Control && env.event_type == OFFER
}

/// A new return link for the listener process of pipe `pipe`: this side's
/// socket, to open the link on ([`crate::link::open`]), and the offer frame
/// that carries the other end to the listener. `instance` names the
/// offering instance among the links its process offers (its
/// `correlation`): a listener keeps one link per process and instance.
pub fn offer(pipe: u64, instance: u64) -> Result<(tokio::net::UnixStream, Envelope)> {
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    ours.set_nonblocking(true)?;
    let ours = tokio::net::UnixStream::from_std(ours)?;
    let theirs = OwnedFd::from(theirs);
    // A payload of two descriptors is what every hop already passes on
    // unread (a stream's); the second is a duplicate the listener closes.
    let twin = theirs.try_clone()?;
    let mut env = Envelope::request(OFFER, instance, Default::default());
    env.kind = Kind::Control;
    env.origin = Origin::Pipe(pipe);
    env.payload = Payload::Stream(StreamHandle::from_parts(theirs, twin, None));
    Ok((ours, env))
}

/// The socket of a return-link offer, checked to be a connected Unix
/// socket (the offer may come from any process that can reach the router),
/// with the instance number the offer names.
pub fn accept(env: Envelope) -> Result<(tokio::net::UnixStream, u64)> {
    let instance = env.correlation;
    let Payload::Stream(handle) = env.payload else {
        return Err(Error::Malformed("a return-link offer without its socket"));
    };
    let (socket, twin, _) = handle.into_parts()?;
    drop(twin);
    let socket = std::os::unix::net::UnixStream::from(socket);
    socket.peer_addr().map_err(|_| {
        Error::Malformed("a return-link offer whose descriptor is not a connected Unix socket")
    })?;
    socket.set_nonblocking(true)?;
    Ok((tokio::net::UnixStream::from_std(socket)?, instance))
}

/// A random number naming this process's instance in its offers.
pub fn instance_number() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

/// The listener's keyed token function: SipHash with keys drawn from the
/// operating system once per process (std's `RandomState`), over the
/// correlation id. A token is unguessable without the keys and says
/// nothing about the keys or about other correlations' tokens, so an
/// instance that sees the tokens of its own requests learns none of
/// anyone else's; nothing is stored per request, as the token is
/// computed again to check an answer.
#[derive(Clone, Debug, Default)]
pub struct Tokens(std::collections::hash_map::RandomState);

impl Tokens {
    /// Fresh keys.
    pub fn new() -> Tokens {
        Tokens::default()
    }

    /// The token of request `correlation`; never 0 (0 means none).
    pub fn token(&self, correlation: u64) -> u64 {
        let mut h = self.0.build_hasher();
        h.write_u64(correlation);
        h.finish().max(1)
    }

    /// Whether `answer` echoes its request's token.
    pub fn check(&self, answer: &Envelope) -> bool {
        answer.token == self.token(answer.correlation)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_keyed_per_process_and_checked() {
        let (a, b) = (Tokens::new(), Tokens::new());
        assert_ne!(a.token(7), a.token(8));
        // Other keys, other tokens: one listener's tokens say nothing of
        // another's.
        assert_ne!(a.token(7), b.token(7));
        let mut request = Envelope::request(EventType::of("demo.Noop"), 7, Default::default());
        request.token = a.token(7);
        let answer = Envelope::response_to(&request, 200, Default::default(), Default::default());
        assert!(a.check(&answer));
        assert!(!b.check(&answer));
        let mut forged = answer.clone();
        forged.correlation = 8;
        assert!(!a.check(&forged), "a token is good for its own correlation only");
    }

    #[tokio::test]
    async fn an_offer_carries_a_working_socket_through_a_frame() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (mut ours, env) = offer(3, 9).unwrap();
        assert!(is_offer(&env));
        assert_eq!(env.origin, Origin::Pipe(3));
        let (mut theirs, instance) = accept(env).unwrap();
        assert_eq!(instance, 9);
        ours.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 2];
        theirs.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"hi");
        // Only the listener's copy is left: closing ours ends theirs.
        drop(ours);
        assert_eq!(theirs.read(&mut buf).await.unwrap(), 0);
    }
}
