//! Failing actions of the storage agents: per object, exponential back-off (as kube's
//! controllers rate-limit their work queues; the external-provisioner from 1 s doubling to
//! 5 min) instead of a retry every pass, and a Warning event saying why: one per distinct error,
//! its `count` raised at each retry as kube's event recorder aggregates repeats.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// Delays between tries of a failing action: `initial`, doubling, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// Kubelet's figures for restarting a failed container.
    pub const KUBELET: Backoff = Backoff {
        initial: Duration::from_secs(10),
        max: Duration::from_secs(300),
    };

    /// The delay after `failures` failures in a row (1: the first).
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }
}

#[derive(Debug)]
struct Failing {
    fingerprint: String,
    failures: u32,
    next: Instant,
}

/// The objects whose actions failed, by key, with when to try again.
#[derive(Debug, Default)]
pub struct Retries {
    backoff: Backoff,
    failing: HashMap<String, Failing>,
}

impl Retries {
    pub fn new(backoff: Backoff) -> Retries {
        Retries {
            backoff,
            failing: HashMap::new(),
        }
    }

    /// Whether the action for `key` may be tried at `now`: it has not failed, its back-off is
    /// over, or the object changed since (another `fingerprint`), which starts afresh as kube
    /// requeues an updated object at once.
    pub fn due(&mut self, key: &str, fingerprint: &str, now: Instant) -> bool {
        match self.failing.get(key) {
            Some(f) if f.fingerprint == fingerprint => {
                // Not yet: the agent passes again when it is.
                super::due_by(f.next);
                now >= f.next
            }
            Some(_) => {
                self.failing.remove(key);
                true
            }
            None => true,
        }
    }

    /// Count a failure; returns the failures in a row and the delay before the next try.
    pub fn failed(&mut self, key: &str, fingerprint: &str, now: Instant) -> (u32, Duration) {
        let f = self.failing.entry(key.to_string()).or_insert(Failing {
            fingerprint: fingerprint.to_string(),
            failures: 0,
            next: now,
        });
        f.fingerprint = fingerprint.to_string();
        f.failures += 1;
        let delay = self.backoff.delay(f.failures);
        f.next = now + delay;
        // The agent passes again then, changes or not.
        super::due_by(f.next);
        (f.failures, delay)
    }

    pub fn succeeded(&mut self, key: &str) {
        self.failing.remove(key);
    }

    /// Forget the objects `keep` does not name (done, or gone).
    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.failing.retain(|k, _| keep(k));
    }
}

/// Post a Warning event about `involved` (`apiVersion`, `kind`, `namespace`, `name`, `uid`)
/// from `component`. Its name comes from the object, reason and message, so a repeat of the
/// same error finds it and raises its count; another error is another event. Events about
/// cluster-scoped objects go to `default`, where kube's recorder puts them.
pub async fn warn(
    client: &Client,
    component: &str,
    involved: &Value,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let text = |k: &str| involved[k].as_str().unwrap_or("");
    let ns = match text("namespace") {
        "" => "default",
        ns => ns,
    };
    let identity = format!(
        "{}/{}/{}/{}\n{reason}\n{message}",
        text("kind"),
        text("namespace"),
        text("name"),
        text("uid")
    );
    let name = super::event_name(text("name"), &super::short_hash(&identity));
    let now = jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default();
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    let event: Event = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "involvedObject": involved, "reason": reason, "message": message, "type": "Warning",
        "source": {"component": component}, "firstTimestamp": now, "lastTimestamp": now,
        "count": 1,
    }))
    .map_err(kube::Error::SerdeError)?;
    match events.create(&PostParams::default(), &event).await {
        Err(kube::Error::Api(e)) if e.code == 409 => {
            let count = events.get(&name).await?.count.unwrap_or(1);
            let patch = json!({"count": count + 1, "lastTimestamp": now});
            events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            Ok(())
        }
        other => other.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_back_off_per_object_until_it_changes() {
        let backoff = Backoff::default();
        assert_eq!(backoff.delay(1), Duration::from_secs(1));
        assert_eq!(backoff.delay(4), Duration::from_secs(8));
        assert_eq!(backoff.delay(20), Duration::from_secs(300));
        assert_eq!(backoff.delay(u32::MAX), Duration::from_secs(300));

        let mut r = Retries::new(backoff);
        let t0 = Instant::now();
        assert!(r.due("a", "g1", t0));
        assert_eq!(r.failed("a", "g1", t0), (1, Duration::from_secs(1)));
        assert!(!r.due("a", "g1", t0 + Duration::from_millis(999)));
        assert!(r.due("b", "g1", t0), "other objects are not held");
        let t1 = t0 + Duration::from_secs(1);
        assert!(r.due("a", "g1", t1));
        assert_eq!(r.failed("a", "g1", t1), (2, Duration::from_secs(2)));
        assert!(!r.due("a", "g1", t1 + Duration::from_secs(1)));
        // Changed: tried at once, counted afresh.
        assert!(r.due("a", "g2", t1));
        assert_eq!(r.failed("a", "g2", t1).0, 1);
        r.succeeded("a");
        assert!(r.due("a", "g2", t1));
        r.failed("c", "", t1);
        r.retain(|k| k != "c");
        assert!(r.due("c", "", t1));
    }
}
