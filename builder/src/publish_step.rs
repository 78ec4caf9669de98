//! `publish` as a command: a build Job's last step, the one that holds the namespace's
//! builder token (docs/security.md, door 2).
//!
//! The compile step before it runs the author's code — a Rust crate's procedural macros
//! run inside rustc — so it runs without a ServiceAccount token and leaves only a module
//! and its result line in the pod's work directory. This step runs none: it reads the
//! module, validates it, takes its digest itself, compiles it to native code through a
//! cache no compile step mounts, and publishes both. What the compile step says of itself
//! (its phases, its cache's answers) is reported as it said it, and trusted for nothing.

use crate::command::{Failure, code_report, collect_cache, millis, write_termination_log};
use crate::publish::{self, Destination};
use crate::{BuildError, Built, Language, Phases};
use std::io::Read;
use std::path::{Path, PathBuf};
use wasmless_artifact::{Digest, EXIT_SOURCE_DOES_NOT_BUILD};

/// The largest module the step reads: far over any handler (a Go one is ~10 MB), under what
/// would make a pod's memory the limit.
const MAX_MODULE_BYTES: u64 = 512 << 20;
/// The compile step's result line is a few hundred bytes.
const MAX_RESULT_BYTES: u64 = 64 << 10;

#[derive(clap::Args)]
pub struct PublishArgs {
    #[arg(long, env = "WASMLESS_LANGUAGE", value_enum)]
    pub language: Language,
    /// The module the compile step wrote.
    #[arg(long, env = "WASMLESS_MODULE")]
    pub module: PathBuf,
    /// The compile step's result line (`wasmless-builder build --result-file`).
    #[arg(long, env = "WASMLESS_BUILD_RESULT")]
    pub build_result: Option<PathBuf>,
    /// `configmap://<namespace>/<function>` or `oci://<registry>/<repo>:<tag>`.
    #[arg(long, env = "WASMLESS_PUBLISH")]
    pub publish: Destination,
    /// The operator's source digest, used in the published labels.
    #[arg(long, env = "WASMLESS_SOURCE_DIGEST")]
    pub source_digest: Digest,
    /// Compiled code (and Cranelift's compiled functions) by module digest: a directory only
    /// publish steps write [default: a temporary directory of this step's].
    #[arg(long, env = "WASMLESS_CODE_CACHE")]
    pub cache_dir: Option<PathBuf>,
    /// Publish the module only, without compiled code.
    #[arg(long, env = "WASMLESS_NO_CODE")]
    pub no_code: bool,
    /// As `build --cache-budget`, for this step's cache.
    #[arg(long, env = "WASMLESS_BUILD_CACHE_BUDGET", default_value = "4Gi", value_parser = wasmless_formats::quantity::parse_bytes)]
    pub cache_budget: u64,
    #[arg(long, env = "WASMLESS_TERMINATION_LOG", default_value = "/dev/termination-log")]
    pub termination_log: PathBuf,
}

/// Runs the step as the command does: the JSON result line on stdout and in the
/// termination message; the exit status as `build`'s.
pub async fn run(args: PublishArgs, progress: &(dyn Fn(&str) + Sync)) -> i32 {
    let termination_log = args.termination_log.clone();
    let budget = args.cache_budget;
    match publish(args, progress).await {
        Ok((result, cache_dir)) => {
            println!("{result}");
            write_termination_log(&termination_log, &result);
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

/// Reads at most `limit` bytes of the regular file `path`; more is an error, not a
/// truncation. Never through a link: the compile step wrote the directory, and a link to
/// this step's token or cache would have it read that instead. (The compile step has ended
/// by now, so nothing can swap the file between the look and the read.)
fn read_bounded(path: &Path, limit: u64) -> std::io::Result<Vec<u8>> {
    if !std::fs::symlink_metadata(path)?.file_type().is_file() {
        return Err(std::io::Error::other("it is not a regular file"));
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(std::io::Error::other(format!("it is over {limit} bytes")));
    }
    Ok(bytes)
}

/// The compile step's result line as an object, or an empty one: it only fills the report.
fn compile_report(path: Option<&Path>) -> serde_json::Map<String, serde_json::Value> {
    let Some(path) = path else { return Default::default() };
    match read_bounded(path, MAX_RESULT_BYTES).map(|bytes| serde_json::from_slice(&bytes)) {
        Ok(Ok(serde_json::Value::Object(report))) => report,
        _ => {
            tracing::warn!(path = %path.display(), "the compile step's result line cannot be read; the report lacks its phases");
            Default::default()
        }
    }
}

async fn publish(args: PublishArgs, progress: &(dyn Fn(&str) + Sync)) -> Result<(String, PathBuf), Failure> {
    let started = std::time::Instant::now();
    let wasm = read_bounded(&args.module, MAX_MODULE_BYTES)
        .map_err(|e| Failure::transient(format!("cannot read the module {}: {e}", args.module.display())))?;
    progress(&crate::Step::Validating.describe(args.language));
    crate::validate::validate(args.language, &wasm).map_err(|e| Failure::from(BuildError::from(e)))?;
    let mut report = compile_report(args.build_result.as_deref());
    let built = Built {
        digest: Digest::of(&wasm),
        wasm,
        source_digest: args.source_digest,
        cached: report.get("cached").and_then(serde_json::Value::as_bool) == Some(true),
        snapshot: None,
        cache: "n/a",
        cache_problem: None,
        phases: Phases::default(),
    };
    let cache_dir = args
        .cache_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join("wasmless-code-cache"));
    let code = match args.no_code {
        true => None,
        false => {
            progress(&crate::Step::Precompiling.describe(args.language));
            let code = tokio::task::block_in_place(|| crate::precompile_cached(&built, &cache_dir))
                .map_err(Failure::transient)?;
            Some(code)
        }
    };
    progress("publishing");
    let publish_started = std::time::Instant::now();
    let published = publish::publish(&args.publish, &built, code.as_ref(), &built.source_digest)
        .await
        .map_err(Failure::transient)?;
    let publish_seconds = publish_started.elapsed().as_secs_f64();
    // What this step established replaces whatever the compile step said of it.
    report.remove("output");
    report.insert("digest".into(), built.digest.to_string().into());
    report.insert("size".into(), built.wasm.len().into());
    report.insert("sourceDigest".into(), built.source_digest.to_string().into());
    report.insert("published".into(), published.location.clone().into());
    let mut result = serde_json::Value::Object(report);
    if let Some(code) = &code {
        result["code"] = code_report(code);
    }
    if !result["phases"].is_object() {
        result["phases"] = serde_json::json!({});
    }
    let compile_total = result["phases"]["total"].as_f64().unwrap_or(0.0);
    result["phases"]["precompile"] = millis(code.as_ref().map_or(0.0, |code| code.seconds)).into();
    result["phases"]["publish"] = millis(publish_seconds).into();
    // From the compile step's start: the build as the operator reports it, both steps.
    result["phases"]["total"] = millis(compile_total + started.elapsed().as_secs_f64()).into();
    if !result["cache"].is_object() {
        result["cache"] = serde_json::json!({});
    }
    result["cache"]["code"] = code.as_ref().map(|code| code.cache).into();
    if let Some(functions) = code.as_ref().and_then(|code| code.functions) {
        result["cache"]["functions"]["precompile"] =
            serde_json::json!({"reused": functions.0, "compiled": functions.1});
    }
    if let Some(problem) = code.as_ref().and_then(|code| code.cache_problem.clone()) {
        match result["cache"]["problems"].as_array_mut() {
            Some(problems) => problems.push(problem.into()),
            None => result["cache"]["problems"] = serde_json::json!([problem]),
        }
    }
    if !published.config_maps.is_empty() {
        result["configMaps"] = serde_json::json!(published.config_maps);
    }
    if !published.code_config_maps.is_empty() {
        result["codeConfigMaps"] = serde_json::json!(published.code_config_maps);
    }
    Ok((result.to_string(), cache_dir))
}
