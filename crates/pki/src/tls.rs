//! Serving TLS: a rustls server configuration from PEM material (client certificates verified
//! against a CA when one is given), material followed as it is renewed, and the common name a
//! verified client certificate carries.

use std::sync::Arc;

/// The server's TLS material (PEM).
#[derive(Debug, Clone)]
pub struct Tls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    /// The CA client certificates must be signed by; without it no client is verified, and
    /// uploads are refused.
    pub client_ca_pem: Option<Vec<u8>>,
}

/// The rustls configuration: the server's certificate, and client certificates verified against
/// the client CA when one is given (but not required: the readiness probe has none).
pub fn tls_config(tls: &Tls) -> Result<Arc<rustls::ServerConfig>, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_slice_iter(&tls.cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("TLS_CERT_FILE: {e}"))?;
    let key =
        PrivateKeyDer::from_pem_slice(&tls.key_pem).map_err(|e| format!("TLS_KEY_FILE: {e}"))?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?;
    let builder = match &tls.client_ca_pem {
        Some(pem) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pem) {
                let cert = cert.map_err(|e| format!("CLIENT_CERT_FILE: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("CLIENT_CERT_FILE: {e}"))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| format!("CLIENT_CERT_FILE: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("TLS_CERT_FILE/TLS_KEY_FILE: {e}"))?;
    // HTTP/1.1 only: an upload is one long stream (HTTP/2's flow control only slows it), and a
    // refusal answered before the body is read ends an HTTP/2 stream with a reset that clients
    // such as curl report as a failure instead of the answer.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// What is built from TLS material that may be replaced while serving (a rotated
/// certificate): the next connections take what the newest material built; material that
/// cannot be used is logged and what was built before is kept.
pub struct Following<T>(Arc<std::sync::RwLock<Arc<T>>>);

impl<T> Clone for Following<T> {
    fn clone(&self) -> Self {
        Following(self.0.clone())
    }
}

impl<T: Send + Sync + 'static> Following<T> {
    /// Built from `material` now (an error if it cannot be), then again on each change.
    pub fn new<M, F>(
        mut material: tokio::sync::watch::Receiver<M>,
        what: &'static str,
        build: F,
    ) -> Result<Following<T>, String>
    where
        M: Clone + Send + Sync + 'static,
        F: Fn(&M) -> Result<T, String> + Send + 'static,
    {
        let first = build(&material.borrow_and_update().clone())?;
        let shared = Following(Arc::new(std::sync::RwLock::new(Arc::new(first))));
        let inner = shared.clone();
        tokio::spawn(async move {
            while material.changed().await.is_ok() {
                let next = material.borrow_and_update().clone();
                match build(&next) {
                    Ok(built) => {
                        *inner.0.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(built);
                        tracing::info!("now using the new {what}");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "the new {what} cannot be used; keeping the one before")
                    }
                }
            }
        });
        Ok(shared)
    }

    pub fn get(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// The common name of a (verified) client certificate.
pub fn common_name(der: &[u8]) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?;
    cn.as_str().ok().map(str::to_string)
}

/// Serve one accepted connection: the TLS handshake, then HTTP/1.1 or HTTP/2 (as ALPN and the
/// client's preface say) with `handle`, which is given each request and the common name of the
/// client's verified certificate, if it showed one. A failed handshake (a port scan, a probe
/// speaking plain HTTP) ends the connection quietly. Under `graceful`, a shutdown waits for the
/// connection's requests under way.
pub async fn serve_connection<H, F, B>(
    tcp: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    handle: H,
    graceful: Option<hyper_util::server::graceful::Watcher>,
) where
    H: Fn(hyper::Request<hyper::body::Incoming>, Option<String>) -> F + Send + Sync + 'static,
    F: std::future::Future<Output = hyper::Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let Ok(tls) = acceptor.accept(tcp).await else {
        return;
    };
    let client_cn = tls
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .and_then(|c| common_name(c));
    let handle = Arc::new(handle);
    let service = hyper::service::service_fn(move |req| {
        let reply = handle(req, client_cn.clone());
        async move { Ok::<_, std::convert::Infallible>(reply.await) }
    });
    let builder =
        hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), service);
    let _ = match graceful {
        Some(watcher) => watcher.watch(conn.into_owned()).await,
        None => conn.await,
    };
}

/// Accept connections on `listener` until it fails, serving each on a task of its own as
/// [`serve_connection`] does, with the acceptor `acceptor` gives at the time (so a renewed
/// certificate serves the next connections). Returns the listener's error.
pub async fn serve<A, H, F, B>(
    listener: tokio::net::TcpListener,
    acceptor: A,
    handle: H,
) -> std::io::Error
where
    A: Fn() -> tokio_rustls::TlsAcceptor,
    H: Fn(hyper::Request<hyper::body::Incoming>, Option<String>) -> F
        + Clone
        + Send
        + Sync
        + 'static,
    F: std::future::Future<Output = hyper::Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    loop {
        match listener.accept().await {
            Ok((tcp, _)) => {
                tokio::spawn(serve_connection(tcp, acceptor(), handle.clone(), None));
            }
            Err(e) => return e,
        }
    }
}
