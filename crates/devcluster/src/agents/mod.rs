//! The development cluster's node agents: plain Kubernetes components that know nothing about
//! CDI. Decisions are pure functions over the objects; the loops around them watch and write.

pub mod kubelet;
pub mod localpath;
pub mod nodes;
pub mod pvcontroller;
pub mod scheduler;
