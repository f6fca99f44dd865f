//! What a demo prints as it happens: each line once, with the time since the demo began.

use std::collections::BTreeSet;
use std::time::Instant;

pub(crate) struct Timeline {
    start: Instant,
    seen: BTreeSet<String>,
}

impl Timeline {
    pub(crate) fn new() -> Timeline {
        Timeline {
            start: Instant::now(),
            seen: BTreeSet::new(),
        }
    }

    /// Print `line` once (by `key`), with the time since the start.
    pub(crate) fn say(&mut self, key: &str, line: String) {
        if self.seen.insert(key.to_string()) {
            println!("{:>7.2}s  {line}", self.start.elapsed().as_secs_f64());
        }
    }
}
