//! The DataSource controller (cdi-core `datasource`): each DataSource's `Ready` condition and
//! `status.source` from the claim (and its DataVolume) or snapshot it names, following one
//! reference to another DataSource; the image's KubeVirt labels (instance types, preferences)
//! copied onto it. Upstream's DataSource CRD has no status subresource: the status is patched
//! on the object.

use crate::runtime::run::RunAs;
use std::sync::Arc;

use cdi_api::datasource::DataSource;
use cdi_api::datavolume::DataVolume;
use cdi_core::datasource::{self, Image};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::cache::Changes;
use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// One pass over a DataSource.
async fn reconcile(
    ds: Arc<DataSource>,
    ctx: Arc<(Context, Store<DataSource>)>,
) -> Result<Action, Error> {
    let (ctx, store) = (&ctx.0, &ctx.1);
    let ns = ds.namespace().unwrap_or_default();
    ctx.caches.ready().await;
    let resolved = datasource::resolve_chain(&ds, |ns, name| {
        store
            .get(&ObjectRef::new(name).within(ns))
            .map(|d| d.as_ref().clone())
    });
    let mut image = Image::default();
    let claim;
    let dv;
    if let Ok(r) = &resolved {
        let own = r.namespace().unwrap_or_default();
        let at = |n: &str| {
            if n.is_empty() {
                own.clone()
            } else {
                n.to_string()
            }
        };
        if let Some(p) = &r.spec.source.pvc {
            let pns = at(&p.namespace);
            claim = ctx.caches.claim(&pns, &p.name);
            dv = Api::<DataVolume>::namespaced(ctx.client.clone(), &pns)
                .get_opt(&p.name)
                .await?;
            image.claim = claim.as_deref();
            image.dv = dv.as_ref();
        } else if let Some(s) = &r.spec.source.snapshot {
            let snapshots: Api<DynamicObject> = Api::namespaced_with(
                ctx.client.clone(),
                &at(&s.namespace),
                &crate::objects::snapshot_api("VolumeSnapshot", "volumesnapshots"),
            );
            // No snapshot API served is no snapshot.
            let found = snapshots.get_opt(&s.name).await.unwrap_or(None);
            image.snapshot = found
                .as_ref()
                .map(|o| o.data["status"]["readyToUse"] == true);
            image.snapshot_labels = found.map(|o| o.labels().clone()).unwrap_or_default();
        }
    }
    let now = k8s_openapi::jiff::Timestamp::now();
    let (status, labels) = datasource::status(&ds, &resolved, &image, now);
    let new_labels = cdi_core::import::annotation_patch(ds.labels(), &labels, false);
    if ds.status.as_ref() != Some(&status) || !new_labels.is_empty() {
        let mut patch = json!({"status": status});
        if !new_labels.is_empty() {
            patch["metadata"] = json!({"labels": new_labels});
        }
        Api::<DataSource>::namespaced(ctx.client.clone(), &ns)
            .patch(
                &ds.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    // What a DataSource waits for (a DataVolume's phase, a snapshot's readiness, the DataSource
    // it refers to) wakes it only through its claim, if at all: looked at again while not ready.
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.status == cdi_api::enums::ConditionStatus::True);
    Ok(if ready && ds.spec.source.data_source.is_none() {
        Action::await_change()
    } else {
        Action::requeue(ctx.options.resync * 2)
    })
}

/// The cache subscription the controller is woken by.
pub struct Triggers {
    claims: Changes<PersistentVolumeClaim>,
}

impl Triggers {
    pub fn subscribe(feeds: &mut crate::cache::Feeds) -> Triggers {
        Triggers {
            claims: feeds.claims.subscribe(),
        }
    }
}

/// Run the controller over DataSources; a claim wakes the DataSources that name it.
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
    let controller = Controller::new(
        Api::<DataSource>::all(ctx.client.clone()),
        watcher::Config::default(),
    );
    let store = controller.store();
    let index = store.clone();
    controller
        .watches_shared_stream(triggers.claims, move |c: Arc<PersistentVolumeClaim>| {
            let ns = c.namespace().unwrap_or_default();
            let name = c.name_any();
            // Several DataSources may name one claim; each is woken.
            index
                .state()
                .into_iter()
                .filter(|d| {
                    let own = d.namespace().unwrap_or_default();
                    d.spec.source.pvc.as_ref().is_some_and(|p| {
                        p.name == name
                            && (if p.namespace.is_empty() {
                                &own
                            } else {
                                &p.namespace
                            }) == &ns
                    })
                })
                .map(|d| ObjectRef::from_obj(d.as_ref()))
                .collect::<Vec<_>>()
        })
        .run_as(
            "datasource",
            ctx.metrics.clone(),
            Arc::new((ctx, store)),
            reconcile,
        )
        .await;
    Ok(())
}
