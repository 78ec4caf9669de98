//! Density of a pool *pod* on the test cluster: a thousand Functions with `scale.min: 0` in
//! one namespace, all served by its one pool pod, reached through their own Services as
//! users reach them. What the pod's process holds per loaded Function, and the first
//! request to a Function not loaded yet against one that is.
//!
//! A thousand builds would take the cluster most of an hour, so the bench publishes each
//! Function's build itself, as its build Job would (`wasmless_builder::publish`, under the
//! source digest the operator computes for the Function's source): the base example built
//! once by `wasmless-builder`, each Function's module that build with a custom section
//! naming it (so its digest is its own), and the base's native code packaged for that
//! digest (custom sections are not compiled). Each Function's source is the example's
//! with a comment naming it, which would build to the same code. The operator then finds
//! every build done, runs no Job, and serves each Function from the pool: entries, Services
//! and the pool's reads of module and code through the API are all the real ones.
//!
//! Needs `kubectl` on PATH for a cluster with the operator installed from deploy/
//! (`bench/cluster.sh density`). For its run the operator is set to one pool pod, a
//! budget of loaded code above what a thousand Functions take, and no loading ahead (so
//! a first request is what loads a Function); its settings are restored after.

use crate::measure::{Resident, resident_mib};
use crate::pool::{DensityRow, density_table, percentile, with_custom_section};
use crate::scenarios::{Settings, build_example, example_source};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};
use wasmless_artifact::Digest;

pub const HEADING: &str = crate::report::POOL_POD_HEADING;

const NAMESPACE: &str = "bench-density";
const OPERATOR: &str = "wasmless-operator";
const OPERATOR_NAMESPACE: &str = "wasmless-system";
/// The operator's settings for this run, restored after it.
const OPERATOR_ENV: [(&str, &str); 3] = [
    ("WASMLESS_POOL_REPLICAS", "1"),
    ("WASMLESS_POOL_MEMORY_BUDGET", "6Gi"),
    ("WASMLESS_POOL_LOAD_AHEAD", "false"),
];
/// The pool's admin port (`/pool`, `/metrics`).
const POOL_ADMIN_PORT: u16 = wasmless_artifact::ports::ADMIN;
/// Builds published at once.
const CONCURRENT_PUBLISHES: usize = 8;

pub struct PodDensity {
    pub functions: usize,
    pub rows: Vec<DensityRow>,
    /// Each group's first loads, phase by phase: the mean milliseconds of each phase.
    pub phases: Vec<(String, Vec<(String, f64)>)>,
    pub empty: Resident,
    pub all_loaded: Resident,
    pub loaded_reported: f64,
    /// From `kubectl apply` of the Functions to the pool pod listening for all of them.
    pub apply_to_listening_s: f64,
    pub published_mib: f64,
    pub started: String,
}

struct Group {
    name: &'static str,
    example: &'static str,
    language: &'static str,
    first: usize,
    count: usize,
}

pub fn run(settings: &Settings, functions: usize, go_functions: usize) -> anyhow::Result<PodDensity> {
    let started = crate::report::chrono_free_now();
    let builder_version = operator_builder_version()?;
    let rust_functions = functions.saturating_sub(go_functions);
    let groups = [
        Group {
            name: "Rust hello (component)",
            example: "hello-rust",
            language: "rust",
            first: 0,
            count: rust_functions,
        },
        Group {
            name: "Goless sample (Go reactor, snapshotted)",
            example: "hello-go",
            language: "go",
            first: rust_functions,
            count: functions - rust_functions,
        },
    ];
    kubectl(&[
        "delete",
        "namespace",
        NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=600s",
    ])?;
    kubectl(&["create", "namespace", NAMESPACE])?;
    let _operator = OperatorSettings::set()?;

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut code_mib = BTreeMap::new();
    let mut published = 0usize;
    let mut objects = Vec::new();
    for group in &groups {
        eprintln!("building {} with wasmless-builder", group.example);
        let base = build_example(settings, group.example, group.language)?;
        let source = example_source(settings, group.example)?;
        let wasm = std::fs::read(&base.path)?;
        eprintln!("publishing {} builds of {}", group.count, group.name);
        let (code_bytes, bytes) = runtime.block_on(publish_group(group, &wasm, &source, &builder_version))?;
        code_mib.insert(group.name, code_bytes as f64 / (1 << 20) as f64);
        published += bytes;
        for index in group.first..group.first + group.count {
            objects.push(json!({
                "apiVersion": "wasmless.io/v1alpha1",
                "kind": "Function",
                "metadata": {"name": function_name(index), "namespace": NAMESPACE},
                "spec": {
                    "language": group.language,
                    "source": variant_source(&source, index),
                    "scale": {"min": 0},
                },
            }));
        }
    }

    let list = settings.work("density").join("functions.json");
    std::fs::write(
        &list,
        json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string(),
    )?;
    eprintln!("creating {functions} Functions");
    let applied = Instant::now();
    kubectl(&["create", "-f", &list.display().to_string()])?;
    let pool_ip = wait_for_pool(functions)?;
    let apply_to_listening_s = applied.elapsed().as_secs_f64();
    let jobs = kubectl(&["get", "jobs", "-n", NAMESPACE, "-o", "name"])?;
    if !jobs.trim().is_empty() {
        bail!(
            "the operator started build Jobs ({}): the source digests published here are not the ones it computes (builder version {builder_version})",
            jobs.lines().count()
        );
    }
    let services = service_addresses()?;
    let pid = pool_pid(&pool_ip)?;
    eprintln!("waiting until every Service takes connections");
    for index in 0..functions {
        wait_connectable(services[&function_name(index)])?;
    }
    let empty = resident_mib(pid);

    let mut rows = Vec::new();
    let mut phases = Vec::new();
    let mut before = empty;
    let admin = SocketAddr::new(pool_ip.parse()?, POOL_ADMIN_PORT);
    let mut phases_before = LoadPhaseTotals::scraped(&http_get(admin, "/metrics")?);
    for group in groups.iter().filter(|group| group.count > 0) {
        eprintln!("first requests: {}", group.name);
        let mut first_requests = Vec::with_capacity(group.count);
        for index in group.first..group.first + group.count {
            first_requests.push(timed_get(services[&function_name(index)])?);
        }
        let after = resident_mib(pid);
        let phases_after = LoadPhaseTotals::scraped(&http_get(admin, "/metrics")?);
        phases.push((group.name.to_string(), phases_after.mean_ms_since(&phases_before)));
        phases_before = phases_after;
        let mut loaded = Vec::with_capacity(group.count);
        for index in group.first..group.first + group.count {
            loaded.push(timed_get(services[&function_name(index)])?);
        }
        rows.push(DensityRow {
            name: group.name.to_string(),
            functions: group.count,
            rss_per_function_mib: (after.rss - before.rss) / group.count.max(1) as f64,
            private_per_function_mib: (after.private - before.private) / group.count.max(1) as f64,
            code_mib: code_mib[group.name],
            first_request_p50_ms: percentile(&mut first_requests, 0.5),
            first_request_p90_ms: percentile(&mut first_requests, 0.9),
            loaded_p50_ms: percentile(&mut loaded, 0.5),
            loaded_p90_ms: percentile(&mut loaded, 0.9),
        });
        before = after;
    }
    let metrics = http_get(admin, "/metrics")?;
    let loaded_reported = metrics
        .lines()
        .find_map(|line| line.strip_prefix("wasmless_pool_functions_loaded "))
        .and_then(|value| value.trim().parse().ok())
        .context("the pool exports no wasmless_pool_functions_loaded")?;
    eprintln!("deleting the namespace {NAMESPACE}");
    kubectl(&["delete", "namespace", NAMESPACE, "--wait=true", "--timeout=600s"])?;
    Ok(PodDensity {
        functions,
        rows,
        phases,
        empty,
        all_loaded: before,
        loaded_reported,
        apply_to_listening_s,
        published_mib: published as f64 / (1 << 20) as f64,
        started,
    })
}

/// `wasmless_load_phase_seconds`' sums and counts by phase, as one scrape of the pool has them.
#[derive(Default)]
struct LoadPhaseTotals(std::collections::BTreeMap<String, (f64, f64)>);

impl LoadPhaseTotals {
    fn scraped(metrics: &str) -> Self {
        let mut totals = Self::default();
        for line in metrics.lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (sum, rest) = if let Some(rest) = series.strip_prefix("wasmless_load_phase_seconds_sum{") {
                (true, rest)
            } else if let Some(rest) = series.strip_prefix("wasmless_load_phase_seconds_count{") {
                (false, rest)
            } else {
                continue;
            };
            let Some(phase) = rest.split("phase=\"").nth(1).and_then(|rest| rest.split('"').next()) else {
                continue;
            };
            let entry = totals.0.entry(phase.to_string()).or_default();
            if sum { entry.0 += value } else { entry.1 += value }
        }
        totals
    }

    /// The mean milliseconds of each phase over the loads since `before`, in load order.
    fn mean_ms_since(&self, before: &Self) -> Vec<(String, f64)> {
        const ORDER: [&str; 7] = ["fetch", "verify", "place", "open", "compile", "files", "link"];
        ORDER
            .iter()
            .filter_map(|phase| {
                let (sum, count) = self.0.get(*phase).copied().unwrap_or_default();
                let (sum_before, count_before) = before.0.get(*phase).copied().unwrap_or_default();
                let loads = count - count_before;
                (loads > 0.0).then(|| (phase.to_string(), (sum - sum_before) / loads * 1000.0))
            })
            .collect()
    }
}

fn function_name(index: usize) -> String {
    format!("density-{index}")
}

fn variant_source(source: &str, index: usize) -> String {
    format!("{source}// {} (bench/src/pool_pod.rs)\n", function_name(index))
}

/// Publishes the build of each Function of `group` as its Job would. The size of the
/// native code of one, and the bytes published in all.
async fn publish_group(
    group: &Group,
    wasm: &[u8],
    source: &str,
    builder_version: &str,
) -> anyhow::Result<(usize, usize)> {
    use futures::{StreamExt, TryStreamExt};
    use wasmless_host::precompiled::{compile_native, package};
    let engine = wasmless_host::precompiled::precompile_engine().map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let abi = wasmless_host::abi::detect(wasm)?;
    let cwasm = compile_native(&engine, abi, wasm).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let engine_hash = wasmless_host::engine::engine_hash(&engine);
    let publishes = (group.first..group.first + group.count).map(|index| {
        let name = function_name(index);
        let variant = with_custom_section(wasm, &name);
        let digest = Digest::of(&variant);
        let source_digest = Digest::of_source(
            group.language,
            builder_version,
            variant_source(source, index).as_bytes(),
        );
        let artifact = package(&engine, abi, &cwasm, digest, false);
        let bytes = variant.len() + artifact.len();
        let code = wasmless_builder::CompiledCode {
            digest: Digest::of(&artifact),
            artifact,
            module_digest: digest,
            engine: engine_hash.clone(),
            target: wasmless_host::engine::PORTABLE_TARGET,
            seconds: 0.0,
            cache: "off",
            cache_problem: None,
            functions: None,
        };
        let built = wasmless_builder::Built {
            wasm: variant,
            digest,
            source_digest,
            cached: false,
            snapshot: None,
            cache: "miss",
            cache_problem: None,
            phases: Default::default(),
        };
        async move {
            let destination = wasmless_builder::publish::Destination::ConfigMap {
                namespace: NAMESPACE.into(),
                function: name.clone(),
            };
            wasmless_builder::publish::publish(&destination, &built, Some(&code), &source_digest)
                .await
                .with_context(|| format!("publishing the build of {name}"))?;
            anyhow::Ok(bytes)
        }
    });
    let sizes: Vec<usize> = futures::stream::iter(publishes)
        .buffer_unordered(CONCURRENT_PUBLISHES)
        .try_collect()
        .await?;
    Ok((cwasm.len(), sizes.iter().sum()))
}

/// The builder version the operator digests sources with (its `WASMLESS_BUILDER_VERSION`,
/// else its builder image).
fn operator_builder_version() -> anyhow::Result<String> {
    let env = kubectl(&[
        "get",
        "deploy",
        OPERATOR,
        "-n",
        OPERATOR_NAMESPACE,
        "-o",
        "jsonpath={range .spec.template.spec.containers[0].env[*]}{.name}={.value}{\"\\n\"}{end}",
    ])?;
    let value = |key: &str| {
        env.lines()
            .find_map(|line| line.strip_prefix(&format!("{key}=")))
            .filter(|value| !value.is_empty())
            .map(str::to_string)
    };
    value("WASMLESS_BUILDER_VERSION")
        .or_else(|| value("WASMLESS_BUILDER_IMAGE"))
        .context("the operator's Deployment sets neither WASMLESS_BUILDER_VERSION nor WASMLESS_BUILDER_IMAGE")
}

/// The operator with this run's pool settings; its own again when dropped.
struct OperatorSettings;

impl OperatorSettings {
    fn set() -> anyhow::Result<Self> {
        let mut args = vec!["set", "env", "deploy", OPERATOR, "-n", OPERATOR_NAMESPACE];
        let pairs: Vec<String> = OPERATOR_ENV.iter().map(|(k, v)| format!("{k}={v}")).collect();
        args.extend(pairs.iter().map(String::as_str));
        kubectl(&args)?;
        kubectl(&[
            "rollout",
            "status",
            "deploy",
            OPERATOR,
            "-n",
            OPERATOR_NAMESPACE,
            "--timeout=180s",
        ])?;
        Ok(Self)
    }
}

impl Drop for OperatorSettings {
    fn drop(&mut self) {
        let mut args = vec!["set", "env", "deploy", OPERATOR, "-n", OPERATOR_NAMESPACE];
        let unset: Vec<String> = OPERATOR_ENV.iter().map(|(k, _)| format!("{k}-")).collect();
        args.extend(unset.iter().map(String::as_str));
        if let Err(error) = kubectl(&args) {
            eprintln!("restoring the operator's settings failed: {error:#}");
        }
    }
}

/// Waits until the namespace's one pool pod is ready and listens for `functions`
/// Functions, each Ready and served by the pool; its pod IP.
fn wait_for_pool(functions: usize) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut said = String::new();
    loop {
        let (served, ip, listening) = pool_progress()?;
        let now = format!("{served} of {functions} Functions served by the pool, {listening} listening in its pod");
        if now != said {
            eprintln!("  {now}");
            said = now;
        }
        if let Some(ip) = ip
            && served == functions
            && listening == functions
        {
            return Ok(ip);
        }
        if Instant::now() > deadline {
            bail!("after 15 minutes: {said}");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn pool_progress() -> anyhow::Result<(usize, Option<String>, usize)> {
    let listed: Value = serde_json::from_str(&kubectl(&["get", "fn", "-n", NAMESPACE, "-o", "json"])?)?;
    let served = listed["items"].as_array().map_or(0, |items| {
        items
            .iter()
            .filter(|f| f.pointer("/status/servedBy").and_then(Value::as_str) == Some("pool"))
            .filter(|f| f.pointer("/status/phase").and_then(Value::as_str) == Some("Ready"))
            .count()
    });
    let pods: Value = serde_json::from_str(&kubectl(&[
        "get",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "wasmless.io/component=pool",
        "-o",
        "json",
    ])?)?;
    let ready: Vec<String> = pods["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|pod| pod.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|pod| {
            pod.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .filter_map(|pod| pod.pointer("/status/podIP").and_then(Value::as_str).map(str::to_string))
        .collect();
    let [ip] = ready.as_slice() else {
        return Ok((served, None, 0));
    };
    let listening = http_get(SocketAddr::new(ip.parse()?, POOL_ADMIN_PORT), "/pool")
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(text.split("\r\n\r\n").nth(1)?).ok())
        .and_then(|status| {
            status["functions"]
                .as_object()
                .map(|f| f.values().filter(|f| f["listening"] == true).count())
        })
        .unwrap_or(0);
    Ok((served, Some(ip.clone()), listening))
}

/// Each Function's Service, by name: its ClusterIP and port.
fn service_addresses() -> anyhow::Result<BTreeMap<String, SocketAddr>> {
    let listed: Value = serde_json::from_str(&kubectl(&["get", "svc", "-n", NAMESPACE, "-o", "json"])?)?;
    let mut addresses = BTreeMap::new();
    for service in listed["items"].as_array().into_iter().flatten() {
        let name = service
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let (Some(ip), Some(port)) = (
            service.pointer("/spec/clusterIP").and_then(Value::as_str),
            service.pointer("/spec/ports/0/port").and_then(Value::as_u64),
        ) else {
            continue;
        };
        let Ok(ip) = ip.parse() else { continue };
        addresses.insert(name.to_string(), SocketAddr::new(ip, u16::try_from(port)?));
    }
    Ok(addresses)
}

/// The pool pod's process on this node: the `wasmless-runtime --pool` whose pod IP is `ip`.
fn pool_pid(ip: &str) -> anyhow::Result<u32> {
    let wanted = format!("WASMLESS_POD_IP={ip}");
    for entry in std::fs::read_dir("/proc")? {
        let entry = entry?;
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if !cmdline.split(|b| *b == 0).any(|arg| arg == b"--pool") {
            continue;
        }
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|var| var == wanted.as_bytes()) {
            return Ok(pid);
        }
    }
    bail!(
        "no process on this node is the pool pod at {ip} (the bench reads its memory from /proc, so runs on the node as root)"
    )
}

fn wait_connectable(address: SocketAddr) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_err() {
        if Instant::now() > deadline {
            bail!("{address} took no connection for 2 minutes");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// One GET / on a new connection through the Service: the time to the whole response,
/// which must be a 200.
fn timed_get(address: SocketAddr) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let response = http_get(address, "/")?;
    let elapsed = started.elapsed();
    if !response.starts_with("HTTP/1.1 200") {
        bail!("{address} answered {}", &response[..response.len().min(200)]);
    }
    Ok(elapsed)
}

fn http_get(address: SocketAddr, path: &str) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    Ok(String::from_utf8_lossy(&response).into_owned())
}

fn kubectl(args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("kubectl")
        .args(args)
        .output()
        .context("running kubectl (bench/cluster.sh puts the test cluster's on PATH)")?;
    if !output.status.success() {
        bail!(
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8(output.stdout)?)
}

pub fn section(density: &PodDensity) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{HEADING}\n\nOne pool pod on the test cluster serving {} Functions with `scale.min: 0` in one namespace, each reached through its own Service (ClusterIP, kube-proxy) from the node, as the pod-density run above but through everything a cluster adds: the Functions' entries, the pool reading each module and its code from ConfigMaps through the API server, digests checked. The operator ran with `--pool-replicas 1`, `--pool-memory-budget 6Gi` and `--pool-load-ahead false` (a first request is what loads a Function). The builds were published by the bench as build Jobs publish them ({:.0} MiB of modules and compiled code before the modules' compression, in ConfigMaps): each Function's source is the example's with a comment naming it, its module the example's build with a custom section naming it, so each digest is its own and its code is the example's (bench/src/pool_pod.rs says why). Requests are sequential GET / on a new connection, from the node, with the cluster on the same 2 cores ({}).\n",
        density.functions, density.published_mib, density.started
    );
    out.push_str(&density_table(&density.rows.iter().collect::<Vec<_>>()));
    if !density.phases.is_empty() {
        out.push_str(
            "\nWhere a first request's load goes, phase by phase (each phase's mean over the group's loads that had it, from the pool's `wasmless_load_phase_seconds`; the rest of a first request is the connection, the first instantiation and the handler):\n\n",
        );
        for (group, phases) in &density.phases {
            let phases: Vec<String> = phases.iter().map(|(phase, ms)| format!("{phase} {ms:.2} ms")).collect();
            let _ = writeln!(out, "- {group}: {}", phases.join(", "));
        }
    }
    let _ = writeln!(
        out,
        "\n- the pool pod's process: {:.1} MiB of RSS ({:.1} MiB private) listening for all {} and nothing loaded, {:.1} MiB ({:.1} MiB private) with all loaded (`wasmless_pool_functions_loaded` said {})\n- `kubectl create` of the {} Functions to the pool pod listening for every one: {:.1} s (the operator's reconciles, entries, the pool's table)\n- against one pool process on loopback (the section above), a loaded Function costs the same memory; a first request costs more, the pool reading the module and its code through the API server (6 MB of code for the Goless sample) where the process read files\n\n`bench/cluster.sh density` (rewrites this section).",
        density.empty.rss,
        density.empty.private,
        density.functions,
        density.all_loaded.rss,
        density.all_loaded.private,
        density.loaded_reported,
        density.functions,
        density.apply_to_listening_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_groups_phases_are_the_means_of_the_loads_since_the_scrape_before() {
        let scrape = |fetch_sum: f64, loads: f64| {
            format!(
                "# TYPE wasmless_load_phase_seconds histogram\n\
                 wasmless_load_phase_seconds_sum{{phase=\"fetch\"}} {fetch_sum}\n\
                 wasmless_load_phase_seconds_count{{phase=\"fetch\"}} {loads}\n\
                 wasmless_load_phase_seconds_bucket{{le=\"0.1\",phase=\"fetch\"}} {loads}\n\
                 wasmless_load_phase_seconds_sum{{phase=\"link\"}} 0.002\n\
                 wasmless_load_phase_seconds_count{{phase=\"link\"}} 2\n"
            )
        };
        let before = LoadPhaseTotals::scraped(&scrape(0.1, 2.0));
        let after = LoadPhaseTotals::scraped(&scrape(0.4, 5.0));
        // Three fetches since, 0.3 s in all; no link since.
        let means = after.mean_ms_since(&before);
        assert_eq!(means.len(), 1, "{means:?}");
        assert_eq!(means[0].0, "fetch");
        assert!((means[0].1 - 100.0).abs() < 1e-6, "{means:?}");
    }
}
