//! Who sent a request, once built-in authentication has said so.
//!
//! The authentication middleware puts an [`Identity`] into the request's
//! extensions (`http::Request::extensions_mut`) when a credential checks
//! out; everything after it (authorization rules, the event's scope fields,
//! `Context::identity` in handlers) reads it from there. No identity in the
//! extensions means an anonymous request.

use std::sync::Arc;

use serde_json::{Map, Value};

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    /// The caller's id: a JWT's `sub`, an API key's name, a Basic user name.
    pub subject: String,
    /// Everything known about the caller, as the handler's scope sees it: a
    /// JWT's claims, or for other methods at least `sub` and `roles`.
    /// Shared: a cached token's claims are not copied per request.
    pub claims: Arc<Map<String, Value>>,
    /// How the caller proved who they are.
    pub method: AuthMethod,
}

/// The credential an [`Identity`] came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuthMethod {
    Jwt,
    ApiKey,
    Basic,
}
