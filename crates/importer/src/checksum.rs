//! `algorithm:hex` checksums over the bytes as downloaded.

use md5::Md5;
use sha1::Sha1;
use sha2::{Digest, Sha256, Sha512};

/// An expected checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checksum {
    pub algorithm: Algorithm,
    /// Lower-case hex.
    pub hex: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Algorithm {
    Md5,
    Sha1,
    Sha256,
    Sha512,
}

impl Algorithm {
    fn hex_len(self) -> usize {
        match self {
            Algorithm::Md5 => 32,
            Algorithm::Sha1 => 40,
            Algorithm::Sha256 => 64,
            Algorithm::Sha512 => 128,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Md5 => "md5",
            Algorithm::Sha1 => "sha1",
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha512 => "sha512",
        }
    }
}

/// A checksum string that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "checksum {0:?} is not valid: use algorithm:hex with md5, sha1, sha256 or sha512, such as sha256:9f86d0…"
)]
pub struct ChecksumError(pub String);

impl std::str::FromStr for Checksum {
    type Err = ChecksumError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ChecksumError(s.to_string());
        let (algo, hex) = s.split_once(':').ok_or_else(err)?;
        let algorithm = match algo.to_ascii_lowercase().as_str() {
            "md5" => Algorithm::Md5,
            "sha1" => Algorithm::Sha1,
            "sha256" => Algorithm::Sha256,
            "sha512" => Algorithm::Sha512,
            _ => return Err(err()),
        };
        let hex = hex.to_ascii_lowercase();
        if hex.len() != algorithm.hex_len() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err());
        }
        Ok(Checksum { algorithm, hex })
    }
}

impl std::fmt::Display for Checksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.algorithm.name(), self.hex)
    }
}

/// A running hash.
pub enum Hasher {
    Md5(Md5),
    Sha1(Sha1),
    Sha256(Sha256),
    Sha512(Sha512),
}

impl Hasher {
    pub fn new(algorithm: Algorithm) -> Self {
        match algorithm {
            Algorithm::Md5 => Hasher::Md5(Md5::new()),
            Algorithm::Sha1 => Hasher::Sha1(Sha1::new()),
            Algorithm::Sha256 => Hasher::Sha256(Sha256::new()),
            Algorithm::Sha512 => Hasher::Sha512(Sha512::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Md5(h) => h.update(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
            Hasher::Sha512(h) => h.update(data),
        }
    }

    /// The digest in lower-case hex.
    pub fn finish(self) -> String {
        let bytes: Vec<u8> = match self {
            Hasher::Md5(h) => h.finalize().to_vec(),
            Hasher::Sha1(h) => h.finalize().to_vec(),
            Hasher::Sha256(h) => h.finalize().to_vec(),
            Hasher::Sha512(h) => h.finalize().to_vec(),
        };
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digests() {
        let cases = [
            (Algorithm::Md5, "900150983cd24fb0d6963f7d28e17f72"),
            (Algorithm::Sha1, "a9993e364706816aba3e25717850c26c9cd0d89d"),
            (
                Algorithm::Sha256,
                "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad",
            ),
        ];
        for (algorithm, want) in cases {
            let mut h = Hasher::new(algorithm);
            h.update(b"ab");
            h.update(b"c");
            assert_eq!(h.finish(), want);
        }
    }

    #[test]
    fn parsing() {
        let c: Checksum = "SHA256:BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD"
            .parse()
            .unwrap();
        assert_eq!(c.algorithm, Algorithm::Sha256);
        assert!(c.hex.starts_with("ba7816"));
        for bad in [
            "",
            "sha256",
            "sha256:xyz",
            "crc32:00000000",
            "md5:900150983cd24fb0d6963f7d28e17f7",
        ] {
            assert!(bad.parse::<Checksum>().is_err(), "{bad}");
        }
    }
}
