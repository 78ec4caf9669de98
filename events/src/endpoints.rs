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

/// The addresses of the Function's ready Pods on the Service's `http` port.
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
    let mut pod_ips: HashMap<String, Vec<IpAddr>> = HashMap::new();
    let mut addresses = Vec::new();
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
            let ready = endpoint.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let Some(pod) = endpoint.target_ref.as_ref().filter(|target| {
                target.kind.as_deref() == Some("Pod") && target.namespace.as_deref().is_none_or(|ns| ns == namespace)
            }) else {
                continue;
            };
            let Some(name) = pod.name.clone().filter(|_| ready) else {
                continue;
            };
            if !pod_ips.contains_key(&name) {
                let ips = match pods.get_opt(&name).await.map_err(failed)? {
                    Some(pod) => pod
                        .status
                        .and_then(|status| status.pod_ips)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|ip| ip.ip.parse().ok())
                        .collect(),
                    None => Vec::new(),
                };
                pod_ips.insert(name.clone(), ips);
            }
            let own = &pod_ips[&name];
            addresses.extend(
                endpoint
                    .addresses
                    .iter()
                    .filter_map(|address| address.parse::<IpAddr>().ok())
                    .filter(|ip| own.contains(ip))
                    .map(|ip| SocketAddr::new(ip, port)),
            );
        }
    }
    addresses.sort();
    addresses.dedup();
    Ok(addresses)
}

/// A trigger's current destinations, refreshed in the background, taken in turn.
#[derive(Default)]
pub struct Addresses {
    current: RwLock<Vec<SocketAddr>>,
    next: AtomicUsize,
}

impl Addresses {
    pub fn fixed(addresses: Vec<SocketAddr>) -> Self {
        let this = Self::default();
        this.set(addresses);
        this
    }

    pub fn set(&self, addresses: Vec<SocketAddr>) {
        *self.current.write().expect("addresses") = addresses;
    }

    /// The next destination, or `None` while the Function has no ready Pod.
    pub fn pick(&self) -> Option<SocketAddr> {
        let current = self.current.read().expect("addresses");
        if current.is_empty() {
            return None;
        }
        Some(current[self.next.fetch_add(1, Ordering::Relaxed) % current.len()])
    }
}
