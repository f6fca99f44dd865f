//! `cdi cloner`: the clone source pod's entry point (upstream's cdi-cloner). Configuration comes
//! from upstream's environment (UPLOAD_URL, CLIENT_CERT, CLIENT_KEY, SERVER_CA_CERT, OWNER_UID,
//! PREALLOCATION, VOLUME_MODE, MOUNT_POINT); the progress metric is served while the volume is
//! sent, and the end is written to the termination log. A failure exits non-zero: the pod's
//! restart sends the volume again.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cdi_core::devpod::DevPod;
use cdi_importer::convert::Progress;
use cdi_upload::cloner::{self, ClonerConfig};

#[derive(clap::Args)]
pub struct ClonerArgs {
    #[arg(long, default_value = "/dev/termination-log")]
    termination_log: PathBuf,
    /// Where the progress metric is served over HTTPS.
    #[arg(long, env = "CDI_METRICS_ADDR", default_value = "0.0.0.0:8443")]
    metrics_addr: SocketAddr,
    /// Log verbosity as upstream's cloner takes it (`-v=3`); 3 and above log debug detail.
    #[arg(short = 'v', value_name = "LEVEL", default_value_t = 1)]
    verbosity: u32,
}

pub fn run(args: &ClonerArgs) -> ExitCode {
    crate::pod_logging(args.verbosity);
    match send(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn send(args: &ClonerArgs) -> anyhow::Result<()> {
    // Run by the `cdi dev` kubelet, the pod is a directory and has an address of its own.
    let devpod = DevPod::from_env(|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)?;
    let config = ClonerConfig::from_env(|k| std::env::var(k).ok(), |p| devpod.path(p))?;
    let termination_log = devpod.path(&args.termination_log);
    let runtime = tokio::runtime::Runtime::new()?;
    let progress = Arc::new(Progress::default());
    runtime.block_on(async {
        let metrics = cdi_importer::metrics::serve(
            cdi_importer::metrics::CLONE_PROGRESS,
            devpod.listen(args.metrics_addr),
            config.owner_uid.clone(),
            progress.clone(),
        )
        .await;
        if let Err(e) = &metrics {
            // Progress is a convenience; the clone goes on without it.
            tracing::warn!(error = %e, "the progress metric is not served");
        }
        let sent = cloner::send(&config, progress).await;
        if let Ok((_, task)) = metrics {
            task.abort();
        }
        sent
    })?;
    // Upstream's cloner says it in plain text.
    std::fs::write(&termination_log, config.complete_message())?;
    tracing::info!("{}", config.complete_message());
    Ok(())
}
