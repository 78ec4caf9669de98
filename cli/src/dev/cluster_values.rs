//! What a runtime pod's kubelet would resolve from the cluster, given on `wasmless dev`'s
//! command line instead: the keys of Secrets and ConfigMaps a Function reads
//! (`env[].valueFrom`, `envFrom`, `outbound.headers[].valueFrom`, `outbound.caBundle`).
//! The variables are the operator's own (`function_env`, `handler_env_from`), resolved
//! as the kubelet resolves them: `envFrom` first, `env` over it, a missing optional key
//! left out, a missing required one an error that names the flag to add.

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::EnvVar;
use std::path::{Path, PathBuf};
use wasmless_operator::Function;
use wasmless_operator::objects::{Expansion, HANDLER_ENV_PREFIX, function_env, handler_env_from};

#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterValues {
    /// A key of a Secret the Function reads, as the cluster would hold it:
    /// `NAME/KEY=@FILE` for a file's contents (which keeps the value out of `ps` and the
    /// shell's history), or `NAME/KEY=VALUE`. Repeatable.
    #[arg(long = "secret", value_name = "NAME/KEY=VALUE", value_parser = ObjectKey::parse)]
    pub secrets: Vec<ObjectKey>,
    /// A key of a ConfigMap the Function reads (`outbound.caBundle` too): `NAME/KEY=VALUE`
    /// or `NAME/KEY=@FILE`. Repeatable.
    #[arg(long = "config-map", value_name = "NAME/KEY=VALUE", value_parser = ObjectKey::parse)]
    pub config_maps: Vec<ObjectKey>,
}

/// One key of a Secret or a ConfigMap, and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectKey {
    pub object: String,
    pub key: String,
    pub value: String,
}

impl ObjectKey {
    fn parse(text: &str) -> Result<Self, String> {
        let shape = || format!("{text:?} is not NAME/KEY=VALUE (or NAME/KEY=@FILE)");
        let (reference, value) = text.split_once('=').ok_or_else(shape)?;
        let (object, key) = reference.split_once('/').ok_or_else(shape)?;
        if object.is_empty() || key.is_empty() {
            return Err(shape());
        }
        let value = match value.strip_prefix('@') {
            Some(file) => std::fs::read_to_string(file).map_err(|e| format!("cannot read {file}: {e}"))?,
            None => value.to_string(),
        };
        Ok(Self {
            object: object.into(),
            key: key.into(),
            value,
        })
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Secret,
    ConfigMap,
}

impl Kind {
    fn words(self) -> (&'static str, &'static str) {
        match self {
            Kind::Secret => ("Secret", "--secret"),
            Kind::ConfigMap => ("ConfigMap", "--config-map"),
        }
    }
}

impl ClusterValues {
    fn of(&self, kind: Kind) -> &[ObjectKey] {
        match kind {
            Kind::Secret => &self.secrets,
            Kind::ConfigMap => &self.config_maps,
        }
    }

    fn value(&self, kind: Kind, object: &str, key: &str) -> Option<&str> {
        let given = self.of(kind).iter().rev();
        given
            .filter(|k| k.object == object && k.key == key)
            .map(|k| k.value.as_str())
            .next()
    }

    /// The runtime's environment for `func`, as the kubelet would give its pod: the
    /// handler's variables under `WASMLESS_HANDLER_ENV_`, the outbound headers' values.
    pub fn environment(&self, func: &Function) -> anyhow::Result<Vec<(String, String)>> {
        let mut environment = Vec::new();
        for source in handler_env_from(func) {
            let prefix = source.prefix.unwrap_or_default();
            let (kind, name, optional) = match (source.secret_ref, source.config_map_ref) {
                (Some(secret), _) => (Kind::Secret, secret.name, secret.optional),
                (None, Some(config_map)) => (Kind::ConfigMap, config_map.name, config_map.optional),
                (None, None) => continue,
            };
            let keys: Vec<&ObjectKey> = self.of(kind).iter().filter(|k| k.object == name).collect();
            if keys.is_empty() && optional != Some(true) {
                let (what, flag) = kind.words();
                bail!(
                    "spec.envFrom takes every key of {what} {name}, and `wasmless dev` has no cluster to read it from: pass each key with `{flag} {name}/KEY=VALUE`"
                );
            }
            environment.extend(keys.iter().map(|k| (format!("{prefix}{}", k.key), k.value.clone())));
        }
        for (index, variable) in function_env(func, Expansion::None).into_iter().enumerate() {
            if let Some(value) = self.resolve(func, index, &variable)? {
                environment.push((variable.name, value));
            }
        }
        Ok(environment)
    }

    /// One of `function_env`'s variables: its literal value, the value given for the key it
    /// reads, nothing for a missing optional key, or an error naming the flag to add.
    fn resolve(&self, func: &Function, index: usize, variable: &EnvVar) -> anyhow::Result<Option<String>> {
        let Some(source) = &variable.value_from else {
            return Ok(Some(variable.value.clone().unwrap_or_default()));
        };
        let (kind, name, key, optional) = match (&source.secret_key_ref, &source.config_map_key_ref) {
            (Some(secret), _) => (Kind::Secret, &secret.name, &secret.key, secret.optional),
            (None, Some(config_map)) => (Kind::ConfigMap, &config_map.name, &config_map.key, config_map.optional),
            (None, None) => return Ok(None),
        };
        if let Some(value) = self.value(kind, name, key) {
            return Ok(Some(value.to_string()));
        }
        if optional == Some(true) {
            return Ok(None);
        }
        let field = match variable.name.strip_prefix(HANDLER_ENV_PREFIX) {
            Some(handler_variable) => format!("spec.env {handler_variable}"),
            None => {
                let headers = func.spec.outbound.iter().flat_map(|outbound| &outbound.headers);
                let header = headers
                    .clone()
                    .nth(index)
                    .map(|h| format!(" ({} for {})", h.name, h.url));
                format!("spec.outbound.headers[{index}]{}", header.unwrap_or_default())
            }
        };
        let (what, flag) = kind.words();
        bail!(
            "{field} takes key {key} of {what} {name}, and `wasmless dev` has no cluster to read it from: pass its value with `{flag} {name}/{key}=VALUE` (or `=@FILE`)"
        )
    }

    /// `outbound.caBundle`'s certificates written to a file in `work`, for `--outbound-ca`.
    pub fn ca_bundle_file(&self, func: &Function, work: &Path) -> anyhow::Result<Option<PathBuf>> {
        let Some(bundle) = func.spec.outbound.as_ref().and_then(|o| o.ca_bundle.as_ref()) else {
            return Ok(None);
        };
        let (name, key) = (&bundle.config_map_key_ref.name, &bundle.config_map_key_ref.key);
        let Some(pem) = self.value(Kind::ConfigMap, name, key) else {
            bail!(
                "spec.outbound.caBundle takes key {key} of ConfigMap {name}, and `wasmless dev` has no cluster to read it from: pass the certificates with `--config-map {name}/{key}=@ca.pem`"
            );
        };
        let path = work.join("outbound-ca.pem");
        std::fs::write(&path, pem).with_context(|| format!("cannot write {}", path.display()))?;
        Ok(Some(path))
    }
}
