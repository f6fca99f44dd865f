//! The DataImportCron controller (cdi-core `dataimportcron`): polls a cron's registry image for
//! its digest when its schedule says so (the Secret's credentials, the certConfigMap's CAs,
//! CDIConfig's insecure registries, through cdi-registry as the importer reaches it), then
//! writes what the decision says: the cron's annotations and status, the import DataVolume, the
//! managed DataSource, the imports garbage-collected, the outdated metric. Upstream's
//! DataImportCron CRD has no status subresource: the status is patched on the object.

use crate::runtime::run::RunAs;
use std::collections::BTreeMap;
use std::sync::Arc;

use cdi_api::datasource::{DataImportCron, DataSource};
use cdi_api::datavolume::DataVolume;
use cdi_api::enums::DataImportCronSourceFormat;
use cdi_api::keys::label;
use cdi_core::dataimportcron::{self as dic, DataSourceChange, Observed, Poll};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Secret};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// Read the digest of the image the cron's template names.
async fn poll(ctx: &Context, cron: &DataImportCron) -> Poll {
    let ns = cron.namespace().unwrap_or_default();
    // A claim's "digest" is its uid: a new claim under the name is a new image (upstream's).
    if let Some((at, name)) = dic::claim_source(cron) {
        return match Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &at)
            .get_opt(&name)
            .await
        {
            Ok(Some(claim)) => match claim.metadata.uid.filter(|u| !u.is_empty()) {
                Some(uid) => Poll::Digest(format!("{}{uid}", dic::UID_PREFIX)),
                None => Poll::Failed(format!("PersistentVolumeClaim {at}/{name} has no uid")),
            },
            Ok(None) => Poll::Failed(format!(
                "PersistentVolumeClaim {at}/{name} not found; spec.template.spec.source.pvc names \
                 the claim to import"
            )),
            Err(e) => Poll::Failed(format!("reading PersistentVolumeClaim {at}/{name}: {e}")),
        };
    }
    let registry = cron
        .spec
        .template
        .spec
        .source
        .as_ref()
        .and_then(|s| s.registry.as_ref());
    let Some(url) = registry
        .and_then(|r| r.url.as_deref())
        .filter(|u| !u.is_empty())
    else {
        return Poll::Failed(
            "this version of cdi-rs polls registry images named by spec.template.spec.source.registry.url, and claims named by spec.template.spec.source.pvc"
                .into(),
        );
    };
    let registry = registry.cloned().unwrap_or_default();
    let mut credentials = None;
    if let Some(name) = registry.secret_ref.as_deref().filter(|n| !n.is_empty()) {
        let secret = match Api::<Secret>::namespaced(ctx.client.clone(), &ns)
            .get_opt(name)
            .await
        {
            Ok(Some(s)) => s,
            Ok(None) => return Poll::Failed(format!("Secret {ns}/{name} not found")),
            Err(e) => return Poll::Failed(format!("reading Secret {ns}/{name}: {e}")),
        };
        let data = secret.data.unwrap_or_default();
        let text = |k: &str| {
            data.get(k)
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        };
        match (text("accessKeyId"), text("secretKey")) {
            (Some(user), Some(password)) => credentials = Some((user, password)),
            _ => {
                return Poll::Failed(format!(
                    "Secret {ns}/{name} needs accessKeyId and secretKey"
                ));
            }
        }
    }
    let mut cas = Vec::new();
    if let Some(name) = registry
        .cert_config_map
        .as_deref()
        .filter(|n| !n.is_empty())
    {
        match Api::<ConfigMap>::namespaced(ctx.client.clone(), &ns)
            .get_opt(name)
            .await
        {
            Ok(Some(map)) => cas.extend(
                map.data
                    .unwrap_or_default()
                    .into_values()
                    .map(String::into_bytes),
            ),
            Ok(None) => return Poll::Failed(format!("ConfigMap {ns}/{name} not found")),
            Err(e) => return Poll::Failed(format!("reading ConfigMap {ns}/{name}: {e}")),
        }
    }
    let host = url
        .strip_prefix("docker://")
        .and_then(|r| r.split('/').next())
        .unwrap_or("");
    let insecure = ctx
        .caches
        .config()
        .and_then(|c| c.spec.insecure_registries)
        .unwrap_or_default()
        .iter()
        .any(|h| h == host);
    let architecture = registry.platform.and_then(|p| p.architecture);
    // cdi-registry is the importer's registry client too: the same reach, the same messages.
    let image = match cdi_registry::Image::new(url, credentials, cas, insecure, architecture) {
        Ok(i) => i,
        Err(e) => return Poll::Failed(e.to_string()),
    };
    match image.digest().await {
        Ok(d) => Poll::Digest(d),
        Err(e) => Poll::Failed(e.to_string()),
    }
}

/// The cron's namespaced APIs this controller reads and writes.
struct Apis {
    dvs: Api<DataVolume>,
    claims: Api<PersistentVolumeClaim>,
    sources: Api<DataSource>,
    crons: Api<DataImportCron>,
    snapshots: Api<DynamicObject>,
}

impl Apis {
    /// The APIs in the cron's namespace (no call is made).
    fn new(ctx: &Context, ns: &str) -> Self {
        Apis {
            dvs: Api::namespaced(ctx.client.clone(), ns),
            claims: Api::namespaced(ctx.client.clone(), ns),
            sources: Api::namespaced(ctx.client.clone(), ns),
            crons: Api::namespaced(ctx.client.clone(), ns),
            snapshots: Api::namespaced_with(
                ctx.client.clone(),
                ns,
                &crate::objects::snapshot_api("VolumeSnapshot", "volumesnapshots"),
            ),
        }
    }
}

/// What exists of the cron's current import and of its managed DataSource.
struct Existing {
    /// The DataVolume named by `status.currentImports[0]`.
    current: Option<String>,
    dv: Option<DataVolume>,
    claim: Option<PersistentVolumeClaim>,
    ds_name: String,
    ds: Option<DataSource>,
    /// Another cron that still manages the DataSource.
    other_manager: Option<String>,
}

/// Read the current import's DataVolume and claim, the managed DataSource, and whether
/// another cron manages that DataSource.
async fn read_existing(cron: &DataImportCron, apis: &Apis, name: &str) -> Result<Existing, Error> {
    let current = cron
        .status
        .as_ref()
        .and_then(|s| s.current_imports.as_ref())
        .and_then(|i| i.first())
        .map(|i| i.data_volume_name.clone())
        .filter(|n| !n.is_empty());
    let (dv, claim) = match &current {
        Some(n) => (apis.dvs.get_opt(n).await?, apis.claims.get_opt(n).await?),
        None => (None, None),
    };
    let ds_name = cron.spec.managed_data_source.clone();
    let ds = if ds_name.is_empty() {
        None
    } else {
        apis.sources.get_opt(&ds_name).await?
    };
    // A DataSource another cron (that still manages it) made is that cron's.
    let mut other_manager = None;
    if let Some(owner) = ds
        .as_ref()
        .and_then(|d| d.labels().get(label::DATA_IMPORT_CRON))
        // An empty label is none (and no name to get).
        .filter(|o| !o.is_empty() && **o != name)
        && let Some(other) = apis.crons.get_opt(owner).await?
        && other.spec.managed_data_source == ds_name
    {
        other_manager = Some(owner.clone());
    }
    Ok(Existing {
        current,
        dv,
        claim,
        ds_name,
        ds,
        other_manager,
    })
}

/// The claims labelled as the cron's (metadata only).
async fn labelled_claims(
    claims: &Api<PersistentVolumeClaim>,
    selector: &str,
) -> Result<Vec<PersistentVolumeClaim>, Error> {
    let labelled = claims
        .list_metadata(&ListParams::default().labels(selector))
        .await?;
    Ok(labelled
        .items
        .into_iter()
        .map(|m| PersistentVolumeClaim {
            metadata: m.metadata,
            ..Default::default()
        })
        .collect())
}

/// The class the imports go to, and its StorageProfile's source format and snapshot class.
fn import_storage(
    ctx: &Context,
    cron: &DataImportCron,
) -> (Option<String>, DataImportCronSourceFormat, Option<String>) {
    let template = &cron.spec.template.spec;
    let class = template
        .storage
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .or_else(|| {
            template
                .pvc
                .as_ref()
                .and_then(|p| p.storage_class_name.clone())
        })
        .or_else(|| {
            cdi_core::render::default_storage_class(&ctx.caches.classes(), true)
                .and_then(|c| c.metadata.name.clone())
        });
    let profile = class.as_ref().and_then(|c| {
        ctx.caches
            .profiles()
            .into_iter()
            .find(|p| p.metadata.name.as_deref() == Some(c.as_str()))
    });
    let profile_status = profile.and_then(|p| p.status);
    let format = profile_status
        .as_ref()
        .and_then(|s| s.data_import_cron_source_format)
        .unwrap_or(DataImportCronSourceFormat::Pvc);
    let snapshot_class = profile_status.and_then(|s| s.snapshot_class);
    (class, format, snapshot_class)
}

/// The current import's VolumeSnapshot and the snapshots labelled as the cron's (name and
/// last use time). No snapshot API served is no snapshots.
async fn read_snapshots(
    snapshots: &Api<DynamicObject>,
    current: Option<&String>,
    selector: &str,
) -> (Option<DynamicObject>, Vec<(String, String)>) {
    let snapshot = match current {
        Some(n) => snapshots.get_opt(n).await.unwrap_or(None),
        None => None,
    };
    let labelled = snapshots
        .list_metadata(&ListParams::default().labels(selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .map(|m| {
            let used = m
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(dic::LAST_USE_TIME))
                .cloned()
                .unwrap_or_default();
            (m.metadata.name.unwrap_or_default(), used)
        })
        .collect();
    (snapshot, labelled)
}

/// Upstream's AuthorizeSA: a cron cloning a claim does so as its ServiceAccount. The reason
/// its ServiceAccount may not, logged; `None` when it may or the cron clones nothing.
async fn clone_denied(
    ctx: &Context,
    cron: &DataImportCron,
    ns: &str,
    name: &str,
) -> Result<Option<String>, Error> {
    let clone_denied = match dic::claim_source(cron) {
        Some((at, claim_name)) => {
            let (user, groups) = dic::service_account_user(cron);
            let source = cdi_apiserver::webhook::CloneSource {
                snapshot: false,
                namespace: at.clone(),
                name: claim_name,
            };
            let who = json!({"username": user, "groups": groups});
            match cdi_apiserver::webhook::may_clone(&ctx.client, &source, &who).await {
                Ok(true) => None,
                Ok(false) => Some(cdi_apiserver::webhook::insufficient(&user, &at)),
                Err(e) => return Err(Error::Other(e)),
            }
        }
        None => None,
    };
    if let Some(why) = &clone_denied {
        tracing::info!(cron = %format!("{ns}/{name}"), reason = %why, "not authorized to create DataVolume");
    }
    Ok(clone_denied)
}

/// One pass over a DataImportCron.
async fn reconcile(cron: Arc<DataImportCron>, ctx: Arc<Context>) -> Result<Action, Error> {
    ctx.caches.ready().await;
    let ns = cron.namespace().unwrap_or_default();
    let name = cron.name_any();
    if cron.metadata.deletion_timestamp.is_some() {
        ctx.metrics.remove_cron_outdated(&ns, &name);
        return Ok(Action::await_change());
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let apis = Apis::new(&ctx, &ns);
    let existing = read_existing(&cron, &apis, &name).await?;
    // Another cron's DataSource: this pass only says so, without a digest.
    let polled = if existing.other_manager.is_none() && dic::poll_due(&cron, now) {
        poll(&ctx, &cron).await
    } else {
        Poll::NotDue
    };
    if let Poll::Failed(e) = &polled {
        tracing::info!(cron = %format!("{ns}/{name}"), error = %e, "polling the source failed");
    }
    let selector = format!("{}={name}", label::DATA_IMPORT_CRON);
    let labelled = labelled_claims(&apis.claims, &selector).await?;
    // The source format of the class the imports go to (its StorageProfile's).
    let (class, format, snapshot_class) = import_storage(&ctx, &cron);
    let (snapshot, labelled_snapshots) =
        read_snapshots(&apis.snapshots, existing.current.as_ref(), &selector).await;
    let clone_denied = clone_denied(&ctx, &cron, &ns, &name).await?;
    let observed = Observed {
        cron: &cron,
        now,
        poll: polled,
        dv: existing.dv.as_ref(),
        claim: existing.claim.as_ref(),
        data_source: existing.ds.as_ref(),
        other_manager: existing.other_manager.clone(),
        claims: labelled.iter().collect(),
        class,
        format,
        snapshot: snapshot
            .as_ref()
            .map(|s| s.data["status"]["readyToUse"] == true),
        snapshot_class,
        snapshots: labelled_snapshots,
        clone_denied,
    };
    let plan = dic::decide(&observed);

    // A DataSource not the cron's: said in an event each pass (upstream's), and on the cron
    // by the status below; the plan holds nothing that would take the DataSource over.
    if let Some((reason, message)) = &plan.warning {
        ctx.events
            .record(cron.as_ref(), true, reason, message)
            .await;
    }
    write_imports(&apis, &plan).await?;
    if let Some(used) = &plan.touch {
        touch(&apis, used, existing.claim.as_ref(), snapshot.as_ref(), now).await?;
    }
    write_data_source(&apis.sources, &existing.ds_name, &plan).await?;
    write_cron(&apis.crons, &cron, &name, &plan).await?;
    ctx.metrics
        .set_cron_outdated(&ns, &name, plan.outdated.0, plan.outdated.1);
    Ok(match plan.requeue_after {
        Some(after) => Action::requeue(after),
        None => Action::await_change(),
    })
}

/// Create the plan's import DataVolume (one there already is fine), delete the imports it
/// collects (the claim when no DataVolume is left), take its VolumeSnapshot and delete the
/// old ones.
async fn write_imports(apis: &Apis, plan: &dic::Plan) -> Result<(), Error> {
    if let Some(new) = &plan.create_dv {
        match apis.dvs.create(&PostParams::default(), new).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    for import in &plan.delete {
        match apis.dvs.delete(import, &DeleteParams::default()).await {
            Ok(_) => {}
            // No DataVolume (adopted, or deleted before): the claim itself.
            Err(kube::Error::Api(e)) if e.code == 404 => {
                match apis.claims.delete(import, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(new) = &plan.create_snapshot {
        let object: DynamicObject = serde_json::from_value(new.clone())
            .map_err(|e| Error::Other(format!("a VolumeSnapshot: {e}")))?;
        match apis.snapshots.create(&PostParams::default(), &object).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    for old in &plan.delete_snapshots {
        match apis.snapshots.delete(old, &DeleteParams::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Stamp the last use time on the import in use (its claim, and its snapshot), only when
/// the stamp there is a minute old or missing.
async fn touch(
    apis: &Apis,
    used: &str,
    claim: Option<&PersistentVolumeClaim>,
    snapshot: Option<&DynamicObject>,
    now: k8s_openapi::jiff::Timestamp,
) -> Result<(), Error> {
    let stamp = json!({"metadata": {"annotations": {(dic::LAST_USE_TIME): now.to_string()}}});
    // Only as often as the cron is looked at: a timestamp per pass would wake it again.
    let stale = |anns: Option<&BTreeMap<String, String>>| {
        anns.and_then(|a| a.get(dic::LAST_USE_TIME))
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
            .is_none_or(|t| now.duration_since(t).as_secs() >= 60)
    };
    if claim.is_some_and(|c| stale(c.metadata.annotations.as_ref())) {
        apis.claims
            .patch(used, &PatchParams::default(), &Patch::Merge(&stamp))
            .await?;
    }
    // The snapshot of the import too: its garbage collection goes by the same time.
    if let Some(snap) = snapshot
        && stale(snap.metadata.annotations.as_ref())
    {
        match apis
            .snapshots
            .patch(used, &PatchParams::default(), &Patch::Merge(&stamp))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Create or patch the managed DataSource as the plan says (one created already is fine).
async fn write_data_source(
    sources: &Api<DataSource>,
    ds_name: &str,
    plan: &dic::Plan,
) -> Result<(), Error> {
    match &plan.data_source {
        Some(DataSourceChange::Create(new)) => {
            match sources.create(&PostParams::default(), new).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
        }
        Some(DataSourceChange::Patch(patch)) => {
            sources
                .patch(ds_name, &PatchParams::default(), &Patch::Merge(patch))
                .await?;
        }
        None => {}
    }
    Ok(())
}

/// Patch the cron's annotations and status (on the object: no status subresource) when the
/// plan changes them.
async fn write_cron(
    crons: &Api<DataImportCron>,
    cron: &DataImportCron,
    name: &str,
    plan: &dic::Plan,
) -> Result<(), Error> {
    let mut patch = serde_json::Map::new();
    if !plan.annotations.is_empty() {
        patch.insert("metadata".into(), json!({"annotations": plan.annotations}));
    }
    if cron.status.as_ref() != Some(&plan.status) {
        let status = crate::objects::status_patch(cron.status.as_ref(), &plan.status)?;
        patch.insert("status".into(), status["status"].clone());
    }
    if !patch.is_empty() {
        crons
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(&serde_json::Value::Object(patch)),
            )
            .await?;
    }
    Ok(())
}

/// The cron a labelled object belongs to (the label names it, in the object's namespace).
fn cron_of<K: kube::Resource>(object: &K) -> Option<ObjectRef<DataImportCron>> {
    let name = object
        .meta()
        .labels
        .as_ref()?
        .get(label::DATA_IMPORT_CRON)?;
    let ns = object.meta().namespace.as_deref()?;
    Some(ObjectRef::new(name).within(ns))
}

/// Run the controller over DataImportCrons; their DataVolumes, claims and DataSources (found by
/// label) wake them.
pub async fn run(ctx: Context) -> anyhow::Result<()> {
    // A deleted cron is never reconciled again: its outdated series goes when it does.
    let metrics = ctx.metrics.clone();
    let gone = watcher::watcher(
        Api::<DataImportCron>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .for_each(move |event| {
        if let Ok(watcher::Event::Delete(cron)) = event {
            metrics.remove_cron_outdated(&cron.namespace().unwrap_or_default(), &cron.name_any());
        }
        std::future::ready(())
    });
    let labelled = watcher::Config::default().labels(label::DATA_IMPORT_CRON);
    let crons = Controller::new(
        Api::<DataImportCron>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .watches(
        Api::<DataVolume>::all(ctx.client.clone()),
        labelled.clone(),
        |dv| cron_of(&dv),
    )
    .watches(
        Api::<PersistentVolumeClaim>::all(ctx.client.clone()),
        labelled.clone(),
        |c| cron_of(&c),
    )
    .watches(Api::<DataSource>::all(ctx.client.clone()), labelled, |d| {
        cron_of(&d)
    })
    .run_as(
        "dataimportcron",
        ctx.metrics.clone(),
        Arc::new(ctx),
        reconcile,
    );
    tokio::join!(crons, gone);
    Ok(())
}
