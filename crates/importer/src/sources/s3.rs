//! S3 sources: an object of S3 or an S3-compatible store, read over HTTP with every request
//! signed (SigV4 headers, by the AWS SDK's `aws-sigv4`), as upstream's SDK client does. Signed,
//! the object is an ordinary HTTP source: it streams, is read at random by range requests (qcow2
//! converts without scratch) and resumes a broken transfer exactly as [`HttpSource`] does.
//!
//! The URL forms (upstream's, and two more):
//! - `http(s)://host[:port]/bucket/key`: path-style on that endpoint (MinIO, Ceph, moto, …);
//!   the region is the `<region>` of an `s3.<region>.amazonaws.com` host, else the host's first
//!   label, as upstream derives it.
//! - `https://bucket.s3.<region>.amazonaws.com/key`: virtual-hosted AWS.
//! - `s3://bucket/key`: AWS in `us-east-1`.

use std::sync::Arc;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{
    PayloadChecksumKind, PercentEncodingMode, SignableBody, SignableRequest, SigningSettings,
    UriPathNormalizationMode, sign,
};
use aws_sigv4::sign::v4;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Url;

use crate::error::ImportError;
use crate::sources::http::HttpSource;
use crate::sources::http::Signer;

/// Where an object is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// The endpoint the bucket is reached through (its path-style base, or the bucket's own
    /// host for a virtual-hosted one).
    pub endpoint: Url,
    pub style: Style,
    pub bucket: String,
    pub key: String,
    pub region: String,
}

/// How the bucket is addressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    Path,
    VirtualHost,
}

fn refused(url: &str, why: &str) -> ImportError {
    ImportError::Config(format!(
        "Unable to connect to s3 data source: {why} in {}; write it as http(s)://host/bucket/key or s3://bucket/key",
        crate::sources::http::redact(url)
    ))
}

/// The region of an AWS host (`s3.<region>.amazonaws.com`, `s3-<region>.amazonaws.com`,
/// `<bucket>.s3.<region>.amazonaws.com`), if it is one.
fn aws_region(host: &str) -> Option<&str> {
    let rest = host.strip_suffix(".amazonaws.com")?;
    // The global endpoint (`s3.amazonaws.com`, `<bucket>.s3.amazonaws.com`) is us-east-1's.
    if rest == "s3" || rest.ends_with(".s3") {
        return Some("us-east-1");
    }
    let at = rest.rfind("s3.").or_else(|| rest.rfind("s3-"))?;
    if at > 0 && !rest[..at].ends_with('.') {
        return None;
    }
    let region = &rest[at + 3..];
    (!region.is_empty() && !region.contains('.')).then_some(region)
}

/// Parse an S3 source URL.
pub fn locate(url: &str) -> Result<Location, ImportError> {
    let parsed =
        Url::parse(url).map_err(|e| refused(url, &format!("the URL is not valid ({e})")))?;
    let host = parsed
        .host_str()
        .filter(|h| !h.is_empty())
        .ok_or_else(|| refused(url, "no host"))?
        .to_string();
    let path = percent_encoding::percent_decode_str(parsed.path().trim_start_matches('/'))
        .decode_utf8()
        .map_err(|_| refused(url, "the object key is not UTF-8"))?
        .into_owned();
    let (endpoint, style, bucket, key, region) = match parsed.scheme() {
        "s3" => (
            Url::parse("https://s3.amazonaws.com").expect("a URL"),
            Style::Path,
            host,
            path,
            "us-east-1".to_string(),
        ),
        "http" | "https" => {
            let virtual_bucket = aws_region(&host).and_then(|_| {
                let (bucket, _) = host.split_once(".s3")?;
                (!bucket.is_empty()).then(|| bucket.to_string())
            });
            let region = aws_region(&host)
                .map(str::to_string)
                .unwrap_or_else(|| host.split('.').next().unwrap_or(&host).to_string());
            let mut endpoint = parsed.clone();
            endpoint.set_path("/");
            endpoint.set_query(None);
            endpoint.set_fragment(None);
            match virtual_bucket {
                Some(bucket) => {
                    let base = host[bucket.len() + 1..].to_string();
                    endpoint
                        .set_host(Some(&base))
                        .map_err(|_| refused(url, "no host"))?;
                    (endpoint, Style::VirtualHost, bucket, path, region)
                }
                None => {
                    let (bucket, key) = path.split_once('/').unwrap_or((&path, ""));
                    (
                        endpoint,
                        Style::Path,
                        bucket.to_string(),
                        key.to_string(),
                        region,
                    )
                }
            }
        }
        other => return Err(refused(url, &format!("the scheme {other:?} is not S3's"))),
    };
    if bucket.is_empty() {
        return Err(refused(url, "no bucket"));
    }
    if key.is_empty() || key.ends_with('/') {
        return Err(refused(url, "no object key"));
    }
    Ok(Location {
        endpoint,
        style,
        bucket,
        key,
        region,
    })
}

/// What an object key keeps unescaped in a URL path: S3's unreserved characters and `/`.
const KEY: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~')
    .remove(b'/');

impl Location {
    /// The object's URL (path-style: `endpoint/bucket/key`; else `bucket.endpoint/key`).
    pub fn object_url(&self) -> String {
        let key = utf8_percent_encode(&self.key, KEY);
        let mut base = self.endpoint.clone();
        match self.style {
            Style::Path => {
                let bucket = utf8_percent_encode(&self.bucket, KEY);
                base.set_path(&format!("/{bucket}/{key}"));
            }
            Style::VirtualHost => {
                let host = format!("{}.{}", self.bucket, base.host_str().unwrap_or(""));
                // A bucket that cannot be a host name was refused by `locate` already.
                let _ = base.set_host(Some(&host));
                base.set_path(&format!("/{key}"));
            }
        }
        base.to_string()
    }
}

/// SigV4 for S3: the access key and secret of the DataVolume's `secretRef` (`accessKeyId`,
/// `secretKey`), the location's region.
struct SigV4 {
    credentials: Credentials,
    region: String,
}

impl std::fmt::Debug for SigV4 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigV4")
            .field("region", &self.region)
            .finish()
    }
}

impl Signer for SigV4 {
    fn headers(&self, method: &str, url: &str) -> Result<Vec<(String, String)>, ImportError> {
        let failed = |e: &dyn std::fmt::Display| {
            ImportError::Config(format!(
                "Unable to connect to s3 data source: signing the request failed: {e}"
            ))
        };
        let mut settings = SigningSettings::default();
        // S3 signs the path as sent, once encoded, and wants the payload hash header.
        settings.percent_encoding_mode = PercentEncodingMode::Single;
        settings.uri_path_normalization_mode = UriPathNormalizationMode::Disabled;
        settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
        let identity = self.credentials.clone().into();
        let params: aws_sigv4::http_request::SigningParams = v4::SigningParams::builder()
            .identity(&identity)
            .region(&self.region)
            .name("s3")
            .time(SystemTime::now())
            .settings(settings)
            .build()
            .map_err(|e| failed(&e))?
            .into();
        let request = SignableRequest::new(
            method,
            url,
            std::iter::empty(),
            SignableBody::UnsignedPayload,
        )
        .map_err(|e| failed(&e))?;
        let (instructions, _) = sign(request, &params).map_err(|e| failed(&e))?.into_parts();
        Ok(instructions
            .headers()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }
}

/// The object as an HTTP source whose requests are signed with the access key and secret,
/// trusting `ca_certs_pem` besides the system roots.
pub fn source(
    url: &str,
    access_key: &str,
    secret_key: &str,
    ca_certs_pem: Vec<Vec<u8>>,
) -> Result<HttpSource, ImportError> {
    let at = locate(url)?;
    let object = at.object_url();
    let signer = SigV4 {
        credentials: Credentials::new(access_key, secret_key, None, None, "datavolume-secret"),
        region: at.region.clone(),
    };
    // Once now: what cannot be signed is refused before anything is read.
    signer.headers("GET", &object)?;
    Ok(HttpSource {
        url: object,
        ca_certs_pem,
        signer: Some(Arc::new(signer)),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_an_endpoint_a_bucket_a_key_and_a_region() {
        let at = locate("http://127.0.0.1:9000/images/fedora/disk%201.qcow2").unwrap();
        assert_eq!(at.endpoint.as_str(), "http://127.0.0.1:9000/");
        assert_eq!(at.style, Style::Path);
        assert_eq!(
            (at.bucket.as_str(), at.key.as_str()),
            ("images", "fedora/disk 1.qcow2")
        );
        // Upstream's region for a host that is not AWS's: its first label.
        assert_eq!(at.region, "127");
        let at = locate("https://minio.storage.svc:9000/b/k").unwrap();
        assert_eq!(at.region, "minio");
        let at = locate("https://s3.eu-west-1.amazonaws.com/b/k.img").unwrap();
        assert_eq!((at.region.as_str(), at.style), ("eu-west-1", Style::Path));
        let at = locate("https://golden.s3.eu-west-1.amazonaws.com/k.img").unwrap();
        assert_eq!(at.style, Style::VirtualHost);
        assert_eq!(at.endpoint.as_str(), "https://s3.eu-west-1.amazonaws.com/");
        assert_eq!(
            (at.bucket.as_str(), at.key.as_str(), at.region.as_str()),
            ("golden", "k.img", "eu-west-1")
        );
        let at = locate("https://golden.s3.amazonaws.com/k.img").unwrap();
        assert_eq!(
            (at.region.as_str(), at.style),
            ("us-east-1", Style::VirtualHost)
        );
        assert_eq!(at.endpoint.as_str(), "https://s3.amazonaws.com/");
        let at = locate("s3://golden/images/k.img").unwrap();
        assert_eq!(at.endpoint.as_str(), "https://s3.amazonaws.com/");
        assert_eq!(
            (at.bucket.as_str(), at.key.as_str(), at.region.as_str()),
            ("golden", "images/k.img", "us-east-1")
        );
        for bad in [
            "http://host/bucket",
            "http://host/bucket/",
            "http://host/",
            "s3://bucket",
            "ftp://host/b/k",
            "not a url",
        ] {
            let err = locate(bad).unwrap_err().to_string();
            assert!(err.contains("Unable to connect to s3 data source"), "{err}");
        }
    }

    #[test]
    fn requests_are_signed_in_headers_and_keys_are_escaped_once() {
        let s = source(
            "http://127.0.0.1:9000/b/dir/disk%201.img",
            "AKID",
            "TOPSECRET",
            Vec::new(),
        )
        .unwrap();
        assert_eq!(s.url, "http://127.0.0.1:9000/b/dir/disk%201.img");
        let headers = s.signer.as_ref().unwrap().headers("GET", &s.url).unwrap();
        let get = |name: &str| {
            headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
                .unwrap_or_default()
        };
        assert!(
            get("authorization").starts_with("AWS4-HMAC-SHA256 Credential=AKID/"),
            "{headers:?}"
        );
        assert!(get("authorization").contains("/127/s3/aws4_request"));
        assert_eq!(get("x-amz-content-sha256"), "UNSIGNED-PAYLOAD");
        assert!(!format!("{headers:?}{s:?}").contains("TOPSECRET"));
        let hosted = locate("https://golden.s3.eu-west-1.amazonaws.com/a b.img").unwrap();
        assert_eq!(
            hosted.object_url(),
            "https://golden.s3.eu-west-1.amazonaws.com/a%20b.img"
        );
    }
}
