//! A traffic split: several revisions of one Function side by side in one process, each a
//! tenant with its own module and digests (and its own `revision` metric label), and the
//! share of requests each gets. A revision with a tag also answers every request that
//! names the tag in [`TAG_HEADER`], whatever its share, so it can be tried before it
//! takes traffic.
//!
//! Shares are kept exactly, not drawn at random: each process sends its requests round a
//! fixed schedule of 100 slots in which a revision with `percent: 10` has 10, spread out,
//! so any 100 consecutive requests to one pod split as asked, and several pods' requests
//! together within a request per pod.

use crate::tenant::Tenant;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use wasmless_artifact::Digest;

/// The request header that asks for a tagged revision.
pub const TAG_HEADER: &str = "wasmless-tag";
/// The response header that says which revision answered (only where several can).
pub const REVISION_HEADER: &str = "wasmless-revision";

/// One revision of `--traffic`, as the operator writes it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Target {
    pub revision: String,
    pub percent: u8,
    #[serde(default)]
    pub tag: Option<String>,
    /// Where the module is, as `--module` takes it.
    pub module: String,
    pub module_digest: String,
    /// Where its compiled code is, as `--code` takes it, with `codeDigest`.
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub code_digest: Option<String>,
}

/// `--traffic`: the revisions and their shares, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Traffic(pub Vec<Target>);

impl Traffic {
    /// Parses and checks `--traffic`'s JSON list.
    pub fn parse(text: &str) -> Result<Self, String> {
        let targets: Vec<Target> = serde_json::from_str(text).map_err(|error| {
            format!(
                "--traffic is a JSON list of {{\"revision\", \"percent\", \"tag\", \"module\", \"moduleDigest\", \"code\", \"codeDigest\"}}: {error}"
            )
        })?;
        if targets.is_empty() {
            return Err("--traffic names no revision: give at least one".into());
        }
        let total: u32 = targets.iter().map(|target| u32::from(target.percent)).sum();
        if total != 100 {
            return Err(format!(
                "--traffic's percents add up to {total}: they must add up to 100"
            ));
        }
        for (index, target) in targets.iter().enumerate() {
            let earlier = &targets[..index];
            if target.revision.is_empty() {
                return Err("a --traffic target has an empty revision name".into());
            }
            if earlier.iter().any(|other| other.revision == target.revision) {
                return Err(format!("--traffic names revision {} twice", target.revision));
            }
            if let Some(tag) = &target.tag
                && (tag.is_empty() || earlier.iter().any(|other| other.tag.as_ref() == Some(tag)))
            {
                return Err(format!("--traffic's tag {tag:?} is empty or given twice"));
            }
            if target.percent == 0 && target.tag.is_none() {
                return Err(format!(
                    "--traffic's revision {} has neither a share nor a tag: nothing could reach it",
                    target.revision
                ));
            }
            target
                .module_digest
                .parse::<Digest>()
                .map_err(|error| format!("revision {}'s moduleDigest: {error}", target.revision))?;
            match (&target.code, &target.code_digest) {
                (None, None) => {}
                (Some(_), Some(digest)) => {
                    digest
                        .parse::<Digest>()
                        .map_err(|error| format!("revision {}'s codeDigest: {error}", target.revision))?;
                }
                _ => {
                    return Err(format!(
                        "revision {} has one of code and codeDigest: give both or neither",
                        target.revision
                    ));
                }
            }
        }
        Ok(Self(targets))
    }
}

/// The loaded revisions of a split, and where the next request goes.
pub struct Split {
    function: Arc<str>,
    tenants: Vec<Arc<Tenant>>,
    tags: Vec<(String, usize)>,
    /// 100 slots, each the index of a tenant: a revision's share is its count of slots.
    schedule: Vec<usize>,
    next: AtomicUsize,
}

/// Why a request names no revision this process serves.
#[derive(Debug, thiserror::Error)]
#[error(
    "no revision of {function} is tagged {tag:?} (its tags: {known}): ask with one of those in the {TAG_HEADER} header, or without it"
)]
pub struct UnknownTag {
    function: Arc<str>,
    tag: String,
    known: String,
}

impl Split {
    /// `tenants[i]` serves `traffic.0[i]`.
    pub fn new(function: &str, traffic: &Traffic, tenants: Vec<Arc<Tenant>>) -> Self {
        let percents: Vec<u8> = traffic.0.iter().map(|target| target.percent).collect();
        let tags = traffic
            .0
            .iter()
            .enumerate()
            .filter_map(|(index, target)| Some((target.tag.clone()?, index)))
            .collect();
        Self {
            function: function.into(),
            tenants,
            tags,
            schedule: schedule(&percents),
            next: AtomicUsize::new(0),
        }
    }

    /// The revision for a request: the tagged one if it names a tag, else the next slot's.
    pub fn choose(&self, headers: &http::HeaderMap) -> Result<Arc<Tenant>, UnknownTag> {
        if let Some(tag) = headers.get(TAG_HEADER) {
            let tag = String::from_utf8_lossy(tag.as_bytes());
            return match self.tags.iter().find(|(known, _)| *known == tag) {
                Some((_, index)) => Ok(self.tenants[*index].clone()),
                None => Err(UnknownTag {
                    function: self.function.clone(),
                    tag: tag.into_owned(),
                    known: match self.tags.is_empty() {
                        true => "none".into(),
                        false => self
                            .tags
                            .iter()
                            .map(|(tag, _)| tag.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    },
                }),
            };
        }
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.schedule.len();
        Ok(self.tenants[self.schedule[slot]].clone())
    }

    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }
}

/// 100 slots in which target `i` has `percents[i]`, spread evenly (the smooth weighted
/// round robin of nginx's upstreams): 90/10 gives nine of one, then one of the other.
fn schedule(percents: &[u8]) -> Vec<usize> {
    let total: i32 = percents.iter().map(|&p| i32::from(p)).sum();
    let mut current = vec![0i32; percents.len()];
    (0..total)
        .map(|_| {
            for (weight, &percent) in current.iter_mut().zip(percents) {
                *weight += i32::from(percent);
            }
            let (chosen, _) = current
                .iter()
                .enumerate()
                .max_by_key(|&(index, weight)| (*weight, std::cmp::Reverse(index)))
                .expect("a split has a target");
            current[chosen] -= total;
            chosen
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(revision: &str, percent: u8, tag: Option<&str>) -> serde_json::Value {
        serde_json::json!({
            "revision": revision,
            "percent": percent,
            "tag": tag,
            "module": format!("/revisions/{revision}"),
            "moduleDigest": format!("sha256:{}", "a".repeat(64)),
        })
    }

    #[test]
    fn every_hundred_requests_split_exactly_and_interleaved() {
        let slots = schedule(&[90, 10]);
        assert_eq!(slots.len(), 100);
        assert_eq!(slots.iter().filter(|&&index| index == 1).count(), 10);
        // Spread out: never two of the small share in a row, and one in each tenth.
        for tenth in slots.chunks(10) {
            assert_eq!(tenth.iter().filter(|&&index| index == 1).count(), 1, "{slots:?}");
        }
        let three = schedule(&[50, 30, 20]);
        assert_eq!(
            [0, 1, 2].map(|target| three.iter().filter(|&&index| index == target).count()),
            [50, 30, 20]
        );
        assert!(schedule(&[100, 0]).iter().all(|&index| index == 0));
    }

    #[test]
    fn traffic_that_cannot_be_served_as_asked_is_refused_saying_why() {
        let parse = |targets: Vec<serde_json::Value>| Traffic::parse(&serde_json::Value::from(targets).to_string());
        assert!(parse(vec![target("a-1", 90, None), target("a-2", 10, Some("canary"))]).is_ok());
        assert!(parse(vec![target("a-1", 100, None), target("a-2", 0, Some("next"))]).is_ok());
        let cases = [
            (vec![target("a-1", 90, None), target("a-2", 20, None)], "add up to 110"),
            (vec![target("a-1", 50, None), target("a-1", 50, None)], "twice"),
            (
                vec![target("a-1", 100, None), target("a-2", 0, None)],
                "neither a share nor a tag",
            ),
            (
                vec![target("a-1", 50, Some("x")), target("a-2", 50, Some("x"))],
                "given twice",
            ),
            (vec![], "at least one"),
        ];
        for (targets, expected) in cases {
            let error = parse(targets).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
        let error = Traffic::parse("{}").unwrap_err();
        assert!(error.contains("JSON list"), "{error}");
    }
}
