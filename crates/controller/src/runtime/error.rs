//! Why a reconcile failed, said in one line, and the kind of failure the metrics count.

/// Why a reconcile failed; it is retried.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{}", said(.0))]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Other(String),
    /// A bug met something it did not expect: the pass is abandoned and retried, the other
    /// objects and controllers carry on.
    #[error("reconcile panicked: {0}")]
    Panicked(String),
}

/// A kube error in one line: the API server's refusal by its message, reason and code (kube's
/// own text repeats the message with a dump of the whole Status).
fn said(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({}, {})", s.message, s.reason, s.code),
        other => other.to_string(),
    }
}

impl Error {
    /// The kind of failure, as `cdi_rs_reconcile_failures_total` labels it: what an operator
    /// looking at the metric needs to tell apart (routine conflicts from refusals, an API server
    /// unreachable from a bug).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) => match s.code {
                409 => "conflict",
                404 => "not_found",
                403 => "forbidden",
                422 => "invalid",
                429 => "throttled",
                c if c >= 500 => "server",
                _ => "refused",
            },
            Error::Kube(_) => "transport",
            Error::Other(_) => "other",
            Error::Panicked(_) => "panic",
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn api_errors_are_said_once_without_the_status_dump() {
        let status = kube::core::Status::failure(
            "Operation cannot be fulfilled on persistentvolumeclaims \"d\": the object has been modified",
            "Conflict",
        )
        .with_code(409);
        let e = super::Error::from(kube::Error::Api(Box::new(status)));
        assert_eq!(
            e.to_string(),
            "Operation cannot be fulfilled on persistentvolumeclaims \"d\": the object has been modified (Conflict, 409)"
        );
        assert_eq!(e.kind(), "conflict");
    }
}
