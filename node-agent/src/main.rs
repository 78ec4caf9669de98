//! `wasmless-node-agent`: serves a node's store of verified code on a socket per namespace,
//! each placed by the kubelet's CSI calls (`--kubelet-dir`) or named on the command line.

use anyhow::Context;
use clap::Parser;
use std::path::PathBuf;
use std::sync::Arc;
use wasmless_node_agent::csi::{self, volumes::Volumes};
use wasmless_node_agent::server::{self, ServeLimits};
use wasmless_node_agent::store::{Namespace, Store, StoreLimits};

#[derive(Parser, Debug)]
#[command(name = "wasmless-node-agent", version, about)]
struct Flags {
    /// Where the store keeps its files: the agent's alone (it is made 0700).
    #[arg(long, env = "WASMLESS_STORE_DIR", default_value = "/var/lib/wasmless/code-store")]
    store_dir: PathBuf,
    /// A socket to serve one namespace's runtimes on, as NAMESPACE=PATH (repeatable).
    #[arg(long = "socket", value_parser = parse_socket, required_unless_present = "kubelet_dir")]
    sockets: Vec<(Namespace, PathBuf)>,
    /// The kubelet's root directory: the agent registers there as the CSI driver
    /// code.wasmless.io and serves a socket in each pod volume the kubelet publishes.
    #[arg(long, env = "WASMLESS_KUBELET_DIR")]
    kubelet_dir: Option<PathBuf>,
    /// This node's name, as the kubelet's CSI calls report it.
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node_name: String,
    /// Bytes of code kept on the node; the least recently used go first beyond it.
    #[arg(long, default_value = "8Gi", value_parser = wasmless_formats::quantity::parse_bytes)]
    store_budget: u64,
    /// Bytes of code one namespace holds; beyond it, its least recently used is let go.
    #[arg(long, default_value = "2Gi", value_parser = wasmless_formats::quantity::parse_bytes)]
    namespace_quota: u64,
    /// Largest code, as stored (compressed), that a runtime may put.
    #[arg(long, default_value = "256Mi", value_parser = wasmless_formats::quantity::parse_bytes)]
    max_put_bytes: u64,
    /// Largest code a put may decompress to.
    #[arg(long, default_value = "512Mi", value_parser = wasmless_formats::quantity::parse_bytes)]
    max_code_bytes: u64,
    /// Hash each stored file on every get, not only on the first after the agent starts.
    #[arg(long)]
    verify_every_get: bool,
    /// Where to serve /metrics (the answers to each namespace, the code each holds), such
    /// as 0.0.0.0:9090; unset: nowhere.
    #[arg(long, env = "WASMLESS_METRICS_ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

fn parse_socket(text: &str) -> Result<(Namespace, PathBuf), String> {
    let (namespace, path) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: write NAMESPACE=PATH"))?;
    Ok((Namespace::new(namespace)?, PathBuf::from(path)))
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let flags = Flags::parse();
    let limits = StoreLimits {
        budget: flags.store_budget,
        namespace_quota: flags.namespace_quota,
    };
    let store = Arc::new(
        Store::open(&flags.store_dir, limits, flags.verify_every_get)
            .with_context(|| format!("cannot open the code store at {}", flags.store_dir.display()))?,
    );
    let serve_limits = ServeLimits {
        max_put_bytes: flags.max_put_bytes,
        max_code_bytes: usize::try_from(flags.max_code_bytes).unwrap_or(usize::MAX),
        ..ServeLimits::default()
    };
    if let Some(address) = flags.metrics_addr {
        // Detached: it serves for as long as the process does.
        let _ = wasmless_node_agent::metrics::serve(address, store.clone())
            .with_context(|| format!("cannot serve metrics at {address}"))?;
    }
    let mut sockets = Vec::new();
    for (namespace, path) in flags.sockets {
        sockets.push(server::serve(store.clone(), namespace, &path, serve_limits)?);
    }
    if let Some(kubelet_dir) = &flags.kubelet_dir {
        let records = flags.store_dir.join("volumes");
        let volumes = Volumes::open(store.clone(), serve_limits, kubelet_dir, &records)
            .with_context(|| format!("cannot serve the volumes recorded in {}", records.display()))?;
        let plugin = csi::NodePlugin {
            node_name: flags.node_name.clone(),
            volumes: Arc::new(volumes),
        };
        let registration = kubelet_dir.join("plugins_registry").join(csi::REGISTRATION_SOCKET);
        let serving = csi::serve(plugin, &registration)
            .with_context(|| format!("cannot serve the kubelet at {}", registration.display()))?;
        let _ = serving.join();
    }
    for socket in sockets {
        socket.join();
    }
    Ok(())
}
