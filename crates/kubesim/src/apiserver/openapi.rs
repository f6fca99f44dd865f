//! OpenAPI v3 documents, as much as clients need: kubectl looks up each kind's PATCH operation to
//! learn that the server validates fields itself (`fieldValidation`), and reads schemas.

use serde_json::{Value, json};

use super::registry::{Registry, ResourceDef};

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

/// `/openapi/v3`: one entry per group version.
pub fn root(registry: &Registry) -> Value {
    let mut paths = serde_json::Map::new();
    let mut gvs: Vec<(String, String)> = registry
        .all()
        .map(|d| (d.group.clone(), d.version.clone()))
        .collect();
    gvs.sort();
    gvs.dedup();
    for (g, v) in gvs {
        let p = gv_path(&g, &v);
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}")}),
        );
    }
    json!({"paths": paths})
}

fn operations(def: &ResourceDef) -> Value {
    let gvk = json!({"group": def.group, "version": def.version, "kind": def.kind});
    let validation = json!([
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "dryRun", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
    ]);
    let schema_ref = json!({"$ref": format!("#/components/schemas/{}", schema_name(def))});
    let body = json!({"content": {"application/json": {"schema": schema_ref}}});
    json!({
        "get": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "get", "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": schema_ref}}}}},
        "put": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "put", "parameters": validation, "requestBody": body, "responses": {"200": {"description": "OK"}}},
        "patch": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "patch", "parameters": validation, "responses": {"200": {"description": "OK"}}},
        "delete": {"x-kubernetes-group-version-kind": gvk, "x-kubernetes-action": "delete", "responses": {"200": {"description": "OK"}}},
    })
}

fn schema_name(def: &ResourceDef) -> String {
    let group: Vec<&str> = if def.group.is_empty() {
        vec!["core"]
    } else {
        def.group.split('.').rev().collect()
    };
    format!("{}.{}.{}", group.join("."), def.version, def.kind)
}

/// `/openapi/v3/{api/v1|apis/g/v}`: paths with their operations, and the kinds' schemas (a
/// custom resource's own schema; built-in kinds are described as open objects).
pub fn group_version(registry: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs = registry.in_group_version(group, version);
    if defs.is_empty() {
        return None;
    }
    let mut paths = serde_json::Map::new();
    let mut schemas = serde_json::Map::new();
    for def in defs.into_iter().filter(|d| !d.create_only) {
        let prefix = format!("/{}", gv_path(&def.group, &def.version));
        let item = if def.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", def.plural)
        } else {
            format!("{prefix}/{}/{{name}}", def.plural)
        };
        paths.insert(item, operations(def));
        let mut schema = def.schema.clone().unwrap_or_else(
            || json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true}),
        );
        schema["x-kubernetes-group-version-kind"] =
            json!([{"group": def.group, "version": def.version, "kind": def.kind}]);
        schemas.insert(schema_name(def), schema);
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (cdi dev)", "version": "v1.33.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
