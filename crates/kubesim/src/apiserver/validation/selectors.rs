//! Selectors in objects: metav1 label selectors (a claim's `selector`) and node selectors (a
//! volume's node affinity), their requirements' operators, keys and values.

use serde_json::Value;

use super::field::FieldError;
use super::meta::str_map;
use super::names::{is_dns1123_subdomain, is_label_value, is_qualified_name};

/// ValidateLabelName: a label key (or selector key) is a qualified name.
pub(super) fn label_name(key: &str, path: &str, out: &mut Vec<FieldError>) {
    for msg in is_qualified_name(key) {
        out.push(FieldError::invalid(path, key, &msg));
    }
}

pub(super) fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap_or("")).collect())
        .unwrap_or_default()
}

/// One selector requirement (metav1's and the node selector's): an operator that fits its
/// values (`Gt`/`Lt` with one value only for `node` selectors), a qualified-name key, label
/// values.
pub(super) fn requirement(req: &Value, at: &str, node: bool, out: &mut Vec<FieldError>) {
    let values = strings(&req["values"]);
    match req["operator"].as_str().unwrap_or("") {
        "In" | "NotIn" if values.is_empty() => out.push(FieldError::required(
            &format!("{at}.values"),
            "must be specified when `operator` is 'In' or 'NotIn'",
        )),
        "Exists" | "DoesNotExist" if !values.is_empty() => out.push(FieldError::forbidden(
            &format!("{at}.values"),
            "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
        )),
        "Gt" | "Lt" if node && values.len() != 1 => out.push(FieldError::required(
            &format!("{at}.values"),
            "must be specified single value when `operator` is 'Lt' or 'Gt'",
        )),
        "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
        "Gt" | "Lt" if node => {}
        other => out.push(FieldError::invalid(
            &format!("{at}.operator"),
            other,
            "not a valid selector operator",
        )),
    }
    label_name(req["key"].as_str().unwrap_or(""), &format!("{at}.key"), out);
    for (k, value) in values.iter().enumerate() {
        for msg in is_label_value(value) {
            out.push(FieldError::invalid(
                &format!("{at}.values[{k}]"),
                value,
                &msg,
            ));
        }
    }
}

/// metav1 validation's ValidateLabelSelector: matchLabels as labels (errors at `matchLabels`
/// itself, as ValidateLabels reports them), each matchExpressions requirement with an operator
/// that fits its values, a qualified-name key and label values.
pub(super) fn label_selector(selector: &Value, path: &str, out: &mut Vec<FieldError>) {
    let labels = format!("{path}.matchLabels");
    for (k, v) in str_map(&selector["matchLabels"]) {
        label_name(&k, &labels, out);
        for msg in is_label_value(&v) {
            out.push(FieldError::invalid(&labels, &v, &msg));
        }
    }
    let expressions = selector["matchExpressions"].as_array();
    for (i, req) in expressions.into_iter().flatten().enumerate() {
        requirement(req, &format!("{path}.matchExpressions[{i}]"), false, out);
    }
}

/// ValidateNodeSelector (a PersistentVolume's `nodeAffinity.required`): at least one term; each
/// term's matchExpressions as ValidateNodeSelectorRequirement (Gt/Lt take one value), its
/// matchFields only `metadata.name` In/NotIn one node name.
pub(super) fn node_selector(selector: &Value, path: &str, out: &mut Vec<FieldError>) {
    let terms_at = format!("{path}.nodeSelectorTerms");
    let terms = selector["nodeSelectorTerms"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if terms.is_empty() {
        out.push(FieldError::required(
            &terms_at,
            "must have at least one node selector term",
        ));
        return;
    }
    for (i, term) in terms.iter().enumerate() {
        let term_at = format!("{terms_at}[{i}]");
        let expressions = term["matchExpressions"].as_array();
        for (j, req) in expressions.into_iter().flatten().enumerate() {
            requirement(req, &format!("{term_at}.matchExpressions[{j}]"), true, out);
        }
        let fields = term["matchFields"].as_array();
        for (j, req) in fields.into_iter().flatten().enumerate() {
            let at = format!("{term_at}.matchFields[{j}]");
            let values = strings(&req["values"]);
            match req["operator"].as_str().unwrap_or("") {
                "In" | "NotIn" => {
                    if values.len() != 1 {
                        out.push(FieldError::required(
                            &format!("{at}.values"),
                            "must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
                        ));
                    }
                }
                other => out.push(FieldError::invalid(
                    &format!("{at}.operator"),
                    other,
                    "not a valid selector operator",
                )),
            }
            let key = req["key"].as_str().unwrap_or("");
            if key != "metadata.name" {
                out.push(FieldError::invalid(
                    &format!("{at}.key"),
                    key,
                    "not a valid field selector key",
                ));
            } else {
                for (k, value) in values.iter().enumerate() {
                    for msg in is_dns1123_subdomain(value) {
                        out.push(FieldError::invalid(
                            &format!("{at}.values[{k}]"),
                            value,
                            &msg,
                        ));
                    }
                }
            }
        }
    }
}
