//! A Service's ports as kube-apiserver's ValidateService checks them (validateServicePort, then
//! its duplicate check): named when there are several, each name a DNS-1123 label given once,
//! a valid number and protocol, and each (port, protocol) pair once.

use std::collections::BTreeSet;

use serde_json::Value;

use super::field::{BadValue, ErrorType, FieldError, go_quote};
use super::names::{dns1123_label_errors, is_valid_port_num};

/// supportedPortProtocols, sorted as kube lists them.
const PROTOCOLS: [&str; 3] = ["SCTP", "TCP", "UDP"];

/// A port's protocol; absent or empty is TCP (kube defaults it before validating, this server
/// on create after).
fn protocol_of(port: &Value) -> &str {
    port["protocol"]
        .as_str()
        .filter(|p| !p.is_empty())
        .unwrap_or("TCP")
}

/// The errors of a Service's `ports` (at `path`), in kube's order: each port's own, then the
/// repeated (port, protocol) pairs.
pub(super) fn ports(ports: &Value, path: &str) -> Vec<FieldError> {
    let list = ports.as_array().map(Vec::as_slice).unwrap_or_default();
    let mut out = Vec::new();
    let mut names = BTreeSet::new();
    for (i, port) in list.iter().enumerate() {
        let at = format!("{path}[{i}]");
        let name = port["name"].as_str().unwrap_or("");
        if name.is_empty() {
            // Endpoints name the ports of a Service with several.
            if list.len() > 1 {
                out.push(FieldError::required(&format!("{at}.name"), ""));
            }
        } else {
            dns1123_label_errors(name, &format!("{at}.name"), &mut out);
            if !names.insert(name) {
                out.push(FieldError::duplicate(&format!("{at}.name"), name));
            }
        }
        let number = port["port"].as_i64().unwrap_or(0);
        for m in is_valid_port_num(number) {
            let field = format!("{at}.port");
            out.push(FieldError::new(
                ErrorType::Invalid,
                &field,
                BadValue::Int(number),
                &m,
            ));
        }
        let protocol = protocol_of(port);
        if !PROTOCOLS.contains(&protocol) {
            let value = BadValue::Str(protocol.into());
            out.push(FieldError::not_supported(
                &format!("{at}.protocol"),
                value,
                &PROTOCOLS,
            ));
        }
    }
    let mut pairs = BTreeSet::new();
    for (i, port) in list.iter().enumerate() {
        let (number, protocol) = (port["port"].as_i64().unwrap_or(0), protocol_of(port));
        if !pairs.insert((number, protocol)) {
            // kube keys the pairs by an internal core.ServicePort and prints that (Go's %#v).
            let value = format!(
                "core.ServicePort{{Name:\"\", Protocol:{}, AppProtocol:(*string)(nil), Port:{number}, TargetPort:intstr.IntOrString{{Type:0, IntVal:0, StrVal:\"\"}}, NodePort:0}}",
                go_quote(protocol)
            );
            let field = format!("{path}[{i}]");
            out.push(FieldError::new(
                ErrorType::Duplicate,
                &field,
                BadValue::Raw(value),
                "",
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;
    use serde_json::json;

    fn bodies(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn ports_are_named_valid_and_unique() {
        // cdi-api as ten applies once made it: one number and protocol, given again.
        let services = Registry::with_builtins()
            .all()
            .find(|d| d.group.is_empty() && d.plural == "services")
            .cloned()
            .unwrap();
        let svc = json!({"metadata": {"name": "cdi-api"}, "spec": {"ports": [
            {"port": 443, "targetPort": 8443}, {"port": 443, "protocol": "TCP"}]}});
        assert_eq!(
            bodies(&super::super::validate(&services, &svc, true)),
            [
                "spec.ports[0].name: Required value",
                "spec.ports[1].name: Required value",
                "spec.ports[1]: Duplicate value: core.ServicePort{Name:\"\", Protocol:\"TCP\", AppProtocol:(*string)(nil), Port:443, TargetPort:intstr.IntOrString{Type:0, IntVal:0, StrVal:\"\"}, NodePort:0}",
            ]
        );

        let bad = json!([{"name": "https", "port": 443}, {"name": "https", "port": 0, "protocol": "HTTP"},
            {"name": "Web", "port": 80}]);
        assert_eq!(
            bodies(&ports(&bad, "spec.ports")),
            [
                "spec.ports[1].name: Duplicate value: \"https\"",
                "spec.ports[1].port: Invalid value: 0: must be between 1 and 65535, inclusive",
                "spec.ports[1].protocol: Unsupported value: \"HTTP\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
                "spec.ports[2].name: Invalid value: \"Web\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
            ]
        );

        // One port needs no name; one number over two protocols is two ports.
        assert!(ports(&json!([{"port": 443}]), "spec.ports").is_empty());
        let both = json!([{"name": "https", "port": 443}, {"name": "quic", "port": 443, "protocol": "UDP"}]);
        assert!(ports(&both, "spec.ports").is_empty());
        assert!(ports(&Value::Null, "spec.ports").is_empty());
    }
}
