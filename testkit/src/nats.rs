//! A real NATS server with JetStream (built from its Go module by scripts/lib.sh) on
//! loopback, its store in a directory of its own: the events tests' broker. Killed with
//! `kill`, and started again on the same port and store with `restart`, as a broker's pod
//! is replaced.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// nats-server: `WASMLESS_NATS_SERVER` (scripts/test.sh builds it in the background), or
/// built (once, seconds) or found in the cache by scripts/lib.sh.
fn nats_server() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| crate::lib_sh_tool("WASMLESS_NATS_SERVER", "nats_server_tool", "events test"))
        .clone()
}

pub struct Nats {
    child: Option<Child>,
    pub port: u16,
    store: tempfile::TempDir,
    user: Option<(String, String)>,
}

impl Nats {
    /// A server that takes any connection.
    pub fn start() -> Self {
        Self::start_as(None)
    }

    /// A server that takes connections of this one user and password only, as the
    /// installed broker does.
    pub fn start_with_user(user: &str, password: &str) -> Self {
        Self::start_as(Some((user.to_string(), password.to_string())))
    }

    fn start_as(user: Option<(String, String)>) -> Self {
        let mut nats = Self {
            child: None,
            port: crate::free_port(),
            store: tempfile::tempdir().unwrap(),
            user,
        };
        nats.restart();
        nats
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Stops the server at once (SIGKILL: what it had not written is lost, as in a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server (again) on its port and store, and waits until it takes connections.
    pub fn restart(&mut self) {
        self.kill();
        let mut command = Command::new(nats_server());
        command
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js", "-sd"])
            .arg(self.store.path());
        if let Some((user, password)) = &self.user {
            command.args(["--user", user, "--pass", password]);
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen on {} within 20 s",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill();
    }
}
