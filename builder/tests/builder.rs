//! The builder binary with the real toolchains: every example builds and serves, the
//! cache holds, broken sources fail with the compiler's words, and modules publish to
//! ConfigMaps (an in-memory Kubernetes API, or a real one) and to a real OCI registry.

mod support;

/// Handlers written for native Go answer as under native Go.
mod native_go;

/// Files beside the handler: templates embedded, data read at start-up and per request.
mod files_beside;

use serde_json::Value;
use std::path::Path;
use support::*;

/// The builder's flags reference page is what its `--help` says.
#[test]
fn flags_reference() {
    use clap::CommandFactory;
    let page = wasmless_testkit::flags_reference::page(
        wasmless_builder::flags::Cli::command(),
        "The builder's steps, as a build Job runs them (`docs/architecture.md`, \"Builder\"): the operator writes these flags; a person runs `build` to build a handler by hand.",
    );
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."));
    wasmless_testkit::flags_reference::check(root, "docs/reference/wasmless-builder.md", &page);
}

fn write_example_source(dir: &Path, name: &str) -> (Example, std::path::PathBuf) {
    let example = example(name);
    let extension = match example.language.as_str() {
        "rust" => "rs",
        other => other,
    };
    let path = dir.join(format!("{name}.{extension}"));
    std::fs::write(&path, &example.source).unwrap();
    (example, path)
}

#[tokio::test(flavor = "multi_thread")]
async fn every_example_builds_serves_and_rebuilds_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let checks: [(&str, &str, &str); 6] = [
        ("hello-go", "/", "This works!"),
        ("counter-go", "/", "request 1 to this instance\n"),
        ("hello-rust", "/", "Hello from Rust!\n"),
        ("env-go", "/?name=tester", "Hello from the Function's env, tester!\n"),
        ("echo-go", "/echo/path?color=blue", "\"color\":\"blue\""),
        ("echo-rust", "/echo/path?color=blue", "\"color\":\"blue\""),
    ];
    for (name, path, expected) in checks {
        let (example, source) = write_example_source(dir.path(), name);
        let output = dir.path().join(format!("{name}.wasm"));
        let first = result(&build(&example.language, &source, &output, &cache, &[]));
        assert_eq!(first["cached"], false, "{name}");
        let digest = first["digest"].as_str().unwrap();
        assert_eq!(
            wasmless_artifact::Digest::of(&std::fs::read(&output).unwrap()).to_string(),
            digest
        );
        assert_eq!(
            first["size"].as_u64().unwrap(),
            std::fs::metadata(&output).unwrap().len()
        );

        let served = Served::start(output.to_str().unwrap(), digest, &example.env).await;
        let (status, text) = if name.starts_with("echo") {
            served.post(path, "the body").await
        } else {
            served.get(path).await
        };
        assert_eq!(status, 200, "{name}: {text}");
        assert!(text.contains(expected), "{name}: {text}");
        if name.starts_with("echo") {
            let echo: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(echo["method"], "POST");
            assert_eq!(echo["path"], "/echo/path");
            assert_eq!(echo["body"], "the body");
            let headers = echo["headers"].as_object().unwrap();
            assert!(
                headers
                    .iter()
                    .any(|(k, v)| k.eq_ignore_ascii_case("x-example") && v == "yes"),
                "{text}"
            );
        }

        let second = result(&build(&example.language, &source, &output, &cache, &[]));
        assert_eq!(
            second["cached"], true,
            "{name}: the same source twice does not compile twice"
        );
        assert_eq!(second["digest"], first["digest"]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn configmap_publishing_chunks_a_go_module_that_the_runtime_reassembles() {
    let dir = tempfile::tempdir().unwrap();
    let (_, source) = write_example_source(dir.path(), "hello-go");
    let output = dir.path().join("hello.wasm");
    let kube = fake_api().await;
    let built = result(
        &build_command("go", &source, &output, &dir.path().join("cache"))
            .args(["--publish", "configmap://default/hello"])
            .env("KUBECONFIG", kube.kubeconfig.path())
            .output()
            .unwrap(),
    );
    assert_eq!(built["published"], "configmap://default/hello");
    let digest: wasmless_artifact::Digest = built["digest"].as_str().unwrap().parse().unwrap();
    let source_digest: wasmless_artifact::Digest = built["sourceDigest"].as_str().unwrap().parse().unwrap();
    let size = built["size"].as_u64().unwrap();
    assert!(size > 5_000_000, "a Go module is several MB: {size}");

    let stored = stored_configmaps(&kube, "default");
    let names: Vec<String> = built["configMaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    assert!(names.len() >= 2, "a {size}-byte module needs several chunks: {names:?}");
    assert_eq!(
        names,
        wasmless_artifact::chunks_configmap_names("hello", &source_digest, names.len())
    );
    let chunk_dir = dir.path().join("volume");
    std::fs::create_dir(&chunk_dir).unwrap();
    for (index, name) in names.iter().enumerate() {
        let object = &stored[name];
        let labels = &object["metadata"]["labels"];
        assert_eq!(labels["wasmless.io/function"], "hello");
        // Label values hold at most 63 characters: the short digest; the full one is annotated.
        assert_eq!(labels["wasmless.io/source-digest"], source_digest.short());
        assert_eq!(labels["wasmless.io/module-digest"], digest.short());
        let annotations = &object["metadata"]["annotations"];
        assert_eq!(annotations["wasmless.io/module-digest"], digest.to_string());
        assert_eq!(annotations["wasmless.io/chunk-count"], names.len().to_string());
        assert_eq!(annotations["wasmless.io/chunk-index"], index.to_string());
        let chunk = base64_decode(object["binaryData"]["module.wasm.zst"].as_str().unwrap());
        assert!(chunk.len() <= wasmless_artifact::MAX_CHUNK_BYTES);
        // What the kubelet does with the operator's projected volume.
        std::fs::write(chunk_dir.join(wasmless_artifact::chunk_file_name(index)), chunk).unwrap();
    }
    let served = Served::start(chunk_dir.to_str().unwrap(), &digest.to_string(), &[]).await;
    assert_eq!(served.get("/").await, (200, "This works!".to_string()));

    // The compiled code beside it: its own chunks, pinned by the digest of what is stored,
    // made from this module for the portable target.
    let code = &built["code"];
    let code_digest: wasmless_artifact::Digest = code["digest"].as_str().unwrap().parse().unwrap();
    assert_eq!(code["moduleDigest"], digest.to_string());
    assert_eq!(code["target"], wasmless_host::engine::PORTABLE_TARGET);
    let code_names: Vec<String> = built["codeConfigMaps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        code_names,
        wasmless_artifact::Part::Code.configmap_names("hello", &source_digest, code_names.len())
    );
    let mut stored_code = Vec::new();
    for name in &code_names {
        let object = &stored[name];
        let annotations = &object["metadata"]["annotations"];
        assert_eq!(annotations["wasmless.io/code-digest"], code_digest.to_string());
        assert_eq!(annotations["wasmless.io/module-digest"], digest.to_string());
        assert_eq!(annotations["wasmless.io/engine-hash"], code["engine"]);
        stored_code.extend(base64_decode(object["binaryData"]["code.cwasm.lz4"].as_str().unwrap()));
    }
    assert_eq!(wasmless_artifact::Digest::of(&stored_code), code_digest);
    let (header, _) = wasmless_artifact::decode_code(&stored_code).unwrap();
    assert_eq!(header.module_digest, digest);
    assert_eq!(std::fs::read(code["output"].as_str().unwrap()).unwrap(), stored_code);

    match std::env::var("WASMLESS_TEST_KUBECONFIG") {
        Ok(real) => {
            let namespace = std::env::var("WASMLESS_TEST_NAMESPACE").unwrap_or_else(|_| "default".into());
            let published = result(
                &build_command("go", &source, &output, &dir.path().join("cache"))
                    .arg("--publish")
                    .arg(format!("configmap://{namespace}/hello"))
                    .env("KUBECONFIG", &real)
                    .output()
                    .unwrap(),
            );
            assert_eq!(
                published["configMaps"], built["configMaps"],
                "a real API server stores the same chunks"
            );
        }
        Err(_) => println!("skipped the real API server part: set WASMLESS_TEST_KUBECONFIG to a kubeconfig to run it"),
    }
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut buffer, mut bits) = (0u32, 0);
    for byte in text.bytes().filter(|&b| b != b'=') {
        buffer = (buffer << 6) | ALPHABET.iter().position(|&a| a == byte).unwrap() as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn oci_publishing_pushes_an_artifact_the_runtime_pulls_by_digest() {
    let registry = Registry::start();
    let dir = tempfile::tempdir().unwrap();
    let (_, source) = write_example_source(dir.path(), "hello-rust");
    let output = dir.path().join("hello.wasm");
    let target = format!("oci://{}/functions/hello-rust:v1", registry.address);
    let built = result(&build(
        "rust",
        &source,
        &output,
        &dir.path().join("cache"),
        &["--publish", &target],
    ));
    let location = built["published"].as_str().unwrap();
    assert!(
        location.starts_with(&format!("oci://{}/functions/hello-rust@sha256:", registry.address)),
        "{location}"
    );
    let served = Served::start(location, built["digest"].as_str().unwrap(), &[]).await;
    assert_eq!(served.get("/").await, (200, "Hello from Rust!\n".to_string()));
}

#[tokio::test(flavor = "multi_thread")]
async fn broken_sources_fail_with_the_compilers_message_and_publish_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let kube = fake_api().await;
    let cases = [
        (
            "go",
            "broken.go",
            "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {\n\tw.Write([]byte(\"x\")\n}\n",
            &["syntax error"][..],
        ),
        (
            "rust",
            "broken.rs",
            "use wasmless_sdk::{Request, Response};\n\npub fn handler(_request: Request) -> Response {\n    \"not a response\"\n}\n",
            &["mismatched types"],
        ),
        // Start-up that fails runs at build time (the reactor's snapshot): Go's own words
        // and stack, as `go run` prints them, not a wasm backtrace of numbered functions.
        (
            "go",
            "countries.go",
            "package handlers\n\nimport (\n\t\"net/http\"\n\t\"os\"\n)\n\nvar countries = load()\n\nfunc load() []byte {\n\tdata, err := os.ReadFile(\"countries.csv\")\n\tif err != nil {\n\t\tpanic(err)\n\t}\n\treturn data\n}\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write(countries) }\n",
            &[
                "panic: open countries.csv: no such file or directory",
                "goroutine 1 [running]:",
                "function/handlers.load(",
                "countries.go:13",
            ],
        ),
        (
            "go",
            "fatal.go",
            "package handlers\n\nimport (\n\t\"log\"\n\t\"net/http\"\n)\n\nfunc init() {\n\tlog.SetFlags(log.Lshortfile)\n\tlog.Fatal(\"DATABASE_URL is not set\")\n}\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {}\n",
            &["fatal.go:10: DATABASE_URL is not set", "exited with status 1"],
        ),
    ];
    for (language, file, text, expected) in cases {
        let source = dir.path().join(file);
        std::fs::write(&source, text).unwrap();
        let output = dir.path().join(format!("{file}.wasm"));
        let termination_log = dir.path().join("termination-log");
        std::fs::write(&termination_log, "").unwrap();
        let result = build_command(language, &source, &output, &dir.path().join("cache"))
            .args(["--publish", "configmap://default/broken"])
            .arg("--termination-log")
            .arg(&termination_log)
            .env("KUBECONFIG", kube.kubeconfig.path())
            .output()
            .unwrap();
        assert_eq!(
            result.status.code(),
            Some(wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD),
            "{language}: a compile error has its own exit status, so the Job does not retry it"
        );
        let stderr = String::from_utf8_lossy(&result.stderr);
        let message = std::fs::read_to_string(&termination_log).unwrap();
        for expected in expected {
            assert!(stderr.contains(expected), "{file}: {expected:?} in {stderr}");
            assert!(
                message.contains(expected) && message.len() <= 4096,
                "{file}: {expected:?} in {message}"
            );
        }
        assert!(
            stderr.contains(&format!("{file}:")),
            "{file}: the user's file is named: {stderr}"
        );
        assert!(!output.exists(), "{language}: no module written");
        assert!(
            stored_configmaps(&kube, "default").is_empty(),
            "{language}: nothing published"
        );
    }
}

/// A WAT handler: the quickest real build, for the publishing tests.
const WAT_MODULE: &str = "(module (memory (export \"memory\") 1) (func (export \"_start\")))";

#[tokio::test(flavor = "multi_thread")]
async fn transient_publish_errors_are_retried_and_the_build_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("module.wat");
    std::fs::write(&source, WAT_MODULE).unwrap();
    let kube = fake_api().await;
    // A conflict and a restarting API server, as a build can meet while publishing.
    kube.api
        .fail_with(axum::http::Method::PATCH, "/configmaps/", [409, 503]);
    let built = result(
        &build_command("wat", &source, &dir.path().join("out.wasm"), &dir.path().join("cache"))
            // The module's chunk alone (`--no-code`), so the count of attempts is one chunk's.
            .args(["--publish", "configmap://default/retried", "--no-code"])
            .env("KUBECONFIG", kube.kubeconfig.path())
            .output()
            .unwrap(),
    );
    assert_eq!(built["published"], "configmap://default/retried");
    let stored = stored_configmaps(&kube, "default").len();
    assert_eq!(stored, 1, "the one chunk is stored");
    assert_eq!(configmap_writes(&kube), 3, "two failed attempts, then success");
}

/// A build Job's two steps (docs/security.md, door 2): the compile step leaves a module and
/// its result line and publishes nothing; the publish step publishes what it read and checked
/// itself, whatever the result line claims, never through a link, and refuses a module that
/// is not its language's.
#[tokio::test(flavor = "multi_thread")]
async fn the_publish_step_publishes_what_it_checked_not_what_the_compile_step_says() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("module.wat");
    std::fs::write(&source, WAT_MODULE).unwrap();
    let module = dir.path().join("module.wasm");
    let report = dir.path().join("build.json");
    let compiled = result(
        &build_command("wat", &source, &module, &dir.path().join("cache"))
            .args(["--no-code", "--result-file"])
            .arg(&report)
            .output()
            .unwrap(),
    );
    assert_eq!(compiled["published"], Value::Null, "the compile step publishes nothing");
    assert_eq!(
        serde_json::from_slice::<Value>(&std::fs::read(&report).unwrap()).unwrap(),
        compiled
    );
    // What an author's code in the compile step could write there: another module's digest.
    let mut forged = compiled.clone();
    forged["digest"] = format!("sha256:{}", "0".repeat(64)).into();
    forged["published"] = "configmap://default/someone-else".into();
    std::fs::write(&report, forged.to_string()).unwrap();

    let kube = fake_api().await;
    let publish = |module: &Path, language: &str| {
        builder()
            .args(["publish", "--language", language, "--module"])
            .arg(module)
            .arg("--build-result")
            .arg(&report)
            .args(["--publish", "configmap://default/hello", "--source-digest"])
            .arg(compiled["sourceDigest"].as_str().unwrap())
            .arg("--cache-dir")
            .arg(dir.path().join("code-cache"))
            .env("KUBECONFIG", kube.kubeconfig.path())
            .output()
            .unwrap()
    };
    let published = result(&publish(&module, "wat"));
    assert_eq!(published["digest"], compiled["digest"], "its own digest, not the claim");
    assert_eq!(published["published"], "configmap://default/hello");
    assert!(
        published["code"]["digest"].is_string(),
        "compiled to native code here: {published}"
    );
    assert_eq!(published["phases"]["compile"], compiled["phases"]["compile"]);
    let stored = stored_configmaps(&kube, "default");
    assert!(
        stored.keys().all(|name| name.starts_with("hello-")),
        "{:?}",
        stored.keys()
    );

    let link = dir.path().join("link.wasm");
    std::os::unix::fs::symlink(&module, &link).unwrap();
    let refused = publish(&link, "wat");
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("not a regular file"));
    failed_as_the_sources_fault(&publish(&module, "rust"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_publish_that_keeps_failing_exits_1_so_the_job_retries_it() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("module.wat");
    std::fs::write(&source, WAT_MODULE).unwrap();
    let kube = fake_api().await;
    kube.api.fail_with(axum::http::Method::PATCH, "/configmaps/", [500; 10]);
    let output = build_command("wat", &source, &dir.path().join("out.wasm"), &dir.path().join("cache"))
        .args(["--publish", "configmap://default/unlucky"])
        .env("KUBECONFIG", kube.kubeconfig.path())
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(1),
        "not the source's fault: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(configmap_writes(&kube), 5, "five attempts, then it gives up");
}

#[test]
fn bad_sources_get_a_one_line_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let goless_main =
        "package main\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {}\n";
    let oversized = format!("package handlers\n//{}\n", "x".repeat(600 * 1024));
    let cases: [(&str, &str, String, &str); 4] = [
        ("go", "main.go", goless_main.into(), "`package main`"),
        ("go", "big.go", oversized, "over the 524288-byte limit"),
        ("rust", "nohandler.rs", "pub fn greet() {}\n".into(), "pub fn handler"),
        ("cobol", "x.cob", "DISPLAY 'HI'.".into(), "invalid value 'cobol'"),
    ];
    for (language, file, text, expected) in cases {
        let source = dir.path().join(file);
        std::fs::write(&source, text).unwrap();
        let output = build(language, &source, &dir.path().join("out.wasm"), &cache, &[]);
        assert!(!output.status.success(), "{language} {file}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        let error_line = stderr
            .lines()
            .find(|l| l.starts_with("error"))
            .unwrap_or_else(|| panic!("{stderr}"));
        assert!(error_line.contains(expected), "{file}: {stderr}");
    }
}

#[test]
fn rust_handlers_build_offline_from_a_vendor_directory() {
    let dir = tempfile::tempdir().unwrap();
    let vendor = dir.path().join("vendor");
    let status = builder().arg("vendor").arg(&vendor).status().unwrap();
    assert!(status.success());
    let (_, source) = write_example_source(dir.path(), "hello-rust");
    // An empty CARGO_HOME: no registry index, no downloaded crates, only the vendor dir.
    let empty_home = dir.path().join("cargo-home");
    std::fs::create_dir(&empty_home).unwrap();
    let output = builder()
        .args(["build", "--language", "rust", "--source"])
        .arg(&source)
        .arg("--output")
        .arg(dir.path().join("hello.wasm"))
        .arg("--cache-dir")
        .arg(dir.path().join("cache"))
        .arg("--vendor-dir")
        .arg(&vendor)
        .env("CARGO_HOME", &empty_home)
        .env("CARGO_NET_OFFLINE", "true")
        .output()
        .unwrap();
    let built = result(&output);
    assert_eq!(built["cached"], false);
}

#[test]
fn sigterm_stops_a_build_at_once_and_nothing_is_written() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let (_, source) = write_example_source(dir.path(), "hello-go");
    let output = dir.path().join("out.wasm");
    let termination_log = dir.path().join("termination-log");
    std::fs::write(&termination_log, "").unwrap();
    let mut builder = build_command("go", &source, &output, &dir.path().join("cache"))
        // An empty Go build cache: the compile lasts long enough to be interrupted.
        .env("GOCACHE", dir.path().join("go-build"))
        .env("WASMLESS_TERMINATION_LOG", &termination_log)
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(builder.stderr.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("compiling go") {
        line.clear();
        assert_ne!(
            stderr.read_line(&mut line).unwrap(),
            0,
            "the builder ended before compiling"
        );
    }
    // As the kubelet stops a Job's pod past its deadline.
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &builder.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = builder.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    assert_eq!(status.code(), Some(143), "{rest}");
    assert!(rest.contains("stopped by SIGTERM"), "{rest}");
    assert!(
        std::fs::read_to_string(&termination_log)
            .unwrap()
            .contains("stopped by SIGTERM"),
        "the reason is the pod's termination message"
    );
    assert!(!output.exists(), "a stopped build writes no module");
}

/// Go handlers with their own go.mod build through a module proxy: one the test serves on
/// 127.0.0.1, holding only what `go mod download` fetched at set-up. The modules are
/// verified against the handler's go.sum, cached across builds, and the modules run.
#[tokio::test(flavor = "multi_thread")]
async fn go_modules_build_through_a_proxy_verified_against_go_sum() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let proxy = GoProxy::start();

    // github.com/google/uuid: random and name-based UUIDs.
    let uuid = module_handler("uuid", dir.path());
    let output = dir.path().join("uuid.wasm");
    let built = result(&build(
        "go",
        &uuid,
        &output,
        &cache,
        &["--go-proxy", &proxy.url, "--no-code"],
    ));
    assert!(proxy.requests() > 0, "the modules came from the proxy");
    let served = Served::start(output.to_str().unwrap(), built["digest"].as_str().unwrap(), &[]).await;
    let (status, first) = served.get("/orders").await;
    assert_eq!(status, 200, "{first}");
    let (_, second) = served.get("/orders").await;
    let line = |text: &str, prefix: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} in {text}"))
            .to_string()
    };
    assert!(line(&first, "random ").ends_with("version 4"), "{first}");
    assert_ne!(
        line(&first, "random "),
        line(&second, "random "),
        "a new random UUID per request"
    );
    // uuid.NewSHA1(uuid.NameSpaceURL, "/orders"), as native Go computes it.
    assert_eq!(line(&first, "named "), "90f6f92d-9225-5d4a-95e7-4b9f27291d32");
    drop(served);

    // github.com/go-chi/chi/v5: a third-party router.
    let chi = module_handler("chi", dir.path());
    let output = dir.path().join("chi.wasm");
    let built = result(&build(
        "go",
        &chi,
        &output,
        &cache,
        &["--go-proxy", &proxy.url, "--no-code"],
    ));
    let served = Served::start(output.to_str().unwrap(), built["digest"].as_str().unwrap(), &[]).await;
    assert_eq!(served.get("/users/42").await, (200, "user 42\n".to_string()));
    let (status, text) = served.get("/nowhere").await;
    assert_eq!((status, text.trim()), (404, "no route for /nowhere"));
    drop(served);

    // A go.sum that does not match what was downloaded: go's own SECURITY ERROR, the
    // source's fault. The module is in the build cache now, so the proxy is not asked: the
    // cache is checked against go.sum too.
    let asked = proxy.requests();
    let tampered = module_handler("uuid", &dir.path().join("tampered"));
    let sum = std::fs::read_to_string(tampered.join("go.sum")).unwrap();
    std::fs::write(tampered.join("go.sum"), sum.replace("h1:NIva", "h1:AAAA")).unwrap();
    let failed = build(
        "go",
        &tampered,
        &dir.path().join("t.wasm"),
        &cache,
        &["--go-proxy", &proxy.url],
    );
    let stderr = failed_as_the_sources_fault(&failed);
    assert!(
        stderr.contains("checksum mismatch") && stderr.contains("SECURITY ERROR"),
        "{stderr}"
    );
    assert_eq!(proxy.requests(), asked, "modules are cached across builds");

    // A go.sum without the module's line: -mod=readonly refuses, nothing is added.
    std::fs::write(tampered.join("go.sum"), "").unwrap();
    let failed = build(
        "go",
        &tampered,
        &dir.path().join("t.wasm"),
        &cache,
        &["--go-proxy", &proxy.url],
    );
    let stderr = failed_as_the_sources_fault(&failed);
    assert!(stderr.contains("missing go.sum entry"), "{stderr}");
    assert!(stderr.contains("handler.go:"), "the user's file is named: {stderr}");
    assert_eq!(
        std::fs::read_to_string(tampered.join("go.sum")).unwrap(),
        "",
        "the source is never written"
    );
}

/// No proxy configured: a handler whose go.mod requires modules fails as the source's
/// fault with a message naming the setting, whatever the machine's own GOPROXY; a proxy
/// that does not answer is the machine's fault, retried.
#[test]
fn go_modules_without_a_proxy_fail_with_the_setting_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let uuid = module_handler("uuid", dir.path());
    let termination_log = dir.path().join("termination-log");
    std::fs::write(&termination_log, "").unwrap();
    let failed = build_command("go", &uuid, &dir.path().join("out.wasm"), &dir.path().join("cache"))
        .arg("--termination-log")
        .arg(&termination_log)
        .env("GOPROXY", "https://proxy.golang.org")
        .output()
        .unwrap();
    assert_eq!(
        failed.status.code(),
        Some(wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD)
    );
    let message = std::fs::read_to_string(&termination_log).unwrap();
    for named in [
        "github.com/google/uuid v1.6.0",
        "WASMLESS_GOPROXY",
        "--go-proxy",
        "builder.goProxy",
    ] {
        assert!(message.contains(named), "{named}: {message}");
    }

    // A replacement by a directory would build what the builder's machine holds there.
    let local = module_handler("uuid", &dir.path().join("local"));
    let go_mod = std::fs::read_to_string(local.join("go.mod")).unwrap();
    std::fs::write(
        local.join("go.mod"),
        format!("{go_mod}\nreplace github.com/google/uuid => /etc\n"),
    )
    .unwrap();
    let failed = build_command("go", &local, &dir.path().join("out.wasm"), &dir.path().join("cache"))
        .env("WASMLESS_GOPROXY", "off")
        .output()
        .unwrap();
    let stderr = failed_as_the_sources_fault(&failed);
    assert!(
        stderr.contains("replaces github.com/google/uuid with the directory /etc"),
        "{stderr}"
    );

    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("http://{}", refused.local_addr().unwrap());
    drop(refused);
    let unreachable = build_command("go", &uuid, &dir.path().join("out.wasm"), &dir.path().join("cache"))
        .env("WASMLESS_GOPROXY", &closed)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert_eq!(unreachable.status.code(), Some(1), "worth a retry: {stderr}");
    assert!(
        stderr.contains("module proxy failed") && stderr.contains("connection refused"),
        "{stderr}"
    );
}

/// The cache entries of one build: the module's and its compiled code's.
fn cache_entries(cache: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let only = |dir: &str| {
        let entries: Vec<_> = std::fs::read_dir(cache.join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .collect();
        assert_eq!(entries.len(), 1, "one entry in {dir}: {entries:?}");
        entries[0].clone()
    };
    (only("modules"), only("code"))
}

#[test]
fn a_repeated_or_reverted_source_compiles_and_precompiles_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let (a, b) = (dir.path().join("a.wat"), dir.path().join("b.wat"));
    std::fs::write(&a, WAT_MODULE).unwrap();
    std::fs::write(&b, WAT_MODULE.replace("1)", "2)")).unwrap();
    let build_of = |source: &Path| result(&build("wat", source, &dir.path().join("out.wasm"), &cache, &[]));

    let first = build_of(&a);
    assert_eq!(first["cached"], false);
    assert_eq!(first["cache"]["module"], "miss");
    assert_eq!(first["cache"]["code"], "miss");
    let code = std::fs::read(dir.path().join("out.cwasm.lz4")).unwrap();
    // Another source in between, then the first again: a revert.
    assert_eq!(build_of(&b)["cache"]["code"], "miss");
    let again = build_of(&a);
    assert_eq!(again["cached"], true, "{again}");
    assert_eq!(again["cache"]["module"], "hit", "{again}");
    assert_eq!(
        again["cache"]["code"], "hit",
        "the compiled code comes from the cache: {again}"
    );
    assert_eq!(again["phases"]["compile"], 0.0, "nothing compiled: {again}");
    assert_eq!(again["phases"]["snapshot"], 0.0, "{again}");
    assert_eq!(again["code"]["digest"], first["code"]["digest"]);
    assert_eq!(again["digest"], first["digest"]);
    assert_eq!(std::fs::read(dir.path().join("out.cwasm.lz4")).unwrap(), code);
    assert!(again.get("cache").unwrap().get("problems").is_none(), "{again}");
    for phase in ["check", "compile", "snapshot", "precompile", "publish", "total"] {
        assert!(again["phases"][phase].is_f64(), "{phase} is reported: {again}");
    }
}

#[test]
fn a_corrupt_cache_entry_is_detected_and_rebuilt_never_served() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let source = dir.path().join("module.wat");
    std::fs::write(&source, WAT_MODULE).unwrap();
    let output = dir.path().join("out.wasm");
    let first = result(&build("wat", &source, &output, &cache, &[]));
    let (module, code) = cache_entries(&cache);

    // A torn module (half of it) and compiled code with one byte changed.
    let bytes = std::fs::read(&module).unwrap();
    std::fs::write(&module, &bytes[..bytes.len() / 2]).unwrap();
    let mut bytes = std::fs::read(&code).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&code, &bytes).unwrap();

    let rebuilt = build("wat", &source, &output, &cache, &[]);
    let second = result(&rebuilt);
    assert_eq!(second["cached"], false, "{second}");
    assert_eq!(second["cache"]["module"], "corrupt", "{second}");
    assert_eq!(second["cache"]["code"], "corrupt", "{second}");
    assert_eq!(second["cache"]["problems"].as_array().unwrap().len(), 2, "{second}");
    assert_eq!(second["digest"], first["digest"]);
    assert_eq!(
        second["code"]["digest"], first["code"]["digest"],
        "the code served is compiled anew"
    );
    let log = String::from_utf8_lossy(&rebuilt.stderr);
    assert!(log.contains("failed its check"), "the Job's log says so: {log}");

    // The rebuilt entries replaced the corrupt ones.
    let third = result(&build("wat", &source, &output, &cache, &[]));
    assert_eq!(
        (third["cache"]["module"].as_str(), third["cache"]["code"].as_str()),
        (Some("hit"), Some("hit"))
    );
}

#[test]
fn concurrent_builds_of_one_source_share_the_cache_without_corrupting_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let source = dir.path().join("module.wat");
    std::fs::write(&source, WAT_MODULE).unwrap();
    let builds: Vec<_> = (0..6)
        .map(|i| {
            build_command("wat", &source, &dir.path().join(format!("out{i}.wasm")), &cache)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let results: Vec<Value> = builds
        .into_iter()
        .map(|child| result(&child.wait_with_output().unwrap()))
        .collect();
    for built in &results {
        assert_eq!(built["digest"], results[0]["digest"]);
        assert_eq!(built["code"]["digest"], results[0]["code"]["digest"]);
        assert!(
            built["cache"].get("problems").is_none(),
            "no build saw a torn entry: {built}"
        );
    }
    let after = result(&build("wat", &source, &dir.path().join("out.wasm"), &cache, &[]));
    assert_eq!(
        (after["cache"]["module"].as_str(), after["cache"]["code"].as_str()),
        (Some("hit"), Some("hit"))
    );
    // No temporary file is left behind.
    cache_entries(&cache);
}

#[test]
fn a_cache_directory_that_cannot_be_used_builds_cold_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("module.wat");
    std::fs::write(&source, WAT_MODULE).unwrap();
    // A file where the directory should be, as a node path made wrong would be.
    let cache = dir.path().join("cache");
    std::fs::write(&cache, "not a directory").unwrap();
    let built = result(&build("wat", &source, &dir.path().join("out.wasm"), &cache, &[]));
    assert_ne!(built["cache"]["dir"], cache.to_str().unwrap(), "{built}");
    let problems = built["cache"]["problems"].to_string();
    assert!(problems.contains("install -d -o 65532"), "says what to do: {problems}");
}

/// `--cache-dir` relative to where the builder runs is made absolute, as Go's `GOCACHE`
/// must be (`--compiler-caches-in-cache-dir` puts it there), and a second build hits it.
#[test]
fn a_relative_cache_directory_is_used_as_an_absolute_one() {
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("module.wat");
    std::fs::write(&source, WAT_MODULE).unwrap();
    let build_in_dir = || {
        let output = build_command("wat", &source, &dir.path().join("out.wasm"), Path::new("cache"))
            .current_dir(dir.path())
            .output()
            .unwrap();
        result(&output)
    };
    let first = build_in_dir();
    assert_eq!(
        first["cache"]["dir"],
        dir.path().join("cache").to_str().unwrap(),
        "{first}"
    );
    let second = build_in_dir();
    assert_eq!(second["cache"]["module"], "hit", "{second}");
}

/// A Rust handler with dependencies in its Cargo.toml (serde with derive, serde_json) builds
/// through a crates registry the test serves on 127.0.0.1, holding only the crates
/// scripts/cargo-registry.sh fetched at set-up; its Cargo.lock holds the build (`--locked`),
/// the crates are kept across builds, and the module answers as the handler says.
#[tokio::test(flavor = "multi_thread")]
async fn rust_dependencies_build_through_a_crates_registry() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let registry = CratesRegistry::start();
    let orders = crate_handler("orders", dir.path());
    let output = dir.path().join("orders.wasm");
    let built = result(&build(
        "rust",
        &orders,
        &output,
        &cache,
        &["--cargo-registry", &registry.index, "--no-code"],
    ));
    let downloaded = registry.downloads();
    for name in ["serde_json-", "serde_derive-", "wasip2-"] {
        assert!(
            downloaded.iter().any(|d| d.starts_with(name)),
            "{name} came from the registry (the SDK's dependencies too): {downloaded:?}"
        );
    }
    let served = Served::start(output.to_str().unwrap(), built["digest"].as_str().unwrap(), &[]).await;
    let order = r#"{"customer":"ada","items":[{"sku":"tea","quantity":3,"unit_cents":450},{"sku":"cup","quantity":1,"unit_cents":1299}],"coupon":"TENOFF"}"#;
    let (status, text) = served.post("/quote", order).await;
    assert_eq!(status, 200, "{text}");
    let quote: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        quote,
        serde_json::json!({"customer": "ada", "lines": 2, "total": "23.85", "skus": ["tea", "cup"]}),
        "serde's derive and serde_json, compiled into the handler"
    );
    let (status, text) = served.post("/quote", r#"{"customer": 7}"#).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid type: integer `7`, expected a string"), "{text}");
    drop(served);

    // Another handler with the same dependencies and no Cargo.lock: resolved from the
    // registry's index, built from the crates kept in the build cache, none downloaded again.
    let unlocked = crate_handler("orders", &dir.path().join("unlocked"));
    std::fs::remove_file(unlocked.join("Cargo.lock")).unwrap();
    let lib = std::fs::read_to_string(unlocked.join("src/lib.rs")).unwrap();
    std::fs::write(unlocked.join("src/lib.rs"), lib.replace("TENOFF", "HALF")).unwrap();
    let before = registry.downloads().len();
    result(&build(
        "rust",
        &unlocked,
        &dir.path().join("unlocked.wasm"),
        &cache,
        &["--cargo-registry", &registry.index, "--no-code"],
    ));
    assert_eq!(registry.downloads().len(), before, "crates are kept across builds");

    // A Cargo.lock whose checksum is not the registry's: cargo refuses, the source's fault.
    let tampered = crate_handler("orders", &dir.path().join("tampered"));
    let lock = std::fs::read_to_string(tampered.join("Cargo.lock")).unwrap();
    let checksum = lock
        .split("name = \"serde_json\"")
        .nth(1)
        .and_then(|rest| rest.split("checksum = \"").nth(1))
        .map(|rest| rest[..64].to_string())
        .unwrap();
    std::fs::write(tampered.join("Cargo.lock"), lock.replace(&checksum, &"0".repeat(64))).unwrap();
    let failed = build(
        "rust",
        &tampered,
        &dir.path().join("t.wasm"),
        &cache,
        &["--cargo-registry", &registry.index],
    );
    let stderr = failed_as_the_sources_fault(&failed);
    assert!(stderr.contains("checksum for `serde_json"), "{stderr}");

    // What cannot work here is refused before anything is fetched, with what to do.
    for (addition, expected) in [
        (
            "[dependencies.local]\npath = \"../local\"\n",
            "dependency local comes from a directory",
        ),
        (
            "[dependencies.remote]\ngit = \"https://example.com/remote.git\"\n",
            "dependency remote comes from a git repository",
        ),
        (
            "[patch.crates-io]\nserde = { path = \"../serde\" }\n",
            "[patch] is not supported",
        ),
    ] {
        let refused = crate_handler("orders", &dir.path().join("refused"));
        let manifest = std::fs::read_to_string(refused.join("Cargo.toml")).unwrap();
        std::fs::write(refused.join("Cargo.toml"), format!("{manifest}\n{addition}")).unwrap();
        let failed = build(
            "rust",
            &refused,
            &dir.path().join("r.wasm"),
            &cache,
            &["--cargo-registry", &registry.index],
        );
        let stderr = failed_as_the_sources_fault(&failed);
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
}

/// No crates registry configured: a Rust handler whose Cargo.toml has dependencies fails as
/// the source's fault with a message naming the setting; a registry that does not answer is
/// the machine's fault, retried.
#[test]
fn rust_dependencies_without_a_registry_fail_with_the_setting_to_set() {
    let dir = tempfile::tempdir().unwrap();
    let orders = crate_handler("orders", dir.path());
    let termination_log = dir.path().join("termination-log");
    std::fs::write(&termination_log, "").unwrap();
    let failed = build_command("rust", &orders, &dir.path().join("out.wasm"), &dir.path().join("cache"))
        .arg("--termination-log")
        .arg(&termination_log)
        .output()
        .unwrap();
    assert_eq!(
        failed.status.code(),
        Some(wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD)
    );
    let message = std::fs::read_to_string(&termination_log).unwrap();
    for named in [
        "serde 1, serde_json 1",
        "WASMLESS_CARGO_REGISTRY",
        "--cargo-registry",
        "builder.cargoRegistry",
    ] {
        assert!(message.contains(named), "{named}: {message}");
    }

    let refused = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("sparse+http://{}/index/", refused.local_addr().unwrap());
    drop(refused);
    let unreachable = build_command("rust", &orders, &dir.path().join("out.wasm"), &dir.path().join("cache"))
        .env("WASMLESS_CARGO_REGISTRY", &closed)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&unreachable.stderr);
    assert_eq!(unreachable.status.code(), Some(1), "worth a retry: {stderr}");
    assert!(stderr.contains("crates registry failed"), "{stderr}");
}

/// A Goless handler answering `answer`.
fn go_answering(answer: &str) -> String {
    format!(
        "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) {{\n\tw.Write([]byte(\"{answer}\"))\n}}\n"
    )
}

/// Functions found compiled and compiled anew by one step (`snapshot`, `precompile`).
fn function_counts(built: &Value, step: &str) -> (u64, u64) {
    let counts = &built["cache"]["functions"][step];
    match (counts["reused"].as_u64(), counts["compiled"].as_u64()) {
        (Some(reused), Some(compiled)) => (reused, compiled),
        _ => panic!("no function counts for {step}: {built}"),
    }
}

#[test]
fn an_edit_compiles_only_the_functions_it_changed_into_the_same_code() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let source = dir.path().join("handler.go");
    let output = dir.path().join("out.wasm");
    let build_answering = |answer: &str| {
        std::fs::write(&source, go_answering(answer)).unwrap();
        result(&build("go", &source, &output, &cache, &[]))
    };
    let few_of = |(reused, compiled): (u64, u64)| compiled * 20 < reused;

    // Cold: the module's functions compiled once each (identical bodies, such as the
    // trampolines of one signature, are found compiled the second time), by the snapshot's
    // run; the precompile that follows finds them all compiled (the snapshot keeps the
    // exports it ran with, which every function's compilation depends on).
    let cold_build = build_answering("one");
    let cold = function_counts(&cold_build, "snapshot");
    let cold_precompile = function_counts(&cold_build, "precompile");
    assert!(
        few_of(cold_precompile),
        "the precompile after a cold snapshot compiled (reused, compiled) {cold_precompile:?}: {cold_build}"
    );

    let edit = build_answering("two");
    for step in ["snapshot", "precompile"] {
        let counts = function_counts(&edit, step);
        assert!(
            few_of(counts),
            "an edit's {step} compiled (reused, compiled) {counts:?}: {edit}"
        );
    }
    // What the cache put together is what a compiler with no cache makes.
    let built = wasmless_builder::Built {
        wasm: std::fs::read(&output).unwrap(),
        digest: edit["digest"].as_str().unwrap().parse().unwrap(),
        source_digest: edit["sourceDigest"].as_str().unwrap().parse().unwrap(),
        cached: false,
        snapshot: None,
        cache: "off",
        cache_problem: None,
        phases: Default::default(),
    };
    let plain = wasmless_builder::precompile(&built).unwrap();
    assert_eq!(edit["code"]["digest"], plain.digest.to_string(), "{edit}");

    // Every function entry torn: each is compiled again, and the build succeeds.
    let mut torn = 0;
    for shard in std::fs::read_dir(cache.join("functions")).unwrap() {
        for entry in std::fs::read_dir(shard.unwrap().path()).unwrap() {
            let path = entry.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
            torn += 1;
        }
    }
    assert!(torn > 100, "{torn} function entries");
    let after = build_answering("three");
    let (_, compiled) = function_counts(&after, "snapshot");
    assert!(
        compiled * 10 >= cold.1 * 9,
        "torn entries are compiled again as in a cold build ({cold:?}), not used: {after}"
    );
}
