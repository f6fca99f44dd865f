//! OCI images built by hand for tests: an image layout directory (what `skopeo copy oci:DIR:TAG`
//! reads, and what an `oci-archive` is a tar of), with layers written entry by entry, so a test
//! can make exactly the image it needs: a disk in a lower layer under a whiteout, two disks, a
//! multi-architecture index.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

pub const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";
pub const LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// One entry of a layer.
#[derive(Debug, Clone)]
pub enum Entry {
    Dir(String),
    File(String, Vec<u8>),
    /// A symbolic link at the first path to the second.
    Link(String, String),
    /// The whiteout hiding this path of lower layers (`dir/.wh.name`).
    Whiteout(String),
    /// The opaque marker of a directory: nothing of it in lower layers shows.
    Opaque(String),
}

/// A layer: its entries in order, compressed with gzip or not.
#[derive(Debug, Clone)]
pub struct Layer {
    pub entries: Vec<Entry>,
    pub gzip: bool,
}

impl Layer {
    pub fn gzip(entries: Vec<Entry>) -> Layer {
        Layer {
            entries,
            gzip: true,
        }
    }

    pub fn tar(entries: Vec<Entry>) -> Layer {
        Layer {
            entries,
            gzip: false,
        }
    }

    /// The usual containerDisk layer: `disk/` and the disk in it.
    pub fn disk(name: &str, data: Vec<u8>) -> Layer {
        Layer::gzip(vec![
            Entry::Dir("disk".into()),
            Entry::File(format!("disk/{name}"), data),
        ])
    }
}

/// An image: its layers bottom first, and what its config says.
#[derive(Debug, Clone)]
pub struct Image {
    pub layers: Vec<Layer>,
    pub architecture: String,
    pub env: Vec<String>,
    pub labels: BTreeMap<String, String>,
}

impl Image {
    pub fn new(layers: Vec<Layer>) -> Image {
        Image {
            layers,
            architecture: "amd64".into(),
            env: Vec::new(),
            labels: BTreeMap::new(),
        }
    }
}

/// A content descriptor.
#[derive(Debug, Clone)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

impl Descriptor {
    fn json(&self) -> Value {
        json!({"mediaType": self.media_type, "digest": self.digest, "size": self.size})
    }
}

/// An OCI image layout directory.
pub struct Layout {
    pub dir: PathBuf,
    tags: Vec<Value>,
}

fn sha256(data: &[u8]) -> String {
    let hex: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

fn layer_tar(entries: &[Entry]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut add = |path: &str, kind: tar::EntryType, data: &[u8], link: Option<&str>| {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(data.len() as u64);
        header.set_mode(if kind == tar::EntryType::Directory {
            0o755
        } else {
            0o644
        });
        header.set_mtime(0);
        if let Some(target) = link {
            header.set_link_name(target).expect("a link target");
        }
        header.set_path(path).expect("a layer path");
        header.set_cksum();
        builder.append(&header, data).expect("a layer entry");
    };
    let whiteout = |path: &str, name: &str| match path.rsplit_once('/') {
        Some((dir, _)) => format!("{dir}/{name}"),
        None => name.to_string(),
    };
    for entry in entries {
        match entry {
            Entry::Dir(path) => add(path, tar::EntryType::Directory, &[], None),
            Entry::File(path, data) => add(path, tar::EntryType::Regular, data, None),
            Entry::Link(path, target) => add(path, tar::EntryType::Symlink, &[], Some(target)),
            Entry::Whiteout(path) => {
                let base = path.rsplit('/').next().unwrap_or(path);
                add(
                    &whiteout(path, &format!(".wh.{base}")),
                    tar::EntryType::Regular,
                    &[],
                    None,
                )
            }
            Entry::Opaque(dir) => add(
                &format!("{dir}/.wh..wh..opq"),
                tar::EntryType::Regular,
                &[],
                None,
            ),
        }
    }
    builder.into_inner().expect("a layer tar")
}

impl Layout {
    /// An empty layout at `dir` (created).
    pub fn new(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).expect("creating the layout");
        std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#)
            .expect("writing oci-layout");
        let layout = Layout {
            dir: dir.to_path_buf(),
            tags: Vec::new(),
        };
        layout.write_index();
        layout
    }

    fn blob(&self, media_type: &str, data: &[u8]) -> Descriptor {
        let digest = sha256(data);
        let hex = digest.trim_start_matches("sha256:");
        std::fs::write(self.dir.join("blobs/sha256").join(hex), data).expect("writing a blob");
        Descriptor {
            media_type: media_type.into(),
            digest,
            size: data.len() as u64,
        }
    }

    /// Write the image's blobs; its manifest's descriptor.
    pub fn add_image(&self, image: &Image) -> Descriptor {
        let mut layers = Vec::new();
        let mut diff_ids = Vec::new();
        for layer in &image.layers {
            let tar = layer_tar(&layer.entries);
            diff_ids.push(sha256(&tar));
            layers.push(if layer.gzip {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
                gz.write_all(&tar).expect("compressing a layer");
                self.blob(LAYER_GZIP, &gz.finish().expect("compressing a layer"))
            } else {
                self.blob(LAYER_TAR, &tar)
            });
        }
        let config = json!({
            "architecture": image.architecture,
            "os": "linux",
            "config": {"Env": image.env, "Labels": image.labels},
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let config = self.blob(CONFIG, config.to_string().as_bytes());
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": config.json(),
            "layers": layers.iter().map(Descriptor::json).collect::<Vec<_>>(),
        });
        self.blob(MANIFEST, manifest.to_string().as_bytes())
    }

    /// An index of images, each `(manifest, architecture)`.
    pub fn add_index(&self, images: &[(Descriptor, &str)]) -> Descriptor {
        let manifests: Vec<Value> = images
            .iter()
            .map(|(d, arch)| {
                let mut v = d.json();
                v["platform"] = json!({"architecture": arch, "os": "linux"});
                v
            })
            .collect();
        let index = json!({"schemaVersion": 2, "mediaType": INDEX, "manifests": manifests});
        self.blob(INDEX, index.to_string().as_bytes())
    }

    /// Name `what` (a manifest or an index) `tag` in the layout.
    pub fn tag(&mut self, tag: &str, what: &Descriptor) {
        let mut v = what.json();
        v["annotations"] = json!({"org.opencontainers.image.ref.name": tag});
        self.tags.push(v);
        self.write_index();
    }

    fn write_index(&self) {
        let index = json!({"schemaVersion": 2, "manifests": self.tags});
        std::fs::write(self.dir.join("index.json"), index.to_string()).expect("writing index.json");
    }

    /// The layout as an `oci-archive` (a tar of the directory).
    pub fn archive(&self) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        builder
            .append_dir_all(".", &self.dir)
            .expect("archiving the layout");
        builder.into_inner().expect("archiving the layout")
    }
}
