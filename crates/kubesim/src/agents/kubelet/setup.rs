//! Getting a pod ready to run: its volumes resolved to host paths (claims to their volumes'
//! directories or block files; Secrets, ConfigMaps, downward API and emptyDir written into the
//! pod's directory), each container's environment, and each container's root: a directory where
//! its mount paths are links to those volumes and its termination log is a file.

mod blocked;
mod container_root;
mod dirs;
mod env;
mod files;
mod paths;
mod sources;
mod tokens;
mod volumes;

pub use blocked::Blocked;
pub use container_root::{capacities, empty_termination_log, read_termination_log, root};
pub use dirs::{HostVolume, PodDir};
pub use env::{environment, resolv_conf, service_env};
pub use paths::{bad_component, check};
pub use tokens::{renew_tokens, token_lifetime};
pub use volumes::{has_refreshed_volumes, refresh_volumes, volumes};
