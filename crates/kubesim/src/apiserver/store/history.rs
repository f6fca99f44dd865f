//! The retained changes watches resume from, bounded by count and by bytes, and what a
//! watcher is given.

use std::collections::VecDeque;
use std::sync::Arc;

use serde_json::Value;

/// Changes kept for watches to resume from; older versions answer 410 Gone.
pub const HISTORY: usize = 50_000;

/// Bytes of changes kept (their objects as JSON): large objects must not pin the memory that
/// 50,000 changes of them would.
pub const HISTORY_BYTES: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Added => "ADDED",
            ChangeKind::Modified => "MODIFIED",
            ChangeKind::Deleted => "DELETED",
        }
    }
}

/// One change, as watchers see it.
#[derive(Debug, Clone)]
pub struct Change {
    pub rv: u64,
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub kind: ChangeKind,
    pub object: Value,
}

/// The retained changes, bounded by count and by bytes; kept apart from the objects so that
/// watchers read them without taking the store's lock.
pub(super) struct History {
    pub(super) changes: VecDeque<(Arc<Change>, usize)>,
    pub(super) bytes: usize,
    pub(super) cap: usize,
    pub(super) byte_cap: usize,
    /// The newest version committed.
    pub(super) last: u64,
}

impl History {
    pub(super) fn push(&mut self, change: Arc<Change>) {
        let size = json_len(&change.object);
        self.last = change.rv;
        self.bytes += size;
        self.changes.push_back((change, size));
        // The newest change stays whatever its size, so that live watchers never miss it.
        while self.changes.len() > 1
            && (self.changes.len() > self.cap || self.bytes > self.byte_cap)
        {
            if let Some((_, size)) = self.changes.pop_front() {
                self.bytes -= size;
            }
        }
    }

    /// Whether changes after `rv` were dropped (a watch from it cannot be served).
    pub(super) fn lost(&self, rv: u64) -> bool {
        let oldest = self
            .changes
            .front()
            .map(|(c, _)| c.rv)
            .unwrap_or(self.last + 1);
        rv + 1 < oldest && rv < self.last
    }

    pub(super) fn after(&self, rv: u64) -> Vec<Arc<Change>> {
        let start = self.changes.partition_point(|(c, _)| c.rv <= rv);
        self.changes
            .range(start..)
            .map(|(c, _)| c.clone())
            .collect()
    }
}

/// The length of a value as JSON, without building the text.
fn json_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// A subscription: retained changes after the asked version, a receiver that wakes on every
/// new version (read the changes with [`Store::changes_after`]), and the version at
/// subscription.
///
/// [`Store::changes_after`]: super::Store::changes_after
pub type Watch = (Vec<Arc<Change>>, tokio::sync::watch::Receiver<u64>, u64);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::{Registry, ResourceDef};
    use crate::apiserver::store::Store;
    use serde_json::json;

    fn config_maps() -> (Registry, ResourceDef) {
        let registry = Registry::with_builtins();
        let def = registry.get("", "v1", "configmaps").cloned().unwrap();
        (registry, def)
    }

    fn cm(name: &str, size: usize) -> Value {
        json!({"metadata": {"name": name}, "data": {"k": "x".repeat(size)}})
    }

    #[test]
    fn the_history_is_bounded_by_bytes_as_well_as_count() {
        let (registry, def) = config_maps();
        let store = Store::with_history_limits(registry, 1_000, 20_000);
        let start = store.resource_version();
        for i in 0..50 {
            store
                .create(&def, "default", cm(&format!("cm-{i}"), 1_000), false, None)
                .unwrap();
        }
        {
            let history = store.history();
            assert!(history.bytes <= 20_000, "{} bytes kept", history.bytes);
            let kept = history.changes.len();
            assert!((10..50).contains(&kept), "{kept} changes kept");
            assert_eq!(
                history.bytes,
                history.changes.iter().map(|(_, s)| s).sum::<usize>()
            );
        }
        // Dropped versions answer 410; retained ones resume.
        assert_eq!(store.watch_from(Some(start)).unwrap_err().code, 410);
        assert!(store.changes_after(start).is_none());
        assert!(store.expired(start));
        let now = store.resource_version();
        let (past, _, at) = store.watch_from(Some(now - 3)).unwrap();
        assert_eq!(
            past.iter().map(|c| c.rv).collect::<Vec<_>>(),
            [now - 2, now - 1, now]
        );
        assert_eq!(at, now);
        assert_eq!(store.changes_after(now).unwrap().len(), 0);

        // A change larger than the whole budget is kept alone (watchers must see it).
        store
            .create(&def, "default", cm("huge", 30_000), false, None)
            .unwrap();
        assert_eq!(store.history().changes.len(), 1);
        assert_eq!(store.changes_after(now).unwrap().len(), 1);
        assert!(store.expired(now - 1));
    }

    #[test]
    fn the_count_bound_still_applies() {
        let (registry, def) = config_maps();
        let store = Store::with_history_limits(registry, 5, HISTORY_BYTES);
        for i in 0..20 {
            store
                .create(&def, "default", cm(&format!("cm-{i}"), 10), false, None)
                .unwrap();
        }
        assert_eq!(store.history().changes.len(), 5);
    }
}
