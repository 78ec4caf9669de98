//! What the integration tests start on loopback: Debian's OCI registry, and an
//! in-memory Kubernetes API for ConfigMaps (the issue allows a fake API server where
//! no cluster exists; tests also run against a real one when
//! `WASMLESS_TEST_KUBECONFIG` is set).

mod fake_kube;
mod registry;

pub use fake_kube::{FakeKube, RunningFakeKube};
pub use registry::Registry;

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
