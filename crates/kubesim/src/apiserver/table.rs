//! Server-side printing: `Table` responses for clients that ask for them (`kubectl get`), with a
//! custom resource's printer columns.

use serde_json::{Value, json};

use super::registry::ResourceDef;

/// Whether the Accept header asks for a Table.
pub fn wants_table(accept: &str) -> bool {
    accept
        .split(',')
        .next()
        .is_some_and(|first| first.contains("as=Table"))
}

/// Evaluate the JSONPath subset printer columns use: `.a.b`, `.a[0].b`, and
/// `.a[?(@.k=="v")].b`.
pub fn json_path(obj: &Value, path: &str) -> Value {
    let mut cur = vec![obj.clone()];
    let mut rest = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim_start_matches('.');
    while !rest.is_empty() {
        if let Some(filter) = rest.strip_prefix("[?(@.") {
            let end = filter.find(")]").unwrap_or(filter.len());
            let cond = &filter[..end];
            rest = filter.get(end + 2..).unwrap_or("").trim_start_matches('.');
            let (field, want) = cond.split_once("==").unwrap_or((cond, ""));
            let want = want.trim().trim_matches(|c| c == '"' || c == '\'');
            cur = cur
                .iter()
                .filter_map(Value::as_array)
                .flatten()
                .filter(|item| item.get(field.trim()).and_then(Value::as_str) == Some(want))
                .cloned()
                .collect();
            continue;
        }
        if let Some(index) = rest.strip_prefix('[') {
            let end = index.find(']').unwrap_or(index.len());
            let i: usize = index[..end].parse().unwrap_or(usize::MAX);
            rest = index.get(end + 1..).unwrap_or("").trim_start_matches('.');
            cur = cur.iter().filter_map(|v| v.get(i).cloned()).collect();
            continue;
        }
        // A field ends at the first `.` or `[` not escaped with `\` (annotation keys).
        let mut escaped = false;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                let ends = !escaped && (c == '.' || c == '[');
                escaped = !escaped && c == '\\';
                ends
            })
            .map_or(rest.len(), |(i, _)| i);
        let field = rest[..end].replace("\\.", ".");
        let field = field.as_str();
        rest = rest[end..].trim_start_matches('.');
        cur = cur.iter().filter_map(|v| v.get(field).cloned()).collect();
    }
    cur.into_iter().next().unwrap_or(Value::Null)
}

/// Kubernetes' human-readable duration (`5s`, `3m20s`, `4h`, `2d3h`, …), as `kubectl get`
/// shows ages.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

fn age(timestamp: &Value) -> Value {
    let Some(t) = timestamp
        .as_str()
        .and_then(|s| s.parse::<jiff::Timestamp>().ok())
    else {
        return json!("<unknown>");
    };
    let seconds = jiff::Timestamp::now().as_second() - t.as_second();
    json!(human_duration(seconds))
}

/// A pod's READY, STATUS and RESTARTS cells, by kubectl's rules: the first init container that
/// has not succeeded explains the status (`Init:1/2`, `Init:CrashLoopBackOff`); otherwise the
/// last container with a waiting or terminated reason does; deletion shows `Terminating`.
fn pod_cell(pod: &Value, which: &str) -> Value {
    let status = &pod["status"];
    let mut reason = status["phase"].as_str().unwrap_or("").to_string();
    if let Some(r) = status["reason"].as_str().filter(|r| !r.is_empty()) {
        reason = r.to_string();
    }
    let exit_reason = |t: &Value, prefix: &str| match t["reason"].as_str().filter(|r| !r.is_empty())
    {
        Some(r) => format!("{prefix}{r}"),
        None => match t["signal"].as_i64().filter(|s| *s != 0) {
            Some(s) => format!("{prefix}Signal:{s}"),
            None => format!("{prefix}ExitCode:{}", t["exitCode"].as_i64().unwrap_or(0)),
        },
    };
    let empty = Vec::new();
    let inits = status["initContainerStatuses"].as_array().unwrap_or(&empty);
    let init_total = pod["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    let mut restarts = 0;
    let mut initializing = false;
    for (i, c) in inits.iter().enumerate() {
        restarts += c["restartCount"].as_i64().unwrap_or(0);
        let state = &c["state"];
        let waiting = state["waiting"]["reason"].as_str().unwrap_or("");
        if state["terminated"].is_object() {
            if state["terminated"]["exitCode"].as_i64() == Some(0) {
                continue;
            }
            reason = exit_reason(&state["terminated"], "Init:");
        } else if !waiting.is_empty() && waiting != "PodInitializing" {
            reason = format!("Init:{waiting}");
        } else {
            reason = format!("Init:{i}/{init_total}");
        }
        initializing = true;
        break;
    }
    let mut ready = 0;
    if !initializing {
        restarts = 0;
        let mut running = false;
        let containers = status["containerStatuses"].as_array().unwrap_or(&empty);
        for c in containers.iter().rev() {
            restarts += c["restartCount"].as_i64().unwrap_or(0);
            let state = &c["state"];
            if let Some(w) = state["waiting"]["reason"]
                .as_str()
                .filter(|r| !r.is_empty())
            {
                reason = w.to_string();
            } else if state["terminated"].is_object() {
                reason = exit_reason(&state["terminated"], "");
            } else if c["ready"] == true && state["running"].is_object() {
                running = true;
                ready += 1;
            }
        }
        if reason == "Completed" && running {
            let pod_ready = status["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            reason = if pod_ready { "Running" } else { "NotReady" }.into();
        }
    }
    if !pod["metadata"]["deletionTimestamp"].is_null() {
        reason = "Terminating".into();
    }
    let total = pod["spec"]["containers"].as_array().map_or(0, Vec::len);
    match which {
        "#pod.ready" => json!(format!("{ready}/{total}")),
        "#pod.status" => json!(reason),
        "#pod.restarts" => json!(restarts),
        _ => Value::Null,
    }
}

/// An event's LAST SEEN as kube's printer has it: its series' last observation, else its last
/// timestamp, else its first, else its eventTime (in either API's field names).
fn event_last_seen(event: &Value) -> Value {
    [
        ".series.lastObservedTime",
        ".lastTimestamp",
        ".deprecatedLastTimestamp",
        ".firstTimestamp",
        ".deprecatedFirstTimestamp",
        ".eventTime",
    ]
    .iter()
    .map(|path| json_path(event, path))
    .find(|v| v.as_str().is_some_and(|s| !s.is_empty()))
    .unwrap_or(Value::Null)
}

fn columns(def: &ResourceDef) -> Vec<(String, String, String, String, i64)> {
    // (name, type, format, jsonPath, priority)
    let mut cols = vec![(
        "Name".to_string(),
        "string".to_string(),
        "name".to_string(),
        ".metadata.name".to_string(),
        0,
    )];
    if def.printer_columns.is_empty() {
        cols.push((
            "Age".into(),
            "date".into(),
            String::new(),
            ".metadata.creationTimestamp".into(),
            0,
        ));
        return cols;
    }
    for c in &def.printer_columns {
        cols.push((
            c["name"].as_str().unwrap_or("").to_string(),
            c["type"].as_str().unwrap_or("string").to_string(),
            c["format"].as_str().unwrap_or("").to_string(),
            c["jsonPath"].as_str().unwrap_or("").to_string(),
            c["priority"].as_i64().unwrap_or(0),
        ));
    }
    cols
}

/// A Table of `items`; rows carry the object's metadata (or the object, if asked).
pub fn table(
    def: &ResourceDef,
    items: &[Value],
    resource_version: &str,
    include_object: bool,
) -> Value {
    let cols = columns(def);
    let definitions: Vec<Value> = cols
        .iter()
        .map(|(name, ty, format, _, priority)| json!({"name": name, "type": ty, "format": format, "description": "", "priority": priority}))
        .collect();
    let rows: Vec<Value> = items
        .iter()
        .map(|obj| {
            // Dates are shown as ages, computed here as kube-apiserver does.
            let cells: Vec<Value> = cols
                .iter()
                .map(|(_, ty, _, path, _)| {
                    let v = if path.starts_with("#pod.") {
                        pod_cell(obj, path)
                    } else if path == "#service.ports" {
                        let ports: Vec<String> = obj["spec"]["ports"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|p| {
                                format!(
                                    "{}/{}",
                                    p["port"].as_i64().unwrap_or(0),
                                    p["protocol"].as_str().unwrap_or("TCP")
                                )
                            })
                            .collect();
                        json!(if ports.is_empty() { "<none>".to_string() } else { ports.join(",") })
                    } else if path == "#service.selector" {
                        let selector: Vec<String> = obj["spec"]["selector"]
                            .as_object()
                            .into_iter()
                            .flatten()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                            .collect();
                        json!(if selector.is_empty() { "<none>".to_string() } else { selector.join(",") })
                    } else if path == "#apiservice.service" {
                        let svc = &obj["spec"]["service"];
                        json!(if svc.is_object() {
                            format!(
                                "{}/{}",
                                svc["namespace"].as_str().unwrap_or(""),
                                svc["name"].as_str().unwrap_or("")
                            )
                        } else {
                            "Local".to_string()
                        })
                    } else if path == "#apiservice.available" {
                        // kube's printer: the status, and the reason when it is not True.
                        let available = obj["status"]["conditions"]
                            .as_array()
                            .and_then(|c| c.iter().find(|c| c["type"] == "Available"));
                        json!(match available {
                            None => "Unknown".to_string(),
                            Some(c) if c["status"] == "True" => "True".to_string(),
                            Some(c) => format!(
                                "{} ({})",
                                c["status"].as_str().unwrap_or(""),
                                c["reason"].as_str().unwrap_or("")
                            ),
                        })
                    } else if path == "#deployment.ready" {
                        let ready = obj["status"]["readyReplicas"].as_i64().unwrap_or(0);
                        let want = obj["spec"]["replicas"].as_i64().unwrap_or(1);
                        json!(format!("{ready}/{want}"))
                    } else if path == "#event.lastSeen" {
                        event_last_seen(obj)
                    } else if path == "#storage.status" {
                        // kubectl's printer: a claim or volume being deleted is Terminating.
                        if obj["metadata"]["deletionTimestamp"].is_null() {
                            obj["status"]["phase"].clone()
                        } else {
                            json!("Terminating")
                        }
                    } else {
                        json_path(obj, path)
                    };
                    if ty == "date" && !v.is_null() { age(&v) } else { v }
                })
                .collect();
            let object = if include_object {
                obj.clone()
            } else {
                json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"]})
            };
            json!({"cells": cells, "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": definitions,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_cells_as_kubectl_shows_them() {
        let cells =
            |pod: Value| ["#pod.ready", "#pod.status", "#pod.restarts"].map(|w| pod_cell(&pod, w));
        let spec = json!({"containers": [{"name": "a"}, {"name": "b"}]});
        let running = json!({"state": {"running": {}}, "ready": true, "restartCount": 1});
        let crashing =
            json!({"state": {"waiting": {"reason": "CrashLoopBackOff"}}, "restartCount": 4});
        assert_eq!(
            cells(json!({"spec": spec, "status": {"phase": "Running",
                "containerStatuses": [running, crashing]}})),
            [json!("1/2"), json!("CrashLoopBackOff"), json!(5)]
        );
        let done = json!({"state": {"terminated": {"exitCode": 0, "reason": "Completed"}}});
        assert_eq!(
            cells(
                json!({"spec": {"containers": [{}]}, "status": {"phase": "Succeeded",
                "containerStatuses": [done]}})
            )[1],
            json!("Completed")
        );
        let killed = json!({"state": {"terminated": {"exitCode": 137, "signal": 9}}});
        assert_eq!(
            cells(
                json!({"spec": {"containers": [{}]}, "status": {"phase": "Failed",
                "containerStatuses": [killed]}})
            )[1],
            json!("Signal:9")
        );
        let init = json!({"spec": {"initContainers": [{}, {}], "containers": [{}]},
            "status": {"phase": "Pending", "initContainerStatuses": [
                {"state": {"terminated": {"exitCode": 0}}},
                {"state": {"running": {}}}]}});
        assert_eq!(cells(init)[1], json!("Init:1/2"));
        let deleting = json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": spec, "status": {"phase": "Running"}});
        assert_eq!(cells(deleting)[1], json!("Terminating"));
    }

    #[test]
    fn claims_and_volumes_being_deleted_are_terminating() {
        let def = crate::apiserver::registry::Registry::with_builtins()
            .get("", "v1", "persistentvolumeclaims")
            .cloned()
            .unwrap();
        let bound = json!({"metadata": {"name": "a"}, "status": {"phase": "Bound"}});
        let deleting = json!({"metadata": {"name": "b", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "status": {"phase": "Bound"}});
        let table = table(&def, &[bound, deleting], "1", false);
        let status: Vec<&Value> = table["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| &r["cells"][1])
            .collect();
        assert_eq!(status, [&json!("Bound"), &json!("Terminating")]);
    }

    #[test]
    fn events_last_seen_as_kubes_printer() {
        let seen = |e: Value| event_last_seen(&e);
        let times = json!({"eventTime": "t0", "firstTimestamp": "t1", "lastTimestamp": "t2",
            "series": {"lastObservedTime": "t3"}});
        assert_eq!(seen(times.clone()), json!("t3"));
        let mut single = times;
        single.as_object_mut().unwrap().remove("series");
        assert_eq!(seen(single.clone()), json!("t2"));
        single.as_object_mut().unwrap().remove("lastTimestamp");
        assert_eq!(seen(single.clone()), json!("t1"));
        single.as_object_mut().unwrap().remove("firstTimestamp");
        assert_eq!(seen(single), json!("t0"));
        assert_eq!(
            seen(json!({"eventTime": "t0", "deprecatedLastTimestamp": "t2"})),
            json!("t2")
        );
        assert_eq!(seen(json!({})), Value::Null);
    }

    #[test]
    fn printer_column_paths() {
        let obj = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}, {"type": "Complete", "status": "True"}]}, "spec": {"list": [{"a": 1}, {"a": 2}]}});
        assert_eq!(json_path(&obj, ".status.phase"), json!("Running"));
        assert_eq!(
            json_path(&obj, ".status.conditions[?(@.type==\"Complete\")].status"),
            json!("True")
        );
        assert_eq!(json_path(&obj, ".spec.list[1].a"), json!(2));
        assert_eq!(json_path(&obj, ".status.missing"), Value::Null);
        let claim =
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-2"}}});
        assert_eq!(
            json_path(
                &claim,
                ".metadata.annotations.volume\\.kubernetes\\.io/selected-node"
            ),
            json!("node-2")
        );
        assert!(wants_table(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
        ));
        assert!(!wants_table("application/json"));
        let ages = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (600, "10m"),
            (3 * 3600 + 60, "3h1m"),
            (30 * 3600, "30h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (800 * 86400, "2y70d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (s, want) in ages {
            assert_eq!(human_duration(s), want, "{s}");
        }
    }
}
