//! The density run's hands on the test cluster: `kubectl`, the operator's settings, the
//! pool pod (its readiness, its process on this node, its metrics) and the Services.

use super::{NAMESPACE, OPERATOR, OPERATOR_NAMESPACE, POOL_ADMIN_PORT};
use anyhow::{Context, bail};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

/// The operator with this run's settings; its own again when dropped.
pub(super) struct OperatorSettings {
    set: Vec<String>,
}

impl OperatorSettings {
    pub(super) fn set(pairs: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut settings = Self { set: Vec::new() };
        settings.add(pairs)?;
        Ok(settings)
    }

    /// Sets `pairs` in the operator's environment, and waits for the operator it restarts.
    pub(super) fn add(&mut self, pairs: &[(&str, &str)]) -> anyhow::Result<()> {
        self.set.extend(pairs.iter().map(|(key, _)| key.to_string()));
        let mut args = vec!["set", "env", "deploy", OPERATOR, "-n", OPERATOR_NAMESPACE];
        let pairs: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}={v}")).collect();
        args.extend(pairs.iter().map(String::as_str));
        kubectl(&args)?;
        operator_rolled_out()
    }
}

/// Waits until the operator's Deployment has rolled out.
fn operator_rolled_out() -> anyhow::Result<()> {
    kubectl(&[
        "rollout",
        "status",
        "deploy",
        OPERATOR,
        "-n",
        OPERATOR_NAMESPACE,
        "--timeout=180s",
    ])
    .map(drop)
}

impl Drop for OperatorSettings {
    fn drop(&mut self) {
        let mut args = vec!["set", "env", "deploy", OPERATOR, "-n", OPERATOR_NAMESPACE];
        let unset: Vec<String> = self.set.iter().map(|key| format!("{key}-")).collect();
        args.extend(unset.iter().map(String::as_str));
        if let Err(error) = kubectl(&args) {
            eprintln!("restoring the operator's settings failed: {error:#}");
        }
    }
}

/// The operator stopped (its Deployment at zero replicas) until dropped: what the run writes
/// meanwhile is there before its first reconcile.
pub(super) struct OperatorStopped {
    replicas: String,
}

impl OperatorStopped {
    pub(super) fn stop() -> anyhow::Result<Self> {
        let replicas = operator_deployment("{.spec.replicas}")?;
        let stopped = Self { replicas };
        kubectl(&["scale", "deploy", OPERATOR, "-n", OPERATOR_NAMESPACE, "--replicas=0"])?;
        kubectl(&[
            "wait",
            "--for=delete",
            "pod",
            "-n",
            OPERATOR_NAMESPACE,
            "-l",
            &format!("app.kubernetes.io/name={OPERATOR}"),
            "--timeout=120s",
        ])?;
        Ok(stopped)
    }
}

impl Drop for OperatorStopped {
    fn drop(&mut self) {
        let replicas = format!("--replicas={}", self.replicas);
        let started = kubectl(&["scale", "deploy", OPERATOR, "-n", OPERATOR_NAMESPACE, &replicas])
            .and_then(|_| operator_rolled_out());
        if let Err(error) = started {
            eprintln!("starting the operator again failed: {error:#}");
        }
    }
}

/// The node agent's DaemonSet, its store's budget and the namespace quota raised to `gib`
/// (and its memory limit above them: the page cache of the files it writes is charged to
/// it) until dropped, then rolled back to its revision before.
pub(super) struct NodeAgentBudget;

const NODE_AGENT: &str = "wasmless-node-agent";
const NODE_AGENT_NAMESPACE: &str = "wasmless-node";

impl NodeAgentBudget {
    pub(super) fn raise(gib: u64) -> anyhow::Result<Self> {
        let patch = serde_json::json!([
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": format!("--store-budget={gib}Gi")},
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": format!("--namespace-quota={gib}Gi")},
            {"op": "replace", "path": "/spec/template/spec/containers/0/resources/limits/memory", "value": format!("{}Gi", gib + 1)},
        ]);
        kubectl(&[
            "patch",
            "ds",
            NODE_AGENT,
            "-n",
            NODE_AGENT_NAMESPACE,
            "--type=json",
            "-p",
            &patch.to_string(),
        ])?;
        let raised = Self;
        raised.rolled_out()?;
        Ok(raised)
    }

    fn rolled_out(&self) -> anyhow::Result<String> {
        kubectl(&[
            "rollout",
            "status",
            "ds",
            NODE_AGENT,
            "-n",
            NODE_AGENT_NAMESPACE,
            "--timeout=120s",
        ])
    }
}

impl Drop for NodeAgentBudget {
    fn drop(&mut self) {
        let undone =
            kubectl(&["rollout", "undo", "ds", NODE_AGENT, "-n", NODE_AGENT_NAMESPACE]).and_then(|_| self.rolled_out());
        if let Err(error) = undone {
            eprintln!("restoring the node agent's settings failed: {error:#}");
        }
    }
}

/// Writes on each Function's status the revision its build Job's result would have made
/// the operator record, a few `kubectl` at a time.
pub(super) fn record_revisions(revisions: &[(String, Value)]) -> anyhow::Result<()> {
    const AT_ONCE: usize = 4;
    let chunk = revisions.len().div_ceil(AT_ONCE).max(1);
    std::thread::scope(|scope| {
        let writers: Vec<_> = revisions
            .chunks(chunk)
            .map(|some| {
                scope.spawn(move || {
                    for (name, revision) in some {
                        let status = serde_json::json!({"status": {"revisions": [revision]}});
                        kubectl(&[
                            "patch",
                            "fn",
                            name,
                            "-n",
                            NAMESPACE,
                            "--subresource=status",
                            "--type=merge",
                            "-p",
                            &status.to_string(),
                        ])?;
                    }
                    anyhow::Ok(())
                })
            })
            .collect();
        writers
            .into_iter()
            .try_for_each(|writer| writer.join().map_err(|_| anyhow::anyhow!("a status writer panicked"))?)
    })
}

/// The value of `flag` (`--name=value` or `--name value`) the process `pid` was started with.
pub(super) fn process_flag(pid: u32, flag: &str) -> Option<String> {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let args: Vec<String> = cmdline
        .split(|b| *b == 0)
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect();
    args.iter()
        .enumerate()
        .find_map(|(at, arg)| match arg.strip_prefix(flag) {
            Some(value) if value.starts_with('=') => Some(value[1..].to_string()),
            Some("") => args.get(at + 1).cloned(),
            _ => None,
        })
}

/// Waits until the namespace's one pool pod — not the one at `replacing`, and with no other
/// pool pod left, terminating or not — is ready and listens for `functions` Functions, each
/// Ready and served by the pool, and until every Service sends to it; its pod IP.
pub(super) fn wait_for_pool(functions: usize, replacing: Option<&str>) -> anyhow::Result<String> {
    // The operator reconciles each Function (Service, entry) in turn: most of a second each.
    let patience = Duration::from_secs(900 + functions as u64);
    let deadline = Instant::now() + patience;
    let mut said = String::new();
    loop {
        let progress = pool_progress()?;
        let ip = progress
            .ip
            .filter(|ip| Some(ip.as_str()) != replacing && progress.pods == 1);
        let now = format!(
            "{} of {functions} Functions served by the pool, {} listening in its pod ({} pool pods)",
            progress.served, progress.listening, progress.pods
        );
        if now != said {
            eprintln!("  {now}");
            said = now;
        }
        if let Some(ip) = ip
            && progress.served == functions
            && progress.listening == functions
            && every_service_sends_to(&ip)?
        {
            // kube-proxy follows the EndpointSlices within its sync period (1 s here).
            std::thread::sleep(Duration::from_secs(3));
            return Ok(ip);
        }
        if Instant::now() > deadline {
            bail!("after {} s: {said}", patience.as_secs());
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

struct PoolProgress {
    /// Functions Ready and served by the pool.
    served: usize,
    /// The one ready pool pod's IP.
    ip: Option<String>,
    /// Functions it listens for.
    listening: usize,
    /// Pool pods in the namespace, in any state.
    pods: usize,
}

fn pool_progress() -> anyhow::Result<PoolProgress> {
    let served = served_by_pool()?;
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
    let all = pods["items"].as_array().map_or(0, Vec::len);
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
        return Ok(PoolProgress {
            served,
            ip: None,
            listening: 0,
            pods: all,
        });
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
    Ok(PoolProgress {
        served,
        ip: Some(ip.clone()),
        listening,
        pods: all,
    })
}

/// Whether every EndpointSlice of the namespace lists `ip` and no other address: a first
/// request sent now reaches that pod, not the one it replaced.
fn every_service_sends_to(ip: &str) -> anyhow::Result<bool> {
    every_service_sends_to_all(&BTreeSet::from([ip.to_string()]))
}

/// Whether every EndpointSlice of the namespace lists exactly `ips`.
pub(super) fn every_service_sends_to_all(ips: &BTreeSet<String>) -> anyhow::Result<bool> {
    let slices: Value = serde_json::from_str(&kubectl(&["get", "endpointslices", "-n", NAMESPACE, "-o", "json"])?)?;
    Ok(slices["items"].as_array().into_iter().flatten().all(|slice| {
        let addresses: BTreeSet<String> = slice["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|endpoint| endpoint["addresses"].as_array().into_iter().flatten())
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect();
        addresses == *ips
    }))
}

/// The namespace's Functions that are Ready and served by the pool.
pub(super) fn served_by_pool() -> anyhow::Result<usize> {
    let listed: Value = serde_json::from_str(&kubectl(&["get", "fn", "-n", NAMESPACE, "-o", "json"])?)?;
    Ok(listed["items"].as_array().map_or(0, |items| {
        items
            .iter()
            .filter(|f| f.pointer("/status/servedBy").and_then(Value::as_str) == Some("pool"))
            .filter(|f| f.pointer("/status/phase").and_then(Value::as_str) == Some("Ready"))
            .count()
    }))
}

/// Each Function's Service, by name: its ClusterIP and port.
pub(super) fn service_addresses() -> anyhow::Result<BTreeMap<String, SocketAddr>> {
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
pub(super) fn pool_pid(ip: &str) -> anyhow::Result<u32> {
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

pub(super) fn wait_connectable(address: SocketAddr) -> anyhow::Result<()> {
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
pub(super) fn timed_get(address: SocketAddr) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let response = http_get(address, "/")?;
    let elapsed = started.elapsed();
    if !response.starts_with("HTTP/1.1 200") {
        bail!("{address} answered {}", &response[..response.len().min(200)]);
    }
    Ok(elapsed)
}

pub(super) fn http_get(address: SocketAddr, path: &str) -> anyhow::Result<String> {
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

/// The sum of the samples of `name` (a counter's `_total`, a gauge) whose labels hold each
/// of `labels` (`key="value"`), in one scrape.
pub(super) fn metric_sum(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let rest = series.strip_prefix(name)?;
            let labelled = rest.is_empty() || rest.starts_with('{');
            (labelled && labels.iter().all(|label| rest.contains(label)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

pub(super) fn kubectl(args: &[&str]) -> anyhow::Result<String> {
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

/// The operator's environment as `NAME=value` lines (values from references are empty).
pub(super) fn operator_env() -> anyhow::Result<String> {
    operator_deployment("{range .spec.template.spec.containers[0].env[*]}{.name}={.value}{\"\\n\"}{end}")
}

/// What the JSONPath `template` makes of the operator's Deployment.
fn operator_deployment(template: &str) -> anyhow::Result<String> {
    let output = format!("jsonpath={template}");
    kubectl(&["get", "deploy", OPERATOR, "-n", OPERATOR_NAMESPACE, "-o", &output])
}

/// The run's namespace, made anew: whatever an earlier run left is deleted first.
pub(super) fn fresh_namespace() -> anyhow::Result<()> {
    kubectl(&[
        "delete",
        "namespace",
        NAMESPACE,
        "--ignore-not-found",
        "--wait=true",
        "--timeout=600s",
    ])?;
    kubectl(&["create", "namespace", NAMESPACE])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::metric_sum;

    #[test]
    fn a_metric_is_summed_over_the_series_with_the_labels_asked_for() {
        let scrape = "# TYPE wasmless_code_store_requests counter\n\
                      wasmless_code_store_requests_total{op=\"get\",result=\"found\"} 7\n\
                      wasmless_code_store_requests_total{op=\"get\",result=\"absent\"} 3\n\
                      wasmless_code_store_requests_total{op=\"put\",result=\"stored\"} 2\n\
                      wasmless_code_store_requests_totally 100\n\
                      wasmless_pool_functions_loaded 12\n";
        let requests = "wasmless_code_store_requests_total";
        assert_eq!(metric_sum(scrape, requests, &["op=\"get\"", "result=\"found\""]), 7.0);
        assert_eq!(metric_sum(scrape, requests, &["op=\"get\""]), 10.0);
        assert_eq!(metric_sum(scrape, requests, &["result=\"corrupt\""]), 0.0);
        assert_eq!(metric_sum(scrape, "wasmless_pool_functions_loaded", &[]), 12.0);
    }
}
