//! A pod's spec as ValidatePodSpec checks it (the parts the development cluster's kubelet
//! relies on): volumes and their file paths, containers' names, ports, environment, mounts,
//! devices and resources, the node selector and tolerations.

use std::collections::BTreeSet;

use serde_json::Value;

use super::field::{BadValue, ErrorType, FieldError};
use super::meta::str_map;
use super::names::{
    dns1123_label_errors, is_label_value, is_qualified_name, is_valid_port_name, is_valid_port_num,
};

fn mount_path_local_descending(value: &str, field: &str, out: &mut Vec<FieldError>) {
    if value.starts_with('/') {
        out.push(FieldError::invalid(field, value, "must be a relative path"));
    }
    if value.replace('\\', "/").split('/').any(|p| p == "..") {
        out.push(FieldError::invalid(field, value, "must not contain '..'"));
    }
}

fn container_ports(ports: &Value, path: &str, out: &mut Vec<FieldError>) {
    let mut names = BTreeSet::new();
    for (i, port) in ports.as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}[{i}]");
        let name = port["name"].as_str().unwrap_or("");
        if !name.is_empty() {
            let msgs = is_valid_port_name(name);
            if !msgs.is_empty() {
                for m in msgs {
                    out.push(FieldError::invalid(&format!("{at}.name"), name, &m));
                }
            } else if !names.insert(name.to_string()) {
                out.push(FieldError::duplicate(&format!("{at}.name"), name));
            }
        }
        match port["containerPort"].as_i64().unwrap_or(0) {
            0 => out.push(FieldError::required(&format!("{at}.containerPort"), "")),
            n => {
                for m in is_valid_port_num(n) {
                    out.push(FieldError::new(
                        ErrorType::Invalid,
                        &format!("{at}.containerPort"),
                        BadValue::Int(n),
                        &m,
                    ));
                }
            }
        }
        let host = port["hostPort"].as_i64().unwrap_or(0);
        if host != 0 {
            for m in is_valid_port_num(host) {
                out.push(FieldError::new(
                    ErrorType::Invalid,
                    &format!("{at}.hostPort"),
                    BadValue::Int(host),
                    &m,
                ));
            }
        }
        // An absent protocol is defaulted to TCP.
        if let Some(p) = port["protocol"].as_str()
            && !["SCTP", "TCP", "UDP"].contains(&p)
        {
            out.push(FieldError::not_supported(
                &format!("{at}.protocol"),
                BadValue::Str(p.into()),
                &["SCTP", "TCP", "UDP"],
            ));
        }
    }
}

fn volume_mounts(
    mounts: &Value,
    volumes: &BTreeSet<String>,
    path: &str,
    out: &mut Vec<FieldError>,
) {
    let mut points = BTreeSet::new();
    for (i, m) in mounts.as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}[{i}]");
        let name = m["name"].as_str().unwrap_or("");
        if name.is_empty() {
            out.push(FieldError::required(&format!("{at}.name"), ""));
        }
        if !volumes.contains(name) {
            out.push(FieldError::not_found(&format!("{at}.name"), name));
        }
        let mount_path = m["mountPath"].as_str().unwrap_or("");
        if mount_path.is_empty() {
            out.push(FieldError::required(&format!("{at}.mountPath"), ""));
        }
        if !points.insert(mount_path.to_string()) {
            out.push(FieldError::invalid(
                &format!("{at}.mountPath"),
                mount_path,
                "must be unique",
            ));
        }
        // Kubernetes reports these on the list's path, not the item's.
        let sub = m["subPath"].as_str().unwrap_or("");
        if !sub.is_empty() {
            mount_path_local_descending(sub, &format!("{path}.subPath"), out);
        }
        let expr = m["subPathExpr"].as_str().unwrap_or("");
        if !expr.is_empty() {
            if !sub.is_empty() {
                out.push(FieldError::invalid(
                    &format!("{at}.subPathExpr"),
                    expr,
                    "subPathExpr and subPath are mutually exclusive",
                ));
            }
            mount_path_local_descending(expr, &format!("{path}.subPathExpr"), out);
        }
    }
}

/// validateLocalNonReservedPath: a projected file's path stays inside the volume and clear of
/// the `..data` links the kubelet's atomic writer keeps there.
fn local_non_reserved_path(value: &str, field: &str, out: &mut Vec<FieldError>) {
    mount_path_local_descending(value, field, out);
    // Not reported twice when `..` was already caught.
    if value.starts_with("..") && !value.starts_with("../") {
        out.push(FieldError::invalid(
            field,
            value,
            "must not start with '..'",
        ));
    }
}

/// validateKeyToPath over a source's `items`.
fn key_to_paths(items: &Value, path: &str, out: &mut Vec<FieldError>) {
    for (i, kp) in items.as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}[{i}]");
        if kp["key"].as_str().unwrap_or("").is_empty() {
            out.push(FieldError::required(&format!("{at}.key"), ""));
        }
        let p = kp["path"].as_str().unwrap_or("");
        if p.is_empty() {
            out.push(FieldError::required(&format!("{at}.path"), ""));
        }
        local_non_reserved_path(p, &format!("{at}.path"), out);
    }
}

/// validateDownwardAPIVolumeFile's path checks.
fn downward_api_items(items: &Value, path: &str, out: &mut Vec<FieldError>) {
    for (i, f) in items.as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}[{i}].path");
        let p = f["path"].as_str().unwrap_or("");
        if p.is_empty() {
            out.push(FieldError::required(&at, ""));
        }
        local_non_reserved_path(p, &at, out);
    }
}

/// The file paths of a volume's secret, configMap, downwardAPI and projected sources.
fn volume_item_paths(v: &Value, path: &str, out: &mut Vec<FieldError>) {
    key_to_paths(&v["secret"]["items"], &format!("{path}.secret.items"), out);
    key_to_paths(
        &v["configMap"]["items"],
        &format!("{path}.configMap.items"),
        out,
    );
    downward_api_items(
        &v["downwardAPI"]["items"],
        &format!("{path}.downwardAPI.items"),
        out,
    );
    for (i, src) in v["projected"]["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("{path}.projected.sources[{i}]");
        key_to_paths(&src["secret"]["items"], &format!("{at}.secret.items"), out);
        key_to_paths(
            &src["configMap"]["items"],
            &format!("{at}.configMap.items"),
            out,
        );
        downward_api_items(
            &src["downwardAPI"]["items"],
            &format!("{at}.downwardAPI.items"),
            out,
        );
    }
}

/// validateVolumeDevices' path check: a device path may not step out with `..`.
fn volume_devices(devices: &Value, path: &str, out: &mut Vec<FieldError>) {
    for (i, d) in devices.as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}[{i}]");
        if d["name"].as_str().unwrap_or("").is_empty() {
            out.push(FieldError::required(&format!("{at}.name"), ""));
        }
        let p = d["devicePath"].as_str().unwrap_or("");
        if p.is_empty() {
            out.push(FieldError::required(&format!("{at}.devicePath"), ""));
        }
        if p.replace('\\', "/").split('/').any(|x| x == "..") {
            out.push(FieldError::invalid(
                &format!("{at}.devicePath"),
                p,
                "can not contain backsteps ('..')",
            ));
        }
    }
}

/// IsOvercommitAllowed: native resources other than huge pages may have requests below limits;
/// the rest must have them equal.
fn overcommit_allowed(name: &str) -> bool {
    let native = !name.contains('/') || name.contains("kubernetes.io/");
    native && !name.starts_with("hugepages-")
}

/// ValidateResourceRequirements: quantities not negative, requests at most their limits.
fn resource_requirements(r: &Value, path: &str, out: &mut Vec<FieldError>) {
    let parse = |v: &Value| {
        v.as_str()
            .and_then(|s| s.trim().parse::<k8s_rules::Quantity>().ok())
    };
    let limits: Vec<(String, k8s_rules::Quantity)> = r["limits"]
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| parse(v).map(|q| (k.clone(), q)))
        .collect();
    for (k, q) in &limits {
        if q.nanos() < 0 {
            out.push(FieldError::invalid(
                &format!("{path}.limits[{k}]"),
                &q.to_string(),
                "must be greater than or equal to 0",
            ));
        }
    }
    let req_path = format!("{path}.requests");
    for (k, v) in r["requests"].as_object().into_iter().flatten() {
        let Some(q) = parse(v) else { continue };
        if q.nanos() < 0 {
            out.push(FieldError::invalid(
                &format!("{req_path}[{k}]"),
                &q.to_string(),
                "must be greater than or equal to 0",
            ));
        }
        let Some((_, limit)) = limits.iter().find(|(l, _)| l == k) else {
            continue;
        };
        if q.nanos() != limit.nanos() && !overcommit_allowed(k) {
            out.push(FieldError::invalid(
                &req_path,
                &q.to_string(),
                &format!("must be equal to {k} limit of {limit}"),
            ));
        } else if q.nanos() > limit.nanos() {
            out.push(FieldError::invalid(
                &req_path,
                &q.to_string(),
                &format!("must be less than or equal to {k} limit of {limit}"),
            ));
        }
    }
}

const TAINT_EFFECTS: &[&str] = &["NoSchedule", "PreferNoSchedule", "NoExecute"];

/// ValidateTolerations.
fn tolerations(list: &Value, path: &str, out: &mut Vec<FieldError>) {
    for (i, t) in list.as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}[{i}]");
        let key = t["key"].as_str().unwrap_or("");
        let op = t["operator"].as_str().unwrap_or("");
        let effect = t["effect"].as_str().unwrap_or("");
        let value = t["value"].as_str().unwrap_or("");
        if !key.is_empty() {
            for m in is_qualified_name(key) {
                out.push(FieldError::invalid(&format!("{at}.key"), key, &m));
            }
        }
        if key.is_empty() && op != "Exists" {
            out.push(FieldError::invalid(
                &format!("{at}.operator"),
                op,
                "operator must be Exists when `key` is empty, which means \"match all values and all keys\"",
            ));
        }
        if !t["tolerationSeconds"].is_null() && effect != "NoExecute" {
            out.push(FieldError::invalid(
                &format!("{at}.effect"),
                effect,
                "effect must be 'NoExecute' when `tolerationSeconds` is set",
            ));
        }
        match op {
            "Equal" | "" => {
                let errs = is_label_value(value);
                if !errs.is_empty() {
                    out.push(FieldError::invalid(
                        &format!("{at}.operator"),
                        value,
                        &errs.join(";"),
                    ));
                }
            }
            "Exists" => {
                if !value.is_empty() {
                    // kube prints the whole toleration as the value; the value says enough.
                    out.push(FieldError::invalid(
                        &format!("{at}.operator"),
                        value,
                        "value must be empty when `operator` is 'Exists'",
                    ));
                }
            }
            other => out.push(FieldError::not_supported(
                &format!("{at}.operator"),
                BadValue::Str(other.into()),
                &["Equal", "Exists"],
            )),
        }
        if !effect.is_empty() && !TAINT_EFFECTS.contains(&effect) {
            out.push(FieldError::not_supported(
                &format!("{at}.effect"),
                BadValue::Str(effect.into()),
                TAINT_EFFECTS,
            ));
        }
    }
}

/// validateContainerCommon (the parts the development cluster's kubelet relies on).
fn container(c: &Value, volumes: &BTreeSet<String>, path: &str, out: &mut Vec<FieldError>) {
    let name = c["name"].as_str().unwrap_or("");
    if name.is_empty() {
        out.push(FieldError::required(&format!("{path}.name"), ""));
    } else {
        dns1123_label_errors(name, &format!("{path}.name"), out);
    }
    if c["image"].as_str().unwrap_or("").is_empty() {
        out.push(FieldError::required(&format!("{path}.image"), ""));
    }
    container_ports(&c["ports"], &format!("{path}.ports"), out);
    for (i, e) in c["env"].as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}.env[{i}].name");
        let n = e["name"].as_str().unwrap_or("");
        if n.is_empty() {
            out.push(FieldError::required(&at, ""));
        } else if n
            .chars()
            .any(|c| !(c.is_ascii_graphic() || c == ' ') || c == '=')
        {
            // RelaxedEnvironmentVariableValidation is on by default in 1.33.
            out.push(FieldError::invalid(
                &at,
                n,
                "a valid environment variable name must consist only of printable ASCII characters other than '='",
            ));
        }
    }
    volume_mounts(
        &c["volumeMounts"],
        volumes,
        &format!("{path}.volumeMounts"),
        out,
    );
    volume_devices(&c["volumeDevices"], &format!("{path}.volumeDevices"), out);
    resource_requirements(&c["resources"], &format!("{path}.resources"), out);
}

/// ValidatePodSpec: volumes, containers, init containers.
pub fn pod_spec(spec: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut volumes = BTreeSet::new();
    for (i, v) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        let at = format!("{path}.volumes[{i}].name");
        let name = v["name"].as_str().unwrap_or("");
        let mut errs = Vec::new();
        if name.is_empty() {
            errs.push(FieldError::required(&at, ""));
        } else {
            dns1123_label_errors(name, &at, &mut errs);
        }
        if volumes.contains(name) {
            errs.push(FieldError::duplicate(&at, name));
        }
        volume_item_paths(v, &format!("{path}.volumes[{i}]"), &mut errs);
        // A volume with errors is not one that mounts can name.
        if errs.is_empty() {
            volumes.insert(name.to_string());
        }
        out.extend(errs);
    }
    let containers = spec["containers"].as_array().cloned().unwrap_or_default();
    if containers.is_empty() {
        out.push(FieldError::required(&format!("{path}.containers"), ""));
    }
    let mut names = BTreeSet::new();
    for (i, c) in containers.iter().enumerate() {
        let at = format!("{path}.containers[{i}]");
        container(c, &volumes, &at, &mut out);
        let name = c["name"].as_str().unwrap_or("");
        if !names.insert(name.to_string()) {
            out.push(FieldError::duplicate(&format!("{at}.name"), name));
        }
    }
    for (i, c) in spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("{path}.initContainers[{i}]");
        container(c, &volumes, &at, &mut out);
        let name = c["name"].as_str().unwrap_or("");
        if names.contains(name) {
            out.push(FieldError::duplicate(&format!("{at}.name"), name));
        } else if !name.is_empty() {
            names.insert(name.to_string());
        }
    }
    // ValidateLabels on the node selector.
    for (k, v) in str_map(&spec["nodeSelector"]) {
        for m in is_qualified_name(&k) {
            out.push(FieldError::invalid(&format!("{path}.nodeSelector"), &k, &m));
        }
        for m in is_label_value(&v) {
            out.push(FieldError::invalid(&format!("{path}.nodeSelector"), &v, &m));
        }
    }
    tolerations(
        &spec["tolerations"],
        &format!("{path}.tolerations"),
        &mut out,
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::validation::testing::{bodies, def};
    use crate::apiserver::validation::validate;
    use serde_json::json;

    #[test]
    fn pods_containers_volumes_ports_and_mounts() {
        let pods = def("", "pods");
        let pod = |spec: Value| json!({"metadata": {"name": "p"}, "spec": spec});
        let ok = pod(json!({"volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{"name": "main", "image": "x",
                "ports": [{"name": "metrics", "containerPort": 8080}],
                "volumeMounts": [{"name": "data", "mountPath": "/data", "subPath": "a/b"}]}]}));
        assert!(validate(&pods, &ok, true).is_empty());

        let bad = pod(json!({"containers": [{"name": "../../../../tmp/x", "image": "x"}]}));
        assert_eq!(
            bodies(&validate(&pods, &bad, true)),
            [
                "spec.containers[0].name: Invalid value: \"../../../../tmp/x\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
            ]
        );

        let bad = pod(json!({
            "volumes": [{"name": "Data"}, {"name": "v"}, {"name": "v"}],
            "containers": [
                {"name": "c", "image": "x",
                 "ports": [{"name": "-bad--name-toolong", "containerPort": 70000, "protocol": "HTTP"},
                           {"name": "web", "containerPort": 80}, {"name": "web"}],
                 "volumeMounts": [{"name": "Data", "mountPath": "/d"},
                                  {"name": "v", "mountPath": "/d", "subPath": "../up"},
                                  {"name": "v", "mountPath": "/e", "subPath": "/abs"}]},
                {"name": "c"}],
            "initContainers": [{"name": "c", "image": "x"}]}));
        assert_eq!(
            bodies(&validate(&pods, &bad, true)),
            [
                "spec.volumes[0].name: Invalid value: \"Data\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
                "spec.volumes[2].name: Duplicate value: \"v\"",
                "spec.containers[0].ports[0].name: Invalid value: \"-bad--name-toolong\": must be no more than 15 characters",
                "spec.containers[0].ports[0].name: Invalid value: \"-bad--name-toolong\": must not contain consecutive hyphens",
                "spec.containers[0].ports[0].name: Invalid value: \"-bad--name-toolong\": must not begin or end with a hyphen",
                "spec.containers[0].ports[0].containerPort: Invalid value: 70000: must be between 1 and 65535, inclusive",
                "spec.containers[0].ports[0].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "spec.containers[0].ports[2].name: Duplicate value: \"web\"",
                "spec.containers[0].ports[2].containerPort: Required value",
                "spec.containers[0].volumeMounts[0].name: Not found: \"Data\"",
                "spec.containers[0].volumeMounts[1].mountPath: Invalid value: \"/d\": must be unique",
                "spec.containers[0].volumeMounts.subPath: Invalid value: \"../up\": must not contain '..'",
                "spec.containers[0].volumeMounts.subPath: Invalid value: \"/abs\": must be a relative path",
                "spec.containers[1].image: Required value",
                "spec.containers[1].name: Duplicate value: \"c\"",
                "spec.initContainers[0].name: Duplicate value: \"c\"",
            ]
        );
        assert_eq!(
            bodies(&validate(&pods, &pod(json!({})), true)),
            ["spec.containers: Required value"]
        );
    }
}
