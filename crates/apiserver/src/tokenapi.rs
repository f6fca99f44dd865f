//! The logic of the aggregated UploadTokenRequest API (`upload.cdi.kubevirt.io/v1beta1`), as
//! upstream's `cdi-apiserver` applies it: the caller is who the aggregator says in its
//! request headers — believed only over a client certificate the front-proxy CA signed, with a
//! name the cluster allows (`kube-system/extension-apiserver-authentication`) — and may have a
//! token if a SubjectAccessReview for `create` on `uploadtokenrequests` in the namespace says
//! so; the token is for an upload to exactly the named claim.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use cdi_pki::token::{LIFETIME, Payload, Signer};

/// The API group, version and resource served.
pub const GROUP: &str = "upload.cdi.kubevirt.io";
pub const VERSION: &str = "v1beta1";
pub const RESOURCE: &str = "uploadtokenrequests";

/// How the aggregator's requests are to be read: the client certificate names it may use, and
/// the headers that carry the caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RequestHeaders {
    pub allowed_names: Vec<String>,
    pub username: Vec<String>,
    pub uid: Vec<String>,
    pub group: Vec<String>,
    pub extra_prefixes: Vec<String>,
}

impl RequestHeaders {
    /// From the data of `extension-apiserver-authentication` (each value a JSON list).
    pub fn from_config_map(data: &BTreeMap<String, String>) -> RequestHeaders {
        let list = |key: &str| -> Vec<String> {
            data.get(key)
                .and_then(|v| serde_json::from_str(v).ok())
                .unwrap_or_default()
        };
        RequestHeaders {
            allowed_names: list("requestheader-allowed-names"),
            username: list("requestheader-username-headers"),
            uid: list("requestheader-uid-headers"),
            group: list("requestheader-group-headers"),
            extra_prefixes: list("requestheader-extra-headers-prefix"),
        }
    }
}

/// The caller the aggregator vouches for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Caller {
    pub user: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request gets no token, with the HTTP status upstream answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Refusal {
    pub code: u16,
    pub message: String,
}

fn refuse(code: u16, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// The caller of a request whose client certificate (already verified against the front-proxy
/// CA) has common name `client_cn`, from its `headers` (name, value; names in any case).
pub fn caller(
    headers: &[(String, String)],
    client_cn: Option<&str>,
    config: &RequestHeaders,
) -> Result<Caller, Refusal> {
    let Some(cn) = client_cn else {
        return Err(refuse(401, "Unauthorized"));
    };
    if !config.allowed_names.is_empty() && !config.allowed_names.iter().any(|n| n == cn) {
        return Err(refuse(
            401,
            format!("client certificate {cn:?} is not one the cluster allows to proxy"),
        ));
    }
    let values = |names: &[String]| -> Vec<String> {
        headers
            .iter()
            .filter(|(k, _)| names.iter().any(|n| n.eq_ignore_ascii_case(k)))
            .map(|(_, v)| v.clone())
            .collect()
    };
    let user = values(&config.username)
        .into_iter()
        .find(|u| !u.is_empty())
        .ok_or_else(|| refuse(401, "Unauthorized"))?;
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in headers {
        let lower = k.to_ascii_lowercase();
        if let Some(key) = config
            .extra_prefixes
            .iter()
            .find_map(|p| lower.strip_prefix(&p.to_ascii_lowercase()))
        {
            extra.entry(key.to_string()).or_default().push(v.clone());
        }
    }
    Ok(Caller {
        user,
        uid: values(&config.uid).into_iter().next().unwrap_or_default(),
        groups: values(&config.group),
        extra,
    })
}

/// The SubjectAccessReview that decides whether `caller` may have a token in `namespace`.
pub fn access_review(caller: &Caller, namespace: &str) -> Value {
    let mut spec = json!({"user": caller.user, "groups": caller.groups,
        "resourceAttributes": {"namespace": namespace, "verb": "create", "group": GROUP,
            "version": VERSION, "resource": RESOURCE}});
    if !caller.uid.is_empty() {
        spec["uid"] = json!(caller.uid);
    }
    if !caller.extra.is_empty() {
        spec["extra"] = json!(caller.extra);
    }
    json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec})
}

/// The answer to an UploadTokenRequest in `namespace` the review allowed: the request with
/// `status.token` for an upload to its `spec.pvcName`.
pub fn answer(request: &Value, namespace: &str, signer: &Signer) -> Result<Value, Refusal> {
    let claim = request["spec"]["pvcName"].as_str().unwrap_or("");
    if claim.is_empty() {
        return Err(refuse(
            422,
            "UploadTokenRequest is invalid: spec.pvcName: Required value",
        ));
    }
    // The name is put into an API path by the proxy: only a claim's name may be signed, not a
    // path such as `../other-ns/claim` or `claim/status`.
    if !cdi_core::naming::is_object_name(claim) {
        return Err(refuse(
            422,
            format!(
                "UploadTokenRequest is invalid: spec.pvcName: Invalid value: {claim:?}: a PVC name must be a lowercase RFC 1123 subdomain (letters, digits, '-' and '.')"
            ),
        ));
    }
    let mut out = request.clone();
    out["apiVersion"] = json!(format!("{GROUP}/{VERSION}"));
    out["kind"] = json!("UploadTokenRequest");
    out["metadata"]["namespace"] = json!(namespace);
    out["status"] = json!({"token": signer.sign(&Payload::upload(namespace, claim), LIFETIME)});
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdi_pki::token::{API_ISSUER, Validator, generate_key};

    /// What the development cluster's API server publishes, as kube-apiserver does.
    fn published() -> RequestHeaders {
        let data: BTreeMap<String, String> = [
            ("requestheader-allowed-names", r#"["front-proxy-client"]"#),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-uid-headers", r#"["X-Remote-Uid"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        RequestHeaders::from_config_map(&data)
    }

    fn headers(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_caller_is_believed_only_from_the_allowed_proxy() {
        let config = published();
        let h = headers(&[
            ("x-remote-user", "alice"),
            ("X-Remote-Group", "devs"),
            ("x-remote-group", "system:authenticated"),
            ("x-remote-extra-scopes", "a"),
        ]);
        let alice = caller(&h, Some("front-proxy-client"), &config).unwrap();
        assert_eq!(alice.user, "alice");
        assert_eq!(alice.groups, ["devs", "system:authenticated"]);
        assert_eq!(alice.extra["scopes"], ["a"]);
        assert_eq!(caller(&h, None, &config).unwrap_err().code, 401);
        assert_eq!(caller(&h, Some("mallory"), &config).unwrap_err().code, 401);
        let nobody = headers(&[("x-remote-group", "devs")]);
        assert_eq!(
            caller(&nobody, Some("front-proxy-client"), &config)
                .unwrap_err()
                .code,
            401
        );
    }

    #[test]
    fn the_review_asks_for_create_on_uploadtokenrequests_in_the_namespace() {
        let review = access_review(
            &Caller {
                user: "alice".into(),
                groups: vec!["devs".into()],
                ..Default::default()
            },
            "a",
        );
        assert_eq!(review["spec"]["user"], "alice");
        assert_eq!(
            review["spec"]["resourceAttributes"],
            json!({"namespace": "a", "verb": "create", "group": GROUP, "version": VERSION,
                "resource": RESOURCE})
        );
    }

    #[test]
    fn the_answer_holds_a_token_for_that_claim_only() {
        let (private, public) = generate_key().unwrap();
        let signer = Signer::new(API_ISSUER, &private).unwrap();
        let validator = Validator::new(API_ISSUER, &public).unwrap();
        let request = json!({"apiVersion": "upload.cdi.kubevirt.io/v1beta1",
            "kind": "UploadTokenRequest", "metadata": {"name": "t"}, "spec": {"pvcName": "disk"}});
        let answer = answer(&request, "a", &signer).unwrap();
        let token = answer["status"]["token"].as_str().unwrap();
        validator
            .validate_for(token, &Payload::upload("a", "disk"))
            .unwrap();
        assert!(
            validator
                .validate_for(token, &Payload::upload("a", "other"))
                .is_err()
        );
        let empty = json!({"spec": {}});
        assert_eq!(super::answer(&empty, "a", &signer).unwrap_err().code, 422);
        for path in [
            "../nsy/yclaim",
            "nsy/yclaim",
            "yclaim/status",
            "Disk",
            "disk?x=1",
            "-a",
        ] {
            let request = json!({"spec": {"pvcName": path}});
            let refused = super::answer(&request, "a", &signer).unwrap_err();
            assert_eq!(refused.code, 422, "{path}");
            assert!(
                refused.message.contains("spec.pvcName"),
                "{}",
                refused.message
            );
        }
    }
}
