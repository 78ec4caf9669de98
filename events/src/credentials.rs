//! The broker's one password: in a Secret of this component's namespace, made with random
//! bytes by the first replica that finds it missing; the installed broker reads it from the
//! same Secret. No tenant holds it, so no tenant connects to the broker (docs/security.md,
//! door 8).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use rand::RngCore;
use std::collections::BTreeMap;
use thiserror::Error;

/// The user the installed broker knows this component by (deploy/events/nats.yaml).
pub const USER: &str = "wasmless-events";
/// The key of the password in the Secret.
pub const PASSWORD_KEY: &str = "password";

#[derive(Debug, Error)]
pub enum CredentialsError {
    #[error("reading or making Secret {namespace}/{name}, the broker's password: {source}")]
    Api {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "Secret {namespace}/{name} has no text `{PASSWORD_KEY}`: delete it, and it is made again (then restart the broker's pod)"
    )]
    NoPassword { namespace: String, name: String },
}

/// The password in Secret `namespace/name`, which is made first if missing.
pub async fn ensure_password(client: kube::Client, namespace: &str, name: &str) -> Result<String, CredentialsError> {
    let api: kube::Api<Secret> = kube::Api::namespaced(client, namespace);
    let failed = |source| CredentialsError::Api {
        namespace: namespace.to_string(),
        name: name.to_string(),
        source,
    };
    let secret = match api.get_opt(name).await.map_err(failed)? {
        Some(secret) => secret,
        None => {
            let mut bytes = [0u8; 32];
            rand::rng().fill_bytes(&mut bytes);
            let made = Secret {
                metadata: ObjectMeta {
                    name: Some(name.to_string()),
                    labels: Some(BTreeMap::from([(
                        "app.kubernetes.io/part-of".to_string(),
                        "wasmless".to_string(),
                    )])),
                    ..Default::default()
                },
                data: Some(BTreeMap::from([(
                    PASSWORD_KEY.to_string(),
                    ByteString(hex::encode(bytes).into_bytes()),
                )])),
                ..Default::default()
            };
            match api.create(&PostParams::default(), &made).await {
                Ok(secret) => {
                    tracing::info!(%namespace, %name, "made the broker's password");
                    secret
                }
                // Another replica made it first: its password is the one.
                Err(kube::Error::Api(status)) if status.code == 409 => api.get(name).await.map_err(failed)?,
                Err(error) => return Err(failed(error)),
            }
        }
    };
    secret
        .data
        .and_then(|mut data| data.remove(PASSWORD_KEY))
        .and_then(|password| String::from_utf8(password.0).ok())
        .filter(|password| !password.is_empty())
        .ok_or_else(|| CredentialsError::NoPassword {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
}
