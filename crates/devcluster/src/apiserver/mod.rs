//! An in-memory Kubernetes API server, faithful enough to Kubernetes' API semantics that kube-rs
//! controllers and kubectl run against it unchanged (SPEC §7).

pub mod errors;
pub mod patch;
pub mod registry;
pub mod selector;
pub mod server;
pub mod store;

pub use server::ApiServer;
