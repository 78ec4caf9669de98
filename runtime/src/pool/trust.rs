//! Which ConfigMaps the pool takes an entry from (`--pool api:`), and which arguments an
//! entry may hold. An entry is the pool's root of trust for its Function: the port its
//! clients reach, and the digests of the module and native code the pool runs for it. A
//! label is something anyone who may edit ConfigMaps can write, so a label alone is not
//! enough: the pool accepts only the object the operator owns for the Function, in the
//! shape the operator writes it. The admission policy is what keeps others from writing
//! such an object; this is the pool taking nothing else on faith, so that one hole in
//! the policy is not a way into every pooled Function.
//!
//! A directory table (`--pool <dir>`) is not checked here: whoever can write the pod's
//! files already holds the pool.

use k8s_openapi::api::core::v1::ConfigMap;
use wasmless_artifact::labels::FUNCTION as FUNCTION_LABEL;
use wasmless_host::configmap_chunks::{self, ConfigMapChunks};

/// A Function's entry is the ConfigMap `<function>-pool`.
pub const ENTRY_SUFFIX: &str = "-pool";
/// The API group and kind of the owner the operator writes on every entry.
pub const OWNER_GROUP: &str = "wasmless.io";
pub const OWNER_KIND: &str = "Function";

/// The flags the operator writes for a pooled Function, each followed by its value
/// (operator/src/objects/runtime.rs `function_args` and `args_with_locations`, with the
/// locations of objects/pool.rs `pool_args`). `--outbound-ca` is not among them: the
/// operator writes it only for a Function that trusts a CA bundle, which is never pooled,
/// and its value is a file of the pool's pod. `--env` is not either: a pooled Function's
/// variables travel in the entry's `env`, as references.
const OPERATOR_FLAGS: &[&str] = &[
    "--function",
    "--module",
    "--module-digest",
    "--code",
    "--code-digest",
    "--port",
    "--admin-port",
    "--memory-limit",
    "--timeout",
    "--max-concurrency",
    "--max-request-body",
    "--cache-dir",
    "--watch-interval",
    "--drain-delay",
    "--shutdown-grace",
    "--isolation",
    "--outbound-allow",
    "--outbound-timeout",
    "--outbound-max-response-body",
    "--outbound-max-concurrency",
    "--outbound-header",
];

/// Flags the operator always writes: an entry without them is not one of its.
const REQUIRED_FLAGS: &[&str] = &["--function", "--module", "--module-digest"];

/// Why the pool does not serve a ConfigMap its selector picked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Not any Function's entry (no label, or a name that is not `<label>-pool`): reported
    /// under the ConfigMap's own name, so it can take no Function's place.
    Stranger(String),
    /// `<function>-pool`, but not owned by that Function as the operator writes it.
    Unowned(String),
}

/// The Function whose entry `configmap` is, or why it is none. `Ok` only for the object
/// the operator writes: named `<function>-pool` after its `wasmless.io/function` label,
/// and controlled by that Function.
pub fn entry_function(configmap: &ConfigMap) -> Result<String, Refusal> {
    let name = configmap.metadata.name.as_deref().unwrap_or_default();
    let only = "the pool serves only the entries the operator writes (<function>-pool, labelled and owned by its Function); delete this ConfigMap or let the operator write it";
    let label = configmap
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(FUNCTION_LABEL))
        .filter(|function| !function.is_empty());
    let Some(function) = label else {
        return Err(Refusal::Stranger(format!(
            "ConfigMap {name} has no {FUNCTION_LABEL} label: {only}"
        )));
    };
    if name.strip_suffix(ENTRY_SUFFIX) != Some(function.as_str()) {
        return Err(Refusal::Stranger(format!(
            "ConfigMap {name} says it is Function {function}'s entry, which is {function}{ENTRY_SUFFIX}: {only}"
        )));
    }
    if !controlled_by(configmap, function) {
        return Err(Refusal::Unowned(format!(
            "ConfigMap {name} is not controlled by Function {function} (an ownerReference of apiVersion {OWNER_GROUP}/*, kind {OWNER_KIND}, name {function}, controller: true): {only}"
        )));
    }
    Ok(function.clone())
}

/// Whether `configmap` names `function` as its controlling owner. The group, not the
/// version: a new version of the CRD is the same Function.
fn controlled_by(configmap: &ConfigMap, function: &str) -> bool {
    let mut owners = configmap.metadata.owner_references.iter().flatten();
    owners.any(|owner| {
        owner.api_version.split_once('/').map(|(group, _)| group) == Some(OWNER_GROUP)
            && owner.kind == OWNER_KIND
            && owner.name == function
            && owner.controller == Some(true)
    })
}

/// Checks that `args` are what the operator writes for `function`: flag and value pairs
/// of [`OPERATOR_FLAGS`], its own name, and its module and code read from its own chunk
/// ConfigMaps or an OCI registry, never from a file of the pool's pod.
pub fn check_args(function: &str, args: &[String]) -> Result<(), String> {
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            return Err(format!(
                "its args end with {} and no value: the operator writes every flag with its value",
                pair[0]
            ));
        };
        check_flag(function, flag, value)?;
    }
    let given = |flag: &&str| args.chunks(2).any(|pair| pair[0] == **flag);
    if let Some(missing) = REQUIRED_FLAGS.iter().copied().find(|flag| !given(flag)) {
        return Err(format!(
            "its args have no {missing}, which the operator always writes: refused"
        ));
    }
    Ok(())
}

fn check_flag(function: &str, flag: &str, value: &str) -> Result<(), String> {
    if !OPERATOR_FLAGS.contains(&flag) {
        return Err(format!(
            "its args hold {flag}, which the operator never writes for a pooled Function: refused (an entry may hold only {})",
            OPERATOR_FLAGS.join(" ")
        ));
    }
    // A value that looks like a flag would be read as one: the pairs above would not be
    // the arguments the runtime parses.
    if value.starts_with('-') {
        return Err(format!(
            "its args give {flag} the value {value:?}, which starts with '-': refused"
        ));
    }
    match flag {
        "--function" if value != function => Err(format!(
            "its args say --function {value}, but it is Function {function}'s entry: refused"
        )),
        "--module" | "--code" => check_location(function, flag, value),
        _ => Ok(()),
    }
}

/// `configmaps:<function>/...` of the entry's own Function, or `oci://...` (pinned by the
/// entry's digests like any other source).
fn check_location(function: &str, flag: &str, value: &str) -> Result<(), String> {
    if value.starts_with(wasmless_artifact::oci::SCHEME) {
        return Ok(());
    }
    let Some(chunks) = value.strip_prefix(configmap_chunks::SCHEME) else {
        return Err(format!(
            "its args read {flag} from {value}: a pooled Function's {flag} is {}{function}/... or {}..., never a file of the pool's pod",
            configmap_chunks::SCHEME,
            wasmless_artifact::oci::SCHEME
        ));
    };
    let chunks = ConfigMapChunks::parse(chunks).map_err(|problem| format!("its {flag} {value}: {problem}"))?;
    if chunks.function != function {
        return Err(format!(
            "its args read {flag} from Function {}'s chunks, but it is Function {function}'s entry: refused",
            chunks.function
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmless_artifact::Digest;

    fn configmap(name: &str, function: Option<&str>, owners: serde_json::Value) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": function.map(|function| serde_json::json!({FUNCTION_LABEL: function})),
                "ownerReferences": owners,
            },
        }))
        .unwrap()
    }

    fn owner(kind: &str, name: &str, controller: bool) -> serde_json::Value {
        serde_json::json!([{
            "apiVersion": "wasmless.io/v1alpha1", "kind": kind, "name": name,
            "uid": "0b7e3c1e-4f0a-4d53-9d1c-5a0d8c2e1f00", "controller": controller,
        }])
    }

    #[test]
    fn only_the_entry_its_function_controls_is_one() {
        let own = configmap("hello-pool", Some("hello"), owner("Function", "hello", true));
        assert_eq!(entry_function(&own), Ok("hello".to_string()));

        let refused = |configmap: ConfigMap| entry_function(&configmap).unwrap_err();
        let Refusal::Stranger(why) = refused(configmap("hello-pool", None, owner("Function", "hello", true))) else {
            panic!("an unlabelled ConfigMap is nobody's entry")
        };
        assert!(why.contains("no wasmless.io/function label"), "{why}");
        let Refusal::Stranger(why) = refused(configmap("a-pool", Some("hello"), owner("Function", "hello", true)))
        else {
            panic!("a name that is not <label>-pool is nobody's entry")
        };
        assert!(why.contains("which is hello-pool"), "{why}");
        for owners in [
            serde_json::Value::Null,
            owner("Function", "other", true),
            owner("Function", "hello", false),
            owner("Deployment", "hello", true),
        ] {
            let Refusal::Unowned(why) = refused(configmap("hello-pool", Some("hello"), owners.clone())) else {
                panic!("{owners}: not controlled by hello, yet not refused as such")
            };
            assert!(why.contains("not controlled by Function hello"), "{why}");
        }
    }

    /// The arguments the operator writes for a pooled Function with every option set
    /// (operator/src/objects/runtime.rs `function_args`, `args_with_locations`).
    fn operator_args(function: &str) -> Vec<String> {
        let source = Digest::of(b"source");
        let digest = Digest::of(b"module").to_string();
        [
            ("--module", format!("configmaps:{function}/{source}/2")),
            ("--module-digest", digest.clone()),
            ("--function", function.to_string()),
            ("--port", "8080".into()),
            ("--admin-port", "9090".into()),
            ("--memory-limit", "64Mi".into()),
            ("--timeout", "10s".into()),
            ("--max-concurrency", "64".into()),
            ("--max-request-body", "1Mi".into()),
            ("--cache-dir", "/cache".into()),
            ("--watch-interval", "0".into()),
            ("--drain-delay", "5s".into()),
            ("--shutdown-grace", "30s".into()),
            ("--isolation", "shared".into()),
            ("--outbound-allow", "https://*.example.com".into()),
            ("--outbound-timeout", "5s".into()),
            ("--outbound-max-response-body", "10Mi".into()),
            ("--outbound-max-concurrency", "64".into()),
            (
                "--outbound-header",
                "https://api.example.com Authorization WASMLESS_OUTBOUND_HEADER_0".into(),
            ),
            ("--code", format!("configmaps:{function}/{source}/3")),
            ("--code-digest", digest),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect()
    }

    #[test]
    fn the_operators_arguments_pass_and_an_oci_module_too() {
        check_args("hello", &operator_args("hello")).unwrap();
        let oci = [
            "--function",
            "hello",
            "--module",
            "oci://registry.example/hello@sha256:00",
            "--module-digest",
            "sha256:00",
        ]
        .map(String::from);
        check_args("hello", &oci).unwrap();
    }

    #[test]
    fn any_other_argument_is_refused_naming_it() {
        let with = |flag: &str, value: &str| {
            let mut args = operator_args("hello");
            args.extend([flag.to_string(), value.to_string()]);
            check_args("hello", &args).unwrap_err()
        };
        for (flag, value, says) in [
            ("--env", "A=B", "--env"),
            ("--outbound-ca", "/etc/ssl/evil.pem", "--outbound-ca"),
            ("--pool", "/tmp", "--pool"),
            ("--module=/etc/passwd", "x", "--module=/etc/passwd"),
            ("-m", "x", "-m"),
            ("--function", "victim", "--function victim"),
            ("--module", "/var/run/module.wasm", "never a file of the pool's pod"),
            ("--code", "/cache/native.cwasm", "never a file of the pool's pod"),
            (
                "--code",
                &format!("configmaps:victim/{}/1", Digest::of(b"source")),
                "Function victim's chunks",
            ),
            ("--timeout", "--outbound-ca", "starts with '-'"),
        ] {
            let error = with(flag, value);
            assert!(error.contains(says), "{flag} {value}: {error}");
        }
        let mut odd = operator_args("hello");
        odd.push("--timeout".into());
        assert!(check_args("hello", &odd).unwrap_err().contains("no value"));
        let without_digest: Vec<String> = operator_args("hello")[2..].to_vec();
        let error = check_args("hello", &without_digest).unwrap_err();
        assert!(error.contains("no --module"), "{error}");
    }
}
