//! The size math (docs/design.md#the-size-math), byte for byte as upstream CDI.
//!
//! Upstream evaluates `request × (1 + overhead)` and `available ÷ (1 + overhead)` in IEEE
//! double precision and rounds up. For some overheads that differs from exact decimal arithmetic
//! by a byte, and upstream's answer is the compatible one, so these functions use `f64` on
//! purpose, in the same order of operations as upstream.

use std::fmt;
use std::str::FromStr;

/// Disk images are aligned to 1 MiB, a multiple of every hardware block size.
pub const MIB: i64 = 1024 * 1024;

/// The filesystem overhead upstream assumes when CDIConfig says nothing.
pub const DEFAULT_OVERHEAD: Overhead = Overhead { thousandths: 60 };

/// A filesystem overhead fraction in `[0, 1]` with at most three decimals (upstream's `Percent`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Overhead {
    thousandths: u16,
}

/// A string that is not a valid overhead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "filesystem overhead {0:?} is not valid: use a fraction between 0 and 1 with at most three decimals, such as 0.06 or 0.055"
)]
pub struct OverheadError(pub String);

impl Overhead {
    pub const ZERO: Overhead = Overhead { thousandths: 0 };

    /// The overhead that applies to a volume of `mode`: a Block volume has no filesystem, so none.
    pub fn for_mode(self, mode: VolumeMode) -> Overhead {
        match mode {
            VolumeMode::Block => Overhead::ZERO,
            VolumeMode::Filesystem => self,
        }
    }

    /// From thousandths (`60` is `0.06`); `None` above 1000.
    pub const fn from_thousandths(thousandths: u16) -> Option<Overhead> {
        if thousandths <= 1000 {
            Some(Overhead { thousandths })
        } else {
            None
        }
    }

    pub const fn thousandths(self) -> u16 {
        self.thousandths
    }

    /// The value as upstream holds it after `strconv.ParseFloat`: the double nearest to the
    /// decimal (a correctly rounded division gives exactly that double).
    pub fn as_f64(self) -> f64 {
        f64::from(self.thousandths) / 1000.0
    }
}

impl FromStr for Overhead {
    type Err = OverheadError;

    /// Accepts exactly upstream's `Percent` pattern `^(0(?:\.\d{1,3})?|1)$`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || OverheadError(s.to_string());
        if s == "1" {
            return Ok(Overhead { thousandths: 1000 });
        }
        let rest = s.strip_prefix('0').ok_or_else(err)?;
        if rest.is_empty() {
            return Ok(Overhead::ZERO);
        }
        let decimals = rest.strip_prefix('.').ok_or_else(err)?;
        if decimals.is_empty()
            || decimals.len() > 3
            || !decimals.bytes().all(|b| b.is_ascii_digit())
        {
            return Err(err());
        }
        let padded = format!("{decimals:0<3}");
        Ok(Overhead {
            thousandths: padded.parse().map_err(|_| err())?,
        })
    }
}

impl fmt::Display for Overhead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.thousandths {
            0 => f.write_str("0"),
            1000 => f.write_str("1"),
            t => {
                let digits = format!("{t:03}");
                write!(f, "0.{}", digits.trim_end_matches('0'))
            }
        }
    }
}

/// `n` rounded down to a multiple of `multiple` (integer division, as upstream).
pub fn round_down(n: i64, multiple: i64) -> i64 {
    n / multiple * multiple
}

/// A byte count computed through `f64`, if it is one an `i64` holds (2^63 itself is not).
fn whole_bytes(v: f64) -> Option<i64> {
    (0.0..9_223_372_036_854_775_808.0)
        .contains(&v)
        .then_some(v as i64)
}

/// `n` rounded up to a multiple of `multiple`, computed through `f64` as upstream does; `None`
/// past 2^63-1 (a request near the largest quantity).
pub fn round_up(n: i64, multiple: i64) -> Option<i64> {
    let units = ((n as f64) / (multiple as f64)).ceil() as i64;
    units.checked_mul(multiple)
}

/// The PVC request for a `spec.storage` Filesystem volume of `request` bytes:
/// `ceil(roundUp(request, MiB) × (1 + overhead))`; `None` when that is past 2^63-1.
pub fn required_space(request: i64, overhead: Overhead) -> Option<i64> {
    let aligned = round_up(request, MIB)?;
    whole_bytes(((aligned as f64) * (1.0 + overhead.as_f64())).ceil())
}

/// The disk image size the importer creates on a Filesystem volume of `available` bytes:
/// `roundDown(ceil(available ÷ (1 + overhead)), MiB)`.
pub fn usable_space(available: i64, overhead: Overhead) -> i64 {
    let without_overhead = ((available as f64) / (1.0 + overhead.as_f64())).ceil() as i64;
    round_down(without_overhead, MIB)
}

pub use cdi_api::VolumeMode;

/// What a volume of `bytes` holds for a disk image: all of a Block volume, the usable space of a
/// Filesystem one.
pub fn image_space(mode: VolumeMode, bytes: i64, overhead: Overhead) -> i64 {
    match mode {
        VolumeMode::Block => bytes,
        VolumeMode::Filesystem => usable_space(bytes, overhead),
    }
}

/// Upstream's `ResolveVolumeMode`: only an explicit `Block` is Block; unset is Filesystem.
pub fn resolve_volume_mode(mode: Option<&str>) -> VolumeMode {
    if mode == Some("Block") {
        VolumeMode::Block
    } else {
        VolumeMode::Filesystem
    }
}

/// The size the importer grows the image to: on a Filesystem volume
/// `min(usable(min(capacity, requested)), requested)`; on a Block volume the device size.
pub fn resize_target(mode: VolumeMode, capacity: i64, requested: i64, overhead: Overhead) -> i64 {
    match mode {
        VolumeMode::Block => capacity,
        VolumeMode::Filesystem => usable_space(capacity.min(requested), overhead).min(requested),
    }
}

/// Which DataVolume API a size was requested through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimApi {
    /// `spec.storage`: CDI inflates the claim so the disk gets the requested size.
    Storage,
    /// `spec.pvc`: the claim is used verbatim; the disk is smaller by the overhead.
    Pvc,
}

/// What one DataVolume request turns into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SizePlan {
    pub api: ClaimApi,
    pub mode: VolumeMode,
    /// The claim's `resources.requests.storage`, in bytes.
    pub pvc_request: i64,
    /// The disk image the importer writes, assuming the volume's capacity equals the request.
    pub disk_image: i64,
}

/// The claim and disk sizes for `request` bytes through `api` (capacity assumed equal to the
/// request, as provisioners that honour requests exactly give); `None` when the claim would have
/// to ask for more than a quantity holds (2^63-1 bytes).
pub fn plan(api: ClaimApi, mode: VolumeMode, request: i64, overhead: Overhead) -> Option<SizePlan> {
    let overhead = overhead.for_mode(mode);
    let pvc_request = match (api, mode) {
        (ClaimApi::Storage, VolumeMode::Filesystem) => required_space(request, overhead)?,
        _ => request,
    };
    let disk_image = resize_target(mode, pvc_request, pvc_request, overhead);
    Some(SizePlan {
        api,
        mode,
        pvc_request,
        disk_image,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const GI: i64 = 1 << 30;

    fn oh(s: &str) -> Overhead {
        s.parse().unwrap()
    }

    #[test]
    fn spec_table() {
        let storage = plan(
            ClaimApi::Storage,
            VolumeMode::Filesystem,
            10 * GI,
            DEFAULT_OVERHEAD,
        )
        .unwrap();
        assert_eq!(
            (storage.pvc_request, storage.disk_image),
            (11_381_663_335, 10_737_418_240)
        );
        let pvc = plan(
            ClaimApi::Pvc,
            VolumeMode::Filesystem,
            10 * GI,
            DEFAULT_OVERHEAD,
        )
        .unwrap();
        assert_eq!(
            (pvc.pvc_request, pvc.disk_image),
            (10_737_418_240, 10_129_244_160)
        );
        for api in [ClaimApi::Storage, ClaimApi::Pvc] {
            let block = plan(api, VolumeMode::Block, 10 * GI, DEFAULT_OVERHEAD).unwrap();
            assert_eq!((block.pvc_request, block.disk_image), (10 * GI, 10 * GI));
        }
    }

    #[test]
    fn block_volumes_have_no_overhead() {
        assert_eq!(oh("0.06").for_mode(VolumeMode::Block), Overhead::ZERO);
        assert_eq!(oh("0.06").for_mode(VolumeMode::Filesystem), oh("0.06"));
    }

    #[test]
    fn upstream_worked_numbers() {
        assert_eq!(required_space(GI, oh("0.06")), Some(1_138_166_334));
        assert_eq!(required_space(GI, oh("0.055")), Some(1_132_797_625));
        assert_eq!(required_space(GI, oh("0")), Some(GI));
        assert_eq!(round_up(1_073_741_825, MIB), Some(1_074_790_400));
    }

    /// Requests near the largest quantity: no overflow, `None` where the claim cannot be asked.
    #[test]
    fn requests_past_what_a_quantity_holds_are_none() {
        assert_eq!(round_up(i64::MAX, MIB), None);
        assert_eq!(required_space(i64::MAX, oh("0")), None);
        assert_eq!(required_space(i64::MAX / 2, oh("1")), None);
        assert!(required_space(i64::MAX / 4, oh("0.06")).is_some());
        assert!(
            plan(
                ClaimApi::Storage,
                VolumeMode::Filesystem,
                i64::MAX,
                oh("0.06")
            )
            .is_none()
        );
        // Without inflation, any quantity is a claim.
        assert!(plan(ClaimApi::Pvc, VolumeMode::Filesystem, i64::MAX, oh("0.06")).is_some());
        assert!(plan(ClaimApi::Storage, VolumeMode::Block, i64::MAX, oh("0.06")).is_some());
        assert_eq!(usable_space(11_381_663_335, oh("0.06")), 10 * GI);
    }

    #[test]
    fn overhead_accepts_exactly_the_percent_pattern() {
        for (s, t) in [
            ("0", 0),
            ("1", 1000),
            ("0.06", 60),
            ("0.055", 55),
            ("0.1", 100),
            ("0.000", 0),
            ("0.999", 999),
        ] {
            assert_eq!(oh(s).thousandths(), t, "{s}");
        }
        for bad in [
            "", "1.0", "0.0601", ".06", "0.", "6%", "-0.1", "2", "0,06", "00.1",
        ] {
            let err = bad.parse::<Overhead>().expect_err(bad);
            assert!(err.to_string().contains("between 0 and 1"), "{bad}");
        }
        assert_eq!(oh("0.060").to_string(), "0.06");
        assert_eq!(oh("0.055").to_string(), "0.055");
        assert_eq!(Overhead::from_thousandths(1000).unwrap().to_string(), "1");
        assert_eq!(oh("0.06").as_f64(), "0.06".parse::<f64>().unwrap());
    }

    /// An independent model of upstream's float64 evaluation: the exact product or quotient of
    /// integers and the double `1 + overhead`, rounded to 53 bits (nearest, ties to even) in
    /// integer arithmetic, then ceiled. It shares no floating-point code with the functions
    /// under test.
    mod ieee {
        /// A positive double as `m × 2^e` with `m < 2^53`.
        fn decompose(x: f64) -> (u128, i32) {
            let bits = x.to_bits();
            let exp = ((bits >> 52) & 0x7ff) as i32;
            let frac = (bits & ((1 << 52) - 1)) as u128;
            assert!(exp != 0, "normal doubles only");
            (frac | (1 << 52), exp - 1075)
        }

        /// Round `n × 2^e` (n > 0 exact, `sticky` = a non-zero remainder lies below) to 53
        /// significant bits and return `ceil` of the rounded value.
        fn round_then_ceil(n: u128, e: i32, sticky: bool) -> i128 {
            let bits = 128 - n.leading_zeros() as i32;
            let (mut m, mut e) = (n, e);
            if bits > 53 {
                let drop = bits - 53;
                let half = 1u128 << (drop - 1);
                let rest = m & ((1u128 << drop) - 1);
                m >>= drop;
                e += drop;
                let above_half = rest > half || (rest == half && sticky);
                if above_half || (rest == half && !sticky && m & 1 == 1) {
                    m += 1;
                }
            }
            // ceil(m × 2^e)
            if e >= 0 {
                (m << e) as i128
            } else {
                let shift = -e;
                if shift >= 128 {
                    return if m == 0 { 0 } else { 1 };
                }
                let whole = m >> shift;
                let frac = m & ((1u128 << shift) - 1);
                (whole + u128::from(frac != 0)) as i128
            }
        }

        /// ceil(fl(a × f)) for an integer `a` exactly representable as a double.
        pub fn mul_ceil(a: i64, f: f64) -> i128 {
            let (m, e) = decompose(f);
            round_then_ceil(a as u128 * m, e, false)
        }

        /// ceil(fl(a ÷ f)).
        pub fn div_ceil(a: i64, f: f64) -> i128 {
            let (m, e) = decompose(f);
            // a / (m·2^e) = (a·2^s / m) · 2^(-e-s); s large enough for 55+ quotient bits.
            let s = 60i32;
            let num = (a as u128) << s;
            let q = num / m;
            let r = num % m;
            round_then_ceil(q, -e - s, r != 0)
        }
    }

    fn model_required(request: i64, overhead: Overhead) -> i64 {
        let aligned = (request as u64).div_ceil(MIB as u64) as i64 * MIB;
        ieee::mul_ceil(aligned, 1.0 + overhead.as_f64()) as i64
    }

    fn model_usable(available: i64, overhead: Overhead) -> i64 {
        let v = ieee::div_ceil(available, 1.0 + overhead.as_f64()) as i64;
        v / MIB * MIB
    }

    /// Exact decimal arithmetic, for comparison: what a careful reimplementation without
    /// floating point would compute.
    fn exact_required(request: i64, overhead: Overhead) -> i64 {
        let aligned = (request as u64).div_ceil(MIB as u64) as i64 * MIB;
        let t = i128::from(overhead.thousandths());
        ((aligned as i128 * (1000 + t)) as u128).div_ceil(1000) as i64
    }

    fn overheads() -> impl Strategy<Value = Overhead> {
        (0u16..=1000).prop_map(|t| Overhead::from_thousandths(t).unwrap())
    }

    // Sizes below 2^47 (128 TiB): all values and intermediates stay exact in a double where
    // upstream's Go code assumes it, and the model's shifts cannot overflow.
    const MAX: i64 = 1 << 47;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        #[test]
        fn required_matches_the_float64_model(request in 1i64..MAX, overhead in overheads()) {
            prop_assert_eq!(required_space(request, overhead), Some(model_required(request, overhead)));
        }

        #[test]
        fn usable_matches_the_float64_model(available in 1i64..MAX, overhead in overheads()) {
            prop_assert_eq!(usable_space(available, overhead), model_usable(available, overhead));
        }

        #[test]
        fn float64_and_exact_decimal_differ_by_at_most_a_byte(request in 1i64..MAX, overhead in overheads()) {
            let diff = required_space(request, overhead).unwrap() - exact_required(request, overhead);
            prop_assert!((-1..=1).contains(&diff), "diff {}", diff);
        }

        #[test]
        fn storage_api_never_yields_a_smaller_disk(request in MIB..MAX, overhead in overheads()) {
            let p = plan(ClaimApi::Storage, VolumeMode::Filesystem, request, overhead).unwrap();
            prop_assert!(p.disk_image >= request, "{} < {}", p.disk_image, request);
            prop_assert!(p.pvc_request >= request);
        }

        #[test]
        fn resize_never_exceeds_request_or_capacity(cap in MIB..MAX, req in MIB..MAX, overhead in overheads()) {
            let t = resize_target(VolumeMode::Filesystem, cap, req, overhead);
            prop_assert!(t <= req && t <= cap && t % MIB == 0);
        }
    }

    #[test]
    fn float64_differs_from_exact_decimal_for_some_inputs() {
        // The reason the float64 model exists: find inputs where upstream's double arithmetic
        // and exact decimals disagree, and check we follow upstream there.
        let mut found = None;
        'search: for t in 1..=1000u16 {
            let overhead = Overhead::from_thousandths(t).unwrap();
            for mib in 1..4096i64 {
                let request = mib * MIB;
                if required_space(request, overhead) != Some(exact_required(request, overhead)) {
                    found = Some((request, overhead));
                    break 'search;
                }
            }
        }
        let (request, overhead) = found.expect("some input where float64 and exact decimal differ");
        assert_eq!(
            required_space(request, overhead),
            Some(model_required(request, overhead))
        );
    }
}
