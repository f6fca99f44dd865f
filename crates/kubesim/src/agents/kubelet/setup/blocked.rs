//! Why a pod cannot start yet, as its containers' waiting reason says.

use std::io;

/// Why a pod cannot start yet: something still to come (the container stays
/// `ContainerCreating`), a mistake in the pod (`CreateContainerConfigError`), or an image with
/// nothing to run (`ErrImagePull`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Blocked {
    Waiting(String),
    Config(String),
    /// No program for the image.
    Image(String),
}

impl Blocked {
    pub fn reason(&self) -> &'static str {
        match self {
            Blocked::Waiting(_) => "ContainerCreating",
            Blocked::Config(_) => "CreateContainerConfigError",
            Blocked::Image(_) => "ErrImagePull",
        }
    }

    pub fn message(&self) -> &str {
        match self {
            Blocked::Waiting(m) | Blocked::Config(m) | Blocked::Image(m) => m,
        }
    }
}

pub(super) fn io_blocked(what: &str, e: io::Error) -> Blocked {
    Blocked::Waiting(format!("{what}: {e}"))
}
