//! Debian's `docker-registry` (the CNCF distribution registry), started on loopback.

use crate::free_port;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Debian's `docker-registry` (the CNCF distribution registry) on a loopback port.
pub struct Registry {
    child: Child,
    pub address: String,
    _storage: tempfile::TempDir,
}

impl Registry {
    /// A registry that refuses to delete manifests (distribution's default).
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// A registry that deletes manifests when asked (`storage.delete.enabled`).
    pub fn start_allowing_deletes() -> Self {
        Self::start_with(true)
    }

    fn start_with(deletes: bool) -> Self {
        let storage = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = storage.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: {deletes}\nhttp:\n  addr: 127.0.0.1:{port}\n",
                storage.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("docker-registry must be installed (scripts/setup.sh installs it)");
        let address = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(Instant::now() < deadline, "docker-registry did not start listening");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            address,
            _storage: storage,
        }
    }

    /// Pushes `wasm` as a Wasm OCI artifact; returns the manifest's digest.
    pub async fn push_wasm(&self, repository_and_tag: &str, wasm: &[u8]) -> String {
        self.push_layers(repository_and_tag, &[(wasmless_artifact::oci::LAYER_MEDIA_TYPE, wasm)])
            .await
    }

    /// Pushes an artifact of `(media type, bytes)` layers, in order, with the Wasm OCI
    /// config; returns the manifest's digest.
    pub async fn push_layers(&self, repository_and_tag: &str, layers: &[(&str, &[u8])]) -> String {
        self.push_with_config(repository_and_tag, wasmless_artifact::oci::CONFIG_MEDIA_TYPE, layers)
            .await
    }

    /// Pushes an artifact of `(media type, bytes)` layers whose config has `config_media_type`
    /// (another tool's image, say); returns the manifest's digest.
    pub async fn push_with_config(
        &self,
        repository_and_tag: &str,
        config_media_type: &str,
        layers: &[(&str, &[u8])],
    ) -> String {
        use oci_client::client::{Config, ImageLayer};
        let client = plain_http_client();
        let reference: oci_client::Reference = format!("{}/{repository_and_tag}", self.address).parse().unwrap();
        let auth = oci_client::secrets::RegistryAuth::Anonymous;
        let layers: Vec<ImageLayer> = layers
            .iter()
            .map(|(media_type, bytes)| ImageLayer::new(bytes.to_vec(), media_type.to_string(), None))
            .collect();
        let config = Config::new(b"{}".to_vec(), config_media_type.to_string(), None);
        client.push(&reference, &layers, config, &auth, None).await.unwrap();
        client.fetch_manifest_digest(&reference, &auth).await.unwrap()
    }

    /// The tags of `repository`, sorted: none once its manifests are deleted (or before any).
    pub async fn tags(&self, repository: &str) -> Vec<String> {
        let client = plain_http_client();
        let reference: oci_client::Reference = format!("{}/{repository}:any", self.address).parse().unwrap();
        let auth = oci_client::secrets::RegistryAuth::Anonymous;
        let mut tags = client
            .list_tags(&reference, &auth, None, None)
            .await
            .map(|listed| listed.tags)
            .unwrap_or_default();
        tags.sort();
        tags
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A plain-HTTP client of the test's registry. The OCI client takes the process's rustls
/// provider (`rustls-tls-no-provider`), and panics without one even when it never speaks TLS.
fn plain_http_client() -> oci_client::Client {
    crate::install_tls_provider();
    oci_client::Client::new(oci_client::client::ClientConfig {
        protocol: oci_client::client::ClientProtocol::Http,
        ..Default::default()
    })
}
