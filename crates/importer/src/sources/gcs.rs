//! GCS sources: an object of Google Cloud Storage (or of a server speaking its XML API), read
//! over HTTP like any other object: streamed, read at random by range requests (qcow2 converts
//! without scratch) and resumed after a broken transfer, as [`HttpSource`] does.
//!
//! With a service-account key (the DataVolume's Secret, mounted where upstream mounts it and
//! named by `GOOGLE_APPLICATION_CREDENTIALS`) every request carries an OAuth access token that
//! the key buys from its `token_uri` with a signed JWT (RFC 7523), renewed before it expires.
//! Without a key the requests are anonymous, which public objects allow, as upstream's.
//!
//! The URL forms (upstream's):
//! - `gs://bucket/object`: Google's endpoint, `https://storage.googleapis.com/bucket/object`.
//! - `http(s)://host[:port]/bucket/object`: the object on that endpoint, path-style.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::future::BoxFuture;
use reqwest::Url;
use serde::{Deserialize, Serialize};

use crate::error::ImportError;
use crate::sources::http::HttpSource;
use crate::sources::http::{Signer, redact, trusting};

/// Google's endpoint for `gs://` URLs.
const ENDPOINT: &str = "https://storage.googleapis.com";
/// Google's token endpoint, for keys that name none.
const TOKEN_URI: &str = "https://oauth2.googleapis.com/token";
/// Reading objects is all the importer does.
pub const READ_SCOPE: &str = "https://www.googleapis.com/auth/devstorage.read_only";
/// RFC 7523's grant type, already form-encoded.
const JWT_BEARER: &str = "urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer";
/// How long before it expires a token is renewed, so a request never carries a stale one.
const RENEW_EARLY: Duration = Duration::from_secs(300);

fn refused(url: &str, why: &str) -> ImportError {
    ImportError::Config(format!(
        "Unable to connect to gcs data source: {why} in {}; write it as gs://bucket/object or http(s)://host/bucket/object",
        redact(url)
    ))
}

/// The URL an object is read from (the XML API's path-style form).
pub fn object_url(url: &str) -> Result<String, ImportError> {
    let parsed =
        Url::parse(url).map_err(|e| refused(url, &format!("the URL is not valid ({e})")))?;
    let (base, path) = match parsed.scheme() {
        "gs" => {
            let bucket = parsed
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| refused(url, "no bucket"))?;
            (ENDPOINT.to_string(), format!("/{bucket}{}", parsed.path()))
        }
        "http" | "https" => {
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(refused(url, "no host"));
            }
            let mut base = parsed.clone();
            base.set_path("");
            base.set_query(None);
            base.set_fragment(None);
            (
                base.as_str().trim_end_matches('/').to_string(),
                parsed.path().to_string(),
            )
        }
        other => return Err(refused(url, &format!("the scheme {other:?} is not GCS's"))),
    };
    let (bucket, object) = path
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((path.trim_start_matches('/'), ""));
    if bucket.is_empty() {
        return Err(refused(url, "no bucket"));
    }
    if object.is_empty() || object.ends_with('/') {
        return Err(refused(url, "no object name"));
    }
    Ok(format!("{base}/{bucket}/{object}"))
}

/// The fields of a key file the importer uses (Google's `service_account` JSON key).
#[derive(Deserialize)]
struct KeyFile {
    #[serde(rename = "type")]
    kind: Option<String>,
    client_email: Option<String>,
    private_key: Option<String>,
    private_key_id: Option<String>,
    token_uri: Option<String>,
}

/// A service account, as its key file describes it.
pub struct ServiceAccount {
    pub email: String,
    key: jsonwebtoken::EncodingKey,
    key_id: Option<String>,
    pub token_uri: String,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("email", &self.email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

fn bad_key(origin: &str, why: &str) -> ImportError {
    ImportError::Config(format!(
        "Unable to connect to gcs data source: the key in {origin} {why}; the DataVolume's \
         secretRef must name a Secret whose credentials.json is a service account's JSON key"
    ))
}

impl ServiceAccount {
    /// Read a JSON key; `origin` names where it came from, for messages (the key is never
    /// quoted).
    pub fn from_json(json: &[u8], origin: &str) -> Result<ServiceAccount, ImportError> {
        let file: KeyFile = serde_json::from_slice(json)
            .map_err(|e| bad_key(origin, &format!("is not a JSON key ({e})")))?;
        match file.kind.as_deref() {
            Some("service_account") => {}
            Some(other) => {
                return Err(bad_key(
                    origin,
                    &format!("is of type {other:?}, not service_account"),
                ));
            }
            None => return Err(bad_key(origin, "has no type")),
        }
        let email = file
            .client_email
            .filter(|e| !e.is_empty())
            .ok_or_else(|| bad_key(origin, "has no client_email"))?;
        let pem = file
            .private_key
            .ok_or_else(|| bad_key(origin, "has no private_key"))?;
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(pem.as_bytes())
            .map_err(|e| bad_key(origin, &format!("has a private_key that is not RSA ({e})")))?;
        let token_uri = file
            .token_uri
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| TOKEN_URI.to_string());
        Url::parse(&token_uri)
            .map_err(|e| bad_key(origin, &format!("has a token_uri that is not a URL ({e})")))?;
        Ok(ServiceAccount {
            email,
            key,
            key_id: file.private_key_id.filter(|k| !k.is_empty()),
            token_uri,
        })
    }

    /// The signed JWT that asks `token_uri` for a read-only token, issued at `now` (seconds
    /// since the epoch) and valid for an hour, as Google's clients ask.
    pub fn assertion(&self, now: u64) -> Result<String, ImportError> {
        #[derive(Serialize)]
        struct Claims<'a> {
            iss: &'a str,
            scope: &'a str,
            aud: &'a str,
            iat: u64,
            exp: u64,
        }
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = self.key_id.clone();
        let claims = Claims {
            iss: &self.email,
            scope: READ_SCOPE,
            aud: &self.token_uri,
            iat: now,
            exp: now + 3600,
        };
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| ImportError::Internal(format!("signing the token request: {e}")))
    }
}

/// A token and when to renew it.
struct Token {
    value: String,
    renew_at: Instant,
}

/// Signs requests with the service account's current access token.
struct Bearer {
    account: ServiceAccount,
    client: reqwest::Client,
    token: Mutex<Option<Token>>,
    /// One token request at a time; the others wait for its token.
    fetching: tokio::sync::Mutex<()>,
}

impl Bearer {
    fn current(&self) -> Option<String> {
        let token = self.token.lock().unwrap_or_else(|e| e.into_inner());
        token
            .as_ref()
            .filter(|t| Instant::now() < t.renew_at)
            .map(|t| t.value.clone())
    }

    async fn fetch(&self) -> Result<Token, ImportError> {
        #[derive(Deserialize)]
        struct Granted {
            access_token: String,
            expires_in: Option<u64>,
        }
        #[derive(Deserialize)]
        struct Refusal {
            error: Option<String>,
            error_description: Option<String>,
        }
        let uri = &self.account.token_uri;
        let failed = |status: Option<u16>, why: String| ImportError::Http {
            url: redact(uri),
            status,
            message: format!(
                "Unable to connect to gcs data source: getting an access token for {}: {why}",
                self.account.email
            ),
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let body = format!(
            "grant_type={JWT_BEARER}&assertion={}",
            self.account.assertion(now)?
        );
        let asked = Instant::now();
        let resp = self
            .client
            .post(uri)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(body)
            .send()
            .await
            .map_err(|e| failed(None, e.without_url().to_string()))?;
        let status = resp.status();
        let text = resp
            .text()
            .await
            .map_err(|e| failed(Some(status.as_u16()), e.without_url().to_string()))?;
        if !status.is_success() {
            let why = match serde_json::from_str::<Refusal>(&text) {
                Ok(Refusal {
                    error: Some(error),
                    error_description,
                }) => match error_description {
                    Some(d) => format!("{error}: {d}"),
                    None => error,
                },
                _ => text.chars().take(200).collect(),
            };
            return Err(failed(
                Some(status.as_u16()),
                format!(
                    "the token endpoint refused the service account's key (HTTP {}: {why}); \
                     check the key in the DataVolume's secretRef",
                    status.as_u16()
                ),
            ));
        }
        let granted: Granted = serde_json::from_str(&text).map_err(|e| {
            failed(
                Some(status.as_u16()),
                format!("the token endpoint's answer is not a token ({e})"),
            )
        })?;
        let lifetime = Duration::from_secs(granted.expires_in.unwrap_or(3600));
        // Renewed early, or at half its life for a short-lived one.
        let renew_in = lifetime
            .checked_sub(RENEW_EARLY)
            .filter(|d| *d >= lifetime / 2)
            .unwrap_or(lifetime / 2);
        Ok(Token {
            value: granted.access_token,
            renew_at: asked + renew_in,
        })
    }
}

impl Signer for Bearer {
    fn headers(&self, _method: &str, _url: &str) -> Result<Vec<(String, String)>, ImportError> {
        let token = self.token.lock().unwrap_or_else(|e| e.into_inner());
        match token.as_ref() {
            Some(t) => Ok(vec![(
                "authorization".to_string(),
                format!("Bearer {}", t.value),
            )]),
            None => Err(ImportError::Internal(
                "no access token was obtained before the request".into(),
            )),
        }
    }

    fn ready(&self) -> BoxFuture<'_, Result<(), ImportError>> {
        Box::pin(async move {
            if self.current().is_some() {
                return Ok(());
            }
            let _one = self.fetching.lock().await;
            if self.current().is_some() {
                return Ok(());
            }
            let token = self.fetch().await?;
            *self.token.lock().unwrap_or_else(|e| e.into_inner()) = Some(token);
            Ok(())
        })
    }
}

/// The HTTP source of a GCS object: anonymous without `account`, else signed with its tokens.
/// The CAs (the DataVolume's certConfigMap) are trusted by the object's and the token's
/// endpoint alike.
pub fn source(
    url: &str,
    account: Option<ServiceAccount>,
    ca_certs_pem: Vec<Vec<u8>>,
) -> Result<HttpSource, ImportError> {
    let object = object_url(url)?;
    let signer = match account {
        Some(account) => {
            let client = trusting(
                reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(30))
                    .timeout(Duration::from_secs(60)),
                &ca_certs_pem,
                false,
            )?
            .build()
            .map_err(|e| ImportError::Internal(format!("building the HTTP client: {e}")))?;
            let bearer: Arc<dyn Signer> = Arc::new(Bearer {
                account,
                client,
                token: Mutex::new(None),
                fetching: tokio::sync::Mutex::new(()),
            });
            Some(bearer)
        }
        None => None,
    };
    Ok(HttpSource {
        url: object,
        ca_certs_pem,
        signer,
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_an_endpoint_a_bucket_and_an_object() {
        for (url, want) in [
            (
                "gs://images/fedora/disk.qcow2",
                "https://storage.googleapis.com/images/fedora/disk.qcow2",
            ),
            (
                "https://storage.googleapis.com/images/disk.img",
                "https://storage.googleapis.com/images/disk.img",
            ),
            (
                "http://127.0.0.1:9023/images/a%20b.img",
                "http://127.0.0.1:9023/images/a%20b.img",
            ),
            (
                "gs://images/a b.img",
                "https://storage.googleapis.com/images/a%20b.img",
            ),
        ] {
            assert_eq!(object_url(url).unwrap(), want, "{url}");
        }
        for (url, why) in [
            ("gs://images", "no object name"),
            ("gs://images/dir/", "no object name"),
            ("https://storage.googleapis.com/images", "no object name"),
            ("https://storage.googleapis.com/", "no bucket"),
            ("s3://images/disk.img", "not GCS's"),
            ("not a url", "not valid"),
        ] {
            let err = object_url(url).unwrap_err().to_string();
            assert!(err.contains(why), "{url}: {err}");
            assert!(err.contains("gs://bucket/object"), "{err}");
        }
    }

    #[test]
    fn token_requests_are_jwts_signed_with_the_accounts_key() {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
        let json = serde_json::json!({
            "type": "service_account",
            "client_email": "importer@project.iam.gserviceaccount.com",
            "private_key_id": "k1",
            "private_key": pair.serialize_pem(),
            "token_uri": "http://127.0.0.1:1/token",
        });
        let account =
            ServiceAccount::from_json(json.to_string().as_bytes(), "credentials.json").unwrap();
        let jwt = account.assertion(1_700_000_000).unwrap();
        let key =
            jsonwebtoken::DecodingKey::from_rsa_pem(pair.public_key_pem().as_bytes()).unwrap();
        let mut validation = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        validation.validate_exp = false;
        validation.set_audience(&["http://127.0.0.1:1/token"]);
        let token = jsonwebtoken::decode::<serde_json::Value>(&jwt, &key, &validation).unwrap();
        assert_eq!(token.header.kid.as_deref(), Some("k1"));
        assert_eq!(
            token.claims["iss"],
            "importer@project.iam.gserviceaccount.com"
        );
        assert_eq!(token.claims["scope"], READ_SCOPE);
        assert_eq!(token.claims["exp"], 1_700_003_600);
        // Without a token_uri, Google's.
        let mut json = json;
        json.as_object_mut().unwrap().remove("token_uri");
        let account =
            ServiceAccount::from_json(json.to_string().as_bytes(), "credentials.json").unwrap();
        assert_eq!(account.token_uri, TOKEN_URI);
        assert!(!format!("{account:?}").contains("PRIVATE"));
    }

    #[test]
    fn keys_that_are_not_a_service_accounts_are_refused_without_quoting_them() {
        for (json, why) in [
            ("not json", "is not a JSON key"),
            (
                r#"{"type": "authorized_user", "private_key": "SECRET"}"#,
                "authorized_user",
            ),
            (
                r#"{"type": "service_account", "private_key": "SECRET"}"#,
                "no client_email",
            ),
            (
                r#"{"type": "service_account", "client_email": "a@b", "private_key": "SECRET"}"#,
                "not RSA",
            ),
        ] {
            let err = ServiceAccount::from_json(json.as_bytes(), "/google/credentials.json")
                .unwrap_err()
                .to_string();
            assert!(err.contains(why), "{json}: {err}");
            assert!(err.contains("/google/credentials.json"), "{err}");
            assert!(!err.contains("SECRET"), "{err}");
        }
    }
}
