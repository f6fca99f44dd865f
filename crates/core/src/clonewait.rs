//! A clone waiting for its source under its path from before the clone decisions shared a
//! folder: it lives in [`crate::clone::wait`], whose public items are re-exported here so
//! that `cdi_core::clonewait` paths keep working.

pub use crate::clone::wait::*;
