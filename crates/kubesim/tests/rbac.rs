//! RBAC objects in the embedded API server, and the access reviews it answers from them, with
//! the real kube-rs client in process.

use k8s_openapi::api::authorization::v1::{LocalSubjectAccessReview, SubjectAccessReview};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kubesim::apiserver::ApiServer;
use serde_json::{Value, json};

fn client(server: &ApiServer) -> Client {
    Client::new(server.router(), "default")
}

async fn create<K>(api: &Api<K>, object: Value) -> K
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

/// What a SubjectAccessReview for `user` (in `groups`) says about `verb` on `resource` of
/// cdi.kubevirt.io in `ns`: (allowed, reason).
async fn review(
    client: &Client,
    user: &str,
    groups: &[&str],
    verb: &str,
    ns: &str,
) -> (bool, String) {
    let sar: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {"user": user, "groups": groups, "resourceAttributes": {
            "namespace": ns, "verb": verb, "group": "cdi.kubevirt.io", "resource": "datavolumes"}}
    }))
    .unwrap();
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &sar)
        .await
        .unwrap();
    let status = answer.status.unwrap();
    (status.allowed, status.reason.unwrap_or_default())
}

async fn namespace(client: &Client, name: &str) {
    create(
        &Api::<Namespace>::all(client.clone()),
        json!({"metadata": {"name": name}}),
    )
    .await;
}

#[tokio::test]
async fn access_reviews_say_what_the_bindings_grant() {
    let server = ApiServer::new();
    let c = client(&server);
    namespace(&c, "a").await;
    namespace(&c, "b").await;
    // Nothing granted yet.
    assert_eq!(
        review(&c, "alice", &["devs"], "create", "a").await,
        (false, String::new())
    );
    create(
        &Api::<Role>::namespaced(c.clone(), "a"),
        json!({"metadata": {"name": "dv-writer"}, "rules": [{"apiGroups": ["cdi.kubevirt.io"],
            "resources": ["datavolumes"], "verbs": ["create", "get"]}]}),
    )
    .await;
    create(
        &Api::<RoleBinding>::namespaced(c.clone(), "a"),
        json!({"metadata": {"name": "devs-dvs"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role", "name": "dv-writer"}, "subjects": [{"kind": "Group", "name": "devs"}]}),
    )
    .await;
    assert_eq!(
        review(&c, "alice", &["devs"], "create", "a").await,
        (
            true,
            "RBAC: allowed by RoleBinding \"devs-dvs/a\" of Role \"dv-writer\" to Group \"devs\""
                .into()
        )
    );
    // Another verb, namespace, or someone outside the group: no.
    assert!(!review(&c, "alice", &["devs"], "delete", "a").await.0);
    assert!(!review(&c, "alice", &["devs"], "create", "b").await.0);
    assert!(!review(&c, "bob", &["ops"], "create", "a").await.0);
    // system:masters may do anything.
    assert!(
        review(&c, "root", &["system:masters"], "delete", "b")
            .await
            .0
    );

    // A LocalSubjectAccessReview asks about its own namespace.
    let local = |ns: &str| {
        serde_json::from_value::<LocalSubjectAccessReview>(json!({
            "metadata": {"namespace": ns},
            "spec": {"user": "alice", "groups": ["devs"], "resourceAttributes": {
                "namespace": ns, "verb": "get", "group": "cdi.kubevirt.io", "resource": "datavolumes"}}
        }))
        .unwrap()
    };
    for (ns, allowed) in [("a", true), ("b", false)] {
        let answer = Api::<LocalSubjectAccessReview>::namespaced(c.clone(), ns)
            .create(&PostParams::default(), &local(ns))
            .await
            .unwrap();
        assert_eq!(answer.status.unwrap().allowed, allowed, "{ns}");
    }

    // A review without a subject, or without attributes, is refused as kube refuses it.
    let bad = Api::<SubjectAccessReview>::all(c.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"spec": {"resourceAttributes": {"verb": "get"}}}))
                .unwrap(),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(e) = bad else {
        panic!("{bad}")
    };
    assert_eq!(e.code, 422);
    assert_eq!(
        e.message,
        "SubjectAccessReview.authorization.k8s.io \"\" is invalid: spec.user: Invalid value: \"\": at least one of user or group must be specified"
    );
}

#[tokio::test]
async fn aggregated_cluster_roles_follow_the_roles_they_select() {
    let server = ApiServer::new();
    let c = client(&server);
    namespace(&c, "a").await;
    let roles = Api::<ClusterRole>::all(c.clone());
    let label = "example.com/aggregate-to-dv-view";
    let view = create(
        &roles,
        json!({"metadata": {"name": "dv-view"},
            "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {(label): "true"}}]}}),
    )
    .await;
    assert!(view.rules.unwrap_or_default().is_empty());
    create(
        &roles,
        json!({"metadata": {"name": "dv-get", "labels": {(label): "true"}},
            "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"], "verbs": ["get"]}]}),
    )
    .await;
    let rules = |r: ClusterRole| -> Vec<Vec<String>> {
        r.rules
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.verbs)
            .collect()
    };
    assert_eq!(
        rules(roles.get("dv-view").await.unwrap()),
        vec![vec!["get"]]
    );
    create(
        &Api::<ClusterRoleBinding>::all(c.clone()),
        json!({"metadata": {"name": "alice-view"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole", "name": "dv-view"}, "subjects": [{"kind": "User", "name": "alice"}]}),
    )
    .await;
    assert!(review(&c, "alice", &[], "get", "a").await.0);
    assert!(!review(&c, "alice", &[], "list", "a").await.0);
    // A change to the selected role reaches the aggregate, and so does its removal.
    roles
        .patch(
            "dv-get",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": [{"apiGroups": ["cdi.kubevirt.io"],
                "resources": ["datavolumes"], "verbs": ["get", "list"]}]})),
        )
        .await
        .unwrap();
    assert_eq!(
        rules(roles.get("dv-view").await.unwrap()),
        vec![vec!["get", "list"]]
    );
    assert!(review(&c, "alice", &[], "list", "a").await.0);
    roles
        .delete("dv-get", &DeleteParams::default())
        .await
        .unwrap();
    assert!(rules(roles.get("dv-view").await.unwrap()).is_empty());
    assert!(!review(&c, "alice", &[], "get", "a").await.0);
}

#[tokio::test]
async fn every_namespace_has_its_default_service_account() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    let server = ApiServer::new();
    let c = client(&server);
    for ns in ["default", "kube-system", "kube-public"] {
        let accounts = Api::<ServiceAccount>::namespaced(c.clone(), ns);
        assert!(accounts.get_opt("default").await.unwrap().is_some(), "{ns}");
    }
    namespace(&c, "a").await;
    let accounts = Api::<ServiceAccount>::namespaced(c.clone(), "a");
    let first = accounts.get("default").await.unwrap();
    // Deleted, it is made again.
    accounts
        .delete("default", &DeleteParams::default())
        .await
        .unwrap();
    let again = accounts.get("default").await.unwrap();
    assert_ne!(first.metadata.uid, again.metadata.uid);
}
