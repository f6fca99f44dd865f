//! Whose a claim is: the DataVolume's own (made for it, adopted, marked populated for it), or
//! someone else's. Upstream's ownership rules, decided once.

use cdi_api::config::CDIConfig;
use cdi_api::datavolume::DataVolume;
use cdi_api::{ann, gate};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The claim holds the DataVolume's data already: marked populated for it, or the DataVolume
/// says its claim is pre-populated.
pub fn populated_for(claim: &PersistentVolumeClaim, dv: &DataVolume) -> bool {
    let name = dv.metadata.name.as_deref().unwrap_or("");
    annotation(&claim.metadata, ann::POPULATED_FOR) == Some(name)
        || annotation(&dv.metadata, ann::PRE_POPULATED).is_some()
}

/// Upstream's `AllowClaimAdoption`: an existing claim not made for this DataVolume is taken over
/// when the DataVolume says `allowClaimAdoption: "true"`, or, without that annotation, when the
/// `DataVolumeClaimAdoption` gate is on.
pub fn adoptable(claim: &PersistentVolumeClaim, dv: &DataVolume, cfg: Option<&CDIConfig>) -> bool {
    // Made for this very DataVolume (a DataVolume not yet created has no uid: none is).
    if let Some(made_for) = annotation(&claim.metadata, ann::CREATED_FOR_DATA_VOLUME)
        && Some(made_for) == dv.metadata.uid.as_deref()
    {
        return false;
    }
    match annotation(&dv.metadata, ann::ALLOW_CLAIM_ADOPTION) {
        Some(v) => matches!(v, "1" | "t" | "T" | "true" | "TRUE" | "True"),
        None => cfg.is_some_and(|c| c.spec.gate_enabled(gate::DATA_VOLUME_CLAIM_ADOPTION)),
    }
}

/// The claim has an owner reference to this DataVolume (this one: by uid).
pub fn owned_by(claim: &PersistentVolumeClaim, dv: &DataVolume) -> bool {
    claim
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| Some(&o.uid) == dv.metadata.uid.as_ref())
}

/// Whether the DataVolume's claim exists (its own, or populated for it). The source is judged
/// until then; an edit after that changes nothing (upstream refuses it at admission) and must not
/// fail a DataVolume whose claim is fine.
pub fn claim_made_for(claim: Option<&PersistentVolumeClaim>, dv: &DataVolume) -> bool {
    claim.is_some_and(|c| owned_by(c, dv) || populated_for(c, dv))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dv(annotations: serde_json::Value) -> DataVolume {
        serde_json::from_value(json!({
            "apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume",
            "metadata": {"name": "d", "namespace": "n", "uid": "u1", "annotations": annotations},
            // Edited after the claim was made: no longer a source cdi-rs takes.
            "spec": {"source": {"http": {"url": "ftp://x/y"}}}}))
        .unwrap()
    }

    fn claim(meta: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({"metadata": meta})).unwrap()
    }

    fn owner(uid: &str) -> serde_json::Value {
        json!([{"apiVersion": "cdi.kubevirt.io/v1beta1", "kind": "DataVolume", "name": "d",
            "uid": uid, "controller": true}])
    }

    #[test]
    fn the_source_is_judged_only_until_the_claim_is_made() {
        let d = dv(json!({}));
        assert!(crate::source::check(&d).is_err());
        let own = claim(json!({"name": "d", "ownerReferences": owner("u1")}));
        let populated = claim(json!({"name": "d", "annotations": {ann::POPULATED_FOR: "d"}}));
        let other = claim(json!({"name": "d", "ownerReferences": owner("u0")}));
        assert!(claim_made_for(Some(&own), &d));
        assert!(claim_made_for(Some(&populated), &d));
        assert!(!claim_made_for(Some(&other), &d));
        assert!(!claim_made_for(None, &d));
        assert!(owned_by(&own, &d) && !owned_by(&other, &d));
    }

    #[test]
    fn adoption_as_upstream_decides_it() {
        let gate_on: CDIConfig = serde_json::from_value(json!({
            "metadata": {"name": "config"},
            "spec": {"featureGates": [gate::DATA_VOLUME_CLAIM_ADOPTION]}}))
        .unwrap();
        let foreign = claim(json!({"name": "d"}));
        let made_for_it = claim(json!({"name": "d",
            "annotations": {ann::CREATED_FOR_DATA_VOLUME: "u1"}}));
        // (DataVolume annotation, gate on, claim, adoptable)
        let cases = [
            (json!({}), false, &foreign, false),
            (json!({}), true, &foreign, true),
            (
                json!({ann::ALLOW_CLAIM_ADOPTION: "true"}),
                false,
                &foreign,
                true,
            ),
            (
                json!({ann::ALLOW_CLAIM_ADOPTION: "T"}),
                false,
                &foreign,
                true,
            ),
            (
                json!({ann::ALLOW_CLAIM_ADOPTION: "false"}),
                true,
                &foreign,
                false,
            ),
            (
                json!({ann::ALLOW_CLAIM_ADOPTION: "yes"}),
                true,
                &foreign,
                false,
            ),
            (
                json!({ann::ALLOW_CLAIM_ADOPTION: "true"}),
                true,
                &made_for_it,
                false,
            ),
        ];
        for (anns, gate, c, want) in cases {
            let d = dv(anns.clone());
            let cfg = gate.then_some(&gate_on);
            assert_eq!(adoptable(c, &d, cfg), want, "{anns} gate={gate}");
        }
        let pre = dv(json!({ann::PRE_POPULATED: "d"}));
        assert!(populated_for(&foreign, &pre));
        assert!(!populated_for(&foreign, &dv(json!({}))));
    }
}
