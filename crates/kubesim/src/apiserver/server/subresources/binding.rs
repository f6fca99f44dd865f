//! `pods/{name}/binding`: the scheduler's placement of a pod on a node.

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::request::read_object;
use crate::apiserver::server::response::json_response;

/// `pods/{name}/binding`: the scheduler's placement of a pod on a node.
pub(super) async fn binding(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    if call.method != Method::POST {
        return Err(call.not_supported(&at.res.def, "binding"));
    }
    let Named { res, ns, name } = at;
    let binding = read_object(req).await?;
    let node = binding["target"]["name"].as_str().unwrap_or("").to_string();
    if node.is_empty() {
        return Err(ApiError::invalid(
            "Binding",
            name,
            vec![("target.name".into(), "Required value".into())],
        ));
    }
    res.modify(ns, name, &call.write(false), |current| {
        if current["spec"]["nodeName"]
            .as_str()
            .is_some_and(|n| !n.is_empty())
        {
            return Err(ApiError::conflict("", "pods", name));
        }
        let mut next = current.clone();
        next["spec"]["nodeName"] = json!(node);
        Ok(next)
    })?;
    // As kube-apiserver's binding does: the pod is now scheduled.
    res.modify(ns, name, &call.write(true), |current| {
        let mut next = current.clone();
        if !next["status"].is_object() {
            next["status"] = json!({});
        }
        let mut conditions: Vec<Value> = next["status"]["conditions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        conditions.retain(|c| c["type"] != "PodScheduled");
        conditions.push(json!({"type": "PodScheduled", "status": "True",
            "lastTransitionTime": crate::apiserver::store::now()}));
        next["status"]["conditions"] = json!(conditions);
        Ok(next)
    })?;
    Ok(json_response(
        StatusCode::CREATED,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
    ))
}
