//! The ClusterRoles CDI installs for its users (upstream's operator installs the same): what
//! `admin`, `edit` and `view` grant on CDI's kinds, through Kubernetes' role aggregation, and
//! the config reader every authenticated user is bound to.

use serde_json::{Value, json};

const OWN: [&str; 6] = [
    "datavolumes",
    "dataimportcrons",
    "datasources",
    "volumeimportsources",
    "volumeuploadsources",
    "volumeclonesources",
];

fn aggregate(name: &str, to: &str, rules: Value) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name, "labels": {
            format!("rbac.authorization.k8s.io/aggregate-to-{to}"): "true",
            "cdi.kubevirt.io": ""}},
        "rules": rules})
}

/// `admin` and `edit` may do anything with CDI's namespaced kinds and ask for upload tokens.
fn editor_rules() -> Value {
    json!([
        {"apiGroups": ["cdi.kubevirt.io"], "resources": OWN, "verbs": ["*"]},
        {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"], "verbs": ["create"]},
        {"apiGroups": ["upload.cdi.kubevirt.io"], "resources": ["uploadtokenrequests"], "verbs": ["*"]},
        {"apiGroups": ["forklift.cdi.kubevirt.io"],
            "resources": ["ovirtvolumepopulators", "openstackvolumepopulators"], "verbs": ["*"]}
    ])
}

/// The ClusterRoles and the ClusterRoleBinding, as objects to create.
pub fn user_roles() -> Vec<Value> {
    let read = json!(["get", "list", "watch"]);
    vec![
        aggregate("cdi.kubevirt.io:admin", "admin", editor_rules()),
        aggregate("cdi.kubevirt.io:edit", "edit", editor_rules()),
        aggregate(
            "cdi.kubevirt.io:view",
            "view",
            json!([
                {"apiGroups": ["cdi.kubevirt.io"], "resources": ["cdiconfigs", "dataimportcrons",
                    "datasources", "datavolumes", "objecttransfers", "storageprofiles",
                    "volumeimportsources", "volumeuploadsources", "volumeclonesources"],
                    "verbs": read},
                {"apiGroups": ["forklift.cdi.kubevirt.io"],
                    "resources": ["ovirtvolumepopulators", "openstackvolumepopulators"],
                    "verbs": read}
            ]),
        ),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "cdi.kubevirt.io:clone-sourcer"},
            "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"],
                "verbs": ["create"]}]}),
        // Everyone may read the cluster's CDI settings (where the upload proxy is, the
        // profiles of the classes).
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "cdi.kubevirt.io:config-reader"},
            "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["cdiconfigs", "storageprofiles"],
                "verbs": read}]}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "cdi.kubevirt.io:config-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "cdi.kubevirt.io:config-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                "name": "system:authenticated"}]}),
    ]
}
