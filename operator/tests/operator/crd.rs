//! The CRD: its CEL rules and schema bounds evaluated client-side, printer columns, and
//! the committed `crds/function.yaml`.

use crate::harness::*;
use kube::CustomResourceExt;
use serde_json::{Value, json};
use wasmless_artifact::Digest;
use wasmless_operator::crd::Function;

#[test]
fn committed_crd_matches_the_rust_types() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/function.yaml");
    let committed = std::fs::read_to_string(path).expect("crds/function.yaml");
    assert!(
        committed == wasmless_operator::crd_yaml(),
        "crds/function.yaml is stale: run `cargo run -p wasmless-operator --bin crdgen`"
    );
}

/// The reference page is the CRD's schema, so it says what the API server checks.
#[test]
fn committed_reference_matches_the_crds_schema() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/function.md");
    let committed = std::fs::read_to_string(path).expect("docs/reference/function.md");
    let written = wasmless_operator::crd::reference_markdown();
    assert!(
        committed == written,
        "docs/reference/function.md is stale: run `cargo run -p wasmless-operator --bin crdgen -- --reference`"
    );
    // Every field of the schema has its row, with its bounds.
    for row in [
        "| `spec.limits.memory` | string | `64Mi` | length ≤ 32, pattern `^[0-9]+(Ki\\|Mi\\|Gi)?$` |",
        "| `spec.limits.maxConcurrency` | integer | `64` | min 1, max 10000 |",
        "| `spec.outbound.allow` | array of string |",
        "| `spec.language` | string: `go` \\| `rust` \\| `wat` \\| `wasm` | `go` |",
        "| `spec.module.digest` | string |  | required, pattern `^sha256:[0-9a-f]{64}$` |",
        "| `status.phase` |",
    ] {
        assert!(written.contains(row), "no {row} in:\n{written}");
    }
    assert!(written.contains("exactly one of source, function (the Goless field) or module must be set"));
}

fn spec_schema() -> Value {
    let crd = serde_json::to_value(Function::crd()).unwrap();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema").unwrap().clone()
}

/// Runs the CRD's CEL rules on a Function the way the API server does on create.
fn cel_errors(spec: Value) -> Vec<String> {
    cel_errors_named("hello", spec)
}

fn cel_errors_named(name: &str, spec: Value) -> Vec<String> {
    let object =
        json!({"apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": name}, "spec": spec});
    match kube::core::cel::Validator::new().validate(&spec_schema(), &object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.into_iter().map(|e| e.message).collect(),
    }
}

/// The structural checks of the schema (enum, bounds, lengths) the API server applies before CEL.
fn schema_errors(schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        errors.push(format!("{path}: {value} is not one of {options:?}"));
    }
    if let Some(n) = value.as_f64() {
        if schema.get("minimum").and_then(Value::as_f64).is_some_and(|m| n < m) {
            errors.push(format!("{path}: {n} is below the minimum"));
        }
        if schema.get("maximum").and_then(Value::as_f64).is_some_and(|m| n > m) {
            errors.push(format!("{path}: {n} is above the maximum"));
        }
    }
    if let Some(s) = value.as_str() {
        let chars = s.chars().count() as u64;
        if schema
            .get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| chars > m)
        {
            errors.push(format!("{path}: longer than maxLength"));
        }
        if schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| chars < m)
        {
            errors.push(format!("{path}: shorter than minLength"));
        }
    }
    if let (Some(pattern), Some(s)) = (schema.get("pattern").and_then(Value::as_str), value.as_str())
        && !regex::Regex::new(pattern).unwrap().is_match(s)
    {
        errors.push(format!("{path}: {s:?} does not match {pattern}"));
    }
    if let Some(items) = value.as_array() {
        if schema
            .get("maxItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| items.len() as u64 > m)
        {
            errors.push(format!("{path}: more items than maxItems"));
        }
        if schema
            .get("minItems")
            .and_then(Value::as_u64)
            .is_some_and(|m| (items.len() as u64) < m)
        {
            errors.push(format!("{path}: fewer items than minItems"));
        }
        if let Some(item_schema) = schema.get("items") {
            for (index, item) in items.iter().enumerate() {
                errors.extend(schema_errors(item_schema, item, &format!("{path}[{index}]")));
            }
        }
    }
    if let Some(object) = value.as_object() {
        for required in schema.get("required").and_then(Value::as_array).into_iter().flatten() {
            if !object.contains_key(required.as_str().unwrap()) {
                errors.push(format!("{path}: {} is required", required.as_str().unwrap()));
            }
        }
    }
    if let (Some(properties), Some(object)) = (schema.get("properties"), value.as_object()) {
        for (key, field) in object {
            if let Some(field_schema) = properties.get(key) {
                errors.extend(schema_errors(field_schema, field, &format!("{path}.{key}")));
            }
        }
    }
    errors
}

fn refused(spec: Value) -> Vec<String> {
    let object = json!({"metadata": {"name": "hello"}, "spec": spec.clone()});
    let mut errors = schema_errors(&spec_schema(), &object, "");
    errors.extend(cel_errors(spec));
    errors
}

#[test]
fn crd_accepts_goless_and_rust_functions() {
    assert_eq!(refused(json!({"source": HELLO})), Vec::<String>::new());
    assert_eq!(
        refused(json!({"function": HELLO, "service": "hello", "serverPort": 9000})),
        Vec::<String>::new()
    );
    assert_eq!(
        refused(json!({"language": "rust", "source": "fn x() {}"})),
        Vec::<String>::new()
    );
    let digest = Digest::of(b"m").to_string();
    assert_eq!(
        refused(json!({"language": "wasm", "module": {"image": "r.local/x", "digest": digest}})),
        Vec::<String>::new()
    );
}

#[test]
fn every_example_function_is_accepted() {
    let examples = std::fs::read_dir(repo_root().join("examples")).unwrap();
    let mut checked = 0;
    for example in examples.flatten() {
        let path = example.path().join("function.yaml");
        let yaml: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(yaml["apiVersion"], "wasmless.io/v1alpha1", "{}", path.display());
        assert_eq!(yaml["kind"], "Function", "{}", path.display());
        assert_eq!(
            refused(yaml["spec"].clone()),
            Vec::<String>::new(),
            "{}",
            path.display()
        );
        serde_json::from_value::<wasmless_operator::Function>(yaml.clone())
            .unwrap_or_else(|e| panic!("{} does not parse as a Function: {e}", path.display()));
        checked += 1;
    }
    assert!(checked >= 5, "the examples are there: {checked}");
}

#[test]
fn crd_refuses_bad_functions() {
    let digest = Digest::of(b"m").to_string();
    let cases = [
        (json!({"language": "cobol", "source": HELLO}), "is not one of"),
        (json!({"source": ""}), "shorter than minLength"),
        (json!({"source": "x".repeat(512 * 1024 + 1)}), "source is over 512 KiB"),
        (json!({}), "exactly one of source"),
        (json!({"source": HELLO, "function": HELLO}), "exactly one of source"),
        (
            json!({"language": "wasm", "source": HELLO, "module": {"image": "r/x", "digest": digest}}),
            "exactly one of source",
        ),
        (json!({"source": HELLO, "serverPort": 70000}), "above the maximum"),
        (json!({"source": HELLO, "serverPort": 0}), "below the minimum"),
        (json!({"source": HELLO, "replicas": -1}), "below the minimum"),
        (
            json!({"module": {"image": "r/x", "digest": digest}}),
            "set language: wasm",
        ),
        (json!({"language": "wasm", "source": HELLO}), "takes a prebuilt module"),
        (
            json!({"source": HELLO, "limits": {"isolation": "process"}}),
            "is not one of",
        ),
        (
            json!({"source": HELLO, "traffic": [{"revision": "hello-1", "latestRevision": true, "percent": 100}]}),
            "one of the two",
        ),
        (
            json!({"source": HELLO, "traffic": [{"percent": 100}]}),
            "one of the two",
        ),
        (
            json!({"source": HELLO, "traffic": [{"revision": "hello-1", "percent": 90, "tag": "Canary!"}]}),
            "does not match",
        ),
        (
            json!({"source": HELLO, "traffic": (1..=11).map(|n| json!({"revision": format!("hello-{n}"), "percent": 1})).collect::<Vec<_>>()}),
            "more items than maxItems",
        ),
        (json!({"source": HELLO, "revisionHistoryLimit": 0}), "below the minimum"),
    ];
    for (spec, expected) in cases {
        let errors = refused(spec.clone());
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{spec:.80}: expected {expected:?}, got {errors:?}"
        );
    }
}

#[test]
fn crd_accepts_a_rollback_and_the_latest_written_out() {
    for traffic in [
        json!([{"revision": "hello-2", "percent": 100}]),
        json!([{"latestRevision": true, "percent": 100}]),
        json!([{"revision": "hello-1", "percent": 90}, {"latestRevision": true, "percent": 10, "tag": "canary"}]),
    ] {
        assert_eq!(
            refused(json!({"source": HELLO, "traffic": traffic})),
            Vec::<String>::new(),
            "{traffic}"
        );
    }
}

#[test]
fn crd_refuses_names_that_cannot_name_a_build_job() {
    let spec = json!({"source": HELLO});
    assert_eq!(cel_errors_named(&"a".repeat(46), spec.clone()), Vec::<String>::new());
    for name in ["a".repeat(47), "9lives".to_string(), "dotted.name".to_string()] {
        let errors = cel_errors_named(&name, spec.clone());
        assert!(
            errors.iter().any(|e| e.contains("at most 46 characters")),
            "{name}: {errors:?}"
        );
    }
}

/// `wasmless-events` may write the status subresource; its admission policy refuses a
/// change of any field but the triggers' progress, by naming each of the operator's
/// fields: a field added to the status and not to the policy would be the component's to
/// forge (status.revisions says what a rollback serves).
#[test]
fn the_events_components_status_writes_are_held_to_the_triggers_by_every_other_field() {
    let properties = spec_schema()
        .pointer("/properties/status/properties")
        .and_then(Value::as_object)
        .expect("the status schema's properties")
        .keys()
        .cloned()
        .collect::<Vec<_>>();
    assert!(properties.contains(&"revisions".to_string()));
    for policy in [
        "/../deploy/events/admission.yaml",
        "/../deploy/helm/wasmless/templates/events.yaml",
    ] {
        let text = std::fs::read_to_string(format!("{}{policy}", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let compared = text.matches(" == oldObject.?status.?").count();
        for field in &properties {
            let kept = format!("object.?status.?{field} == oldObject.?status.?{field}");
            match field.as_str() {
                "triggers" | "triggersSummary" => assert!(!text.contains(&kept), "{policy} holds {field}"),
                _ => assert!(
                    text.contains(&kept),
                    "{policy} does not hold status.{field}: add `{kept}`"
                ),
            }
        }
        assert_eq!(
            compared,
            properties.len() - 2,
            "{policy} compares a field the status lacks"
        );
    }
}

#[test]
fn crd_has_printer_columns_short_name_and_status() {
    let crd = Function::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["fn".to_string()]));
    let version = &crd.spec.versions[0];
    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(
        columns,
        [
            "Language", "Phase", "Ready", "Served", "Digest", "URL", "Triggers", "Age", "Revision", "Serving"
        ]
    );
    // The revisions only in `kubectl get fn -o wide`.
    let wide: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .filter(|c| c.priority == Some(1))
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(wide, ["Revision", "Serving"]);
    let subresources = version.subresources.as_ref().unwrap();
    assert!(subresources.status.is_some());
    let scale = subresources
        .scale
        .as_ref()
        .expect("the scale subresource, for kubectl scale and HPAs");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
}

#[test]
fn crd_accepts_secrets_config_and_outbound_as_kubernetes_users_write_them() {
    let spec = json!({
        "source": HELLO,
        "env": [
            {"name": "GREETING", "value": "hi"},
            {"name": "EMPTY"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
            {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}},
        ],
        "envFrom": [{"secretRef": {"name": "more"}}, {"configMapRef": {"name": "cfg.v2", "optional": true}, "prefix": "CFG_"}],
        "outbound": {
            "allow": [
                "http://b.default.svc.cluster.local:8080",
                "https://*.example.com",
                "https://api.example.com",
                "http://*",
                "http://169.254.169.254",
                "http://[fd00:ec2::254]:80",
                "http://b:8080",
            ],
            "timeout": "2s",
            "maxResponseBody": "1Mi",
            "maxConcurrency": 8,
            "headers": [
                {"url": "https://api.example.com", "name": "Authorization",
                 "valueFrom": {"secretKeyRef": {"name": "api", "key": "bearer"}}},
                // Plain http, said so: a sidecar or a mesh the owner trusts.
                {"url": "http://b:8080", "name": "X-Api-Key", "allowInsecure": true,
                 "valueFrom": {"secretKeyRef": {"name": "api", "key": "key"}}},
            ],
            "caBundle": {"configMapKeyRef": {"name": "internal-ca", "key": "ca.crt"}},
        },
    });
    assert_eq!(refused(spec.clone()), Vec::<String>::new());
    let func: Function = serde_json::from_value(json!({
        "apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": "hello"}, "spec": spec,
    }))
    .unwrap();
    assert_eq!(func.spec.problems(), Vec::<String>::new());
    // The defaults of an outbound that names only what it allows.
    let func: Function = serde_json::from_value(json!({
        "apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": "hello"},
        "spec": {"source": HELLO, "outbound": {"allow": ["https://api.example.com"]}},
    }))
    .unwrap();
    let outbound = func.spec.outbound.unwrap();
    assert_eq!(
        (
            outbound.timeout.as_str(),
            outbound.max_response_body.as_str(),
            outbound.max_concurrency
        ),
        ("5s", "10Mi", 64)
    );
}

#[test]
fn crd_refuses_bad_references_and_outbound() {
    let secret = json!({"secretKeyRef": {"name": "api", "key": "token"}});
    let header = |url: &str, name: &str| json!({"url": url, "name": name, "valueFrom": secret.clone()});
    let outbound =
        |allow: Value, headers: Value| json!({"source": HELLO, "outbound": {"allow": allow, "headers": headers}});
    let cases = [
        (
            json!({"source": HELLO, "env": [{"name": "A", "value": "x", "valueFrom": secret.clone()}]}),
            "value or valueFrom, not both",
        ),
        (
            json!({"source": HELLO, "env": [{"name": "A", "valueFrom": {}}]}),
            "exactly one of secretKeyRef or configMapKeyRef",
        ),
        (
            json!({"source": HELLO, "env": [{"name": "A", "valueFrom": {
                "secretKeyRef": {"name": "a", "key": "k"}, "configMapKeyRef": {"name": "a", "key": "k"}}}]}),
            "exactly one of secretKeyRef or configMapKeyRef",
        ),
        (
            json!({"source": HELLO, "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Api", "key": "k"}}}]}),
            "does not match",
        ),
        (
            json!({"source": HELLO, "env": [{"name": "A", "valueFrom": {"secretKeyRef": {"name": "api"}}}]}),
            "key is required",
        ),
        (
            json!({"source": HELLO, "envFrom": [{"prefix": "P_"}]}),
            "exactly one of secretRef or configMapRef",
        ),
        (
            json!({"source": HELLO, "envFrom": [{"secretRef": {"name": "a"}, "prefix": "NOT-A-NAME"}]}),
            "does not match",
        ),
        (json!({"source": HELLO, "outbound": {}}), "allow is required"),
        (outbound(json!([]), json!([])), "fewer items than minItems"),
        (
            outbound(json!(["ftp://files.example.com"]), json!([])),
            "does not match",
        ),
        (
            outbound(json!(["https://api.example.com/v1"]), json!([])),
            "does not match",
        ),
        (outbound(json!(["api.example.com"]), json!([])), "does not match"),
        (outbound(json!(["https://*example.com"]), json!([])), "does not match"),
        (outbound(json!(["https://api.*.com"]), json!([])), "does not match"),
        (
            outbound(
                json!(["https://api.example.com"]),
                json!([header("https://other.example.com", "Authorization")]),
            ),
            "must be one of outbound.allow",
        ),
        (
            outbound(
                json!(["https://*.example.com"]),
                json!([header("https://*.example.com", "Authorization")]),
            ),
            "does not match",
        ),
        (
            outbound(
                json!(["https://api.example.com"]),
                json!([header("https://api.example.com", "Bad Header")]),
            ),
            "does not match",
        ),
        (
            outbound(
                json!(["http://b:8080"]),
                json!([header("http://b:8080", "Authorization")]),
            ),
            "travel in clear",
        ),
        (
            outbound(
                json!(["http://b:8080"]),
                json!([{"url": "http://b:8080", "name": "Authorization", "valueFrom": secret.clone(), "allowInsecure": false}]),
            ),
            "travel in clear",
        ),
        (
            json!({"source": HELLO, "outbound": {"allow": ["https://a.example.com"], "timeout": "5"}}),
            "does not match",
        ),
        (
            json!({"source": HELLO, "outbound": {"allow": ["https://a.example.com"], "maxConcurrency": 0}}),
            "below the minimum",
        ),
    ];
    for (spec, expected) in cases {
        let errors = refused(spec.clone());
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{spec}: expected {expected:?}, got {errors:?}"
        );
    }
}

#[test]
fn outbound_the_schema_lets_through_is_refused_on_status() {
    let secret = json!({"secretKeyRef": {"name": "api", "key": "token"}});
    let problems = |outbound: Value| {
        let func: Function = serde_json::from_value(json!({
            "apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": "hello"},
            "spec": {"source": HELLO, "outbound": outbound},
        }))
        .unwrap();
        func.spec.problems()
    };
    let past = problems(json!({"allow": ["http://b:99999", "http://[::1]:70000", "http://[::1]:8080"]}));
    assert_eq!(past.len(), 2, "{past:?}");
    assert!(past[0].contains("http://b:99999 has port 99999"), "{past:?}");
    assert!(past[1].contains("port 70000"), "{past:?}");
    let twice = problems(json!({"allow": ["https://a.example.com"], "headers": [
        {"url": "https://a.example.com", "name": "Authorization", "valueFrom": secret.clone()},
        {"url": "https://a.example.com", "name": "authorization", "valueFrom": secret.clone()},
    ]}));
    assert_eq!(twice.len(), 1, "{twice:?}");
    assert!(twice[0].contains("twice"), "{twice:?}");
    // Stored before the CRD refused it: refused on status, the pods left as they are.
    let insecure = problems(json!({"allow": ["http://b:8080"], "headers": [
        {"url": "http://b:8080", "name": "Authorization", "valueFrom": secret.clone()},
    ]}));
    assert_eq!(insecure.len(), 1, "{insecure:?}");
    assert!(insecure[0].contains("allowInsecure"), "{insecure:?}");
}

const GO_MOD: &str = "module example.com/uuidfn\n\ngo 1.21\n\nrequire github.com/google/uuid v1.6.0\n";
const GO_SUM: &str = "github.com/google/uuid v1.6.0 h1:NIvaJDMOsjHA8n1jAhLSgzrAzy1Hgr+hNrb57e+94F0=\n";

#[test]
fn files_go_beside_an_inline_source_with_names_from_its_folder_down() {
    let files = json!({"go.mod": GO_MOD, "go.sum": GO_SUM, "routes.go": "package handlers\n"});
    assert_eq!(refused(json!({"source": HELLO, "files": files})), Vec::<String>::new());
    assert_eq!(
        refused(json!({"function": HELLO, "files": files})),
        Vec::<String>::new()
    );
    let digest = Digest::of(b"m").to_string();
    let prebuilt =
        refused(json!({"language": "wasm", "module": {"image": "r.local/x", "digest": digest}, "files": files}));
    assert!(
        prebuilt.iter().any(|e| e.contains("files go beside an inline source")),
        "{prebuilt:?}"
    );

    let problems = |language: &str, files: Value| {
        let func: Function = serde_json::from_value(json!({
            "apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": "hello"},
            "spec": {"language": language, "source": HELLO, "files": files},
        }))
        .unwrap();
        func.spec.problems()
    };
    assert_eq!(problems("go", files.clone()), Vec::<String>::new());
    // A Go handler's files may be in folders and hold data (files beside the handler);
    // what would leave its folder, hide, or be left out of a folder's read is refused.
    for (name, why) in [
        ("../go.mod", ".. segment"),
        ("a//b.csv", "empty segment"),
        (".env", "starts with '.'"),
        ("data/.secret", "starts with '.'"),
        ("x_test.go", "a folder's read leaves out"),
        ("wasmless_main/main.go", "the builder writes its own code"),
    ] {
        let found = problems("go", json!({ name: "x" }));
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        assert!(
            found[0].contains("is not allowed") && found[0].contains(why),
            "{name}: {found:?}"
        );
    }
    for name in ["sub/x.go", "notes.txt", "source", "templates/index.html"] {
        assert_eq!(problems("go", json!({ name: "x" })), Vec::<String>::new(), "{name}");
    }
    let itself = problems("go", json!({"handler.go": HELLO}));
    assert!(
        itself[0].contains("the name the source itself is built as"),
        "{itself:?}"
    );
    let big = "x".repeat(300 * 1024);
    let over = problems("go", json!({"a.go": big, "b.go": big}));
    assert!(
        over.iter().any(|p| p.contains("together, over the 524288-byte limit")),
        "{over:?}"
    );
    let sum_alone = problems("go", json!({"go.sum": GO_SUM}));
    assert!(sum_alone[0].contains("go.sum without go.mod"), "{sum_alone:?}");
    let cargo = problems(
        "rust",
        json!({"Cargo.toml": "[dependencies]\nserde = \"1\"\n", "Cargo.lock": "version = 4\n", "util.rs": ""}),
    );
    assert_eq!(
        cargo,
        Vec::<String>::new(),
        "Rust handlers take a Cargo.toml and its Cargo.lock"
    );
    let lock_alone = problems("rust", json!({"Cargo.lock": "version = 4\n"}));
    assert!(
        lock_alone[0].contains("Cargo.lock without Cargo.toml"),
        "{lock_alone:?}"
    );
    let many: serde_json::Map<String, Value> = (0..65)
        .map(|i| (format!("f{i}.go"), json!("package handlers\n")))
        .collect();
    assert!(
        problems("go", Value::Object(many))
            .iter()
            .any(|p| p.contains("over the limit of 64"))
    );
}

/// Door 5 of issue 38: a Function whose requests may hold the pool longer or with more
/// than the pool lets one Function have keeps a pod of its own, and says why.
#[test]
fn a_function_over_the_pools_caps_keeps_a_pod_of_its_own() {
    let spec = |limits: Value| -> wasmless_operator::crd::FunctionSpec {
        serde_json::from_value(json!({"source": "package handlers", "scale": {"min": 0}, "limits": limits})).unwrap()
    };
    assert_eq!(
        spec(json!({"timeout": "60s", "maxRequestBody": "16Mi", "memory": "256Mi"})).pool_refusal(),
        None
    );
    let refusal = spec(json!({"timeout": "2m"})).pool_refusal().unwrap();
    assert!(
        refusal.contains("limits.timeout 2m is over the shared pool's 60s"),
        "{refusal}"
    );
    let refusal = spec(json!({"maxRequestBody": "17Mi"})).pool_refusal().unwrap();
    assert!(
        refusal.contains("limits.maxRequestBody 17Mi is over the shared pool's 16Mi"),
        "{refusal}"
    );
}

#[test]
fn crd_takes_queue_and_schedule_triggers_and_refuses_ones_that_would_leave_their_namespace_or_collide() {
    let queue = |name: &str, subject: &str| json!({"name": name, "queue": {"subject": subject}});
    assert_eq!(
        refused(json!({
            "source": HELLO,
            "triggers": [queue("created", "orders.created"), queue("any", "orders.*"), queue("all", "orders.>"),
                {"name": "nightly", "schedule": "0 3 * * MON-FRI", "timeZone": "Europe/Paris", "path": "/cron"},
                {"name": "often", "schedule": "*/10 * * * * *"}, {"name": "hourly", "schedule": "@hourly"}],
            "delivery": {"retries": 5, "backoff": "500ms", "timeout": "10s", "deadLetter": false},
        })),
        Vec::<String>::new()
    );
    let cases = [
        (
            json!([queue("a", "orders"), queue("a", "refunds")]),
            "each of triggers[] needs a name of its own",
        ),
        (json!([queue("a", "_deadletter.hello")]), "does not match"),
        (json!([queue("a", "*.created")]), "does not match"),
        (json!([queue("a", ">")]), "does not match"),
        (json!([queue("a", "orders..created")]), "does not match"),
        (json!([queue("a", "orders.>.x")]), "does not match"),
        (json!([queue("Bad_Name", "orders")]), "does not match"),
        (
            json!([{"name": "a", "path": "no-slash", "queue": {"subject": "orders"}}]),
            "does not match",
        ),
        (
            json!([{"name": "a", "queue": {"subject": "orders", "maxInFlight": 0}}]),
            "below the minimum",
        ),
        (json!([{"name": "a"}]), "a queue or a schedule, one of the two"),
        (
            json!([{"name": "a", "schedule": "* * * * *", "queue": {"subject": "orders"}}]),
            "a queue or a schedule, one of the two",
        ),
        (json!([{"name": "a", "schedule": "every day"}]), "does not match"),
        (json!([{"name": "a", "schedule": "@reboot"}]), "does not match"),
        (json!([{"name": "a", "schedule": "* * * *"}]), "does not match"),
        (
            json!([{"name": "a", "queue": {"subject": "orders"}, "timeZone": "UTC"}]),
            "timeZone is a schedule's",
        ),
        (
            json!([{"name": "a", "schedule": "@daily", "timeZone": "../etc"}]),
            "does not match",
        ),
    ];
    for (triggers, expected) in cases {
        let errors = refused(json!({"source": HELLO, "triggers": triggers.clone()}));
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{triggers} should be refused with {expected:?}, got {errors:?}"
        );
    }
    let errors = refused(json!({"source": HELLO, "triggers": [queue("a", "orders")], "delivery": {"backoff": "soon"}}));
    assert!(errors.iter().any(|e| e.contains("does not match")), "{errors:?}");
    let delivery = |timeout: &str, backoff: &str| {
        refused(json!({"source": HELLO, "triggers": [queue("a", "orders")],
            "delivery": {"retries": 3, "timeout": timeout, "backoff": backoff, "deadLetter": true}}))
    };
    assert_eq!(delivery("5m", "250ms"), Vec::<String>::new());
    assert!(
        delivery("999999m", "1s")
            .iter()
            .any(|e| e.contains("delivery.timeout is at most 5m"))
    );
    assert!(
        delivery("30s", "301s")
            .iter()
            .any(|e| e.contains("delivery.backoff is at most 5m"))
    );
}
