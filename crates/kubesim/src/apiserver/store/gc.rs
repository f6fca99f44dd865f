//! Deletion and garbage collection: finalizers, orphaning and foreground deletion, and the
//! collector's graph of owners and dependents worked under the store's lock (as kube's garbage
//! collector and namespace controller do), so every answer sees the collected state.

use serde_json::{Value, json};

use super::crds;
use super::history::ChangeKind;
use super::objects::{
    FOREGROUND, Key, ORPHAN, being_deleted, deleting_dependents, finalizers, has_finalizer, now,
    owner_refs, owner_uids, uid_of,
};
use super::{Inner, Propagation, Store};

/// What an owner reference points at, for the garbage collector (as kube's classifyReferences).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum OwnerState {
    /// The owner exists and is not waiting for its dependents.
    Solid,
    /// No object of that kind and name has the uid: the owner is gone (or never was).
    Dangling,
    /// The owner is in foreground deletion.
    Waiting,
    /// The kind is not served (or a namespaced owner of a cluster-scoped object): kube's
    /// collector cannot decide and leaves the dependent alone.
    Unknown,
}

impl Store {
    /// Delete the object at `key` (under the lock): with finalizers it only gets a
    /// deletionTimestamp, without it goes. Orphaning strips this owner from its dependents
    /// first; foreground deletion holds the object with the `foregroundDeletion` finalizer
    /// while it has dependents. Returns the object as last stored.
    pub(super) fn delete_object(
        &self,
        inner: &mut Inner,
        key: &Key,
        propagation: Propagation,
    ) -> Value {
        let Some(current) = inner.objects.get(key).cloned() else {
            return Value::Null;
        };
        let mut fins = finalizers(&current);
        match propagation {
            // kube adds the `orphan` finalizer and its collector strips the references before
            // removing it; the result is the same done at once.
            Propagation::Orphan => self.orphan_dependents(inner, &current),
            Propagation::Foreground => {
                if Self::has_dependents(inner, uid_of(&current))
                    && !fins.iter().any(|f| f == FOREGROUND)
                {
                    fins.push(FOREGROUND.to_string());
                }
            }
            Propagation::Background => {}
        }
        // A CRD is held until its objects are gone (kube's CRD storage does this on the first
        // delete; `finish_crds` does the rest).
        let crd_first_delete = crds::is_crd(key) && !being_deleted(&current);
        if crd_first_delete && !fins.iter().any(|f| f == crds::CLEANUP) {
            fins.push(crds::CLEANUP.to_string());
        }
        if fins.is_empty() {
            return self.commit(inner, key, current, ChangeKind::Deleted);
        }
        if being_deleted(&current) && fins == finalizers(&current) {
            return current;
        }
        let mut next = current.clone();
        if !being_deleted(&current) {
            next["metadata"]["deletionTimestamp"] = json!(now());
            next["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        }
        next["metadata"]["finalizers"] = json!(fins);
        if crd_first_delete {
            crds::set_terminating(&mut next, crds::PENDING);
        }
        self.commit(inner, key, next, ChangeKind::Modified)
    }

    fn has_dependents(inner: &Inner, uid: &str) -> bool {
        inner.dependents.get(uid).is_some_and(|d| !d.is_empty())
    }

    /// Remove the references to `owner` from its dependents.
    fn orphan_dependents(&self, inner: &mut Inner, owner: &Value) {
        let uid = uid_of(owner).to_string();
        let keys: Vec<Key> = inner
            .dependents
            .get(&uid)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default();
        for k in keys {
            let Some(mut obj) = inner.objects.get(&k).cloned() else {
                continue;
            };
            if let Some(refs) = obj["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| r["uid"].as_str() != Some(uid.as_str()));
            }
            self.commit(inner, &k, obj, ChangeKind::Modified);
        }
    }

    /// Remove one finalizer; the object goes with its last one when it is being deleted.
    pub(super) fn remove_finalizer(&self, inner: &mut Inner, key: &Key, name: &str) {
        let Some(mut obj) = inner.objects.get(key).cloned() else {
            return;
        };
        let rest: Vec<String> = finalizers(&obj).into_iter().filter(|f| f != name).collect();
        if rest.is_empty() {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("finalizers");
            }
        } else {
            obj["metadata"]["finalizers"] = json!(rest);
        }
        let stored = self.commit(inner, key, obj, ChangeKind::Modified);
        if rest.is_empty() && being_deleted(&stored) {
            self.commit(inner, key, stored, ChangeKind::Deleted);
        }
    }

    /// Keep the collector's graph current after a change of `key` from `before` to `after`,
    /// and queue what the change concerns (as kube's graph builder does from its watches); a
    /// CRD's change also concerns its objects and whether its kind is served.
    pub(super) fn track(
        inner: &mut Inner,
        key: &Key,
        before: Option<&Value>,
        after: &Value,
        kind: ChangeKind,
    ) {
        let old = before.map(owner_uids).unwrap_or_default();
        let new = if kind == ChangeKind::Deleted {
            Vec::new()
        } else {
            owner_uids(after)
        };
        for uid in old.iter().filter(|u| !new.contains(u)) {
            if let Some(set) = inner.dependents.get_mut(uid) {
                set.remove(key);
                if set.is_empty() {
                    inner.dependents.remove(uid);
                }
            }
        }
        for uid in &new {
            inner
                .dependents
                .entry(uid.clone())
                .or_default()
                .insert(key.clone());
        }
        // Owners waiting for their dependents look again when one goes or lets go of them.
        let mut refs = before.map(owner_refs).unwrap_or_default();
        refs.extend(owner_refs(after));
        for r in &refs {
            if let Some(owner) = Self::owner_key(inner, key, r)
                && inner.objects.get(&owner).is_some_and(|o| {
                    deleting_dependents(o) && uid_of(o) == r["uid"].as_str().unwrap_or("")
                })
            {
                inner.gc_queue.push_back(owner);
            }
        }
        let uid = uid_of(after).to_string();
        match kind {
            ChangeKind::Deleted => {
                // Its dependents may be left without owners now.
                if let Some(deps) = inner.dependents.get(&uid) {
                    inner.gc_queue.extend(deps.iter().cloned());
                }
                inner.to_finish = true;
                // A CRD gone: its kind is no longer served.
                if crds::is_crd(key) {
                    crds::unserve(inner, after);
                }
            }
            _ => {
                // A terminating CRD has objects to delete (`finish_crds`).
                if crds::is_crd(key) && being_deleted(after) {
                    inner.to_finish = true;
                }
                let started_waiting =
                    deleting_dependents(after) && !before.is_some_and(deleting_dependents);
                if started_waiting && let Some(deps) = inner.dependents.get(&uid) {
                    inner.gc_queue.extend(deps.iter().cloned());
                }
                if !new.is_empty()
                    || deleting_dependents(after)
                    || (being_deleted(after) && has_finalizer(after, ORPHAN))
                {
                    inner.gc_queue.push_back(key.clone());
                }
            }
        }
    }

    /// Where an owner reference of the object at `dependent` points, if its kind is served.
    fn owner_key(inner: &Inner, dependent: &Key, r: &Value) -> Option<Key> {
        let api_version = r["apiVersion"].as_str().unwrap_or("");
        let group = api_version.rsplit_once('/').map(|(g, _)| g).unwrap_or("");
        let kind = r["kind"].as_str().unwrap_or("");
        let def = inner
            .registry
            .all()
            .find(|d| d.group == group && d.kind == kind && !d.create_only)?;
        if def.namespaced && dependent.2.is_empty() {
            // A cluster-scoped object cannot have a namespaced owner.
            return None;
        }
        Some((
            def.group.clone(),
            def.plural.clone(),
            if def.namespaced {
                dependent.2.clone()
            } else {
                String::new()
            },
            r["name"].as_str().unwrap_or("").to_string(),
        ))
    }

    fn owner_state(inner: &Inner, dependent: &Key, r: &Value) -> OwnerState {
        let Some(key) = Self::owner_key(inner, dependent, r) else {
            return OwnerState::Unknown;
        };
        match inner.objects.get(&key) {
            Some(o) if uid_of(o) == r["uid"].as_str().unwrap_or("") => {
                if deleting_dependents(o) {
                    OwnerState::Waiting
                } else {
                    OwnerState::Solid
                }
            }
            _ => OwnerState::Dangling,
        }
    }

    /// Work the collector's queue until nothing is left to do (under the lock, so that every
    /// answer and every watch sees the collected state).
    pub(super) fn run_gc(&self, inner: &mut Inner) {
        // Each step deletes, strips a reference or removes a finalizer, so the work ends; the
        // bound is a guard against a mistake turning into a hung server.
        let mut budget = 1_000_000usize;
        loop {
            while let Some(key) = inner.gc_queue.pop_front() {
                budget = budget.saturating_sub(1);
                if budget == 0 {
                    tracing::error!("garbage collection did not settle; dropping its queue");
                    inner.gc_queue.clear();
                    return;
                }
                self.attempt_to_delete(inner, &key);
            }
            if !inner.to_finish {
                return;
            }
            inner.to_finish = false;
            self.finish_namespaces(inner);
            self.finish_crds(inner);
        }
    }

    /// kube's attemptToDeleteItem (and its orphan and foreground workers) for one object.
    fn attempt_to_delete(&self, inner: &mut Inner, key: &Key) {
        let Some(obj) = inner.objects.get(key).cloned() else {
            return;
        };
        if being_deleted(&obj) && has_finalizer(&obj, ORPHAN) {
            self.orphan_dependents(inner, &obj);
            self.remove_finalizer(inner, key, ORPHAN);
            return;
        }
        if deleting_dependents(&obj) {
            // Only dependents that block their owner's deletion hold it.
            let uid = uid_of(&obj).to_string();
            let blocking: Vec<Key> = inner
                .dependents
                .get(&uid)
                .into_iter()
                .flatten()
                .filter(|d| {
                    inner.objects.get(*d).is_some_and(|o| {
                        owner_refs(o).iter().any(|r| {
                            r["uid"].as_str() == Some(uid.as_str())
                                && r["blockOwnerDeletion"] == json!(true)
                        })
                    })
                })
                .cloned()
                .collect();
            if blocking.is_empty() {
                self.remove_finalizer(inner, key, FOREGROUND);
                return;
            }
            for d in blocking {
                if inner
                    .objects
                    .get(&d)
                    .is_some_and(|o| !deleting_dependents(o))
                {
                    inner.gc_queue.push_back(d);
                }
            }
            return;
        }
        if being_deleted(&obj) {
            return;
        }
        let refs = owner_refs(&obj);
        if refs.is_empty() {
            return;
        }
        let (mut solid, mut gone, mut waiting) = (0, Vec::new(), Vec::new());
        for r in &refs {
            let uid = r["uid"].as_str().unwrap_or("").to_string();
            match Self::owner_state(inner, key, r) {
                OwnerState::Unknown => return,
                OwnerState::Solid => solid += 1,
                OwnerState::Dangling => gone.push(uid),
                OwnerState::Waiting => waiting.push(uid),
            }
        }
        if solid > 0 {
            // Live owners keep it; references to gone or going owners are removed.
            if gone.is_empty() && waiting.is_empty() {
                return;
            }
            let mut next = obj.clone();
            if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                refs.retain(|r| {
                    let uid = r["uid"].as_str().unwrap_or("");
                    !gone.iter().any(|g| g == uid) && !waiting.iter().any(|w| w == uid)
                });
            }
            self.commit(inner, key, next, ChangeKind::Modified);
            return;
        }
        let uid = uid_of(&obj).to_string();
        if !waiting.is_empty() && Self::has_dependents(inner, &uid) {
            // Its owner waits for it, and it has dependents of its own: it goes in the
            // foreground too. A dependent that waits as well would wait for it forever: its
            // references stop blocking first (kube's cycle breaking).
            let cycle = inner
                .dependents
                .get(&uid)
                .into_iter()
                .flatten()
                .any(|d| inner.objects.get(d).is_some_and(deleting_dependents));
            if cycle {
                let mut next = obj.clone();
                if let Some(refs) = next["metadata"]["ownerReferences"].as_array_mut() {
                    for r in refs.iter_mut() {
                        if r["blockOwnerDeletion"] == json!(true) {
                            r["blockOwnerDeletion"] = json!(false);
                        }
                    }
                }
                self.commit(inner, key, next, ChangeKind::Modified);
            }
            self.delete_object(inner, key, Propagation::Foreground);
            return;
        }
        let propagation = if has_finalizer(&obj, ORPHAN) {
            Propagation::Orphan
        } else if has_finalizer(&obj, FOREGROUND) {
            Propagation::Foreground
        } else {
            Propagation::Background
        };
        self.delete_object(inner, key, propagation);
    }

    /// Terminating namespaces with nothing left in them go.
    fn finish_namespaces(&self, inner: &mut Inner) {
        let first = (
            String::new(),
            "namespaces".to_string(),
            String::new(),
            String::new(),
        );
        let terminating: Vec<(Key, Value)> = inner
            .objects
            .range(first..)
            .take_while(|(k, _)| k.0.is_empty() && k.1 == "namespaces")
            .filter(|(_, o)| being_deleted(o))
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect();
        for (key, obj) in terminating {
            if !inner.objects.keys().any(|other| other.2 == key.3) {
                self.commit(inner, &key, obj, ChangeKind::Deleted);
            }
        }
    }
}
