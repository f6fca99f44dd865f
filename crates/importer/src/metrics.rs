//! A worker's progress metric, served over HTTPS (self-signed) as upstream's importer and cloner
//! do: `kubevirt_cdi_import_progress_total{ownerUID="…"} <percent>` (or the cloner's
//! `kubevirt_cdi_clone_progress_total`) on `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, StatusCode};

use crate::convert::Progress;
use crate::error::ImportError;

/// A progress metric: its name and help text, as upstream's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
}

/// The importer's.
pub const IMPORT_PROGRESS: Metric = Metric {
    name: "kubevirt_cdi_import_progress_total",
    help: "The import progress in percentage",
};

/// The cloner's (the source side of a host-assisted clone).
pub const CLONE_PROGRESS: Metric = Metric {
    name: "kubevirt_cdi_clone_progress_total",
    help: "The clone progress in percentage",
};

/// The answer to a request for `path`: the exposition text `body` on `/metrics`, else 404.
fn page(path: &str, body: String) -> Response<Full<Bytes>> {
    let response = if path == "/metrics" {
        Response::builder()
            .header("Content-Type", "text/plain; version=0.0.4")
            .body(Full::new(Bytes::from(body)))
    } else {
        Response::builder()
            .status(StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::new()))
    };
    response.expect("a static response")
}

/// The exposition text for the current progress.
pub fn render(metric: Metric, owner_uid: &str, progress: &Progress) -> String {
    let total = progress.total.load(Ordering::Relaxed);
    let done = progress.done.load(Ordering::Relaxed);
    let percent = if total == 0 {
        0.0
    } else {
        (done as f64 * 100.0 / total as f64).min(100.0)
    };
    // Label values are escaped as the text format requires.
    let uid = owner_uid
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n");
    let Metric { name, help } = metric;
    format!(
        "# HELP {name} {help}\n# TYPE {name} counter\n{name}{{ownerUID=\"{uid}\"}} {percent:.2}\n"
    )
}

/// A TLS acceptor with a fresh self-signed certificate.
fn acceptor() -> Result<tokio_rustls::TlsAcceptor, ImportError> {
    let key = rcgen::KeyPair::generate()
        .map_err(|e| ImportError::Internal(format!("metrics key: {e}")))?;
    let cert = rcgen::CertificateParams::new(vec!["cdi-importer".to_string()])
        .and_then(|p| p.self_signed(&key))
        .map_err(|e| ImportError::Internal(format!("metrics certificate: {e}")))?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .and_then(|b| {
        b.with_no_client_auth().with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
    })
    .map_err(|e| ImportError::Internal(format!("metrics TLS: {e}")))?;
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Serve `/metrics` on `addr` over TLS with a fresh self-signed certificate until the returned
/// task is aborted. Returns the bound address (for port 0). The certificate is made when the
/// first connection arrives: its key is the process's first use of aws-lc's random generator,
/// whose seeding costs tens of milliseconds of CPU, and an import that ends before anyone
/// scrapes it (most small ones) should not pay that.
pub async fn serve(
    metric: Metric,
    addr: SocketAddr,
    owner_uid: String,
    progress: Arc<Progress>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ImportError> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ImportError::io(format!("listening on {addr}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ImportError::io("metrics address", e))?;
    let tls_acceptor = Arc::new(tokio::sync::OnceCell::new());
    let task = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (tls_acceptor, progress, uid) =
                (tls_acceptor.clone(), progress.clone(), owner_uid.clone());
            tokio::spawn(async move {
                let made = tls_acceptor
                    .get_or_try_init(|| async {
                        tokio::task::spawn_blocking(acceptor)
                            .await
                            .map_err(|e| ImportError::Internal(e.to_string()))?
                    })
                    .await;
                let acceptor = match made {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "the progress metric is not served");
                        return;
                    }
                };
                let handler = move |req: Request<hyper::body::Incoming>, _| {
                    let body = render(metric, &uid, &progress);
                    async move { page(req.uri().path(), body) }
                };
                cdi_pki::tls::serve_connection(stream, acceptor.clone(), handler, None).await;
            });
        }
    });
    Ok((bound, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition() {
        let p = Progress::default();
        p.total.store(400, Ordering::Relaxed);
        p.add(181);
        assert_eq!(
            render(IMPORT_PROGRESS, "5e1d", &p).lines().last().unwrap(),
            "kubevirt_cdi_import_progress_total{ownerUID=\"5e1d\"} 45.25"
        );
        assert!(
            render(CLONE_PROGRESS, "a\"b", &Progress::default())
                .contains("ownerUID=\"a\\\"b\"} 0.00")
        );
    }
}
