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

/// A tool of scripts/lib.sh the tests start (the Collector, nats-server): the path in
/// `env` (scripts/test.sh builds the tools in the background and sets it), or built (once)
/// or found in the cache by the shell function `tool`.
pub(crate) fn lib_sh_tool(env: &str, tool: &str, say_as: &str) -> std::path::PathBuf {
    if let Some(path) = std::env::var_os(env) {
        return path.into();
    }
    let output = std::process::Command::new("bash")
        .args(["-c", &format!(". scripts/lib.sh && {tool}")])
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap())
        .env("SAY_AS", say_as)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap();
    assert!(output.status.success(), "scripts/lib.sh's {tool} failed");
    String::from_utf8(output.stdout).unwrap().trim().into()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}
