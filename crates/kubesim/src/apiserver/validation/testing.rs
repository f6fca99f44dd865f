//! What the validation tests share: a built-in kind's definition, errors as kube prints them.

use super::field::FieldError;
use crate::apiserver::registry::{Registry, ResourceDef};

pub(super) fn def(group: &str, plural: &str) -> ResourceDef {
    Registry::with_builtins()
        .all()
        .find(|d| d.group == group && d.plural == plural)
        .cloned()
        .unwrap()
}

pub(super) fn bodies(errs: &[FieldError]) -> Vec<String> {
    errs.iter()
        .map(|e| format!("{}: {}", e.field, e.body()))
        .collect()
}

pub(super) const SUBDOMAIN: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
