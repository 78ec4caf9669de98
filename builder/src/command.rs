//! `build` as a command: the flags, the JSON result line, the termination message.
//! Shared by `wasmless-builder build` and `wasmless build`.

use crate::publish::{self, Destination};
use crate::{BuildError, BuildOptions, Language, Source};
use anyhow::Context;
use std::path::{Path, PathBuf};
use wasmless_artifact::{Digest, EXIT_SOURCE_DOES_NOT_BUILD};

#[derive(clap::Args)]
pub struct BuildArgs {
    #[arg(long, env = "WASMLESS_LANGUAGE", value_enum)]
    pub language: Language,
    /// A source file, or a directory of source files.
    #[arg(long, env = "WASMLESS_SOURCE")]
    pub source: PathBuf,
    /// Where to write the `.wasm`.
    #[arg(long, env = "WASMLESS_OUTPUT")]
    pub output: PathBuf,
    /// Where to write the compiled code [default: the output with `.cwasm.lz4`].
    #[arg(long, env = "WASMLESS_CODE_OUTPUT")]
    pub code_output: Option<PathBuf>,
    /// Publish the module only, without compiled code: every new pod then compiles it.
    #[arg(long, env = "WASMLESS_NO_CODE")]
    pub no_code: bool,
    /// `configmap://<namespace>/<function>` or `oci://<registry>/<repo>:<tag>`.
    #[arg(long, env = "WASMLESS_PUBLISH")]
    pub publish: Option<Destination>,
    /// Built modules and compiler caches [default: ~/.cache/wasmless/builder].
    #[arg(long, env = "WASMLESS_BUILD_CACHE")]
    pub cache_dir: Option<PathBuf>,
    /// Keep the compilers' caches (Go's GOCACHE, Cargo's home) in the cache directory too,
    /// whatever GOCACHE and HOME say: a build Job's persistent cache, where an edit
    /// compiles only what changed.
    #[arg(long, env = "WASMLESS_COMPILER_CACHES_IN_CACHE_DIR")]
    pub compiler_caches_in_cache_dir: bool,
    /// Build Rust handlers offline from this `wasmless-builder vendor` directory.
    #[arg(long, env = "WASMLESS_VENDOR_DIR")]
    pub vendor_dir: Option<PathBuf>,
    /// The Go module proxy (a `GOPROXY` value: `https://proxy.golang.org`, an internal
    /// mirror) for Go handlers whose go.mod requires modules; checked against their go.sum.
    #[arg(long, env = "WASMLESS_GOPROXY")]
    pub go_proxy: Option<String>,
    /// The crates registry (a sparse index, `sparse+https://…/`) that Rust handlers whose
    /// Cargo.toml has dependencies build through, in place of crates.io.
    #[arg(long, env = "WASMLESS_CARGO_REGISTRY")]
    pub cargo_registry: Option<String>,
    /// The operator's source digest, used in the published labels.
    #[arg(long, env = "WASMLESS_SOURCE_DIGEST")]
    pub source_digest: Option<Digest>,
    /// The most the cache's own entries (built modules, compiled code, compiled functions)
    /// may take: after each build the least recently used go, down to three quarters of
    /// it. Go's and Cargo's caches beside them are not counted (Go trims its own).
    #[arg(long, env = "WASMLESS_BUILD_CACHE_BUDGET", default_value = "4Gi", value_parser = wasmless_formats::quantity::parse_bytes)]
    pub cache_budget: u64,
    /// Where Kubernetes reads a container's result; written when it exists.
    #[arg(long, env = "WASMLESS_TERMINATION_LOG", default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
    /// Also write the result line here: a build Job's compile step leaves it, with the
    /// module, to its publish step (`wasmless-builder publish --build-result`).
    #[arg(long, env = "WASMLESS_RESULT_FILE")]
    pub result_file: Option<PathBuf>,
}

/// Runs a build as the command does: prints progress and the JSON result line, writes
/// the termination message; returns the process's exit status: 0, or
/// [`EXIT_SOURCE_DOES_NOT_BUILD`] when the source is at fault (retrying is pointless), or 1
/// for anything else (retrying may succeed).
pub async fn run(args: BuildArgs, progress: &(dyn Fn(&str) + Sync)) -> i32 {
    let termination_log = args.termination_log.clone();
    let result_file = args.result_file.clone();
    let budget = args.cache_budget;
    match build(args, progress).await {
        Ok((result, cache_dir)) => {
            println!("{result}");
            write_termination_log(&termination_log, &result);
            if let Some(path) = &result_file
                && let Err(error) = write_atomically(path, result.as_bytes())
            {
                eprintln!("error: cannot write the result to {}: {error}", path.display());
                return 1;
            }
            // After the result: the operator has what it needs, nobody waits for this.
            collect_cache(&cache_dir, budget);
            0
        }
        Err(Failure { message, sources_fault }) => {
            eprintln!("error: {message}");
            write_termination_log(&termination_log, &message);
            if sources_fault { EXIT_SOURCE_DOES_NOT_BUILD } else { 1 }
        }
    }
}

/// Why a build failed, and whose fault it is.
pub(crate) struct Failure {
    pub(crate) message: String,
    pub(crate) sources_fault: bool,
}

impl Failure {
    /// The machine's or the network's fault: worth a retry.
    pub(crate) fn transient(message: impl std::fmt::Display) -> Self {
        Self {
            message: message.to_string(),
            sources_fault: false,
        }
    }
}

impl From<BuildError> for Failure {
    fn from(error: BuildError) -> Self {
        Self {
            sources_fault: error.is_the_sources_fault(),
            message: error.status_message(),
        }
    }
}

/// Keeps the cache's own entries under `budget`, saying what went; a failure costs only
/// the collection.
pub(crate) fn collect_cache(cache_dir: &Path, budget: u64) {
    match crate::cache::BuildCache::new(cache_dir).collect(budget) {
        Ok(collected) if collected.removed > 0 => tracing::info!(
            cache = %cache_dir.display(),
            removed = collected.removed,
            freed_bytes = collected.freed,
            held_bytes = collected.held,
            budget,
            "the build cache was over its budget: its least recently used entries were removed"
        ),
        Ok(_) => {}
        Err(error) => tracing::warn!(cache = %cache_dir.display(), %error, "cannot collect the build cache"),
    }
}

/// Returns the JSON result line and the cache directory it used, or why the build failed.
async fn build(args: BuildArgs, progress: &(dyn Fn(&str) + Sync)) -> Result<(String, PathBuf), Failure> {
    let started = std::time::Instant::now();
    // The wall clock of the start, for the operator's trace of the build: its phases are
    // placed from here (the pod's own timestamps have whole seconds only).
    let started_unix_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let source = Source::read(args.language, &args.source).map_err(|e| Failure::from(BuildError::Source(e)))?;
    let (cache_dir, cache_unusable) = usable_cache_dir(args.cache_dir);
    let options = BuildOptions {
        cache_dir: cache_dir.clone(),
        vendor_dir: args.vendor_dir,
        go_proxy: args.go_proxy.filter(|p| !p.trim().is_empty()),
        compiler_caches_in_cache_dir: args.compiler_caches_in_cache_dir,
        cargo_registry: args.cargo_registry.filter(|r| !r.trim().is_empty()),
    };
    let language = args.language;
    let built =
        tokio::task::block_in_place(|| crate::build(&source, &options, &|step| progress(&step.describe(language))))
            .map_err(Failure::from)?;
    write_atomically(&args.output, &built.wasm)
        .with_context(|| format!("cannot write {}", args.output.display()))
        .map_err(|e| Failure::transient(format!("{e:#}")))?;
    let code = if args.no_code {
        None
    } else {
        progress(&crate::Step::Precompiling.describe(language));
        // A module that validated and does not compile is this builder's failure, not the
        // source's: retried like any other.
        let code =
            tokio::task::block_in_place(|| crate::precompile_cached(&built, &cache_dir)).map_err(Failure::transient)?;
        let path = args
            .code_output
            .clone()
            .unwrap_or_else(|| args.output.with_extension("cwasm.lz4"));
        write_atomically(&path, &code.artifact)
            .with_context(|| format!("cannot write {}", path.display()))
            .map_err(|e| Failure::transient(format!("{e:#}")))?;
        Some((code, path))
    };
    let source_digest = args.source_digest.unwrap_or(built.source_digest);
    let publish_started = std::time::Instant::now();
    let published = match &args.publish {
        Some(destination) => {
            progress("publishing");
            Some(
                publish::publish(destination, &built, code.as_ref().map(|(code, _)| code), &source_digest)
                    .await
                    .map_err(Failure::transient)?,
            )
        }
        None => None,
    };
    let publish_seconds = publish_started.elapsed().as_secs_f64();
    let result = result_line(Outcome {
        built: &built,
        code: code.as_ref(),
        published,
        source_digest: &source_digest,
        output: &args.output,
        cache_dir: &cache_dir,
        cache_unusable: cache_unusable.as_deref(),
        started,
        started_unix_ms,
        publish_seconds,
    });
    Ok((result.to_string(), cache_dir))
}

/// The build cache to use: the one asked for (absolute, because Go refuses a relative
/// GOCACHE and the compilers run elsewhere), or, when it cannot be used, a cold one and why:
/// an unusable cache costs a cold build, never the build.
fn usable_cache_dir(asked: Option<PathBuf>) -> (PathBuf, Option<String>) {
    let wanted = asked.unwrap_or_else(default_cache_dir);
    let wanted = std::path::absolute(&wanted).unwrap_or(wanted);
    match crate::cache::check_usable(&wanted) {
        Ok(()) => (wanted, None),
        Err(why) => {
            tracing::warn!(cache = %wanted.display(), "build cache unusable, building cold: {why}");
            (std::env::temp_dir().join("wasmless-cold-cache"), Some(why))
        }
    }
}

/// What a build did, for its result line.
struct Outcome<'a> {
    built: &'a crate::Built,
    code: Option<&'a (crate::CompiledCode, PathBuf)>,
    published: Option<publish::Published>,
    source_digest: &'a Digest,
    output: &'a Path,
    cache_dir: &'a Path,
    cache_unusable: Option<&'a str>,
    started: std::time::Instant,
    started_unix_ms: u64,
    publish_seconds: f64,
}

/// The result line the operator reads: the module, its code, where they were published,
/// where the time went and what the caches answered.
fn result_line(outcome: Outcome) -> serde_json::Value {
    let mut result = serde_json::json!({
        "digest": outcome.built.digest.to_string(),
        "size": outcome.built.wasm.len(),
        "sourceDigest": outcome.source_digest.to_string(),
        "cached": outcome.built.cached,
        "output": outcome.output,
        "published": outcome.published.as_ref().map(|p| p.location.clone()),
    });
    if let Some(snapshot) = &outcome.built.snapshot {
        result["snapshot"] = serde_json::json!({
            "size": outcome.built.wasm.len(),
            "memoryBytes": snapshot.memory_bytes,
            "dataSegments": snapshot.segments_kept,
            "dataSegmentsBeforeMerging": snapshot.segments_written,
            "seconds": millis(snapshot.seconds),
        });
    }
    if let Some((code, path)) = outcome.code {
        result["code"] = code_report(code);
        result["code"]["output"] = serde_json::json!(path);
    }
    // Where the build's time went, phase by phase; a phase that did not run took 0.
    result["phases"] = serde_json::json!({
        "check": millis(outcome.built.phases.check),
        "compile": millis(outcome.built.phases.compile),
        "snapshot": millis(outcome.built.phases.snapshot),
        "precompile": millis(outcome.code.map_or(0.0, |(code, _)| code.seconds)),
        "publish": millis(outcome.publish_seconds),
        "total": millis(outcome.started.elapsed().as_secs_f64()),
        "startedUnixMs": outcome.started_unix_ms,
    });
    let problems: Vec<&str> = [outcome.cache_unusable, outcome.built.cache_problem.as_deref()]
        .into_iter()
        .chain(outcome.code.iter().map(|(code, _)| code.cache_problem.as_deref()))
        .flatten()
        .collect();
    result["cache"] = serde_json::json!({
        "dir": outcome.cache_dir,
        "module": outcome.built.cache,
        "code": outcome.code.map(|(code, _)| code.cache),
    });
    // Cranelift's function cache: what an edit compiled again, and what it found compiled.
    let counts = |(reused, compiled): (usize, usize)| serde_json::json!({"reused": reused, "compiled": compiled});
    if let Some(snapshot) = &outcome.built.snapshot {
        result["cache"]["functions"]["snapshot"] = counts(snapshot.functions);
    }
    if let Some(functions) = outcome.code.and_then(|(code, _)| code.functions) {
        result["cache"]["functions"]["precompile"] = counts(functions);
    }
    if !problems.is_empty() {
        result["cache"]["problems"] = serde_json::json!(problems);
    }
    if let Some(published) = outcome.published {
        if !published.config_maps.is_empty() {
            result["configMaps"] = serde_json::json!(published.config_maps);
        }
        if !published.code_config_maps.is_empty() {
            result["codeConfigMaps"] = serde_json::json!(published.code_config_maps);
        }
    }
    result
}

/// Seconds to the millisecond, as the result line reports them.
pub(crate) fn millis(seconds: f64) -> f64 {
    (seconds * 1000.0).round() / 1000.0
}

/// The result line's `code`: what was compiled to native code, for what, and how long it took.
pub(crate) fn code_report(code: &crate::CompiledCode) -> serde_json::Value {
    serde_json::json!({
        "digest": code.digest.to_string(),
        "size": code.artifact.len(),
        "moduleDigest": code.module_digest.to_string(),
        "engine": code.engine,
        "target": code.target,
        "seconds": millis(code.seconds),
    })
}

/// `WASMLESS_BUILD_CACHE`, else `~/.cache/wasmless/builder`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("WASMLESS_BUILD_CACHE") {
        return dir.into();
    }
    match std::env::var_os("HOME") {
        Some(home) => Path::new(&home).join(".cache/wasmless/builder"),
        None => std::env::temp_dir().join("wasmless-builder"),
    }
}

pub(crate) fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let staging = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&staging, bytes)?;
    std::fs::rename(&staging, path)
}

/// Kubernetes shows at most 4 KiB of a termination message.
pub fn write_termination_log(path: &Path, text: &str) {
    if path.exists() {
        let cut = &text[..text.floor_char_boundary(4096)];
        let _ = std::fs::write(path, cut);
    }
}
