//! The Secrets and ConfigMaps a Function's pods read (env `valueFrom`, `envFrom`, outbound
//! headers), and what the operator does with them without ever reading a value: a hash of
//! their resourceVersions on the pod template, so a changed object rolls the pods and an
//! unchanged one restarts nothing; a missing one, named on status; and the Functions an
//! object's change concerns, for the controller's watch of Secrets and ConfigMaps.

use crate::crd::{Function, FunctionSpec};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use wasmless_artifact::Digest;

/// Pod-template annotation: sha256 over the kind, name and resourceVersion of every object
/// the pods read. Absent when they read none.
pub const CONFIG_HASH_ANNOTATION: &str = "wasmless.io/config-hash";

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConfigKind {
    Secret,
    ConfigMap,
}

impl fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConfigKind::Secret => "Secret",
            ConfigKind::ConfigMap => "ConfigMap",
        })
    }
}

/// One object a Function's pods read, with every field that reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    pub kind: ConfigKind,
    pub name: String,
    /// Every use says `optional: true`: the pods start without the object.
    pub optional: bool,
    /// The fields that name it, for messages: `env TOKEN`, `envFrom`, `outbound header Authorization`.
    pub uses: Vec<String>,
}

/// The objects `spec` reads, each once, ordered by kind and name.
pub fn references(spec: &FunctionSpec) -> Vec<Reference> {
    let mut found: BTreeMap<(ConfigKind, String), Reference> = BTreeMap::new();
    let mut add = |kind, name: &str, optional: Option<bool>, used_as: String| {
        let optional = optional.unwrap_or(false);
        let reference = found.entry((kind, name.to_string())).or_insert_with(|| Reference {
            kind,
            name: name.to_string(),
            optional,
            uses: Vec::new(),
        });
        reference.optional &= optional;
        reference.uses.push(used_as);
    };
    for var in &spec.env {
        let Some(source) = &var.value_from else { continue };
        if let Some(key) = &source.secret_key_ref {
            add(ConfigKind::Secret, &key.name, key.optional, format!("env {}", var.name));
        }
        if let Some(key) = &source.config_map_key_ref {
            add(
                ConfigKind::ConfigMap,
                &key.name,
                key.optional,
                format!("env {}", var.name),
            );
        }
    }
    for source in &spec.env_from {
        if let Some(secret) = &source.secret_ref {
            add(ConfigKind::Secret, &secret.name, secret.optional, "envFrom".into());
        }
        if let Some(cm) = &source.config_map_ref {
            add(ConfigKind::ConfigMap, &cm.name, cm.optional, "envFrom".into());
        }
    }
    for header in spec.outbound.iter().flat_map(|outbound| &outbound.headers) {
        let secret = &header.value_from.secret_key_ref;
        // A header without its value would be a call without its credential: never optional.
        add(
            ConfigKind::Secret,
            &secret.name,
            Some(false),
            format!("outbound header {} for {}", header.name, header.url),
        );
    }
    if let Some(bundle) = spec.outbound.as_ref().and_then(|outbound| outbound.ca_bundle.as_ref()) {
        // Calls to the services it signs would fail without it: never optional.
        add(
            ConfigKind::ConfigMap,
            &bundle.config_map_key_ref.name,
            Some(false),
            "outbound caBundle".into(),
        );
    }
    found.into_values().collect()
}

/// The hash of [`CONFIG_HASH_ANNOTATION`] over `(reference, resourceVersion)`, the version
/// `None` for an optional object that does not exist (so that its creation rolls the pods
/// too). `None` when there is nothing to hash.
pub fn config_hash<'a>(versions: impl IntoIterator<Item = (&'a Reference, Option<&'a str>)>) -> Option<Digest> {
    let mut lines: Vec<String> = versions
        .into_iter()
        .map(|(reference, version)| format!("{}/{}={}\n", reference.kind, reference.name, version.unwrap_or("-")))
        .collect();
    if lines.is_empty() {
        return None;
    }
    lines.sort();
    Some(Digest::of(lines.concat().as_bytes()))
}

/// What to do about objects that are missing and not optional, for the Ready condition.
pub fn missing_message(missing: &[&Reference], namespace: &str) -> String {
    let each: Vec<String> = missing
        .iter()
        .map(|reference| {
            format!(
                "{} {} (for {})",
                reference.kind,
                reference.name,
                reference.uses.join(", ")
            )
        })
        .collect();
    format!(
        "{} not found in namespace {namespace}: create it, or mark the reference optional: true \
         (outbound headers and caBundle cannot be); the runtime pods keep their previous configuration until then",
        each.join("; ")
    )
}

/// The Functions among `functions` whose pods read the `kind` object `name` in `namespace`:
/// the ones to reconcile when it changes.
pub fn functions_reading(
    functions: &[Arc<Function>],
    kind: ConfigKind,
    namespace: Option<&str>,
    name: &str,
) -> Vec<ObjectRef<Function>> {
    functions
        .iter()
        .filter(|func| func.namespace().as_deref() == namespace)
        .filter(|func| {
            references(&func.spec)
                .iter()
                .any(|reference| reference.kind == kind && reference.name == name)
        })
        .map(|func| ObjectRef::from_obj(func.as_ref()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn function(namespace: &str, name: &str, spec: serde_json::Value) -> Arc<Function> {
        let mut spec = spec;
        spec["source"] = json!("package handlers");
        Arc::new(
            serde_json::from_value(json!({
                "apiVersion": "wasmless.io/v1alpha1", "kind": "Function",
                "metadata": {"name": name, "namespace": namespace}, "spec": spec,
            }))
            .unwrap(),
        )
    }

    fn reads_everything() -> Arc<Function> {
        function(
            "shop",
            "reads",
            json!({
                "env": [
                    {"name": "PLAIN", "value": "x"},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
                    {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode", "optional": true}}},
                    {"name": "SHARED", "valueFrom": {"configMapKeyRef": {"name": "api", "key": "k"}}},
                ],
                "envFrom": [{"secretRef": {"name": "more", "optional": true}}, {"configMapRef": {"name": "cfg", "optional": true}}],
                "outbound": {"allow": ["https://api.example.com"], "headers": [
                    {"url": "https://api.example.com", "name": "Authorization",
                     "valueFrom": {"secretKeyRef": {"name": "more", "key": "bearer"}}}],
                    "caBundle": {"configMapKeyRef": {"name": "cfg", "key": "ca.crt"}}},
            }),
        )
    }

    #[test]
    fn every_read_object_once_optional_only_if_every_use_is() {
        let found = references(&reads_everything().spec);
        let summary: Vec<_> = found
            .iter()
            .map(|r| (r.kind, r.name.as_str(), r.optional, r.uses.len()))
            .collect();
        assert_eq!(
            summary,
            [
                (ConfigKind::Secret, "api", false, 1),
                // optional in envFrom, but a header needs it.
                (ConfigKind::Secret, "more", false, 2),
                // A ConfigMap named like a Secret is another object.
                (ConfigKind::ConfigMap, "api", false, 1),
                // optional in env and envFrom, but the CA bundle needs it.
                (ConfigKind::ConfigMap, "cfg", false, 3),
            ]
        );
        assert!(references(&function("shop", "plain", json!({"env": [{"name": "A", "value": "1"}]})).spec).is_empty());
    }

    #[test]
    fn the_hash_changes_with_a_version_and_only_then() {
        let found = references(&reads_everything().spec);
        let versions = |changed: &str| {
            found
                .iter()
                .map(|r| {
                    (
                        r,
                        Some(if r.name == changed && r.kind == ConfigKind::Secret {
                            "2"
                        } else {
                            "1"
                        }),
                    )
                })
                .collect::<Vec<_>>()
        };
        let before = config_hash(versions("")).unwrap();
        assert_eq!(config_hash(versions("")).unwrap(), before, "deterministic");
        let mut reversed = versions("");
        reversed.reverse();
        assert_eq!(config_hash(reversed).unwrap(), before, "independent of order");
        assert_ne!(config_hash(versions("api")).unwrap(), before);
        // An optional object that appears rolls the pods as well.
        let absent = found.iter().map(|r| (r, (r.name != "cfg").then_some("1")));
        assert_ne!(config_hash(absent).unwrap(), before);
        assert_eq!(config_hash(std::iter::empty()), None);
    }

    #[test]
    fn a_change_reaches_the_functions_that_read_the_object_and_no_others() {
        let functions = vec![
            reads_everything(),
            function(
                "other",
                "same-names-elsewhere",
                json!({"envFrom": [{"secretRef": {"name": "api"}}]}),
            ),
            function("shop", "plain", json!({"env": [{"name": "api", "value": "1"}]})),
        ];
        let names = |kind, namespace, name| {
            functions_reading(&functions, kind, Some(namespace), name)
                .into_iter()
                .map(|r| r.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(ConfigKind::Secret, "shop", "api"), ["reads"]);
        assert_eq!(names(ConfigKind::Secret, "shop", "more"), ["reads"]);
        assert_eq!(names(ConfigKind::ConfigMap, "shop", "cfg"), ["reads"]);
        assert_eq!(names(ConfigKind::Secret, "other", "api"), ["same-names-elsewhere"]);
        assert!(
            names(ConfigKind::Secret, "shop", "cfg").is_empty(),
            "cfg is a ConfigMap"
        );
        assert!(names(ConfigKind::ConfigMap, "shop", "unrelated").is_empty());
    }

    #[test]
    fn the_missing_message_says_what_to_do_and_no_value() {
        let found = references(&reads_everything().spec);
        let missing: Vec<_> = found.iter().filter(|r| !r.optional).collect();
        let message = missing_message(&missing[..1], "shop");
        assert!(
            message.starts_with("Secret api (for env TOKEN) not found in namespace shop"),
            "{message}"
        );
        assert!(
            message.contains("create it, or mark the reference optional: true"),
            "{message}"
        );
    }
}
