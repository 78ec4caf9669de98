//! Where a trigger's events go: the ready Pods behind the Function's Service, in the
//! Function's own namespace, each address checked against its Pod's own. Not the Service's
//! cluster IP: whoever edits a namespace's Services and EndpointSlices chooses where that
//! IP leads, and the component, which other namespaces' NetworkPolicies may let in, would
//! then carry one namespace's messages to another's pods (security.md, door 8).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::RwLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use thiserror::Error;

#[derive(Debug, Error)]
#[error("the endpoints of Service {namespace}/{service} cannot be read: {source}")]
pub struct EndpointsError {
    namespace: String,
    service: String,
    #[source]
    source: kube::Error,
}

/// Endpoints looked at, at most, per Service: the slices are the namespace's users' to
/// write, and each one costs the component work.
const MAX_ENDPOINTS: usize = 1024;

/// The addresses of the Function's ready Pods on the Service's `http` port: two reads of
/// the API (the Service's EndpointSlices, the namespace's running Pods), whatever the
/// slices say.
pub async fn pod_addresses(
    kube: &kube::Client,
    namespace: &str,
    service: &str,
) -> Result<Vec<SocketAddr>, EndpointsError> {
    let failed = |source| EndpointsError {
        namespace: namespace.into(),
        service: service.into(),
        source,
    };
    let slices: Api<EndpointSlice> = Api::namespaced(kube.clone(), namespace);
    let slices = slices
        .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={service}")))
        .await
        .map_err(failed)?;
    let pods: Api<Pod> = Api::namespaced(kube.clone(), namespace);
    let pods = pods
        .list(&ListParams::default().fields("status.phase=Running"))
        .await
        .map_err(failed)?;
    let live: HashMap<String, LivePod> = pods.items.into_iter().filter_map(LivePod::of).collect();
    let mut addresses = Vec::new();
    let mut looked_at = 0;
    for slice in slices {
        let Some(port) = slice
            .ports
            .iter()
            .flatten()
            .find(|port| port.name.as_deref() == Some("http"))
            .and_then(|port| port.port)
            .and_then(|port| u16::try_from(port).ok())
        else {
            continue;
        };
        for endpoint in &slice.endpoints {
            looked_at += 1;
            if looked_at > MAX_ENDPOINTS {
                break;
            }
            let Some(pod) = endpoint
                .target_ref
                .as_ref()
                .filter(|target| target.kind.as_deref() == Some("Pod"))
                .filter(|target| target.namespace.as_deref().is_none_or(|ns| ns == namespace))
                .and_then(|target| Some((target.name.as_ref()?, target.uid.as_ref()?)))
                .and_then(|(name, uid)| live.get(name).filter(|pod| &pod.uid == uid))
            else {
                continue;
            };
            addresses.extend(
                endpoint
                    .addresses
                    .iter()
                    .filter_map(|address| address.parse::<IpAddr>().ok())
                    .filter(|ip| pod.ips.contains(ip))
                    .map(|ip| SocketAddr::new(ip, port)),
            );
        }
    }
    addresses.sort();
    addresses.dedup();
    Ok(addresses)
}

/// A Pod whose addresses are its own now: running, ready by its own conditions, not being
/// deleted, not on the node's network. A finished Pod keeps its old addresses in its
/// status after the network has given them to another Pod, maybe of another namespace.
struct LivePod {
    uid: String,
    ips: Vec<IpAddr>,
}

impl LivePod {
    fn of(pod: Pod) -> Option<(String, Self)> {
        let name = pod.metadata.name?;
        let uid = pod.metadata.uid?;
        if pod.metadata.deletion_timestamp.is_some() || pod.spec.as_ref()?.host_network == Some(true) {
            return None;
        }
        let status = pod.status?;
        let ready = status
            .conditions
            .iter()
            .flatten()
            .any(|condition| condition.type_ == "Ready" && condition.status == "True");
        if status.phase.as_deref() != Some("Running") || !ready {
            return None;
        }
        let ips = status
            .pod_ips
            .iter()
            .flatten()
            .filter_map(|ip| ip.ip.parse().ok())
            .collect();
        Some((name, Self { uid, ips }))
    }
}

/// A trigger's current destinations, refreshed in the background, taken in turn.
#[derive(Default)]
pub struct Addresses {
    current: RwLock<Vec<SocketAddr>>,
    next: AtomicUsize,
    /// Told when a delivery found none: the Pods are read again then, not a few seconds
    /// later (a trigger starts before its Function serves; a pool pod is replaced).
    missing: tokio::sync::Notify,
    /// Told when destinations are set: a delivery that found none waits for this.
    found: tokio::sync::Notify,
}

impl Addresses {
    pub fn fixed(addresses: Vec<SocketAddr>) -> Self {
        let this = Self::default();
        this.set(addresses);
        this
    }

    pub fn set(&self, addresses: Vec<SocketAddr>) {
        let some = !addresses.is_empty();
        *self.current.write().expect("addresses") = addresses;
        if some {
            self.found.notify_waiters();
        }
    }

    /// The next destination; with none known, the Pods are read again and this waits up to
    /// `wait` for them, so a try is counted as "no ready pod" only after a fresh look.
    pub async fn pick_or_wait(&self, wait: std::time::Duration) -> Option<SocketAddr> {
        let found = self.found.notified();
        tokio::pin!(found);
        found.as_mut().enable();
        if let Some(address) = self.pick() {
            return Some(address);
        }
        let _ = tokio::time::timeout(wait, found).await;
        self.pick()
    }

    /// The next destination, or `None` while the Function has no ready Pod.
    pub fn pick(&self) -> Option<SocketAddr> {
        let current = self.current.read().expect("addresses");
        if current.is_empty() {
            self.missing.notify_one();
            return None;
        }
        Some(current[self.next.fetch_add(1, Ordering::Relaxed) % current.len()])
    }

    /// Resolves once a delivery has found no destination.
    pub async fn missed(&self) {
        self.missing.notified().await;
    }
}
