//! Admission webhooks, as kube-apiserver calls them: each MutatingWebhookConfiguration's
//! webhooks whose rules, namespace selector and object selector match a write are sent an
//! AdmissionReview (v1) over HTTPS, trusting their `caBundle`, and their JSONPatch is applied, in
//! order; then every matching ValidatingWebhookConfiguration's webhooks may deny it. A webhook
//! that cannot be reached fails the request (`failurePolicy: Fail`, the default) or is skipped
//! (`Ignore`). The configurations themselves are never sent to webhooks.

use std::time::Duration;

use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult, error_chain};
use super::rbac::UserInfo;
use super::registry::ResourceDef;
use super::store::{ListOptions, Store};

/// A write, as an AdmissionReview's request describes it.
pub struct Attempt<'a> {
    pub operation: &'a str,
    pub def: &'a ResourceDef,
    pub subresource: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub old: Option<&'a Value>,
    pub user: &'a UserInfo,
    pub dry_run: bool,
}

const GROUP: &str = "admissionregistration.k8s.io";

/// The webhooks of every configuration of `plural`, in the order kube calls them (by
/// configuration name, then as listed), with their configuration's name.
fn webhooks(store: &Store, plural: &str) -> Vec<(String, Value)> {
    let Some(def) = store.registry().get(GROUP, "v1", plural).cloned() else {
        return Vec::new();
    };
    let (mut configs, _, _) = store.list(&def, None, &ListOptions::default());
    configs.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    configs
        .into_iter()
        .flat_map(|c| {
            let name = c["metadata"]["name"].as_str().unwrap_or("").to_string();
            c["webhooks"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |w| (name.clone(), w))
        })
        .collect()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn any_or(list: &[&str], value: &str) -> bool {
    list.iter().any(|v| *v == "*" || *v == value)
}

/// Whether a rule names the attempt: operation, group, version, resource (`*`, `*/*`,
/// `pods/*`, `*/status`), scope.
fn rule_matches(rule: &Value, a: &Attempt) -> bool {
    let resource = if a.subresource.is_empty() {
        a.def.plural.clone()
    } else {
        format!("{}/{}", a.def.plural, a.subresource)
    };
    let resources_match = strings(&rule["resources"]).iter().any(|r| {
        let (rr, rs) = r.split_once('/').unwrap_or((r, ""));
        let main = rr == "*" || rr == a.def.plural;
        let sub = if a.subresource.is_empty() {
            rs.is_empty()
        } else {
            rs == "*" || rs == a.subresource
        };
        *r == resource || (main && sub)
    });
    let scope = rule["scope"].as_str().unwrap_or("*");
    let scope_match = match scope {
        "Cluster" => !a.def.namespaced,
        "Namespaced" => a.def.namespaced,
        _ => true,
    };
    any_or(&strings(&rule["operations"]), a.operation)
        && any_or(&strings(&rule["apiGroups"]), &a.def.group)
        && any_or(&strings(&rule["apiVersions"]), &a.def.version)
        && resources_match
        && scope_match
}

fn selector_matches(selector: &Value, labels: &Value) -> bool {
    if selector.is_null() {
        return true;
    }
    let Ok(selector) = serde_json::from_value(selector.clone()) else {
        return false;
    };
    let labels: std::collections::BTreeMap<String, String> =
        serde_json::from_value(labels.clone()).unwrap_or_default();
    super::selector::selects(&selector, &labels)
}

/// Whether a webhook is called for the attempt on `object` (the new object, or the old one for a
/// delete).
fn applies(store: &Store, webhook: &Value, a: &Attempt, object: Option<&Value>) -> bool {
    if !strings_rules(webhook).any(|r| rule_matches(r, a)) {
        return false;
    }
    // The namespace's labels (a Namespace is its own); cluster-scoped objects are not filtered.
    let ns_selector = &webhook["namespaceSelector"];
    if !ns_selector.is_null() && (a.def.namespaced || a.def.plural == "namespaces") {
        let ns_name = if a.def.plural == "namespaces" {
            a.name
        } else {
            a.namespace
        };
        let labels = store
            .registry()
            .get("", "v1", "namespaces")
            .cloned()
            .and_then(|def| store.get(&def, "", ns_name).ok())
            .map(|ns| ns["metadata"]["labels"].clone())
            .unwrap_or(Value::Null);
        if !selector_matches(ns_selector, &labels) {
            return false;
        }
    }
    let obj_selector = &webhook["objectSelector"];
    if !obj_selector.is_null() {
        let new = object.map(|o| o["metadata"]["labels"].clone());
        let old = a.old.map(|o| o["metadata"]["labels"].clone());
        let any = [new, old]
            .into_iter()
            .flatten()
            .any(|labels| selector_matches(obj_selector, &labels));
        if !any {
            return false;
        }
    }
    true
}

fn strings_rules(webhook: &Value) -> impl Iterator<Item = &Value> {
    webhook["rules"].as_array().into_iter().flatten()
}

/// The AdmissionReview sent to a webhook.
fn review(a: &Attempt, object: Option<&Value>, uid: &str) -> Value {
    let mut user = json!({"username": a.user.name, "groups": a.user.groups});
    if !a.user.uid.is_empty() {
        user["uid"] = json!(a.user.uid);
    }
    let kind = json!({"group": a.def.group, "version": a.def.version, "kind": a.def.kind});
    let resource =
        json!({"group": a.def.group, "version": a.def.version, "resource": a.def.plural});
    let mut request = json!({"uid": uid, "kind": kind, "resource": resource,
        "requestKind": kind, "requestResource": resource,
        "name": a.name, "operation": a.operation, "userInfo": user,
        "object": object.cloned().unwrap_or(Value::Null),
        "oldObject": a.old.cloned().unwrap_or(Value::Null),
        "dryRun": a.dry_run});
    if !a.subresource.is_empty() {
        request["subResource"] = json!(a.subresource);
        request["requestSubResource"] = json!(a.subresource);
    }
    if a.def.namespaced {
        request["namespace"] = json!(a.namespace);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// Where a webhook is: its `url`, or its Service (`https://<svc>.<ns>.svc:<port><path>`, reached
/// at the Service's cluster IP). Returns the URL, and for a Service its host and address.
fn endpoint(
    store: &Store,
    config: &Value,
) -> Result<(String, Option<(String, std::net::SocketAddr)>), String> {
    if let Some(url) = config["url"].as_str() {
        return Ok((url.to_string(), None));
    }
    let service = &config["service"];
    let (host, port, at) = super::aggregation::service_address(store, service)?;
    let path = service["path"].as_str().unwrap_or("/");
    Ok((format!("https://{host}:{port}{path}"), Some((host, at))))
}

/// Call one webhook: its response, or why it could not be called (kube's wording after
/// `failed calling webhook "…": `).
async fn call(store: &Store, webhook: &Value, body: &Value) -> Result<Value, String> {
    let config = &webhook["clientConfig"];
    let (url, at) = endpoint(store, config)?;
    let mut client = reqwest::Client::builder().timeout(Duration::from_secs(
        webhook["timeoutSeconds"]
            .as_u64()
            .unwrap_or(10)
            .clamp(1, 30),
    ));
    client = super::aggregation::trusting(client, config["caBundle"].as_str())?;
    if let Some((host, at)) = at {
        client = client.resolve(&host, at);
    }
    let client = client.build().map_err(|e| e.to_string())?;
    let response = client
        .post(&url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| format!("failed to call webhook: Post {url:?}: {}", error_chain(&e)))?;
    let status = response.status();
    let text = response.text().await.map_err(|e| e.to_string())?;
    if !status.is_success() {
        return Err(format!(
            "received invalid webhook response: the server responded with {status}"
        ));
    }
    let review: Value = serde_json::from_str(&text)
        .map_err(|e| format!("received invalid webhook response: {e}"))?;
    let answer = review["response"].clone();
    if answer["uid"] != body["request"]["uid"] {
        return Err(format!(
            "expected response.uid={:?}, got {:?}",
            body["request"]["uid"].as_str().unwrap_or(""),
            answer["uid"].as_str().unwrap_or("")
        ));
    }
    Ok(answer)
}

/// kube's error for a webhook that denied the request.
fn denied(webhook: &str, answer: &Value) -> ApiError {
    let status = &answer["status"];
    let message = status["message"].as_str().unwrap_or("");
    let by = format!("admission webhook {webhook:?} denied the request");
    let code = status["code"].as_u64().filter(|c| *c >= 400).unwrap_or(400) as u16;
    let message = if message.is_empty() {
        format!("{by} without explanation")
    } else {
        format!("{by}: {message}")
    };
    // kube-apiserver passes the webhook's Status on as it is: its reason (none, often, so
    // kubectl says just "Error from server: …") and its details (the causes).
    let reason = match status["reason"].as_str().unwrap_or("") {
        "Forbidden" => "Forbidden",
        "NotFound" => "NotFound",
        "Conflict" => "Conflict",
        "Invalid" => "Invalid",
        "BadRequest" => "BadRequest",
        "AlreadyExists" => "AlreadyExists",
        "Unauthorized" => "Unauthorized",
        _ => "",
    };
    ApiError {
        code,
        reason,
        message,
        details: status.get("details").filter(|d| d.is_object()).cloned(),
    }
}

/// Whether a webhook failed to be called counts (Fail, the default) or not (Ignore).
fn fails_closed(webhook: &Value) -> bool {
    webhook["failurePolicy"].as_str() != Some("Ignore")
}

fn name_of(webhook: &Value) -> String {
    webhook["name"].as_str().unwrap_or("").to_string()
}

/// Whether any webhook configuration exists at all (most requests need go no further).
pub fn any(store: &Store, def: &ResourceDef) -> bool {
    // None was ever written (the cluster starts without any): no need to list them.
    if def.group == GROUP || store.group_version(GROUP) == 0 {
        return false;
    }
    [
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    ]
    .iter()
    .any(|p| !webhooks(store, p).is_empty())
}

/// Run the mutating webhooks on `object`: their patches applied, in order. Returns warnings.
pub async fn mutate(store: &Store, a: &Attempt<'_>, object: &mut Value) -> ApiResult<Vec<String>> {
    if !any(store, a.def) {
        return Ok(Vec::new());
    }
    let mut warnings = Vec::new();
    for (_, webhook) in webhooks(store, "mutatingwebhookconfigurations") {
        if !applies(store, &webhook, a, Some(object)) {
            continue;
        }
        let name = name_of(&webhook);
        let uid = super::store::new_uid();
        let answer = match call(store, &webhook, &review(a, Some(object), &uid)).await {
            Ok(answer) => answer,
            Err(why) if fails_closed(&webhook) => {
                return Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook {name:?}: {why}"
                )));
            }
            Err(_) => continue,
        };
        warnings.extend(strings(&answer["warnings"]).into_iter().map(String::from));
        if answer["allowed"] != json!(true) {
            return Err(denied(&name, &answer));
        }
        if let Some(patch) = answer["patch"].as_str() {
            use base64::Engine;
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(patch)
                .map_err(|e| {
                    ApiError::internal(format!(
                        "Internal error occurred: webhook {name:?} sent a patch that is not base64: {e}"
                    ))
                })?;
            let ops: json_patch::Patch = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::internal(format!(
                    "Internal error occurred: webhook {name:?} sent an invalid JSON patch: {e}"
                ))
            })?;
            json_patch::patch(object, &ops).map_err(|e| {
                ApiError::internal(format!(
                    "Internal error occurred: webhook {name:?} sent a patch that does not apply: {e}"
                ))
            })?;
        }
    }
    Ok(warnings)
}

/// Run the validating webhooks: any may deny. Returns warnings.
pub async fn validate(
    store: &Store,
    a: &Attempt<'_>,
    object: Option<&Value>,
) -> ApiResult<Vec<String>> {
    if !any(store, a.def) {
        return Ok(Vec::new());
    }
    let mut warnings = Vec::new();
    for (_, webhook) in webhooks(store, "validatingwebhookconfigurations") {
        if !applies(store, &webhook, a, object.or(a.old)) {
            continue;
        }
        let name = name_of(&webhook);
        let uid = super::store::new_uid();
        match call(store, &webhook, &review(a, object, &uid)).await {
            Ok(answer) => {
                warnings.extend(strings(&answer["warnings"]).into_iter().map(String::from));
                if answer["allowed"] != json!(true) {
                    return Err(denied(&name, &answer));
                }
            }
            Err(why) if fails_closed(&webhook) => {
                return Err(ApiError::internal(format!(
                    "Internal error occurred: failed calling webhook {name:?}: {why}"
                )));
            }
            Err(_) => {}
        }
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn def(group: &str, plural: &str, namespaced: bool) -> ResourceDef {
        let mut d = super::super::registry::Registry::with_builtins()
            .get("", "v1", "pods")
            .cloned()
            .unwrap();
        d.group = group.into();
        d.version = "v1beta1".into();
        d.kind = "DataVolume".into();
        d.plural = plural.into();
        d.namespaced = namespaced;
        d
    }

    fn attempt<'a>(
        d: &'a ResourceDef,
        op: &'a str,
        sub: &'a str,
        user: &'a UserInfo,
    ) -> Attempt<'a> {
        Attempt {
            operation: op,
            def: d,
            subresource: sub,
            namespace: "a",
            name: "dv",
            old: None,
            user,
            dry_run: false,
        }
    }

    #[test]
    fn rules_match_operations_groups_resources_and_scope() {
        let user = UserInfo::default();
        let dvs = def("cdi.kubevirt.io", "datavolumes", true);
        let rule = json!({"operations": ["CREATE", "UPDATE"], "apiGroups": ["cdi.kubevirt.io"],
            "apiVersions": ["*"], "resources": ["datavolumes"], "scope": "Namespaced"});
        assert!(rule_matches(&rule, &attempt(&dvs, "CREATE", "", &user)));
        assert!(!rule_matches(&rule, &attempt(&dvs, "DELETE", "", &user)));
        assert!(!rule_matches(
            &rule,
            &attempt(&dvs, "UPDATE", "status", &user)
        ));
        let status = json!({"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
            "resources": ["*/status"]});
        assert!(rule_matches(
            &status,
            &attempt(&dvs, "UPDATE", "status", &user)
        ));
        assert!(!rule_matches(&status, &attempt(&dvs, "UPDATE", "", &user)));
        let cluster = json!({"operations": ["*"], "apiGroups": ["*"], "apiVersions": ["*"],
            "resources": ["*"], "scope": "Cluster"});
        assert!(!rule_matches(&cluster, &attempt(&dvs, "CREATE", "", &user)));
    }

    #[test]
    fn a_denial_reads_as_kube_writes_it() {
        let e = denied(
            "dv-validate.cdi.kubevirt.io",
            &json!({"allowed": false, "status": {"code": 403, "message": "no"}}),
        );
        assert_eq!(e.code, 403);
        assert_eq!(
            e.message,
            "admission webhook \"dv-validate.cdi.kubevirt.io\" denied the request: no"
        );
        let e = denied("w", &json!({"allowed": false}));
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "admission webhook \"w\" denied the request without explanation"
            )
        );
    }
}
