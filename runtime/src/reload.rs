//! Swapping in a module replaced on disk (a ConfigMap volume update, a `wasmless dev`
//! rebuild) without a restart: requests in flight finish on the module they started
//! with, the next ones get the new one, and a module that fails to load or verify
//! leaves the old one serving.

use crate::tenant::Tenant;
use std::hash::{Hash, Hasher};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wasmless_artifact::Digest;
use wasmless_host::module_source::{LoadError, ModuleSource, VerifiedModule};

const SETTLE_TIME: Duration = Duration::from_millis(200);

pub async fn watch(interval: Duration, tenant: Arc<Tenant>) {
    let (source, pinned) = (&tenant.source, tenant.pinned);
    let Some(path) = source.watched_path().map(Path::to_path_buf) else {
        return;
    };
    let mut last = fingerprint(&path);
    loop {
        tokio::time::sleep(interval).await;
        let now = fingerprint(&path);
        if now == last {
            continue;
        }
        last = now;
        let module = match load_settled(source, pinned).await {
            Ok(module) => module,
            Err(error) => {
                tracing::warn!(%error, "module changed on disk but cannot be used; still serving the previous one");
                continue;
            }
        };
        if tenant
            .handler
            .load()
            .as_ref()
            .is_some_and(|handler| handler.digest == module.digest)
        {
            continue;
        }
        match tenant.loader.load(module).await {
            Ok(handler) => {
                let digest = handler.digest;
                tenant.handler.store(Some(Arc::new(handler)));
                tracing::info!(%digest, "swapped in the module replaced on disk");
            }
            Err(error) => {
                tracing::warn!(%error, "module changed on disk but does not load; still serving the previous one")
            }
        }
    }
}

/// A module and its digest file are two files written one after the other: a digest
/// mismatch gets one more look once the writer is likely done.
async fn load_settled(source: &ModuleSource, pinned: Option<Digest>) -> Result<VerifiedModule, LoadError> {
    match source.load(pinned).await {
        Err(LoadError::DigestMismatch { .. }) => {
            tokio::time::sleep(SETTLE_TIME).await;
            source.load(pinned).await
        }
        other => other,
    }
}

/// Changes whenever the module, its digest file, or a chunk directory's entries change
/// (ConfigMap volumes swap a `..data` symlink, which changes what every entry resolves to).
fn fingerprint(path: &Path) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let mut stamp = |path: &Path| {
        path.hash(&mut hasher);
        if let Ok(meta) = std::fs::metadata(path) {
            use std::os::unix::fs::MetadataExt;
            (meta.len(), meta.mtime(), meta.mtime_nsec(), meta.ino()).hash(&mut hasher);
        }
    };
    if path.is_dir() {
        let mut entries: Vec<_> = std::fs::read_dir(path)
            .map(|dir| dir.filter_map(|entry| entry.ok().map(|entry| entry.path())).collect())
            .unwrap_or_default();
        entries.sort();
        entries.iter().for_each(|entry| stamp(entry));
    } else {
        stamp(path);
        let mut sidecar = path.as_os_str().to_os_string();
        sidecar.push(".sha256");
        stamp(Path::new(&sidecar));
    }
    hasher.finish()
}
