//! `pods/{name}/log`: a container's log from where its kubelet keeps it, as `kubectl logs` asks
//! for it (a run, its tail, and with `follow` what it writes until it ends).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::response::body_stream;
use crate::apiserver::store::Store;

/// `pods/log` as `kubectl logs` asks it: the current run of a container (`container`, needed when
/// the pod has several), or the one before (`previous`), its last `tailLines` lines or
/// `limitBytes` bytes, and with `follow` what it writes until it ends.
pub(super) async fn pod_log(call: &Call, at: &Named, _req: Request) -> ApiResult<Response> {
    if call.method != Method::GET {
        return Err(call.not_supported(&at.res.def, "log"));
    }
    let Named { res, ns, name } = at;
    let pod = res.get(ns, name)?;
    let container = container_of(call, &pod, name)?;
    let previous = call.q.flag("previous");
    let instance = run_of(&pod, &container, name, previous)?;
    let node = pod["spec"]["nodeName"].as_str().unwrap_or("");
    let Some(logs) = call.pod_logs.as_ref().filter(|_| !node.is_empty()) else {
        return Err(bad(format!(
            "container {container:?} in pod {name:?} has no logs on this cluster"
        )));
    };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or("");
    let file = logs.log_file(node, uid, &container, instance);
    let text = std::fs::read(&file).unwrap_or_default();
    let tail = call.q.int("tailLines")?.filter(|n| *n >= 0);
    let limit = call.q.int("limitBytes")?.filter(|n| *n > 0);
    let mut head = text.as_slice();
    if let Some(n) = tail {
        head = tail_lines(head, n as usize);
    }
    if let Some(limit) = limit {
        head = &head[..head.len().min(limit as usize)];
    }
    let text_plain = [(header::CONTENT_TYPE, "text/plain")];
    if !call.q.flag("follow") || previous {
        return Ok((StatusCode::OK, text_plain, head.to_vec()).into_response());
    }
    // Follow: what is there, then what the run writes, until it is no longer the running one.
    let run = Run {
        store: call.store.clone(),
        def: res.def.clone(),
        ns: ns.clone(),
        name: name.clone(),
        container,
        instance,
        file,
    };
    let stream = run.follow(head.to_vec(), text.len() as u64);
    Ok((StatusCode::OK, text_plain, Body::from_stream(stream)).into_response())
}

/// A 400 saying why the log cannot be read.
fn bad(message: String) -> ApiError {
    ApiError::bad_request(message)
}

/// The container whose log is asked for: the one named (an init container's too), or the pod's
/// only one.
fn container_of(call: &Call, pod: &Value, name: &str) -> ApiResult<String> {
    let containers: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod["spec"][*k].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    let mains: Vec<&str> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    match call.q.get("container").filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c.as_str()) => Ok(c.clone()),
        Some(c) => Err(bad(format!("container {c} is not valid for pod {name}"))),
        None if mains.len() == 1 => Ok(mains[0].to_string()),
        None => Err(bad(format!(
            "a container name must be specified for pod {name}, choose one of: [{}]",
            mains.join(" ")
        ))),
    }
}

/// Which run of `container` (its restart count then) the log is of, as the kubelet picks it:
/// the current one once it has started, else (waiting to restart) the one that ended last;
/// with `previous`, the one that ended last.
fn run_of(pod: &Value, container: &str, name: &str, previous: bool) -> ApiResult<u32> {
    let status = ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| pod["status"][*k].as_array().into_iter().flatten())
        .find(|s| s["name"] == container)
        .cloned()
        .unwrap_or(Value::Null);
    let restarts = status["restartCount"].as_u64().unwrap_or(0) as u32;
    let state = &status["state"];
    let ended_before = status["lastState"]["terminated"].is_object() && restarts > 0;
    if previous {
        ended_before.then(|| restarts - 1).ok_or_else(|| {
            bad(format!(
                "previous terminated container {container:?} in pod {name:?} not found"
            ))
        })
    } else if state["running"].is_object() || state["terminated"].is_object() {
        Ok(restarts)
    } else if ended_before {
        Ok(restarts - 1)
    } else {
        let reason = state["waiting"]["reason"]
            .as_str()
            .unwrap_or("ContainerCreating");
        Err(bad(format!(
            "container {container:?} in pod {name:?} is waiting to start: {reason}"
        )))
    }
}

/// A run of a container whose log is followed.
struct Run {
    store: Arc<Store>,
    def: ResourceDef,
    ns: String,
    name: String,
    container: String,
    instance: u32,
    file: PathBuf,
}

impl Run {
    /// `first`, then what the run writes past `offset` in its log, until it is no longer
    /// running (and what it wrote last).
    fn follow(
        self,
        first: Vec<u8>,
        mut offset: u64,
    ) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
        body_stream(move |tx| async move {
            if tx.send(Ok(Bytes::from(first))).await.is_err() {
                return;
            }
            let mut changes = self.store.subscribe();
            loop {
                let running = self.running();
                let more = read_from(&self.file, &mut offset);
                if !more.is_empty() && tx.send(Ok(Bytes::from(more))).await.is_err() {
                    return;
                }
                if !running {
                    let rest = read_from(&self.file, &mut offset);
                    if !rest.is_empty() {
                        let _ = tx.send(Ok(Bytes::from(rest))).await;
                    }
                    return;
                }
                // The log grows between changes of the cluster too: look again soon.
                let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
            }
        })
    }

    /// Whether this run is still the container's running one.
    fn running(&self) -> bool {
        let pod = self.store.get(&self.def, &self.ns, &self.name);
        pod.ok().is_some_and(|pod| {
            ["initContainerStatuses", "containerStatuses"]
                .iter()
                .flat_map(|k| pod["status"][*k].as_array().cloned().unwrap_or_default())
                .any(|s| {
                    s["name"] == self.container.as_str()
                        && s["restartCount"].as_u64().unwrap_or(0) as u32 == self.instance
                        && s["state"]["running"].is_object()
                })
        })
    }
}

/// The last `n` lines of `text`.
fn tail_lines(text: &[u8], n: usize) -> &[u8] {
    if n == 0 {
        return &[];
    }
    let body = text.strip_suffix(b"\n").unwrap_or(text);
    let mut seen = 0;
    for (i, b) in body.iter().enumerate().rev() {
        if *b == b'\n' {
            seen += 1;
            if seen == n {
                return &text[i + 1..];
            }
        }
    }
    text
}

/// What `file` holds past `offset`, moving it on.
fn read_from(file: &std::path::Path, offset: &mut u64) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut out = Vec::new();
    if let Ok(mut f) = std::fs::File::open(file)
        && f.seek(SeekFrom::Start(*offset)).is_ok()
    {
        let _ = f.read_to_end(&mut out);
    }
    *offset += out.len() as u64;
    out
}
