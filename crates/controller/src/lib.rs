//! cdi-controller: the controllers of cdi-rs, each a thin shell around decisions in `cdi-core`
//! (observe, decide, act). `cdi controller` runs them:
//!
//! - `config`: creates CDIConfig `config` and keeps its status (effective values).
//! - `storageprofile`: one StorageProfile per StorageClass.
//! - `datavolume`: renders each DataVolume's claim and computes the DataVolume's status.
//! - `import`: runs the importer pod for claims with an import source, honouring
//!   WaitForFirstConsumer, and writes the pod's state onto the claim.
//! - `populator`: PVC prime for claims populated from a VolumeImportSource, and the rebind.
//! - `upload`: runs the upload pod (with its Service and certificates) for upload-target claims
//!   and writes the pod's state onto the claim.
//! - `placement` (used by the worker-pod controllers): what a claim's worker pods inherit from
//!   the consumer its node was selected for.
//!
//! They share one [`Context`]: reflector stores of what they read (`cache`), the event
//! recorder (`events`), the metrics and one HTTP client for progress reads.
//!
//! Every reconciler is level-triggered and idempotent: killing the controller at any point and
//! starting it again converges.

pub mod cache;
pub mod certs;
pub mod clonepop;
pub mod clonesource;
pub mod clonetoken;
pub mod config;
pub mod dataimportcron;
pub mod datasource;
pub mod datavolume;
pub mod events;
pub mod import;
pub mod operator;
pub mod placement;
pub mod populator;
pub mod progress;
pub mod serve;
pub mod storageprofile;
pub mod upload;

use std::sync::Arc;
use std::time::Duration;

use kube::Client;

/// How the controller runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The importer pod's image (upstream's `IMPORTER_IMAGE`).
    pub importer_image: String,
    /// The upload pod's image (upstream's `UPLOADSERVER_IMAGE`).
    pub upload_server_image: String,
    /// The clone source pod's image (upstream's `CLONER_IMAGE`).
    pub cloner_image: String,
    pub pull_policy: String,
    /// `-v=N` for worker pods.
    pub verbosity: u32,
    /// Where the leader election Lease lives.
    pub namespace: String,
    /// This instance's identity in the election.
    pub identity: String,
    /// How often progress is read and unfinished work looked at again.
    pub resync: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            importer_image: "quay.io/kubevirt/cdi-importer:latest".into(),
            upload_server_image: "quay.io/kubevirt/cdi-uploadserver:latest".into(),
            cloner_image: "quay.io/kubevirt/cdi-cloner:latest".into(),
            pull_policy: "IfNotPresent".into(),
            verbosity: 1,
            namespace: "cdi".into(),
            identity: "cdi-controller".into(),
            resync: Duration::from_secs(2),
        }
    }
}

/// What the reconcilers share.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub options: Arc<Options>,
    pub metrics: Arc<serve::Metrics>,
    /// The one client progress is read with from worker pods (connections are reused).
    pub http: reqwest::Client,
    /// The cluster-wide objects reconciles read; filled while [`run_controllers`] runs (each
    /// run, a leadership term, starts from a fresh list).
    pub caches: cache::Caches,
    /// Events on the objects reconciled (kube-runtime's Recorder).
    pub events: Arc<events::Events>,
    /// The upload path's certificate authorities, read when needed and again once rotated.
    pub upload_pki: Arc<upload::PkiCache>,
    /// The keys of clone tokens, read once they are needed.
    pub clone_tokens: Arc<tokio::sync::OnceCell<clonetoken::CloneTokens>>,
}

impl Context {
    pub fn new(client: Client, options: Options, metrics: Arc<serve::Metrics>) -> Context {
        Context {
            events: Arc::new(events::Events::new(client.clone(), &options.identity)),
            client,
            options: Arc::new(options),
            metrics,
            http: progress::client(),
            caches: cache::new().0,
            upload_pki: Default::default(),
            clone_tokens: Default::default(),
        }
    }
}

/// Why a reconcile failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}", said(.0))]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
    /// A bug met something it did not expect: the pass is abandoned and retried, the other
    /// objects and controllers carry on.
    #[error("reconcile panicked: {0}")]
    Panicked(String),
}

/// A kube error in one line: the API server's refusal by its message, reason and code (kube's
/// own text repeats the message with a dump of the whole Status).
fn said(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}, {})", s.message, s.reason, s.code),
        other => other.to_string(),
    }
}

/// Run one reconcile pass of `controller` over `object` (namespace/name) in a tracing span,
/// turning a panic into [`Error::Panicked`], and count it (result and duration) in `metrics`. Without the guard a panic on one object (whatever a
/// user wrote into it) would take every controller down with it, and the restarted process
/// would meet the same object and crash again.
pub async fn guarded<T>(
    metrics: &serve::Metrics,
    controller: &'static str,
    object: &str,
    pass: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    use futures::FutureExt;
    use tracing::Instrument;
    let started = std::time::Instant::now();
    // Everything the pass logs carries the controller and the object.
    let span = tracing::info_span!("reconcile", controller, object);
    span.in_scope(|| tracing::trace!("pass starts"));
    let result = match std::panic::AssertUnwindSafe(pass)
        .catch_unwind()
        .instrument(span)
        .await
    {
        Ok(r) => r,
        Err(panic) => {
            let message = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            tracing::error!(controller, panic = %message, "reconcile panicked; retrying later");
            Err(Error::Panicked(message))
        }
    };
    let outcome = match &result {
        Ok(_) => "ok",
        Err(Error::Panicked(_)) => "panic",
        Err(_) => "error",
    };
    metrics.reconciled(controller, outcome, started.elapsed().as_secs_f64());
    tracing::debug!(controller, object, outcome, elapsed = ?started.elapsed(), "pass");
    result
}

/// `obj` as the API server holds it now, if it is still the same object (same uid) and not being
/// deleted. A reflector's cache can still hold an object that was just deleted, or an older
/// version of it; what a controller creates for it (with an owner reference to it) would be made
/// for nothing, or for a state already past, so creations ask first.
pub async fn live<K>(client: &Client, obj: &K) -> Result<Option<K>, kube::Error>
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let ns = obj.meta().namespace.as_deref().unwrap_or_default();
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), ns);
    let name = obj.meta().name.as_deref().unwrap_or_default();
    Ok(api.get_opt(name).await?.filter(|live| {
        live.meta().uid == obj.meta().uid && live.meta().deletion_timestamp.is_none()
    }))
}

/// Create `object`; already there is fine (a pass that failed half way is repeated).
pub async fn create<K>(api: &kube::Api<K>, object: &K) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&kube::api::PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Delete object `name`; already gone is fine.
pub async fn delete<K>(api: &kube::Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &kube::api::DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Add or remove `name` among the object's finalizers (conditional on the version read, so a
/// concurrent change is not lost).
pub(crate) async fn set_finalizer<K>(
    api: &kube::Api<K>,
    object: &K,
    name: &str,
    present: bool,
) -> Result<(), Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    use kube::ResourceExt;
    let mut list = object.finalizers().to_vec();
    if list.iter().any(|f| f == name) == present {
        return Ok(());
    }
    if present {
        list.push(name.to_string());
    } else {
        list.retain(|f| f != name);
    }
    let patch = serde_json::json!({"metadata": {"finalizers": list,
        "resourceVersion": object.meta().resource_version}});
    api.patch(
        &object.name_any(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// A kind of the snapshot API (`snapshot.storage.k8s.io/v1`), read as dynamic objects: the
/// controller does not depend on the snapshot CRDs being installed.
pub(crate) fn snapshot_api(kind: &str, plural: &str) -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "snapshot.storage.k8s.io".into(),
        version: "v1".into(),
        api_version: "snapshot.storage.k8s.io/v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// The VolumeSnapshot `namespace/name`, if it exists (and the snapshot API is served).
pub(crate) async fn get_snapshot(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<kube::api::DynamicObject>, Error> {
    let snapshots: kube::Api<kube::api::DynamicObject> = kube::Api::namespaced_with(
        ctx.client.clone(),
        namespace,
        &snapshot_api("VolumeSnapshot", "volumesnapshots"),
    );
    Ok(snapshots.get_opt(name).await?)
}

/// What `snapshot` says about itself: the CSI driver that took it and the volume mode of what
/// it was taken of (its bound VolumeSnapshotContent's, when known), its restore size (0 while
/// it has none).
pub(crate) async fn snapshot_source(
    ctx: &Context,
    snapshot: &kube::api::DynamicObject,
) -> Result<cdi_core::clone::SnapshotSource, Error> {
    let mut found = cdi_core::clone::SnapshotSource {
        driver: None,
        volume_mode: None,
        restore_size: cdi_core::clonepop::restore_size(&snapshot.data).unwrap_or(0),
    };
    let Some(content) = snapshot.data["status"]["boundVolumeSnapshotContentName"].as_str() else {
        return Ok(found);
    };
    let contents: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
        ctx.client.clone(),
        &snapshot_api("VolumeSnapshotContent", "volumesnapshotcontents"),
    );
    if let Some(c) = contents.get_opt(content).await? {
        let spec = &c.data["spec"];
        found.driver = spec["driver"].as_str().map(String::from);
        found.volume_mode = spec["sourceVolumeMode"]
            .as_str()
            .map(|m| cdi_core::size::resolve_volume_mode(Some(m)));
    }
    Ok(found)
}

/// Hand `volume` over to `target` (the PV's `claimRef` switched, no data copied): how every
/// populator gives its target the volume its temporary claim filled.
pub(crate) async fn hand_over(
    ctx: &Context,
    volume: &str,
    target: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
) -> Result<(), kube::Error> {
    use kube::ResourceExt;
    let claim_ref = serde_json::json!({"spec": {"claimRef": {"apiVersion": "v1",
        "kind": "PersistentVolumeClaim", "namespace": target.namespace(), "name": target.name_any(),
        "uid": target.metadata.uid, "resourceVersion": null}}});
    kube::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(ctx.client.clone())
        .patch(
            volume,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&claim_ref),
        )
        .await?;
    tracing::info!(target = %format!("{}/{}", target.namespace().unwrap_or_default(), target.name_any()),
        volume = %volume, "rebound the volume to the target");
    Ok(())
}

/// Write the annotations (and add the labels) that differ from the claim's.
pub async fn patch_claim(
    claims: &kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim,
    anns: &std::collections::BTreeMap<String, String>,
    labels: &std::collections::BTreeMap<String, String>,
) -> Result<(), kube::Error> {
    use kube::ResourceExt;
    let changed = cdi_core::import::annotation_patch(claim.annotations(), anns, false);
    let new_labels = cdi_core::import::annotation_patch(claim.labels(), labels, false);
    if changed.is_empty() && new_labels.is_empty() {
        return Ok(());
    }
    let patch = serde_json::json!({"metadata": {"annotations": changed, "labels": new_labels}});
    claims
        .patch(
            &claim.name_any(),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    Ok(())
}

/// A merge patch that turns `old` into `new` exactly: what `new` leaves out is set to null, so a
/// field the new status no longer has (a proxy removed from the spec, a deleted class's overhead,
/// something a user wrote) goes instead of staying for ever.
pub fn merge_patch(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            let mut patch = serde_json::Map::new();
            for (k, nv) in n {
                match o.get(k) {
                    Some(ov) if ov == nv => {}
                    Some(ov) => {
                        patch.insert(k.clone(), merge_patch(ov, nv));
                    }
                    None => {
                        patch.insert(k.clone(), nv.clone());
                    }
                }
            }
            for k in o.keys().filter(|k| !n.contains_key(*k)) {
                patch.insert(k.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => new.clone(),
    }
}

/// The merge patch replacing an object's whole `status` with `new`.
pub fn status_patch<S: serde::Serialize>(
    old: Option<&S>,
    new: &S,
) -> Result<serde_json::Value, Error> {
    let json = |v| serde_json::to_value(v).map_err(|e| Error::Other(e.to_string()));
    let old = match old {
        Some(o) => json(o)?,
        None => serde_json::Value::Null,
    };
    Ok(serde_json::json!({"status": merge_patch(&old, &json(new)?)}))
}

/// Run every controller until one of them stops (they do not, unless the client fails).
pub async fn run_controllers(ctx: Context) -> anyhow::Result<()> {
    config::ensure(&ctx).await?;
    let (caches, mut feeds) = cache::new();
    // A new term reads the certificate authorities again.
    let ctx = Context {
        caches,
        upload_pki: Default::default(),
        clone_tokens: Default::default(),
        ..ctx
    };
    let config_triggers = config::Triggers::subscribe(&mut feeds);
    let dv_triggers = datavolume::Triggers::subscribe(&mut feeds);
    let import_triggers = import::Triggers::subscribe(&mut feeds);
    let populator_triggers = populator::Triggers::subscribe(&mut feeds);
    let upload_triggers = upload::Triggers::subscribe(&mut feeds);
    let clone_source_triggers = clonesource::Triggers::subscribe(&mut feeds);
    let clone_populator_triggers = clonepop::Triggers::subscribe(&mut feeds);
    let datasource_triggers = datasource::Triggers::subscribe(&mut feeds);
    // Reconciles wait for the caches' first list themselves: the subscriptions must be read
    // from the start.
    tokio::select! {
        _ = feeds.run(ctx.client.clone()) => Err(anyhow::anyhow!("the caches stopped")),
        r = config::run(ctx.clone(), config_triggers) => r,
        r = storageprofile::run(ctx.clone()) => r,
        r = datavolume::run(ctx.clone(), dv_triggers) => r,
        r = import::run(ctx.clone(), import_triggers) => r,
        r = populator::run(ctx.clone(), populator_triggers) => r,
        r = upload::run(ctx.clone(), upload_triggers) => r,
        r = clonesource::run(ctx.clone(), clone_source_triggers) => r,
        r = clonepop::run(ctx.clone(), clone_populator_triggers) => r,
        r = datasource::run(ctx.clone(), datasource_triggers) => r,
        r = dataimportcron::run(ctx.clone()) => r,
    }
}

/// Run the controllers while this instance holds the leader Lease
/// (`cdi-controller-leader-election-helper`, as upstream names it), until `shutdown`.
pub async fn run_as_leader(
    ctx: Context,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let lease = Lease {
        client: ctx.client.clone(),
        namespace: ctx.options.namespace.clone(),
        name: "cdi-controller-leader-election-helper",
        identity: ctx.options.identity.clone(),
    };
    let metrics = ctx.metrics.clone();
    lead(
        lease,
        |leading| metrics.set_leader(leading),
        || run_controllers(ctx.clone()),
        shutdown,
    )
    .await
}

/// A leader election Lease.
pub struct Lease {
    pub client: Client,
    pub namespace: String,
    pub name: &'static str,
    pub identity: String,
}

/// Run `work` while this instance holds `lease` (stopping it when the lease is lost, starting
/// it again when held again), until `work` ends or `shutdown` comes; then the lease is given up,
/// so a successor (the next pod of a rolling update) leads at once instead of waiting for it to
/// expire.
pub async fn lead<W, F>(
    lease: Lease,
    leader: impl Fn(bool),
    work: W,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()>
where
    W: Fn() -> F,
    F: std::future::Future<Output = anyhow::Result<()>>,
{
    use kube_lease_manager::LeaseManagerBuilder;
    let manager = LeaseManagerBuilder::new(lease.client, lease.name)
        .with_namespace(&lease.namespace)
        .with_identity(&lease.identity)
        .with_duration(15)
        .with_grace(5)
        .build()
        .await?;
    let (mut leading, task) = manager.watch().await;
    let led = async {
        loop {
            while !*leading.borrow_and_update() {
                leader(false);
                leading.changed().await?;
            }
            tracing::info!(identity = %lease.identity, lease = lease.name, "leading");
            leader(true);
            tokio::select! {
                r = work() => return r,
                _ = async {
                    while *leading.borrow_and_update() {
                        if leading.changed().await.is_err() {
                            break;
                        }
                    }
                } => {
                    tracing::warn!(lease = lease.name, "lost the lease; stopping");
                }
            }
        }
    };
    let outcome = tokio::select! {
        r = led => r,
        _ = shutdown => Ok(()),
    };
    // Closing the channel makes the manager release the lease.
    drop(leading);
    match tokio::time::timeout(std::time::Duration::from_secs(5), task).await {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, lease = lease.name, "giving up the lease"),
        Ok(_) => {}
        Err(_) => tracing::warn!(lease = lease.name, "giving up the lease took too long"),
    }
    outcome
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn api_errors_are_said_once_without_the_status_dump() {
        let status = kube::core::Status::failure(
            "Operation cannot be fulfilled on persistentvolumeclaims \"d\": the object has been modified",
            "Conflict",
        )
        .with_code(409);
        let e = super::Error::from(kube::Error::Api(Box::new(status)));
        assert_eq!(
            e.to_string(),
            "Operation cannot be fulfilled on persistentvolumeclaims \"d\": the object has been modified (Conflict, 409)"
        );
    }

    #[test]
    fn merge_patches_remove_what_the_new_value_leaves_out() {
        let old = json!({"importProxy": {"HTTPProxy": "http://x"}, "overhead": {"a": "0.1", "b": "0.2"},
            "list": [1, 2], "same": 1});
        let new = json!({"overhead": {"a": "0.1"}, "list": [1], "same": 1, "added": true});
        let patch = super::merge_patch(&old, &new);
        assert_eq!(
            patch,
            json!({"importProxy": null, "overhead": {"b": null}, "list": [1], "added": true})
        );
        // Applying it (RFC 7386) gives `new`.
        let mut applied = old.clone();
        merge(&mut applied, &patch);
        assert_eq!(applied, new);
    }

    fn merge(target: &mut serde_json::Value, patch: &serde_json::Value) {
        match patch {
            serde_json::Value::Object(p) => {
                if !target.is_object() {
                    *target = json!({});
                }
                let t = target.as_object_mut().unwrap();
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(k);
                    } else {
                        merge(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                    }
                }
            }
            _ => *target = patch.clone(),
        }
    }
}
