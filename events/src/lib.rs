//! The event vocabulary a client and a manager share, below both: an event
//! type's name on the wire ([`EventName`]), the reply it declares
//! ([`DeclaredReply`]), and the whole protocol of the built-in Store
//! ([`store`]) and Scheduler ([`scheduler`]) as plain serde types.
//!
//! The manager SDK (`switchyard-manager`) re-exports all of it and makes
//! these types events a handler can receive and call; the built-in managers
//! (`switchyard-builtin`) serve them; `switchyard-client` sends them as
//! JSON. A client therefore links this crate and serde, not the plugin SDK
//! (decision 0144). Field names are the wire: JSON for clients, bincode
//! between managers.
//!
//! # Layout
//! - this file: [`EventName`], [`DeclaredReply`], [`JsonError`].
//! - `json`: [`JsonText`](store::JsonText), the Store's JSON values.
//! - [`store`]: the Store's events and answers.
//! - [`scheduler`]: the Scheduler's events and answers, and
//!   [`Job`](scheduler::Job), which builds a `Schedule`.

#![forbid(unsafe_code)]

mod json;
pub mod scheduler;
pub mod store;

/// An event type's stable name, e.g. `shop.Checkout`: what a client sends
/// it as and what it is routed by. `#[derive(Event)]` implements it with
/// the SDK's `Event` (whose `NAME` is the same string).
pub trait EventName {
    /// The type's name on the wire.
    const EVENT_NAME: &'static str;
}

/// The one reply an event declares with `#[event(reply = R)]`, by name:
/// what a typed client (`switchyard_client::Call`) decodes its answer as.
/// Implemented by the derive; an event that names no reply has none.
pub trait DeclaredReply: EventName {
    /// The reply its handler returns.
    type Reply;
}

/// Why a value is not the JSON it should be. In a handler, `?` turns it
/// into the SDK's `Error` with the status given with each variant.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    /// The value does not serialize as JSON (a 500: the program's bug).
    #[error("cannot encode the value as JSON: {0}")]
    Encode(serde_json::Error),
    /// The text is not one JSON document (a 422: the sender's).
    #[error("not a JSON document: {0}")]
    NotJson(serde_json::Error),
    /// A stored value does not fit the type asked for (a 500: the
    /// program's idea of the key and the stored data disagree).
    #[error("the stored value of `{key}` is not a `{type_name}`: {source}")]
    Mismatch {
        key: String,
        type_name: &'static str,
        source: serde_json::Error,
    },
}

/// Names each built-in event type (the events name themselves here, once,
/// and the SDK's `Event` reads the name from [`EventName`]).
macro_rules! event_names {
    ($($ty:ty => $name:literal),* $(,)?) => {
        $(impl $crate::EventName for $ty {
            const EVENT_NAME: &'static str = $name;
        })*
    };
}
pub(crate) use event_names;
