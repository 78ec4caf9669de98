//! Where a module's bytes come from — a file, a directory of ConfigMap chunks, the chunk
//! ConfigMaps themselves through the API (a pooled Function), or an OCI registry — and the
//! digest check that every load passes before anything runs.

use crate::configmap_chunks::{self, ChunkFetchError, ConfigMapChunks};
use std::path::{Path, PathBuf};
use wasmless_artifact::{DIGEST_FILE_NAME, Digest, Part, oci::SCHEME as OCI_SCHEME};

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read module {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("directory {dir} holds no chunks (files named {example}, ...)")]
    NoChunks { dir: PathBuf, example: String },
    #[error("chunk directory {dir} is missing chunk {index} (found {found} chunks)")]
    MissingChunk { dir: PathBuf, index: usize, found: usize },
    #[error("module chunks in {dir} do not reassemble: {source}")]
    Chunks {
        /// The chunk directory, or the `configmaps:` source.
        dir: String,
        source: wasmless_artifact::ChunkError,
    },
    #[error("{0} is not a source the runtime can read: {1}")]
    BadSource(String, String),
    #[error("no digest to verify {0} against: pass --module-digest sha256:<hex>")]
    Unpinned(String),
    #[error(transparent)]
    ConfigMaps(#[from] ChunkFetchError),
    #[error("no digest to verify {0} against: pass --module-digest sha256:<hex>, or put the digest in {1}")]
    NoDigest(String, PathBuf),
    #[error("digest file {path} is not a digest: {source}")]
    BadDigestFile {
        path: PathBuf,
        source: wasmless_artifact::DigestError,
    },
    #[error("module digest mismatch: expected {expected}, but {module} has {actual}; refusing to run it")]
    DigestMismatch {
        module: String,
        expected: Digest,
        actual: Digest,
    },
    #[error(transparent)]
    Oci(#[from] crate::oci::OciError),
}

/// A module's location, parsed from `--module`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModuleSource {
    File(PathBuf),
    ChunkDir(PathBuf),
    Oci(String),
    ConfigMaps(ConfigMapChunks),
}

/// A module's verified bytes.
#[derive(Clone)]
pub struct VerifiedModule {
    pub bytes: Vec<u8>,
    pub digest: Digest,
}

impl ModuleSource {
    pub fn parse(text: &str) -> Result<Self, LoadError> {
        if let Some(reference) = text.strip_prefix(OCI_SCHEME) {
            return Ok(Self::Oci(reference.to_string()));
        }
        if let Some(chunks) = text.strip_prefix(configmap_chunks::SCHEME) {
            return ConfigMapChunks::parse(chunks)
                .map(Self::ConfigMaps)
                .map_err(|reason| LoadError::BadSource(text.to_string(), reason));
        }
        let path = PathBuf::from(text);
        Ok(if path.is_dir() {
            Self::ChunkDir(path)
        } else {
            Self::File(path)
        })
    }

    /// The file whose change means a new module, for sources that can change on disk.
    pub fn watched_path(&self) -> Option<&Path> {
        match self {
            Self::File(path) | Self::ChunkDir(path) => Some(path),
            Self::Oci(_) | Self::ConfigMaps(_) => None,
        }
    }

    /// The digest the module must have, when it is known without reading the module:
    /// pinned, or in the digest file beside it. `None` leaves the reason to [`Self::load`].
    pub async fn known_digest(&self, pinned: Option<Digest>) -> Option<Digest> {
        if pinned.is_some() {
            return pinned;
        }
        let digest_file = match self {
            Self::File(path) => sidecar_digest_path(path),
            Self::ChunkDir(dir) => dir.join(DIGEST_FILE_NAME),
            Self::Oci(_) | Self::ConfigMaps(_) => return None,
        };
        tokio::fs::read_to_string(digest_file).await.ok()?.parse().ok()
    }

    /// Reads the module and checks it against `pinned`, or, when nothing is pinned,
    /// against the digest file beside it.
    pub async fn load(&self, pinned: Option<Digest>) -> Result<VerifiedModule, LoadError> {
        let (bytes, expected) = match self {
            Self::File(path) => {
                let bytes = read(path).await?;
                let digest_file = sidecar_digest_path(path);
                (bytes, expected_digest(pinned, &digest_file, path).await?)
            }
            Self::ChunkDir(dir) => {
                let bytes = read_chunk_dir(dir).await?;
                (bytes, expected_digest(pinned, &dir.join(DIGEST_FILE_NAME), dir).await?)
            }
            Self::Oci(reference) => crate::oci::pull(reference, pinned).await?,
            Self::ConfigMaps(chunks) => {
                // Nothing beside the chunks holds a digest: the pin is the only one.
                let expected = pinned.ok_or_else(|| LoadError::Unpinned(self.to_string()))?;
                (
                    reassemble_chunks(&self.to_string(), &chunks.fetch(Part::Module).await?)?,
                    expected,
                )
            }
        };
        let actual = Digest::of(&bytes);
        if actual != expected {
            return Err(LoadError::DigestMismatch {
                module: self.to_string(),
                expected,
                actual,
            });
        }
        Ok(VerifiedModule { bytes, digest: actual })
    }
}

impl std::fmt::Display for ModuleSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::File(path) | Self::ChunkDir(path) => write!(f, "{}", path.display()),
            Self::Oci(reference) => write!(f, "{OCI_SCHEME}{reference}"),
            Self::ConfigMaps(chunks) => write!(f, "{chunks}"),
        }
    }
}

fn sidecar_digest_path(module: &Path) -> PathBuf {
    let mut name = module.file_name().unwrap_or_default().to_os_string();
    name.push(".sha256");
    module.with_file_name(name)
}

async fn expected_digest(pinned: Option<Digest>, digest_file: &Path, module: &Path) -> Result<Digest, LoadError> {
    if let Some(digest) = pinned {
        return Ok(digest);
    }
    match tokio::fs::read_to_string(digest_file).await {
        Ok(text) => text.parse().map_err(|source| LoadError::BadDigestFile {
            path: digest_file.to_path_buf(),
            source,
        }),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(LoadError::NoDigest(
            module.display().to_string(),
            digest_file.to_path_buf(),
        )),
        Err(source) => Err(LoadError::Read {
            path: digest_file.to_path_buf(),
            source,
        }),
    }
}

pub(crate) async fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    tokio::fs::read(path).await.map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads `0000.wasm.zst`, `0001.wasm.zst`, ... in index order and decompresses them.
async fn read_chunk_dir(dir: &Path) -> Result<Vec<u8>, LoadError> {
    let chunks = read_chunk_files(dir, Part::Module).await?;
    reassemble_chunks(&dir.display().to_string(), &chunks)
}

/// A module's chunks, from a directory or from the API, back to its bytes (the digest is
/// checked by the caller, [`ModuleSource::load`], for every source alike).
fn reassemble_chunks(origin: &str, chunks: &[Vec<u8>]) -> Result<Vec<u8>, LoadError> {
    wasmless_artifact::reassemble(chunks).map_err(|source| LoadError::Chunks {
        dir: origin.to_string(),
        source,
    })
}

/// The chunk files of `part` in `dir` (`0000.wasm.zst`, ... or `0000.cwasm.lz4`, ...), in
/// index order, as stored. Other entries (a ConfigMap volume's `..data` links, the digest
/// file, the other part's chunks) are ignored.
pub(crate) async fn read_chunk_files(dir: &Path, part: Part) -> Result<Vec<Vec<u8>>, LoadError> {
    let mut chunks = Vec::new();
    for path in chunk_file_paths(dir, part).await? {
        chunks.push(read(&path).await?);
    }
    Ok(chunks)
}

/// The paths of [`read_chunk_files`], checked to run from index 0 without a gap.
pub(crate) async fn chunk_file_paths(dir: &Path, part: Part) -> Result<Vec<PathBuf>, LoadError> {
    let read_error = |source| LoadError::Read {
        path: dir.to_path_buf(),
        source,
    };
    let mut indexed = Vec::new();
    let mut entries = tokio::fs::read_dir(dir).await.map_err(read_error)?;
    while let Some(entry) = entries.next_entry().await.map_err(read_error)? {
        if let Some(index) = entry
            .file_name()
            .to_str()
            .and_then(|name| part.parse_chunk_file_name(name))
        {
            indexed.push((index, entry.path()));
        }
    }
    if indexed.is_empty() {
        return Err(LoadError::NoChunks {
            dir: dir.to_path_buf(),
            example: part.chunk_file_name(0),
        });
    }
    indexed.sort();
    let found = indexed.len();
    let mut paths = Vec::with_capacity(found);
    for (expected_index, (index, path)) in indexed.into_iter().enumerate() {
        if index != expected_index {
            return Err(LoadError::MissingChunk {
                dir: dir.to_path_buf(),
                index: expected_index,
                found,
            });
        }
        paths.push(path);
    }
    Ok(paths)
}
