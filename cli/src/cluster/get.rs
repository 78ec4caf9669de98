//! `wasmless get`: the Functions of a namespace, as `kubectl get fn` prints them.

use super::{Target, explain};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ListParams};
use wasmless_operator::Function;
use wasmless_operator::crd::ServedBy;

#[derive(clap::Args)]
pub struct GetArgs {
    /// Only this Function.
    pub name: Option<String>,
    #[command(flatten)]
    pub target: Target,
}

pub async fn run(args: GetArgs) -> anyhow::Result<()> {
    let (client, namespace) = args.target.connect().await?;
    let api: Api<Function> = Api::namespaced(client, &namespace);
    let functions = match &args.name {
        Some(name) => vec![
            api.get(name)
                .await
                .map_err(|e| explain(e, &format!("reading Function {name}")))?,
        ],
        None => {
            api.list(&ListParams::default())
                .await
                .map_err(|e| explain(e, "listing Functions"))?
                .items
        }
    };
    if functions.is_empty() {
        eprintln!("no Functions in namespace {namespace}");
        return Ok(());
    }
    print!("{}", table(&functions, Timestamp::now()));
    Ok(())
}

/// The columns of the CRD's printer columns, in their order.
pub fn table(functions: &[Function], now: Timestamp) -> String {
    let header = [
        "NAME", "LANGUAGE", "PHASE", "READY", "SERVED", "DIGEST", "URL", "TRIGGERS", "AGE",
    ]
    .map(String::from);
    let rows: Vec<[String; 9]> = functions
        .iter()
        .map(|f| {
            let status = f.status.clone().unwrap_or_default();
            let dash = || "-".to_string();
            [
                f.metadata.name.clone().unwrap_or_default(),
                f.spec.language.as_str().to_string(),
                status.phase.map(|p| p.as_str().to_string()).unwrap_or_else(dash),
                status.ready_replicas.map(|r| r.to_string()).unwrap_or_else(dash),
                status
                    .served_by
                    .map(|served| match served {
                        ServedBy::Pods => "pods".to_string(),
                        ServedBy::Pool => "pool".to_string(),
                    })
                    .unwrap_or_else(dash),
                status.module_digest_short.unwrap_or_else(dash),
                status.url.unwrap_or_else(dash),
                status.triggers_summary.unwrap_or_else(dash),
                f.metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| age(now.duration_since(t.0)))
                    .unwrap_or_else(dash),
            ]
        })
        .collect();
    aligned(std::iter::once(&header).chain(&rows).map(|row| row.as_slice()))
}

/// Rows in columns as kubectl prints them: each as wide as its widest cell, three spaces
/// apart. Cells are counted in characters, so a `·` or `→` keeps its column straight.
pub(super) fn aligned<'a>(rows: impl Iterator<Item = &'a [String]> + Clone) -> String {
    let columns = rows.clone().map(<[String]>::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|i| {
            rows.clone()
                .filter_map(|row| row.get(i))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("   ").trim_end());
        out.push('\n');
    }
    out
}

/// An age as kubectl shows it: `42s`, `7m`, `3h`, `12d`.
pub(super) fn age(elapsed: SignedDuration) -> String {
    let seconds = elapsed.as_secs().max(0);
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_kubectls_default_columns_with_served() {
        let function: Function = serde_json::from_value(serde_json::json!({
            "apiVersion": "wasmless.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": "idle", "creationTimestamp": "2026-11-26T10:00:00Z"},
            "spec": {"language": "go", "source": "package handlers"},
            "status": {"phase": "Ready", "readyReplicas": 0, "servedBy": "pool",
                       "moduleDigestShort": "0c6702ecae", "url": "http://idle.ns.svc.cluster.local:8080"},
        }))
        .unwrap();
        let now: Timestamp = "2026-11-26T10:05:00Z".parse().unwrap();
        let table = table(&[function], now);
        let lines: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
        assert_eq!(
            lines[0],
            [
                "NAME", "LANGUAGE", "PHASE", "READY", "SERVED", "DIGEST", "URL", "TRIGGERS", "AGE"
            ]
        );
        assert_eq!(
            lines[1],
            [
                "idle",
                "go",
                "Ready",
                "0",
                "pool",
                "0c6702ecae",
                "http://idle.ns.svc.cluster.local:8080",
                "-",
                "5m"
            ]
        );
    }
}
