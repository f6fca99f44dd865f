//! Where an image's bytes come from: one module per kind of source, each a [`Source`] (the
//! contract, in [`source`]). The import sees only the trait, so another source is a module here
//! and its `pub mod` line.

pub mod file;
pub mod gcs;
pub mod http;
pub mod oci_archive;
pub mod registry;
pub mod s3;
pub mod source;
pub mod stream;

pub use file::FileSource;
pub use http::HttpSource;
pub use source::{Opened, RangeReader, Source, StartStream};
pub use stream::StreamSource;
