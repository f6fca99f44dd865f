//! cdi-importer: turns an image from a source into a raw disk image on a Kubernetes volume (or,
//! for `cdi import`, a local file or block device), streaming and without scratch space where
//! the format allows.
//!
//! - [`sources`]: where the bytes come from, behind the [`sources::Source`] trait: an HTTP(S)
//!   URL or a local file. A blank image has no source ([`pod`] makes it).
//! - [`formats`]: what the bytes are: raw, ISO and qcow2 converted natively; vmdk, vdi, vhd and
//!   vhdx through qemu-img.
//! - The rest is neither: the import itself ([`import`]) with the tuning and progress every
//!   conversion shares ([`convert`]), the target [`writer`], transfer [`buffer`]s,
//!   [`checksum`]s, tar [`archive`]s, the pod contract ([`pod`]), the progress [`metrics`] and
//!   the [`error`]; the helpers the import and the formats share for reading a stream in order
//!   (`reading`) and for blocking work (`task`); and the target side of a host-assisted [`clone`], which copies bytes as
//!   they are.

pub mod archive;
pub mod buffer;
pub mod checksum;
pub mod clone;
pub mod convert;
pub mod error;
pub mod formats;
pub mod import;
pub mod metrics;
pub mod pod;
mod reading;
pub mod sources;
mod task;
pub mod writer;

pub use error::ImportError;
// The paths crates/cli and the tests name.
pub use formats::probe;
pub use formats::qcow2::write as qcow2_write;
pub use sources::http;
