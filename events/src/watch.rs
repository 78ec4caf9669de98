//! The Functions of the cluster (or of one namespace) followed with a watch: each one's
//! triggers kept running as its spec says (`running::Running::set`), and a Function gone
//! while the watch was down (absent from the list it starts again with) is stopped too.

use crate::broker::Broker;
use crate::function;
pub use crate::function::functions_api;
use crate::running::Running;
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::DynamicObject;
use kube::runtime::watcher;
use std::collections::HashSet;

/// Follows the Functions until the watch's stream ends (it does not: the watcher retries).
pub async fn follow_functions<B: Broker>(api: kube::Api<DynamicObject>, running: &mut Running<B>) {
    let mut events = watcher(api, watcher::Config::default()).boxed();
    let mut listed: HashSet<(String, String)> = HashSet::new();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(object)) => {
                listed.insert(key(&object));
                apply(running, &object).await;
            }
            Ok(watcher::Event::InitDone) => {
                for (namespace, name) in running.functions() {
                    if !listed.contains(&(namespace.clone(), name.clone())) {
                        running.set(&namespace, &name, Vec::new()).await;
                    }
                }
            }
            Ok(watcher::Event::Apply(object)) => apply(running, &object).await,
            Ok(watcher::Event::Delete(object)) => {
                let (namespace, name) = key(&object);
                running.set(&namespace, &name, Vec::new()).await;
            }
            Err(error) => tracing::warn!(%error, "the watch of Functions failed; it starts again"),
        }
    }
}

fn key(object: &DynamicObject) -> (String, String) {
    (object.namespace().unwrap_or_default(), object.name_any())
}

async fn apply<B: Broker>(running: &mut Running<B>, object: &DynamicObject) {
    let (namespace, name) = key(object);
    let spec = object.data.get("spec").cloned().unwrap_or_default();
    match function::wanted(&namespace, &name, &spec) {
        Ok(mut wanted) => {
            for want in &mut wanted {
                want.function_uid = object.uid();
            }
            running.set(&namespace, &name, wanted).await
        }
        Err(error) => {
            // What got past the CRD (a cron expression the parser refuses, an older CRD):
            // the triggers as they were keep running, as a failed build leaves the old
            // version serving; removing them would remove their consumers, and with them
            // where each had got to.
            tracing::warn!(function = %name, %namespace, %error, "a Function's triggers cannot change; the ones running keep running");
        }
    }
}
