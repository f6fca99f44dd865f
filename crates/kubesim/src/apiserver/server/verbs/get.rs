//! Reading: an object (`get`), a collection (`list`, selectors, `limit` and `continue` tokens),
//! as JSON or as the Table kubectl asks for.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::selector::{FieldSelector, LabelSelector};
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::request::Query;
use crate::apiserver::server::response::json_response;
use crate::apiserver::store::{ListOptions, Store};
use crate::apiserver::view::Resource;

/// A GET of an object, as JSON or as a one-row Table.
pub(crate) fn get(call: &Call, at: &Named) -> ApiResult<Response> {
    call.q.resource_version()?;
    let obj = at.res.get(&at.ns, &at.name)?;
    if call.wants_table() {
        let rv = obj["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string();
        return Ok(json_response(
            StatusCode::OK,
            &call.table(&at.res.def, &[obj], &rv),
        ));
    }
    Ok(json_response(StatusCode::OK, &obj))
}

/// A list of a collection (of one namespace, or all of them).
pub(crate) fn list(call: &Call, res: &Resource, ns: Option<String>) -> ApiResult<Response> {
    let (def, q) = (&res.def, &call.q);
    let opts = list_options(&call.store, def, q)?;
    let (items, rv, next) = res.list(ns.as_deref(), &opts);
    let next = next.map(|position| encode_continue(rv, &position));
    if call.wants_table() {
        let mut t = call.table(def, &items, &rv.to_string());
        if let Some(next) = next {
            t["metadata"]["continue"] = json!(next);
        }
        return Ok(json_response(StatusCode::OK, &t));
    }
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(next) = next {
        meta["continue"] = json!(next);
    }
    Ok(json_response(
        StatusCode::OK,
        &json!({"apiVersion": def.api_version(), "kind": format!("{}List", def.kind), "metadata": meta, "items": items}),
    ))
}

/// The fields a kind's field selectors may name besides `metadata.name` and
/// `metadata.namespace` (kube's field label conversion functions), or None where this server
/// does not know the kind's set and takes any field outside `metadata`.
fn selectable_fields(def: &ResourceDef) -> Option<&'static [&'static str]> {
    Some(match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => &[
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.podIPs",
            "status.nominatedNodeName",
        ],
        ("", "events") => &[
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        ("", "namespaces") => &["status.phase"],
        ("", "secrets") => &["type"],
        ("", "nodes") => &["spec.unschedulable"],
        ("", "configmaps" | "serviceaccounts" | "persistentvolumeclaims" | "persistentvolumes")
        | ("storage.k8s.io", _)
        | ("coordination.k8s.io", _)
        | ("rbac.authorization.k8s.io", _)
        | ("apps", "deployments") => &[],
        _ => return None,
    })
}

/// The selectors of a list or watch; a field selector on a field the kind does not support is
/// a 400, as kube answers it.
pub(crate) fn selectors(def: &ResourceDef, q: &Query) -> ApiResult<ListOptions> {
    let mut fields = FieldSelector::parse(q.get("fieldSelector").map(String::as_str).unwrap_or(""))
        .map_err(ApiError::bad_request)?;
    let unsupported =
        |field: &str| ApiError::bad_request(format!("field label not supported: {field}"));
    let known = selectable_fields(def);
    let view = crate::apiserver::view::of(def);
    for (field, _, _) in &mut fields.0 {
        // A view selects the stored objects, by the field its label converts to.
        if let Some(view) = view {
            *field = view
                .stored_field(field)
                .ok_or_else(|| unsupported(field))?
                .to_string();
            continue;
        }
        // A custom resource: only what its CRD declares selectable.
        let supported = matches!(field.as_str(), "metadata.name" | "metadata.namespace")
            || if def.schema.is_some() {
                def.selectable_fields.contains(field)
            } else {
                match known {
                    Some(list) => list.contains(&field.as_str()),
                    None => !field.starts_with("metadata."),
                }
            };
        if !supported {
            return Err(unsupported(field));
        }
    }
    Ok(ListOptions {
        labels: LabelSelector::parse(q.get("labelSelector").map(String::as_str).unwrap_or(""))
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
        fields,
        ..Default::default()
    })
}

/// The options of a list: selectors, `limit`, and where a `continue` token resumes.
pub(crate) fn list_options(store: &Store, def: &ResourceDef, q: &Query) -> ApiResult<ListOptions> {
    let rv = q.resource_version()?;
    let mut opts = selectors(def, q)?;
    opts.limit = q.int("limit")?.filter(|l| *l > 0).map(|l| l as usize);
    if let Some(token) = q.get("continue").filter(|c| !c.is_empty()) {
        if rv.is_some() {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        let (token_rv, start) = decode_continue(token)?;
        if token_rv > 0 && store.expired(token_rv as u64) {
            return Err(ApiError::gone(
                "The provided continue parameter is too old to display a consistent list result. \
                 You can start a new list without the continue parameter.",
            ));
        }
        opts.continue_after = Some(start);
    }
    Ok(opts)
}

const CONTINUE_VERSION: &str = "meta.k8s.io/v1";

/// A continue token as kube-apiserver encodes one: base64url of
/// `{"v":"meta.k8s.io/v1","rv":<list version>,"start":<position>}`.
fn encode_continue(rv: u64, position: &str) -> String {
    use base64::Engine;
    let token = json!({"v": CONTINUE_VERSION, "rv": rv, "start": position});
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(token.to_string())
}

/// A continue token back into (version, position); a malformed one is a 400 with kube's
/// messages (k8s.io/apiserver/pkg/storage/continue.go).
fn decode_continue(token: &str) -> ApiResult<(i64, String)> {
    use base64::Engine;
    let invalid = |why: &str| {
        let why = if why.is_empty() {
            String::new()
        } else {
            format!(": {why}")
        };
        ApiError::bad_request(format!(
            "invalid continue token: continue key is not valid{why}"
        ))
    };
    let data = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .map_err(|e| {
            let at = match e {
                base64::DecodeError::InvalidByte(at, _)
                | base64::DecodeError::InvalidLastSymbol(at, _) => at,
                base64::DecodeError::InvalidLength(len) => len,
                base64::DecodeError::InvalidPadding => token.len(),
            };
            invalid(&format!("illegal base64 data at input byte {at}"))
        })?;
    let parsed: Value = serde_json::from_slice(&data).map_err(|e| invalid(&e.to_string()))?;
    let field = |name: &str| parsed.get(name).filter(|v| !v.is_null());
    let version = field("v").map(|v| v.as_str().ok_or(())).transpose();
    let rv = field("rv").map(|v| v.as_i64().ok_or(())).transpose();
    let start = field("start").map(|v| v.as_str().ok_or(())).transpose();
    let (Some(()), Ok(version), Ok(rv), Ok(start)) =
        (parsed.is_object().then_some(()), version, rv, start)
    else {
        return Err(invalid("the token does not decode to a continue token"));
    };
    if version != Some(CONTINUE_VERSION) {
        return Err(invalid("server does not recognize this encoded version"));
    }
    let rv = rv.unwrap_or(0);
    if rv == 0 {
        return Err(invalid(
            "incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
        ));
    }
    let start = start.unwrap_or("");
    if start.is_empty() {
        return Err(invalid("encoded start key empty (version meta.k8s.io/v1)"));
    }
    // kube refuses keys that path.Clean would change (no climbing out of the resource).
    let key = if start.starts_with('/') {
        start.to_string()
    } else {
        format!("/{start}")
    };
    let segments: Vec<&str> = key[1..].split('/').collect();
    if key.len() > 1
        && segments
            .iter()
            .any(|s| s.is_empty() || *s == "." || *s == "..")
    {
        return Err(invalid(start));
    }
    Ok((rv, start.to_string()))
}
