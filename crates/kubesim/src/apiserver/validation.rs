//! Object validation as kube-apiserver does it before storing: names per kind, metadata (labels,
//! annotations, owner references, finalizers), pods' containers, volumes, ports and mounts,
//! Services' ports, and the size of ConfigMaps and Secrets. Every failure is a field error
//! printed exactly as k8s.io/apimachinery's `field.Error` prints it, so that messages match a
//! real cluster's.
//!
//! The rules and messages come from k8s.io/apimachinery/pkg/util/validation/validation.go,
//! .../api/validation/{objectmeta,generic}.go, .../apis/meta/v1/validation and
//! k8s.io/kubernetes/pkg/apis/core/validation/validation.go (Kubernetes 1.33).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::registry::ResourceDef;

mod service;

/// The kinds of field errors (field.ErrorType).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    NotFound,
    Required,
    Duplicate,
    Invalid,
    NotSupported,
    Forbidden,
    TooLong,
}

impl ErrorType {
    /// The cause type in a Status' `details.causes`.
    pub fn reason(self) -> &'static str {
        match self {
            ErrorType::NotFound => "FieldValueNotFound",
            ErrorType::Required => "FieldValueRequired",
            ErrorType::Duplicate => "FieldValueDuplicate",
            ErrorType::Invalid => "FieldValueInvalid",
            ErrorType::NotSupported => "FieldValueNotSupported",
            ErrorType::Forbidden => "FieldValueForbidden",
            ErrorType::TooLong => "FieldValueTooLong",
        }
    }

    fn text(self) -> &'static str {
        match self {
            ErrorType::NotFound => "Not found",
            ErrorType::Required => "Required value",
            ErrorType::Duplicate => "Duplicate value",
            ErrorType::Invalid => "Invalid value",
            ErrorType::NotSupported => "Unsupported value",
            ErrorType::Forbidden => "Forbidden",
            ErrorType::TooLong => "Too long",
        }
    }
}

/// The offending value, as Go prints it in an error.
#[derive(Debug, Clone, PartialEq)]
pub enum BadValue {
    /// Not printed.
    Omitted,
    /// Printed quoted (`%q`).
    Str(String),
    /// Printed plainly.
    Int(i64),
    /// Printed as given (Go's `%#v` of composite values).
    Raw(String),
}

/// One field error.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    pub kind: ErrorType,
    pub field: String,
    pub value: BadValue,
    pub detail: String,
}

impl FieldError {
    fn new(kind: ErrorType, field: &str, value: BadValue, detail: &str) -> Self {
        FieldError {
            kind,
            field: field.to_string(),
            value,
            detail: detail.to_string(),
        }
    }

    pub fn invalid(field: &str, value: &str, detail: &str) -> Self {
        Self::new(
            ErrorType::Invalid,
            field,
            BadValue::Str(value.into()),
            detail,
        )
    }

    pub fn forbidden(field: &str, detail: &str) -> Self {
        Self::new(ErrorType::Forbidden, field, BadValue::Omitted, detail)
    }

    pub fn required(field: &str, detail: &str) -> Self {
        Self::new(ErrorType::Required, field, BadValue::Omitted, detail)
    }

    pub fn not_found(field: &str, value: &str) -> Self {
        Self::new(ErrorType::NotFound, field, BadValue::Str(value.into()), "")
    }

    pub fn duplicate(field: &str, value: &str) -> Self {
        Self::new(ErrorType::Duplicate, field, BadValue::Str(value.into()), "")
    }

    /// field.TooLong: "must have at most N bytes".
    pub fn too_long(field: &str, max: usize) -> Self {
        Self::new(
            ErrorType::TooLong,
            field,
            BadValue::Omitted,
            &format!("must have at most {max} bytes"),
        )
    }

    /// field.NotSupported with the supported values listed (quoted).
    pub fn not_supported(field: &str, value: BadValue, supported: &[&str]) -> Self {
        let list: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
        let detail = if list.is_empty() {
            String::new()
        } else {
            format!("supported values: {}", list.join(", "))
        };
        Self::new(ErrorType::NotSupported, field, value, &detail)
    }

    /// The message without the field (field.Error.ErrorBody).
    pub fn body(&self) -> String {
        let text = self.kind.text();
        let mut s = match (self.kind, &self.value) {
            (ErrorType::Required | ErrorType::Forbidden | ErrorType::TooLong, _) => {
                text.to_string()
            }
            (_, BadValue::Omitted) => text.to_string(),
            (_, BadValue::Str(v)) => format!("{text}: {}", go_quote(v)),
            (_, BadValue::Int(i)) => format!("{text}: {i}"),
            (_, BadValue::Raw(r)) => format!("{text}: {r}"),
        };
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }

    /// (field, message) as a Status cause.
    pub fn cause(&self) -> (String, String) {
        (self.field.clone(), self.body())
    }
}

/// A string quoted as Go's `%q` does (printable characters kept, others escaped).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => {
                let n = c as u32;
                if n <= 0xffff {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

// --- k8s.io/apimachinery/pkg/util/validation ---------------------------------------------------

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_LABEL_ERR: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_FMT: &str =
    "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1123_SUBDOMAIN_ERR: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const DNS1035_LABEL_ERR: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const QUALIFIED_NAME_ERR: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const LABEL_VALUE_ERR: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const CONFIG_MAP_KEY_FMT: &str = "[-._a-zA-Z0-9]+";
const CONFIG_MAP_KEY_ERR: &str =
    "a valid config key must consist of alphanumeric characters, '-', '_' or '.'";

/// DNS1123SubdomainMaxLength.
pub const SUBDOMAIN_MAX: usize = 253;
/// DNS1123LabelMaxLength (and DNS1035LabelMaxLength, the label-key name part, label values).
pub const LABEL_MAX: usize = 63;
/// TotalAnnotationSizeLimitB.
pub const ANNOTATIONS_MAX: usize = 256 << 10;
/// core.MaxSecretSize, the limit of a ConfigMap's or Secret's data.
pub const DATA_MAX: usize = 1 << 20;

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// validation.RegexError, with its quirk of a doubled space between examples.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    if examples.is_empty() {
        return format!("{msg} (regex used for validation is '{fmt}')");
    }
    let mut out = format!("{msg} (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            out.push_str(" or ");
        }
        out.push_str(&format!("'{e}', "));
    }
    out.push_str(&format!("regex used for validation is '{fmt}')"));
    out
}

fn alnum_lower(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && alnum_lower(b[0])
        && alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| alnum_lower(c) || c == b'-')
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_MAX {
        errs.push(max_len_error(LABEL_MAX));
    }
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            errs.push("must not contain dots".into());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    errs
}

pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > SUBDOMAIN_MAX {
        errs.push(max_len_error(SUBDOMAIN_MAX));
    }
    if !matches_dns1123_subdomain(value) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    errs
}

pub fn is_dns1035_label(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_MAX {
        errs.push(max_len_error(LABEL_MAX));
    }
    let b = value.as_bytes();
    let ok = !b.is_empty()
        && b[0].is_ascii_lowercase()
        && alnum_lower(b[b.len() - 1])
        && b.iter().all(|&c| alnum_lower(c) || c == b'-');
    if !ok {
        errs.push(regex_error(
            DNS1035_LABEL_ERR,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    errs
}

/// IsQualifiedName: label keys, annotation keys, finalizers.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else {
                errs.extend(
                    is_dns1123_subdomain(prefix)
                        .into_iter()
                        .map(|m| format!("prefix part {m}")),
                );
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(QUALIFIED_NAME_ERR, QUALIFIED_NAME_FMT, &["MyName", "my.name", "123-abc"])
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".into());
    } else if name.len() > LABEL_MAX {
        errs.push(format!("name part {}", max_len_error(LABEL_MAX)));
    }
    if !matches_qualified_name(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"]
            )
        ));
    }
    errs
}

pub fn is_label_value(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > LABEL_MAX {
        errs.push(max_len_error(LABEL_MAX));
    }
    if !value.is_empty() && !matches_qualified_name(value) {
        errs.push(regex_error(
            LABEL_VALUE_ERR,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    errs
}

fn has_chdir_prefix(value: &str) -> Option<String> {
    match value {
        "." => Some("must not be '.'".into()),
        ".." => Some("must not be '..'".into()),
        v if v.starts_with("..") => Some("must not start with '..'".into()),
        _ => None,
    }
}

pub fn is_config_map_key(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if value.len() > SUBDOMAIN_MAX {
        errs.push(max_len_error(SUBDOMAIN_MAX));
    }
    let ok = !value.is_empty()
        && value
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_'));
    if !ok {
        errs.push(regex_error(
            CONFIG_MAP_KEY_ERR,
            CONFIG_MAP_KEY_FMT,
            &["key.name", "KEY_NAME", "key-name"],
        ));
    }
    errs.extend(has_chdir_prefix(value));
    errs
}

/// IsValidPortName: an IANA_SVC_NAME.
pub fn is_valid_port_name(port: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if port.len() > 15 {
        errs.push(max_len_error(15));
    }
    if port.is_empty() || !port.bytes().all(|c| alnum_lower(c) || c == b'-') {
        errs.push("must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)".into());
    }
    if !port.bytes().any(|c| c.is_ascii_lowercase()) {
        errs.push("must contain at least one letter (a-z)".into());
    }
    if port.contains("--") {
        errs.push("must not contain consecutive hyphens".into());
    }
    if port.starts_with('-') || port.ends_with('-') {
        errs.push("must not begin or end with a hyphen".into());
    }
    errs
}

fn is_valid_port_num(port: i64) -> Vec<String> {
    if (1..=65535).contains(&port) {
        Vec::new()
    } else {
        vec!["must be between 1 and 65535, inclusive".into()]
    }
}

/// IsValidPathSegmentName: what a name in a request path may not be.
pub fn is_path_segment_name(name: &str) -> Vec<String> {
    for bad in [".", ".."] {
        if name == bad {
            return vec![format!("may not be '{bad}'")];
        }
    }
    ["/", "%"]
        .iter()
        .filter(|bad| name.contains(**bad))
        .map(|bad| format!("may not contain '{bad}'"))
        .collect()
}

// --- names per kind ----------------------------------------------------------------------------

/// The rule a kind's names follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameRule {
    /// NameIsDNSSubdomain: most kinds, custom resources included.
    Subdomain,
    /// NameIsDNSLabel: namespaces.
    Label,
    /// NameIsDNS1035Label: services.
    Dns1035,
    /// ValidateRBACName (path.IsValidPathSegmentName): roles and bindings, whose names may hold
    /// colons (`system:auth-delegator`, `cdi.kubevirt.io:edit`).
    PathSegment,
}

pub fn name_rule(def: &ResourceDef) -> NameRule {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "namespaces") => NameRule::Label,
        ("", "services") => NameRule::Dns1035,
        ("rbac.authorization.k8s.io", _) => NameRule::PathSegment,
        _ => NameRule::Subdomain,
    }
}

/// maskTrailingDash: a generateName may end in '-' (kube replaces the last two characters).
fn mask_trailing_dash(name: &str) -> String {
    match name.strip_suffix('-') {
        Some(_) if name.len() >= 2 => format!("{}a", &name[..name.len() - 2]),
        Some(_) => "a".into(),
        None => name.to_string(),
    }
}

/// The ValidateNameFunc of a rule.
pub fn check_name(rule: NameRule, name: &str, prefix: bool) -> Vec<String> {
    let name = if prefix {
        mask_trailing_dash(name)
    } else {
        name.to_string()
    };
    match rule {
        NameRule::Subdomain => is_dns1123_subdomain(&name),
        NameRule::Label => is_dns1123_label(&name),
        NameRule::Dns1035 => is_dns1035_label(&name),
        NameRule::PathSegment => is_path_segment_name(&name),
    }
}

fn dns1123_label_errors(value: &str, field: &str, out: &mut Vec<FieldError>) {
    for m in is_dns1123_label(value) {
        out.push(FieldError::invalid(field, value, &m));
    }
}

// --- metadata ----------------------------------------------------------------------------------

fn str_map(v: &Value) -> Vec<(String, String)> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

/// ValidateObjectMetaAccessor. `create`: the name (and generateName) are checked too; updates
/// cannot change the name.
pub fn object_meta(def: &ResourceDef, obj: &Value, create: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = &obj["metadata"];
    let rule = name_rule(def);
    if create {
        let generate = meta["generateName"].as_str().unwrap_or("");
        if !generate.is_empty() {
            for m in check_name(rule, generate, true) {
                errs.push(FieldError::invalid("metadata.generateName", generate, &m));
            }
        }
        let name = meta["name"].as_str().unwrap_or("");
        if name.is_empty() {
            errs.push(FieldError::required(
                "metadata.name",
                "name or generateName is required",
            ));
        } else {
            for m in check_name(rule, name, false) {
                errs.push(FieldError::invalid("metadata.name", name, &m));
            }
        }
    }
    for (k, v) in str_map(&meta["labels"]) {
        for m in is_qualified_name(&k) {
            errs.push(FieldError::invalid("metadata.labels", &k, &m));
        }
        for m in is_label_value(&v) {
            errs.push(FieldError::invalid("metadata.labels", &v, &m));
        }
    }
    let annotations = str_map(&meta["annotations"]);
    for (k, _) in &annotations {
        // Annotation keys are qualified names in any case.
        for m in is_qualified_name(&k.to_lowercase()) {
            errs.push(FieldError::invalid("metadata.annotations", k, &m));
        }
    }
    let total: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if total > ANNOTATIONS_MAX {
        errs.push(FieldError::too_long(
            "metadata.annotations",
            ANNOTATIONS_MAX,
        ));
    }
    if let Some(refs) = meta["ownerReferences"].as_array() {
        let path = "metadata.ownerReferences";
        for r in refs {
            let api_version = r["apiVersion"].as_str().unwrap_or("");
            let version = api_version.rsplit('/').next().unwrap_or("");
            if version.is_empty() {
                errs.push(FieldError::invalid(
                    &format!("{path}.apiVersion"),
                    api_version,
                    "version must not be empty",
                ));
            }
            for field in ["kind", "name", "uid"] {
                let v = r[field].as_str().unwrap_or("");
                if v.is_empty() {
                    errs.push(FieldError::invalid(
                        &format!("{path}.{field}"),
                        v,
                        "must not be empty",
                    ));
                }
            }
        }
    }
    if let Some(fins) = meta["finalizers"].as_array() {
        for f in fins.iter().filter_map(Value::as_str) {
            for m in is_qualified_name(f) {
                errs.push(FieldError::invalid("metadata.finalizers", f, &m));
            }
        }
    }
    errs
}

// --- kinds -------------------------------------------------------------------------------------

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

/// A Secret's `data` value: base64 (its decoded size counts).
fn decoded_len(v: &Value) -> usize {
    use base64::Engine;
    let s = v.as_str().unwrap_or_default();
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map(|d| d.len())
        .unwrap_or(s.len())
}

/// ValidateConfigMap: keys, keys in both `data` and `binaryData`, and 1 MiB of data at most.
pub fn config_map(obj: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let data = obj["data"].as_object();
    let binary = obj["binaryData"].as_object();
    let mut total = 0;
    for (k, v) in data.into_iter().flatten() {
        let at = format!("data[{k}]");
        for m in is_config_map_key(k) {
            out.push(FieldError::invalid(&at, k, &m));
        }
        if binary.is_some_and(|b| b.contains_key(k)) {
            out.push(FieldError::invalid(
                &at,
                k,
                "duplicate of key present in binaryData",
            ));
        }
        total += v.as_str().map(str::len).unwrap_or_default();
    }
    for (k, v) in binary.into_iter().flatten() {
        for m in is_config_map_key(k) {
            out.push(FieldError::invalid(&format!("binaryData[{k}]"), k, &m));
        }
        total += decoded_len(v);
    }
    if total > DATA_MAX {
        // kube passes an empty path: the whole object is too large.
        out.push(FieldError::too_long("[]", DATA_MAX));
    }
    out
}

/// ValidateSecret: keys and 1 MiB of (decoded) data at most.
pub fn secret(obj: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut total = 0;
    for (k, v) in obj["data"].as_object().into_iter().flatten() {
        for m in is_config_map_key(k) {
            out.push(FieldError::invalid(&format!("data[{k}]"), k, &m));
        }
        total += decoded_len(v);
    }
    if total > DATA_MAX {
        out.push(FieldError::too_long("data", DATA_MAX));
    }
    out
}

/// kube's supported access modes, volume modes and reclaim policies (`sets.List`, sorted).
pub const ACCESS_MODES: &[&str] = &[
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOnce",
    "ReadWriteOncePod",
];
const VOLUME_MODES: &[&str] = &["Block", "Filesystem"];
const PV_RECLAIM_POLICIES: &[&str] = &["Delete", "Recycle", "Retain"];
const CLASS_RECLAIM_POLICIES: &[&str] = &["Delete", "Retain"];
const BINDING_MODES: &[&str] = &["Immediate", "WaitForFirstConsumer"];

/// The access modes of a claim or volume spec: required, each supported, ReadWriteOncePod alone.
fn access_modes(spec: &Value, path: &str, required: &str, out: &mut Vec<FieldError>) {
    let at = format!("{path}.accessModes");
    let modes: Vec<&str> = spec["accessModes"]
        .as_array()
        .map(|a| a.iter().map(|m| m.as_str().unwrap_or("")).collect())
        .unwrap_or_default();
    if modes.is_empty() {
        out.push(FieldError::required(&at, required));
    }
    let (mut rwop, mut other) = (false, false);
    for mode in modes {
        if !ACCESS_MODES.contains(&mode) {
            out.push(FieldError::not_supported(
                &at,
                BadValue::Str(mode.into()),
                ACCESS_MODES,
            ));
        } else if mode == "ReadWriteOncePod" {
            rwop = true;
        } else {
            other = true;
        }
    }
    if rwop && other {
        out.push(FieldError::forbidden(
            &at,
            "may not use ReadWriteOncePod with other access modes",
        ));
    }
}

fn volume_mode(spec: &Value, path: &str, out: &mut Vec<FieldError>) {
    if let Some(mode) = spec["volumeMode"].as_str()
        && !VOLUME_MODES.contains(&mode)
    {
        out.push(FieldError::not_supported(
            &format!("{path}.volumeMode"),
            BadValue::Str(mode.into()),
            VOLUME_MODES,
        ));
    }
}

/// validateDataSource / validateDataSourceRef.
fn data_source(source: &Value, path: &str, out: &mut Vec<FieldError>) {
    let name = source["name"].as_str().unwrap_or("");
    let kind = source["kind"].as_str().unwrap_or("");
    if name.is_empty() {
        out.push(FieldError::required(&format!("{path}.name"), ""));
    }
    if kind.is_empty() {
        out.push(FieldError::required(&format!("{path}.kind"), ""));
    }
    let group = source["apiGroup"].as_str().unwrap_or("");
    if group.is_empty() && kind != "PersistentVolumeClaim" {
        out.push(FieldError::invalid(
            path,
            kind,
            "must be 'PersistentVolumeClaim' when referencing the default apiGroup",
        ));
    }
    if !group.is_empty() {
        for msg in is_dns1123_subdomain(group) {
            out.push(FieldError::invalid(
                &format!("{path}.apiGroup"),
                group,
                &msg,
            ));
        }
    }
}

/// ValidateLabelName: a label key (or selector key) is a qualified name.
fn label_name(key: &str, path: &str, out: &mut Vec<FieldError>) {
    for msg in is_qualified_name(key) {
        out.push(FieldError::invalid(path, key, &msg));
    }
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap_or("")).collect())
        .unwrap_or_default()
}

/// One selector requirement (metav1's and the node selector's): an operator that fits its
/// values (`Gt`/`Lt` with one value only for `node` selectors), a qualified-name key, label
/// values.
fn requirement(req: &Value, at: &str, node: bool, out: &mut Vec<FieldError>) {
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
fn label_selector(selector: &Value, path: &str, out: &mut Vec<FieldError>) {
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
fn node_selector(selector: &Value, path: &str, out: &mut Vec<FieldError>) {
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

/// ValidateClassName (a storage or volume attributes class name): a DNS subdomain.
fn class_name(name: &str, path: &str, out: &mut Vec<FieldError>) {
    for msg in is_dns1123_subdomain(name) {
        out.push(FieldError::invalid(path, name, &msg));
    }
}

/// ValidatePersistentVolumeClaimSpec: access modes, the storage request (present and greater
/// than zero; decoding made sure it is a quantity; kube's path keys `resources`, not
/// `resources.requests`), volume mode, and the data sources.
pub fn claim_spec(spec: &Value, path: &str) -> Vec<FieldError> {
    let mut out = Vec::new();
    access_modes(spec, path, "at least 1 access mode is required", &mut out);
    if spec["selector"].is_object() {
        label_selector(&spec["selector"], &format!("{path}.selector"), &mut out);
    }
    let at = format!("{path}.resources[storage]");
    match spec["resources"]["requests"].get("storage") {
        None => out.push(FieldError::required(&at, "")),
        Some(storage) => {
            let text = storage.as_str().unwrap_or_default();
            match text.trim().parse::<k8s_rules::Quantity>() {
                Ok(q) if q.nanos() > 0 => {}
                Ok(q) => out.push(FieldError::invalid(
                    &at,
                    &q.to_string(),
                    "must be greater than zero",
                )),
                // Not reached after decoding; refused all the same.
                Err(e) => out.push(FieldError::invalid(&at, text, &e.to_string())),
            }
        }
    }
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        class_name(class, &format!("{path}.storageClassName"), &mut out);
    }
    volume_mode(spec, path, &mut out);
    let (source, reference) = (&spec["dataSource"], &spec["dataSourceRef"]);
    if source.is_object() {
        data_source(source, &format!("{path}.dataSource"), &mut out);
    }
    if reference.is_object() {
        data_source(reference, &format!("{path}.dataSourceRef"), &mut out);
    }
    let namespaced_ref = reference["namespace"]
        .as_str()
        .is_some_and(|n| !n.is_empty());
    if reference.is_object() && namespaced_ref {
        if source.is_object() {
            out.push(FieldError::invalid(
                path,
                &format!("{path}.dataSource"),
                "may not be specified when dataSourceRef.namespace is specified",
            ));
        }
    } else if source.is_object() && reference.is_object() {
        let same = source["apiGroup"].as_str() == reference["apiGroup"].as_str()
            && source["kind"].as_str().unwrap_or("") == reference["kind"].as_str().unwrap_or("")
            && source["name"].as_str().unwrap_or("") == reference["name"].as_str().unwrap_or("");
        if !same {
            out.push(FieldError::invalid(
                path,
                &format!("{path}.dataSource"),
                "must match dataSourceRef",
            ));
        }
    }
    // An empty name is allowed on a claim (it means "no class"); a PersistentVolume's is not.
    if let Some(class) = spec["volumeAttributesClassName"]
        .as_str()
        .filter(|c| !c.is_empty())
    {
        class_name(
            class,
            &format!("{path}.volumeAttributesClassName"),
            &mut out,
        );
    }
    out
}

/// ValidatePersistentVolumeSpec's access modes, capacity, reclaim policy and volume mode.
pub fn persistent_volume(obj: &Value) -> Vec<FieldError> {
    let spec = &obj["spec"];
    let mut out = Vec::new();
    access_modes(spec, "spec", "", &mut out);
    let capacity = spec["capacity"].as_object();
    let keys: Vec<&String> = capacity.map(|c| c.keys().collect()).unwrap_or_default();
    if keys.is_empty() {
        out.push(FieldError::required("spec.capacity", ""));
    }
    if !keys.iter().any(|k| *k == "storage") || keys.len() > 1 {
        // Go's `%#v` of the ResourceList (quantities elided).
        let shown = if keys.is_empty() {
            "core.ResourceList(nil)".to_string()
        } else {
            let entries: Vec<String> = keys
                .iter()
                .map(|k| format!("{}:resource.Quantity{{...}}", go_quote(k)))
                .collect();
            format!("core.ResourceList{{{}}}", entries.join(", "))
        };
        out.push(FieldError::not_supported(
            "spec.capacity",
            BadValue::Raw(shown),
            &["storage"],
        ));
    }
    for (key, value) in capacity.into_iter().flatten() {
        let at = format!("spec.capacity[{key}]");
        if let Some(q) = value
            .as_str()
            .and_then(|t| t.trim().parse::<k8s_rules::Quantity>().ok())
            && q.nanos() <= 0
        {
            out.push(FieldError::invalid(
                &at,
                &q.to_string(),
                "must be greater than zero",
            ));
        }
    }
    if let Some(policy) = spec["persistentVolumeReclaimPolicy"].as_str()
        && !policy.is_empty()
        && !PV_RECLAIM_POLICIES.contains(&policy)
    {
        out.push(FieldError::not_supported(
            "spec.persistentVolumeReclaimPolicy",
            BadValue::Str(policy.into()),
            PV_RECLAIM_POLICIES,
        ));
    }
    // validateVolumeNodeAffinity; a local volume needs one.
    if spec["local"].is_object() && !spec["nodeAffinity"].is_object() {
        out.push(FieldError::required(
            "spec.nodeAffinity",
            "Local volume requires node affinity",
        ));
    }
    if spec["nodeAffinity"].is_object() {
        let required = &spec["nodeAffinity"]["required"];
        if required.is_object() {
            node_selector(required, "spec.nodeAffinity.required", &mut out);
        } else {
            out.push(FieldError::required(
                "spec.nodeAffinity.required",
                "must specify required node constraints",
            ));
        }
    }
    if let Some(class) = spec["storageClassName"].as_str().filter(|c| !c.is_empty()) {
        class_name(class, "spec.storageClassName", &mut out);
    }
    volume_mode(spec, "spec", &mut out);
    if let Some(class) = spec["volumeAttributesClassName"].as_str() {
        let at = "spec.volumeAttributesClassName";
        if class.is_empty() {
            out.push(FieldError::required(at, "an empty string is disallowed"));
        } else {
            class_name(class, at, &mut out);
        }
        if !spec["csi"].is_object() {
            out.push(FieldError::required(
                "spec.csi",
                "has to be specified when using volumeAttributesClassName",
            ));
        }
    }
    out
}

/// SetDefaults_PersistentVolume: reclaim policy Retain, volume mode Filesystem, phase Pending.
pub fn default_persistent_volume(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    let spec = map
        .entry("spec")
        .or_insert_with(|| Value::Object(Default::default()));
    if let Some(spec) = spec.as_object_mut() {
        if spec
            .get("persistentVolumeReclaimPolicy")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            spec.insert("persistentVolumeReclaimPolicy".into(), "Retain".into());
        }
        if spec.get("volumeMode").is_none_or(Value::is_null) {
            spec.insert("volumeMode".into(), "Filesystem".into());
        }
    }
    let status = map
        .entry("status")
        .or_insert_with(|| Value::Object(Default::default()));
    if status.is_null() {
        *status = Value::Object(Default::default());
    }
    if let Some(status) = status.as_object_mut()
        && status
            .get("phase")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        status.insert("phase".into(), "Pending".into());
    }
}

/// The members of PersistentVolumeSpec's inlined PersistentVolumeSource: one volume type each.
const PV_SOURCES: &[&str] = &[
    "awsElasticBlockStore",
    "azureDisk",
    "azureFile",
    "cephfs",
    "cinder",
    "csi",
    "fc",
    "flexVolume",
    "flocker",
    "gcePersistentDisk",
    "glusterfs",
    "hostPath",
    "iscsi",
    "local",
    "nfs",
    "photonPersistentDisk",
    "portworxVolume",
    "quobyte",
    "rbd",
    "scaleIO",
    "storageos",
    "vsphereVolume",
];

/// kube's betaToGALabel: a PersistentVolume's node affinity may move a key from the beta label
/// to its GA one.
const BETA_TO_GA_LABELS: &[(&str, &str)] = &[
    (
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    ),
    (
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
    ("beta.kubernetes.io/os", "kubernetes.io/os"),
    ("beta.kubernetes.io/arch", "kubernetes.io/arch"),
    (
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
    ),
];

/// `old`'s node affinity with every requirement key that `new` moved from a beta label to its
/// GA label rewritten to the GA key (getMaskNodeSelectorLabelChangeEqualities).
fn mask_beta_to_ga(old: &Value, new: &Value) -> Value {
    let mut masked = old.clone();
    let terms = |v: &Value| v["required"]["nodeSelectorTerms"].as_array().cloned();
    let (Some(new_terms), Some(old_terms)) = (terms(new), terms(old)) else {
        return masked;
    };
    for (i, (o, n)) in old_terms.iter().zip(&new_terms).enumerate() {
        let exprs = |t: &Value| {
            t["matchExpressions"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        };
        for (j, (oe, ne)) in exprs(o).iter().zip(exprs(n).iter()).enumerate() {
            let (ok, nk) = (oe["key"].as_str(), ne["key"].as_str());
            if let (Some(ok), Some(nk)) = (ok, nk)
                && BETA_TO_GA_LABELS.contains(&(ok, nk))
            {
                masked["required"]["nodeSelectorTerms"][i]["matchExpressions"][j]["key"] =
                    Value::String(nk.into());
            }
        }
    }
    masked
}

/// ValidatePersistentVolumeUpdate's immutability rules (the spec's own rules are checked by
/// `persistent_volume` on every write): the volume source may not change (except setting a CSI
/// volume's controllerExpandSecretRef the first time), nor the volume mode, nor a node affinity
/// once set (except beta to GA label keys), and a volumeAttributesClassName may not be unset.
/// kube appends a cmp.Diff of the two sources to the first message; that diff is not rendered.
pub fn persistent_volume_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let source = |spec: &Value| -> Value {
        Value::Object(
            PV_SOURCES
                .iter()
                .filter_map(|k| spec.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect(),
        )
    };
    let (old_source, mut new_source) = (source(&old["spec"]), source(&new["spec"]));
    let no_expand_ref =
        |s: &Value| s["csi"].is_object() && s["csi"]["controllerExpandSecretRef"].is_null();
    if no_expand_ref(&old_source)
        && new_source["csi"].is_object()
        && let Some(csi) = new_source["csi"].as_object_mut()
    {
        csi.remove("controllerExpandSecretRef");
    }
    if semantic(&old_source) != semantic(&new_source) {
        out.push(FieldError::forbidden(
            "spec.persistentvolumesource",
            "spec.persistentvolumesource is immutable after creation",
        ));
    }
    let (old_mode, new_mode) = (
        old["spec"]["volumeMode"].as_str(),
        new["spec"]["volumeMode"].as_str(),
    );
    if old_mode != new_mode {
        out.push(FieldError::invalid(
            "volumeMode",
            new_mode.unwrap_or("null"),
            "field is immutable",
        ));
    }
    let (old_affinity, new_affinity) = (&old["spec"]["nodeAffinity"], &new["spec"]["nodeAffinity"]);
    if !old_affinity.is_null()
        && semantic(&mask_beta_to_ga(old_affinity, new_affinity)) != semantic(new_affinity)
    {
        // Go prints the new *VolumeNodeAffinity with %#v; its pointer's address is elided.
        let shown = if new_affinity.is_object() {
            let required = if new_affinity["required"].is_object() {
                "..."
            } else {
                "nil"
            };
            BadValue::Raw(format!(
                "core.VolumeNodeAffinity{{Required:(*core.NodeSelector)({required})}}"
            ))
        } else {
            BadValue::Str("null".into())
        };
        out.push(FieldError::new(
            ErrorType::Invalid,
            "nodeAffinity",
            shown,
            "field is immutable, except for updating from beta label to GA",
        ));
    }
    if !old["spec"]["volumeAttributesClassName"].is_null()
        && new["spec"]["volumeAttributesClassName"].is_null()
    {
        out.push(FieldError::forbidden(
            "spec.volumeAttributesClassName",
            "update from non-nil value to nil is forbidden",
        ));
    }
    out
}

const MAX_PARAMETERS: usize = 512;
const MAX_PARAMETERS_SIZE: usize = 256 * (1 << 10);

/// ValidateStorageClass: provisioner, parameters, reclaim policy and binding mode (after
/// SetDefaults_StorageClass, so an absent policy or mode is Delete or Immediate).
pub fn storage_class(obj: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let provisioner = obj["provisioner"].as_str().unwrap_or("");
    if provisioner.is_empty() {
        out.push(FieldError::required("provisioner", ""));
    } else {
        let lower = provisioner.to_lowercase();
        for msg in is_qualified_name(&lower) {
            out.push(FieldError::invalid("provisioner", &lower, &msg));
        }
    }
    if let Some(params) = obj["parameters"].as_object() {
        if params.len() > MAX_PARAMETERS {
            out.push(FieldError::too_long("parameters", MAX_PARAMETERS));
        } else {
            let mut total = 0;
            for (k, v) in params {
                if k.is_empty() {
                    out.push(FieldError::invalid(
                        "parameters",
                        k,
                        "field can not be empty.",
                    ));
                }
                total += k.len() + v.as_str().map_or(0, str::len);
            }
            if total > MAX_PARAMETERS_SIZE {
                out.push(FieldError::too_long("parameters", MAX_PARAMETERS_SIZE));
            }
        }
    }
    if let Some(policy) = obj["reclaimPolicy"].as_str()
        && !policy.is_empty()
        && !CLASS_RECLAIM_POLICIES.contains(&policy)
    {
        out.push(FieldError::not_supported(
            "reclaimPolicy",
            BadValue::Str(policy.into()),
            CLASS_RECLAIM_POLICIES,
        ));
    }
    match obj["volumeBindingMode"].as_str() {
        None => out.push(FieldError::required("volumeBindingMode", "")),
        Some(mode) if !BINDING_MODES.contains(&mode) => out.push(FieldError::not_supported(
            "volumeBindingMode",
            BadValue::Str(mode.into()),
            BINDING_MODES,
        )),
        Some(_) => {}
    }
    allowed_topologies(&obj["allowedTopologies"], "allowedTopologies", &mut out);
    out
}

/// validateAllowedTopologies: each term's matchLabelExpressions need a qualified-name key, at
/// least one value and no value twice; no key twice in a term, and no term twice (compared as
/// key → set of values).
fn allowed_topologies(terms: &Value, path: &str, out: &mut Vec<FieldError>) {
    let Some(terms) = terms.as_array().filter(|t| !t.is_empty()) else {
        return;
    };
    // kube's list starts with one empty entry per term (a `make` with a length), so a term with
    // no expressions is reported as a duplicate too.
    let mut seen: Vec<BTreeMap<String, BTreeSet<String>>> = vec![BTreeMap::new(); terms.len()];
    for (i, term) in terms.iter().enumerate() {
        let exprs_at = format!("{path}[{i}].matchLabelExpressions");
        let mut map: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let exprs = term["matchLabelExpressions"].as_array();
        for (j, req) in exprs.into_iter().flatten().enumerate() {
            let at = format!("{exprs_at}[{j}]");
            let values = strings(&req["values"]);
            if values.is_empty() {
                out.push(FieldError::required(&format!("{at}.values"), ""));
            }
            let mut set = BTreeSet::new();
            for (k, value) in values.iter().enumerate() {
                if !set.insert(value.to_string()) {
                    out.push(FieldError::duplicate(&format!("{at}.values[{k}]"), value));
                }
            }
            let key = req["key"].as_str().unwrap_or("");
            label_name(key, &format!("{at}.key"), out);
            if map.contains_key(key) {
                out.push(FieldError::duplicate(&format!("{at}.key"), key));
            }
            map.insert(key.to_string(), set);
        }
        if seen.contains(&map) {
            out.push(FieldError::duplicate(&exprs_at, ""));
        }
        seen.push(map);
    }
}

/// SetDefaults_StorageClass: reclaimPolicy Delete, volumeBindingMode Immediate.
pub fn default_storage_class(obj: &mut Value) {
    let Some(map) = obj.as_object_mut() else {
        return;
    };
    for (key, value) in [
        ("reclaimPolicy", "Delete"),
        ("volumeBindingMode", "Immediate"),
    ] {
        if map.get(key).is_none_or(Value::is_null) {
            map.insert(key.into(), Value::String(value.into()));
        }
    }
}

/// ValidateStorageClassUpdate: provisioner, parameters and reclaimPolicy may not change;
/// volumeBindingMode is immutable.
pub fn storage_class_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let params = |v: &Value| match &v["parameters"] {
        Value::Object(m) if !m.is_empty() => Some(m.clone()),
        _ => None,
    };
    if params(old) != params(new) {
        out.push(FieldError::forbidden(
            "parameters",
            "updates to parameters are forbidden.",
        ));
    }
    if old["provisioner"].as_str().unwrap_or("") != new["provisioner"].as_str().unwrap_or("") {
        out.push(FieldError::forbidden(
            "provisioner",
            "updates to provisioner are forbidden.",
        ));
    }
    if old["reclaimPolicy"].as_str().unwrap_or("") != new["reclaimPolicy"].as_str().unwrap_or("") {
        out.push(FieldError::forbidden(
            "reclaimPolicy",
            "updates to reclaimPolicy are forbidden.",
        ));
    }
    if old["volumeBindingMode"].as_str() != new["volumeBindingMode"].as_str() {
        out.push(FieldError::invalid(
            "volumeBindingMode",
            new["volumeBindingMode"].as_str().unwrap_or("null"),
            "field is immutable",
        ));
    }
    out
}

/// A spec as apiequality.Semantic compares it: nulls, empty lists and empty maps dropped,
/// quantities under `resources` reduced to their values.
fn semantic(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !is_empty_value(v))
                .map(|(k, v)| (k.clone(), semantic(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(semantic).collect()),
        other => other.clone(),
    }
}

fn is_empty_value(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(m) => m.is_empty(),
        _ => false,
    }
}

fn quantities(resources: &mut Value) {
    for part in ["requests", "limits"] {
        if let Some(map) = resources[part].as_object_mut() {
            for q in map.values_mut() {
                if let Some(parsed) = q
                    .as_str()
                    .and_then(|t| t.trim().parse::<k8s_rules::Quantity>().ok())
                {
                    *q = Value::String(parsed.nanos().to_string());
                }
            }
        }
    }
}

const BETA_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// ValidatePersistentVolumeClaimUpdate's immutability rules (the spec's own rules are checked by
/// `claim_spec` on every write): volumeName may be set once, storageClassName may be set from
/// nil (or from the beta annotation), a bound claim's storage request may change (not below
/// status.capacity), a bound claim's volumeAttributesClassName may change (not back to nil or
/// to ""); nothing else in the spec may.
pub fn claim_update(old: &Value, new: &Value) -> Vec<FieldError> {
    let mut out = Vec::new();
    let (mut old_spec, mut new_spec) = (old["spec"].clone(), new["spec"].clone());
    if !old_spec.is_object() {
        old_spec = Value::Object(Default::default());
    }
    if !new_spec.is_object() {
        new_spec = Value::Object(Default::default());
    }
    let set = |spec: &mut Value, key: &str, value: Value| {
        if let Some(map) = spec.as_object_mut() {
            map.insert(key.into(), value);
        }
    };
    if old["spec"]["volumeName"].as_str().unwrap_or("").is_empty() {
        set(
            &mut old_spec,
            "volumeName",
            new["spec"]["volumeName"].clone(),
        );
    }
    let old_annotation = old["metadata"]["annotations"][BETA_CLASS].as_str();
    let new_annotation = new["metadata"]["annotations"][BETA_CLASS].as_str();
    let old_class = old["spec"]["storageClassName"].as_str();
    let new_class = new["spec"]["storageClassName"].as_str();
    let from_annotation = old_annotation.is_some()
        && old_class.is_none()
        && new_class.is_some()
        && new_class == old_annotation
        && (new_annotation.is_none() || new_annotation == old_annotation);
    if from_annotation {
        set(&mut new_spec, "storageClassName", Value::Null);
    } else {
        if new_annotation != old_annotation {
            out.push(FieldError::invalid(
                &format!("metadata.annotations.{BETA_CLASS}"),
                new_annotation.unwrap_or(""),
                "field is immutable",
            ));
        }
        if new_class.is_some()
            && old_class.is_none()
            && (old_annotation.is_none() || new_class == old_annotation)
        {
            set(&mut new_spec, "storageClassName", Value::Null);
        }
    }
    let bound = old["status"]["phase"] == "Bound";
    if bound && new_spec["resources"]["requests"].is_object() {
        new_spec["resources"]["requests"]["storage"] =
            old["spec"]["resources"]["requests"]["storage"].clone();
    }
    if bound && !new_spec["volumeAttributesClassName"].is_null() {
        set(
            &mut new_spec,
            "volumeAttributesClassName",
            old_spec["volumeAttributesClassName"].clone(),
        );
    }
    for spec in [&mut old_spec, &mut new_spec] {
        if spec["resources"].is_object() {
            quantities(&mut spec["resources"]);
        }
    }
    if semantic(&old_spec) != semantic(&new_spec) {
        out.push(FieldError::forbidden(
            "spec",
            "spec is immutable after creation except resources.requests and \
             volumeAttributesClassName for bound claims",
        ));
    }
    let size = |v: &Value| {
        v.as_str()
            .and_then(|s| s.trim().parse::<k8s_rules::Quantity>().ok())
            .map_or(0, |q| q.nanos())
    };
    let old_size = size(&old["spec"]["resources"]["requests"]["storage"]);
    let new_size = size(&new["spec"]["resources"]["requests"]["storage"]);
    let capacity = size(&old["status"]["capacity"]["storage"]);
    if new_size < old_size && new_size <= capacity {
        out.push(FieldError::forbidden(
            "spec.resources.requests.storage",
            "field can not be less than status.capacity",
        ));
    }
    let (old_mode, new_mode) = (
        old["spec"]["volumeMode"].as_str(),
        new["spec"]["volumeMode"].as_str(),
    );
    if old_mode != new_mode {
        out.push(FieldError::invalid(
            "volumeMode",
            new_mode.unwrap_or("null"),
            "field is immutable",
        ));
    }
    let old_class = &old["spec"]["volumeAttributesClassName"];
    let new_class = &new["spec"]["volumeAttributesClassName"];
    if !old_class.is_null() && old_class != new_class {
        let at = "spec.volumeAttributesClassName";
        if new_class.is_null() {
            out.push(FieldError::forbidden(
                at,
                "update from non-nil value to nil is forbidden",
            ));
        } else if new_class.as_str() == Some("") {
            out.push(FieldError::forbidden(
                at,
                "update from non-nil value to an empty string is forbidden",
            ));
        }
    }
    out
}

/// Everything checked on a create (after name generation) or an update of `obj`.
pub fn validate(def: &ResourceDef, obj: &Value, create: bool) -> Vec<FieldError> {
    if def.create_only {
        return Vec::new();
    }
    let mut errs = object_meta(def, obj, create);
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "pods") => errs.extend(pod_spec(&obj["spec"], "spec")),
        ("", "persistentvolumeclaims") => errs.extend(claim_spec(&obj["spec"], "spec")),
        ("", "persistentvolumes") => errs.extend(persistent_volume(obj)),
        ("storage.k8s.io", "storageclasses") => errs.extend(storage_class(obj)),
        ("", "configmaps") => errs.extend(config_map(obj)),
        ("", "secrets") => errs.extend(secret(obj)),
        ("", "services") => errs.extend(service::ports(&obj["spec"]["ports"], "spec.ports")),
        _ => {}
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::registry::Registry;
    use serde_json::json;

    fn def(group: &str, plural: &str) -> ResourceDef {
        Registry::with_builtins()
            .all()
            .find(|d| d.group == group && d.plural == plural)
            .cloned()
            .unwrap()
    }

    fn bodies(errs: &[FieldError]) -> Vec<String> {
        errs.iter()
            .map(|e| format!("{}: {}", e.field, e.body()))
            .collect()
    }

    #[test]
    fn names_follow_kubes_rules_and_messages() {
        // RBAC names are path segments: colons are fine, slashes are not.
        assert!(check_name(NameRule::PathSegment, "cdi.kubevirt.io:edit", false).is_empty());
        assert_eq!(
            check_name(NameRule::PathSegment, "a/b", false),
            ["may not contain '/'"]
        );
        let cm = def("", "configmaps");
        let errs = validate(&cm, &json!({"metadata": {"name": "UPPER_case"}}), true);
        assert_eq!(
            bodies(&errs),
            [
                "metadata.name: Invalid value: \"UPPER_case\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
            ]
        );
        for bad in ["a/b", "..", ".", "a%b", "-a", "a.", ""] {
            assert!(
                !validate(&cm, &json!({"metadata": {"name": bad}}), true).is_empty(),
                "{bad:?}"
            );
        }
        let long = "a".repeat(300);
        let errs = validate(&cm, &json!({"metadata": {"name": long}}), true);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].detail, "must be no more than 253 characters");
        assert!(validate(&cm, &json!({"metadata": {"name": "a.b-c.d1"}}), true).is_empty());

        // Namespaces are labels: no dots, 63 characters.
        let ns = def("", "namespaces");
        let errs = validate(&ns, &json!({"metadata": {"name": "a.b"}}), true);
        assert_eq!(
            bodies(&errs),
            ["metadata.name: Invalid value: \"a.b\": must not contain dots"]
        );
        assert_eq!(
            validate(&ns, &json!({"metadata": {"name": "a".repeat(64)}}), true)[0].detail,
            "must be no more than 63 characters"
        );
        // Services are DNS-1035 labels: a letter first.
        let svc = def("", "services");
        let errs = validate(&svc, &json!({"metadata": {"name": "1abc"}}), true);
        assert_eq!(
            bodies(&errs),
            [
                "metadata.name: Invalid value: \"1abc\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        // Missing names.
        assert_eq!(
            bodies(&validate(&cm, &json!({"metadata": {}}), true)),
            ["metadata.name: Required value: name or generateName is required"]
        );
        // A generateName may end in '-'; a bad one is reported on its own field.
        let errs = validate(
            &cm,
            &json!({"metadata": {"generateName": "ok-", "name": "ok-x1b2c"}}),
            true,
        );
        assert!(errs.is_empty(), "{errs:?}");
        let errs = validate(
            &cm,
            &json!({"metadata": {"generateName": "Bad-", "name": "Bad-x1b2c"}}),
            true,
        );
        assert_eq!(errs[0].field, "metadata.generateName");
        assert_eq!(errs[1].field, "metadata.name");
        // Updates do not check the (immutable) name.
        assert!(validate(&cm, &json!({"metadata": {"name": "X"}}), false).is_empty());
    }

    #[test]
    fn labels_annotations_owners_and_finalizers() {
        let cm = def("", "configmaps");
        let obj = json!({"metadata": {"name": "x",
            "labels": {"a/b/c": "ok", "good": "bad value"},
            "annotations": {"Example.com/Key": "fine", "/x": "v"},
            "ownerReferences": [{"apiVersion": "", "kind": "K", "name": "n", "uid": ""}],
            "finalizers": ["example.com/ok", "bad finalizer"]}});
        let got = bodies(&validate(&cm, &obj, true));
        assert_eq!(
            got,
            [
                "metadata.labels: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                "metadata.labels: Invalid value: \"bad value\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                "metadata.annotations: Invalid value: \"/x\": prefix part must be non-empty",
                "metadata.ownerReferences.apiVersion: Invalid value: \"\": version must not be empty",
                "metadata.ownerReferences.uid: Invalid value: \"\": must not be empty",
                "metadata.finalizers: Invalid value: \"bad finalizer\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            ]
        );
        let big =
            json!({"metadata": {"name": "x", "annotations": {"k": "v".repeat(ANNOTATIONS_MAX)}}});
        assert_eq!(
            bodies(&validate(&cm, &big, true)),
            ["metadata.annotations: Too long: must have at most 262144 bytes"]
        );
    }

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

    #[test]
    fn config_maps_and_secrets_are_bounded() {
        use base64::Engine;
        let cm = def("", "configmaps");
        let big = json!({"metadata": {"name": "x"}, "data": {"k": "v".repeat(DATA_MAX + 1)}});
        assert_eq!(
            bodies(&validate(&cm, &big, true)),
            ["[]: Too long: must have at most 1048576 bytes"]
        );
        let edge = json!({"metadata": {"name": "x"}, "data": {"k": "v".repeat(DATA_MAX)}});
        assert!(validate(&cm, &edge, true).is_empty());
        let keys = json!({"metadata": {"name": "x"}, "data": {"a b": "", "..x": "", "d": ""},
            "binaryData": {"d": ""}});
        assert_eq!(
            bodies(&validate(&cm, &keys, true)),
            [
                "data[..x]: Invalid value: \"..x\": must not start with '..'",
                "data[a b]: Invalid value: \"a b\": a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')",
                "data[d]: Invalid value: \"d\": duplicate of key present in binaryData",
            ]
        );
        let secrets = def("", "secrets");
        let payload = base64::engine::general_purpose::STANDARD.encode(vec![0u8; DATA_MAX + 1]);
        let big = json!({"metadata": {"name": "x"}, "data": {"k": payload}});
        assert_eq!(
            bodies(&validate(&secrets, &big, true)),
            ["data: Too long: must have at most 1048576 bytes"]
        );
    }

    #[test]
    fn path_segments_and_quoting() {
        assert_eq!(is_path_segment_name(".."), ["may not be '..'"]);
        assert_eq!(
            is_path_segment_name("a/b%c"),
            ["may not contain '/'", "may not contain '%'"]
        );
        assert!(is_path_segment_name("UPPER_case").is_empty());
        assert_eq!(go_quote("a\"b\\c\n\u{1}é"), "\"a\\\"b\\\\c\\n\\x01é\"");
        assert_eq!(mask_trailing_dash("abc-"), "aba");
    }

    fn pv(spec: Value) -> Value {
        json!({"metadata": {"name": "pv"}, "spec": spec})
    }

    fn local_pv() -> Value {
        pv(
            json!({"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "local": {"path": "/x"}, "volumeMode": "Filesystem",
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "failure-domain.beta.kubernetes.io/zone", "operator": "In", "values": ["a"]}]}]}}}),
        )
    }

    /// `obj` with the field at `pointer` set (its parent exists).
    fn with(mut obj: Value, pointer: &str, value: Value) -> Value {
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        match obj.pointer_mut(parent).unwrap() {
            Value::Array(items) => items[key.parse::<usize>().unwrap()] = value,
            other => other[key] = value,
        }
        obj
    }

    #[test]
    fn volumes_source_mode_and_node_affinity_are_immutable() {
        let old = local_pv();
        assert!(persistent_volume_update(&old, &old).is_empty());
        let moved = with(old.clone(), "/spec/local/path", json!("/y"));
        assert_eq!(
            bodies(&persistent_volume_update(&old, &moved)),
            [
                "spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"
            ]
        );
        let block = with(old.clone(), "/spec/volumeMode", json!("Block"));
        assert_eq!(
            bodies(&persistent_volume_update(&old, &block)),
            ["volumeMode: Invalid value: \"Block\": field is immutable"]
        );
        let elsewhere = with(
            old.clone(),
            "/spec/nodeAffinity/required/nodeSelectorTerms/0/matchExpressions/0/values",
            json!(["b"]),
        );
        assert_eq!(
            bodies(&persistent_volume_update(&old, &elsewhere)),
            [
                "nodeAffinity: Invalid value: core.VolumeNodeAffinity{Required:(*core.NodeSelector)(...)}: field is immutable, except for updating from beta label to GA"
            ]
        );
        let dropped = with(old.clone(), "/spec/nodeAffinity", Value::Null);
        assert_eq!(
            bodies(&persistent_volume_update(&old, &dropped)),
            [
                "nodeAffinity: Invalid value: \"null\": field is immutable, except for updating from beta label to GA"
            ]
        );
        // Beta to GA keys is the one change allowed; setting an affinity where none was is too.
        let ga = with(
            old.clone(),
            "/spec/nodeAffinity/required/nodeSelectorTerms/0/matchExpressions/0/key",
            json!("topology.kubernetes.io/zone"),
        );
        assert!(persistent_volume_update(&old, &ga).is_empty());
        assert!(persistent_volume_update(&dropped, &old).is_empty());
        // A CSI volume may get its controllerExpandSecretRef once; the reclaim policy may change.
        let csi = pv(json!({"csi": {"driver": "d", "volumeHandle": "h"}}));
        let expand = with(
            csi.clone(),
            "/spec/csi",
            json!({"driver": "d", "volumeHandle": "h", "controllerExpandSecretRef": {"name": "s"}}),
        );
        assert!(persistent_volume_update(&csi, &expand).is_empty());
        assert_eq!(persistent_volume_update(&expand, &csi).len(), 1);
        let retained = with(
            old.clone(),
            "/spec/persistentVolumeReclaimPolicy",
            json!("Retain"),
        );
        assert!(persistent_volume_update(&old, &retained).is_empty());
        let classed = with(
            csi.clone(),
            "/spec/volumeAttributesClassName",
            json!("gold"),
        );
        assert_eq!(
            bodies(&persistent_volume_update(&classed, &csi)),
            [
                "spec.volumeAttributesClassName: Forbidden: update from non-nil value to nil is forbidden"
            ]
        );
    }

    #[test]
    fn volumes_are_defaulted_as_kube_defaults_them() {
        let mut v = pv(json!({"capacity": {"storage": "1Gi"}}));
        default_persistent_volume(&mut v);
        assert_eq!(v["spec"]["persistentVolumeReclaimPolicy"], "Retain");
        assert_eq!(v["spec"]["volumeMode"], "Filesystem");
        assert_eq!(v["status"]["phase"], "Pending");
        let mut kept =
            pv(json!({"persistentVolumeReclaimPolicy": "Delete", "volumeMode": "Block"}));
        kept["status"] = json!({"phase": "Bound"});
        let before = kept.clone();
        default_persistent_volume(&mut kept);
        assert_eq!(kept, before);
    }

    #[test]
    fn volume_node_affinity_class_names_and_attributes_class() {
        let pvs = def("", "persistentvolumes");
        let base = local_pv();
        assert!(validate(&pvs, &base, true).is_empty());
        let unplaced = with(base.clone(), "/spec/nodeAffinity", Value::Null);
        assert_eq!(
            bodies(&validate(&pvs, &unplaced, true)),
            ["spec.nodeAffinity: Required value: Local volume requires node affinity"]
        );
        let no_required = with(base.clone(), "/spec/nodeAffinity", json!({}));
        assert_eq!(
            bodies(&validate(&pvs, &no_required, true)),
            ["spec.nodeAffinity.required: Required value: must specify required node constraints"]
        );
        let no_terms = with(
            base.clone(),
            "/spec/nodeAffinity/required",
            json!({"nodeSelectorTerms": []}),
        );
        assert_eq!(
            bodies(&validate(&pvs, &no_terms, true)),
            [
                "spec.nodeAffinity.required.nodeSelectorTerms: Required value: must have at least one node selector term"
            ]
        );
        let bad_terms = with(
            base.clone(),
            "/spec/nodeAffinity/required/nodeSelectorTerms",
            json!([{"matchExpressions": [
                {"key": "zone", "operator": "In"},
                {"key": "zone", "operator": "Exists", "values": ["a"]},
                {"key": "size", "operator": "Gt", "values": ["1", "2"]},
                {"key": "-bad", "operator": "Near", "values": ["a b"]}],
              "matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["a", "b"]}]}]),
        );
        assert_eq!(
            bodies(&validate(&pvs, &bad_terms, true)),
            [
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[2].values: Required value: must be specified single value when `operator` is 'Lt' or 'Gt'",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[3].operator: Invalid value: \"Near\": not a valid selector operator",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[3].key: Invalid value: \"-bad\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchExpressions[3].values[0]: Invalid value: \"a b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchFields[0].values: Required value: must be only one value when `operator` is 'In' or 'NotIn' for node field selector",
                "spec.nodeAffinity.required.nodeSelectorTerms[0].matchFields[0].key: Invalid value: \"metadata.uid\": not a valid field selector key",
            ]
        );
        let classes = with(
            with(base.clone(), "/spec/storageClassName", json!("Gold")),
            "/spec/volumeAttributesClassName",
            json!(""),
        );
        assert_eq!(
            bodies(&validate(&pvs, &classes, true)),
            [
                format!("spec.storageClassName: Invalid value: \"Gold\": {SUBDOMAIN}"),
                "spec.volumeAttributesClassName: Required value: an empty string is disallowed".to_string(),
                "spec.csi: Required value: has to be specified when using volumeAttributesClassName".to_string(),
            ]
        );
    }

    const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";

    #[test]
    fn class_topologies_are_validated_as_kube_validates_them() {
        let classes = def("storage.k8s.io", "storageclasses");
        let class = |topologies: Value| {
            json!({"metadata": {"name": "c"}, "provisioner": "p", "reclaimPolicy": "Delete",
                "volumeBindingMode": "WaitForFirstConsumer", "allowedTopologies": topologies})
        };
        let good = class(json!([
            {"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["a", "b"]}]},
            {"matchLabelExpressions": [{"key": "topology.kubernetes.io/zone", "values": ["c"]}]},
        ]));
        assert!(validate(&classes, &good, true).is_empty());
        let bad = class(json!([
            {"matchLabelExpressions": [
                {"key": "zone", "values": []},
                {"key": "zone", "values": ["a", "a"]},
                {"key": "bad key", "values": ["x"]}]},
            {"matchLabelExpressions": [{"key": "rack", "values": ["1"]}]},
            {"matchLabelExpressions": [{"key": "rack", "values": ["1"]}]},
        ]));
        assert_eq!(
            bodies(&validate(&classes, &bad, true)),
            [
                "allowedTopologies[0].matchLabelExpressions[0].values: Required value",
                "allowedTopologies[0].matchLabelExpressions[1].values[1]: Duplicate value: \"a\"",
                "allowedTopologies[0].matchLabelExpressions[1].key: Duplicate value: \"zone\"",
                "allowedTopologies[0].matchLabelExpressions[2].key: Invalid value: \"bad key\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
                "allowedTopologies[2].matchLabelExpressions: Duplicate value: \"\"",
            ]
        );
    }

    fn claim(spec: Value) -> Value {
        let mut c = json!({"metadata": {"name": "c", "namespace": "default"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
            "volumeMode": "Filesystem"}});
        for (k, v) in spec.as_object().unwrap() {
            c["spec"][k] = v.clone();
        }
        c
    }

    #[test]
    fn claim_selectors_and_class_names() {
        let claims = def("", "persistentvolumeclaims");
        let good = claim(
            json!({"selector": {"matchLabels": {"app": "db"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a"]}, {"key": "x", "operator": "Exists"}]},
            "storageClassName": "local", "volumeAttributesClassName": ""}),
        );
        assert!(validate(&claims, &good, true).is_empty());
        let bad = claim(
            json!({"selector": {"matchLabels": {"a b": "c d"}, "matchExpressions": [
            {"key": "tier", "operator": "NotIn"},
            {"key": "x", "operator": "DoesNotExist", "values": ["a"]},
            {"key": "y", "operator": "Gt", "values": ["1"]}]},
            "storageClassName": "Local", "volumeAttributesClassName": "Gold"}),
        );
        assert_eq!(
            bodies(&validate(&claims, &bad, true)),
            [
                "spec.selector.matchLabels: Invalid value: \"a b\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_string(),
                "spec.selector.matchLabels: Invalid value: \"c d\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_string(),
                "spec.selector.matchExpressions[0].values: Required value: must be specified when `operator` is 'In' or 'NotIn'".to_string(),
                "spec.selector.matchExpressions[1].values: Forbidden: may not be specified when `operator` is 'Exists' or 'DoesNotExist'".to_string(),
                "spec.selector.matchExpressions[2].operator: Invalid value: \"Gt\": not a valid selector operator".to_string(),
                format!("spec.storageClassName: Invalid value: \"Local\": {SUBDOMAIN}"),
                format!("spec.volumeAttributesClassName: Invalid value: \"Gold\": {SUBDOMAIN}"),
            ]
        );
    }

    #[test]
    fn claim_attributes_class_changes_only_when_bound_and_never_back() {
        let bound = |class: Value| {
            let mut c = claim(json!({"volumeName": "pv"}));
            if !class.is_null() {
                c["spec"]["volumeAttributesClassName"] = class;
            }
            c["status"] = json!({"phase": "Bound"});
            c
        };
        assert!(claim_update(&bound(json!("gold")), &bound(json!("silver"))).is_empty());
        assert!(claim_update(&bound(Value::Null), &bound(json!("gold"))).is_empty());
        assert_eq!(
            bodies(&claim_update(&bound(json!("gold")), &bound(json!("")))),
            [
                "spec.volumeAttributesClassName: Forbidden: update from non-nil value to an empty string is forbidden"
            ]
        );
        let to_nil = bodies(&claim_update(&bound(json!("gold")), &bound(Value::Null)));
        assert_eq!(to_nil.len(), 2, "{to_nil:?}");
        assert_eq!(
            to_nil[1],
            "spec.volumeAttributesClassName: Forbidden: update from non-nil value to nil is forbidden"
        );
        let pending = |class: &str| {
            let mut c = claim(json!({"volumeAttributesClassName": class}));
            c["status"] = json!({"phase": "Pending"});
            c
        };
        assert_eq!(
            bodies(&claim_update(&pending("gold"), &pending("silver"))),
            [
                "spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"
            ]
        );
    }
}
