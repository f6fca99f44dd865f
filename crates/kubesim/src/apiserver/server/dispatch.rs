//! Which handler answers a routed request: discovery, a verb on a collection, a verb on an
//! object, or one of its subresources.

use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;

use super::admit::Write;
use super::call::{Call, Named};
use super::discovery;
use super::routing::Target;
use super::subresources::SUBRESOURCES;
use super::verbs::{create, delete, get, update, watch};
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::view::Resource;

/// Answer a routed request.
pub(super) async fn dispatch(
    target: ApiResult<Target>,
    call: Call,
    req: Request,
) -> ApiResult<Response> {
    match target? {
        Target::Discovery(doc) => discovery::answer(&call.store, doc),
        Target::Collection { def, ns } => collection(&call, &call.resource(def)?, ns, req).await,
        Target::Item { def, ns, name, sub } => {
            let at = Named {
                res: call.resource(def)?,
                ns,
                name,
            };
            item(&call, &at, sub.as_deref(), req).await
        }
    }
}

/// A collection: list, watch, create, delete the matching.
async fn collection(
    call: &Call,
    res: &Resource,
    ns: Option<String>,
    req: Request,
) -> ApiResult<Response> {
    match call.method {
        Method::GET if call.q.flag("watch") => watch::watch(call, res.clone(), ns),
        Method::GET => get::list(call, res, ns),
        Method::POST => create::post(call, res, ns, req).await,
        Method::DELETE => delete::delete_collection(call, res, ns),
        _ => Err(ApiError::method_not_allowed(format!(
            "{} is not supported on {}",
            call.method, res.def.plural
        ))),
    }
}

/// One object: get, replace, patch, delete, and its subresources.
async fn item(call: &Call, at: &Named, sub: Option<&str>, req: Request) -> ApiResult<Response> {
    let def = &at.res.def;
    if def.create_only {
        return Err(ApiError::method_not_allowed(format!(
            "{} only supports create",
            def.plural
        )));
    }
    if let Some(sub) = sub {
        // A subresource the kind does not serve is not there at all, as kube answers it
        // (a GET of csidrivers/rancher.io/local-path is a 404, not a refused method).
        let found = SUBRESOURCES
            .iter()
            .find(|s| s.name == sub && (s.served)(def))
            .ok_or_else(ApiError::path_not_found)?;
        return (found.handle)(call, at, req).await;
    }
    match call.method {
        Method::GET => get::get(call, at),
        Method::PUT => update::update(call, at, Write::Update, req).await,
        Method::PATCH => update::patch(call, at, Write::Update, req).await,
        Method::DELETE => delete::delete(call, at, req).await,
        _ => Err(call.not_supported(def, "")),
    }
}
