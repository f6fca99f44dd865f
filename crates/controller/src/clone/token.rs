//! Clone tokens, the controller's side of cross-namespace authorization (docs/cloning.md#cross-namespace-authorization, upstream's
//! `ensureExtendedToken*` and `MultiTokenValidator`): the DataVolume admission webhook gives a
//! cross-namespace clone a short token once its creator may read the source's namespace; the
//! DataVolume controller swaps it for a long one bound to the DataVolume's uid, then gives the
//! claim one bound to the claim's uid. Whatever reads a source (the upload and clone-source
//! controllers, the clone populator) first checks the claim's token. A clone within one
//! namespace needs none.

use cdi_api::datavolume::DataVolume;
use cdi_api::keys::ann;
use cdi_core::source::Refusal;
use cdi_pki::token::{EXTENDED_LIFETIME, Payload, Resource};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use kube::{Api, ResourceExt};

use crate::pki::tokens::CloneTokens;
use crate::runtime::context::Context;
use crate::runtime::error::Error;

/// The event reason of a clone refused for want of authorization.
pub const NOT_AUTHORIZED: &str = cdi_core::hostclone::NOT_AUTHORIZED;

/// The keys, read once from the signing key Secret (made with the upload path's PKI).
pub async fn tokens(ctx: &Context) -> Result<&CloneTokens, Error> {
    ctx.clone_tokens
        .get_or_try_init(|| async {
            ctx.upload_pki
                .get(&ctx.client, &ctx.options.namespace)
                .await?;
            let secret = Api::<Secret>::namespaced(ctx.client.clone(), &ctx.options.namespace)
                .get(crate::pki::names::SIGNING_KEY)
                .await?;
            let text = |key: &str| {
                secret
                    .data
                    .as_ref()
                    .and_then(|d| d.get(key))
                    .and_then(|b| String::from_utf8(b.0.clone()).ok())
                    .ok_or_else(|| {
                        Error::Other(format!(
                            "Secret {} has no {key}",
                            crate::pki::names::SIGNING_KEY
                        ))
                    })
            };
            CloneTokens::new(
                &text(crate::pki::names::SIGNING_KEY_PRIVATE)?,
                &text(crate::pki::names::SIGNING_KEY_PUBLIC)?,
            )
        })
        .await
}

/// What a DataVolume's clone may do.
#[derive(Debug, PartialEq)]
pub enum DvGrant {
    /// Not a clone from another namespace: nothing to check.
    NotNeeded,
    /// Authorized; `extend` is the long token to put on the DataVolume when it holds only the
    /// short one.
    Granted {
        extend: Option<String>,
    },
    Refused(Refusal),
}

/// What a clone's claim may do.
#[derive(Debug, PartialEq)]
pub enum ClaimGrant {
    Allowed,
    /// A DataVolume's claim whose token the DataVolume controller has not given yet.
    Wait,
    Refused(String),
}

fn grant(source: &(String, String), resource: Resource, target: (&str, &str)) -> Payload {
    Payload::for_clone((&source.0, &source.1), resource, target)
}

/// Check the token of `dv` (the DataVolume as decided: a `sourceRef` resolved) cloning
/// `source`; `uid` is the DataVolume's.
pub fn check_dv(
    tokens: &CloneTokens,
    dv: &DataVolume,
    source: &(String, String),
    resource: Resource,
) -> DvGrant {
    let ns = dv.metadata.namespace.as_deref().unwrap_or("");
    let name = dv.metadata.name.as_deref().unwrap_or("");
    if source.0 == ns {
        return DvGrant::NotNeeded;
    }
    let uid = dv.metadata.uid.as_deref().unwrap_or("");
    let want = grant(source, resource, (ns, name));
    let anns = dv.annotations();
    if let Some(long) = anns.get(ann::EXTENDED_CLONE_TOKEN)
        && tokens
            .long
            .validate_clone(long, &want.clone().bound_to(uid))
            .is_ok()
    {
        return DvGrant::Granted { extend: None };
    }
    let why = match anns.get(ann::CLONE_TOKEN) {
        None => "it has no clone token".to_string(),
        Some(short) => match tokens.short.validate_clone(short, &want) {
            Ok(_) => {
                let long = tokens.signer.sign(&want.bound_to(uid), EXTENDED_LIFETIME);
                return DvGrant::Granted { extend: Some(long) };
            }
            Err(e) => format!("its clone token is refused ({e})"),
        },
    };
    DvGrant::Refused(Refusal {
        reason: NOT_AUTHORIZED,
        message: format!(
            "DataVolume {ns}/{name} clones {}/{} from another namespace, and {why}: nothing was \
             read. The token ({}) is given at creation by CDI's DataVolume admission webhook to a \
             creator allowed to create datavolumes/source in namespace {}, and lasts five \
             minutes until the controller takes it; create the DataVolume again where the \
             webhook runs (cdi dev up --cdi, or an installed CDI)",
            source.0,
            source.1,
            ann::CLONE_TOKEN,
            source.0
        ),
    })
}

/// The long token for the claim of a granted DataVolume (named like it), when the claim lacks
/// a valid one.
pub fn claim_token(
    tokens: &CloneTokens,
    claim: &PersistentVolumeClaim,
    source: &(String, String),
    resource: Resource,
) -> Option<String> {
    let ns = claim.metadata.namespace.as_deref().unwrap_or("");
    let name = claim.metadata.name.as_deref().unwrap_or("");
    let want =
        grant(source, resource, (ns, name)).bound_to(claim.metadata.uid.as_deref().unwrap_or(""));
    let valid = claim
        .annotations()
        .get(ann::EXTENDED_CLONE_TOKEN)
        .is_some_and(|t| tokens.long.validate_clone(t, &want).is_ok());
    (!valid).then(|| tokens.signer.sign(&want, EXTENDED_LIFETIME))
}

/// Whether `claim` may copy `source` (`resource`): within its namespace always; from another
/// only with a long token bound to it.
pub fn check_claim(
    tokens: &CloneTokens,
    claim: &PersistentVolumeClaim,
    source: &(String, String),
    resource: Resource,
) -> ClaimGrant {
    let ns = claim.metadata.namespace.as_deref().unwrap_or("");
    let name = claim.metadata.name.as_deref().unwrap_or("");
    if source.0 == ns {
        return ClaimGrant::Allowed;
    }
    let want =
        grant(source, resource, (ns, name)).bound_to(claim.metadata.uid.as_deref().unwrap_or(""));
    let why = match claim.annotations().get(ann::EXTENDED_CLONE_TOKEN) {
        Some(t) => match tokens.long.validate_clone(t, &want) {
            Ok(_) => return ClaimGrant::Allowed,
            Err(e) => format!("its clone token is refused ({e})"),
        },
        None => {
            let of_dv = claim
                .owner_references()
                .iter()
                .any(|o| o.kind == "DataVolume" && o.controller == Some(true));
            if of_dv {
                return ClaimGrant::Wait;
            }
            "it has no clone token".to_string()
        }
    };
    ClaimGrant::Refused(format!(
        "claim {ns}/{name} copies {}/{} from another namespace, and {why}: nothing was read. \
         Clone across namespaces with a DataVolume, created by someone allowed to create \
         datavolumes/source in namespace {}",
        source.0, source.1, source.0
    ))
}

/// What a clone's token must grant for a copy of claim `source`: that claim, or for a claim a
/// snapshot was restored into for the copy, the snapshot.
pub fn grant_of(ctx: &Context, source: &(String, String)) -> ((String, String), Resource) {
    let restored = ctx
        .caches
        .claim(&source.0, &source.1)
        .and_then(|c| cdi_core::hostclone::restored_for_copy(&c));
    match restored {
        Some(snapshot) => ((source.0.clone(), snapshot), Resource::snapshots()),
        None => (source.clone(), Resource::claims()),
    }
}

/// [`check_claim`] with the controller's keys; an event says a refusal.
pub async fn claim_allowed(
    ctx: &Context,
    claim: &PersistentVolumeClaim,
    source: &(String, String),
    resource: Resource,
) -> Result<bool, Error> {
    if source.0 == claim.namespace().unwrap_or_default() {
        return Ok(true);
    }
    match check_claim(tokens(ctx).await?, claim, source, resource) {
        ClaimGrant::Allowed => Ok(true),
        ClaimGrant::Wait => Ok(false),
        ClaimGrant::Refused(message) => {
            ctx.events
                .record(claim, true, NOT_AUTHORIZED, &message)
                .await;
            Ok(false)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdi_pki::token::{API_ISSUER, Signer};
    use std::time::{Duration, SystemTime};

    fn keys() -> (CloneTokens, Signer) {
        let (private, public) = cdi_pki::token::generate_key().unwrap();
        (
            CloneTokens::new(&private, &public).unwrap(),
            Signer::new(API_ISSUER, &private).unwrap(),
        )
    }

    fn dv(anns: &[(&str, &str)]) -> DataVolume {
        let mut dv: DataVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "disk", "namespace": "vms", "uid": "dv-uid"},
            "spec": {"source": {"pvc": {"namespace": "golden", "name": "img"}}}}))
        .unwrap();
        dv.metadata.annotations = Some(
            anns.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        dv
    }

    fn claim(anns: &[(&str, &str)], of_dv: bool) -> PersistentVolumeClaim {
        let mut owners = serde_json::json!([]);
        if of_dv {
            owners = serde_json::json!([{"apiVersion": "cdi.kubevirt.io/v1beta1",
                "kind": "DataVolume", "name": "disk", "uid": "dv-uid", "controller": true}]);
        }
        let mut c: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "disk", "namespace": "vms", "uid": "claim-uid",
                "ownerReferences": owners}}))
        .unwrap();
        c.metadata.annotations = Some(
            anns.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        c
    }

    fn source() -> (String, String) {
        ("golden".into(), "img".into())
    }

    fn short(signer: &Signer) -> String {
        signer.sign(
            &Payload::for_clone(("golden", "img"), Resource::claims(), ("vms", "disk")),
            cdi_pki::token::LIFETIME,
        )
    }

    #[test]
    fn a_short_token_is_swapped_for_a_long_one_bound_to_the_datavolume() {
        let (tokens, apiserver) = keys();
        let token = short(&apiserver);
        let DvGrant::Granted { extend: Some(long) } = check_dv(
            &tokens,
            &dv(&[(ann::CLONE_TOKEN, &token)]),
            &source(),
            Resource::claims(),
        ) else {
            panic!("a valid short token is granted");
        };
        // The long one alone is enough (the short one has expired by then).
        assert_eq!(
            check_dv(
                &tokens,
                &dv(&[(ann::EXTENDED_CLONE_TOKEN, &long)]),
                &source(),
                Resource::claims()
            ),
            DvGrant::Granted { extend: None }
        );
        // Another DataVolume of the same name (another uid) cannot use it.
        let mut other = dv(&[(ann::EXTENDED_CLONE_TOKEN, &long)]);
        other.metadata.uid = Some("other-uid".into());
        assert!(matches!(
            check_dv(&tokens, &other, &source(), Resource::claims()),
            DvGrant::Refused(_)
        ));
    }

    #[test]
    fn missing_expired_and_foreign_tokens_are_refused_with_the_fix() {
        let (tokens, apiserver) = keys();
        let DvGrant::Refused(r) = check_dv(&tokens, &dv(&[]), &source(), Resource::claims()) else {
            panic!("no token, no clone");
        };
        assert!(r.message.contains("vms/disk") && r.message.contains("datavolumes/source"));
        let old = apiserver.sign_at(
            &Payload::for_clone(("golden", "img"), Resource::claims(), ("vms", "disk")),
            SystemTime::now() - Duration::from_secs(3600),
            cdi_pki::token::LIFETIME,
        );
        assert!(matches!(
            check_dv(&tokens, &dv(&[(ann::CLONE_TOKEN, &old)]), &source(), Resource::claims()),
            DvGrant::Refused(r) if r.message.contains("expired")
        ));
        // A token of another source, and one signed by another cluster's key.
        let (_, stranger) = keys();
        for token in [
            apiserver.sign(
                &Payload::for_clone(("golden", "other"), Resource::claims(), ("vms", "disk")),
                cdi_pki::token::LIFETIME,
            ),
            short(&stranger),
        ] {
            assert!(matches!(
                check_dv(
                    &tokens,
                    &dv(&[(ann::CLONE_TOKEN, &token)]),
                    &source(),
                    Resource::claims()
                ),
                DvGrant::Refused(_)
            ));
        }
        // Within the namespace nothing is asked.
        assert_eq!(
            check_dv(
                &tokens,
                &dv(&[]),
                &("vms".into(), "img".into()),
                Resource::claims()
            ),
            DvGrant::NotNeeded
        );
    }

    #[test]
    fn a_claim_copies_from_another_namespace_only_with_its_own_token() {
        let (tokens, apiserver) = keys();
        let c = claim(&[], true);
        assert_eq!(
            check_claim(&tokens, &c, &source(), Resource::claims()),
            ClaimGrant::Wait,
            "a DataVolume's claim waits for its token"
        );
        let token = claim_token(&tokens, &c, &source(), Resource::claims()).unwrap();
        let given = claim(&[(ann::EXTENDED_CLONE_TOKEN, &token)], true);
        assert_eq!(
            check_claim(&tokens, &given, &source(), Resource::claims()),
            ClaimGrant::Allowed
        );
        assert_eq!(
            claim_token(&tokens, &given, &source(), Resource::claims()),
            None
        );
        // A claim made by hand, with no token or with a DataVolume's short one.
        assert!(matches!(
            check_claim(&tokens, &claim(&[], false), &source(), Resource::claims()),
            ClaimGrant::Refused(m) if m.contains("vms/disk")
        ));
        let copied = claim(&[(ann::EXTENDED_CLONE_TOKEN, &short(&apiserver))], false);
        assert!(matches!(
            check_claim(&tokens, &copied, &source(), Resource::claims()),
            ClaimGrant::Refused(_)
        ));
        // The DataVolume's long token on another claim.
        let DvGrant::Granted { extend: Some(long) } = check_dv(
            &tokens,
            &dv(&[(ann::CLONE_TOKEN, &short(&apiserver))]),
            &source(),
            Resource::claims(),
        ) else {
            panic!()
        };
        assert!(matches!(
            check_claim(
                &tokens,
                &claim(&[(ann::EXTENDED_CLONE_TOKEN, &long)], false),
                &source(),
                Resource::claims()
            ),
            ClaimGrant::Refused(_)
        ));
    }
}
