//! Any bytes as a local image, imported as `cdi import` would: probed (every format, every
//! compression), converted or refused, never a panic, a hang or an image larger than asked.
#![no_main]

use std::sync::{Arc, OnceLock};

use cdi_importer::convert::{Progress, Tuning};
use cdi_importer::import::{ImportOptions, SizeSpec, TargetSpec, import_file};
use libfuzzer_sys::fuzz_target;

/// Large enough for the seeds, small enough that a lying header cannot fill the disk.
const SIZE: u64 = 64 << 20;

struct World {
    dir: tempfile::TempDir,
    runtime: tokio::runtime::Runtime,
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| World {
        dir: tempfile::tempdir().unwrap(),
        runtime: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap(),
    })
}

fuzz_target!(|data: &[u8]| {
    let w = world();
    let image = w.dir.path().join("image");
    let out = w.dir.path().join("disk.img");
    std::fs::write(&image, data).unwrap();
    let opts = ImportOptions {
        target: TargetSpec::VolumeFile(out.clone()),
        size: Some(SizeSpec {
            requested: SIZE,
            capacity: SIZE,
        }),
        overhead: "0".parse().unwrap(),
        preallocate: false,
        checksum: None,
        scratch_dir: w.dir.path().join("scratch"),
        scratch_mounted: false,
        tuning: Tuning::default(),
    };
    let result = w
        .runtime
        .block_on(import_file(&image, &opts, Arc::new(Progress::default())));
    if result.is_ok() {
        let len = std::fs::metadata(&out).unwrap().len();
        assert!(
            len <= SIZE,
            "an image of {len} bytes for a {SIZE}-byte claim"
        );
    }
    let _ = std::fs::remove_file(&out);
});
