//! Leader election through a coordination.k8s.io `Lease`, so two operator replicas never
//! reconcile at once. Writes use the Lease's resourceVersion: of two replicas racing for an
//! expired Lease, the API server lets exactly one write succeed (409 for the other).

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use std::time::Duration;

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
}

impl LeaseLock {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            duration,
        }
    }

    /// How often a leader renews: a third of the lease, so two missed renewals are survivable.
    pub fn renew_interval(&self) -> Duration {
        self.duration / 3
    }

    /// Takes the Lease if it is free, expired or already ours, and renews it. `Ok(false)`
    /// when another replica holds it (or won the race for it).
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let now = Timestamp::now();
        let seconds = i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.identity.clone()),
                    lease_duration_seconds: Some(seconds),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return conflict_is_false(self.api.create(&PostParams::default(), &lease).await);
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(secs)) => renewed.0 + SignedDuration::from_secs(secs.into()) < now,
            _ => true,
        };
        if !ours && !expired {
            return Ok(false);
        }
        if !ours {
            spec.holder_identity = Some(self.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(seconds);
        spec.renew_time = Some(MicroTime(now));
        // `replace` sends the resourceVersion we read: a concurrent writer makes it fail.
        conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &lease).await)
    }

    /// Waits until this replica holds the Lease.
    pub async fn acquire(&self) -> Result<(), kube::Error> {
        loop {
            if self.try_acquire_or_renew().await? {
                tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                return Ok(());
            }
            tokio::time::sleep(self.renew_interval()).await;
        }
    }

    /// Renews the Lease until a renewal fails for longer than the lease lasts, then returns:
    /// by then another replica may lead, so the caller must stop reconciling.
    pub async fn keep(&self) -> String {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.renew_interval()).await;
            match self.try_acquire_or_renew().await {
                Ok(true) => last_renewal = tokio::time::Instant::now(),
                Ok(false) => return format!("lease {} was taken by another replica", self.name),
                Err(error) => {
                    tracing::warn!(%error, "could not renew the lease");
                    if last_renewal.elapsed() >= self.duration {
                        return format!("lease {} not renewed for {:?}: {error}", self.name, self.duration);
                    }
                }
            }
        }
    }
}

fn conflict_is_false<T>(result: Result<T, kube::Error>) -> Result<bool, kube::Error> {
    match result {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
        Err(error) => Err(error),
    }
}
