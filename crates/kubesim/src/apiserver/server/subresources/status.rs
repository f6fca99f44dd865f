//! `{object}/status`: read as the object; written, only its status changes.

use axum::extract::Request;
use axum::http::Method;
use axum::response::Response;

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::server::admit::Write;
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::verbs::{get, update};

/// `{object}/status`: the object as a GET reads it; writes change only its status.
pub(super) async fn status(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    match call.method {
        Method::GET => get::get(call, at),
        Method::PUT if !at.res.def.has_status() => Err(ApiError::path_not_found()),
        Method::PUT => update::update(call, at, Write::Status, req).await,
        Method::PATCH => update::patch(call, at, Write::Status, req).await,
        _ => Err(call.not_supported(&at.res.def, "status")),
    }
}
