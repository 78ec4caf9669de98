//! What a Function no longer uses: its Service under an older name (step 4), and the Jobs
//! of its older sources and the ConfigMaps of revisions no longer kept, once the current
//! module is Ready (step 6).

use super::{Context, Doing, READY, StepError};
use crate::Error;
use crate::crd::Function;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, ResourceExt};
use wasmless_artifact::{Digest, labels};

/// Deletes this Function's Services under another name than `spec.service` now gives.
pub(super) async fn remove_renamed_services(
    services: &Api<Service>,
    func: &Function,
    current: &str,
) -> Result<(), StepError> {
    let selector = format!("{}={}", labels::FUNCTION, func.name_any());
    let uid = func.uid();
    let listed = services
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .doing(READY, || format!("listing the Services of {}", func.name_any()))?;
    for service in listed.items {
        let owned = service.owner_references().iter().any(|o| Some(&o.uid) == uid.as_ref());
        let old = service.name_any();
        if owned && old != current {
            services
                .delete(&old, &DeleteParams::default())
                .await
                .doing(READY, || format!("deleting the Service {old}, renamed to {current}"))?;
        }
    }
    Ok(())
}

/// Deletes the Jobs of this Function's other sources than `current`, and the source and
/// chunk ConfigMaps of those no kept revision was built from.
pub(super) async fn collect_old_builds(
    ctx: &Context,
    func: &Function,
    current: &Digest,
    kept: &[Digest],
) -> Result<(), Error> {
    let (name, ns) = (func.name_any(), func.namespace().unwrap_or_default());
    let ns = ns.as_str();
    // Only what the Function owns: a label anyone may have put on their own objects.
    let uid = func.uid().unwrap_or_default();
    let ours = |meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| super::apply::owned_by(meta, &uid);
    let selector = format!(
        "{}={name},{}!={}",
        labels::FUNCTION,
        labels::SOURCE_DIGEST,
        labels::digest_value(current)
    );
    let params = ListParams::default().labels(&selector);
    let jobs: Api<Job> = Api::namespaced(ctx.client.clone(), ns);
    for job in jobs.list_metadata(&params).await?.items {
        if job.labels().contains_key(labels::SOURCE_DIGEST) && ours(&job.metadata) {
            jobs.delete(&job.name_any(), &DeleteParams::background()).await?;
        }
    }
    let kept: Vec<String> = kept.iter().map(labels::digest_value).collect();
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    for cm in configmaps.list_metadata(&params).await?.items {
        let source = cm.labels().get(labels::SOURCE_DIGEST);
        if source.is_some_and(|source| !kept.contains(source)) && ours(&cm.metadata) {
            configmaps.delete(&cm.name_any(), &DeleteParams::default()).await?;
        }
    }
    Ok(())
}
