//! Server-side apply, skipped when the live object already holds every field of the
//! desired one, so an unchanged reconcile writes nothing (and restarts nothing); and never
//! over an object of the same name that its Function does not own.
//!
//! Server-side apply with `force` takes any object of the name, whoever made it: a
//! Function whose `spec.service` named an existing Service would rewrite its selector, and
//! the owner reference it added would have the garbage collector delete it with the
//! Function. So an object the Function's desired one names an owner for is written only
//! when it does not exist or already carries that owner's UID (docs/security.md, door 3).

use crate::Error;
use crate::crd::Function;
use crate::objects::MANAGER;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::fmt::Debug;

/// Whether `meta` names the owner whose UID is `uid` among its owner references.
pub(super) fn owned_by(meta: &ObjectMeta, uid: &str) -> bool {
    meta.owner_references.iter().flatten().any(|owner| owner.uid == uid)
}

/// `existing` when it is `func`'s (or absent); [`Error::NotOwner`] when it is someone else's.
pub(super) fn owned<K>(existing: Option<K>, func: &Function) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()>,
{
    match (&existing, func.uid()) {
        (Some(object), Some(uid)) if !owned_by(object.meta(), &uid) => Err(Error::NotOwner {
            kind: K::kind(&()).into_owned(),
            name: object.name_any(),
        }),
        _ => Ok(existing),
    }
}

/// Reads the object `name` of `func`'s, refusing one that is someone else's, so that
/// nothing the reconcile decides rests on an object its Function does not own.
pub(super) async fn get_owned<K>(api: &Api<K>, name: &str, func: &Function) -> Result<Option<K>, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    owned(api.get_opt(name).await?, func)
}

/// Server-side applies `desired` unless the live object already holds every field of it;
/// whether it wrote.
pub(super) async fn apply_if_changed<K>(api: &Api<K>, desired: &K) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    let existing = api.get_opt(&desired.name_any()).await?;
    apply_if_changed_with(api, existing.as_ref(), desired).await
}

/// [`apply_if_changed`] against a live object already read. A live object that lacks an
/// owner `desired` names is not written ([`Error::NotOwner`]); shared objects (the
/// namespace's builder and pool identities, the pool's Deployment) name no owner.
pub(super) async fn apply_if_changed_with<K>(api: &Api<K>, existing: Option<&K>, desired: &K) -> Result<bool, Error>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + Debug,
{
    if let Some(existing) = existing {
        let not_ours = desired
            .owner_references()
            .iter()
            .find(|owner| !owned_by(existing.meta(), &owner.uid));
        if not_ours.is_some() {
            return Err(Error::NotOwner {
                kind: K::kind(&()).into_owned(),
                name: existing.name_any(),
            });
        }
        if is_subset(&serde_json::to_value(desired)?, &serde_json::to_value(existing)?) {
            return Ok(false);
        }
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
