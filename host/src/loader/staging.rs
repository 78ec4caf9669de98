//! Code put in the node's store before it is mapped from there: ahead of its first load (a
//! pool that has no room to load a Function ahead of its first request still makes sure the
//! node holds its code, so that request maps the node's copy instead of reading and
//! verifying the code itself), and by a load that read the code because the store lacked it.

use super::{FromStore, Loader, ModuleError, OpenedCode};
use crate::code_store::{CodeStore, CodeStoreError};
use crate::load_phases::LoadPhase;
use crate::metrics::Metrics;
use crate::precompiled::{self, CodeRefused, CodeSource, Fallback, StoredBytes, VerifiedCode};
use std::time::{Duration, Instant};
use wasmless_artifact::Digest;

/// The longest a load ahead waits for this process's put on its way: a put's own timeout.
const PUT_WAIT: Duration = Duration::from_secs(30);

/// What staging a Function's code did ([`Loader::stage`]).
#[derive(Debug, PartialEq, Eq)]
pub enum Staged {
    /// No node store here.
    NoStore,
    /// No pinned code of the builder's to stage (a module compiled where it runs).
    NoCode,
    /// The store holds the code already.
    Held,
    /// Read, verified and put.
    Put,
    /// Not staged (its first load reads the code as without a store), and why.
    Failed(String),
    /// The store could not be asked, or did not take the code: staging more now would
    /// only hold the node's one put at a time. Why.
    StoreRefused(String),
}

impl Loader {
    /// Waits until no put of this process is on its way (at most a put's timeout), so that
    /// loads made one after another ahead of requests each find the turn to put free.
    pub async fn puts_done(&self) {
        let Some(store) = &self.code_store else {
            return;
        };
        let deadline = Instant::now() + PUT_WAIT;
        while store.is_putting() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Puts the builder's code pinned to `code_digest` in the node's store without loading
    /// it, where the store lacks it: read from `source` and verified as a load reads it,
    /// then put in this process's turn, waited for. Nothing is compiled or mapped.
    pub async fn stage(&self, source: &CodeSource, code_digest: Digest, module: Digest) -> Staged {
        let Some(store) = self.code_store.clone() else {
            return Staged::NoStore;
        };
        let metrics = self.shared.metrics.clone();
        let asking = store.clone();
        // The file of code found is dropped at once: it is the store's to keep.
        let asked = tokio::task::spawn_blocking(move || asking.get(&code_digest).map(|stored| stored.name())).await;
        match asked {
            Ok(Ok("found")) => {
                metrics.code_store_request("get", "found");
                return Staged::Held;
            }
            Ok(Ok(result)) => metrics.code_store_request("get", result),
            Ok(Err(error)) => {
                metrics.code_store_request("get", "error");
                return Staged::StoreRefused(format!("cannot ask the node's code store: {error}"));
            }
            Err(panicked) => return Staged::StoreRefused(format!("asking the node's code store panicked: {panicked}")),
        }
        // Read only once this process's last put is done: nothing read waits for its turn.
        self.puts_done().await;
        let mut verified = match source.load_code(code_digest, true).await {
            Ok(Ok(verified)) => verified,
            Ok(Err(fallback)) => return Staged::Failed(format!("the code cannot be read: {fallback}")),
            Err(refused) => return Staged::Failed(refused.to_string()),
        };
        // Only code that would load here is worth the node's keeping (as after a load).
        if let Err(why) = precompiled::runs_here(&self.engine, &self.target, source, &verified, &module) {
            return Staged::Failed(why);
        }
        let Some(stored) = verified.take_stored() else {
            return Staged::Failed("the code's bytes were not kept".into());
        };
        drop(verified);
        let Some(turn) = store.turn_to_put() else {
            return Staged::StoreRefused("another put of this process is on its way".into());
        };
        let putting = store.clone();
        let put = tokio::task::spawn_blocking(move || {
            let _turn = turn;
            put_now(&putting, &metrics, code_digest, stored, true)
        })
        .await;
        // Loads' puts that queued behind this one.
        store.start_waiting_puts();
        match put {
            Ok(Ok(())) => Staged::Put,
            Ok(Err(error)) => Staged::StoreRefused(error.to_string()),
            Err(panicked) => Staged::StoreRefused(format!("the put panicked: {panicked}")),
        }
    }
}

impl Loader {
    /// Opens the builder's code read and verified for a load that found the node's store
    /// without it (`FromStore::Missing { put: true }`): put in the store first, then mapped
    /// from the store's copy, so that the node holds the code once and this process keeps
    /// no copy of its own (on its disk, against a pool's `--pool-mapped-code-budget`, which
    /// a thousand Go Functions loaded from nothing filled after 290). The put waits for no
    /// other: where this process's turn to put is taken, the put fails, or the store does not
    /// hand the code back, it opens as [`Loader::open_precompiled`] does, from its own copy
    /// (a put then queued only where none was tried here).
    pub async fn open_through_store(
        &self,
        source: &CodeSource,
        code: Result<Result<VerifiedCode, Fallback>, CodeRefused>,
        module: Digest,
        code_digest: Digest,
        started: Instant,
    ) -> Result<Option<OpenedCode>, ModuleError> {
        let (store, mut verified) = match (self.code_store.clone(), code) {
            (Some(store), Ok(Ok(verified))) => (store, verified),
            (_, code) => return self.open_precompiled(source, code, module, code_digest, started).await,
        };
        let runs_here = precompiled::runs_here(&self.engine, &self.target, source, &verified, &module).is_ok();
        let turn = runs_here.then(|| store.turn_to_put()).flatten();
        let stored = turn.as_ref().and_then(|_| verified.take_stored());
        if let (Some(turn), Some(stored)) = (turn, stored) {
            let putting = Instant::now();
            let (metrics, put_store) = (self.shared.metrics.clone(), store.clone());
            // On a request's path: one try, no waiting while the store checks other puts.
            let put = tokio::task::spawn_blocking(move || {
                let put = put_now(&put_store, &metrics, code_digest, stored, false);
                // Here, not after the await: a request dropped meanwhile (its client gone)
                // must not leave the puts queued behind this one waiting.
                drop(turn);
                put_store.start_waiting_puts();
                put
            })
            .await;
            let put_took = putting.elapsed();
            if let Ok(Ok(())) = put
                && let FromStore::Opened(mut opened) = self.open_stored(source, code_digest, module, started).await?
            {
                let mut phases = verified.phases().clone();
                phases.add(LoadPhase::Store, put_took);
                phases.extend(&opened.phases);
                opened.phases = phases;
                return Ok(Some(opened));
            }
        } else {
            // A turn taken with no bytes to put: the puts queued meanwhile go on.
            store.start_waiting_puts();
        }
        self.open_precompiled(source, Ok(Ok(verified)), module, code_digest, started)
            .await
    }
}

/// Hands `stored`, verified against `code_digest`, to the node's store as a sealed copy,
/// and counts what the store answered; `wait_while_busy`: tries again for about 2 s while
/// the store checks other puts. Blocks.
pub(super) fn put_now(
    store: &CodeStore,
    metrics: &Metrics,
    code_digest: Digest,
    stored: StoredBytes,
    wait_while_busy: bool,
) -> Result<(), CodeStoreError> {
    // The copy is charged to this pod's memory: a Function's own pod may be sized close to
    // what it runs, and a put that kills it would be tried again at every start.
    let size = stored.bytes().len();
    if cgroup_memory().is_some_and(|(in_use, limit)| !room_for_copy(size as u64, in_use, limit)) {
        tracing::info!(%code_digest, size, "no room in this pod's memory limit to put the code in the node's store");
        return Err(CodeStoreError::NoRoom(size));
    }
    // The copy handed over is made, and the bytes read given back, before the store is
    // asked.
    let sealed = CodeStore::sealed_copy(stored.bytes());
    drop(stored);
    let put = sealed.and_then(|sealed| put_when_free(store, &code_digest, &sealed, wait_while_busy));
    match &put {
        Ok(()) => metrics.code_store_request("put", "stored"),
        Err(CodeStoreError::Busy) => {
            metrics.code_store_request("put", "refused");
            tracing::info!(%code_digest, "the node's code store was checking other puts each time: not put");
        }
        Err(CodeStoreError::Refused(why)) => {
            metrics.code_store_request("put", "refused");
            tracing::warn!(%code_digest, why, "the node's code store refused the code");
        }
        Err(error) => {
            metrics.code_store_request("put", "error");
            tracing::warn!(%code_digest, %error, "cannot put the code in the node's code store");
        }
    }
    put
}

/// How long a put the store found busy waits before each try again: the store checks one
/// put at a time on the node, and a namespace's pool replicas stage the same Functions at
/// the same moment (a Go Function's check takes ~0.1 s). About 2 s in all.
const BUSY_WAITS_MS: [u64; 10] = [25, 50, 100, 200, 250, 250, 250, 250, 250, 250];

/// Puts `sealed`, trying again while the store answers that it is checking another put
/// (`wait_while_busy`); once only, for a while after a put found it busy through all its
/// tries (another namespace may keep it so). Blocks.
fn put_when_free(
    store: &CodeStore,
    code_digest: &Digest,
    sealed: &std::fs::File,
    wait_while_busy: bool,
) -> Result<(), CodeStoreError> {
    let waits: &[u64] = if wait_while_busy && !store.busy_lately() {
        &BUSY_WAITS_MS
    } else {
        &[]
    };
    for wait in waits {
        match store.put(code_digest, sealed) {
            Err(CodeStoreError::Busy) => std::thread::sleep(Duration::from_millis(wait + jitter(wait / 2))),
            done => return done,
        }
    }
    let put = store.put(code_digest, sealed);
    if wait_while_busy && matches!(put, Err(CodeStoreError::Busy)) {
        store.found_busy();
    }
    put
}

/// Up to `most`: replicas that found the store busy together try again apart.
fn jitter(most: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| u64::from(since.subsec_nanos()));
    nanos % most.max(1)
}

/// Whether a copy of `bytes` more leaves a quarter of a memory limit free, with `in_use`
/// of it taken by memory that cannot be reclaimed.
fn room_for_copy(bytes: u64, in_use: u64, limit: u64) -> bool {
    in_use.saturating_add(bytes) <= limit / 4 * 3
}

/// This process's cgroup's (v2) memory that cannot be reclaimed (anonymous and shared
/// memory; page cache can) and its limit, where a limit is set.
fn cgroup_memory() -> Option<(u64, u64)> {
    let cgroup = std::path::Path::new("/sys/fs/cgroup");
    let limit = std::fs::read_to_string(cgroup.join("memory.max"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(cgroup.join("memory.stat")).ok()?;
    let counter = |name: &str| {
        stat.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
    };
    Some((counter("anon")? + counter("shmem")?, limit))
}

#[cfg(test)]
mod tests {
    use super::{CodeStore, CodeStoreError, put_when_free, room_for_copy};
    use std::os::fd::AsFd;
    use std::time::Duration;
    use wasmless_artifact::Digest;
    use wasmless_artifact::code_store::{Reply, accept, listen, receive, send};

    /// A store on `path` that answers its puts `replies`, one per connection, in order;
    /// joined, how many puts it received.
    fn store_answering(path: &std::path::Path, replies: Vec<Reply>) -> std::thread::JoinHandle<usize> {
        let listener = listen(path).unwrap();
        std::thread::spawn(move || {
            let mut received = 0;
            for reply in replies {
                let Ok(socket) = accept(listener.as_fd(), Duration::from_secs(10)) else {
                    break;
                };
                let (text, file) = receive(socket.as_fd()).unwrap();
                assert!(text.starts_with("put ") && file.is_some(), "{text}");
                received += 1;
                send(socket.as_fd(), &reply.encode(), None).unwrap();
            }
            received
        })
    }

    #[test]
    fn a_put_the_store_found_busy_is_made_again_and_stored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sock");
        let store = store_answering(&path, vec![Reply::Busy, Reply::Busy, Reply::Stored]);
        let sealed = CodeStore::sealed_copy(b"code").unwrap();
        put_when_free(&CodeStore::new(&path), &Digest::of(b"code"), &sealed, true).unwrap();
        assert_eq!(store.join().unwrap(), 3);
    }

    #[test]
    fn a_put_on_a_requests_path_is_tried_once_and_leaves_later_puts_patient() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sock");
        let store = store_answering(&path, vec![Reply::Busy, Reply::Busy, Reply::Stored]);
        let client = CodeStore::new(&path);
        let sealed = CodeStore::sealed_copy(b"code").unwrap();
        let put = put_when_free(&client, &Digest::of(b"code"), &sealed, false);
        assert!(matches!(put, Err(CodeStoreError::Busy)), "{put:?}");
        assert!(!client.busy_lately(), "one busy answer to a single try");
        put_when_free(&client, &Digest::of(b"code"), &sealed, true).unwrap();
        assert_eq!(store.join().unwrap(), 3);
    }

    #[test]
    fn after_a_put_found_the_store_busy_through_all_its_tries_the_next_tries_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sock");
        // One answer: a second try would find no store, and fail otherwise than busy.
        let store = store_answering(&path, vec![Reply::Busy]);
        let client = CodeStore::new(&path);
        client.found_busy();
        let sealed = CodeStore::sealed_copy(b"code").unwrap();
        let put = put_when_free(&client, &Digest::of(b"code"), &sealed, true);
        assert!(matches!(put, Err(CodeStoreError::Busy)), "{put:?}");
        assert_eq!(store.join().unwrap(), 1);
    }

    #[test]
    fn a_put_the_store_refused_for_a_reason_is_not_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.sock");
        let store = store_answering(&path, vec![Reply::Refused("digest: not the code".into())]);
        let sealed = CodeStore::sealed_copy(b"code").unwrap();
        let put = put_when_free(&CodeStore::new(&path), &Digest::of(b"code"), &sealed, true);
        assert!(matches!(put, Err(CodeStoreError::Refused(why)) if why.starts_with("digest")));
        assert_eq!(store.join().unwrap(), 1);
    }

    #[test]
    fn a_put_copies_only_while_a_quarter_of_the_pods_memory_limit_stays_free() {
        const MIB: u64 = 1 << 20;
        assert!(
            room_for_copy(14 * MIB, 20 * MIB, 64 * MIB),
            "a Go Function's code in a 64Mi pod"
        );
        assert!(!room_for_copy(14 * MIB, 40 * MIB, 64 * MIB), "past three quarters");
        assert!(!room_for_copy(u64::MAX, 0, 64 * MIB), "no overflow");
    }
}
