//! Names and values as k8s.io/apimachinery/pkg/util/validation checks them (DNS labels and
//! subdomains, qualified names, label values, config keys, port names, path segments), and the
//! rule each kind's names follow.

use super::field::FieldError;
use crate::apiserver::registry::ResourceDef;

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

pub(super) fn is_valid_port_num(port: i64) -> Vec<String> {
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

pub(super) fn dns1123_label_errors(value: &str, field: &str, out: &mut Vec<FieldError>) {
    for m in is_dns1123_label(value) {
        out.push(FieldError::invalid(field, value, &m));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apiserver::validation::field::go_quote;
    use crate::apiserver::validation::testing::{bodies, def};
    use crate::apiserver::validation::validate;
    use serde_json::json;

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
}
