//! The clone populator under its path from before the clone decisions shared a
//! folder: it lives in [`crate::clone::populator`], whose public items are re-exported here so
//! that `cdi_core::clonepop` paths keep working.

pub use crate::clone::populator::*;
