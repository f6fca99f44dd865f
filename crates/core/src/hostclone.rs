//! The host-assisted clone under its path from before the clone decisions shared a
//! folder: it lives in [`crate::clone::host`], whose public items are re-exported here so
//! that `cdi_core::hostclone` paths keep working.

pub use crate::clone::host::*;
