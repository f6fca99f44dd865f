//! cdi-devcluster: the embedded development cluster of `cdi dev`.

pub mod apiserver;
