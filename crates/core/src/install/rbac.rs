//! Least-privilege RBAC for each component (docs/install.md#least-privilege): every API call it
//! makes, as rules, and its ServiceAccount, roles and bindings.

use serde_json::{Value, json};

use super::names::{API_SERVICE, APISERVER, CDI_GROUP, MUTATING_WEBHOOKS, VALIDATING_WEBHOOKS};
use super::pieces::{named, rule};
use super::release::{Release, labels};

/// Every API call `cdi controller` makes, cluster-wide: its claims, pods, Services and Secrets in
/// DataVolumes' namespaces, the volumes it hands over, the CDI kinds, snapshots, events, and the
/// access reviews of DataImportCrons' clones.
pub(super) fn controller_cluster_rules() -> Vec<Value> {
    vec![
        rule(
            &[""],
            &["persistentvolumeclaims"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(
            &[""],
            &["pods"],
            &["get", "list", "watch", "create", "delete"],
        ),
        rule(&[""], &["services"], &["create", "delete"]),
        rule(&[""], &["secrets"], &["get", "create", "delete"]),
        rule(&[""], &["configmaps"], &["get"]),
        rule(&[""], &["events"], &["list", "watch"]),
        rule(&["events.k8s.io"], &["events"], &["create", "patch"]),
        rule(&[""], &["persistentvolumes"], &["list", "patch"]),
        rule(&[""], &["nodes"], &["get"]),
        rule(
            &["storage.k8s.io"],
            &["storageclasses", "csidrivers"],
            &["list", "watch"],
        ),
        rule(
            &["snapshot.storage.k8s.io"],
            &["volumesnapshots"],
            &["get", "list", "create", "patch", "delete"],
        ),
        rule(
            &["snapshot.storage.k8s.io"],
            &["volumesnapshotcontents"],
            &["get"],
        ),
        rule(
            &["snapshot.storage.k8s.io"],
            &["volumesnapshotclasses"],
            &["list"],
        ),
        rule(
            &[CDI_GROUP],
            &["cdiconfigs"],
            &["get", "list", "watch", "create", "patch"],
        ),
        rule(&[CDI_GROUP], &["cdis"], &["list", "watch"]),
        rule(
            &[CDI_GROUP],
            &["storageprofiles"],
            &["list", "watch", "create", "patch", "delete"],
        ),
        rule(
            &[CDI_GROUP],
            &["datavolumes"],
            &["get", "list", "watch", "create", "patch", "delete"],
        ),
        rule(
            &[CDI_GROUP],
            &["datavolumes/status", "storageprofiles/status"],
            &["patch"],
        ),
        rule(
            &[CDI_GROUP],
            &["datasources"],
            &["get", "list", "watch", "create", "patch"],
        ),
        rule(
            &[CDI_GROUP],
            &["dataimportcrons"],
            &["get", "list", "watch", "patch"],
        ),
        rule(
            &[CDI_GROUP],
            &["volumeimportsources", "volumeclonesources"],
            &["get", "create", "delete"],
        ),
        rule(&[CDI_GROUP], &["volumeclonesources"], &["list"]),
        rule(&[CDI_GROUP], &["volumeuploadsources"], &["get", "create"]),
        rule(
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
            &["create"],
        ),
        // Its own writes to a DataVolume cloning from another namespace pass the clone
        // authorization webhook, as the creator's did.
        rule(&[CDI_GROUP], &["datavolumes/source"], &["create"]),
        // Where OwnerReferencesPermissionEnforcement is on, an owner reference that blocks its
        // owner's deletion needs this.
        rule(&[CDI_GROUP], &["datavolumes/finalizers"], &["update"]),
        rule(
            &[""],
            &["persistentvolumeclaims/finalizers", "pods/finalizers"],
            &["update"],
        ),
    ]
}

/// What the controller does in its own namespace: its lease. (The certificates and their
/// bundles are the operator's.)
pub(super) fn controller_namespace_rules() -> Vec<Value> {
    vec![
        rule(&["coordination.k8s.io"], &["leases"], &["create"]),
        named(
            &["coordination.k8s.io"],
            &["leases"],
            &["cdi-controller-leader-election-helper"],
            &["get", "patch"],
        ),
    ]
}

/// `cdi apiserver`: registers its APIService and webhooks, asks who may do what, and reads what
/// its webhooks decide on.
pub(super) fn apiserver_cluster_rules() -> Vec<Value> {
    let mutating = MUTATING_WEBHOOKS;
    let validating = VALIDATING_WEBHOOKS;
    vec![
        rule(
            &["authorization.k8s.io"],
            &["subjectaccessreviews"],
            &["create"],
        ),
        rule(&["apiregistration.k8s.io"], &["apiservices"], &["create"]),
        named(
            &["apiregistration.k8s.io"],
            &["apiservices"],
            &[API_SERVICE],
            &["patch"],
        ),
        rule(
            &["admissionregistration.k8s.io"],
            &[
                "mutatingwebhookconfigurations",
                "validatingwebhookconfigurations",
            ],
            &["create"],
        ),
        named(
            &["admissionregistration.k8s.io"],
            &["mutatingwebhookconfigurations"],
            mutating,
            &["patch"],
        ),
        named(
            &["admissionregistration.k8s.io"],
            &["validatingwebhookconfigurations"],
            validating,
            &["patch"],
        ),
        rule(&[""], &["persistentvolumeclaims", "namespaces"], &["get"]),
        rule(&["storage.k8s.io"], &["storageclasses"], &["list"]),
        rule(&["snapshot.storage.k8s.io"], &["volumesnapshots"], &["get"]),
        rule(
            &[CDI_GROUP],
            &["datasources", "volumeclonesources", "cdiconfigs", "cdis"],
            &["get"],
        ),
        rule(&[CDI_GROUP], &["datavolumes", "storageprofiles"], &["list"]),
    ]
}

pub(super) fn apiserver_namespace_rules() -> Vec<Value> {
    vec![
        named(
            &[""],
            &["secrets"],
            &["cdi-api-signing-key", "cdi-apiserver-server-cert"],
            &["get"],
        ),
        named(
            &[""],
            &["configmaps"],
            &["cdi-apiserver-signer-bundle"],
            &["get"],
        ),
    ]
}

/// The upload proxy finds each upload's claim and the address of its upload pod.
pub(super) fn upload_proxy_cluster_rules() -> Vec<Value> {
    vec![rule(
        &[""],
        &["persistentvolumeclaims", "endpoints"],
        &["get"],
    )]
}

/// The RBAC objects of one component: a ServiceAccount, a ClusterRole and a Role with their
/// bindings (upstream's names: the ClusterRole of the controller is `cdi`, its binding `cdi-sa`).
pub(super) fn component_rbac(
    release: &Release,
    account: &str,
    cluster_role: &str,
    cluster_binding: &str,
    cluster_rules: Vec<Value>,
    role: &str,
    namespace_rules: Vec<Value>,
) -> Vec<Value> {
    let ns = &release.namespace;
    let subject = json!([{"kind": "ServiceAccount", "name": account, "namespace": ns}]);
    let mut objects = vec![
        json!({"apiVersion": "v1", "kind": "ServiceAccount",
            "metadata": {"name": account, "namespace": ns, "labels": labels(release, &[])}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": cluster_role, "labels": labels(release, &[])},
            "rules": cluster_rules}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": cluster_binding, "labels": labels(release, &[])},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cluster_role},
            "subjects": subject}),
    ];
    if !namespace_rules.is_empty() {
        objects.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": role, "namespace": ns, "labels": labels(release, &[])},
            "rules": namespace_rules}),
        );
        objects.push(
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": role, "namespace": ns, "labels": labels(release, &[])},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
            "subjects": subject}),
        );
    }
    objects
}

/// The binding that lets `cdi apiserver` read how the API server authenticates the requests it
/// forwards (kube's built-in Role in kube-system).
const AUTH_READER_BINDING: &str = "cdi-apiserver-auth-reader";

pub(super) fn apiserver_auth_reader(release: &Release) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": AUTH_READER_BINDING, "namespace": "kube-system",
            "labels": labels(release, &[])},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": "extension-apiserver-authentication-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": APISERVER, "namespace": release.namespace}]})
}
