//! The components' Deployments (upstream's shape: non-root, every capability dropped, placed by
//! `spec.infra`, pulled by `spec.imagePullPolicy`) and Services.

use cdi_api::config::{CDI, ComponentConfig};
use serde_json::{Value, json};

use super::names::CONTROLLER;
use super::pieces::pod_namespace;
use super::release::{Release, labels};

pub(super) fn service(
    release: &Release,
    name: &str,
    component: &str,
    port: u16,
    target: Value,
) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": release.namespace,
            "labels": labels(release, &[("cdi.kubevirt.io", component)])},
        "spec": {"selector": {"cdi.kubevirt.io": component},
            "ports": [{"port": port, "targetPort": target, "protocol": "TCP"}]}})
}

/// A component's Deployment (upstream's shape): one container running as non-root with every
/// capability dropped, placed by `spec.infra`, pulled by `spec.imagePullPolicy`.
pub(super) struct Component<'a> {
    pub(super) name: &'a str,
    pub(super) account: &'a str,
    pub(super) image: &'a str,
    pub(super) replicas: Option<i32>,
    pub(super) container: Value,
    pub(super) volumes: Value,
}

pub(super) fn deployment(release: &Release, cdi: &CDI, c: Component) -> Value {
    let infra = cdi.spec.infra.clone().unwrap_or_default();
    let pull = cdi
        .spec
        .image_pull_policy
        .as_ref()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| release.pull_policy.clone());
    let pod_labels = json!({"cdi.kubevirt.io": c.name, "app": "containerized-data-importer",
        "prometheus.cdi.kubevirt.io": if c.name == CONTROLLER { "true" } else { "" }});
    let mut container = json!({
        "name": c.name,
        "image": c.image,
        "imagePullPolicy": pull,
        "args": [format!("-v={}", verbosity(release, cdi))],
        "env": [pod_namespace()],
        "resources": {"requests": {"cpu": "100m", "memory": "150Mi"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {"allowPrivilegeEscalation": false, "runAsNonRoot": true,
            "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
    });
    if let Value::Object(more) = c.container {
        for (k, v) in more {
            if k == "env" {
                if let (Some(env), Some(add)) = (container["env"].as_array_mut(), v.as_array()) {
                    env.extend(add.iter().cloned());
                }
            } else {
                container[k] = v;
            }
        }
    }
    let mut pod = json!({
        "serviceAccountName": c.account,
        "securityContext": {"runAsNonRoot": true},
        "containers": [container],
        "volumes": c.volumes,
    });
    placement(&mut pod, &infra);
    if let Some(secrets) = cdi
        .spec
        .config
        .as_ref()
        .and_then(|c| c.image_pull_secrets.as_ref())
        && !secrets.is_empty()
    {
        pod["imagePullSecrets"] = json!(secrets);
    }
    if let Some(class) = cdi.spec.priority_class.as_deref().filter(|c| !c.is_empty()) {
        pod["priorityClassName"] = json!(class);
    }
    json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": c.name, "namespace": release.namespace,
            "labels": labels(release, &[("cdi.kubevirt.io", c.name)])},
        "spec": {
            "replicas": c.replicas.filter(|r| *r > 1).unwrap_or(1),
            "selector": {"matchLabels": {"cdi.kubevirt.io": c.name}},
            "template": {"metadata": {"labels": pod_labels}, "spec": pod}}})
}

fn verbosity(release: &Release, cdi: &CDI) -> i64 {
    cdi.spec
        .config
        .as_ref()
        .and_then(|c| c.log_verbosity)
        .map(i64::from)
        .unwrap_or(i64::from(release.verbosity))
}

fn placement(pod: &mut Value, infra: &ComponentConfig) {
    if let Some(s) = infra.node_selector.as_ref().filter(|s| !s.is_empty()) {
        pod["nodeSelector"] = json!(s);
    }
    if let Some(a) = &infra.affinity {
        pod["affinity"] = json!(a);
    }
    if let Some(t) = infra.tolerations.as_ref().filter(|t| !t.is_empty()) {
        pod["tolerations"] = json!(t);
    }
}
