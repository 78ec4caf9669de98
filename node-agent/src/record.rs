//! What the store records of each object it keeps (`<hex>.meta`), and how it checks a file
//! against that record.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use wasmless_artifact::{CodeHeader, Digest};

/// What was verified of an object, and the file it was written to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Meta {
    pub(crate) cwasm_sha256: Digest,
    pub(crate) identity: Identity,
    pub(crate) header: CodeHeader,
}

/// The inode as written: a file replaced or changed since differs in one of these (a
/// write or a metadata change sets its ctime, which no one can set back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) ino: u64,
    pub(crate) size: u64,
    pub(crate) ctime: (i64, i64),
}

impl Identity {
    pub(crate) fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            ino: metadata.ino(),
            size: metadata.size(),
            ctime: (metadata.ctime(), metadata.ctime_nsec()),
        }
    }
}

impl Meta {
    pub(crate) fn encode(&self) -> String {
        format!(
            "cwasm-sha256: {}\nino: {}\nsize: {}\nctime: {}.{:09}\n\n{}",
            self.cwasm_sha256,
            self.identity.ino,
            self.identity.size,
            self.identity.ctime.0,
            self.identity.ctime.1,
            self.header.to_lines()
        )
    }

    pub(crate) fn parse(text: &str) -> Option<Self> {
        let (ours, header) = text.split_once("\n\n")?;
        let mut fields = HashMap::new();
        for line in ours.lines() {
            let (key, value) = line.split_once(": ")?;
            fields.insert(key, value);
        }
        let (secs, nanos) = fields.get("ctime")?.split_once('.')?;
        Some(Self {
            cwasm_sha256: fields.get("cwasm-sha256")?.parse().ok()?,
            identity: Identity {
                ino: fields.get("ino")?.parse().ok()?,
                size: fields.get("size")?.parse().ok()?,
                ctime: (secs.parse().ok()?, nanos.parse().ok()?),
            },
            header: CodeHeader::parse(header).ok()?,
        })
    }
}

pub(crate) fn hash_file(file: &File) -> std::io::Result<Digest> {
    let mut hasher = Digest::hasher();
    let mut buffer = vec![0; 1 << 20];
    let mut at = 0;
    loop {
        let read = std::os::unix::fs::FileExt::read_at(file, &mut buffer, at)?;
        if read == 0 {
            return Ok(hasher.finish());
        }
        hasher.update(&buffer[..read]);
        at += read as u64;
    }
}
