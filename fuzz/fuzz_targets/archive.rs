//! Any bytes as an archive source (`contentType: archive`): unpacked below its directory or
//! refused, never a file outside it.
#![no_main]

use std::sync::{Arc, OnceLock};

use cdi_importer::archive::unpack;
use cdi_importer::convert::Progress;
use cdi_importer::sources::file::FileSource;
use libfuzzer_sys::fuzz_target;

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
    let archive = w.dir.path().join("archive");
    let into = w.dir.path().join("volume");
    std::fs::write(&archive, data).unwrap();
    std::fs::create_dir_all(&into).unwrap();
    let _ = w.runtime.block_on(unpack(
        &FileSource::new(&archive),
        &into,
        16 << 20,
        None,
        Arc::new(Progress::default()),
    ));
    // Nothing lands beside the volume.
    let beside: Vec<_> = std::fs::read_dir(w.dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(beside.len() <= 2, "{beside:?}");
    let _ = std::fs::remove_dir_all(&into);
});
