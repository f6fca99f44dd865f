//! Events on objects through kube-runtime's [`Recorder`] (events.k8s.io/v1, which `kubectl
//! describe` lists as core/v1 Events), with upstream's reasons. A repeat of the same event on the
//! same object becomes a series (its count goes up), not a new Event.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

pub use cdi_core::datavolume::COMPONENT;

/// events.k8s.io refuses longer notes.
const MAX_NOTE: usize = 1024;

/// How long a repeat still counts as one: longer than the Recorder's own memory of a series.
const KEEP: Duration = Duration::from_secs(10 * 60);

type Key = (String, String, String);

/// The controller's event recorder.
pub struct Events {
    client: Client,
    reporter: Reporter,
    /// One Recorder per object, reason and message: kube-runtime tells repeats apart by object
    /// and reason only, and would publish a new message as one more of the old.
    recorders: Mutex<HashMap<Key, (Recorder, Instant)>>,
}

impl Events {
    /// Events reported by `cdi-controller`, from `instance`.
    pub fn new(client: Client, instance: &str) -> Events {
        Events::of(client, COMPONENT, instance)
    }

    /// Events reported by `component`, from `instance`.
    pub fn of(client: Client, component: &str, instance: &str) -> Events {
        Events {
            client,
            reporter: Reporter {
                controller: component.into(),
                instance: Some(instance.into()),
            },
            recorders: Mutex::default(),
        }
    }

    /// Record `reason`/`note` on `obj` (`warning` selects the type). A failure is logged, not
    /// returned: an event is a report, and the work it reports on goes on without it.
    pub async fn record<K>(&self, obj: &K, warning: bool, reason: &str, note: &str)
    where
        K: Resource<DynamicType = ()>,
    {
        let reference = obj.object_ref(&());
        let note = truncate(note);
        let who = reference
            .uid
            .clone()
            .unwrap_or_else(|| format!("{:?}/{:?}", reference.namespace, reference.name));
        let key = (who, reason.to_string(), note.to_string());
        let recorder = {
            let mut recorders = self.recorders.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            recorders.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
            let entry = recorders.entry(key).or_insert_with(|| {
                (
                    Recorder::new(self.client.clone(), self.reporter.clone()),
                    now,
                )
            });
            entry.1 = now;
            entry.0.clone()
        };
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note.into()),
            // What the controller was doing: upstream's events have no action, the API asks for one.
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&event, &reference).await {
            tracing::debug!(error = %e, reason, "recording an event");
        }
    }
}

/// At most [`MAX_NOTE`] bytes, cut at a character boundary.
pub fn truncate(note: &str) -> &str {
    if note.len() <= MAX_NOTE {
        return note;
    }
    let mut end = MAX_NOTE;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    &note[..end]
}

#[cfg(test)]
mod tests {
    #[test]
    fn long_notes_are_cut_at_a_character_boundary() {
        let long = "é".repeat(600);
        let cut = super::truncate(&long);
        assert!(cut.len() <= super::MAX_NOTE);
        assert_eq!(cut.chars().count(), 512);
        assert_eq!(super::truncate("short"), "short");
    }
}
