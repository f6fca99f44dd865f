//! The reviews, answered rather than stored: SubjectAccessReviews (local, self) by the RBAC
//! authorizer, SelfSubjectRulesReview, TokenReview by the authenticator, SelfSubjectReview.

use serde_json::{Value, json};

use super::call::{AuditLog, Call, Live, write_audit};
use super::controllers::rbac_policy;
use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::rbac::{Attributes, UserInfo};
use crate::apiserver::registry::ResourceDef;
use crate::apiserver::store::Store;

/// The status of a review: access reviews answered by the RBAC authorizer, a TokenReview by the
/// authenticator, a SelfSubjectReview with the caller.
pub(super) fn answer_review(
    call: &Call,
    def: &ResourceDef,
    ns: &str,
    review: &Value,
) -> ApiResult<Value> {
    match def.kind.as_str() {
        "SelfSubjectAccessReview" => {
            access_review(&call.store, def, ns, review, Some(&call.user), None)
        }
        "SelfSubjectRulesReview" => Ok(rules_review(&call.store, &call.user, review)),
        "TokenReview" => Ok(token_review(call, review)),
        "SelfSubjectReview" => {
            Ok(json!({"userInfo": crate::apiserver::auth::user_json(&call.user)}))
        }
        _ => access_review(&call.store, def, ns, review, None, call.audit.as_ref()),
    }
}

/// What the caller may do in `spec.namespace` (cluster-wide rules included), as
/// `kubectl auth can-i --list` shows it.
fn rules_review(store: &Store, user: &UserInfo, review: &Value) -> Value {
    let ns = review["spec"]["namespace"].as_str().unwrap_or("");
    let (mut resource_rules, mut path_rules) = (Vec::new(), Vec::new());
    for (_, rule) in rbac_policy(store).rules_for(user, ns) {
        let mut out = json!({"verbs": rule.verbs});
        if let Some(urls) = rule.non_resource_urls.filter(|u| !u.is_empty()) {
            out["nonResourceURLs"] = json!(urls);
            if !path_rules.contains(&out) {
                path_rules.push(out);
            }
            continue;
        }
        out["apiGroups"] = json!(rule.api_groups.unwrap_or_default());
        out["resources"] = json!(rule.resources.unwrap_or_default());
        if let Some(names) = rule.resource_names.filter(|n| !n.is_empty()) {
            out["resourceNames"] = json!(names);
        }
        if !resource_rules.contains(&out) {
            resource_rules.push(out);
        }
    }
    json!({"resourceRules": resource_rules, "nonResourceRules": path_rules, "incomplete": false})
}

/// Whether `spec.token` authenticates, for `spec.audiences` (this server's own by default).
fn token_review(call: &Call, review: &Value) -> Value {
    let token = review["spec"]["token"].as_str().unwrap_or("");
    let asked: Vec<String> = review["spec"]["audiences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    let audiences = if asked.is_empty() {
        vec![crate::apiserver::auth::AUDIENCE.to_string()]
    } else {
        asked
    };
    for audience in &audiences {
        if let Some(user) = call.auth.verify(token, audience, &Live(&call.store)) {
            return json!({"authenticated": true, "user": crate::apiserver::auth::user_json(&user), "audiences": [audience]});
        }
    }
    json!({"authenticated": false, "user": {}, "error": "invalid bearer token"})
}

/// A SubjectAccessReview (or LocalSubjectAccessReview) answered by the RBAC authorizer: whether
/// the user or groups in its spec may do what it asks.
fn access_review(
    store: &Store,
    def: &ResourceDef,
    ns: &str,
    review: &Value,
    caller: Option<&UserInfo>,
    audit: Option<&AuditLog>,
) -> ApiResult<Value> {
    use crate::apiserver::validation::FieldError;
    let spec = &review["spec"];
    let resource = spec.get("resourceAttributes").filter(|v| v.is_object());
    let path = spec.get("nonResourceAttributes").filter(|v| v.is_object());
    let text = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    // A SelfSubjectAccessReview asks about its caller.
    let user = caller.cloned().unwrap_or_else(|| UserInfo {
        name: text(spec, "user"),
        uid: text(spec, "uid"),
        groups: spec["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g.as_str().map(String::from))
            .collect(),
    });
    let mut errs = Vec::new();
    if resource.is_some() && path.is_some() {
        errs.push(
            FieldError::invalid(
                "spec.nonResourceAttributes",
                "",
                "cannot be specified in combination with resourceAttributes",
            )
            .cause(),
        );
    }
    if resource.is_none() && path.is_none() {
        // Go prints the nil attributes it names as "null".
        errs.push(
            FieldError::invalid(
                "spec.resourceAttributes",
                "null",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )
            .cause(),
        );
    }
    if caller.is_none() && user.name.is_empty() && user.groups.is_empty() {
        errs.push(
            FieldError::invalid(
                "spec.user",
                "",
                "at least one of user or group must be specified",
            )
            .cause(),
        );
    }
    if !errs.is_empty() {
        return Err(ApiError::invalid(
            &format!("{}.{}", def.kind, def.group),
            "",
            errs,
        ));
    }
    let attributes = match (resource, path) {
        (Some(r), _) => Attributes {
            verb: text(r, "verb"),
            resource_request: true,
            // A LocalSubjectAccessReview asks about its own namespace.
            namespace: if def.namespaced {
                ns.to_string()
            } else {
                text(r, "namespace")
            },
            api_group: text(r, "group"),
            resource: text(r, "resource"),
            subresource: text(r, "subresource"),
            name: text(r, "name"),
            path: String::new(),
        },
        (None, Some(p)) => Attributes {
            verb: text(p, "verb"),
            path: text(p, "path"),
            ..Default::default()
        },
        (None, None) => unreachable!("refused above"),
    };
    let decided = rbac_policy(store).authorize(&user, &attributes);
    if let Some(audit) = audit.filter(|_| caller.is_none()) {
        // A decision made for another (a server delegating authorization) is logged as the
        // reviewed user's, marked so: what that user's roles must allow.
        let mut line = crate::apiserver::auth::audit_event(
            &user,
            &attributes,
            &axum::http::Uri::from_static("/apis/authorization.k8s.io/v1/subjectaccessreviews"),
            decided.is_some(),
        );
        line["annotations"]["cdi-rs.dev/subject-access-review"] = json!("true");
        write_audit(audit, &line);
    }
    Ok(match decided {
        Some(reason) => json!({"allowed": true, "reason": reason}),
        None => json!({"allowed": false}),
    })
}
