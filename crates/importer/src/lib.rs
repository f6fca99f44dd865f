//! cdi-importer: turns a source (HTTP, registry, upload, file) into a raw disk image on a
//! Kubernetes volume, streaming and without scratch space where the format allows.

pub mod error;
pub mod probe;
pub mod qcow2;
pub mod reader;
pub mod writer;

pub use error::ImportError;
