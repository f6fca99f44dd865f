//! What an image's bytes are, and how each format becomes raw: one module per format. A format
//! is added as its module (its magic and its conversion), its [`Format`] (in [`kind`]) and its place in
//! [`probe::probe`]'s order, and its line in `convert`, `converts_at_random` and `streams`
//! below.

use std::path::Path;
use std::sync::Arc;

use crate::convert::{Progress, Tuning};
use crate::error::ImportError;
use crate::sources::RangeReader;
use crate::writer::{Target, WriteStats};

pub mod iso;
pub mod kind;
pub mod probe;
pub mod qcow2;
pub mod qemu;
pub mod raw;

use kind::{Detected, Format};
use probe::PROBE_LEN;

/// What a source read at random holds: its head, and for a fixed-size VHD its footer.
pub(crate) async fn detect(reader: &dyn RangeReader) -> Result<Detected, ImportError> {
    let len = reader.size();
    let head = reader.read_at(0, PROBE_LEN.min(len as usize)).await?;
    Ok(match probe::probe(&head) {
        Detected::Image(Format::Raw)
            if len >= 512 && qemu::vhd_footer(&reader.read_at(len - 512, 512).await?) =>
        {
            Detected::Image(Format::Vhd)
        }
        other => other,
    })
}

/// Convert an image of `format`, read at random, into `target`, refusing one larger than
/// `limit`; returns its virtual size and what was written. The formats qemu-img converts need
/// `local_path`, the file `reader` reads.
pub(crate) async fn convert(
    format: Format,
    reader: Arc<dyn RangeReader>,
    local_path: Option<&Path>,
    target: &Target,
    limit: Option<u64>,
    tuning: Tuning,
    progress: &Progress,
) -> Result<(u64, WriteStats), ImportError> {
    match format {
        Format::Raw | Format::Iso => raw::convert(reader, target, limit, tuning, progress).await,
        Format::Qcow2 => qcow2::convert::convert(reader, target, limit, tuning, progress).await,
        Format::Vmdk | Format::Vdi | Format::Vhd | Format::Vhdx => {
            let len = reader.size();
            qemu::convert(format, local_path, len, target, limit, progress).await
        }
    }
}

/// Whether `format` converts from reads at random without a local copy of the source (so from
/// an HTTP server with ranges, without scratch space).
pub(crate) fn converts_at_random(format: Format) -> bool {
    matches!(format, Format::Raw | Format::Iso | Format::Qcow2)
}

/// Whether `format` is copied from a sequential stream as it arrives ([`raw::copy_stream`]).
/// qcow2 has a conversion of its own for streams ([`qcow2::stream`]); a stream of any other
/// format is spooled to scratch and converted at random.
pub(crate) fn streams(format: Format) -> bool {
    matches!(format, Format::Raw | Format::Iso)
}
