//! cdi-importer: turns a source (an HTTP(S) URL or a local file; nothing for a blank image) into
//! a raw disk image on a Kubernetes volume, streaming and without scratch space where the format
//! allows.

pub mod archive;
pub mod buffer;
pub mod checksum;
pub mod convert;
pub mod error;
pub mod formats;
pub mod import;
pub mod metrics;
pub mod pod;
pub mod sources;
pub mod writer;

pub use error::ImportError;
// The paths crates/cli and the tests name.
pub use formats::probe;
pub use formats::qcow2::write as qcow2_write;
pub use sources::http;
