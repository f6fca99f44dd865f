//! The controller's certificates and keys: the names of the upload path's Secrets and
//! ConfigMaps ([`names`]), making and rotating certificates ([`certs`]), the CAs as last read
//! ([`cache`]), and the clone token keys ([`tokens`]).

pub mod cache;
pub mod certs;
pub mod names;
pub mod tokens;
