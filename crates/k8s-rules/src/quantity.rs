//! Kubernetes `resource.Quantity`: parsing and canonical formatting in integer arithmetic.
//!
//! Grammar (as apimachinery): `[+-]? digits [. digits] suffix`, where the suffix is a binary SI
//! unit (`Ki`…`Ei`), a decimal SI unit (`n u m "" k M G T P E`) or a decimal exponent (`e3`,
//! `E-2`). Values are kept in nano units, rounded up (away from zero) below one nano as
//! apimachinery does, and may not exceed 2^63-1 in magnitude.

use std::fmt;
use std::str::FromStr;

const NANO: i128 = 1_000_000_000;
/// The largest magnitude a Quantity may have, in nanos (2^63-1 units).
const MAX_NANOS: i128 = i64::MAX as i128 * NANO;

/// How a quantity was written, which decides how it is printed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `Ki`, `Mi`, …: powers of 1024.
    BinarySi,
    /// `m`, `k`, `M`, …: powers of 1000 (and no suffix).
    DecimalSi,
    /// `e3`, `E6`, …: powers of ten.
    DecimalExponent,
}

/// A parsed Kubernetes quantity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    #[error("empty quantity: expected a number with an optional unit, such as 10Gi or 500M")]
    Empty,
    #[error(
        "{input:?} is not a quantity: expected a number with an optional unit (Ki Mi Gi Ti Pi Ei, n u m k M G T P E, or an exponent such as e9), such as 10Gi"
    )]
    Syntax { input: String },
    #[error(
        "{input:?} has an unknown unit {suffix:?}: use Ki Mi Gi Ti Pi Ei, k M G T P E, m, or an exponent such as e9"
    )]
    Suffix { input: String, suffix: String },
    #[error("{input:?} is too large: a quantity may not exceed 2^63-1")]
    TooLarge { input: String },
}

impl Quantity {
    /// A whole number of bytes, printed as plain digits (`DecimalSI`), as CDI writes sizes.
    pub fn from_bytes(bytes: i64) -> Self {
        Quantity {
            nanos: bytes as i128 * NANO,
            format: Format::DecimalSi,
        }
    }

    /// A whole number of bytes printed with binary units where exact (`BinarySI`: `1Gi`), as
    /// `resource.NewQuantity(n, BinarySI)` does.
    pub fn from_bytes_binary(bytes: i64) -> Self {
        Quantity {
            nanos: bytes as i128 * NANO,
            format: Format::BinarySi,
        }
    }

    /// The value rounded up to an integer (away from zero), as apimachinery's `Value()`.
    pub fn value(&self) -> i64 {
        let whole = self.nanos / NANO;
        let rem = self.nanos % NANO;
        // Bounded by MAX_NANOS, so the rounded value always fits.
        (whole + rem.signum()) as i64
    }

    /// The value in milli-units, rounded up, as `MilliValue()`.
    pub fn milli_value(&self) -> i128 {
        let whole = self.nanos / 1_000_000;
        whole + (self.nanos % 1_000_000).signum()
    }

    /// The exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    pub fn format(&self) -> Format {
        self.format
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// The sum, in `self`'s format (`other`'s when `self` is zero), as apimachinery's `Add`.
    pub fn plus(&self, other: &Quantity) -> Quantity {
        Quantity {
            nanos: self.nanos.saturating_add(other.nanos),
            format: if self.is_zero() {
                other.format
            } else {
                self.format
            },
        }
    }
}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.nanos.cmp(&other.nanos))
    }
}

fn ceil_div(n: i128, d: i128) -> i128 {
    // Rounds away from zero, as apimachinery rounds sub-nano precision "up".
    let q = n / d;
    if n % d != 0 { q + n.signum() } else { q }
}

fn pow10(exp: u32) -> Option<i128> {
    10i128.checked_pow(exp)
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        if input.is_empty() {
            return Err(QuantityError::Empty);
        }
        let written = Written::split(input).ok_or_else(|| syntax(input))?;
        let mantissa = written.mantissa(input)?;
        let frac_len = written.frac_digits.len() as i32;
        let (format, nanos) = match binary_power(written.suffix) {
            Some(power) => {
                let scaled =
                    scale_decimal(mantissa, 9 - frac_len).ok_or_else(|| too_large(input))?;
                let nanos = scaled
                    .checked_mul(1i128 << power)
                    .ok_or_else(|| too_large(input))?;
                (Format::BinarySi, nanos)
            }
            None => {
                let (format, exp10) = decimal_suffix(input, written.suffix)?;
                let shift = 9 - frac_len + exp10;
                if mantissa != 0 && shift > 40 {
                    return Err(too_large(input));
                }
                (
                    format,
                    scale_decimal(mantissa, shift).ok_or_else(|| too_large(input))?,
                )
            }
        };
        if nanos > MAX_NANOS {
            return Err(too_large(input));
        }
        let nanos = if written.negative { -nanos } else { nanos };
        // A binary quantity below one unit prints as decimal (apimachinery does the same).
        let format = if format == Format::BinarySi && nanos.abs() < NANO && nanos != 0 {
            Format::DecimalSi
        } else {
            format
        };
        Ok(Quantity { nanos, format })
    }
}

fn syntax(input: &str) -> QuantityError {
    QuantityError::Syntax {
        input: input.to_string(),
    }
}

fn too_large(input: &str) -> QuantityError {
    QuantityError::TooLarge {
        input: input.to_string(),
    }
}

/// A quantity as written, split into its parts: `[+-]? digits [. digits] suffix`.
struct Written<'a> {
    negative: bool,
    int_digits: &'a str,
    frac_digits: &'a str,
    suffix: &'a str,
}

impl<'a> Written<'a> {
    /// The parts of a non-empty `input`; `None` without a digit before the suffix.
    fn split(input: &'a str) -> Option<Written<'a>> {
        let bytes = input.as_bytes();
        let mut pos = 0;
        let negative = match bytes[0] {
            b'-' => {
                pos = 1;
                true
            }
            b'+' => {
                pos = 1;
                false
            }
            _ => false,
        };
        let int_start = pos;
        while pos < bytes.len() && bytes[pos].is_ascii_digit() {
            pos += 1;
        }
        let int_digits = &input[int_start..pos];
        let mut frac_digits = "";
        if pos < bytes.len() && bytes[pos] == b'.' {
            pos += 1;
            let frac_start = pos;
            while pos < bytes.len() && bytes[pos].is_ascii_digit() {
                pos += 1;
            }
            frac_digits = &input[frac_start..pos];
        }
        if int_digits.is_empty() && frac_digits.is_empty() {
            return None;
        }
        Some(Written {
            negative,
            int_digits,
            frac_digits,
            suffix: &input[pos..],
        })
    }

    /// The digits as one integer: the value is mantissa × 10^-(fraction digits). Leading zeros
    /// are dropped so long zero-padded input still parses.
    fn mantissa(&self, input: &str) -> Result<i128, QuantityError> {
        let digits = format!("{}{}", self.int_digits, self.frac_digits);
        let significant = digits.trim_start_matches('0');
        if significant.len() > 30 {
            return Err(too_large(input));
        }
        if significant.is_empty() {
            Ok(0)
        } else {
            significant.parse().map_err(|_| syntax(input))
        }
    }
}

/// The power of two a binary SI suffix stands for (`Ki` is 2^10), if it is one.
fn binary_power(suffix: &str) -> Option<u32> {
    Some(match suffix {
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        "Ti" => 40,
        "Pi" => 50,
        "Ei" => 60,
        _ => return None,
    })
}

/// The format and power of ten of a decimal SI suffix or a decimal exponent (`e3`, `E-2`);
/// anything else is an unknown unit.
fn decimal_suffix(input: &str, suffix: &str) -> Result<(Format, i32), QuantityError> {
    let unknown = || QuantityError::Suffix {
        input: input.to_string(),
        suffix: suffix.to_string(),
    };
    Ok(match suffix {
        "n" => (Format::DecimalSi, -9),
        "u" => (Format::DecimalSi, -6),
        "m" => (Format::DecimalSi, -3),
        "" => (Format::DecimalSi, 0),
        "k" => (Format::DecimalSi, 3),
        "M" => (Format::DecimalSi, 6),
        "G" => (Format::DecimalSi, 9),
        "T" => (Format::DecimalSi, 12),
        "P" => (Format::DecimalSi, 15),
        "E" => (Format::DecimalSi, 18),
        s if s.starts_with(['e', 'E']) => {
            let exp = &s[1..];
            let unsigned = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            if unsigned.is_empty() || !unsigned.bytes().all(|b| b.is_ascii_digit()) {
                return Err(unknown());
            }
            let value: i32 = exp.parse().map_err(|_| too_large(input))?;
            (Format::DecimalExponent, value)
        }
        _ => return Err(unknown()),
    })
}

/// `mantissa × 10^shift`, rounding a negative shift up (away from zero).
fn scale_decimal(mantissa: i128, shift: i32) -> Option<i128> {
    if shift >= 0 {
        mantissa.checked_mul(pow10(shift as u32)?)
    } else if -shift > 38 {
        Some(if mantissa == 0 { 0 } else { mantissa.signum() })
    } else {
        Some(ceil_div(mantissa, pow10((-shift) as u32)?))
    }
}

impl fmt::Display for Quantity {
    /// The canonical form apimachinery prints (`String()`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let whole = self.nanos % NANO == 0;
        if self.format == Format::BinarySi && whole && self.nanos.abs() >= 1024 * NANO {
            let mut value = self.nanos / NANO;
            let mut unit = 0;
            while unit < 6 && value % 1024 == 0 {
                value /= 1024;
                unit += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][unit];
            return write!(f, "{value}{suffix}");
        }
        // Decimal: mantissa × 10^exp with exp a multiple of three in [-9, 18].
        let mut mantissa = self.nanos;
        let mut exp: i32 = -9;
        while mantissa % 10 == 0 && exp < 18 {
            mantissa /= 10;
            exp += 1;
        }
        while exp.rem_euclid(3) != 0 {
            mantissa *= 10;
            exp -= 1;
        }
        if self.format == Format::DecimalExponent {
            if exp == 0 {
                write!(f, "{mantissa}")
            } else {
                write!(f, "{mantissa}e{exp}")
            }
        } else {
            let suffix = match exp {
                -9 => "n",
                -6 => "u",
                -3 => "m",
                0 => "",
                3 => "k",
                6 => "M",
                9 => "G",
                12 => "T",
                15 => "P",
                _ => "E",
            };
            write!(f, "{mantissa}{suffix}")
        }
    }
}

impl TryFrom<&k8s_openapi::apimachinery::pkg::api::resource::Quantity> for Quantity {
    type Error = QuantityError;
    fn try_from(
        q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity,
    ) -> Result<Self, Self::Error> {
        q.0.parse()
    }
}

impl From<Quantity> for k8s_openapi::apimachinery::pkg::api::resource::Quantity {
    fn from(q: Quantity) -> Self {
        k8s_openapi::apimachinery::pkg::api::resource::Quantity(q.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn byte_counts_in_either_format() {
        assert_eq!(Quantity::from_bytes(1 << 30).to_string(), "1073741824");
        assert_eq!(Quantity::from_bytes_binary(1 << 30).to_string(), "1Gi");
        assert_eq!(Quantity::from_bytes_binary(64 << 20).to_string(), "64Mi");
        // As apimachinery: below 1024 it prints decimal units; inexact values print digits.
        assert_eq!(Quantity::from_bytes_binary(1000).to_string(), "1k");
        assert_eq!(Quantity::from_bytes_binary(1500).to_string(), "1500");
    }

    #[test]
    fn byte_values() {
        let cases = [
            ("10Gi", 10_737_418_240),
            ("20Gi", 21_474_836_480),
            ("1Mi", 1_048_576),
            ("1.5Gi", 1_610_612_736),
            ("500M", 500_000_000),
            ("1k", 1000),
            ("1e3", 1000),
            ("1E3", 1000),
            ("12e-1", 2),
            ("0.5", 1),
            ("100m", 1),
            ("11381663335", 11_381_663_335),
            ("+7Ki", 7168),
            ("-1Ki", -1024),
            ("0", 0),
            ("0Gi", 0),
            ("007", 7),
            (".5Ki", 512),
            ("1.", 1),
        ];
        for (s, want) in cases {
            assert_eq!(q(s).value(), want, "{s}");
        }
        assert_eq!(q("7Ei").value(), 7 << 60);
    }

    #[test]
    fn canonical_strings_match_apimachinery() {
        let cases = [
            ("10Gi", "10Gi"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("1.5Gi", "1536Mi"),
            ("1000", "1k"),
            ("1500", "1500"),
            ("11381663335", "11381663335"),
            ("0.1", "100m"),
            ("100m", "100m"),
            ("1000m", "1"),
            ("1e3", "1e3"),
            ("1.5e3", "1500"),
            ("1000Ki", "1000Ki"),
            ("512", "512"),
            ("0.5Ki", "512"),
            ("0.5Mi", "512Ki"),
            ("1000000000000000000", "1E"),
            ("1500P", "1500P"),
            ("0.0000000001", "1n"),
            ("0Mi", "0"),
            ("-10Gi", "-10Gi"),
            ("5G", "5G"),
        ];
        for (input, want) in cases {
            assert_eq!(q(input).to_string(), want, "{input}");
        }
        assert_eq!(
            Quantity::from_bytes(10_737_418_240).to_string(),
            "10737418240"
        );
        assert_eq!(
            Quantity::from_bytes(11_381_663_335).to_string(),
            "11381663335"
        );
    }

    #[test]
    fn garbage_is_refused_with_a_clear_error() {
        for bad in [
            "", "Gi", "ten", "1 Gi", "1GB", "1gi", "1.2.3", "--1", "1e", "1ex", "e3", " 1", "1Gi ",
        ] {
            let err = bad.parse::<Quantity>().expect_err(bad);
            let msg = err.to_string();
            assert!(
                msg.contains("quantity") || msg.contains("unit"),
                "{bad}: {msg}"
            );
        }
        assert!(matches!(
            "8Ei".parse::<Quantity>(),
            Err(QuantityError::TooLarge { .. })
        ));
        assert!(matches!(
            "1e40".parse::<Quantity>(),
            Err(QuantityError::TooLarge { .. })
        ));
        assert!(matches!(
            "1GB".parse::<Quantity>(),
            Err(QuantityError::Suffix { .. })
        ));
    }

    proptest! {
        #[test]
        fn binary_multiples_print_and_parse_back(v in 0i64..(1i64 << 33), unit in 0usize..4) {
            let suffix = ["", "Ki", "Mi", "Gi"][unit];
            let text = format!("{v}{suffix}");
            let parsed = q(&text);
            prop_assert_eq!(parsed.value(), v << (10 * unit));
            let printed = parsed.to_string();
            prop_assert_eq!(q(&printed).value(), parsed.value());
        }

        #[test]
        fn decimal_values_round_trip(nanos in -(1i128 << 90)..(1i128 << 90)) {
            let quantity = Quantity { nanos, format: Format::DecimalSi };
            let back = q(&quantity.to_string());
            prop_assert_eq!(back.nanos(), nanos);
        }

        #[test]
        fn parsing_never_panics(s in "[-+]?[0-9.]{0,25}([eE][-+]?[0-9]{0,3}|[KMGTPE]i?|[num]|[a-z]{0,2})") {
            let _ = s.parse::<Quantity>();
        }
    }
}
