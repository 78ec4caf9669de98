//! The pool's table from the Kubernetes API (`--pool api:<label selector>`): the ConfigMaps
//! of the pool's namespace that the selector picks, one per Function, watched — a ConfigMap
//! volume would take up to a minute to show a change, a watch event takes milliseconds.
//!
//! A ConfigMap is `<fn>-pool`, labelled `wasmless.io/function: <fn>` and controlled by
//! Function `<fn>`, its key `entry.json` the JSON of a table file with only the flags the
//! operator writes ([`super::trust`]); any other is reported and not served. The same
//! client reads pooled Functions' chunk ConfigMaps ([`wasmless_host::configmap_chunks`]).

use super::Pool;
use super::references::{self, ApiObjects};
use super::table::{self, Entry, Row, Table};
use super::trust;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The label that names a ConfigMap's Function.
pub const FUNCTION_LABEL: &str = wasmless_artifact::labels::FUNCTION;
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

/// The Function a ConfigMap describes: its name and its row of the table. Only the
/// operator's entry for a Function is served ([`trust`]): a ConfigMap that is no
/// Function's entry is reported under `ConfigMap <name>`, a key no Function name can have
/// (names have no spaces), so that it takes no Function's place; one that is a Function's
/// but not as the operator writes it is reported under the Function, which, if it served
/// before, serves on as it was.
pub fn row_of(configmap: &ConfigMap) -> (String, Row) {
    let configmap_name = configmap.metadata.name.clone().unwrap_or_default();
    let origin = format!("ConfigMap {configmap_name}");
    let claimed_since = configmap.metadata.creation_timestamp.clone();
    let (function, entry) = match trust::entry_function(configmap) {
        Ok(function) => {
            let entry = parse_entry(configmap).and_then(|entry| {
                trust::check_args(&function, &entry.args)?;
                Ok(entry)
            });
            (function, entry)
        }
        Err(trust::Refusal::Stranger(problem)) => (origin.clone(), Err(problem)),
        Err(trust::Refusal::Unowned(problem)) => {
            let function = configmap_name.strip_suffix(trust::ENTRY_SUFFIX).unwrap_or_default();
            (function.to_string(), Err(problem))
        }
    };
    let row = Row {
        origin,
        entry,
        claimed_since,
    };
    (function, row)
}

fn parse_entry(configmap: &ConfigMap) -> Result<Entry, String> {
    match configmap.data.as_ref().and_then(|data| data.get(ENTRY_KEY)) {
        Some(json) => table::parse_entry(json.as_bytes()),
        None => Err(format!("it has no {ENTRY_KEY} key")),
    }
}

/// The table of the ConfigMaps held, by ConfigMap name. Only `<fn>-pool` can be `<fn>`'s
/// row ([`row_of`]); should two rows still name one Function, the first by ConfigMap name
/// serves it and the other is reported (under a key no Function name can have, so it
/// takes nobody's place).
pub fn table_of(configmaps: &BTreeMap<String, (String, Row)>) -> Table {
    let mut table = Table::new();
    for (configmap, (function, row)) in configmaps {
        if let Some(first) = table.get(function) {
            let problem = format!("Function {function} is {}'s already", first.origin);
            table.insert(
                format!("ConfigMap {configmap}"),
                Row {
                    entry: Err(problem),
                    ..row.clone()
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
        wasmless_host::configmap_chunks::use_client(client.clone(), &namespace);
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
                    entry: Ok(reused),
                    ..row
                };
                return ((function, row), false);
            }
        }
        let resolved = references::resolve(entry, &self.objects).await;
        let failed = resolved.is_err();
        let row = Row { entry: resolved, ..row };
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

    /// A ConfigMap as the operator writes an entry: `<function>-pool`, labelled with its
    /// Function and controlled by it, created at `created`.
    fn entry_configmap(function: &str, entry: &serde_json::Value, created: &str) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("{function}-pool"),
                "creationTimestamp": created,
                "labels": {FUNCTION_LABEL: function, "wasmless.io/component": "pool-entry"},
                "ownerReferences": [{
                    "apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "name": function,
                    "uid": "6f1d2c3b-0a9e-4e8f-b7c6-d5e4f3a2b1c0", "controller": true, "blockOwnerDeletion": true,
                }],
            },
            "data": {ENTRY_KEY: entry.to_string()},
        }))
        .unwrap()
    }

    /// The entry the operator writes for `function` on `port` (its own chunks, pinned).
    fn entry(function: &str, port: u16) -> serde_json::Value {
        let source = wasmless_artifact::Digest::of(b"source");
        let digest = wasmless_artifact::Digest::of(function.as_bytes());
        serde_json::json!({"port": port, "args": [
            "--module", format!("configmaps:{function}/{source}/1"), "--module-digest", digest.to_string(),
            "--function", function, "--memory-limit", "64Mi",
        ]})
    }

    /// `configmap` changed by `change` to its JSON.
    fn changed(configmap: &ConfigMap, change: impl FnOnce(&mut serde_json::Value)) -> ConfigMap {
        let mut json = serde_json::to_value(configmap).unwrap();
        change(&mut json);
        serde_json::from_value(json).unwrap()
    }

    fn table(configmaps: &[ConfigMap]) -> Table {
        let held: BTreeMap<String, (String, Row)> = configmaps
            .iter()
            .map(|configmap| (configmap.metadata.name.clone().unwrap(), row_of(configmap)))
            .collect();
        table_of(&held)
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
    fn the_operators_entry_is_its_functions_row_with_its_creation_time() {
        let configmap = entry_configmap("hello", &entry("hello", 20001), "2024-05-01T10:00:00Z");
        let (name, row) = row_of(&configmap);
        assert_eq!(name, "hello");
        assert_eq!(row.origin, "ConfigMap hello-pool");
        assert_eq!(row.claimed_since, configmap.metadata.creation_timestamp);
        assert_eq!(row.entry.unwrap().port, 20001);
    }

    #[test]
    fn a_configmap_without_a_usable_entry_says_why() {
        let empty = changed(
            &entry_configmap("empty", &entry("empty", 1), "2024-05-01T10:00:00Z"),
            |json| {
                json["data"] = serde_json::json!({});
            },
        );
        let (_, row) = row_of(&empty);
        assert!(row.entry.unwrap_err().contains("no entry.json key"));
        let broken = changed(&empty, |json| json["data"] = serde_json::json!({ENTRY_KEY: "{"}));
        let (_, row) = row_of(&broken);
        assert!(row.entry.unwrap_err().contains(r#"{"port": <number>"#));
    }

    /// Door 1 of issue 38: a ConfigMap anyone who may edit ConfigMaps can write, copying
    /// the victim's entry, took over its port and its clients. Now only the victim's own
    /// entry is its row; a copy under another name, or without the label, takes nobody's
    /// place and says why.
    #[test]
    fn a_forged_entry_under_another_name_or_unlabelled_takes_no_functions_place() {
        let victim = entry_configmap("victim", &entry("victim", 20001), "2024-05-01T10:00:00Z");
        // Sorts before victim-pool, which used to make it the Function's entry.
        let forged = changed(&victim, |json| json["metadata"]["name"] = "a-pool".into());
        let unlabelled = changed(&victim, |json| {
            json["metadata"]["name"] = "aa-pool".into();
            json["metadata"]["labels"] = serde_json::json!({"wasmless.io/component": "pool-entry"});
        });
        let table = table(&[forged, unlabelled, victim.clone()]);
        assert_eq!(table["victim"], row_of(&victim).1, "{table:#?}");
        let forged = table["ConfigMap a-pool"].entry.as_ref().unwrap_err();
        assert!(forged.contains("which is victim-pool"), "{forged}");
        let unlabelled = table["ConfigMap aa-pool"].entry.as_ref().unwrap_err();
        assert!(unlabelled.contains("no wasmless.io/function label"), "{unlabelled}");
        assert_eq!(table.len(), 3, "{table:#?}");
    }

    /// An entry named and labelled as the operator's but not controlled by its Function,
    /// or holding a flag the operator never writes: refused under the Function's name, so
    /// that the Function, if it served, serves on as it was (`Pool::apply`).
    #[test]
    fn an_entry_not_owned_by_its_function_or_with_a_foreign_flag_is_refused_naming_why() {
        let own = entry_configmap("victim", &entry("victim", 20001), "2024-05-01T10:00:00Z");
        let unowned = changed(&own, |json| json["metadata"]["ownerReferences"] = serde_json::json!([]));
        let (name, row) = row_of(&unowned);
        assert_eq!(name, "victim");
        let why = row.entry.unwrap_err();
        assert!(why.contains("not controlled by Function victim"), "{why}");
        let not_controller = changed(&own, |json| {
            json["metadata"]["ownerReferences"][0]["controller"] = false.into();
        });
        assert!(row_of(&not_controller).1.entry.is_err());

        for (flag, value) in [
            ("--env", "GREETING=forged"),
            ("--outbound-ca", "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"),
            ("--module", "/tmp/native.wasm"),
        ] {
            let foreign = changed(&own, |json| {
                let mut entry = entry("victim", 20001);
                entry["args"]
                    .as_array_mut()
                    .unwrap()
                    .extend([flag.into(), value.into()]);
                json["data"][ENTRY_KEY] = entry.to_string().into();
            });
            let (name, row) = row_of(&foreign);
            assert_eq!(name, "victim");
            let why = row.entry.unwrap_err();
            assert!(why.contains(flag) || why.contains(value), "{flag}: {why}");
        }
        let other_function = changed(&own, |json| {
            json["data"][ENTRY_KEY] = entry("other", 20001).to_string().into();
        });
        let why = row_of(&other_function).1.entry.unwrap_err();
        assert!(why.contains("Function other's chunks"), "{why}");
    }
}
