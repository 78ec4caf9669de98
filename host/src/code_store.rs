//! The runtime's side of its node's store of verified code (`--code-store`, the
//! `wasmless-node-agent`): before reading a Function's code through the API, ask the store
//! for it by its pinned digest; on a hit, map the file it hands over, which holds code it
//! checked against that digest, so nothing is read, hashed, decompressed or written here.
//! After a miss, the code read and verified the slow way is put there for the next process
//! on the node. Any failure of the store is a miss: the slow path is always there.

use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};
use wasmless_artifact::code_store::{self, ProtocolError, Reply, Request};
use wasmless_artifact::{CodeHeader, Digest};

/// How long a `get` may take before the load goes the slow way: the agent answers from
/// its index and a file it opens, in well under a millisecond.
const GET_TIMEOUT: Duration = Duration::from_secs(1);
/// A `put`: the agent reads, checks and writes megabytes. Mostly off the request's path; a
/// load that found the store without its code puts before it maps the store's copy, and
/// only an agent stuck within a put holds that load this long.
const PUT_TIMEOUT: Duration = Duration::from_secs(30);

/// Code of puts waiting for their turn a process may hold: about ten Go Functions'.
pub const MAX_WAITING_PUT_BYTES: usize = 64 << 20;

/// The store's socket.
#[derive(Clone)]
pub struct CodeStore {
    socket: PathBuf,
    /// A put is on its way: one at a time per process, so a pool loading many Functions at
    /// once does not hold a copy of each one's code for the store, nor its threads.
    putting: Arc<AtomicBool>,
    /// Puts that found another on its way, oldest first: made after it, in the same turn,
    /// so a pool that loads Functions faster than the store takes them puts every one.
    waiting: Arc<Mutex<WaitingPuts>>,
    /// When a put last found the store busy through all its tries.
    busy_at: Arc<Mutex<Option<Instant>>>,
}

/// How long after a put found the store busy through all its tries the next ones try once:
/// the store checks one put at a time on the node, and a namespace that keeps it busy
/// would otherwise hold every other pool's puts, and the loads ahead waiting for them, for
/// seconds each.
const BUSY_QUIET: Duration = Duration::from_secs(30);

impl std::fmt::Debug for CodeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CodeStore")
            .field("socket", &self.socket)
            .finish_non_exhaustive()
    }
}

type Put = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct WaitingPuts {
    puts: VecDeque<(usize, Put)>,
    bytes: usize,
}

impl WaitingPuts {
    fn next(&mut self) -> Option<Put> {
        let (bytes, put) = self.puts.pop_front()?;
        self.bytes -= bytes;
        Some(put)
    }
}

/// A put's turn, given back when dropped.
pub struct PutTurn(Arc<AtomicBool>);

impl Drop for PutTurn {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

/// What a `get` found.
#[derive(Debug)]
pub enum Stored {
    /// The code: its header, and its file (read-only, the agent's).
    Code(CodeHeader, File),
    Absent,
    /// The agent found the file changed since it verified it, and removed it.
    Corrupt,
}

impl Stored {
    /// The `result` label.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Code(..) => "found",
            Self::Absent => "absent",
            Self::Corrupt => "corrupt",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CodeStoreError {
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    #[error("the code store refused: {0}")]
    Refused(String),
    #[error("the code store was checking another put")]
    Busy,
    #[error("the code store answered {0:?} to a {1}")]
    Unexpected(String, &'static str),
    #[error("cannot hand the code to the store: {0}")]
    Memfd(#[from] std::io::Error),
    #[error("not the node's code store: {0}")]
    NotTheStore(String),
    #[error("no room in this pod's memory limit for a copy of the code ({0} bytes)")]
    NoRoom(usize),
}

/// The uid of the process at the other end of `socket` (`SO_PEERCRED`). Not rustix's
/// `socket_peercred`: its `UCred` holds the pid as a non-zero number, and a peer in
/// another pid namespace (the agent's pod, seen from a runtime's pod) has pid 0, which it
/// returns as an error reading "Success (os error 0)" (found on the test cluster).
fn peer_uid(socket: BorrowedFd) -> std::io::Result<u32> {
    let mut credentials = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes a `ucred`, at most `length` bytes, into `credentials`.
    let result = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut credentials).cast(),
            &mut length,
        )
    };
    if result != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if length as usize != std::mem::size_of::<libc::ucred>() {
        return Err(std::io::Error::other(format!("SO_PEERCRED gave {length} bytes")));
    }
    Ok(credentials.uid)
}

/// `file` if it is what the store hands out: a regular file of root's that no one may
/// write, open for reading only. Anything else could change under the mapping.
fn read_only_root_file(file: File) -> Result<File, CodeStoreError> {
    use std::os::unix::fs::MetadataExt;
    let metadata = file.metadata()?;
    let access = rustix::fs::fcntl_getfl(&file).map_err(std::io::Error::from)? & rustix::fs::OFlags::RWMODE;
    let problem = match () {
        _ if !metadata.file_type().is_file() => Some("not a regular file"),
        _ if metadata.uid() != 0 => Some("not root's"),
        _ if metadata.mode() & 0o222 != 0 => Some("writable"),
        _ if access != rustix::fs::OFlags::RDONLY => Some("open for writing"),
        _ => None,
    };
    match problem {
        Some(problem) => Err(CodeStoreError::NotTheStore(format!("the code's file is {problem}"))),
        None => Ok(file),
    }
}

impl CodeStore {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
            putting: Arc::new(AtomicBool::new(false)),
            waiting: Arc::default(),
            busy_at: Arc::default(),
        }
    }

    /// Records that a put found the store busy through all its tries.
    pub fn found_busy(&self) {
        *self.busy_at.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
    }

    /// Whether a put found the store busy through all its tries within [`BUSY_QUIET`].
    pub fn busy_lately(&self) -> bool {
        self.busy_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some_and(|at| at.elapsed() < BUSY_QUIET)
    }

    /// Makes `put` (of `bytes` of code) in this process's turn, on a thread of its own:
    /// now if no other put is on its way, else after those before it. False: not made,
    /// for [`MAX_WAITING_PUT_BYTES`] wait already or no thread could be started (the next
    /// process that misses puts it).
    pub fn put_in_turn(&self, bytes: usize, put: impl FnOnce() + Send + 'static) -> bool {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        // The limit is on what waits: with the turn free, the put is made at once.
        if self.is_putting() && waiting.bytes + bytes > MAX_WAITING_PUT_BYTES {
            return false;
        }
        waiting.bytes += bytes;
        waiting.puts.push_back((bytes, Box::new(put)));
        self.start_oldest(waiting)
    }

    /// Starts the puts that wait, if the turn is free: a turn taken by [`Self::turn_to_put`]
    /// (a staging's) leaves those that queued meanwhile until this is called.
    pub fn start_waiting_puts(&self) {
        self.start_oldest(self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
    }

    /// Takes the turn, if free, for the oldest waiting put and those after it. False: no
    /// thread could be started (that put is dropped; the turn goes back with it).
    fn start_oldest(&self, mut waiting: MutexGuard<'_, WaitingPuts>) -> bool {
        if waiting.puts.is_empty() {
            return true;
        }
        let Some(turn) = self.turn_to_put() else {
            // The put on its way makes the waiting ones after it.
            return true;
        };
        let Some(first) = waiting.next() else {
            return true;
        };
        drop(waiting);
        self.make_puts(turn, first)
    }

    /// `first`, then every put that waits, then gives the turn back: under the queue's
    /// lock, so a put queued as the last one ends is not left waiting.
    fn make_puts(&self, turn: PutTurn, first: Put) -> bool {
        let waiting = self.waiting.clone();
        let spawned = std::thread::Builder::new()
            .name("code-store-put".into())
            .spawn(move || {
                let mut put = first;
                loop {
                    put();
                    let mut queue = waiting.lock().unwrap_or_else(PoisonError::into_inner);
                    match queue.next() {
                        Some(next) => put = next,
                        None => {
                            drop(turn);
                            return;
                        }
                    }
                }
            });
        // Out of threads: the turn went back with the closure; what waits, waits for the next.
        spawned.is_ok()
    }

    /// The turn to put, unless another put of this process is on its way.
    pub fn turn_to_put(&self) -> Option<PutTurn> {
        let taken = self.putting.swap(true, Ordering::AcqRel);
        (!taken).then(|| PutTurn(self.putting.clone()))
    }

    /// Whether a put of this process (a turn taken) is on its way.
    pub fn is_putting(&self) -> bool {
        self.putting.load(Ordering::Acquire)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The code stored under `code_digest` for this namespace. Blocking.
    pub fn get(&self, code_digest: &Digest) -> Result<Stored, CodeStoreError> {
        let socket = self.connect_to_the_agent(GET_TIMEOUT)?;
        code_store::send(socket.as_fd(), &Request::Get(*code_digest).encode(), None)?;
        let (text, file) = code_store::receive(socket.as_fd())?;
        match (Reply::parse(&text)?, file) {
            (Reply::Found(header), Some(file)) => Ok(Stored::Code(header, read_only_root_file(File::from(file))?)),
            (Reply::Absent, _) => Ok(Stored::Absent),
            (Reply::Corrupt, _) => Ok(Stored::Corrupt),
            (Reply::Refused(why), _) => Err(CodeStoreError::Refused(why)),
            (other, _) => Err(CodeStoreError::Unexpected(other.encode(), "get")),
        }
    }

    /// A connection to the store's agent, which is root: what a `get` answers is mapped
    /// without a hash, and what a put hands over is the namespace's code, neither for a
    /// process of another user that took the socket's place.
    fn connect_to_the_agent(&self, timeout: Duration) -> Result<OwnedFd, CodeStoreError> {
        let socket = code_store::connect(&self.socket, timeout)?;
        let peer_uid = peer_uid(socket.as_fd())
            .map_err(|error| CodeStoreError::NotTheStore(format!("cannot tell who the socket's peer is: {error}")))?;
        if peer_uid != 0 {
            return Err(CodeStoreError::NotTheStore(format!(
                "the socket's peer is uid {peer_uid}, not root"
            )));
        }
        Ok(socket)
    }

    /// `stored` in a memory file sealed against change, as a put hands it over.
    pub fn sealed_copy(stored: &[u8]) -> Result<File, CodeStoreError> {
        use rustix::fs::{MemfdFlags, SealFlags};
        let memfd = rustix::fs::memfd_create("wasmless-code", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(std::io::Error::from)?;
        let mut file = File::from(memfd);
        file.write_all(stored)?;
        let seals = SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL;
        rustix::fs::fcntl_add_seals(&file, seals).map_err(std::io::Error::from)?;
        Ok(file)
    }

    /// Hands the store `sealed` ([`CodeStore::sealed_copy`] of the code as stored, which
    /// hashes to `code_digest`). Blocking.
    pub fn put(&self, code_digest: &Digest, sealed: &File) -> Result<(), CodeStoreError> {
        let socket = self.connect_to_the_agent(PUT_TIMEOUT)?;
        code_store::send(
            socket.as_fd(),
            &Request::Put(*code_digest).encode(),
            Some(sealed.as_fd()),
        )?;
        let (text, _) = code_store::receive(socket.as_fd())?;
        match Reply::parse(&text)? {
            Reply::Stored => Ok(()),
            Reply::Busy => Err(CodeStoreError::Busy),
            Reply::Refused(why) => Err(CodeStoreError::Refused(why)),
            other => Err(CodeStoreError::Unexpected(other.encode(), "put")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_that_find_the_turn_taken_are_made_after_it_in_order_up_to_a_limit() {
        let store = CodeStore::new("/nonexistent/agent.sock");
        let made = Arc::new(Mutex::new(Vec::new()));
        let record = |name: &'static str| {
            let made = made.clone();
            move || made.lock().unwrap().push(name)
        };
        let staging = store.turn_to_put().expect("the turn is free");
        assert!(store.put_in_turn(10 << 20, record("first")));
        assert!(store.put_in_turn(10 << 20, record("second")));
        assert!(
            !store.put_in_turn(MAX_WAITING_PUT_BYTES, record("too much")),
            "beyond the limit: not made"
        );
        std::thread::sleep(Duration::from_millis(50));
        assert!(made.lock().unwrap().is_empty(), "made while the turn was taken");
        drop(staging);
        store.start_waiting_puts();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while store.is_putting() {
            assert!(std::time::Instant::now() < deadline, "the waiting puts were not made");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(*made.lock().unwrap(), ["first", "second"]);

        // With the turn free, a put is made at once and gives the turn back.
        assert!(store.put_in_turn(1, record("third")));
        while store.is_putting() {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(made.lock().unwrap().last(), Some(&"third"));
        assert!(store.turn_to_put().is_some());
    }

    /// A process of another user serving the socket's path, as one that took the agent's
    /// place would: it gets neither a put's code nor the trust of a get.
    #[test]
    fn a_socket_served_by_another_user_is_handed_no_code_and_trusted_for_none() {
        use std::os::unix::process::CommandExt;
        if !rustix::process::getuid().is_root() {
            eprintln!("skipped: only root can start a process of another user");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
        let socket = dir.path().join("agent.sock");
        let heard = dir.path().join("heard");
        // Accepts two connections and writes down the bytes each sent.
        let impostor = "import socket, sys\n\
            s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)\n\
            s.bind(sys.argv[1]); s.listen(2)\n\
            total = 0\n\
            for _ in range(2):\n\
            \x20   c, _ = s.accept(); total += len(c.recv(65536)); c.close()\n\
            open(sys.argv[2], 'w').write(str(total))\n";
        let mut child = std::process::Command::new("python3")
            .args(["-c", impostor, socket.to_str().unwrap(), heard.to_str().unwrap()])
            .uid(65534)
            .gid(65534)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(std::time::Instant::now() < deadline, "the impostor never listened");
            std::thread::sleep(Duration::from_millis(10));
        }
        let store = CodeStore::new(&socket);
        let digest = Digest::of(b"code");
        let sealed = CodeStore::sealed_copy(b"code").unwrap();
        let put = store.put(&digest, &sealed);
        assert!(matches!(put, Err(CodeStoreError::NotTheStore(_))), "{put:?}");
        let got = store.get(&digest);
        assert!(matches!(got, Err(CodeStoreError::NotTheStore(_))), "{:?}", got.err());
        assert!(child.wait().unwrap().success());
        assert_eq!(
            std::fs::read_to_string(&heard).unwrap(),
            "0",
            "the impostor was sent something"
        );
    }

    #[test]
    fn the_peer_of_a_socket_is_the_process_that_made_its_other_end() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let uid = rustix::process::getuid().as_raw();
        assert_eq!(peer_uid(ours.as_fd()).unwrap(), uid);
        drop(theirs);
        let file = File::open("/dev/null").unwrap();
        let refused = peer_uid(file.as_fd()).unwrap_err();
        assert_eq!(refused.raw_os_error(), Some(libc::ENOTSOCK), "{refused}");
    }
}
