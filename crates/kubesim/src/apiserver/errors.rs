//! Errors as Kubernetes `Status` objects with the code and reason clients act on.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// An API error.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

/// `resource.group`, or just `resource` in the core group, as Kubernetes names them in messages.
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// The cause type of a field error, from its message (field.ErrorType's text).
fn cause_reason(message: &str) -> &'static str {
    const TYPES: &[(&str, &str)] = &[
        ("Not found", "FieldValueNotFound"),
        ("Required value", "FieldValueRequired"),
        ("Duplicate value", "FieldValueDuplicate"),
        ("Unsupported value", "FieldValueNotSupported"),
        ("Forbidden", "FieldValueForbidden"),
        ("Too long", "FieldValueTooLong"),
        ("Too many", "FieldValueTooMany"),
        ("Internal error", "InternalError"),
    ];
    TYPES
        .iter()
        .find(|(text, _)| message.starts_with(text))
        .map(|(_, reason)| *reason)
        .unwrap_or("FieldValueInvalid")
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details = Some(json!({ "name": name, "group": group, "kind": kind }));
        self
    }

    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        ApiError::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(group, resource, name)
    }

    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(group, resource, name)
    }

    pub fn conflict(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        ApiError::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"),
        )
        .with_details(group, resource, name)
    }

    /// The same error about `to` (group, resource) where it names `from`: a view's client is
    /// told about the resource it asked for, not the one the objects are stored under.
    pub fn about(mut self, from: (&str, &str), to: (&str, &str)) -> Self {
        let Some(d) = self.details.as_mut() else {
            return self;
        };
        if d["group"] != from.0 || d["kind"] != from.1 {
            return self;
        }
        let name = d["name"].as_str().unwrap_or("").to_string();
        self.message = self.message.replacen(
            &format!("{} \"{name}\"", qualified(from.0, from.1)),
            &format!("{} \"{name}\"", qualified(to.0, to.1)),
            1,
        );
        d["group"] = json!(to.0);
        d["kind"] = json!(to.1);
        self
    }

    /// 422 Invalid, as errors.NewInvalid builds it: `kind` is the qualified kind (`Kind` or
    /// `Kind.group`), `causes` are (field, message) pairs whose message starts with the error
    /// type's text ("Invalid value", "Required value", ...).
    pub fn invalid(kind: &str, name: &str, causes: Vec<(String, String)>) -> Self {
        // The aggregate message lists each distinct error once, bracketed when there are several.
        let mut seen = std::collections::BTreeSet::new();
        let summary: Vec<String> = causes
            .iter()
            .map(|(f, m)| {
                if f.is_empty() {
                    m.clone()
                } else {
                    format!("{f}: {m}")
                }
            })
            .filter(|line| seen.insert(line.clone()))
            .collect();
        let message = match summary.as_slice() {
            [] => format!("{kind} \"{name}\" is invalid"),
            [one] => format!("{kind} \"{name}\" is invalid: {one}"),
            many => format!("{kind} \"{name}\" is invalid: [{}]", many.join(", ")),
        };
        let mut e = ApiError::new(422, "Invalid", message);
        let (bare_kind, group) = kind.split_once('.').unwrap_or((kind, ""));
        let mut details = json!({
            "name": name,
            "kind": bare_kind,
            "causes": causes.iter().map(|(f, m)| json!({"reason": cause_reason(m), "message": m, "field": f})).collect::<Vec<_>>(),
        });
        if !group.is_empty() {
            details["group"] = json!(group);
        }
        e.details = Some(details);
        e
    }

    /// 413, as kube-apiserver answers a body over its limit.
    pub fn too_large(limit: usize) -> Self {
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn gone(message: impl Into<String>) -> Self {
        ApiError::new(410, "Expired", message)
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        ApiError::new(405, "MethodNotAllowed", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        ApiError::new(415, "UnsupportedMediaType", message)
    }

    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(403, "Forbidden", message)
    }

    /// kube's answer to a request without valid credentials.
    pub fn unauthorized() -> Self {
        ApiError::new(401, "Unauthorized", "Unauthorized")
    }

    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(500, "InternalError", message)
    }

    /// kube's 403 for a request the authorizer did not allow, with the object it named.
    pub fn forbidden_request(user: &super::rbac::UserInfo, a: &super::rbac::Attributes) -> Self {
        let err = ApiError::forbidden(super::rbac::forbidden_message(user, a));
        if !a.resource_request {
            return err;
        }
        let mut details = json!({"group": a.api_group, "kind": a.resource});
        if !a.name.is_empty() {
            details["name"] = a.name.clone().into();
        }
        ApiError {
            details: Some(details),
            ..err
        }
    }

    pub fn path_not_found() -> Self {
        ApiError::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    /// The `Status` object.
    pub fn status(&self) -> Value {
        let mut v = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            v["details"] = d.clone();
        }
        // No reason is none at all (StatusReasonUnknown), as kube writes it.
        if self.reason.is_empty()
            && let Some(o) = v.as_object_mut()
        {
            o.remove("reason");
        }
        v
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, axum::Json(self.status())).into_response()
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

/// An error and its sources, as Go prints a wrapped error: `outer: inner: innermost`.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}
