//! What a group's API looks like to a client: each event type's fields as
//! a JSON Schema, its reply, and where its parameters come from.
//!
//! A plugin describes its types when the validation child creates it
//! ([`TypeDoc`] in the manager's description, across the plugin ABI); the
//! supervisor gathers them into a [`Catalog`] and hands it to the
//! listeners, which serve it as `/openapi.json`, `/docs` and typed gRPC
//! services. None of it travels with a request.

use serde::{Deserialize, Serialize};

use crate::control::HandledType;

/// How a type is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TypeRole {
    /// A request answered by one handler.
    Request,
    /// A request whose body a handler reads as a stream.
    Upload,
    /// A notification some manager subscribes to or declares it emits.
    Notification,
    /// A request whose body is a `multipart/form-data` form a handler reads
    /// part by part; the type's fields are the form's leading text fields.
    Form,
}

/// One event type, described.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TypeDoc {
    /// The type's name (`demo.Hello`).
    pub name: String,
    pub role: TypeRole,
    /// The type's doc comment.
    pub description: String,
    /// The JSON Schema (2020-12) of the fields a client sets, as JSON text
    /// (bincode cannot carry a `serde_json::Value`); its definitions are
    /// under its own `$defs`.
    pub schema: String,
    /// The request body is the whole event (`#[event(body)]`), not an
    /// object of its fields.
    pub whole_body: bool,
    /// Fields taken from a header or a cookie (`#[from(...)]`).
    pub params: Vec<BoundParam>,
    /// What a handler answers (requests only; `None`: not described).
    pub reply: Option<ReplyDoc>,
}

/// A field bound to a header or a cookie.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundParam {
    /// `header` or `cookie`.
    pub location: String,
    /// The header's (lowercase) or cookie's name.
    pub name: String,
    /// Absent is an error (the field is not an `Option`).
    pub required: bool,
}

/// A handler's successful reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplyDoc {
    /// Its HTTP status (204: no body).
    pub status: u16,
    /// `application/json` unless the reply says otherwise.
    pub content_type: String,
    /// The reply type's doc comment.
    pub description: String,
    /// The JSON Schema of its body as JSON text; empty when not described.
    pub schema: String,
}

/// One configured manager's declarations.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerDoc {
    /// The configured name.
    pub name: String,
    /// The manager type (`Manager::NAME`).
    pub kind: String,
    /// Its request types and their routes, as the router learns them.
    pub handles: Vec<HandledType>,
    /// Every type it handles, subscribes to or emits.
    pub types: Vec<TypeDoc>,
}

/// The API of a whole group, in the order of its configured managers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub managers: Vec<ManagerDoc>,
}

impl Catalog {
    /// The description of type `name`: a request's from the manager that
    /// handles it, else the first found.
    pub fn find(&self, name: &str) -> Option<&TypeDoc> {
        let all = || {
            self.managers
                .iter()
                .flat_map(|m| m.types.iter())
                .filter(|t| t.name == name)
        };
        all()
            .find(|t| t.role != TypeRole::Notification)
            .or_else(|| all().next())
    }
}
