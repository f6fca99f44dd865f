//! `cdi install` (the operator's manifests and a CDI resource: printed, written to `deploy/`, or
//! applied and waited for) and `cdi operator` (the operator's entry point).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use cdi_api::config::CDI;
use cdi_core::install::{self, Release};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::Value;

/// Where the images come from by default: build them with the Containerfile and push them
/// under your registry, then pass it with `--registry`.
pub const REGISTRY: &str = "cdi-rs";

#[derive(clap::Args)]
pub struct InstallArgs {
    /// Print the manifests (the operator's, then the CDI resource) instead of applying them.
    #[arg(long, conflicts_with = "out_dir")]
    print: bool,
    /// Write them as `cdi-operator.yaml` and `cdi-cr.yaml` into this directory (`deploy/` is
    /// made this way) instead of applying them.
    #[arg(long, value_name = "DIR")]
    out_dir: Option<PathBuf>,
    /// The registry path of the images: `<registry>/cdi-<component>:<tag>`.
    #[arg(long, default_value = REGISTRY)]
    registry: String,
    /// The images' tag, and the release the operator reports.
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    tag: String,
    /// The namespace CDI runs in.
    #[arg(long, short = 'n', default_value = "cdi")]
    namespace: String,
    /// The CDI resource to apply instead of the example one (YAML or JSON).
    #[arg(long, value_name = "FILE")]
    cdi: Option<PathBuf>,
    /// How long to wait for the CDI resource to be Deployed, in seconds.
    #[arg(long, default_value_t = 300)]
    timeout: u64,
}

/// A YAML stream of `objects`.
pub fn to_yaml(objects: &[Value]) -> String {
    objects
        .iter()
        // Plain data always serialises.
        .map(|o| format!("---\n{}", serde_saphyr::to_string(o).expect("JSON is YAML")))
        .collect()
}

fn read_cdi(path: Option<&PathBuf>) -> anyhow::Result<Value> {
    let Some(path) = path else {
        return Ok(install::example_cdi());
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let cdi: Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("{} is not a YAML or JSON object", path.display()))?;
    if cdi["kind"] != "CDI" {
        bail!(
            "{} holds a {} where a CDI resource (kind: CDI) was expected",
            path.display(),
            cdi["kind"]
        );
    }
    Ok(cdi)
}

pub fn run(args: &InstallArgs) -> anyhow::Result<()> {
    let release = Release::tagged(&args.registry, &args.tag, &args.namespace);
    let operator = install::operator_manifests(&release);
    let cdi = read_cdi(args.cdi.as_ref())?;
    if args.print {
        let mut all = operator;
        all.push(cdi);
        let text = to_yaml(&all);
        if let Err(e) = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes())
            && e.kind() != std::io::ErrorKind::BrokenPipe
        {
            return Err(e.into());
        }
        return Ok(());
    }
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, objects) in [("cdi-operator.yaml", operator), ("cdi-cr.yaml", vec![cdi])] {
            let path = dir.join(name);
            std::fs::write(&path, to_yaml(&objects))
                .with_context(|| format!("writing {}", path.display()))?;
        }
        return Ok(());
    }
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the cluster (set KUBECONFIG)")?;
        let name = apply_all(&client, &operator, &cdi).await?;
        eprintln!("applied the operator's manifests and CDI {name}; waiting for it to be Deployed");
        let phase = wait_deployed(&client, &name, Duration::from_secs(args.timeout)).await?;
        println!("CDI {name} is {phase}");
        Ok(())
    })
}

/// Apply the operator's manifests, then the CDI resource; the resource's name.
pub async fn apply_all(
    client: &kube::Client,
    operator: &[Value],
    cdi: &Value,
) -> anyhow::Result<String> {
    for o in operator {
        cdi_controller::operator::apply(client, o).await?;
    }
    // The CRD just made is served once it is Established; a first apply may come too early.
    let api: Api<CDI> = Api::all(client.clone());
    let name = cdi["metadata"]["name"]
        .as_str()
        .unwrap_or("cdi")
        .to_string();
    let mut tries = 0;
    loop {
        match api
            .patch(
                &name,
                &PatchParams::apply("cdi-install").force(),
                &Patch::Apply(cdi),
            )
            .await
        {
            Ok(_) => return Ok(name),
            Err(kube::Error::Api(e)) if e.code == 404 && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).with_context(|| format!("applying CDI {name}")),
        }
    }
}

/// Wait until CDI `name` is Deployed; its phase, or what it says when it does not get there.
pub async fn wait_deployed(
    client: &kube::Client,
    name: &str,
    timeout: Duration,
) -> anyhow::Result<String> {
    use kube::runtime::wait::await_condition;
    let api: Api<CDI> = Api::all(client.clone());
    let deployed = |c: Option<&CDI>| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase.as_ref())
            .is_some_and(|p| p.as_str() == "Deployed")
    };
    match tokio::time::timeout(timeout, await_condition(api.clone(), name, deployed)).await {
        Ok(Ok(_)) => Ok("Deployed".into()),
        Ok(Err(e)) => Err(e).context("watching the CDI resource"),
        Err(_) => {
            let now = api.get_opt(name).await?;
            let said = now
                .and_then(|c| c.status)
                .map(|s| serde_json::to_string(&s).unwrap_or_default())
                .unwrap_or_else(|| {
                    "no status: is the operator running? kubectl get pods -n <namespace>".into()
                });
            bail!("CDI {name} was not Deployed within {timeout:?}: {said}")
        }
    }
}

#[derive(clap::Args)]
pub struct OperatorArgs {
    /// Log verbosity as upstream's components take it (`-v=1`); 3 and above log debug detail.
    #[arg(short = 'v', value_name = "LEVEL", default_value_t = 1)]
    verbosity: u32,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// The namespace CDI is installed in (the operator's own).
    #[arg(long, env = "POD_NAMESPACE", default_value = "cdi")]
    namespace: String,
}

/// `cdi operator`: the release comes from its environment (OPERATOR_VERSION and the images).
pub fn operator(args: &OperatorArgs) -> anyhow::Result<()> {
    crate::pod_logging(args.verbosity);
    let release = Release::from_env(|k| std::env::var(k).ok(), &args.namespace)
        .map_err(anyhow::Error::msg)?;
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .context("connecting to the cluster (set KUBECONFIG, or run in a pod)")?;
        let metrics = Arc::new(cdi_controller::serve::Metrics::for_operator());
        let pod = cdi_core::devpod::DevPod::from_env(|k| std::env::var(k).ok())
            .map_err(anyhow::Error::msg)?;
        let (bound, mut server) =
            cdi_controller::serve::serve(pod.listen(args.metrics_addr), metrics.clone())
                .await
                .with_context(|| format!("listening on {}", args.metrics_addr))?;
        eprintln!(
            "cdi operator {} in {}: metrics, healthz and readyz on http://{bound}",
            release.version, release.namespace,
        );
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let shutdown = async move {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = terminate.recv() => {}
            }
        };
        // One operator acts at a time (upstream's lease name); the others wait.
        let lease = cdi_controller::Lease {
            client: client.clone(),
            namespace: release.namespace.clone(),
            name: cdi_core::install::OPERATOR_LEASE,
            identity: format!(
                "{}-{}",
                std::env::var("HOSTNAME").unwrap_or_else(|_| "cdi-operator".into()),
                std::process::id()
            ),
        };
        tokio::select! {
            r = cdi_controller::lead(
                lease,
                |_| {},
                || cdi_controller::operator::run(client.clone(), release.clone(), metrics.clone()),
                shutdown,
            ) => r,
            _ = &mut server => Err(anyhow::anyhow!("the metrics and health server stopped")),
        }
    })
}
