//! The volumes the kubelet publishes: each pod that mounts `code.wasmless.io` gets a
//! directory holding one socket, `agent.sock`, served as the pod's namespace. The namespace
//! comes from the kubelet (`csi.storage.k8s.io/pod.namespace`, which it writes over any
//! attribute the pod sets), never from the pod. Were the CSIDriver's `podInfoOnMount`
//! turned off, the kubelet would pass the pod's own attributes instead: so the pod's UID
//! must come too, and be the pod whose directory the target is in, which a pod cannot
//! know before it is made, so cannot write in its spec. Nothing is mounted: the kubelet bind-mounts
//! the directory into the pod's containers, read-only, and `connect()` needs no write
//! access to the mount. Each published volume is recorded on disk, so an agent that
//! restarts serves its sockets again (the kubelet does not publish twice for that).

use crate::server::{self, Listening, ServeLimits};
use crate::store::{Namespace, Store};
use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// The socket's name in each published volume.
pub const SOCKET_NAME: &str = "agent.sock";

/// The attributes the kubelet gives a pod's inline volume when the CSIDriver asks for pod
/// information (`podInfoOnMount: true`).
const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";

/// A volume the kubelet asks to publish.
#[derive(Debug, Clone)]
pub struct Publish {
    pub volume_id: String,
    pub target_path: String,
    pub readonly: bool,
    pub volume_context: HashMap<String, String>,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// The request is not one the agent serves; it will not be served if asked again.
    #[error("{0}")]
    Invalid(String),
    /// The agent could not do its part; asked again, it may.
    #[error("{0}")]
    Failed(String),
}

/// The published volumes of this node, each with its socket being served.
pub struct Volumes {
    store: Arc<Store>,
    limits: ServeLimits,
    /// The kubelet's directory of pods: every target is inside it.
    pods_dir: PathBuf,
    /// One record per published volume, `<volume id>`: its namespace and target.
    records_dir: PathBuf,
    published: Mutex<HashMap<String, Published>>,
}

struct Published {
    namespace: Namespace,
    target: PathBuf,
    listening: Listening,
}

impl Volumes {
    /// The volumes published on this node: those recorded in `records_dir` by an earlier
    /// agent are served again, if their directory is still there.
    pub fn open(
        store: Arc<Store>,
        limits: ServeLimits,
        kubelet_dir: &Path,
        records_dir: &Path,
    ) -> std::io::Result<Self> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(records_dir)?;
        let volumes = Self {
            store,
            limits,
            pods_dir: kubelet_dir.join("pods"),
            records_dir: records_dir.to_path_buf(),
            published: Mutex::new(HashMap::new()),
        };
        volumes.restore()?;
        Ok(volumes)
    }

    fn restore(&self) -> std::io::Result<()> {
        for entry in std::fs::read_dir(&self.records_dir)?.flatten() {
            let volume_id = entry.file_name().to_string_lossy().into_owned();
            let recorded = std::fs::read_to_string(entry.path()).ok().and_then(|text| {
                let (namespace, target) = text.trim_end().split_once('\n')?;
                Some((Namespace::new(namespace).ok()?, PathBuf::from(target)))
            });
            let restored = match recorded {
                Some((namespace, target)) if target.is_dir() && self.is_target(&target) => {
                    self.serve(&volume_id, namespace, target)
                }
                _ => Err(VolumeError::Invalid("its record or its directory is gone".into())),
            };
            if let Err(error) = restored {
                tracing::info!(volume_id, %error, "a volume recorded before is not served again");
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Published>> {
        self.published.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serves the pod's namespace a socket in `target_path`. Asked again for a volume
    /// already served there, does nothing.
    pub fn publish(&self, request: &Publish) -> Result<(), VolumeError> {
        check_volume_id(&request.volume_id)?;
        let target = self.target(&request.target_path)?;
        if request.volume_context.get(EPHEMERAL).map(String::as_str) != Some("true") {
            return Err(VolumeError::Invalid(
                "code.wasmless.io serves only inline volumes in a pod's spec (csi: {driver: code.wasmless.io})".into(),
            ));
        }
        if !request.readonly {
            return Err(VolumeError::Invalid(
                "mount code.wasmless.io read-only (csi: {driver: code.wasmless.io, readOnly: true})".into(),
            ));
        }
        let namespace = request
            .volume_context
            .get(POD_NAMESPACE)
            .ok_or_else(|| {
                VolumeError::Invalid(format!(
                    "no {POD_NAMESPACE} from the kubelet: the CSIDriver code.wasmless.io must have podInfoOnMount: true"
                ))
            })
            .and_then(|name| Namespace::new(name).map_err(VolumeError::Invalid))?;
        let pod_uid = request.volume_context.get(POD_UID).map(String::as_str);
        if pod_uid.is_none() || pod_uid != self.pod_of(&target) {
            return Err(VolumeError::Invalid(format!(
                "{POD_UID} {pod_uid:?} from the kubelet is not the pod whose directory {} is in: the CSIDriver code.wasmless.io must have podInfoOnMount: true",
                target.display()
            )));
        }
        if let Some(published) = self.lock().get(&request.volume_id) {
            return match published.target == target && published.namespace == namespace {
                true => Ok(()),
                false => Err(VolumeError::Invalid(format!(
                    "volume {} is published at {} already",
                    request.volume_id,
                    published.target.display()
                ))),
            };
        }
        make_target_dir(&target)?;
        self.record(&request.volume_id, &namespace, &target)?;
        self.serve(&request.volume_id, namespace, target)
    }

    fn serve(&self, volume_id: &str, namespace: Namespace, target: PathBuf) -> Result<(), VolumeError> {
        let listening = server::serve(
            self.store.clone(),
            namespace.clone(),
            &target.join(SOCKET_NAME),
            self.limits,
        )
        .map_err(|error| VolumeError::Failed(error.to_string()))?;
        tracing::info!(volume_id, %namespace, target = %target.display(), "volume published");
        let replaced = self.lock().insert(
            volume_id.to_string(),
            Published {
                namespace,
                target,
                listening,
            },
        );
        if let Some(replaced) = replaced {
            replaced.listening.stop();
        }
        Ok(())
    }

    /// Stops serving the volume's socket and removes what publishing made. A volume not
    /// published (or unpublished already) is fine.
    pub fn unpublish(&self, volume_id: &str, target_path: &str) -> Result<(), VolumeError> {
        check_volume_id(volume_id)?;
        let target = self.target(target_path)?;
        if let Some(published) = self.lock().remove(volume_id) {
            published.listening.stop();
        }
        let socket = target.join(SOCKET_NAME);
        if std::fs::symlink_metadata(&socket).is_ok_and(|metadata| metadata.file_type().is_socket()) {
            std::fs::remove_file(&socket).map_err(failed(&socket))?;
        }
        gone(std::fs::remove_dir(&target)).map_err(failed(&target))?;
        let record = self.records_dir.join(volume_id);
        gone(std::fs::remove_file(&record)).map_err(failed(&record))?;
        tracing::info!(volume_id, target = %target.display(), "volume unpublished");
        Ok(())
    }

    /// How many volumes are served now.
    #[cfg(test)]
    pub fn count(&self) -> usize {
        self.lock().len()
    }

    fn record(&self, volume_id: &str, namespace: &Namespace, target: &Path) -> Result<(), VolumeError> {
        let record = self.records_dir.join(volume_id);
        let written = self.records_dir.join(format!(".{volume_id}.new"));
        std::fs::write(&written, format!("{namespace}\n{}\n", target.display()))
            .and_then(|()| std::fs::rename(&written, &record))
            .map_err(failed(&record))
    }

    /// `target_path` if it is where the kubelet puts a pod's volume: an absolute path of
    /// plain names inside its pods directory, ending in `mount`.
    fn target(&self, target_path: &str) -> Result<PathBuf, VolumeError> {
        let target = PathBuf::from(target_path);
        match self.is_target(&target) {
            true => Ok(target),
            false => Err(VolumeError::Invalid(format!(
                "{target_path:?} is not a pod volume's directory in {}",
                self.pods_dir.display()
            ))),
        }
    }

    /// The pod a target belongs to: the kubelet's `<pods>/<pod uid>/volumes/…/mount`.
    fn pod_of<'a>(&self, target: &'a Path) -> Option<&'a str> {
        match target.strip_prefix(&self.pods_dir).ok()?.components().next()? {
            Component::Normal(uid) => uid.to_str(),
            _ => None,
        }
    }

    fn is_target(&self, target: &Path) -> bool {
        let plain = target
            .components()
            .all(|component| matches!(component, Component::RootDir | Component::Normal(_)));
        plain && target.starts_with(&self.pods_dir) && target.file_name().is_some_and(|name| name == "mount")
    }
}

/// The kubelet's ids of inline volumes are `csi-` and a hex digest; any name safe as a file
/// name in the records is taken.
fn check_volume_id(volume_id: &str) -> Result<(), VolumeError> {
    let safe = !volume_id.is_empty()
        && volume_id.len() <= 128
        && !volume_id.starts_with('.')
        && volume_id
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.'));
    match safe {
        true => Ok(()),
        false => Err(VolumeError::Invalid(format!(
            "{volume_id:?} is not a volume id the agent serves"
        ))),
    }
}

/// The target directory (its parent is the kubelet's), which the pod's user may enter but
/// not change. One already there is taken if it is a directory, not a link to one.
fn make_target_dir(target: &Path) -> Result<(), VolumeError> {
    match std::fs::DirBuilder::new().mode(0o755).create(target) {
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
            let metadata = std::fs::symlink_metadata(target).map_err(failed(target))?;
            if !metadata.is_dir() {
                return Err(VolumeError::Failed(format!(
                    "{} exists and is not a directory",
                    target.display()
                )));
            }
        }
        created => created.map_err(failed(target))?,
    }
    std::fs::set_permissions(target, std::fs::Permissions::from_mode(0o755)).map_err(failed(target))
}

/// A removal's outcome, where what was already gone is removed too.
fn gone(removed: std::io::Result<()>) -> std::io::Result<()> {
    match removed {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn failed(path: &Path) -> impl Fn(std::io::Error) -> VolumeError + '_ {
    move |error| VolumeError::Failed(format!("{}: {error}", path.display()))
}

#[cfg(test)]
#[path = "volumes_tests.rs"]
mod tests;
