//! Small pieces manifests are made of: RBAC rules, volumes and their mounts, probes, the
//! `POD_NAMESPACE` variable.

use serde_json::{Value, json};

pub(super) fn pod_namespace() -> Value {
    json!({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
}

pub(super) fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

pub(super) fn named(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "resourceNames": names, "verbs": verbs})
}

pub(super) fn secret_volume(name: &str) -> Value {
    json!({"name": name, "secret": {"secretName": name}})
}

pub(super) fn bundle_volume(name: &str) -> Value {
    json!({"name": name, "configMap": {"name": name}})
}

pub(super) fn mount(name: &str, at: &str) -> Value {
    json!({"name": name, "mountPath": at, "readOnly": true})
}

pub(super) fn probe(scheme: &str, path: &str, port: Value) -> Value {
    json!({"httpGet": {"path": path, "port": port, "scheme": scheme},
        "initialDelaySeconds": 2, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 1})
}
