//! The subresources served (`status`, `binding`, `scale`, `log`, `token`), one a file, and the
//! table of which kinds serve which.

mod binding;
mod log;
mod scale;
mod status;
mod token;

use axum::extract::Request;
use axum::response::Response;
use futures::future::BoxFuture;

use super::call::{Call, Named};
use crate::apiserver::errors::ApiResult;
use crate::apiserver::registry::ResourceDef;

/// A subresource's handler, for every method on `{object}/{name}`.
type SubresourceHandler =
    for<'a> fn(&'a Call, &'a Named, Request) -> BoxFuture<'a, ApiResult<Response>>;

/// A subresource the server serves: for which kinds, and its handler.
pub(super) struct Subresource {
    pub(super) name: &'static str,
    pub(super) served: fn(&ResourceDef) -> bool,
    pub(super) handle: SubresourceHandler,
}

/// Whether the kind declares the subresource (`scale`, `token`…).
fn declares(def: &ResourceDef, sub: &str) -> bool {
    def.subresources.iter().any(|s| s == sub)
}

/// Every subresource served. A name not here, or not served for the kind, is a 404.
pub(super) const SUBRESOURCES: &[Subresource] = &[
    Subresource {
        name: "status",
        // Read and patched through on every kind, as this server always has; only a PUT
        // requires the kind to declare it (see `status`).
        served: |_| true,
        handle: |call, at, req| Box::pin(status::status(call, at, req)),
    },
    Subresource {
        name: "binding",
        served: |def| declares(def, "binding"),
        handle: |call, at, req| Box::pin(binding::binding(call, at, req)),
    },
    Subresource {
        name: "scale",
        served: |def| declares(def, "scale"),
        handle: |call, at, req| Box::pin(scale::scale(call, at, req)),
    },
    Subresource {
        name: "log",
        served: |def| def.group.is_empty() && def.plural == "pods",
        handle: |call, at, req| Box::pin(log::pod_log(call, at, req)),
    },
    Subresource {
        name: "token",
        served: |def| declares(def, "token"),
        handle: |call, at, req| Box::pin(token::token_request(call, at, req)),
    },
];
