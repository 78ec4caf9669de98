//! `status.triggers` of each Function: every trigger's progress as the broker last said it
//! (`running::keep_looking` reads it every few seconds), written on the Function by a
//! server-side apply of this component's own field manager. The operator's status writes
//! leave those fields alone, and its autoscaler reads the lag: a backlog scales the
//! Function out of the pool.
//!
//! Every replica runs every trigger and reads the same broker, so replicas write the same
//! thing; a write is made only when something a reader would notice changed, or to keep a
//! lag over zero fresh (the autoscaler takes none older than a minute).

use crate::broker::Progress;
use crate::names::TriggerRef;
use kube::api::{DynamicObject, Patch, PatchParams};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The field manager of this component's writes.
pub const FIELD_MANAGER: &str = "wasmless-events";
/// How often the progress is looked at for writing.
const REPORT_EVERY: Duration = Duration::from_secs(5);
/// An unchanged status is written again after this while it shows a lag, or a delivery
/// since the last write.
const REFRESH_AFTER: Duration = Duration::from_secs(20);
/// The longest one Function's write may take.
const WRITE_WITHIN: Duration = Duration::from_secs(5);

/// A trigger's progress, and when the broker said it: what `observedAt` says, so that a
/// progress no longer read (the broker away) grows old in the status, and the autoscaler
/// stops counting its lag.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Reading {
    pub progress: Progress,
    pub at: SystemTime,
}

/// A Function, as (namespace, name).
type FunctionKey = (String, String);
/// A Function's triggers' readings, by trigger name.
type Triggers = Vec<(String, Reading)>;

/// Each running trigger's last progress, shared by the triggers' tasks and the writer.
#[derive(Clone, Default)]
pub struct Progresses(Arc<Mutex<HashMap<TriggerRef, Reading>>>);

impl Progresses {
    /// The broker said `progress` now.
    pub fn set(&self, trigger: &TriggerRef, progress: Progress) {
        let reading = Reading {
            progress,
            at: SystemTime::now(),
        };
        self.0.lock().expect("progresses").insert(trigger.clone(), reading);
    }

    pub fn get(&self, trigger: &TriggerRef) -> Option<Progress> {
        self.0
            .lock()
            .expect("progresses")
            .get(trigger)
            .map(|reading| reading.progress)
    }

    /// A removed trigger: gone from its Function's status at the next write.
    pub fn remove(&self, trigger: &TriggerRef) {
        self.0.lock().expect("progresses").remove(trigger);
    }

    /// By Function (namespace, name): each trigger's name and reading, by name.
    fn by_function(&self) -> BTreeMap<(String, String), Vec<(String, Reading)>> {
        let mut functions: BTreeMap<(String, String), Vec<(String, Reading)>> = BTreeMap::new();
        for (trigger, reading) in self.0.lock().expect("progresses").iter() {
            functions
                .entry((trigger.namespace.clone(), trigger.function.clone()))
                .or_default()
                .push((trigger.trigger.clone(), *reading));
        }
        for triggers in functions.values_mut() {
            triggers.sort_by(|a, b| a.0.cmp(&b.0));
        }
        functions
    }
}

/// What a reader of the status would notice: the triggers, their lags and dead letters;
/// not a delivery time that moved (that waits for [`REFRESH_AFTER`]).
fn noticeably_different(written: &[(String, Reading)], now: &[(String, Reading)]) -> bool {
    written.len() != now.len()
        || written.iter().zip(now).any(|((a, was), (b, is))| {
            let (was, is) = (&was.progress, &is.progress);
            a != b
                || was.lag != is.lag
                || was.dead_letters != is.dead_letters
                || was.last_delivered.is_none() != is.last_delivered.is_none()
        })
}

/// Whether to write `now` over what was written at `written_at`.
fn should_write(written: Option<&(Vec<(String, Reading)>, Instant)>, now: &[(String, Reading)], at: Instant) -> bool {
    let Some((written, written_at)) = written else {
        return true;
    };
    if noticeably_different(written, now) {
        return true;
    }
    // Read again since, with a lag to keep fresh or a delivery to tell: a reading that did
    // not move (the broker away) is left to grow old.
    let moved = written.iter().zip(now).any(|((_, was), (_, is))| {
        was.at != is.at && (is.progress.lag > 0 || was.progress.last_delivered != is.progress.last_delivered)
    });
    moved && at.duration_since(*written_at) >= REFRESH_AFTER
}

/// The status apply of one Function's triggers.
pub fn status_patch(triggers: &[(String, Reading)]) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = triggers
        .iter()
        .map(|(name, Reading { progress, at })| {
            let mut entry = serde_json::json!({
                "name": name,
                "lag": progress.lag,
                "deadLetters": progress.dead_letters,
                "observedAt": rfc3339(*at),
            });
            if let Some(at) = progress.last_delivered {
                entry["lastFired"] = rfc3339(at).into();
            }
            entry
        })
        .collect();
    let mut status = serde_json::json!({});
    if !triggers.is_empty() {
        status["triggers"] = entries.into();
        status["triggersSummary"] = summary(triggers).into();
    }
    serde_json::json!({
        "apiVersion": "wasmless.io/v1alpha1",
        "kind": "Function",
        "status": status,
    })
}

/// `kubectl get`'s TRIGGERS column: `orders lag 120 dead 2, tick lag 0`.
pub fn summary(triggers: &[(String, Reading)]) -> String {
    triggers
        .iter()
        .map(|(name, reading)| match reading.progress.dead_letters {
            0 => format!("{name} lag {}", reading.progress.lag),
            dead => format!("{name} lag {} dead {dead}", reading.progress.lag),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Kubernetes' `Time`: RFC 3339, whole seconds, UTC.
fn rfc3339(at: SystemTime) -> String {
    chrono::DateTime::<chrono::Utc>::from(at).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Writes the Functions' `status.triggers` until the process ends.
pub async fn keep_reporting(kube: kube::Client, progresses: Progresses) {
    let mut written: HashMap<FunctionKey, (Triggers, Instant)> = HashMap::new();
    let mut interval = tokio::time::interval(REPORT_EVERY);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let now = progresses.by_function();
        // A Function whose last trigger went: its entries are taken off (an apply of an
        // empty status drops what this manager wrote before).
        let gone: Vec<(String, String)> = written.keys().filter(|key| !now.contains_key(*key)).cloned().collect();
        for key in gone {
            written.remove(&key);
            write(&kube, &key, &[]).await;
        }
        let at = Instant::now();
        for (key, triggers) in now {
            if should_write(written.get(&key), &triggers, at) && write(&kube, &key, &triggers).await {
                written.insert(key, (triggers, at));
            }
        }
    }
}

/// One Function's status apply; whether it was written (a Function already gone counts).
async fn write(kube: &kube::Client, (namespace, name): &(String, String), triggers: &[(String, Reading)]) -> bool {
    let api: kube::Api<DynamicObject> = crate::function::functions_api(kube.clone(), Some(namespace));
    let patch = status_patch(triggers);
    let params = PatchParams::apply(FIELD_MANAGER).force();
    // A slow API server delays the next Functions' writes, not past their lag's freshness.
    match tokio::time::timeout(WRITE_WITHIN, api.patch_status(name, &params, &Patch::Apply(&patch))).await {
        Err(_) => {
            tracing::warn!(function = %name, %namespace, "status.triggers not written within {WRITE_WITHIN:?}; trying again");
            false
        }
        Ok(Ok(_)) => true,
        Ok(Err(kube::Error::Api(status))) if status.code == 404 => true,
        Ok(Err(error)) => {
            tracing::warn!(function = %name, %namespace, %error, "status.triggers not written; trying again");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(lag: u64, dead_letters: u64, last_delivered: Option<u64>) -> Reading {
        read_at(1_800_000_005, lag, dead_letters, last_delivered)
    }

    fn read_at(at: u64, lag: u64, dead_letters: u64, last_delivered: Option<u64>) -> Reading {
        Reading {
            progress: Progress {
                lag,
                last_delivered: last_delivered.map(|secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs)),
                dead_letters,
            },
            at: SystemTime::UNIX_EPOCH + Duration::from_secs(at),
        }
    }

    #[test]
    fn the_patch_says_each_triggers_lag_dead_letters_and_last_delivery_and_the_column_sums_them_up() {
        let triggers = vec![
            ("orders".to_string(), progress(120, 2, Some(1_800_000_000))),
            ("tick".to_string(), progress(0, 0, None)),
        ];
        let patch = status_patch(&triggers);
        assert_eq!(
            patch["status"],
            serde_json::json!({
                "triggers": [
                    {"name": "orders", "lag": 120, "deadLetters": 2, "lastFired": "2027-01-15T08:00:00Z", "observedAt": "2027-01-15T08:00:05Z"},
                    {"name": "tick", "lag": 0, "deadLetters": 0, "observedAt": "2027-01-15T08:00:05Z"},
                ],
                "triggersSummary": "orders lag 120 dead 2, tick lag 0",
            })
        );
        assert_eq!(patch["kind"], "Function");
        assert_eq!(
            status_patch(&[])["status"],
            serde_json::json!({}),
            "no triggers left: nothing of ours"
        );
    }

    #[test]
    fn a_write_is_made_when_a_reader_would_notice_and_a_lag_is_kept_fresh() {
        let start = Instant::now();
        let idle = vec![("orders".to_string(), read_at(1000, 0, 0, Some(100)))];
        assert!(should_write(None, &idle, start), "never written");
        let written = (idle.clone(), start);
        let idle_later = vec![("orders".to_string(), read_at(1600, 0, 0, Some(100)))];
        assert!(
            !should_write(Some(&written), &idle_later, start + Duration::from_secs(600)),
            "nothing moved"
        );
        let delivered_since = vec![("orders".to_string(), read_at(1005, 0, 0, Some(105)))];
        assert!(!should_write(
            Some(&written),
            &delivered_since,
            start + Duration::from_secs(5)
        ));
        assert!(should_write(Some(&written), &delivered_since, start + REFRESH_AFTER));
        let backlog = vec![("orders".to_string(), read_at(1001, 40, 0, Some(100)))];
        assert!(
            should_write(Some(&written), &backlog, start + Duration::from_secs(1)),
            "a lag at once"
        );
        let still = (backlog.clone(), start);
        assert!(!should_write(Some(&still), &backlog, start + Duration::from_secs(5)));
        let read_again = vec![("orders".to_string(), read_at(1021, 40, 0, Some(100)))];
        assert!(
            should_write(Some(&still), &read_again, start + REFRESH_AFTER),
            "kept fresh"
        );
        assert!(
            !should_write(Some(&still), &backlog, start + REFRESH_AFTER * 3),
            "a lag no longer read (the broker away) is left to grow old"
        );
        let parked = vec![("orders".to_string(), progress(0, 1, Some(100)))];
        assert!(
            should_write(Some(&written), &parked, start + Duration::from_secs(1)),
            "a dead letter"
        );
        let renamed = vec![("created".to_string(), progress(0, 0, Some(100)))];
        assert!(should_write(Some(&written), &renamed, start));
    }
}
