//! `wasmless dev`: build a function, serve it on localhost with the runtime in this
//! process, and rebuild and swap it in whenever its source changes.

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use wasmless::function_file::LocalFunction;
use wasmless_builder::{BuildOptions, Built};

#[derive(clap::Args)]
pub struct DevArgs {
    /// A function directory, a function.yaml, or a handler source file.
    path: PathBuf,
    #[arg(long, default_value_t = wasmless_artifact::ports::HTTP)]
    port: u16,
    #[arg(long, default_value_t = wasmless_artifact::ports::ADMIN)]
    admin_port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    bind: String,
}

const POLL: Duration = Duration::from_millis(300);

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let function = LocalFunction::load(&args.path)?;
    let work = std::env::temp_dir().join(format!("wasmless-dev-{}-{}", function.name, std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let module = work.join("module.wasm");
    // WASMLESS_GOPROXY names the module proxy of a handler with a go.mod, and
    // WASMLESS_CARGO_REGISTRY the crates registry of one with a Cargo.toml, as for `wasmless build`.
    let options = BuildOptions::with_cache_dir(wasmless_builder::command::default_cache_dir())
        .with_go_proxy_from_env()
        .with_cargo_registry_from_env();

    let built = build_with_progress(&function, &options)
        .await
        .map_err(|message| anyhow::anyhow!("{message}\n\nfix the source and run `wasmless dev` again"))?;
    install(&module, &built)?;
    // The first start loads precompiled code, as a new pod does; rebuilds are swapped in by
    // the runtime, which compiles them (the builder would only compile them a second time).
    let code = precompile_with_progress(&built, &work).await?;

    let config = runtime_config(&args, &function, &module, &work, &code);
    let watched = function.watched.clone();
    let name = function.name.clone();
    tokio::spawn(rebuild_on_change(watched.clone(), module, options));
    wasmless_runtime::serve(config, wasmless_runtime::shutdown_signal(), move |bound| {
        eprintln!(
            "serving {name} on http://{} (metrics on http://{}/metrics)\nedit {} to rebuild; Ctrl-C stops",
            bound.function,
            bound.admin,
            watched.display()
        );
    })
    .await?;
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}

fn runtime_config(
    args: &DevArgs,
    function: &LocalFunction,
    module: &Path,
    work: &Path,
    code: &(PathBuf, wasmless_artifact::Digest),
) -> wasmless_runtime::Config {
    let mut flags: Vec<String> = vec![
        "wasmless-runtime".into(),
        "--module".into(),
        module.display().to_string(),
        "--code".into(),
        code.0.display().to_string(),
        "--code-digest".into(),
        code.1.to_string(),
        "--function".into(),
        function.name.clone(),
        "--bind".into(),
        args.bind.clone(),
        "--port".into(),
        args.port.to_string(),
        "--admin-port".into(),
        args.admin_port.to_string(),
        "--watch-interval".into(),
        "200ms".into(),
        "--shutdown-grace".into(),
        "2s".into(),
        "--cache-dir".into(),
        work.join("compiled").display().to_string(),
    ];
    let limits = &function.limits;
    for (flag, value) in [
        ("--memory-limit", limits.memory.clone()),
        ("--timeout", limits.timeout.clone()),
        ("--max-concurrency", limits.max_concurrency.map(|n| n.to_string())),
        ("--max-request-body", limits.max_request_body.clone()),
        ("--isolation", limits.isolation.clone()),
    ] {
        if let Some(value) = value {
            flags.extend([flag.to_string(), value]);
        }
    }
    for (key, value) in &function.env {
        flags.extend(["--env".to_string(), format!("{key}={value}")]);
    }
    <wasmless_runtime::Config as clap::Parser>::parse_from(flags)
}

async fn build_with_progress(function: &LocalFunction, options: &BuildOptions) -> Result<Built, String> {
    let spinner = ProgressBar::new_spinner().with_style(ProgressStyle::with_template("{spinner} {msg}").unwrap());
    spinner.enable_steady_tick(Duration::from_millis(100));
    let language = function.source.language;
    let result = tokio::task::block_in_place(|| {
        wasmless_builder::build(&function.source, options, &|step| {
            spinner.set_message(step.describe(language))
        })
    });
    spinner.finish_and_clear();
    let built = result.map_err(|error| format!("build failed: {}", error.status_message()))?;
    let snapshot = built.snapshot.as_ref().map_or(String::new(), |s| {
        format!(
            ", a Go reactor snapshotted in {:.2} s with {} KiB of memory",
            s.seconds,
            s.memory_bytes / 1024
        )
    });
    eprintln!(
        "built {} ({} bytes{}{snapshot})",
        built.digest,
        built.wasm.len(),
        if built.cached { ", from the build cache" } else { "" }
    );
    Ok(built)
}

/// Compiles the module to native code as the build Job does, into `work`.
async fn precompile_with_progress(built: &Built, work: &Path) -> anyhow::Result<(PathBuf, wasmless_artifact::Digest)> {
    let spinner = ProgressBar::new_spinner().with_style(ProgressStyle::with_template("{spinner} {msg}").unwrap());
    spinner.enable_steady_tick(Duration::from_millis(100));
    spinner.set_message(format!(
        "compiling to native code for {}",
        wasmless_runtime::engine::PORTABLE_TARGET
    ));
    let code = tokio::task::block_in_place(|| wasmless_builder::precompile(built));
    spinner.finish_and_clear();
    let code = code?;
    let path = work.join("module.cwasm.lz4");
    std::fs::write(&path, &code.artifact).with_context(|| format!("cannot write {}", path.display()))?;
    eprintln!(
        "compiled to native code for {} in {:.1}s ({} bytes compressed)",
        code.target,
        code.seconds,
        code.artifact.len()
    );
    Ok((path, code.digest))
}

/// Puts a module where the runtime watches: the digest file first is not enough (the
/// runtime would see new digest, old module), so both are renamed into place and the
/// runtime's reload settles a mismatch by looking again.
fn install(module: &Path, built: &Built) -> anyhow::Result<()> {
    let digest_file = PathBuf::from(format!("{}.sha256", module.display()));
    let staged_module = module.with_extension("wasm.new");
    let staged_digest = module.with_extension("sha256.new");
    std::fs::write(&staged_module, &built.wasm)?;
    std::fs::write(&staged_digest, built.digest.to_string())?;
    std::fs::rename(&staged_module, module)?;
    std::fs::rename(&staged_digest, &digest_file)?;
    Ok(())
}

async fn rebuild_on_change(watched: PathBuf, module: PathBuf, options: BuildOptions) {
    let modified = |path: &Path| {
        let of = |path: &Path| {
            std::fs::metadata(path)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        // A module's directory: the latest change of any file in it (go.mod, go.sum, the
        // handler's), and in its src/ (a Cargo package's modules).
        let files = [path.to_path_buf(), path.join("src")]
            .into_iter()
            .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten());
        files.map(|entry| of(&entry.path())).fold(of(path), SystemTime::max)
    };
    let mut last = modified(&watched);
    loop {
        tokio::time::sleep(POLL).await;
        let now = modified(&watched);
        if now == last {
            continue;
        }
        last = now;
        let function = match LocalFunction::load(&watched) {
            Ok(function) => function,
            Err(error) => {
                eprintln!("cannot read the changed source ({error:#}); still serving the previous version");
                continue;
            }
        };
        match build_with_progress(&function, &options).await {
            Ok(built) => match install(&module, &built) {
                Ok(()) => eprintln!("swapping in {}", built.digest),
                Err(error) => eprintln!("cannot write the module: {error}"),
            },
            Err(message) => eprintln!("{message}\nstill serving the previous version"),
        }
    }
}
