//! cdi-importer: turns a source (an HTTP(S) URL or a local file; nothing for a blank image) into
//! a raw disk image on a Kubernetes volume, streaming and without scratch space where the format
//! allows.

pub mod archive;
pub mod buffer;
pub mod checksum;
pub mod convert;
pub mod error;
pub mod http;
pub mod import;
pub mod metrics;
pub mod pod;
pub mod probe;
pub mod qcow2;
pub mod qcow2_write;
pub mod qemu;
pub mod reader;
pub mod writer;

pub use error::ImportError;
