//! CustomResourceDefinitions: the resource a CRD defines, and its status once established.

use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::store::{Store, WriteOptions};

/// The served resource a CRD defines (its storage version).
pub(super) fn crd_resource(crd: &Value) -> ApiResult<ResourceDef> {
    let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
    let invalid = |field: &str, msg: &str| {
        ApiError::invalid(
            "CustomResourceDefinition",
            &name,
            vec![(field.into(), msg.into())],
        )
    };
    let spec = &crd["spec"];
    let group = spec["group"]
        .as_str()
        .filter(|g| !g.is_empty())
        .ok_or_else(|| invalid("spec.group", "Required value"))?;
    let names = &spec["names"];
    let plural = names["plural"]
        .as_str()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| invalid("spec.names.plural", "Required value"))?;
    let kind = names["kind"]
        .as_str()
        .filter(|k| !k.is_empty())
        .ok_or_else(|| invalid("spec.names.kind", "Required value"))?;
    if name != format!("{plural}.{group}") {
        return Err(invalid(
            "metadata.name",
            &format!("must be spec.names.plural+\".\"+spec.group: {plural}.{group}"),
        ));
    }
    let versions = spec["versions"]
        .as_array()
        .filter(|v| !v.is_empty())
        .ok_or_else(|| invalid("spec.versions", "Required value"))?;
    let storage = versions
        .iter()
        .find(|v| v["storage"] == json!(true))
        .ok_or_else(|| {
            invalid(
                "spec.versions",
                "exactly one version must be marked as storage version",
            )
        })?;
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let served_versions = versions
        .iter()
        .filter(|v| v["served"] == json!(true) && v["storage"] != json!(true))
        .filter_map(|v| v["name"].as_str().map(str::to_string))
        .collect();
    let mut subresources = Vec::new();
    if storage["subresources"]["status"].is_object() {
        subresources.push("status".to_string());
    }
    Ok(ResourceDef {
        group: group.to_string(),
        version: storage["name"].as_str().unwrap_or("v1").to_string(),
        kind: kind.to_string(),
        plural: plural.to_string(),
        singular: names["singular"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| kind.to_lowercase()),
        namespaced: spec["scope"] != json!("Cluster"),
        short_names: strings(&names["shortNames"]),
        categories: strings(&names["categories"]),
        subresources,
        create_only: false,
        schema: Some(storage["schema"]["openAPIV3Schema"].clone()),
        printer_columns: storage["additionalPrinterColumns"]
            .as_array()
            .cloned()
            .unwrap_or_default(),
        selectable_fields: storage["selectableFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["jsonPath"].as_str())
            .map(|p| p.trim_start_matches('.').to_string())
            .collect(),
        served_versions,
        storage_version: None,
    })
}

/// Write a created CRD's status as kube's CRD controllers do: its names accepted and it
/// established.
pub(super) fn mark_established(store: &Store, def: &ResourceDef, crd: &Value) -> ApiResult<Value> {
    let name = crd["metadata"]["name"].as_str().unwrap_or("").to_string();
    let mut next = crd.clone();
    let now = crate::apiserver::store::now();
    next["status"] = json!({
        "acceptedNames": crd["spec"]["names"],
        "storedVersions": crd["spec"]["versions"].as_array().map(|vs| vs.iter().filter(|v| v["storage"] == json!(true)).map(|v| v["name"].clone()).collect::<Vec<_>>()).unwrap_or_default(),
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
    });
    next["metadata"]["resourceVersion"] = json!("");
    store.update(
        def,
        "",
        &name,
        next,
        &WriteOptions {
            status_only: true,
            ..Default::default()
        },
    )
}
