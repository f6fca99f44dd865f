//! `cdi controller`: the CDI controllers against the cluster of the current kubeconfig.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use cdi_controller::{Context, Options, serve};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};

#[derive(clap::Args)]
pub struct ControllerArgs {
    /// The importer pod's image.
    #[arg(
        long,
        env = "IMPORTER_IMAGE",
        default_value = "quay.io/kubevirt/cdi-importer:latest"
    )]
    importer_image: String,
    /// The upload pod's image.
    #[arg(
        long,
        env = "UPLOADSERVER_IMAGE",
        default_value = "quay.io/kubevirt/cdi-uploadserver:latest"
    )]
    upload_server_image: String,
    /// The clone source pod's image.
    #[arg(
        long,
        env = "CLONER_IMAGE",
        default_value = "quay.io/kubevirt/cdi-cloner:latest"
    )]
    cloner_image: String,
    /// Worker pods' imagePullPolicy.
    #[arg(long, env = "PULL_POLICY", default_value = "IfNotPresent")]
    pull_policy: String,
    /// Log verbosity (`-v=N`, upstream's flag), which worker pods are given too.
    #[arg(short = 'v', long, default_value_t = 1)]
    verbosity: u32,
    /// Namespace of the leader election Lease (the controller's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "kube-system")]
    namespace: String,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Create or update the cdi.kubevirt.io CustomResourceDefinitions first, as the operator
    /// does on a real cluster.
    #[arg(long)]
    install_crds: bool,
}

pub(crate) async fn install_crds(client: &kube::Client) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in cdi_api::crd::crds() {
        let name = crd.name_any();
        api.patch(
            &name,
            &PatchParams::apply("cdi-controller").force(),
            &Patch::Apply(&crd),
        )
        .await
        .with_context(|| format!("installing CRD {name}"))?;
    }
    Ok(())
}

pub fn run(args: &ControllerArgs) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube_runtime=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colours only for a terminal: a pod's log is a file.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the cluster (set KUBECONFIG, or run in a pod)")?;
        if args.install_crds {
            install_crds(&client).await?;
        }
        let metrics = Arc::new(serve::Metrics::default());
        // In a pod of the development cluster, "all addresses" means the pod's own.
        let pod = cdi_core::devpod::DevPod::from_env(|k| std::env::var(k).ok())
            .map_err(anyhow::Error::msg)?;
        let (bound, mut server) = serve::serve(pod.listen(args.metrics_addr), metrics.clone())
            .await
            .with_context(|| format!("listening on {}", args.metrics_addr))?;
        eprintln!("metrics, healthz and readyz on http://{bound}");
        let identity = format!(
            "{}-{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "cdi-controller".into()),
            std::process::id()
        );
        let ctx = Context::new(
            client,
            Options {
                importer_image: args.importer_image.clone(),
                upload_server_image: args.upload_server_image.clone(),
                cloner_image: args.cloner_image.clone(),
                pull_policy: args.pull_policy.clone(),
                verbosity: args.verbosity,
                namespace: args.namespace.clone(),
                identity,
                resync: Duration::from_secs(1),
            },
            metrics,
        );
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        };
        tokio::select! {
            r = cdi_controller::run_as_leader(ctx, shutdown) => r,
            // Without it the process would look alive to nobody: stop, and let it be restarted.
            r = &mut server => Err(match r {
                Err(e) if e.is_panic() => anyhow::anyhow!("the metrics and health server panicked"),
                _ => anyhow::anyhow!("the metrics and health server stopped"),
            }),
        }
    })
}
