//! The pool's table from the Kubernetes API (`--pool api:<label selector>`): the ConfigMaps
//! of the pool's namespace that the selector picks, one per Function, watched — a ConfigMap
//! volume would take up to a minute to show a change, a watch event takes milliseconds.
//!
//! A ConfigMap is `<fn>-pool`, labelled `wasmless.io/function: <fn>`, its key `entry.json`
//! the JSON of a table file. The Function's name is that label, else the ConfigMap's name.
//! The same client reads pooled Functions' chunk ConfigMaps ([`crate::configmap_chunks`]).

use super::Pool;
use super::references::{self, ApiObjects};
use super::table::{self, Entry, Row, Table};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The label that names a ConfigMap's Function.
pub const FUNCTION_LABEL: &str = "wasmless.io/function";
/// The ConfigMap key that holds the entry.
pub const ENTRY_KEY: &str = "entry.json";
/// The namespace a pod's service account is in (Kubernetes mounts it in every pod).
const SERVICE_ACCOUNT_NAMESPACE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "--pool api: needs a Kubernetes client (in a pod, its service account; elsewhere KUBECONFIG or ~/.kube/config): {0}"
    )]
    Client(kube::Error),
}

/// Checks the text after `api:`: a label selector, which must pick something (an empty one
/// would make every ConfigMap of the namespace a Function).
pub fn parse_selector(text: &str) -> Result<String, String> {
    let selector = text.trim();
    if selector.is_empty() {
        return Err("api: needs a label selector, e.g. api:wasmless.io/component=pool-entry".into());
    }
    if selector.split(',').any(|term| term.trim().is_empty()) {
        return Err(format!("the label selector {selector:?} has an empty term"));
    }
    Ok(selector.to_string())
}

/// The pool's namespace: `WASMLESS_NAMESPACE` (the operator sets it from the downward
/// API), else the service account's, else the kubeconfig's default.
pub fn choose_namespace(env: Option<String>, service_account: Option<String>, kubeconfig_default: &str) -> String {
    [env, service_account]
        .into_iter()
        .flatten()
        .map(|namespace| namespace.trim().to_string())
        .find(|namespace| !namespace.is_empty())
        .unwrap_or_else(|| kubeconfig_default.to_string())
}

/// The Function a ConfigMap describes: its name and its row of the table.
pub fn row_of(configmap: &ConfigMap) -> (String, Row) {
    let configmap_name = configmap.metadata.name.clone().unwrap_or_default();
    let function = configmap
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(FUNCTION_LABEL))
        .filter(|name| !name.is_empty())
        .cloned()
        .unwrap_or_else(|| configmap_name.clone());
    let entry = match configmap.data.as_ref().and_then(|data| data.get(ENTRY_KEY)) {
        Some(json) => table::parse_entry(json.as_bytes()),
        None => Err(format!("it has no {ENTRY_KEY} key")),
    };
    let row = Row {
        origin: format!("ConfigMap {configmap_name}"),
        entry,
    };
    (function, row)
}

/// The table of the ConfigMaps held, by ConfigMap name. Two ConfigMaps naming one
/// Function: the first by name serves it, the other is reported (under a key no Function
/// name can have, so it takes nobody's place).
pub fn table_of(configmaps: &BTreeMap<String, (String, Row)>) -> Table {
    let mut table = Table::new();
    for (configmap, (function, row)) in configmaps {
        if let Some(first) = table.get(function) {
            let problem = format!("Function {function} is {}'s already", first.origin);
            table.insert(
                format!("ConfigMap {configmap}"),
                Row {
                    origin: row.origin.clone(),
                    entry: Err(problem),
                },
            );
        } else {
            table.insert(function.clone(), row.clone());
        }
    }
    table
}

/// How long a Function whose Secrets or ConfigMaps could not be read waits before they are
/// read again: doubling from the first, up to the last.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MOST: Duration = Duration::from_secs(10);

/// An entry whose values could not be read: its ConfigMap, and when to try again.
struct Unresolved {
    configmap: ConfigMap,
    wait: Duration,
    next: Instant,
}

/// A connected client, and what to watch with it.
pub struct ApiTable {
    configmaps: kube::Api<ConfigMap>,
    objects: ApiObjects,
    namespace: String,
    selector: String,
}

impl ApiTable {
    /// Connects (in a pod with its service account, elsewhere with KUBECONFIG), finds the
    /// pool's namespace, and lets `configmaps:` sources read chunks there.
    pub async fn connect(selector: &str) -> Result<Self, ApiError> {
        let client = kube::Client::try_default().await.map_err(ApiError::Client)?;
        let namespace = choose_namespace(
            std::env::var("WASMLESS_NAMESPACE").ok(),
            std::fs::read_to_string(SERVICE_ACCOUNT_NAMESPACE).ok(),
            client.default_namespace(),
        );
        crate::configmap_chunks::use_client(client.clone(), &namespace);
        Ok(Self {
            configmaps: kube::Api::namespaced(client.clone(), &namespace),
            objects: ApiObjects {
                secrets: kube::Api::<Secret>::namespaced(client.clone(), &namespace),
                configmaps: kube::Api::namespaced(client, &namespace),
            },
            namespace,
            selector: selector.to_string(),
        })
    }

    /// The row of an entry ConfigMap, its Secrets' and ConfigMaps' values read; whether
    /// reading them failed (then it is read again later).
    /// `previous`: the row held for it, whose values serve again when only the route changed.
    async fn read_row(&self, configmap: &ConfigMap, previous: Option<&(String, Row)>) -> ((String, Row), bool) {
        let (function, row) = row_of(configmap);
        let Ok(entry) = row.entry else {
            return ((function, row), false);
        };
        if let Some((_, Row { entry: Ok(held), .. })) = previous {
            let reused = Entry {
                resolved: held.resolved.clone(),
                ..entry.clone()
            };
            if held.same_but_route(&reused) {
                let row = Row {
                    origin: row.origin,
                    entry: Ok(reused),
                };
                return ((function, row), false);
            }
        }
        let resolved = references::resolve(entry, &self.objects).await;
        let failed = resolved.is_err();
        let row = Row {
            origin: row.origin,
            entry: resolved,
        };
        ((function, row), failed)
    }

    /// Watches until the process ends: every change is applied as it arrives, a relist
    /// replaces the table once complete. A failed watch is retried with backoff, the last
    /// table serving meanwhile; so is a Function whose Secrets could not be read, on its own.
    pub async fn run(self, pool: Arc<Pool>) {
        tracing::info!(namespace = %self.namespace, selector = %self.selector, "watching the pool's table through the Kubernetes API");
        let config = watcher::Config::default().labels(&self.selector);
        let mut events = watcher::watcher(self.configmaps.clone(), config)
            .default_backoff()
            .boxed();
        let mut held: BTreeMap<String, (String, Row)> = BTreeMap::new();
        // A relist's ConfigMaps, applied together once it is complete: one missing from it
        // was deleted while the watch was down.
        let mut relisted: Option<BTreeMap<String, (String, Row)>> = None;
        let mut unresolved: BTreeMap<String, Unresolved> = BTreeMap::new();
        let mut retries = tokio::time::interval(RETRY_FIRST);
        retries.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut failing = false;
        loop {
            let event = tokio::select! {
                event = events.next() => match event {
                    Some(event) => event,
                    None => break,
                },
                _ = retries.tick(), if !unresolved.is_empty() => {
                    if self.retry(&mut unresolved, &mut held).await {
                        pool.apply(table_of(&held));
                    }
                    continue;
                }
            };
            let event = match event {
                Ok(event) => event,
                Err(error) => {
                    if !failing {
                        tracing::warn!(%error, namespace = %self.namespace, "watching the pool's ConfigMaps failed; retrying with backoff, serving the last table meanwhile");
                    }
                    failing = true;
                    continue;
                }
            };
            if failing {
                tracing::info!("watching the pool's ConfigMaps again");
                failing = false;
            }
            let name = |configmap: &ConfigMap| configmap.metadata.name.clone().unwrap_or_default();
            match event {
                Event::Init => relisted = Some(BTreeMap::new()),
                Event::InitApply(configmap) => {
                    let (row, failed) = self.read_row(&configmap, held.get(&name(&configmap))).await;
                    note_unresolved(&mut unresolved, &configmap, failed);
                    relisted.get_or_insert_default().insert(name(&configmap), row);
                }
                Event::InitDone => {
                    held = relisted.take().unwrap_or_default();
                    unresolved.retain(|name, _| held.contains_key(name));
                    pool.apply(table_of(&held));
                    tracing::info!(functions = pool.len(), "pool table read from the API");
                }
                Event::Apply(configmap) => {
                    let (row, failed) = self.read_row(&configmap, held.get(&name(&configmap))).await;
                    note_unresolved(&mut unresolved, &configmap, failed);
                    held.insert(name(&configmap), row);
                    pool.apply(table_of(&held));
                }
                Event::Delete(configmap) => {
                    held.remove(&name(&configmap));
                    unresolved.remove(&name(&configmap));
                    pool.apply(table_of(&held));
                }
            }
        }
        tracing::error!("the watch of the pool's ConfigMaps ended; serving the last table");
    }

    /// Reads again the values of the entries that are due; whether a row changed.
    async fn retry(
        &self,
        unresolved: &mut BTreeMap<String, Unresolved>,
        held: &mut BTreeMap<String, (String, Row)>,
    ) -> bool {
        let now = Instant::now();
        let due: Vec<String> = unresolved
            .iter()
            .filter(|(_, waiting)| waiting.next <= now)
            .map(|(name, _)| name.clone())
            .collect();
        let mut changed = false;
        for name in due {
            let configmap = unresolved[&name].configmap.clone();
            let (row, failed) = self.read_row(&configmap, None).await;
            if failed {
                let waiting = unresolved.get_mut(&name).expect("due");
                waiting.wait = (waiting.wait * 2).min(RETRY_MOST);
                waiting.next = Instant::now() + waiting.wait;
            } else {
                unresolved.remove(&name);
                tracing::info!(function = %row.0, "its Secrets and ConfigMaps were read");
            }
            if held.get(&name) != Some(&row) {
                held.insert(name, row);
                changed = true;
            }
        }
        changed
    }
}

/// Keeps `configmap` for another try when reading its values failed, forgets it otherwise.
fn note_unresolved(unresolved: &mut BTreeMap<String, Unresolved>, configmap: &ConfigMap, failed: bool) {
    let name = configmap.metadata.name.clone().unwrap_or_default();
    if failed {
        unresolved.insert(
            name,
            Unresolved {
                configmap: configmap.clone(),
                wait: RETRY_FIRST,
                next: Instant::now() + RETRY_FIRST,
            },
        );
    } else {
        unresolved.remove(&name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configmap(name: &str, function: Option<&str>, entry: Option<&str>) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": name,
                "labels": function.map(|function| serde_json::json!({FUNCTION_LABEL: function})),
            },
            "data": entry.map(|entry| serde_json::json!({ENTRY_KEY: entry})),
        }))
        .unwrap()
    }

    #[test]
    fn a_selector_must_pick_something() {
        assert_eq!(
            parse_selector("wasmless.io/component=pool-entry").unwrap(),
            "wasmless.io/component=pool-entry"
        );
        assert_eq!(parse_selector(" a=b,c ").unwrap(), "a=b,c");
        assert!(parse_selector("").unwrap_err().contains("label selector"));
        assert!(parse_selector("a=b,").unwrap_err().contains("empty term"));
    }

    #[test]
    fn the_namespace_is_the_variable_then_the_service_accounts_then_the_kubeconfigs() {
        let some = |text: &str| Some(text.to_string());
        assert_eq!(choose_namespace(some("fns"), some("sa\n"), "default"), "fns");
        assert_eq!(choose_namespace(None, some("sa\n"), "default"), "sa");
        assert_eq!(choose_namespace(some(""), None, "default"), "default");
    }

    #[test]
    fn a_configmap_is_named_by_its_function_label_else_its_own_name() {
        let entry = r#"{"port": 20001, "args": ["--function", "hello"]}"#;
        let (name, row) = row_of(&configmap("hello-pool", Some("hello"), Some(entry)));
        assert_eq!(name, "hello");
        assert_eq!(row.origin, "ConfigMap hello-pool");
        assert_eq!(row.entry.unwrap().port, 20001);
        let (name, _) = row_of(&configmap("unlabelled", None, Some(entry)));
        assert_eq!(name, "unlabelled");
    }

    #[test]
    fn a_configmap_without_a_usable_entry_says_why() {
        let (_, row) = row_of(&configmap("empty", Some("empty"), None));
        assert!(row.entry.unwrap_err().contains("no entry.json key"));
        let (_, row) = row_of(&configmap("broken", Some("broken"), Some("{")));
        assert!(row.entry.unwrap_err().contains(r#"{"port": <number>"#));
    }

    #[test]
    fn two_configmaps_for_one_function_serve_the_first_and_report_the_other() {
        let entry = |port: u16| format!(r#"{{"port": {port}, "args": []}}"#);
        let held: BTreeMap<String, (String, Row)> = [("a-pool", 20001), ("b-pool", 20002)]
            .into_iter()
            .map(|(name, port)| {
                let configmap = configmap(name, Some("hello"), Some(&entry(port)));
                (name.to_string(), row_of(&configmap))
            })
            .collect();
        let table = table_of(&held);
        assert_eq!(table["hello"].entry.as_ref().unwrap().port, 20001);
        let other = table["ConfigMap b-pool"].entry.as_ref().unwrap_err();
        assert!(other.contains("ConfigMap a-pool's already"), "{other}");
    }
}
