//! The index of the fields agents and controllers select on each pass (a node's pods, an
//! object's events), so that such a list reads only what it returns.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::objects::Key;

/// The fields the store indexes, per (group, plural): the ones agents and controllers select on
/// each pass (a kubelet its node's pods, a controller a claim's events). Without the index each
/// such list reads every pod or event, so a pass costs what the whole cluster holds.
pub(super) const INDEXED_FIELDS: &[(&str, &str, &str)] = &[
    ("", "pods", "spec.nodeName"),
    ("", "events", "involvedObject.name"),
];

/// (group, plural, field path, value) → the objects with that value.
pub(super) type FieldIndex = HashMap<(String, String, &'static str, String), BTreeSet<Key>>;

/// A field's value as field selectors read it: a string, or "" when missing (other JSON values
/// are not indexed: selectors on them fall back to a scan).
fn field_value<'a>(obj: &'a Value, path: &str) -> Option<&'a str> {
    match crate::apiserver::selector::field(obj, path) {
        Value::String(s) => Some(s),
        Value::Null => Some(""),
        _ => None,
    }
}

fn indexed_fields(key: &Key) -> impl Iterator<Item = &'static str> + '_ {
    INDEXED_FIELDS
        .iter()
        .filter(|(g, p, _)| *g == key.0 && *p == key.1)
        .map(|(_, _, path)| *path)
}

/// Keep the index current for `key` going from `before` to `after` (`None`: absent).
pub(super) fn reindex(
    index: &mut FieldIndex,
    key: &Key,
    before: Option<&Value>,
    after: Option<&Value>,
) {
    for path in indexed_fields(key) {
        let old = before.and_then(|o| field_value(o, path));
        let new = after.and_then(|o| field_value(o, path));
        if old == new {
            continue;
        }
        if let Some(old) = old {
            let slot = (key.0.clone(), key.1.clone(), path, old.to_string());
            if let Some(keys) = index.get_mut(&slot) {
                keys.remove(key);
                if keys.is_empty() {
                    index.remove(&slot);
                }
            }
        }
        if let Some(new) = new {
            index
                .entry((key.0.clone(), key.1.clone(), path, new.to_string()))
                .or_default()
                .insert(key.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::apiserver::registry::Registry;
    use crate::apiserver::selector::FieldSelector;
    use crate::apiserver::store::{DeleteOptions, ListOptions, Propagation, Store, WriteOptions};
    use serde_json::{Value, json};

    /// A list selecting on an indexed field returns what a scan of every object would, in the
    /// same order and pages, as objects are created, moved between values and deleted.
    #[test]
    fn indexed_field_lists_answer_as_a_scan_would() {
        let registry = Registry::with_builtins();
        let pods = registry.get("", "v1", "pods").cloned().unwrap();
        let store = Store::new(registry);
        let pod = |name: &str, node: Option<&str>| {
            let mut p = json!({"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "i"}]}});
            if let Some(node) = node {
                p["spec"]["nodeName"] = json!(node);
            }
            p
        };
        for i in 0..30 {
            let node = ["node-1", "node-2"].get(i % 3).copied();
            let ns = if i % 2 == 0 { "default" } else { "kube-system" };
            store
                .create(&pods, ns, pod(&format!("p{i:02}"), node), false, None)
                .unwrap();
        }
        let how = WriteOptions {
            dry_run: false,
            status_only: false,
            owner: None,
        };
        // Moved from node-1 to node-2, and from none to node-1.
        store
            .update(&pods, "default", "p00", pod("p00", Some("node-2")), &how)
            .unwrap();
        store
            .update(&pods, "default", "p02", pod("p02", Some("node-1")), &how)
            .unwrap();
        let gone = DeleteOptions {
            propagation: Propagation::Background,
            precondition_uid: None,
            grace_period: Some(0),
            dry_run: false,
        };
        store.delete(&pods, "kube-system", "p03", &gone).unwrap();

        let names = |items: &[Value]| -> Vec<String> {
            items
                .iter()
                .map(|o| {
                    format!(
                        "{}/{}",
                        o["metadata"]["namespace"].as_str().unwrap(),
                        o["metadata"]["name"].as_str().unwrap()
                    )
                })
                .collect()
        };
        for selector in [
            "spec.nodeName=node-1",
            "spec.nodeName==node-2",
            "spec.nodeName=",
            "spec.nodeName=node-3",
            "spec.nodeName=node-1,metadata.name!=p01",
        ] {
            let fields = FieldSelector::parse(selector).unwrap();
            let (all, _, _) = store.list(&pods, None, &ListOptions::default());
            let scan: Vec<Value> = all.into_iter().filter(|o| fields.matches(o)).collect();
            for ns in [None, Some("default"), Some("kube-system")] {
                let want: Vec<String> = names(&scan)
                    .into_iter()
                    .filter(|n| ns.is_none_or(|ns| n.starts_with(&format!("{ns}/"))))
                    .collect();
                let opts = ListOptions {
                    fields: fields.clone(),
                    ..Default::default()
                };
                let (got, _, next) = store.list(&pods, ns, &opts);
                assert_eq!(names(&got), want, "{selector} in {ns:?}");
                assert!(next.is_none());
                // Pages of 2 add up to the same.
                let mut paged = Vec::new();
                let mut after = None;
                loop {
                    let opts = ListOptions {
                        fields: fields.clone(),
                        limit: Some(2),
                        continue_after: after.clone(),
                        ..Default::default()
                    };
                    let (page, _, next) = store.list(&pods, ns, &opts);
                    paged.extend(names(&page));
                    match next {
                        Some(n) => after = Some(n),
                        None => break,
                    }
                }
                assert_eq!(paged, want, "{selector} in {ns:?}, paged");
            }
        }
        assert!(
            names(
                &store
                    .list(
                        &pods,
                        None,
                        &ListOptions {
                            fields: FieldSelector::parse("spec.nodeName=node-1").unwrap(),
                            ..Default::default()
                        }
                    )
                    .0
            )
            .contains(&"default/p02".to_string())
        );
    }
}
