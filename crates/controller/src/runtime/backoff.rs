//! How long a failing object waits before its next try: per object, exponentially, as
//! controller-runtime's default per-item rate limiter does. A pass that fails once is tried again
//! at once (a conflict, a cache a moment behind); one that keeps failing (an API server down, a
//! bug on one object) is tried less and less often, and costs nothing next to the others.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The delays of one controller's failing objects: `base`, doubling with each failure in a row,
/// at most `cap`; a success forgets the object.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    failures: Mutex<HashMap<String, u32>>,
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
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        let count = failures.entry(object.to_string()).or_insert(0);
        let delay = self.delay(*count);
        *count = count.saturating_add(1);
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
}
