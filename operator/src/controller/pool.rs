//! Step 4 for a Function with `scale.min: 0`: the namespace's pool (its identity and
//! Deployment), the Function's entry in the pool's table, and whether the pool's pods
//! serve it yet (asked of each ready pool pod's `GET /pool`). And off the reconcile: a
//! pool no Function needs any more is scaled to zero pods.

use super::apply::{apply_if_changed, apply_if_changed_with};
use super::{Context, Doing, READY, StepError};
use crate::Error;
use crate::crd::Function;
use crate::module::Module;
use crate::objects::{self, POOL_NAME};
use crate::references::{self, ConfigKind};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Api, Resource, ResourceExt};
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmless_artifact::{Digest, ports};

/// How the pool stands for one Function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PoolState {
    /// Every ready pool pod (at least one) listens on the Function's port.
    Serving,
    /// Not yet, and why (for the Ready condition).
    NotYet(String),
}

/// Writes the pool's ServiceAccount, Role, RoleBinding and Deployment in `ns` where they
/// differ from what this operator would write; the Role names the Secrets that `func` and
/// the namespace's other pooled Functions read.
pub(super) async fn ensure_pool(ctx: &Context, func: &Function, ns: &str) -> Result<(), StepError> {
    let secrets = pooled_secrets(ctx, func, ns)
        .await
        .doing(READY, || format!("listing the Functions of namespace {ns}"))?;
    let (account, role, binding) = objects::pool_rbac(ns, &secrets);
    let client = &ctx.client;
    apply_if_changed(&Api::<ServiceAccount>::namespaced(client.clone(), ns), &account)
        .await
        .doing(READY, || format!("applying the ServiceAccount {POOL_NAME}"))?;
    apply_if_changed(&Api::<Role>::namespaced(client.clone(), ns), &role)
        .await
        .doing(READY, || format!("applying the Role {POOL_NAME}"))?;
    apply_if_changed(&Api::<RoleBinding>::namespaced(client.clone(), ns), &binding)
        .await
        .doing(READY, || format!("applying the RoleBinding {POOL_NAME}"))?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let desired = objects::pool_deployment(ns, &ctx.settings);
    let existing = deployments
        .get_opt(POOL_NAME)
        .await
        .doing(READY, || format!("reading the Deployment {POOL_NAME}"))?;
    apply_if_changed_with(&deployments, existing.as_ref(), &desired)
        .await
        .doing(READY, || format!("applying the Deployment {POOL_NAME}"))?;
    Ok(())
}

/// The Secrets the pool of `ns` may read: those of `func` (as this reconcile sees it) and
/// of every other Function of `ns` that is pooled or still has an entry there.
async fn pooled_secrets(ctx: &Context, func: &Function, ns: &str) -> Result<BTreeSet<String>, kube::Error> {
    let others: Vec<Arc<Function>> = match ctx.functions.get() {
        Some(store) => store.state(),
        None => Api::<Function>::namespaced(ctx.client.clone(), ns)
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .map(Arc::new)
            .collect(),
    };
    let name = func.name_any();
    let others = others
        .iter()
        .map(|other| other.as_ref())
        .filter(|other| other.name_any() != name);
    Ok(secrets_read_in_pool(others.chain(std::iter::once(func)), ns))
}

/// The Secrets that the Functions of `ns` among `functions` read while they are in its
/// pool (pooled, or leaving with an entry still there).
fn secrets_read_in_pool<'a>(functions: impl IntoIterator<Item = &'a Function>, ns: &str) -> BTreeSet<String> {
    let in_pool = |func: &Function| {
        let pooled = func.spec.scales_to_zero() && func.spec.pool_refusal().is_none();
        pooled || func.status.as_ref().is_some_and(|status| status.pool_port.is_some())
    };
    functions
        .into_iter()
        .filter(|func| func.namespace().as_deref() == Some(ns) && in_pool(func))
        .flat_map(|func| references::references(&func.spec))
        .filter(|reference| reference.kind == ConfigKind::Secret)
        .map(|reference| reference.name)
        .collect()
}

/// Narrows each pool's Role to the Secrets its namespace's pooled Functions read now: a
/// Function deleted, gone to pods or changed no longer lets the pool read its Secrets.
/// (Reconciles only ever write the Role of a Function they see; this is the one that
/// notices what is gone.) The namespaces whose Role changed.
pub async fn narrow_pool_roles(
    ctx: &Context,
    deployments: &Api<Deployment>,
    functions: &[Arc<Function>],
) -> Result<Vec<String>, Error> {
    let pools = deployments
        .list(&ListParams::default().labels(&objects::pool_deployment_selector()))
        .await?;
    let mut narrowed = Vec::new();
    for pool in pools.items.iter().filter(|pool| pool.name_any() == POOL_NAME) {
        let Some(ns) = pool.namespace() else { continue };
        let secrets = secrets_read_in_pool(functions.iter().map(|func| func.as_ref()), &ns);
        let (_, role, _) = objects::pool_rbac(&ns, &secrets);
        if apply_if_changed(&Api::<Role>::namespaced(ctx.client.clone(), &ns), &role).await? {
            tracing::info!(namespace = %ns, secrets = ?secrets, "the pool's Role now names only the Secrets its Functions read");
            narrowed.push(ns);
        }
    }
    Ok(narrowed)
}

/// What a pooled Function's entry is made of, beside its port and route.
pub(super) struct EntryParts<'a> {
    pub module: &'a Module,
    /// The hash of the resourceVersions of what its `env` reads.
    pub config_hash: Option<&'a Digest>,
}

/// Writes the Function's entry in the pool's table (`served_by_pods`: the Service routes
/// to the Function's own pods); the Function's port in the pool. A
/// Function keeps the port its entry has; a new one gets a port no other entry of the
/// namespace holds (allocations are serialized in this process, the only writer).
pub(super) async fn write_entry(
    ctx: &Context,
    func: &Function,
    ns: &str,
    entry: &EntryParts<'_>,
    served_by_pods: bool,
) -> Result<u16, StepError> {
    let name = func.name_any();
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    let entry_name = objects::pool_entry_name(&name);
    let _allocating = ctx.pool_ports.lock().await;
    let existing = super::apply::get_owned(&configmaps, &entry_name, func)
        .await
        .doing(READY, || format!("reading the pool entry {entry_name}"))?;
    let port = match existing.as_ref().and_then(objects::pool_entry_port) {
        Some(port) => port,
        None => {
            let entries = configmaps
                .list(&ListParams::default().labels(&objects::pool_entry_selector()))
                .await
                .doing(READY, || format!("listing the pool entries of namespace {ns}"))?;
            let taken: BTreeSet<u16> = entries
                .items
                .iter()
                .filter(|entry| entry.name_any() != entry_name)
                .filter_map(objects::pool_entry_port)
                .collect();
            objects::free_pool_port(&name, &taken)
                .ok_or_else(|| Error::PoolFull(ns.to_string()))
                .doing(READY, || format!("giving {name} a port in the pool"))?
        }
    };
    let desired = objects::pool_entry(func, entry.module, port, served_by_pods, entry.config_hash);
    apply_if_changed_with(&configmaps, existing.as_ref(), &desired)
        .await
        .doing(READY, || format!("writing the pool entry {entry_name}"))?;
    Ok(port)
}

/// Removes the Function's entry from the pool's table (the Function is no longer served
/// there); nothing when it has none.
pub(super) async fn remove_entry(ctx: &Context, func: &Function, ns: &str) -> Result<(), StepError> {
    let entry_name = objects::pool_entry_name(&func.name_any());
    let configmaps: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), ns);
    // Only the entry this Function owns, and only that very object (its UID), never one
    // of the name made since by someone else.
    let Some(entry) = super::apply::get_owned(&configmaps, &entry_name, func)
        .await
        .doing(READY, || format!("reading the pool entry {entry_name}"))?
    else {
        return Ok(());
    };
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: entry.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match configmaps.delete(&entry_name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(error) => Err(error).doing(READY, || format!("deleting the pool entry {entry_name}")),
    }
}

/// The IPs of the pool's ready pods in `ns`.
pub(super) async fn ready_pool_pods(ctx: &Context, ns: &str) -> Result<Vec<String>, Error> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let selector = objects::pool_pod_selector()
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",");
    let list = pods.list(&ListParams::default().labels(&selector)).await?;
    Ok(list
        .items
        .iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none() && is_ready(pod))
        .filter_map(|pod| pod.status.as_ref()?.pod_ip.clone())
        .collect())
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Whether every ready pool pod of `ns` serves `function` on `port`.
pub(super) async fn pool_state(ctx: &Context, ns: &str, function: &str, port: u16) -> PoolState {
    let ips = match ready_pool_pods(ctx, ns).await {
        Ok(ips) => ips,
        Err(error) => return PoolState::NotYet(format!("cannot list the pool's pods: {error}")),
    };
    if ips.is_empty() {
        return PoolState::NotYet(format!("the pool ({POOL_NAME}) has no ready pod yet"));
    }
    for ip in &ips {
        match serves(ip, function, port).await {
            Ok(true) => {}
            Ok(false) => return PoolState::NotYet(format!("pool pod {ip} does not listen for {function} yet")),
            Err(error) => return PoolState::NotYet(format!("cannot ask pool pod {ip}: {error}")),
        }
    }
    PoolState::Serving
}

/// `GET http://<ip>:<admin>/pool`: whether the pod lists `function` listening on `port`.
async fn serves(ip: &str, function: &str, port: u16) -> Result<bool, String> {
    let body = get(&format!("http://{}/pool", pod_addr(ip))).await?;
    let value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|error| format!("its /pool is not JSON: {error}"))?;
    let entry = &value["functions"][function];
    Ok(entry["listening"] == serde_json::Value::Bool(true) && entry["port"].as_u64() == Some(port.into()))
}

/// `ip:admin port`, IPv6 bracketed.
pub(super) fn pod_addr(ip: &str) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{}", ports::ADMIN)
    } else {
        format!("{ip}:{}", ports::ADMIN)
    }
}

/// A GET to a pod's admin port, with a short deadline: a pod that does not answer in a
/// second is not one to route to.
pub(super) async fn get(url: &str) -> Result<Bytes, String> {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: hyper::Uri = url.parse().map_err(|error| format!("{url}: {error}"))?;
    let request = async {
        let response = client.get(uri).await.map_err(|error| error.to_string())?;
        if !response.status().is_success() {
            return Err(format!("{url} answered {}", response.status()));
        }
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| error.to_string())?;
        Ok(body.to_bytes())
    };
    tokio::time::timeout(Duration::from_secs(1), request)
        .await
        .map_err(|_| format!("{url} did not answer within a second"))?
}

/// How long a namespace's pool runs with no Function that needs it before its pods go.
pub const IDLE_POOL_GRACE: Duration = Duration::from_secs(60);
/// How often the pools are looked at.
const IDLE_POOL_CHECK: Duration = Duration::from_secs(15);

/// Scales to zero pods the pool of each namespace where no Function asks to be pooled
/// (`scale.min: 0` and poolable) and none has for `grace`: the last one was deleted, or
/// left the pool. `idle` keeps when each namespace was first seen so. The Deployment stays
/// (the operator has no `delete` on Deployments, and needs none): `ensure_pool` scales it
/// up again for the next pooled Function. The namespaces scaled, each with an Event on its
/// pool.
pub async fn scale_idle_pools(
    ctx: &Context,
    deployments: &Api<Deployment>,
    functions: &[Arc<Function>],
    idle: &mut HashMap<String, Instant>,
    grace: Duration,
) -> Result<Vec<String>, Error> {
    let needed: BTreeSet<String> = functions
        .iter()
        .filter(|func| func.spec.scales_to_zero() && func.spec.pool_refusal().is_none())
        .filter_map(|func| func.namespace())
        .collect();
    let pools = deployments
        .list(&ListParams::default().labels(&objects::pool_deployment_selector()))
        .await?;
    let mut scaled = Vec::new();
    let mut running = BTreeSet::new();
    for pool in pools.items.iter().filter(|pool| pool.name_any() == POOL_NAME) {
        let Some(ns) = pool.namespace() else { continue };
        let replicas = pool.spec.as_ref().and_then(|spec| spec.replicas).unwrap_or(1);
        if needed.contains(&ns) || replicas == 0 {
            continue;
        }
        running.insert(ns.clone());
        if idle.entry(ns.clone()).or_insert_with(Instant::now).elapsed() < grace {
            continue;
        }
        // A merge patch, not an apply: the operator's apply of the pool owns its other
        // fields, and an apply of `replicas` alone would remove them.
        Api::<Deployment>::namespaced(ctx.client.clone(), &ns)
            .patch(
                POOL_NAME,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
            )
            .await?;
        tracing::info!(namespace = %ns, "no Function needs the pool: scaled to zero pods");
        let event = Event {
            type_: EventType::Normal,
            reason: "PoolIdle".into(),
            note: Some(format!(
                "no Function of {ns} has been pooled (scale.min 0) for {} s: the pool is scaled to 0 pods, and scales up for the next one",
                grace.as_secs()
            )),
            action: "Scale".into(),
            secondary: None,
        };
        if let Err(error) = ctx.recorder.publish(&event, &pool.object_ref(&())).await {
            tracing::warn!(namespace = %ns, %error, "could not publish event");
        }
        scaled.push(ns);
    }
    idle.retain(|ns, _| running.contains(ns) && !scaled.contains(ns));
    Ok(scaled)
}

/// Runs [`scale_idle_pools`] every few seconds, over the Functions the controller knows.
pub(super) async fn scale_idle_pools_forever(
    ctx: Arc<Context>,
    deployments: Api<Deployment>,
    functions: Store<Function>,
) {
    // An empty store before the first list would make every pool look unneeded, and every
    // Role's Secrets unread. The store's readiness is waited for, but not for ever: on the
    // test cluster, the controller's store never reported ready (kube-runtime 5), and this
    // loop never ran. The grace covers a store that fills late: a pool is scaled down only
    // after it was seen unneeded for that long, and Roles are narrowed only after it.
    let started = Instant::now();
    if tokio::time::timeout(IDLE_POOL_GRACE, functions.wait_until_ready())
        .await
        .is_err()
    {
        tracing::info!("the Function store did not report ready; checking idle pools anyway");
    }
    tracing::info!(
        every_s = IDLE_POOL_CHECK.as_secs(),
        "checking for idle pools and the Secrets their Roles name"
    );
    let mut idle = HashMap::new();
    let mut tick = tokio::time::interval(IDLE_POOL_CHECK);
    loop {
        tick.tick().await;
        let state = functions.state();
        if let Err(error) = scale_idle_pools(&ctx, &deployments, &state, &mut idle, IDLE_POOL_GRACE).await {
            tracing::warn!(%error, "cannot scale the idle pools down; trying again");
        }
        if started.elapsed() >= IDLE_POOL_GRACE
            && let Err(error) = narrow_pool_roles(&ctx, &deployments, &state).await
        {
            tracing::warn!(%error, "cannot narrow the pools' Roles; trying again");
        }
    }
}
