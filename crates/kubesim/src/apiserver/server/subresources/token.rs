//! `serviceaccounts/{name}/token`: a TokenRequest, as `kubectl create token` and the kubelet ask
//! for one.

use axum::extract::Request;
use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::request::read_object;
use crate::apiserver::server::response::json_response;

/// A TokenRequest (`serviceaccounts/token`, as `kubectl create token` and the kubelet ask it):
/// a signed token of the ServiceAccount for the audiences asked, bound to a pod if asked.
pub(super) async fn token_request(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    if call.method != Method::POST {
        return Err(call.not_supported(&at.res.def, "token"));
    }
    let Named { res, ns, name } = at;
    let mut request = read_object(req).await?;
    let account = res.get(ns, name)?;
    let spec = &request["spec"];
    let invalid = |field: &str, value: &str, message: &str| {
        ApiError::invalid(
            "TokenRequest.authentication.k8s.io",
            name,
            vec![(field.into(), format!("Invalid value: {value}: {message}"))],
        )
    };
    let seconds = match &spec["expirationSeconds"] {
        Value::Null => crate::apiserver::auth::DEFAULT_TOKEN_SECONDS,
        v => v.as_i64().ok_or_else(|| {
            invalid(
                "spec.expirationSeconds",
                &v.to_string(),
                "must be an integer",
            )
        })?,
    };
    if seconds < crate::apiserver::auth::MIN_TOKEN_SECONDS {
        return Err(invalid(
            "spec.expirationSeconds",
            &seconds.to_string(),
            "may not specify a duration less than 10 minutes",
        ));
    }
    if seconds > 1 << 32 {
        return Err(invalid(
            "spec.expirationSeconds",
            &seconds.to_string(),
            "may not specify a duration larger than 2^32 seconds",
        ));
    }
    let mut audiences: Vec<String> = spec["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    if audiences.is_empty() {
        audiences.push(crate::apiserver::auth::AUDIENCE.into());
    }
    let bound = &spec["boundObjectRef"];
    let pod = match bound["kind"].as_str() {
        None => None,
        Some("Pod") => {
            let pod_name = bound["name"].as_str().unwrap_or("");
            let def = call
                .store
                .registry()
                .get("", "v1", "pods")
                .cloned()
                .ok_or_else(ApiError::path_not_found)?;
            let pod = call.store.get(&def, ns, pod_name)?;
            let uid = pod["metadata"]["uid"].as_str().unwrap_or("").to_string();
            if let Some(asked) = bound["uid"].as_str().filter(|u| !u.is_empty())
                && asked != uid
            {
                return Err(ApiError {
                    message: format!(
                        "Operation cannot be fulfilled on Pod {pod_name:?}: the UID in the bound object reference ({asked}) does not match the UID in record. The object might have been deleted and then recreated"
                    ),
                    ..ApiError::conflict("", "pods", pod_name)
                });
            }
            let runs_as = pod["spec"]["serviceAccountName"]
                .as_str()
                .filter(|s| !s.is_empty())
                .unwrap_or(crate::apiserver::store::DEFAULT_SERVICE_ACCOUNT);
            if runs_as != name {
                return Err(ApiError::bad_request(format!(
                    "cannot bind token for serviceaccount {name:?} to pod running with different serviceaccount name."
                )));
            }
            Some((pod_name.to_string(), uid))
        }
        Some(kind) => {
            return Err(ApiError::bad_request(format!(
                "cannot bind token to object of type {kind}"
            )));
        }
    };
    let (token, expires) = call.auth.mint(&crate::apiserver::auth::TokenFor {
        namespace: ns.clone(),
        service_account: (
            name.clone(),
            account["metadata"]["uid"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        ),
        pod,
        audiences: audiences.clone(),
        seconds,
    });
    request["apiVersion"] = json!("authentication.k8s.io/v1");
    request["kind"] = json!("TokenRequest");
    request["metadata"]["name"] = json!(name);
    request["metadata"]["namespace"] = json!(ns);
    request["spec"]["audiences"] = json!(audiences);
    request["spec"]["expirationSeconds"] = json!(seconds);
    request["status"] = json!({
        "token": token,
        "expirationTimestamp": jiff::Timestamp::from_second(expires)
            .map(|t| t.to_string())
            .unwrap_or_default(),
    });
    Ok(json_response(StatusCode::CREATED, &request))
}
