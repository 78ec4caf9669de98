//! The objects the operator writes, rendered for a few representative Functions and compared
//! byte for byte with `operator/tests/golden/`: a changed pod template restarts every pod of
//! every Function when the operator is upgraded, so a change there must be a decision.
//! `WASMLESS_BLESS=1 cargo test -p wasmless-operator --test operator golden` rewrites them.

use serde::Serialize;
use serde_json::json;
use wasmless_artifact::Digest;
use wasmless_operator::Settings;
use wasmless_operator::crd::{Function, Storage};
use wasmless_operator::module::{Code, Module, ModuleLocation};
use wasmless_operator::settings::BuildCache;
use wasmless_operator::{objects, references};

fn function(spec: serde_json::Value) -> Function {
    serde_json::from_value(json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "metadata": {"name": "hello", "namespace": "shop", "uid": "5f0c6a8e-0000-4000-8000-000000000001"},
        "spec": spec,
    }))
    .expect("a Function")
}

fn digest(text: &str) -> Digest {
    Digest::of(text.as_bytes())
}

/// Every object of one Function, as YAML documents in a fixed order.
fn render(func: &Function, settings: &Settings, module: &Module, storage: Storage) -> String {
    fn doc(out: &mut String, title: &str, object: &impl Serialize) {
        out.push_str(&format!("# {title}\n"));
        out.push_str(&serde_yaml::to_string(object).expect("YAML"));
        out.push_str("---\n");
    }
    let source = func.spec.inline_source().unwrap_or_default();
    let source_digest = objects::spec_source_digest(func, &settings.builder_version);
    let mut out = String::new();
    if func.spec.module.is_none() {
        doc(
            &mut out,
            "source ConfigMap",
            &objects::source_configmap(func, source, &source_digest),
        );
        let publish = objects::publish_target(func, storage, settings, &source_digest).expect("a publish target");
        doc(
            &mut out,
            "build Job",
            &objects::build_job(func, settings, &source_digest, &publish),
        );
    }
    // Every Secret and ConfigMap the pods read, at resourceVersion 1.
    let read = references::references(&func.spec);
    let config_hash = references::config_hash(read.iter().map(|reference| (reference, Some("1"))));
    doc(
        &mut out,
        "Deployment",
        &objects::deployment(func, settings, &serving(module), config_hash.as_ref()),
    );
    doc(
        &mut out,
        "routes ConfigMap",
        &objects::routes_configmap(
            func,
            objects::routes_document(1, &objects::routes_json(&serving(module).routes)),
        ),
    );
    doc(&mut out, "Service", &objects::service(func, objects::Route::Pods));
    let (account, role, binding) = objects::builder_rbac("shop");
    doc(&mut out, "builder ServiceAccount", &account);
    doc(&mut out, "builder Role", &role);
    doc(&mut out, "builder RoleBinding", &binding);
    let serving = serving(module);
    if serving.chunk_reader.is_some() {
        let chunks = serving
            .routes
            .iter()
            .chain(serving.standby.iter())
            .flat_map(|share| objects::chunk_configmap_names("hello", &share.module))
            .collect();
        let (account, role, binding) = objects::chunk_reader_rbac(func, &chunks);
        doc(&mut out, "chunk reader ServiceAccount", &account);
        doc(&mut out, "chunk reader Role", &role);
        doc(&mut out, "chunk reader RoleBinding", &binding);
    }
    out
}

/// `module` alone, as revision `hello-2`, with `hello-1` (the same module, in ConfigMaps)
/// mounted beside it for a rollback in place.
fn serving(module: &Module) -> objects::Serving {
    let share = |revision: &str, percent| objects::Share {
        revision: revision.into(),
        module: module.clone(),
        percent,
        tag: None,
    };
    objects::Serving {
        routes: vec![share("hello-2", 100)],
        standby: Some(share("hello-1", 0)).filter(|_| matches!(module.location, ModuleLocation::ConfigMaps { .. })),
        chunk_reader: matches!(module.location, ModuleLocation::ConfigMaps { .. })
            .then(|| objects::chunk_reader_name("hello")),
    }
}

fn check(name: &str, rendered: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/golden/{name}.yaml"));
    if std::env::var_os("WASMLESS_BLESS").is_some() {
        std::fs::write(&path, rendered).expect("writing the golden file");
        return;
    }
    let golden = std::fs::read_to_string(&path).unwrap_or_default();
    if golden != rendered {
        let line = golden
            .lines()
            .zip(rendered.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(golden.lines().count().min(rendered.lines().count()));
        panic!(
            "{} differs from what the operator renders, first at line {}:\n  golden:   {:?}\n  rendered: {:?}\n\
             A changed pod template restarts every pod on upgrade; if that is meant, rewrite it with WASMLESS_BLESS=1.",
            path.display(),
            line + 1,
            golden.lines().nth(line),
            rendered.lines().nth(line)
        );
    }
}

/// A Go function in ConfigMaps, with compiled code, env, shared isolation, its own Service
/// name and port, container resources, and an operator told of a plain-HTTP registry.
#[test]
fn golden_go_function_in_configmaps_with_code() {
    let func = function(json!({
        "language": "go",
        "source": "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(\"This works!\")) }\n",
        "service": "greeter",
        "serverPort": 9000,
        "replicas": 3,
        "env": [{"name": "GREETING", "value": "hi"}, {"name": "EMPTY"}],
        "limits": {"memory": "128Mi", "timeout": "5s", "maxConcurrency": 16, "maxRequestBody": "2Mi", "isolation": "shared"},
        "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
    }));
    let mut settings = Settings::new("wasmless/runtime:1.2.3", "wasmless/builder:1.2.3");
    settings.oci_plain_http = Some("registry.local:5000".into());
    let source_digest = objects::source_digest(
        func.spec.language,
        &settings.builder_version,
        func.spec.inline_source().unwrap(),
    );
    let module = Module {
        digest: digest("module"),
        size: Some(5_812_345),
        source_digest,
        location: ModuleLocation::ConfigMaps { count: 2 },
        code: Some(Code {
            digest: digest("code"),
            chunks: 7,
        }),
    };
    check(
        "go-configmaps-code",
        &render(&func, &settings, &module, Storage::ConfigMap),
    );
}

/// A Rust function in an OCI registry, with code as a layer of the artifact, and defaults
/// everywhere else.
#[test]
fn golden_rust_function_in_oci() {
    let func = function(json!({
        "language": "rust",
        "source": "use wasmless_sdk::{Request, Response};\n\npub fn handler(_: Request) -> Response { Response::new(\"hi\".into()) }\n",
        "storage": "oci",
    }));
    let mut settings = Settings::new("wasmless/runtime:1.2.3", "wasmless/builder:1.2.3");
    settings.default_storage = Storage::Oci;
    settings.oci_registry = Some("registry.local:5000/functions/".into());
    // The persistent build cache on a PersistentVolumeClaim (the others: a node directory, none).
    settings.build_cache = BuildCache::Claim("wasmless-build-cache".into());
    // Traces on: the pods are told the collector.
    settings.otlp_endpoint = Some("http://otel-collector.observability:4318".into());
    let source_digest = objects::source_digest(
        func.spec.language,
        &settings.builder_version,
        func.spec.inline_source().unwrap(),
    );
    let module = Module {
        digest: digest("rust module"),
        size: Some(81_234),
        source_digest,
        location: ModuleLocation::Oci {
            reference: format!("registry.local:5000/functions/shop/hello@{}", digest("manifest")),
        },
        code: Some(Code {
            digest: digest("rust code"),
            chunks: 0,
        }),
    };
    check("rust-oci-code", &render(&func, &settings, &module, Storage::Oci));
}

/// A prebuilt module (nothing to build, no code), and a WAT build of before compiled code
/// (chunks without code): the two templates older operators wrote.
#[test]
fn golden_prebuilt_and_codeless_modules() {
    let prebuilt_digest = digest("prebuilt");
    let func = function(json!({
        "language": "wasm",
        "module": {"image": format!("registry.example.com/fns/hello@{}", digest("prebuilt manifest")), "digest": prebuilt_digest.to_string()},
        "replicas": 0,
    }));
    let mut settings = Settings::new("wasmless/runtime:1.2.3", "wasmless/builder:1.2.3");
    // No persistent build cache: the build Job is the one operators wrote before it.
    settings.build_cache = BuildCache::None;
    let module = Module {
        digest: prebuilt_digest,
        size: None,
        source_digest: prebuilt_digest,
        location: ModuleLocation::Oci {
            reference: func.spec.module.as_ref().unwrap().image.clone(),
        },
        code: None,
    };
    check("wasm-prebuilt", &render(&func, &settings, &module, Storage::ConfigMap));

    let func = function(json!({
        "language": "wat",
        "source": "(module (memory (export \"memory\") 1) (func (export \"_start\")))",
        "limits": {"isolation": "request"},
    }));
    let source_digest = objects::source_digest(
        func.spec.language,
        &settings.builder_version,
        func.spec.inline_source().unwrap(),
    );
    let module = Module {
        digest: digest("wat module"),
        size: Some(64),
        source_digest,
        location: ModuleLocation::ConfigMaps { count: 1 },
        code: None,
    };
    check(
        "wat-configmaps-no-code",
        &render(&func, &settings, &module, Storage::ConfigMap),
    );
}

/// A Go function whose environment comes from Secrets and ConfigMaps (a literal value with
/// `$` in it too), and that may call out, with a header from a Secret and an internal CA
/// from a ConfigMap.
#[test]
fn golden_go_function_with_secrets_and_outbound() {
    let func = function(json!({
        "source": "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(\"This works!\")) }\n",
        "env": [
            {"name": "PRICE", "value": "$(NOT_EXPANDED) costs 5$"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}},
        ],
        "envFrom": [{"secretRef": {"name": "more"}}, {"configMapRef": {"name": "cfg", "optional": true}, "prefix": "CFG_"}],
        "outbound": {
            "allow": ["http://b.shop.svc.cluster.local:8080", "https://*.example.com", "https://api.example.com"],
            "timeout": "2s",
            "headers": [{"url": "https://api.example.com", "name": "Authorization",
                         "valueFrom": {"secretKeyRef": {"name": "api", "key": "bearer"}}}],
            "caBundle": {"configMapKeyRef": {"name": "internal-ca", "key": "ca.crt"}},
        },
    }));
    let settings = Settings::new("wasmless/runtime:1.2.3", "wasmless/builder:1.2.3");
    let source_digest = objects::source_digest(
        func.spec.language,
        &settings.builder_version,
        func.spec.inline_source().unwrap(),
    );
    let module = Module {
        digest: digest("module"),
        size: Some(5_812_345),
        source_digest,
        location: ModuleLocation::ConfigMaps { count: 1 },
        code: None,
    };
    check(
        "go-secrets-outbound",
        &render(&func, &settings, &module, Storage::ConfigMap),
    );
}

/// A Go function with its own go.mod and go.sum, and an operator with a Go module proxy:
/// every file in the source ConfigMap and mounted in the build Job, which builds the
/// directory with the proxy named.
#[test]
fn golden_go_function_with_modules() {
    let func = function(json!({
        "language": "go",
        "source": "package handlers\n\nimport (\n\t\"net/http\"\n\n\t\"github.com/google/uuid\"\n)\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(uuid.NewString())) }\n",
        "files": {
            "go.mod": "module example.com/uuidfn\n\ngo 1.21\n\nrequire github.com/google/uuid v1.6.0\n",
            "go.sum": "github.com/google/uuid v1.6.0 h1:NIvaJDMOsjHA8n1jAhLSgzrAzy1Hgr+hNrb57e+94F0=\ngithub.com/google/uuid v1.6.0/go.mod h1:TIyPZe4MgqvfeYDBFedMoGGpEw/LqOeaOT+nhxU+yHo=\n",
        },
    }));
    let mut settings = Settings::new("wasmless/runtime:1.2.3", "wasmless/builder:1.2.3");
    settings.go_proxy = Some("http://athens.wasmless-system.svc:3000".into());
    let source_digest = objects::spec_source_digest(&func, &settings.builder_version);
    // The digest the builder computes over the directory the Job mounts.
    let files = [
        ("handler.go", func.spec.source.as_deref().unwrap().as_bytes()),
        ("go.mod", func.spec.files["go.mod"].as_bytes()),
        ("go.sum", func.spec.files["go.sum"].as_bytes()),
    ];
    assert_eq!(
        source_digest,
        wasmless_formats::source::files_digest("go", &settings.builder_version, &files)
    );
    let mut changed = func.clone();
    changed.spec.files.insert("go.sum".into(), String::new());
    assert_ne!(
        objects::spec_source_digest(&changed, &settings.builder_version),
        source_digest
    );
    let module = Module {
        digest: digest("uuid module"),
        size: Some(6_345_678),
        source_digest,
        location: ModuleLocation::ConfigMaps { count: 2 },
        code: Some(Code {
            digest: digest("uuid code"),
            chunks: 3,
        }),
    };
    check("go-modules", &render(&func, &settings, &module, Storage::ConfigMap));
}

/// `--build-cache`: a node directory, a claim, or none; anything else is refused with the
/// forms it takes.
#[test]
fn the_build_cache_setting_takes_a_node_directory_a_claim_or_none() {
    let parse = |value: &str| value.parse::<BuildCache>();
    assert_eq!(
        parse("hostPath:/var/cache/wl"),
        Ok(BuildCache::HostPath("/var/cache/wl".into()))
    );
    assert_eq!(parse("pvc:build-cache"), Ok(BuildCache::Claim("build-cache".into())));
    assert_eq!(parse("none"), Ok(BuildCache::None));
    for bad in [
        "hostPath:relative/dir",
        "hostPath:/a/../etc",
        "pvc:Not_A_Name",
        "pvc:",
        "/var/cache",
        "",
    ] {
        let error = parse(bad).expect_err(bad);
        assert!(
            error.contains("hostPath:/absolute/dir, pvc:<claim name> or none"),
            "{bad}: {error}"
        );
    }
    assert_eq!(
        Settings::new("r", "b").build_cache,
        BuildCache::HostPath(wasmless_operator::settings::DEFAULT_BUILD_CACHE_PATH.into()),
        "a warm cache on the node by default"
    );
}

/// A Rust function with its own Cargo.toml and Cargo.lock, and an operator with a crates
/// registry: both files in the source ConfigMap and mounted in the build Job, which builds
/// the directory with the registry named.
#[test]
fn golden_rust_function_with_crates() {
    let func = function(json!({
        "language": "rust",
        "source": "use wasmless_sdk::{Request, Response};\n\npub fn handler(r: Request) -> Response {\n    let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap_or_default();\n    Response::new(v.to_string().into_bytes())\n}\n",
        "files": {
            "Cargo.toml": "[package]\nname = \"echo-json\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[dependencies]\nserde_json = \"1\"\n",
            "Cargo.lock": "version = 4\n",
        },
    }));
    let mut settings = Settings::new("wasmless/runtime:1.2.3", "wasmless/builder:1.2.3");
    settings.cargo_registry = Some("sparse+http://crates.wasmless-system.svc:8080/index/".into());
    let source_digest = objects::spec_source_digest(&func, &settings.builder_version);
    let files = [
        ("lib.rs", func.spec.source.as_deref().unwrap().as_bytes()),
        ("Cargo.toml", func.spec.files["Cargo.toml"].as_bytes()),
        ("Cargo.lock", func.spec.files["Cargo.lock"].as_bytes()),
    ];
    assert_eq!(
        source_digest,
        wasmless_formats::source::files_digest("rust", &settings.builder_version, &files),
        "the digest the builder computes over the directory the Job mounts"
    );
    let module = Module {
        digest: digest("crates module"),
        size: Some(181_234),
        source_digest,
        location: ModuleLocation::ConfigMaps { count: 1 },
        code: Some(Code {
            digest: digest("crates code"),
            chunks: 1,
        }),
    };
    check("rust-crates", &render(&func, &settings, &module, Storage::ConfigMap));
}

/// A Go function with `scale.min: 0`, in ConfigMaps with code: its entry in the pool's
/// table (the module and code read from the API, its env's Secrets and ConfigMaps named,
/// never read), its Service while the pool serves it, and the namespace's pool with its
/// identity, which may read the Secrets pooled Functions name.
#[test]
fn golden_go_function_served_by_the_pool() {
    let func = function(json!({
        "language": "go",
        "source": "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(\"idle\")) }\n",
        "env": [
            {"name": "GREETING", "value": "hi $(HOME)"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "prices-api", "key": "token"}}},
        ],
        "envFrom": [{"configMapRef": {"name": "shop-settings"}, "prefix": "SHOP_"}],
        "scale": {"min": 0, "max": 4, "targetConcurrency": 20, "idleTimeout": "30s"},
        "outbound": {
            "allow": ["http://prices.shop.svc.cluster.local:8080"],
            "headers": [{"url": "http://prices.shop.svc.cluster.local:8080", "name": "Authorization",
                         "allowInsecure": true,
                         "valueFrom": {"secretKeyRef": {"name": "prices-auth", "key": "bearer"}}}],
        },
    }));
    let mut settings = Settings::new("wasmless/runtime:1.2.3", "wasmless/builder:1.2.3");
    // Traces on: the pool is told the collector, as a Function's own pods are.
    settings.otlp_endpoint = Some("http://otel-collector.observability:4318".into());
    let source_digest = objects::spec_source_digest(&func, &settings.builder_version);
    let module = Module {
        digest: digest("module"),
        size: Some(5_812_345),
        source_digest,
        location: ModuleLocation::ConfigMaps { count: 2 },
        code: Some(Code {
            digest: digest("code"),
            chunks: 7,
        }),
    };
    let mut out = String::new();
    let mut doc = |title: &str, object: &dyn erased::Yaml| {
        out.push_str(&format!("# {title}\n{}---\n", object.yaml()));
    };
    let port = objects::free_pool_port("hello", &Default::default()).expect("a free port");
    doc(
        "pool entry ConfigMap",
        &objects::pool_entry(&func, &module, port, false, Some(&digest("config versions"))),
    );
    doc(
        "Service, routed to the pool",
        &objects::service(&func, objects::Route::Pool { port }),
    );
    doc("pool Deployment", &objects::pool_deployment("shop", &settings));
    let secrets = ["prices-api", "prices-auth"].map(String::from).into();
    let (account, role, binding) = objects::pool_rbac("shop", &secrets);
    doc("pool ServiceAccount", &account);
    doc("pool Role", &role);
    doc("pool RoleBinding", &binding);
    check("go-pooled", &out);
}

/// Serializing objects of different types through one closure.
mod erased {
    pub trait Yaml {
        fn yaml(&self) -> String;
    }
    impl<T: serde::Serialize> Yaml for T {
        fn yaml(&self) -> String {
            serde_yaml::to_string(self).expect("YAML")
        }
    }
}
