//! How long a failing object waits before its next try: per object, exponentially, as
//! controller-runtime's default per-item rate limiter does. A pass that fails once is tried again
//! at once (a conflict, a cache a moment behind); one that keeps failing (an API server down, a
//! bug on one object) is tried less and less often, and costs nothing next to the others.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How many failing objects are remembered before those that stopped failing long ago are
/// forgotten: an object deleted while it failed is never reconciled again to say so.
const REMEMBERED: usize = 1024;

/// The delays of one controller's failing objects: `base`, doubling with each failure in a row,
/// at most `cap`; a success forgets the object.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    /// Failures in a row by object, and when the last one was.
    failures: Mutex<HashMap<String, (u32, Instant)>>,
}

impl Default for Backoff {
    /// From 5 ms to 5 minutes: controller-runtime starts at 5 ms too; its cap (1,000 s) is longer
    /// than a user waiting on a DataVolume should wait after the cause is gone.
    fn default() -> Self {
        Backoff::new(Duration::from_millis(5), Duration::from_secs(300))
    }
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            failures: Mutex::default(),
        }
    }

    /// Count a failure of `object` and say how long it waits before its next try.
    pub fn failed(&self, object: &str) -> Duration {
        self.failed_at(object, Instant::now())
    }

    fn failed_at(&self, object: &str, now: Instant) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        if failures.len() >= REMEMBERED {
            // Not tried for twice the longest delay: deleted, or fixed by a change whose pass
            // succeeded under another name. Either way its count is stale.
            let stale = self.cap.saturating_mul(2);
            failures.retain(|_, (_, at)| now.saturating_duration_since(*at) < stale);
        }
        let (count, at) = failures.entry(object.to_string()).or_insert((0, now));
        let delay = self.delay(*count);
        *count = count.saturating_add(1);
        *at = now;
        delay
    }

    /// `object`'s pass succeeded: its next failure starts from `base` again.
    pub fn succeeded(&self, object: &str) {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.remove(object);
    }

    /// The delay after `previous` failures in a row.
    pub fn delay(&self, previous: u32) -> Duration {
        // 2^31 × 5 ms is far past any cap: stop doubling before the multiplication overflows.
        let factor = 1u32 << previous.min(31);
        self.base.saturating_mul(factor).min(self.cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_per_object_up_to_the_cap_and_reset_on_success() {
        let b = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
        let delays: Vec<u128> = (0..10).map(|_| b.failed("ns/a").as_millis()).collect();
        assert_eq!(delays, [5, 10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        // Another object has its own count.
        assert_eq!(b.failed("ns/b"), Duration::from_millis(5));
        b.succeeded("ns/a");
        assert_eq!(b.failed("ns/a"), Duration::from_millis(5));
        // However long it fails, the delay stays at the cap.
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn objects_that_stopped_failing_long_ago_are_forgotten_once_many_are_remembered() {
        let b = Backoff::new(Duration::from_millis(5), Duration::from_secs(1));
        let start = Instant::now();
        b.failed_at("ns/deleted", start);
        b.failed_at("ns/deleted", start);
        for i in 1..REMEMBERED {
            b.failed_at(&format!("ns/{i}"), start + Duration::from_secs(3));
        }
        // Still under the bound: nothing is forgotten.
        assert_eq!(b.failed_at("ns/deleted", start), Duration::from_millis(20));
        // At the bound, three seconds on (twice the cap is two): only the stale one goes.
        let later = start + Duration::from_secs(3);
        assert_eq!(b.failed_at("ns/new", later), Duration::from_millis(5));
        assert_eq!(b.failed_at("ns/1", later), Duration::from_millis(10));
        assert_eq!(b.failed_at("ns/deleted", later), Duration::from_millis(5));
    }
}
