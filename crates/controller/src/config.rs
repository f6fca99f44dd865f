//! The CDIConfig controller: `config` exists, and its status holds the effective values for
//! the cluster's StorageClasses (cdi-core `config::status`).

use crate::runtime::run::run_singleton;
use std::time::Duration;

use cdi_api::config::{CDI, CDIConfig, CDIConfigSpec};
use futures::StreamExt;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};

use crate::cache::Changes;
use crate::runtime::context::Context;

/// Create `config` when it is missing (empty spec: the gates are the user's to set).
pub async fn ensure(ctx: &Context) -> Result<(), kube::Error> {
    let api: Api<CDIConfig> = Api::all(ctx.client.clone());
    if api.get_opt(cdi_api::name::CDI_CONFIG).await?.is_none() {
        let config = CDIConfig::new(cdi_api::name::CDI_CONFIG, CDIConfigSpec::default());
        match api.create(&PostParams::default(), &config).await {
            Ok(_) => tracing::info!("created CDIConfig config"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Bring the status up to date; true when it changed.
pub async fn reconcile(ctx: &Context) -> Result<bool, kube::Error> {
    ensure(ctx).await?;
    let api: Api<CDIConfig> = Api::all(ctx.client.clone());
    let mut config = api.get(cdi_api::name::CDI_CONFIG).await?;
    if let Some(spec) = authoritative(ctx)
        && spec != config.spec
    {
        let json = |s: &CDIConfigSpec| serde_json::to_value(s).unwrap_or_default();
        let patch = serde_json::json!({"spec": crate::objects::merge_patch(&json(&config.spec), &json(&spec))});
        config = api
            .patch(
                cdi_api::name::CDI_CONFIG,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        tracing::info!("CDIConfig spec set from the CDI resource's spec.config");
    }
    let classes = Api::<StorageClass>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    // The CA of the upload proxy's certificate, for clients such as `cdi image-upload`.
    let bundle = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
        ctx.client.clone(),
        &ctx.options.namespace,
    )
    .get_opt(crate::pki::names::PROXY_SIGNER_BUNDLE)
    .await?;
    let ca = bundle.and_then(|b| b.data?.remove(crate::pki::names::BUNDLE_KEY));
    let proxy = cdi_core::config::UploadProxy {
        url: None,
        ca: ca.as_deref(),
    };
    let status = cdi_core::config::status(&config.spec, &classes, proxy);
    if config.status.as_ref() == Some(&status) {
        return Ok(false);
    }
    // CDIConfig has no status subresource upstream: status is written with the object.
    let patch = crate::objects::status_patch(config.status.as_ref(), &status)
        .map_err(|e| kube::Error::Service(e.to_string().into()))?;
    api.patch(
        cdi_api::name::CDI_CONFIG,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(true)
}

/// The CDIConfig spec the installation's CDI resource holds, when it is the authority on it
/// (upstream's `configAuthority` annotation, which the operator sets): edits to CDIConfig itself
/// are then undone, as upstream does.
fn authoritative(ctx: &Context) -> Option<CDIConfigSpec> {
    cdi_core::install::active(&ctx.caches.cdis())
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| {
            c.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key(cdi_core::install::CONFIG_AUTHORITY))
        })
        .map(|c| c.spec.config.clone().unwrap_or_default())
}

/// What wakes the controller: CDIConfig, StorageClass and CDI changes, once the caches hold them.
pub struct Triggers {
    configs: Changes<CDIConfig>,
    classes: Changes<StorageClass>,
    cdis: Changes<CDI>,
}

impl Triggers {
    pub fn subscribe(feeds: &mut crate::cache::Feeds) -> Triggers {
        Triggers {
            configs: feeds.configs.subscribe(),
            classes: feeds.classes.subscribe(),
            cdis: feeds.cdis.subscribe(),
        }
    }
}

/// Reconcile on every change of the config or of a StorageClass, and every `resync`.
pub async fn run(ctx: Context, triggers: Triggers) -> anyhow::Result<()> {
    let mut changes = futures::stream::select_all([
        triggers.configs.map(|_| ()).boxed(),
        triggers.classes.map(|_| ()).boxed(),
        triggers.cdis.map(|_| ()).boxed(),
    ]);
    let period = ctx.options.resync.max(Duration::from_secs(1)) * 5;
    let object = cdi_api::name::CDI_CONFIG;
    run_singleton(
        "config",
        object,
        &ctx.metrics,
        &mut changes,
        period,
        || async {
            if reconcile(&ctx).await? {
                tracing::info!("updated CDIConfig status");
            }
            Ok(())
        },
    )
    .await;
    Ok(())
}
