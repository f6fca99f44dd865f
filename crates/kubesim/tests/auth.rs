//! Who may do what: the admin's token, ServiceAccount tokens, impersonation, and RBAC enforced on
//! every request, with kubectl (`--as`, `auth can-i`) and kube-rs against the listening server.

use std::process::Command;

use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use kubesim::apiserver::auth::{AUDIENCE, Authenticator, TokenFor};
use kubesim::apiserver::{ApiServer, KubeconfigUser, kubeconfig};
use serde_json::{Value, json};

struct Cluster {
    server: ApiServer,
    url: String,
    dir: tempfile::TempDir,
    admin: Client,
    _task: tokio::task::JoinHandle<()>,
}

impl Cluster {
    async fn start() -> Cluster {
        let server = ApiServer::new();
        let (addr, task) = server.serve("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let admin = Client::new(server.router(), "default");
        let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
        for crd in cdi_api::crd::crds() {
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
        for ns in ["a", "b"] {
            let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
            Api::<Namespace>::all(admin.clone())
                .create(&PostParams::default(), &ns)
                .await
                .unwrap();
        }
        Cluster {
            server,
            url: format!("https://{addr}"),
            dir: tempfile::tempdir().unwrap(),
            admin,
            _task: task,
        }
    }

    /// A kubeconfig file for `user`, named `name`.
    fn kubeconfig(&self, name: &str, user: &KubeconfigUser) -> std::path::PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(
            &path,
            kubeconfig(&self.url, Some(self.server.ca_pem()), user),
        )
        .unwrap();
        path
    }

    /// kubectl as the admin: (success, stdout, stderr).
    async fn kubectl(&self, args: &[&str]) -> (bool, String, String) {
        let admin = self.kubeconfig("admin", &KubeconfigUser::Token(self.server.admin_token()));
        kubectl(&admin, args).await
    }
}

async fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> (bool, String, String) {
    let mut cmd = Command::new("kubectl");
    cmd.args(args).env("KUBECONFIG", kubeconfig);
    let out = tokio::task::spawn_blocking(move || cmd.output().expect("kubectl is installed"))
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

async fn create<K>(client: &Client, ns: &str, object: Value) -> K
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    let object: K = serde_json::from_value(object).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap()
}

/// Cluster-scoped objects through the dynamic API (their scope differs from `create`'s).
async fn create_cluster(client: &Client, api_version: &str, kind: &str, object: Value) {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (resource, _) = kube::discovery::pinned_kind(client, &gvk).await.unwrap();
    let api: Api<kube::api::DynamicObject> = Api::all_with(client.clone(), &resource);
    let mut object = object;
    object["apiVersion"] = json!(api_version);
    object["kind"] = json!(kind);
    api.create(
        &PostParams::default(),
        &serde_json::from_value(object).unwrap(),
    )
    .await
    .unwrap();
}

fn data_volume(dir: &std::path::Path, ns: &str) -> std::path::PathBuf {
    let path = dir.join(format!("dv-{ns}.yaml"));
    std::fs::write(
        &path,
        format!("apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata:\n  name: disk\n  namespace: {ns}\nspec:\n  source:\n    blank: {{}}\n  storage:\n    resources:\n      requests:\n        storage: 1Gi\n"),
    )
    .unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_as_alice_is_refused_until_a_binding_grants_it_and_can_i_agrees() {
    let c = Cluster::start().await;
    let dv = data_volume(c.dir.path(), "a");
    let dv = dv.to_str().unwrap();

    let (ok, _, err) = c.kubectl(&["--as=alice", "create", "-f", dv]).await;
    assert!(!ok);
    assert!(
        err.contains(
            r#"datavolumes.cdi.kubevirt.io is forbidden: User "alice" cannot create resource "datavolumes" in API group "cdi.kubevirt.io" in the namespace "a""#
        ),
        "{err}"
    );
    let (ok, out, _) = c
        .kubectl(&[
            "--as=alice",
            "auth",
            "can-i",
            "create",
            "datavolumes",
            "-n",
            "a",
        ])
        .await;
    assert_eq!((ok, out.trim()), (false, "no"));

    // An installer's ClusterRole aggregated into `edit`, and `edit` granted to alice in `a`.
    create_cluster(
        &c.admin,
        "rbac.authorization.k8s.io/v1",
        "ClusterRole",
        json!({"metadata": {"name": "cdi-edit", "labels":
            {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
            "rules": [{"apiGroups": ["cdi.kubevirt.io"], "resources": ["datavolumes"],
                "verbs": ["create", "get", "list", "watch", "delete"]}]}),
    )
    .await;
    let (ok, _, err) = c
        .kubectl(&[
            "create",
            "rolebinding",
            "alice-edit",
            "--clusterrole=edit",
            "--user=alice",
            "-n",
            "a",
        ])
        .await;
    assert!(ok, "{err}");

    let (ok, out, _) = c
        .kubectl(&[
            "--as=alice",
            "auth",
            "can-i",
            "create",
            "datavolumes",
            "-n",
            "a",
        ])
        .await;
    assert_eq!((ok, out.trim()), (true, "yes"));
    let (ok, out, err) = c.kubectl(&["--as=alice", "create", "-f", dv]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("datavolume.cdi.kubevirt.io/disk created"),
        "{out}"
    );
    // Only in `a`: the server and can-i agree about `b` too.
    let (ok, out, _) = c
        .kubectl(&[
            "--as=alice",
            "auth",
            "can-i",
            "create",
            "datavolumes",
            "-n",
            "b",
        ])
        .await;
    assert_eq!((ok, out.trim()), (false, "no"));
    let (ok, _, err) = c
        .kubectl(&[
            "--as=alice",
            "create",
            "-f",
            &data_volume(c.dir.path(), "b").to_string_lossy(),
        ])
        .await;
    assert!(!ok && err.contains("in the namespace \"b\""), "{err}");
    // `edit` brings what kube's own edit role grants, and not what it does not.
    let (_, out, _) = c
        .kubectl(&["--as=alice", "auth", "can-i", "delete", "pods", "-n", "a"])
        .await;
    assert_eq!(out.trim(), "yes");
    let (_, out, _) = c
        .kubectl(&[
            "--as=alice",
            "auth",
            "can-i",
            "create",
            "rolebindings",
            "-n",
            "a",
        ])
        .await;
    assert_eq!(out.trim(), "no");
    let (ok, out, err) = c
        .kubectl(&["--as=alice", "auth", "can-i", "--list", "-n", "a"])
        .await;
    assert!(ok, "{err}");
    assert!(out.contains("datavolumes.cdi.kubevirt.io"), "{out}");
    assert!(
        out.contains("selfsubjectaccessreviews.authorization.k8s.io"),
        "{out}"
    );

    // A group's binding: `view` for the viewers, read but never write.
    let (ok, _, err) = c
        .kubectl(&[
            "create",
            "rolebinding",
            "viewers",
            "--clusterrole=view",
            "--group=viewers",
            "-n",
            "a",
        ])
        .await;
    assert!(ok, "{err}");
    let bob = ["--as=bob", "--as-group=viewers"];
    let (ok, out, err) = c
        .kubectl(&[&bob[..], &["get", "datavolumes", "-n", "a"]].concat())
        .await;
    // `view` holds no CDI rules: nothing was aggregated into it.
    assert!(!ok && out.is_empty(), "{out}");
    assert!(
        err.contains(r#"User "bob" cannot list resource "datavolumes""#),
        "{err}"
    );
    let (ok, _, err) = c
        .kubectl(&[&bob[..], &["get", "configmaps", "-n", "a"]].concat())
        .await;
    assert!(ok, "{err}");
    let (ok, _, err) = c
        .kubectl(&[&bob[..], &["create", "configmap", "x", "-n", "a"]].concat())
        .await;
    assert!(
        !ok && err.contains(r#"User "bob" cannot create resource "configmaps""#),
        "{err}"
    );
    for (verb, resource, expected) in [
        ("list", "configmaps", "yes"),
        ("watch", "pods", "yes"),
        ("get", "pods/log", "yes"),
        ("create", "configmaps", "no"),
        ("get", "secrets", "no"),
    ] {
        let (_, out, _) = c
            .kubectl(&[&bob[..], &["auth", "can-i", verb, resource, "-n", "a"]].concat())
            .await;
        assert_eq!(out.trim(), expected, "bob {verb} {resource}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_account_tokens_authenticate_while_valid_and_are_limited_to_their_role() {
    let c = Cluster::start().await;
    create::<ServiceAccount>(&c.admin, "a", json!({"metadata": {"name": "robot"}})).await;
    let (ok, token, err) = c.kubectl(&["create", "token", "robot", "-n", "a"]).await;
    assert!(ok, "{err}");
    let token = token.trim().to_string();
    let robot = c.kubeconfig("robot", &KubeconfigUser::Token(&token));

    // kube-rs with the token: authenticated, but allowed nothing yet.
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&robot).unwrap(),
        &Default::default(),
    )
    .await
    .unwrap();
    let client = Client::try_from(config).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "a");
    match cms.list(&ListParams::default()).await {
        Err(kube::Error::Api(e)) => {
            assert_eq!(e.code, 403);
            assert_eq!(
                e.message,
                r#"configmaps is forbidden: User "system:serviceaccount:a:robot" cannot list resource "configmaps" in API group "" in the namespace "a""#
            );
        }
        other => panic!("expected 403, got {other:?}"),
    }
    let (ok, _, err) = c
        .kubectl(&[
            "create",
            "role",
            "cm-reader",
            "--verb=get,list",
            "--resource=configmaps",
            "-n",
            "a",
        ])
        .await;
    assert!(ok, "{err}");
    let (ok, _, err) = c
        .kubectl(&[
            "create",
            "rolebinding",
            "robot-reads",
            "--role=cm-reader",
            "--serviceaccount=a:robot",
            "-n",
            "a",
        ])
        .await;
    assert!(ok, "{err}");
    cms.list(&ListParams::default()).await.unwrap();
    // Its Role, no more: not another namespace, not a write.
    let other: Api<ConfigMap> = Api::namespaced(client.clone(), "b");
    assert!(
        matches!(other.list(&ListParams::default()).await, Err(kube::Error::Api(e)) if e.code == 403)
    );
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    assert!(
        matches!(cms.create(&PostParams::default(), &cm).await, Err(kube::Error::Api(e)) if e.code == 403)
    );
    // Nor may it impersonate anyone.
    let (ok, _, err) = kubectl(&robot, &["--as=alice", "get", "configmaps", "-n", "a"]).await;
    assert!(
        !ok && err.contains(
            r#"users "alice" is forbidden: User "system:serviceaccount:a:robot" cannot impersonate resource "users" in API group "" at the cluster scope"#
        ),
        "{err}"
    );

    // A TokenReview names whose token it is.
    let review: TokenReview = serde_json::from_value(json!({"spec": {"token": token}})).unwrap();
    let review = Api::<TokenReview>::all(c.admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let status = review.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(
        status.user.unwrap().username.as_deref(),
        Some("system:serviceaccount:a:robot")
    );

    // Forged (another signer), expired, and no token at all: 401.
    let sa_uid = Api::<ServiceAccount>::namespaced(c.admin.clone(), "a")
        .get("robot")
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap();
    let claims = |seconds| TokenFor {
        namespace: "a".into(),
        service_account: ("robot".into(), sa_uid.clone()),
        pod: None,
        audiences: vec![AUDIENCE.into()],
        seconds,
    };
    let (forged, _) = Authenticator::new().mint(&claims(3600));
    let (expired, _) = c.server.authenticator().mint(&claims(-60));
    for bad in [forged.as_str(), expired.as_str()] {
        let path = c.kubeconfig("bad", &KubeconfigUser::Token(bad));
        let (ok, _, err) = kubectl(&path, &["get", "configmaps", "-n", "a"]).await;
        assert!(!ok && err.contains("Unauthorized"), "{err}");
    }
    let anonymous = trusting(&c.server)
        .get(format!("{}/api/v1/namespaces", c.url))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status().as_u16(), 401);
    let body: Value = serde_json::from_str(&anonymous.text().await.unwrap()).unwrap();
    assert_eq!(body["reason"], "Unauthorized");

    // Deleting the ServiceAccount ends its tokens.
    Api::<ServiceAccount>::namespaced(c.admin.clone(), "a")
        .delete("robot", &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        matches!(cms.list(&ListParams::default()).await, Err(kube::Error::Api(e)) if e.code == 401)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_bound_to_a_pod_ends_with_the_pod() {
    let c = Cluster::start().await;
    let pod: Pod = create(
        &c.admin,
        "a",
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c", "image": "x"}]}}),
    )
    .await;
    let request = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": "p",
            "uid": pod.metadata.uid.clone().unwrap()}}});
    let http = trusting(&c.server);
    let (_, answer) = post(
        &http,
        &format!(
            "{}/api/v1/namespaces/a/serviceaccounts/default/token",
            c.url
        ),
        c.server.admin_token(),
        &request,
    )
    .await;
    let token = answer["status"]["token"]
        .as_str()
        .expect("a token")
        .to_string();
    assert_eq!(answer["spec"]["expirationSeconds"], 3600);
    let whoami = |token: String| {
        let http = http.clone();
        let url = format!("{}/apis/authentication.k8s.io/v1/selfsubjectreviews", c.url);
        async move {
            let review =
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"});
            post(&http, &url, &token, &review).await
        }
    };
    let (code, review) = whoami(token.clone()).await;
    assert_eq!(code, 201, "{review}");
    assert_eq!(
        review["status"]["userInfo"]["username"],
        "system:serviceaccount:a:default"
    );
    Api::<Pod>::namespaced(c.admin.clone(), "a")
        .delete("p", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let (code, _) = whoami(token).await;
    assert_eq!(code, 401);

    // Shorter than kube's ten minutes is refused, as kube refuses it.
    let short = json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": 60}});
    let (code, body) = post(
        &http,
        &format!(
            "{}/api/v1/namespaces/a/serviceaccounts/default/token",
            c.url
        ),
        c.server.admin_token(),
        &short,
    )
    .await;
    assert_eq!(code, 422);
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("may not specify a duration less than 10 minutes"),
        "{body}"
    );
}

/// POST `body` as JSON with `token`: (status, answer).
async fn post(http: &reqwest::Client, url: &str, token: &str, body: &Value) -> (u16, Value) {
    let resp = http
        .post(url)
        .bearer_auth(token)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let code = resp.status().as_u16();
    (
        code,
        serde_json::from_str(&resp.text().await.unwrap()).unwrap(),
    )
}

/// An HTTP client that trusts the server's CA.
fn trusting(server: &ApiServer) -> reqwest::Client {
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(server.ca_pem().as_bytes()).unwrap())
        .build()
        .unwrap()
}
