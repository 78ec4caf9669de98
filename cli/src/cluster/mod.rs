//! The commands that work on the cluster of the current kubeconfig, as `kubectl` would:
//! `deploy` applies a Function and follows it to Ready, `get` lists Functions, `logs`
//! streams their pods' lines, `events` shows where a Function's triggers are and their
//! failed tries, `rollback` sends a Function's traffic back to a kept revision. kube-rs
//! throughout: no `kubectl` needed.

pub mod deploy;
pub mod events;
pub mod get;
pub mod logs;
pub mod rollback;

use anyhow::Context;
use kube::Client;

/// Which cluster and namespace: the kubeconfig's current context, as `kubectl` chooses.
#[derive(clap::Args, Clone, Debug)]
pub struct Target {
    /// The namespace [default: the kubeconfig context's, else `default`].
    #[arg(short, long, env = "WASMLESS_NAMESPACE")]
    pub namespace: Option<String>,
}

impl Target {
    pub async fn connect(&self) -> anyhow::Result<(Client, String)> {
        // rustls panics on the first TLS connection unless a provider is chosen; the
        // workspace links ring alone.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = Client::try_default().await.context(
            "cannot reach a Kubernetes cluster: set KUBECONFIG or ~/.kube/config to one where Wasmless is installed (`kubectl apply -k deploy/`)",
        )?;
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        Ok((client, namespace))
    }
}

/// A missing CRD is the first thing a new user meets: say how to install it.
fn explain(error: kube::Error, doing: &str) -> anyhow::Error {
    match &error {
        kube::Error::Api(status) if status.code == 404 && status.message.contains("the server could not find") => {
            anyhow::anyhow!(
                "{doing}: this cluster has no Function resource; install Wasmless first (`kubectl apply -k deploy/`)"
            )
        }
        _ => anyhow::Error::new(error).context(doing.to_string()),
    }
}
