//! Deleting: an object (propagation, preconditions, grace period, the validating webhooks), and
//! the matching objects of a collection.

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::controllers::{
    aggregate_cluster_roles, ensure_default_service_account, ensure_root_ca, is_cluster_role,
};
use crate::apiserver::server::request::body_bytes;
use crate::apiserver::server::response::json_response;
use crate::apiserver::server::verbs::get::list_options;
use crate::apiserver::store::{DeleteOptions, Propagation};
use crate::apiserver::view::Resource;

/// A DELETE of an object, with the options in its query or body.
pub(crate) async fn delete(call: &Call, at: &Named, req: Request) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let (def, store, q) = (&res.def, &call.store, &call.q);
    q.write_options("DeleteOptions")?;
    let body = body_bytes(req).await?;
    let opts: Value = if body.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&body).unwrap_or(json!({}))
    };
    let policy = q
        .get("propagationPolicy")
        .cloned()
        .or_else(|| opts["propagationPolicy"].as_str().map(str::to_string))
        .or_else(|| (opts["orphanDependents"] == json!(true)).then(|| "Orphan".to_string()));
    let propagation = match policy.as_deref() {
        Some("Orphan") => Propagation::Orphan,
        Some("Foreground") => Propagation::Foreground,
        None | Some("Background") => Propagation::Background,
        Some(other) => {
            // ValidateDeleteOptions.
            let e = crate::apiserver::validation::FieldError::not_supported(
                "propagationPolicy",
                crate::apiserver::validation::BadValue::Str(other.to_string()),
                &["Foreground", "Background", "Orphan", "nil"],
            );
            return Err(ApiError::invalid(
                "DeleteOptions.meta.k8s.io",
                "",
                vec![e.cause()],
            ));
        }
    };
    let grace_period = q
        .int("gracePeriodSeconds")?
        .or_else(|| opts["gracePeriodSeconds"].as_i64());
    let body_dry_run = opts["dryRun"]
        .as_array()
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    let how = DeleteOptions {
        propagation,
        precondition_uid: opts["preconditions"]["uid"].as_str().map(str::to_string),
        grace_period,
        dry_run: call.dry_run || body_dry_run,
    };
    if crate::apiserver::admission::any(store, def)
        && let Ok(current) = res.get(ns, name)
    {
        let attempt = crate::apiserver::admission::Attempt {
            operation: "DELETE",
            def,
            subresource: "",
            namespace: ns,
            name,
            old: Some(&current),
            user: &call.user,
            dry_run: how.dry_run,
        };
        crate::apiserver::admission::validate(store, &attempt, None).await?;
    }
    // A CRD's objects go with it, and its kind stops being served when it goes: the store
    // does both, for the collector's deletes too.
    let deleted = res.delete(ns, name, &how)?;
    if is_cluster_role(def) {
        aggregate_cluster_roles(store);
    }
    if def.group.is_empty()
        && def.plural == "serviceaccounts"
        && name == crate::apiserver::store::DEFAULT_SERVICE_ACCOUNT
        && !how.dry_run
    {
        ensure_default_service_account(store, ns);
    }
    if def.group.is_empty()
        && def.plural == "configmaps"
        && name == crate::apiserver::store::ROOT_CA_CONFIG_MAP
        && !how.dry_run
    {
        ensure_root_ca(store, ns);
    }
    Ok(json_response(StatusCode::OK, &deleted))
}

/// A DELETE of a collection: every object its selectors match.
pub(crate) fn delete_collection(
    call: &Call,
    res: &Resource,
    ns: Option<String>,
) -> ApiResult<Response> {
    let (def, q) = (&res.def, &call.q);
    q.write_options("DeleteOptions")?;
    let opts = list_options(&call.store, def, q)?;
    let (items, _, _) = res.list(ns.as_deref(), &opts);
    let mut deleted = Vec::new();
    for item in items {
        let name = item["metadata"]["name"].as_str().unwrap_or("").to_string();
        let ins = item["metadata"]["namespace"]
            .as_str()
            .unwrap_or("")
            .to_string();
        if let Ok(d) = res.delete(
            &ins,
            &name,
            &DeleteOptions {
                dry_run: call.dry_run,
                ..Default::default()
            },
        ) {
            deleted.push(d);
        }
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"apiVersion": def.api_version(), "kind": format!("{}List", def.kind), "metadata": {"resourceVersion": res.store.resource_version().to_string()}, "items": deleted}),
    ))
}
