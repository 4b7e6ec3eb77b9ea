//! The wire every Switchyard process speaks: the event envelope, its bincode
//! codec, and the framed, batched transport over Unix stream sockets.
//!
//! Every hop of the data path (listener → broker → router → manager and back)
//! moves [`Envelope`]s as length-prefixed frames. This crate owns their
//! format, their limits and the I/O loops that move them; it does not know
//! what any role does with an event. The supervisor's own channel to each
//! child (phases and commands) lives here too, so that every process speaks
//! one vocabulary.
//!
//! # Layout
//! - [`codec`]: the only module that calls bincode; every decode is bounded.
//! - [`event`]: the envelope: type id, kind, correlation, origin, deadline,
//!   meta headers, payload (inline or shared-memory handle).
//! - [`frame`]: bytes ↔ frames (two-phase: `check` then `parse`).
//! - [`transport`]: the batched frame writer, the frame reader, peer checks.
//! - [`control`]: control messages between group processes (hello, route
//!   table, registration).
//! - [`supervision`]: the child ↔ supervisor control channel.
//! - [`shm`]: sealed memfd bodies whose descriptors travel with frames.
//! - [`problem`]: `application/problem+json` bodies for synthesized errors.
//! - [`process`]: what every child process shares: logging, runtime paths.

pub mod codec;
pub mod control;
pub mod event;
pub mod frame;
pub mod problem;
pub mod process;
pub mod shm;
pub mod supervision;
pub mod transport;

mod error;
mod fdpass;

pub use error::{Error, Result};
pub use event::{Deadline, Envelope, EventType, Kind, Meta, Origin, Payload};
pub use frame::DEFAULT_MAX_FRAME;
pub use shm::ShmBody;
