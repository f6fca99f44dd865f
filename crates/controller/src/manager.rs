//! Every controller of `cdi controller`, run together on one set of caches while this instance
//! leads (controller-runtime's manager).

use crate::runtime::context::Context;
use crate::runtime::lease::{Lease, lead};
use crate::{
    cache, clone, config, dataimportcron, datasource, datavolume, import, populator,
    storageprofile, upload,
};

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
    let clone_source_triggers = clone::source::Triggers::subscribe(&mut feeds);
    let clone_populator_triggers = clone::populator::Triggers::subscribe(&mut feeds);
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
        r = clone::source::run(ctx.clone(), clone_source_triggers) => r,
        r = clone::populator::run(ctx.clone(), clone_populator_triggers) => r,
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
