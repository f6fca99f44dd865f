//! Cloning a PVC, the controller's side (the decisions are `cdi_core::clone`'s): the clone
//! populator that fills a VolumeCloneSource's target by snapshot, CSI clone or host-assisted
//! copy ([`populator`]), the source side of a host-assisted copy and what protects the source
//! meanwhile ([`source`]), and the tokens that authorize a clone from another namespace
//! ([`token`]). See docs/cloning.md.

pub mod populator;
pub mod source;
pub mod token;
