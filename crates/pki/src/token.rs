//! CDI's tokens, as upstream's `pkg/token` makes them: a signed JWT, issuer `cdi-apiserver`,
//! valid for five minutes, whose payload names one operation (`Upload`, `Clone`) on one object
//! (`namespace/name` of a resource) with optional parameters. The upload proxy accepts an upload
//! to a claim only with a token for exactly that claim and operation. Signed ES256 here (upstream
//! uses PS256 with an RSA key): the token is opaque to clients, only its issuer reads it.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// Who signs the tokens of UploadTokenRequests and of clone DataVolumes.
pub const API_ISSUER: &str = "cdi-apiserver";
/// How long they are valid.
pub const LIFETIME: Duration = Duration::from_secs(5 * 60);
/// Clock skew allowed when checking them.
pub const LEEWAY: Duration = Duration::from_secs(10);
/// Who signs the long-lived clone tokens the controller swaps a DataVolume's short one for
/// (upstream's "extended" tokens): bound to the DataVolume's, then the claim's, uid.
pub const EXTENDED_ISSUER: &str = "cdi-deployment";
/// How long they are valid (upstream: ten years; the uid binding is what limits them).
pub const EXTENDED_LIFETIME: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// What a token allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Operation {
    Upload,
    Clone,
}

/// The resource a token names, as Kubernetes' GroupVersionResource.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Resource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

impl Resource {
    /// PersistentVolumeClaims (core/v1): what an upload targets.
    pub fn claims() -> Resource {
        Resource {
            group: String::new(),
            version: "v1".into(),
            resource: "persistentvolumeclaims".into(),
        }
    }

    /// VolumeSnapshots (snapshot.storage.k8s.io/v1): what a snapshot clone reads.
    pub fn snapshots() -> Resource {
        Resource {
            group: "snapshot.storage.k8s.io".into(),
            version: "v1".into(),
            resource: "volumesnapshots".into(),
        }
    }
}

/// What a token is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    pub operation: Operation,
    pub name: String,
    pub namespace: String,
    pub resource: Resource,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub params: BTreeMap<String, String>,
}

impl Payload {
    /// An upload to claim `namespace/name`.
    pub fn upload(namespace: &str, name: &str) -> Payload {
        Payload {
            operation: Operation::Upload,
            name: name.into(),
            namespace: namespace.into(),
            resource: Resource::claims(),
            params: BTreeMap::new(),
        }
    }

    /// A clone of `source` (`resource` in namespace `source.0`) into `target` (namespace,
    /// name), as the DataVolume admission webhook grants it.
    pub fn for_clone(source: (&str, &str), resource: Resource, target: (&str, &str)) -> Payload {
        Payload {
            operation: Operation::Clone,
            name: source.1.into(),
            namespace: source.0.into(),
            resource,
            params: BTreeMap::from([
                ("targetNamespace".to_string(), target.0.to_string()),
                ("targetName".to_string(), target.1.to_string()),
            ]),
        }
    }

    /// The same grant bound to one object (a DataVolume's or a claim's uid).
    pub fn bound_to(mut self, uid: &str) -> Payload {
        self.params.insert("uid".into(), uid.into());
        self
    }
}

/// The JWT's claims: the payload and the registered ones.
#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    iss: String,
    iat: u64,
    nbf: u64,
    exp: u64,
    #[serde(flatten)]
    payload: Payload,
}

/// Why a token was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("the token is not a token of this cluster: {0}")]
    Invalid(String),
    #[error("the token expired")]
    Expired,
    #[error("the token is not valid yet")]
    NotYetValid,
    #[error("the token is for {got}, not for {want}")]
    WrongScope { got: String, want: String },
}

/// Signs tokens with a private key (ECDSA P-256, PKCS#8 PEM).
pub struct Signer {
    issuer: String,
    key: jsonwebtoken::EncodingKey,
}

/// Checks tokens with the matching public key (SPKI PEM).
pub struct Validator {
    issuer: String,
    key: jsonwebtoken::DecodingKey,
}

/// A fresh key pair: (private key PEM, public key PEM), as the controller keeps them in a
/// Secret.
pub fn generate_key() -> Result<(String, String), TokenError> {
    let key = rcgen::KeyPair::generate().map_err(|e| TokenError::Invalid(e.to_string()))?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

impl Signer {
    pub fn new(issuer: &str, private_pem: &str) -> Result<Signer, TokenError> {
        Ok(Signer {
            issuer: issuer.into(),
            key: jsonwebtoken::EncodingKey::from_ec_pem(private_pem.as_bytes())
                .map_err(|e| TokenError::Invalid(format!("the signing key: {e}")))?,
        })
    }

    /// A token for `payload`, valid for `lifetime` from now.
    pub fn sign(&self, payload: &Payload, lifetime: Duration) -> String {
        self.sign_at(payload, SystemTime::now(), lifetime)
    }

    /// A token for `payload` issued at `issued` (a token from the past, for tests of expiry),
    /// valid for `lifetime` from then.
    pub fn sign_at(&self, payload: &Payload, issued: SystemTime, lifetime: Duration) -> String {
        let at = issued
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let claims = Claims {
            iss: self.issuer.clone(),
            iat: at,
            nbf: at,
            exp: at + lifetime.as_secs(),
            payload: payload.clone(),
        };
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::ES256);
        jsonwebtoken::encode(&header, &claims, &self.key).expect("an ECDSA key signs any claims")
    }
}

impl Validator {
    pub fn new(issuer: &str, public_pem: &str) -> Result<Validator, TokenError> {
        Ok(Validator {
            issuer: issuer.into(),
            key: jsonwebtoken::DecodingKey::from_ec_pem(public_pem.as_bytes())
                .map_err(|e| TokenError::Invalid(format!("the verifying key: {e}")))?,
        })
    }

    /// The payload of a token this issuer signed that is valid now (within [`LEEWAY`]).
    pub fn validate(&self, token: &str) -> Result<Payload, TokenError> {
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::ES256);
        validation.set_issuer(&[&self.issuer]);
        validation.leeway = LEEWAY.as_secs();
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp", "nbf", "iss"]);
        match jsonwebtoken::decode::<Claims>(token, &self.key, &validation) {
            Ok(data) => Ok(data.claims.payload),
            Err(e) => Err(match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenError::Expired,
                jsonwebtoken::errors::ErrorKind::ImmatureSignature => TokenError::NotYetValid,
                _ => TokenError::Invalid(e.to_string()),
            }),
        }
    }

    /// The payload, if the token is valid and for exactly `want` (operation, object, resource).
    pub fn validate_for(&self, token: &str, want: &Payload) -> Result<Payload, TokenError> {
        let got = self.validate(token)?;
        let scope = |p: &Payload| {
            format!(
                "{:?} of {}/{} ({})",
                p.operation, p.namespace, p.name, p.resource.resource
            )
        };
        if got.operation != want.operation
            || got.namespace != want.namespace
            || got.name != want.name
            || got.resource != want.resource
        {
            return Err(TokenError::WrongScope {
                got: scope(&got),
                want: scope(want),
            });
        }
        Ok(got)
    }

    /// The payload, if the token is valid and grants exactly the clone `want`: its source and
    /// resource, and every parameter of `want` (target, and uid when `want` is bound).
    pub fn validate_clone(&self, token: &str, want: &Payload) -> Result<Payload, TokenError> {
        let got = self.validate_for(token, want)?;
        for (key, value) in &want.params {
            let found = got.params.get(key).map(String::as_str).unwrap_or("");
            if found != value {
                return Err(TokenError::WrongScope {
                    got: format!("{key} {found:?}"),
                    want: format!("{key} {value:?}"),
                });
            }
        }
        Ok(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (Signer, Validator) {
        let (private, public) = generate_key().unwrap();
        (
            Signer::new(API_ISSUER, &private).unwrap(),
            Validator::new(API_ISSUER, &public).unwrap(),
        )
    }

    #[test]
    fn a_token_is_good_for_its_claim_and_operation_only() {
        let (signer, validator) = pair();
        let token = signer.sign(&Payload::upload("a", "disk"), LIFETIME);
        assert_eq!(
            validator
                .validate_for(&token, &Payload::upload("a", "disk"))
                .unwrap(),
            Payload::upload("a", "disk")
        );
        assert!(matches!(
            validator.validate_for(&token, &Payload::upload("a", "other")),
            Err(TokenError::WrongScope { .. })
        ));
        assert!(matches!(
            validator.validate_for(&token, &Payload::upload("b", "disk")),
            Err(TokenError::WrongScope { .. })
        ));
        let mut clone = Payload::upload("a", "disk");
        clone.operation = Operation::Clone;
        assert!(matches!(
            validator.validate_for(&token, &clone),
            Err(TokenError::WrongScope { .. })
        ));
    }

    #[test]
    fn expired_forged_and_junk_tokens_are_refused() {
        let (signer, validator) = pair();
        // Ended long ago (beyond the leeway), and just now (within it).
        let ended = |ago: u64| {
            let issued = SystemTime::now() - Duration::from_secs(300 + ago);
            signer.sign_at(&Payload::upload("a", "disk"), issued, LIFETIME)
        };
        assert_eq!(validator.validate(&ended(60)), Err(TokenError::Expired));
        assert!(validator.validate(&ended(1)).is_ok(), "within the leeway");
        // Signed by another key.
        let (other, _) = pair();
        let forged = other.sign(&Payload::upload("a", "disk"), LIFETIME);
        assert!(matches!(
            validator.validate(&forged),
            Err(TokenError::Invalid(_))
        ));
        for junk in ["", "a.b.c", "not a token", "eyJ.eyJ.sig"] {
            assert!(matches!(
                validator.validate(junk),
                Err(TokenError::Invalid(_))
            ));
        }
    }

    #[test]
    fn a_clone_token_names_source_target_and_binding() {
        let (signer, validator) = pair();
        let grant = Payload::for_clone(("golden", "img"), Resource::claims(), ("vms", "disk"));
        let token = signer.sign(&grant, LIFETIME);
        assert!(validator.validate_clone(&token, &grant).is_ok());
        for other in [
            Payload::for_clone(("golden", "img"), Resource::claims(), ("vms", "other")),
            Payload::for_clone(("golden", "img"), Resource::claims(), ("other", "disk")),
            Payload::for_clone(("golden", "img2"), Resource::claims(), ("vms", "disk")),
            Payload::for_clone(("golden", "img"), Resource::snapshots(), ("vms", "disk")),
            grant.clone().bound_to("uid-1"),
        ] {
            assert!(
                matches!(
                    validator.validate_clone(&token, &other),
                    Err(TokenError::WrongScope { .. })
                ),
                "{other:?}"
            );
        }
        let bound = signer.sign(&grant.clone().bound_to("uid-1"), LIFETIME);
        assert!(
            validator
                .validate_clone(&bound, &grant.clone().bound_to("uid-1"))
                .is_ok()
        );
        assert!(
            validator
                .validate_clone(&bound, &grant.bound_to("uid-2"))
                .is_err()
        );
    }

    #[test]
    fn the_issuer_is_checked() {
        let (private, public) = generate_key().unwrap();
        let other_issuer = Signer::new("cdi-deployment", &private).unwrap();
        let validator = Validator::new(API_ISSUER, &public).unwrap();
        let token = other_issuer.sign(&Payload::upload("a", "disk"), LIFETIME);
        assert!(matches!(
            validator.validate(&token),
            Err(TokenError::Invalid(_))
        ));
    }
}
