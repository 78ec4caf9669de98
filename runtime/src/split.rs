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

use crate::ServeError;
use crate::config::Config;
use crate::tenant::Tenant;
use crate::traffic::{Target, Traffic};
use crate::traffic_files;
use arc_swap::ArcSwap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use wasmless_host::loader::EngineHost;
use wasmless_host::metrics::Metrics;

/// How often `--traffic-file` is read for a change: a few hundred bytes, and the kubelet
/// rewrites a downward API file within a few hundred milliseconds of the annotation.
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(100);
/// How many more times a list whose revisions did not load is tried, one
/// [`FOLLOW_INTERVAL`] apart: a revision read through the API may be refused for a moment
/// after the operator widened the pod's Role, until the API server's authorizer sees it.
pub(crate) const LOAD_RETRIES: u32 = 20;
/// How often routes that still did not load after [`LOAD_RETRIES`] are tried again: a pod
/// switched in place to them must not stay behind for good because the API refused it a
/// read for a while.
pub(crate) const SLOW_RETRY_INTERVAL: Duration = Duration::from_secs(5);

/// The request header that asks for a tagged revision.
pub const TAG_HEADER: &str = "wasmless-tag";
/// The response header that says which revision answered (only where several can).
pub const REVISION_HEADER: &str = "wasmless-revision";

/// The loaded revisions of a split, and where the next request goes.
pub struct Split {
    function: Arc<str>,
    /// What each tenant was made from, so a new traffic list reuses what it still names.
    targets: Vec<Target>,
    tenants: Vec<Arc<Tenant>>,
    tags: Vec<(String, usize)>,
    /// 100 slots, each the index of a tenant: a revision's share is its count of slots.
    schedule: Vec<usize>,
    next: AtomicUsize,
}

/// Why a request names no revision this process serves. The Function's tags are not
/// listed: a tag reaches a revision no share sends to (one not yet released), so a client
/// who was not given it is not told it.
#[derive(Debug, thiserror::Error)]
#[error(
    "no revision of {function} answers to the tag {tag:?} in the {TAG_HEADER} header: send the request without that header (it goes to the revisions by their shares of the traffic), or with a tag the Function's owner gave you"
)]
pub struct UnknownTag {
    function: Arc<str>,
    tag: String,
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
            targets: traffic.0.clone(),
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
                }),
            };
        }
        let slot = self.next.fetch_add(1, Ordering::Relaxed) % self.schedule.len();
        Ok(self.tenants[self.schedule[slot]].clone())
    }

    /// `hello-1 90%, hello-2 10% (canary)`, for the log.
    pub fn summary(&self) -> String {
        self.targets
            .iter()
            .map(|target| match &target.tag {
                Some(tag) => format!("{} {}% ({tag})", target.revision, target.percent),
                None => format!("{} {}%", target.revision, target.percent),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The tenant of this split already made from `target` (its revision, module and
    /// digests), labelled as `labelled` asks.
    fn tenant_for(&self, target: &Target, labelled: bool) -> Option<Arc<Tenant>> {
        let same = |known: &Target| {
            known.revision == target.revision
                && known.module == target.module
                && known.module_digest == target.module_digest
                && known.code == target.code
                && known.code_digest == target.code_digest
        };
        self.targets
            .iter()
            .zip(&self.tenants)
            .find(|(known, tenant)| same(known) && tenant.revision.is_some() == labelled)
            .map(|(_, tenant)| tenant.clone())
    }
}

/// The revisions a dedicated runtime serves now (`--traffic`, or `--traffic-file` followed
/// as it changes): a whole [`Split`], swapped for a new one only once every revision the
/// new one names is loaded, so a request never waits for a switch, and one that fails to
/// load leaves the old one serving.
///
/// A list of one revision is served as a Function with one revision is: without the
/// `revision` metric label and the [`REVISION_HEADER`], so a pod that is switched from one
/// revision to another keeps its series.
pub struct Revisions {
    current: ArcSwap<Split>,
    engine: EngineHost,
    config: Config,
    metrics: Arc<Metrics>,
    admin_port: u16,
    /// One switch at a time.
    switching: tokio::sync::Mutex<()>,
}

impl Revisions {
    /// Loads every revision `traffic` names (digests checked) before it returns.
    pub async fn load(
        engine: EngineHost,
        config: &Config,
        metrics: Arc<Metrics>,
        admin_port: u16,
        traffic: &Traffic,
    ) -> Result<Self, ServeError> {
        let config = Config {
            traffic: None,
            traffic_file: Vec::new(),
            ..config.clone()
        };
        let split = make_split(&engine, &config, &metrics, admin_port, traffic, None).await?;
        Ok(Self {
            current: ArcSwap::from_pointee(split),
            engine,
            config,
            metrics,
            admin_port,
            switching: tokio::sync::Mutex::new(()),
        })
    }

    pub fn choose(&self, headers: &http::HeaderMap) -> Result<Arc<Tenant>, UnknownTag> {
        self.current.load().choose(headers)
    }

    pub fn summary(&self) -> String {
        self.current.load().summary()
    }

    /// Serves `traffic` from now on, once each revision it names that is not loaded yet
    /// is; the revisions it no longer names are dropped when their last request ends.
    pub async fn switch(&self, traffic: &Traffic) -> Result<(), ServeError> {
        let _one = self.switching.lock().await;
        let now = self.current.load_full();
        let split = make_split(
            &self.engine,
            &self.config,
            &self.metrics,
            self.admin_port,
            traffic,
            Some(&now),
        )
        .await?;
        self.current.store(Arc::new(split));
        Ok(())
    }

    /// Reads `files` every [`FOLLOW_INTERVAL`] and switches to the routes that serve
    /// among them ([`traffic_files::choose`]) whenever those change from `applied` (the
    /// routes served now). A list that does not parse is logged once; one whose revisions
    /// do not load is tried again [`LOAD_RETRIES`] times, then logged; meanwhile the last
    /// one serves on.
    pub async fn follow(self: Arc<Self>, files: Vec<PathBuf>, mut applied: String) {
        let mut tick = tokio::time::interval(FOLLOW_INTERVAL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut unreadable = false;
        let mut reported: Vec<String> = Vec::new();
        let mut retries_left = 0;
        let mut given_up_at: Option<std::time::Instant> = None;
        loop {
            tick.tick().await;
            let read = match traffic_files::read_all(&files).await {
                Ok(read) => read,
                Err((file, error)) => {
                    if !std::mem::replace(&mut unreadable, true) {
                        tracing::error!(file = %file.display(), %error, "cannot read the traffic file; the last traffic serves on");
                    }
                    continue;
                }
            };
            unreadable = false;
            let (chosen, problems) = traffic_files::choose(&read);
            if problems != reported {
                for problem in &problems {
                    tracing::error!(%problem, serving = %self.summary(), "the traffic file's new list cannot be served; the last one serves on");
                }
                reported = problems;
            }
            let Some(chosen) = chosen else { continue };
            if chosen.routes != applied {
                applied = chosen.routes.clone();
                retries_left = LOAD_RETRIES;
                given_up_at = None;
            } else if let Some(at) = given_up_at {
                // Routes that never loaded: tried again now and then, not given up on.
                if at.elapsed() < SLOW_RETRY_INTERVAL {
                    continue;
                }
                given_up_at = Some(std::time::Instant::now());
            } else if retries_left == 0 {
                continue;
            } else {
                retries_left -= 1;
            }
            let file = chosen.file.display();
            let started = std::time::Instant::now();
            let traffic = match Traffic::parse(applied.trim()) {
                Ok(traffic) => traffic,
                Err(error) => {
                    retries_left = 0;
                    tracing::error!(%file, %error, serving = %self.summary(), "the traffic file's new list cannot be served; the last one serves on");
                    continue;
                }
            };
            match self.switch(&traffic).await {
                Ok(()) => {
                    retries_left = 0;
                    given_up_at = None;
                    tracing::info!(
                        traffic = %self.summary(),
                        %file,
                        generation = chosen.generation,
                        switch_ms = started.elapsed().as_secs_f64() * 1000.0,
                        "serving the traffic file's revisions"
                    )
                }
                Err(error) if retries_left > 0 => tracing::warn!(
                    %file,
                    %error,
                    retries_left,
                    "the traffic file's new list cannot be served yet; trying again"
                ),
                Err(error) => {
                    if given_up_at.replace(std::time::Instant::now()).is_none() {
                        tracing::error!(
                            %file,
                            %error,
                            serving = %self.summary(),
                            "the traffic file's new list cannot be served; the last one serves on, and it is tried again every few seconds"
                        );
                    }
                }
            }
        }
    }
}

/// The split `traffic` describes: the tenants of `reuse` that serve a revision it still
/// names (with the same module and digests), new ones for the rest, all loaded.
async fn make_split(
    engine: &EngineHost,
    config: &Config,
    metrics: &Arc<Metrics>,
    admin_port: u16,
    traffic: &Traffic,
    reuse: Option<&Split>,
) -> Result<Split, ServeError> {
    let labelled = traffic.0.len() > 1;
    let mut tenants = Vec::new();
    for target in &traffic.0 {
        if let Some(tenant) = reuse.and_then(|split| split.tenant_for(target, labelled)) {
            tenants.push(tenant);
            continue;
        }
        let checked = "digests checked by Traffic::parse";
        let revision_config = Config {
            module: Some(target.module.clone()),
            module_digest: Some(target.module_digest.parse().expect(checked)),
            code: target.code.clone(),
            code_digest: target.code_digest.as_ref().map(|digest| digest.parse().expect(checked)),
            ..config.clone()
        };
        let revision_metrics = match labelled {
            true => Arc::new(metrics.for_revision(&config.function, Some(&target.revision))),
            false => metrics.clone(),
        };
        let environment = config.process_env().into_iter();
        let mut tenant = Tenant::new(engine, &revision_config, revision_metrics, admin_port, environment)?;
        if labelled {
            tenant.revision = Some(target.revision.as_str().into());
        }
        tenants.push(Arc::new(tenant));
    }
    futures::future::try_join_all(tenants.iter().map(|tenant| tenant.handler())).await?;
    Ok(Split::new(&config.function, traffic, tenants))
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
    fn an_unknown_tag_is_refused_without_naming_the_known_ones() {
        let targets = vec![target("hello-1", 100, None), target("hello-2", 0, Some("unreleased"))];
        let traffic = Traffic::parse(&serde_json::Value::from(targets).to_string()).unwrap();
        // No tenant is reached: an unknown tag is refused before any is chosen.
        let split = Split::new("hello", &traffic, Vec::new());
        let mut headers = http::HeaderMap::new();
        headers.insert(TAG_HEADER, http::HeaderValue::from_static("guess"));
        let Err(error) = split.choose(&headers) else {
            panic!("an unknown tag chose a revision")
        };
        let text = error.to_string();
        assert!(!text.contains("unreleased"), "{text}");
        assert!(
            text.contains("\"guess\"") && text.contains("without that header"),
            "{text}"
        );
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
