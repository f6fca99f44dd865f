//! `cdi size`: the size math calculator (docs/design.md#the-size-math).

use anyhow::Context as _;
use cdi_core::Quantity;
use cdi_core::size::{self, ClaimApi, Overhead, SizePlan, VolumeMode};

#[derive(clap::Args)]
pub struct SizeArgs {
    /// The size asked for in the DataVolume, as a Kubernetes quantity (10Gi, 500M, 1e9).
    size: String,
    /// Filesystem overhead of the StorageClass (CDIConfig status.filesystemOverhead).
    #[arg(long, default_value = "0.06")]
    overhead: String,
    /// Volume mode of the claim.
    #[arg(long, default_value = "Filesystem", value_parser = ["Filesystem", "Block"])]
    volume_mode: String,
}

pub fn run(args: &SizeArgs) -> anyhow::Result<()> {
    print!("{}", report(args)?);
    Ok(())
}

fn report(args: &SizeArgs) -> anyhow::Result<String> {
    let quantity: Quantity = args.size.parse()?;
    let request = quantity.value();
    if request < size::MIB {
        anyhow::bail!(
            "{} is {request} bytes: a DataVolume must ask for at least 1Mi (upstream refuses smaller sizes)",
            args.size
        );
    }
    let overhead: Overhead = args.overhead.parse()?;
    let mode = size::resolve_volume_mode(Some(&args.volume_mode));
    let storage = size::plan(ClaimApi::Storage, mode, request, overhead).with_context(|| {
        format!(
            "{} with the filesystem overhead {overhead} needs a claim larger than 2^63-1 bytes; ask for less",
            args.size
        )
    })?;
    let pvc = size::plan(ClaimApi::Pvc, mode, request, overhead)
        .context("a spec.pvc claim is the request itself")?;

    let mut out = String::new();
    let shown_overhead = if mode == VolumeMode::Block {
        "none (Block)".to_string()
    } else {
        overhead.to_string()
    };
    out.push_str(&format!(
        "DataVolume size {} = {request} bytes, volume mode {mode}, filesystem overhead {shown_overhead}\n\n",
        args.size
    ));
    out.push_str(&format!(
        "{:<14} {:>30} {:>30}\n",
        "API", "PVC request", "disk image"
    ));
    for (name, p) in [("spec.storage", &storage), ("spec.pvc", &pvc)] {
        out.push_str(&format!(
            "{:<14} {:>30} {:>30}\n",
            name,
            bytes(p.pvc_request),
            bytes(p.disk_image)
        ));
    }
    out.push('\n');
    out.push_str(&verdict("spec.storage", &storage, request));
    out.push_str(&verdict("spec.pvc", &pvc, request));
    Ok(out)
}

fn verdict(name: &str, plan: &SizePlan, request: i64) -> String {
    if plan.disk_image >= request {
        format!("{name}: the disk gets the requested size.\n")
    } else {
        let short = request - plan.disk_image;
        format!(
            "{name}: the disk is {} smaller than requested ({:.2}%); use spec.storage, or ask for more.\n",
            human(short),
            short as f64 * 100.0 / request as f64
        )
    }
}

/// Plain digits, so the figures can be pasted into a manifest or compared with `kubectl get`.
fn bytes(n: i64) -> String {
    format!("{n} B ({})", human(n))
}

fn human(n: i64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64;
    let mut unit = 0;
    value /= 1024.0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(size: &str, overhead: &str, mode: &str) -> SizeArgs {
        SizeArgs {
            size: size.into(),
            overhead: overhead.into(),
            volume_mode: mode.into(),
        }
    }

    #[test]
    fn the_spec_table_for_10gi() {
        let out = report(&args("10Gi", "0.06", "Filesystem")).unwrap();
        assert!(out.contains("11381663335 B (10.60 GiB)"), "{out}");
        assert!(out.contains("10737418240 B (10.00 GiB)"), "{out}");
        assert!(out.contains("10129244160 B (9.43 GiB)"), "{out}");
        assert!(
            out.contains("spec.storage: the disk gets the requested size."),
            "{out}"
        );
        assert!(
            out.contains("spec.pvc: the disk is 580.00 MiB smaller than requested"),
            "{out}"
        );
    }

    #[test]
    fn block_is_not_inflated() {
        let out = report(&args("10Gi", "0.06", "Block")).unwrap();
        assert_eq!(out.matches("10737418240 B").count(), 4, "{out}");
        assert!(out.contains("overhead none (Block)"));
    }

    #[test]
    fn bad_input_names_the_fix() {
        let err = report(&args("10GB", "0.06", "Filesystem"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown unit \"GB\""), "{err}");
        let err = report(&args("10Gi", "6%", "Filesystem"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("such as 0.06"), "{err}");
        let err = report(&args("1Ki", "0.06", "Filesystem"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("at least 1Mi"), "{err}");
    }
}
