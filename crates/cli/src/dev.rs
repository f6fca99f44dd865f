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
        /// Serve HTTPS under a fresh self-signed CA (written into the kubeconfig).
        #[arg(long)]
        tls: bool,
    },
}

pub fn run(command: &DevCommand) -> anyhow::Result<()> {
    match command {
        DevCommand::Apiserver {
            addr,
            kubeconfig,
            tls,
        } => {
            let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
            runtime.block_on(async {
                let server = ApiServer::new();
                let listening = |e| anyhow::anyhow!("listening on {addr}: {e}");
                let (bound, task, ca) = if *tls {
                    let (bound, task, ca) = server.serve_tls(*addr).await.map_err(listening)?;
                    (bound, task, Some(ca))
                } else {
                    let (bound, task) = server.serve(*addr).await.map_err(listening)?;
                    (bound, task, None)
                };
                if let Some(dir) = kubeconfig.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("creating {}", dir.display()))?;
                }
                let url = format!("{}://{bound}", if *tls { "https" } else { "http" });
                std::fs::write(
                    kubeconfig,
                    apiserver::kubeconfig_with_ca(&url, ca.as_deref()),
                )
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
