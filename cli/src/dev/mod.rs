//! `wasmless dev`: build a function, serve it on localhost with the runtime in this
//! process, and rebuild and swap it in whenever its source changes. It serves the Function
//! as the cluster would: the runtime's flags are the operator's (`function_args`), from
//! the same Function `wasmless deploy` would apply, with this machine's ports and
//! directories in place of the pod's, and the Secrets' and ConfigMaps' values given on the
//! command line ([`cluster_values`]).

mod cluster_values;

use anyhow::Context;
use cluster_values::ClusterValues;
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use wasmless::function_file::LocalFunction;
use wasmless_builder::{BuildOptions, Built};
use wasmless_operator::Function;

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
    #[command(flatten)]
    values: ClusterValues,
}

/// The fields of a Function that place or scale it on a cluster: `dev` serves one
/// instance of the latest source, and says so when a file sets them.
const CLUSTER_ONLY_FIELDS: [&str; 9] = [
    "replicas",
    "scale",
    "traffic",
    "service",
    "serverPort",
    "resources",
    "storage",
    "revisionHistoryLimit",
    "module",
];

const POLL: Duration = Duration::from_millis(300);

pub async fn run(args: DevArgs) -> anyhow::Result<()> {
    let function = LocalFunction::load(&args.path)?;
    // What the cluster would be given, checked before a build: a Secret's value that is
    // missing is said now, not after a minute of compiling.
    let (resource, written) = as_applied(&args.path)?;
    let environment = args.values.environment(&resource)?;
    for field in CLUSTER_ONLY_FIELDS
        .iter()
        .filter(|f| written["spec"].get(**f).is_some())
    {
        eprintln!("note: spec.{field} is for the cluster; `wasmless dev` serves one instance of the latest source");
    }
    let work = std::env::temp_dir().join(format!("wasmless-dev-{}-{}", function.name, std::process::id()));
    std::fs::create_dir_all(&work).with_context(|| format!("cannot create {}", work.display()))?;
    let ca_bundle = args.values.ca_bundle_file(&resource, &work)?;
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

    let here = Here {
        module: &module,
        code: &code,
        work: &work,
        ca_bundle: ca_bundle.as_deref(),
    };
    let mut config = runtime_config(&args, &resource, &here)?;
    config.environment = Some(environment);
    let watched = function.watched.clone();
    let name = kube::ResourceExt::name_any(&resource);
    let served = settings(&resource);
    tokio::spawn(rebuild_on_change(
        watched.clone(),
        module,
        options,
        args.path.clone(),
        served,
    ));
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

/// The Function at `path` as `wasmless deploy` would apply it, and as written. A
/// function.yaml without `apiVersion` and `kind` is served all the same (`kubectl apply`
/// would want them), and so is one whose name the cluster would refuse; a spec it would
/// refuse is not.
fn as_applied(path: &Path) -> anyhow::Result<(Function, serde_json::Value)> {
    fn lenient_yaml(yaml: &Path) -> anyhow::Result<serde_json::Value> {
        let text = std::fs::read_to_string(yaml).with_context(|| format!("cannot read {}", yaml.display()))?;
        let mut value: serde_json::Value =
            serde_yaml::from_str(&text).with_context(|| format!("{} is not YAML", yaml.display()))?;
        if let Some(object) = value.as_object_mut() {
            object.entry("apiVersion").or_insert("wasmless.io/v1alpha1".into());
            object.entry("kind").or_insert("Function".into());
        }
        Ok(value)
    }
    // A module file has no Function around it: the runtime's defaults, as a Function's.
    let written = if path.extension().is_some_and(|e| e == "wasm") {
        let name = path
            .file_stem()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        serde_json::json!({"apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": name}, "spec": {}})
    } else {
        crate::cluster::deploy::written(path, None, lenient_yaml)?
    };
    let resource: Function = serde_json::from_value(written.clone())
        .with_context(|| format!("{} does not describe a Function", path.display()))?;
    // What the cluster refuses in the spec, dev refuses too (a misspelt isolation would
    // otherwise be served as the default).
    let problems = resource.spec.problems();
    if !problems.is_empty() {
        anyhow::bail!("{}: {}", path.display(), problems.join("; "));
    }
    Ok((resource, written))
}

/// What a running runtime keeps of a Function: its flags, its variables and where its
/// certificates come from.
type Settings = (
    Vec<String>,
    Vec<k8s_openapi::api::core::v1::EnvVar>,
    Vec<k8s_openapi::api::core::v1::EnvFromSource>,
    Option<wasmless_operator::crd::CaBundle>,
);

fn settings(resource: &Function) -> Settings {
    use wasmless_operator::objects::{Expansion, function_args, function_env, handler_env_from};
    let ca_bundle = resource.spec.outbound.as_ref().and_then(|o| o.ca_bundle.clone());
    (
        function_args(resource),
        function_env(resource, Expansion::None),
        handler_env_from(resource),
        ca_bundle,
    )
}

/// Where this machine keeps what a pod has in its volumes.
struct Here<'a> {
    module: &'a Path,
    code: &'a (PathBuf, wasmless_artifact::Digest),
    work: &'a Path,
    ca_bundle: Option<&'a Path>,
}

/// The runtime's configuration for serving `resource` here: the operator's flags for it,
/// with this machine's ports and directories in place of the pod's. The module is read
/// without a pinned digest (from `module.wasm.sha256`), so a rebuild is swapped in.
fn runtime_config(args: &DevArgs, resource: &Function, here: &Here) -> anyhow::Result<wasmless_runtime::Config> {
    let mut flags: Vec<String> = vec![
        "wasmless-runtime".into(),
        "--module".into(),
        here.module.display().to_string(),
        "--code".into(),
        here.code.0.display().to_string(),
        "--code-digest".into(),
        here.code.1.to_string(),
    ];
    let mut placed = vec![
        ("--port", args.port.to_string()),
        ("--admin-port", args.admin_port.to_string()),
        ("--bind", args.bind.clone()),
        ("--cache-dir", here.work.join("compiled").display().to_string()),
        ("--watch-interval", "200ms".into()),
        ("--drain-delay", "0s".into()),
        ("--shutdown-grace", "2s".into()),
    ];
    if let Some(ca_bundle) = here.ca_bundle {
        placed.push(("--outbound-ca", ca_bundle.display().to_string()));
    }
    flags.extend(placed_here(
        wasmless_operator::objects::function_args(resource),
        &placed,
    ));
    <wasmless_runtime::Config as clap::Parser>::try_parse_from(flags)
        .context("the runtime refuses the flags of this Function")
}

/// `args` with each flag of `placed` given its value here (added where `args` lacks it).
fn placed_here(mut args: Vec<String>, placed: &[(&str, String)]) -> Vec<String> {
    for (flag, value) in placed {
        match args.iter().position(|arg| arg == flag) {
            Some(at) if at + 1 < args.len() => args[at + 1] = value.clone(),
            _ => args.extend([flag.to_string(), value.clone()]),
        }
    }
    args
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
        wasmless_host::engine::PORTABLE_TARGET
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

async fn rebuild_on_change(watched: PathBuf, module: PathBuf, options: BuildOptions, path: PathBuf, served: Settings) {
    let modified = |path: &Path| {
        let of = |path: &Path| {
            std::fs::metadata(path)
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH)
        };
        // A handler's folder: the latest change of any file in it or its sub-folders (go.mod,
        // go.sum, the handler's, its templates and data, a Cargo package's src/).
        fn latest(dir: &Path, depth: usize, of: &dyn Fn(&Path) -> SystemTime) -> SystemTime {
            let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
            entries
                .filter(|entry| !entry.file_name().to_string_lossy().starts_with('.') && entry.file_name() != "target")
                .map(|entry| match entry.path() {
                    sub if depth > 0 && sub.is_dir() => latest(&sub, depth - 1, of).max(of(&sub)),
                    file => of(&file),
                })
                .fold(of(dir), SystemTime::max)
        }
        latest(path, 8, &of)
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
        // The source is swapped in; the rest of the spec is the runtime's flags, which a
        // running runtime keeps.
        if as_applied(&path).is_ok_and(|(resource, _)| settings(&resource) != served) {
            eprintln!(
                "note: the Function's settings changed (limits, env, outbound): restart `wasmless dev` to serve them; the source is rebuilt now"
            );
        }
        match build_with_progress(&function, &options).await {
            Ok(built) => match install(&module, &built) {
                Ok(()) => eprintln!("swapping in {}", built.digest),
                Err(error) => eprintln!("cannot write the module: {error}"),
            },
            Err(message) => eprintln!("{message}\nstill serving the previous version"),
        }
    }
}

#[cfg(test)]
mod tests;
