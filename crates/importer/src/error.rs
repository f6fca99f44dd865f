//! The importer's error: one line a user can act on, and whether retrying can help.

use crate::qcow2::Qcow2Error;

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("invalid qcow2 image: {0}")]
    Qcow2(#[from] Qcow2Error),
    #[error("a larger PVC is required: image virtual size {virtual_size} > usable {usable}")]
    TooLarge { virtual_size: u64, usable: u64 },
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("checksum mismatch: expected {expected}, the download has {actual}")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("the image is damaged: {0}")]
    Damaged(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl ImportError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        ImportError::Io {
            context: context.into(),
            source,
        }
    }

    /// Transfer errors worth another attempt: a dropped connection, a stall, a 5xx, 408, 429.
    pub fn is_retryable(&self) -> bool {
        match self {
            ImportError::Http { message, .. } => {
                !message.starts_with("HTTP 4")
                    || message.starts_with("HTTP 408")
                    || message.starts_with("HTTP 429")
            }
            ImportError::Io { .. } => true,
            _ => false,
        }
    }

    /// Errors no retry can fix: the pod should not be restarted for them.
    pub fn is_fatal(&self) -> bool {
        matches!(
            self,
            ImportError::Qcow2(_)
                | ImportError::TooLarge { .. }
                | ImportError::Unsupported(_)
                | ImportError::ChecksumMismatch { .. }
        )
    }
}
