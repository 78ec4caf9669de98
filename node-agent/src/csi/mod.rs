//! The agent as the kubelet's CSI node plugin `code.wasmless.io`: it registers itself with
//! the kubelet's plugin watcher and answers the node service's calls on one socket, so that
//! any pod with an inline `code.wasmless.io` volume finds in it a socket of the agent served
//! as the pod's own namespace (`volumes`).
//!
//! The registration socket's name holds an `@`: the kubelet dials it by its path with no
//! authority set, so grpc-go sends the path, percent-encoded, as `:authority`, and hyper
//! refuses a `%` in a host; after an `@` that part is user information, where `%` is allowed.

pub mod grpc;
pub mod messages;
pub mod volumes;

use grpc::{Code, Status, decode};
use messages::*;
use prost::Message;
use std::sync::Arc;
use volumes::{Publish, VolumeError, Volumes};

/// The driver's name, as the CSIDriver object and pods' volumes spell it.
pub const DRIVER_NAME: &str = "code.wasmless.io";

/// The registration socket's name in the kubelet's `plugins_registry` directory.
pub const REGISTRATION_SOCKET: &str = "code.wasmless.io@reg.sock";

/// The calls the kubelet makes, answered.
pub struct NodePlugin {
    pub node_name: String,
    pub volumes: Arc<Volumes>,
}

impl grpc::Methods for NodePlugin {
    fn call(&self, method: &str, request: &[u8]) -> Result<Vec<u8>, Status> {
        let reply = match method {
            "/pluginregistration.Registration/GetInfo" => PluginInfo {
                r#type: "CSIPlugin".into(),
                name: DRIVER_NAME.into(),
                endpoint: String::new(),
                supported_versions: vec!["1.0.0".into()],
            }
            .encode_to_vec(),
            "/pluginregistration.Registration/NotifyRegistrationStatus" => {
                let status: RegistrationStatus = decode(request)?;
                match status.plugin_registered {
                    true => tracing::info!(driver = DRIVER_NAME, "registered with the kubelet"),
                    false => tracing::error!(
                        driver = DRIVER_NAME,
                        error = status.error,
                        "the kubelet refused the registration"
                    ),
                }
                Empty {}.encode_to_vec()
            }
            "/csi.v1.Identity/GetPluginInfo" => GetPluginInfoResponse {
                name: DRIVER_NAME.into(),
                vendor_version: env!("CARGO_PKG_VERSION").into(),
            }
            .encode_to_vec(),
            "/csi.v1.Identity/Probe" => ProbeResponse {
                ready: Some(BoolValue { value: true }),
            }
            .encode_to_vec(),
            // No controller service, no staging, no volume statistics: empty lists.
            "/csi.v1.Identity/GetPluginCapabilities" | "/csi.v1.Node/NodeGetCapabilities" => Empty {}.encode_to_vec(),
            "/csi.v1.Node/NodeGetInfo" => NodeGetInfoResponse {
                node_id: self.node_name.clone(),
            }
            .encode_to_vec(),
            "/csi.v1.Node/NodePublishVolume" => {
                let request: NodePublishVolumeRequest = decode(request)?;
                self.volumes
                    .publish(&Publish {
                        volume_id: request.volume_id,
                        target_path: request.target_path,
                        readonly: request.readonly,
                        volume_context: request.volume_context,
                    })
                    .map_err(status)?;
                Empty {}.encode_to_vec()
            }
            "/csi.v1.Node/NodeUnpublishVolume" => {
                let request: NodeUnpublishVolumeRequest = decode(request)?;
                self.volumes
                    .unpublish(&request.volume_id, &request.target_path)
                    .map_err(status)?;
                Empty {}.encode_to_vec()
            }
            _ => {
                return Err(Status::new(
                    Code::Unimplemented,
                    format!("{method} is not served by {DRIVER_NAME}"),
                ));
            }
        };
        Ok(reply)
    }
}

fn status(error: VolumeError) -> Status {
    match error {
        VolumeError::Invalid(message) => Status::new(Code::InvalidArgument, message),
        VolumeError::Failed(message) => Status::new(Code::Internal, message),
    }
}

/// Serves the plugin at `socket` (the kubelet's registry directory) on a thread of its own.
pub fn serve(plugin: NodePlugin, socket: &std::path::Path) -> std::io::Result<std::thread::JoinHandle<()>> {
    if std::fs::symlink_metadata(socket).is_ok() {
        std::fs::remove_file(socket)?;
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let listener = {
        let _entered = runtime.enter();
        tokio::net::UnixListener::bind(socket)?
    };
    // The kubelet (root) alone dials it.
    std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    tracing::info!(driver = DRIVER_NAME, socket = %socket.display(), "serving the kubelet");
    let plugin: Arc<dyn grpc::Methods> = Arc::new(plugin);
    Ok(std::thread::spawn(move || {
        runtime.block_on(grpc::serve(listener, plugin))
    }))
}
