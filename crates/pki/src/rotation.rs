//! When the certificates of CDI's own endpoints are made again, as upstream's operator decides
//! it (OpenShift's library-go certrotation): from the validity written on each Secret, the
//! lifetimes `spec.certConfig` asks for, and the CA bundle each target must still chain to.
//! Pure: the operator and the controller act on what this says.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use cdi_api::config::{CdiCertConfig, CertConfig};
use k8s_openapi::jiff::Timestamp;

/// The Secret annotations upstream keeps a certificate's validity and origin in.
pub const NOT_BEFORE: &str = "auth.openshift.io/certificate-not-before";
pub const NOT_AFTER: &str = "auth.openshift.io/certificate-not-after";
pub const ISSUER: &str = "auth.openshift.io/certificate-issuer";
pub const HOSTNAMES: &str = "auth.openshift.io/certificate-hostnames";
/// The lifetimes a certificate was made for; a change makes it again.
pub const CERT_CONFIG: &str = "operator.cdi.kubevirt.io/certConfig";

/// How long a certificate lives, and when (counted from its start) it is made again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub lifetime: Duration,
    pub refresh: Duration,
}

const HOUR: Duration = Duration::from_secs(3600);

/// The longest lifetime taken: what a certificate can be signed for (Go's durations end near
/// 292 years; dates past 9999 cannot be written in a certificate).
pub const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

impl Lifetime {
    /// When a certificate made at `start` is made again: at its refresh time, and at the latest
    /// at four fifths of its life.
    pub fn renew_at(&self, start: SystemTime) -> SystemTime {
        start + self.refresh.min(self.lifetime * 4 / 5)
    }

    /// The annotation recording it (upstream's JSON, Go's duration notation).
    pub fn annotation(&self) -> String {
        serde_json::json!({"lifetime": go_duration(self.lifetime),
            "refresh": go_duration(self.refresh)})
        .to_string()
    }
}

/// The lifetimes of the CAs, the serving certificates and the client certificates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetimes {
    pub ca: Lifetime,
    pub server: Lifetime,
    pub client: Lifetime,
}

impl Default for Lifetimes {
    /// Upstream's: CAs for 48h made again after 24h, the others for 24h made again after 12h.
    fn default() -> Self {
        Lifetimes {
            ca: Lifetime {
                lifetime: 48 * HOUR,
                refresh: 24 * HOUR,
            },
            server: Lifetime {
                lifetime: 24 * HOUR,
                refresh: 12 * HOUR,
            },
            client: Lifetime {
                lifetime: 24 * HOUR,
                refresh: 12 * HOUR,
            },
        }
    }
}

impl Lifetimes {
    /// Upstream's defaults overridden by `spec.certConfig`: `duration` is the lifetime and
    /// `renewBefore` how long before the end it is made again. A value that cannot be honoured
    /// is an error naming the field.
    pub fn from_spec(spec: Option<&CdiCertConfig>) -> Result<Lifetimes, String> {
        let mut out = Lifetimes::default();
        let Some(spec) = spec else { return Ok(out) };
        for (field, given, into) in [
            ("ca", &spec.ca, &mut out.ca),
            ("server", &spec.server, &mut out.server),
            ("client", &spec.client, &mut out.client),
        ] {
            if let Some(c) = given {
                apply(field, c, into)?;
            }
        }
        Ok(out)
    }
}

fn apply(field: &str, c: &CertConfig, into: &mut Lifetime) -> Result<(), String> {
    let parse = |name: &str, v: &str| {
        parse_go_duration(v).map_err(|why| {
            format!("spec.certConfig.{field}.{name}: {v:?} is not a duration ({why}); write it as Go does, e.g. \"48h\" or \"30m\"")
        })
    };
    if let Some(d) = &c.duration {
        into.lifetime = parse("duration", d)?;
        if into.lifetime.is_zero() || into.lifetime > LONGEST {
            return Err(format!(
                "spec.certConfig.{field}.duration must be longer than 0 and at most {}",
                go_duration(LONGEST)
            ));
        }
    }
    if let Some(r) = &c.renew_before {
        let before = parse("renewBefore", r)?;
        if before >= into.lifetime {
            return Err(format!(
                "spec.certConfig.{field}.renewBefore ({r}) must be shorter than its duration ({})",
                go_duration(into.lifetime)
            ));
        }
        into.refresh = into.lifetime - before;
    }
    Ok(())
}

/// A duration as Go writes it (`48h0m0s`, `30m0s`, `1.5s`, `250ms`, `0s`).
pub fn go_duration(d: Duration) -> String {
    let secs = d.as_secs();
    let nanos = d.subsec_nanos();
    if secs == 0 {
        return match nanos {
            0 => "0s".into(),
            n if n % 1_000_000 == 0 => format!("{}ms", n / 1_000_000),
            n if n % 1_000 == 0 => format!("{}µs", n / 1_000),
            n => format!("{n}ns"),
        };
    }
    let mut s = if nanos == 0 {
        format!("{}s", secs % 60)
    } else {
        let frac = format!("{nanos:09}");
        format!("{}.{}s", secs % 60, frac.trim_end_matches('0'))
    };
    if secs >= 60 {
        s = format!("{}m{s}", (secs / 60) % 60);
    }
    if secs >= 3600 {
        s = format!("{}h{s}", secs / 3600);
    }
    s
}

/// Go's `time.ParseDuration` for the non-negative durations a lifetime can be.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.starts_with('-') {
        return Err("a lifetime cannot be negative".into());
    }
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err("empty".into());
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or("a number without a unit")?;
        let (number, after) = rest.split_at(digits);
        let value: f64 = number
            .parse()
            .map_err(|_| format!("{number:?} is not a number"))?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let scale = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            other => return Err(format!("unknown unit {other:?}")),
        };
        total += value * scale;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|e| e.to_string())
}

/// When a certificate is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// The validity of the (first) certificate of `pem`.
    pub fn of_pem(pem: &str) -> Result<Validity, String> {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
            .map_err(|e| format!("not a PEM certificate: {e}"))?;
        let cert = block
            .parse_x509()
            .map_err(|e| format!("not an X.509 certificate: {e}"))?;
        Ok(Validity::of_cert(&cert))
    }

    fn of_cert(cert: &x509_parser::certificate::X509Certificate) -> Validity {
        let at = |t: x509_parser::time::ASN1Time| {
            SystemTime::UNIX_EPOCH + Duration::from_secs(t.timestamp().max(0) as u64)
        };
        Validity {
            not_before: at(cert.validity().not_before),
            not_after: at(cert.validity().not_after),
        }
    }

    /// The annotations recording it (RFC 3339, to the second, as Go writes them).
    pub fn annotations(&self) -> [(&'static str, String); 2] {
        [
            (NOT_BEFORE, rfc3339(self.not_before)),
            (NOT_AFTER, rfc3339(self.not_after)),
        ]
    }

    /// The validity a Secret's annotations record, or why they record none.
    pub fn of_annotations(anns: &BTreeMap<String, String>) -> Result<Validity, String> {
        let read = |key: &str| {
            let text = anns.get(key).ok_or(format!("missing {key}"))?;
            let at: Timestamp = text
                .parse()
                .map_err(|e| format!("bad {key} {text:?}: {e}"))?;
            Ok::<_, String>(SystemTime::from(at))
        };
        Ok(Validity {
            not_before: read(NOT_BEFORE)?,
            not_after: read(NOT_AFTER)?,
        })
    }

    /// Past this, the certificate is made again whatever its refresh says (library-go's rule:
    /// four fifths of its validity).
    fn latest(&self) -> SystemTime {
        let span = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or_default();
        self.not_after - span / 5
    }
}

fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Timestamp::from_second(secs)
        .map(|ts| ts.to_string())
        .unwrap_or_default()
}

/// Why the certificate a Secret with annotations `anns` holds must be made again at `now`, if
/// it must: its validity is unknown, it expired, it is past four fifths of its validity, past
/// its refresh time, or it was made for other lifetimes.
pub fn due(
    anns: &BTreeMap<String, String>,
    lifetime: &Lifetime,
    now: SystemTime,
) -> Option<String> {
    let v = match Validity::of_annotations(anns) {
        Ok(v) => v,
        Err(why) => return Some(why),
    };
    if now > v.not_after {
        return Some("already expired".into());
    }
    if now > v.latest() {
        return Some(format!(
            "past its latest possible time {}",
            rfc3339(v.latest())
        ));
    }
    let refresh = v.not_before + lifetime.refresh;
    if now > refresh {
        return Some(format!("past its refresh time {}", rfc3339(refresh)));
    }
    if anns.get(CERT_CONFIG) != Some(&lifetime.annotation()) {
        return Some(format!(
            "made for other lifetimes than {}",
            lifetime.annotation()
        ));
    }
    None
}

/// When `due` will next say yes for a certificate that is not due now (`None` when its
/// validity is unknown, which makes it due already).
pub fn next_due(anns: &BTreeMap<String, String>, lifetime: &Lifetime) -> Option<SystemTime> {
    let v = Validity::of_annotations(anns).ok()?;
    Some(v.latest().min(v.not_before + lifetime.refresh))
}

/// Why a target certificate (signed by a CA of `bundle`, for `hostnames` when it serves) must
/// be made again: `due` — except that past its refresh time it waits until the current CA
/// (which started at `signer_start`) has been out a tenth of that refresh, so that its bundle
/// reached those who trust it (library-go's rule) —, or its issuer is no longer in the bundle,
/// or its names changed.
pub fn target_due(
    anns: &BTreeMap<String, String>,
    lifetime: &Lifetime,
    bundle: &str,
    hostnames: Option<&[String]>,
    signer_start: SystemTime,
    now: SystemTime,
) -> Option<String> {
    if let Some(why) = due(anns, lifetime, now) {
        let refresh_only = why.starts_with("past its refresh time");
        if !refresh_only || now > signer_start + lifetime.refresh / 10 {
            return Some(why);
        }
    }
    let Some(issuer) = anns.get(ISSUER) else {
        return Some("missing issuer name".into());
    };
    if !common_names(bundle).contains(issuer) {
        return Some(format!("issuer {issuer:?} is not in the CA bundle"));
    }
    // Compared as sets, as library-go compares them.
    let set = |names: &mut Vec<String>| {
        names.sort();
        names.dedup();
    };
    if let Some(names) = hostnames {
        let mut want: Vec<String> = names.to_vec();
        let mut have: Vec<String> = anns
            .get(HOSTNAMES)
            .map(|h| h.split(',').map(str::to_string).collect())
            .unwrap_or_default();
        set(&mut want);
        set(&mut have);
        if want != have {
            return Some(format!("its hostnames are not {}", names.join(",")));
        }
    }
    None
}

/// The certificates of a PEM bundle, each as PEM with its DER and validity (what cannot be
/// read is left out: it would not verify anything).
fn certificates(bundle: &str) -> Vec<(String, Vec<u8>, Validity, String)> {
    let mut out = Vec::new();
    for block in x509_parser::pem::Pem::iter_from_buffer(bundle.as_bytes()).flatten() {
        if block.label != "CERTIFICATE" {
            continue;
        }
        let Ok(cert) = block.parse_x509() else {
            continue;
        };
        let validity = Validity::of_cert(&cert);
        let cn = cert
            .subject()
            .iter_common_name()
            .next()
            .and_then(|c| c.as_str().ok())
            .unwrap_or("")
            .to_string();
        let pem = pem_of(&block.contents);
        out.push((pem, block.contents.clone(), validity, cn));
    }
    out
}

fn pem_of(der: &[u8]) -> String {
    use base64::Engine;
    let text = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in text.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or(""));
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// The common names of a bundle's certificates.
pub fn common_names(bundle: &str) -> Vec<String> {
    certificates(bundle).into_iter().map(|c| c.3).collect()
}

/// The CA bundle to publish: the current CA first, then every certificate already published
/// that has not expired, each once. What a CA signed stays trusted until that CA expires.
pub fn bundle(published: &str, ca_pem: &str, now: SystemTime) -> String {
    let mut seen: Vec<Vec<u8>> = Vec::new();
    let mut out = String::new();
    for (pem, der, validity, _) in certificates(ca_pem)
        .into_iter()
        .chain(certificates(published))
    {
        if validity.not_after < now || seen.contains(&der) {
            continue;
        }
        seen.push(der);
        out.push_str(&pem);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ca::Ca;

    fn anns(pairs: &[(&str, String)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn go_durations_both_ways() {
        for (text, secs) in [
            ("48h", 172800.0),
            ("1h30m", 5400.0),
            ("90s", 90.0),
            ("1.5h", 5400.0),
            ("500ms", 0.5),
            ("0", 0.0),
        ] {
            assert_eq!(
                parse_go_duration(text).unwrap(),
                Duration::from_secs_f64(secs),
                "{text}"
            );
        }
        for bad in ["", "10", "5d", "-1h", "h"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(go_duration(48 * HOUR), "48h0m0s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
        assert_eq!(go_duration(Duration::ZERO), "0s");
        assert_eq!(
            Lifetimes::default().ca.annotation(),
            r#"{"lifetime":"48h0m0s","refresh":"24h0m0s"}"#
        );
    }

    #[test]
    fn cert_config_overrides_as_upstream_reads_it() {
        let spec: CdiCertConfig = serde_json::from_value(serde_json::json!({
            "ca": {"duration": "10h", "renewBefore": "4h"},
            "server": {"duration": "2h"}}))
        .unwrap();
        let l = Lifetimes::from_spec(Some(&spec)).unwrap();
        assert_eq!(l.ca.lifetime, 10 * HOUR);
        assert_eq!(l.ca.refresh, 6 * HOUR);
        // A duration alone keeps the default refresh (upstream's rule).
        assert_eq!(l.server.lifetime, 2 * HOUR);
        assert_eq!(l.server.refresh, 12 * HOUR);
        assert_eq!(l.client, Lifetimes::default().client);
        let bad: CdiCertConfig = serde_json::from_value(
            serde_json::json!({"client": {"duration": "1h", "renewBefore": "2h"}}),
        )
        .unwrap();
        assert_eq!(
            Lifetimes::from_spec(Some(&bad)).unwrap_err(),
            "spec.certConfig.client.renewBefore (2h) must be shorter than its duration (1h0m0s)"
        );
        let huge: CdiCertConfig =
            serde_json::from_value(serde_json::json!({"server": {"duration": "100000000h"}}))
                .unwrap();
        assert!(
            Lifetimes::from_spec(Some(&huge))
                .unwrap_err()
                .contains("at most 876000h0m0s")
        );
        let l = Lifetimes::default().server;
        let at = SystemTime::UNIX_EPOCH;
        assert_eq!(l.renew_at(at), at + l.refresh);
        let short = Lifetime {
            lifetime: 2 * HOUR,
            refresh: 12 * HOUR,
        };
        assert_eq!(short.renew_at(at), at + 2 * HOUR * 4 / 5);
        let bad: CdiCertConfig =
            serde_json::from_value(serde_json::json!({"ca": {"duration": "2 days"}})).unwrap();
        assert!(
            Lifetimes::from_spec(Some(&bad))
                .unwrap_err()
                .starts_with("spec.certConfig.ca.duration: \"2 days\" is not a duration")
        );
    }

    #[test]
    fn a_certificate_is_due_when_its_annotations_say_so() {
        let l = Lifetimes::default().ca;
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let v = Validity {
            not_before: start,
            not_after: start + l.lifetime,
        };
        let mut a = anns(&v.annotations());
        a.insert(CERT_CONFIG.into(), l.annotation());
        assert_eq!(due(&a, &l, start + HOUR), None);
        assert_eq!(next_due(&a, &l), Some(start + l.refresh));
        assert!(
            due(&a, &l, start + 25 * HOUR)
                .unwrap()
                .starts_with("past its refresh time")
        );
        assert_eq!(
            due(&a, &l, start + 49 * HOUR).as_deref(),
            Some("already expired")
        );
        // Upstream's test of rotation: notAfter moved to just after notBefore.
        let mut expired = a.clone();
        expired.insert(NOT_AFTER.into(), rfc3339(start + Duration::from_secs(1)));
        assert_eq!(
            due(&expired, &l, start + HOUR).as_deref(),
            Some("already expired")
        );
        // A long refresh still ends at four fifths of the validity.
        let lazy = Lifetime {
            lifetime: l.lifetime,
            refresh: l.lifetime,
        };
        let mut a2 = a.clone();
        a2.insert(CERT_CONFIG.into(), lazy.annotation());
        assert!(
            due(&a2, &lazy, start + 40 * HOUR)
                .unwrap()
                .starts_with("past its latest possible time")
        );
        let mut other = a.clone();
        other.insert(CERT_CONFIG.into(), Lifetimes::default().server.annotation());
        assert!(
            due(&other, &l, start + HOUR)
                .unwrap()
                .starts_with("made for other lifetimes")
        );
        assert_eq!(
            due(&BTreeMap::new(), &l, start).as_deref(),
            Some("missing auth.openshift.io/certificate-not-before")
        );
        let mut garbage = a.clone();
        garbage.insert(NOT_AFTER.into(), "soon".into());
        assert!(due(&garbage, &l, start).unwrap().starts_with("bad "));
    }

    #[test]
    fn a_bundle_keeps_old_cas_until_they_expire_and_targets_follow_it() {
        let now = SystemTime::now();
        let old = Ca::generate("cdi_signer@1", Duration::from_secs(3600)).unwrap();
        let new = Ca::generate("cdi_signer@2", Duration::from_secs(7200)).unwrap();
        let first = bundle("", &old.pair.cert_pem, now);
        assert_eq!(common_names(&first), ["cdi_signer@1"]);
        let second = bundle(&first, &new.pair.cert_pem, now);
        assert_eq!(common_names(&second), ["cdi_signer@2", "cdi_signer@1"]);
        // Publishing again changes nothing.
        assert_eq!(bundle(&second, &new.pair.cert_pem, now), second);
        // Once the old CA expired, it goes.
        let later = now + Duration::from_secs(5400);
        assert_eq!(
            common_names(&bundle(&second, &new.pair.cert_pem, later)),
            ["cdi_signer@2"]
        );
        // Garbage in a published bundle is dropped, not fatal.
        assert_eq!(
            common_names(&bundle("not a cert", &new.pair.cert_pem, now)),
            ["cdi_signer@2"]
        );

        let l = Lifetimes::default().server;
        let cert = old.server_cert(&["cdi-api".into()], l.lifetime).unwrap();
        let mut a = anns(&Validity::of_pem(&cert.cert_pem).unwrap().annotations());
        a.insert(CERT_CONFIG.into(), l.annotation());
        a.insert(ISSUER.into(), "cdi_signer@1".into());
        a.insert(HOSTNAMES.into(), "cdi-api".into());
        let names = ["cdi-api".to_string()];
        let signed = now - Duration::from_secs(3600);
        assert_eq!(target_due(&a, &l, &second, Some(&names), signed, now), None);
        assert_eq!(
            target_due(
                &a,
                &l,
                &bundle("", &new.pair.cert_pem, now),
                Some(&names),
                signed,
                now
            )
            .as_deref(),
            Some("issuer \"cdi_signer@1\" is not in the CA bundle")
        );
        let more = ["10.0.0.1".to_string(), "cdi-api".to_string()];
        assert_eq!(
            target_due(&a, &l, &second, Some(&more), signed, now).as_deref(),
            Some("its hostnames are not 10.0.0.1,cdi-api")
        );
        // The same names in another order are the same names.
        let mut listed = a.clone();
        listed.insert(HOSTNAMES.into(), "10.0.0.1,cdi-api".into());
        assert_eq!(
            target_due(&listed, &l, &second, Some(&more), signed, now),
            None
        );
        // Past its refresh time, it waits for a CA made a moment ago to be out a while.
        let start = Validity::of_pem(&cert.cert_pem).unwrap().not_before;
        let later = start + l.refresh + Duration::from_secs(60);
        let fresh_ca = later - Duration::from_secs(30);
        assert_eq!(
            target_due(&a, &l, &second, Some(&names), fresh_ca, later),
            None
        );
        assert!(
            target_due(&a, &l, &second, Some(&names), signed, later)
                .unwrap()
                .starts_with("past its refresh time")
        );
        // Expired is expired, whatever the CA's age.
        let expired = Validity::of_pem(&cert.cert_pem).unwrap().not_after + Duration::from_secs(60);
        assert_eq!(
            target_due(&a, &l, &second, Some(&names), expired, expired).as_deref(),
            Some("already expired")
        );
    }
}
