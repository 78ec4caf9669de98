//! Whether runtime pods reach their node's code store (`--node-code-store`): always, never,
//! or, by default, while the node agent's CSI driver `code.wasmless.io` is installed. A
//! pod whose volume names a driver that no node serves never starts, so `auto` follows the
//! CSIDriver object that `deploy/node-agent/` (or the chart's `nodeAgent.install`) creates
//! beside its DaemonSet: installing the agent turns the store on, removing it turns it off,
//! and either rolls every Function's pods once.

use futures::StreamExt;
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc;

/// The node agent's CSI driver (deploy/node-agent/csidriver.yaml).
pub const DRIVER: &str = "code.wasmless.io";

/// The flag's three values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeCodeStoreSetting {
    /// While the CSIDriver `code.wasmless.io` exists.
    Auto,
    /// Always: where no node agent runs, runtime pods wait for it.
    #[value(alias = "on")]
    True,
    /// Never.
    #[value(alias = "off")]
    False,
}

/// The setting, and (for `auto`) whether the driver was last seen installed; shared by
/// every clone, so the watch below changes what every reconcile after it builds.
#[derive(Clone, Debug)]
pub struct NodeCodeStore {
    setting: NodeCodeStoreSetting,
    driver_installed: Arc<AtomicBool>,
}

impl NodeCodeStore {
    pub fn new(setting: NodeCodeStoreSetting) -> Self {
        Self {
            setting,
            driver_installed: Arc::new(AtomicBool::new(false)),
        }
    }

    pub fn setting(&self) -> NodeCodeStoreSetting {
        self.setting
    }

    /// Whether runtime pods made now get the store's volume.
    pub fn in_use(&self) -> bool {
        match self.setting {
            NodeCodeStoreSetting::True => true,
            NodeCodeStoreSetting::False => false,
            NodeCodeStoreSetting::Auto => self.driver_installed.load(Ordering::Relaxed),
        }
    }

    /// Records whether the driver is installed; true when that changed [`Self::in_use`].
    pub fn driver_seen(&self, installed: bool) -> bool {
        let before = self.in_use();
        self.driver_installed.store(installed, Ordering::Relaxed);
        before != self.in_use()
    }
}

impl Default for NodeCodeStore {
    fn default() -> Self {
        Self::new(NodeCodeStoreSetting::Auto)
    }
}

/// Looks the driver up once, so that the first reconciles already build what the
/// cluster has (a restarted operator must not roll every pod off the store and back).
/// An API that refuses the read (an RBAC without `csidrivers`) leaves the store off.
pub async fn detect(client: &Client, store: &NodeCodeStore) {
    if store.setting() != NodeCodeStoreSetting::Auto {
        return;
    }
    match Api::<CSIDriver>::all(client.clone()).get_opt(DRIVER).await {
        Ok(found) => {
            store.driver_seen(found.is_some());
            tracing::info!(driver = DRIVER, installed = found.is_some(), "the node's code store");
        }
        Err(error) => tracing::warn!(
            driver = DRIVER,
            %error,
            "cannot read the node agent's CSIDriver: runtime pods do not use the node's code store (give the operator get/list/watch on csidrivers, or set --node-code-store)"
        ),
    }
}

/// Follows the driver for as long as the operator runs, and sends on `changed` each time
/// its coming or going changes what runtime pods get (every Function is then reconciled).
pub async fn follow(client: Client, store: NodeCodeStore, changed: mpsc::UnboundedSender<()>) {
    if store.setting() != NodeCodeStoreSetting::Auto {
        return;
    }
    let config = watcher::Config::default().fields(&format!("metadata.name={DRIVER}"));
    let mut events = watcher::watcher(Api::<CSIDriver>::all(client), config)
        .default_backoff()
        .boxed();
    // Between a (re)list's Init and InitDone, whether the driver was among what it listed.
    let mut listed = false;
    while let Some(event) = events.next().await {
        let installed = match event {
            Ok(Event::Init) => {
                listed = false;
                continue;
            }
            Ok(Event::InitApply(_)) => {
                listed = true;
                continue;
            }
            Ok(Event::InitDone) => listed,
            Ok(Event::Apply(_)) => true,
            Ok(Event::Delete(_)) => false,
            Err(error) => {
                tracing::warn!(driver = DRIVER, %error, "watching the node agent's CSIDriver");
                continue;
            }
        };
        if store.driver_seen(installed) {
            tracing::info!(
                driver = DRIVER,
                installed,
                "the node's code store changed: rolling every Function's pods"
            );
            let _ = changed.send(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_the_driver_and_says_when_that_changes_the_pods() {
        let store = NodeCodeStore::default();
        assert!(!store.in_use(), "no driver seen yet");
        assert!(store.driver_seen(true), "installed: a change");
        assert!(store.in_use());
        let clone = store.clone();
        assert!(!clone.driver_seen(true), "seen again: no change");
        assert!(clone.driver_seen(false), "removed: a change");
        assert!(!store.in_use(), "clones share what was seen");
    }

    #[test]
    fn true_and_false_ignore_the_driver() {
        let on = NodeCodeStore::new(NodeCodeStoreSetting::True);
        let off = NodeCodeStore::new(NodeCodeStoreSetting::False);
        for installed in [false, true] {
            assert!(!on.driver_seen(installed) && on.in_use());
            assert!(!off.driver_seen(installed) && !off.in_use());
        }
    }
}
