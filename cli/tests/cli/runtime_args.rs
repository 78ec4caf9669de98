//! The contract between operator and runtime pod, checked from both ends: the arguments the
//! operator's `runtime_args` writes into the pod template, parsed by the runtime's own
//! `Config`. Here because this crate depends on both (the operator must not link the runtime).

use clap::Parser;
use serde_json::json;
use std::time::Duration;
use wasmless_artifact::{Digest, ports};
use wasmless_host::limits::Isolation;
use wasmless_operator::Function;
use wasmless_operator::module::{Code, Module, ModuleLocation};
use wasmless_operator::objects::{DRAIN_DELAY_SECONDS, SHUTDOWN_GRACE_SECONDS, runtime_args};
use wasmless_runtime::config::Config;

fn function(spec: serde_json::Value) -> Function {
    serde_json::from_value(json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "metadata": {"name": "hello", "namespace": "default"},
        "spec": spec,
    }))
    .unwrap()
}

fn parse(args: Vec<String>) -> Config {
    Config::try_parse_from(std::iter::once("wasmless-runtime".to_string()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("the runtime refuses the operator's arguments {args:?}: {e}"))
}

#[test]
fn the_runtime_parses_what_the_operator_writes_for_a_module_in_configmaps() {
    let func = function(json!({
        "language": "go",
        "source": "package handlers",
        "env": [{"name": "GREETING", "value": "hi=there"}, {"name": "EMPTY"}],
        "limits": {"memory": "128Mi", "timeout": "5s", "maxConcurrency": 16, "maxRequestBody": "2Mi", "isolation": "shared"},
    }));
    let module = Module {
        digest: Digest::of(b"module"),
        size: Some(10),
        source_digest: Digest::of(b"source"),
        location: ModuleLocation::ConfigMaps { count: 2 },
        code: Some(Code {
            digest: Digest::of(b"code"),
            chunks: 3,
        }),
    };
    let config = parse(runtime_args(&func, &module));
    assert_eq!(config.module.as_deref(), Some("/module"));
    assert_eq!(config.module_digest, Some(module.digest));
    assert_eq!(
        config.code.as_deref(),
        Some("/module"),
        "the code is in the same volume"
    );
    assert_eq!(config.code_digest, Some(Digest::of(b"code")));
    assert_eq!(config.function, "hello");
    assert_eq!((config.port, config.admin_port), (ports::HTTP, ports::ADMIN));
    assert_eq!(config.memory_limit, 128 << 20);
    assert_eq!(config.timeout, Duration::from_secs(5));
    assert_eq!(config.max_concurrency, 16);
    assert_eq!(config.max_request_body, 2 << 20);
    assert_eq!(config.isolation, Isolation::Shared);
    // The handler's environment is the container's `WASMLESS_HANDLER_ENV_*` variables
    // (values from Secrets included), never arguments.
    assert!(config.env.is_empty(), "{:?}", config.env);
    assert_eq!(config.cache_dir.as_deref(), Some(std::path::Path::new("/cache")));
    assert_eq!(config.watch_interval, Duration::ZERO, "a pinned module is not watched");
    assert_eq!(config.drain_delay, Duration::from_secs(DRAIN_DELAY_SECONDS as u64));
    assert_eq!(
        config.shutdown_grace,
        Duration::from_secs(SHUTDOWN_GRACE_SECONDS as u64)
    );
}

#[test]
fn the_runtime_parses_what_the_operator_writes_for_a_module_in_a_registry() {
    let func = function(json!({"language": "rust", "source": "pub fn handler() {}"}));
    let reference = format!("registry.local:5000/fns/hello@{}", Digest::of(b"manifest"));
    let module = Module {
        digest: Digest::of(b"module"),
        size: None,
        source_digest: Digest::of(b"source"),
        location: ModuleLocation::Oci {
            reference: reference.clone(),
        },
        code: None,
    };
    let config = parse(runtime_args(&func, &module));
    assert_eq!(config.module, Some(format!("oci://{reference}")));
    assert_eq!((config.code, config.code_digest), (None, None));
    assert_eq!(
        config.isolation,
        Isolation::Request,
        "the runtime's default, not written"
    );
    assert!(config.env.is_empty());
    assert_eq!(config.timeout, Duration::from_secs(10));
    assert_eq!(config.max_concurrency, 64);
}

#[test]
fn the_runtime_builds_the_outbound_policy_the_operator_writes() {
    use wasmless_host::metrics::Metrics;
    use wasmless_outbound::{Outbound, parse_injected_header};
    let func = function(json!({
        "language": "go",
        "source": "package handlers",
        "outbound": {
            "allow": ["http://b.default.svc.cluster.local:8080", "https://*.example.com", "https://api.example.com", "http://10.0.0.7:*"],
            "timeout": "2s",
            "maxResponseBody": "1Mi",
            "maxConcurrency": 8,
            "headers": [{"url": "https://api.example.com", "name": "Authorization",
                         "valueFrom": {"secretKeyRef": {"name": "api", "key": "bearer"}}}],
        },
    }));
    let module = Module {
        digest: Digest::of(b"module"),
        size: Some(10),
        source_digest: Digest::of(b"source"),
        location: ModuleLocation::ConfigMaps { count: 1 },
        code: None,
    };
    let config = parse(runtime_args(&func, &module));
    assert_eq!(config.outbound_allow.len(), 4);
    assert_eq!(config.outbound_timeout, Duration::from_secs(2));
    assert_eq!(config.outbound_max_response_body, 1 << 20);
    assert_eq!(config.outbound_max_concurrency, 8);
    // The header's value is in a variable of the container, filled from the Secret.
    let headers: Vec<_> = config
        .outbound_header
        .iter()
        .map(|text| {
            parse_injected_header(text, |name| {
                name.starts_with("WASMLESS_OUTBOUND_HEADER_")
                    .then(|| "Bearer x".to_string())
            })
            .unwrap_or_else(|e| panic!("{text:?}: {e}"))
        })
        .collect();
    assert_eq!(
        headers,
        [(
            "https://api.example.com".into(),
            "Authorization".into(),
            "Bearer x".into()
        )]
    );
    let outbound = wasmless_outbound::OutboundConfig {
        allow: config.outbound_allow.clone(),
        timeout: config.outbound_timeout,
        max_response_body: config.outbound_max_response_body,
        max_concurrency: config.outbound_max_concurrency,
        headers,
        admin_port: config.admin_port,
        pod_ip: None,
        extra_roots: Vec::new(),
    };
    let metrics = std::sync::Arc::new(Metrics::new("hello"));
    if let Err(error) = Outbound::new(&outbound, metrics) {
        panic!("the runtime refuses the operator's outbound policy: {error}");
    }
}

#[test]
fn the_runtime_parses_what_the_operator_writes_for_a_traffic_split() {
    use wasmless_operator::objects::{Share, split_args};
    let func = function(json!({"language": "go", "source": "package handlers", "limits": {"maxConcurrency": 8}}));
    let module = |name: &str, location| Module {
        digest: Digest::of(name.as_bytes()),
        size: None,
        source_digest: Digest::of(format!("source of {name}").as_bytes()),
        location,
        code: Some(Code {
            digest: Digest::of(format!("code of {name}").as_bytes()),
            chunks: 1,
        }),
    };
    let shares = [
        Share {
            revision: "hello-1".into(),
            module: module("v1", ModuleLocation::ConfigMaps { count: 1 }),
            percent: 90,
            tag: None,
        },
        Share {
            revision: "hello-2".into(),
            module: module(
                "v2",
                ModuleLocation::Oci {
                    reference: "registry.local/fn/hello@sha256:abc".into(),
                },
            ),
            percent: 10,
            tag: Some("canary".into()),
        },
    ];
    let config = parse(split_args(&func, &shares));
    assert_eq!(config.module, None, "a split names its modules in --traffic");
    assert_eq!(config.function, "hello");
    assert_eq!(
        config.max_concurrency, 8,
        "the Function's limits hold for every revision"
    );
    let traffic = config.traffic.expect("--traffic").0;
    assert_eq!(traffic.len(), 2);
    assert_eq!(
        (
            traffic[0].revision.as_str(),
            traffic[0].percent,
            traffic[0].tag.as_deref()
        ),
        ("hello-1", 90, None)
    );
    assert_eq!(traffic[0].module, "/revisions/hello-1");
    assert_eq!(traffic[0].code.as_deref(), Some("/revisions/hello-1"));
    assert_eq!(traffic[0].module_digest, Digest::of(b"v1").to_string());
    assert_eq!(traffic[0].code_digest, Some(Digest::of(b"code of v1").to_string()));
    assert_eq!(traffic[1].tag.as_deref(), Some("canary"));
    assert_eq!(traffic[1].module, "oci://registry.local/fn/hello@sha256:abc");
}

/// The operator's pods name no module on their command line: the runtime follows the
/// pod's `wasmless.io/routes` annotation through the first file `--traffic-file` names, and
/// its Function's routes ConfigMap through the second, whose routes document holds the same
/// list `--traffic` takes, each revision's directory mounted.
#[test]
fn the_runtime_follows_the_routes_the_operator_annotates() {
    use wasmless_operator::objects::{self, Serving, Share};
    let func = function(json!({"language": "go", "source": "package handlers"}));
    let module = |name: &str| Module {
        digest: Digest::of(name.as_bytes()),
        size: None,
        source_digest: Digest::of(format!("source of {name}").as_bytes()),
        location: ModuleLocation::ConfigMaps { count: 1 },
        code: None,
    };
    let serving = Serving {
        routes: vec![Share {
            revision: "hello-2".into(),
            module: module("v2"),
            percent: 100,
            tag: None,
        }],
        standby: Some(Share {
            revision: "hello-1".into(),
            module: module("v1"),
            percent: 0,
            tag: None,
        }),
        chunk_reader: Some(objects::chunk_reader_name("hello")),
    };
    let settings = wasmless_operator::Settings::new("runtime:1", "builder:1");
    let deployment = objects::deployment(&func, &settings, &serving, None);
    let template = deployment.spec.unwrap().template;
    let pod = template.spec.unwrap();
    let config = parse(pod.containers[0].args.clone().unwrap());
    let [file, function_file] = <[std::path::PathBuf; 2]>::try_from(config.traffic_file)
        .expect("two --traffic-files: the pod's own routes, then its Function's");
    assert_eq!(config.module, None);
    // The file is the downward API volume's item of the routes annotation.
    let volume = pod
        .volumes
        .clone()
        .unwrap()
        .into_iter()
        .find(|v| v.name == objects::ROUTES_VOLUME)
        .unwrap();
    let item = &volume.downward_api.unwrap().items.unwrap()[0];
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == objects::ROUTES_VOLUME)
        .unwrap();
    assert_eq!(file, std::path::Path::new(&mount.mount_path).join(&item.path));
    assert_eq!(
        item.field_ref.as_ref().unwrap().field_path,
        format!("metadata.annotations['{}']", objects::ROUTES_ANNOTATION)
    );
    // The second is the Function's routes ConfigMap, which holds a routes document.
    let volume = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| {
            v.config_map
                .as_ref()
                .is_some_and(|c| c.name == objects::routes_configmap_name("hello"))
        })
        .expect("the routes ConfigMap's volume");
    let mount = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume.name)
        .unwrap();
    assert!(function_file.starts_with(&mount.mount_path), "{function_file:?}");
    let configmap = objects::routes_configmap(
        &func,
        objects::routes_document(3, &deployment.metadata.annotations.unwrap()[objects::ROUTES_ANNOTATION]),
    );
    let key = function_file.file_name().unwrap().to_str().unwrap();
    let document = &configmap.data.unwrap()[key];
    let (chosen, problems) = wasmless_runtime::traffic_files::choose(&[(function_file.clone(), document.clone())]);
    assert!(problems.is_empty(), "{problems:?}");
    let chosen = chosen.expect("the runtime reads the routes document");
    assert_eq!(chosen.generation, 3);
    let traffic = wasmless_runtime::traffic::Traffic::parse(&chosen.routes)
        .expect("the runtime parses the routes")
        .0;
    assert_eq!(traffic.len(), 1);
    assert_eq!((traffic[0].revision.as_str(), traffic[0].percent), ("hello-2", 100));
    assert_eq!(traffic[0].module_digest, Digest::of(b"v2").to_string());
    // Both revisions' directories are mounted: the one serving and the standby.
    let mounts: Vec<&str> = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(mounts.contains(&traffic[0].module.as_str()), "{mounts:?}");
    assert!(mounts.contains(&"/revisions/hello-1"), "{mounts:?}");
    // A pod switched in place to a revision it has not mounted reads the same chunks the
    // builder wrote, through the API: the runtime takes the operator's `configmaps:` text.
    let reading = objects::routes_json_reading(&serving.routes, |_| false, "hello").expect("read through the API");
    let traffic = wasmless_runtime::traffic::Traffic::parse(&reading)
        .expect("the runtime parses it")
        .0;
    let wasmless_host::module_source::ModuleSource::ConfigMaps(chunks) =
        wasmless_host::module_source::ModuleSource::parse(&traffic[0].module).expect("a module source")
    else {
        panic!("not read through the API: {}", traffic[0].module);
    };
    assert_eq!(
        wasmless_artifact::Part::Module.configmap_names(&chunks.function, &chunks.source_digest, chunks.count),
        objects::chunk_configmap_names("hello", &serving.routes[0].module),
        "the chunks the runtime reads are the ones the chunk reader may get"
    );
    assert_eq!(
        objects::routes_json_reading(&serving.routes, |_| false, ""),
        None,
        "without the chunk reader a pod cannot have it"
    );
}
