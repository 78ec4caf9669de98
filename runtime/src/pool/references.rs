//! A pooled Function's `env` and `envFrom`, resolved as the kubelet resolves a pod's: the
//! pool is one process for many Functions, so the values a dedicated pod would find in its
//! environment are read here, from the Secrets and ConfigMaps of the pool's namespace, and
//! given to that Function alone. The pool may read only the Secrets the operator names in
//! its Role (those pooled Functions read); a value is kept in memory, never written or
//! logged.

use super::table::{Entry, Resolved};
use k8s_openapi::api::core::v1::{ConfigMap, EnvVarSource, Secret};
use std::collections::BTreeMap;

/// An object's data, by key.
pub type Data = BTreeMap<String, Vec<u8>>;

/// Where a reference's object is read from. `Ok(None)`: it does not exist.
pub trait Objects {
    fn secret(&self, name: &str) -> impl Future<Output = Result<Option<Data>, String>> + Send;
    fn configmap(&self, name: &str) -> impl Future<Output = Result<Option<BTreeMap<String, String>>, String>> + Send;
}

/// The namespace's objects through the API, with the pool's identity.
pub struct ApiObjects {
    pub secrets: kube::Api<Secret>,
    pub configmaps: kube::Api<ConfigMap>,
}

fn api_problem(kind: &str, name: &str, error: kube::Error) -> String {
    match error {
        kube::Error::Api(status) if status.code == 403 => format!(
            "the pool may not read {kind} {name}: the operator names the Secrets pooled Functions read in the pool's Role \
             (wasmless-pool), so it may not be written yet; retrying"
        ),
        error => format!("reading {kind} {name} failed: {error}; retrying"),
    }
}

impl Objects for ApiObjects {
    async fn secret(&self, name: &str) -> Result<Option<Data>, String> {
        let secret = self
            .secrets
            .get_opt(name)
            .await
            .map_err(|error| api_problem("Secret", name, error))?;
        Ok(secret.map(|secret| {
            secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(key, bytes)| (key, bytes.0))
                .collect()
        }))
    }

    async fn configmap(&self, name: &str) -> Result<Option<BTreeMap<String, String>>, String> {
        let configmap = self
            .configmaps
            .get_opt(name)
            .await
            .map_err(|error| api_problem("ConfigMap", name, error))?;
        Ok(configmap.map(|configmap| configmap.data.unwrap_or_default()))
    }
}

/// What a variable is to the person who wrote the Function, for messages: `env TOKEN`, or
/// an outbound header.
fn described(variable: &str) -> String {
    match variable.strip_prefix(wasmless_artifact::HANDLER_ENV_PREFIX) {
        Some(name) => format!("env {name}"),
        None => format!("an outbound header ({variable})"),
    }
}

/// One object's data as text values, read once per resolution.
#[derive(Default)]
struct Read {
    held: BTreeMap<(&'static str, String), Option<Data>>,
}

impl Read {
    async fn object(
        &mut self,
        objects: &impl Objects,
        kind: &'static str,
        name: &str,
    ) -> Result<Option<&Data>, String> {
        let key = (kind, name.to_string());
        if !self.held.contains_key(&key) {
            let data = match kind {
                "Secret" => objects.secret(name).await?,
                _ => objects
                    .configmap(name)
                    .await?
                    .map(|data| data.into_iter().map(|(key, value)| (key, value.into_bytes())).collect()),
            };
            self.held.insert(key.clone(), data);
        }
        Ok(self.held[&key].as_ref())
    }
}

fn text(kind: &str, name: &str, key: &str, bytes: &[u8]) -> Result<String, String> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| format!("{kind} {name} key {key} is not UTF-8 text, which an environment variable must be"))
}

/// A key `envFrom` can make a variable of (the kubelet skips the others too).
fn usable_name(key: &str) -> bool {
    !key.is_empty() && !key.contains(['=', '\0'])
}

/// `entry` with its variables resolved: `envFrom`'s objects first, then `env` in order, a
/// later name replacing an earlier one, as in a container. A missing object or key that is
/// not optional is an error naming it and the variable that reads it.
pub async fn resolve(mut entry: Entry, objects: &impl Objects) -> Result<Entry, String> {
    let mut read = Read::default();
    let mut variables: Vec<(String, String)> = Vec::new();
    let mut set = |name: String, value: String| {
        variables.retain(|(existing, _)| *existing != name);
        variables.push((name, value));
    };
    for source in &entry.env_from {
        let prefix = source.prefix.as_deref().unwrap_or_default();
        let (kind, name, optional) = match (&source.secret_ref, &source.config_map_ref) {
            (Some(secret), None) => ("Secret", &secret.name, secret.optional),
            (None, Some(configmap)) => ("ConfigMap", &configmap.name, configmap.optional),
            _ => return Err("an envFrom entry names neither or both of secretRef and configMapRef".into()),
        };
        match read.object(objects, kind, name).await? {
            Some(data) => {
                for (key, bytes) in data.iter().filter(|(key, _)| usable_name(key)) {
                    set(format!("{prefix}{key}"), text(kind, name, key, bytes)?);
                }
            }
            None if optional == Some(true) => {}
            None => {
                return Err(format!(
                    "{kind} {name} does not exist (envFrom): create it, or mark the reference optional"
                ));
            }
        }
    }
    for var in &entry.env {
        let Some(source) = &var.value_from else {
            set(var.name.clone(), var.value.clone().unwrap_or_default());
            continue;
        };
        let (kind, name, key, optional) = match source {
            EnvVarSource {
                secret_key_ref: Some(selector),
                config_map_key_ref: None,
                field_ref: None,
                resource_field_ref: None,
                ..
            } => ("Secret", &selector.name, &selector.key, selector.optional),
            EnvVarSource {
                secret_key_ref: None,
                config_map_key_ref: Some(selector),
                field_ref: None,
                resource_field_ref: None,
                ..
            } => ("ConfigMap", &selector.name, &selector.key, selector.optional),
            _ => {
                return Err(format!(
                    "{} takes its value from neither a Secret nor a ConfigMap, which is all the pool reads",
                    described(&var.name)
                ));
            }
        };
        let optional = optional == Some(true);
        match read.object(objects, kind, name).await? {
            Some(data) => match data.get(key.as_str()) {
                Some(bytes) => set(var.name.clone(), text(kind, name, key, bytes)?),
                None if optional => {}
                None => {
                    return Err(format!(
                        "{kind} {name} has no key {key} ({}): add it, or mark the reference optional",
                        described(&var.name)
                    ));
                }
            },
            None if optional => {}
            None => {
                return Err(format!(
                    "{kind} {name} does not exist ({}): create it, or mark the reference optional",
                    described(&var.name)
                ));
            }
        }
    }
    entry.resolved = Resolved(variables);
    Ok(entry)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::table::resolve_literal;
    use std::sync::Mutex;

    /// The namespace's objects in memory, counting reads.
    #[derive(Default)]
    struct Namespace {
        secrets: BTreeMap<String, BTreeMap<String, Vec<u8>>>,
        configmaps: BTreeMap<String, BTreeMap<String, String>>,
        forbidden: Vec<String>,
        reads: Mutex<usize>,
    }

    impl Objects for Namespace {
        async fn secret(&self, name: &str) -> Result<Option<Data>, String> {
            *self.reads.lock().unwrap() += 1;
            if self.forbidden.iter().any(|forbidden| forbidden == name) {
                return Err(format!("the pool may not read Secret {name}"));
            }
            Ok(self.secrets.get(name).cloned())
        }
        async fn configmap(&self, name: &str) -> Result<Option<BTreeMap<String, String>>, String> {
            *self.reads.lock().unwrap() += 1;
            Ok(self.configmaps.get(name).cloned())
        }
    }

    fn namespace() -> Namespace {
        Namespace {
            secrets: BTreeMap::from([(
                "api".to_string(),
                BTreeMap::from([
                    ("token".to_string(), b"s3cret".to_vec()),
                    ("user".to_string(), b"ada".to_vec()),
                    ("binary".to_string(), vec![0xff, 0xfe]),
                ]),
            )]),
            configmaps: BTreeMap::from([(
                "settings".to_string(),
                BTreeMap::from([
                    ("GREETING".to_string(), "hello".to_string()),
                    ("COLOUR".to_string(), "blue".to_string()),
                    ("not=a name".to_string(), "skipped".to_string()),
                ]),
            )]),
            ..Default::default()
        }
    }

    fn entry(env: serde_json::Value, env_from: serde_json::Value) -> Entry {
        serde_json::from_value(serde_json::json!({"port": 20001, "args": [], "env": env, "envFrom": env_from})).unwrap()
    }

    fn resolved(entry: &Entry) -> Vec<(&str, &str)> {
        entry
            .resolved
            .0
            .iter()
            .map(|(name, value)| (name.as_str(), value.as_str()))
            .collect()
    }

    #[tokio::test]
    async fn variables_come_from_env_from_then_env_as_in_a_container() {
        let entry = entry(
            serde_json::json!([
                {"name": "WASMLESS_HANDLER_ENV_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}},
                {"name": "WASMLESS_HANDLER_ENV_COLOUR", "value": "red"},
                {"name": "WASMLESS_OUTBOUND_HEADER_0", "valueFrom": {"secretKeyRef": {"name": "api", "key": "user"}}},
            ]),
            serde_json::json!([{"prefix": "WASMLESS_HANDLER_ENV_", "configMapRef": {"name": "settings"}}]),
        );
        let namespace = namespace();
        let entry = resolve(entry, &namespace).await.unwrap();
        assert_eq!(
            resolved(&entry),
            [
                ("WASMLESS_HANDLER_ENV_GREETING", "hello"),
                ("WASMLESS_HANDLER_ENV_TOKEN", "s3cret"),
                ("WASMLESS_HANDLER_ENV_COLOUR", "red"),
                ("WASMLESS_OUTBOUND_HEADER_0", "ada"),
            ]
        );
        assert_eq!(*namespace.reads.lock().unwrap(), 2, "each object is read once");
        let debug = format!("{entry:?}");
        assert!(!debug.contains("s3cret"), "a value reached Debug: {debug}");
    }

    #[tokio::test]
    async fn what_is_missing_is_named_unless_it_is_optional() {
        let namespace = namespace();
        // The error of an entry whose one variable reads `name`'s `key`.
        async fn error_of(namespace: &Namespace, variable: &str, name: &str, key: &str) -> String {
            let env =
                serde_json::json!([{"name": variable, "valueFrom": {"secretKeyRef": {"name": name, "key": key}}}]);
            resolve(entry(env, serde_json::json!([])), namespace).await.unwrap_err()
        }
        assert_eq!(
            error_of(&namespace, "WASMLESS_HANDLER_ENV_TOKEN", "gone", "token").await,
            "Secret gone does not exist (env TOKEN): create it, or mark the reference optional"
        );
        let error = error_of(&namespace, "WASMLESS_HANDLER_ENV_TOKEN", "api", "nope").await;
        assert!(error.starts_with("Secret api has no key nope (env TOKEN)"), "{error}");
        let error = error_of(&namespace, "WASMLESS_HANDLER_ENV_RAW", "api", "binary").await;
        assert!(error.contains("not UTF-8"), "{error}");
        let optional = resolve(
            entry(
                serde_json::json!([{"name": "WASMLESS_HANDLER_ENV_TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "nope", "optional": true}}}]),
                serde_json::json!([{"secretRef": {"name": "gone", "optional": true}}]),
            ),
            &namespace,
        )
        .await
        .unwrap();
        assert!(optional.resolved.0.is_empty());
        let forbidden = Namespace {
            forbidden: vec!["api".into()],
            ..namespace
        };
        let error = error_of(&forbidden, "WASMLESS_HANDLER_ENV_TOKEN", "api", "token").await;
        assert!(error.contains("may not read Secret api"), "{error}");
    }

    #[test]
    fn a_directory_table_takes_literal_values_only() {
        let literal = entry(
            serde_json::json!([{"name": "WASMLESS_HANDLER_ENV_A", "value": "1"}]),
            serde_json::json!([]),
        );
        assert_eq!(
            resolved(&resolve_literal(literal).unwrap()),
            [("WASMLESS_HANDLER_ENV_A", "1")]
        );
        let secret = entry(
            serde_json::json!([]),
            serde_json::json!([{"secretRef": {"name": "api"}}]),
        );
        assert!(resolve_literal(secret).unwrap_err().contains("--pool api:"));
    }
}
