//! Revisions: every successful build of a Function, named `<function>-<n>` and listed on
//! status newest first. The last `spec.revisionHistoryLimit` are kept, with the objects
//! that store them (step 6 deletes the rest), so that traffic can go back to one without
//! a build.

use crate::crd::{Function, Revision, TrafficStatus};
use crate::module::Module;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use wasmless_artifact::Digest;

/// The revisions after `module` was built: `old` unchanged when `module` is already the
/// newest, else with a new revision in front, numbered one past the highest so far. Cut
/// to the Function's limit.
pub(super) fn record(func: &Function, old: &[Revision], module: &Module, now: Time) -> Vec<Revision> {
    let name = func.name_any();
    let mut revisions = old.to_vec();
    let newest_is_this = revisions.first().is_some_and(|newest| {
        newest.source_digest == module.source_digest.to_string() && newest.module_digest == module.digest.to_string()
    });
    if !newest_is_this {
        // The newest always has the highest number and is never cut, so a number is never
        // given twice, even after every other revision was deleted.
        let number = revisions
            .iter()
            .filter_map(|revision| number_of(&name, &revision.name))
            .max()
            .unwrap_or(0)
            + 1;
        revisions.insert(
            0,
            Revision {
                name: format!("{name}-{number}"),
                source_digest: module.source_digest.to_string(),
                module_digest: module.digest.to_string(),
                code_digest: module.code.as_ref().map(|code| code.digest.to_string()),
                module_ref: Some(module.reference(&name)),
                created: now,
            },
        );
    }
    cut(func, revisions)
}

/// The revisions kept while no new build is done: `old`, cut to the Function's limit (it
/// may have been lowered).
pub(super) fn keep(func: &Function, old: &[Revision]) -> Vec<Revision> {
    cut(func, old.to_vec())
}

/// The newest `revisionHistoryLimit` revisions, and any older one `spec.traffic` names:
/// a revision that serves is never deleted.
fn cut(func: &Function, mut revisions: Vec<Revision>) -> Vec<Revision> {
    let limit = limit(func);
    let mut index = 0;
    revisions.retain(|revision| {
        index += 1;
        index <= limit
            || func
                .spec
                .traffic
                .iter()
                .any(|t| t.revision.as_ref() == Some(&revision.name))
    });
    revisions
}

/// The revision `spec.traffic` sends requests to.
pub(super) enum Wanted<'a> {
    /// The latest build (no `spec.traffic`, or `latestRevision: true`).
    Latest,
    /// A kept revision.
    Revision(&'a Revision),
    /// A revision that is not on `status.revisions`: why, for the `Ready` condition.
    NotKept(String),
}

pub(super) fn wanted(func: &Function) -> Wanted<'_> {
    let Some(name) = func
        .spec
        .traffic
        .iter()
        .find(|t| t.percent > 0)
        .and_then(|t| t.revision.as_ref())
    else {
        return Wanted::Latest;
    };
    wanted_by_name(func, name)
}

/// The kept revision called `name`, or why there is none.
fn wanted_by_name<'a>(func: &'a Function, name: &str) -> Wanted<'a> {
    let kept = func
        .status
        .as_ref()
        .map(|status| status.revisions.as_slice())
        .unwrap_or_default();
    match kept.iter().find(|revision| revision.name == name) {
        Some(revision) => Wanted::Revision(revision),
        None => {
            let names: Vec<&str> = kept.iter().map(|revision| revision.name.as_str()).collect();
            Wanted::NotKept(format!(
                "spec.traffic names revision {name}, which is not kept (kept: {}): name one of those, or set latestRevision: true",
                if names.is_empty() {
                    "none yet".to_string()
                } else {
                    names.join(", ")
                }
            ))
        }
    }
}

/// The Ready condition's reason while `spec.traffic` names a revision that cannot serve.
pub const REASON_REVISION_NOT_FOUND: &str = "RevisionNotFound";
/// The Ready condition's reason while `spec.traffic`'s shares cannot be served as written
/// (they do not add up to 100, or a tag is given twice).
pub const REASON_TRAFFIC_INVALID: &str = "TrafficInvalid";

/// Why `spec.traffic` cannot be served as written: the `Ready` condition's reason and
/// message, while what served before serves on.
#[derive(Clone, Debug)]
pub(super) struct TrafficProblem {
    pub reason: &'static str,
    pub message: String,
}

impl TrafficProblem {
    /// A revision that is not kept, or whose module is no longer stored.
    pub fn not_found(message: String) -> Self {
        Self {
            reason: REASON_REVISION_NOT_FOUND,
            message,
        }
    }

    /// Shares that do not add up, or a tag given twice.
    fn invalid(message: String) -> Self {
        Self {
            reason: REASON_TRAFFIC_INVALID,
            message,
        }
    }
}

/// One target of a split `spec.traffic`, its revision not yet read.
pub(super) struct Share<'a> {
    /// `None`: the latest build.
    pub revision: Option<&'a Revision>,
    pub percent: u8,
    pub tag: Option<&'a str>,
}

/// The targets of `spec.traffic` when it splits, that is when more than one target can be
/// reached (a share or a tag): `None` when it does not. An `Err` says why the split cannot
/// be served as written, for the `Ready` condition; what serves meanwhile stays.
pub(super) fn split(func: &Function) -> Option<Result<Vec<Share<'_>>, TrafficProblem>> {
    let reachable: Vec<_> = func
        .spec
        .traffic
        .iter()
        .filter(|target| target.percent > 0 || target.tag.is_some())
        .collect();
    if reachable.len() < 2 {
        return None;
    }
    let total: i32 = reachable.iter().map(|target| target.percent).sum();
    if total != 100 {
        return Some(Err(TrafficProblem::invalid(format!(
            "spec.traffic's percents add up to {total}: make them add up to 100"
        ))));
    }
    let mut shares: Vec<Share> = Vec::new();
    for (index, target) in reachable.iter().enumerate() {
        if let Some(tag) = &target.tag
            && reachable[..index].iter().any(|other| other.tag.as_ref() == Some(tag))
        {
            return Some(Err(TrafficProblem::invalid(format!(
                "spec.traffic gives the tag {tag} twice: a tag names one revision"
            ))));
        }
        let revision = match &target.revision {
            None => None,
            Some(name) => match wanted_by_name(func, name) {
                Wanted::Revision(revision) => Some(revision),
                Wanted::NotKept(problem) => return Some(Err(TrafficProblem::not_found(problem))),
                Wanted::Latest => unreachable!("a name is looked up"),
            },
        };
        shares.push(Share {
            revision,
            percent: u8::try_from(target.percent.clamp(0, 100)).unwrap_or(100),
            tag: target.tag.as_deref(),
        });
    }
    Some(Ok(shares))
}

/// `status.traffic` for a split the pods serve.
pub(super) fn split_traffic(shares: &[crate::objects::Share]) -> Vec<TrafficStatus> {
    shares
        .iter()
        .map(|share| TrafficStatus {
            revision: share.revision.clone(),
            percent: i32::from(share.percent),
            tag: share.tag.clone(),
        })
        .collect()
}

/// The name the revision of `module` has, or will have once status records it.
pub(super) fn name_of(func: &Function, module: &Module) -> String {
    let old = func
        .status
        .as_ref()
        .map(|status| status.revisions.as_slice())
        .unwrap_or_default();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    record(func, old, module, now)
        .into_iter()
        .next()
        .map(|revision| revision.name)
        .unwrap_or_default()
}

/// `status.traffic`: the revision serving `module`, with all the requests.
pub(super) fn traffic(revisions: &[Revision], module: Option<&Module>) -> Vec<TrafficStatus> {
    module
        .and_then(|module| serving(revisions, module))
        .map(|revision| TrafficStatus {
            revision: revision.name.clone(),
            percent: 100,
            tag: None,
        })
        .into_iter()
        .collect()
}

fn limit(func: &Function) -> usize {
    usize::try_from(func.spec.revision_history_limit.max(1)).unwrap_or(1)
}

/// The newest revision that served ready: the one serving now if it is ready and newer
/// than the last (a rollback to an older revision does not make it the latest), while the
/// last is still kept.
pub(super) fn latest_ready(revisions: &[Revision], last: Option<&str>, ready_with: Option<&Module>) -> Option<String> {
    let position = |name: &str| revisions.iter().position(|revision| revision.name == name);
    let now = ready_with
        .and_then(|module| serving(revisions, module))
        .map(|r| r.name.as_str());
    [now, last]
        .into_iter()
        .flatten()
        .filter_map(|name| Some((position(name)?, name)))
        .min()
        .map(|(_, name)| name.to_string())
}

/// `n` of a revision named `<function>-<n>`.
fn number_of(function: &str, revision: &str) -> Option<u64> {
    revision.strip_prefix(function)?.strip_prefix('-')?.parse().ok()
}

/// The revision that `serving` is, when the Function is ready with it: it becomes the
/// latest ready revision.
pub(super) fn serving<'a>(revisions: &'a [Revision], serving: &Module) -> Option<&'a Revision> {
    revisions.iter().find(|revision| {
        revision.source_digest == serving.source_digest.to_string()
            && revision.module_digest == serving.digest.to_string()
    })
}

/// The sources whose objects (source and chunk ConfigMaps) the kept revisions need.
pub(super) fn kept_sources(revisions: &[Revision]) -> Vec<Digest> {
    revisions
        .iter()
        .filter_map(|revision| revision.source_digest.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::ModuleLocation;
    use k8s_openapi::jiff::Timestamp;
    use serde_json::json;

    fn function(limit: i32) -> Function {
        serde_json::from_value(json!({
            "apiVersion": "wasmless.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": "hello", "namespace": "ns"},
            "spec": {"language": "go", "source": "package handlers", "revisionHistoryLimit": limit},
        }))
        .unwrap()
    }

    fn module(source: &str) -> Module {
        Module {
            digest: Digest::of(format!("module of {source}").as_bytes()),
            size: None,
            source_digest: Digest::of(source.as_bytes()),
            location: ModuleLocation::ConfigMaps { count: 1 },
            code: None,
        }
    }

    fn names(revisions: &[Revision]) -> Vec<&str> {
        revisions.iter().map(|revision| revision.name.as_str()).collect()
    }

    #[test]
    fn each_new_build_is_a_new_revision_numbered_past_the_highest_and_old_ones_are_cut() {
        let func = function(3);
        let now = || Time(Timestamp::now());
        let mut revisions = Vec::new();
        for source in ["v1", "v2", "v2", "v3", "v4", "v1"] {
            revisions = record(&func, &revisions, &module(source), now());
        }
        // v2 twice is one revision; v1 again (a revert) is a new one, built from the same source.
        assert_eq!(names(&revisions), ["hello-5", "hello-4", "hello-3"]);
        assert_eq!(revisions[0].source_digest, Digest::of(b"v1").to_string());
        assert_eq!(
            kept_sources(&revisions),
            ["v1", "v4", "v3"].map(|s| Digest::of(s.as_bytes()))
        );
        // Every revision but the newest deleted (a lower limit): the next is still new.
        let func = function(1);
        revisions = record(&func, &revisions, &module("v1"), now());
        assert_eq!(names(&revisions), ["hello-5"]);
        revisions = record(&func, &revisions, &module("v6"), now());
        assert_eq!(names(&revisions), ["hello-6"]);
        assert_eq!(
            serving(&revisions, &module("v6")).map(|r| r.name.as_str()),
            Some("hello-6")
        );
        assert!(serving(&revisions, &module("v1")).is_none());
    }

    #[test]
    fn a_revision_that_traffic_names_is_kept_past_the_limit() {
        let mut func = function(2);
        func.spec.traffic = vec![crate::crd::TrafficTarget {
            revision: Some("hello-1".into()),
            latest_revision: None,
            percent: 100,
            tag: None,
        }];
        let mut revisions = Vec::new();
        for source in ["v1", "v2", "v3", "v4"] {
            revisions = record(&func, &revisions, &module(source), Time(Timestamp::now()));
        }
        assert_eq!(names(&revisions), ["hello-4", "hello-3", "hello-1"]);
        func.spec.traffic.clear();
        assert_eq!(names(&keep(&func, &revisions)), ["hello-4", "hello-3"]);
    }

    #[test]
    fn a_split_is_read_only_when_it_adds_up_and_names_kept_revisions() {
        let mut func = function(5);
        let mut revisions = Vec::new();
        for source in ["v1", "v2"] {
            revisions = record(&func, &revisions, &module(source), Time(Timestamp::now()));
        }
        func.status = Some(crate::crd::FunctionStatus {
            revisions,
            ..Default::default()
        });
        let set = |func: &mut Function, traffic: serde_json::Value| {
            func.spec.traffic = serde_json::from_value(traffic).unwrap();
        };
        let problem = |func: &Function| match split(func) {
            Some(Err(problem)) => (problem.reason, problem.message),
            Some(Ok(_)) => panic!("split accepted"),
            None => panic!("not a split"),
        };

        set(&mut func, json!([{"revision": "hello-1", "percent": 100}]));
        assert!(split(&func).is_none(), "one target is not a split");
        set(
            &mut func,
            json!([{"revision": "hello-1", "percent": 100}, {"latestRevision": true, "percent": 0}]),
        );
        assert!(split(&func).is_none(), "a target no request can reach is not a split");

        set(
            &mut func,
            json!([{"revision": "hello-1", "percent": 90}, {"latestRevision": true, "percent": 10, "tag": "canary"}]),
        );
        let Some(Ok(shares)) = split(&func) else {
            panic!("a split")
        };
        let read: Vec<_> = shares
            .iter()
            .map(|share| (share.revision.map(|r| r.name.as_str()), share.percent, share.tag))
            .collect();
        assert_eq!(read, [(Some("hello-1"), 90, None), (None, 10, Some("canary"))]);

        set(
            &mut func,
            json!([{"revision": "hello-1", "percent": 50}, {"latestRevision": true, "percent": 40}]),
        );
        let (reason, message) = problem(&func);
        assert_eq!(reason, "TrafficInvalid");
        assert!(message.contains("add up to 90"), "{message}");
        set(
            &mut func,
            json!([{"revision": "hello-1", "percent": 50, "tag": "a"}, {"latestRevision": true, "percent": 50, "tag": "a"}]),
        );
        assert!(problem(&func).1.contains("tag a twice"));
        set(
            &mut func,
            json!([{"revision": "hello-7", "percent": 50}, {"latestRevision": true, "percent": 50}]),
        );
        let (reason, message) = problem(&func);
        assert_eq!(reason, "RevisionNotFound");
        assert!(
            message.contains("hello-7") && message.contains("hello-2, hello-1"),
            "{message}"
        );
    }

    #[test]
    fn the_latest_ready_revision_only_moves_forward_while_kept() {
        let func = function(5);
        let mut revisions = Vec::new();
        for source in ["v1", "v2", "v3"] {
            revisions = record(&func, &revisions, &module(source), Time(Timestamp::now()));
        }
        // v3 built but not ready yet: still hello-2.
        assert_eq!(
            latest_ready(&revisions, Some("hello-2"), None).as_deref(),
            Some("hello-2")
        );
        assert_eq!(
            latest_ready(&revisions, Some("hello-2"), Some(&module("v3"))).as_deref(),
            Some("hello-3")
        );
        // Serving v1 again (a rollback) does not make it the latest.
        assert_eq!(
            latest_ready(&revisions, Some("hello-3"), Some(&module("v1"))).as_deref(),
            Some("hello-3")
        );
        // A latest that was cut is forgotten.
        assert_eq!(latest_ready(&revisions, Some("hello-0"), None), None);
    }
}
