//! The host-assisted clone's data path, for `scripts/bench-clone`: `cdi cloner`'s sender packs
//! the directory SOURCE and an upload server writes it into the empty directory TARGET, over
//! mutual TLS on 127.0.0.1 (fresh CAs), as a source pod and an upload pod do. Prints the seconds
//! it took and the bytes sent.
//!
//!   cargo run --release -p cdi-upload --example clone_bench -- SOURCE TARGET

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cdi_importer::convert::Progress;
use cdi_importer::pod::PodPaths;
use cdi_pki::ca::{self as pki, Ca};
use cdi_upload::cloner::{self, CloneSource, ClonerConfig};
use cdi_upload::server::{self, Config, Tls};

const CLIENT: &str = "bench/source-bench/target";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [source, target] = args.as_slice() else {
        return Err("usage: clone_bench SOURCE_DIR TARGET_DIR".into());
    };
    let target = PathBuf::from(target);
    let server_ca = Ca::generate("server-signer", pki::CA_LIFETIME)?;
    let client_ca = Ca::generate("client-signer", pki::CA_LIFETIME)?;
    let cert = server_ca.server_cert(&["localhost".into()], pki::SERVER_LIFETIME)?;
    let config = Config {
        listen: "127.0.0.1:0".parse()?,
        tls: Tls {
            cert_pem: cert.cert_pem.into_bytes(),
            key_pem: cert.key_pem.into_bytes(),
            client_ca_pem: Some(client_ca.pair.cert_pem.clone().into_bytes()),
        },
        client_name: CLIENT.into(),
        image_size: None,
        overhead: cdi_core::Overhead::ZERO,
        preallocation: false,
        deadline: None,
        paths: PodPaths {
            data_dir: target.clone(),
            block_device: target.join("no-device"),
            scratch_dir: target.join("no-scratch"),
            termination_log: std::env::temp_dir().join("clone-bench-termination-log"),
            data_capacity: Some(u64::MAX / 2),
            ..PodPaths::default()
        },
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let port = listener.local_addr()?.port();
    let served = tokio::spawn(server::run(config, listener));
    let pair = client_ca.client_cert(CLIENT, pki::CLIENT_LIFETIME)?;
    let sender = ClonerConfig {
        url: format!("https://localhost:{port}/v1beta1/upload"),
        client_cert_pem: pair.cert_pem,
        client_key_pem: pair.key_pem,
        server_ca_pem: server_ca.pair.cert_pem.clone(),
        owner_uid: "bench".into(),
        preallocation: false,
        source: CloneSource::Filesystem(source.into()),
    };
    let progress = Arc::new(Progress::default());
    let started = Instant::now();
    cloner::send(&sender, progress.clone()).await?;
    served.await??;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{secs:.3} s, {} bytes sent",
        progress.done.load(Ordering::Relaxed)
    );
    Ok(())
}
