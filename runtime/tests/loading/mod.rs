//! Where a module comes from: chunk directories and the compiled-code cache, a module
//! replaced on disk, an OCI registry; and SIGTERM.

use crate::support::*;
use std::time::Duration;
use wasmless_artifact::Digest;

#[tokio::test(flavor = "multi_thread")]
async fn chunked_module_loads_and_compiled_code_is_cached() {
    let module = std::fs::read(go_handler("goless-sample")).unwrap();
    let digest = Digest::of(&module);
    let chunks = wasmless_artifact::compress_and_split(&module);
    let dir = tempfile::tempdir().unwrap();
    let chunk_dir = dir.path().join("module");
    std::fs::create_dir(&chunk_dir).unwrap();
    for (index, chunk) in chunks.iter().enumerate() {
        std::fs::write(chunk_dir.join(wasmless_artifact::chunk_file_name(index)), chunk).unwrap();
    }
    let cache = dir.path().join("cache");
    let args = [
        "--module-digest",
        &digest.to_string(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ];

    let first = Runtime::start(&chunk_dir, &args);
    first.wait_for_log(&["module loaded", "\"compiled_code\":\"compiled\""]);
    assert_eq!(get(first.url("/")).await.1, "This works!");
    drop(first);

    let second = Runtime::start(&chunk_dir, &args);
    second.wait_for_log(&["module loaded", "\"compiled_code\":\"cache hit\""]);
    assert_eq!(get(second.url("/")).await.1, "This works!");

    // A missing chunk is named, not a panic, when the module has to be read.
    std::fs::remove_file(chunk_dir.join(wasmless_artifact::chunk_file_name(0))).unwrap();
    let fresh_cache = dir.path().join("fresh-cache");
    let output = start_expecting_failure(
        &chunk_dir,
        &[
            "--module-digest",
            &digest.to_string(),
            "--cache-dir",
            fresh_cache.to_str().unwrap(),
        ],
    );
    assert!(output.contains("missing chunk 0"), "{output}");
}

/// A module that ships files (the builder's `wasmless.files` section) still serves them
/// after a restart that finds its code in the compiled-code cache, which would otherwise
/// spare reading the module: the entry's mark says the module must be read for them.
#[tokio::test(flavor = "multi_thread")]
async fn a_module_with_files_serves_them_after_a_restart_from_the_compiled_code_cache() {
    let module = std::fs::read(go_handler("go-files")).unwrap();
    let files = [wasmless_artifact::guest_files::GuestFile {
        name: "data/today.txt".into(),
        bytes: b"monday".to_vec(),
    }];
    let module = wasmless_artifact::guest_files::append(&module, &files);
    let dir = tempfile::tempdir().unwrap();
    let (path, digest) = write_module(dir.path(), "files.wasm", &module);
    let cache = dir.path().join("cache");
    let args = [
        "--module-digest",
        &digest.to_string(),
        "--cache-dir",
        cache.to_str().unwrap(),
    ];

    let first = Runtime::start(&path, &args);
    first.wait_for_log(&["module loaded", "\"compiled_code\":\"compiled\"", "\"files\":1"]);
    assert_eq!(get(first.url("/")).await, (200, "monday".to_string()));
    drop(first);

    let second = Runtime::start(&path, &args);
    second.wait_for_log(&["module loaded", "\"compiled_code\":\"cache hit\"", "\"files\":1"]);
    assert_eq!(get(second.url("/")).await, (200, "monday".to_string()));

    // The same handler without the section: the read fails as on a machine without the file.
    let (bare, bare_digest) = write_module(dir.path(), "bare.wasm", &std::fs::read(go_handler("go-files")).unwrap());
    let third = Runtime::start(&bare, &["--module-digest", &bare_digest.to_string()]);
    let (status, body) = get(third.url("/")).await;
    assert_eq!(status, 500);
    assert!(body.contains("data/today.txt"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn replaced_module_is_swapped_in_without_a_failed_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("module.wasm");
    let publish = |body: &str| {
        // As a ConfigMap volume update does: new files renamed into place.
        let module = cgi_wat(&format!("Content-Type: text/plain\n\n{body}"));
        let staged = dir.path().join("staged.wasm");
        std::fs::write(&staged, &module).unwrap();
        let staged_digest = dir.path().join("staged.sha256");
        std::fs::write(&staged_digest, Digest::of(&module).to_string()).unwrap();
        std::fs::rename(&staged, &path).unwrap();
        std::fs::rename(&staged_digest, dir.path().join("module.wasm.sha256")).unwrap();
    };
    publish("version one");
    let runtime = Runtime::start(&path, &["--watch-interval", "100ms"]);
    assert_eq!(get(runtime.url("/")).await.1, "version one");

    let hammer = {
        let url = runtime.url("/");
        tokio::spawn(async move {
            let mut seen = Vec::new();
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while std::time::Instant::now() < deadline {
                let (status, text) = get(url.clone()).await;
                assert_eq!(status, 200, "a request failed during the swap: {text}");
                seen.push(text.clone());
                if text == "version two" {
                    break;
                }
            }
            seen
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish("version two");
    let seen = hammer.await.unwrap();
    assert_eq!(seen.last().map(String::as_str), Some("version two"), "never swapped");
    runtime.wait_for_log(&["swapped in the module replaced on disk"]);

    // A file that does not match its digest is refused, and the old module keeps serving.
    std::fs::write(&path, b"garbage").unwrap();
    runtime.wait_for_log(&["still serving the previous one"]);
    assert_eq!(get(runtime.url("/")).await.1, "version two");
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_requests_in_flight_finish() {
    let mut runtime = Runtime::start(rust_echo_with_digest(), &[]);
    let slow = tokio::spawn(get(runtime.url("/sleep?ms=1500")));
    tokio::time::sleep(Duration::from_millis(400)).await;
    runtime.terminate();
    let (status, text) = slow.await.unwrap();
    assert_eq!((status, text.as_str()), (200, "slept\n"));
    assert!(runtime.wait().success());
    assert!(
        client().get(runtime.url("/")).send().await.is_err(),
        "no longer listening"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn module_is_pulled_from_an_oci_registry_by_digest() {
    let registry = Registry::start();
    let module = cgi_wat("Content-Type: text/plain\n\nfrom the registry\n");
    let digest = Digest::of(&module);
    let manifest = registry.push_wasm("functions/hello:v1", &module).await;

    // Pulled, not found in a compiled-code cache: a hit would never ask the registry.
    let pulled = |source: &str| {
        let mut command = runtime_command(source, &["--module-digest", &digest.to_string()]);
        without_shared_cache(&mut command);
        let runtime = Runtime::spawn(command);
        runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"compiled (no cache)\""]);
        runtime
    };
    // By tag, pinned by the module digest: the layer blob is fetched by that digest.
    let by_tag = format!("oci://{}/functions/hello:v1", registry.address);
    let runtime = pulled(&by_tag);
    assert_eq!(get(runtime.url("/")).await.1, "from the registry\n");

    // By manifest digest.
    let by_manifest = format!("oci://{}/functions/hello@{manifest}", registry.address);
    let runtime = pulled(&by_manifest);
    assert_eq!(get(runtime.url("/")).await.1, "from the registry\n");

    // A tag alone can move: refused. A wrong digest: refused, naming both.
    let output = start_expecting_failure(&by_tag, &[]);
    assert!(output.contains("--module-digest"), "{output}");
    let wrong = Digest::of(b"another module");
    let output = start_expecting_failure(&by_manifest, &["--module-digest", &wrong.to_string()]);
    assert!(
        output.contains(&wrong.to_string()) && output.contains(&digest.to_string()),
        "{output}"
    );

    // A restart with the compiled code cached needs no registry: one that is down
    // does not keep the function from coming back.
    let cache = tempfile::tempdir().unwrap();
    let cached = [
        "--module-digest",
        &digest.to_string(),
        "--cache-dir",
        cache.path().to_str().unwrap(),
    ];
    drop(Runtime::start(&by_manifest, &cached));
    let address = registry.address.clone();
    drop(registry);
    assert!(
        std::net::TcpStream::connect(&address).is_err(),
        "the registry should be down"
    );
    let runtime = Runtime::start(&by_manifest, &cached);
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"cache hit\""]);
    assert_eq!(get(runtime.url("/")).await.1, "from the registry\n");
}
