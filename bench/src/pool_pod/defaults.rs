//! Go Functions at the operator's own settings, as a user who installed the operator and
//! the node agent and changed nothing meets them: its pool replicas, its budget of loaded
//! code, loading ahead on, the node's store on because its driver is installed. Issue 39
//! asks this of a hundred distinct Go Functions at `scale.min: 0`: each one's first
//! request p50 ≤ 15 ms and p90 ≤ 50 ms, all of them loaded at once with no eviction, and
//! a loaded Go Function costing a pool process ≤ 4 MiB of its resident memory.
//!
//! One Function is created first, and each pool replica's memory read once it has loaded
//! it: what the others add is then what loading them cost, not the process itself. The
//! builds are published as in the density run (`publish`), so no build Job runs.

use super::cluster::{
    every_service_sends_to_all, http_get, kubectl, metric_sum, served_by_pool, timed_get, wait_connectable,
};
use super::{Group, NAMESPACE, OPERATOR, OPERATOR_NAMESPACE, POOL_ADMIN_PORT, STORE_REQUESTS, function_name};
use crate::measure::{Resident, resident_mib};
use crate::pool::percentile;
use crate::scenarios::{Settings, build_example, example_source};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub const HEADING: &str = crate::report::POOL_DEFAULTS_HEADING;

/// The operator's settings this run is about: set in its environment, the run would not
/// be at the defaults.
const SETTINGS: [&str; 5] = [
    "WASMLESS_POOL_REPLICAS",
    "WASMLESS_POOL_MEMORY_BUDGET",
    "WASMLESS_POOL_MAPPED_CODE_BUDGET",
    "WASMLESS_POOL_LOAD_AHEAD",
    "WASMLESS_NODE_CODE_STORE",
];

pub struct AtDefaults {
    pub functions: usize,
    pub started: String,
    /// Functions loaded, over all replicas, when the first requests began.
    pub loaded_before_first: f64,
    pub first_p50_ms: f64,
    pub first_p90_ms: f64,
    pub loaded_p50_ms: f64,
    pub loaded_p90_ms: f64,
    /// A request to each Function once they had all been idle for the pool's
    /// `--pool-release-code-after`.
    pub after_idle_p50_ms: f64,
    pub after_idle_p90_ms: f64,
    /// Each replica just after the requests, and again once the Functions were idle.
    pub replicas: Vec<Replica>,
    pub idle: Vec<Replica>,
}

/// One pool replica at one moment of the run.
pub struct Replica {
    pub loaded: u64,
    pub evictions: u64,
    /// Of the Functions' code, loads that mapped the node's store's copy.
    pub store_hits: u64,
    /// Times an idle Function's code left its page tables.
    pub released: u64,
    /// What its process grew by per Function, from the first one loaded to all of them.
    pub per_function: Resident,
    pub rss_mib: f64,
}

/// How long the Functions are left idle before the second reading: the runtime's default
/// `--pool-release-code-after` (10 s), its sweep's half period after that, and a margin.
const IDLE: Duration = Duration::from_secs(20);

pub fn run(settings: &Settings, functions: usize) -> anyhow::Result<AtDefaults> {
    if functions < 2 {
        bail!("the run at the defaults needs at least 2 Go Functions (--pool-go-functions)");
    }
    let started = crate::report::chrono_free_now();
    refuse_overrides()?;
    super::cluster::fresh_namespace()?;
    let group = Group {
        name: "Goless sample (Go reactor, snapshotted)",
        example: "hello-go",
        language: "go",
        first: 0,
        count: functions,
    };
    let builder_version = super::publish::operator_builder_version()?;
    let base = build_example(settings, group.example, group.language)?;
    let source = example_source(settings, group.example)?;
    let wasm = std::fs::read(&base.path)?;
    eprintln!("publishing {functions} builds of {}", group.name);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(super::publish::publish_group(
            &group,
            &wasm,
            &source,
            &builder_version,
            super::publish::Storage::ConfigMaps,
        ))?;
    let manifest = |index: usize| {
        json!({
            "apiVersion": "wasmless.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": function_name(index), "namespace": NAMESPACE},
            "spec": {"language": "go", "source": super::variant_source(&source, index), "scale": {"min": 0}},
        })
    };
    let create = |indexes: std::ops::Range<usize>, file: &str| -> anyhow::Result<()> {
        let path = settings.work("defaults").join(file);
        let items: Vec<Value> = indexes.map(manifest).collect();
        std::fs::write(
            &path,
            json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string(),
        )?;
        kubectl(&["create", "-f", &path.display().to_string()])?;
        Ok(())
    };

    eprintln!("one Function first: each pool replica's memory with it loaded");
    create(0..1, "first.json")?;
    let replicas = wait_for_replicas(1)?;
    settle(&replicas, 1);
    let baseline: Vec<(u32, Resident)> = replicas
        .iter()
        .map(|ip| {
            let pid = super::cluster::pool_pid(ip)?;
            Ok((pid, resident_mib(pid)))
        })
        .collect::<anyhow::Result<_>>()?;

    eprintln!("the other {} Functions", functions - 1);
    create(1..functions, "rest.json")?;
    let now = wait_for_replicas(functions)?;
    if now != replicas {
        bail!("the pool replicas changed while the Functions were created: {replicas:?}, then {now:?}");
    }
    let services = super::cluster::service_addresses()?;
    for index in 0..functions {
        wait_connectable(services[&function_name(index)])?;
    }
    let loaded_before_first = replicas
        .iter()
        .map(|ip| {
            Ok(metric_sum(
                &admin_get(ip, "/metrics")?,
                "wasmless_pool_functions_loaded",
                &[],
            ))
        })
        .sum::<anyhow::Result<f64>>()?;

    eprintln!("first requests");
    let mut first = Vec::with_capacity(functions);
    for index in 0..functions {
        first.push(timed_get(services[&function_name(index)])?);
    }
    let mut loaded = Vec::with_capacity(functions);
    for index in 0..functions {
        loaded.push(timed_get(services[&function_name(index)])?);
    }
    // Loading ahead may still be at work in a replica the Services sent no request to.
    settle(&replicas, functions);
    let after_requests = read_replicas(&replicas, &baseline, functions)?;
    eprintln!("the Functions idle for {} s, then a request to each", IDLE.as_secs());
    std::thread::sleep(IDLE);
    let idle = read_replicas(&replicas, &baseline, functions)?;
    let mut after_idle = Vec::with_capacity(functions);
    for index in 0..functions {
        after_idle.push(timed_get(services[&function_name(index)])?);
    }

    eprintln!("deleting the namespace {NAMESPACE}");
    kubectl(&["delete", "namespace", NAMESPACE, "--wait=true", "--timeout=600s"])?;
    Ok(AtDefaults {
        functions,
        started,
        loaded_before_first,
        first_p50_ms: percentile(&mut first, 0.5),
        first_p90_ms: percentile(&mut first, 0.9),
        loaded_p50_ms: percentile(&mut loaded, 0.5),
        loaded_p90_ms: percentile(&mut loaded, 0.9),
        after_idle_p50_ms: percentile(&mut after_idle, 0.5),
        after_idle_p90_ms: percentile(&mut after_idle, 0.9),
        replicas: after_requests,
        idle,
    })
}

/// Each replica now: its pool's metrics, and what its process grew by per Function since
/// `baseline` (one Function loaded).
fn read_replicas(
    replicas: &BTreeSet<String>,
    baseline: &[(u32, Resident)],
    functions: usize,
) -> anyhow::Result<Vec<Replica>> {
    replicas
        .iter()
        .zip(baseline)
        .map(|(ip, (pid, before))| {
            let metrics = admin_get(ip, "/metrics")?;
            let after = resident_mib(*pid);
            let grown = |now: f64, then: f64| (now - then) / (functions - 1) as f64;
            Ok(Replica {
                loaded: metric_sum(&metrics, "wasmless_pool_functions_loaded", &[]) as u64,
                evictions: metric_sum(&metrics, "wasmless_pool_evictions_total", &[]) as u64,
                store_hits: metric_sum(&metrics, STORE_REQUESTS, &["op=\"get\"", "result=\"found\""]) as u64,
                released: metric_sum(&metrics, "wasmless_pool_idle_code_released_total", &[]) as u64,
                per_function: Resident {
                    rss: grown(after.rss, before.rss),
                    private: grown(after.private, before.private),
                    pss: grown(after.pss, before.pss),
                },
                rss_mib: after.rss,
            })
        })
        .collect()
}

/// Fails where the operator's environment sets one of the settings this run is about.
fn refuse_overrides() -> anyhow::Result<()> {
    let env = super::cluster::operator_env()?;
    let set: Vec<&str> = env
        .lines()
        .filter_map(|line| line.split_once('=').map(|(name, _)| name))
        .filter(|name| SETTINGS.contains(name))
        .collect();
    if !set.is_empty() {
        bail!(
            "the operator's environment sets {}: this run measures its defaults (kubectl set env deploy/{OPERATOR} -n {OPERATOR_NAMESPACE} NAME- removes one)",
            set.join(", ")
        );
    }
    Ok(())
}

/// Waits until the namespace's pool pods are all ready, none terminating, each listening
/// for `functions` Functions that are Ready and served by the pool, and every Service sends
/// to exactly those pods; their IPs.
fn wait_for_replicas(functions: usize) -> anyhow::Result<BTreeSet<String>> {
    let deadline = Instant::now() + Duration::from_secs(900);
    let mut said = String::new();
    loop {
        let (ready, all) = pool_pods()?;
        let served = served_by_pool()?;
        let listening: Vec<usize> = ready.iter().map(|ip| listening(ip).unwrap_or(0)).collect();
        let now = format!(
            "{served} of {functions} Functions served by the pool; pool pods: {all}, ready {}, listening {listening:?}",
            ready.len()
        );
        if now != said {
            eprintln!("  {now}");
            said = now;
        }
        if !ready.is_empty()
            && ready.len() == all
            && served == functions
            && listening.iter().all(|&count| count == functions)
            && every_service_sends_to_all(&ready)?
        {
            // kube-proxy follows the EndpointSlices within its sync period (1 s here).
            std::thread::sleep(Duration::from_secs(3));
            return Ok(ready);
        }
        if Instant::now() > deadline {
            bail!("after 15 minutes: {said}");
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Waits up to two minutes for each replica to hold `functions` loaded.
fn settle(replicas: &BTreeSet<String>, functions: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let all_loaded = replicas.iter().all(|ip| {
            admin_get(ip, "/metrics")
                .is_ok_and(|metrics| metric_sum(&metrics, "wasmless_pool_functions_loaded", &[]) as usize >= functions)
        });
        if all_loaded {
            return;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The ready pool pods' IPs, and how many pool pods there are in any state.
fn pool_pods() -> anyhow::Result<(BTreeSet<String>, usize)> {
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
    let items = pods["items"].as_array().cloned().unwrap_or_default();
    let ready = items
        .iter()
        .filter(|pod| pod.pointer("/metadata/deletionTimestamp").is_none())
        .filter(|pod| {
            pod.pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|c| c.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"))
        })
        .filter_map(|pod| pod.pointer("/status/podIP").and_then(Value::as_str).map(str::to_string))
        .collect();
    Ok((ready, items.len()))
}

fn listening(ip: &str) -> anyhow::Result<usize> {
    let text = admin_get(ip, "/pool")?;
    let status: Value = serde_json::from_str(text.split("\r\n\r\n").nth(1).context("no body")?)?;
    Ok(status["functions"]
        .as_object()
        .map_or(0, |f| f.values().filter(|f| f["listening"] == true).count()))
}

fn admin_get(ip: &str, path: &str) -> anyhow::Result<String> {
    http_get(SocketAddr::new(ip.parse()?, POOL_ADMIN_PORT), path)
}

pub fn section(run: &AtDefaults) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{HEADING}\n\nIssue 39's acceptance run: {} distinct Go Functions (the Goless sample, each build its own, published as in the run above) with `scale.min: 0` in one namespace, the operator at its own settings (none of {} in its environment: its pool replicas, its budget of loaded code, loading ahead on, and the node's store on because the node agent's CSI driver is installed), the node's store holding nothing of them before. One Function was created first and each replica's process read once it had loaded it; then the others, and, once every Service took connections, each Function's first request through its Service, then a second (loaded). Per Function is what a replica's process grew by from the first Function to all of them, divided by the others' count. {:.0} of {} loads had been made ahead (over all replicas) when the first requests began. Requests are sequential GET / on a new connection, from the node, with the cluster on the same 2 cores ({}).\n",
        run.functions,
        SETTINGS.map(|name| format!("`{name}`")).join(", "),
        run.loaded_before_first,
        run.functions * run.replicas.len(),
        run.started
    );
    let _ = writeln!(
        out,
        "| | target | measured |\n|---|---|---|\n| first request p50 / p90 | ≤ 15 / ≤ 50 ms | {:.2} / {:.2} ms |\n| loaded p50 / p90 | | {:.2} / {:.2} ms |\n| loaded, after {} s idle, p50 / p90 | | {:.2} / {:.2} ms |",
        run.first_p50_ms,
        run.first_p90_ms,
        run.loaded_p50_ms,
        run.loaded_p90_ms,
        IDLE.as_secs(),
        run.after_idle_p50_ms,
        run.after_idle_p90_ms
    );
    for (index, (replica, idle)) in run.replicas.iter().zip(&run.idle).enumerate() {
        let _ = writeln!(
            out,
            "| replica {}: loaded, evictions | {} loaded, 0 evictions | {} loaded, {} evictions ({} loads from the node's store) |",
            index + 1,
            run.functions,
            replica.loaded,
            replica.evictions,
            replica.store_hits,
        );
        for (when, reading) in [("just after its requests", replica), ("idle", idle)] {
            let _ = writeln!(
                out,
                "| replica {}: per loaded Function RSS / PSS / private, {when} | RSS ≤ 4 MiB | {:.2} / {:.2} / {:.2} MiB (process RSS {:.0} MiB; code let go of {} times) |",
                index + 1,
                reading.per_function.rss,
                reading.per_function.pss,
                reading.per_function.private,
                reading.rss_mib,
                reading.released,
            );
        }
    }
    out.push_str(
        "\nRSS counts the pages of the node's copy of the code a Function's requests touched, and the kernel's neighbours of each (fault-around maps the 64 KiB about a touched page; `MADV_RANDOM` does not stop it on this kernel): shared, clean, and dropped by the kernel under pressure. A Function idle for the pool's `--pool-release-code-after` (10 s) keeps its code loaded, but its pages leave the process's page tables (they stay in the node's page cache): the idle rows, read after the Functions were left idle, show what the pool then holds, and the row after idleness what that costs the next request, which maps back what it runs. PSS divides each page by the processes mapping it, here the two replicas. Private is what the Function costs its replica alone: what wasmtime builds from the code (what `--pool-memory-budget` counts: 0.16 MiB in the density run above, where each Function was requested once) and the warm request slot its instances left (up to 1 MiB of the pages a request dirtied, so the next instance starts without `mmap` calls, and the pages of its image it read), of which at most 16 idle slots stay warm (`engine::WARM_SLOTS`; wasmtime's default of 100 kept one for each of the hundred Functions).\n",
    );
    out
}
