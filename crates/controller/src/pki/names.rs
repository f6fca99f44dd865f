//! The names of the upload path's certificates, CAs, bundles and the token signing key: the
//! Secrets and ConfigMaps the operator makes and rotates, and the controller reads.

/// The Secret holding the CA of upload servers' certificates.
pub const SERVER_SIGNER: &str = "cdi-uploadserver-signer";
/// The Secret holding the CA of the upload proxy's client certificate.
pub const CLIENT_SIGNER: &str = "cdi-uploadserver-client-signer";
/// The upload proxy's client certificate (`tls.crt`, `tls.key`).
pub const CLIENT_CERT: &str = "cdi-uploadserver-client-cert";
/// The ConfigMap (key `ca-bundle.crt`) with the CA the proxy verifies upload servers by.
pub const SERVER_SIGNER_BUNDLE: &str = "cdi-uploadserver-signer-bundle";
pub const CLIENT_SIGNER_BUNDLE: &str = "cdi-uploadserver-client-signer-bundle";
pub const BUNDLE_KEY: &str = "ca-bundle.crt";
/// The key `cdi apiserver` signs upload tokens with and the upload proxy checks them by
/// (upstream's Secret and key names; the key is ECDSA P-256 here).
pub const SIGNING_KEY: &str = "cdi-api-signing-key";
pub const SIGNING_KEY_PRIVATE: &str = "id_rsa";
pub const SIGNING_KEY_PUBLIC: &str = "id_rsa.pub";
/// The CA of the upload proxy's serving certificate, the certificate, and the CA's bundle.
pub const PROXY_SIGNER: &str = "cdi-uploadproxy-signer";
pub const PROXY_CERT: &str = "cdi-uploadproxy-server-cert";
pub const PROXY_SIGNER_BUNDLE: &str = "cdi-uploadproxy-signer-bundle";
/// The upload proxy's Service (its certificate names it, and its cluster IP when it has one).
pub const PROXY_SERVICE: &str = "cdi-uploadproxy";
/// The same for the token API (`cdi apiserver`), whose APIService names Service `cdi-api`.
pub const API_SIGNER: &str = "cdi-apiserver-signer";
pub const API_CERT: &str = "cdi-apiserver-server-cert";
pub const API_SIGNER_BUNDLE: &str = "cdi-apiserver-signer-bundle";
pub const API_SERVICE: &str = "cdi-api";
