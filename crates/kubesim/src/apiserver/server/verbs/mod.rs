//! The verbs on collections and objects, one family a file.

pub(super) mod create;
pub(super) mod delete;
pub(super) mod get;
pub(super) mod update;
pub(super) mod watch;
