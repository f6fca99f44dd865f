//! The cluster's certificate authority: it signs the API server's serving certificate, which
//! every client trusts through the kubeconfig (and pods through their mounted `ca.crt`).

use std::net::SocketAddr;
use std::sync::Arc;

/// A self-signed CA, made fresh for each server.
pub struct Ca {
    cert_pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

fn tls_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("TLS setup: {e}"))
}

impl Ca {
    pub fn generate() -> std::io::Result<Ca> {
        let key = rcgen::KeyPair::generate().map_err(tls_error)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(tls_error)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "cdi dev cluster CA");
        let cert = params.self_signed(&key).map_err(tls_error)?;
        Ok(Ca {
            cert_pem: cert.pem(),
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// A client certificate for `name` in `groups` (its CN and O), signed by this CA: the
    /// certificate and its key, PEM.
    pub fn client_cert(&self, name: &str, groups: &[&str]) -> std::io::Result<(String, String)> {
        let key = rcgen::KeyPair::generate().map_err(tls_error)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(tls_error)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        if let Some(group) = groups.first() {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *group);
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer).map_err(tls_error)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// The CA certificate clients trust (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A rustls server configuration for a server at `addr`, known also as `localhost`,
    /// `127.0.0.1` and `names`, its certificate signed by this CA; HTTP/2 and HTTP/1.1.
    pub fn server_config(
        &self,
        addr: SocketAddr,
        names: &[&str],
    ) -> std::io::Result<Arc<rustls::ServerConfig>> {
        let key = rcgen::KeyPair::generate().map_err(tls_error)?;
        let mut hosts = vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
            addr.ip().to_string(),
        ];
        hosts.extend(names.iter().map(|n| n.to_string()));
        hosts.dedup();
        let params = rcgen::CertificateParams::new(hosts).map_err(tls_error)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(tls_error)?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .map_err(tls_error)?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }
}
