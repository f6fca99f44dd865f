//! Watching: past events from a version (or the current objects as ADDED), then live ones, as
//! JSON lines; bookmarks when asked; closed after `timeoutSeconds`.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use crate::apiserver::errors::ApiResult;
use crate::apiserver::server::call::Call;
use crate::apiserver::server::response::ndjson;
use crate::apiserver::server::verbs::get::selectors;
use crate::apiserver::store::{ChangeKind, ListOptions};
use crate::apiserver::view::Resource;

/// A watch: past events (from a version, or synthetic ADDED for the current state), then live
/// ones, as JSON lines; bookmarks when asked; closed after `timeoutSeconds`.
pub(crate) fn watch(call: &Call, res: Resource, ns: Option<String>) -> ApiResult<Response> {
    let (q, as_table) = (&call.q, call.wants_table());
    let (store, def) = (call.store.clone(), res.def.clone());
    let opts = selectors(&def, q)?;
    let rv = q.resource_version()?;
    let send_initial = q.opt_flag("sendInitialEvents");
    // Without sendInitialEvents, a watch from no version (or "0") starts with the current
    // objects (the legacy behaviour); sendInitialEvents says so explicitly either way.
    let initial = send_initial.unwrap_or(rv.is_none());
    let bookmarks = q.flag("allowWatchBookmarks");
    let send_initial_end = send_initial == Some(true);
    let timeout = Duration::from_secs(
        q.int("timeoutSeconds")?
            .filter(|t| *t > 0)
            .map(|t| t as u64)
            .unwrap_or(1800),
    );
    let since = if initial { None } else { rv };

    let (past, mut rx, at) = match store.watch_from(since.or(Some(store.resource_version()))) {
        Ok(w) => w,
        // As kube-apiserver: the watch starts, then says 410 in an ERROR event.
        Err(e) if e.code == 410 => {
            let line = ndjson(&json!({"type": "ERROR", "object": e.status()}));
            return Ok((
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                Body::from(line),
            )
                .into_response());
        }
        Err(e) => return Err(e),
    };
    let mut lines: Vec<Value> = Vec::new();
    let mut last = since.unwrap_or(at);
    if initial {
        let (items, rv_now, _) = res.list(
            ns.as_deref(),
            &ListOptions {
                labels: opts.labels.clone(),
                fields: opts.fields.clone(),
                ..Default::default()
            },
        );
        lines.extend(
            items
                .into_iter()
                .map(|o| json!({"type": "ADDED", "object": o})),
        );
        last = rv_now.max(at);
        if send_initial_end {
            lines.push(json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(), "metadata": {"resourceVersion": last.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}}));
        }
    }
    // Changes are of the stored objects (a view's too), which the selectors name.
    let matches = {
        let def = res.stored_def().clone();
        let ns = ns.clone();
        let opts = opts.clone();
        move |c: &crate::apiserver::store::Change| -> bool {
            c.group == def.group
                && c.plural == def.plural
                && ns
                    .as_ref()
                    .is_none_or(|n| !def.namespaced || *n == c.namespace)
                && opts.labels.matches(
                    &c.object["metadata"]["labels"]
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .map(|(k, v)| {
                                    (k.clone(), v.as_str().unwrap_or_default().to_string())
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                )
                && opts.fields.matches(&c.object)
        }
    };
    let threshold = last;
    for change in past.iter().filter(|c| c.rv > threshold) {
        if matches(change) {
            let mut line = json!({"type": change.kind.as_str()});
            line["object"] = res.to_served(change.object.clone());
            lines.push(line);
        }
        last = last.max(change.rv);
    }

    // `kubectl get -w` asks for each event's object as a one-row Table.
    let shape = {
        let def = def.clone();
        move |event: Value| -> Value {
            if !as_table || event["type"] == "BOOKMARK" || event["type"] == "ERROR" {
                return event;
            }
            let rv = event["object"]["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or("")
                .to_string();
            json!({"type": event["type"], "object": crate::apiserver::table::table(&def, &[event["object"].clone()], &rv, false)})
        }
    };
    let lines: Vec<Value> = lines.into_iter().map(&shape).collect();
    let (tx, body_rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let kind = def.kind.clone();
    let api_version = def.api_version();
    tokio::spawn(async move {
        for line in lines {
            if tx.send(Ok(ndjson(&line))).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticker = tokio::time::interval(Duration::from_secs(5));
        ticker.tick().await;
        loop {
            tokio::select! {
                _ = &mut deadline => return,
                _ = ticker.tick(), if bookmarks => {
                    let b = json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": {"resourceVersion": last.to_string()}}});
                    if tx.send(Ok(ndjson(&b))).await.is_err() { return; }
                }
                changed = rx.changed() => {
                    if changed.is_err() { return; }
                    // Too slow a reader (its next changes already dropped from the history):
                    // end the watch; the client lists again.
                    let Some(changes) = store.changes_after(last) else { return };
                    for c in changes {
                        last = c.rv;
                        if matches(&c) {
                            let kind = match c.kind { ChangeKind::Added => "ADDED", ChangeKind::Modified => "MODIFIED", ChangeKind::Deleted => "DELETED" };
                            let mut event = json!({"type": kind});
                            event["object"] = res.to_served(c.object.clone());
                            if tx.send(Ok(ndjson(&shape(event)))).await.is_err() { return; }
                        }
                    }
                },
                _ = tx.closed() => return,
            }
        }
    });
    let stream = futures::stream::unfold(body_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        Body::from_stream(stream),
    )
        .into_response())
}
