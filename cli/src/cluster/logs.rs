//! `wasmless logs <function>`: the request and handler lines of a Function's pods, each
//! prefixed with its pod, as `kubectl logs -l ... --prefix` would show them.

use super::{Target, explain};
use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, LogParams};
use wasmless_artifact::labels;

#[derive(clap::Args)]
pub struct LogsArgs {
    /// The Function.
    pub name: String,
    /// Keep streaming new lines.
    #[arg(short, long)]
    pub follow: bool,
    /// Only the last N lines of each pod.
    #[arg(long)]
    pub tail: Option<i64>,
    #[command(flatten)]
    pub target: Target,
}

pub async fn run(args: LogsArgs) -> anyhow::Result<()> {
    let (client, namespace) = args.target.connect().await?;
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let selector = format!("{}={},wasmless.io/component=runtime", labels::FUNCTION, args.name);
    let running: Vec<String> = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| explain(e, "listing the function's pods"))?
        .items
        .into_iter()
        .filter(|pod| pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|pod| pod.metadata.name)
        .collect();
    if running.is_empty() {
        anyhow::bail!(
            "no running pod of Function {} in namespace {namespace}: is it Ready (`wasmless get {}`)?",
            args.name,
            args.name
        );
    }
    let params = LogParams {
        container: Some("runtime".into()),
        follow: args.follow,
        tail_lines: args.tail,
        ..Default::default()
    };
    // One stream per pod, interleaved as lines arrive.
    let streams = running.into_iter().map(|pod| {
        let pods = pods.clone();
        let params = params.clone();
        async move {
            let lines = pods
                .log_stream(&pod, &params)
                .await
                .map_err(|e| anyhow::Error::new(e).context(format!("reading the log of pod {pod}")))?
                .lines();
            anyhow::Ok(lines.map_ok(move |line| format!("[{pod}] {line}")))
        }
    });
    let mut merged = futures::stream::select_all(
        futures::future::try_join_all(streams)
            .await?
            .into_iter()
            .map(|s| s.boxed()),
    );
    while let Some(line) = merged.next().await {
        println!("{}", line?);
    }
    Ok(())
}
