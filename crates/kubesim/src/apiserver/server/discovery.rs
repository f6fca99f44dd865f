//! Discovery: the version, the OpenAPI documents, and the API groups and resources served
//! (aggregated ones included), as kubectl and client-go discover them.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::response::json_response;
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::store::Store;

/// The discovery documents.
pub(super) enum Document {
    Version,
    OpenApiRoot,
    OpenApi(String, String),
    ApiVersions,
    Groups,
    Group(String),
    Resources(String, String),
}

/// A discovery document.
pub(super) fn answer(store: &Store, doc: Document) -> ApiResult<Response> {
    match doc {
        Document::Version => Ok(json_response(StatusCode::OK, &version())),
        Document::OpenApiRoot => {
            let mut root = crate::apiserver::openapi::root(&store.registry());
            // Aggregated group versions: their documents come from their servers.
            for (group, versions) in crate::apiserver::aggregation::groups(store) {
                for v in versions {
                    let p = format!("apis/{group}/{v}");
                    root["paths"][&p] = json!({"serverRelativeURL": format!("/openapi/v3/{p}")});
                }
            }
            Ok(json_response(StatusCode::OK, &root))
        }
        Document::OpenApi(g, v) => {
            crate::apiserver::openapi::group_version(&store.registry(), &g, &v)
                .map(|doc| json_response(StatusCode::OK, &doc))
                .ok_or_else(ApiError::path_not_found)
        }
        Document::ApiVersions => Ok(json_response(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": "127.0.0.1"}]}),
        )),
        Document::Groups => Ok(json_response(StatusCode::OK, &groups(store))),
        Document::Group(g) => {
            let list = groups(store);
            let found = list["groups"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["name"] == g.as_str()).cloned());
            match found {
                Some(mut group) => {
                    group["kind"] = json!("APIGroup");
                    group["apiVersion"] = json!("v1");
                    Ok(json_response(StatusCode::OK, &group))
                }
                None => Err(ApiError::path_not_found()),
            }
        }
        Document::Resources(g, v) => {
            let registry = store.registry();
            let defs = registry.in_group_version(&g, &v);
            if defs.is_empty() {
                return Err(ApiError::path_not_found());
            }
            let group_version = if g.is_empty() {
                v.clone()
            } else {
                format!("{g}/{v}")
            };
            let resources: Vec<Value> = defs.iter().flat_map(|d| d.discovery()).collect();
            Ok(json_response(
                StatusCode::OK,
                &json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": group_version, "resources": resources}),
            ))
        }
    }
}

/// What `/version` says (`kubectl version`).
pub(super) fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-cdi-dev",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24",
        "compiler": "rustc",
        "platform": "linux/amd64",
    })
}

/// The API groups: the served ones, then those of aggregated APIs.
pub(super) fn groups(store: &Store) -> Value {
    let mut all: Vec<(String, Vec<String>)> = store.registry().groups().into_iter().collect();
    for (group, versions) in crate::apiserver::aggregation::groups(store) {
        if !all.iter().any(|(g, _)| *g == group) {
            all.push((group, versions));
        }
    }
    let groups: Vec<Value> = all
        .into_iter()
        .map(|(name, versions)| {
            let versions: Vec<Value> = versions
                .iter()
                .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
                .collect();
            json!({"name": name, "versions": versions, "preferredVersion": versions[0]})
        })
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}
