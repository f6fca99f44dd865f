//! CDI installed as a cluster admin installs it: `deploy/` (what `cdi install` prints) and the
//! example CDI resource, the operator bringing every component up under its own ServiceAccount
//! with least-privilege RBAC; then an upgrade and an uninstall.

mod devcluster;

use std::collections::BTreeMap;
use std::path::Path;

use devcluster::{Down, cdi, get_json, kubectl, wait_for};
use kubesim::apiserver::auth::from_audit_event;
use kubesim::apiserver::rbac::{Attributes, Policy, UserInfo};
use serde_json::Value;

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `deploy/` is what `cdi install --out-dir` writes: the checked-in manifests cannot drift from
/// the code, and `--print` prints the same stream.
#[test]
fn deploy_holds_what_cdi_install_renders() {
    let tmp = tempfile::tempdir().unwrap();
    let install = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdi"))
            .arg("install")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    install(&["--out-dir", tmp.path().to_str().unwrap()]);
    let mut printed = String::new();
    for name in ["cdi-operator.yaml", "cdi-cr.yaml"] {
        let made = std::fs::read_to_string(tmp.path().join(name)).unwrap();
        let kept = std::fs::read_to_string(repo().join("deploy").join(name)).unwrap_or_default();
        assert!(
            made == kept,
            "deploy/{name} differs from what the code renders: run `cargo run -p cdi -- install --out-dir deploy`"
        );
        printed.push_str(&made);
    }
    let out = install(&["--print"]);
    assert_eq!(out, printed);
    // Every component's Deployment is the operator's to make: the manifests hold its own only.
    assert_eq!(out.matches("kind: Deployment").count(), 1, "{out}");
}

/// Component roles the scenario below does not reach, and why; every other rule must be shown
/// needed by a request the components made.
const NOT_REACHED: &[(&str, &str)] = &[
    (
        "finalizers update",
        "only where OwnerReferencesPermissionEnforcement is on (OpenShift): owner references that block their owner's deletion need it; the dev cluster does not enforce it",
    ),
    (
        "ClusterRole cdi: [authorization.k8s.io] subjectaccessreviews create",
        "the controller asks it only for a DataImportCron cloning a PVC (registry crons are tested without the operator)",
    ),
];

/// The requests each ServiceAccount made, from the API server's audit log.
/// Each: who, what, whether it was allowed, and whether it was asked by a server on the user's
/// behalf (a SubjectAccessReview, which may fail while another way is allowed).
fn audited(dir: &Path) -> Vec<(UserInfo, Attributes, bool, bool)> {
    let text = std::fs::read_to_string(dir.join("logs/audit.log")).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|e| {
            let allowed = e["annotations"]["authorization.k8s.io/decision"] == "allow";
            let delegated = e["annotations"]["cdi-rs.dev/subject-access-review"] == "true";
            let (user, a) = from_audit_event(&e)?;
            user.name
                .starts_with("system:serviceaccount:cdi:")
                .then_some((user, a, allowed, delegated))
        })
        .collect()
}

fn items<T: k8s_openapi::serde::de::DeserializeOwned>(dir: &Path, kind: &str) -> Vec<T> {
    let out = kubectl(dir, &["get", kind, "-A", "-o", "json"], None);
    let list: Value = serde_json::from_str(&out).unwrap();
    serde_json::from_value(list["items"].clone()).unwrap()
}

fn policy(dir: &Path) -> Policy {
    Policy {
        roles: items(dir, "roles"),
        cluster_roles: items(dir, "clusterroles"),
        role_bindings: items(dir, "rolebindings"),
        cluster_role_bindings: items(dir, "clusterrolebindings"),
    }
}

/// For every rule of the components' roles: the requests the rule alone allowed (none means the
/// rule could go). Found by taking the rule away and asking kube's authorizer again.
fn needed_by(
    policy: &Policy,
    requests: &[(UserInfo, Attributes, bool, bool)],
) -> BTreeMap<String, usize> {
    let mut found = BTreeMap::new();
    // The operator's roles bound to a component's account (not, say, the one it grants
    // Prometheus).
    let to_component = |subjects: &Option<Vec<k8s_openapi::api::rbac::v1::Subject>>| {
        subjects.iter().flatten().any(|s| {
            s.kind == "ServiceAccount"
                && s.namespace.as_deref() == Some("cdi")
                && s.name != "cdi-operator"
        })
    };
    let bound: Vec<(String, String)> = policy
        .role_bindings
        .iter()
        .filter(|b| to_component(&b.subjects))
        .map(|b| (b.role_ref.kind.clone(), b.role_ref.name.clone()))
        .chain(
            policy
                .cluster_role_bindings
                .iter()
                .filter(|b| to_component(&b.subjects))
                .map(|b| (b.role_ref.kind.clone(), b.role_ref.name.clone())),
        )
        .collect();
    let component =
        |kind: &str, meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
            let name = meta.name.clone().unwrap_or_default();
            meta.labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/managed-by"))
                .is_some_and(|m| m == "cdi-operator")
                && bound.contains(&(kind.to_string(), name))
        };
    let allowed: Vec<&(UserInfo, Attributes, bool, bool)> =
        requests.iter().filter(|r| r.2).collect();
    let count = |without: &Policy| {
        allowed
            .iter()
            .filter(|(u, a, _, _)| without.authorize(u, a).is_none())
            .count()
    };
    for (i, role) in policy.cluster_roles.iter().enumerate() {
        if !component("ClusterRole", &role.metadata) || role.aggregation_rule.is_some() {
            continue;
        }
        let name = role.metadata.name.clone().unwrap_or_default();
        if name.starts_with("cdi.kubevirt.io:") {
            continue;
        }
        for r in 0..role.rules.as_ref().map_or(0, Vec::len) {
            let mut without = policy.clone();
            let rule = without.cluster_roles[i].rules.as_mut().unwrap().remove(r);
            found.insert(
                format!("ClusterRole {name}: {}", describe(&rule)),
                count(&without),
            );
        }
    }
    for (i, role) in policy.roles.iter().enumerate() {
        if !component("Role", &role.metadata) {
            continue;
        }
        let name = role.metadata.name.clone().unwrap_or_default();
        for r in 0..role.rules.as_ref().map_or(0, Vec::len) {
            let mut without = policy.clone();
            let rule = without.roles[i].rules.as_mut().unwrap().remove(r);
            found.insert(format!("Role {name}: {}", describe(&rule)), count(&without));
        }
    }
    found
}

/// A pod that uses `claim` and does nothing: its first consumer.
fn consumer(name: &str, claim: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers: [{{name: c, image: busybox, command: [/bin/sh, -c, sleep 600]}}]\n  volumes: [{{name: d, persistentVolumeClaim: {{claimName: {claim}}}}}]\n"
    )
}

fn describe(rule: &k8s_openapi::api::rbac::v1::PolicyRule) -> String {
    let list = |v: &Option<Vec<String>>| v.as_ref().map(|v| v.join(",")).unwrap_or_default();
    format!(
        "[{}] {} {}{}",
        list(&rule.api_groups),
        list(&rule.resources),
        rule.verbs.join(","),
        rule.resource_names
            .as_ref()
            .map(|n| format!(" ({})", n.join(",")))
            .unwrap_or_default()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn the_operator_installs_least_privilege_components_upgrades_and_uninstalls() {
    use cdi_testkit::images::{convert, pattern};
    use cdi_testkit::{Behaviour, FileServer};
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("src.raw"), pattern(4 << 20)).unwrap();
    let qcow2 = tmp.path().join("src.qcow2");
    convert(&tmp.path().join("src.raw"), "qcow2", &[], &qcow2);
    let server = FileServer::start(None).await;
    server.add(
        "/disk.qcow2",
        std::fs::read(&qcow2).unwrap(),
        Behaviour::default(),
    );

    // `cdi dev up --cdi` applies deploy/'s manifests and the example CDI resource and returns
    // once the operator reports it Deployed.
    let dir = tmp.path().join("cluster");
    let (ok, out, err) = cdi(
        &["dev", "up", "--addr", "127.0.0.1:0", "--cdi", "--audit-log"],
        &dir,
    );
    assert!(ok, "{out}{err}");
    let _down = Down(&dir);
    // A merge patch of the CDI resource's spec, as an admin edits it.
    let patch_spec = |spec: &str| {
        kubectl(
            &dir,
            &[
                "patch",
                "cdi",
                "cdi",
                "--type",
                "merge",
                "-p",
                &format!(r#"{{"spec":{spec}}}"#),
            ],
            None,
        )
    };
    let cr = get_json(&dir, "", "cdi/cdi").unwrap();
    assert_eq!(cr["status"]["phase"], "Deployed", "{cr}");
    let condition = |cr: &Value, t: &str| {
        cr["status"]["conditions"].as_array().and_then(|c| {
            c.iter()
                .find(|c| c["type"] == t)
                .map(|c| c["status"].clone())
        })
    };
    assert_eq!(condition(&cr, "Available"), Some("True".into()), "{cr}");
    assert_eq!(condition(&cr, "Progressing"), Some("False".into()), "{cr}");
    assert_eq!(condition(&cr, "Degraded"), Some("False".into()), "{cr}");
    assert_eq!(cr["status"]["observedVersion"], env!("CARGO_PKG_VERSION"));
    // The CDI kind is served at v1alpha1 too: an old manifest still applies.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: cdi.kubevirt.io/v1alpha1\nkind: CDI\nmetadata: {name: cdi, labels: {written-at: v1alpha1}}\n",
        ),
    );
    let old = kubectl(
        &dir,
        &[
            "get",
            "cdis.v1alpha1.cdi.kubevirt.io",
            "cdi",
            "-o",
            "jsonpath={.apiVersion} {.metadata.labels.written-at} {.spec.config.featureGates}",
        ],
        None,
    );
    assert_eq!(
        old,
        r#"cdi.kubevirt.io/v1alpha1 v1alpha1 ["HonorWaitForFirstConsumer"]"#
    );
    // Each component runs under its own account.
    for (component, account) in [
        ("cdi-deployment", "cdi-sa"),
        ("cdi-apiserver", "cdi-apiserver"),
        ("cdi-uploadproxy", "cdi-uploadproxy"),
    ] {
        let used = kubectl(
            &dir,
            &[
                "get",
                "deployment",
                component,
                "-n",
                "cdi",
                "-o",
                "jsonpath={.spec.template.spec.serviceAccountName}",
            ],
            None,
        );
        assert_eq!(used, account);
    }
    // One operator acts at a time: the one holding upstream's lease.
    let holder = || {
        let pod = kubectl(
            &dir,
            &[
                "get",
                "pods",
                "-n",
                "cdi",
                "-l",
                "name=cdi-operator",
                "--field-selector",
                "status.phase=Running",
                "-o",
                "jsonpath={.items[*].metadata.name}",
            ],
            None,
        );
        let held = kubectl(
            &dir,
            &[
                "get",
                "lease",
                "cdi-operator-leader-election-helper",
                "-n",
                "cdi",
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
            None,
        );
        (pod, held)
    };
    let (pod, held) = holder();
    assert!(held.starts_with(&format!("{pod}-")), "{pod} {held}");
    // The operator's metric says the install is ready.
    let ip = kubectl(
        &dir,
        &[
            "get",
            "pods",
            "-n",
            "cdi",
            "-l",
            "name=cdi-operator",
            "-o",
            "jsonpath={.items[0].status.podIP}",
        ],
        None,
    );
    let page = reqwest::get(format!("http://{ip}:8080/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.lines().any(|l| l == "kubevirt_cdi_cr_ready 1"),
        "{page}"
    );

    // Prometheus Operator and the volume populators' registry installed after CDI: the operator
    // adds CDI's rules and alerts, its scrape target and Prometheus's access to it, and
    // registers CDI's populator kinds.
    let crd = |plural: &str, kind: &str, group: &str, version: &str, scope: &str| {
        format!(
            "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata: {{name: {plural}.{group}}}\nspec:\n  group: {group}\n  scope: {scope}\n  names: {{kind: {kind}, listKind: {kind}List, plural: {plural}, singular: {}}}\n  versions: [{{name: {version}, served: true, storage: true, schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}}}]\n---\n",
            kind.to_ascii_lowercase()
        )
    };
    let extensions = [
        crd(
            "prometheusrules",
            "PrometheusRule",
            "monitoring.coreos.com",
            "v1",
            "Namespaced",
        ),
        crd(
            "servicemonitors",
            "ServiceMonitor",
            "monitoring.coreos.com",
            "v1",
            "Namespaced",
        ),
        crd(
            "volumepopulators",
            "VolumePopulator",
            "populator.storage.k8s.io",
            "v1beta1",
            "Cluster",
        ),
    ]
    .concat();
    kubectl(&dir, &["apply", "-f", "-"], Some(&extensions));
    let rule = wait_for("the operator to install CDI's PrometheusRule", 60, || {
        get_json(&dir, "cdi", "prometheusrule/prometheus-cdi-rules")
    });
    assert_eq!(
        rule["spec"]["groups"],
        cdi_core::monitoring::groups("cdi"),
        "{rule}"
    );
    let monitor = wait_for("the ServiceMonitor", 30, || {
        get_json(&dir, "cdi", "servicemonitor/service-monitor-cdi")
    });
    assert_eq!(
        monitor["spec"]["selector"]["matchLabels"]["prometheus.cdi.kubevirt.io"],
        "true"
    );
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    // What it selects: the metrics Service, whose port of that name it scrapes.
    let selected = kubectl(
        &dir,
        &[
            "get",
            "services",
            "-n",
            "cdi",
            "-l",
            "prometheus.cdi.kubevirt.io=true",
            "-o",
            "jsonpath={.items[*].metadata.name} {.items[*].spec.ports[*].name}",
        ],
        None,
    );
    assert_eq!(selected, "cdi-prometheus-metrics metrics");
    let binding = get_json(&dir, "cdi", "rolebinding/cdi-monitoring").unwrap();
    assert_eq!(
        binding["subjects"][0],
        serde_json::json!({"kind": "ServiceAccount", "name": "prometheus-k8s", "namespace": "monitoring"})
    );
    for kind in [
        "VolumeImportSource",
        "VolumeUploadSource",
        "VolumeCloneSource",
    ] {
        let registered = wait_for(&format!("{kind} registered"), 30, || {
            get_json(
                &dir,
                "",
                &format!("volumepopulator/{}", kind.to_ascii_lowercase()),
            )
        });
        assert_eq!(
            registered["sourceKind"],
            serde_json::json!({"group": "cdi.kubevirt.io", "kind": kind})
        );
    }

    // Imports, uploads and clones through that install: on local-path (worker pods fill the
    // claim) and on the CSI class (populators, a snapshot clone). The example resource honours
    // WaitForFirstConsumer; these volumes have no consumer.
    devcluster::set_feature_gates(&dir, "[]");
    let dv = |name: &str, ns: &str, class: &str, source: &str| {
        format!(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataVolume\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  {source}\n  storage: {{storageClassName: {class}, accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 64Mi}}}}}}\n"
        )
    };
    let http = format!(
        "source: {{http: {{url: \"{}\"}}}}",
        server.url("/disk.qcow2")
    );
    let upload = |name: &str, class: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cdi"))
            .args([
                "image-upload",
                "dv",
                name,
                "--size",
                "64Mi",
                "--storage-class",
                class,
                "--image-path",
                qcow2.to_str().unwrap(),
                "--access-mode",
                "ReadWriteOnce",
                "--wait-secs",
                "60",
            ])
            .env("KUBECONFIG", dir.join("kubeconfig"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let succeeded = |ns: &str, name: &str| {
        wait_for(&format!("{ns}/{name} to succeed"), 120, || {
            get_json(&dir, ns, &format!("dv/{name}"))
                .filter(|d| d["status"]["phase"] == "Succeeded")
        })
    };
    kubectl(&dir, &["create", "namespace", "vms"], None);
    for class in ["local-path", "csi"] {
        kubectl(
            &dir,
            &["apply", "-f", "-"],
            Some(&dv(&format!("imported-{class}"), "default", class, &http)),
        );
        upload(&format!("uploaded-{class}"), class);
        succeeded("default", &format!("imported-{class}"));
        succeeded("default", &format!("uploaded-{class}"));
        let source = format!("source: {{pvc: {{namespace: default, name: imported-{class}}}}}");
        kubectl(
            &dir,
            &["apply", "-f", "-"],
            Some(&dv(&format!("cloned-{class}"), "vms", class, &source)),
        );
        succeeded("vms", &format!("cloned-{class}"));
    }
    // A DataVolume from a VolumeSnapshot.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: snapshot.storage.k8s.io/v1\nkind: VolumeSnapshot\nmetadata: {name: snap}\nspec: {volumeSnapshotClassName: csi-snapclass, source: {persistentVolumeClaimName: imported-csi}}\n",
        ),
    );
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&dv(
            "from-snapshot",
            "vms",
            "csi",
            "source: {snapshot: {namespace: default, name: snap}}",
        )),
    );
    succeeded("vms", "from-snapshot");
    // A claim cloned from that snapshot through a VolumeCloneSource, asking no size: rendered
    // with the snapshot's.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: VolumeCloneSource\nmetadata: {name: snap-source}\nspec: {source: {kind: VolumeSnapshot, name: snap}}\n---\napiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: restored, labels: {cdi.kubevirt.io/applyStorageProfile: \"true\"}}\nspec:\n  storageClassName: csi\n  accessModes: [ReadWriteOnce]\n  dataSourceRef: {apiGroup: cdi.kubevirt.io, kind: VolumeCloneSource, name: snap-source}\n",
        ),
    );
    let restored = get_json(&dir, "default", "pvc/restored").unwrap();
    assert!(
        restored["spec"]["resources"]["requests"]["storage"].is_string(),
        "{restored}"
    );
    kubectl(&dir, &["delete", "pvc", "restored", "--wait=false"], None);
    // A DataVolume from a DataSource, and a claim rendered from its StorageProfile.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: cdi.kubevirt.io/v1beta1\nkind: DataSource\nmetadata: {name: golden}\nspec: {source: {pvc: {namespace: default, name: imported-local-path}}}\n",
        ),
    );
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&dv(
            "from-source",
            "default",
            "local-path",
            "sourceRef: {kind: DataSource, name: golden}",
        )),
    );
    succeeded("default", "from-source");
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: rendered, labels: {cdi.kubevirt.io/applyStorageProfile: \"true\"}}\nspec: {storageClassName: local-path, accessModes: [ReadWriteOnce], resources: {requests: {storage: 64Mi}}}\n",
        ),
    );
    let rendered = get_json(&dir, "default", "pvc/rendered").unwrap();
    assert_eq!(rendered["spec"]["volumeMode"], "Filesystem", "{rendered}");
    assert_ne!(
        rendered["spec"]["resources"]["requests"]["storage"], "64Mi",
        "{rendered}"
    );
    // Honouring WaitForFirstConsumer, the importer goes where the consumer's node is.
    devcluster::set_feature_gates(&dir, r#"["HonorWaitForFirstConsumer"]"#);
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&dv("consumed", "default", "local-path", &http)),
    );
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&consumer("consumer", "consumed")),
    );
    succeeded("default", "consumed");

    // Uninstall is refused while DataVolumes exist under BlockUninstallIfWorkloadsExist.
    patch_spec(r#"{"uninstallStrategy":"BlockUninstallIfWorkloadsExist"}"#);
    let (ok, _, err) =
        devcluster::kubectl_as(&dir.join("kubeconfig"), &["delete", "cdi", "cdi"], None);
    // Upstream's words; it counts at most two.
    assert!(
        !ok && err.contains(
            "rejecting the uninstall request, since there are still 2 DataVolumes present. \
             Either delete all DataVolumes or change the uninstall strategy before uninstalling CDI"
        ),
        "{err}"
    );
    // Least privilege, proven by trying: every rule of every component role, taken away, refuses
    // a request the components made (replayed through kube's authorizer); and nothing they asked
    // was refused.
    let requests = audited(&dir);
    let refused: Vec<String> = requests
        .iter()
        .filter(|r| !r.2 && !r.3)
        .map(|(u, a, _, _)| format!("{} {} {:?}", u.name, a.verb, a))
        .collect();
    assert!(
        refused.is_empty(),
        "components were refused:\n{}",
        refused.join("\n")
    );
    let needed = needed_by(&policy(&dir), &requests);
    assert!(needed.len() > 20, "{needed:?}");
    let unneeded: Vec<&String> = needed
        .iter()
        .filter(|(rule, n)| **n == 0 && !NOT_REACHED.iter().any(|(r, _)| rule.contains(r)))
        .map(|(rule, _)| rule)
        .collect();
    assert!(
        unneeded.is_empty(),
        "rules no request needed (of {}):\n{}",
        needed.len(),
        unneeded
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Certificate rotation, as upstream's test asks for it: a CA marked expired (its notAfter
    // annotation moved to just after its notBefore) is made again, its bundle keeps the old one
    // beside it; new lifetimes in spec.certConfig make the serving and client certificates
    // again, signed by the new CAs. The components take them up while running, and an upload
    // (webhooks, the token API, the proxy, an upload server) still works.
    let signers = [
        ("cdi-apiserver-signer", "cdi-apiserver-signer-bundle"),
        ("cdi-uploadproxy-signer", "cdi-uploadproxy-signer-bundle"),
        ("cdi-uploadserver-signer", "cdi-uploadserver-signer-bundle"),
        (
            "cdi-uploadserver-client-signer",
            "cdi-uploadserver-client-signer-bundle",
        ),
    ];
    let secret = |name: &str| get_json(&dir, "cdi", &format!("secret/{name}")).unwrap();
    let bundle = |name: &str| {
        get_json(&dir, "cdi", &format!("configmap/{name}")).unwrap()["data"]["ca-bundle.crt"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    let pems = |text: &str| text.matches("-----BEGIN CERTIFICATE-----").count();
    for (signer, bundle_name) in signers {
        let before = secret(signer);
        assert_eq!(pems(&bundle(bundle_name)), 1, "{bundle_name}");
        let not_before =
            before["metadata"]["annotations"]["auth.openshift.io/certificate-not-before"]
                .as_str()
                .unwrap_or_else(|| panic!("{signer} has no notBefore: {before}"))
                .to_string();
        let start: k8s_openapi::jiff::Timestamp = not_before.parse().unwrap();
        let expired = (start + k8s_openapi::jiff::SignedDuration::from_secs(1)).to_string();
        kubectl(
            &dir,
            &[
                "annotate",
                "--overwrite",
                "secret",
                signer,
                "-n",
                "cdi",
                &format!("auth.openshift.io/certificate-not-after={expired}"),
            ],
            None,
        );
        wait_for(&format!("{signer} made again"), 60, || {
            let now = secret(signer);
            (now["data"]["tls.crt"] != before["data"]["tls.crt"]).then_some(())
        });
        // Said on the CDI resource, in library-go's words.
        wait_for(&format!("the event of {signer}"), 30, || {
            let said = kubectl(
                &dir,
                &[
                    "get",
                    "events",
                    "-A",
                    "--field-selector",
                    "reason=SignerUpdateRequired",
                    "-o",
                    "jsonpath={.items[*].message}",
                ],
                None,
            );
            said.contains(&format!(
                "\"{signer}\" in \"cdi\" requires a new signing cert/key pair: already expired"
            ))
            .then_some(())
        });
        // The new CA first, the old one kept until it expires.
        let both = wait_for(&format!("{bundle_name} with both CAs"), 30, || {
            Some(bundle(bundle_name)).filter(|b| pems(b) == 2)
        });
        let new_ca = String::from_utf8(base64_decode(
            secret(signer)["data"]["tls.crt"].as_str().unwrap(),
        ))
        .unwrap();
        assert!(both.starts_with(new_ca.trim_end()), "{bundle_name}: {both}");
    }
    let served = |service: &str| {
        let ip = kubectl(
            &dir,
            &[
                "get",
                "svc",
                service,
                "-n",
                "cdi",
                "-o",
                "jsonpath={.spec.clusterIP}",
            ],
            None,
        );
        format!("https://{ip}/healthz")
    };
    let (proxy_url, api_url) = (served("cdi-uploadproxy"), served("cdi-api"));
    let old_proxy_cert = served_certificate(&proxy_url).await;
    let old_api_cert = served_certificate(&api_url).await;
    patch_spec(
        r#"{"certConfig":{"server":{"duration":"20h","renewBefore":"8h"},"client":{"duration":"20h","renewBefore":"8h"}}}"#,
    );
    for target in [
        "cdi-apiserver-server-cert",
        "cdi-uploadproxy-server-cert",
        "cdi-uploadserver-client-cert",
    ] {
        let made = wait_for(&format!("{target} made for the new lifetimes"), 60, || {
            let s = secret(target);
            (s["metadata"]["annotations"]["operator.cdi.kubevirt.io/certConfig"]
                == r#"{"lifetime":"20h0m0s","refresh":"12h0m0s"}"#)
                .then_some(s)
        });
        // Signed by the new CA (library-go's issuer names are unique per CA).
        let issuer = made["metadata"]["annotations"]["auth.openshift.io/certificate-issuer"]
            .as_str()
            .unwrap()
            .to_string();
        let signer = signers
            .iter()
            .find(|(s, _)| issuer.contains(&format!("_{s}@")))
            .unwrap_or_else(|| panic!("{target}: issuer {issuer}"))
            .0;
        let ca = String::from_utf8(base64_decode(
            secret(signer)["data"]["tls.crt"].as_str().unwrap(),
        ))
        .unwrap();
        assert!(
            ca_common_name(&ca).as_deref() == Some(issuer.as_str()),
            "{target} is signed by {issuer}, not by the current {signer}"
        );
    }
    // The running components serve the new certificates (the kubelet rewrote the proxy's
    // mounted Secret; the token API read its own).
    for (url, old, name) in [
        (&proxy_url, &old_proxy_cert, "cdi-uploadproxy-server-cert"),
        (&api_url, &old_api_cert, "cdi-apiserver-server-cert"),
    ] {
        let want = pem_der(
            &String::from_utf8(base64_decode(
                secret(name)["data"]["tls.crt"].as_str().unwrap(),
            ))
            .unwrap(),
        );
        assert_ne!(&want, old);
        let mut now = Vec::new();
        for _ in 0..600 {
            now = served_certificate(url).await;
            if now == want {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert_eq!(
            now, want,
            "{url} still serves the certificate before {name}"
        );
    }
    // Clients learn the proxy's CAs from CDIConfig.
    let proxy_bundle = bundle("cdi-uploadproxy-signer-bundle");
    wait_for("CDIConfig publishing the rotated proxy CAs", 60, || {
        get_json(&dir, "", "cdiconfig/config")
            .filter(|c| c["status"]["uploadProxyCA"] == proxy_bundle.as_str())
    });
    // No consumer follows: bound at once.
    devcluster::set_feature_gates(&dir, "[]");
    upload("rotated-upload", "local-path");
    succeeded("default", "rotated-upload");

    // An upgrade: a new release in the operator's environment rolls every component to it.
    // The cluster now has upstream's PriorityClass too, which the components then run at (the
    // operator leaves out a class the cluster does not have).
    let class = kubectl(
        &dir,
        &[
            "get",
            "deployments",
            "-n",
            "cdi",
            "-o",
            "jsonpath={.items[*].spec.template.spec.priorityClassName}",
        ],
        None,
    );
    assert_eq!(class, "", "no such class yet");
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(
            "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: kubevirt-cluster-critical}\nvalue: 1000000000\n",
        ),
    );
    // spec.customizeComponents: a patch that cannot apply is refused in an event and nothing
    // changes; patches and flags that apply reach the Deployments they name, and stay through
    // the upgrade.
    let customize = |c: &str| patch_spec(&format!(r#"{{"customizeComponents":{c}}}"#));
    customize(
        r#"{"patches":[{"resourceName":"cdi-uploadproxy","resourceType":"Deployment","type":"json","patch":"[{\"op\":\"replace\",\"path\":\"/nope/x\",\"value\":1}]"}]}"#,
    );
    wait_for("the bad customization refused in an event", 60, || {
        let events = kubectl(
            &dir,
            &[
                "get",
                "events",
                "-A",
                "--field-selector",
                "reason=InvalidCustomization",
                "-o",
                "jsonpath={.items[*].message}",
            ],
            None,
        );
        events
            .contains("spec.customizeComponents: the json patch for Deployment cdi-uploadproxy: ")
            .then_some(())
    });
    customize(
        r#"{"patches":[{"resourceName":"cdi-uploadproxy","resourceType":"Deployment","type":"strategic","patch":"{\"metadata\":{\"labels\":{\"customized\":\"yes\"}}}"}],"flags":{"api":{"v":"2"}}}"#,
    );
    let customized = || {
        let proxy = get_json(&dir, "cdi", "deployment/cdi-uploadproxy").unwrap();
        let api = get_json(&dir, "cdi", "deployment/cdi-apiserver").unwrap();
        let args = api["spec"]["template"]["spec"]["containers"][0]["args"].clone();
        let id = &proxy["metadata"]["annotations"]["cdi.kubevirt.io/customizer-identifier"];
        (proxy["metadata"]["labels"]["customized"] == "yes"
            && id.is_string()
            && args == serde_json::json!(["-v", "2"]))
        .then_some(())
    };
    wait_for("the customization applied", 60, customized);
    // What the release before made and this one does not: gone once the upgrade is done.
    // (An object of the same labels not owned by the resource is not the operator's to prune.)
    let uid = get_json(&dir, "", "cdi/cdi").unwrap()["metadata"]["uid"].clone();
    let old_version = env!("CARGO_PKG_VERSION");
    let leftover = |kind: &str, name: &str, ns: &str, owned: bool| {
        let owner = if owned {
            format!(
                ", ownerReferences: [{{apiVersion: cdi.kubevirt.io/v1beta1, kind: CDI, name: cdi, uid: {uid}, controller: true}}]"
            )
        } else {
            String::new()
        };
        let ports = if kind == "Service" {
            "\nspec: {ports: [{port: 80}]}"
        } else {
            ""
        };
        format!(
            "apiVersion: {}\nkind: {kind}\nmetadata: {{name: {name}, namespace: {ns}, labels: {{app.kubernetes.io/managed-by: cdi-operator, operator.cdi.kubevirt.io/updateVersion: \"{old_version}\"}}{owner}}}{ports}\n---\n",
            if kind == "Service" {
                "v1"
            } else {
                "rbac.authorization.k8s.io/v1"
            }
        )
    };
    let stale = [
        leftover("ClusterRole", "cdi-retired", "", true),
        leftover("Service", "cdi-retired", "cdi", true),
        leftover("ClusterRole", "someone-elses", "", false),
    ]
    .concat();
    kubectl(&dir, &["apply", "-f", "-"], Some(&stale));
    let next = "0.0.1-next";
    let image = |c: &str| format!("cdi-rs/cdi-{c}:{next}");
    let env = kubectl(
        &dir,
        &[
            "get",
            "deployment",
            "cdi-operator",
            "-n",
            "cdi",
            "-o",
            "jsonpath={.spec.template.spec.containers[0].env[*].name}",
        ],
        None,
    );
    let mut ops = Vec::new();
    for (i, name) in env.split_whitespace().enumerate() {
        let value = match name {
            "OPERATOR_VERSION" => next.to_string(),
            "CONTROLLER_IMAGE" => image("controller"),
            "IMPORTER_IMAGE" => image("importer"),
            "CLONER_IMAGE" => image("cloner"),
            "APISERVER_IMAGE" => image("apiserver"),
            "UPLOAD_SERVER_IMAGE" => image("uploadserver"),
            "UPLOAD_PROXY_IMAGE" => image("uploadproxy"),
            _ => continue,
        };
        ops.push(serde_json::json!({"op": "replace",
            "path": format!("/spec/template/spec/containers/0/env/{i}/value"), "value": value}));
    }
    assert_eq!(ops.len(), 7, "{env}");
    kubectl(
        &dir,
        &[
            "patch",
            "deployment",
            "cdi-operator",
            "-n",
            "cdi",
            "--type",
            "json",
            "-p",
            &Value::Array(ops).to_string(),
        ],
        None,
    );
    let upgraded = wait_for("the upgrade to complete", 180, || {
        get_json(&dir, "", "cdi/cdi").filter(|c| {
            c["status"]["observedVersion"] == next && c["status"]["phase"] == "Deployed"
        })
    });
    assert_eq!(upgraded["status"]["operatorVersion"], next, "{upgraded}");
    customized().expect("the customization stays through the upgrade");
    // The old operator gave the lease up; the new one holds it.
    let (pod_now, held_now) = wait_for("the new operator alone", 60, || {
        let (p, h) = holder();
        (!p.contains(' ') && p != pod).then_some((p, h))
    });
    assert!(
        held_now.starts_with(&format!("{pod_now}-")),
        "{pod_now} {held_now}"
    );
    for d in ["cdi-deployment", "cdi-apiserver", "cdi-uploadproxy"] {
        let running = kubectl(
            &dir,
            &[
                "get",
                "deployment",
                d,
                "-n",
                "cdi",
                "-o",
                "jsonpath={.spec.template.spec.priorityClassName} {.spec.template.spec.containers[0].image}",
            ],
            None,
        );
        assert!(
            running.starts_with("kubevirt-cluster-critical ")
                && running.ends_with(&format!(":{next}")),
            "{d}: {running}"
        );
    }
    wait_for("the retired objects to go", 60, || {
        let gone = get_json(&dir, "", "clusterrole/cdi-retired").is_none()
            && get_json(&dir, "cdi", "service/cdi-retired").is_none();
        gone.then_some(())
    });
    assert!(get_json(&dir, "", "clusterrole/someone-elses").is_some());
    kubectl(&dir, &["delete", "clusterrole", "someone-elses"], None);
    // The rolled controller makes importers of the new release, which still import.
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&dv("after-upgrade", "default", "local-path", &http)),
    );
    kubectl(
        &dir,
        &["apply", "-f", "-"],
        Some(&consumer("consumer-2", "after-upgrade")),
    );
    succeeded("default", "after-upgrade");

    // Uninstall, once they are gone.
    kubectl(
        &dir,
        &["delete", "pod", "consumer", "consumer-2", "--wait=false"],
        None,
    );
    kubectl(&dir, &["delete", "dv", "--all", "-A"], None);
    kubectl(&dir, &["delete", "cdi", "cdi"], None);
    wait_for("the CDI resource to go", 120, || {
        get_json(&dir, "", "cdi/cdi").is_none().then_some(())
    });
    let left = |what: &str, ns: &[&str], keep: &[&str]| {
        let mut args = vec!["get", what, "-o", "jsonpath={.items[*].metadata.name}"];
        args.extend_from_slice(ns);
        kubectl(&dir, &args, None)
            .split_whitespace()
            .filter(|n| !keep.iter().any(|k| n.starts_with(k)))
            .map(String::from)
            .collect::<Vec<_>>()
    };
    wait_for("nothing of CDI to be left", 120, || {
        let leftovers = [
            left(
                "deployments,serviceaccounts,services,secrets,roles,rolebindings,leases",
                &["-n", "cdi"],
                &["cdi-operator", "default"],
            ),
            left("configmaps", &["-n", "cdi"], &["kube-root-ca.crt"]),
            left("pods", &["-n", "cdi"], &["cdi-operator"]),
            left(
                "rolebindings",
                &["-n", "kube-system"],
                &["cdi-operator", "system:"],
            ),
            left(
                "clusterroles,clusterrolebindings",
                &["-l", "app.kubernetes.io/managed-by=cdi-operator"],
                &[],
            ),
            left(
                "customresourcedefinitions",
                &[],
                &[
                    "cdis.",
                    "virtualmachine",
                    "volumesnapshot",
                    "prometheusrules.",
                    "servicemonitors.",
                    "volumepopulators.",
                ],
            ),
            left("prometheusrules,servicemonitors", &["-n", "cdi"], &[]),
            left("volumepopulators", &[], &[]),
            left(
                "mutatingwebhookconfigurations,validatingwebhookconfigurations,apiservices",
                &[],
                &["v1."],
            ),
            left(
                "pods,services",
                &[
                    "-A",
                    "-l",
                    "cdi.kubevirt.io in (importer, cdi-upload-server, cdi-clone-source)",
                ],
                &[],
            ),
        ]
        .concat();
        leftovers.is_empty().then_some(()).or_else(|| {
            eprintln!("left: {leftovers:?}");
            None
        })
    });
}

fn base64_decode(text: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .unwrap()
}

/// The DER of the first certificate of `pem`.
fn pem_der(pem: &str) -> Vec<u8> {
    let body: String = pem
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    base64_decode(&body)
}

fn ca_common_name(pem: &str) -> Option<String> {
    cdi_pki::rotation::common_names(pem).into_iter().next()
}

/// The certificate `url`'s server presents (DER), or nothing when it cannot be reached.
async fn served_certificate(url: &str) -> Vec<u8> {
    let client = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .tls_info(true)
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .unwrap();
    match client.get(url).send().await {
        Ok(r) => r
            .extensions()
            .get::<reqwest::tls::TlsInfo>()
            .and_then(|t| t.peer_certificate())
            .map(<[u8]>::to_vec)
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}
