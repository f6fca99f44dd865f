//! Names derived from other names (`importer-<claim>`, `<claim>-scratch`), kept within what the
//! API server accepts as upstream keeps them (its `naming.GetResourceName`, which is OpenShift's
//! `GetName`): `base-suffix` when it fits, otherwise a truncated base, an 8-digit FNV-1a hash and
//! the suffix, so a 253-character DataVolume still gets a valid importer pod name, and the same
//! one upstream would give it.

/// The longest object name (a DNS-1123 subdomain).
pub const MAX_NAME: usize = 253;
/// The longest label value and Service name (a DNS-1123 / DNS-1035 label).
pub const MAX_LABEL: usize = 63;

/// FNV-1a, 32 bits, as 8 lowercase hex digits.
fn hash(s: &str) -> String {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// The longest prefix of `s` of at most `n` bytes that ends on a character boundary. Names are
/// ASCII when the API server accepted them; this keeps a hostile one from panicking a slice.
pub fn prefix(s: &str, n: usize) -> &str {
    let mut end = n.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `base-suffix`, shortened to at most `max` bytes as upstream shortens it.
pub fn name_with_max(base: &str, suffix: &str, max: usize) -> String {
    if max == 0 {
        return String::new();
    }
    let name = format!("{base}-{suffix}");
    if name.len() <= max {
        return name;
    }
    // Room for the base beside "-<hash>-<suffix>".
    match max.checked_sub(10 + suffix.len()).filter(|n| *n > 0) {
        Some(room) => format!("{}-{}-{suffix}", prefix(base, room), hash(base)),
        // The suffix alone is too long: drop it, keep what fits of the base and a hash of both.
        None => {
            let short = format!("{}-{}", prefix(base, max.saturating_sub(9)), hash(&name));
            prefix(&short, max).to_string()
        }
    }
}

/// `base-suffix` as an object name (upstream's `GetResourceName`).
pub fn resource_name(base: &str, suffix: &str) -> String {
    name_with_max(base, suffix, MAX_NAME)
}

/// A name usable as a label value or Service name (upstream's `GetLabelNameFromResourceName`):
/// dots become dashes, and a name over 63 characters is shortened with a hash.
pub fn label_name(resource_name: &str) -> String {
    let base = resource_name.replace('.', "-");
    if base.len() <= MAX_LABEL {
        return base;
    }
    name_with_max(&base, "cdi", MAX_LABEL)
}

/// An Event's name: `<object>.<suffix>`, as kube's recorder names them (the suffix is the time in
/// hex, or a reason), with the object's name cut so that the whole stays a valid object name: a
/// generateName ending in "." is not one, and a 253-character object would get no events at all.
pub fn event_name(object: &str, suffix: &str) -> String {
    let head = prefix(object, MAX_NAME.saturating_sub(suffix.len() + 1));
    let head = head.trim_end_matches(['-', '.']);
    let head = if head.is_empty() { "event" } else { head };
    format!("{head}.{suffix}")
}

/// Whether `name` is a valid object name (a lowercase RFC 1123 subdomain), so a name read from an
/// annotation anyone can write is used only when the API server could hold such an object.
pub fn is_object_name(name: &str) -> bool {
    name.len() <= MAX_NAME
        && name.split('.').all(|part| {
            let b = part.as_bytes();
            !b.is_empty()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn short_names_are_joined() {
        assert_eq!(resource_name("importer", "disk"), "importer-disk");
        assert_eq!(resource_name("disk", "scratch"), "disk-scratch");
        assert_eq!(label_name("a.b"), "a-b");
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        // FNV-1a 32 of "" and "a", from the algorithm's published test vectors.
        assert_eq!(hash(""), "811c9dc5");
        assert_eq!(hash("a"), "e40c292c");
        assert_eq!(hash("foobar"), "bf9cf968");
    }

    #[test]
    fn a_long_claim_gets_upstreams_importer_name() {
        let claim = "d".repeat(250);
        // The suffix (the claim) leaves no room: "importer-" and a hash of the whole name.
        let name = resource_name("importer", &claim);
        assert_eq!(
            name,
            format!("importer-{}", hash(&format!("importer-{claim}")))
        );
        // A long base with a short suffix keeps the suffix after the hash.
        let scratch = resource_name(&claim, "scratch");
        assert_eq!(scratch.len(), MAX_NAME);
        assert!(scratch.ends_with(&format!("-{}-scratch", hash(&claim))));
        assert!(scratch.starts_with(&format!("{}-", "d".repeat(236))));
    }

    #[test]
    fn object_names() {
        for ok in ["a", "importer-disk", "a.b-c", &"x".repeat(253)] {
            assert!(is_object_name(ok), "{ok}");
        }
        for bad in [
            "",
            "a/b",
            "..",
            ".a",
            "UPPER",
            "-a",
            "a-",
            "a..b",
            &"x".repeat(254),
        ] {
            assert!(!is_object_name(bad), "{bad}");
        }
    }

    #[test]
    fn event_names_are_valid_names() {
        let long = format!("{}-{}", "d".repeat(233), "e".repeat(30));
        let name = event_name(&long, "provisioningfailed");
        assert!(name.len() <= MAX_NAME, "{name}");
        assert!(name.ends_with("d.provisioningfailed"), "{name}");
        assert_eq!(event_name("disk", "abc"), "disk.abc");
        for object in ["disk", &"a".repeat(253), &format!("{}-b", "a".repeat(234))] {
            let name = event_name(object, "18ed1541b3abac4f");
            assert!(is_object_name(&name), "{name}");
        }
    }

    #[test]
    fn long_labels_are_shortened() {
        let l = label_name(&"x.y".repeat(40));
        assert_eq!(l.len(), MAX_LABEL);
        assert!(l.ends_with("-cdi"));
        assert!(!l.contains('.'));
    }

    proptest! {
        #[test]
        fn names_fit_and_differ(base in "[a-z0-9.-]{0,300}", suffix in "[a-z0-9-]{0,300}", other in "[a-z0-9]{1,8}") {
            let n = resource_name(&base, &suffix);
            prop_assert!(n.len() <= MAX_NAME);
            prop_assert!(label_name(&base).len() <= MAX_LABEL);
            // Names that were shortened still tell different inputs apart.
            let m = resource_name(&base, &format!("{suffix}{other}"));
            prop_assert_ne!(n, m);
        }

        #[test]
        fn non_ascii_does_not_panic(base in "\\PC{0,300}", suffix in "\\PC{0,300}", max in 0usize..300) {
            prop_assert!(name_with_max(&base, &suffix, max).len() <= max);
        }
    }
}
