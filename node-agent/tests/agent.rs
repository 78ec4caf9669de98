//! The agent binary, as a node runs it, tried from outside: through its sockets, as the
//! runtimes of two namespaces and as a user with fewer rights than its own.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::{Duration, Instant};
use wasmless_artifact::code_store::{Reply, Request, call};
use wasmless_artifact::{CodeHeader, CodeKind, Digest, encode_code};

/// The uid every tenant's runtime runs as on a cluster.
const TENANT_UID: u32 = 65532;

struct Agent {
    child: Child,
    store: PathBuf,
    sockets: PathBuf,
    metrics: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Agent {
    /// The agent serving `team-a` and `team-b` each on a socket of its own.
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let store = dir.path().join("store");
        let sockets = dir.path().join("sockets");
        std::fs::create_dir(&sockets).unwrap();
        // A pod reaches its socket through its volume; here, through a directory anyone may
        // traverse (the test's own is 0700).
        for path in [dir.path(), &sockets] {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // A port free a moment ago, as Prometheus would be told it.
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_wasmless-node-agent"))
            .arg("--store-dir")
            .arg(&store)
            .arg("--metrics-addr")
            .arg(metrics.to_string())
            .arg("--socket")
            .arg(format!("team-a={}", sockets.join("team-a.sock").display()))
            .arg("--socket")
            .arg(format!("team-b={}", sockets.join("team-b.sock").display()))
            .spawn()
            .unwrap();
        let agent = Self {
            child,
            store,
            sockets,
            metrics,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !(agent.socket("team-a").exists() && agent.socket("team-b").exists()) {
            assert!(Instant::now() < deadline, "the agent made no sockets in 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        agent
    }

    fn socket(&self, namespace: &str) -> PathBuf {
        self.sockets.join(format!("{namespace}.sock"))
    }

    fn get(&self, namespace: &str, digest: &Digest) -> (Reply, Option<std::fs::File>) {
        let (reply, file) = call(
            &self.socket(namespace),
            &Request::Get(*digest),
            None,
            Duration::from_secs(5),
        )
        .unwrap();
        (reply, file.map(std::fs::File::from))
    }

    /// A put as the runtime makes it: the stored bytes in a sealed memory file.
    fn put(&self, namespace: &str, digest: &Digest, stored: &[u8]) -> Reply {
        use rustix::fs::{MemfdFlags, SealFlags};
        let file = std::fs::File::from(rustix::fs::memfd_create("code", MemfdFlags::ALLOW_SEALING).unwrap());
        std::io::Write::write_all(&mut &file, stored).unwrap();
        rustix::fs::fcntl_add_seals(&file, SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK).unwrap();
        self.put_file(namespace, digest, &file)
    }

    fn put_file(&self, namespace: &str, digest: &Digest, file: &std::fs::File) -> Reply {
        call(
            &self.socket(namespace),
            &Request::Put(*digest),
            Some(file.as_fd()),
            Duration::from_secs(30),
        )
        .unwrap()
        .0
    }

    /// What Prometheus scrapes: `/metrics` over HTTP/1.1.
    fn scrape(&self) -> String {
        let mut stream =
            TcpStream::connect_timeout(&self.metrics, Duration::from_secs(5)).expect("the agent serves metrics");
        stream.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            stream,
            "GET /metrics HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        assert!(response.starts_with("HTTP/1.1 200"), "{response}");
        response
    }

    fn object(&self, digest: &Digest) -> PathBuf {
        self.store.join("objects").join(format!("{}.cwasm", digest.hex()))
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Code as the builder stores it: `start` and 64 KiB LZ4 cannot shrink, behind a header.
fn stored_code(start: &str) -> (Vec<u8>, Vec<u8>) {
    let mut state = start
        .bytes()
        .fold(0x2545_f491_4f6c_dd1d_u64, |s, b| s.rotate_left(7) ^ u64::from(b));
    let mut cwasm = format!("\x7fELF{start}").into_bytes();
    cwasm.extend((0..64 << 10).map(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state as u8
    }));
    let header = CodeHeader {
        module_digest: Digest::of(start.as_bytes()),
        engine: "ab".repeat(32),
        kind: CodeKind::Module,
        target: "x86-64-v3".into(),
        module_files: false,
    };
    (encode_code(&header, &cwasm), cwasm)
}

fn read(file: &std::fs::File) -> Vec<u8> {
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &*file, &mut bytes).unwrap();
    bytes
}

#[test]
fn a_namespace_gets_back_the_code_it_put_and_another_namespace_gets_nothing() {
    let agent = Agent::start();
    let (stored, cwasm) = stored_code("payments");
    let digest = Digest::of(&stored);
    assert_eq!(agent.get("team-a", &digest).0, Reply::Absent);
    assert_eq!(agent.put("team-a", &digest, &stored), Reply::Stored);

    let (reply, file) = agent.get("team-a", &digest);
    let Reply::Found(header) = reply else {
        panic!("expected the code, got {reply:?}")
    };
    assert_eq!(header.module_digest, Digest::of(b"payments"));
    assert_eq!(read(&file.expect("the code's file came along")), cwasm);

    // team-b knows the digest (it is in every pod's arguments), not the code.
    assert_eq!(agent.get("team-b", &digest).0, Reply::Absent);
    assert!(agent.get("team-b", &digest).1.is_none());
}

#[test]
fn a_put_of_bytes_that_are_not_what_the_digest_pins_or_in_an_unsealed_file_is_refused() {
    let agent = Agent::start();
    let (victim, _) = stored_code("payments");
    let (forged, _) = stored_code("malicious");
    let victims_digest = Digest::of(&victim);
    let reply = agent.put("team-b", &victims_digest, &forged);
    assert!(
        matches!(&reply, Reply::Refused(why) if why.starts_with("digest:")),
        "{reply:?}"
    );
    assert!(!agent.object(&victims_digest).exists());
    assert_eq!(agent.put("team-a", &victims_digest, &victim), Reply::Stored);
    let (_, file) = agent.get("team-a", &victims_digest);
    assert_eq!(read(&file.unwrap())[..12], *b"\x7fELFpayments");

    // A file that could change or grow while the agent reads it is not read at all.
    let mut unsealed = tempfile::tempfile().unwrap();
    std::io::Write::write_all(&mut unsealed, &victim).unwrap();
    let reply = agent.put_file("team-b", &victims_digest, &unsealed);
    assert!(
        matches!(&reply, Reply::Refused(why) if why.starts_with("read:")),
        "{reply:?}"
    );

    let not_code = b"#!/bin/sh\nrm -rf /\n".to_vec();
    let reply = agent.put("team-b", &Digest::of(&not_code), &not_code);
    assert!(
        matches!(&reply, Reply::Refused(why) if why.starts_with("malformed:")),
        "{reply:?}"
    );
}

#[test]
fn a_file_changed_on_disk_is_answered_corrupt_and_removed() {
    let agent = Agent::start();
    let (stored, _) = stored_code("orders");
    let digest = Digest::of(&stored);
    assert_eq!(agent.put("team-a", &digest, &stored), Reply::Stored);
    // Only root can: the file is root's, 0444, in a 0700 directory. Later than the put by
    // more than a tick of the coarsest file clock, as a change at rest would be (within the
    // same tick only the re-hash after the agent's restart would see it).
    std::thread::sleep(Duration::from_millis(20));
    let object = agent.object(&digest);
    let mut file = std::fs::OpenOptions::new().write(true).open(&object).unwrap();
    std::io::Write::write_all(&mut file, b"\x7fELF\x02").unwrap();
    drop(file);
    assert_eq!(agent.get("team-a", &digest).0, Reply::Corrupt);
    assert!(!object.exists());
    assert_eq!(agent.get("team-a", &digest).0, Reply::Absent);
}

/// As the tenants' uid, with the fd of code it may run: the file cannot be written, reopened
/// for writing or made writable, and the store cannot be listed.
#[test]
fn a_tenant_cannot_change_the_code_it_is_handed_nor_look_into_the_store() {
    assert!(
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .any(|line| line.starts_with("Uid:") && line.split_whitespace().nth(1) == Some("0")),
        "this test runs as root (as the agent does), to try the store as uid {TENANT_UID}"
    );
    let agent = Agent::start();
    let (stored, _) = stored_code("payments");
    let digest = Digest::of(&stored);
    assert_eq!(agent.put("team-a", &digest, &stored), Reply::Stored);
    // Beside the sockets, where the tenant's uid may read it (a checkout may be in a home
    // only root enters).
    let probe = agent.sockets.join("tenant_probe.py");
    std::fs::write(&probe, include_str!("tenant_probe.py")).unwrap();
    std::fs::set_permissions(&probe, std::fs::Permissions::from_mode(0o644)).unwrap();
    let output = Command::new("python3")
        .arg(&probe)
        .arg(agent.socket("team-a"))
        .arg(digest.to_string())
        .arg(&agent.store)
        .uid(TENANT_UID)
        .gid(TENANT_UID)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let expected = [
        "reply found",
        "read ok",
        "write EBADF",
        "reopen-for-writing EACCES",
        "chmod EPERM",
        "list-store EACCES",
    ];
    assert_eq!(printed.lines().collect::<Vec<_>>(), expected, "{printed}");
}

/// A sample's value in a scrape, `None` where the scrape has no such line.
fn sample(scrape: &str, series: &str) -> Option<f64> {
    scrape
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|value| value.trim().parse().unwrap())
}

#[test]
fn its_metrics_count_each_namespaces_answers_and_the_code_each_holds() {
    let agent = Agent::start();
    let (stored, cwasm) = stored_code("ledger");
    let digest = Digest::of(&stored);
    assert_eq!(agent.get("team-a", &digest).0, Reply::Absent);
    assert_eq!(agent.put("team-a", &digest, &stored), Reply::Stored);
    assert!(matches!(agent.get("team-a", &digest).0, Reply::Found(_)));
    assert_eq!(agent.get("team-b", &digest).0, Reply::Absent);
    assert!(matches!(
        agent.put("team-b", &digest, b"not the code"),
        Reply::Refused(_)
    ));

    let scrape = agent.scrape();
    let answers = |namespace: &str, op: &str, result: &str| {
        sample(
            &scrape,
            &format!("wasmless_code_store_answers_total{{namespace=\"{namespace}\",op=\"{op}\",result=\"{result}\"}}"),
        )
    };
    assert_eq!(answers("team-a", "get", "absent"), Some(1.0), "{scrape}");
    assert_eq!(answers("team-a", "put", "stored"), Some(1.0), "{scrape}");
    assert_eq!(answers("team-a", "get", "found"), Some(1.0), "{scrape}");
    assert_eq!(answers("team-b", "get", "absent"), Some(1.0), "{scrape}");
    assert_eq!(answers("team-b", "put", "refused"), Some(1.0), "{scrape}");
    assert_eq!(answers("team-b", "get", "found"), None, "{scrape}");

    // team-a holds the code (charged at least a MiB, as its quota counts it); team-b nothing.
    let held = sample(&scrape, "wasmless_code_store_bytes{namespace=\"team-a\"}").expect("team-a's bytes");
    assert!(held >= cwasm.len().max(1 << 20) as f64, "{scrape}");
    assert_eq!(
        sample(&scrape, "wasmless_code_store_objects{namespace=\"team-a\"}"),
        Some(1.0),
        "{scrape}"
    );
    assert_eq!(
        sample(&scrape, "wasmless_code_store_objects{namespace=\"team-b\"}").unwrap_or(0.0),
        0.0,
        "{scrape}"
    );
    assert_eq!(
        sample(&scrape, "wasmless_code_store_node_bytes"),
        Some(held),
        "{scrape}"
    );
}

#[test]
fn idle_connections_to_its_metrics_port_hold_few_descriptors_and_code_is_served_on() {
    let agent = Agent::start();
    let descriptors = || {
        std::fs::read_dir(format!("/proc/{}/fd", agent.child.id()))
            .unwrap()
            .count()
    };
    let before = descriptors();
    // Any pod reaches the port: one that opens connections and sends nothing.
    let idle: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(agent.metrics).unwrap()).collect();
    std::thread::sleep(Duration::from_millis(500));
    let held = descriptors().saturating_sub(before);
    assert!(held <= 8, "the agent holds {held} descriptors for 64 idle connections");

    let (stored, _) = stored_code("meanwhile");
    let digest = Digest::of(&stored);
    assert_eq!(agent.put("team-a", &digest, &stored), Reply::Stored);
    assert!(matches!(agent.get("team-a", &digest).0, Reply::Found(_)));
    drop(idle);
}
