//! A Go build cache made at image build time (the builder run once on a sample handler),
//! copied into a build's empty `GOCACHE` so that the first build on a node, in a namespace
//! or without a persistent cache compiles the handler, not Go's standard library again.
//!
//! The builder's `-overlay` changes package runtime, net and net/http, so every standard
//! package's cache key is the builder's own: no cache but one the builder filled can serve
//! it. The seed is only read; Go's cache is content-addressed, so a seed made by another Go
//! or another overlay costs cache misses, never a wrong build. A copy that fails costs a
//! cold build, never the build.

use std::io;
use std::path::{Path, PathBuf};

/// The seed's directory, in the builder image `/opt/wasmless/go-build-seed`.
pub const GO_CACHE_SEED_ENV: &str = "WASMLESS_GO_CACHE_SEED";

/// Whether a copy was made into `cache`.
#[derive(Debug, PartialEq, Eq)]
pub enum Seeded {
    /// `cache` was empty or absent, and now holds the seed.
    Copied { files: u64 },
    /// `cache` has entries already: left as it is.
    CacheInUse,
    /// No seed there to copy.
    NoSeed,
}

/// Copies `seed` into `cache` when `cache` is absent or empty. The copy is made beside it
/// and renamed into place, so a build running at the same time in the same cache sees
/// either no cache or the whole seed.
pub fn seed(cache: &Path, seed: &Path) -> io::Result<Seeded> {
    if !seed.is_dir() {
        return Ok(Seeded::NoSeed);
    }
    if has_entries(cache)? {
        return Ok(Seeded::CacheInUse);
    }
    let parent = cache.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let staging = tempfile::Builder::new()
        .prefix(".go-build-seeding")
        .tempdir_in(parent)?;
    let files = copy_tree(seed, staging.path())?;
    // An empty cache directory (made by `mkdir`, or by a build that failed at once) gives
    // way to the seed; one that gained entries meanwhile is kept, and the copy dropped.
    if cache.is_dir() && std::fs::remove_dir(cache).is_err() {
        return Ok(Seeded::CacheInUse);
    }
    match std::fs::rename(staging.path(), cache) {
        Ok(()) => {
            // Renamed away: nothing left for the guard to remove.
            let _ = staging.keep();
            Ok(Seeded::Copied { files })
        }
        Err(_) if has_entries(cache)? => Ok(Seeded::CacheInUse),
        Err(error) => Err(error),
    }
}

fn has_entries(dir: &Path) -> io::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(error) => Err(error),
    }
}

/// Copies the regular files and directories under `from` into `to` (which exists), with
/// new timestamps: Go trims cache entries by age, and a seed's entries are new to this
/// cache. Links and anything else are skipped: the seed is Go's own output.
fn copy_tree(from: &Path, to: &Path) -> io::Result<u64> {
    let mut files = 0;
    let mut pending: Vec<(PathBuf, PathBuf)> = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((source, target)) = pending.pop() {
        for entry in std::fs::read_dir(&source)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let destination = target.join(entry.file_name());
            if kind.is_dir() {
                std::fs::create_dir(&destination)?;
                pending.push((entry.path(), destination));
            } else if kind.is_file() {
                std::fs::copy(entry.path(), &destination)?;
                files += 1;
            }
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seed_dir(root: &Path) -> PathBuf {
        let seed = root.join("seed");
        std::fs::create_dir_all(seed.join("0a")).unwrap();
        std::fs::write(seed.join("0a/0a12-d"), b"compiled fmt").unwrap();
        std::fs::write(seed.join("README"), b"This directory holds cached build artifacts").unwrap();
        seed
    }

    #[test]
    fn an_absent_or_empty_cache_gets_the_whole_seed() {
        let root = tempfile::tempdir().unwrap();
        let seed = seed_dir(root.path());
        let absent = root.path().join("ns/build/go-build");
        assert_eq!(seed_fn(&absent, &seed), Seeded::Copied { files: 2 });
        assert_eq!(std::fs::read(absent.join("0a/0a12-d")).unwrap(), b"compiled fmt");

        let empty = root.path().join("empty");
        std::fs::create_dir(&empty).unwrap();
        assert_eq!(seed_fn(&empty, &seed), Seeded::Copied { files: 2 });
        assert!(empty.join("README").is_file());
        let left: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.starts_with(".go-build-seeding"))
            .collect();
        assert!(left.is_empty(), "staging directories left behind: {left:?}");
    }

    #[test]
    fn a_cache_in_use_is_left_as_it_is() {
        let root = tempfile::tempdir().unwrap();
        let seed = seed_dir(root.path());
        let cache = root.path().join("go-build");
        std::fs::create_dir_all(cache.join("ff")).unwrap();
        std::fs::write(cache.join("ff/ff00-d"), b"the namespace's own").unwrap();
        assert_eq!(seed_fn(&cache, &seed), Seeded::CacheInUse);
        assert!(!cache.join("0a").exists());
        assert_eq!(std::fs::read(cache.join("ff/ff00-d")).unwrap(), b"the namespace's own");
    }

    #[test]
    fn no_seed_no_copy() {
        let root = tempfile::tempdir().unwrap();
        let cache = root.path().join("go-build");
        assert_eq!(seed_fn(&cache, &root.path().join("absent")), Seeded::NoSeed);
        assert!(!cache.exists());
    }

    fn seed_fn(cache: &Path, from: &Path) -> Seeded {
        seed(cache, from).unwrap()
    }
}
