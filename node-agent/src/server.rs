//! One socket per namespace: whoever can reach a socket asks as its namespace, so the
//! socket's place decides who may use it (on a cluster, the CSI driver puts each pod's in
//! that pod's volume; here, `--socket NAMESPACE=PATH`). One request per connection, on a
//! thread of its own, a few at a time per socket (the rest wait in the socket's backlog,
//! and a runtime that waits too long reads its code itself): a pod that opens connections
//! and sends nothing holds its own socket's threads until their timeout, not another's.
//! Puts are checked one at a time on the node, so the agent's memory holds one code's
//! bytes, not one per connection; a put that comes while another is checked is refused as
//! busy (the runtime tries it again a few times, then goes on without the store), and a put's file must be a sealed memory
//! file, which nothing can grow, change or make the agent wait on.

use crate::admission;
use crate::metrics;
use crate::store::{Found, Namespace, Store};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;
use wasmless_artifact::code_store::{self, Reply, Request};

/// How the agent serves each connection.
#[derive(Debug, Clone, Copy)]
pub struct ServeLimits {
    /// Connections served at once on one socket; more are closed unanswered.
    pub connections_per_socket: usize,
    /// How long a peer may take to send its request or read its reply.
    pub timeout: Duration,
    /// Largest file a `put` may bring (the code as stored, compressed).
    pub max_put_bytes: u64,
    /// Largest code a `put` may decompress to.
    pub max_code_bytes: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        Self {
            connections_per_socket: 4,
            timeout: Duration::from_secs(10),
            max_put_bytes: 256 << 20,
            max_code_bytes: 512 << 20,
        }
    }
}

/// Makes the socket at `path` connectable by any user (the runtime runs as one of its own):
/// through a descriptor of the path itself, never following whatever link may stand there
/// by now, and only if it is a socket.
fn reachable_by_anyone(path: &Path) -> std::io::Result<()> {
    use rustix::fs::{FileType, Mode, OFlags};
    let handle = rustix::fs::open(path, OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
    if FileType::from_raw_mode(rustix::fs::fstat(&handle)?.st_mode) != FileType::Socket {
        return Err(std::io::Error::other("not the socket just bound"));
    }
    // chmod through the descriptor's /proc link reaches the inode it holds (as glibc's
    // fchmodat with AT_SYMLINK_NOFOLLOW does).
    let by_descriptor = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&handle));
    std::fs::set_permissions(by_descriptor, std::os::unix::fs::PermissionsExt::from_mode(0o666))
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen at {path}: {source}")]
    Listen {
        path: PathBuf,
        #[source]
        source: code_store::ProtocolError,
    },
    #[error("{path} exists and is not a socket: refusing to replace it")]
    NotASocket { path: PathBuf },
    #[error("cannot make {path} reachable: {source}")]
    Permissions {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A socket being served, until [`Listening::stop`].
pub struct Listening {
    listener: Arc<OwnedFd>,
    stopped: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Listening {
    /// Accepts no more connections (those being answered finish). The socket's file stays
    /// for the caller to remove.
    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept this socket's thread waits in; it sees `stopped` and ends.
        let _ = rustix::net::shutdown(&*self.listener, rustix::net::Shutdown::Both);
    }

    /// Waits for the socket's thread, which ends only once stopped.
    pub fn join(self) {
        let _ = self.thread.join();
    }
}

/// Listens at `path` for `namespace`'s runtimes, on a thread of its own. A socket left there
/// by an earlier agent is replaced; any other file is not.
pub fn serve(
    store: Arc<Store>,
    namespace: Namespace,
    path: &Path,
    limits: ServeLimits,
) -> Result<Listening, ServeError> {
    if let Ok(existing) = std::fs::symlink_metadata(path) {
        if !existing.file_type().is_socket() {
            return Err(ServeError::NotASocket { path: path.into() });
        }
        let _ = std::fs::remove_file(path);
    }
    let listener = listen_at(path)?;
    reachable_by_anyone(path).map_err(|source| ServeError::Permissions {
        path: path.into(),
        source,
    })?;
    tracing::info!(%namespace, socket = %path.display(), "serving a namespace's code");
    let listener = Arc::new(listener);
    let stopped = Arc::new(AtomicBool::new(false));
    let accepting = Accepting {
        namespace,
        path: path.to_path_buf(),
        listener: listener.clone(),
        stopped: stopped.clone(),
    };
    let thread = std::thread::spawn(move || accept_loop(store, accepting, limits));
    Ok(Listening {
        listener,
        stopped,
        thread,
    })
}

/// Listens at `path`, however long: a socket's address holds at most 107 bytes, and the
/// kubelet's volume directories are longer than that on some nodes, so a long path is bound
/// through its directory's descriptor (`/proc/self/fd/N/name`), which names the same place.
fn listen_at(path: &Path) -> Result<OwnedFd, ServeError> {
    let listen_error = |source| ServeError::Listen {
        path: path.into(),
        source,
    };
    let long = path.as_os_str().len() >= 100;
    let (true, Some(dir), Some(name)) = (long, path.parent(), path.file_name()) else {
        return code_store::listen(path).map_err(listen_error);
    };
    use rustix::fs::{Mode, OFlags};
    let dir = rustix::fs::open(dir, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty())
        .map_err(|error| listen_error(error.into()))?;
    let short = Path::new("/proc/self/fd")
        .join(std::os::fd::AsRawFd::as_raw_fd(&dir).to_string())
        .join(name);
    code_store::listen(&short).map_err(listen_error)
}

/// What one socket's thread accepts on.
struct Accepting {
    namespace: Namespace,
    path: PathBuf,
    listener: Arc<OwnedFd>,
    stopped: Arc<AtomicBool>,
}

/// Connections of one socket being answered, at most a number.
struct Slots {
    busy: Mutex<usize>,
    freed: Condvar,
    most: usize,
}

/// A slot taken, given back when dropped (a thread that panics gives it back too).
struct Slot(Arc<Slots>);

impl Slots {
    fn take(self: &Arc<Self>) -> Slot {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        while *busy >= self.most {
            busy = self.freed.wait(busy).unwrap_or_else(PoisonError::into_inner);
        }
        *busy += 1;
        Slot(self.clone())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        *self.0.busy.lock().unwrap_or_else(PoisonError::into_inner) -= 1;
        self.0.freed.notify_one();
    }
}

fn accept_loop(store: Arc<Store>, accepting: Accepting, limits: ServeLimits) {
    let Accepting {
        namespace,
        path,
        listener,
        stopped,
    } = accepting;
    let slots = Arc::new(Slots {
        busy: Mutex::new(0),
        freed: Condvar::new(),
        most: limits.connections_per_socket,
    });
    loop {
        let slot = slots.take();
        let accepted = code_store::accept(listener.as_fd(), limits.timeout);
        if stopped.load(Ordering::SeqCst) {
            tracing::info!(%namespace, socket = %path.display(), "no longer serving a namespace's code");
            return;
        }
        let connection = match accepted {
            Ok(connection) => connection,
            Err(error) => {
                tracing::warn!(%namespace, socket = %path.display(), %error, "cannot accept a connection");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let (store, answering) = (store.clone(), namespace.clone());
        let spawned = std::thread::Builder::new().spawn(move || {
            answer(&store, &answering, connection, &limits);
            drop(slot);
        });
        // Out of threads: this connection goes unanswered, the socket serves on.
        if let Err(error) = spawned {
            tracing::warn!(%namespace, %error, "cannot start a thread for a connection");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// One put's bytes in the agent's memory at a time, whichever socket it came by.
static ADMITTING: Mutex<()> = Mutex::new(());

/// Reads one request from `connection` and answers it.
fn answer(store: &Store, namespace: &Namespace, connection: OwnedFd, limits: &ServeLimits) {
    let (text, file) = match code_store::receive(connection.as_fd()) {
        Ok(received) => received,
        Err(error) => {
            tracing::debug!(%namespace, %error, "a request that could not be read");
            return;
        }
    };
    let (op, reply, sent) = match Request::parse(&text) {
        Ok(Request::Get(digest)) => match store.get(namespace, &digest) {
            Found::Code(header, file) => ("get", Reply::Found(header), Some(file)),
            Found::Absent => ("get", Reply::Absent, None),
            Found::Corrupt => ("get", Reply::Corrupt, None),
        },
        Ok(Request::Put(digest)) => ("put", put(store, namespace, &digest, file, limits), None),
        Err(error) => ("invalid", Reply::Refused(error.to_string()), None),
    };
    metrics::count_answer(namespace, op, reply_word(&reply));
    let result = code_store::send(
        connection.as_fd(),
        &reply.encode(),
        sent.as_ref().map(|file| file.as_fd()),
    );
    if let Err(error) = result {
        tracing::debug!(%namespace, %error, "a reply that could not be sent");
    }
}

/// The reply's first word, as the protocol writes it.
fn reply_word(reply: &Reply) -> &'static str {
    match reply {
        Reply::Found(_) => "found",
        Reply::Absent => "absent",
        Reply::Corrupt => "corrupt",
        Reply::Stored => "stored",
        Reply::Busy | Reply::Refused(_) => "refused",
    }
}

fn put(
    store: &Store,
    namespace: &Namespace,
    digest: &wasmless_artifact::Digest,
    file: Option<OwnedFd>,
    limits: &ServeLimits,
) -> Reply {
    let Some(file) = file else {
        return Reply::Refused("a put brings the code's file beside it".into());
    };
    let admitting = match ADMITTING.try_lock() {
        Ok(admitting) => admitting,
        Err(std::sync::TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
        Err(std::sync::TryLockError::WouldBlock) => {
            return Reply::Busy;
        }
    };
    let file = std::fs::File::from(file);
    let admitted = admission::sealed(&file)
        .and_then(|()| admission::read_sent(&file, limits.max_put_bytes))
        .and_then(|stored| admission::admit(digest, &stored, limits.max_code_bytes));
    let refused = |reason: &str, error: &dyn std::fmt::Display| {
        tracing::warn!(%namespace, %digest, reason, %error, "a put refused");
        Reply::Refused(format!("{reason}: {error}"))
    };
    let stored = admitted.map(|admitted| store.put(namespace, digest, admitted));
    drop(admitting);
    match stored {
        Ok(stored) => match stored {
            Ok(()) => {
                tracing::info!(%namespace, %digest, "code stored");
                Reply::Stored
            }
            Err(error) => refused(error.reason(), &error),
        },
        Err(error) => refused(error.reason(), &error),
    }
}
