//! Label and field selectors as Kubernetes parses and applies them.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector as ApiLabelSelector;
use serde_json::Value;

/// One label requirement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(pub Vec<Requirement>);

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

fn valid_value(v: &str) -> bool {
    v.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Split on commas outside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut parts) = (0i32, 0usize, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if depth < 0 {
            return Err(format!("unbalanced parentheses in {s:?}"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in {s:?}"));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn set(values: &str, whole: &str) -> Result<Vec<String>, String> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| format!("expected a parenthesised set in {whole:?}"))?;
    let vals: Vec<String> = inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect();
    if vals.is_empty() || vals.iter().any(|v| !valid_value(v)) {
        return Err(format!("invalid value set in {whole:?}"));
    }
    Ok(vals)
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<LabelSelector, String> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(LabelSelector(reqs));
        }
        for part in split_top(s)? {
            let p = part.trim();
            let req = if let Some(k) = p.strip_prefix('!') {
                Requirement::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                Requirement::NotEquals(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once("==") {
                Requirement::Equals(k.trim().to_string(), v.trim().to_string())
            } else if let Some((k, v)) = p.split_once('=') {
                Requirement::Equals(k.trim().to_string(), v.trim().to_string())
            } else if let Some(idx) = p.find(" notin ") {
                Requirement::NotIn(p[..idx].trim().to_string(), set(&p[idx + 7..], p)?)
            } else if let Some(idx) = p.find(" in ") {
                Requirement::In(p[..idx].trim().to_string(), set(&p[idx + 4..], p)?)
            } else {
                Requirement::Exists(p.to_string())
            };
            let (key, value) = match &req {
                Requirement::Equals(k, v) | Requirement::NotEquals(k, v) => (k, Some(v)),
                Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => (k, None),
            };
            if !valid_key(key) || value.is_some_and(|v| !valid_value(v)) {
                return Err(format!("unable to parse requirement {p:?}"));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0
            .iter()
            .all(|r| r.holds(labels.get(r.key()).map(String::as_str)))
    }
}

impl Requirement {
    /// The label it is about.
    pub fn key(&self) -> &str {
        match self {
            Requirement::Equals(k, _)
            | Requirement::NotEquals(k, _)
            | Requirement::In(k, _)
            | Requirement::NotIn(k, _)
            | Requirement::Exists(k)
            | Requirement::NotExists(k) => k,
        }
    }

    /// Whether the label's value (`None`: the object has no such label) satisfies it.
    pub fn holds(&self, value: Option<&str>) -> bool {
        let listed = |vs: &[String], v: &str| vs.iter().any(|x| x == v);
        match self {
            Requirement::Equals(_, v) => value == Some(v.as_str()),
            Requirement::NotEquals(_, v) => value != Some(v.as_str()),
            Requirement::In(_, vs) => value.is_some_and(|l| listed(vs, l)),
            Requirement::NotIn(_, vs) => value.is_none_or(|l| !listed(vs, l)),
            Requirement::Exists(_) => value.is_some(),
            Requirement::NotExists(_) => value.is_none(),
        }
    }

    /// A selector expression as objects write it (`key`, `operator`, `values`, in a
    /// LabelSelector's `matchExpressions` or a node selector term); `None` for an operator
    /// other than In, NotIn, Exists and DoesNotExist.
    pub fn from_expression(key: &str, operator: &str, values: &[String]) -> Option<Requirement> {
        let key = key.to_string();
        Some(match operator {
            "In" => Requirement::In(key, values.to_vec()),
            "NotIn" => Requirement::NotIn(key, values.to_vec()),
            "Exists" => Requirement::Exists(key),
            "DoesNotExist" => Requirement::NotExists(key),
            _ => return None,
        })
    }
}

impl LabelSelector {
    /// A metav1 LabelSelector (`matchLabels` and `matchExpressions`, as objects carry them) as
    /// requirements; `None` when an expression's operator is unknown, which selects nothing.
    pub fn from_api(s: &ApiLabelSelector) -> Option<LabelSelector> {
        let mut reqs: Vec<Requirement> = s
            .match_labels
            .iter()
            .flatten()
            .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
            .collect();
        for e in s.match_expressions.iter().flatten() {
            let values = e.values.as_deref().unwrap_or_default();
            reqs.push(Requirement::from_expression(&e.key, &e.operator, values)?);
        }
        Some(LabelSelector(reqs))
    }

    /// The equality selector of a plain label map (a Service's `spec.selector`).
    pub fn of_labels(labels: &BTreeMap<String, String>) -> LabelSelector {
        LabelSelector(
            labels
                .iter()
                .map(|(k, v)| Requirement::Equals(k.clone(), v.clone()))
                .collect(),
        )
    }
}

/// Whether a metav1 label selector selects `labels` (an unknown operator selects nothing).
pub fn selects(s: &ApiLabelSelector, labels: &BTreeMap<String, String>) -> bool {
    LabelSelector::from_api(s).is_some_and(|selector| selector.matches(labels))
}

/// The value at a dotted field path, as field selectors read it: a missing field is null.
pub fn field<'a>(obj: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .try_fold(obj, |cur, seg| cur.get(seg))
        .unwrap_or(&Value::Null)
}

/// A parsed field selector: (path, equal?, value).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(pub Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<FieldSelector, String> {
        let mut out = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector(out));
        }
        for part in s.split(',') {
            let p = part.trim();
            let (path, eq, value) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(format!(
                    "invalid field selector {p:?}: use field=value or field!=value"
                ));
            };
            out.push((path.trim().to_string(), eq, value.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    /// Fields are dotted paths into the object; a missing field reads as "".
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, value)| {
            // Compared in place: a list matches every object of its kind.
            let same = match field(obj, path) {
                Value::String(s) => s == value,
                Value::Null => value.is_empty(),
                Value::Bool(b) => value == if *b { "true" } else { "false" },
                Value::Number(n) => value.parse::<serde_json::Number>().is_ok_and(|v| v == *n),
                // A selector's value cannot spell a list or a map (commas separate terms).
                Value::Array(_) | Value::Object(_) => false,
            };
            same == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn label_requirements() {
        let l = labels(&[
            ("app", "cdi"),
            ("tier", "web"),
            ("kubevirt.io/created-by", "uid-1"),
        ]);
        let cases = [
            ("", true),
            ("app=cdi", true),
            ("app==cdi", true),
            ("app!=cdi", false),
            ("app!=other", true),
            ("missing!=x", true),
            ("tier in (web, db)", true),
            ("tier notin (web,db)", false),
            ("missing notin (a)", true),
            ("kubevirt.io/created-by", true),
            ("!kubevirt.io/created-by", false),
            ("app=cdi,tier in (db)", false),
            ("app=cdi, tier in (web,db), !gone", true),
        ];
        for (s, want) in cases {
            assert_eq!(LabelSelector::parse(s).unwrap().matches(&l), want, "{s}");
        }
        for bad in ["tier in (", "tier in ()", "a b=c", "x=(", "in (a)"] {
            assert!(
                LabelSelector::parse(bad).is_err() || bad == "in (a)",
                "{bad}"
            );
        }
    }

    #[test]
    fn fields() {
        let pod = serde_json::json!({"metadata": {"name": "p", "namespace": "ns"}, "spec": {"nodeName": "node-2"}, "status": {"phase": "Running"}});
        for (s, want) in [
            ("metadata.name=p", true),
            ("metadata.namespace==ns,spec.nodeName=node-2", true),
            ("status.phase!=Running", false),
            ("spec.nodeName=", false),
            ("spec.missing=", true),
        ] {
            assert_eq!(FieldSelector::parse(s).unwrap().matches(&pod), want, "{s}");
        }
        assert!(FieldSelector::parse("nonsense").is_err());
    }

    proptest! {
        #[test]
        fn parsing_never_panics(s in "[a-z=!(), .in/-]{0,40}") {
            let _ = LabelSelector::parse(&s);
            let _ = FieldSelector::parse(&s);
        }

        #[test]
        fn equality_selectors_round_trip(k in "[a-z][a-z0-9]{0,8}", v in "[a-z0-9]{0,8}") {
            let l: BTreeMap<String, String> = [(k.clone(), v.clone())].into();
            let eq = format!("{k}={v}");
            let ne = format!("{k}!={v}");
            prop_assert!(LabelSelector::parse(&eq).unwrap().matches(&l));
            prop_assert!(!LabelSelector::parse(&ne).unwrap().matches(&l));
        }
    }
}
