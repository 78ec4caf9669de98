//! The builder's compiled code: loaded by a new pod, refused when tampered with or
//! unpinned, a fallback for another engine, pulled from the module's OCI artifact.

use crate::support::*;
use wasmless_artifact::{Digest, Part};

#[tokio::test(flavor = "multi_thread")]
async fn a_new_pod_loads_precompiled_code_and_compiles_nothing() {
    let module = std::fs::read(go_handler("goless-sample")).unwrap();
    let digest = Digest::of(&module);
    let code = precompile_for(&portable_engine(), &module);
    let code_digest = Digest::of(&code);

    // The operator's volume: module chunks and code chunks side by side.
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("module");
    std::fs::create_dir(&volume).unwrap();
    for (index, chunk) in wasmless_artifact::compress_and_split(&module).iter().enumerate() {
        std::fs::write(volume.join(Part::Module.chunk_file_name(index)), chunk).unwrap();
    }
    for (index, chunk) in wasmless_artifact::split_chunks(&code).iter().enumerate() {
        std::fs::write(volume.join(Part::Code.chunk_file_name(index)), chunk).unwrap();
    }
    let empty_cache = dir.path().join("cache");
    let args = [
        "--module-digest",
        &digest.to_string(),
        "--code",
        volume.to_str().unwrap(),
        "--code-digest",
        &code_digest.to_string(),
        "--cache-dir",
        empty_cache.to_str().unwrap(),
    ];
    let runtime = Runtime::start(&volume, &args);
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(get(runtime.url("/")).await.1, "This works!");
    let metrics = get(runtime.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(&metrics, "wasmless_compile_fallbacks_total", &[]),
        None,
        "{metrics}"
    );
    // Nothing was compiled, so nothing went into the cache.
    assert!(
        std::fs::read_dir(&empty_cache).map_or(true, |mut entries| entries.next().is_none()),
        "the compiled-code cache should be empty"
    );
    drop(runtime);

    // The file form (`wasmless dev`, a local build) loads the same way.
    let (file, _) = write_module(dir.path(), "module.cwasm.lz4", &code);
    let file_args = [
        "--module-digest",
        &digest.to_string(),
        "--code",
        file.to_str().unwrap(),
        "--code-digest",
        &code_digest.to_string(),
    ];
    let runtime = Runtime::start(&volume, &file_args);
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(get(runtime.url("/")).await.1, "This works!");
}

#[tokio::test(flavor = "multi_thread")]
async fn tampered_or_unpinned_code_is_refused_and_nothing_runs() {
    let module = cgi_wat("Content-Type: text/plain\n\nhello\n");
    let dir = tempfile::tempdir().unwrap();
    let (module_path, digest) = write_module(dir.path(), "hello.wasm", &module);
    let code = precompile_for(&portable_engine(), &module);
    let code_digest = Digest::of(&code);

    let mut tampered = code.clone();
    let middle = tampered.len() / 2;
    tampered[middle] ^= 1;
    let (tampered_path, _) = write_module(dir.path(), "tampered.cwasm.lz4", &tampered);
    let output = start_expecting_failure(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            tampered_path.to_str().unwrap(),
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    assert!(
        output.contains("compiled code digest mismatch") && output.contains(&code_digest.to_string()),
        "{output}"
    );
    assert!(!output.contains("serving"), "{output}");

    // Genuine code, but made from another module than the one pinned.
    let other = cgi_wat("Content-Type: text/plain\n\nother\n");
    let other_code = precompile_for(&portable_engine(), &other);
    let (other_path, other_digest) = write_module(dir.path(), "other.cwasm.lz4", &other_code);
    let output = start_expecting_failure(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            other_path.to_str().unwrap(),
            "--code-digest",
            &other_digest.to_string(),
        ],
    );
    assert!(output.contains("was made from module"), "{output}");

    // Code is never loaded unpinned.
    let (code_path, _) = write_module(dir.path(), "hello.cwasm.lz4", &code);
    let output = start_expecting_failure(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            code_path.to_str().unwrap(),
        ],
    );
    assert!(output.contains("--code-digest"), "{output}");
}

#[tokio::test(flavor = "multi_thread")]
async fn code_for_another_engine_falls_back_to_compiling_and_is_counted() {
    let module = std::fs::read(rust_echo()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (module_path, digest) = write_module(dir.path(), "echo.wasm", &module);
    // What another wasmtime configuration makes (here: another memory reservation).
    let mut config = wasmless_host::engine::compiler_config(&wasmless_host::engine::CompileTarget::Portable).unwrap();
    config.memory_reservation(1 << 28);
    let other_engine = wasmtime::Engine::new(&config).unwrap();
    let code = precompile_for(&other_engine, &module);
    let (code_path, code_digest) = write_module(dir.path(), "echo.cwasm.lz4", &code);

    let mut command = runtime_command(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            code_path.to_str().unwrap(),
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    without_shared_cache(&mut command);
    let runtime = Runtime::spawn(command);
    let log = runtime.wait_for_log(&["not using the precompiled code", "\"reason\":\"engine\""]);
    assert!(log.contains("another wasmtime version or configuration"), "{log}");
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"compiled (no cache)\""]);
    let (status, body) = get(runtime.url("/echo?x=1")).await;
    assert_eq!(status, 200, "{body}");
    let metrics = get(runtime.admin_url("/metrics")).await.1;
    assert_eq!(
        sample(&metrics, "wasmless_compile_fallbacks_total", &[("reason", "engine")]),
        Some(1.0),
        "{metrics}"
    );

    // Code that cannot be read at all (a volume not mounted, a registry down): compiled too.
    let missing = dir.path().join("missing.cwasm.lz4");
    let runtime = Runtime::start(
        &module_path,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            missing.to_str().unwrap(),
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    runtime.wait_for_log(&["not using the precompiled code", "\"reason\":\"unavailable\""]);
    assert_eq!(get(runtime.url("/echo")).await.0, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn compiled_code_is_pulled_from_the_modules_oci_artifact() {
    let registry = Registry::start();
    let module = cgi_wat("Content-Type: text/plain\n\nprecompiled from the registry\n");
    let digest = Digest::of(&module);
    let code = precompile_for(&portable_engine(), &module);
    let code_digest = Digest::of(&code);
    let manifest = registry
        .push_layers(
            "functions/hello:v1",
            &[
                (wasmless_artifact::oci::LAYER_MEDIA_TYPE, &module[..]),
                (wasmless_artifact::oci::CODE_LAYER_MEDIA_TYPE, &code[..]),
            ],
        )
        .await;
    let reference = format!("oci://{}/functions/hello@{manifest}", registry.address);
    let runtime = Runtime::start(
        &reference,
        &[
            "--module-digest",
            &digest.to_string(),
            "--code",
            &reference,
            "--code-digest",
            &code_digest.to_string(),
        ],
    );
    runtime.wait_for_log(&["module loaded", "\"compiled_code\":\"precompiled\""]);
    assert_eq!(get(runtime.url("/")).await.1, "precompiled from the registry\n");
    // The module alone, by manifest digest, still loads from an artifact with two layers.
    let runtime = Runtime::start(&reference, &[]);
    assert_eq!(get(runtime.url("/")).await.1, "precompiled from the registry\n");
}
