//! The builder's own cache: built modules by source digest, and their compiled code by
//! module digest, engine compatibility hash and target, so that the same source (a repeat,
//! or a revert to an earlier one) neither compiles nor precompiles twice.
//!
//! Every entry starts with a header line naming the sha256 and length of what follows, and
//! a read checks both: an entry torn by a crash, truncated by a full disk or altered on the
//! node is logged, removed and rebuilt, never used. The digest guards against accidents,
//! not against someone who can write the directory (they can write a matching header too):
//! that is what the directory's owner and mode are for (0700, the builder's uid, mounted
//! only into build Jobs; docs/architecture.md, "The build cache"). Entries are written to a
//! temporary file of their own and renamed into place, so concurrent builds — threads or
//! Jobs on one node sharing the directory — each see a whole entry or none.

use crate::BuildError;
use std::io::Write;
use std::path::{Path, PathBuf};
use wasmless_artifact::{Digest, build_cache};

/// The first bytes of every entry; a new layout gets a new version (and misses).
const MAGIC: &str = "wasmless-cache 1";

pub struct BuildCache {
    dir: PathBuf,
}

/// What a look-up found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Hit(Vec<u8>),
    Miss,
    /// An entry that failed its check (and was removed): why, for the build's report.
    Corrupt(String),
}

impl Lookup {
    /// `hit`, `miss` or `corrupt`, as the build result reports it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Hit(_) => "hit",
            Self::Miss => "miss",
            Self::Corrupt(_) => "corrupt",
        }
    }
}

impl BuildCache {
    pub fn new(cache_dir: &Path) -> Self {
        Self {
            dir: cache_dir.to_owned(),
        }
    }

    fn module_path(&self, source_digest: &Digest) -> PathBuf {
        self.dir.join("modules").join(format!("{}.wasm", source_digest.hex()))
    }

    fn code_path(&self, module_digest: &Digest, engine: &str, target: &str) -> PathBuf {
        let clean = |text: &str| -> String {
            text.chars()
                .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
                .collect()
        };
        self.dir.join("code").join(format!(
            "{}-{}-{}.cwasm.lz4",
            module_digest.hex(),
            clean(engine),
            clean(target)
        ))
    }

    /// Cranelift's compiled functions, in this cache's `functions/`.
    pub fn functions(&self) -> std::sync::Arc<FunctionCache> {
        FunctionCache::new(&self.dir)
    }

    /// The module built from `source_digest`.
    pub fn get_module(&self, source_digest: &Digest) -> Lookup {
        read_entry(&self.module_path(source_digest))
    }

    pub fn put_module(&self, source_digest: &Digest, wasm: &[u8]) -> Result<(), BuildError> {
        write_entry(&self.module_path(source_digest), wasm)
    }

    /// The compiled code artifact of `module_digest` for this engine and target.
    pub fn get_code(&self, module_digest: &Digest, engine: &str, target: &str) -> Lookup {
        read_entry(&self.code_path(module_digest, engine, target))
    }

    pub fn put_code(
        &self,
        module_digest: &Digest,
        engine: &str,
        target: &str,
        artifact: &[u8],
    ) -> Result<(), BuildError> {
        write_entry(&self.code_path(module_digest, engine, target), artifact)
    }
}

/// Cranelift's incremental cache on disk (wasmtime's `CacheStore`): one entry per compiled
/// function, named by the sha256 of the key Cranelift gives it (the function's body, its
/// signature and the compiler's flags), so an edited module compiles only the functions
/// the edit changed — in the snapshot's one run and in the precompile, which compile the
/// same bodies with the same flags. Entries are checked like every other one: a corrupt
/// entry is removed and is a miss, and Cranelift compiles that function again.
#[derive(Debug)]
pub struct FunctionCache {
    dir: PathBuf,
    hits: std::sync::atomic::AtomicUsize,
    misses: std::sync::atomic::AtomicUsize,
    /// Whether a torn entry was logged: one line, not one per function.
    said_corrupt: std::sync::atomic::AtomicBool,
}

impl FunctionCache {
    pub fn new(cache_dir: &Path) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            dir: cache_dir.join("functions"),
            hits: Default::default(),
            misses: Default::default(),
            said_corrupt: Default::default(),
        })
    }

    fn path(&self, key: &[u8]) -> PathBuf {
        let hex = Digest::of(key).hex();
        // 256 directories, so that none holds the tens of thousands a few Go modules make.
        self.dir.join(&hex[..2]).join(&hex[2..])
    }

    /// Functions found compiled, and compiled anew, since this cache was opened.
    pub fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.hits.load(Relaxed), self.misses.load(Relaxed))
    }
}

impl wasmless_host::precompiled::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<std::borrow::Cow<'_, [u8]>> {
        use std::sync::atomic::Ordering::Relaxed;
        let path = self.path(key);
        match check_entry(&path) {
            Ok(Some(bytes)) => {
                self.hits.fetch_add(1, Relaxed);
                return Some(bytes.into());
            }
            Ok(None) => {}
            Err(why) => {
                let _ = std::fs::remove_file(&path);
                if !self.said_corrupt.swap(true, Relaxed) {
                    tracing::warn!(
                        entry = %path.display(),
                        "compiled functions in the build cache failed their check and are compiled again (this is the first): {why}"
                    );
                }
            }
        }
        self.misses.fetch_add(1, Relaxed);
        None
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        write_entry(&self.path(key), &value).is_ok()
    }
}

fn header(bytes: &[u8]) -> String {
    format!("{MAGIC} {} {}\n", Digest::of(bytes), bytes.len())
}

fn read_entry(path: &Path) -> Lookup {
    match check_entry(path) {
        Ok(Some(payload)) => Lookup::Hit(payload),
        Ok(None) => Lookup::Miss,
        Err(why) => corrupt(path, why),
    }
}

/// An entry's payload if it is there and whole, or why it is not.
fn check_entry(path: &Path) -> Result<Option<Vec<u8>>, String> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("cannot read it: {error}")),
    };
    let Some(end) = bytes.iter().position(|b| *b == b'\n') else {
        return Err("no header line".into());
    };
    let (line, payload) = (String::from_utf8_lossy(&bytes[..=end]), &bytes[end + 1..]);
    let expected = header(payload);
    if line != expected {
        return Err(format!(
            "header {:?} does not match its {} bytes ({:?})",
            line.trim_end(),
            payload.len(),
            expected.trim_end()
        ));
    }
    touch(path);
    Ok(Some(payload.to_vec()))
}

/// How long a hit leaves an entry's modification time alone: it marks when the entry was
/// last used (for [`BuildCache::collect`]) without a write on every hit.
const TOUCH_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// Marks an entry just read as used now, unless it was within [`TOUCH_AFTER`]. Best effort:
/// an entry that cannot be touched is only collected sooner.
fn touch(path: &Path) {
    let now = std::time::SystemTime::now();
    let Ok(file) = std::fs::File::options().write(true).open(path) else {
        return;
    };
    let stale = file
        .metadata()
        .and_then(|meta| meta.modified())
        .map_or(true, |modified| {
            now.duration_since(modified).unwrap_or_default() > TOUCH_AFTER
        });
    if stale {
        let _ = file.set_modified(now);
    }
}

/// What [`BuildCache::collect`] found and removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Collected {
    /// Bytes of entries before, and removed.
    pub held: u64,
    pub freed: u64,
    pub removed: usize,
}

/// The directories of this cache's own entries; the compilers' caches beside them are theirs
/// (Go trims its own build cache of what it has not used for days).
const ENTRY_DIRS: [&str; 3] = ["modules", "code", "functions"];

impl BuildCache {
    /// Removes the least recently used entries (by modification time, which a hit renews
    /// at most hourly) while the cache's own entries — modules, compiled code, compiled
    /// functions — take more than `budget`, down to three quarters of it, so that a full
    /// cache is not collected again at every build. Concurrent builds stay safe: one whose
    /// entry goes finds a miss and compiles it again. A writer's temporary file is only
    /// removed once it is an hour old (a crashed build's).
    pub fn collect(&self, budget: u64) -> std::io::Result<Collected> {
        let now = std::time::SystemTime::now();
        let mut entries: Vec<(std::time::SystemTime, u64, PathBuf)> = Vec::new();
        let mut stack: Vec<PathBuf> = ENTRY_DIRS.iter().map(|dir| self.dir.join(dir)).collect();
        while let Some(dir) = stack.pop() {
            let listing = match std::fs::read_dir(&dir) {
                Ok(listing) => listing,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(error) => return Err(error),
            };
            for entry in listing.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_dir() {
                    stack.push(entry.path());
                    continue;
                }
                let modified = meta.modified().unwrap_or(now);
                let writing = entry.file_name().to_string_lossy().starts_with(".tmp-")
                    && now.duration_since(modified).unwrap_or_default() < TOUCH_AFTER;
                if !writing {
                    entries.push((modified, meta.len(), entry.path()));
                }
            }
        }
        let held: u64 = entries.iter().map(|(_, len, _)| len).sum();
        let mut collected = Collected {
            held,
            ..Collected::default()
        };
        if held <= budget {
            return Ok(collected);
        }
        entries.sort();
        let goal = budget / 4 * 3;
        for (_, len, path) in entries {
            if held - collected.freed <= goal {
                break;
            }
            if std::fs::remove_file(&path).is_ok() {
                collected.freed += len;
                collected.removed += 1;
            }
        }
        Ok(collected)
    }
}

/// Removes an entry that failed its check, so the rebuild replaces it, and says why.
fn corrupt(path: &Path, why: String) -> Lookup {
    let removed = std::fs::remove_file(path);
    tracing::warn!(
        entry = %path.display(),
        removed = removed.is_ok(),
        "build cache entry failed its check and is rebuilt: {why}"
    );
    Lookup::Corrupt(format!("{}: {why}", path.display()))
}

fn write_entry(path: &Path, bytes: &[u8]) -> Result<(), BuildError> {
    let error = |source| BuildError::Cache {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().expect("an entry is in a directory");
    make_private_dir(dir).map_err(error)?;
    // A temporary file of this writer's own (not one named by the process id, which two
    // threads share), renamed into place: a reader never sees half an entry.
    let mut staging = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempfile_in(dir)
        .map_err(error)?;
    staging.write_all(header(bytes).as_bytes()).map_err(error)?;
    staging.write_all(bytes).map_err(error)?;
    staging.persist(path).map_err(|e| error(e.error))?;
    Ok(())
}

/// The cache's directories are the builder's alone (0700): compiled code is read from them.
pub fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Makes the compile step's directory of `namespace` and the publish step's under `root`
/// ([`build_cache`]: the compile step runs the author's code with what it mounts, so it
/// gets its namespace's only; the publish step runs none and keeps the native code),
/// each private (0700) to the builder's uid, before they are mounted into the steps as
/// sub-directories: mounted before they exist, the kubelet would make them root's, and no
/// build could use them. A path that is already there as anything but a directory (a
/// symbolic link, say) is refused, never followed. Never fatal to the build: what cannot be
/// made, the build finds unusable and builds cold, saying why.
pub fn prepare_dirs(root: &Path, namespace: &str) -> Result<Vec<PathBuf>, String> {
    let valid_namespace = !namespace.is_empty()
        && namespace.len() <= 63
        && namespace
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid_namespace {
        return Err(format!("{namespace:?} is not a namespace name"));
    }
    let dirs = [
        root.join("namespaces"),
        root.join(build_cache::namespace_dir(namespace)),
        root.join(build_cache::build_dir(namespace)),
        root.join(build_cache::published_dir(namespace)),
    ];
    for dir in &dirs {
        match std::fs::symlink_metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(format!("{} exists and is not a directory", dir.display())),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| format!("{} cannot be made: {e}", dir.display()))?;
            }
            Err(error) => return Err(format!("{}: {error}", dir.display())),
        }
    }
    Ok(dirs.to_vec())
}

/// Whether `dir` can hold this builder's cache: it exists or can be made, this process can
/// write it, and no other user can (a directory of ours is made 0700; one of another owner,
/// such as a volume's root that only its group may write, must not be writable by all).
/// The reason it cannot, in words that say what to do.
pub fn check_usable(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let fix = "make it a directory of the builder's uid (65532) with mode 0700, e.g. `install -d -o 65532 -g 65532 -m 0700 DIR` on the node, or give build Jobs a PersistentVolumeClaim";
    make_private_dir(dir).map_err(|e| format!("{} cannot be made ({e}): {fix}", dir.display()))?;
    // A file this process made is owned by its uid: no call to the C library needed.
    let probe = tempfile::Builder::new()
        .prefix(".probe-")
        .tempfile_in(dir)
        .map_err(|e| format!("{} is not writable by this builder ({e}): {fix}", dir.display()))?;
    let uid = probe
        .as_file()
        .metadata()
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .uid();
    drop(probe);
    let meta = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if meta.uid() == uid {
        if meta.mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| format!("{} cannot be made private ({e}): {fix}", dir.display()))?;
        }
    } else if meta.mode() & 0o002 != 0 {
        return Err(format!(
            "{} is owned by uid {} and writable by every user, so its compiled code could be anyone's: {fix}",
            dir.display(),
            meta.uid()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn age(path: &Path, ago: Duration) {
        let file = std::fs::File::options().write(true).open(path).unwrap();
        file.set_modified(SystemTime::now() - ago).unwrap();
    }

    #[test]
    fn collecting_removes_the_least_recently_used_entries_down_to_three_quarters_of_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BuildCache::new(dir.path());
        let functions = cache.functions();
        let kilobyte = vec![7u8; 1000];
        // Ten modules and ten compiled functions of about 1 kB, the first the oldest.
        let modules: Vec<Digest> = (0..10u8).map(|n| Digest::of(&[n])).collect();
        for (n, digest) in modules.iter().enumerate() {
            cache.put_module(digest, &kilobyte).unwrap();
            assert!(wasmless_host::precompiled::CacheStore::insert(
                &*functions,
                &[n as u8],
                kilobyte.clone()
            ));
            age(
                &cache.module_path(digest),
                Duration::from_secs(86_400 * (20 - n as u64)),
            );
            // An hour newer than its module: an order that does not hang on nanoseconds.
            age(
                &functions.path(&[n as u8]),
                Duration::from_secs(86_400 * (20 - n as u64) - 3600),
            );
        }
        // The oldest module is used now: a hit marks it.
        assert!(matches!(cache.get_module(&modules[0]), Lookup::Hit(_)));
        let entry_len = std::fs::metadata(cache.module_path(&modules[0])).unwrap().len();
        let held = 20 * entry_len;

        assert_eq!(
            cache.collect(held).unwrap().removed,
            0,
            "within the budget: nothing goes"
        );
        let collected = cache.collect(held - 1).unwrap();
        assert_eq!(collected.held, held);
        assert!(held - collected.freed <= (held - 1) / 4 * 3, "{collected:?}");
        assert_eq!(collected.removed, 6, "{collected:?}");
        // The oldest go first (modules 1-3 and functions 0-2), the one just used stays.
        assert!(matches!(cache.get_module(&modules[0]), Lookup::Hit(_)));
        for (n, module) in modules.iter().enumerate().skip(1) {
            match n {
                1..=3 => assert_eq!(cache.get_module(module), Lookup::Miss, "module {n}"),
                _ => assert!(matches!(cache.get_module(module), Lookup::Hit(_)), "module {n}"),
            }
        }
        use wasmless_host::precompiled::CacheStore;
        assert!(functions.get(&[0]).is_none() && functions.get(&[2]).is_none());
        assert!(functions.get(&[3]).is_some() && functions.get(&[9]).is_some());
    }

    #[test]
    fn each_namespace_gets_a_private_directory_and_a_planted_link_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let made = prepare_dirs(root.path(), "team-a").unwrap();
        for dir in &made {
            let mode = std::fs::metadata(dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700, "{}", dir.display());
        }
        assert!(root.path().join("namespaces/team-a/build").is_dir());
        assert!(root.path().join("namespaces/team-a/published").is_dir());
        // Again: nothing changes, nothing fails.
        prepare_dirs(root.path(), "team-a").unwrap();
        // A link where a namespace's directory goes would send its builds elsewhere.
        std::os::unix::fs::symlink(
            root.path().join("namespaces/team-a"),
            root.path().join("namespaces/team-b"),
        )
        .unwrap();
        let refused = prepare_dirs(root.path(), "team-b").unwrap_err();
        assert!(refused.contains("is not a directory"), "{refused}");
        for bad in ["", "../x", "a/b", "A"] {
            assert!(prepare_dirs(root.path(), bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_write_under_way_is_not_collected_and_a_crashed_ones_is() {
        let dir = tempfile::tempdir().unwrap();
        let cache = BuildCache::new(dir.path());
        make_private_dir(&dir.path().join("code")).unwrap();
        let writing = dir.path().join("code").join(".tmp-writing");
        let crashed = dir.path().join("code").join(".tmp-crashed");
        std::fs::write(&writing, vec![0u8; 1000]).unwrap();
        std::fs::write(&crashed, vec![0u8; 1000]).unwrap();
        age(&crashed, Duration::from_secs(7200));
        let collected = cache.collect(10).unwrap();
        assert_eq!(collected.removed, 1);
        assert!(writing.exists() && !crashed.exists());
    }
}
