//! Step 6 for `storage: oci`, off the reconcile: the registry keeps only what kept
//! revisions name. A sweep every [`SWEEP_EVERY`] deletes the manifests of revisions cut
//! from a Ready Function's `status.revisions` (as step 6 deletes their ConfigMaps once the
//! current module is Ready, so no pod still pulls one) and of Functions that are gone (the
//! API server's garbage collector does not reach a registry). It deletes a manifest only
//! when two sweeps in a row found it stale, so a build that pushed just before its
//! Function's status named it is never raced; and it lists the Functions from the API
//! server each time, never from a cache that may not be filled yet.

use super::Context;
use crate::crd::{Function, Phase};
use crate::registry::{ManifestRef, Registry, RegistryError, function_of, split_registry, stale_tags};
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use wasmless_artifact::Digest;

/// How often the registry is swept.
pub const SWEEP_EVERY: Duration = Duration::from_secs(20);

/// The 10-hex source tags a Function's manifests may keep: its kept revisions' and the
/// source being built now.
fn kept_tags(func: &Function) -> BTreeSet<String> {
    let Some(status) = func.status.as_ref() else {
        return BTreeSet::new();
    };
    status
        .revisions
        .iter()
        .map(|revision| revision.source_digest.as_str())
        .chain(status.source_digest.as_deref())
        .filter_map(|digest| digest.parse::<Digest>().ok())
        .map(|digest| digest.short())
        .collect()
}

/// One sweep of the registry: deletes what `candidates` (the last sweep's stale manifests,
/// `repository@digest`) still finds stale, and keeps this sweep's for the next. The
/// manifests deleted.
pub async fn sweep(
    ctx: &Context,
    registry: &Registry,
    namespace: Option<&str>,
    candidates: &mut BTreeSet<String>,
) -> Result<Vec<String>, SweepError> {
    let Some(setting) = ctx.settings.oci_registry.as_deref() else {
        return Ok(Vec::new());
    };
    let (host, prefix) = split_registry(setting.trim_end_matches('/'));
    let functions: Api<Function> = match namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let functions = functions.list(&ListParams::default()).await?.items;
    let mut stale_now = BTreeSet::new();
    let mut deleted = Vec::new();
    for repository in registry.repositories(host).await? {
        let Some((ns, name)) = function_of(&repository, prefix) else {
            continue;
        };
        if namespace.is_some_and(|watched| watched != ns) {
            continue;
        }
        let func = functions
            .iter()
            .find(|func| func.namespace().as_deref() == Some(ns.as_str()) && func.name_any() == name);
        // A Function that is not Ready may still have pods of a revision just cut.
        if func.is_some_and(|func| func.status.as_ref().and_then(|status| status.phase) != Some(Phase::Ready)) {
            continue;
        }
        let kept = func.map(kept_tags);
        let tagged = registry.tagged(host, &repository).await?;
        for stale in stale_tags(&tagged, kept.as_ref()) {
            let key = format!("{repository}@{}", stale.digest);
            if !candidates.contains(&key) {
                stale_now.insert(key);
                continue;
            }
            let manifest = ManifestRef {
                host: host.to_string(),
                repository: repository.clone(),
                digest: stale.digest.clone(),
            };
            if registry.delete(&manifest).await? {
                tracing::info!(manifest = %key, function_exists = func.is_some(), "deleted a manifest no kept revision names");
                deleted.push(key);
            }
        }
    }
    *candidates = stale_now;
    Ok(deleted)
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error("listing the Functions: {0}")]
    Kube(#[from] kube::Error),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// Sweeps the registry every [`SWEEP_EVERY`] until the controller stops.
pub(super) async fn sweep_forever(ctx: Arc<Context>, namespace: Option<String>) {
    let Some(registry) = ctx.registry.as_ref() else {
        return;
    };
    tracing::info!(
        every_s = SWEEP_EVERY.as_secs(),
        "sweeping the registry for manifests no kept revision names"
    );
    let mut candidates = BTreeSet::new();
    let mut tick = tokio::time::interval(SWEEP_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tick.tick().await;
        match sweep(&ctx, registry, namespace.as_deref(), &mut candidates).await {
            Ok(_) => failing = false,
            Err(error) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(%error, "cannot sweep the registry; trying again every {} s", SWEEP_EVERY.as_secs());
                }
            }
        }
    }
}
