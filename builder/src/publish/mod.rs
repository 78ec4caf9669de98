//! Shipping a built module to where the runtime loads it from.

mod configmap;
mod oci;

use crate::{Built, CompiledCode};
use serde::Serialize;
use wasmless_artifact::Digest;

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("{0:?} is not a destination: use configmap://<namespace>/<function> or oci://<registry>/<repo>:<tag>")]
    Destination(String),
    #[error("cannot reach the Kubernetes API: {0} (is KUBECONFIG set, or are we in a pod?)")]
    KubeConfig(String),
    #[error("cannot write ConfigMap {name}: {message}")]
    ConfigMap { name: String, message: String },
    #[error("cannot push to {reference}: {message}")]
    Oci { reference: String, message: String },
}

/// Where `--publish` sends the module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    ConfigMap { namespace: String, function: String },
    Oci { reference: String },
}

impl std::str::FromStr for Destination {
    type Err = PublishError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || PublishError::Destination(text.to_string());
        if let Some(rest) = text.strip_prefix("configmap://") {
            let (namespace, function) = rest.split_once('/').ok_or_else(bad)?;
            let valid = |name: &str| {
                !name.is_empty()
                    && name.len() <= 63
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            };
            if !valid(namespace) || !valid(function) {
                return Err(bad());
            }
            return Ok(Self::ConfigMap {
                namespace: namespace.into(),
                function: function.into(),
            });
        }
        if let Some(reference) = text.strip_prefix(wasmless_artifact::oci::SCHEME) {
            reference.parse::<oci_client::Reference>().map_err(|_| bad())?;
            return Ok(Self::Oci {
                reference: reference.into(),
            });
        }
        Err(bad())
    }
}

/// What was published, for the JSON result line.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Published {
    /// `configmap://ns/fn` or `oci://registry/repo@sha256:<manifest>`.
    pub location: String,
    /// ConfigMap names, in chunk order (ConfigMap publishing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub config_maps: Vec<String>,
    /// The compiled code's ConfigMap names, in chunk order (ConfigMap publishing).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub code_config_maps: Vec<String>,
}

/// Publishes the module and, when there is one, its compiled code beside it.
pub async fn publish(
    destination: &Destination,
    built: &Built,
    code: Option<&CompiledCode>,
    source_digest: &Digest,
) -> Result<Published, PublishError> {
    match destination {
        Destination::ConfigMap { namespace, function } => {
            configmap::publish(namespace, function, built, code, source_digest).await
        }
        Destination::Oci { reference } => oci::publish(reference, &built.wasm, code).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_parse_or_say_what_to_write() {
        assert_eq!(
            "configmap://default/hello".parse::<Destination>().unwrap(),
            Destination::ConfigMap {
                namespace: "default".into(),
                function: "hello".into()
            }
        );
        assert_eq!(
            "oci://localhost:5000/fns/hello:v1".parse::<Destination>().unwrap(),
            Destination::Oci {
                reference: "localhost:5000/fns/hello:v1".into()
            }
        );
        for bad in ["configmap://default", "configmap://Default/x", "s3://bucket/x", "hello"] {
            let error = bad.parse::<Destination>().unwrap_err().to_string();
            assert!(error.contains("configmap://<namespace>/<function>"), "{error}");
        }
    }
}
