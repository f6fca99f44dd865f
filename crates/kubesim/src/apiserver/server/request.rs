//! Reading a request: its query parameters (and the write options every write validates), its
//! body within [`MAX_BODY`], and the object in it, in the media types the server decodes.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::header;
use serde_json::Value;

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::http::{MAX_BODY, decode};
use crate::apiserver::registry::ResourceDef;

/// The query parameters: the first value of each (as kube decodes options), and every value.
#[derive(Debug, Clone, Default)]
pub(super) struct Query {
    pub(super) all: HashMap<String, Vec<String>>,
}

impl Query {
    pub(super) fn get(&self, name: &str) -> Option<&String> {
        self.all.get(name).and_then(|v| v.first())
    }

    /// A boolean option as kube-apiserver converts it (Convert_Slice_string_To_bool): absent,
    /// "0" and "false" in any case are false; anything else, "True" included, is true.
    pub(super) fn flag(&self, name: &str) -> bool {
        self.opt_flag(name).unwrap_or(false)
    }

    pub(super) fn opt_flag(&self, name: &str) -> Option<bool> {
        self.get(name)
            .map(|v| !(v == "0" || v.eq_ignore_ascii_case("false")))
    }

    /// An integer option; a malformed one is a 400 with Go's strconv message, as kube answers.
    pub(super) fn int(&self, name: &str) -> ApiResult<Option<i64>> {
        let Some(v) = self.get(name) else {
            return Ok(None);
        };
        let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
        if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ApiError::bad_request(format!(
                "strconv.ParseInt: parsing {}: invalid syntax",
                crate::apiserver::validation::go_quote(v)
            )));
        }
        v.parse::<i64>().map(Some).map_err(|_| {
            ApiError::bad_request(format!(
                "strconv.ParseInt: parsing {}: value out of range",
                crate::apiserver::validation::go_quote(v)
            ))
        })
    }

    /// `resourceVersion`, which the storage parses as an unsigned integer ("" and "0": any).
    pub(super) fn resource_version(&self) -> ApiResult<Option<u64>> {
        match self.get("resourceVersion").map(String::as_str) {
            None | Some("") | Some("0") => Ok(None),
            Some(rv) => rv.parse::<u64>().map(Some).map_err(|_| {
                let why = if rv.bytes().all(|b| b.is_ascii_digit()) {
                    "value out of range"
                } else {
                    "invalid syntax"
                };
                let q = crate::apiserver::validation::go_quote(rv);
                ApiError::bad_request(format!(
                    "invalid resource version: resourceVersion: Invalid value: {q}: strconv.ParseUint: parsing {q}: {why}"
                ))
            }),
        }
    }

    /// The write options every create, update, patch and delete validates
    /// (ValidateCreateOptions and friends): `dryRun` may only be `All`, `fieldValidation` one
    /// of the known directives, `fieldManager` short and printable.
    pub(super) fn write_options(&self, options_kind: &str) -> ApiResult<()> {
        self.options_checked(options_kind, false)
    }

    /// The options of a PATCH: an apply must name its field manager.
    pub(super) fn patch_options(&self, apply: bool) -> ApiResult<()> {
        self.options_checked("PatchOptions", apply)
    }

    pub(super) fn options_checked(&self, options_kind: &str, apply: bool) -> ApiResult<()> {
        use crate::apiserver::validation::{BadValue, FieldError, go_quote};
        let mut errs = Vec::new();
        if apply && self.get("fieldManager").is_none_or(|m| m.is_empty()) {
            errs.push((
                "fieldManager".to_string(),
                "Required value: is required for apply patch".to_string(),
            ));
        }
        if let Some(manager) = self.get("fieldManager") {
            if manager.len() > 128 {
                errs.push((
                    "fieldManager".to_string(),
                    "Too long: may not be longer than 128".to_string(),
                ));
            }
            if manager.chars().any(|c| c.is_control()) {
                errs.push(
                    FieldError::invalid(
                        "fieldManager",
                        manager,
                        "must only contain printable characters",
                    )
                    .cause(),
                );
            }
        }
        let dry_run = self.all.get("dryRun").cloned().unwrap_or_default();
        if dry_run.iter().any(|d| d != "All") {
            let list: Vec<String> = dry_run.iter().map(|d| go_quote(d)).collect();
            errs.push(
                FieldError::not_supported(
                    "dryRun",
                    BadValue::Raw(format!("[]string{{{}}}", list.join(", "))),
                    &["All"],
                )
                .cause(),
            );
        }
        if let Some(v) = self.get("fieldValidation")
            && !["", "Ignore", "Strict", "Warn"].contains(&v.as_str())
        {
            errs.push(
                FieldError::not_supported(
                    "fieldValidation",
                    BadValue::Str(v.clone()),
                    &["", "Ignore", "Strict", "Warn"],
                )
                .cause(),
            );
        }
        if errs.is_empty() {
            Ok(())
        } else {
            Err(ApiError::invalid(
                &format!("{options_kind}.meta.k8s.io"),
                "",
                errs,
            ))
        }
    }
}

/// The query parameters of `req`, percent-decoded.
pub(super) fn query(req: &Request) -> Query {
    let mut q = Query::default();
    for p in req
        .uri()
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
    {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        q.all.entry(decode(k)).or_default().push(decode(v));
    }
    q
}

/// The request body, refused with 413 beyond [`MAX_BODY`] as kube-apiserver does.
pub(super) async fn body_bytes(req: Request) -> ApiResult<Bytes> {
    use futures::StreamExt;
    let mut stream = req.into_body().into_data_stream();
    let mut out = Vec::new();
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("reading the body: {e}")))?;
        seen += chunk.len();
        if seen > MAX_BODY {
            // The rest is read and dropped (within reason), so that the client gets the answer
            // rather than a reset connection while it is still sending.
            out = Vec::new();
            if seen > 64 * MAX_BODY {
                break;
            }
            continue;
        }
        out.extend_from_slice(&chunk);
    }
    if seen > MAX_BODY {
        return Err(ApiError::too_large(MAX_BODY));
    }
    Ok(Bytes::from(out))
}

/// A create's or update's body, in a media type the server decodes: JSON, YAML, and protobuf for
/// the kinds kubectl's generators send. Other media types get kube's 415 (client-go does not
/// fall back to JSON on it).
pub(super) async fn read_object(req: Request) -> ApiResult<Value> {
    let media = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if media == "application/vnd.kubernetes.protobuf" {
        return crate::apiserver::protobuf::decode(&body_bytes(req).await?);
    }
    if !matches!(media.as_str(), "" | "application/json" | "application/yaml") {
        return Err(ApiError::unsupported_media_type(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml",
        ));
    }
    parse_object(&body_bytes(req).await?)
}

/// What kube-apiserver refuses before looking further: a body of another kind or API version
/// than the URL's resource (a Secret POSTed to `configmaps`), or naming another namespace than
/// the URL. A body may leave all three out; the URL supplies them.
pub(super) fn matches_url(def: &ResourceDef, ns: &str, obj: &Value) -> ApiResult<()> {
    let api_version = obj["apiVersion"].as_str().unwrap_or("");
    let kind = obj["kind"].as_str().unwrap_or("");
    if !kind.is_empty() && kind != def.kind {
        // The versioning decoder's wording, then why it cannot.
        let version = api_version.rsplit('/').next().unwrap_or("");
        return Err(ApiError::bad_request(format!(
            "{kind} in version \"{version}\" cannot be handled as a {}: the body is a {kind}, and {} holds {} objects",
            def.kind, def.plural, def.kind
        )));
    }
    if !api_version.is_empty() && api_version != def.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            def.api_version()
        )));
    }
    let named = obj["metadata"]["namespace"].as_str().unwrap_or("");
    if def.namespaced && !named.is_empty() && named != ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    Ok(())
}

/// A body as an object, JSON or YAML.
pub(super) fn parse_object(bytes: &[u8]) -> ApiResult<Value> {
    let v: Value = serde_json::from_slice(bytes)
        .or_else(|_| serde_saphyr::from_slice::<Value>(bytes).map_err(|e| e.to_string()))
        .map_err(|e| ApiError::bad_request(format!("the body is not a valid object: {e}")))?;
    if !v.is_object() {
        return Err(ApiError::bad_request("the body must be an object"));
    }
    Ok(v)
}
