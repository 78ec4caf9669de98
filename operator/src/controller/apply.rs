//! Server-side apply, skipped when the live object already holds every field of the
//! desired one, so an unchanged reconcile writes nothing (and restarts nothing).

use crate::Error;
use crate::objects::MANAGER;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Server-side applies `desired` unless the live object already holds every field of it;
/// whether it wrote.
pub(super) async fn apply_if_changed<K>(api: &Api<K>, desired: &K) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let existing = api.get_opt(&desired.name_any()).await?;
    apply_if_changed_with(api, existing.as_ref(), desired).await
}

/// [`apply_if_changed`] against a live object already read.
pub(super) async fn apply_if_changed_with<K>(api: &Api<K>, existing: Option<&K>, desired: &K) -> Result<bool, Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    if let Some(existing) = existing
        && is_subset(&serde_json::to_value(desired)?, &serde_json::to_value(existing)?)
    {
        return Ok(false);
    }
    api.patch(
        &desired.name_any(),
        &PatchParams::apply(MANAGER).force(),
        &Patch::Apply(desired),
    )
    .await?;
    Ok(true)
}

/// Whether every field set in `part` has the same value in `whole` (lists element-wise,
/// same length). Fields the API server defaults are only in `whole` and do not count;
/// a zero value in `part` (`false`, `0`, `""`, `{}`, `[]`) matches a field `whole` lacks,
/// since the API server drops such fields rather than store them (Go's `omitempty`).
pub fn is_subset(part: &serde_json::Value, whole: &serde_json::Value) -> bool {
    use serde_json::Value;
    fn is_zero(value: &Value) -> bool {
        match value {
            Value::Null => true,
            Value::Bool(b) => !b,
            Value::Number(n) => n.as_f64() == Some(0.0),
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.values().all(is_zero),
        }
    }
    match (part, whole) {
        (Value::Object(part), Value::Object(whole)) => part
            .iter()
            .all(|(key, value)| whole.get(key).map_or(is_zero(value), |w| is_subset(value, w))),
        (Value::Array(part), Value::Array(whole)) => {
            part.len() == whole.len() && part.iter().zip(whole).all(|(p, w)| is_subset(p, w))
        }
        _ => part == whole,
    }
}
