//! Quoting the cluster in the doctor's sentences: one line that says something, and what a
//! container's end says of why it ended. Messages come from anyone (a log's tail with
//! `FallbackToLogsOnError`, an API error, a condition): a quote is never a whole log.

use k8s_openapi::api::core::v1::ContainerStateTerminated;

/// The longest summary, in characters: one line of `cdi doctor`'s listing.
pub(super) const MAX_SUMMARY: usize = 240;

fn worded(line: &str) -> bool {
    line.chars().any(char::is_alphanumeric)
}

/// A log line a program writes while it works (tracing's `… INFO target: …`, klog's `I0102 …`,
/// logfmt's `level=info`, JSON's `"level":"info"`): no reason why it stopped.
pub(super) fn is_chatter(line: &str) -> bool {
    let lower = line.to_ascii_lowercase();
    let leveled = ["info", "debug", "trace"].iter().any(|l| {
        lower.contains(&format!("level={l}")) || lower.contains(&format!("\"level\":\"{l}\""))
    });
    let first = line.split_whitespace().next().unwrap_or("");
    let klog = first.len() == 5
        && first.starts_with('I')
        && first[1..].bytes().all(|b| b.is_ascii_digit());
    let tracing = line
        .split_whitespace()
        .take(3)
        .any(|w| matches!(w, "INFO" | "DEBUG" | "TRACE"));
    leveled || klog || tracing
}

/// The first line of `text` that says something (words, not chatter), trimmed.
fn telling_line(text: &str) -> Option<&str> {
    text.lines()
        .map(str::trim)
        .find(|l| worded(l) && !is_chatter(l))
}

/// The first meaningful line of `text`: the first that says something, else the first with
/// words; empty when it has none.
pub(super) fn first_line(text: &str) -> &str {
    telling_line(text)
        .or_else(|| text.lines().map(str::trim).find(|l| worded(l)))
        .unwrap_or("")
}

/// A summary as one line of a listing: its first line with words, cut at [`MAX_SUMMARY`]
/// characters (the explanation has the rest).
pub(super) fn summary(text: &str) -> String {
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| worded(l))
        .unwrap_or("");
    if line.chars().count() <= MAX_SUMMARY {
        return line.to_string();
    }
    let end = line
        .char_indices()
        .nth(MAX_SUMMARY - 1)
        .map_or(line.len(), |(i, _)| i);
    format!("{}…", line[..end].trim_end())
}

/// Why a container ended, in a clause: what the program said in its termination message (the
/// importer's JSON, or plain text), else how it ended (out of memory, a signal, an exit code).
/// A killed container said nothing: with `FallbackToLogsOnError` its message is its log's tail,
/// whose last lines are whatever it was doing ("upload server listening"). `None` for a
/// container that ended well.
pub(super) fn last_words(t: &ContainerStateTerminated) -> Option<String> {
    if t.exit_code == 0 {
        return None;
    }
    if t.reason.as_deref() == Some("OOMKilled") {
        return Some("OOMKilled: it exceeded its memory limit".into());
    }
    if let Some(sig) = crate::import::signal_of(t) {
        let name = crate::import::signal_name(sig);
        return Some(format!("killed by signal {sig}{name}"));
    }
    let said = t
        .message
        .as_deref()
        .and_then(|m| cdi_api::termination::TerminationMessage::parse(m).message)
        .unwrap_or_default();
    if let Some(line) = telling_line(&said) {
        return Some(line.to_string());
    }
    let reason = t.reason.as_deref().filter(|r| worded(r)).unwrap_or("Error");
    Some(format!("{reason} (exit code {})", t.exit_code))
}
