//! The controllers' reconciles in process: the kube client talks to the embedded API server's
//! router directly (no sockets, no subprocesses, no node agents), and each test runs single
//! passes and looks at what they left. What the passes decide is table-tested in cdi-core; this
//! proves the executors carry the decisions out against a real API server.

use std::sync::Arc;
use std::time::Duration;

use cdi_api::config::CDIConfig;
use cdi_api::datavolume::DataVolume;
use cdi_api::populators::VolumeImportSource;
use cdi_api::storageprofile::StorageProfile;
use cdi_api::{ann, name};
use cdi_controller::cache::{self, Caches};
use cdi_controller::{Context, Options, datavolume, import, populator, serve};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use kubesim::apiserver::ApiServer;
use serde_json::{Value, json};

const NS: &str = "vms";

struct Cluster {
    client: Client,
    ctx: Arc<Context>,
}

async fn cluster() -> Cluster {
    let server = ApiServer::new();
    let client = Client::new(server.router(), "default");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in cdi_api::crd::crds() {
        crds.patch(
            &crd.name_any(),
            &PatchParams::apply("test").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
    }
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let mut ctx = Context::new(
        client.clone(),
        Options::default(),
        Arc::new(serve::Metrics::default()),
    );
    let (caches, feeds) = cache::new();
    ctx.caches = caches;
    // No subscriptions taken: nothing has to read them.
    tokio::spawn(feeds.run(client.clone()));
    Cluster {
        client,
        ctx: Arc::new(ctx),
    }
}

impl Cluster {
    /// Create `object` through `api` (namespaced or not, as its kind is).
    async fn create<K>(&self, api: Api<K>, object: Value) -> K
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + serde::Serialize
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        let object: K = serde_json::from_value(object).unwrap();
        api.create(&PostParams::default(), &object).await.unwrap()
    }

    fn ns<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    fn all<K: kube::Resource<DynamicType = ()>>(&self) -> Api<K> {
        Api::all(self.client.clone())
    }

    /// A local-path class binding `binding`, its StorageProfile (by the profile controller's
    /// own pass) and CDIConfig (by the config controller's), in the caches before returning.
    async fn storage(&self, binding: &str, csi: bool) {
        self.create::<StorageClass>(
            self.all(),
            json!({"metadata": {"name": "local"},
            "provisioner": "kubevirt.io.hostpath-provisioner", "volumeBindingMode": binding}),
        )
        .await;
        if csi {
            self.create::<CSIDriver>(
                self.all(),
                json!({"metadata": {"name": "kubevirt.io.hostpath-provisioner"},
                "spec": {}}),
            )
            .await;
        }
        cdi_controller::storageprofile::reconcile(&self.ctx)
            .await
            .unwrap();
        cdi_controller::config::reconcile(&self.ctx).await.unwrap();
        self.cached(|c| {
            c.profiles().iter().any(|p| p.status.is_some())
                && c.config().is_some_and(|c| c.status.is_some())
                && c.csi_drivers().len() == usize::from(csi)
        })
        .await;
    }

    /// Wait until the stores the passes read hold what the API server holds: the claims, pods
    /// and claim events of the namespace, each at its current version.
    async fn synced(&self) {
        fn versions<K: ResourceExt, D: std::ops::Deref<Target = K>>(
            objects: impl IntoIterator<Item = D>,
        ) -> Vec<(String, String)> {
            let mut v: Vec<(String, String)> = objects
                .into_iter()
                .filter(|o| o.namespace().as_deref() == Some(NS))
                .map(|o| (o.name_any(), o.resource_version().unwrap_or_default()))
                .collect();
            v.sort();
            v
        }
        let lp = ListParams::default();
        for _ in 0..1000 {
            let claims = self.ns::<PersistentVolumeClaim>().list(&lp).await.unwrap();
            let pods = self.ns::<Pod>().list(&lp).await.unwrap();
            let events = self
                .ns::<Event>()
                .list(&ListParams::default().fields("involvedObject.kind=PersistentVolumeClaim"))
                .await
                .unwrap();
            let caches = &self.ctx.caches;
            if versions(claims.items.iter()) == versions(caches.claims.state())
                && versions(pods.items.iter()) == versions(caches.pods.state())
                && versions(events.items.iter()) == versions(caches.events.state())
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the caches never caught up with the API server");
    }

    /// Wait until the caches show what was just written (the watch delivers it).
    async fn cached(&self, ready: impl Fn(&Caches) -> bool) {
        for _ in 0..1000 {
            if ready(&self.ctx.caches) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the caches never caught up");
    }

    async fn dv(&self, annotations: Value, source: Value) -> DataVolume {
        self.create(
            self.ns(),
            json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": NS, "annotations": annotations},
            "spec": {"source": source, "storage": {"storageClassName": "local",
                "resources": {"requests": {"storage": "1Gi"}}}}}),
        )
        .await
    }

    async fn get<K>(&self, name: &str) -> Option<K>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + std::fmt::Debug,
    {
        Api::<K>::namespaced(self.client.clone(), NS)
            .get_opt(name)
            .await
            .unwrap()
    }

    /// One DataVolume pass over the DataVolume as the API server holds it now.
    async fn pass(&self) -> DataVolume {
        let dv: DataVolume = self.get("disk").await.unwrap();
        self.synced().await;
        datavolume::reconcile(Arc::new(dv), self.ctx.clone())
            .await
            .unwrap();
        self.get("disk").await.unwrap()
    }

    /// The reasons of the events on the `kind` named `object`, as `kubectl describe` lists them.
    async fn reasons(&self, kind: &str, object: &str) -> Vec<String> {
        let events: Api<Event> = Api::namespaced(self.client.clone(), NS);
        let selector = format!("involvedObject.name={object}");
        let mut reasons: Vec<String> = events
            .list(&ListParams::default().fields(&selector))
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.involved_object.kind.as_deref() == Some(kind))
            .filter_map(|e| e.reason)
            .collect();
        reasons.sort();
        reasons
    }
}

fn http() -> Value {
    json!({"http": {"url": "http://images.local/disk.qcow2"}})
}

fn phase(dv: &DataVolume) -> String {
    dv.status
        .as_ref()
        .and_then(|s| s.phase.as_ref())
        .map(|p| p.as_str().to_string())
        .unwrap_or_default()
}

fn annotation(obj: &impl ResourceExt, key: &str) -> Option<String> {
    obj.annotations().get(key).cloned()
}

#[tokio::test]
async fn a_datavolume_gets_its_claim_then_an_importer() {
    let c = cluster().await;
    c.storage("Immediate", false).await;
    c.dv(json!({}), http()).await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "Pending");
    assert_eq!(
        annotation(&dv, ann::USE_POPULATOR).as_deref(),
        Some("false")
    );
    let claim: PersistentVolumeClaim = c.get("disk").await.expect("the claim");
    assert!(
        claim
            .owner_references()
            .iter()
            .any(|o| Some(&o.uid) == dv.metadata.uid.as_ref())
    );
    assert_eq!(
        annotation(&claim, ann::IMPORT_ENDPOINT).as_deref(),
        Some("http://images.local/disk.qcow2")
    );
    // The import controller's pass makes the importer (the class binds at once).
    c.synced().await;
    import::reconcile(Arc::new(claim.clone()), c.ctx.clone())
        .await
        .unwrap();
    let pod_name = cdi_core::import::pod_name(&claim);
    let pod: Pod = c.get(&pod_name).await.expect("the importer pod");
    assert_eq!(
        pod.owner_references()[0].uid,
        claim.metadata.uid.clone().unwrap()
    );
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    assert_eq!(
        annotation(&claim, ann::IMPORT_POD_NAME).as_deref(),
        Some(pod_name.as_str())
    );
}

#[tokio::test]
async fn with_a_csi_driver_the_populator_path_is_taken() {
    let c = cluster().await;
    c.storage("Immediate", true).await;
    let dv = c.dv(json!({}), http()).await;
    let dv_after = c.pass().await;
    assert_eq!(
        annotation(&dv_after, ann::USE_POPULATOR).as_deref(),
        Some("true")
    );
    let source_name = cdi_core::datavolume::import_source_name(&dv);
    let source: VolumeImportSource = c.get(&source_name).await.expect("the import source");
    assert_eq!(
        source.spec.source.and_then(|s| s.http).map(|h| h.url),
        Some("http://images.local/disk.qcow2".into())
    );
    let target: PersistentVolumeClaim = c.get("disk").await.unwrap();
    assert_eq!(
        cdi_core::populator::import_source_name(&target),
        Some(source_name.as_str())
    );
    // The populator's pass makes PVC prime for it, and says so on the target.
    c.synced().await;
    populator::reconcile(Arc::new(target.clone()), c.ctx.clone())
        .await
        .unwrap();
    let prime: PersistentVolumeClaim = c
        .get(&cdi_core::populator::prime_name(&target))
        .await
        .expect("PVC prime");
    assert!(cdi_core::import::is_import_claim(&prime));
    assert_eq!(
        c.reasons("PersistentVolumeClaim", "disk").await,
        ["CreatedPVCPrimeSuccessfully"]
    );
}

#[tokio::test]
async fn a_claim_that_is_not_its_own_is_refused_then_adopted() {
    let c = cluster().await;
    c.storage("Immediate", false).await;
    c.create::<PersistentVolumeClaim>(
        c.ns(),
        json!({"metadata": {"name": "disk", "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local",
            "resources": {"requests": {"storage": "1Gi"}}}}),
    )
    .await;
    c.dv(json!({}), http()).await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "Pending");
    assert!(
        c.reasons("DataVolume", "disk")
            .await
            .contains(&"ErrResourceExists".into())
    );
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    assert!(claim.owner_references().is_empty());

    let api: Api<DataVolume> = Api::namespaced(c.client.clone(), NS);
    let allow = json!({"metadata": {"annotations": {(ann::ALLOW_CLAIM_ADOPTION): "true"}}});
    api.patch("disk", &PatchParams::default(), &Patch::Merge(&allow))
        .await
        .unwrap();
    let dv = c.pass().await;
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    assert_eq!(
        claim.owner_references()[0].uid,
        dv.metadata.uid.clone().unwrap()
    );
    assert_eq!(
        annotation(&claim, ann::POPULATED_FOR).as_deref(),
        Some("disk")
    );
    assert_eq!(phase(&dv), "Succeeded");
}

#[tokio::test]
async fn a_malformed_source_fails_and_makes_nothing() {
    let c = cluster().await;
    c.storage("Immediate", false).await;
    c.dv(json!({}), json!({})).await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "Failed");
    assert!(c.get::<PersistentVolumeClaim>("disk").await.is_none());
    assert_eq!(c.reasons("DataVolume", "disk").await, ["ErrInvalidSource"]);
    // The next pass says nothing new.
    c.pass().await;
    assert_eq!(c.reasons("DataVolume", "disk").await, ["ErrInvalidSource"]);
}

#[tokio::test]
async fn without_a_consumer_no_importer_is_made() {
    let c = cluster().await;
    c.storage("WaitForFirstConsumer", false).await;
    let api: Api<CDIConfig> = Api::all(c.client.clone());
    let gate = json!({"spec": {"featureGates": ["HonorWaitForFirstConsumer"]}});
    api.patch(
        name::CDI_CONFIG,
        &PatchParams::default(),
        &Patch::Merge(&gate),
    )
    .await
    .unwrap();
    c.cached(|caches| {
        caches
            .config()
            .is_some_and(|c| c.spec.feature_gates.is_some())
    })
    .await;
    c.dv(json!({}), http()).await;
    c.pass().await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "WaitForFirstConsumer");
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    c.synced().await;
    import::reconcile(Arc::new(claim.clone()), c.ctx.clone())
        .await
        .unwrap();
    // The pass is over and made nothing: no pod, no pod named on the claim.
    let pod_name = cdi_core::import::pod_name(&claim);
    assert!(c.get::<Pod>(&pod_name).await.is_none());
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    assert!(annotation(&claim, ann::IMPORT_POD_NAME).is_none());
}

#[tokio::test]
async fn a_profile_fixed_later_lets_the_claim_be_rendered() {
    let c = cluster().await;
    // A class without its profile yet: the claim cannot be rendered, and the DataVolume says so.
    c.create::<StorageClass>(
        c.all(),
        json!({"metadata": {"name": "local"},
        "provisioner": "kubevirt.io.hostpath-provisioner", "volumeBindingMode": "Immediate"}),
    )
    .await;
    c.cached(|caches| caches.classes().len() == 1).await;
    c.dv(json!({}), http()).await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "Pending");
    assert!(c.get::<PersistentVolumeClaim>("disk").await.is_none());
    assert!(
        c.reasons("DataVolume", "disk")
            .await
            .contains(&"ErrClaimNotValid".into())
    );
    cdi_controller::storageprofile::reconcile(&c.ctx)
        .await
        .unwrap();
    c.cached(|caches| caches.profiles().iter().any(|p| p.status.is_some()))
        .await;
    c.pass().await;
    assert!(c.get::<PersistentVolumeClaim>("disk").await.is_some());
    let profiles: Api<StorageProfile> = Api::all(c.client.clone());
    assert!(profiles.get_opt("local").await.unwrap().is_some());
}

async fn set_status<K>(api: &Api<K>, name: &str, status: Value)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": status})),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn external_population_waits_for_binding() {
    let c = cluster().await;
    c.storage("Immediate", true).await;
    c.create::<DataVolume>(
        c.ns(),
        json!({"apiVersion": "cdi.kubevirt.io/v1beta1",
        "kind": "DataVolume", "metadata": {"name": "disk", "namespace": NS},
        "spec": {"storage": {"storageClassName": "local",
            "resources": {"requests": {"storage": "1Gi"}},
            "dataSourceRef": {"apiGroup": "example.com", "kind": "Blob", "name": "b"}}}}),
    )
    .await;
    c.pass().await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "PendingPopulation");
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    let kind = claim
        .spec
        .as_ref()
        .and_then(|s| s.data_source_ref.as_ref())
        .map(|r| r.kind.clone());
    assert_eq!(
        kind.as_deref(),
        Some("Blob"),
        "the claim names the populator"
    );
    // The populator filled it and the claim bound: done.
    set_status(
        &c.ns::<PersistentVolumeClaim>(),
        "disk",
        json!({"phase": "Bound"}),
    )
    .await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "Succeeded");
    assert!(
        c.reasons("DataVolume", "disk")
            .await
            .contains(&"ExternalPopulationSucceeded".into())
    );
}

#[tokio::test]
async fn the_importers_end_reaches_the_claim_and_the_datavolume() {
    let c = cluster().await;
    c.storage("Immediate", false).await;
    c.dv(json!({}), http()).await;
    c.pass().await;
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    c.synced().await;
    import::reconcile(Arc::new(claim), c.ctx.clone())
        .await
        .unwrap();
    let claims = c.ns::<PersistentVolumeClaim>();
    set_status(&claims, "disk", json!({"phase": "Bound"})).await;
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    let pod_name = cdi_core::import::pod_name(&claim);
    set_status(
        &c.ns::<Pod>(),
        &pod_name,
        json!({"phase": "Succeeded",
        "containerStatuses": [{"name": "importer", "image": "x", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": 0,
            "message": "{\"message\": \"Import Complete\"}"}}}]}),
    )
    .await;
    c.synced().await;
    import::reconcile(Arc::new(claim), c.ctx.clone())
        .await
        .unwrap();
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    assert_eq!(
        annotation(&claim, ann::POD_PHASE).as_deref(),
        Some("Succeeded")
    );
    assert!(c.get::<Pod>(&pod_name).await.is_none(), "the pod goes");
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "Succeeded");
    assert_eq!(
        dv.status.and_then(|s| s.progress).as_deref(),
        Some("100.0%")
    );
}

#[tokio::test]
async fn a_pod_that_is_not_the_claims_importer_is_left_alone() {
    let c = cluster().await;
    c.storage("Immediate", false).await;
    c.dv(json!({}), http()).await;
    c.pass().await;
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    let pod_name = cdi_core::import::pod_name(&claim);
    c.create::<Pod>(
        c.ns(),
        json!({"metadata": {"name": pod_name, "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    c.synced().await;
    import::reconcile(Arc::new(claim), c.ctx.clone())
        .await
        .unwrap();
    assert!(
        c.reasons("PersistentVolumeClaim", "disk")
            .await
            .contains(&"ImportTargetInUse".into())
    );
    // Neither read nor deleted.
    let pod: Pod = c.get(&pod_name).await.expect("the pod stays");
    assert!(pod.owner_references().is_empty());
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    assert!(annotation(&claim, ann::POD_PHASE).is_none());
}

impl Cluster {
    /// Turn HonorWaitForFirstConsumer on (and CDIConfig's annotations to `annotations`), in the
    /// cache before returning.
    async fn honor_wffc(&self, annotations: Value) {
        let api: Api<CDIConfig> = Api::all(self.client.clone());
        let patch = json!({"metadata": {"annotations": annotations},
            "spec": {"featureGates": ["HonorWaitForFirstConsumer"]}});
        api.patch(
            name::CDI_CONFIG,
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
        let wanted = annotations.as_object().map_or(0, |a| a.len());
        self.cached(|caches| {
            caches
                .config()
                .is_some_and(|c| c.spec.feature_gates.is_some() && c.annotations().len() >= wanted)
        })
        .await;
    }

    /// The seed's nodes as far as placement goes: node-2 tainted `virt-local=true:NoSchedule`,
    /// node-3 tainted `gpu=a100:NoSchedule`.
    async fn tainted_nodes(&self) {
        for (name, key, value) in [("node-2", "virt-local", "true"), ("node-3", "gpu", "a100")] {
            self.create::<k8s_openapi::api::core::v1::Node>(
                self.all(),
                json!({"metadata": {"name": name}, "spec": {"taints": [
                    {"key": key, "value": value, "effect": "NoSchedule"}]}}),
            )
            .await;
        }
    }

    /// A consumer of claim `claim` as KubeVirt's temporary pod is made: tolerating node-2's
    /// taint, and node-3's, which is not where it goes.
    async fn consumer(&self, claim: &str) {
        self.create::<Pod>(
            self.ns(),
            json!({"metadata": {"name": "virt-launcher-vm-tmp", "namespace": NS,
                "annotations": {"kubevirt.io/ephemeral-provisioning": "true"}},
            "spec": {"containers": [{"name": "compute", "image": "virt-launcher"}],
                "tolerations": [
                    {"key": "virt-local", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
                    {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": claim}}]}}),
        )
        .await;
    }

    /// What the scheduler does for the consumer: the claim's node is chosen.
    async fn select_node(&self, claim: &str, node: &str) {
        let patch = json!({"metadata": {"annotations": {(ann::SELECTED_NODE): node}}});
        self.ns::<PersistentVolumeClaim>()
            .patch(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }

    async fn import_pass(&self, claim: &str) {
        let claim: PersistentVolumeClaim = self.get(claim).await.unwrap();
        self.synced().await;
        import::reconcile(Arc::new(claim), self.ctx.clone())
            .await
            .unwrap();
    }
}

fn toleration_keys(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|t| t.key)
        .collect()
}

#[tokio::test]
async fn the_importer_inherits_the_consumers_toleration_for_the_selected_node_only() {
    let c = cluster().await;
    c.storage("WaitForFirstConsumer", false).await;
    c.honor_wffc(json!({})).await;
    c.tainted_nodes().await;
    c.dv(json!({}), http()).await;
    c.pass().await;
    c.consumer("disk").await;
    c.select_node("disk", "node-2").await;
    // The pass that sees the node chosen records what worker pods inherit, and says so.
    c.import_pass("disk").await;
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    let record = cdi_core::placement::recorded(&claim)
        .unwrap()
        .expect("a record");
    assert_eq!(record.consumer.as_deref(), Some("virt-launcher-vm-tmp"));
    assert_eq!(record.node, "node-2");
    let keys: Vec<_> = record
        .tolerations
        .iter()
        .filter_map(|t| t.key.clone())
        .collect();
    assert_eq!(
        keys,
        ["virt-local"],
        "node-3's toleration is not node-2's business"
    );
    assert!(
        c.reasons("PersistentVolumeClaim", "disk")
            .await
            .contains(&cdi_controller::placement::INHERITED.to_string())
    );
    // KubeVirt deletes its temporary pod once the claim is bound; the importer still inherits.
    c.ns::<Pod>()
        .delete("virt-launcher-vm-tmp", &Default::default())
        .await
        .unwrap();
    c.import_pass("disk").await;
    set_status(
        &c.ns::<PersistentVolumeClaim>(),
        "disk",
        json!({"phase": "Bound"}),
    )
    .await;
    c.import_pass("disk").await;
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    let importer: Pod = c
        .get(&cdi_core::import::pod_name(&claim))
        .await
        .expect("the importer pod");
    assert_eq!(toleration_keys(&importer), ["virt-local"]);
    // Decided once: the pass after the consumer went did not record again.
    assert_eq!(cdi_core::placement::recorded(&claim).unwrap(), Some(record));
}

#[tokio::test]
async fn worker_placement_cdi_keeps_upstreams_placement() {
    for (dv_annotations, config_annotations) in [
        (json!({"cdi-rs.dev/worker-placement": "cdi"}), json!({})),
        (json!({}), json!({"cdi-rs.dev/worker-placement": "cdi"})),
    ] {
        let c = cluster().await;
        c.storage("WaitForFirstConsumer", false).await;
        c.honor_wffc(config_annotations).await;
        c.tainted_nodes().await;
        c.dv(dv_annotations, http()).await;
        c.pass().await;
        c.consumer("disk").await;
        c.select_node("disk", "node-2").await;
        c.import_pass("disk").await;
        set_status(
            &c.ns::<PersistentVolumeClaim>(),
            "disk",
            json!({"phase": "Bound"}),
        )
        .await;
        c.import_pass("disk").await;
        let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
        assert_eq!(cdi_core::placement::recorded(&claim), Ok(None));
        let importer: Pod = c
            .get(&cdi_core::import::pod_name(&claim))
            .await
            .expect("the importer pod");
        assert!(toleration_keys(&importer).is_empty());
    }
}

#[tokio::test]
async fn a_record_written_by_someone_else_is_refused_and_inherits_nothing() {
    let c = cluster().await;
    c.storage("Immediate", false).await;
    c.dv(json!({}), http()).await;
    c.pass().await;
    let patch =
        json!({"metadata": {"annotations": {"cdi-rs.dev/worker-tolerations": "[{\"key\":"}}});
    c.ns::<PersistentVolumeClaim>()
        .patch("disk", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    c.import_pass("disk").await;
    let claim: PersistentVolumeClaim = c.get("disk").await.unwrap();
    let importer: Pod = c
        .get(&cdi_core::import::pod_name(&claim))
        .await
        .expect("the importer pod");
    assert!(toleration_keys(&importer).is_empty());
    assert!(
        c.reasons("PersistentVolumeClaim", "disk")
            .await
            .contains(&cdi_controller::placement::ERR_RECORD.to_string())
    );
}

#[tokio::test]
async fn pvc_primes_importer_inherits_what_its_targets_consumer_tolerated() {
    let c = cluster().await;
    c.storage("WaitForFirstConsumer", true).await;
    c.honor_wffc(json!({})).await;
    c.tainted_nodes().await;
    c.dv(json!({}), http()).await;
    c.pass().await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "PendingPopulation");
    c.consumer("disk").await;
    c.select_node("disk", "node-2").await;
    let populate = || async {
        let target: PersistentVolumeClaim = c.get("disk").await.unwrap();
        c.synced().await;
        populator::reconcile(Arc::new(target), c.ctx.clone())
            .await
            .unwrap();
    };
    populate().await;
    c.ns::<Pod>()
        .delete("virt-launcher-vm-tmp", &Default::default())
        .await
        .unwrap();
    populate().await;
    let target: PersistentVolumeClaim = c.get("disk").await.unwrap();
    let prime_name = cdi_core::populator::prime_name(&target);
    let prime: PersistentVolumeClaim = c.get(&prime_name).await.expect("PVC prime");
    assert_eq!(
        annotation(&prime, "cdi-rs.dev/worker-tolerations"),
        annotation(&target, "cdi-rs.dev/worker-tolerations"),
    );
    c.import_pass(&prime_name).await;
    let importer: Pod = c
        .get(&cdi_core::import::pod_name(&prime))
        .await
        .expect("PVC prime's importer");
    assert_eq!(toleration_keys(&importer), ["virt-local"]);
    let prime: PersistentVolumeClaim = c.get(&prime_name).await.unwrap();
    assert_eq!(
        annotation(&prime, "cdi-rs.dev/worker-tolerations"),
        annotation(&target, "cdi-rs.dev/worker-tolerations"),
        "prime's copy is not recorded again"
    );
}

#[tokio::test]
async fn a_first_consumer_template_makes_the_temporary_pod_and_it_goes_when_done() {
    let c = cluster().await;
    c.storage("WaitForFirstConsumer", false).await;
    c.honor_wffc(json!({})).await;
    c.tainted_nodes().await;
    let template = "nodeSelector: {kubernetes.io/hostname: node-3}\n\
                    tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]";
    c.dv(json!({"cdi-rs.dev/first-consumer": template}), http())
        .await;
    c.pass().await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "WaitForFirstConsumer");
    let pod: Pod = c
        .get("disk-first-consumer")
        .await
        .expect("the temporary pod");
    let spec = pod.spec.as_ref().unwrap();
    assert_eq!(
        spec.node_selector.as_ref().unwrap()["kubernetes.io/hostname"],
        "node-3"
    );
    assert_eq!(toleration_keys(&pod), ["gpu"]);
    // The scheduler chose node-3 for it; the importer inherits its toleration for node-3.
    c.select_node("disk", "node-3").await;
    c.import_pass("disk").await;
    set_status(
        &c.ns::<PersistentVolumeClaim>(),
        "disk",
        json!({"phase": "Bound"}),
    )
    .await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "PVCBound");
    assert!(
        c.get::<Pod>("disk-first-consumer").await.is_none(),
        "bound and recorded: the temporary pod goes"
    );
    c.import_pass("disk").await;
    let importer: Pod = c.get("importer-disk").await.expect("the importer");
    assert_eq!(toleration_keys(&importer), ["gpu"]);
}

#[tokio::test]
async fn an_invalid_first_consumer_template_is_said_and_makes_no_pod() {
    let c = cluster().await;
    c.storage("WaitForFirstConsumer", false).await;
    c.honor_wffc(json!({})).await;
    c.dv(
        json!({"cdi-rs.dev/first-consumer": "containers: [{name: x, image: busybox}]"}),
        http(),
    )
    .await;
    c.pass().await;
    let dv = c.pass().await;
    assert_eq!(phase(&dv), "WaitForFirstConsumer");
    assert!(c.get::<Pod>("disk-first-consumer").await.is_none());
    assert!(
        c.reasons("DataVolume", "disk")
            .await
            .contains(&"ErrFirstConsumerTemplate".to_string())
    );
}
