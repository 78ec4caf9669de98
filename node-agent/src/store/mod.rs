//! The store on the node's disk, written by this agent alone:
//!
//! ```text
//! <root>/                      root 0700: no other user resolves a name inside
//!   objects/<hex>.cwasm        0444: the decompressed code stored as sha256:<hex>, never modified
//!   objects/<hex>.meta         0400: what was verified (the header, the code's own sha256)
//!                              and the file's identity as written (inode, size, ctime)
//!   namespaces/<ns>/<hex>      the namespace <ns> put that code: it may get it
//!   tmp/                       files being written
//! ```
//!
//! A namespace gets only code it has put, and a put proves possession: its bytes hash to
//! the digest (admission). Each object is checked again before the first `get` after the
//! agent starts (re-hashed), and its identity on every `get`: a file changed on disk is
//! removed and answered `corrupt`, and the runtime takes the path it took before the store.
//! Objects are only ever unlinked, never rewritten, so a runtime that maps one keeps its
//! pages whatever happens to the name.

use crate::admission::Admitted;
pub use crate::namespace::Namespace;
use crate::record::{Identity, Meta, hash_file};
use std::collections::{HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use wasmless_artifact::{CodeHeader, Digest};

/// How much the store keeps: all of it, and what one namespace's puts may hold of it.
#[derive(Debug, Clone, Copy)]
pub struct StoreLimits {
    /// Bytes of code files on the node; the least recently used go first beyond it.
    pub budget: u64,
    /// Bytes of code one namespace holds; beyond it that namespace's least recently used
    /// code is let go (for it: another namespace that holds it keeps it).
    pub namespace_quota: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the code store at {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a directory of the agent's own user: refusing to keep code there")]
    NotOurs { path: PathBuf },
    #[error("{size} bytes of code is over the store's {limit} ({what})")]
    TooLarge { size: u64, limit: u64, what: &'static str },
}

impl StoreError {
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Io { .. } | Self::NotOurs { .. } => "io",
            Self::TooLarge { .. } => "too-large",
        }
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a `get` found.
#[derive(Debug)]
pub enum Found {
    Code(CodeHeader, File),
    Absent,
    Corrupt,
}

/// Why an object cannot be opened as recorded.
enum NotThere {
    /// No file (let go of by someone other than this agent, or never written whole).
    Gone,
    /// A file, not the one written, or a record that does not parse.
    Changed,
    /// It could not be read now (descriptors, the disk): kept.
    Unreadable(std::io::Error),
}

#[derive(Debug)]
struct Object {
    /// What it counts against the budget and quotas ([`charge`]).
    charged: u64,
    last_used: u64,
    /// Re-hashed since this agent started.
    checked: bool,
}

/// What an object of `size` bytes counts: at least 1 MiB, so that a quota is a bound on
/// files too (a namespace of 2 GiB holds 2,048 at most, not half a million tiny ones, each
/// with its record and marker).
fn charge(size: u64) -> u64 {
    size.max(1 << 20)
}

/// What is stored and who may get it, in memory: read from the disk at start, kept in step
/// with it since. Every change of the store's files and every `get` happen under its lock,
/// so no `get` meets an object half removed or half written.
#[derive(Debug, Default)]
struct Index {
    objects: HashMap<Digest, Object>,
    namespaces: HashMap<Namespace, HashSet<Digest>>,
    /// The sum of the objects' charges.
    total: u64,
    clock: u64,
}

impl Index {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn held_by(&self, namespace: &Namespace) -> u64 {
        self.namespaces.get(namespace).map_or(0, |held| {
            held.iter()
                .filter_map(|digest| self.objects.get(digest))
                .map(|o| o.charged)
                .sum()
        })
    }

    fn insert(&mut self, digest: Digest, object: Object) {
        self.total += object.charged;
        if let Some(old) = self.objects.insert(digest, object) {
            self.total -= old.charged;
        }
    }
}

pub struct Store {
    root: PathBuf,
    limits: StoreLimits,
    index: Mutex<Index>,
    /// Re-hash an object on every `get`, not only on the first after start.
    verify_every_get: bool,
}

impl Store {
    /// The store at `root`, made if missing (owner-only), with what it held before: objects
    /// whose file is no longer what was written are removed.
    pub fn open(root: &Path, limits: StoreLimits, verify_every_get: bool) -> Result<Self, StoreError> {
        for dir in [root.to_path_buf(), root.join("objects"), root.join("namespaces")] {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(io_error(&dir))?;
        }
        // The store's directories must be the agent's own (whoever else owns one could rewrite
        // the records it checks files against), and no one else's to enter.
        for dir in [root.to_path_buf(), root.join("objects"), root.join("namespaces")] {
            let metadata = std::fs::symlink_metadata(&dir).map_err(io_error(&dir))?;
            if !metadata.is_dir() || metadata.uid() != rustix::process::geteuid().as_raw() {
                return Err(StoreError::NotOurs { path: dir });
            }
        }
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).map_err(io_error(root))?;
        let tmp = root.join("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .map_err(io_error(&tmp))?;
        let store = Self {
            root: root.to_path_buf(),
            limits,
            index: Mutex::new(Index::default()),
            verify_every_get,
        };
        store.read_index()?;
        Ok(store)
    }

    /// The index, whatever a thread that panicked holding it left: its every change is made
    /// after the file it records, so it is never ahead of the disk.
    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn object_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("objects").join(format!("{}.cwasm", digest.hex()))
    }

    fn meta_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("objects").join(format!("{}.meta", digest.hex()))
    }

    fn marker_path(&self, namespace: &Namespace, digest: &Digest) -> PathBuf {
        self.root.join("namespaces").join(namespace.as_str()).join(digest.hex())
    }

    fn read_index(&self) -> Result<(), StoreError> {
        let mut index = self.lock();
        let objects = self.root.join("objects");
        for entry in std::fs::read_dir(&objects).map_err(io_error(&objects))?.flatten() {
            let name = entry.file_name();
            let Some(hex) = name.to_str().and_then(|name| name.strip_suffix(".cwasm")) else {
                continue;
            };
            let Ok(digest) = format!("sha256:{hex}").parse::<Digest>() else {
                let _ = std::fs::remove_file(entry.path());
                continue;
            };
            match self.read_meta(&digest) {
                Some((meta, _)) => index.insert(
                    digest,
                    Object {
                        charged: charge(meta.identity.size),
                        last_used: 0,
                        checked: false,
                    },
                ),
                None => self.remove_files(&digest),
            }
        }
        // Metadata without its object: written by an agent stopped in between.
        for entry in std::fs::read_dir(&objects).map_err(io_error(&objects))?.flatten() {
            let name = entry.file_name();
            if let Some(hex) = name.to_str().and_then(|name| name.strip_suffix(".meta"))
                && !entry.path().with_file_name(format!("{hex}.cwasm")).exists()
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let namespaces = self.root.join("namespaces");
        for dir in std::fs::read_dir(&namespaces).map_err(io_error(&namespaces))?.flatten() {
            let Some(namespace) = dir.file_name().to_str().and_then(|name| Namespace::new(name).ok()) else {
                continue;
            };
            let Ok(markers) = std::fs::read_dir(dir.path()) else {
                continue;
            };
            for marker in markers.flatten() {
                let digest = marker
                    .file_name()
                    .to_str()
                    .and_then(|hex| format!("sha256:{hex}").parse::<Digest>().ok());
                match digest {
                    Some(digest) if index.objects.contains_key(&digest) => {
                        index.namespaces.entry(namespace.clone()).or_default().insert(digest);
                    }
                    _ => {
                        let _ = std::fs::remove_file(marker.path());
                    }
                }
            }
        }
        tracing::info!(
            objects = index.objects.len(),
            bytes = index.total,
            namespaces = index.namespaces.len(),
            "code store opened"
        );
        Ok(())
    }

    /// The metadata of `digest` and its object's file, if both are there and the file is
    /// still the one written.
    fn read_meta(&self, digest: &Digest) -> Option<(Meta, File)> {
        self.open_object(digest).ok()
    }

    /// [`Store::read_meta`], saying why not.
    fn open_object(&self, digest: &Digest) -> Result<(Meta, File), NotThere> {
        let unreadable = |error: std::io::Error| match error.kind() {
            std::io::ErrorKind::NotFound => NotThere::Gone,
            _ => NotThere::Unreadable(error),
        };
        let meta = std::fs::read_to_string(self.meta_path(digest)).map_err(unreadable)?;
        let meta = Meta::parse(&meta).ok_or(NotThere::Changed)?;
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(self.object_path(digest))
            .map_err(|error| match error.raw_os_error() {
                // A symbolic link where the object was: not what the agent wrote.
                Some(code) if code == rustix::io::Errno::LOOP.raw_os_error() => NotThere::Changed,
                _ => unreadable(error),
            })?;
        let identity = Identity::of(&file.metadata().map_err(NotThere::Unreadable)?);
        match identity == meta.identity {
            true => Ok((meta, file)),
            false => Err(NotThere::Changed),
        }
    }

    fn remove_files(&self, digest: &Digest) {
        let _ = std::fs::remove_file(self.object_path(digest));
        let _ = std::fs::remove_file(self.meta_path(digest));
    }

    /// The code `namespace` put under `digest`, as a read-only file.
    pub fn get(&self, namespace: &Namespace, digest: &Digest) -> Found {
        let (meta, file, checked) = {
            let mut index = self.lock();
            let held = index
                .namespaces
                .get(namespace)
                .is_some_and(|held| held.contains(digest));
            let now = index.tick();
            let checked = match index.objects.get_mut(digest) {
                Some(object) if held => {
                    object.last_used = now;
                    object.checked
                }
                _ => return Found::Absent,
            };
            match self.open_object(digest) {
                Ok((meta, file)) => (meta, file, checked),
                // Gone from the disk (not by this agent): nothing to warn of, nothing to serve.
                Err(NotThere::Gone) => {
                    self.remove_object(&mut index, digest);
                    return Found::Absent;
                }
                Err(NotThere::Changed) => {
                    tracing::warn!(%digest, "a stored object's file is not the one written: removed");
                    self.remove_object(&mut index, digest);
                    return Found::Corrupt;
                }
                // Out of descriptors, a disk error: kept, for a later get.
                Err(NotThere::Unreadable(error)) => {
                    tracing::warn!(%digest, %error, "cannot open a stored object");
                    return Found::Absent;
                }
            }
        };
        if checked && !self.verify_every_get {
            return Found::Code(meta.header, file);
        }
        // Hashed outside the lock (megabytes): other gets and puts go on meanwhile.
        let hashed = hash_file(&file);
        let mut index = self.lock();
        match hashed {
            Ok(actual) if actual == meta.cwasm_sha256 => {
                if let Some(object) = index.objects.get_mut(digest) {
                    object.checked = true;
                }
                Found::Code(meta.header, file)
            }
            Ok(_) => {
                tracing::warn!(%digest, "a stored object's bytes are not the ones verified: removed");
                // Only the file that was hashed: one written anew meanwhile stays.
                let still_this_file = self.read_meta(digest).is_some_and(|(now, _)| now == meta);
                if still_this_file {
                    self.remove_object(&mut index, digest);
                }
                Found::Corrupt
            }
            Err(error) => {
                tracing::warn!(%digest, %error, "cannot read a stored object to check it");
                Found::Absent
            }
        }
    }

    /// Keeps admitted code under `digest` (if it is not kept already) and lets `namespace`
    /// get it; then lets go of the least recently used beyond the limits.
    pub fn put(&self, namespace: &Namespace, digest: &Digest, admitted: Admitted) -> Result<(), StoreError> {
        let charged = charge(admitted.cwasm().len() as u64);
        for (limit, what) in [
            (self.limits.namespace_quota, "quota of a namespace"),
            (self.limits.budget, "budget"),
        ] {
            if charged > limit {
                return Err(StoreError::TooLarge {
                    size: charged,
                    limit,
                    what,
                });
            }
        }
        let stored = {
            let mut index = self.lock();
            let stored = index.objects.contains_key(digest);
            // Indexed, but its file gone or changed behind the agent's back: written anew.
            if stored && self.read_meta(digest).is_none() {
                self.remove_object(&mut index, digest);
                false
            } else {
                stored
            }
        };
        // Written outside the lock: megabytes, while gets go on.
        let written = match stored {
            true => None,
            false => Some(self.write_object(admitted.cwasm())?),
        };
        let mut index = self.lock();
        if !index.objects.contains_key(digest) {
            let Some(written) = &written else {
                // Let go of between the two locks: a put again, this time writing it.
                drop(index);
                return self.put(namespace, digest, admitted);
            };
            if let Err(error) = self.publish(digest, written, &admitted) {
                let _ = std::fs::remove_file(written);
                self.remove_files(digest);
                return Err(error);
            }
            let object = Object {
                charged,
                last_used: 0,
                checked: true,
            };
            index.insert(*digest, object);
        } else if let Some(written) = &written {
            // Another put of the same code came first.
            let _ = std::fs::remove_file(written);
        }
        let marker = self.marker_path(namespace, digest);
        let dir = marker.parent().expect("a marker is in its namespace's directory");
        let marked = std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(dir)
            .and_then(|()| {
                OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .mode(0o600)
                    .open(&marker)
                    .map(drop)
            });
        if let Err(source) = marked {
            if !index.namespaces.values().any(|held| held.contains(digest)) {
                self.remove_object(&mut index, digest);
            }
            return Err(StoreError::Io { path: marker, source });
        }
        let now = index.tick();
        if let Some(object) = index.objects.get_mut(digest) {
            object.last_used = now;
        }
        index.namespaces.entry(namespace.clone()).or_default().insert(*digest);
        self.let_go(&mut index, namespace, digest);
        Ok(())
    }

    /// `cwasm` in a new file of `tmp/`, read-only once written; nothing is left of it when
    /// it cannot be written whole.
    fn write_object(&self, cwasm: &[u8]) -> Result<PathBuf, StoreError> {
        let (mut writer, path) = tempfile_in(&self.root.join("tmp"))?;
        let written = writer
            .write_all(cwasm)
            .and_then(|()| writer.set_permissions(std::fs::Permissions::from_mode(0o444)));
        if let Err(source) = written {
            let _ = std::fs::remove_file(&path);
            return Err(StoreError::Io { path, source });
        }
        Ok(path)
    }

    /// Moves a written object into place and records what it was verified to be.
    fn publish(&self, digest: &Digest, written: &Path, admitted: &Admitted) -> Result<(), StoreError> {
        let object = self.object_path(digest);
        std::fs::rename(written, &object).map_err(io_error(&object))?;
        let identity = Identity::of(&std::fs::symlink_metadata(&object).map_err(io_error(&object))?);
        let meta = Meta {
            cwasm_sha256: admitted.cwasm_sha256,
            identity,
            header: admitted.header.clone(),
        };
        let (mut writer, path) = tempfile_in(&self.root.join("tmp"))?;
        let written = writer
            .write_all(meta.encode().as_bytes())
            .and_then(|()| writer.set_permissions(std::fs::Permissions::from_mode(0o400)))
            .and_then(|()| std::fs::rename(&path, self.meta_path(digest)));
        if let Err(source) = written {
            let _ = std::fs::remove_file(&path);
            return Err(StoreError::Io { path, source });
        }
        Ok(())
    }

    /// Beyond `namespace`'s quota, its least recently used code is no longer its own; beyond
    /// the budget, the least recently used code goes. Never `keep`, just put.
    fn let_go(&self, index: &mut Index, namespace: &Namespace, keep: &Digest) {
        while index.held_by(namespace) > self.limits.namespace_quota {
            let held = &index.namespaces[namespace];
            let Some(oldest) = held
                .iter()
                .filter(|digest| *digest != keep)
                .min_by_key(|digest| index.objects.get(digest).map_or(0, |o| o.last_used))
                .copied()
            else {
                break;
            };
            let _ = std::fs::remove_file(self.marker_path(namespace, &oldest));
            index.namespaces.get_mut(namespace).expect("held above").remove(&oldest);
            let still_held = index.namespaces.values().any(|held| held.contains(&oldest));
            if !still_held {
                self.remove_object(index, &oldest);
            }
        }
        while index.total > self.limits.budget {
            let Some(oldest) = index
                .objects
                .iter()
                .filter(|(digest, _)| *digest != keep)
                .min_by_key(|(_, object)| object.last_used)
                .map(|(digest, _)| *digest)
            else {
                break;
            };
            self.remove_object(index, &oldest);
        }
    }

    fn remove_object(&self, index: &mut Index, digest: &Digest) {
        if let Some(object) = index.objects.remove(digest) {
            index.total -= object.charged;
        }
        for (namespace, held) in index.namespaces.iter_mut() {
            if held.remove(digest) {
                let _ = std::fs::remove_file(self.marker_path(namespace, digest));
            }
        }
        self.remove_files(digest);
        tracing::info!(%digest, "stored code let go");
    }

    /// Bytes of code stored (as charged), and how many objects.
    pub fn usage(&self) -> (u64, usize) {
        let index = self.lock();
        (index.total, index.objects.len())
    }

    /// What each namespace holds: bytes (as charged against its quota) and objects; code
    /// two namespaces hold counts in both.
    pub fn usage_by_namespace(&self) -> Vec<(Namespace, u64, usize)> {
        let index = self.lock();
        index
            .namespaces
            .iter()
            .map(|(namespace, held)| {
                let objects = held.iter().filter(|digest| index.objects.contains_key(*digest)).count();
                (namespace.clone(), index.held_by(namespace), objects)
            })
            .collect()
    }
}

/// A new file in `dir` that nothing else has opened (`O_EXCL`), owner-only until made
/// read-only.
fn tempfile_in(dir: &Path) -> Result<(File, PathBuf), StoreError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let path = dir.join(format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io_error(&path))?;
    Ok((file, path))
}

#[cfg(test)]
pub(crate) mod tests;
