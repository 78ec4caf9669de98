//! The node's store of verified code (`--code-store`, the node agent): the first runtime of
//! a namespace reads and verifies the builder's code and puts it there; the next maps the
//! store's file and reads nothing; a file changed on the node, or a store that does not
//! hold the code for this namespace, leaves the runtime on the path it took before.

use crate::support::*;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmless_artifact::{Digest, Part};
use wasmless_node_agent::server::{self, ServeLimits};
use wasmless_node_agent::store::{Namespace, Store, StoreLimits};

/// The agent, in this process, serving two namespaces on sockets of their own.
struct Agent {
    dir: tempfile::TempDir,
}

impl Agent {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let limits = StoreLimits {
            budget: 1 << 30,
            namespace_quota: 1 << 30,
        };
        let store = Arc::new(Store::open(&dir.path().join("store"), limits, false).unwrap());
        for namespace in ["team-a", "team-b"] {
            let socket = dir.path().join(format!("{namespace}.sock"));
            let namespace = Namespace::new(namespace).unwrap();
            server::serve(store.clone(), namespace, &socket, ServeLimits::default()).unwrap();
        }
        Self { dir }
    }

    fn socket(&self, namespace: &str) -> String {
        self.dir.path().join(format!("{namespace}.sock")).display().to_string()
    }

    fn object(&self, code_digest: &Digest) -> std::path::PathBuf {
        self.dir
            .path()
            .join("store/objects")
            .join(format!("{}.cwasm", code_digest.hex()))
    }
}

/// The agents of these tests live in this one process, whose puts are checked one at a
/// time as a node's are (a put that comes meanwhile is refused as busy): the tests that put
/// take turns.
static ONE_PUT_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `wasmless_code_store_requests_total{op, result}`, once it is at least 1 (a put runs
/// after the load, in the background).
async fn store_requests(runtime: &Runtime, op: &str, result: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = get(runtime.admin_url("/metrics")).await.1;
        let count = sample(
            &metrics,
            "wasmless_code_store_requests_total",
            &[("op", op), ("result", result)],
        );
        if let Some(count) = count {
            return count;
        }
        assert!(Instant::now() < deadline, "no {op} {result} in 30 s: {metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn write_chunks(volume: &std::path::Path, part: Part, chunks: &[Vec<u8>]) {
    for (index, chunk) in chunks.iter().enumerate() {
        std::fs::write(volume.join(part.chunk_file_name(index)), chunk).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_next_runtime_maps_the_code_the_first_put_and_a_changed_file_falls_back() {
    let _turn = ONE_PUT_AT_A_TIME.lock().await;
    let module = std::fs::read(go_handler("goless-sample")).unwrap();
    let digest = Digest::of(&module);
    let code = precompile_for(&portable_engine(), &module);
    let code_digest = Digest::of(&code);
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("module");
    std::fs::create_dir(&volume).unwrap();
    write_chunks(&volume, Part::Module, &wasmless_artifact::compress_and_split(&module));
    write_chunks(&volume, Part::Code, &wasmless_artifact::split_chunks(&code));
    let agent = Agent::start();
    let args = |namespace: &str| {
        [
            "--module-digest".to_string(),
            digest.to_string(),
            "--code".into(),
            volume.display().to_string(),
            "--code-digest".into(),
            code_digest.to_string(),
            "--code-store".into(),
            agent.socket(namespace),
        ]
    };
    let start = |namespace: &str| {
        let args = args(namespace);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut command = runtime_command(&volume, &args);
        without_shared_cache(&mut command);
        Runtime::spawn(command)
    };

    // The first of team-a's runtimes on the node: the store has nothing, the code is read
    // from the volume, verified, put there, and mapped from the store's copy: the node
    // holds it once, and the runtime keeps no copy of its own.
    let first = start("team-a");
    let loaded = first.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert!(loaded.contains("mapped from the node's store"), "{loaded}");
    assert!(loaded.contains("verify"), "read and verified first: {loaded}");
    assert_eq!(get(first.url("/")).await.1, "This works!");
    assert_eq!(store_requests(&first, "get", "absent").await, 1.0);
    assert_eq!(store_requests(&first, "put", "stored").await, 1.0);
    assert_eq!(store_requests(&first, "get", "found").await, 1.0);
    drop(first);
    assert!(agent.object(&code_digest).exists());

    // The next reads nothing: the code's chunks are gone from its volume, and it serves.
    let code_chunks: Vec<_> = std::fs::read_dir(&volume)
        .unwrap()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().contains("cwasm"))
        .map(|entry| entry.path())
        .collect();
    let saved: Vec<_> = code_chunks.iter().map(|path| std::fs::read(path).unwrap()).collect();
    for path in &code_chunks {
        std::fs::remove_file(path).unwrap();
    }
    let second = start("team-a");
    let loaded = second.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert!(loaded.contains("\"phases\":\"store "), "{loaded}");
    assert!(!loaded.contains("fetch") && !loaded.contains("verify"), "{loaded}");
    assert!(loaded.contains("mapped from the node's store"), "{loaded}");
    assert_eq!(get(second.url("/")).await.1, "This works!");
    assert_eq!(store_requests(&second, "get", "found").await, 1.0);

    // The store lets go of the file (its budget, a restart): what is mapped serves on.
    std::fs::remove_file(agent.object(&code_digest)).unwrap();
    assert_eq!(get(second.url("/")).await.1, "This works!");
    drop(second);

    // team-b asks by the same digest (every pod's arguments show it): the store answers
    // only what team-b put, so it reads the code itself.
    for (path, bytes) in code_chunks.iter().zip(&saved) {
        std::fs::write(path, bytes).unwrap();
    }
    let other = start("team-b");
    other.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(store_requests(&other, "get", "absent").await, 1.0);
    assert_eq!(store_requests(&other, "put", "stored").await, 1.0);
    drop(other);

    // A byte of the stored file changed on the node: refused, and the runtime serves from
    // the code it reads and verifies itself.
    let object = agent.object(&code_digest);
    let mut bytes = std::fs::read(&object).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&object, &bytes).unwrap();
    let after = start("team-b");
    let loaded = after.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert!(loaded.contains("verify"), "read and verified again: {loaded}");
    assert_eq!(get(after.url("/")).await.1, "This works!");
    assert_eq!(store_requests(&after, "get", "corrupt").await, 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_runtime_whose_store_is_not_there_serves_as_without_one() {
    let module = std::fs::read(go_handler("goless-sample")).unwrap();
    let code = precompile_for(&portable_engine(), &module);
    let dir = tempfile::tempdir().unwrap();
    let (module_path, digest) = write_module(dir.path(), "module.wasm", &module);
    let (code_path, code_digest) = write_module(dir.path(), "module.cwasm.lz4", &code);
    let missing = dir.path().join("no-agent.sock");
    let args = [
        "--module-digest",
        &digest.to_string(),
        "--code",
        code_path.to_str().unwrap(),
        "--code-digest",
        &code_digest.to_string(),
        "--code-store",
        missing.to_str().unwrap(),
    ];
    let mut command = runtime_command(&module_path, &args);
    without_shared_cache(&mut command);
    let runtime = Runtime::spawn(command);
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(get(runtime.url("/")).await.1, "This works!");
    assert_eq!(store_requests(&runtime, "get", "error").await, 1.0);
}

/// A Function of a pool table, with the builder's code.
struct Pooled {
    name: &'static str,
    code_digest: Digest,
    port: u16,
}

/// A Rust and a Go Function with the builder's code, both in a pool table in `dir` (so they
/// join a pool's table together): the table, and the two.
fn two_functions_with_code(dir: &std::path::Path) -> (std::path::PathBuf, Vec<Pooled>) {
    let table = dir.join("table");
    std::fs::create_dir(&table).unwrap();
    let mut functions = Vec::new();
    for (name, module) in [("echo", rust_echo()), ("sample", go_handler("goless-sample"))] {
        let code = precompile_for(&portable_engine(), &std::fs::read(&module).unwrap());
        let (code_path, code_digest) = write_module(dir, &format!("{name}.cwasm.lz4"), &code);
        let port = free_port();
        let code = [
            "--code",
            code_path.to_str().unwrap(),
            "--code-digest",
            &code_digest.to_string(),
        ];
        crate::pool::add_function(&table, name, port, &module, &code);
        functions.push(Pooled {
            name,
            code_digest,
            port,
        });
    }
    (table, functions)
}

/// With room to load ahead and a node's store, a pool puts each Function's code in the
/// store first and loads it from there: its loaded code is the node's copy, shared with
/// the other processes that map it, and none of it is a copy of the pool's own.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_loading_ahead_maps_the_nodes_copy_not_one_of_its_own() {
    let _turn = ONE_PUT_AT_A_TIME.lock().await;
    let agent = Agent::start();
    let dir = tempfile::tempdir().unwrap();
    let (table, functions) = two_functions_with_code(dir.path());
    let cache = dir.path().join("cache");
    let pool = Runtime::start_pool(
        &table,
        &[
            "--pool-load-ahead",
            "true",
            "--code-store",
            &agent.socket("team-a"),
            "--cache-dir",
            cache.to_str().unwrap(),
        ],
    );
    loaded(&pool, 2.0).await;
    let metrics = get(pool.admin_url("/metrics")).await.1;
    for function in &functions {
        let code_digest = &function.code_digest;
        assert!(agent.object(code_digest).exists(), "the store holds {code_digest}");
    }
    let store = |op: &str, result: &str| {
        sample(
            &metrics,
            "wasmless_code_store_requests_total",
            &[("op", op), ("result", result)],
        )
    };
    assert_eq!(store("put", "stored"), Some(2.0), "each put once: {metrics}");
    assert_eq!(
        store("get", "found"),
        Some(2.0),
        "each loaded from the store: {metrics}"
    );
    let code = |memory: &str| sample(&metrics, "wasmless_pool_code_bytes", &[("memory", memory)]).unwrap_or(0.0);
    assert_eq!(code("mapped"), 0.0, "no copy of the pool's own: {metrics}");
    assert!(code("shared") > 0.0, "the node's copy mapped: {metrics}");
    for function in &functions {
        let (status, body) = get(crate::pool::at(function.port, "/hello")).await;
        assert_eq!(status, 200, "{}: {body}", function.name);
    }
}

/// A pool with no room to load a Function ahead of its first request stages its code in
/// the node's store instead (read, verified and put, not loaded): a new pool pod's first
/// request to it maps the node's copy and reads nothing.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_with_no_room_to_load_ahead_stages_the_code_in_the_nodes_store() {
    let _turn = ONE_PUT_AT_A_TIME.lock().await;
    let agent = Agent::start();
    let dir = tempfile::tempdir().unwrap();
    let (table, functions) = two_functions_with_code(dir.path());
    let store = agent.socket("team-a");
    // Room for one: the first Function loaded ahead takes more than three quarters of 1Ki.
    let first = Runtime::start_pool(
        &table,
        &[
            "--pool-load-ahead",
            "true",
            "--pool-memory-budget",
            "1Ki",
            "--code-store",
            &store,
        ],
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !functions
        .iter()
        .all(|function| agent.object(&function.code_digest).exists())
    {
        assert!(
            Instant::now() < deadline,
            "the store holds not both Functions' code within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Each put once: the one loaded ahead staged before its load, the other without a
    // load (each counted once the store has answered).
    let puts = [("op", "put"), ("result", "stored")];
    let mut metrics = get(first.admin_url("/metrics")).await.1;
    while sample(&metrics, "wasmless_code_store_requests_total", &puts) != Some(2.0) {
        assert!(Instant::now() < deadline, "not two puts within 60 s: {metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        metrics = get(first.admin_url("/metrics")).await.1;
    }
    assert_eq!(
        sample(&metrics, "wasmless_pool_load_seconds_count", &[]),
        Some(1.0),
        "one Function loaded ahead, the other staged: {metrics}"
    );
    drop(first);

    // A new pool pod, loading nothing ahead: each first request maps the node's copy.
    let second = Runtime::start_pool(&table, &["--pool-load-ahead", "false", "--code-store", &store]);
    for function in &functions {
        let (status, body) = get(crate::pool::at(function.port, "/hello")).await;
        assert_eq!(status, 200, "{}: {body}", function.name);
    }
    assert_eq!(store_requests(&second, "get", "found").await, 2.0);
    let metrics = get(second.admin_url("/metrics")).await.1;
    let read =
        ["fetch", "verify"].map(|phase| sample(&metrics, "wasmless_load_phase_seconds_count", &[("phase", phase)]));
    assert_eq!(
        read,
        [None, None],
        "nothing read or verified by the new pool: {metrics}"
    );
}

/// KiB of `pid`'s executable mappings of files whose path ends in `name` that are
/// resident in its page tables (`/proc/PID/smaps`, `Rss`).
fn text_resident_kib(pid: u32, name: &str) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut in_text = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields
            .first()
            .is_some_and(|first| first.contains('-') && first.chars().all(|c| c.is_ascii_hexdigit() || c == '-'))
        {
            in_text = fields.get(1) == Some(&"r-xp") && fields.get(5).is_some_and(|path| path.ends_with(name));
        } else if in_text && fields.first() == Some(&"Rss:") {
            kib += fields[1].parse::<u64>().unwrap();
        }
    }
    kib
}

/// Waits up to 60 s for the pool to hold `count` Functions loaded.
async fn loaded(pool: &Runtime, count: f64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut metrics = get(pool.admin_url("/metrics")).await.1;
    while sample(&metrics, "wasmless_pool_functions_loaded", &[]) != Some(count) {
        assert!(Instant::now() < deadline, "not {count} loaded within 60 s: {metrics}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        metrics = get(pool.admin_url("/metrics")).await.1;
    }
}

/// The pool's metrics once it has let go of some Function's code (within 15 s).
async fn released(pool: &Runtime) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let metrics = get(pool.admin_url("/metrics")).await.1;
        if sample(&metrics, "wasmless_pool_idle_code_released_total", &[]).is_some_and(|count| count > 0.0) {
            return metrics;
        }
        assert!(Instant::now() < deadline, "no code let go of in 15 s: {metrics}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each Function's answer to `GET /hello`, each a 200.
async fn answers(functions: &[Pooled]) -> Vec<String> {
    let mut answers = Vec::new();
    for function in functions {
        let (status, body) = get(crate::pool::at(function.port, "/hello")).await;
        assert_eq!(status, 200, "{}: {body}", function.name);
        answers.push(body);
    }
    answers
}

/// Each Function answers again, a 200, and the Go sample the same words as `before` (the
/// echo answers with the request it got).
async fn answer_as_before(functions: &[Pooled], before: &[String]) {
    let after = answers(functions).await;
    for ((function, before), after) in functions.iter().zip(before).zip(&after) {
        if function.name == "sample" {
            assert_eq!(after, before, "the Go sample's answer");
        }
    }
}

/// A Go Function no request used for `--pool-release-code-after` stays loaded, but the
/// node's copy of its code leaves the pool process's resident memory; its next request
/// answers as the first did, mapping back what it runs.
#[tokio::test(flavor = "multi_thread")]
async fn an_idle_functions_code_leaves_the_pools_resident_memory_and_its_next_request_answers() {
    let _turn = ONE_PUT_AT_A_TIME.lock().await;
    let agent = Agent::start();
    let dir = tempfile::tempdir().unwrap();
    let (table, functions) = two_functions_with_code(dir.path());
    let pool = Runtime::start_pool(
        &table,
        &[
            "--pool-load-ahead",
            "true",
            "--code-store",
            &agent.socket("team-a"),
            "--pool-release-code-after",
            "3s",
        ],
    );
    loaded(&pool, 2.0).await;
    let go = functions.iter().find(|function| function.name == "sample").unwrap();
    let object = format!("{}.cwasm", go.code_digest.hex());
    let (status, answer) = get(crate::pool::at(go.port, "/hello")).await;
    assert_eq!(status, 200, "{answer}");
    let resident = text_resident_kib(pool.pid(), &object);
    assert!(
        resident > 1024,
        "a Go request runs MiBs of its code: {resident} KiB resident"
    );

    let deadline = Instant::now() + Duration::from_secs(15);
    while text_resident_kib(pool.pid(), &object) > 0 {
        assert!(
            Instant::now() < deadline,
            "the idle Function's code still resident after 15 s: {} KiB",
            text_resident_kib(pool.pid(), &object)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let metrics = released(&pool).await;
    assert_eq!(
        sample(&metrics, "wasmless_pool_idle_code_released_total", &[]),
        Some(1.0),
        "the Go Function's, not the echo's, which ran nothing: {metrics}"
    );
    assert_eq!(
        sample(&metrics, "wasmless_pool_functions_loaded", &[]),
        Some(2.0),
        "still loaded: {metrics}"
    );

    assert_eq!(get(crate::pool::at(go.port, "/hello")).await, (status, answer));
    assert!(
        text_resident_kib(pool.pid(), &object) > 1024,
        "its request mapped back what it ran"
    );
    let echo = functions.iter().find(|function| function.name == "echo").unwrap();
    let (status, body) = get(crate::pool::at(echo.port, "/hello")).await;
    assert_eq!(status, 200, "{body}");
    let metrics = get(pool.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(&metrics, "wasmless_pool_load_seconds_count", &[]),
        Some(2.0),
        "nothing loaded again: {metrics}"
    );
}

/// Code a pool holds in its own memory (no node's store, no `--cache-dir`) is not the
/// page cache of a file: it is never let go of, and an idle Function answers as before.
#[tokio::test(flavor = "multi_thread")]
async fn code_in_the_pools_own_memory_stays_and_an_idle_function_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (table, functions) = two_functions_with_code(dir.path());
    let pool = Runtime::start_pool(
        &table,
        &["--pool-load-ahead", "true", "--pool-release-code-after", "1s"],
    );
    loaded(&pool, 2.0).await;
    let before = answers(&functions).await;
    // Idle through two sweeps, then used again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    answer_as_before(&functions, &before).await;
    let metrics = get(pool.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(&metrics, "wasmless_pool_idle_code_released_total", &[]),
        Some(0.0),
        "{metrics}"
    );
}

/// Code the pool mapped from a file of its own (`--cache-dir`, no node's store) is let go
/// of too, and the Function answers after as before.
#[tokio::test(flavor = "multi_thread")]
async fn code_mapped_from_the_pools_own_file_is_let_go_of_and_the_function_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (table, functions) = two_functions_with_code(dir.path());
    let cache = dir.path().join("cache");
    let pool = Runtime::start_pool(
        &table,
        &[
            "--pool-load-ahead",
            "true",
            "--cache-dir",
            cache.to_str().unwrap(),
            "--pool-release-code-after",
            "1s",
        ],
    );
    loaded(&pool, 2.0).await;
    let metrics = get(pool.admin_url("/metrics")).await.1;
    let mapped = sample(&metrics, "wasmless_pool_code_bytes", &[("memory", "mapped")]);
    assert!(
        mapped.is_some_and(|bytes| bytes > 0.0),
        "mapped from the cache's files: {metrics}"
    );
    let before = answers(&functions).await;
    released(&pool).await;
    answer_as_before(&functions, &before).await;
}
