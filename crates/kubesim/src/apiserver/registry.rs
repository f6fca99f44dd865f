//! The resources the server serves: built-in kinds as a table, custom resources registered at
//! run time from CustomResourceDefinitions.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One served resource.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDef {
    /// Empty for the core group.
    pub group: String,
    pub version: String,
    pub kind: String,
    pub plural: String,
    pub singular: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Subresources served: `status`, `binding`.
    pub subresources: Vec<String>,
    /// Only `create` (SubjectAccessReview and friends): nothing is stored.
    pub create_only: bool,
    /// The CRD's structural schema, for custom resources.
    pub schema: Option<Value>,
    /// The CRD's printer columns, for custom resources.
    pub printer_columns: Vec<Value>,
    /// The fields a custom resource's CRD declares selectable (`spec.selectableFields`, paths
    /// without their leading dot), beside `metadata.name` and `metadata.namespace`.
    pub selectable_fields: Vec<String>,
    /// Further versions a custom resource is served at (its CRD's served versions besides the
    /// storage one).
    pub served_versions: Vec<String>,
    /// Set on such a further version: the version the objects are stored at.
    pub storage_version: Option<String>,
}

impl ResourceDef {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    pub fn has_status(&self) -> bool {
        self.subresources.iter().any(|s| s == "status")
    }

    pub fn verbs(&self) -> Vec<&'static str> {
        if self.create_only {
            return vec!["create"];
        }
        vec![
            "create",
            "delete",
            "deletecollection",
            "get",
            "list",
            "patch",
            "update",
            "watch",
        ]
    }

    /// The discovery entry (`APIResource`) of the resource and its subresources.
    pub fn discovery(&self) -> Vec<Value> {
        let mut main = json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": self.verbs(),
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = json!(self.categories);
        }
        let mut out = vec![main];
        for sub in &self.subresources {
            let (kind, verbs) = match sub.as_str() {
                "binding" => ("Binding", vec!["create"]),
                "token" => ("TokenRequest", vec!["create"]),
                "scale" => ("Scale", vec!["get", "patch", "update"]),
                _ => (self.kind.as_str(), vec!["get", "patch", "update"]),
            };
            out.push(json!({
                "name": format!("{}/{sub}", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": kind,
                "verbs": verbs,
            }));
        }
        out
    }
}

/// (group, version, kind, plural, namespaced, short names, categories, subresources)
type Builtin = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    bool,
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
);

/// The built-in kinds the system touches.
const BUILTINS: &[Builtin] = &[
    (
        "rbac.authorization.k8s.io",
        "v1",
        "Role",
        "roles",
        true,
        &[],
        &[],
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRole",
        "clusterroles",
        false,
        &[],
        &[],
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "RoleBinding",
        "rolebindings",
        true,
        &[],
        &[],
        &[],
    ),
    (
        "rbac.authorization.k8s.io",
        "v1",
        "ClusterRoleBinding",
        "clusterrolebindings",
        false,
        &[],
        &[],
        &[],
    ),
    (
        "",
        "v1",
        "Namespace",
        "namespaces",
        false,
        &["ns"],
        &[],
        &["status"],
    ),
    ("", "v1", "Node", "nodes", false, &["no"], &[], &["status"]),
    (
        "",
        "v1",
        "Pod",
        "pods",
        true,
        &["po"],
        &["all"],
        &["status", "binding"],
    ),
    (
        "",
        "v1",
        "Service",
        "services",
        true,
        &["svc"],
        &["all"],
        &["status"],
    ),
    ("", "v1", "Endpoints", "endpoints", true, &["ep"], &[], &[]),
    (
        "discovery.k8s.io",
        "v1",
        "EndpointSlice",
        "endpointslices",
        true,
        &[],
        &[],
        &[],
    ),
    ("", "v1", "ConfigMap", "configmaps", true, &["cm"], &[], &[]),
    ("", "v1", "Secret", "secrets", true, &[], &[], &[]),
    (
        "",
        "v1",
        "ServiceAccount",
        "serviceaccounts",
        true,
        &["sa"],
        &[],
        &["token"],
    ),
    ("", "v1", "Event", "events", true, &["ev"], &[], &[]),
    (
        "",
        "v1",
        "ResourceQuota",
        "resourcequotas",
        true,
        &["quota"],
        &[],
        &["status"],
    ),
    (
        "",
        "v1",
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        true,
        &["pvc"],
        &[],
        &["status"],
    ),
    (
        "",
        "v1",
        "PersistentVolume",
        "persistentvolumes",
        false,
        &["pv"],
        &[],
        &["status"],
    ),
    (
        "events.k8s.io",
        "v1",
        "Event",
        "events",
        true,
        &["ev"],
        &[],
        &[],
    ),
    (
        "storage.k8s.io",
        "v1",
        "StorageClass",
        "storageclasses",
        false,
        &["sc"],
        &[],
        &[],
    ),
    (
        "storage.k8s.io",
        "v1",
        "CSIDriver",
        "csidrivers",
        false,
        &[],
        &[],
        &[],
    ),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshot",
        "volumesnapshots",
        true,
        &["vs"],
        &[],
        &["status"],
    ),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshotClass",
        "volumesnapshotclasses",
        false,
        &["vsclass", "vsclasses"],
        &[],
        &[],
    ),
    (
        "snapshot.storage.k8s.io",
        "v1",
        "VolumeSnapshotContent",
        "volumesnapshotcontents",
        false,
        &["vsc", "vscs"],
        &[],
        &["status"],
    ),
    (
        "coordination.k8s.io",
        "v1",
        "Lease",
        "leases",
        true,
        &[],
        &[],
        &[],
    ),
    (
        "scheduling.k8s.io",
        "v1",
        "PriorityClass",
        "priorityclasses",
        false,
        &["pc"],
        &[],
        &[],
    ),
    (
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        false,
        &["crd", "crds"],
        &[],
        &["status"],
    ),
    (
        "apps",
        "v1",
        "Deployment",
        "deployments",
        true,
        &["deploy"],
        &["all"],
        &["status", "scale"],
    ),
    (
        "apiregistration.k8s.io",
        "v1",
        "APIService",
        "apiservices",
        false,
        &[],
        &["api-extensions"],
        &["status"],
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "MutatingWebhookConfiguration",
        "mutatingwebhookconfigurations",
        false,
        &[],
        &["api-extensions"],
        &[],
    ),
    (
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingWebhookConfiguration",
        "validatingwebhookconfigurations",
        false,
        &[],
        &["api-extensions"],
        &[],
    ),
    (
        "apps",
        "v1",
        "ReplicaSet",
        "replicasets",
        true,
        &["rs"],
        &["all"],
        &["status", "scale"],
    ),
];

/// Every served resource, by (group, plural), and the further versions some are served at, by
/// (group, plural, version).
#[derive(Debug, Clone, Default)]
pub struct Registry {
    resources: BTreeMap<(String, String), ResourceDef>,
    further: BTreeMap<(String, String, String), ResourceDef>,
}

/// The columns `kubectl get` shows for the built-in kinds the development cluster's story is
/// about (priority 1: only with `-o wide`). Kubernetes computes some cells: the pod's are
/// computed the same way; for the others (the claim's `namespace/name`) these are the plain
/// fields closest to them.
fn builtin_columns(group: &str, plural: &str) -> Vec<Value> {
    let col = |name: &str, path: &str, priority: i64| {
        let ty = if name == "Age" { "date" } else { "string" };
        json!({"name": name, "type": ty, "jsonPath": path, "priority": priority})
    };
    let age = || col("Age", ".metadata.creationTimestamp", 0);
    match (group, plural) {
        // One printer for both APIs' Events, as kube's: each in its own field names.
        ("", "events") => vec![
            json!({"name": "Last Seen", "type": "date", "jsonPath": "#event.lastSeen", "priority": 0}),
            col("Type", ".type", 0),
            col("Reason", ".reason", 0),
            col("Object", ".involvedObject.name", 0),
            col("Message", ".message", 0),
        ],
        ("events.k8s.io", "events") => vec![
            json!({"name": "Last Seen", "type": "date", "jsonPath": "#event.lastSeen", "priority": 0}),
            col("Type", ".type", 0),
            col("Reason", ".reason", 0),
            col("Object", ".regarding.name", 0),
            col("Message", ".note", 0),
        ],
        ("apps", "deployments") => vec![
            col("Ready", "#deployment.ready", 0),
            col("Up-to-date", ".status.updatedReplicas", 0),
            col("Available", ".status.availableReplicas", 0),
            age(),
        ],
        ("", "services") => vec![
            col("Type", ".spec.type", 0),
            col("Cluster-IP", ".spec.clusterIP", 0),
            col("Ports", "#service.ports", 0),
            age(),
            col("Selector", "#service.selector", 1),
        ],
        ("apiregistration.k8s.io", "apiservices") => vec![
            col("Service", "#apiservice.service", 0),
            col("Available", "#apiservice.available", 0),
            age(),
        ],
        ("apps", "replicasets") => vec![
            col("Desired", ".spec.replicas", 0),
            col("Current", ".status.replicas", 0),
            col("Ready", ".status.readyReplicas", 0),
            age(),
        ],
        // `#…` paths are cells computed as kubectl's pod printer does (see `table`).
        ("", "pods") => vec![
            col("Ready", "#pod.ready", 0),
            col("Status", "#pod.status", 0),
            col("Restarts", "#pod.restarts", 0),
            age(),
            col("IP", ".status.podIP", 1),
            col("Node", ".spec.nodeName", 1),
        ],
        ("", "persistentvolumeclaims") => vec![
            col("Status", "#storage.status", 0),
            col("Volume", ".spec.volumeName", 0),
            col("Capacity", ".status.capacity.storage", 0),
            col("StorageClass", ".spec.storageClassName", 0),
            age(),
            col("VolumeMode", ".spec.volumeMode", 1),
            col(
                "Selected-Node",
                ".metadata.annotations.volume\\.kubernetes\\.io/selected-node",
                1,
            ),
        ],
        ("", "persistentvolumes") => vec![
            col("Capacity", ".spec.capacity.storage", 0),
            col("Reclaim Policy", ".spec.persistentVolumeReclaimPolicy", 0),
            col("Status", "#storage.status", 0),
            col("Claim", ".spec.claimRef.name", 0),
            col("StorageClass", ".spec.storageClassName", 0),
            age(),
            col("VolumeMode", ".spec.volumeMode", 1),
            col(
                "Node",
                ".spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values[0]",
                1,
            ),
        ],
        ("storage.k8s.io", "storageclasses") => vec![
            col("Provisioner", ".provisioner", 0),
            col("ReclaimPolicy", ".reclaimPolicy", 0),
            col("VolumeBindingMode", ".volumeBindingMode", 0),
            age(),
        ],
        ("", "nodes") => vec![age(), col("Taints", ".spec.taints[0].key", 1)],
        _ => Vec::new(),
    }
}

impl Registry {
    pub fn with_builtins() -> Registry {
        let mut r = Registry::default();
        for (group, version, kind, plural, namespaced, short, categories, subresources) in BUILTINS
        {
            r.add(ResourceDef {
                group: group.to_string(),
                version: version.to_string(),
                kind: kind.to_string(),
                plural: plural.to_string(),
                singular: kind.to_lowercase(),
                namespaced: *namespaced,
                short_names: short.iter().map(|s| s.to_string()).collect(),
                categories: categories.iter().map(|s| s.to_string()).collect(),
                subresources: subresources.iter().map(|s| s.to_string()).collect(),
                create_only: false,
                schema: None,
                printer_columns: builtin_columns(group, plural),
                selectable_fields: vec![],
                served_versions: vec![],
                storage_version: None,
            });
        }
        // Reviews: only created, answered by the authenticator or the RBAC authorizer, never
        // stored.
        for (group, kind, namespaced) in [
            ("authorization.k8s.io", "SubjectAccessReview", false),
            ("authorization.k8s.io", "LocalSubjectAccessReview", true),
            ("authorization.k8s.io", "SelfSubjectAccessReview", false),
            ("authorization.k8s.io", "SelfSubjectRulesReview", false),
            ("authentication.k8s.io", "TokenReview", false),
            ("authentication.k8s.io", "SelfSubjectReview", false),
        ] {
            r.add(ResourceDef {
                group: group.into(),
                version: "v1".into(),
                kind: kind.into(),
                plural: format!("{}s", kind.to_lowercase()),
                singular: kind.to_lowercase(),
                namespaced,
                short_names: vec![],
                categories: vec![],
                subresources: vec![],
                create_only: true,
                schema: None,
                printer_columns: vec![],
                selectable_fields: vec![],
                served_versions: vec![],
                storage_version: None,
            });
        }
        r
    }

    pub fn add(&mut self, def: ResourceDef) {
        self.remove_further(&def.group, &def.plural);
        for version in &def.served_versions {
            let at = ResourceDef {
                version: version.clone(),
                served_versions: vec![],
                storage_version: Some(def.version.clone()),
                ..def.clone()
            };
            self.further
                .insert((def.group.clone(), def.plural.clone(), version.clone()), at);
        }
        self.resources
            .insert((def.group.clone(), def.plural.clone()), def);
    }

    fn remove_further(&mut self, group: &str, plural: &str) {
        self.further
            .retain(|(g, p, _), _| !(g == group && p == plural));
    }

    pub fn remove(&mut self, group: &str, plural: &str) -> Option<ResourceDef> {
        self.remove_further(group, plural);
        self.resources
            .remove(&(group.to_string(), plural.to_string()))
    }

    /// The resource at `/apis/{group}/{version}/{plural}` (or `/api/v1/{plural}`): stored at
    /// that version, or served there over another.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.resources
            .get(&(group.to_string(), plural.to_string()))
            .filter(|d| d.version == version)
            .or_else(|| {
                self.further
                    .get(&(group.to_string(), plural.to_string(), version.to_string()))
            })
    }

    pub fn all(&self) -> impl Iterator<Item = &ResourceDef> {
        self.resources.values()
    }

    /// Groups with their versions, core group excluded, in a stable order; storage versions
    /// first (the preferred ones).
    pub fn groups(&self) -> BTreeMap<String, Vec<String>> {
        let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let all = self.resources.values().chain(self.further.values());
        for d in all.filter(|d| !d.group.is_empty()) {
            let versions = groups.entry(d.group.clone()).or_default();
            if !versions.contains(&d.version) {
                versions.push(d.version.clone());
            }
        }
        groups
    }

    /// Resources of one group version.
    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<&ResourceDef> {
        self.resources
            .values()
            .chain(self.further.values())
            .filter(|d| d.group == group && d.version == version)
            .collect()
    }
}
