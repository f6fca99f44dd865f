//! The StorageProfile controller: one profile per StorageClass, same name, created, kept up to
//! date (status from cdi-core `storageprofile::resolve`) and deleted with its class.

use crate::runtime::run::run_singleton;
use std::collections::BTreeMap;
use std::time::Duration;

use cdi_api::enums::AccessMode;
use cdi_api::storageprofile::{
    CONDITION_RECOGNIZED, StorageProfile, StorageProfileCondition, StorageProfileSpec,
    StorageProfileStatus,
};
use cdi_core::storageprofile::{SnapshotClassInfo, StaticVolume};
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::runtime::context::Context;

/// Every VolumeSnapshotClass, or none when the snapshot API is not served.
pub(crate) async fn snapshot_classes(ctx: &Context) -> Vec<SnapshotClassInfo> {
    let api: Api<DynamicObject> = Api::all_with(
        ctx.client.clone(),
        &crate::objects::snapshot_api("VolumeSnapshotClass", "volumesnapshotclasses"),
    );
    let Ok(list) = api.list(&ListParams::default()).await else {
        return Vec::new();
    };
    list.items
        .into_iter()
        .map(|o| SnapshotClassInfo {
            name: o.name_any(),
            driver: o.data["driver"].as_str().unwrap_or("").to_string(),
            is_default: o
                .annotations()
                .get(cdi_api::ann::DEFAULT_SNAPSHOT_CLASS)
                .is_some_and(|v| v == "true"),
        })
        .collect()
}

fn static_volumes(volumes: &[PersistentVolume], class: &str) -> Vec<StaticVolume> {
    volumes
        .iter()
        .filter_map(|v| {
            let spec = v.spec.as_ref()?;
            if spec.storage_class_name.as_deref() != Some(class) {
                return None;
            }
            let access_modes: Vec<AccessMode> = spec
                .access_modes
                .iter()
                .flatten()
                .filter_map(|m| m.parse().ok())
                .collect();
            let volume_mode = spec
                .volume_mode
                .as_deref()
                .unwrap_or("Filesystem")
                .parse()
                .ok()?;
            Some(StaticVolume {
                access_modes,
                volume_mode,
            })
        })
        .collect()
}

/// The status for `class` with the profile's `spec`, keeping condition times that did not change.
fn status_for(
    class: &StorageClass,
    profile: Option<&StorageProfile>,
    snaps: &[SnapshotClassInfo],
    volumes: &[PersistentVolume],
) -> Result<(StorageProfileStatus, BTreeMap<String, String>), String> {
    let spec = profile.map(|p| p.spec.clone()).unwrap_or_default();
    let name = class.name_any();
    let resolved =
        cdi_core::storageprofile::resolve(class, &spec, snaps, &static_volumes(volumes, &name))
            .map_err(|e| e.to_string())?;
    let (status, reason, message) = resolved.recognized;
    let previous = profile
        .and_then(|p| p.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_RECOGNIZED));
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let same = previous.is_some_and(|p| p.status == status && p.reason.as_ref() == Some(&reason));
    let condition = StorageProfileCondition {
        type_: CONDITION_RECOGNIZED.into(),
        status,
        last_transition_time: if same {
            previous.and_then(|p| p.last_transition_time.clone())
        } else {
            Some(now.clone())
        },
        last_heartbeat_time: if same {
            previous.and_then(|p| p.last_heartbeat_time.clone())
        } else {
            Some(now)
        },
        reason: Some(reason),
        message: Some(message.into()),
    };
    Ok((
        StorageProfileStatus {
            storage_class: Some(name),
            provisioner: Some(resolved.provisioner),
            clone_strategy: resolved.clone_strategy,
            claim_property_sets: Some(resolved.claim_property_sets),
            data_import_cron_source_format: Some(resolved.data_import_cron_source_format),
            snapshot_class: resolved.snapshot_class,
            conditions: Some(vec![condition]),
        },
        resolved.default_annotations,
    ))
}

/// One pass over every class and profile.
pub async fn reconcile(ctx: &Context) -> Result<(), kube::Error> {
    let classes = Api::<StorageClass>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let profiles_api: Api<StorageProfile> = Api::all(ctx.client.clone());
    let profiles = profiles_api.list(&ListParams::default()).await?.items;
    let volumes = Api::<PersistentVolume>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let snaps = snapshot_classes(ctx).await;
    // For the info metric: which drivers clone smartly.
    let csi_drivers = ctx.caches.csi_drivers();
    let snapshot_drivers: Vec<String> = snaps.iter().map(|s| s.driver.clone()).collect();
    for class in &classes {
        let name = class.name_any();
        let mut profile = profiles.iter().find(|p| p.name_any() == name).cloned();
        if profile.is_none() {
            let created = profiles_api
                .create(
                    &PostParams::default(),
                    &StorageProfile::new(&name, StorageProfileSpec::default()),
                )
                .await;
            match created {
                Ok(p) => {
                    tracing::info!(profile = %name, "created StorageProfile");
                    profile = Some(p);
                }
                Err(kube::Error::Api(e)) if e.code == 409 => continue,
                Err(e) => return Err(e),
            }
        }
        let Some(profile) = profile else { continue };
        match status_for(class, Some(&profile), &snaps, &volumes) {
            Ok((status, defaults)) => {
                // Upstream adds its annotations only when absent.
                let missing: BTreeMap<&String, &String> = defaults
                    .iter()
                    .filter(|(k, _)| !profile.annotations().contains_key(*k))
                    .collect();
                if !missing.is_empty() {
                    let patch = json!({"metadata": {"annotations": missing}});
                    profiles_api
                        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                        .await?;
                }
                let unchanged = profile.status.as_ref().is_some_and(|s| {
                    let mut a = s.clone();
                    let mut b = status.clone();
                    a.conditions = None;
                    b.conditions = None;
                    // Anyone can write the status (`conditions: []` too): compare, never index.
                    let first = |c: &Option<Vec<StorageProfileCondition>>| {
                        c.as_ref()
                            .and_then(|c| c.first())
                            .map(|c| (c.status, c.reason.clone()))
                    };
                    a == b && first(&s.conditions) == first(&status.conditions)
                });
                if !unchanged {
                    let status_patch =
                        crate::objects::status_patch(profile.status.as_ref(), &status)
                            .map_err(|e| kube::Error::Service(e.to_string().into()))?;
                    profiles_api
                        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status_patch))
                        .await?;
                }
                if let Some(info) =
                    cdi_core::storageprofile::info(&status, class, &csi_drivers, &snapshot_drivers)
                {
                    ctx.metrics.set_storage_profile(&info);
                }
            }
            Err(message) => {
                tracing::warn!(profile = %name, "{message}");
                ctx.events
                    .record(&profile, true, "ErrStorageProfile", &message)
                    .await;
            }
        }
    }
    for class in ctx.metrics.storage_profile_classes() {
        if !classes.iter().any(|c| c.name_any() == class) {
            ctx.metrics.remove_storage_profile(&class);
        }
    }
    for profile in &profiles {
        let name = profile.name_any();
        if !classes.iter().any(|c| c.name_any() == name) {
            match profiles_api.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::info!(profile = %name, "deleted StorageProfile of a deleted class")
                }
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
    }
    Ok(())
}

/// Reconcile on changes of classes, profiles and volumes, and every few resyncs.
pub async fn run(ctx: Context) -> anyhow::Result<()> {
    let w = watcher::Config::default();
    let classes = watcher(Api::<StorageClass>::all(ctx.client.clone()), w.clone())
        .touched_objects()
        .map(|_| ())
        .boxed();
    let profiles = watcher(Api::<StorageProfile>::all(ctx.client.clone()), w.clone())
        .touched_objects()
        .map(|_| ())
        .boxed();
    let mut changes = futures::stream::select(classes, profiles);
    let period = ctx.options.resync.max(Duration::from_secs(1)) * 5;
    let object = "every StorageClass";
    run_singleton(
        "storageprofile",
        object,
        &ctx.metrics,
        &mut changes,
        period,
        || async { Ok(reconcile(&ctx).await?) },
    )
    .await;
    Ok(())
}
