//! RBAC as kube-apiserver's authorizer decides it (`plugin/pkg/auth/authorizer/rbac` and
//! `pkg/registry/rbac/validation`): who a request is, what it asks, and whether a binding grants
//! it; the rules a user has in a namespace (SelfSubjectRulesReview); the rules of aggregated
//! ClusterRoles; and kube's words for a refusal.
//!
//! Pure: the caller hands in the Roles, ClusterRoles and bindings it holds.

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};

/// Who is asking (authenticated, or impersonated).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// What is asked, as kube's `authorizer.Attributes` names it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    pub verb: String,
    /// A resource request (`/api`, `/apis/...` naming a resource) or a path (`/healthz`, discovery).
    pub resource_request: bool,
    pub namespace: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    /// The URL path of a non-resource request.
    pub path: String,
}

/// The RBAC objects a decision reads.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub roles: Vec<Role>,
    pub cluster_roles: Vec<ClusterRole>,
    pub role_bindings: Vec<RoleBinding>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
}

/// The group every member of `system:masters` belongs to: allowed everything, as kube-apiserver's
/// `cluster-admin` binding does (and as the first request of a fresh cluster needs).
pub const MASTERS: &str = "system:masters";

fn any_or(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

fn resource_matches(rule: &PolicyRule, combined: &str, subresource: &str) -> bool {
    rule.resources.iter().flatten().any(|r| {
        r == "*"
            || r == combined
            // `*/scale` grants that subresource of every resource.
            || (!subresource.is_empty()
                && r.strip_prefix("*/") == Some(subresource))
    })
}

fn name_matches(rule: &PolicyRule, name: &str) -> bool {
    match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => !name.is_empty() && names.iter().any(|n| n == name),
    }
}

fn url_matches(rule: &PolicyRule, path: &str) -> bool {
    rule.non_resource_urls
        .iter()
        .flatten()
        .any(|u| u == "*" || u == path || u.strip_suffix('*').is_some_and(|p| path.starts_with(p)))
}

/// Whether one rule grants the request (kube's `RuleAllows`).
pub fn rule_allows(rule: &PolicyRule, a: &Attributes) -> bool {
    if !any_or(&rule.verbs, &a.verb) {
        return false;
    }
    if !a.resource_request {
        return url_matches(rule, &a.path);
    }
    let combined = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    any_or(rule.api_groups.as_deref().unwrap_or_default(), &a.api_group)
        && resource_matches(rule, &combined, &a.subresource)
        && name_matches(rule, &a.name)
}

/// Whether `subject` names `user`; a ServiceAccount subject without a namespace is in the
/// binding's.
fn applies_to(subject: &Subject, user: &UserInfo, binding_namespace: &str) -> bool {
    match subject.kind.as_str() {
        "User" => subject.name == user.name,
        "Group" => user.groups.contains(&subject.name),
        "ServiceAccount" => {
            let ns = subject
                .namespace
                .as_deref()
                .filter(|n| !n.is_empty())
                .unwrap_or(binding_namespace);
            user.name == format!("system:serviceaccount:{ns}:{}", subject.name)
        }
        _ => false,
    }
}

impl Policy {
    fn cluster_role(&self, name: &str) -> Option<&ClusterRole> {
        self.cluster_roles
            .iter()
            .find(|r| r.metadata.name.as_deref() == Some(name))
    }

    fn role(&self, namespace: &str, name: &str) -> Option<&Role> {
        self.roles.iter().find(|r| {
            r.metadata.namespace.as_deref() == Some(namespace)
                && r.metadata.name.as_deref() == Some(name)
        })
    }

    /// Every rule `user` holds in `namespace` (cluster-wide ones included; `namespace` empty:
    /// cluster-wide ones only), with the binding that grants it.
    pub fn rules_for(&self, user: &UserInfo, namespace: &str) -> Vec<(String, PolicyRule)> {
        let mut rules = Vec::new();
        for b in &self.cluster_role_bindings {
            let subjects = b.subjects.iter().flatten();
            if b.role_ref.kind != "ClusterRole"
                || !subjects.clone().any(|s| applies_to(s, user, ""))
            {
                continue;
            }
            if let Some(role) = self.cluster_role(&b.role_ref.name) {
                let by = format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of ClusterRole {:?} to {}",
                    b.metadata.name.as_deref().unwrap_or(""),
                    b.role_ref.name,
                    describe(subjects.clone(), user, "")
                );
                rules.extend(role.rules.iter().flatten().map(|r| (by.clone(), r.clone())));
            }
        }
        if namespace.is_empty() {
            return rules;
        }
        for b in &self.role_bindings {
            if b.metadata.namespace.as_deref() != Some(namespace) {
                continue;
            }
            let subjects = b.subjects.iter().flatten();
            if !subjects.clone().any(|s| applies_to(s, user, namespace)) {
                continue;
            }
            let granted = match b.role_ref.kind.as_str() {
                "ClusterRole" => self
                    .cluster_role(&b.role_ref.name)
                    .and_then(|r| r.rules.clone()),
                "Role" => self
                    .role(namespace, &b.role_ref.name)
                    .and_then(|r| r.rules.clone()),
                _ => None,
            };
            let by = format!(
                "RBAC: allowed by RoleBinding \"{}/{}\" of {} {:?} to {}",
                b.metadata.name.as_deref().unwrap_or(""),
                namespace,
                b.role_ref.kind,
                b.role_ref.name,
                describe(subjects, user, namespace)
            );
            rules.extend(granted.into_iter().flatten().map(|r| (by.clone(), r)));
        }
        rules
    }

    /// kube's decision: the reason naming the binding that allows the request, or None (no
    /// opinion: RBAC never denies, it only fails to allow).
    pub fn authorize(&self, user: &UserInfo, a: &Attributes) -> Option<String> {
        if user.groups.iter().any(|g| g == MASTERS) {
            return Some(format!("{MASTERS} may do anything"));
        }
        self.rules_for(user, &a.namespace)
            .into_iter()
            .find(|(_, rule)| rule_allows(rule, a))
            .map(|(by, _)| by)
    }

    /// The rules of every ClusterRole with an `aggregationRule`: the union of the rules of the
    /// ClusterRoles its selectors match (kube's clusterrole aggregation controller), in name
    /// order, each once. Returned as (name, rules) where they differ from the role's own.
    pub fn aggregated(&self) -> Vec<(String, Vec<PolicyRule>)> {
        let mut changed = Vec::new();
        for role in &self.cluster_roles {
            let Some(aggregation) = &role.aggregation_rule else {
                continue;
            };
            let name = role.metadata.name.clone().unwrap_or_default();
            let mut sources: Vec<&ClusterRole> = self
                .cluster_roles
                .iter()
                .filter(|other| other.metadata.name.as_deref() != Some(name.as_str()))
                .filter(|other| {
                    let labels = other.metadata.labels.clone().unwrap_or_default();
                    aggregation
                        .cluster_role_selectors
                        .iter()
                        .flatten()
                        .any(|s| super::selector::selects(s, &labels))
                })
                .collect();
            sources.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
            let mut rules: Vec<PolicyRule> = Vec::new();
            for rule in sources.iter().flat_map(|r| r.rules.iter().flatten()) {
                if !rules.contains(rule) {
                    rules.push(rule.clone());
                }
            }
            if role.rules.as_ref() != Some(&rules) {
                changed.push((name, rules));
            }
        }
        changed
    }
}

/// The subject a binding matched, as kube's reason names it.
fn describe<'a>(
    subjects: impl Iterator<Item = &'a Subject>,
    user: &UserInfo,
    namespace: &str,
) -> String {
    for s in subjects {
        if applies_to(s, user, namespace) {
            return match s.kind.as_str() {
                // Name first, then namespace: kube's `describeSubject`.
                "ServiceAccount" => format!(
                    "ServiceAccount \"{}/{}\"",
                    s.name,
                    s.namespace
                        .as_deref()
                        .filter(|n| !n.is_empty())
                        .unwrap_or(namespace)
                ),
                kind => format!("{kind} {:?}", s.name),
            };
        }
    }
    String::new()
}

/// kube-apiserver's reason for a request RBAC did not allow (`forbiddenMessage`).
pub fn forbidden_reason(user: &UserInfo, a: &Attributes) -> String {
    let who = &user.name;
    if !a.resource_request {
        return format!("User {who:?} cannot {} path {:?}", a.verb, a.path);
    }
    let resource = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    if a.namespace.is_empty() {
        format!(
            "User {who:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
            a.verb, a.api_group
        )
    } else {
        format!(
            "User {who:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
            a.verb, a.api_group, a.namespace
        )
    }
}

/// The whole 403 message: `datavolumes.cdi.kubevirt.io "x" is forbidden: User …` (the name left
/// out where the request names none).
pub fn forbidden_message(user: &UserInfo, a: &Attributes) -> String {
    let reason = forbidden_reason(user, a);
    if !a.resource_request {
        return format!("forbidden: {reason}");
    }
    let qualified = if a.api_group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.api_group)
    };
    if a.name.is_empty() {
        format!("{qualified} is forbidden: {reason}")
    } else {
        format!("{qualified} {:?} is forbidden: {reason}", a.name)
    }
}

/// A rule of `verbs` on `resources` in each of `groups`.
fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> serde_json::Value {
    serde_json::json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

fn url_rule(urls: &[&str], verbs: &[&str]) -> serde_json::Value {
    serde_json::json!({"nonResourceURLs": urls, "verbs": verbs})
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];
const AGGREGATE: &str = "rbac.authorization.k8s.io/aggregate-to-";

/// The ClusterRoles kube-apiserver creates at start (`bootstrappolicy`), as far as this cluster
/// serves their resources: `cluster-admin`; `admin`, `edit` and `view`, which aggregate the
/// `system:aggregate-to-*` roles and whatever an installer labels for them (`view` feeds `edit`,
/// `edit` feeds `admin`); discovery, the self reviews and health for every authenticated user;
/// and `system:auth-delegator` for servers that delegate authentication and authorization.
/// Aggregated rules are filled in.
pub fn bootstrap_cluster_roles() -> Vec<ClusterRole> {
    // The one the scheduler and PV controller of a real cluster would need is `cluster-admin`
    // here: they run inside the server's process as the admin.
    let mut policy = Policy {
        cluster_roles: bootstrap_cluster_role_objects()
            .into_iter()
            .map(|r| serde_json::from_value(r).expect("a bootstrap ClusterRole"))
            .collect(),
        ..Default::default()
    };
    for _ in 0..4 {
        for (name, rules) in policy.aggregated() {
            if let Some(r) = policy
                .cluster_roles
                .iter_mut()
                .find(|r| r.metadata.name.as_deref() == Some(name.as_str()))
            {
                r.rules = Some(rules);
            }
        }
    }
    policy.cluster_roles
}

/// The bootstrap ClusterRoles as objects, the aggregating ones still without rules.
// layout: table
fn bootstrap_cluster_role_objects() -> Vec<serde_json::Value> {
    use serde_json::json;
    let role = |name: &str, labels: serde_json::Value, rules: Vec<serde_json::Value>| {
        json!({"metadata": {"name": name, "labels": labels,
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "rules": rules})
    };
    let aggregating = |name: &str, into: Option<&str>| {
        let mut labels = json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
        if let Some(into) = into {
            labels[format!("{AGGREGATE}{into}")] = json!("true");
        }
        json!({"metadata": {"name": name, "labels": labels,
            "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "aggregationRule": {"clusterRoleSelectors": [
                {"matchLabels": {format!("{AGGREGATE}{name}"): "true"}}]},
            "rules": []})
    };
    let defaults = || json!({"kubernetes.io/bootstrapping": "rbac-defaults"});
    let feeding = |into: &str| {
        let mut l = defaults();
        l[format!("{AGGREGATE}{into}")] = json!("true");
        l
    };
    let workloads = [
        "deployments",
        "deployments/scale",
        "replicasets",
        "replicasets/scale",
        "statefulsets",
        "statefulsets/scale",
        "daemonsets",
    ];
    vec![
        role(
            "cluster-admin",
            defaults(),
            vec![rule(&["*"], &["*"], &["*"]), url_rule(&["*"], &["*"])],
        ),
        aggregating("admin", None),
        aggregating("edit", Some("admin")),
        aggregating("view", Some("edit")),
        role(
            "system:aggregate-to-admin",
            feeding("admin"),
            vec![
                rule(
                    &["rbac.authorization.k8s.io"],
                    &["rolebindings", "roles"],
                    &[WRITE, READ].concat(),
                ),
                rule(
                    &["authorization.k8s.io"],
                    &["localsubjectaccessreviews"],
                    &["create"],
                ),
            ],
        ),
        role(
            "system:aggregate-to-edit",
            feeding("edit"),
            vec![
                rule(&[""], &["serviceaccounts"], &["impersonate"]),
                rule(
                    &[""],
                    &[
                        "pods",
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                    ],
                    WRITE,
                ),
                rule(&[""], &["pods/eviction"], &["create"]),
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "events",
                        "persistentvolumeclaims",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "secrets",
                        "serviceaccounts",
                        "services",
                        "services/proxy",
                    ],
                    WRITE,
                ),
                rule(&[""], &["serviceaccounts/token"], &["create"]),
                rule(
                    &["apps"],
                    &[&workloads[..], &["deployments/rollback"]].concat(),
                    WRITE,
                ),
                rule(&["batch"], &["cronjobs", "jobs"], WRITE),
                rule(&["discovery.k8s.io"], &["endpointslices"], WRITE),
                rule(
                    &[""],
                    &[
                        "pods/attach",
                        "pods/exec",
                        "pods/portforward",
                        "pods/proxy",
                        "secrets",
                        "services/proxy",
                    ],
                    READ,
                ),
            ],
        ),
        role(
            "system:aggregate-to-view",
            feeding("view"),
            vec![
                rule(
                    &[""],
                    &[
                        "configmaps",
                        "endpoints",
                        "persistentvolumeclaims",
                        "persistentvolumeclaims/status",
                        "pods",
                        "replicationcontrollers",
                        "replicationcontrollers/scale",
                        "serviceaccounts",
                        "services",
                        "services/status",
                    ],
                    READ,
                ),
                rule(
                    &[""],
                    &[
                        "bindings",
                        "events",
                        "limitranges",
                        "namespaces/status",
                        "pods/log",
                        "pods/status",
                        "replicationcontrollers/status",
                        "resourcequotas",
                        "resourcequotas/status",
                    ],
                    READ,
                ),
                rule(&[""], &["namespaces"], READ),
                rule(&["discovery.k8s.io"], &["endpointslices"], READ),
                rule(
                    &["apps"],
                    &[
                        &workloads[..],
                        &[
                            "controllerrevisions",
                            "daemonsets/status",
                            "deployments/status",
                            "replicasets/status",
                            "statefulsets/status",
                        ],
                    ]
                    .concat(),
                    READ,
                ),
                rule(&["batch"], &["cronjobs", "jobs"], READ),
            ],
        ),
        role(
            "system:discovery",
            defaults(),
            vec![url_rule(
                &[
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                &["get"],
            )],
        ),
        role(
            "system:public-info-viewer",
            defaults(),
            vec![url_rule(
                &["/healthz", "/livez", "/readyz", "/version", "/version/"],
                &["get"],
            )],
        ),
        role(
            "system:basic-user",
            defaults(),
            vec![
                rule(
                    &["authorization.k8s.io"],
                    &["selfsubjectaccessreviews", "selfsubjectrulesreviews"],
                    &["create"],
                ),
                rule(
                    &["authentication.k8s.io"],
                    &["selfsubjectreviews"],
                    &["create"],
                ),
            ],
        ),
        role(
            "system:auth-delegator",
            defaults(),
            vec![
                rule(&["authentication.k8s.io"], &["tokenreviews"], &["create"]),
                rule(
                    &["authorization.k8s.io"],
                    &["subjectaccessreviews"],
                    &["create"],
                ),
            ],
        ),
    ]
}

/// The namespaced Roles kube-apiserver creates at start: who may read, in kube-system, how it
/// authenticates the requests it forwards to aggregated API servers.
pub fn bootstrap_roles() -> Vec<Role> {
    vec![
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "extension-apiserver-authentication-reader",
                "namespace": "kube-system",
                "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["extension-apiserver-authentication"],
                "verbs": ["get", "list", "watch"]}],
        }))
        .expect("a bootstrap Role"),
    ]
}

/// The bindings kube-apiserver creates at start: `system:masters` to `cluster-admin`, every
/// authenticated user to discovery, the self reviews and health, and everyone (authenticated or
/// not) to health and version.
pub fn bootstrap_cluster_role_bindings() -> Vec<ClusterRoleBinding> {
    use serde_json::json;
    let binding = |name: &str, groups: &[&str]| {
        let subjects: Vec<_> = groups
            .iter()
            .map(|g| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}))
            .collect();
        serde_json::from_value(json!({
            "metadata": {"name": name,
                "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"},
                "annotations": {"rbac.authorization.kubernetes.io/autoupdate": "true"}},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": subjects,
        }))
        .expect("a bootstrap ClusterRoleBinding")
    };
    vec![
        binding("cluster-admin", &[MASTERS]),
        binding("system:discovery", &["system:authenticated"]),
        binding("system:basic-user", &["system:authenticated"]),
        binding(
            "system:public-info-viewer",
            &["system:authenticated", "system:unauthenticated"],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn from<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn alice() -> UserInfo {
        UserInfo {
            name: "alice".into(),
            uid: String::new(),
            groups: vec!["devs".into(), "system:authenticated".into()],
        }
    }

    fn ask(verb: &str, ns: &str, group: &str, resource: &str, sub: &str, name: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            resource_request: true,
            namespace: ns.into(),
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            name: name.into(),
            path: String::new(),
        }
    }

    fn policy() -> Policy {
        Policy {
            roles: vec![from(
                json!({"metadata": {"name": "dv-writer", "namespace": "a"},
                "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"],
                    "verbs": ["get", "list", "create"]},
                    {"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes/source"],
                    "verbs": ["create"]},
                    {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["settings"],
                    "verbs": ["get"]}]}),
            )],
            cluster_roles: vec![
                from(json!({"metadata": {"name": "log-reader"},
                    "rules": [{"apiGroups": [""], "resources": ["*/log"], "verbs": ["get"]},
                        {"nonResourceURLs": ["/healthz", "/metrics/*"], "verbs": ["get"]}]})),
                from(json!({"metadata": {"name": "view"},
                    "aggregationRule": {"clusterRoleSelectors": [{"matchLabels":
                        {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]}})),
                from(json!({"metadata": {"name": "cdi-view", "labels":
                        {"rbac.authorization.k8s.io/aggregate-to-view": "true"}},
                    "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["*"],
                        "verbs": ["get", "list", "watch"]}]})),
            ],
            role_bindings: vec![
                from(json!({"metadata": {"name": "alice-dvs", "namespace": "a"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                        "name": "dv-writer"},
                    "subjects": [{"kind": "User", "name": "alice"}]})),
                from(json!({"metadata": {"name": "sa-logs", "namespace": "b"},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "log-reader"},
                    "subjects": [{"kind": "ServiceAccount", "name": "worker"}]})),
            ],
            cluster_role_bindings: vec![from(json!({"metadata": {"name": "devs-logs"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "log-reader"},
                "subjects": [{"kind": "Group", "name": "devs"}]}))],
        }
    }

    #[test]
    fn bindings_grant_what_their_rules_say_and_nothing_else() {
        let p = policy();
        let a = alice();
        let allowed = |attrs: Attributes| p.authorize(&a, &attrs).is_some();
        assert!(allowed(ask(
            "create",
            "a",
            "cdi.kubevirt.io",
            "datavolumes",
            "",
            ""
        )));
        assert!(allowed(ask(
            "get",
            "a",
            "cdi.kubevirt.io",
            "datavolumes",
            "",
            "x"
        )));
        // Another verb, namespace, group, or a subresource the rule does not name.
        assert!(!allowed(ask(
            "delete",
            "a",
            "cdi.kubevirt.io",
            "datavolumes",
            "",
            "x"
        )));
        assert!(!allowed(ask(
            "create",
            "b",
            "cdi.kubevirt.io",
            "datavolumes",
            "",
            ""
        )));
        assert!(!allowed(ask("create", "a", "", "datavolumes", "", "")));
        assert!(!allowed(ask(
            "update",
            "a",
            "cdi.kubevirt.io",
            "datavolumes",
            "status",
            "x"
        )));
        assert!(allowed(ask(
            "create",
            "a",
            "cdi.kubevirt.io",
            "datavolumes",
            "source",
            "x"
        )));
        // resourceNames: only that name, and never a list (no name).
        assert!(allowed(ask("get", "a", "", "configmaps", "", "settings")));
        assert!(!allowed(ask("get", "a", "", "configmaps", "", "other")));
        assert!(!allowed(ask("get", "a", "", "configmaps", "", "")));
        // `*/log` from the group's cluster binding, in every namespace; not the pod itself.
        assert!(allowed(ask("get", "z", "", "pods", "log", "p")));
        assert!(!allowed(ask("get", "z", "", "pods", "", "p")));
        // Non-resource URLs: exact, or a prefix ending in `*`.
        let path = |p: &str| Attributes {
            verb: "get".into(),
            path: p.into(),
            ..Default::default()
        };
        assert!(allowed(path("/healthz")));
        assert!(allowed(path("/metrics/cadvisor")));
        assert!(!allowed(path("/readyz")));
        // Not in the group: nothing.
        let bob = UserInfo {
            name: "bob".into(),
            ..Default::default()
        };
        assert!(
            p.authorize(&bob, &ask("get", "z", "", "pods", "log", "p"))
                .is_none()
        );
        // system:masters: everything.
        let admin = UserInfo {
            name: "admin".into(),
            groups: vec![MASTERS.into()],
            ..Default::default()
        };
        assert!(
            p.authorize(&admin, &ask("delete", "", "", "nodes", "", "n"))
                .is_some()
        );
    }

    #[test]
    fn a_service_account_subject_is_in_its_bindings_namespace() {
        let p = policy();
        let sa = |ns: &str| UserInfo {
            name: format!("system:serviceaccount:{ns}:worker"),
            groups: vec!["system:serviceaccounts".into()],
            ..Default::default()
        };
        let logs = ask("get", "b", "", "pods", "log", "p");
        let reason = p.authorize(&sa("b"), &logs).unwrap();
        assert_eq!(
            reason,
            "RBAC: allowed by RoleBinding \"sa-logs/b\" of ClusterRole \"log-reader\" to ServiceAccount \"worker/b\""
        );
        assert!(p.authorize(&sa("c"), &logs).is_none());
        // The binding is in b: the same account's request in another namespace is not granted.
        assert!(
            p.authorize(&sa("b"), &ask("get", "c", "", "pods", "log", "p"))
                .is_none()
        );
    }

    #[test]
    fn aggregated_roles_take_the_rules_of_the_roles_they_select() {
        let mut p = policy();
        let changed = p.aggregated();
        assert_eq!(changed.len(), 1);
        assert_eq!(changed[0].0, "view");
        assert_eq!(changed[0].1.len(), 1);
        assert_eq!(changed[0].1[0].verbs, vec!["get", "list", "watch"]);
        // Applied, the role is stable.
        let rules = changed[0].1.clone();
        for r in &mut p.cluster_roles {
            if r.metadata.name.as_deref() == Some("view") {
                r.rules = Some(rules.clone());
            }
        }
        assert!(p.aggregated().is_empty());
    }

    #[test]
    fn refusals_are_worded_as_kube_words_them() {
        let a = alice();
        assert_eq!(
            forbidden_message(
                &a,
                &ask("create", "a", "cdi.kubevirt.io", "datavolumes", "", "")
            ),
            "datavolumes.cdi.kubevirt.io is forbidden: User \"alice\" cannot create resource \"datavolumes\" in API group \"cdi.kubevirt.io\" in the namespace \"a\""
        );
        assert_eq!(
            forbidden_message(&a, &ask("get", "", "", "nodes", "", "n1")),
            "nodes \"n1\" is forbidden: User \"alice\" cannot get resource \"nodes\" in API group \"\" at the cluster scope"
        );
        assert_eq!(
            forbidden_message(&a, &ask("get", "x", "", "pods", "log", "p")),
            "pods \"p\" is forbidden: User \"alice\" cannot get resource \"pods/log\" in API group \"\" in the namespace \"x\""
        );
        let path = Attributes {
            verb: "get".into(),
            path: "/metrics".into(),
            ..Default::default()
        };
        assert_eq!(
            forbidden_message(&a, &path),
            "forbidden: User \"alice\" cannot get path \"/metrics\""
        );
    }
}
