//! Field ownership for server-side apply: who set which leaf field, and an apply's conflicts
//! with other managers.

use serde_json::Value;

use super::objects::Key;
use super::{Inner, Owner, Store};
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::registry::ResourceDef;

/// Leaf fields of an object (lists are atomic), as dotted paths, with their values.
fn leaves(v: &Value, prefix: &str, out: &mut Vec<(String, Value)>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => {
            for (k, sub) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(sub, &path, out);
            }
        }
        _ => out.push((prefix.to_string(), v.clone())),
    }
}

fn owned_leaves(obj: &Value) -> Vec<(String, Value)> {
    let mut all = Vec::new();
    leaves(obj, "", &mut all);
    all.retain(|(p, _)| {
        !matches!(p.as_str(), "apiVersion" | "kind") && !p.starts_with("metadata.") && !p.is_empty()
    });
    all
}

fn at_path<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.').try_fold(v, |cur, seg| cur.get(seg))
}

impl Store {
    /// Check an apply for conflicts with other managers, then record who owns what after the
    /// write from `before` to `after`.
    pub(super) fn own(
        inner: &mut Inner,
        def: &ResourceDef,
        key: &Key,
        before: Option<&Value>,
        after: &Value,
        owner: Option<&Owner>,
    ) -> ApiResult<()> {
        let Some(owner) = owner else {
            return Ok(());
        };
        let owners = inner.owners.entry(key.clone()).or_default();
        if let (Some(applied), false) = (&owner.applied, owner.force) {
            let conflicts: Vec<String> = owned_leaves(applied)
                .into_iter()
                .filter(|(path, value)| {
                    let current = before.and_then(|b| at_path(b, path));
                    current.is_some_and(|c| c != value)
                        && owners.get(path).is_some_and(|m| *m != owner.manager)
                })
                .map(|(path, _)| path)
                .collect();
            if !conflicts.is_empty() {
                let details: Vec<String> = conflicts
                    .iter()
                    .map(|p| format!("conflict with \"{}\": .{p}", owners[p]))
                    .collect();
                let mut e = ApiError::conflict(&def.group, &def.plural, &key.3);
                e.message = format!(
                    "Apply failed with {} conflict{}: {}",
                    conflicts.len(),
                    if conflicts.len() == 1 { "" } else { "s" },
                    details.join(", ")
                );
                return Err(e);
            }
        }
        let after_leaves = owned_leaves(after);
        let present: std::collections::BTreeSet<&String> =
            after_leaves.iter().map(|(p, _)| p).collect();
        owners.retain(|p, _| present.contains(p));
        let claimed: Vec<String> = match &owner.applied {
            Some(applied) => owned_leaves(applied)
                .into_iter()
                .map(|(p, _)| p)
                .filter(|p| present.contains(p))
                .collect(),
            None => after_leaves
                .iter()
                .filter(|(p, v)| before.and_then(|b| at_path(b, p)) != Some(v))
                .map(|(p, _)| p.clone())
                .collect(),
        };
        for p in claimed {
            owners.insert(p, owner.manager.clone());
        }
        Ok(())
    }
}
