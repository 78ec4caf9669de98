//! The pool reading its table and its Functions' chunks from the Kubernetes API
//! (`--pool api:<selector>`, `--module configmaps:...`), on the cluster that
//! `WASMLESS_TEST_KUBECONFIG` names (`scripts/cluster.sh up` starts one; without it these
//! tests fail, saying so: skip them with `cargo test -- --skip real_api`). The pool runs
//! here, as a process of its own with that kubeconfig, in a namespace made for the test.

use super::{at, eventually, metrics};
use crate::support::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use wasmless_artifact::{Digest, Part, annotations};

const SELECTOR: &str = "wasmless.io/component=pool-entry";

/// A namespace of the test cluster, deleted when dropped (a failed assertion too).
struct TestNamespace {
    client: kube::Client,
    name: String,
    kubeconfig: String,
}

impl TestNamespace {
    async fn new(test: &str) -> Self {
        let kubeconfig = std::env::var("WASMLESS_TEST_KUBECONFIG").unwrap_or_else(|_| {
            panic!(
                "{test} runs on a real cluster: start one with `scripts/cluster.sh up` and set \
                 WASMLESS_TEST_KUBECONFIG to the kubeconfig it prints (scripts/test.sh does both), \
                 or skip these with `cargo test -- --skip real_api`"
            )
        });
        // rustls needs its provider chosen (ring, the one the workspace links).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = client_of(&kubeconfig).await;
        // The process ID: runs may overlap while an earlier run's namespace is terminating.
        let name = format!("wasmless-test-{test}-{}", std::process::id());
        let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("creating the test namespace");
        Self {
            client,
            name,
            kubeconfig,
        }
    }

    fn configmaps(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.name)
    }

    /// Writes (or overwrites) a ConfigMap, as the operator and the builder do.
    async fn apply(&self, configmap: serde_json::Value) {
        let configmap: ConfigMap = serde_json::from_value(configmap).unwrap();
        let name = configmap.metadata.name.clone().unwrap();
        self.configmaps()
            .patch(
                &name,
                &PatchParams::apply("wasmless-tests").force(),
                &Patch::Apply(&configmap),
            )
            .await
            .unwrap_or_else(|error| panic!("writing ConfigMap {name}: {error}"));
    }

    /// The chunk ConfigMaps of `function`'s `part`, named, keyed and annotated as the builder
    /// writes them.
    async fn write_chunks(&self, function: &str, source_digest: &Digest, part: Part, chunks: &[Vec<u8>]) {
        for (index, chunk) in chunks.iter().enumerate() {
            let mut configmap = ConfigMap::default();
            configmap.metadata.name = Some(part.configmap_name(function, source_digest, index));
            configmap.metadata.annotations = Some(BTreeMap::from([
                (annotations::CHUNK_COUNT.to_string(), chunks.len().to_string()),
                (annotations::CHUNK_INDEX.to_string(), index.to_string()),
            ]));
            configmap.binary_data = Some(BTreeMap::from([(
                part.configmap_key().to_string(),
                ByteString(chunk.clone()),
            )]));
            self.apply(serde_json::to_value(configmap).unwrap()).await;
        }
    }

    /// `<function>-pool`, the pool's entry for `function`, as the operator writes it: the
    /// handler's `GREETING` in the entry's `env`, where the operator puts a Function's
    /// variables (an entry's args hold no `--env`).
    async fn write_entry(&self, function: &str, port: u16, args: &[String], greeting: Option<&str>) {
        let mut entry = serde_json::json!({ "port": port, "args": args });
        if let Some(greeting) = greeting {
            entry["env"] = serde_json::json!([{"name": "WASMLESS_HANDLER_ENV_GREETING", "value": greeting}]);
        }
        self.write_raw_entry(function, &entry.to_string()).await;
    }

    /// An entry ConfigMap as the operator writes it: named after its Function, labelled,
    /// and controlled by the Function (the pool serves no other).
    async fn write_raw_entry(&self, function: &str, entry_json: &str) {
        let owner = self.function_owner(function).await;
        self.apply(serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": format!("{function}-pool"),
                "labels": {"wasmless.io/component": "pool-entry", "wasmless.io/function": function},
                "ownerReferences": [owner],
            },
            "data": {"entry.json": entry_json},
        }))
        .await;
    }

    /// The ownerReference of Function `function` in this namespace, made for it. Where the
    /// cluster has the Function CRD, the Function is created (no operator runs here, so it
    /// only sits there): the garbage collector deletes an object whose owner it cannot
    /// find. Without the CRD, the collector cannot look the owner up, and leaves the entry.
    async fn function_owner(&self, function: &str) -> serde_json::Value {
        let resource = ApiResource {
            group: "wasmless.io".into(),
            version: "v1alpha1".into(),
            api_version: "wasmless.io/v1alpha1".into(),
            kind: "Function".into(),
            plural: "functions".into(),
        };
        let functions: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &self.name, &resource);
        let made = DynamicObject::new(function, &resource)
            .data(serde_json::json!({"spec": {"language": "wat", "source": "(module)"}}));
        let uid = match functions.create(&PostParams::default(), &made).await {
            Ok(created) => created.metadata.uid,
            Err(kube::Error::Api(response)) if response.code == 409 => {
                functions.get(function).await.ok().and_then(|found| found.metadata.uid)
            }
            Err(_) => None,
        };
        serde_json::json!({
            "apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "name": function,
            "uid": uid.unwrap_or_else(|| "00000000-0000-4000-8000-000000000000".into()),
            "controller": true, "blockOwnerDeletion": true,
        })
    }

    /// Writes (or overwrites) a Secret of text values.
    async fn apply_secret(&self, name: &str, values: &[(&str, &str)]) {
        let data: BTreeMap<String, String> = values.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data,
        }))
        .unwrap();
        Api::<Secret>::namespaced(self.client.clone(), &self.name)
            .patch(
                name,
                &PatchParams::apply("wasmless-tests").force(),
                &Patch::Apply(&secret),
            )
            .await
            .unwrap_or_else(|error| panic!("writing Secret {name}: {error}"));
    }

    async fn delete_entry(&self, function: &str) {
        self.configmaps()
            .delete(&format!("{function}-pool"), &DeleteParams::default())
            .await
            .expect("deleting the entry");
    }

    /// The pool, run here against this namespace through the test's kubeconfig.
    fn start_pool(&self, kubeconfig: &str) -> Runtime {
        Runtime::start_pool_from(
            &format!("api:{SELECTOR}"),
            &[],
            &[("KUBECONFIG", kubeconfig), ("WASMLESS_NAMESPACE", &self.name)],
        )
    }
}

async fn client_of(kubeconfig: &str) -> kube::Client {
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(kubeconfig).expect("reading WASMLESS_TEST_KUBECONFIG"),
        &Default::default(),
    )
    .await
    .expect("kubeconfig");
    kube::Client::try_from(config).expect("client")
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        let (kubeconfig, name) = (self.kubeconfig.clone(), self.name.clone());
        // Drop cannot await, and blocks the test's runtime, on which the test's client
        // does its work: another thread, with a runtime and a client of its own.
        let deleted = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async {
                    Api::<Namespace>::all(client_of(&kubeconfig).await)
                        .delete(&name, &DeleteParams::background())
                        .await
                        .map(|_| ())
                })
        })
        .join();
        if !matches!(deleted, Ok(Ok(()))) {
            eprintln!("could not delete the test namespace {}: {deleted:?}", self.name);
        }
    }
}

/// A Rust handler's module and compiled code as the builder stores them: the ConfigMaps'
/// chunks, and the runtime arguments that read them through the API.
struct Built {
    module_chunks: Vec<Vec<u8>>,
    code_chunks: Vec<Vec<u8>>,
    module_digest: Digest,
    code_digest: Digest,
    source_digest: Digest,
}

impl Built {
    fn echo() -> Self {
        let wasm = std::fs::read(rust_echo()).unwrap();
        let code = precompile_for(&portable_engine(), &wasm);
        Self {
            module_chunks: wasmless_artifact::compress_and_split(&wasm),
            // In nine chunks, where a build would store one: the pool fetches several at
            // once, and must join them in their order (the code's digest says so).
            code_chunks: code.chunks(code.len().div_ceil(9)).map(<[u8]>::to_vec).collect(),
            module_digest: Digest::of(&wasm),
            code_digest: Digest::of(&code),
            source_digest: Digest::of(b"the echo handler's source"),
        }
    }

    async fn write(&self, namespace: &TestNamespace, function: &str) {
        namespace
            .write_chunks(function, &self.source_digest, Part::Module, &self.module_chunks)
            .await;
        namespace
            .write_chunks(function, &self.source_digest, Part::Code, &self.code_chunks)
            .await;
    }

    fn args(&self, function: &str, extra: &[&str]) -> Vec<String> {
        let source = |count: usize| format!("configmaps:{function}/{}/{count}", self.source_digest);
        let mut args = vec![
            "--function".to_string(),
            function.to_string(),
            "--module".to_string(),
            source(self.module_chunks.len()),
            "--module-digest".to_string(),
            self.module_digest.to_string(),
            "--code".to_string(),
            source(self.code_chunks.len()),
            "--code-digest".to_string(),
            self.code_digest.to_string(),
        ];
        args.extend(extra.iter().map(|arg| arg.to_string()));
        args
    }
}

async fn answers(port: u16, path: &str) -> Option<(u16, String)> {
    let response = client().get(at(port, path)).send().await.ok()?;
    Some((response.status().as_u16(), response.text().await.ok()?))
}

async fn greeting(port: u16) -> Option<String> {
    let (status, body) = answers(port, "/echo").await?;
    let json: serde_json::Value = serde_json::from_str(&body).ok().filter(|_| status == 200)?;
    json["env"].as_str().map(str::to_string)
}

async fn pool_status(pool: &Runtime) -> serde_json::Value {
    let (status, body) = get(pool.admin_url("/pool")).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["functions"].clone()
}

async fn ready(pool: &Runtime) -> bool {
    get(pool.admin_url("/readyz")).await.0 == 200
}

#[tokio::test]
async fn real_api_pool_serves_functions_as_their_configmaps_come_change_and_go() {
    let namespace = TestNamespace::new("pool-api").await;
    let built = Built::echo();
    built.write(&namespace, "echo").await;
    let pool = namespace.start_pool(&namespace.kubeconfig);
    eventually("the pool is ready once it has listed its ConfigMaps", || ready(&pool)).await;

    // Created: its port answers within seconds, with its code read from the ConfigMaps.
    let port = free_port();
    let written = Instant::now();
    namespace
        .write_entry("echo", port, &built.args("echo", &[]), Some("first"))
        .await;
    eventually("the new Function answers", || async {
        greeting(port).await.as_deref() == Some("first")
    })
    .await;
    let took = written.elapsed();
    assert!(took < Duration::from_secs(5), "the first answer took {took:?}");
    pool.wait_for_log(&[
        "module loaded",
        &built.module_digest.to_string(),
        "\"compiled_code\":\"precompiled\"",
        "\"phases\":\"fetch ",
    ]);
    let text = metrics(&pool).await;
    for phase in ["fetch", "verify", "open", "link"] {
        assert_eq!(
            sample(&text, "wasmless_load_phase_seconds_count", &[("phase", phase)]),
            Some(1.0),
            "{phase}: {text}"
        );
    }
    let status = pool_status(&pool).await;
    assert_eq!(
        status["echo"],
        serde_json::json!({"port": port, "listening": true, "loaded": true, "error": null}),
        "{status}"
    );

    // Changed: the new arguments apply.
    namespace
        .write_entry("echo", port, &built.args("echo", &[]), Some("second"))
        .await;
    eventually("the changed Function answers with its new env", || async {
        greeting(port).await.as_deref() == Some("second")
    })
    .await;

    // Chunks whose bytes are not the pinned module: that Function answers 503 saying so,
    // its neighbour serves on.
    let tampered_port = free_port();
    let other_module = wasmless_artifact::compress_and_split(&cgi_wat("Status: 200\r\n\r\nnot echo"));
    namespace
        .write_chunks("tampered", &built.source_digest, Part::Module, &other_module)
        .await;
    let args = [
        "--function".to_string(),
        "tampered".to_string(),
        "--module".to_string(),
        format!("configmaps:tampered/{}/{}", built.source_digest, other_module.len()),
        "--module-digest".to_string(),
        built.module_digest.to_string(),
    ];
    namespace.write_entry("tampered", tampered_port, &args, None).await;
    eventually("the tampered Function's port is open", || async {
        answers(tampered_port, "/").await.is_some()
    })
    .await;
    let (status, body) = answers(tampered_port, "/").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("cannot be loaded"), "{body}");
    pool.wait_for_log(&["cannot load the function's module", "digest mismatch"]);
    assert_eq!(greeting(port).await.as_deref(), Some("second"));
    let status = pool_status(&pool).await;
    let tampered = &status["tampered"];
    assert_eq!(tampered["listening"], true, "{status}");
    assert_eq!(tampered["loaded"], false, "{status}");
    assert!(
        tampered["error"]
            .as_str()
            .unwrap_or_default()
            .contains("digest mismatch"),
        "{status}"
    );

    // An entry that is not one: reported, on /pool too, and nothing else changes.
    namespace.write_raw_entry("junk", "{").await;
    pool.wait_for_log(&["ConfigMap junk-pool", "cannot be served"]);
    let status = pool_status(&pool).await;
    assert_eq!(status["junk"]["listening"], false, "{status}");
    assert!(
        status["junk"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("ConfigMap junk-pool"),
        "{status}"
    );

    // Deleted: its port refuses within seconds, and it leaves the pool's state.
    namespace.delete_entry("echo").await;
    eventually("the deleted Function's port refuses", || async {
        client().get(at(port, "/echo")).send().await.is_err()
    })
    .await;
    let status = pool_status(&pool).await;
    assert!(status.get("echo").is_none(), "{status}");
    let text = metrics(&pool).await;
    assert_eq!(
        sample(&text, "wasmless_module_info", &[("function", "echo")]),
        None,
        "a deleted Function leaves no module series: {text}"
    );
    assert!(ready(&pool).await);
}

#[tokio::test]
async fn real_api_pool_is_not_ready_until_it_has_read_its_table() {
    let namespace = TestNamespace::new("pool-api-unready").await;
    // The cluster's kubeconfig with its API server moved to a port nobody listens on: the
    // watch fails, and is retried.
    let unreachable = format!("https://127.0.0.1:{}", free_port());
    let kubeconfig: String = std::fs::read_to_string(&namespace.kubeconfig)
        .unwrap()
        .lines()
        .map(|line| match line.split_once("server:") {
            Some((indent, _)) if indent.trim().is_empty() => format!("{indent}server: {unreachable}\n"),
            _ => format!("{line}\n"),
        })
        .collect();
    assert!(kubeconfig.contains(&unreachable), "no server: line in {kubeconfig}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    std::fs::write(&path, kubeconfig).unwrap();

    let pool = namespace.start_pool(path.to_str().unwrap());
    pool.wait_for_log(&["watching the pool's ConfigMaps failed", "retrying"]);
    let (status, body) = get(pool.admin_url("/readyz")).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("table"), "{body}");
}

#[tokio::test]
async fn real_api_pool_gives_a_function_its_secrets_and_configmaps_values_and_reads_them_again_when_told() {
    let namespace = TestNamespace::new("pool-secrets").await;
    let built = Built::echo();
    built.write(&namespace, "secretive").await;
    built.write(&namespace, "configured").await;
    built.write(&namespace, "waiting").await;
    namespace.apply_secret("greeting", &[("text", "from the Secret")]).await;
    namespace
        .apply(serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"},
            "data": {"GREETING": "from the ConfigMap", "OTHER": "x"},
        }))
        .await;
    let pool = namespace.start_pool(&namespace.kubeconfig);
    eventually("the pool is ready once it has listed its ConfigMaps", || ready(&pool)).await;

    // As the operator writes it: the variables a pod's container would have.
    let entry = |function: &str, port: u16, env: serde_json::Value, env_from: serde_json::Value, hash: &str| {
        serde_json::json!({
            "port": port, "args": built.args(function, &[]), "env": env, "envFrom": env_from, "configHash": hash,
        })
        .to_string()
    };
    let from_secret = serde_json::json!([{"name": "WASMLESS_HANDLER_ENV_GREETING",
        "valueFrom": {"secretKeyRef": {"name": "greeting", "key": "text"}}}]);
    let secretive = free_port();
    namespace
        .write_raw_entry(
            "secretive",
            &entry("secretive", secretive, from_secret.clone(), serde_json::json!([]), "v1"),
        )
        .await;
    let configured = free_port();
    let from_configmap = serde_json::json!([{"prefix": "WASMLESS_HANDLER_ENV_", "configMapRef": {"name": "settings"}}]);
    namespace
        .write_raw_entry(
            "configured",
            &entry("configured", configured, serde_json::json!([]), from_configmap, "v1"),
        )
        .await;
    eventually("the Function answers with its Secret's value", || async {
        greeting(secretive).await.as_deref() == Some("from the Secret")
    })
    .await;
    eventually("the other answers with its ConfigMap's value", || async {
        greeting(configured).await.as_deref() == Some("from the ConfigMap")
    })
    .await;
    let logs = pool.logs().join("\n");
    assert!(!logs.contains("from the Secret"), "a Secret's value was logged: {logs}");

    // Rotated: the Secret changes, then the entry's hash (the operator's resourceVersions).
    namespace.apply_secret("greeting", &[("text", "rotated")]).await;
    namespace
        .write_raw_entry(
            "secretive",
            &entry("secretive", secretive, from_secret, serde_json::json!([]), "v2"),
        )
        .await;
    eventually("the Function answers with the Secret's new value", || async {
        greeting(secretive).await.as_deref() == Some("rotated")
    })
    .await;

    // A Secret that does not exist yet: named on /pool, and read once it exists.
    let waiting = free_port();
    let from_missing = serde_json::json!([{"name": "WASMLESS_HANDLER_ENV_GREETING",
        "valueFrom": {"secretKeyRef": {"name": "later", "key": "text"}}}]);
    namespace
        .write_raw_entry(
            "waiting",
            &entry("waiting", waiting, from_missing, serde_json::json!([]), "v1"),
        )
        .await;
    eventually("the pool names the missing Secret", || async {
        pool_status(&pool).await["waiting"]["error"]
            .as_str()
            .is_some_and(|error| error.contains("Secret later does not exist (env GREETING)"))
    })
    .await;
    assert_eq!(
        greeting(secretive).await.as_deref(),
        Some("rotated"),
        "its neighbour serves on"
    );
    namespace.apply_secret("later", &[("text", "at last")]).await;
    eventually("the Function serves once its Secret exists", || async {
        greeting(waiting).await.as_deref() == Some("at last")
    })
    .await;
}

/// Door 1 of issue 38, the pool's side: whoever may write ConfigMaps in the namespace
/// forges entries (a copy of the victim's under another name, one on the victim's port
/// with no owner) and rewrites the victim's with a flag the operator never writes. None
/// is served, each says why on `/pool`, and the victim answers on with its own body.
#[tokio::test]
async fn real_api_pool_serves_no_forged_entry_and_the_victim_answers_on() {
    let namespace = TestNamespace::new("pool-forged").await;
    let built = Built::echo();
    built.write(&namespace, "victim").await;
    let pool = namespace.start_pool(&namespace.kubeconfig);
    eventually("the pool is ready once it has listed its ConfigMaps", || ready(&pool)).await;
    let port = free_port();
    let args = built.args("victim", &[]);
    namespace.write_entry("victim", port, &args, Some("victim's")).await;
    eventually("the victim answers", || async {
        greeting(port).await.as_deref() == Some("victim's")
    })
    .await;

    let forged = serde_json::json!({"port": port, "args": args,
        "env": [{"name": "WASMLESS_HANDLER_ENV_GREETING", "value": "forged"}]});
    let owner = namespace.function_owner("victim").await;
    for (name, labels, owners) in [
        // Sorts before victim-pool: it used to become the victim's entry.
        (
            "a-pool",
            serde_json::json!({"wasmless.io/component": "pool-entry", "wasmless.io/function": "victim"}),
            serde_json::json!([owner]),
        ),
        (
            "thief-pool",
            serde_json::json!({"wasmless.io/component": "pool-entry", "wasmless.io/function": "thief"}),
            serde_json::json!([]),
        ),
    ] {
        namespace
            .apply(serde_json::json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
                "data": {"entry.json": forged.to_string()},
            }))
            .await;
    }
    let mut foreign = args.clone();
    foreign.extend([
        "--outbound-ca".to_string(),
        "/etc/ssl/certs/ca-certificates.crt".to_string(),
    ]);
    namespace.write_entry("victim", port, &foreign, Some("forged")).await;

    eventually("/pool names every forgery", || async {
        let status = pool_status(&pool).await;
        let error = |key: &str| status[key]["error"].as_str().unwrap_or_default().to_string();
        error("ConfigMap a-pool").contains("which is victim-pool")
            && error("thief").contains("not controlled by Function thief")
            && error("victim").contains("--outbound-ca")
    })
    .await;
    for _ in 0..5 {
        assert_eq!(greeting(port).await.as_deref(), Some("victim's"));
    }
    let status = pool_status(&pool).await;
    assert_eq!(status["victim"]["listening"], true, "{status}");
    assert_eq!(status["thief"]["listening"], false, "{status}");
}
