//! Publishing as the kubelet does it, in a directory laid out as its own: what a pod's
//! volume holds, whose code its socket hands out, what is refused, and what an agent that
//! restarts serves again.

use super::*;
use crate::store::StoreLimits;
use std::time::Duration;
use wasmless_artifact::Digest;
use wasmless_artifact::code_store::{Reply, Request, call};

struct Node {
    store: Arc<Store>,
    kubelet: tempfile::TempDir,
    records: PathBuf,
}

impl Node {
    fn new() -> Self {
        let kubelet = tempfile::tempdir().unwrap();
        let store_dir = kubelet.path().join("store");
        let store = Arc::new(
            Store::open(
                &store_dir,
                StoreLimits {
                    budget: 1 << 30,
                    namespace_quota: 1 << 30,
                },
                false,
            )
            .unwrap(),
        );
        Self {
            store,
            records: store_dir.join("volumes"),
            kubelet,
        }
    }

    /// The agent, started (again) on this node.
    fn agent(&self) -> Volumes {
        Volumes::open(
            self.store.clone(),
            ServeLimits::default(),
            self.kubelet.path(),
            &self.records,
        )
        .unwrap()
    }

    /// A pod's volume directory's path, with the parent the kubelet makes before publishing.
    fn target(&self, pod: &str) -> PathBuf {
        let parent = self
            .kubelet
            .path()
            .join(format!("pods/{pod}/volumes/kubernetes.io~csi/code"));
        std::fs::create_dir_all(&parent).unwrap();
        parent.join("mount")
    }

    /// Code put by `namespace`, as its runtime would have.
    fn code_of(&self, namespace: &str) -> Digest {
        let (digest, admitted) = crate::store::tests::code(namespace);
        self.store
            .put(&Namespace::new(namespace).unwrap(), &digest, admitted)
            .unwrap();
        digest
    }
}

/// The kubelet's request for a pod of `namespace`'s inline volume at `target`.
/// The pod's UID is the name of its directory, `pods/<uid>/volumes/kubernetes.io~csi/code/mount`.
fn publish(volume_id: &str, target: &Path, namespace: &str) -> Publish {
    let pod_uid = target.ancestors().nth(4).and_then(Path::file_name);
    Publish {
        volume_id: volume_id.into(),
        target_path: target.display().to_string(),
        readonly: true,
        volume_context: HashMap::from([
            (POD_NAMESPACE.to_string(), namespace.to_string()),
            (
                POD_UID.to_string(),
                pod_uid.unwrap_or_default().to_string_lossy().into_owned(),
            ),
            ("csi.storage.k8s.io/pod.name".to_string(), "pool-1".to_string()),
            (EPHEMERAL.to_string(), "true".to_string()),
        ]),
    }
}

fn get(target: &Path, digest: &Digest) -> Reply {
    call(
        &target.join(SOCKET_NAME),
        &Request::Get(*digest),
        None,
        Duration::from_secs(5),
    )
    .unwrap()
    .0
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_pods_volume_holds_a_socket_served_as_the_pods_namespace() {
    let node = Node::new();
    let (theirs, ours) = (node.code_of("team-a"), node.code_of("team-b"));
    let agent = node.agent();
    let target = node.target("pod-b");
    agent.publish(&publish("csi-b", &target, "team-b")).unwrap();

    assert_eq!(
        mode(&target),
        0o755,
        "the pod's user enters the directory, and changes nothing in it"
    );
    assert_eq!(
        mode(&target.join(SOCKET_NAME)),
        0o666,
        "the pod's user connects to the socket"
    );
    assert!(
        matches!(get(&target, &ours), Reply::Found(_)),
        "the pod gets its own namespace's code"
    );
    assert_eq!(
        get(&target, &theirs),
        Reply::Absent,
        "a pod of team-b is not handed team-a's code"
    );
}

#[test]
fn a_target_longer_than_a_socket_address_is_served() {
    let node = Node::new();
    let code = node.code_of("team-a");
    let agent = node.agent();
    // /var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~csi/<volume>/mount/agent.sock is
    // over the 107 bytes of a socket's address once the volume's name is long.
    let target = node.target(&format!("2eff1158-1c1a-45d7-a0a6-9036de249489-{}", "v".repeat(60)));
    assert!(target.join(SOCKET_NAME).as_os_str().len() > 108);
    agent.publish(&publish("csi-long", &target, "team-a")).unwrap();
    assert_eq!(mode(&target.join(SOCKET_NAME)), 0o666);
    // A pod reaches it by its short path inside the pod; here, through the directory.
    let dir = std::fs::File::open(&target).unwrap();
    let short = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)));
    assert!(matches!(get(&short, &code), Reply::Found(_)));
}

#[test]
fn publishing_again_is_fine_and_unpublishing_leaves_nothing_for_the_kubelet_to_trip_on() {
    let node = Node::new();
    let agent = node.agent();
    let target = node.target("pod-a");
    agent.publish(&publish("csi-a", &target, "team-a")).unwrap();
    agent.publish(&publish("csi-a", &target, "team-a")).unwrap();
    assert_eq!(agent.count(), 1);

    agent.unpublish("csi-a", &target.display().to_string()).unwrap();
    assert!(
        !target.exists(),
        "the kubelet removes the volume's directory only if it is empty"
    );
    assert_eq!(agent.count(), 0);
    assert_eq!(std::fs::read_dir(&node.records).unwrap().count(), 0, "no record left");
    agent.unpublish("csi-a", &target.display().to_string()).unwrap();
}

#[test]
fn what_is_not_a_pods_inline_read_only_volume_is_refused() {
    let node = Node::new();
    let agent = node.agent();
    let target = node.target("pod-a");
    let refused = |request: Publish, says: &str| match agent.publish(&request) {
        Err(VolumeError::Invalid(message)) => assert!(message.contains(says), "{message:?} says {says:?}"),
        other => panic!("expected a refusal saying {says:?}, got {other:?}"),
    };

    let mut writable = publish("csi-a", &target, "team-a");
    writable.readonly = false;
    refused(writable, "readOnly: true");
    let mut persistent = publish("csi-a", &target, "team-a");
    persistent.volume_context.remove(EPHEMERAL);
    refused(persistent, "inline volumes");
    let mut no_pod_info = publish("csi-a", &target, "team-a");
    no_pod_info.volume_context.remove(POD_NAMESPACE);
    refused(no_pod_info, "podInfoOnMount");
    // Without podInfoOnMount the kubelet passes the pod's own attributes: a pod can claim a
    // namespace, but not its own UID, which it has only once made.
    let mut claimed = publish("csi-a", &target, "team-a");
    claimed.volume_context.remove(POD_UID);
    refused(claimed, "podInfoOnMount");
    let mut another_pod = publish("csi-a", &target, "team-a");
    another_pod
        .volume_context
        .insert(POD_UID.to_string(), "pod-b".to_string());
    refused(another_pod, "podInfoOnMount");
    refused(publish("csi-a", &target, "Team A"), "not a namespace");
    let outside = node.kubelet.path().join("plugins/mount");
    refused(publish("csi-a", &outside, "team-a"), "not a pod volume's directory");
    let climbing = node.kubelet.path().join("pods/x/../../mount");
    refused(publish("csi-a", &climbing, "team-a"), "not a pod volume's directory");
    refused(publish("../csi-a", &target, "team-a"), "not a volume id");

    assert!(!target.exists(), "nothing made for a refused volume");
    assert_eq!(agent.count(), 0);
}

#[test]
fn an_agent_started_again_serves_the_volumes_published_before() {
    let node = Node::new();
    let code = node.code_of("team-a");
    let target = node.target("pod-a");
    let gone = node.target("pod-gone");
    let first = node.agent();
    first.publish(&publish("csi-a", &target, "team-a")).unwrap();
    first.publish(&publish("csi-gone", &gone, "team-a")).unwrap();
    // The agent's process ends, its socket files stay; one pod's directory goes meanwhile.
    drop(first);
    std::fs::remove_file(gone.join(SOCKET_NAME)).unwrap();
    std::fs::remove_dir(&gone).unwrap();

    let second = node.agent();
    assert_eq!(
        second.count(),
        1,
        "the volume still there is served, the one gone is forgotten"
    );
    assert!(matches!(get(&target, &code), Reply::Found(_)));
    assert!(!node.records.join("csi-gone").exists());
}

#[test]
fn a_socket_stopped_accepts_no_more_and_its_thread_ends() {
    let node = Node::new();
    let socket = node.kubelet.path().join("stopped.sock");
    let listening = server::serve(
        node.store.clone(),
        Namespace::new("team-a").unwrap(),
        &socket,
        ServeLimits::default(),
    )
    .unwrap();
    listening.stop();
    let (ended, waited) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        listening.join();
        let _ = ended.send(());
    });
    waited
        .recv_timeout(Duration::from_secs(5))
        .expect("the socket's thread ended");
    assert!(call(&socket, &Request::Get(Digest::of(b"x")), None, Duration::from_secs(1)).is_err());
}
