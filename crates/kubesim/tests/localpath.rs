//! The local-path and CSI-like provisioners with the scheduler and the PV controller, through
//! the API server.

mod common;

use std::time::Duration;

use common::wait_for;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use kubesim::agents::localpath::agent::Provisioner;
use kubesim::agents::localpath::{Driver, NodeDirs};
use kubesim::agents::nodes::default_nodes;
use kubesim::agents::pvcontroller;
use kubesim::apiserver::ApiServer;
use kubesim::cluster;
use serde_json::{Value, json};

struct Cluster {
    _server: ApiServer,
    client: Client,
    root: tempfile::TempDir,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

async fn cluster() -> Cluster {
    let (server, client) = common::with_nodes().await;
    let root = tempfile::tempdir().unwrap();
    let every = Duration::from_millis(30);
    let dirs = NodeDirs {
        root: root.path().to_path_buf(),
    };
    let names: Vec<String> = default_nodes().into_iter().map(|n| n.name).collect();
    let tasks = cluster::spawn_agents(&client, &dirs, &names, &Default::default(), every);
    Cluster {
        _server: server,
        client,
        root,
        tasks,
    }
}

impl Cluster {
    /// One whole pass of the PV controller and of both provisioners over what the cluster holds
    /// now: what they did not do in it, they were not going to do.
    async fn pass(&self) {
        pvcontroller::agent::pass(&self.client, &mut Default::default())
            .await
            .unwrap();
        for driver in Driver::ALL {
            let dirs = NodeDirs {
                root: self.root.path().to_path_buf(),
            };
            Provisioner::new(self.client.clone(), driver, dirs)
                .pass()
                .await
                .unwrap();
        }
    }
}

async fn create<K>(api: Api<K>, value: Value)
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
}

fn claim(name: &str, class: &str) -> Value {
    json!({"metadata": {"name": name}, "spec": {"storageClassName": class,
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}})
}

async fn bound_volume(claims: &Api<PersistentVolumeClaim>, name: &str) -> Option<String> {
    let c = claims.get(name).await.unwrap();
    if c.status?.phase.as_deref() != Some("Bound") {
        return None;
    }
    c.spec?.volume_name
}

fn node_of(v: &PersistentVolume) -> String {
    let terms = &v.spec.as_ref().unwrap().node_affinity.as_ref().unwrap();
    let term = &terms.required.as_ref().unwrap().node_selector_terms[0];
    let req = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(req.key, "kubernetes.io/hostname");
    req.values.as_ref().unwrap()[0].clone()
}

#[tokio::test]
async fn an_immediate_claim_binds_before_any_pod_and_its_directory_goes_with_it() {
    let c = cluster().await;
    create(
        Api::<StorageClass>::all(c.client.clone()),
        json!({"metadata": {"name": "local-path"},
        "provisioner": "rancher.io/local-path", "volumeBindingMode": "Immediate"}),
    )
    .await;
    create(
        Api::<PersistentVolumeClaim>::default_namespaced(c.client.clone()),
        claim("scratch", "local-path"),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client.clone());
    let pv_name = wait_for("scratch bound", async || {
        bound_volume(&claims, "scratch").await
    })
    .await;
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let pv = volumes.get(&pv_name).await.unwrap();
    let spec = pv.spec.clone().unwrap();
    assert_eq!(spec.capacity.unwrap()["storage"].0, "2Gi");
    assert_eq!(
        spec.persistent_volume_reclaim_policy.as_deref(),
        Some("Delete")
    );
    let node = node_of(&pv);
    let dir = std::path::PathBuf::from(spec.host_path.unwrap().path);
    let uid = claims.get("scratch").await.unwrap().metadata.uid.unwrap();
    assert_eq!(
        dir,
        c.root
            .path()
            .join(&node)
            .join("opt/local-path-provisioner")
            .join(format!("pvc-{uid}_default_scratch"))
    );
    assert!(dir.is_dir());

    // A second claim goes to another node: volumes are spread.
    create(
        Api::<PersistentVolumeClaim>::default_namespaced(c.client.clone()),
        claim("more", "local-path"),
    )
    .await;
    let other = wait_for("more bound", async || bound_volume(&claims, "more").await).await;
    assert_ne!(node_of(&volumes.get(&other).await.unwrap()), node);

    claims
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("volume deleted", async || {
        volumes
            .get_opt(&pv_name)
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    assert!(!dir.exists(), "the Delete policy removes the directory");
}

#[tokio::test]
async fn a_wffc_claim_is_provisioned_on_the_node_its_pod_is_scheduled_to() {
    let c = cluster().await;
    create(Api::<StorageClass>::all(c.client.clone()), json!({"metadata": {"name": "local-wffc"},
        "provisioner": "rancher.io/local-path", "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Retain",
        "parameters": {"nodePath": "/var/vm-disks", "pathPattern": "{{ .PVC.Namespace }}/{{ .PVC.Name }}"}})).await;
    create(
        Api::<PersistentVolumeClaim>::default_namespaced(c.client.clone()),
        claim("vm-disk", "local-wffc"),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client.clone());
    c.pass().await;
    let waiting = claims.get("vm-disk").await.unwrap();
    assert_eq!(waiting.status.unwrap().phase.as_deref(), Some("Pending"));
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    assert!(
        volumes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );

    create(Api::<Pod>::default_namespaced(c.client.clone()), json!({"metadata": {"name": "virt-launcher"}, "spec": {
        "containers": [{"name": "compute", "image": "x"}],
        "nodeSelector": {"node-role.kubernetes.io/virt-local": "true"},
        "tolerations": [{"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
        "volumes": [{"name": "disk", "persistentVolumeClaim": {"claimName": "vm-disk"}}]}})).await;
    let pods: Api<Pod> = Api::default_namespaced(c.client.clone());
    let node = wait_for("pod scheduled", async || {
        pods.get("virt-launcher").await.unwrap().spec?.node_name
    })
    .await;
    assert_eq!(node, "node-2");
    let claim = claims.get("vm-disk").await.unwrap();
    let annotations = claim.metadata.annotations.unwrap();
    assert_eq!(annotations["volume.kubernetes.io/selected-node"], "node-2");
    assert_eq!(
        annotations["volume.kubernetes.io/storage-provisioner"],
        "rancher.io/local-path"
    );
    let pv = volumes
        .get(&claim.spec.unwrap().volume_name.unwrap())
        .await
        .unwrap();
    assert_eq!(node_of(&pv), "node-2");
    let dir = c.root.path().join("node-2/var/vm-disks/default/vm-disk");
    assert_eq!(
        pv.spec.unwrap().host_path.unwrap().path,
        dir.to_string_lossy()
    );
    assert!(dir.is_dir());
}

#[tokio::test]
async fn a_block_claim_is_refused_with_an_event() {
    let c = cluster().await;
    create(
        Api::<StorageClass>::all(c.client.clone()),
        json!({"metadata": {"name": "local-path"},
        "provisioner": "rancher.io/local-path"}),
    )
    .await;
    let mut block = claim("raw", "local-path");
    block["spec"]["volumeMode"] = json!("Block");
    create(
        Api::<PersistentVolumeClaim>::default_namespaced(c.client.clone()),
        block,
    )
    .await;
    let events: Api<Event> = Api::default_namespaced(c.client.clone());
    let message = wait_for("event", async || {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        list.into_iter()
            .find(|e| e.reason.as_deref() == Some("ProvisioningFailed"))?
            .message
    })
    .await;
    assert!(
        message.contains("only Filesystem") && message.contains("\"raw\""),
        "{message}"
    );
}

#[tokio::test]
async fn the_csi_driver_makes_block_files_clones_by_copy_and_leaves_populator_claims_pending() {
    let c = cluster().await;
    create(
        Api::<StorageClass>::all(c.client.clone()),
        json!({"metadata": {"name": "csi"}, "provisioner": "csi.cdi-rs.dev"}),
    )
    .await;
    let claims_api = || Api::<PersistentVolumeClaim>::default_namespaced(c.client.clone());
    let mut block = claim("raw", "csi");
    block["spec"]["volumeMode"] = json!("Block");
    block["spec"]["resources"]["requests"]["storage"] = json!("64Mi");
    create(claims_api(), block).await;
    create(claims_api(), claim("files", "csi")).await;
    let claims = claims_api();
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let raw_pv = wait_for("raw bound", async || bound_volume(&claims, "raw").await).await;
    let files_pv = wait_for("files bound", async || bound_volume(&claims, "files").await).await;
    let path_of = async |pv: &str| {
        let v = volumes.get(pv).await.unwrap();
        assert_eq!(
            v.spec.as_ref().unwrap().csi.as_ref().unwrap().driver,
            "csi.cdi-rs.dev"
        );
        std::path::PathBuf::from(&v.spec.unwrap().csi.unwrap().volume_attributes.unwrap()["path"])
    };
    let raw = path_of(&raw_pv).await;
    assert_eq!(
        std::fs::metadata(&raw).unwrap().len(),
        64 << 20,
        "a 64Mi sparse file"
    );
    let files = path_of(&files_pv).await;
    assert!(files.is_dir());

    // Data in both, then clone each.
    std::fs::write(files.join("disk.img"), b"hello from the source").unwrap();
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&raw).unwrap();
        f.write_all_at(b"MBR", 1 << 20).unwrap();
    }
    let mut clone = claim("files-copy", "csi");
    clone["spec"]["dataSource"] = json!({"kind": "PersistentVolumeClaim", "name": "files"});
    create(claims_api(), clone).await;
    let mut raw_clone = claim("raw-copy", "csi");
    raw_clone["spec"]["volumeMode"] = json!("Block");
    raw_clone["spec"]["resources"]["requests"]["storage"] = json!("96Mi");
    raw_clone["spec"]["dataSourceRef"] = json!({"kind": "PersistentVolumeClaim", "name": "raw"});
    create(claims_api(), raw_clone).await;
    // A claim for a populator (CDI's VolumeImportSource): no provisioner may touch it.
    let mut populated = claim("populated", "csi");
    populated["spec"]["dataSourceRef"] =
        json!({"apiGroup": "cdi.kubevirt.io", "kind": "VolumeImportSource", "name": "src"});
    create(claims_api(), populated).await;

    let copy = wait_for("files-copy bound", async || {
        bound_volume(&claims, "files-copy").await
    })
    .await;
    let copy = path_of(&copy).await;
    assert_ne!(copy, files);
    assert_eq!(
        std::fs::read(copy.join("disk.img")).unwrap(),
        b"hello from the source"
    );
    let raw_copy = wait_for("raw-copy bound", async || {
        bound_volume(&claims, "raw-copy").await
    })
    .await;
    let raw_copy = path_of(&raw_copy).await;
    assert_eq!(
        std::fs::metadata(&raw_copy).unwrap().len(),
        96 << 20,
        "grown to the request"
    );
    let mut head = [0u8; 3];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&raw_copy).unwrap(),
        &mut head,
        1 << 20,
    )
    .unwrap();
    assert_eq!(&head, b"MBR");
    let allocated =
        std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(&raw_copy).unwrap()) * 512;
    assert!(
        allocated < 8 << 20,
        "the clone stays sparse: {allocated} bytes allocated"
    );

    c.pass().await;
    let waiting = claims.get("populated").await.unwrap();
    assert_eq!(waiting.status.unwrap().phase.as_deref(), Some("Pending"));
    assert!(waiting.spec.unwrap().volume_name.is_none());

    // Deleting a block claim removes its file.
    claims
        .delete("raw-copy", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("file removed", async || (!raw_copy.exists()).then_some(())).await;
}

/// The second CSI driver makes volumes of its own but fills none from another claim (as
/// drivers without clone support): such a claim is refused with an event.
#[tokio::test]
async fn the_shared_driver_makes_volumes_but_clones_nothing() {
    let c = cluster().await;
    create(
        Api::<StorageClass>::all(c.client.clone()),
        json!({"metadata": {"name": "shared"}, "provisioner": "shared.cdi-rs.dev"}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client.clone());
    create(claims.clone(), claim("files", "shared")).await;
    let pv = wait_for("files bound", async || bound_volume(&claims, "files").await).await;
    let v = Api::<PersistentVolume>::all(c.client.clone())
        .get(&pv)
        .await
        .unwrap();
    let csi = v.spec.unwrap().csi.unwrap();
    assert_eq!(csi.driver, "shared.cdi-rs.dev");
    let path = std::path::PathBuf::from(&csi.volume_attributes.unwrap()["path"]);
    assert!(path.is_dir() && path.to_string_lossy().contains("/shared/"));
    let mut clone = claim("files-copy", "shared");
    clone["spec"]["dataSource"] = json!({"kind": "PersistentVolumeClaim", "name": "files"});
    create(claims.clone(), clone).await;
    let events: Api<Event> = Api::default_namespaced(c.client.clone());
    let message = wait_for("the refusal", async || {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        provisioning_failures(&list, "files-copy").pop()?.message
    })
    .await;
    assert!(
        message.contains("does not clone") && message.contains("\"files-copy\""),
        "{message}"
    );
}

/// A valid 253-character claim name (DNS labels of at most 63), starting with `head`.
fn long_name(head: &str) -> String {
    let mut name = head.to_string();
    while name.len() < 253 {
        let label = name.rsplit('.').next().unwrap().len();
        name.push(if label == 60 { '.' } else { 'x' });
    }
    assert!(name.ends_with('x'), "{name}");
    name
}

fn path_of(v: &PersistentVolume) -> std::path::PathBuf {
    let spec = v.spec.as_ref().unwrap();
    match (&spec.host_path, &spec.csi) {
        (Some(h), _) => h.path.clone().into(),
        (None, Some(c)) => c.volume_attributes.as_ref().unwrap()["path"].clone().into(),
        _ => panic!("{v:?}"),
    }
}

#[tokio::test]
async fn claims_with_253_character_names_get_directories_that_go_with_them() {
    let c = cluster().await;
    let classes = Api::<StorageClass>::all(c.client.clone());
    for (name, provisioner) in [
        ("local-now", "rancher.io/local-path"),
        ("csi-now", "csi.cdi-rs.dev"),
    ] {
        create(
            classes.clone(),
            json!({"metadata": {"name": name}, "provisioner": provisioner,
                "volumeBindingMode": "Immediate", "reclaimPolicy": "Delete"}),
        )
        .await;
    }
    // Two local-path claims alike for their first 200 characters, and one of the CSI driver.
    let alike = long_name("a-disk");
    let names = [
        (alike.clone(), "local-now"),
        (format!("{}zzz", &alike[..250]), "local-now"),
        (long_name("csi-disk"), "csi-now"),
    ];
    assert_eq!(names[0].0[..200], names[1].0[..200]);
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client.clone());
    for (name, class) in &names {
        create(claims.clone(), claim(name, class)).await;
    }
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    let mut dirs = Vec::new();
    for (name, _) in &names {
        let pv = wait_for("a long claim bound", async || {
            bound_volume(&claims, name).await
        })
        .await;
        let pv = volumes.get(&pv).await.unwrap();
        let dir = path_of(&pv);
        assert!(dir.is_dir(), "{dir:?}");
        let below = dir.strip_prefix(c.root.path().join(node_of(&pv))).unwrap();
        assert!(
            below.components().all(|p| p.as_os_str().len() <= 255),
            "{below:?}"
        );
        dirs.push((name.clone(), pv.metadata.name.unwrap(), dir));
    }
    // The default pattern's readable start stays: the volume, namespace and claim's beginning.
    let local = dirs[0]
        .2
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert!(
        local.starts_with(&format!("{}_default_a-disk", dirs[0].1)),
        "{local}"
    );
    assert_ne!(dirs[0].2, dirs[1].2);

    for (name, pv, dir) in &dirs {
        claims.delete(name, &DeleteParams::default()).await.unwrap();
        wait_for("the volume deleted", async || {
            volumes.get_opt(pv).await.unwrap().is_none().then_some(())
        })
        .await;
        assert!(!dir.exists(), "{dir:?} left behind");
    }
}

fn provisioning_failures(events: &[Event], claim: &str) -> Vec<Event> {
    events
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(claim)
                && e.reason.as_deref() == Some("ProvisioningFailed")
        })
        .cloned()
        .collect()
}

#[tokio::test]
async fn a_failing_claim_is_told_once_and_retried_with_back_off() {
    let c = cluster().await;
    // nodePath's parent is a regular file on the node: no directory can be made there.
    let node = c.root.path().join("node-1");
    std::fs::create_dir_all(&node).unwrap();
    std::fs::write(node.join("blocked"), b"").unwrap();
    let classes = Api::<StorageClass>::all(c.client.clone());
    create(
        classes.clone(),
        json!({"metadata": {"name": "broken"}, "provisioner": "rancher.io/local-path",
            "volumeBindingMode": "WaitForFirstConsumer",
            "parameters": {"nodePath": "/blocked/volumes"}}),
    )
    .await;
    create(
        classes,
        json!({"metadata": {"name": "fine"}, "provisioner": "rancher.io/local-path",
            "volumeBindingMode": "Immediate"}),
    )
    .await;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client.clone());
    // On node-1, as the scheduler would have chosen: every attempt fails the same way.
    let mut stuck = claim("stuck", "broken");
    stuck["metadata"]["annotations"] = json!({"volume.kubernetes.io/selected-node": "node-1"});
    create(claims.clone(), stuck).await;
    let events: Api<Event> = Api::default_namespaced(c.client.clone());
    let list = async || events.list(&ListParams::default()).await.unwrap().items;
    let first = wait_for("a ProvisioningFailed event", async || {
        provisioning_failures(&list().await, "stuck").pop()
    })
    .await;
    let message = first.message.clone().unwrap();
    assert!(
        message.starts_with("failed to provision volume with StorageClass \"broken\": making ")
            && message.contains("Not a directory"),
        "{message}"
    );
    assert_eq!(first.type_.as_deref(), Some("Warning"));

    // Other claims are not held up meanwhile.
    create(claims.clone(), claim("other", "fine")).await;
    wait_for("the other claim bound", async || {
        bound_volume(&claims, "other").await
    })
    .await;

    // Each retry raises the one event's count; three attempts span the back-off (1 s, then
    // 2 s), where a retry every pass (30 ms) would have made them within a second.
    // Polled by hand: every poll also checks that the error has one event.
    let mut third = None;
    for _ in 0..300 {
        let mut told = provisioning_failures(&list().await, "stuck");
        assert_eq!(told.len(), 1, "one event for one error: {told:?}");
        third = told.pop().filter(|e| e.count >= Some(3));
        if third.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let third = third.expect("a third attempt within 15 s");
    assert_eq!(third.count, Some(3), "{third:?}");
    let (from, to) = (
        third.first_timestamp.unwrap().0,
        third.last_timestamp.unwrap().0,
    );
    assert!(
        to.duration_since(from).as_secs() >= 2,
        "attempts from {from} to {to}"
    );
    assert_eq!(third.message.as_deref(), Some(message.as_str()));
    assert_eq!(
        claims
            .get("stuck")
            .await
            .unwrap()
            .status
            .unwrap()
            .phase
            .as_deref(),
        Some("Pending")
    );
}

#[tokio::test]
async fn failure_events_are_one_per_distinct_error_and_count_repeats() {
    let (_server, client) = common::with_nodes().await;
    let involved = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "namespace": "default", "name": long_name("claim"), "uid": "u-1"});
    let warn = async |message: &str| {
        kubesim::agents::retry::warn(
            &client,
            "rancher.io/local-path",
            &involved,
            "ProvisioningFailed",
            message,
        )
        .await
        .unwrap()
    };
    warn("disk full").await;
    warn("disk full").await;
    warn("permission denied").await;
    let events: Api<Event> = Api::default_namespaced(client.clone());
    let mut told: Vec<(String, i32)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|e| {
            assert!(e.metadata.name.as_ref().unwrap().len() <= 253);
            (e.message.unwrap(), e.count.unwrap())
        })
        .collect();
    told.sort();
    assert_eq!(
        told,
        [("disk full".into(), 2), ("permission denied".into(), 1)]
    );
}

#[tokio::test]
async fn a_claim_made_again_under_its_name_waits_for_its_predecessors_directory_to_go() {
    let c = cluster().await;
    let classes = Api::<StorageClass>::all(c.client.clone());
    for (name, policy) in [("by-name", "Delete"), ("by-name-kept", "Retain")] {
        create(
            classes.clone(),
            json!({"metadata": {"name": name}, "provisioner": "rancher.io/local-path",
                "volumeBindingMode": "WaitForFirstConsumer", "reclaimPolicy": policy,
                "parameters": {"pathPattern": "{{ .PVC.Namespace }}/{{ .PVC.Name }}"}}),
        )
        .await;
    }
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(c.client.clone());
    let volumes: Api<PersistentVolume> = Api::all(c.client.clone());
    // On node-1, as the scheduler would have chosen for a pod there, each time.
    let on_node_1 = |class: &str| {
        let mut c = claim(class, class);
        c["metadata"]["annotations"] = json!({"volume.kubernetes.io/selected-node": "node-1"});
        c
    };
    for class in ["by-name", "by-name-kept"] {
        create(claims.clone(), on_node_1(class)).await;
    }
    let first = wait_for("the claim bound", async || {
        bound_volume(&claims, "by-name").await
    })
    .await;
    let kept = wait_for("the kept claim bound", async || {
        bound_volume(&claims, "by-name-kept").await
    })
    .await;
    let dir = path_of(&volumes.get(&first).await.unwrap());
    std::fs::write(dir.join("old"), b"the first claim's").unwrap();

    // Deleted and made again at once: both volumes would have the same directory.
    for class in ["by-name", "by-name-kept"] {
        claims
            .delete(class, &DeleteParams::default())
            .await
            .unwrap();
        wait_for("the claim gone", async || {
            claims.get_opt(class).await.unwrap().is_none().then_some(())
        })
        .await;
        create(claims.clone(), on_node_1(class)).await;
    }
    let second = wait_for("the new claim bound", async || {
        bound_volume(&claims, "by-name").await
    })
    .await;
    assert_ne!(first, second);
    assert!(
        volumes.get_opt(&first).await.unwrap().is_none(),
        "the old volume went first"
    );
    let again = path_of(&volumes.get(&second).await.unwrap());
    assert_eq!(again, dir);
    assert!(again.is_dir(), "the new volume's directory exists");
    assert!(!again.join("old").exists(), "and starts empty");

    // Under Retain the old directory stays the old volume's: the new claim is told why.
    let events: Api<Event> = Api::default_namespaced(c.client.clone());
    let told = wait_for("a ProvisioningFailed event", async || {
        provisioning_failures(
            &events.list(&ListParams::default()).await.unwrap().items,
            "by-name-kept",
        )
        .pop()
    })
    .await;
    let message = told.message.unwrap();
    assert!(
        message.contains(&format!("still the volume {kept}'s")),
        "{message}"
    );
}
