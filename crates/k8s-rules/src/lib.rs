//! Kubernetes' own small rules, as the API server and kubelet apply them: resource quantities,
//! object and event names, taint tolerations. They know nothing of CDI; both the product crates
//! and the development cluster's simulator take them from here, so each rule exists once.

pub mod naming;
pub mod quantity;
pub mod toleration;

pub use quantity::Quantity;
