//! An in-memory Kubernetes API server, faithful enough to Kubernetes' API semantics that kube-rs
//! controllers and kubectl run against it unchanged (SPEC §7).

pub mod errors;
pub mod openapi;
pub mod patch;
pub mod registry;
pub mod schema;
pub mod selector;
pub mod server;
pub mod store;
pub mod table;

pub use server::ApiServer;

/// A kubeconfig for clients of a server at `url` (no credentials: the server trusts loopback).
pub fn kubeconfig(url: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: cdi-dev\n  cluster:\n    server: {url}\nusers:\n- name: cdi-dev\n  user: {{}}\ncontexts:\n- name: cdi-dev\n  context:\n    cluster: cdi-dev\n    user: cdi-dev\n    namespace: default\ncurrent-context: cdi-dev\n"
    )
}
