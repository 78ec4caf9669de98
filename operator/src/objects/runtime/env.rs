//! The runtime container's environment: the operator's settings, the pod's IP, the outbound
//! headers' Secrets and the handler's own variables, as the kubelet will resolve them.

use super::*;

pub use wasmless_artifact::HANDLER_ENV_PREFIX;
/// The pod's IP, from the downward API: the runtime refuses outbound calls to its own admin
/// port on it.
pub const POD_IP_ENV: &str = "WASMLESS_POD_IP";

/// The container variable holding the value of `outbound.headers[index]`, which the
/// runtime reads and the handler never sees.
pub fn outbound_header_env(index: usize) -> String {
    format!("WASMLESS_OUTBOUND_HEADER_{index}")
}

/// The runtime container's environment: the operator's settings, the pod's IP, the
/// outbound headers' Secrets, and the handler's `env`, each under [`HANDLER_ENV_PREFIX`].
/// Values from Secrets and ConfigMaps are references the kubelet resolves when the pod
/// starts: they are never in the Deployment, and the operator never reads them.
pub(super) fn runtime_env(func: &Function, settings: &Settings) -> Vec<EnvVar> {
    let mut env: Vec<EnvVar> = runtime_settings_env(settings).collect();
    env.push(EnvVar {
        name: POD_IP_ENV.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "status.podIP".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    env.extend(function_env(func, Expansion::Kubelet));
    env
}

/// Whether a literal value is read by the kubelet, which expands `$(NAME)` and turns `$$`
/// into `$` (a pod's container), or taken as is (the pool's entry).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Expansion {
    Kubelet,
    None,
}

/// The Function's own variables: its outbound headers' values and its handler's `env`,
/// under the names the runtime reads them by.
pub fn function_env(func: &Function, expansion: Expansion) -> Vec<EnvVar> {
    let mut env = Vec::new();
    let headers = func.spec.outbound.iter().flat_map(|outbound| &outbound.headers);
    env.extend(headers.enumerate().map(|(index, header)| {
        let secret = &header.value_from.secret_key_ref;
        EnvVar {
            name: outbound_header_env(index),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret.name.clone(),
                    key: secret.key.clone(),
                    optional: None,
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }));
    env.extend(func.spec.env.iter().map(|var| handler_env_var(var, expansion)));
    env
}

/// One variable of the handler's environment as a container variable. For the kubelet, a
/// literal value has every `$` doubled: it expands `$(NAME)` in container variables and
/// turns `$$` into `$`, and the handler must get exactly what the Function says.
fn handler_env_var(var: &crate::crd::EnvVar, expansion: Expansion) -> EnvVar {
    let source = var.value_from.as_ref();
    let literal = var.value.as_deref().unwrap_or_default();
    EnvVar {
        name: format!("{HANDLER_ENV_PREFIX}{}", var.name),
        value: match (source, expansion) {
            (Some(_), _) => None,
            (None, Expansion::Kubelet) => Some(literal.replace('$', "$$")),
            (None, Expansion::None) => Some(literal.to_string()),
        },
        value_from: source.map(|source| EnvVarSource {
            secret_key_ref: source.secret_key_ref.as_ref().map(|key| SecretKeySelector {
                name: key.name.clone(),
                key: key.key.clone(),
                optional: key.optional,
            }),
            config_map_key_ref: source.config_map_key_ref.as_ref().map(|key| ConfigMapKeySelector {
                name: key.name.clone(),
                key: key.key.clone(),
                optional: key.optional,
            }),
            ..Default::default()
        }),
    }
}

/// The Function's `envFrom`, each under [`HANDLER_ENV_PREFIX`] (and the entry's own prefix).
pub fn handler_env_from(func: &Function) -> Vec<EnvFromSource> {
    func.spec
        .env_from
        .iter()
        .map(|source| EnvFromSource {
            prefix: Some(format!(
                "{HANDLER_ENV_PREFIX}{}",
                source.prefix.as_deref().unwrap_or_default()
            )),
            secret_ref: source.secret_ref.as_ref().map(|secret| SecretEnvSource {
                name: secret.name.clone(),
                optional: secret.optional,
            }),
            config_map_ref: source.config_map_ref.as_ref().map(|cm| ConfigMapEnvSource {
                name: cm.name.clone(),
                optional: cm.optional,
            }),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// The kubelet's expansion of a container variable's value, after Kubernetes'
    /// `third_party/forked/golang/expansion/expand.go`: `$$` is `$`, `$(NAME)` is the value
    /// of an earlier variable (left as written when there is none), any other `$` stays.
    fn kubelet_expand(input: &str, defined: &BTreeMap<&str, &str>) -> String {
        let mut out = String::new();
        let mut rest = input;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            if let Some(tail) = after.strip_prefix('$') {
                out.push('$');
                rest = tail;
            } else if let Some(reference) = after.strip_prefix('(')
                && let Some(close) = reference.find(')')
            {
                let name = &reference[..close];
                match defined.get(name) {
                    Some(value) => out.push_str(value),
                    None => out.push_str(&format!("$({name})")),
                }
                rest = &reference[close + 1..];
            } else {
                out.push('$');
                rest = after;
            }
        }
        out.push_str(rest);
        out
    }

    #[test]
    fn a_literal_value_reaches_the_handler_as_written() {
        let defined = BTreeMap::from([("WASMLESS_POD_IP", "10.0.0.7"), ("HOME", "/root")]);
        for value in [
            "plain",
            "$(WASMLESS_POD_IP)",
            "$$(HOME)",
            "a$$b",
            "$",
            "cost: 5$",
            "$(",
            "$(UNDEFINED)",
            "x$$$(HOME)y",
        ] {
            let var = crate::crd::EnvVar {
                name: "V".into(),
                value: Some(value.into()),
                value_from: None,
            };
            let container_var = handler_env_var(&var, Expansion::Kubelet);
            assert_eq!(container_var.name, "WASMLESS_HANDLER_ENV_V");
            let written = container_var.value.unwrap();
            assert_eq!(kubelet_expand(&written, &defined), value, "written as {written:?}");
        }
        // The expansion above is the kubelet's: unescaped, these would not arrive intact.
        assert_eq!(kubelet_expand("$(HOME)", &defined), "/root");
        assert_eq!(kubelet_expand("a$$b", &defined), "a$b");
    }
}
