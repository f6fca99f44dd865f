//! Objects as the store sees them: their key, fresh uids and timestamps, and what their
//! metadata says (labels, finalizers, owners, deletion).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::Value;

/// (group, plural, namespace, name)
pub type Key = (String, String, String, String);

static UID_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A unique id in UUID form (not cryptographic: ids only need to be unique).
pub fn new_uid() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mix = |seed: u64| {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let n = UID_COUNTER.fetch_add(1, Ordering::Relaxed);
    let a = mix(nanos ^ n.rotate_left(32));
    let b = mix(a ^ n ^ std::process::id() as u64);
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | ((b >> 48) & 0x3fff),
        b & 0xffff_ffff_ffff
    )
}

/// Now, as Kubernetes writes timestamps (RFC 3339, seconds).
pub fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

pub(super) fn meta(obj: &Value) -> &Value {
    obj.get("metadata").unwrap_or(&Value::Null)
}

pub(super) fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    meta(obj)
        .get("labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn finalizers(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("finalizers")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| f.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn uid_of(obj: &Value) -> &str {
    meta(obj)["uid"].as_str().unwrap_or("")
}

pub(super) fn has_finalizer(obj: &Value, name: &str) -> bool {
    finalizers(obj).iter().any(|f| f == name)
}

pub(super) fn being_deleted(obj: &Value) -> bool {
    meta(obj)
        .get("deletionTimestamp")
        .is_some_and(|t| !t.is_null())
}

/// Waiting for its dependents to go (foreground deletion).
pub(super) fn deleting_dependents(obj: &Value) -> bool {
    being_deleted(obj) && has_finalizer(obj, FOREGROUND)
}

pub(super) fn owner_refs(obj: &Value) -> Vec<Value> {
    meta(obj)
        .get("ownerReferences")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

pub(super) fn owner_uids(obj: &Value) -> Vec<String> {
    meta(obj)
        .get("ownerReferences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|o| o.get("uid").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// What decides `metadata.generation`: everything but metadata and status.
pub(super) fn generation_content(obj: &Value) -> Value {
    let mut v = obj.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

pub(super) const FOREGROUND: &str = "foregroundDeletion";
pub(super) const ORPHAN: &str = "orphan";
