//! Density of a pool *pod* on the test cluster: a thousand Functions with `scale.min: 0` in
//! one namespace, all served by its one pool pod, reached through their own Services as
//! users reach them. What the pod's process holds per loaded Function, and the first
//! request to a Function not loaded yet against one that is — in three passes, each a new
//! pool pod: without the node's code store (each pool pod keeps the code it reads on its
//! own disk), with the store holding nothing yet (the pod reads the code and puts it
//! there), and with the store holding every Function's code (the pod maps the node's copy).
//!
//! A thousand builds would take the cluster most of an hour, so the bench publishes each
//! Function's build itself, as its build Job would (`wasmless_builder::publish`, under the
//! source digest the operator computes for the Function's source): the base example built
//! once by `wasmless-builder`, each Function's module that build with a custom section
//! naming it (so its digest is its own), and the base's native code packaged for that
//! digest (custom sections are not compiled). The package's header names the module's
//! digest, so each Function's code is a file of its own in the node's store and in the
//! page cache, as distinct builds' are: the store is not flattered. Each Function's source
//! is the example's with a comment naming it, which would build to the same code. The
//! operator then finds every build done, runs no Job, and serves each Function from the
//! pool: entries, Services and the pool's reads of module and code through the API are all
//! the real ones.
//!
//! Needs `kubectl` on PATH for a cluster with the operator installed from deploy/ and the
//! node agent from deploy/node-agent/ (`bench/cluster.sh density`). For its run the
//! operator is set to one pool pod, a budget of loaded code above what a thousand Functions
//! take, and no loading ahead (so a first request is what loads a Function), then to the
//! node's store; its settings are restored after.

mod cluster;
pub mod defaults;
mod publish;
mod section;

pub use section::section;

use crate::measure::{Resident, resident_mib};
use crate::pool::{DensityRow, percentile};
use crate::scenarios::{Settings, build_example, example_source};
use anyhow::bail;
use cluster::{OperatorSettings, http_get, kubectl, metric_sum, timed_get};
use publish::Storage;
use section::LoadPhaseTotals;
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Instant;

pub const HEADING: &str = crate::report::POOL_POD_HEADING;

const NAMESPACE: &str = "bench-density";
const OPERATOR: &str = "wasmless-operator";
const OPERATOR_NAMESPACE: &str = "wasmless-system";
/// The operator's settings for this run, restored after it.
const OPERATOR_ENV: [(&str, &str); 4] = [
    ("WASMLESS_POOL_REPLICAS", "1"),
    ("WASMLESS_POOL_MEMORY_BUDGET", "6Gi"),
    ("WASMLESS_POOL_LOAD_AHEAD", "false"),
    // The first pass's pool pod without the store the node agent installed for the
    // others (the operator's default, auto, would find it).
    ("WASMLESS_NODE_CODE_STORE", "false"),
];
/// The pool's admin port (`/pool`, `/metrics`).
const POOL_ADMIN_PORT: u16 = wasmless_artifact::ports::ADMIN;
/// Builds published at once.
const CONCURRENT_PUBLISHES: usize = 8;
const STORE_REQUESTS: &str = "wasmless_code_store_requests_total";
/// The node agent's default `--namespace-quota` (node-agent/src/main.rs), MiB.
const NODE_STORE_NAMESPACE_QUOTA_MIB: f64 = 2048.0;

pub struct PodDensity {
    pub functions: usize,
    pub passes: Vec<Pass>,
    /// From `kubectl apply` of the Functions to the pool pod listening for all of them.
    pub apply_to_listening_s: f64,
    pub published_mib: f64,
    pub started: String,
    /// The OCI registry the builds were published to; none: ConfigMaps.
    pub registry: Option<String>,
    /// The pass without the node's store left out: the code of all (MiB) over the pool pod's
    /// budget of code on its own disk (MiB).
    pub skipped_own_disk: Option<(f64, f64)>,
    /// The node agent's store budget and namespace quota for the run, where raised (GiB).
    pub store_raised_gib: Option<u64>,
}

/// Where a pass's new pool pod finds each Function's compiled code.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum CodeFrom {
    /// No node store: read through the API, verified, written to the pod's own disk, mapped.
    PodsOwnDisk,
    /// The node's store, which holds nothing yet: read as above, then put in the store.
    StoreEmpty,
    /// The node's store, which holds it: the node's verified copy, mapped.
    Store,
}

impl CodeFrom {
    /// What the pass's pool pod does for a Function's code; `from_registry`: the builds are
    /// in an OCI registry, not ConfigMaps.
    pub fn describe(self, from_registry: bool) -> &'static str {
        match (self, from_registry) {
            (Self::PodsOwnDisk, false) => "no node store: read through the API, kept on the pod's disk",
            (Self::PodsOwnDisk, true) => "no node store: pulled from the registry, kept on the pod's disk",
            (Self::StoreEmpty, false) => "node store empty: read through the API, put in the store, its copy mapped",
            (Self::StoreEmpty, true) => "node store empty: pulled from the registry, put in the store, its copy mapped",
            (Self::Store, _) => "node store holds it: the node's copy mapped",
        }
    }
}

/// One pass: a new pool pod, every Function's first request, then a loaded one.
pub struct Pass {
    pub code_from: CodeFrom,
    pub rows: Vec<PodRow>,
    /// Each group's first loads, phase by phase: the mean milliseconds of each phase.
    pub phases: Vec<(String, Vec<(String, f64)>)>,
    pub empty: Resident,
    pub all_loaded: Resident,
    /// `wasmless_pool_functions_loaded` at the end.
    pub loaded_reported: f64,
    /// `wasmless_pool_code_bytes` at the end, by `memory`, MiB.
    pub code_bytes: Vec<(&'static str, f64)>,
}

pub struct PodRow {
    pub row: DensityRow,
    /// The proportional share of the resident memory the pool grew by, per Function.
    pub pss_per_function_mib: f64,
    /// Of the first requests, how many found the code in the node's store.
    pub store_hits: usize,
    /// How many put it there.
    pub store_puts: usize,
}

struct Group {
    name: &'static str,
    example: &'static str,
    language: &'static str,
    first: usize,
    count: usize,
}

pub fn run(
    settings: &Settings,
    functions: usize,
    go_functions: usize,
    registry: Option<&str>,
) -> anyhow::Result<PodDensity> {
    let started = crate::report::chrono_free_now();
    let builder_version = publish::operator_builder_version()?;
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
    if let Some(registry) = registry
        && !std::env::var("WASMLESS_OCI_PLAIN_HTTP").is_ok_and(|list| list.split(',').any(|r| r.trim() == registry))
    {
        bail!(
            "--pool-registry {registry}: the bench pushes over plain HTTP only to a registry WASMLESS_OCI_PLAIN_HTTP names (bench/cluster.sh density starts one and sets both)"
        );
    }
    let storage = registry.map_or(Storage::ConfigMaps, |registry| Storage::Oci { registry });
    cluster::fresh_namespace()?;
    let mut operator_env = OPERATOR_ENV.to_vec();
    if let Some(registry) = registry {
        operator_env.extend([
            ("WASMLESS_OCI_REGISTRY", registry),
            ("WASMLESS_OCI_PLAIN_HTTP", registry),
        ]);
    }
    let mut operator = OperatorSettings::set(&operator_env)?;

    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let mut code_mib = BTreeMap::new();
    let mut published = Vec::new();
    let mut objects = Vec::new();
    for group in &groups {
        eprintln!("building {} with wasmless-builder", group.example);
        let base = build_example(settings, group.example, group.language)?;
        let source = example_source(settings, group.example)?;
        let wasm = std::fs::read(&base.path)?;
        eprintln!("publishing {} builds of {}", group.count, group.name);
        let (code_bytes, builds) =
            runtime.block_on(publish::publish_group(group, &wasm, &source, &builder_version, storage))?;
        code_mib.insert(group.name, code_bytes as f64 / (1 << 20) as f64);
        published.extend(builds);
        for index in group.first..group.first + group.count {
            let mut spec = json!({
                "language": group.language,
                "source": variant_source(&source, index),
                "scale": {"min": 0},
            });
            if registry.is_some() {
                spec["storage"] = json!("oci");
            }
            objects.push(json!({
                "apiVersion": "wasmless.io/v1alpha1",
                "kind": "Function",
                "metadata": {"name": function_name(index), "namespace": NAMESPACE},
                "spec": spec,
            }));
        }
    }
    let code_total_mib: f64 = groups
        .iter()
        .map(|group| group.count as f64 * code_mib[group.name])
        .sum();
    // The node agent's defaults (8 GiB in all, 2 GiB a namespace) hold about 140 Go
    // Functions of one namespace: beyond, the store lets the least recently used go, and a
    // pass that asks for every Function in turn would find none of them there.
    let agent_budget = (code_total_mib > NODE_STORE_NAMESPACE_QUOTA_MIB)
        .then(|| {
            let gib = (code_total_mib * 1.25 / 1024.0).ceil() as u64 + 1;
            eprintln!("the node agent's store budget and namespace quota raised to {gib} GiB for the run");
            cluster::NodeAgentBudget::raise(gib).map(|raised| (raised, gib))
        })
        .transpose()?;
    let store_raised_gib = agent_budget.as_ref().map(|(_, gib)| *gib);

    let list = settings.work("density").join("functions.json");
    std::fs::write(
        &list,
        json!({"apiVersion": "v1", "kind": "List", "items": objects}).to_string(),
    )?;
    let applied = create_functions(storage, &list, &published)?;
    let mut pool_ip = cluster::wait_for_pool(functions, None)?;
    let apply_to_listening_s = applied.elapsed().as_secs_f64();
    let jobs = kubectl(&["get", "jobs", "-n", NAMESPACE, "-o", "name"])?;
    if !jobs.trim().is_empty() {
        bail!(
            "the operator started build Jobs ({}): the source digests published here are not the ones it computes (builder version {builder_version})",
            jobs.lines().count()
        );
    }
    let services = cluster::service_addresses()?;
    eprintln!("waiting until every Service takes connections");
    for index in 0..functions {
        cluster::wait_connectable(services[&function_name(index)])?;
    }

    let pass = Measuring {
        groups: &groups,
        services: &services,
        code_mib: &code_mib,
        from_registry: registry.is_some(),
    };
    // Without the store the pod keeps each Function's code on its own disk, within its
    // budget of mapped code: past it, it would unload Functions as the pass loads others.
    let own_disk_budget_mib = cluster::process_flag(cluster::pool_pid(&pool_ip)?, "--pool-mapped-code-budget")
        .and_then(|budget| wasmless_formats::quantity::parse_bytes(&budget).ok())
        .map(|bytes| bytes as f64 / (1 << 20) as f64);
    let mut passes = Vec::new();
    let skipped_own_disk = match own_disk_budget_mib {
        Some(budget) if code_total_mib > budget * 0.95 => Some(budget),
        _ => {
            passes.push(pass.run(CodeFrom::PodsOwnDisk, &pool_ip)?);
            None
        }
    };
    eprintln!("the operator with --node-code-store: a new pool pod, the store empty");
    operator.add(&[("WASMLESS_NODE_CODE_STORE", "true")])?;
    pool_ip = cluster::wait_for_pool(functions, Some(&pool_ip))?;
    passes.push(pass.run(CodeFrom::StoreEmpty, &pool_ip)?);
    eprintln!("the pool pod replaced: a new one, the store holding the code");
    kubectl(&[
        "delete",
        "pods",
        "-n",
        NAMESPACE,
        "-l",
        "wasmless.io/component=pool",
        "--wait=false",
    ])?;
    pool_ip = cluster::wait_for_pool(functions, Some(&pool_ip))?;
    passes.push(pass.run(CodeFrom::Store, &pool_ip)?);

    eprintln!("deleting the namespace {NAMESPACE}");
    kubectl(&["delete", "namespace", NAMESPACE, "--wait=true", "--timeout=600s"])?;
    Ok(PodDensity {
        functions,
        passes,
        apply_to_listening_s,
        published_mib: published.iter().map(|build| build.bytes).sum::<usize>() as f64 / (1 << 20) as f64,
        started,
        registry: registry.map(str::to_string),
        skipped_own_disk: skipped_own_disk.map(|budget| (code_total_mib, budget)),
        store_raised_gib,
    })
}

/// Creates the Functions listed in `list` with their builds `published` to `storage`, as
/// the operator then finds them built; when the operator began to reconcile them.
fn create_functions(
    storage: Storage,
    list: &std::path::Path,
    published: &[publish::Published],
) -> anyhow::Result<Instant> {
    let functions = published.len();
    Ok(match storage {
        Storage::ConfigMaps => {
            eprintln!("creating {functions} Functions");
            let applied = Instant::now();
            kubectl(&["create", "-f", &list.display().to_string()])?;
            applied
        }
        // An OCI build's only record is on its Function's status, which the operator would
        // otherwise start a build Job before the bench could write.
        Storage::Oci { .. } => {
            eprintln!("the operator stopped: creating {functions} Functions and writing their builds on their status");
            let stopped = cluster::OperatorStopped::stop()?;
            kubectl(&["create", "-f", &list.display().to_string()])?;
            let created = kubectl(&[
                "get",
                "fn",
                "-n",
                NAMESPACE,
                "-o",
                "jsonpath={.items[0].metadata.creationTimestamp}",
            ])?;
            let revisions: Vec<(String, serde_json::Value)> = published
                .iter()
                .map(|build| (build.name.clone(), build.revision(created.trim())))
                .collect();
            cluster::record_revisions(&revisions)?;
            eprintln!("the operator started again");
            let applied = Instant::now();
            drop(stopped);
            applied
        }
    })
}

/// What every pass measures, over the same Functions.
struct Measuring<'a> {
    groups: &'a [Group],
    services: &'a BTreeMap<String, SocketAddr>,
    code_mib: &'a BTreeMap<&'static str, f64>,
    from_registry: bool,
}

impl Measuring<'_> {
    /// Each group's first requests to the pool pod at `pool_ip`, which has loaded nothing,
    /// then a request to each loaded; what its process grew by per Function. Fails where
    /// the pod did not serve the pass as `code_from` says (a request reached another pod,
    /// a Function was unloaded, the store did not answer as expected).
    fn run(&self, code_from: CodeFrom, pool_ip: &str) -> anyhow::Result<Pass> {
        eprintln!("pass: {}", code_from.describe(self.from_registry));
        // What the passes before wrote (a gigabyte of copies for 100 Go Functions) is on
        // its way to the disk: every read of this pass would queue behind it.
        std::process::Command::new("sync").status()?;
        let pid = cluster::pool_pid(pool_ip)?;
        let admin = SocketAddr::new(pool_ip.parse()?, POOL_ADMIN_PORT);
        let empty = resident_mib(pid);
        let mut before = empty;
        let mut metrics_before = http_get(admin, "/metrics")?;
        let (mut rows, mut phases) = (Vec::new(), Vec::new());
        for group in self.groups.iter().filter(|group| group.count > 0) {
            eprintln!("  first requests: {}", group.name);
            let mut first_requests = Vec::with_capacity(group.count);
            for index in group.first..group.first + group.count {
                first_requests.push(timed_get(self.services[&function_name(index)])?);
            }
            let after = resident_mib(pid);
            let metrics_after = http_get(admin, "/metrics")?;
            let since = |labels: &[&str]| {
                metric_sum(&metrics_after, STORE_REQUESTS, labels) - metric_sum(&metrics_before, STORE_REQUESTS, labels)
            };
            let store_hits = since(&["op=\"get\"", "result=\"found\""]) as usize;
            let store_puts = since(&["op=\"put\"", "result=\"stored\""]) as usize;
            let phases_now = LoadPhaseTotals::scraped(&metrics_after);
            phases.push((
                group.name.to_string(),
                phases_now.mean_ms_since(&LoadPhaseTotals::scraped(&metrics_before)),
            ));
            metrics_before = metrics_after;
            let mut loaded = Vec::with_capacity(group.count);
            for index in group.first..group.first + group.count {
                loaded.push(timed_get(self.services[&function_name(index)])?);
            }
            let per_function = |grown: f64| grown / group.count as f64;
            rows.push(PodRow {
                row: DensityRow {
                    name: group.name.to_string(),
                    functions: group.count,
                    rss_per_function_mib: per_function(after.rss - before.rss),
                    private_per_function_mib: per_function(after.private - before.private),
                    code_mib: self.code_mib[group.name],
                    first_request_p50_ms: percentile(&mut first_requests, 0.5),
                    first_request_p90_ms: percentile(&mut first_requests, 0.9),
                    loaded_p50_ms: percentile(&mut loaded, 0.5),
                    loaded_p90_ms: percentile(&mut loaded, 0.9),
                },
                pss_per_function_mib: per_function(after.pss - before.pss),
                store_hits,
                store_puts,
            });
            before = resident_mib(pid);
        }
        let metrics = http_get(admin, "/metrics")?;
        let loaded_reported = metric_sum(&metrics, "wasmless_pool_functions_loaded", &[]);
        let functions: usize = self.groups.iter().map(|group| group.count).sum();
        if loaded_reported as usize != functions {
            bail!("the pool pod at {pool_ip} has {loaded_reported} of {functions} Functions loaded after the pass");
        }
        let hits: usize = rows.iter().map(|row| row.store_hits).sum();
        let puts: usize = rows.iter().map(|row| row.store_puts).sum();
        match code_from {
            CodeFrom::PodsOwnDisk if metric_sum(&metrics, STORE_REQUESTS, &[]) > 0.0 => {
                bail!("the pool pod asked a node store in the pass without one")
            }
            // A load that put the code maps the store's copy: a hit after each put.
            CodeFrom::StoreEmpty if hits > puts => {
                bail!("the node's store held {} Functions' code before the pass", hits - puts)
            }
            CodeFrom::Store if hits == 0 => bail!("the node's store held no Function's code"),
            _ => {}
        }
        let code_bytes = ["private", "mapped", "shared"]
            .into_iter()
            .map(|memory| {
                let label = format!("memory=\"{memory}\"");
                let bytes = metric_sum(&metrics, "wasmless_pool_code_bytes", &[label.as_str()]);
                (memory, bytes / (1 << 20) as f64)
            })
            .collect();
        Ok(Pass {
            code_from,
            rows,
            phases,
            empty,
            all_loaded: before,
            loaded_reported,
            code_bytes,
        })
    }
}

fn function_name(index: usize) -> String {
    format!("density-{index}")
}

fn variant_source(source: &str, index: usize) -> String {
    format!("{source}// {} (bench/src/pool_pod)\n", function_name(index))
}
