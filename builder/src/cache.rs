//! Built modules by source digest: the same source never compiles twice.

use crate::BuildError;
use std::path::{Path, PathBuf};
use wasmless_artifact::Digest;

pub struct BuildCache {
    dir: PathBuf,
}

impl BuildCache {
    pub fn new(cache_dir: &Path) -> Self {
        Self {
            dir: cache_dir.join("modules"),
        }
    }

    fn path(&self, source_digest: &Digest) -> PathBuf {
        self.dir.join(format!("{}.wasm", source_digest.hex()))
    }

    pub fn get(&self, source_digest: &Digest) -> Option<Vec<u8>> {
        std::fs::read(self.path(source_digest)).ok()
    }

    pub fn put(&self, source_digest: &Digest, wasm: &[u8]) -> Result<(), BuildError> {
        let path = self.path(source_digest);
        let error = |source| BuildError::Cache {
            path: path.clone(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(error)?;
        // Renamed into place, so a reader never sees half a module.
        let staging = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::write(&staging, wasm).map_err(error)?;
        std::fs::rename(&staging, &path).map_err(error)
    }
}
