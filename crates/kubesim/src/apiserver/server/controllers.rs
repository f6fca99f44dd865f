//! What kube's controllers would do, done by the API server on the writes that need it: every
//! namespace's `default` ServiceAccount and `kube-root-ca.crt`, the `kubernetes` Service, the
//! aggregation of ClusterRoles, and a CRD's kind served as it is written.

use std::net::SocketAddr;

use serde_json::{Value, json};

use super::crds::crd_resource;
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::store::{DeleteOptions, ListOptions, Store, WriteOptions};

/// Make namespace `ns`'s `default` ServiceAccount, as kube's serviceaccount controller does for
/// a new namespace and again when it is deleted (not in a namespace being deleted: the store
/// refuses that).
pub(super) fn ensure_default_service_account(store: &Store, ns: &str) {
    use crate::apiserver::store::DEFAULT_SERVICE_ACCOUNT;
    let Some(def) = store.registry().get("", "v1", "serviceaccounts").cloned() else {
        return;
    };
    if store.get(&def, ns, DEFAULT_SERVICE_ACCOUNT).is_ok() {
        return;
    }
    let account = json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": DEFAULT_SERVICE_ACCOUNT}});
    let _ = store.create(&def, ns, account, false, None);
}

/// Publish the cluster's CA as `kube-root-ca.crt` in namespace `ns`, as kube-controller-manager's
/// root CA publisher does (again when it is deleted).
pub(super) fn ensure_root_ca(store: &Store, ns: &str) {
    use crate::apiserver::store::ROOT_CA_CONFIG_MAP;
    let (Some(def), Some(pem)) = (
        store.registry().get("", "v1", "configmaps").cloned(),
        store.root_ca(),
    ) else {
        return;
    };
    if store.get(&def, ns, ROOT_CA_CONFIG_MAP).is_ok() {
        return;
    }
    let config_map = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": ROOT_CA_CONFIG_MAP, "annotations": {"kubernetes.io/description":
            "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
        "data": {"ca.crt": pem}});
    let _ = store.create(&def, ns, config_map, false, None);
}

/// The names the API server is known by inside the cluster, in its serving certificate.
pub(super) const KUBERNETES_NAMES: [&str; 4] = [
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
];

/// The `kubernetes` Service in `default` and its Endpoints, pointing at where the server listens,
/// as kube-apiserver keeps them: what pods' `KUBERNETES_SERVICE_HOST`/`_PORT` come from.
pub(super) fn publish_kubernetes_service(store: &Store, at: SocketAddr) {
    let registry = store.registry();
    let (Some(services), Some(endpoints)) = (
        registry.get("", "v1", "services").cloned(),
        registry.get("", "v1", "endpoints").cloned(),
    ) else {
        return;
    };
    let (ip, port) = (at.ip().to_string(), at.port());
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kubernetes", "labels": {"component": "apiserver", "provider": "kubernetes"}},
        "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
            "ports": [{"name": "https", "port": port, "protocol": "TCP", "targetPort": port}],
            "sessionAffinity": "None"}});
    let addresses = json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": ip}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}]});
    for (def, obj) in [(services, service), (endpoints, addresses)] {
        let _ = store.delete(&def, "default", "kubernetes", &DeleteOptions::default());
        let _ = store.create(&def, "default", obj, false, None);
    }
}

/// What follows a write of `obj`: a CRD's kind served as it now reads, ClusterRoles aggregated
/// again.
pub(super) fn after_write(store: &Store, def: &ResourceDef, obj: &Value) {
    if def.group == "apiextensions.k8s.io"
        && def.plural == "customresourcedefinitions"
        && let Ok(custom) = crd_resource(obj)
    {
        store.register(custom);
    }
    if is_cluster_role(def) {
        aggregate_cluster_roles(store);
    }
}

/// Whether `def` is ClusterRoles, whose writes the aggregation follows.
pub(super) fn is_cluster_role(def: &ResourceDef) -> bool {
    def.group == "rbac.authorization.k8s.io" && def.plural == "clusterroles"
}

/// The definition of an RBAC resource (`roles`, `clusterroles`, …).
fn rbac_def(store: &Store, plural: &str) -> Option<ResourceDef> {
    store
        .registry()
        .get("rbac.authorization.k8s.io", "v1", plural)
        .cloned()
}

/// The RBAC objects the store holds (those that decode; the API refuses the others).
pub(super) fn rbac_policy(store: &Store) -> crate::apiserver::rbac::Policy {
    fn all<T: serde::de::DeserializeOwned>(store: &Store, plural: &str) -> Vec<T> {
        let Some(def) = rbac_def(store, plural) else {
            return Vec::new();
        };
        store
            .list(&def, None, &ListOptions::default())
            .0
            .into_iter()
            .filter_map(|o| serde_json::from_value(o).ok())
            .collect()
    }
    crate::apiserver::rbac::Policy {
        roles: all(store, "roles"),
        cluster_roles: all(store, "clusterroles"),
        role_bindings: all(store, "rolebindings"),
        cluster_role_bindings: all(store, "clusterrolebindings"),
    }
}

/// kube's clusterrole aggregation controller, run on every ClusterRole write: an aggregated
/// role's rules become those of the roles its selectors pick, repeated while one aggregated role
/// feeds another (`edit` into `admin`).
pub(super) fn aggregate_cluster_roles(store: &Store) {
    let Some(def) = rbac_def(store, "clusterroles") else {
        return;
    };
    for _ in 0..8 {
        let changed = rbac_policy(store).aggregated();
        if changed.is_empty() {
            return;
        }
        for (name, rules) in changed {
            let rules = serde_json::to_value(&rules).unwrap_or_default();
            let write = WriteOptions::default();
            let _ = store.modify(&def, "", &name, &write, |current| {
                let mut next = current.clone();
                next["rules"] = rules.clone();
                Ok(next)
            });
        }
    }
}
