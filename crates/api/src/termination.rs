//! What a worker pod (the importer) says when it ends: its container's termination message. The
//! importer writes it and the import controller reads it, both through this one type, so the
//! contract is checked by the compiler rather than by matching text.
//!
//! The JSON shape is upstream's `common.TerminationMessage` (`scratchSpaceRequired`,
//! `preallocationApplied`, `message`, `labels`), so upstream tools read ours; `reason` is cdi-rs's
//! own addition, left out by upstream's importer, and says why an import failed and whether
//! running it again can help.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Why an import failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureReason {
    /// The image can never be accepted: a backing or external data file, encryption, a header
    /// that lies, a format the importer does not take, an option it refuses.
    ImageRefused,
    /// The image's virtual size is larger than the volume can hold.
    ImageTooLarge,
    /// The download does not have the checksum the DataVolume asked for.
    ChecksumMismatch,
    /// The worker pod's settings do not describe an import that can run (a setting that does
    /// not parse, a source kind this importer lacks): the same pod would fail the same way.
    Misconfigured,
    /// The server refused the request for good (HTTP 4xx other than 408 and 429).
    SourceRefused,
    /// The volume ran out of space (ENOSPC, EDQUOT) while writing.
    NoSpace,
    /// Anything else (a dropped connection, a 5xx, an I/O error): the next attempt may work.
    Transient,
}

impl FailureReason {
    /// Whether running the importer again cannot help: the pod is not restarted, the
    /// DataVolume fails with the message.
    pub fn is_fatal(self) -> bool {
        matches!(
            self,
            FailureReason::ImageRefused
                | FailureReason::Misconfigured
                | FailureReason::ImageTooLarge
                | FailureReason::ChecksumMismatch
        )
    }
}

/// The importer's termination message.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TerminationMessage {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scratch_space_required: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preallocation_applied: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// The upload server ended because its deadline passed before an upload came (its
    /// certificate is due for renewal): the controller makes a new pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_passed: Option<bool>,
    /// Set when the import failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<FailureReason>,
}

/// The largest termination message kubelet keeps (4096 bytes); longer ones are cut.
pub const MAX_TERMINATION_MESSAGE: usize = 4096;

impl TerminationMessage {
    /// A failure: upstream's "Unable to process data: …" message and the reason.
    pub fn failed(reason: FailureReason, error: &str) -> TerminationMessage {
        TerminationMessage {
            message: Some(format!("Unable to process data: {error}")),
            reason: Some(reason),
            ..Default::default()
        }
    }

    /// Whether the pod should not be run again.
    pub fn is_fatal(&self) -> bool {
        self.reason.is_some_and(FailureReason::is_fatal)
    }

    /// The JSON written to the termination log, within kubelet's limit: a message too long for
    /// it is shortened (at a character boundary) so that the JSON stays whole.
    pub fn to_json(&self) -> String {
        let mut out = self.clone();
        loop {
            let json = serde_json::to_string(&out).expect("plain data serialises");
            let Some(message) = out
                .message
                .as_mut()
                .filter(|_| json.len() > MAX_TERMINATION_MESSAGE)
            else {
                return json;
            };
            let excess = json.len() - MAX_TERMINATION_MESSAGE;
            let mut end = message.len().saturating_sub(excess.max(1));
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            if end == 0 && message.is_empty() {
                return json;
            }
            message.truncate(end);
        }
    }

    /// Read what a terminated container left: this JSON, or (upstream's importer on failure,
    /// or anything else) plain text, taken as the message with no reason.
    pub fn parse(text: &str) -> TerminationMessage {
        let text = text.trim();
        if text.starts_with('{')
            && let Ok(m) = serde_json::from_str::<TerminationMessage>(text)
        {
            return m;
        }
        TerminationMessage {
            message: (!text.is_empty()).then(|| text.to_string()),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_shape_with_a_reason() {
        let m = TerminationMessage::failed(FailureReason::ImageRefused, "backing file");
        assert_eq!(
            m.to_json(),
            r#"{"message":"Unable to process data: backing file","reason":"ImageRefused"}"#
        );
        assert_eq!(TerminationMessage::parse(&m.to_json()), m);
        assert!(m.is_fatal());
        assert!(!TerminationMessage::failed(FailureReason::Transient, "x").is_fatal());
        // Upstream's importer: JSON without a reason on success, plain text on failure.
        let upstream = TerminationMessage::parse(
            r#"{"scratchSpaceRequired":false,"preallocationApplied":false,"message":"Import Complete"}"#,
        );
        assert_eq!(upstream.message.as_deref(), Some("Import Complete"));
        assert_eq!(upstream.reason, None);
        let text = TerminationMessage::parse("Unable to process data: checksum mismatch\n");
        assert_eq!(
            text.message.as_deref(),
            Some("Unable to process data: checksum mismatch")
        );
        assert!(!text.is_fatal(), "text is never read for a reason");
        // A reason this build does not know is not a crash: the text is the message.
        let unknown = TerminationMessage::parse(r#"{"message":"m","reason":"Someday"}"#);
        assert_eq!(unknown.reason, None);
        assert_eq!(
            TerminationMessage::parse("  "),
            TerminationMessage::default()
        );
    }

    #[test]
    fn long_messages_are_cut_to_fit_and_stay_json() {
        let long = "é".repeat(5000);
        let m = TerminationMessage::failed(FailureReason::Transient, &long);
        let json = m.to_json();
        assert!(json.len() <= MAX_TERMINATION_MESSAGE, "{}", json.len());
        let back = TerminationMessage::parse(&json);
        assert_eq!(back.reason, Some(FailureReason::Transient));
        assert!(
            back.message
                .unwrap()
                .starts_with("Unable to process data: éé")
        );
    }
}
