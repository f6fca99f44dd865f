//! Where a request points ([`route`]), and how the request metrics name it ([`describe`]).

use axum::extract::Request;

use super::discovery::Document;
use super::request::Query;
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::http::decode_segment;
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::store::Store;

/// Where a request points.
pub(super) enum Target {
    /// A discovery document.
    Discovery(Document),
    Collection {
        def: ResourceDef,
        ns: Option<String>,
    },
    Item {
        def: ResourceDef,
        ns: String,
        name: String,
        sub: Option<String>,
    },
}

/// Where `path` points: a discovery document, a collection or an object (and its
/// subresource) of a served resource; names and namespaces percent-decoded and checked.
pub(super) fn route(store: &Store, path: &str) -> ApiResult<Target> {
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, version, rest): (&str, &str, &[&str]) = match segs.as_slice() {
        ["version"] => return Ok(Target::Discovery(Document::Version)),
        ["openapi", "v3"] => return Ok(Target::Discovery(Document::OpenApiRoot)),
        ["openapi", "v3", "api", v] => {
            return Ok(Target::Discovery(Document::OpenApi(
                String::new(),
                v.to_string(),
            )));
        }
        ["openapi", "v3", "apis", g, v] => {
            return Ok(Target::Discovery(Document::OpenApi(
                g.to_string(),
                v.to_string(),
            )));
        }
        ["api"] => return Ok(Target::Discovery(Document::ApiVersions)),
        ["apis"] => return Ok(Target::Discovery(Document::Groups)),
        ["apis", g] => return Ok(Target::Discovery(Document::Group(g.to_string()))),
        ["api", v] => {
            return Ok(Target::Discovery(Document::Resources(
                String::new(),
                v.to_string(),
            )));
        }
        ["apis", g, v] => {
            return Ok(Target::Discovery(Document::Resources(
                g.to_string(),
                v.to_string(),
            )));
        }
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return Err(ApiError::path_not_found()),
    };
    let registry = store.registry();
    let def = |plural: &str| {
        registry
            .get(group, version, plural)
            .cloned()
            .ok_or_else(ApiError::path_not_found)
    };
    let core_ns = group.is_empty();
    let mut target = match rest {
        [plural] => Target::Collection {
            def: def(plural)?,
            ns: None,
        },
        ["namespaces", name] if core_ns => Target::Item {
            def: def("namespaces")?,
            ns: String::new(),
            name: name.to_string(),
            sub: None,
        },
        ["namespaces", name, sub @ ("status" | "finalize")] if core_ns => Target::Item {
            def: def("namespaces")?,
            ns: String::new(),
            name: name.to_string(),
            sub: Some(sub.to_string()),
        },
        ["namespaces", ns, plural] => {
            let d = def(plural)?;
            if !d.namespaced {
                return Err(ApiError::path_not_found());
            }
            Target::Collection {
                def: d,
                ns: Some(ns.to_string()),
            }
        }
        ["namespaces", ns, plural, name] => Target::Item {
            def: def(plural)?,
            ns: ns.to_string(),
            name: name.to_string(),
            sub: None,
        },
        ["namespaces", ns, plural, name, sub] => Target::Item {
            def: def(plural)?,
            ns: ns.to_string(),
            name: name.to_string(),
            sub: Some(sub.to_string()),
        },
        [plural, name] => Target::Item {
            def: def(plural)?,
            ns: String::new(),
            name: name.to_string(),
            sub: None,
        },
        [plural, name, sub] => Target::Item {
            def: def(plural)?,
            ns: String::new(),
            name: name.to_string(),
            sub: Some(sub.to_string()),
        },
        _ => return Err(ApiError::path_not_found()),
    };
    decode_names(&mut target)?;
    Ok(target)
}

/// Percent-decode the namespace and name a target carries, and check the name as the
/// registry's key function does: it must be usable as a path segment.
fn decode_names(target: &mut Target) -> ApiResult<()> {
    match target {
        Target::Item { ns, name, .. } => {
            *ns = decode_segment(ns);
            *name = decode_segment(name);
            let problems = crate::apiserver::validation::is_path_segment_name(name);
            if !problems.is_empty() {
                return Err(ApiError::bad_request(format!(
                    "Name parameter invalid: {}: {}",
                    crate::apiserver::validation::go_quote(name),
                    problems.join(";")
                )));
            }
        }
        Target::Collection { ns: Some(ns), .. } => *ns = decode_segment(ns),
        _ => {}
    }
    Ok(())
}
/// How kube-apiserver's request metrics label a request: the verb as its authorizer names it,
/// and the resource it reaches.
pub(super) fn describe(
    req: &Request,
    target: Option<&Target>,
    q: &Query,
) -> crate::apiserver::metrics::Request {
    let (def, sub, item) = match target {
        Some(Target::Collection { def, .. }) => (Some(def), None, false),
        Some(Target::Item { def, sub, .. }) => (Some(def), sub.clone(), true),
        _ => (None, None, false),
    };
    let verb = match (def.is_some(), req.method().as_str(), item) {
        (false, m, _) => m.to_ascii_lowercase(),
        (true, "GET", _) if q.flag("watch") => "watch".into(),
        (true, "GET", true) => "get".into(),
        (true, "GET", false) => "list".into(),
        (true, "POST", _) => "create".into(),
        (true, "PUT", _) => "update".into(),
        (true, "PATCH", _) => "patch".into(),
        (true, "DELETE", true) => "delete".into(),
        (true, "DELETE", false) => "deletecollection".into(),
        (true, m, _) => m.to_ascii_lowercase(),
    };
    crate::apiserver::metrics::Request {
        verb,
        group: def.map(|d| d.group.clone()).unwrap_or_default(),
        resource: def.map(|d| d.plural.clone()).unwrap_or_default(),
        subresource: sub.unwrap_or_default(),
        code: String::new(),
    }
}
