//! What the integration tests start on loopback: Debian's OCI registry, an OpenTelemetry
//! Collector, and the in-memory
//! Kubernetes API server (`FakeApiServer`) of the operator's and the builder's tests (tests
//! also run against a real one when `WASMLESS_TEST_KUBECONFIG` is set).

#[cfg(feature = "fake-api")]
mod fake_api;
#[cfg(feature = "flags-reference")]
pub mod flags_reference;
pub mod otelcol;
mod registry;

#[cfg(feature = "fake-api")]
pub use fake_api::{FakeApiServer, Recorded, ServedFakeApi};
pub use registry::Registry;

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
