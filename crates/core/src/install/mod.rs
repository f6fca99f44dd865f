//! An installation of CDI, as its operator makes it (upstream's `pkg/operator/resources`): the
//! operator's own manifests (what `cdi install` prints), the objects it keeps for a `CDI`
//! resource (each component's ServiceAccount, least-privilege RBAC, Service and Deployment), and
//! the resource's status from what it observes. Pure: `cdi operator` applies and writes.

use cdi_api::config::{CDI, CDIStatus, ComponentConfig, OperatorCondition};
use cdi_api::enums::{CdiPhase, ConditionStatus};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

/// The operator's finalizer on the CDI resource (upstream's).
pub const FINALIZER: &str = "operator.cdi.kubevirt.io";
/// On the CDI resource: its `spec.config` is what CDIConfig holds (upstream's).
pub const CONFIG_AUTHORITY: &str = "cdi.kubevirt.io/configAuthority";
/// The label every object the operator keeps carries, with the release that last wrote it.
pub const UPDATE_VERSION: &str = "operator.cdi.kubevirt.io/updateVersion";
/// Who manages the component objects (upstream's value).
pub const MANAGED_BY: &str = "cdi-operator";

/// The webhook configurations `cdi apiserver` registers (upstream's names).
pub const MUTATING_WEBHOOKS: &[&str] = &["cdi-api-datavolume-mutate", "cdi-api-pvc-mutate"];
pub const VALIDATING_WEBHOOKS: &[&str] = &[
    "cdi-api-datavolume-validate",
    "cdi-api-dataimportcron-validate",
    "cdi-api-populator-validate",
    "cdi-api-validate",
];
/// The APIService of the upload token API.
pub const API_SERVICE: &str = "v1beta1.upload.cdi.kubevirt.io";

/// The three component Deployments (upstream's names).
pub const CONTROLLER: &str = "cdi-deployment";
pub const APISERVER: &str = "cdi-apiserver";
pub const UPLOAD_PROXY: &str = "cdi-uploadproxy";
pub const OPERATOR: &str = "cdi-operator";
/// The Lease one operator at a time holds (upstream's name).
pub const OPERATOR_LEASE: &str = "cdi-operator-leader-election-helper";
/// The ServiceAccount the controller runs as (upstream's).
pub const CONTROLLER_ACCOUNT: &str = "cdi-sa";

/// What a release is made of: the operator's environment upstream names the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub namespace: String,
    pub version: String,
    pub operator_image: String,
    pub controller_image: String,
    pub importer_image: String,
    pub cloner_image: String,
    pub upload_server_image: String,
    pub upload_proxy_image: String,
    pub apiserver_image: String,
    pub pull_policy: String,
    pub verbosity: u32,
    /// Where Prometheus runs (its ServiceAccount `prometheus-k8s` reads CDI's metrics
    /// endpoints); upstream's `MONITORING_NAMESPACE`.
    pub monitoring_namespace: String,
}

/// Upstream's default monitoring namespace.
pub const MONITORING_NAMESPACE: &str = "monitoring";

/// The operator's environment variables for the images (upstream's names), in manifest order.
const IMAGE_ENV: [&str; 7] = [
    "OPERATOR_IMAGE",
    "CONTROLLER_IMAGE",
    "IMPORTER_IMAGE",
    "CLONER_IMAGE",
    "APISERVER_IMAGE",
    "UPLOAD_SERVER_IMAGE",
    "UPLOAD_PROXY_IMAGE",
];

impl Release {
    /// A release whose images are `<registry>/cdi-<component>:<tag>`, as upstream names them.
    pub fn tagged(registry: &str, tag: &str, namespace: &str) -> Release {
        let image = |c: &str| format!("{}/cdi-{c}:{tag}", registry.trim_end_matches('/'));
        Release {
            namespace: namespace.to_string(),
            version: tag.to_string(),
            operator_image: image("operator"),
            controller_image: image("controller"),
            importer_image: image("importer"),
            cloner_image: image("cloner"),
            upload_server_image: image("uploadserver"),
            upload_proxy_image: image("uploadproxy"),
            apiserver_image: image("apiserver"),
            pull_policy: "IfNotPresent".into(),
            verbosity: 1,
            monitoring_namespace: MONITORING_NAMESPACE.into(),
        }
    }

    fn images(&self) -> [&String; 7] {
        [
            &self.operator_image,
            &self.controller_image,
            &self.importer_image,
            &self.cloner_image,
            &self.apiserver_image,
            &self.upload_server_image,
            &self.upload_proxy_image,
        ]
    }

    /// The release the operator runs: its environment (as its Deployment sets it) and its
    /// namespace. A missing variable is named.
    pub fn from_env(
        get: impl Fn(&str) -> Option<String>,
        namespace: &str,
    ) -> Result<Release, String> {
        let need = |name: &str| {
            get(name).filter(|v| !v.is_empty()).ok_or_else(|| {
                format!("the operator's environment has no {name}: set it in the cdi-operator Deployment (cdi install prints one)")
            })
        };
        let mut images = Vec::new();
        for name in IMAGE_ENV {
            images.push(need(name)?);
        }
        let verbosity = match get("VERBOSITY").filter(|v| !v.is_empty()) {
            None => 1,
            Some(v) => v
                .parse()
                .map_err(|_| format!("VERBOSITY {v:?} is not a number"))?,
        };
        let [
            operator,
            controller,
            importer,
            cloner,
            apiserver,
            upload_server,
            upload_proxy,
        ] = <[String; 7]>::try_from(images).expect("seven names were read");
        Ok(Release {
            namespace: namespace.to_string(),
            version: need("OPERATOR_VERSION")?,
            operator_image: operator,
            controller_image: controller,
            importer_image: importer,
            cloner_image: cloner,
            upload_server_image: upload_server,
            upload_proxy_image: upload_proxy,
            apiserver_image: apiserver,
            pull_policy: get("PULL_POLICY")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "IfNotPresent".into()),
            verbosity,
            monitoring_namespace: get("MONITORING_NAMESPACE")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| MONITORING_NAMESPACE.into()),
        })
    }

    /// The operator container's environment for this release.
    fn env(&self) -> Value {
        let mut env = vec![json!({"name": "OPERATOR_VERSION", "value": self.version})];
        for (name, image) in IMAGE_ENV.iter().zip(self.images()) {
            env.push(json!({"name": name, "value": image}));
        }
        env.push(json!({"name": "PULL_POLICY", "value": self.pull_policy}));
        env.push(json!({"name": "VERBOSITY", "value": self.verbosity.to_string()}));
        env.push(json!({"name": "MONITORING_NAMESPACE", "value": self.monitoring_namespace}));
        env.push(pod_namespace());
        Value::Array(env)
    }
}

fn pod_namespace() -> Value {
    json!({"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}})
}

/// The labels every component object carries (upstream's), and the release that wrote it.
fn labels(release: &Release, more: &[(&str, &str)]) -> Value {
    let mut l = json!({
        "cdi.kubevirt.io": "",
        "app": "containerized-data-importer",
        "app.kubernetes.io/managed-by": MANAGED_BY,
        "app.kubernetes.io/component": "storage",
        UPDATE_VERSION: release.version,
    });
    for (k, v) in more {
        l[*k] = json!(v);
    }
    l
}

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn named(groups: &[&str], resources: &[&str], names: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "resourceNames": names, "verbs": verbs})
}

const CDI_GROUP: &str = "cdi.kubevirt.io";

/// Every API call `cdi controller` makes, cluster-wide: its claims, pods, Services and Secrets in
/// DataVolumes' namespaces, the volumes it hands over, the CDI kinds, snapshots, events, and the
/// access reviews of DataImportCrons' clones.
fn controller_cluster_rules() -> Vec<Value> {
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
fn controller_namespace_rules() -> Vec<Value> {
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
fn apiserver_cluster_rules() -> Vec<Value> {
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

fn apiserver_namespace_rules() -> Vec<Value> {
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
fn upload_proxy_cluster_rules() -> Vec<Value> {
    vec![rule(
        &[""],
        &["persistentvolumeclaims", "endpoints"],
        &["get"],
    )]
}

/// The RBAC objects of one component: a ServiceAccount, a ClusterRole and a Role with their
/// bindings (upstream's names: the ClusterRole of the controller is `cdi`, its binding `cdi-sa`).
fn component_rbac(
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

fn apiserver_auth_reader(release: &Release) -> Value {
    json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": AUTH_READER_BINDING, "namespace": "kube-system",
            "labels": labels(release, &[])},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
            "name": "extension-apiserver-authentication-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": APISERVER, "namespace": release.namespace}]})
}

fn service(release: &Release, name: &str, component: &str, port: u16, target: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": release.namespace,
            "labels": labels(release, &[("cdi.kubevirt.io", component)])},
        "spec": {"selector": {"cdi.kubevirt.io": component},
            "ports": [{"port": port, "targetPort": target, "protocol": "TCP"}]}})
}

/// A component's Deployment (upstream's shape): one container running as non-root with every
/// capability dropped, placed by `spec.infra`, pulled by `spec.imagePullPolicy`.
struct Component<'a> {
    name: &'a str,
    account: &'a str,
    image: &'a str,
    replicas: Option<i32>,
    container: Value,
    volumes: Value,
}

fn deployment(release: &Release, cdi: &CDI, c: Component) -> Value {
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

fn secret_volume(name: &str) -> Value {
    json!({"name": name, "secret": {"secretName": name}})
}

fn bundle_volume(name: &str) -> Value {
    json!({"name": name, "configMap": {"name": name}})
}

fn mount(name: &str, at: &str) -> Value {
    json!({"name": name, "mountPath": at, "readOnly": true})
}

fn probe(scheme: &str, path: &str, port: Value) -> Value {
    json!({"httpGet": {"path": path, "port": port, "scheme": scheme},
        "initialDelaySeconds": 2, "periodSeconds": 5, "failureThreshold": 3, "timeoutSeconds": 1})
}

/// Everything the operator keeps for `cdi`, in the order it applies them: accounts and RBAC,
/// the roles CDI's users get, the Services (before the Deployments: the controller puts their
/// addresses in its certificates), the Deployments.
pub fn components(release: &Release, cdi: &CDI) -> Vec<Value> {
    let infra = cdi.spec.infra.clone().unwrap_or_default();
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
    for mut role in crate::rbac::user_roles() {
        let mut l = labels(release, &[]);
        if let Some(own) = role["metadata"]["labels"].as_object() {
            for (k, v) in own {
                l[k] = v.clone();
            }
        }
        role["metadata"]["labels"] = l;
        objects.push(role);
    }
    objects.push(service(
        release,
        UPLOAD_PROXY,
        UPLOAD_PROXY,
        443,
        json!(8443),
    ));
    objects.push(service(release, "cdi-api", APISERVER, 443, json!(8443)));
    objects.push(json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "cdi-prometheus-metrics", "namespace": release.namespace,
            "labels": labels(release, &[("prometheus.cdi.kubevirt.io", "true")])},
        "spec": {"selector": {"prometheus.cdi.kubevirt.io": "true"},
            "ports": [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]}}));
    objects.push(deployment(
        release,
        cdi,
        Component {
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
        },
    ));
    objects.push(deployment(
        release,
        cdi,
        Component {
            name: APISERVER,
            account: APISERVER,
            image: &release.apiserver_image,
            replicas: infra.api_server_replicas,
            container: json!({
                "ports": [{"name": APISERVER, "containerPort": 8443, "protocol": "TCP"}],
                "readinessProbe": probe("HTTPS", "/readyz", json!(8443)),
            }),
            volumes: json!([]),
        },
    ));
    objects.push(deployment(
        release,
        cdi,
        Component {
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
        },
    ));
    objects
}

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

/// The objects an earlier release made that this one no longer makes, among those the
/// operator labels: every object this release wants is applied with its version, so what still
/// carries another one is left over (upstream prunes the same way, by its createVersion label).
pub fn leftover_selector(release: &Release) -> String {
    format!(
        "app.kubernetes.io/managed-by={MANAGED_BY},{UPDATE_VERSION},{UPDATE_VERSION}!={}",
        release.version
    )
}

/// The kinds a release's leftovers are looked for in: (apiVersion, kind, namespace); the
/// optional kinds only where their CRDs are.
pub fn leftover_kinds(
    release: &Release,
    monitoring: bool,
    populators: bool,
) -> Vec<(&'static str, &'static str, Option<String>)> {
    let ns = || Some(release.namespace.clone());
    let rbac = "rbac.authorization.k8s.io/v1";
    let mut kinds = vec![
        ("apps/v1", "Deployment", ns()),
        ("v1", "Service", ns()),
        ("v1", "ServiceAccount", ns()),
        (rbac, "Role", ns()),
        (rbac, "RoleBinding", ns()),
        (rbac, "RoleBinding", Some("kube-system".to_string())),
        (rbac, "ClusterRole", None),
        (rbac, "ClusterRoleBinding", None),
    ];
    if monitoring {
        kinds.push(("monitoring.coreos.com/v1", "PrometheusRule", ns()));
        kinds.push(("monitoring.coreos.com/v1", "ServiceMonitor", ns()));
    }
    if populators {
        kinds.push(("populator.storage.k8s.io/v1beta1", "VolumePopulator", None));
    }
    kinds
}

/// The CRDs whose presence adds objects to an install: Prometheus Operator's (then CDI's rules,
/// alerts and scrape target) and the volume populators' registry.
pub const PROMETHEUS_RULE_CRD: &str = "prometheusrules.monitoring.coreos.com";
pub const SERVICE_MONITOR_CRD: &str = "servicemonitors.monitoring.coreos.com";
pub const VOLUME_POPULATOR_CRD: &str = "volumepopulators.populator.storage.k8s.io";

/// What Prometheus is allowed in CDI's namespace to find what to scrape (upstream's
/// `cdi-monitoring` Role).
fn prometheus_rules() -> Vec<Value> {
    vec![rule(
        &[""],
        &["services", "endpoints", "pods"],
        &["get", "list", "watch"],
    )]
}

/// When Prometheus Operator's CRDs are there: the PrometheusRule with CDI's recording rules and
/// alerts, a ServiceMonitor for the metrics Service, and the Role letting Prometheus's account
/// (`prometheus-k8s` in the monitoring namespace) find its endpoints; upstream's names.
pub fn monitoring(release: &Release) -> Vec<Value> {
    let ns = &release.namespace;
    let mut rule = crate::monitoring::prometheus_rule(ns);
    rule["metadata"]["labels"] = labels(release, &[("prometheus.cdi.kubevirt.io", "true")]);
    let prometheus = labels(release, &[("prometheus.cdi.kubevirt.io", "true")]);
    vec![
        rule,
        json!({"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "service-monitor-cdi", "namespace": ns,
                "labels": labels(release, &[("prometheus.cdi.kubevirt.io", "true"),
                    ("openshift.io/cluster-monitoring", "")])},
            "spec": {"selector": {"matchLabels": {"prometheus.cdi.kubevirt.io": "true"}},
                "namespaceSelector": {"matchNames": [ns]},
                // cdi-rs serves its metrics over plain HTTP on the port named `metrics`.
                "endpoints": [{"port": "metrics", "scheme": "http"}]}}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "cdi-monitoring", "namespace": ns, "labels": prometheus},
            "rules": prometheus_rules()}),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": "cdi-monitoring", "namespace": ns, "labels": prometheus},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                "name": "cdi-monitoring"},
            "subjects": [{"kind": "ServiceAccount", "name": "prometheus-k8s",
                "namespace": release.monitoring_namespace}]}),
    ]
}

/// When the volume populators' CRD is there: CDI's populator kinds registered, so that
/// kube's volume-data-source-validator accepts claims naming them (upstream's names: each
/// kind in lower case).
pub fn volume_populators(release: &Release) -> Vec<Value> {
    [
        "VolumeImportSource",
        "VolumeUploadSource",
        "VolumeCloneSource",
    ]
    .iter()
    .map(|kind| {
        json!({"apiVersion": "populator.storage.k8s.io/v1beta1", "kind": "VolumePopulator",
                "metadata": {"name": kind.to_ascii_lowercase(), "labels": labels(release, &[])},
                "sourceKind": {"group": CDI_GROUP, "kind": kind}})
    })
    .collect()
}

/// The CRDs of the CDI kinds as objects to apply: the CDI kind's own (`cdi_kind`), which comes
/// with the operator's manifests, or every other, which the operator keeps.
pub fn crds(cdi_kind: bool) -> Vec<Value> {
    cdi_api::crd::crds()
        .into_iter()
        .filter(|c| (c.spec.names.kind == "CDI") == cdi_kind)
        // A CRD is plain data; its apiVersion and kind come with it.
        .map(|c| serde_json::to_value(c).expect("a CRD is JSON"))
        .collect()
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

/// Whether a Deployment has rolled out its current template and all its replicas are ready.
pub fn rolled_out(d: &Deployment) -> bool {
    let want = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let Some(s) = &d.status else {
        return false;
    };
    s.observed_generation.unwrap_or(0) >= d.metadata.generation.unwrap_or(0)
        && s.updated_replicas.unwrap_or(0) == want
        && s.ready_replicas.unwrap_or(0) == want
        && s.replicas.unwrap_or(0) == want
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    now: &Time,
) -> OperatorCondition {
    OperatorCondition {
        type_: type_.into(),
        status: if status {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        },
        reason: (!reason.is_empty()).then(|| reason.to_string()),
        message: (!message.is_empty()).then(|| message.to_string()),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(now.clone()),
    }
}

/// A condition that is False, without a reason.
const NONE: (bool, &str, &str) = (false, "", "");

/// Conditions as upstream's operator SDK sets them, keeping a transition time that did not
/// change.
fn conditions(
    old: Option<&[OperatorCondition]>,
    [available, progressing, degraded]: [(bool, &str, &str); 3],
    now: &Time,
) -> Vec<OperatorCondition> {
    [
        ("Available", available),
        ("Progressing", progressing),
        ("Degraded", degraded),
    ]
    .into_iter()
    .map(|(t, (s, reason, message))| {
        let mut c = condition(t, s, reason, message, now);
        if let Some(prev) = old.into_iter().flatten().find(|c| c.type_ == t)
            && prev.status == c.status
            && prev.reason == c.reason
            && prev.message == c.message
        {
            c = prev.clone();
        }
        c
    })
    .collect()
}

/// The CDI resource's status, from what the operator sees of its Deployments (upstream's
/// phases and conditions): `Deploying` until every component has rolled out, then `Deployed`
/// (Available); `Upgrading` while a new release rolls out over a deployed one; Degraded when a
/// deployed component loses a replica. `deployments` are the components' as observed.
pub fn status(cdi: &CDI, release: &Release, deployments: &[Deployment], now: Time) -> CDIStatus {
    let old = cdi.status.clone().unwrap_or_default();
    let old_conditions = old.conditions.as_deref();
    let ready = [CONTROLLER, APISERVER, UPLOAD_PROXY].iter().all(|name| {
        deployments
            .iter()
            .find(|d| d.metadata.name.as_deref() == Some(name))
            .is_some_and(|d| {
                rolled_out(d)
                    && d.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(UPDATE_VERSION))
                        == Some(&release.version)
            })
    });
    let observed = old.observed_version.clone().filter(|v| !v.is_empty());
    let mut status = CDIStatus {
        operator_version: Some(release.version.clone()),
        target_version: Some(release.version.clone()),
        observed_version: observed.clone(),
        ..Default::default()
    };
    let deployed_before = matches!(old.phase, Some(CdiPhase::Deployed | CdiPhase::Upgrading));
    let upgrading = deployed_before && observed.as_deref() != Some(release.version.as_str());
    let upgrade = format!("Started upgrade to version {}", release.version);
    let (phase, conds) = if ready {
        status.observed_version = Some(release.version.clone());
        (
            CdiPhase::Deployed,
            [
                (true, "DeployCompleted", "Deployment Completed"),
                NONE,
                NONE,
            ],
        )
    } else if upgrading {
        let started = (true, "UpgradeStarted", upgrade.as_str());
        (CdiPhase::Upgrading, [(true, "", ""), started, started])
    } else if deployed_before {
        (
            CdiPhase::Deployed,
            [
                (true, "DeployCompleted", "Deployment Completed"),
                NONE,
                (true, "", ""),
            ],
        )
    } else {
        (
            CdiPhase::Deploying,
            [NONE, (true, "DeployStarted", "Started Deployment"), NONE],
        )
    };
    status.phase = Some(phase);
    status.conditions = Some(conditions(old_conditions, conds, &now));
    status
}

/// `kubevirt_cdi_cr_ready` from the resource's conditions (upstream's rule): 1 when Available,
/// 0 when not and not progressing, and unchanged (None) while progressing.
pub fn cr_ready(status: Option<&CDIStatus>) -> Option<i64> {
    let conditions = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let is = |t: &str| {
        conditions
            .iter()
            .any(|c| c.type_ == t && c.status == ConditionStatus::True)
    };
    if is("Available") {
        Some(1)
    } else if !is("Progressing") {
        Some(0)
    } else {
        None
    }
}

/// Which CDI resource is the installation: the one that holds the finalizer, else the oldest.
/// Any other is refused (upstream's `ConfigError`).
pub fn active(all: &[CDI]) -> Option<&CDI> {
    let holds = |c: &&CDI| {
        c.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    };
    all.iter().find(holds).or_else(|| {
        all.iter()
            .filter(|c| c.metadata.deletion_timestamp.is_none())
            .min_by_key(|c| {
                (
                    c.metadata.creation_timestamp.as_ref().map(|t| t.0),
                    c.metadata.name.clone(),
                )
            })
    })
}

/// The status of a CDI resource that is not the installation.
pub fn unwanted(now: Time) -> CDIStatus {
    CDIStatus {
        phase: Some(CdiPhase::Error),
        conditions: Some(conditions(
            None,
            [
                NONE,
                NONE,
                (
                    true,
                    "ConfigError",
                    "Reconciling to error state, unwanted CDI object",
                ),
            ],
            &now,
        )),
        ..Default::default()
    }
}

/// What the operator removes on uninstall besides what the garbage collector takes with the
/// resource: the webhooks and APIService `cdi apiserver` registers and the certificates the
/// controller makes (kind, name) in the namespace.
pub const LEFT_BY_COMPONENTS: &[(&str, &str)] = &[
    ("Secret", "cdi-api-signing-key"),
    ("Secret", "cdi-apiserver-signer"),
    ("Secret", "cdi-apiserver-server-cert"),
    ("Secret", "cdi-uploadproxy-signer"),
    ("Secret", "cdi-uploadproxy-server-cert"),
    ("Secret", "cdi-uploadserver-signer"),
    ("Secret", "cdi-uploadserver-client-signer"),
    ("Secret", "cdi-uploadserver-client-cert"),
    ("ConfigMap", "cdi-apiserver-signer-bundle"),
    ("ConfigMap", "cdi-uploadproxy-signer-bundle"),
    ("ConfigMap", "cdi-uploadserver-signer-bundle"),
    ("ConfigMap", "cdi-uploadserver-client-signer-bundle"),
    ("Lease", "cdi-controller-leader-election-helper"),
];

/// The labels of worker pods and Services the operator clears on uninstall (upstream's).
pub const WORKER_SELECTOR: &str =
    "cdi.kubevirt.io in (importer, cdi-upload-server, cdi-clone-source)";

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

#[cfg(test)]
mod tests;
