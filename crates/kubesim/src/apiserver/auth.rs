//! Who a request comes from, as kube-apiserver's authenticators decide it, and what it asks, as
//! its RequestInfoFactory reads the URL: the admin's bearer token, ServiceAccount tokens (signed,
//! audience-bound JWTs, checked against the ServiceAccount and pod they name), client
//! certificates (`CN` the user, `O` the groups), and impersonation on top of any of them.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::rbac::{Attributes, MASTERS, UserInfo};

/// The audience kube-apiserver's tokens carry by default (`--api-audiences`, from the issuer).
pub const AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// The issuer of ServiceAccount tokens (`--service-account-issuer`).
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
/// The group every authenticated user is in.
pub const AUTHENTICATED: &str = "system:authenticated";
/// The user name of the kubeconfig `cdi dev` writes (kubeadm's admin).
pub const ADMIN: &str = "kubernetes-admin";

/// kube's shortest and default token lifetimes (TokenRequest's `expirationSeconds`).
pub const MIN_TOKEN_SECONDS: i64 = 600;
pub const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// The identity of a connection, where it has one: its TLS client certificate's user, or the
/// caller of an in-process router. A request's bearer token, where it sends one, wins.
#[derive(Debug, Clone)]
pub struct Peer(pub UserInfo);

/// The admin: allowed everything through `system:masters`.
pub fn admin() -> UserInfo {
    UserInfo {
        name: ADMIN.into(),
        uid: String::new(),
        groups: vec![MASTERS.into(), AUTHENTICATED.into()],
    }
}

/// The user a ServiceAccount authenticates as, with kube's groups for it.
pub fn service_account_user(namespace: &str, name: &str, uid: &str) -> UserInfo {
    UserInfo {
        name: format!("system:serviceaccount:{namespace}:{name}"),
        uid: uid.into(),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            AUTHENTICATED.into(),
        ],
    }
}

/// A ServiceAccount token's claims, as kube-apiserver writes them.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    sub: String,
    aud: Vec<String>,
    exp: i64,
    iat: i64,
    nbf: i64,
    #[serde(rename = "kubernetes.io")]
    kubernetes: KubeClaims,
}

#[derive(Debug, Serialize, Deserialize)]
struct KubeClaims {
    namespace: String,
    serviceaccount: ObjectClaim,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pod: Option<ObjectClaim>,
}

#[derive(Debug, Serialize, Deserialize)]
struct ObjectClaim {
    name: String,
    uid: String,
}

/// A token to mint: for which ServiceAccount, bound to which pod, for whom and how long.
#[derive(Debug, Clone)]
pub struct TokenFor {
    pub namespace: String,
    pub service_account: (String, String),
    pub pod: Option<(String, String)>,
    pub audiences: Vec<String>,
    pub seconds: i64,
}

/// What the authenticator looks up in the cluster: the uid of a live ServiceAccount or pod.
pub trait Lookup {
    fn uid(&self, plural: &str, namespace: &str, name: &str) -> Option<String>;
}

/// The credentials a server accepts.
pub struct Authenticator {
    admin_token: String,
    signer: jsonwebtoken::EncodingKey,
    verifier: jsonwebtoken::DecodingKey,
    /// kube-apiserver's `--token-auth-file`: `token,user,uid,"group1,group2"` per line, read
    /// afresh for each token it is asked about, so that lines added while the server runs count.
    token_file: Option<std::path::PathBuf>,
}

fn seconds_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

/// Random bytes as lowercase hex.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the system's random source");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

impl Authenticator {
    /// A fresh admin token and a fresh ServiceAccount signing key (ECDSA P-256, ES256).
    pub fn new() -> Authenticator {
        let key = rcgen::KeyPair::generate().expect("generating the ServiceAccount signing key");
        Authenticator {
            admin_token: random_hex(24),
            signer: jsonwebtoken::EncodingKey::from_ec_pem(key.serialize_pem().as_bytes())
                .expect("the signing key in PKCS#8"),
            verifier: jsonwebtoken::DecodingKey::from_ec_pem(key.public_key_pem().as_bytes())
                .expect("the verifying key"),
            token_file: None,
        }
    }

    /// Also accept the static tokens of `file` (kube-apiserver's `--token-auth-file`).
    pub fn set_token_file(&mut self, file: std::path::PathBuf) {
        self.token_file = Some(file);
    }

    /// The user of a static token, from the token file.
    fn static_token(&self, token: &str) -> Option<UserInfo> {
        let text = std::fs::read_to_string(self.token_file.as_ref()?).ok()?;
        text.lines().find_map(|line| {
            let user = parse_token_line(line)?;
            constant_time_eq(user.0.as_bytes(), token.as_bytes()).then_some(user.1)
        })
    }

    /// The bearer token of the admin kubeconfig.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A ServiceAccount token (TokenRequest); returns it and when it expires (Unix seconds).
    pub fn mint(&self, t: &TokenFor) -> (String, i64) {
        let now = seconds_now();
        let claims = Claims {
            iss: ISSUER.into(),
            sub: format!(
                "system:serviceaccount:{}:{}",
                t.namespace, t.service_account.0
            ),
            aud: t.audiences.clone(),
            exp: now + t.seconds,
            iat: now,
            nbf: now,
            kubernetes: KubeClaims {
                namespace: t.namespace.clone(),
                serviceaccount: ObjectClaim {
                    name: t.service_account.0.clone(),
                    uid: t.service_account.1.clone(),
                },
                pod: t.pod.as_ref().map(|(name, uid)| ObjectClaim {
                    name: name.clone(),
                    uid: uid.clone(),
                }),
            },
        };
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        let token = jsonwebtoken::encode(&header, &claims, &self.signer)
            .expect("signing with a key of the right kind");
        (token, claims.exp)
    }

    /// The user a bearer token authenticates, for a server whose audience is `audience`; None
    /// for a token this server did not issue, an expired one, one for another audience, or one
    /// whose ServiceAccount (or bound pod) is gone or was recreated since.
    pub fn verify(&self, token: &str, audience: &str, cluster: &dyn Lookup) -> Option<UserInfo> {
        if constant_time_eq(token.as_bytes(), self.admin_token.as_bytes()) {
            return Some(admin());
        }
        if token.split('.').count() != 3 {
            return self.static_token(token);
        }
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        validation.set_audience(&[audience]);
        validation.set_issuer(&[ISSUER]);
        validation.leeway = 0;
        let claims = jsonwebtoken::decode::<Claims>(token, &self.verifier, &validation)
            .ok()?
            .claims;
        let k = &claims.kubernetes;
        let sa = &k.serviceaccount;
        if cluster.uid("serviceaccounts", &k.namespace, &sa.name)? != sa.uid {
            return None;
        }
        if let Some(pod) = &k.pod
            && cluster.uid("pods", &k.namespace, &pod.name)? != pod.uid
        {
            return None;
        }
        Some(service_account_user(&k.namespace, &sa.name, &sa.uid))
    }
}

impl Default for Authenticator {
    fn default() -> Self {
        Self::new()
    }
}

/// One line of a token file: `token,user,uid` and optionally `,"group1,group2"`.
pub fn parse_token_line(line: &str) -> Option<(String, UserInfo)> {
    let mut parts = line.trim().splitn(4, ',');
    let token = parts.next()?.trim();
    let name = parts.next()?.trim();
    let uid = parts.next()?.trim();
    if token.is_empty() || name.is_empty() {
        return None;
    }
    let mut groups: Vec<String> = parts
        .next()
        .map(|g| g.trim().trim_matches('"'))
        .into_iter()
        .flat_map(|g| g.split(','))
        .map(|g| g.trim().to_string())
        .filter(|g| !g.is_empty())
        .collect();
    groups.push(AUTHENTICATED.into());
    Some((
        token.to_string(),
        UserInfo {
            name: name.into(),
            uid: uid.into(),
            groups,
        },
    ))
}

/// A line of a token file for `user` in `groups`.
pub fn token_line(token: &str, user: &str, groups: &[String]) -> String {
    format!("{token},{user},{user},\"{}\"\n", groups.join(","))
}

/// Comparison that takes as long for any two tokens of the same length, so that timing does not
/// reveal how much of the admin token a guess got right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The bearer token of an `Authorization` header, if it carries one.
pub fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    let value = headers
        .get(axum::http::header::AUTHORIZATION)?
        .to_str()
        .ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// One authorization decision as a line of kube-apiserver's audit log (audit.k8s.io/v1 Event,
/// Metadata level): the user, the verb, the object reference of a resource request, the URI,
/// and the decision annotation kube's authorizer leaves.
pub fn audit_event(
    user: &UserInfo,
    a: &Attributes,
    uri: &axum::http::Uri,
    allowed: bool,
) -> serde_json::Value {
    let mut event = serde_json::json!({
        "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
        "stage": "ResponseComplete",
        "requestURI": uri.to_string(),
        "verb": a.verb,
        "user": {"username": user.name, "uid": user.uid, "groups": user.groups},
        "annotations": {"authorization.k8s.io/decision": if allowed { "allow" } else { "forbid" }},
    });
    if a.resource_request {
        event["objectRef"] = serde_json::json!({
            "resource": a.resource, "namespace": a.namespace, "name": a.name,
            "apiGroup": a.api_group, "subresource": a.subresource,
        });
    }
    event
}

/// Who asked what, read back from a line [`audit_event`] wrote.
pub fn from_audit_event(event: &serde_json::Value) -> Option<(UserInfo, Attributes)> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or("").to_string();
    let user = UserInfo {
        name: event["user"]["username"].as_str()?.to_string(),
        uid: text(&event["user"]["uid"]),
        groups: event["user"]["groups"]
            .as_array()?
            .iter()
            .filter_map(|g| g.as_str().map(String::from))
            .collect(),
    };
    let object = &event["objectRef"];
    let uri = text(&event["requestURI"]);
    let a = Attributes {
        verb: event["verb"].as_str()?.to_string(),
        resource_request: object.is_object(),
        namespace: text(&object["namespace"]),
        api_group: text(&object["apiGroup"]),
        resource: text(&object["resource"]),
        subresource: text(&object["subresource"]),
        name: text(&object["name"]),
        path: uri.split('?').next().unwrap_or("").to_string(),
    };
    Some((user, a))
}

/// What a request asks, read off its method, path and query as kube's RequestInfoFactory does:
/// `/api/v1/namespaces/a/pods/x/log` is a `get` of `pods/log` named `x` in `a`; a GET without a
/// name is a `list` (or `watch`), naming the object its `metadata.name=` field selector pins;
/// `/healthz` and discovery are non-resource requests.
pub fn request_attributes(
    method: &str,
    path: &str,
    watch: bool,
    field_selector: Option<&str>,
) -> Attributes {
    let parts: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => return non_resource(&other.to_ascii_lowercase(), path),
    };
    let (group, rest): (&str, &[&str]) = match parts.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (group, rest),
        _ => return non_resource(&method.to_ascii_lowercase(), path),
    };
    let mut a = Attributes {
        verb: verb.into(),
        resource_request: true,
        api_group: group.to_string(),
        ..Default::default()
    };
    let mut rest = rest;
    if rest[0] == "namespaces" && rest.len() > 1 {
        a.namespace = decode(rest[1]);
        // `namespaces/a/status` stays the namespace's own subresource; anything else after the
        // namespace's name is a resource in it.
        if rest.len() > 2 && !matches!(rest[2], "status" | "finalize") {
            rest = &rest[2..];
        }
    }
    a.resource = rest[0].to_string();
    if let Some(name) = rest.get(1) {
        a.name = decode(name);
    }
    if let Some(sub) = rest.get(2) {
        a.subresource = sub.to_string();
    }
    if a.name.is_empty() && a.verb == "get" {
        a.verb = if watch { "watch" } else { "list" }.into();
        let pinned = field_selector
            .into_iter()
            .flat_map(|s| s.split(','))
            .find_map(|term| {
                let (field, value) = term.split_once("==").or_else(|| term.split_once('='))?;
                (field.trim() == "metadata.name").then(|| value.trim().to_string())
            });
        if let Some(name) = pinned.filter(|n| !n.is_empty() && !n.contains('/')) {
            a.name = name;
        }
    }
    if a.name.is_empty() && a.verb == "delete" {
        a.verb = "deletecollection".into();
    }
    a
}

fn non_resource(verb: &str, path: &str) -> Attributes {
    Attributes {
        verb: verb.into(),
        path: path.into(),
        ..Default::default()
    }
}

fn decode(segment: &str) -> String {
    super::http::decode_segment(segment)
}

/// The user a request acts as: the authenticated one, or the one it impersonates
/// (`Impersonate-User`, `Impersonate-Group`, `Impersonate-Uid`, `Impersonate-Extra-*`), each
/// impersonation checked with `allowed` as kube's impersonation filter does. Returns the user and,
/// on refusal, kube's 403.
pub fn impersonate(
    requester: UserInfo,
    headers: &axum::http::HeaderMap,
    allowed: &dyn Fn(&UserInfo, &Attributes) -> bool,
) -> ApiResult<UserInfo> {
    let values = |name: &str| -> Vec<String> {
        headers
            .get_all(name)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::to_string)
            .collect()
    };
    let user = values("Impersonate-User").into_iter().next();
    let groups = values("Impersonate-Group");
    let uid = values("Impersonate-Uid").into_iter().next();
    let extras: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(k, v)| {
            let key = k.as_str().strip_prefix("impersonate-extra-")?;
            Some((key.to_string(), v.to_str().ok()?.to_string()))
        })
        .collect();
    let Some(user) = user else {
        if groups.is_empty() && uid.is_none() && extras.is_empty() {
            return Ok(requester);
        }
        return Err(ApiError::internal(format!(
            "requested {groups:?} without impersonating a user"
        )));
    };
    let check = |a: Attributes| -> ApiResult<()> {
        if allowed(&requester, &a) {
            Ok(())
        } else {
            Err(ApiError::forbidden_request(&requester, &a))
        }
    };
    let impersonation = |group: &str, resource: &str, namespace: &str, name: &str| Attributes {
        verb: "impersonate".into(),
        resource_request: true,
        namespace: namespace.into(),
        api_group: group.into(),
        resource: resource.into(),
        name: name.into(),
        ..Default::default()
    };
    let mut out = UserInfo {
        name: user.clone(),
        uid: uid.clone().unwrap_or_default(),
        groups: groups.clone(),
    };
    match user
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
    {
        Some((ns, name)) => {
            check(impersonation("", "serviceaccounts", ns, name))?;
            if groups.is_empty() {
                out.groups = service_account_user(ns, name, "").groups;
            }
        }
        None => check(impersonation("", "users", "", &user))?,
    }
    for g in &groups {
        check(impersonation("", "groups", "", g))?;
    }
    if let Some(uid) = &uid {
        check(impersonation("authentication.k8s.io", "uids", "", uid))?;
    }
    for (key, value) in &extras {
        check(impersonation(
            "authentication.k8s.io",
            &format!("userextras/{key}"),
            "",
            value,
        ))?;
    }
    if user != "system:anonymous" && !out.groups.iter().any(|g| g == AUTHENTICATED) {
        out.groups.push(AUTHENTICATED.into());
    }
    Ok(out)
}

/// The `status.user` of a TokenReview or SelfSubjectReview.
pub fn user_json(user: &UserInfo) -> Value {
    let mut v = serde_json::json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        v["uid"] = user.uid.clone().into();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct Cluster(HashMap<(String, String, String), String>);

    impl Lookup for Cluster {
        fn uid(&self, plural: &str, namespace: &str, name: &str) -> Option<String> {
            self.0
                .get(&(plural.into(), namespace.into(), name.into()))
                .cloned()
        }
    }

    fn cluster() -> Cluster {
        Cluster(HashMap::from([
            (
                ("serviceaccounts".into(), "a".into(), "default".into()),
                "sa-1".into(),
            ),
            (("pods".into(), "a".into(), "p".into()), "pod-1".into()),
        ]))
    }

    fn token_for(pod: Option<(&str, &str)>, seconds: i64) -> TokenFor {
        TokenFor {
            namespace: "a".into(),
            service_account: ("default".into(), "sa-1".into()),
            pod: pod.map(|(n, u)| (n.into(), u.into())),
            audiences: vec![AUDIENCE.into()],
            seconds,
        }
    }

    #[test]
    fn a_minted_token_authenticates_its_service_account_while_it_and_its_pod_live() {
        let auth = Authenticator::new();
        let (token, _) = auth.mint(&token_for(Some(("p", "pod-1")), 3600));
        let user = auth.verify(&token, AUDIENCE, &cluster()).unwrap();
        assert_eq!(user.name, "system:serviceaccount:a:default");
        assert_eq!(user.uid, "sa-1");
        assert!(
            user.groups
                .contains(&"system:serviceaccounts:a".to_string())
        );

        // The pod was recreated (another uid) or the token names another: refused.
        let (stale, _) = auth.mint(&token_for(Some(("p", "pod-0")), 3600));
        assert_eq!(auth.verify(&stale, AUDIENCE, &cluster()), None);
        let (gone, _) = auth.mint(&token_for(Some(("q", "pod-1")), 3600));
        assert_eq!(auth.verify(&gone, AUDIENCE, &cluster()), None);
    }

    #[test]
    fn expired_foreign_and_other_audience_tokens_are_refused() {
        let auth = Authenticator::new();
        let (expired, _) = auth.mint(&token_for(None, -10));
        assert_eq!(auth.verify(&expired, AUDIENCE, &cluster()), None);
        let (elsewhere, _) = Authenticator::new().mint(&token_for(None, 3600));
        assert_eq!(auth.verify(&elsewhere, AUDIENCE, &cluster()), None);
        let mut other = token_for(None, 3600);
        other.audiences = vec!["vault".into()];
        let (other, _) = auth.mint(&other);
        assert_eq!(auth.verify(&other, AUDIENCE, &cluster()), None);
        assert_eq!(auth.verify("not-a-token", AUDIENCE, &cluster()), None);
        let admin_token = auth.admin_token().to_string();
        assert_eq!(
            auth.verify(&admin_token, AUDIENCE, &cluster()),
            Some(admin())
        );
    }

    #[test]
    fn static_tokens_come_from_the_token_file_as_it_is_now() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tokens.csv");
        std::fs::write(&file, "").unwrap();
        let mut auth = Authenticator::new();
        auth.set_token_file(file.clone());
        assert_eq!(auth.verify("t0k3n", AUDIENCE, &cluster()), None);
        let line = token_line("t0k3n", "alice", &["devs".into(), "qa".into()]);
        std::fs::write(&file, format!("# comment\nbad\n{line}")).unwrap();
        let alice = auth.verify("t0k3n", AUDIENCE, &cluster()).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.groups, ["devs", "qa", AUTHENTICATED]);
        assert_eq!(auth.verify("t0k3", AUDIENCE, &cluster()), None);
    }

    #[test]
    fn urls_read_as_kube_reads_them() {
        let a = request_attributes("GET", "/api/v1/namespaces/a/pods/x/log", false, None);
        assert_eq!(
            (
                a.verb.as_str(),
                a.namespace.as_str(),
                a.resource.as_str(),
                a.subresource.as_str(),
                a.name.as_str()
            ),
            ("get", "a", "pods", "log", "x")
        );
        let a = request_attributes(
            "GET",
            "/apis/cdi.kubevirt.io/v1beta1/namespaces/a/datavolumes",
            true,
            Some("metadata.name=dv"),
        );
        assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "dv"));
        assert_eq!(a.api_group, "cdi.kubevirt.io");
        let a = request_attributes("GET", "/api/v1/namespaces/a", false, None);
        assert_eq!(
            (a.resource.as_str(), a.namespace.as_str(), a.name.as_str()),
            ("namespaces", "a", "a")
        );
        let a = request_attributes("DELETE", "/api/v1/namespaces/a/pods", false, None);
        assert_eq!(a.verb, "deletecollection");
        let a = request_attributes("GET", "/apis/apps/v1", false, None);
        assert!(!a.resource_request);
        assert_eq!((a.verb.as_str(), a.path.as_str()), ("get", "/apis/apps/v1"));
    }

    #[test]
    fn impersonation_needs_the_impersonate_verb_for_user_groups_and_uid() {
        use axum::http::{HeaderMap, HeaderValue};
        let mut h = HeaderMap::new();
        h.insert("impersonate-user", HeaderValue::from_static("alice"));
        h.append("impersonate-group", HeaderValue::from_static("devs"));
        let bob = UserInfo {
            name: "bob".into(),
            uid: String::new(),
            groups: vec![AUTHENTICATED.into()],
        };
        let users_only = |_: &UserInfo, a: &Attributes| a.resource == "users";
        let err = impersonate(bob.clone(), &h, &users_only).unwrap_err();
        assert_eq!(err.code, 403);
        assert_eq!(
            err.message,
            "groups \"devs\" is forbidden: User \"bob\" cannot impersonate resource \"groups\" in API group \"\" at the cluster scope"
        );
        let all = |_: &UserInfo, a: &Attributes| a.verb == "impersonate";
        let alice = impersonate(bob.clone(), &h, &all).unwrap();
        assert_eq!(alice.name, "alice");
        assert_eq!(alice.groups, vec!["devs".to_string(), AUTHENTICATED.into()]);
        assert_eq!(
            impersonate(bob.clone(), &HeaderMap::new(), &users_only).unwrap(),
            bob
        );
    }
}
