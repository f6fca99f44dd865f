//! An in-memory Kubernetes API server, faithful enough to Kubernetes' API semantics that kube-rs
//! controllers and kubectl run against it unchanged (SPEC §7).

pub mod decode;
pub mod errors;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod protobuf;
pub mod rbac;
pub mod registry;
pub mod schema;
pub mod selector;
pub mod server;
pub mod store;
pub mod table;
pub mod validation;
pub mod view;

pub use server::{ApiServer, PV_PROTECTION, PVC_PROTECTION};

/// A kubeconfig for clients of a server at `url`. The server trusts loopback; the token is there
/// only so that kubectl does not prompt for credentials over https.
pub fn kubeconfig(url: &str) -> String {
    kubeconfig_with_ca(url, None)
}

/// A kubeconfig that trusts `ca_pem` for an `https://` server.
pub fn kubeconfig_with_ca(url: &str, ca_pem: Option<&str>) -> String {
    use base64::Engine;
    let ca = ca_pem
        .map(|pem| {
            format!(
                "\n    certificate-authority-data: {}",
                base64::engine::general_purpose::STANDARD.encode(pem)
            )
        })
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cdi-dev\n  cluster:\n    server: {url}{ca}\nusers:\n- name: cdi-dev\n  user:\n    token: cdi-dev\ncontexts:\n- name: cdi-dev\n  context:\n    cluster: cdi-dev\n    user: cdi-dev\n    namespace: default\ncurrent-context: cdi-dev\n"
    )
}
