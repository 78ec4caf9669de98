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
    pub fn start() -> Self {
        let storage = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = storage.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
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
        use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
        let client = oci_client::Client::new(ClientConfig {
            protocol: ClientProtocol::Http,
            ..Default::default()
        });
        let reference: oci_client::Reference = format!("{}/{repository_and_tag}", self.address).parse().unwrap();
        let auth = oci_client::secrets::RegistryAuth::Anonymous;
        let layers: Vec<ImageLayer> = layers
            .iter()
            .map(|(media_type, bytes)| ImageLayer::new(bytes.to_vec(), media_type.to_string(), None))
            .collect();
        let config = Config::new(
            b"{}".to_vec(),
            wasmless_artifact::oci::CONFIG_MEDIA_TYPE.to_string(),
            None,
        );
        client.push(&reference, &layers, config, &auth, None).await.unwrap();
        client.fetch_manifest_digest(&reference, &auth).await.unwrap()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
