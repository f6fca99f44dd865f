//! What the operator keeps for a `CDI` resource: each component's account and RBAC, the roles
//! CDI's users get, the Services and the Deployments, owned by the resource; and the
//! PriorityClass they run at (docs/install.md#what-the-operator-keeps).

use cdi_api::config::CDI;
use serde_json::{Value, json};

use super::deployments::{Component, deployment, service};
use super::names::{APISERVER, CONTROLLER, CONTROLLER_ACCOUNT, UPLOAD_PROXY};
use super::pieces::{bundle_volume, mount, probe, secret_volume};
use super::rbac::{
    apiserver_auth_reader, apiserver_cluster_rules, apiserver_namespace_rules, component_rbac,
    controller_cluster_rules, controller_namespace_rules, upload_proxy_cluster_rules,
};
use super::release::{Release, labels};

/// Everything the operator keeps for `cdi`, in the order it applies them: accounts and RBAC,
/// the roles CDI's users get, the Services (before the Deployments: the controller puts their
/// addresses in its certificates), the Deployments.
pub fn components(release: &Release, cdi: &CDI) -> Vec<Value> {
    let mut objects = accounts(release);
    objects.extend(user_roles(release));
    objects.extend(services(release));
    objects.extend(deployments(release, cdi));
    objects
}

/// Each component's ServiceAccount and least-privilege RBAC (upstream's names: the ClusterRole
/// of the controller is `cdi`, its binding `cdi-sa`), and the apiserver's authentication reader.
fn accounts(release: &Release) -> Vec<Value> {
    let mut objects = component_rbac(
        release,
        CONTROLLER_ACCOUNT,
        "cdi",
        CONTROLLER_ACCOUNT,
        controller_cluster_rules(),
        CONTROLLER,
        controller_namespace_rules(),
    );
    objects.extend(component_rbac(
        release,
        APISERVER,
        APISERVER,
        APISERVER,
        apiserver_cluster_rules(),
        APISERVER,
        apiserver_namespace_rules(),
    ));
    objects.push(apiserver_auth_reader(release));
    objects.extend(component_rbac(
        release,
        UPLOAD_PROXY,
        UPLOAD_PROXY,
        UPLOAD_PROXY,
        upload_proxy_cluster_rules(),
        UPLOAD_PROXY,
        Vec::new(),
    ));
    objects
}

/// The roles CDI's users get, with the release's labels added to their own.
fn user_roles(release: &Release) -> Vec<Value> {
    crate::rbac::user_roles()
        .into_iter()
        .map(|mut role| {
            let mut l = labels(release, &[]);
            if let Some(own) = role["metadata"]["labels"].as_object() {
                for (k, v) in own {
                    l[k] = v.clone();
                }
            }
            role["metadata"]["labels"] = l;
            role
        })
        .collect()
}

/// The upload proxy's and the apiserver's Services, and the one Prometheus scrapes.
fn services(release: &Release) -> Vec<Value> {
    vec![
        service(release, UPLOAD_PROXY, UPLOAD_PROXY, 443, json!(8443)),
        service(release, "cdi-api", APISERVER, 443, json!(8443)),
        json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "cdi-prometheus-metrics", "namespace": release.namespace,
                "labels": labels(release, &[("prometheus.cdi.kubevirt.io", "true")])},
            "spec": {"selector": {"prometheus.cdi.kubevirt.io": "true"},
                "ports": [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]}}),
    ]
}

/// The controller's, the apiserver's and the upload proxy's Deployments.
fn deployments(release: &Release, cdi: &CDI) -> Vec<Value> {
    let infra = cdi.spec.infra.clone().unwrap_or_default();
    let controller = Component {
        name: CONTROLLER,
        account: CONTROLLER_ACCOUNT,
        image: &release.controller_image,
        replicas: infra.deployment_replicas,
        container: json!({
            "env": [
                {"name": "IMPORTER_IMAGE", "value": release.importer_image},
                {"name": "CLONER_IMAGE", "value": release.cloner_image},
                {"name": "UPLOADSERVER_IMAGE", "value": release.upload_server_image},
                {"name": "PULL_POLICY", "value": cdi.spec.image_pull_policy.as_ref()
                    .map(|p| p.as_str().to_string()).unwrap_or_else(|| release.pull_policy.clone())},
            ],
            "ports": [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}],
            // Alive, not leading: a standby counts as ready, or a rolling update (whose new
            // pod must be ready before the old one, the leader, goes) would never end.
            "readinessProbe": probe("HTTP", "/healthz", json!("metrics")),
        }),
        volumes: json!([]),
    };
    let apiserver = Component {
        name: APISERVER,
        account: APISERVER,
        image: &release.apiserver_image,
        replicas: infra.api_server_replicas,
        container: json!({
            "ports": [{"name": APISERVER, "containerPort": 8443, "protocol": "TCP"}],
            "readinessProbe": probe("HTTPS", "/readyz", json!(8443)),
        }),
        volumes: json!([]),
    };
    let upload_proxy = Component {
        name: UPLOAD_PROXY,
        account: UPLOAD_PROXY,
        image: &release.upload_proxy_image,
        replicas: infra.upload_proxy_replicas,
        container: json!({
            "env": [{"name": "APISERVER_PUBLIC_KEY", "valueFrom": {"secretKeyRef":
                {"name": "cdi-api-signing-key", "key": "id_rsa.pub"}}}],
            "readinessProbe": probe("HTTPS", "/healthz", json!(8443)),
            "volumeMounts": [
                mount("cdi-uploadproxy-server-cert", "/var/run/certs/cdi-uploadproxy-server-cert"),
                mount("cdi-uploadserver-client-cert", "/var/run/certs/cdi-uploadserver-client-cert"),
                mount("cdi-uploadserver-signer-bundle",
                    "/var/run/ca-bundle/cdi-uploadserver-signer-bundle"),
            ],
        }),
        volumes: json!([
            secret_volume("cdi-uploadproxy-server-cert"),
            secret_volume("cdi-uploadserver-client-cert"),
            bundle_volume("cdi-uploadserver-signer-bundle"),
        ]),
    };
    [controller, apiserver, upload_proxy]
        .into_iter()
        .map(|c| deployment(release, cdi, c))
        .collect()
}

/// The PriorityClass the components run at unless `spec.priorityClass` names another
/// (upstream's); left out when the cluster has no such class.
pub const DEFAULT_PRIORITY_CLASS: &str = "kubevirt-cluster-critical";

/// The PriorityClass `cdi` asks for its components.
pub fn priority_class(cdi: &CDI) -> &str {
    cdi.spec
        .priority_class
        .as_deref()
        .filter(|c| !c.is_empty())
        .unwrap_or(DEFAULT_PRIORITY_CLASS)
}

/// Owner references from every component object to the CDI resource, so the garbage collector
/// removes them with it.
pub fn owned(mut objects: Vec<Value>, cdi: &CDI) -> Vec<Value> {
    let owner = json!([{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "CDI",
        "name": cdi.metadata.name, "uid": cdi.metadata.uid,
        "controller": true, "blockOwnerDeletion": true}]);
    for o in &mut objects {
        o["metadata"]["ownerReferences"] = owner.clone();
    }
    objects
}
