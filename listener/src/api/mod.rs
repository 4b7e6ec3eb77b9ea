//! The group's API described for clients: `GET /openapi.json` (OpenAPI
//! 3.1) and `GET /docs` (an HTML page), from the [`Catalog`] the
//! supervisor gathered from the plugins (docs/api.md, decision 0060).
//! Each document is rendered once per configuration generation, on its
//! first request; nothing here runs for other requests.

mod docs;
mod openapi;
pub mod proto;

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::{Either, Full};
use switchyard_proto::api::{Catalog, TypeRole};
use switchyard_proto::control::HandledType;

use crate::reply::{Reply, error};
use switchyard_middleware::config::{AuthConfig, exposed};

pub use openapi::document as openapi_document;

/// 405 with `Allow` for a method other than `GET` or `HEAD` on one of the
/// listener's own read-only routes (these, `/health`, `/ready`): what
/// their description promises.
pub(crate) fn only_get_and_head(method: &Method) -> Option<Reply> {
    if method == Method::GET || method == Method::HEAD {
        return None;
    }
    let mut reply = error(StatusCode::METHOD_NOT_ALLOWED, "only GET and HEAD");
    reply
        .headers_mut()
        .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
    Some(reply)
}

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
    pub(crate) fn serves(&self, path: &str) -> bool {
        (path == "/openapi.json" && self.openapi) || (path == "/docs" && self.docs)
    }

    /// The answer to a request for `path` (one [`Self::serves`]).
    pub(crate) fn answer(&self, method: &Method, path: &str, auth: &AuthConfig) -> Reply {
        if let Some(refused) = only_get_and_head(method) {
            return refused;
        }
        let rendered = self.rendered.get_or_init(|| {
            let catalog = for_clients(&self.catalog, &auth.expose);
            Rendered {
                openapi: Bytes::from(
                    serde_json::to_vec_pretty(&openapi::document(&catalog, self, auth)).unwrap_or_default(),
                ),
                docs: Bytes::from(docs::page(&catalog, self)),
            }
        });
        let (body, content_type) = if path == "/docs" {
            (rendered.docs.clone(), "text/html; charset=utf-8")
        } else {
            (rendered.openapi.clone(), "application/json")
        };
        let sent = if method == Method::HEAD {
            Bytes::new()
        } else {
            body.clone()
        };
        let mut reply = Reply::new(Either::Left(Full::new(sent)));
        let headers = reply.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        if method == Method::HEAD {
            headers.insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        }
        reply
    }
}
