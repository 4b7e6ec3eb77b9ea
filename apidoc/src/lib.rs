//! The group's API described for clients: `GET /openapi.json` (OpenAPI
//! 3.1), `GET /docs` (an HTML page) and the `.proto` of the typed gRPC
//! services, all from the [`Catalog`] the supervisor gathered from the
//! plugins (docs/api.md, decisions 0060 and 0064). Off the data path: the
//! listener renders each document once per configuration generation, on
//! its first request, and `switchyard openapi` / `switchyard proto` print
//! them without a running group. Pure functions of the catalog and the
//! `[auth]` settings, so they are tested without sockets.
//!
//! # Layout
//! - `openapi`: the OpenAPI 3.1 document.
//! - `docs`: the HTML page.
//! - [`proto`]: the typed gRPC services' `.proto` files and their
//!   compiled descriptors (the listener's typed services and reflection).

mod docs;
mod openapi;
pub mod proto;

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use switchyard_middleware::config::{AuthConfig, exposed};
use switchyard_proto::api::{Catalog, TypeRole};
use switchyard_proto::control::HandledType;

pub use openapi::document as openapi_document;

/// What clients are told of `catalog`: its internal request types
/// (neither public nor opened by `expose`, decision 0108) left out, as
/// they are from the typed gRPC services and reflection. Notification
/// types stay: they describe what clients may subscribe to.
pub fn for_clients(catalog: &Catalog, expose: &[String]) -> Catalog {
    let open = |h: &HandledType| h.public || exposed(expose, &h.name);
    let mut catalog = catalog.clone();
    for m in &mut catalog.managers {
        let internal: Vec<String> = m
            .handles
            .iter()
            .filter(|h| !open(h))
            .map(|h| h.name.clone())
            .collect();
        m.handles.retain(open);
        m.types
            .retain(|t| t.role == TypeRole::Notification || !internal.contains(&t.name));
    }
    catalog
}

/// `[api]`: the API description endpoints.
#[derive(Clone, Debug)]
pub struct ApiConfig {
    /// Serve `GET /openapi.json`.
    pub openapi: bool,
    /// Serve `GET /docs`.
    pub docs: bool,
    /// The document's `info.title` and the page's heading.
    pub title: String,
    /// The document's `info.version` (the API's version, not Switchyard's).
    pub version: String,
    /// What the group's plugins declared.
    pub catalog: Arc<Catalog>,
    /// The documents, rendered on first use.
    rendered: Arc<OnceLock<Rendered>>,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig::new(
            true,
            true,
            "Switchyard".to_owned(),
            "1.0.0".to_owned(),
            Arc::default(),
        )
    }
}

#[derive(Debug)]
struct Rendered {
    openapi: Bytes,
    docs: Bytes,
}

impl ApiConfig {
    pub fn new(
        openapi: bool,
        docs: bool,
        title: String,
        version: String,
        catalog: Arc<Catalog>,
    ) -> ApiConfig {
        ApiConfig {
            openapi,
            docs,
            title,
            version,
            catalog,
            rendered: Arc::default(),
        }
    }

    /// Whether `path` is one of the endpoints this configuration serves.
    pub fn serves(&self, path: &str) -> bool {
        (path == "/openapi.json" && self.openapi) || (path == "/docs" && self.docs)
    }

    /// The document at `path` (one [`Self::serves`]) and its content
    /// type, rendered on the first call and shared afterwards.
    pub fn document(&self, path: &str, auth: &AuthConfig) -> (Bytes, &'static str) {
        let rendered = self.rendered.get_or_init(|| {
            let catalog = for_clients(&self.catalog, &auth.expose);
            Rendered {
                openapi: Bytes::from(
                    serde_json::to_vec_pretty(&openapi::document(&catalog, self, auth)).unwrap_or_default(),
                ),
                docs: Bytes::from(docs::page(&catalog, self)),
            }
        });
        if path == "/docs" {
            (rendered.docs.clone(), "text/html; charset=utf-8")
        } else {
            (rendered.openapi.clone(), "application/json")
        }
    }
}
