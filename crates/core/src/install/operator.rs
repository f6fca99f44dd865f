//! The operator's own manifests (what `cdi install` prints): its namespace, the CDI kind's CRD,
//! its account and the rules it needs to keep everything else, its Deployment; and the
//! example CDI resource.

use cdi_api::config::CDI;
use serde_json::{Value, json};

use super::components::components;
use super::crds::{crds, prometheus_rules};
use super::names::{
    API_SERVICE, CDI_GROUP, MUTATING_WEBHOOKS, OPERATOR, OPERATOR_LEASE, VALIDATING_WEBHOOKS,
};
use super::pieces::{named, probe, rule};
use super::release::Release;

/// What the operator itself may do: keep every object of [`components`] and the CRDs, write
/// the CDI resource, clear worker pods and what `cdi apiserver` registered on uninstall — and
/// hold every permission it grants, as kube's RBAC requires of whoever writes a role.
fn operator_rules(release: &Release) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let all = [
        "get", "list", "watch", "create", "patch", "update", "delete",
    ];
    let mut cluster = vec![
        rule(
            &["apiextensions.k8s.io"],
            &["customresourcedefinitions"],
            &all,
        ),
        rule(
            &["rbac.authorization.k8s.io"],
            &["clusterroles", "clusterrolebindings"],
            &all,
        ),
        rule(
            &[CDI_GROUP],
            &["cdis"],
            &["get", "list", "watch", "patch", "update"],
        ),
        rule(&[CDI_GROUP], &["cdis/finalizers"], &["update"]),
        rule(&["scheduling.k8s.io"], &["priorityclasses"], &["get"]),
        rule(
            &["populator.storage.k8s.io"],
            &["volumepopulators"],
            &[
                "get", "list", "watch", "create", "patch", "update", "delete",
            ],
        ),
        rule(&[""], &["pods", "services"], &["list", "delete"]),
        named(
            &["apiregistration.k8s.io"],
            &["apiservices"],
            &[API_SERVICE],
            &["delete"],
        ),
        named(
            &["admissionregistration.k8s.io"],
            &["mutatingwebhookconfigurations"],
            MUTATING_WEBHOOKS,
            &["delete"],
        ),
        named(
            &["admissionregistration.k8s.io"],
            &["validatingwebhookconfigurations"],
            VALIDATING_WEBHOOKS,
            &["delete"],
        ),
    ];
    let mut namespace = vec![
        rule(
            &["rbac.authorization.k8s.io"],
            &["roles", "rolebindings"],
            &all,
        ),
        rule(
            &["", "apps"],
            &[
                "serviceaccounts",
                "services",
                "deployments",
                "configmaps",
                "secrets",
            ],
            &all,
        ),
        rule(&["coordination.k8s.io"], &["leases"], &["create"]),
        named(
            &["coordination.k8s.io"],
            &["leases"],
            &[OPERATOR_LEASE],
            &["get", "update", "patch"],
        ),
        rule(&["coordination.k8s.io"], &["leases"], &["delete"]),
        rule(
            &["monitoring.coreos.com"],
            &["prometheusrules", "servicemonitors"],
            &all,
        ),
    ];
    // Granted to Prometheus: held so it may be granted.
    namespace.extend(prometheus_rules());
    let kube_system = vec![
        rule(
            &["rbac.authorization.k8s.io"],
            &["rolebindings"],
            &["get", "list", "create", "patch", "delete"],
        ),
        // Held because it is granted to `cdi apiserver` (kube's built-in Role).
        named(
            &[""],
            &["configmaps"],
            &["extension-apiserver-authentication"],
            &["get", "list", "watch"],
        ),
    ];
    for o in components(release, &CDI::new("cdi", Default::default())) {
        let rules = o["rules"].as_array().cloned().unwrap_or_default();
        match o["kind"].as_str() {
            Some("ClusterRole") => cluster.extend(rules),
            Some("Role") => namespace.extend(rules),
            _ => {}
        }
    }
    (cluster, namespace, kube_system)
}

/// The operator's own manifests, what `cdi install` prints and `kubectl apply -f deploy/`
/// applies: its namespace, the CDI kind's CRD, its account and RBAC, its Deployment.
pub fn operator_manifests(release: &Release) -> Vec<Value> {
    let ns = &release.namespace;
    let op_labels = json!({"operator.cdi.kubevirt.io": "", "cdi.kubevirt.io": ""});
    let (cluster, namespace, kube_system) = operator_rules(release);
    let subject = json!([{"kind": "ServiceAccount", "name": OPERATOR, "namespace": ns}]);
    let mut objects = vec![json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {"cdi.kubevirt.io": ""}}})];
    objects.extend(crds(true));
    objects.extend([
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": OPERATOR, "namespace": ns, "labels": op_labels}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "cdi-operator-cluster", "labels": op_labels}, "rules": cluster}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": OPERATOR, "labels": op_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "cdi-operator-cluster"},
            "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": OPERATOR, "namespace": ns, "labels": op_labels}, "rules": namespace}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": OPERATOR, "namespace": ns, "labels": op_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR},
            "subjects": subject}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": OPERATOR, "namespace": "kube-system", "labels": op_labels},
            "rules": kube_system}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": OPERATOR, "namespace": "kube-system", "labels": op_labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": OPERATOR},
            "subjects": subject}),
    ]);
    let labels = json!({"name": OPERATOR, "operator.cdi.kubevirt.io": ""});
    objects.push(json!({"apiVersion": "apps/v1", "kind": "Deployment",
    "metadata": {"name": OPERATOR, "namespace": ns, "labels": op_labels},
    "spec": {"replicas": 1, "selector": {"matchLabels": labels},
        "template": {
            "metadata": {"labels": {"name": OPERATOR, "operator.cdi.kubevirt.io": "",
                "cdi.kubevirt.io": OPERATOR, "prometheus.cdi.kubevirt.io": "true"}},
            "spec": {
                "serviceAccountName": OPERATOR,
                "securityContext": {"runAsNonRoot": true},
                "nodeSelector": {"kubernetes.io/os": "linux"},
                "containers": [{
                    "name": OPERATOR,
                    "image": release.operator_image,
                    "imagePullPolicy": release.pull_policy,
                    "env": release.env(),
                    "ports": [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}],
                    "readinessProbe": probe("HTTP", "/readyz", json!("metrics")),
                    "livenessProbe": probe("HTTP", "/healthz", json!("metrics")),
                    "resources": {"requests": {"cpu": "100m", "memory": "150Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": false,
                        "capabilities": {"drop": ["ALL"]},
                        "seccompProfile": {"type": "RuntimeDefault"}},
                }]}}}}));
    objects
}

/// The example CDI resource (upstream's `cdi-cr.yaml`, with WaitForFirstConsumer honoured).
pub fn example_cdi() -> Value {
    json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
        "metadata": {"name": "cdi"},
        "spec": {
            "config": {"featureGates": ["HonorWaitForFirstConsumer"]},
            "imagePullPolicy": "IfNotPresent",
            "infra": {"nodeSelector": {"kubernetes.io/os": "linux"}},
            "workload": {"nodeSelector": {"kubernetes.io/os": "linux"}}}})
}
