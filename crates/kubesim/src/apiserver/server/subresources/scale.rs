//! `{object}/scale`: the autoscaling/v1 Scale of an object with `spec.replicas`, as `kubectl
//! scale` reads and patches it.

use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::patch::{self, PatchKind};
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::request::{body_bytes, read_object};
use crate::apiserver::server::response::json_response;

/// How a write of `scale` makes the next Scale from the current one.
type ScaleChange = dyn Fn(&Value) -> ApiResult<Value> + Send + Sync;

/// The `scale` subresource (autoscaling/v1 Scale) of an object with `spec.replicas`, as
/// `kubectl scale` reads and patches it: `spec.replicas`, and the pods' count and selector.
pub(super) async fn scale(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let as_scale = |obj: &Value| {
        let selector = obj["spec"]["selector"]["matchLabels"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .unwrap_or_default();
        let meta = &obj["metadata"];
        json!({"apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"],
                "resourceVersion": meta["resourceVersion"],
                "creationTimestamp": meta["creationTimestamp"]},
            "spec": {"replicas": obj["spec"]["replicas"].as_i64().unwrap_or(1)},
            "status": {"replicas": obj["status"]["replicas"].as_i64().unwrap_or(0),
                "selector": selector}})
    };
    let next_scale: Box<ScaleChange> = match call.method {
        Method::GET => {
            return Ok(json_response(
                StatusCode::OK,
                &as_scale(&res.get(ns, name)?),
            ));
        }
        Method::PUT => {
            let body = read_object(req).await?;
            Box::new(move |_| Ok(body.clone()))
        }
        Method::PATCH => {
            let ct = req
                .headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .to_string();
            let kind = PatchKind::from_content_type(&ct)?;
            let body = body_bytes(req).await?;
            Box::new(move |current| patch::apply(kind, current, &body))
        }
        _ => return Err(call.not_supported(&res.def, "scale")),
    };
    let def = res.def.clone();
    let updated = res.modify(ns, name, &call.write(false), |current| {
        let wanted = next_scale(&as_scale(current))?;
        let asked_version = wanted["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if call.method == Method::PUT
            && !asked_version.is_empty()
            && Some(asked_version) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError::conflict(&def.group, &def.plural, name));
        }
        let replicas = wanted["spec"]["replicas"].as_i64().unwrap_or(0);
        if replicas < 0 {
            return Err(ApiError::invalid(
                "Scale.autoscaling",
                name,
                vec![(
                    "spec.replicas".into(),
                    format!("Invalid value: {replicas}: must be greater than or equal to 0"),
                )],
            ));
        }
        let mut next = current.clone();
        next["spec"]["replicas"] = json!(replicas);
        Ok(next)
    })?;
    Ok(json_response(StatusCode::OK, &as_scale(&updated)))
}
