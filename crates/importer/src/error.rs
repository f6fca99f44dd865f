//! The importer's error: one line a user can act on, and whether retrying can help.
//!
//! Each message is complete in itself (the pod writes it to its termination log as it is), so no
//! variant also reports its cause as `source()`: a chain printer such as anyhow's `{:#}` would
//! print that cause a second time.

use std::path::PathBuf;

use crate::formats::qcow2::Qcow2Error;

/// Why an import failed.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    // Not named `source`: thiserror would make it the error's source as well as print it.
    #[error("{context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },
    #[error("invalid qcow2 image: {0}")]
    Qcow2(Qcow2Error),
    #[error("a larger PVC is required: image virtual size {virtual_size} > usable {usable}")]
    TooLarge { virtual_size: u64, usable: u64 },
    /// A stream (raw, or compressed) that went on past what the target can hold; how long it
    /// is in all is not known.
    #[error("a larger PVC is required: the image is larger than the usable {usable} bytes")]
    StreamTooLarge { usable: u64 },
    /// A transfer failed: `status` is the HTTP status the server answered, if it answered.
    #[error("{url}: {message}")]
    Http {
        url: String,
        status: Option<u16>,
        message: String,
    },
    #[error("checksum mismatch: expected {expected}, the download has {actual}")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("the image is damaged: {0}")]
    Damaged(String),
    #[error("{0}")]
    Unsupported(String),
    /// The image must be copied to scratch space first and the pod has none: upstream's contract
    /// for asking the controller for a scratch claim. Says why.
    #[error("scratch space required and none found: {0}")]
    ScratchRequired(String),
    /// A qcow2 image read in order that cannot be converted as it arrives (see
    /// `formats::qcow2::stream`): it is read again through scratch.
    #[error("the image cannot be converted as it streams in: {0}")]
    NotStreamable(String),
    /// The pod's environment or volumes do not describe an import that can run (a setting that
    /// does not parse, a source kind this importer lacks, an archive for a Block volume).
    #[error("{0}")]
    Config(String),
    #[error("internal error: {0}")]
    Internal(String),
    #[error(
        "{} and {} are the same file: importing would overwrite the image while reading it; write to another file",
        image.display(),
        target.display()
    )]
    SameFile { image: PathBuf, target: PathBuf },
}

// By hand rather than `#[from]`, which would also make the qcow2 error the source.
impl From<Qcow2Error> for ImportError {
    fn from(e: Qcow2Error) -> Self {
        ImportError::Qcow2(e)
    }
}

/// Whether a character changes what a terminal shows around it, or hides: control characters
/// and Unicode's invisible format characters (bidirectional overrides, zero-width spaces, the
/// byte order mark), which untrusted text must not carry into a terminal or a log.
pub fn is_deceptive(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{ad}' | '\u{61c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}')
}

/// A reader's error text made safe to show: decoders quote the bytes they could not read (a tar
/// header of random bytes, say), which must not reach a terminal or a log as they are. Anything
/// but printable ASCII is escaped, and the text is cut at 300 characters.
pub fn printable(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == 300 {
            out.push('…');
            break;
        }
        if c.is_ascii_graphic() || c == ' ' {
            out.push(c);
        } else {
            out.extend(c.escape_default());
        }
    }
    out
}

/// Statuses worth another attempt: 408, 429 and server errors. Other 4xx (and anything odd the
/// server sends) are its answer.
pub fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500..=599)
}

impl ImportError {
    pub fn io(context: impl Into<String>, error: std::io::Error) -> Self {
        ImportError::Io {
            context: context.into(),
            error,
        }
    }

    /// Transfer errors worth another attempt: a dropped connection, a stall, a 5xx, 408, 429.
    pub fn is_retryable(&self) -> bool {
        match self {
            ImportError::Http { status, .. } => status.is_none_or(retryable_status),
            ImportError::Io { .. } => true,
            _ => false,
        }
    }

    /// What a failed read of the image stream means: the transfer's own error when the stream's
    /// source put one there (see `http::StreamReader`), else damage found while `context` (a
    /// decompressor, the source) was read.
    pub fn from_read(context: &str, error: std::io::Error) -> ImportError {
        if !error
            .get_ref()
            .is_some_and(|inner| inner.is::<ImportError>())
        {
            return ImportError::Damaged(format!("{context}: {}", printable(&error.to_string())));
        }
        match error
            .into_inner()
            .map(|inner| inner.downcast::<ImportError>())
        {
            Some(Ok(transfer)) => *transfer,
            _ => ImportError::Internal(format!("{context}: a read error went missing")),
        }
    }

    /// Why the import failed, as the termination message says it: by the error's kind (and
    /// HTTP status, errno), never by its text.
    pub fn reason(&self) -> cdi_api::FailureReason {
        use cdi_api::FailureReason as R;
        match self {
            ImportError::Qcow2(_) | ImportError::Unsupported(_) | ImportError::SameFile { .. } => {
                R::ImageRefused
            }
            ImportError::TooLarge { .. } | ImportError::StreamTooLarge { .. } => R::ImageTooLarge,
            ImportError::Config(_) => R::Misconfigured,
            ImportError::ChecksumMismatch { .. } => R::ChecksumMismatch,
            ImportError::Http {
                status: Some(s), ..
            } if !retryable_status(*s) => R::SourceRefused,
            ImportError::Io { error, .. }
                if matches!(
                    rustix::io::Errno::from_io_error(error),
                    Some(
                        rustix::io::Errno::NOSPC
                            | rustix::io::Errno::DQUOT
                            | rustix::io::Errno::FBIG
                    )
                ) =>
            {
                R::NoSpace
            }
            _ => R::Transient,
        }
    }

    /// Errors no retry can fix: the pod should not be restarted for them.
    pub fn is_fatal(&self) -> bool {
        self.reason().is_fatal()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message as a chain printer shows it: the error, then each source.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut text = e.to_string();
        let mut source = e.source();
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        text
    }

    #[test]
    fn what_a_decoder_quotes_is_made_printable() {
        let err = ImportError::from_read(
            "unpacking the archive",
            std::io::Error::other(
                "numeric field was not a number: \u{1b}[2J\u{7}\0 when getting cksum",
            ),
        );
        let text = err.to_string();
        assert!(!text.chars().any(is_deceptive), "{text:?}");
        let bidi = ImportError::from_read("x", std::io::Error::other("abc\u{202e}txt\u{200b}Ø"));
        assert!(!bidi.to_string().chars().any(is_deceptive), "{bidi}");
        assert!(
            bidi.to_string()
                .ends_with("abc\\u{202e}txt\\u{200b}\\u{d8}"),
            "{bidi}"
        );
        assert!(text.contains("\\u{1b}[2J"), "{text}");
        let long = ImportError::from_read("x", std::io::Error::other("y".repeat(1000)));
        assert!(long.to_string().chars().count() < 340);
    }

    #[test]
    fn every_cause_is_printed_once() {
        let efbig = ImportError::io("resizing disk.img", std::io::Error::from_raw_os_error(27));
        let text = chain(&efbig);
        assert_eq!(text.matches("os error 27").count(), 1, "{text}");
        assert!(text.starts_with("resizing disk.img: "), "{text}");

        let qcow2 = ImportError::from(Qcow2Error::Encrypted);
        let text = chain(&qcow2);
        assert_eq!(text.matches("encrypted").count(), 1, "{text}");
        assert!(text.starts_with("invalid qcow2 image: "), "{text}");

        let l1 = ImportError::from(Qcow2Error::Invalid(
            "the L1 table of 99 bytes is larger than qemu allows".into(),
        ));
        let text = chain(&l1);
        assert_eq!(text.matches("invalid").count(), 1, "{text}");
        assert_eq!(text.matches("qcow2").count(), 1, "{text}");
    }
}
