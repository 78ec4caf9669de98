//! `wasmless dev` serves a Function with the flags the operator writes into its pods, and
//! the values the kubelet would resolve, given on the command line.

use super::cluster_values::{ClusterValues, ObjectKey};
use super::*;
use clap::Parser;
use serde_json::json;
use wasmless_artifact::Digest;
use wasmless_operator::module::{Code, Module, ModuleLocation};
use wasmless_runtime::Config;

fn function(spec: serde_json::Value) -> Function {
    serde_json::from_value(json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "metadata": {"name": "rates", "namespace": "default"},
        "spec": spec,
    }))
    .unwrap()
}

/// A Function that uses every setting the runtime takes from it.
fn everything() -> Function {
    function(json!({
        "language": "go",
        "source": "package handlers",
        "env": [
            {"name": "GREETING", "value": "costs $5, $(HOME) stays"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}},
        ],
        "envFrom": [{"prefix": "DB_", "secretRef": {"name": "db"}}],
        "limits": {"memory": "128Mi", "timeout": "3s", "maxConcurrency": 7, "maxRequestBody": "2Mi", "isolation": "shared"},
        "outbound": {
            "allow": ["http://127.0.0.1:18183", "https://*.example.com", "https://api.example.com"],
            "timeout": "2s",
            "maxResponseBody": "1Mi",
            "maxConcurrency": 3,
            "headers": [
                {"url": "https://api.example.com", "name": "Authorization",
                 "valueFrom": {"secretKeyRef": {"name": "api", "key": "bearer"}}},
                {"url": "http://127.0.0.1:18183", "name": "X-Key", "allowInsecure": true,
                 "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}},
            ],
            "caBundle": {"configMapKeyRef": {"name": "ca", "key": "ca.crt"}},
        },
        "scale": {"min": 0, "max": 3},
    }))
}

fn key(object: &str, key: &str, value: &str) -> ObjectKey {
    ObjectKey {
        object: object.into(),
        key: key.into(),
        value: value.into(),
    }
}

fn values() -> ClusterValues {
    ClusterValues {
        secrets: vec![
            key("api", "token", "t0k3n"),
            key("api", "bearer", "Bearer abc"),
            key("api", "key", "k3y"),
            key("db", "USER", "ada"),
            key("db", "PASSWORD", "s3cret"),
        ],
        config_maps: vec![key("ca", "ca.crt", "-----BEGIN CERTIFICATE-----\n")],
    }
}

/// `wasmless dev`'s arguments, as its command line gives them.
fn parse_dev<T: Into<std::ffi::OsString> + Clone>(args: impl IntoIterator<Item = T>) -> Result<DevArgs, clap::Error> {
    #[derive(clap::Parser)]
    struct Dev {
        #[command(flatten)]
        args: DevArgs,
    }
    Dev::try_parse_from(args).map(|dev| dev.args)
}

fn dev_args() -> DevArgs {
    parse_dev(["dev", "function.yaml", "--port", "18080", "--admin-port", "19090"]).unwrap()
}

/// The runtime flags that say where a pod keeps things, which differ by design.
fn placement_cleared(mut config: Config) -> Config {
    config.module = None;
    config.module_digest = None;
    config.code = None;
    config.code_digest = None;
    config.port = 0;
    config.admin_port = 0;
    config.bind = std::net::Ipv4Addr::UNSPECIFIED.into();
    config.cache_dir = None;
    config.watch_interval = Duration::ZERO;
    config.drain_delay = Duration::ZERO;
    config.shutdown_grace = Duration::ZERO;
    config.outbound_ca = config.outbound_ca.map(|_| PathBuf::from("ca"));
    config.environment = None;
    config
}

#[test]
fn dev_and_the_operator_give_the_runtime_the_same_function() {
    let resource = everything();
    let work = tempfile::tempdir().unwrap();
    let code = (work.path().join("module.cwasm.lz4"), Digest::of(b"code"));
    let ca_bundle = values().ca_bundle_file(&resource, work.path()).unwrap();
    let here = Here {
        module: &work.path().join("module.wasm"),
        code: &code,
        work: work.path(),
        ca_bundle: ca_bundle.as_deref(),
    };
    let dev = runtime_config(&dev_args(), &resource, &here).unwrap();

    let module = Module {
        digest: Digest::of(b"module"),
        size: Some(10),
        source_digest: Digest::of(b"source"),
        location: ModuleLocation::ConfigMaps { count: 1 },
        code: Some(Code {
            digest: Digest::of(b"code"),
            chunks: 1,
        }),
    };
    let pod_args = wasmless_operator::objects::runtime_args(&resource, &module);
    let pod = Config::try_parse_from(std::iter::once("wasmless-runtime".to_string()).chain(pod_args)).unwrap();

    // Here, the places are this machine's.
    assert_eq!((dev.port, dev.admin_port), (18080, 19090));
    assert_eq!(dev.bind, std::net::Ipv4Addr::LOCALHOST);
    assert_eq!(dev.outbound_ca.as_deref(), ca_bundle.as_deref());
    assert_eq!(
        dev.module_digest, None,
        "read from module.wasm.sha256, so a rebuild swaps in"
    );
    assert_eq!(
        std::fs::read_to_string(ca_bundle.unwrap()).unwrap(),
        "-----BEGIN CERTIFICATE-----\n"
    );
    // And the Function is the same one, to the last setting.
    assert_eq!(dev.outbound_allow.len(), 3);
    assert_eq!(dev.outbound_header.len(), 2);
    assert_eq!(dev.memory_limit, 128 << 20);
    assert_eq!(
        format!("{:#?}", placement_cleared(dev)),
        format!("{:#?}", placement_cleared(pod))
    );
}

#[test]
fn values_from_secrets_and_config_maps_are_resolved_as_the_kubelet_would() {
    let environment = values().environment(&everything()).unwrap();
    let env = |name: &str| {
        let found = environment.iter().rev().find(|(variable, _)| variable == name);
        found.map(|(_, value)| value.as_str())
    };
    // The handler's variables under the runtime's prefix, literal values exactly as written.
    assert_eq!(env("WASMLESS_HANDLER_ENV_GREETING"), Some("costs $5, $(HOME) stays"));
    assert_eq!(env("WASMLESS_HANDLER_ENV_TOKEN"), Some("t0k3n"));
    assert_eq!(env("WASMLESS_HANDLER_ENV_DB_USER"), Some("ada"));
    assert_eq!(env("WASMLESS_HANDLER_ENV_DB_PASSWORD"), Some("s3cret"));
    assert_eq!(env("WASMLESS_HANDLER_ENV_MODE"), None, "optional, and not given");
    // The headers' values where the runtime reads them, never the handler's.
    assert_eq!(env("WASMLESS_OUTBOUND_HEADER_0"), Some("Bearer abc"));
    assert_eq!(env("WASMLESS_OUTBOUND_HEADER_1"), Some("k3y"));

    // `env` wins over `envFrom`, as in a container.
    let resource = function(json!({
        "source": "package handlers",
        "env": [{"name": "USER", "value": "from env"}],
        "envFrom": [{"secretRef": {"name": "db"}}],
    }));
    let runtime = Config::try_parse_from(["wasmless-runtime", "--module", "m.wasm"]).unwrap();
    let handler = runtime.handler_env(values().environment(&resource).unwrap().into_iter());
    assert!(handler.contains(&("USER".into(), "from env".into())), "{handler:?}");
    assert!(handler.contains(&("PASSWORD".into(), "s3cret".into())), "{handler:?}");
}

#[test]
fn what_needs_a_cluster_is_an_error_that_names_the_flag_to_add() {
    let resource = everything();
    let cases = [
        (
            "api",
            "token",
            "spec.env TOKEN takes key token of Secret api",
            "--secret api/token=VALUE",
        ),
        (
            "api",
            "bearer",
            "spec.outbound.headers[0] (Authorization for https://api.example.com) takes key bearer of Secret api",
            "--secret api/bearer=VALUE",
        ),
        (
            "db",
            "USER",
            "spec.envFrom takes every key of Secret db",
            "--secret db/KEY=VALUE",
        ),
    ];
    for (object, missing, field, flag) in cases {
        let mut given = values();
        given
            .secrets
            .retain(|k| k.object != object || (object != "db" && k.key != missing));
        let error = given.environment(&resource).unwrap_err().to_string();
        assert!(error.contains(field) && error.contains(flag), "{error}");
    }
    let work = tempfile::tempdir().unwrap();
    let error = ClusterValues::default()
        .ca_bundle_file(&resource, work.path())
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("spec.outbound.caBundle") && error.contains("--config-map ca/ca.crt=@ca.pem"),
        "{error}"
    );
}

#[test]
fn a_value_is_given_as_name_key_and_value_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let pem = dir.path().join("ca.pem");
    std::fs::write(&pem, "PEM").unwrap();
    let args = parse_dev([
        "dev".to_string(),
        "f.yaml".into(),
        "--secret".into(),
        "api/token=a=b".into(),
        "--config-map".into(),
        format!("ca/ca.crt=@{}", pem.display()),
    ])
    .unwrap();
    assert_eq!(args.values.secrets, [key("api", "token", "a=b")]);
    assert_eq!(args.values.config_maps, [key("ca", "ca.crt", "PEM")]);
    for bad in ["api=token", "/token=x", "api/=x", "api/token"] {
        assert!(parse_dev(["dev", "f.yaml", "--secret", bad]).is_err(), "{bad}");
    }
}
