//! Creating: a POST to a collection (a review is answered instead of stored), and the store's
//! create with what kube-apiserver's REST storage adds (defaults, plugins, a CRD's kind served).

use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::server::admit::admit_create;
use crate::apiserver::server::call::Call;
use crate::apiserver::server::controllers::{
    aggregate_cluster_roles, ensure_default_service_account, ensure_root_ca, is_cluster_role,
};
use crate::apiserver::server::crds::{crd_resource, mark_established};
use crate::apiserver::server::plugins::{
    admit_service_account, allocate_cluster_ip, default_storage_class, protect,
};
use crate::apiserver::server::request::{matches_url, read_object};
use crate::apiserver::server::response::{json_response, with_warnings};
use crate::apiserver::server::reviews::answer_review;
use crate::apiserver::store::Owner;
use crate::apiserver::view::Resource;

/// A POST to a collection.
pub(crate) async fn post(
    call: &Call,
    res: &Resource,
    ns: Option<String>,
    req: Request,
) -> ApiResult<Response> {
    let (def, q) = (&res.def, &call.q);
    let ns = ns.unwrap_or_default();
    if def.namespaced && ns.is_empty() {
        return Err(ApiError::method_not_allowed(format!(
            "{} must be created in a namespace",
            def.plural
        )));
    }
    q.write_options("CreateOptions")?;
    let obj = read_object(req).await?;
    matches_url(def, &ns, &obj)?;
    if def.create_only {
        let mut review = obj;
        review["status"] = answer_review(call, def, &ns, &review)?;
        return Ok(json_response(StatusCode::CREATED, &review));
    }
    let mut obj = obj;
    let warnings = admit_create(call, def, &ns, &mut obj, None).await?;
    if call.protect_storage {
        protect(def, &mut obj);
    }
    let created = create(res, &ns, obj, call.dry_run, call.writer.as_ref())?;
    Ok(with_warnings(
        json_response(StatusCode::CREATED, &created),
        &warnings,
    ))
}

/// Store a new object as kube-apiserver's REST storage does: a claim's default class, a pod's
/// ServiceAccount, quota, a Service's cluster IP; then a CRD's kind served, a new namespace's
/// ServiceAccount and CA, ClusterRoles aggregated.
pub(crate) fn create(
    res: &Resource,
    ns: &str,
    obj: Value,
    dry_run: bool,
    owner: Option<&Owner>,
) -> ApiResult<Value> {
    let (store, def) = (&*res.store, &res.def);
    let is_crd = def.group == "apiextensions.k8s.io" && def.plural == "customresourcedefinitions";
    let custom = if is_crd {
        Some(crd_resource(&obj)?)
    } else {
        None
    };
    let mut obj = obj;
    if def.group.is_empty() && def.plural == "persistentvolumeclaims" {
        default_storage_class(store, &mut obj);
    }
    if def.group.is_empty() && def.plural == "pods" {
        admit_service_account(store, ns, &mut obj)?;
    }
    if def.group.is_empty() {
        crate::apiserver::quota::admit(store, &def.plural, ns, &obj)?;
    }
    if def.group.is_empty() && def.plural == "services" && !dry_run {
        allocate_cluster_ip(store, &mut obj)?;
    }
    let created = res.create(ns, obj, dry_run, owner)?;
    if let (Some(custom), false) = (custom, dry_run) {
        store.register(custom);
        return mark_established(store, def, &created);
    }
    if !dry_run && def.group.is_empty() && def.plural == "namespaces" {
        let ns = created["metadata"]["name"].as_str().unwrap_or("");
        ensure_default_service_account(store, ns);
        ensure_root_ca(store, ns);
    }
    if !dry_run && is_cluster_role(def) {
        aggregate_cluster_roles(store);
        // The role as aggregated, when it aggregates.
        let name = created["metadata"]["name"].as_str().unwrap_or("");
        return Ok(res.get(ns, name).unwrap_or_else(|_| created.clone()));
    }
    Ok(created)
}
