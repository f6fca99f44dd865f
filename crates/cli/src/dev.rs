//! `cdi dev`: the embedded development cluster.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use cdi_devcluster::apiserver::{self, ApiServer};

#[derive(clap::Subcommand)]
pub enum DevCommand {
    /// Run the embedded Kubernetes API server and write a kubeconfig for kubectl and kube-rs.
    Apiserver {
        /// Where to listen (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:6443")]
        addr: SocketAddr,
        /// Where to write the kubeconfig.
        #[arg(long, default_value_os_t = std::env::temp_dir().join("cdi-dev").join("kubeconfig"))]
        kubeconfig: PathBuf,
    },
}

pub fn run(command: &DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Apiserver { addr, kubeconfig } => {
            let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
            runtime.block_on(async {
                let server = ApiServer::new();
                let (bound, task) = server
                    .serve(*addr)
                    .await
                    .with_context(|| format!("listening on {addr}"))?;
                if let Some(dir) = kubeconfig.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                let url = format!("http://{bound}");
                std::fs::write(kubeconfig, apiserver::kubeconfig(&url))
                    .with_context(|| format!("writing {}", kubeconfig.display()))?;
                println!("API server: {url}");
                println!("kubeconfig: {}", kubeconfig.display());
                println!(
                    "try: KUBECONFIG={} kubectl get namespaces",
                    kubeconfig.display()
                );
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = task => {}
                }
                Ok(())
            })
        }
    }
}
