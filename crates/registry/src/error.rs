//! Why a registry image could not be read. Each variant prints exactly what the importer's
//! `ImportError` printed for it before the client moved here (the importer maps `Reference` to
//! `Config`, `Pull` to `Http` and `Unsupported` to itself), so the importer and the controller
//! show the same words.

/// A registry failure, as one line a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The URL names no registry image.
    #[error("{0}")]
    Reference(String),
    /// The registry failed or refused: `status` is the HTTP status it answered, if it did.
    #[error("{url}: {message}")]
    Pull {
        url: String,
        status: Option<u16>,
        message: String,
    },
    /// The image is there but holds nothing to read for what was asked (no entry for the
    /// architecture, an index inside the index).
    #[error("{0}")]
    Unsupported(String),
}

/// An error and its causes on one line (reqwest hides the useful part in its sources).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

/// A registry error as an import reports it: the image, and the status when there is one.
pub(crate) fn pull_failed(url: &str, e: oci_client::errors::OciDistributionError) -> Error {
    use oci_client::errors::OciDistributionError as E;
    let status = match &e {
        E::UnauthorizedError { .. } | E::AuthenticationFailure(_) => Some(401),
        E::ServerError { code, .. } => Some(*code),
        E::ImageManifestNotFoundError(_) => Some(404),
        E::RegistryError { envelope, .. } => envelope
            .errors
            .iter()
            .any(|e| {
                matches!(
                    e.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::BlobUnknown
                )
            })
            .then_some(404),
        _ => None,
    };
    let hint = match status {
        Some(401) => {
            "; the registry refused the credentials (or wants some): check the Secret \
             named by spec.source.registry.secretRef (accessKeyId, secretKey)"
        }
        Some(404) => "; check the image's name and tag",
        _ => "",
    };
    // "failed to pull image" is what upstream's controller reads as ImagePullFailed.
    Error::Pull {
        url: url.to_string(),
        status,
        message: format!("failed to pull image: {}{hint}", chain(&e)),
    }
}
