//! Leader election through a coordination.k8s.io `Lease`, so two operator replicas never
//! reconcile at once. Writes use the Lease's resourceVersion: of two replicas racing for an
//! expired Lease, the API server lets exactly one write succeed (409 for the other).
//!
//! A leader must stop before anyone else may start: a standby takes the Lease once
//! `duration` has passed since the last renewal it sees, so the leader gives up when it has
//! not renewed for [`LeaseLock::renew_deadline`] (two thirds of that), and no renewal may
//! run past that deadline — a request to an API server that never answers would otherwise
//! keep a deposed leader reconciling.

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

pub struct LeaseLock {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// When the last successful acquisition or renewal was sent.
    renewed: Mutex<Option<Instant>>,
}

impl LeaseLock {
    pub fn new(client: Client, namespace: &str, name: &str, identity: &str, duration: Duration) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.into(),
            identity: identity.into(),
            duration,
            renewed: Mutex::new(None),
        }
    }

    /// How often a leader renews: a third of the lease, so one missed renewal is survivable.
    pub fn renew_interval(&self) -> Duration {
        self.duration / 3
    }

    /// How long a leader leads without a successful renewal: two thirds of the lease, a
    /// third of it short of the moment a standby may take over.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }

    /// Takes the Lease if it is free, expired or already ours, and renews it. `Ok(false)`
    /// when another replica holds it (or won the race for it).
    pub async fn try_acquire_or_renew(&self) -> Result<bool, kube::Error> {
        let sent = Instant::now();
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
            return self.renewed_if(
                conflict_is_false(self.api.create(&PostParams::default(), &lease).await),
                sent,
            );
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let ours = spec.holder_identity.as_deref() == Some(self.identity.as_str());
        // A released Lease has no holder: free at once, as client-go's leader election reads it.
        let released = spec.holder_identity.as_deref().is_none_or(str::is_empty);
        let expired = match (&spec.renew_time, spec.lease_duration_seconds) {
            (Some(renewed), Some(secs)) => renewed.0 + SignedDuration::from_secs(secs.into()) < now,
            _ => true,
        };
        if !ours && !expired && !released {
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
        self.renewed_if(
            conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &lease).await),
            sent,
        )
    }

    fn renewed_if(&self, result: Result<bool, kube::Error>, sent: Instant) -> Result<bool, kube::Error> {
        if let Ok(true) = result {
            *self.renewed.lock().expect("renewal time") = Some(sent);
        }
        result
    }

    /// Waits until this replica holds the Lease. An API error is logged and retried: a
    /// standby that exits on one would restart, and back off, for nothing.
    pub async fn acquire(&self) {
        loop {
            match tokio::time::timeout(self.renew_deadline(), self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => {
                    tracing::info!(lease = %self.name, identity = %self.identity, "became leader");
                    return;
                }
                Ok(Ok(false)) => {}
                Ok(Err(error)) => {
                    tracing::warn!(lease = %self.name, %error, "could not read or take the lease; retrying")
                }
                Err(_) => tracing::warn!(lease = %self.name, "the API server did not answer in time; retrying"),
            }
            tokio::time::sleep(self.renew_interval()).await;
        }
    }

    /// Renews the Lease until it cannot, then returns why: by then another replica may
    /// lead soon, so the caller must stop reconciling at once. It returns at the latest
    /// [`renew_deadline`](Self::renew_deadline) after the last successful renewal, however
    /// slow the API server is.
    pub async fn keep(&self) -> String {
        let retry = (self.duration / 15).max(Duration::from_millis(100));
        let mut wait = self.renew_interval();
        loop {
            let last = self.renewed.lock().expect("renewal time").unwrap_or_else(Instant::now);
            let deadline = last + self.renew_deadline();
            tokio::time::sleep_until((Instant::now() + wait).min(deadline)).await;
            if Instant::now() >= deadline {
                return format!("lease {} not renewed within {:?}", self.name, self.renew_deadline());
            }
            match tokio::time::timeout_at(deadline, self.try_acquire_or_renew()).await {
                Ok(Ok(true)) => wait = self.renew_interval(),
                Ok(Ok(false)) => return format!("lease {} was taken by another replica", self.name),
                Ok(Err(error)) => {
                    tracing::warn!(lease = %self.name, %error, "could not renew the lease; retrying");
                    wait = retry;
                }
                Err(_) => {
                    return format!(
                        "lease {} not renewed within {:?}: the API server did not answer in time",
                        self.name,
                        self.renew_deadline()
                    );
                }
            }
        }
    }

    /// Gives the Lease up (no holder), so a standby takes it at once instead of waiting for
    /// it to expire: a rollout of the operator fails over without a pause. Best effort, and
    /// bounded: the pod is shutting down.
    pub async fn release(&self) {
        let give_up = async {
            let Some(mut lease) = self.api.get_opt(&self.name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.get_or_insert_with(Default::default);
            if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
                return Ok(false);
            }
            spec.holder_identity = None;
            spec.renew_time = Some(MicroTime(Timestamp::now()));
            conflict_is_false(self.api.replace(&self.name, &PostParams::default(), &lease).await)
        };
        match tokio::time::timeout(self.renew_interval(), give_up).await {
            Ok(Ok(true)) => tracing::info!(lease = %self.name, "released the lease"),
            Ok(Ok(false)) => {}
            Ok(Err(error)) => tracing::warn!(lease = %self.name, %error, "could not release the lease"),
            Err(_) => tracing::warn!(lease = %self.name, "could not release the lease in time"),
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
