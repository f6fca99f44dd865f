//! Where an image's bytes come from.

pub mod file;
pub mod http;
