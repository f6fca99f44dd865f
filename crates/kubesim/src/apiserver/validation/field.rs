//! A field error as k8s.io/apimachinery's `field.Error` prints it, so that messages match a
//! real cluster's, and Go's `%q` quoting they print values with.

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
    pub(super) fn new(kind: ErrorType, field: &str, value: BadValue, detail: &str) -> Self {
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
