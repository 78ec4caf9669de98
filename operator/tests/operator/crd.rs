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
    let mut errors = schema_errors(&spec_schema(), &json!({"spec": spec.clone()}), "");
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
    assert_eq!(columns, ["Language", "Phase", "Ready", "Digest", "URL", "Age"]);
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
