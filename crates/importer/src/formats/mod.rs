//! What an image's bytes are.

pub mod probe;
pub mod qcow2;
pub mod qemu;
