//! Watching: past events from a version (or the current objects as ADDED), then live ones, as
//! JSON lines; bookmarks when asked; closed after `timeoutSeconds`.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::apiserver::errors::ApiResult;
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::server::call::Call;
use crate::apiserver::server::request::Query;
use crate::apiserver::server::response::ndjson;
use crate::apiserver::server::verbs::get::selectors;
use crate::apiserver::store::{Change, ChangeKind, ListOptions, Store};
use crate::apiserver::view::Resource;

/// A watch: past events (from a version, or synthetic ADDED for the current state), then live
/// ones, as JSON lines; bookmarks when asked; closed after `timeoutSeconds`.
pub(crate) fn watch(call: &Call, res: Resource, ns: Option<String>) -> ApiResult<Response> {
    let store = call.store.clone();
    let asked = Asked::of(&res.def, &call.q)?;
    let (past, rx, at) = match store.watch_from(asked.since.or(Some(store.resource_version()))) {
        Ok(w) => w,
        // As kube-apiserver: the watch starts, then says 410 in an ERROR event.
        Err(e) if e.code == 410 => {
            let line = ndjson(&json!({"type": "ERROR", "object": e.status()}));
            return Ok(json_lines(Body::from(line)));
        }
        Err(e) => return Err(e),
    };
    let (mut lines, mut last) = initial_events(&res, ns.as_deref(), &asked, at);
    // Changes are of the stored objects (a view's too), which the selectors name.
    let filter = Filter {
        def: res.stored_def().clone(),
        ns,
        opts: asked.opts.clone(),
    };
    let threshold = last;
    for change in past.iter().filter(|c| c.rv > threshold) {
        if filter.matches(change) {
            let mut line = json!({"type": change.kind.as_str()});
            line["object"] = res.to_served(change.object.clone());
            lines.push(line);
        }
        last = last.max(change.rv);
    }
    let shape = Shape {
        def: res.def.clone(),
        as_table: call.wants_table(),
    };
    let lines: Vec<Value> = lines.into_iter().map(|e| shape.apply(e)).collect();
    let (tx, body_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let watcher = Watcher {
        store,
        res,
        filter,
        shape,
        last,
    };
    tokio::spawn(watcher.run(tx, rx, lines, asked.bookmarks, asked.timeout));
    let stream = futures::stream::unfold(body_rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    });
    Ok(json_lines(Body::from_stream(stream)))
}

/// A watch's answer: its events as JSON lines.
fn json_lines(body: Body) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

/// What a watch asks for, from its query.
struct Asked {
    opts: ListOptions,
    /// Start with the current objects, as ADDED events.
    initial: bool,
    /// End those with a bookmark that says so (`sendInitialEvents=true`).
    initial_end: bool,
    /// The version to resume after, when not starting with the current objects.
    since: Option<u64>,
    bookmarks: bool,
    timeout: Duration,
}

impl Asked {
    fn of(def: &ResourceDef, q: &Query) -> ApiResult<Asked> {
        let opts = selectors(def, q)?;
        let rv = q.resource_version()?;
        let send_initial = q.opt_flag("sendInitialEvents");
        // Without sendInitialEvents, a watch from no version (or "0") starts with the current
        // objects (the legacy behaviour); sendInitialEvents says so explicitly either way.
        let initial = send_initial.unwrap_or(rv.is_none());
        let bookmarks = q.flag("allowWatchBookmarks");
        let timeout = Duration::from_secs(
            q.int("timeoutSeconds")?
                .filter(|t| *t > 0)
                .map(|t| t as u64)
                .unwrap_or(1800),
        );
        Ok(Asked {
            opts,
            initial,
            initial_end: send_initial == Some(true),
            since: if initial { None } else { rv },
            bookmarks,
            timeout,
        })
    }
}

/// The events a watch starts with (the current objects, when it asks for them) and the
/// version they bring it to (`at`, the version at subscription, at least).
fn initial_events(res: &Resource, ns: Option<&str>, asked: &Asked, at: u64) -> (Vec<Value>, u64) {
    let mut lines: Vec<Value> = Vec::new();
    let mut last = asked.since.unwrap_or(at);
    if asked.initial {
        let (items, rv_now, _) = res.list(
            ns,
            &ListOptions {
                labels: asked.opts.labels.clone(),
                fields: asked.opts.fields.clone(),
                ..Default::default()
            },
        );
        lines.extend(
            items
                .into_iter()
                .map(|o| json!({"type": "ADDED", "object": o})),
        );
        last = rv_now.max(at);
        if asked.initial_end {
            let def = &res.def;
            lines.push(json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(), "metadata": {"resourceVersion": last.to_string(), "annotations": {"k8s.io/initial-events-end": "true"}}}}));
        }
    }
    (lines, last)
}

/// Which changes a watch sends: those of its resource's stored objects in its namespace that its
/// selectors pick.
struct Filter {
    def: ResourceDef,
    ns: Option<String>,
    opts: ListOptions,
}

impl Filter {
    fn matches(&self, c: &Change) -> bool {
        let (def, opts) = (&self.def, &self.opts);
        c.group == def.group
            && c.plural == def.plural
            && self
                .ns
                .as_ref()
                .is_none_or(|n| !def.namespaced || *n == c.namespace)
            && opts.labels.matches(
                &c.object["metadata"]["labels"]
                    .as_object()
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                            .collect()
                    })
                    .unwrap_or_default(),
            )
            && opts.fields.matches(&c.object)
    }
}

/// How a watch's events are sent: as they are, or (`kubectl get -w` asks so) each object as a
/// one-row Table.
struct Shape {
    def: ResourceDef,
    as_table: bool,
}

impl Shape {
    fn apply(&self, event: Value) -> Value {
        if !self.as_table || event["type"] == "BOOKMARK" || event["type"] == "ERROR" {
            return event;
        }
        let rv = event["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string();
        json!({"type": event["type"], "object": crate::apiserver::table::table(&self.def, &[event["object"].clone()], &rv, false)})
    }
}

/// A watch under way: where it is in the changes, and what it sends of them.
struct Watcher {
    store: Arc<Store>,
    res: Resource,
    filter: Filter,
    shape: Shape,
    /// The version of the last change looked at.
    last: u64,
}

impl Watcher {
    /// Send `lines`, then the changes as they come (and bookmarks every 5 s when asked), until
    /// the client goes, `timeout` passes, or the watch falls behind the history.
    async fn run(
        mut self,
        tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
        mut rx: tokio::sync::watch::Receiver<u64>,
        lines: Vec<Value>,
        bookmarks: bool,
        timeout: Duration,
    ) {
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
                    if tx.send(Ok(ndjson(&self.bookmark()))).await.is_err() { return; }
                }
                changed = rx.changed() => {
                    if changed.is_err() { return; }
                    if !self.send_changes(&tx).await { return; }
                },
                _ = tx.closed() => return,
            }
        }
    }

    /// A bookmark at the last version looked at.
    fn bookmark(&self) -> Value {
        let def = &self.res.def;
        json!({"type": "BOOKMARK", "object": {"kind": def.kind, "apiVersion": def.api_version(), "metadata": {"resourceVersion": self.last.to_string()}}})
    }

    /// Send the changes since the last one looked at; false when the watch is to end (the
    /// client went, or too slow a reader: its next changes already dropped from the history,
    /// so it lists again).
    async fn send_changes(&mut self, tx: &mpsc::Sender<Result<Bytes, std::io::Error>>) -> bool {
        let Some(changes) = self.store.changes_after(self.last) else {
            return false;
        };
        for c in changes {
            self.last = c.rv;
            if self.filter.matches(&c) {
                let kind = match c.kind {
                    ChangeKind::Added => "ADDED",
                    ChangeKind::Modified => "MODIFIED",
                    ChangeKind::Deleted => "DELETED",
                };
                let mut event = json!({"type": kind});
                event["object"] = self.res.to_served(c.object.clone());
                if tx.send(Ok(ndjson(&self.shape.apply(event)))).await.is_err() {
                    return false;
                }
            }
        }
        true
    }
}
