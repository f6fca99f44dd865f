//! cdi-core: every decision of cdi-rs as a pure function over plain data.
//!
//! No I/O, no async, no Kubernetes client: the controllers observe, call into this crate to
//! decide, and act on the answer. That is where the bugs would be, so that is where the tests
//! are.

pub mod admission;
pub mod capabilities;
pub mod claims;
pub mod clone;
pub mod clonepop;
pub mod clonewait;
pub mod config;
pub mod customize;
pub mod dataimportcron;
pub mod datasource;
pub mod datavolume;
pub mod devpod;
pub mod doctor;
pub mod dvstatus;
pub mod first_consumer;
pub mod hostclone;
pub mod import;
pub mod install;
pub mod monitoring;
pub mod placement;
pub mod populator;
pub mod rbac;
pub mod render;
pub mod size;
pub mod source;
pub mod storageprofile;
pub mod upload;

pub use k8s_rules::{Quantity, naming, quantity};
pub use size::{ClaimApi, MIB, Overhead, VolumeMode};
