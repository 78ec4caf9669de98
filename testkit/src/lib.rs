//! What the integration tests start on loopback: Debian's OCI registry, an OpenTelemetry
//! Collector, a NATS server with JetStream, and the in-memory
//! Kubernetes API server (`FakeApiServer`) of the operator's and the builder's tests (tests
//! also run against a real one when `WASMLESS_TEST_KUBECONFIG` is set).

#[cfg(feature = "fake-api")]
mod fake_api;
#[cfg(feature = "flags-reference")]
pub mod flags_reference;
pub mod nats;
pub mod otelcol;
mod registry;

#[cfg(feature = "fake-api")]
pub use fake_api::{FakeApiServer, Recorded, ServedFakeApi};
pub use registry::Registry;

/// Installs ring as the process's rustls provider, if none is. reqwest is built without a
/// provider of its own (`rustls-no-provider`, through the OCI client: the workspace links
/// ring alone), and panics building a client in a process that has none.
pub fn install_tls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A client builder for the tests' requests, with the provider installed.
pub fn http_client_builder() -> reqwest::ClientBuilder {
    install_tls_provider();
    reqwest::Client::builder()
}

/// A client for the tests' requests, with the provider installed.
pub fn http_client() -> reqwest::Client {
    http_client_builder().build().expect("a reqwest client with ring")
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
