//! What the agent tests share: an API server with the default nodes, a whole development
//! cluster, and waiting for a state.

use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use kubesim::agents::nodes::default_nodes;
use kubesim::apiserver::ApiServer;

/// An API server holding the default nodes, and an in-process client for it.
#[allow(dead_code)] // not every test crate uses it
pub async fn with_nodes() -> (ApiServer, Client) {
    let server = ApiServer::new();
    let client = Client::new(server.router(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    for (i, n) in default_nodes().iter().enumerate() {
        nodes
            .create(&PostParams::default(), &n.node(i))
            .await
            .unwrap();
    }
    (server, client)
}

/// Poll `check` until it gives a value; fail after 30 s naming `what`.
#[allow(dead_code)] // not every test crate uses it
pub async fn wait_for<T>(what: &str, mut check: impl AsyncFnMut() -> Option<T>) -> T {
    // Generous: CI runs the suites side by side on two cores; a pass returns as soon as it can.
    for _ in 0..600 {
        if let Some(v) = check().await {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not reached in 30 s");
}

/// A whole development cluster (`cluster::start`) in a temporary directory, its agents looking
/// every 30 ms and its kubelets restarting containers after 100 ms (at most 400 ms).
#[allow(dead_code)] // not every test crate uses it
pub async fn cluster() -> (tempfile::TempDir, kubesim::cluster::Running) {
    let dir = tempfile::tempdir().unwrap();
    let running = cluster_in(dir.path()).await;
    (dir, running)
}

/// The same, its state in `dir`.
#[allow(dead_code)] // not every test crate uses it
pub async fn cluster_in(dir: &std::path::Path) -> kubesim::cluster::Running {
    use kubesim::agents::kubelet::{Backoff, KubeletConfig};
    let mut config =
        kubesim::cluster::Config::new(dir.to_path_buf(), "127.0.0.1:0".parse().unwrap());
    config.every = Duration::from_millis(30);
    config.kubelet = KubeletConfig {
        backoff: Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_millis(400),
        },
        ..Default::default()
    };
    kubesim::cluster::start(&config).await.unwrap()
}

/// Serve `app` over TLS with `config` on `listener` until the task is dropped (a webhook or
/// extension server of a test).
#[allow(dead_code)] // not every test crate uses it
pub fn serve_tls(
    listener: tokio::net::TcpListener,
    config: std::sync::Arc<rustls::ServerConfig>,
    app: axum::Router,
) -> tokio::task::JoinHandle<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper_util::service::TowerToHyperService::new(app);
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
            });
        }
    })
}

/// A fresh CA and a server certificate it signed for `names`: (CA PEM, rustls config builder's
/// certificate chain and key).
#[allow(dead_code)] // not every test crate uses it
pub fn test_ca(
    names: &[&str],
) -> (
    String,
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
    (
        ca.pem(),
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
}

/// An HTTP client that trusts the server's CA and sends the admin's token with every request.
#[allow(dead_code)] // not every test crate uses it
pub fn admin_client(server: &ApiServer) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let token = format!("Bearer {}", server.admin_token());
    headers.insert(
        reqwest::header::AUTHORIZATION,
        token.parse().expect("a token is a header value"),
    );
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(server.ca_pem().as_bytes()).unwrap())
        .default_headers(headers)
        .build()
        .expect("an HTTP client")
}
