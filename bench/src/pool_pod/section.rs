//! The density run's section of docs/benchmarks.md, and the load phases it reads from the
//! pool's metrics.

use super::{CodeFrom, HEADING, Pass, PodDensity};
use std::fmt::Write as _;

pub fn section(density: &PodDensity) -> String {
    let mut out = String::new();
    let (reads, published) = match &density.registry {
        None => (
            "the pool reading each module and its code from ConfigMaps through the API server",
            "in ConfigMaps".to_string(),
        ),
        Some(registry) => (
            "the pool pulling each module and its code by digest from an OCI registry on the node (`storage: oci`; Debian's docker-registry, which bench/cluster.sh starts)",
            format!(
                "pushed to the registry at {registry}, each build's revision written on its Function's status while the operator was stopped, as the operator records a build Job's result: a thousand Go Functions' code is more than the test cluster's etcd holds"
            ),
        ),
    };
    let passes = match density.skipped_own_disk {
        None => "Three passes, each a new pool pod that has loaded nothing: without the node's code store (the pod keeps the code it reads on its own disk, as before the store), then with `--node-code-store` while the node's store holds nothing (the pod reads the code, puts it in the store and maps the store's copy), then a replacement pod while the store holds the code (the pod maps the node's verified copy).".to_string(),
        Some((code, budget)) => format!(
            "Two passes, each a new pool pod that has loaded nothing: with `--node-code-store` while the node's store holds nothing (the pod reads the code, puts it in the store and maps the store's copy), then a replacement pod while the store holds the code (the pod maps the node's verified copy). No pass without the store: the Functions' code, {code:.0} MiB, is over what a pool pod keeps of it on its own disk (`--pool-mapped-code-budget`, {budget:.0} MiB), so such a pod unloads Functions to load others."
        ),
    };
    let store = density.store_raised_gib.map_or(String::new(), |gib| {
        format!(
            " For the run the node agent's `--store-budget` and `--namespace-quota` were {gib} GiB (its defaults, 8 GiB and 2 GiB a namespace, hold about 140 of these Go Functions in one namespace, and a pass asking for each Function in turn would then find none of them: the least recently used goes first), its memory limit {} GiB.",
            gib + 1
        )
    });
    let _ = writeln!(
        out,
        "{HEADING}\n\nOne pool pod on the test cluster serving {} Functions with `scale.min: 0` in one namespace, each reached through its own Service (ClusterIP, kube-proxy) from the node, as the pod-density run above but through everything a cluster adds: the Functions' entries, {reads}, digests checked. The operator ran with `--pool-replicas 1`, `--pool-memory-budget 6Gi` and `--pool-load-ahead false` (a first request is what loads a Function). {passes}{store} Before each pass the node's disk is synced (`sync`): the passes before it wrote gigabytes (the pod's own copies, the store's files), and their writeback would otherwise slow the next pass's reads, which a node in service, its store written long before, does not see. The builds were published by the bench as build Jobs publish them ({:.0} MiB of modules and compiled code before the modules' compression, {published}): each Function's source is the example's with a comment naming it, its module the example's build with a custom section naming it, so each digest is its own and its code is the example's in a package naming the module, a file of its own in the store and the page cache (bench/src/pool_pod/mod.rs says why). Requests are sequential GET / on a new connection, from the node, with the cluster on the same 2 cores ({}).\n",
        density.functions, density.published_mib, density.started
    );
    out.push_str(&table(&density.passes, density.registry.is_some()));
    out.push_str(
        "\nPSS is the resident memory shared pages count for divided by the processes that map them: with one pool pod and no other reader of the store's files it is the RSS; a second pool replica or a Function's own pod on the node mapping the same file halves what each is charged for the shared code. A store hit is a first request whose code the store handed over; a put, one the pod put there after reading and verifying it, then mapped from there (a hit too): one put at a time, and a load that finds another put on its way keeps a copy of its own, put after the other. The pool's `--pool-release-code-after` is at its default (10s): the RSS is read just after a group's first requests, when the Functions requested more than 10 s before hold only what they wrote, their code's pages out of the process's page tables; the slower a pass's first requests, the more of them.\n",
    );
    for pass in &density.passes {
        let _ = writeln!(
            out,
            "\n{}:\n",
            capitalised(pass.code_from.describe(density.registry.is_some()))
        );
        for (group, phases) in &pass.phases {
            let phases: Vec<String> = phases.iter().map(|(phase, ms)| format!("{phase} {ms:.2} ms")).collect();
            let _ = writeln!(out, "- a first request's load, {group}: {}", phases.join(", "));
        }
        let code: Vec<String> = pass
            .code_bytes
            .iter()
            .map(|(memory, mib)| format!("{mib:.1} MiB {memory}"))
            .collect();
        let _ = writeln!(
            out,
            "- the pool pod's process: {:.1} MiB of RSS ({:.1} MiB private) listening for all and nothing loaded, {:.1} MiB ({:.1} MiB private, {:.1} MiB PSS) with all loaded (`wasmless_pool_functions_loaded` said {}); the loaded code (`wasmless_pool_code_bytes`): {}",
            pass.empty.rss,
            pass.empty.private,
            pass.all_loaded.rss,
            pass.all_loaded.private,
            pass.all_loaded.pss,
            pass.loaded_reported,
            code.join(", ")
        );
    }
    let from = match density.registry {
        None => "`kubectl create` of the",
        Some(_) => "the operator's start, the builds on the statuses of the",
    };
    let _ = writeln!(
        out,
        "\n- {from} {} Functions to the pool pod listening for every one: {:.1} s (the operator's reconciles, entries, the pool's table)\n- the phases are each phase's mean over the group's loads that had it, from the pool's `wasmless_load_phase_seconds`; the rest of a first request is the connection, the first instantiation and the handler\n\n`bench/cluster.sh density` (rewrites this section).",
        density.functions, density.apply_to_listening_s
    );
    out
}

/// One row per pass and kind of Function, the passes of a kind together.
fn table(passes: &[Pass], from_registry: bool) -> String {
    let mut md = String::from(
        "| Functions | count | native code of one | code from | RSS per loaded Function | of it private | PSS per loaded Function | first request (not loaded) p50 / p90 | loaded p50 / p90 | store hits / puts |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let kinds = passes.first().map_or(0, |pass| pass.rows.len());
    for kind in 0..kinds {
        for pass in passes {
            let Some(row) = pass.rows.get(kind) else { continue };
            let stored = match pass.code_from {
                CodeFrom::PodsOwnDisk => "–".to_string(),
                _ => format!("{} / {}", row.store_hits, row.store_puts),
            };
            let r = &row.row;
            let _ = writeln!(
                md,
                "| {} | {} | {:.2} MiB | {} | {:.2} MiB | {:.2} MiB | {:.2} MiB | {:.2} / {:.2} ms | {:.2} / {:.2} ms | {stored} |",
                r.name,
                r.functions,
                r.code_mib,
                pass.code_from.describe(from_registry),
                r.rss_per_function_mib,
                r.private_per_function_mib,
                row.pss_per_function_mib,
                r.first_request_p50_ms,
                r.first_request_p90_ms,
                r.loaded_p50_ms,
                r.loaded_p90_ms
            );
        }
    }
    md
}

fn capitalised(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|first| first.to_uppercase().chain(chars).collect())
        .unwrap_or_default()
}

/// `wasmless_load_phase_seconds`' sums and counts by phase, as one scrape of the pool has them.
#[derive(Default)]
pub(super) struct LoadPhaseTotals(std::collections::BTreeMap<String, (f64, f64)>);

impl LoadPhaseTotals {
    pub(super) fn scraped(metrics: &str) -> Self {
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
    pub(super) fn mean_ms_since(&self, before: &Self) -> Vec<(String, f64)> {
        const ORDER: [&str; 8] = ["store", "fetch", "verify", "place", "open", "compile", "files", "link"];
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
