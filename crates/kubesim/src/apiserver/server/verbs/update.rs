//! Changing an object: a PUT of it, a PATCH in any of the patch types (an apply creates what
//! does not exist), of the object or of its status.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::apiserver::errors::{ApiError, ApiResult};
use crate::apiserver::patch::{self, PatchKind};
use crate::apiserver::server::admit::{
    Write, admit, admit_create, expandable_classes, validate_update, webhooks,
};
use crate::apiserver::server::call::{Call, Named};
use crate::apiserver::server::controllers::after_write;
use crate::apiserver::server::plugins::protect;
use crate::apiserver::server::request::{body_bytes, matches_url, parse_object, read_object};
use crate::apiserver::server::response::{json_response, with_warnings};
use crate::apiserver::server::verbs::create::create;
use crate::apiserver::store::{Owner, WriteOptions};

/// A PUT of the object (`Write::Update`) or of its status (`Write::Status`).
pub(crate) async fn update(
    call: &Call,
    at: &Named,
    how: Write,
    req: Request,
) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let (def, store) = (&res.def, &call.store);
    let status = how == Write::Status;
    call.q.write_options("UpdateOptions")?;
    let mut obj = read_object(req).await?;
    matches_url(def, ns, &obj)?;
    let mut warnings = admit(def, &mut obj, &call.validation, how, Some(name.as_str()))?;
    let current = res.get(ns, name).ok();
    if !status && let Some(current) = &current {
        validate_update(def, &expandable_classes(store, def), current, &obj)?;
    }
    if let Some(current) = &current {
        warnings.extend(webhooks(call, def, ns, name, Some(current), &mut obj, how).await?);
    }
    let updated = res.update(ns, name, obj, &call.write(status))?;
    after_write(store, def, &updated);
    Ok(with_warnings(
        json_response(StatusCode::OK, &updated),
        &warnings,
    ))
}

/// A PATCH of the object (`Write::Update`) or of its status (`Write::Status`), in any of the
/// patch types; an apply creates what does not exist.
pub(crate) async fn patch(
    call: &Call,
    at: &Named,
    how: Write,
    req: Request,
) -> ApiResult<Response> {
    let Named { res, ns, name } = at;
    let (def, store) = (&res.def, &call.store);
    let status = how == Write::Status;
    let req_path = req.uri().path().to_string();
    let ct = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let kind = PatchKind::from_content_type(&ct)?;
    call.q.patch_options(kind == PatchKind::Apply)?;
    let body = body_bytes(req).await?;
    let mut warnings = Vec::new();
    // An apply claims the fields it sets and conflicts with other managers'.
    let apply_owner = if kind == PatchKind::Apply {
        let applied = serde_json::from_slice::<Value>(&body)
            .or_else(|_| serde_saphyr::from_slice::<Value>(&body).map_err(|e| e.to_string()))
            .ok();
        Some(Owner {
            manager: call.manager.clone().unwrap_or_default(),
            applied,
            force: call.force,
        })
    } else {
        call.writer.clone()
    };
    let write = WriteOptions {
        owner: apply_owner.as_ref(),
        ..call.write(status)
    };
    let expandable = expandable_classes(store, def);
    // With webhooks to call, the patched object is made from a read and sent to them; the
    // write then happens only if nothing changed the object meanwhile (else a conflict, which
    // clients retry).
    let reviewed = match res.get(ns, name) {
        Ok(current) if crate::apiserver::admission::any(store, def) => {
            let mut next = patch::apply(kind, &current, &body)?;
            warnings = admit(def, &mut next, &call.validation, how, Some(name.as_str()))?;
            if !status {
                validate_update(def, &expandable, &current, &next)?;
            }
            warnings.extend(webhooks(call, def, ns, name, Some(&current), &mut next, how).await?);
            Some((current["metadata"]["resourceVersion"].clone(), next))
        }
        _ => None,
    };
    let result = res.modify(ns, name, &write, |current| {
        if let Some((version, next)) = &reviewed {
            if current["metadata"]["resourceVersion"] != *version {
                return Err(ApiError::conflict(&def.group, &def.plural, name));
            }
            return Ok(next.clone());
        }
        let mut next = patch::apply(kind, current, &body)?;
        warnings = admit(def, &mut next, &call.validation, how, Some(name.as_str()))?;
        if !status {
            validate_update(def, &expandable, current, &next)?;
        }
        Ok(next)
    });
    let updated = match result {
        Err(e) if e.code == 404 && kind == PatchKind::Apply && !status => {
            // Server-side apply creates what does not exist, for whoever may create it.
            if !call.may_create {
                let mut a =
                    crate::apiserver::auth::request_attributes("PATCH", &req_path, false, None);
                a.verb = "create".into();
                return Err(ApiError::forbidden_request(&call.user, &a));
            }
            let mut obj = parse_object(&body)?;
            obj["metadata"]["name"] = json!(name);
            warnings = admit_create(call, def, ns, &mut obj, None).await?;
            if call.protect_storage {
                protect(def, &mut obj);
            }
            create(res, ns, obj, call.dry_run, apply_owner.as_ref())?
        }
        other => other?,
    };
    after_write(store, def, &updated);
    Ok(with_warnings(
        json_response(StatusCode::OK, &updated),
        &warnings,
    ))
}
