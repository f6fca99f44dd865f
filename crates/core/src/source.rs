//! Which source a DataVolume names, and a refusal naming the problem when it names none, several,
//! or one this version cannot fill. Upstream refuses malformed specs in its admission webhook
//! (same rules, same wording); the controller checks again because a DataVolume can reach it
//! without the webhook (none installed yet, or created while it was down).

use cdi_api::datavolume::{DataVolume, DataVolumeSource, SourceKind};

/// What fills the DataVolume's claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filled {
    /// One of the sources a worker pod of this controller fills: http, blank, upload, or a clone
    /// of a claim.
    Import(SourceKind),
    /// Something else, named by the claim's `dataSource`/`dataSourceRef` (external population).
    External,
}

/// Why a DataVolume is not acted on: the event reason and a message naming the DataVolume and the
/// fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: &'static str,
    pub message: String,
}

/// The spec is malformed: it can never be filled as written.
pub const INVALID_SOURCE: &str = "ErrInvalidSource";
/// The spec is well formed but names a source this version does not fill yet.
pub const UNSUPPORTED_SOURCE: &str = "ErrUnsupportedSource";

fn external(dv: &DataVolume) -> bool {
    let pvc = dv.spec.pvc.as_ref();
    let storage = dv.spec.storage.as_ref();
    pvc.is_some_and(|p| p.data_source.is_some() || p.data_source_ref.is_some())
        || storage.is_some_and(|s| s.data_source.is_some() || s.data_source_ref.is_some())
}

/// An import URL as upstream's webhook accepts it (`validateSourceURL`): absolute, of one of
/// `schemes`.
pub(crate) fn check_url(url: &str, schemes: &[&str]) -> Result<(), String> {
    if url.is_empty() {
        return Err("source URL is empty".into());
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(format!("Invalid source URL: {url}"));
    };
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let bad_char = url.chars().any(|c| c.is_whitespace() || c.is_control());
    let valid_scheme = !scheme.is_empty()
        && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
    if !valid_scheme || bad_char || host.is_empty() {
        return Err(format!("Invalid source URL: {url}"));
    }
    if !schemes.contains(&scheme.to_ascii_lowercase().as_str()) {
        return Err(format!("Invalid source URL scheme: {url}"));
    }
    Ok(())
}

/// A registry source as upstream's webhook takes it (its words), then what this version reads:
/// an image by URL from a registry.
pub(crate) fn registry(
    dv: &DataVolume,
    reg: Option<&cdi_api::datavolume::DataVolumeSourceRegistry>,
) -> Result<(), (String, &'static str)> {
    use cdi_api::datavolume::{REGISTRY_SCHEME_DOCKER, REGISTRY_SCHEME_OCI_ARCHIVE};
    if dv.spec.content_type == Some(cdi_api::enums::ContentType::Archive) {
        return Err((
            "ContentType must be kubevirt when Source is Registry".into(),
            "remove spec.contentType: a registry image holds a disk image",
        ));
    }
    let non_empty = |v: Option<&String>| v.filter(|s| !s.is_empty()).cloned();
    let url = non_empty(reg.and_then(|r| r.url.as_ref()));
    let stream = non_empty(reg.and_then(|r| r.image_stream.as_ref()));
    let url = match (url, stream) {
        (Some(url), None) => url,
        (None, Some(_)) => {
            return Err((
                "Source registry ImageStream is supported only with node pull import method".into(),
                "name the image by spec.source.registry.url (docker://host/repository:tag)",
            ));
        }
        _ => {
            return Err((
                "Source registry should have either URL or ImageStream".into(),
                "set spec.source.registry.url to docker://host/repository:tag",
            ));
        }
    };
    let scheme = url.split_once(':').map(|(s, _)| s).unwrap_or("");
    if scheme != REGISTRY_SCHEME_DOCKER && scheme != REGISTRY_SCHEME_OCI_ARCHIVE {
        return Err((
            format!("Illegal registry source URL scheme {url}"),
            "use docker://host/repository:tag",
        ));
    }
    if scheme == REGISTRY_SCHEME_OCI_ARCHIVE {
        // Where it is served is checked below (what upstream would read is a file in the pod).
        return Ok(());
    }
    let rest = url.strip_prefix("docker://").unwrap_or("");
    let host = rest.split('/').next().unwrap_or("");
    if host.is_empty() || rest.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err((
            format!("Illegal registry source URL {url}"),
            "use docker://host/repository:tag",
        ));
    }
    Ok(())
}

/// The host serving an oci-archive named by what follows `oci-archive:` (`https://host/…`,
/// `http://host/…` or `//host/…`); `None` for a path in the importer's filesystem.
pub fn archive_host(location: &str) -> Option<&str> {
    let rest = location
        .strip_prefix("https://")
        .or_else(|| location.strip_prefix("http://"))
        .or_else(|| location.strip_prefix("//"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let bad = rest.chars().any(|c| c.is_whitespace() || c.is_control());
    (!host.is_empty() && !bad).then_some(host)
}

/// A checksum as upstream parses it (`checksum.ParseAndValidate`): `algorithm:hex`, optional.
pub(crate) fn check_checksum(checksum: &str) -> Result<(), String> {
    if checksum.is_empty() {
        return Ok(());
    }
    let Some((algorithm, hash)) = checksum.split_once(':') else {
        return Err(format!(
            "invalid checksum format: expected 'algorithm:hash', got '{checksum}'"
        ));
    };
    let algorithm = algorithm.trim().to_ascii_lowercase();
    let hash = hash.trim();
    if hash.is_empty() {
        return Err("checksum hash value cannot be empty".into());
    }
    let expected = match algorithm.as_str() {
        "md5" => 32,
        "sha1" => 40,
        "sha256" => 64,
        "sha512" => 128,
        _ => {
            return Err(format!(
                "unsupported hash algorithm '{algorithm}': supported algorithms are: md5, sha1, sha256, sha512"
            ));
        }
    };
    if hash.len() != expected {
        return Err(format!(
            "invalid {algorithm} hash length: expected {expected} hex characters, got {}",
            hash.len()
        ));
    }
    if !hash.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err("checksum hash is not valid hexadecimal".into());
    }
    Ok(())
}

/// The DataVolume's source, or why it is refused.
pub fn check(dv: &DataVolume) -> Result<Filled, Refusal> {
    if external(dv) {
        if dv.spec.source.is_some() || dv.spec.source_ref.is_some() {
            return Err(invalid(
                dv,
                "External population is incompatible with Source and SourceRef",
                "remove spec.source and spec.sourceRef, or the dataSource/dataSourceRef of the claim spec",
            ));
        }
        return Ok(Filled::External);
    }
    let source = written_source(dv)?;
    match source.kinds().as_slice() {
        [] => Err(invalid(
            dv,
            "Missing Data volume source",
            "spec.source names no source: set one of http, blank, ...",
        )),
        [SourceKind::Http] => check_http(dv, source),
        [SourceKind::S3] => {
            let url = source.s3.as_ref().map(|s| s.url.as_str()).unwrap_or("");
            // Upstream takes http and https; s3://bucket/key (AWS) as well here.
            if let Err(e) = check_url(url, &["http", "https", "s3"]) {
                return Err(invalid(
                    dv,
                    &format!("spec.source {e}"),
                    "use http(s)://host/bucket/key or s3://bucket/key",
                ));
            }
            Ok(Filled::Import(SourceKind::S3))
        }
        [SourceKind::Gcs] => {
            let url = source.gcs.as_ref().map(|g| g.url.as_str()).unwrap_or("");
            if let Err(e) = check_url(url, &["gs", "http", "https"]) {
                return Err(invalid(
                    dv,
                    &format!("spec.source {e}"),
                    "use gs://bucket/object or http(s)://host/bucket/object",
                ));
            }
            Ok(Filled::Import(SourceKind::Gcs))
        }
        [SourceKind::Registry] => check_registry(dv, source),
        [SourceKind::Blank] => Ok(Filled::Import(SourceKind::Blank)),
        [SourceKind::Upload] => Ok(Filled::Import(SourceKind::Upload)),
        [SourceKind::Pvc] => {
            let pvc = source.pvc.as_ref();
            if pvc.is_none_or(|p| p.name.is_empty()) {
                return Err(invalid(
                    dv,
                    "spec.source.pvc.name source PVC is not valid",
                    "name the claim to clone in spec.source.pvc.name",
                ));
            }
            Ok(Filled::Import(SourceKind::Pvc))
        }
        [SourceKind::Snapshot] => {
            if source.snapshot.as_ref().is_none_or(|s| s.name.is_empty()) {
                return Err(invalid(
                    dv,
                    "spec.source.snapshot.name source snapshot is not valid",
                    "name the VolumeSnapshot to clone in spec.source.snapshot.name",
                ));
            }
            Ok(Filled::Import(SourceKind::Snapshot))
        }
        [kind] => Err(unsupported(
            dv,
            &format!(
                "{} sources are not supported by this version of cdi-rs yet",
                kind.field()
            ),
        )),
        kinds => {
            let names: Vec<&str> = kinds.iter().map(|k| k.field()).collect();
            Err(invalid(
                dv,
                "Multiple Data volume sources",
                &format!("spec.source sets {}: keep exactly one", names.join(" and ")),
            ))
        }
    }
}

/// `DataVolume <namespace>/<name>`'s refusal of a spec written wrong: what, and the fix.
fn invalid(dv: &DataVolume, what: &str, fix: &str) -> Refusal {
    let ns = dv.metadata.namespace.as_deref().unwrap_or("");
    let name = dv.metadata.name.as_deref().unwrap_or("");
    Refusal {
        reason: INVALID_SOURCE,
        message: format!("DataVolume {ns}/{name}: {what}; {fix}"),
    }
}

/// `DataVolume <namespace>/<name>`'s refusal of what this version does not fill.
fn unsupported(dv: &DataVolume, why: &str) -> Refusal {
    let ns = dv.metadata.namespace.as_deref().unwrap_or("");
    let name = dv.metadata.name.as_deref().unwrap_or("");
    Refusal {
        reason: UNSUPPORTED_SOURCE,
        message: format!("DataVolume {ns}/{name}: {why}"),
    }
}

/// `spec.source`, which must be there, alone: a `sourceRef` is resolved by the controller
/// before (`datasource::source_of_ref`), so one that reaches here was not.
fn written_source(dv: &DataVolume) -> Result<&DataVolumeSource, Refusal> {
    let either = "Data volume should have either Source or SourceRef, or be externally populated";
    match (dv.spec.source.as_ref(), dv.spec.source_ref.is_some()) {
        (None, false) => Err(invalid(
            dv,
            either,
            "set spec.source (http, blank, ...) or spec.sourceRef",
        )),
        (Some(_), true) => Err(invalid(
            dv,
            either,
            "it has both: keep spec.source or spec.sourceRef, not both",
        )),
        (None, true) => Err(unsupported(
            dv,
            "spec.sourceRef is decided as the source its DataSource names, and it was not resolved",
        )),
        (Some(s), false) => Ok(s),
    }
}

/// An http source: an http(s) URL, and a checksum as `algorithm:hex` when it has one.
fn check_http(dv: &DataVolume, source: &DataVolumeSource) -> Result<Filled, Refusal> {
    let http = source.http.as_ref();
    let url = http.map(|h| h.url.as_str()).unwrap_or("");
    if let Err(e) = check_url(url, &["http", "https"]) {
        return Err(invalid(
            dv,
            &format!("spec.source {e}"),
            "use an http:// or https:// URL",
        ));
    }
    let checksum = http.and_then(|h| h.checksum.as_deref()).unwrap_or("");
    if let Err(e) = check_checksum(checksum) {
        return Err(invalid(
            dv,
            &format!("Invalid checksum format: {e}"),
            "write it as algorithm:hex with md5, sha1, sha256 or sha512",
        ));
    }
    Ok(Filled::Import(SourceKind::Http))
}

/// A registry source as upstream takes it, and as this version reads it: an oci-archive over
/// HTTP(S), pulled by the importer pod (not by the node).
fn check_registry(dv: &DataVolume, source: &DataVolumeSource) -> Result<Filled, Refusal> {
    let reg = source.registry.as_ref();
    registry(dv, reg).map_err(|(what, fix)| invalid(dv, &what, fix))?;
    let url = reg.and_then(|r| r.url.as_deref()).unwrap_or("");
    if let Some(location) = url.strip_prefix("oci-archive:")
        && archive_host(location).is_none()
    {
        return Err(unsupported(
            dv,
            &format!(
                "spec.source.registry.url {url}: upstream reads \
                 an oci-archive from the importer pod's own filesystem, where nothing \
                 puts one; serve the archive over HTTP(S) and name it \
                 oci-archive:https://host/path/image.tar (or oci-archive://host/path/image.tar)"
            ),
        ));
    }
    let method = reg.and_then(|r| r.pull_method);
    if method == Some(cdi_api::enums::RegistryPullMethod::Node) {
        return Err(unsupported(
            dv,
            "spec.source.registry.pullMethod node is not \
             supported by this version of cdi-rs: the node's container runtime would \
             pull the image, and the development cluster's kubelet runs pods as \
             processes and pulls no images; remove pullMethod (the importer pod \
             pulls the image itself)",
        ));
    }
    Ok(Filled::Import(SourceKind::Registry))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dv(spec: serde_json::Value) -> DataVolume {
        serde_json::from_value(
            json!({"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "disk", "namespace": "vms"}, "spec": spec}),
        )
        .unwrap()
    }

    #[test]
    fn sources() {
        let pvc = json!({"resources": {"requests": {"storage": "1Gi"}}});
        let cases = [
            (
                json!({"source": {"http": {"url": "http://x"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Http)),
            ),
            (
                json!({"source": {"blank": {}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Blank)),
            ),
            (
                json!({"pvc": {"dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "p"}}}),
                Ok(Filled::External),
            ),
            (
                json!({"pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Data volume should have either Source or SourceRef, or be \
                     externally populated; set spec.source (http, blank, ...) or spec.sourceRef",
                )),
            ),
            (
                json!({"source": {}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Missing Data volume source; spec.source names no source: \
                     set one of http, blank, ...",
                )),
            ),
            (
                json!({"source": {"http": {"url": "http://x"}, "blank": {}}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Multiple Data volume sources; spec.source sets http and \
                     blank: keep exactly one",
                )),
            ),
            (
                json!({"source": {"blank": {}}, "sourceRef": {"kind": "DataSource", "name": "d"}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Data volume should have either Source or SourceRef, or be \
                     externally populated; it has both: keep spec.source or spec.sourceRef, not both",
                )),
            ),
            (
                json!({"source": {"blank": {}}, "storage": {"dataSource": {"kind": "PersistentVolumeClaim", "name": "p"}}}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: External population is incompatible with Source and \
                     SourceRef; remove spec.source and spec.sourceRef, or the dataSource/dataSourceRef \
                     of the claim spec",
                )),
            ),
            (
                json!({"source": {"s3": {"url": "http://minio:9000/images/disk.qcow2"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::S3)),
            ),
            (
                json!({"source": {"s3": {"url": "s3://images/disk.qcow2"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::S3)),
            ),
            (
                json!({"source": {"s3": {"url": "ftp://images/disk.qcow2"}}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: spec.source Invalid source URL scheme: \
                     ftp://images/disk.qcow2; use http(s)://host/bucket/key or s3://bucket/key",
                )),
            ),
            (
                json!({"source": {"registry": {"url": "docker://quay.io/containerdisks/fedora:41"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Registry)),
            ),
            (
                json!({"source": {"registry": {"url": "quay.io/containerdisks/fedora:41"}}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Illegal registry source URL scheme \
                     quay.io/containerdisks/fedora:41; use docker://host/repository:tag",
                )),
            ),
            (
                json!({"source": {"registry": {"url": "docker://x/y", "imageStream": "s"}}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: Source registry should have either URL or \
                     ImageStream; set spec.source.registry.url to docker://host/repository:tag",
                )),
            ),
            (
                json!({"source": {"registry": {"url": "docker://x/y"}}, "contentType": "archive", "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: ContentType must be kubevirt when Source is Registry; \
                     remove spec.contentType: a registry image holds a disk image",
                )),
            ),
            (
                json!({"source": {"registry": {"url": "oci-archive:https://files/fedora.tar"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Registry)),
            ),
            (
                json!({"source": {"registry": {"url": "oci-archive://files:8080/fedora.tar"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Registry)),
            ),
            (
                json!({"source": {"registry": {"url": "oci-archive:/images/fedora.tar"}}, "pvc": pvc}),
                Err((
                    UNSUPPORTED_SOURCE,
                    "DataVolume vms/disk: spec.source.registry.url oci-archive:/images/fedora.tar: \
                     upstream reads an oci-archive from the importer pod's own filesystem, where \
                     nothing puts one; serve the archive over HTTP(S) and name it \
                     oci-archive:https://host/path/image.tar (or oci-archive://host/path/image.tar)",
                )),
            ),
            (
                json!({"source": {"registry": {"url": "docker://x/y", "pullMethod": "node"}}, "pvc": pvc}),
                Err((
                    UNSUPPORTED_SOURCE,
                    "DataVolume vms/disk: spec.source.registry.pullMethod node is not supported \
                     by this version of cdi-rs: the node's container runtime would pull the \
                     image, and the development cluster's kubelet runs pods as processes and \
                     pulls no images; remove pullMethod (the importer pod pulls the image itself)",
                )),
            ),
            (
                json!({"source": {"gcs": {"url": "gs://b/o"}}, "pvc": pvc}),
                Ok(Filled::Import(SourceKind::Gcs)),
            ),
            (
                json!({"source": {"gcs": {"url": "s3://b/o"}}, "pvc": pvc}),
                Err((
                    INVALID_SOURCE,
                    "DataVolume vms/disk: spec.source Invalid source URL scheme: s3://b/o; use \
                     gs://bucket/object or http(s)://host/bucket/object",
                )),
            ),
            (
                json!({"source": {"imageio": {"url": "https://engine/api", "diskId": "d"}}, "pvc": pvc}),
                Err((
                    UNSUPPORTED_SOURCE,
                    "DataVolume vms/disk: imageio sources are not supported by this version of \
                     cdi-rs yet",
                )),
            ),
            (
                json!({"sourceRef": {"kind": "DataSource", "name": "d"}, "pvc": pvc}),
                Err((
                    UNSUPPORTED_SOURCE,
                    "DataVolume vms/disk: spec.sourceRef is decided as the source its DataSource names, and it was not resolved",
                )),
            ),
        ];
        for (spec, want) in cases {
            let got = check(&dv(spec.clone()));
            let want = want.map_err(|(reason, message)| Refusal {
                reason,
                message: message.into(),
            });
            assert_eq!(got, want, "{spec}");
        }
    }

    #[test]
    fn urls_and_checksums_as_upstreams_webhook_checks_them() {
        let http = |url: &str, checksum: Option<&str>| {
            dv(
                json!({"source": {"http": {"url": url, "checksum": checksum}},
                "pvc": {"resources": {"requests": {"storage": "1Gi"}}}}),
            )
        };
        let good = format!("SHA256:{}", "A".repeat(64));
        assert_eq!(
            check(&http("HTTPS://x/disk.qcow2", Some(&good))),
            Ok(Filled::Import(SourceKind::Http))
        );
        let url_fix = "use an http:// or https:// URL";
        let sum_fix = "write it as algorithm:hex with md5, sha1, sha256 or sha512";
        let bad_hex = format!("md5:{}", "g".repeat(32));
        let cases = [
            ("", None, "spec.source source URL is empty", url_fix),
            (
                "small.qcow2",
                None,
                "spec.source Invalid source URL: small.qcow2",
                url_fix,
            ),
            (
                "http:///x",
                None,
                "spec.source Invalid source URL: http:///x",
                url_fix,
            ),
            (
                "ftp://x/y",
                None,
                "spec.source Invalid source URL scheme: ftp://x/y",
                url_fix,
            ),
            (
                "file:///etc/passwd",
                None,
                "spec.source Invalid source URL: file:///etc/passwd",
                url_fix,
            ),
            (
                "http://x/y",
                Some("garbage"),
                "Invalid checksum format: invalid checksum format: expected 'algorithm:hash', got 'garbage'",
                sum_fix,
            ),
            (
                "http://x/y",
                Some("sha256:zz"),
                "Invalid checksum format: invalid sha256 hash length: expected 64 hex characters, got 2",
                sum_fix,
            ),
            (
                "http://x/y",
                Some("crc32:00"),
                "Invalid checksum format: unsupported hash algorithm 'crc32': supported algorithms are: md5, sha1, sha256, sha512",
                sum_fix,
            ),
            (
                "http://x/y",
                Some(bad_hex.as_str()),
                "Invalid checksum format: checksum hash is not valid hexadecimal",
                sum_fix,
            ),
        ];
        for (url, checksum, what, fix) in cases {
            assert_eq!(
                check(&http(url, checksum)),
                Err(Refusal {
                    reason: INVALID_SOURCE,
                    message: format!("DataVolume vms/disk: {what}; {fix}"),
                }),
                "{url} {checksum:?}"
            );
        }
    }
}
