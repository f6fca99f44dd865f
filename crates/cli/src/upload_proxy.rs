//! `cdi upload-proxy`: the upload proxy (upstream's cdi-uploadproxy) against the cluster of the
//! current kubeconfig, or in-cluster. Its certificates come from files (the mounted Secrets of
//! its Deployment), the token key from `APISERVER_PUBLIC_KEY` or a file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use cdi_core::devpod::DevPod;
use cdi_pki::token::{API_ISSUER, Validator};
use cdi_upload::proxy::{self, ProxyConfig, ProxyTls};

#[derive(clap::Args)]
pub struct UploadProxyArgs {
    /// Log verbosity as upstream's components take it (`-v=1`); 3 and above log debug detail.
    #[arg(short = 'v', value_name = "LEVEL", default_value_t = 1)]
    verbosity: u32,
    /// Where uploads are taken (HTTPS).
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: SocketAddr,
    /// The proxy's serving certificate and key.
    #[arg(
        long,
        default_value = "/var/run/certs/cdi-uploadproxy-server-cert/tls.crt"
    )]
    tls_cert: PathBuf,
    #[arg(
        long,
        default_value = "/var/run/certs/cdi-uploadproxy-server-cert/tls.key"
    )]
    tls_key: PathBuf,
    /// The client certificate and key upload servers accept.
    #[arg(
        long,
        default_value = "/var/run/certs/cdi-uploadserver-client-cert/tls.crt"
    )]
    client_cert: PathBuf,
    #[arg(
        long,
        default_value = "/var/run/certs/cdi-uploadserver-client-cert/tls.key"
    )]
    client_key: PathBuf,
    /// The CA upload servers' certificates are signed by.
    #[arg(
        long,
        default_value = "/var/run/ca-bundle/cdi-uploadserver-signer-bundle/ca-bundle.crt"
    )]
    server_ca: PathBuf,
    /// The public key upload tokens are checked with (PEM), as upstream passes it.
    #[arg(long, env = "APISERVER_PUBLIC_KEY", hide_env_values = true)]
    apiserver_public_key: Option<String>,
    /// A file holding that key, instead of the variable.
    #[arg(long, conflicts_with = "apiserver_public_key")]
    apiserver_public_key_file: Option<PathBuf>,
}

fn read(root: Option<&Path>, path: &Path) -> anyhow::Result<Vec<u8>> {
    let at = cdi_core::devpod::in_root(root, path);
    std::fs::read(&at).with_context(|| format!("reading {}", at.display()))
}

pub fn run(args: &UploadProxyArgs) -> anyhow::Result<()> {
    crate::pod_logging(args.verbosity);
    let pod = DevPod::from_env(|k| std::env::var(k).ok()).map_err(anyhow::Error::msg)?;
    let root = pod.root.as_deref();
    let key = match (&args.apiserver_public_key, &args.apiserver_public_key_file) {
        (Some(pem), _) => pem.clone(),
        (None, Some(file)) => String::from_utf8(read(root, file)?)?,
        (None, None) => anyhow::bail!(
            "no token key: set APISERVER_PUBLIC_KEY (the id_rsa.pub of Secret cdi-api-signing-key) \
             or --apiserver-public-key-file"
        ),
    };
    let read_tls = {
        let root = pod.root.clone();
        let paths = [
            args.tls_cert.clone(),
            args.tls_key.clone(),
            args.client_cert.clone(),
            args.client_key.clone(),
            args.server_ca.clone(),
        ];
        move || {
            let file = |i: usize| read(root.as_deref(), &paths[i]);
            Ok::<_, anyhow::Error>(ProxyTls {
                cert_pem: file(0)?,
                key_pem: file(1)?,
                client_cert_pem: file(2)?,
                client_key_pem: file(3)?,
                server_ca_pem: file(4)?,
            })
        }
    };
    let (tls_now, tls) = tokio::sync::watch::channel(read_tls()?);
    let config = ProxyConfig {
        listen: pod.listen(args.listen),
        tls,
        validator: Validator::new(API_ISSUER, &key).context("the token key")?,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the runtime")?;
    runtime.block_on(async {
        // The kubelet rewrites mounted Secrets in place when the operator rotates them.
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                // The same material twice in a row: not a certificate of one version beside
                // the key of the other, caught across a rewrite (it is read again next time).
                if let (Ok(now), Ok(again)) = (read_tls(), read_tls())
                    && now == again
                {
                    tls_now.send_if_modified(|seen| {
                        let changed = *seen != now;
                        *seen = now;
                        changed
                    });
                }
            }
        });
        let client = kube::Client::try_default()
            .await
            .context("connecting to the cluster (set KUBECONFIG, or run in a pod)")?;
        let listener = tokio::net::TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("listening on {}", config.listen))?;
        // The first line says where: tests and scripts read it.
        println!("upload proxy on https://{}", listener.local_addr()?);
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            r = proxy::run(config, client, listener) => Ok(r?),
            _ = tokio::signal::ctrl_c() => Ok(()),
            _ = terminate.recv() => Ok(()),
        }
    })
}
