//! An in-memory Kubernetes API server, faithful enough to Kubernetes' API semantics that kube-rs
//! controllers and kubectl run against it unchanged (docs/dev-cluster.md#the-embedded-api-server).

pub mod admission;
pub mod aggregation;
pub mod auth;
pub mod decode;
pub mod errors;
mod http;
mod kubeconfig;
pub mod metrics;
pub mod openapi;
pub mod patch;
pub mod pki;
pub mod protobuf;
pub mod quota;
pub mod rbac;
pub mod registry;
pub mod schema;
pub mod selector;
pub mod server;
pub mod store;
pub mod table;
pub mod validation;
pub mod view;

pub use kubeconfig::{KubeconfigUser, kubeconfig, write_private};
pub use server::{ApiServer, PV_PROTECTION, PVC_PROTECTION};
