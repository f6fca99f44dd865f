//! Any bytes as a qcow2 image read once, in order (an upload), against the same bytes read at
//! random: the stream may refuse or ask for scratch space where the file converts, but what it
//! converts is byte for byte what the conversion at random gives. Never a panic, a hang, or an
//! image larger than asked.
#![no_main]

use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use cdi_importer::convert::{Progress, Tuning};
use cdi_importer::import::{ImportOptions, SizeSpec, TargetSpec, import, import_file};
use cdi_importer::sources::stream;
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

fn options(w: &World, out: &str) -> ImportOptions {
    ImportOptions {
        target: TargetSpec::VolumeFile(w.dir.path().join(out)),
        size: Some(SizeSpec {
            requested: SIZE,
            capacity: SIZE,
        }),
        overhead: "0".parse().unwrap(),
        preallocate: false,
        checksum: None,
        // As an upload pod without scratch space: the stream converts as it arrives or not at all.
        scratch_dir: w.dir.path().join("no-scratch"),
        scratch_mounted: true,
        tuning: Tuning {
            stream_hold: 4 << 20,
            ..Tuning::default()
        },
    }
}

fuzz_target!(|data: &[u8]| {
    // Only qcow2 images take the streaming conversion.
    if !data.starts_with(b"QFI\xfb") {
        return;
    }
    let w = world();
    let image = w.dir.path().join("image");
    std::fs::write(&image, data).unwrap();
    let bytes = Bytes::copy_from_slice(data);
    let streamed = w.runtime.block_on(async {
        let (feeder, source, _) = stream::channel("the upload", Some(bytes.len() as u64), 4);
        tokio::spawn(async move {
            for at in (0..bytes.len()).step_by(4093) {
                let chunk = bytes.slice(at..(at + 4093).min(bytes.len()));
                if feeder.send(Ok(chunk)).await.is_err() {
                    return;
                }
            }
        });
        import(&source, &options(w, "streamed"), Arc::new(Progress::default())).await
    });
    if streamed.is_err() {
        return;
    }
    let streamed_out = std::fs::read(w.dir.path().join("streamed")).unwrap();
    assert!(streamed_out.len() as u64 <= SIZE);
    let at_random = w.runtime.block_on(import_file(
        &image,
        &options(w, "random"),
        Arc::new(Progress::default()),
    ));
    if let Err(e) = at_random {
        panic!("the stream converted an image the file refuses: {e}");
    }
    let random_out = std::fs::read(w.dir.path().join("random")).unwrap();
    assert!(
        streamed_out == random_out,
        "the stream and the file convert to different bytes"
    );
    let _ = std::fs::remove_file(w.dir.path().join("streamed"));
    let _ = std::fs::remove_file(w.dir.path().join("random"));
});
