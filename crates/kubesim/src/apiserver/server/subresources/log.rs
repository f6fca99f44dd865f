//! `pods/{name}/log`: a container's log from where its kubelet keeps it, as `kubectl logs` asks
//! for it (a run, its tail, and with `follow` what it writes until it ends).

use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::server::call::{Call, Named};
use std::time::Duration;

use crate::apiserver::server::response::body_stream;
use axum::body::{Body, Bytes};

/// `pods/log` as `kubectl logs` asks it: the current run of a container (`container`, needed when
/// the pod has several), or the one before (`previous`), its last `tailLines` lines or
/// `limitBytes` bytes, and with `follow` what it writes until it ends.
pub(super) async fn pod_log(call: &Call, at: &Named, _req: Request) -> ApiResult<Response> {
    if call.method != Method::GET {
        return Err(call.not_supported(&at.res.def, "log"));
    }
    let Named { res, ns, name } = at;
    let pod = res.get(ns, name)?;
    let bad = |m: String| ApiError::bad_request(m);
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
    let container = match call.q.get("container").filter(|c| !c.is_empty()) {
        Some(c) if containers.contains(&c.as_str()) => c.clone(),
        Some(c) => {
            return Err(bad(format!("container {c} is not valid for pod {name}")));
        }
        None if mains.len() == 1 => mains[0].to_string(),
        None => {
            return Err(bad(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                mains.join(" ")
            )));
        }
    };
    let status = ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| pod["status"][*k].as_array().into_iter().flatten())
        .find(|s| s["name"] == container.as_str())
        .cloned()
        .unwrap_or(Value::Null);
    let restarts = status["restartCount"].as_u64().unwrap_or(0) as u32;
    let state = &status["state"];
    let ended_before = status["lastState"]["terminated"].is_object() && restarts > 0;
    let previous = call.q.flag("previous");
    // As the kubelet picks the run: the current one once it has started, else (waiting to
    // restart) the one that ended last; `previous`, the one that ended last.
    let instance = if previous {
        ended_before.then(|| restarts - 1).ok_or_else(|| {
            bad(format!(
                "previous terminated container {container:?} in pod {name:?} not found"
            ))
        })?
    } else if state["running"].is_object() || state["terminated"].is_object() {
        restarts
    } else if ended_before {
        restarts - 1
    } else {
        let reason = state["waiting"]["reason"]
            .as_str()
            .unwrap_or("ContainerCreating");
        return Err(bad(format!(
            "container {container:?} in pod {name:?} is waiting to start: {reason}"
        )));
    };
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
    let store = call.store.clone();
    let def = res.def.clone();
    let (ns, name) = (ns.clone(), name.clone());
    let first = head.to_vec();
    let mut offset = text.len() as u64;
    let stream = body_stream(move |tx| async move {
        if tx.send(Ok(Bytes::from(first))).await.is_err() {
            return;
        }
        let mut changes = store.subscribe();
        loop {
            let running = store.get(&def, &ns, &name).ok().is_some_and(|pod| {
                ["initContainerStatuses", "containerStatuses"]
                    .iter()
                    .flat_map(|k| pod["status"][*k].as_array().cloned().unwrap_or_default())
                    .any(|s| {
                        s["name"] == container.as_str()
                            && s["restartCount"].as_u64().unwrap_or(0) as u32 == instance
                            && s["state"]["running"].is_object()
                    })
            });
            let more = read_from(&file, &mut offset);
            if !more.is_empty() && tx.send(Ok(Bytes::from(more))).await.is_err() {
                return;
            }
            if !running {
                let rest = read_from(&file, &mut offset);
                if !rest.is_empty() {
                    let _ = tx.send(Ok(Bytes::from(rest))).await;
                }
                return;
            }
            // The log grows between changes of the cluster too: look again soon.
            let _ = tokio::time::timeout(Duration::from_millis(200), changes.changed()).await;
        }
    });
    Ok((StatusCode::OK, text_plain, Body::from_stream(stream)).into_response())
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
