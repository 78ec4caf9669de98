//! How many pods of its own a Function with `scale` runs, and where its Service routes
//! meanwhile: the pure decisions, and the [`Scaler`]'s record of what each Function wants
//! (kept by `crate::scaler` from the pods' and the pool's metrics).

use crate::crd::{Function, FunctionStatus, ServedBy};
use crate::objects::Route;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::reflector::ObjectRef;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// How long the Service points at the pool before a Function's last pods go: long enough
/// for every node's kube-proxy to have moved its rules (it syncs within a second or two by
/// default), so no new connection reaches a pod that is about to stop; the pods' own drain
/// covers the requests already on them.
pub const ROUTE_SETTLE: Duration = Duration::from_secs(10);

/// The replicas each scaled Function wants, as the scaler last decided.
#[derive(Default)]
pub struct Scaler {
    wanted: Mutex<HashMap<ObjectRef<Function>, i32>>,
}

impl Scaler {
    pub fn wanted(&self, func: &Function) -> Option<i32> {
        self.wanted
            .lock()
            .expect("scaler")
            .get(&ObjectRef::from_obj(func))
            .copied()
    }

    /// Records a decision; whether it changed what the Function wants.
    pub fn set(&self, func: ObjectRef<Function>, replicas: i32) -> bool {
        self.wanted.lock().expect("scaler").insert(func, replicas) != Some(replicas)
    }

    pub fn forget(&self, func: &ObjectRef<Function>) {
        self.wanted.lock().expect("scaler").remove(func);
    }
}

/// The fewest pods a Function with `scale` runs: `min`, but one for a Function that asks
/// for 0 and cannot be pooled.
pub fn floor(func: &Function) -> i32 {
    match &func.spec.scale {
        None => func.spec.replicas,
        Some(scale) if scale.min == 0 && func.spec.pool_refusal().is_some() => 1,
        Some(scale) => scale.min,
    }
}

/// The replicas of the Function's Deployment: `spec.replicas` without `scale`; with it,
/// what the scaler wants, else what runs now (an operator that just started keeps it), else
/// the floor; always within `[floor, max]`.
pub(super) fn replicas(func: &Function, wanted: Option<i32>, live: Option<i32>) -> i32 {
    let Some(scale) = &func.spec.scale else {
        return func.spec.replicas;
    };
    let floor = floor(func);
    wanted.or(live).unwrap_or(floor).clamp(floor, scale.max.max(floor))
}

/// A pooled Function's Deployment replicas and route for one reconcile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Decision {
    pub replicas: i32,
    pub to_pods: bool,
    /// A step of the change is still to come (pods to become ready, the pool to load the
    /// Function, the route to settle before the pods go): reconcile again soon.
    pub pending: bool,
}

impl Decision {
    pub fn route(&self, port: u16) -> Route {
        if self.to_pods {
            Route::Pods
        } else {
            Route::Pool { port }
        }
    }
}

/// Where a pooled Function is served from, in the order that drops no request: to its pods
/// only once one is available; back to the pool only once the pool serves it, and its pods
/// removed only [`ROUTE_SETTLE`] after the Service moved.
pub(super) fn route(
    wanted: i32,
    own_available: i32,
    live: i32,
    pool_serving: bool,
    status: Option<&FunctionStatus>,
) -> Decision {
    if wanted > 0 {
        return Decision {
            replicas: wanted,
            to_pods: own_available > 0,
            pending: own_available == 0,
        };
    }
    if live == 0 || own_available == 0 {
        // No pod serves: nothing to move away from.
        return Decision {
            replicas: 0,
            to_pods: false,
            pending: !pool_serving,
        };
    }
    if !pool_serving {
        // Pods serve and the pool does not yet: they stay until it does.
        return Decision {
            replicas: live,
            to_pods: true,
            pending: true,
        };
    }
    let settled = settled(status, ServedBy::Pool);
    Decision {
        replicas: if settled { 0 } else { live },
        to_pods: false,
        pending: !settled,
    }
}

/// Whether the Service has routed to `to` for [`ROUTE_SETTLE`] at least.
pub(super) fn settled(status: Option<&FunctionStatus>, to: ServedBy) -> bool {
    status.is_some_and(|status| {
        status.served_by == Some(to)
            && status
                .served_by_since
                .as_ref()
                .is_some_and(|since| Timestamp::now().duration_since(since.0).unsigned_abs() >= ROUTE_SETTLE)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn status(served_by: ServedBy, ago: Duration) -> FunctionStatus {
        FunctionStatus {
            served_by: Some(served_by),
            served_by_since: Some(Time(Timestamp::now() - ago)),
            ..Default::default()
        }
    }

    #[test]
    fn traffic_moves_to_pods_only_once_one_is_available() {
        let starting = route(2, 0, 2, true, None);
        assert_eq!(
            (starting.replicas, starting.to_pods, starting.pending),
            (2, false, true)
        );
        let ready = route(2, 1, 2, true, None);
        assert_eq!((ready.replicas, ready.to_pods, ready.pending), (2, true, false));
    }

    #[test]
    fn pods_go_only_after_the_route_to_the_pool_has_settled() {
        // The pool does not serve the Function yet: the pods stay, and keep the traffic.
        let waiting = route(0, 2, 2, false, Some(&status(ServedBy::Pods, Duration::from_secs(600))));
        assert_eq!((waiting.replicas, waiting.to_pods, waiting.pending), (2, true, true));
        // The pool serves: the route moves, the pods stay a while.
        let moved = route(0, 2, 2, true, Some(&status(ServedBy::Pods, Duration::from_secs(600))));
        assert_eq!((moved.replicas, moved.to_pods, moved.pending), (2, false, true));
        let recent = route(0, 2, 2, true, Some(&status(ServedBy::Pool, Duration::from_secs(3))));
        assert_eq!((recent.replicas, recent.to_pods, recent.pending), (2, false, true));
        // Settled: the pods go.
        let settled = route(0, 2, 2, true, Some(&status(ServedBy::Pool, ROUTE_SETTLE)));
        assert_eq!((settled.replicas, settled.to_pods, settled.pending), (0, false, false));
    }

    #[test]
    fn an_idle_function_without_pods_is_the_pools() {
        let idle = route(0, 0, 0, true, None);
        assert_eq!((idle.replicas, idle.to_pods, idle.pending), (0, false, false));
        let loading = route(0, 0, 0, false, None);
        assert_eq!((loading.replicas, loading.to_pods, loading.pending), (0, false, true));
    }
}
