//! Kubeconfigs for the server's clients, and the private files they are written to.

/// How a kubeconfig's user proves who it is.
pub enum KubeconfigUser<'a> {
    /// A bearer token (the admin's, or a ServiceAccount's).
    Token(&'a str),
    /// A client certificate and its key, both PEM, signed by the cluster's CA.
    Certificate { cert_pem: &'a str, key_pem: &'a str },
}

/// A kubeconfig for a client of the server at `url`, trusting `ca_pem` for an `https://` one.
pub fn kubeconfig(url: &str, ca_pem: Option<&str>, user: &KubeconfigUser) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let ca = ca_pem
        .map(|pem| format!("\n    certificate-authority-data: {}", b64(pem)))
        .unwrap_or_default();
    let credentials = match user {
        KubeconfigUser::Token(token) => format!("token: {token}"),
        KubeconfigUser::Certificate { cert_pem, key_pem } => format!(
            "client-certificate-data: {}\n    client-key-data: {}",
            b64(cert_pem),
            b64(key_pem)
        ),
    };
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cdi-dev\n  cluster:\n    server: {url}{ca}\nusers:\n- name: cdi-dev\n  user:\n    {credentials}\ncontexts:\n- name: cdi-dev\n  context:\n    cluster: cdi-dev\n    user: cdi-dev\n    namespace: default\ncurrent-context: cdi-dev\n"
    )
}

/// Write a file only its owner may read (a kubeconfig holds credentials).
pub fn write_private(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its mode through open: narrow it too.
    file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    file.write_all(contents.as_bytes())
}
