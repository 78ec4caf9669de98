//! `wasmless rollback <fn> [revision]`: all of a Function's traffic to a kept revision
//! (default: the one before the revision serving now), by writing `spec.traffic`, then
//! following the Function until that revision serves. Nothing is built: the revision's
//! module and compiled code are still stored.

use super::{Target, explain};
use anyhow::bail;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use std::time::{Duration, Instant};
use wasmless_operator::Function;
use wasmless_operator::FunctionStatus;
use wasmless_operator::crd::Phase;

#[derive(clap::Args)]
pub struct RollbackArgs {
    /// The Function.
    pub name: String,
    /// The revision to send all traffic to (`wasmless get` and `kubectl get fn <name> -o
    /// yaml` list them) [default: the one before the revision serving now].
    pub revision: Option<String>,
    /// How long to wait for the revision to serve.
    #[arg(long, default_value = "2m", value_parser = wasmless_runtime::config::parse_duration)]
    pub timeout: Duration,
    #[command(flatten)]
    pub target: Target,
}

pub async fn run(args: RollbackArgs) -> anyhow::Result<()> {
    let (client, namespace) = args.target.connect().await?;
    let api: Api<Function> = Api::namespaced(client, &namespace);
    let name = &args.name;
    let func = api
        .get(name)
        .await
        .map_err(|e| explain(e, &format!("reading Function {name} in namespace {namespace}")))?;
    let status = func.status.clone().unwrap_or_default();
    let target = choose(name, &status, args.revision.as_deref())?;
    let from = serving(&status).unwrap_or("-").to_string();
    let started = Instant::now();
    let patched = api
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"traffic": [{"revision": target, "percent": 100}]}})),
        )
        .await
        .map_err(|e| explain(e, &format!("writing spec.traffic of Function {name}")))?;
    let generation = patched.metadata.generation.unwrap_or_default();
    loop {
        let status = api
            .get(name)
            .await
            .map_err(|e| explain(e, &format!("reading Function {name}")))?
            .status
            .unwrap_or_default();
        let observed = status.observed_generation.unwrap_or_default() >= generation;
        if observed && serving(&status) == Some(target.as_str()) && status.phase == Some(Phase::Ready) {
            println!(
                "{name}: all traffic on {target} (was {from}), in {:.1} s; back to the latest build: `kubectl patch fn {name} --type=json -p '[{{\"op\":\"remove\",\"path\":\"/spec/traffic\"}}]'`",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if observed && let Some(ready) = condition(&status, "Ready").filter(|c| c.reason == "RevisionNotFound") {
            bail!("{name}: {}", ready.message);
        }
        if started.elapsed() >= args.timeout {
            bail!(
                "{name}: {target} does not serve yet after {:?} (Ready: {}); the operator goes on: follow it with `wasmless get {name}`",
                args.timeout,
                condition(&status, "Ready").map(|c| c.message.as_str()).unwrap_or("-")
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The revision serving now: what status says serves, else the latest ready one.
fn serving(status: &FunctionStatus) -> Option<&str> {
    status
        .traffic
        .first()
        .map(|t| t.revision.as_str())
        .or(status.latest_ready_revision.as_deref())
}

/// The revision to roll back to: the one asked for if kept, else the kept one just older
/// than what serves now.
pub fn choose(name: &str, status: &FunctionStatus, asked: Option<&str>) -> anyhow::Result<String> {
    let kept: Vec<&str> = status.revisions.iter().map(|r| r.name.as_str()).collect();
    if kept.is_empty() {
        bail!("{name} has no revisions yet: it has not been built (see `wasmless get {name}`)");
    }
    if let Some(asked) = asked {
        if !kept.contains(&asked) {
            bail!(
                "{name} keeps no revision {asked}: the kept ones are {}",
                kept.join(", ")
            );
        }
        return Ok(asked.to_string());
    }
    let now = serving(status).unwrap_or(kept[0]);
    let Some(position) = kept.iter().position(|r| *r == now) else {
        bail!(
            "{name} serves {now}, which is no longer kept: name a revision, one of {}",
            kept.join(", ")
        );
    };
    match kept.get(position + 1) {
        Some(before) => Ok(before.to_string()),
        None => bail!(
            "{name} keeps no revision before {now} (kept: {}): name one, or raise spec.revisionHistoryLimit for later builds",
            kept.join(", ")
        ),
    }
}

fn condition<'a>(status: &'a FunctionStatus, kind: &str) -> Option<&'a Condition> {
    status.conditions.iter().find(|c| c.type_ == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(kept: &[&str], serving: Option<&str>) -> FunctionStatus {
        serde_json::from_value(json!({
            "revisions": kept.iter().map(|name| json!({
                "name": name, "sourceDigest": "sha256:0", "moduleDigest": "sha256:1",
                "created": "2026-11-26T10:00:00Z",
            })).collect::<Vec<_>>(),
            "latestReadyRevision": kept.first(),
            "traffic": serving.map(|s| vec![json!({"revision": s, "percent": 100})]).unwrap_or_default(),
        }))
        .unwrap()
    }

    #[test]
    fn the_default_is_the_revision_before_the_one_serving() {
        let kept = ["hello-3", "hello-2", "hello-1"];
        assert_eq!(choose("hello", &status(&kept, None), None).unwrap(), "hello-2");
        assert_eq!(
            choose("hello", &status(&kept, Some("hello-2")), None).unwrap(),
            "hello-1"
        );
        assert_eq!(
            choose("hello", &status(&kept, None), Some("hello-1")).unwrap(),
            "hello-1"
        );
        let error = choose("hello", &status(&kept, Some("hello-1")), None).unwrap_err();
        assert!(error.to_string().contains("no revision before hello-1"), "{error}");
        let error = choose("hello", &status(&kept, None), Some("hello-9")).unwrap_err();
        assert!(error.to_string().contains("hello-3, hello-2, hello-1"), "{error}");
        assert!(choose("hello", &status(&[], None), None).is_err());
    }
}
