//! The certificates of the upload path: a CA that signs each upload server's serving certificate
//! (the proxy trusts it), and a CA that signs the proxy's client certificate (each upload server
//! trusts it). How long each lives and when it is made again is `rotation`'s.

use std::time::{Duration, SystemTime};

/// How long a CA is valid when nobody rotates it (a controller run without an operator).
pub const CA_LIFETIME: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long an upload server's certificate is valid (upstream's default).
pub const SERVER_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// How long a client certificate is valid when nobody rotates it.
pub const CLIENT_LIFETIME: Duration = CA_LIFETIME;

#[derive(Debug, thiserror::Error)]
#[error("certificate: {0}")]
pub struct PkiError(String);

fn pki_error(e: impl std::fmt::Display) -> PkiError {
    PkiError(e.to_string())
}

/// A certificate and its key, PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A CA able to sign.
pub struct Ca {
    pub pair: KeyPair,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

fn validity(params: &mut rcgen::CertificateParams, lifetime: Duration) {
    let now = SystemTime::now();
    // A little in the past: clocks of the signer and the checker differ.
    params.not_before = (now - Duration::from_secs(300)).into();
    params.not_after = (now + lifetime).into();
}

impl Ca {
    /// A new self-signed CA named `name`.
    pub fn generate(name: &str, lifetime: Duration) -> Result<Ca, PkiError> {
        let key = rcgen::KeyPair::generate().map_err(pki_error)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        validity(&mut params, lifetime);
        let cert = params.self_signed(&key).map_err(pki_error)?;
        Ok(Ca {
            pair: KeyPair {
                cert_pem: cert.pem(),
                key_pem: key.serialize_pem(),
            },
            issuer: rcgen::Issuer::new(params, key),
        })
    }

    /// A CA kept earlier (a Secret's `tls.crt` and `tls.key`).
    pub fn from_pem(pair: KeyPair) -> Result<Ca, PkiError> {
        let key = rcgen::KeyPair::from_pem(&pair.key_pem).map_err(pki_error)?;
        let issuer = rcgen::Issuer::from_ca_cert_pem(&pair.cert_pem, key).map_err(pki_error)?;
        Ok(Ca { pair, issuer })
    }

    /// A serving certificate for `names` (DNS names or IP addresses).
    pub fn server_cert(&self, names: &[String], lifetime: Duration) -> Result<KeyPair, PkiError> {
        let key = rcgen::KeyPair::generate().map_err(pki_error)?;
        let mut params = rcgen::CertificateParams::new(names.to_vec()).map_err(pki_error)?;
        if let Some(first) = names.first() {
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, first.as_str());
        }
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params, lifetime);
        let cert = params.signed_by(&key, &self.issuer).map_err(pki_error)?;
        Ok(KeyPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A client certificate with common name `name`.
    pub fn client_cert(&self, name: &str, lifetime: Duration) -> Result<KeyPair, PkiError> {
        let key = rcgen::KeyPair::generate().map_err(pki_error)?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(pki_error)?;
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params, lifetime);
        let cert = params.signed_by(&key, &self.issuer).map_err(pki_error)?;
        Ok(KeyPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_ca_signs_as_the_new_one_did() {
        let ca = Ca::generate("cdi-uploadserver-client-signer", CA_LIFETIME).unwrap();
        let again = Ca::from_pem(ca.pair.clone()).unwrap();
        let client = again
            .client_cert("client.upload-server.cdi.kubevirt.io", CLIENT_LIFETIME)
            .unwrap();
        use rustls::pki_types::pem::PemObject;
        let der =
            rustls::pki_types::CertificateDer::from_pem_slice(client.cert_pem.as_bytes()).unwrap();
        assert_eq!(
            crate::tls::common_name(&der).as_deref(),
            Some("client.upload-server.cdi.kubevirt.io")
        );
        assert!(
            Ca::from_pem(KeyPair {
                cert_pem: "nonsense".into(),
                key_pem: ca.pair.key_pem.clone()
            })
            .is_err()
        );
    }
}
