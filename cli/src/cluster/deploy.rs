//! `wasmless deploy <function.yaml | dir | handler file>`: applies the Function (the file
//! `kubectl apply` takes, or one made from a bare handler), follows its build with a
//! spinner, and prints the URL once it is Ready, or the compiler's message if it failed.

use super::{Target, explain};
use anyhow::{Context, bail};
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;
use wasmless_operator::Function;
use wasmless_operator::crd::Phase;

/// The field manager of what `deploy` applies, as `kubectl apply --server-side` uses its own.
const FIELD_MANAGER: &str = "wasmless-cli";

#[derive(clap::Args)]
pub struct DeployArgs {
    /// A function.yaml, a directory holding one (or one handler file), or a handler file
    /// (handler.go, handler.rs, handler.wat).
    pub path: PathBuf,
    /// The Function's name, for a bare handler [default: its directory's name].
    #[arg(long)]
    pub name: Option<String>,
    /// How long to wait for Ready before giving up (the build goes on).
    #[arg(long, default_value = "10m", value_parser = wasmless_runtime::config::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub target: Target,
}

pub async fn run(args: DeployArgs) -> anyhow::Result<()> {
    let mut function = manifest(&args.path, args.name.as_deref())?;
    let name = function["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let target = Target {
        namespace: args
            .target
            .namespace
            .clone()
            .or_else(|| function["metadata"]["namespace"].as_str().map(String::from)),
    };
    let (client, namespace) = target.connect().await?;
    function["metadata"]["namespace"] = json!(namespace);
    let api: Api<Function> = Api::namespaced(client.clone(), &namespace);
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&function),
        )
        .await
        .map_err(|e| explain(e, &format!("applying Function {name} in namespace {namespace}")))?;
    let generation = applied.metadata.generation.unwrap_or_default();

    let spinner = ProgressBar::new_spinner().with_style(ProgressStyle::with_template("{spinner} {msg}").unwrap());
    spinner.enable_steady_tick(Duration::from_millis(100));
    spinner.set_message(format!("{name}: applied, waiting for the operator"));
    let deadline = tokio::time::Instant::now() + args.timeout;
    let ready = loop {
        let current = api
            .get(&name)
            .await
            .map_err(|e| explain(e, &format!("reading Function {name}")))?;
        let status = current.status.clone().unwrap_or_default();
        let observed = status.observed_generation.unwrap_or_default() >= generation;
        match status.phase.filter(|_| observed) {
            Some(Phase::Ready) => break current,
            Some(Phase::Failed) => {
                spinner.finish_and_clear();
                let reason = condition(&status, "Built")
                    .map(|c| c.reason.clone())
                    .unwrap_or_default();
                bail!(
                    "Function {name} failed ({reason}):\n{}",
                    status.build_message.unwrap_or_default().trim_end()
                );
            }
            phase => spinner.set_message(progress(&name, phase, &status)),
        }
        if tokio::time::Instant::now() >= deadline {
            spinner.finish_and_clear();
            bail!(
                "Function {name} is not Ready after {:?} ({}); the operator goes on: follow it with `wasmless get {name}`",
                args.timeout,
                progress(&name, status.phase, &status)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let served_by = ready.status.as_ref().and_then(|status| status.served_by);
    if served_by != Some(wasmless_operator::crd::ServedBy::Pool) {
        settle_rollout(&client, &namespace, &name, &spinner).await;
    }
    // Ready means the pods are available; the Service routes to them once their endpoints
    // are published, which can come a moment later for a new Service.
    let service = ready.spec.service.clone().unwrap_or_else(|| name.clone());
    spinner.set_message(format!("{name}: Ready, waiting for Service {service} to list its pods"));
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &namespace);
    let by_service = ListParams::default().labels(&format!("kubernetes.io/service-name={service}"));
    let endpoints_deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while tokio::time::Instant::now() < endpoints_deadline {
        let listed = slices.list(&by_service).await.map(|l| l.items).unwrap_or_default();
        if listed
            .iter()
            .flat_map(|slice| &slice.endpoints)
            .any(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    spinner.finish_and_clear();
    let status = ready.status.unwrap_or_default();
    println!(
        "{name} is Ready: module {}, {} ready replica(s)",
        status.module_digest_short.as_deref().unwrap_or("-"),
        status.ready_replicas.unwrap_or_default()
    );
    println!("URL: {}", status.url.as_deref().unwrap_or("-"));
    // The in-cluster name resolves only in pods; a node reaches the Service's address.
    if let Ok(svc) = Api::<Service>::namespaced(client, &namespace).get(&service).await
        && let Some(spec) = svc.spec
        && let Some(ip) = spec.cluster_ip.filter(|ip| ip != "None")
    {
        println!("From a node: http://{ip}:{}/", ready.spec.server_port);
    }
    Ok(())
}

/// How long `deploy` waits after Ready for the pods that stay.
const ROLLOUT_WAIT: Duration = Duration::from_secs(120);

/// Waits (bounded, quietly giving up) until the Function's Deployment runs only pods of its
/// built template. A new Function is Ready on the pod that waited for its build and was
/// switched to it in place; the Deployment then rolls to the built template and that pod
/// goes, serving on through its drain delay. A request sent before then, and its log line,
/// would be the replaced pod's, and `wasmless logs` reads the pod that stays.
async fn settle_rollout(client: &kube::Client, namespace: &str, name: &str, spinner: &ProgressBar) {
    spinner.set_message(format!(
        "{name}: Ready, waiting for its Deployment to run only the built pods"
    ));
    let deadline = tokio::time::Instant::now() + ROLLOUT_WAIT;
    while tokio::time::Instant::now() < deadline {
        match rolled_out(client, namespace, name).await {
            Ok(true) => return,
            Ok(false) => {}
            Err(error) => {
                // Whoever may deploy but not read Deployments or pods still gets the URL.
                tracing::debug!(%error, "cannot tell whether the rollout is done");
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Whether `name`'s Deployment has rolled to its built template (not the one its pods
/// wait for the first build with) and no pod of an older template is left, terminating or not. A Function
/// served by the pool has no pods to wait for.
async fn rolled_out(client: &kube::Client, namespace: &str, name: &str) -> kube::Result<bool> {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::core::v1::Pod;
    let Some(deployment) = Api::<Deployment>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
    else {
        return Ok(true);
    };
    if wasmless_operator::objects::waits_for_first_build(&deployment) {
        return Ok(false);
    }
    let wanted = deployment.spec.as_ref().and_then(|spec| spec.replicas).unwrap_or(1);
    let status = deployment.status.unwrap_or_default();
    let current = status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas.unwrap_or_default() == wanted
        && status.available_replicas.unwrap_or_default() == wanted
        && status.replicas.unwrap_or_default() == wanted;
    if !current {
        return Ok(false);
    }
    let selector = format!(
        "{}={name},{}=runtime",
        wasmless_artifact::labels::FUNCTION,
        wasmless_operator::objects::COMPONENT_LABEL
    );
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await?;
    Ok(pods.items.len() == usize::try_from(wanted).unwrap_or_default())
}

fn condition<'a>(
    status: &'a wasmless_operator::FunctionStatus,
    kind: &str,
) -> Option<&'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    status.conditions.iter().find(|c| c.type_ == kind)
}

/// The spinner's line: the phase and what the condition that holds it back says.
fn progress(name: &str, phase: Option<Phase>, status: &wasmless_operator::FunctionStatus) -> String {
    let phase = phase.map(Phase::as_str).unwrap_or("Pending");
    let why = match phase {
        "Building" | "Pending" if condition(status, "Built").is_some_and(|c| c.status != "True") => {
            condition(status, "Built")
        }
        _ => condition(status, "Ready"),
    };
    match why {
        Some(c) if !c.message.is_empty() => format!("{name}: {phase}: {}", c.message),
        _ => format!("{name}: {phase}"),
    }
}

/// The Function to apply, as JSON: a function.yaml as written (so `deploy` owns only the
/// fields it names, and an autoscaler's `replicas` is left alone), or one made from a
/// bare handler. Checked here first, so a mistake is reported before anything is sent.
pub fn manifest(path: &Path, name: Option<&str>) -> anyhow::Result<Value> {
    let function = written(path, name, read_function_yaml)?;
    let parsed: Function = serde_json::from_value(function.clone())
        .with_context(|| format!("{} does not describe a Function", path.display()))?;
    let name = parsed.metadata.name.clone().unwrap_or_default();
    let mut problems: Vec<String> = wasmless_operator::crd::name_problem(&name).into_iter().collect();
    problems.extend(parsed.spec.problems());
    if !problems.is_empty() {
        bail!("{}: {}", path.display(), problems.join("; "));
    }
    Ok(function)
}

/// The Function `path` describes, as [`manifest`] reads it but unchecked, a function.yaml
/// read by `read_yaml`.
pub fn written(
    path: &Path,
    name: Option<&str>,
    read_yaml: fn(&Path) -> anyhow::Result<Value>,
) -> anyhow::Result<Value> {
    let yaml = if path.is_dir() && path.join("function.yaml").exists() {
        Some(path.join("function.yaml"))
    } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
        Some(path.to_path_buf())
    } else {
        None
    };
    let mut function = match yaml {
        Some(yaml) if path.is_dir() => {
            let mut function = read_yaml(&yaml)?;
            match wasmless_formats::function_file::handler_beside(&function, &yaml, path)? {
                // The settings as written, the code as the folder without the yaml gives it.
                Some(_) => {
                    let code = from_handler(path)?;
                    for key in ["language", "source", "files"] {
                        if function["spec"].get(key).is_none()
                            && let Some(value) = code["spec"].get(key)
                        {
                            function["spec"][key] = value.clone();
                        }
                    }
                }
                None => add_module_files(&mut function, path)?,
            }
            function
        }
        Some(yaml) => read_yaml(&yaml)?,
        None => from_handler(path)?,
    };
    if let Some(name) = name {
        function["metadata"]["name"] = json!(name);
    }
    Ok(function)
}

/// A function.yaml as written.
fn read_function_yaml(yaml: &Path) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(yaml).with_context(|| format!("cannot read {}", yaml.display()))?;
    let value: Value = serde_yaml::from_str(&text).with_context(|| format!("{} is not YAML", yaml.display()))?;
    if value["apiVersion"] != "wasmless.io/v1alpha1" || value["kind"] != "Function" {
        bail!(
            "{} is not a Function: it needs `apiVersion: wasmless.io/v1alpha1` and `kind: Function`",
            yaml.display()
        );
    }
    Ok(value)
}

/// The files beside the handler in `dir` (go.mod, go.sum, the data files a Go handler
/// ships; Cargo.toml) into a function.yaml's `spec.files`, unless it names files itself.
fn add_module_files(function: &mut Value, dir: &Path) -> anyhow::Result<()> {
    if function["spec"].get("files").is_some() || function["spec"].get("module").is_some() {
        return Ok(());
    }
    let language: wasmless_formats::source::Language = function["spec"]["language"].as_str().unwrap_or("go").parse()?;
    let found = wasmless_formats::folder::files_beside(language, dir)?;
    if !found.is_empty() {
        function["spec"]["files"] = files_json(&found)?;
    }
    Ok(())
}

fn files_json(files: &[wasmless_formats::source::SourceFile]) -> anyhow::Result<Value> {
    let mut map = serde_json::Map::new();
    for file in files {
        let text = String::from_utf8(file.bytes.clone())
            .map_err(|_| anyhow::anyhow!("{} is not UTF-8 text: a Function holds its files as text", file.name))?;
        map.insert(file.name.clone(), json!(text));
    }
    Ok(Value::Object(map))
}

/// A Function around a handler file, or the one handler file of a directory, named after
/// its directory.
fn from_handler(path: &Path) -> anyhow::Result<Value> {
    if path.is_dir() && path.join("Cargo.toml").is_file() && path.join("src/lib.rs").is_file() {
        return from_cargo_package(path);
    }
    let file = if path.is_dir() {
        let found: Vec<PathBuf> = ["handler.go", "handler.rs", "handler.wat", "lib.rs"]
            .iter()
            .map(|n| path.join(n))
            .filter(|p| p.exists())
            .collect();
        match found.as_slice() {
            [one] => one.clone(),
            [] => bail!(
                "{} has no function.yaml and no handler.go, handler.rs or handler.wat",
                path.display()
            ),
            _ => bail!("{} has several handler files: name the one to deploy", path.display()),
        }
    } else {
        path.to_path_buf()
    };
    let language = match file.extension().and_then(|e| e.to_str()) {
        Some("go") => "go",
        Some("rs") => "rust",
        Some("wat") => "wat",
        Some("wasm") => bail!(
            "{}: a prebuilt module is deployed from an OCI registry (`spec.module`), not from a file",
            file.display()
        ),
        _ => bail!(
            "cannot tell the language of {}: use .go, .rs, .wat or a function.yaml",
            file.display()
        ),
    };
    let source = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
    let directory = file
        .canonicalize()
        .ok()
        .and_then(|f| {
            f.parent()
                .and_then(|d| d.file_name())
                .map(|n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let mut function = json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "metadata": {"name": dns_label(&directory)},
        "spec": {"language": language, "source": source},
    });
    // Beside a go.mod (or Cargo.toml), the handler is its directory's module: the module
    // files and the handler's other files go into `files`.
    let dir = file
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let parsed_language: wasmless_formats::source::Language = language.parse()?;
    let module_files = wasmless_formats::source::Source::module_files_in(parsed_language, dir)?;
    if !module_files.is_empty() {
        let all = wasmless_formats::source::Source::read(parsed_language, dir)?;
        let handler_name = file.file_name().map(|n| n.to_string_lossy().into_owned());
        let others: Vec<_> = all
            .all_files()
            .filter(|f| Some(&f.name) != handler_name.as_ref())
            .cloned()
            .collect();
        function["spec"]["files"] = files_json(&others)?;
    } else if path.is_dir() {
        // Without a module, the files a Go handler ships beside it (data, templates): only
        // from a folder named as the Function, never the folder a named file happens to be in.
        let beside = wasmless_formats::folder::files_beside(parsed_language, dir)?;
        if !beside.is_empty() {
            function["spec"]["files"] = files_json(&beside)?;
        }
    }
    Ok(function)
}

/// A Function around a Rust handler laid out as a Cargo package (Cargo.toml, src/lib.rs):
/// src/lib.rs is the source, the other files of src/, Cargo.toml and Cargo.lock its `files`,
/// which is how `wasmless dev` builds the directory, so both compute one digest.
fn from_cargo_package(dir: &Path) -> anyhow::Result<Value> {
    let language = wasmless_formats::source::Language::Rust;
    let all = wasmless_formats::source::Source::read(language, dir)?;
    let (entry, others): (Vec<_>, Vec<_>) = all
        .all_files()
        .cloned()
        .partition(|f| f.name == language.inline_file_name());
    let source = String::from_utf8(entry[0].bytes.clone())
        .map_err(|_| anyhow::anyhow!("{}/src/lib.rs is not UTF-8 text", dir.display()))?;
    let directory = dir
        .canonicalize()
        .ok()
        .and_then(|d| d.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default();
    Ok(json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "metadata": {"name": dns_label(&directory)},
        "spec": {"language": "rust", "source": source, "files": files_json(&others)?},
    }))
}

/// A directory's name as a Function name: lower case, other characters as `-`.
fn dns_label(text: &str) -> String {
    let mapped: String = text
        .to_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    let trimmed = mapped.trim_matches(|c: char| c == '-' || c.is_ascii_digit());
    if trimmed.is_empty() {
        "function".into()
    } else {
        trimmed.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_function_yaml_is_applied_as_written() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let function = manifest(&root.join("examples/hello-go"), None).unwrap();
        assert_eq!(function["metadata"]["name"], "hello");
        assert_eq!(function["spec"]["serverPort"], 9000);
        assert!(
            function["spec"].get("replicas").is_none(),
            "no default is added, so deploy never owns (and resets) an autoscaler's replicas"
        );
    }

    #[test]
    fn a_bare_handler_becomes_a_function_named_after_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("My_Greeter");
        std::fs::create_dir(&project).unwrap();
        let handler =
            "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {}\n";
        std::fs::write(project.join("handler.go"), handler).unwrap();
        for path in [project.clone(), project.join("handler.go")] {
            let function = manifest(&path, None).unwrap();
            assert_eq!(function["metadata"]["name"], "my-greeter");
            assert_eq!(function["spec"]["language"], "go");
            assert_eq!(function["spec"]["source"], handler);
        }
        let renamed = manifest(&project, Some("greeter")).unwrap();
        assert_eq!(renamed["metadata"]["name"], "greeter");
    }

    #[test]
    fn mistakes_are_reported_before_anything_is_sent() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let cases = [
            (write("main.go", "package main\n\nfunc main() {}\n"), "package main"),
            (write("notes.txt", "hello"), "cannot tell the language"),
            (
                write("pod.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\n"),
                "is not a Function",
            ),
            (
                write(
                    "empty.yaml",
                    "apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: empty}\nspec: {source: \"  \"}\n",
                ),
                "source is empty",
            ),
        ];
        for (path, expected) in cases {
            let error = format!("{:#}", manifest(&path, None).unwrap_err());
            assert!(error.contains(expected), "{}: {error}", path.display());
        }
    }

    #[test]
    fn a_module_directory_brings_its_go_mod_go_sum_and_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let project = dir.path().join("uuidfn");
        std::fs::create_dir(&project).unwrap();
        let handler =
            "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {}\n";
        let go_mod = "module example.com/uuidfn\n\ngo 1.21\n\nrequire github.com/google/uuid v1.6.0\n";
        let go_sum = "github.com/google/uuid v1.6.0 h1:NIvaJDMOsjHA8n1jAhLSgzrAzy1Hgr+hNrb57e+94F0=\n";
        std::fs::write(project.join("handler.go"), handler).unwrap();
        std::fs::write(project.join("routes.go"), "package handlers\n").unwrap();
        std::fs::write(project.join("go.mod"), go_mod).unwrap();
        std::fs::write(project.join("go.sum"), go_sum).unwrap();
        std::fs::write(project.join("README.md"), "not a source file").unwrap();
        let function = manifest(&project, None).unwrap();
        assert_eq!(function["metadata"]["name"], "uuidfn");
        assert_eq!(function["spec"]["source"], handler);
        // The folder as laid out: a file beside the handler ships, unless .wasmlessignore
        // lists it.
        assert_eq!(
            function["spec"]["files"],
            json!({"go.mod": go_mod, "go.sum": go_sum, "routes.go": "package handlers\n", "README.md": "not a source file"})
        );
        std::fs::write(project.join(".wasmlessignore"), "README.md\n").unwrap();
        let function = manifest(&project, None).unwrap();
        assert_eq!(
            function["spec"]["files"],
            json!({"go.mod": go_mod, "go.sum": go_sum, "routes.go": "package handlers\n"})
        );

        // A function.yaml beside them (its settings; the handler beside it the source) takes
        // the folder's code as it is without the yaml, unless it names files itself.
        let yaml = "apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: ids}\nspec:\n  language: go\n"
            .to_string();
        std::fs::write(project.join("function.yaml"), &yaml).unwrap();
        let function = manifest(&project, None).unwrap();
        assert_eq!(function["metadata"]["name"], "ids");
        assert_eq!(function["spec"]["source"], handler);
        assert_eq!(
            function["spec"]["files"],
            json!({"go.mod": go_mod, "go.sum": go_sum, "routes.go": "package handlers\n"}),
            "the folder's code as without the yaml"
        );
        std::fs::write(
            project.join("function.yaml"),
            format!("{yaml}  files: {{go.mod: {go_mod:?}}}\n"),
        )
        .unwrap();
        assert_eq!(
            manifest(&project, None).unwrap()["spec"]["files"],
            json!({"go.mod": go_mod})
        );

        // What the operator would refuse is refused before anything is sent.
        std::fs::remove_file(project.join("function.yaml")).unwrap();
        std::fs::remove_file(project.join("go.mod")).unwrap();
        let error = format!("{:#}", manifest(&project, None).unwrap_err());
        assert!(error.contains("go.sum without go.mod"), "{error}");
    }

    #[test]
    fn a_function_yaml_of_settings_takes_the_handler_beside_it_as_dev_does() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("rates");
        std::fs::create_dir(&folder).unwrap();
        let handler =
            "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {}\n";
        std::fs::write(folder.join("handler.go"), handler).unwrap();
        std::fs::write(folder.join("countries.csv"), "code,name\nfr,France\n").unwrap();
        let settings = "apiVersion: wasmless.io/v1alpha1\nkind: Function\nmetadata: {name: rates}\nspec:\n  outbound:\n    allow: [\"http://127.0.0.1:18183\"]\n";
        std::fs::write(folder.join("function.yaml"), settings).unwrap();

        let function = manifest(&folder, None).unwrap();
        assert_eq!(
            function["spec"]["source"], handler,
            "the handler beside the yaml is its source"
        );
        assert_eq!(function["spec"]["language"], "go");
        assert_eq!(function["spec"]["outbound"]["allow"], json!(["http://127.0.0.1:18183"]));
        assert_eq!(
            function["spec"]["files"],
            json!({"countries.csv": "code,name\nfr,France\n"})
        );
        let local = wasmless::function_file::LocalFunction::load(&folder).unwrap();
        let files = [
            ("handler.go", handler.as_bytes()),
            ("countries.csv", "code,name\nfr,France\n".as_bytes()),
        ];
        assert_eq!(
            local.source.digest("1"),
            wasmless_formats::source::files_digest("go", "1", &files),
            "`wasmless dev` builds what the cluster builds"
        );
        assert_eq!(local.watched, folder, "an edit of the handler rebuilds too");

        // A yaml naming another language than the handler's file says so.
        std::fs::write(folder.join("function.yaml"), format!("{settings}  language: rust\n")).unwrap();
        let error = format!("{:#}", manifest(&folder, None).unwrap_err());
        assert!(
            error.contains("spec.language is rust") && error.contains("handler.go"),
            "{error}"
        );
        // A yaml that holds a source too: the file beside it would never be built.
        std::fs::write(
            folder.join("function.yaml"),
            format!("{settings}  source: {handler:?}\n"),
        )
        .unwrap();
        let error = format!("{:#}", manifest(&folder, None).unwrap_err());
        assert!(error.contains("keep one"), "{error}");
        // With no handler beside it either, the error says both ways to give the source.
        std::fs::write(folder.join("function.yaml"), settings).unwrap();
        std::fs::remove_file(folder.join("handler.go")).unwrap();
        let error = wasmless::function_file::LocalFunction::load(&folder)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("spec.source") && error.contains("handler.go"), "{error}");
    }

    #[test]
    fn a_cargo_package_is_deployed_as_its_files_with_the_digest_dev_builds() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let package = root.join("builder/tests/crates/orders");
        let function = manifest(&package, None).unwrap();
        assert_eq!(function["metadata"]["name"], "orders");
        assert_eq!(function["spec"]["language"], "rust");
        let read = |name: &str| std::fs::read_to_string(package.join(name)).unwrap();
        assert_eq!(function["spec"]["source"], read("src/lib.rs"));
        assert_eq!(
            function["spec"]["files"],
            json!({"Cargo.lock": read("Cargo.lock"), "Cargo.toml": read("Cargo.toml"), "money.rs": read("src/money.rs")})
        );
        let mut files: Vec<(&str, &[u8])> = vec![("lib.rs", function["spec"]["source"].as_str().unwrap().as_bytes())];
        let spec_files = function["spec"]["files"].as_object().unwrap();
        files.extend(
            spec_files
                .iter()
                .map(|(name, text)| (name.as_str(), text.as_str().unwrap().as_bytes())),
        );
        let local = wasmless::function_file::LocalFunction::load(&package).unwrap();
        assert_eq!(
            wasmless_formats::source::files_digest("rust", "1", &files),
            local.source.digest("1"),
            "`wasmless dev` builds what the cluster builds"
        );
    }
}
