//! Scenarios only the in-memory API server can stage: failing and hanging requests,
//! what it records, and storage that needs no cluster.

use crate::harness::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use wasmless_artifact::Digest;
use wasmless_operator::crd::Phase;
use wasmless_operator::node_code_store::{self, NodeCodeStore, NodeCodeStoreSetting};
use wasmless_operator::objects::{self};
use wasmless_operator::{Context, Metrics, error_policy, reconcile};
use wasmless_testkit::FakeApiServer;

#[test]
fn what_the_api_server_drops_is_not_a_change() {
    use wasmless_operator::controller::is_subset;
    // A volume mount as written, and as a real API server returns it: `readOnly: false`
    // is not stored. Taking that for a change re-applied the Deployment on every reconcile
    // and kept the Function from ever reading its status (it stayed Pending).
    let desired = json!({"volumeMounts": [{"name": "cache", "mountPath": "/cache", "readOnly": false}], "env": []});
    let stored = json!({"volumeMounts": [{"name": "cache", "mountPath": "/cache"}], "imagePullPolicy": "IfNotPresent"});
    assert!(is_subset(&desired, &stored));
    let read_only = json!({"volumeMounts": [{"name": "cache", "mountPath": "/cache", "readOnly": true}]});
    assert!(
        !is_subset(&read_only, &stored),
        "a set field that is missing is a change"
    );
    assert!(!is_subset(&json!({"replicas": 0}), &json!({"replicas": 1})));
}

#[tokio::test]
async fn api_error_midway_is_retried_without_duplicates() {
    let h = Harness::fake();
    let fake = h.fake.as_ref().unwrap();
    h.create("hello", json!({"source": HELLO})).await;
    fake.fail(http::Method::PATCH, "/jobs/", 1);
    let error = h.reconcile("hello").await.expect_err("the Job write failed");
    assert!(error.to_string().contains("injected failure"), "{error}");
    let action = error_policy(Arc::new(h.function("hello").await), &error, h.ctx.clone());
    assert_eq!(action, Action::requeue(Duration::from_secs(1)), "first retry after 1 s");
    let again = error_policy(Arc::new(h.function("hello").await), &error, h.ctx.clone());
    assert_eq!(again, Action::requeue(Duration::from_secs(2)), "then backs off");

    h.reconcile("hello").await.expect("the retry succeeds");
    h.reconcile("hello").await.expect("and again");
    assert_eq!(h.jobs("hello").await.len(), 1, "one Job despite the retry");
    let sources = fake.objects("/configmaps/hello-source-");
    assert_eq!(sources.len(), 1, "one source ConfigMap");
    assert_eq!(status(&h.function("hello").await).phase, Some(Phase::Building));
}

#[tokio::test]
async fn deleted_function_is_left_to_the_garbage_collector() {
    let h = Harness::fake();
    let fake = h.fake.as_ref().unwrap();
    h.create("hello", json!({"source": HELLO})).await;
    let mut func = h.function("hello").await;
    func.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    fake.clear_requests();
    let action = reconcile(Arc::new(func), h.ctx.clone()).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert!(fake.writes().is_empty(), "{:#?}", fake.writes());
}

#[tokio::test]
async fn goless_function_field_is_accepted_as_source() {
    let h = Harness::fake();
    h.create(
        "goless",
        json!({"function": HELLO, "service": "hello-svc", "serverPort": 9000}),
    )
    .await;
    let func = h.reconciled("goless").await;
    assert_eq!(status(&func).phase, Some(Phase::Building));
    h.finish_build("goless", &wasm("goless")).await;
    let func = h.reconciled("goless").await;
    assert!(h.api::<Service>().get_opt("hello-svc").await.unwrap().is_some());
    assert_eq!(
        status(&func).url.as_deref(),
        Some("http://hello-svc.default.svc.cluster.local:9000")
    );
}

#[tokio::test]
async fn a_failed_step_is_reported_on_status_and_cleared_by_the_retry() {
    let h = Harness::fake();
    let fake = h.fake.as_ref().unwrap();
    ready_function(&h, "hello", json!({"source": HELLO})).await;
    h.update_spec("hello", json!({"service": "greeter"})).await;
    // As when the operator's RBAC lacked `delete` on Services: the rename fails every time.
    fake.fail(http::Method::DELETE, "/services/hello", 1);
    let error = h
        .reconcile("hello")
        .await
        .expect_err("the old Service cannot be deleted");
    assert!(error.to_string().contains("injected failure"), "{error}");
    let func = h.function("hello").await;
    let ready = condition(&func, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "ReconcileError")
    );
    assert!(
        ready
            .message
            .starts_with("deleting the Service hello, renamed to greeter: "),
        "{}",
        ready.message
    );
    assert_eq!(status(&func).observed_generation, func.metadata.generation);
    assert!(h.event_reasons("hello").await.contains(&"ReconcileError".to_string()));
    // The retry succeeds and puts the condition right.
    let func = h.reconciled("hello").await;
    assert_eq!(condition(&func, "Ready").reason, "Available");
    assert!(h.api::<Service>().get_opt("hello").await.unwrap().is_none());
}

#[tokio::test]
async fn a_failed_build_step_is_reported_on_built() {
    let h = Harness::fake();
    let fake = h.fake.as_ref().unwrap();
    h.create("hello", json!({"source": HELLO})).await;
    fake.fail(http::Method::PATCH, "/jobs/", 1);
    h.reconcile("hello").await.expect_err("the Job write failed");
    let func = h.function("hello").await;
    let built = condition(&func, "Built");
    assert_eq!(built.reason, "ReconcileError");
    assert!(
        built.message.starts_with("creating the build Job hello-build-"),
        "{}",
        built.message
    );
    assert_eq!(status(&func).phase, Some(Phase::Pending));
}

#[tokio::test]
async fn a_failed_collection_of_old_builds_is_reported_on_built() {
    let h = Harness::fake();
    let fake = h.fake.as_ref().unwrap();
    ready_function(&h, "hello", json!({"source": HELLO})).await;
    h.update_spec("hello", json!({"source": HELLO_V2})).await;
    h.reconcile("hello").await.unwrap();
    h.finish_build("hello", &wasm("v2")).await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    // v2 serves everywhere: this reconcile deletes the first build, and that fails.
    fake.fail(http::Method::DELETE, "/jobs/hello-build-", 1);
    h.reconcile("hello")
        .await
        .expect_err("the old build Job cannot be deleted");
    let func = h.function("hello").await;
    let built = condition(&func, "Built");
    assert_eq!(
        (built.status.as_str(), built.reason.as_str()),
        ("False", "ReconcileError")
    );
    assert!(
        built.message.starts_with("deleting the older builds of hello: "),
        "{}",
        built.message
    );
    // Reported on the status this reconcile wrote (v2 Ready), not the one it started from.
    assert_eq!(status(&func).phase, Some(Phase::Ready), "v2 still serves");
    assert_eq!(condition(&func, "Ready").reason, "Available");
    assert_eq!(h.jobs("hello").await.len(), 2, "nothing collected yet");
    // The retry collects the old build and puts Built right.
    let func = h.reconciled("hello").await;
    assert_eq!(condition(&func, "Built").reason, "Built");
    assert_eq!(h.jobs("hello").await.len(), 1, "old build Job collected");
}

#[tokio::test]
async fn chunks_are_found_from_their_metadata_not_their_data() {
    let h = Harness::fake();
    let fake = h.fake.as_ref().unwrap();
    ready_function(&h, "hello", json!({"source": HELLO})).await;
    fake.clear_requests();
    h.reconcile("hello").await.unwrap();
    let lists: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.resource() == "configmaps" && r.verbs() == ["list"])
        .collect();
    assert!(!lists.is_empty());
    for list in lists {
        assert!(
            list.accept.contains("as=PartialObjectMetadataList"),
            "a ConfigMap list that reads the chunks' data: {list:?}"
        );
    }
}

#[test]
fn event_notes_are_cut_to_1024_bytes_on_a_character_boundary() {
    use wasmless_operator::controller::{MAX_EVENT_NOTE_BYTES, event_note};
    let note = event_note(&"é".repeat(600));
    assert!(note.len() <= MAX_EVENT_NOTE_BYTES, "{} bytes", note.len());
    assert!(note.starts_with("éé") && note.ends_with('…'));
    assert_eq!(event_note("short"), "short");
}

#[tokio::test]
async fn prebuilt_module_is_served_without_a_build() {
    let h = Harness::fake();
    let digest = Digest::of(b"prebuilt");
    h.create(
        "pre",
        json!({"language": "wasm", "module": {"image": "registry.local/fns/pre", "digest": digest.to_string()}}),
    )
    .await;
    h.reconcile("pre").await.unwrap();
    assert!(h.jobs("pre").await.is_empty());
    let deployment = h.deployment("pre").await.unwrap();
    let served = served_alone(&deployment);
    assert_eq!(served["module"], "oci://registry.local/fns/pre", "{served}");
    assert_eq!(served["moduleDigest"], digest.to_string());
}

#[tokio::test]
async fn oci_storage_publishes_to_the_registry_and_serves_by_reference() {
    let fake = FakeApiServer::new();
    let client = fake.client();
    let mut settings = settings();
    settings.oci_registry = Some("registry.local:5000/fns".into());
    let h = Harness {
        ctx: Arc::new(Context::new(client.clone(), settings, Metrics::default(), None)),
        client,
        fake: Some(fake),
        ns: "default".into(),
    };
    h.create("hello", json!({"source": HELLO, "storage": "oci"})).await;
    let func = h.reconciled("hello").await;
    let digest = Harness::status_source_digest(&func);
    let job = &h.jobs("hello").await[0];
    let args = first_container_args(job.spec.clone().unwrap().template);
    let target = format!("oci://registry.local:5000/fns/default/hello:{}", digest.short());
    assert!(has_flag(&args, "--publish", &target), "{args:?}");

    // The builder's result line is the only record of where an OCI build went.
    let module = Digest::of(b"oci module");
    let reference = format!(
        "registry.local:5000/fns/default/hello@sha256:{}",
        Digest::of(b"manifest").hex()
    );
    let code = Digest::of(b"oci code");
    let result = format!(
        r#"{{"digest":"{module}","size":10,"published":"oci://{reference}","code":{{"digest":"{code}","size":4}}}}"#
    );
    h.fail_build("hello", &result).await; // the pod and its termination message …
    h.api::<Job>() // … but the Job succeeded
        .patch_status(
            &objects::job_name("hello", &digest),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"failed": null, "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})),
        )
        .await
        .unwrap();
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).module_digest, Some(module.to_string()));
    assert_eq!(status(&func).module_ref, Some(format!("oci://{reference}")));
    let deployment = h.deployment("hello").await.unwrap();
    let served = served_alone(&deployment);
    assert_eq!(served["module"], format!("oci://{reference}"), "{served}");
    assert_eq!(served["code"], format!("oci://{reference}"), "{served}");
    assert_eq!(served["codeDigest"], code.to_string(), "{served}");
    // Later reconciles find the module from status, without the Job's pod.
    let pods: Api<Pod> = h.api();
    pods.delete(
        &format!("{}-x7k2p", objects::job_name("hello", &digest)),
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).module_digest, Some(module.to_string()));
    assert_eq!(status(&func).code_digest, Some(code.to_string()));
    let served = served_alone(&h.deployment("hello").await.unwrap());
    assert_eq!(served["codeDigest"], code.to_string(), "{served}");

    // An edit: while its build runs, status names the new source but what serves is still
    // the first build's module, which no reconcile may take for the edit's.
    h.update_spec("hello", json!({"source": HELLO_V2})).await;
    let edited = Harness::status_source_digest(&h.reconciled("hello").await);
    assert_ne!(edited, digest);
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).phase, Some(Phase::Building), "{:?}", status(&func));
    assert_eq!(status(&func).revisions.len(), 1, "{:?}", status(&func).revisions);
    let served = served_alone(&h.deployment("hello").await.unwrap());
    assert_eq!(served["moduleDigest"], module.to_string(), "{served}");
    // Its builder exits with its result: its own module serves, as a second revision, from
    // that reconcile on, before the Job has counted the pod and completed.
    let module_v2 = Digest::of(b"oci module v2");
    let reference_v2 = format!(
        "registry.local:5000/fns/default/hello@sha256:{}",
        Digest::of(b"manifest v2").hex()
    );
    let result = format!(r#"{{"digest":"{module_v2}","size":10,"published":"oci://{reference_v2}"}}"#);
    let terminated = json!({"exitCode": 0, "reason": "Completed", "message": result});
    h.build_pod_ended(&objects::job_name("hello", &edited), "Succeeded", terminated)
        .await;
    let func = h.reconciled("hello").await;
    let served = served_alone(&h.deployment("hello").await.unwrap());
    assert_eq!(served["module"], format!("oci://{reference_v2}"), "{served}");
    let revisions: Vec<(String, String)> = status(&func)
        .revisions
        .iter()
        .map(|r| (r.source_digest.clone(), r.module_digest.clone()))
        .collect();
    assert_eq!(
        revisions,
        [
            (edited.to_string(), module_v2.to_string()),
            (digest.to_string(), module.to_string())
        ]
    );
}

#[tokio::test]
async fn a_first_build_whose_pods_never_get_ready_rolls_out_after_a_while() {
    use wasmless_operator::crd::Function;
    let h = Harness::fake();
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    h.pods_started_not_ready("hello").await;
    h.publish_build("hello", &wasm("hello")).await;
    h.reconcile("hello").await.unwrap();
    assert!(
        waits_for_first_build(&h.deployment("hello").await.unwrap()),
        "held while its pods switch"
    );
    // The build ended a minute ago, and still no pod is ready (one that cannot read what
    // was built, say): the Service stops waiting for them and the build rolls out.
    let mut conditions = status(&h.function("hello").await).conditions;
    for condition in &mut conditions {
        if condition.type_ == "Built" {
            let a_minute_ago = k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(60);
            condition.last_transition_time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(a_minute_ago);
        }
    }
    h.api::<Function>()
        .patch_status(
            "hello",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": conditions}})),
        )
        .await
        .unwrap();
    h.reconcile("hello").await.unwrap();
    assert!(!waits_for_first_build(&h.deployment("hello").await.unwrap()));
    let service: Service = h.api().get("hello").await.unwrap();
    assert_eq!(service.spec.unwrap().publish_not_ready_addresses, Some(false));
}

#[tokio::test]
async fn with_the_node_code_store_a_functions_pods_reach_the_nodes_copy_of_its_code() {
    // The setting, and whether the node agent's CSIDriver is in the API when the operator
    // looks (at its start, then by a watch).
    let pod_of = |setting: NodeCodeStoreSetting, driver_installed: bool| async move {
        let fake = FakeApiServer::new();
        let client = fake.client();
        if driver_installed {
            let driver: CSIDriver = serde_json::from_value(
                json!({"metadata": {"name": "code.wasmless.io"}, "spec": {"podInfoOnMount": true}}),
            )
            .unwrap();
            Api::<CSIDriver>::all(client.clone())
                .create(&Default::default(), &driver)
                .await
                .unwrap();
        }
        let mut settings = settings();
        settings.node_code_store = NodeCodeStore::new(setting);
        node_code_store::detect(&client, &settings.node_code_store).await;
        let h = Harness {
            ctx: Arc::new(Context::new(client.clone(), settings, Metrics::default(), None)),
            client,
            fake: Some(fake),
            ns: "default".into(),
        };
        h.create("hello", json!({"source": HELLO})).await;
        h.reconcile("hello").await.unwrap();
        h.finish_build("hello", &wasm("hello")).await;
        h.reconcile("hello").await.unwrap();
        let deployment = h.deployment("hello").await.expect("the Deployment");
        deployment.spec.unwrap().template.spec.unwrap()
    };
    for (setting, driver_installed) in [(NodeCodeStoreSetting::Auto, false), (NodeCodeStoreSetting::False, true)] {
        let without = pod_of(setting, driver_installed).await;
        let args = without.containers[0].args.clone().unwrap();
        assert!(!args.contains(&"--code-store".to_string()), "{setting:?}: {args:?}");
        assert!(without.volumes.unwrap().iter().all(|volume| volume.csi.is_none()));
    }

    // The same volume as the pool's: the node agent serves it a socket as the pod's own
    // namespace, read-only, and the runtime asks it for the code before reading its own.
    // `auto`, the default, finds the agent installed; `true` does not look.
    let with = pod_of(NodeCodeStoreSetting::Auto, true).await;
    assert_eq!(with, pod_of(NodeCodeStoreSetting::True, false).await);
    let volume = with
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.csi.is_some())
        .expect("the store's volume");
    let csi = volume.csi.unwrap();
    assert_eq!((csi.driver.as_str(), csi.read_only), ("code.wasmless.io", Some(true)));
    let container = &with.containers[0];
    let mounts = container.volume_mounts.clone().unwrap();
    let mounted = mounts.iter().find(|mount| mount.name == volume.name).expect("mounted");
    assert_eq!(mounted.read_only, Some(true));
    let args = container.args.clone().unwrap();
    assert!(
        has_flag(&args, "--code-store", &format!("{}/agent.sock", mounted.mount_path)),
        "{args:?}"
    );
}
