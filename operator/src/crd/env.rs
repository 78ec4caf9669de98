//! The handler's environment: literal values, and keys of Secrets and ConfigMaps (`env`,
//! `envFrom`), as a container's.

use super::*;

/// One variable of the handler's environment: a literal `value`, or `valueFrom` a key of a
/// Secret or a ConfigMap, as in a container's `env`. Neither is an empty value, as in
/// Kubernetes (and as this field accepted before `valueFrom`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.value) && has(self.valueFrom))")
    .message("an env entry takes value or valueFrom, not both"))]
pub struct EnvVar {
    #[schemars(length(min = 1, max = 256), regex(pattern = ENV_NAME_PATTERN))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32768))]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<EnvVarSource>,
}

/// Where a variable's value comes from: one key of a Secret or of a ConfigMap in the
/// Function's namespace. The kubelet reads it when a runtime pod starts.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.secretKeyRef) ? 1 : 0) + (has(self.configMapKeyRef) ? 1 : 0) == 1")
    .message("valueFrom takes exactly one of secretKeyRef or configMapKeyRef"))]
pub struct EnvVarSource {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
}

/// One key of a Secret or a ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct KeyRef {
    /// The object's name, in the Function's namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    #[schemars(length(min = 1, max = 253), regex(pattern = DATA_KEY_PATTERN))]
    pub key: String,
    /// The variable is left out when the object or the key does not exist, instead of the
    /// Function waiting for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// Every key of a Secret or a ConfigMap as a variable, as a container's `envFrom`: `env`
/// wins over it, and a later entry over an earlier one.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.secretRef) ? 1 : 0) + (has(self.configMapRef) ? 1 : 0) == 1")
    .message("an envFrom entry takes exactly one of secretRef or configMapRef"))]
pub struct EnvFromSource {
    /// Put before every key's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128), regex(pattern = ENV_NAME_PATTERN))]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<EnvSourceRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<EnvSourceRef>,
}

/// A whole Secret or ConfigMap.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct EnvSourceRef {
    /// The object's name, in the Function's namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = OBJECT_NAME_PATTERN))]
    pub name: String,
    /// Nothing is added when the object does not exist, instead of the Function waiting for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}
