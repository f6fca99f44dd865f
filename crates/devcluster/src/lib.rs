//! cdi-devcluster: the embedded development cluster of `cdi dev`.

pub mod agents;
pub mod apiserver;
pub mod cluster;
pub mod story;
