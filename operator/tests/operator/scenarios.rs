//! The scenarios that run twice: `fake_api::*` on the in-memory API server, `real_api::*`
//! on the cluster of `WASMLESS_TEST_KUBECONFIG`.

use crate::harness::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::rbac::v1::Role;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;
use wasmless_artifact::{CHUNK_KEY, Digest, Part, annotations, configmap_name, labels};
use wasmless_operator::controller::REASON_REFERENCE_NOT_FOUND;
use wasmless_operator::crd::{Function, Phase, ServedBy};
use wasmless_operator::objects::{self, MANAGER};
use wasmless_operator::references;

async fn new_function_starts_one_content_addressed_build(h: &Harness) {
    h.create("hello", json!({"source": HELLO, "serverPort": 9000})).await;
    let func = h.reconciled("hello").await;
    let st = status(&func);
    assert_eq!(st.phase, Some(Phase::Building));
    assert_eq!(condition(&func, "Built").reason, "Building");
    let digest: Digest = st.source_digest.unwrap().parse().unwrap();
    assert_eq!(
        digest,
        objects::source_digest(func.spec.language, "wasmless/builder:test", HELLO)
    );

    let jobs = h.jobs("hello").await;
    assert_eq!(jobs.len(), 1, "exactly one build Job");
    let job = &jobs[0];
    assert_eq!(job.name_any(), format!("hello-build-{}", digest.short()));
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let steps: Vec<&str> = pod
        .init_containers
        .iter()
        .flatten()
        .chain(&pod.containers)
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(steps, ["prepare-cache", "builder", "publish"]);
    let builder = &pod.init_containers.as_ref().unwrap()[1];
    let args = builder.args.clone().unwrap();
    assert_eq!(
        args,
        [
            "build",
            "--language",
            "go",
            "--source",
            "/src/handler.go",
            "--output",
            "/work/module.wasm",
            "--no-code",
            "--result-file",
            "/work/build.json",
        ]
    );
    let publisher = &pod.containers[0];
    assert_eq!(
        publisher.args.clone().unwrap(),
        [
            "publish",
            "--language",
            "go",
            "--module",
            "/work/module.wasm",
            "--build-result",
            "/work/build.json",
            "--publish",
            &format!("configmap://{}/hello", h.ns)
        ]
    );
    let env_of = |container: &k8s_openapi::api::core::v1::Container| -> BTreeMap<String, Option<String>> {
        container
            .env
            .clone()
            .unwrap_or_default()
            .into_iter()
            .map(|e| (e.name, e.value))
            .collect()
    };
    let env = env_of(builder);
    assert_eq!(env["WASMLESS_SOURCE_DIGEST"], Some(digest.to_string()));
    // The chunks the builder publishes are owned by the Function from the start, so a build
    // that outlives its Function leaves nothing behind.
    assert_eq!(env_of(publisher)["WASMLESS_FUNCTION_UID"], func.uid());
    assert_eq!(pod.service_account_name.as_deref(), Some(objects::BUILDER_ACCOUNT));
    // Door 2: the compiler (which runs the author's procedural macros) has no token and only
    // its namespace's cache; the token is the publish step's alone, and so is the code cache.
    assert_eq!(pod.automount_service_account_token, Some(false));
    let mounts = |container: &k8s_openapi::api::core::v1::Container| -> Vec<(String, String, Option<String>)> {
        container
            .volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.clone(), m.mount_path.clone(), m.sub_path.clone()))
            .collect()
    };
    let token_path = "/var/run/secrets/kubernetes.io/serviceaccount";
    assert!(
        !mounts(builder)
            .iter()
            .any(|(name, path, _)| path.starts_with("/var/run/secrets") || name == "publisher-token"),
        "{:?}",
        mounts(builder)
    );
    assert!(mounts(builder).contains(&(
        "build-cache".into(),
        "/cache".into(),
        Some(format!("namespaces/{}/build", h.ns))
    )));
    assert!(
        mounts(publisher)
            .iter()
            .any(|(name, path, _)| name == "publisher-token" && path == token_path)
    );
    assert!(mounts(publisher).contains(&(
        "build-cache".into(),
        "/code-cache".into(),
        Some(format!("namespaces/{}/published", h.ns))
    )));
    let shared: Vec<_> = mounts(builder).into_iter().map(|(name, ..)| name).collect();
    for (name, path, _) in mounts(publisher) {
        let writable = !publisher
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == path && m.read_only == Some(true));
        assert!(
            !(shared.contains(&name) && writable && name != "build-cache"),
            "the publish step writes {name}, which the compile step can write too"
        );
    }
    // A compile error ends the build at once (anything else is retried); an evicted pod is
    // not a failed build.
    let rules = job.spec.as_ref().unwrap().pod_failure_policy.clone().unwrap().rules;
    assert_eq!(rules[0].action, "FailJob");
    assert_eq!(
        rules[0].on_exit_codes.as_ref().unwrap().values,
        vec![wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD]
    );
    assert_eq!(rules[1].action, "Ignore");
    let security = builder.security_context.as_ref().unwrap();
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.run_as_non_root, Some(true));
    assert_eq!(
        security.capabilities.as_ref().unwrap().drop,
        Some(vec!["ALL".to_string()])
    );
    assert_eq!(security.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");

    // The source the Job mounts is the one its digest names.
    let source_cm = h
        .api::<ConfigMap>()
        .get(&objects::source_configmap_name("hello", &digest))
        .await
        .unwrap();
    assert_eq!(source_cm.data.unwrap()["source"], HELLO);
    assert_eq!(source_cm.immutable, Some(true));
    // The builder may write ConfigMaps in this namespace and nothing else.
    let role = h
        .api::<k8s_openapi::api::rbac::v1::Role>()
        .get(objects::BUILDER_ACCOUNT)
        .await
        .unwrap();
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources, Some(vec!["configmaps".to_string()]));
    // Nothing to serve yet, but the pods start meanwhile: their routes name no revision (the
    // runtime waits, not ready), and they run as the chunk reader, whose Role comes with the
    // build (a Role with no names would grant every ConfigMap).
    let waiting = h
        .deployment("hello")
        .await
        .expect("a Deployment whose pods wait for the build");
    assert_eq!(waiting.spec.as_ref().unwrap().replicas, Some(1));
    assert!(waits_for_first_build(&waiting), "its pods wait for the first build");
    let pod = waiting.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("hello-chunk-reader"));
    assert!(
        h.api::<k8s_openapi::api::rbac::v1::Role>()
            .get_opt("hello-chunk-reader")
            .await
            .unwrap()
            .is_none(),
        "no Role before there is a chunk to read"
    );
    let service = h.api::<Service>().get("hello").await.expect("the Service");
    assert_eq!(
        service.spec.unwrap().publish_not_ready_addresses,
        Some(true),
        "to the waiting pods, ready or not"
    );
    let func = h.function("hello").await;
    assert_eq!(status(&func).phase, Some(Phase::Building));
    assert_eq!(condition(&func, "Ready").reason, "NoModule");
    assert!(h.event_reasons("hello").await.contains(&"Building".to_string()));

    // Reconciling again (a restart, a watch event) never starts a second build.
    h.reconcile("hello").await.unwrap();
    assert_eq!(h.jobs("hello").await.len(), 1);
    if let Some(fake) = &h.fake {
        let job_writes = fake.writes().into_iter().filter(|w| w.resource() == "jobs").count();
        assert_eq!(job_writes, 1, "the Job is written once");
        assert!(
            fake.writes()
                .iter()
                .filter(|w| w.method == http::Method::PATCH && w.resource() != "events")
                .all(|w| w.query.contains(MANAGER) && w.content_type.contains("apply-patch")),
            "every patch is a server-side apply by {MANAGER}"
        );
    }
}

async fn finished_build_rolls_out_and_becomes_ready(h: &Harness) {
    h.create(
        "hello",
        json!({"source": HELLO, "serverPort": 9000, "env": [{"name": "GREETING", "value": "hi"}]}),
    )
    .await;
    h.reconcile("hello").await.unwrap();
    let module = h.finish_build("hello", &wasm("hello")).await;
    let func = h.reconciled("hello").await;
    let st = status(&func);
    assert_eq!(condition(&func, "Built").status, "True");
    assert_eq!(st.module_digest, Some(module.to_string()));
    assert_eq!(st.module_digest_short, Some(module.short()));
    assert_eq!(
        st.url.as_deref(),
        Some(format!("http://hello.{}.svc.cluster.local:9000", h.ns).as_str())
    );
    if h.fake.is_some() {
        assert_eq!(st.phase, Some(Phase::Pending), "built, pods not yet available");
    } else {
        // On a cluster the first pods were switched to the build already (finish_build
        // waits for that), so the rolled-out pod may be available by this reconcile.
        assert!(
            st.phase == Some(Phase::Pending)
                || (st.phase == Some(Phase::Ready) && condition(&func, "Ready").reason == "Available"),
            "built: pending, or ready once its pods are available: {:?}",
            st.phase
        );
    }

    let deployment = h.deployment("hello").await.expect("the Deployment");
    assert_eq!(
        serving_annotation(&deployment, annotations::MODULE_DIGEST),
        module.to_string()
    );
    let pod = deployment.spec.as_ref().unwrap().template.spec.clone().unwrap();
    // The pods' one identity: their Function's chunk reader, which may only get its
    // revisions' chunks (for a switch in place to a revision built after they started).
    assert_eq!(pod.service_account_name.as_deref(), Some("hello-chunk-reader"));
    assert_eq!(pod.automount_service_account_token, Some(true));
    let role = h
        .api::<k8s_openapi::api::rbac::v1::Role>()
        .get("hello-chunk-reader")
        .await
        .expect("the chunk reader's Role");
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(
        (rules[0].verbs.as_slice(), rules[0].resources.as_deref()),
        (&["get".to_string()][..], Some(&["configmaps".to_string()][..]))
    );
    let short = &st.source_digest.as_deref().unwrap()["sha256:".len()..][..10];
    let readable = rules[0].resource_names.clone().unwrap_or_default();
    assert!(
        readable.contains(&format!("hello-module-{short}-0"))
            && readable
                .iter()
                .all(|name| name.starts_with(&format!("hello-module-{short}-"))
                    || name.starts_with(&format!("hello-code-{short}-"))),
        "the chunks of the one revision, by name: {readable:?}"
    );
    let runtime = &pod.containers[0];
    let args = runtime.args.clone().unwrap();
    let flag = |name: &str| args[args.iter().position(|a| a == name).unwrap() + 1].clone();
    let served = served_alone(&deployment);
    assert_eq!(served["revision"], "hello-1");
    assert_eq!(served["module"], "/revisions/hello-1");
    assert_eq!(served["moduleDigest"], module.to_string());
    assert_eq!(flag("--function"), "hello");
    // The handler's environment is in the container's, under the runtime's prefix.
    assert!(!args.contains(&"--env".to_string()), "{args:?}");
    let env = runtime.env.clone().unwrap();
    let greeting = env.iter().find(|e| e.name == "WASMLESS_HANDLER_ENV_GREETING").unwrap();
    assert_eq!(greeting.value.as_deref(), Some("hi"));
    assert_eq!(flag("--cache-dir"), "/cache");
    assert_eq!(flag("--watch-interval"), "0", "a pinned module is not polled");
    // Graceful termination: the runtime serves on for the drain delay (endpoints are
    // removed asynchronously), then drains; the kubelet waits longer than both.
    assert_eq!(flag("--drain-delay"), "5s");
    assert_eq!(flag("--shutdown-grace"), "30s");
    assert_eq!(pod.termination_grace_period_seconds, Some(40));
    assert!(
        runtime.lifecycle.as_ref().is_none_or(|l| l.pre_stop.is_none()),
        "the drain delay replaces the preStop sleep"
    );
    assert!(
        served["code"].is_null() && served["codeDigest"].is_null(),
        "a build without compiled code (an older builder's) serves the module alone: {served}"
    );
    assert_eq!(
        runtime
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/readyz")
    );
    assert_eq!(
        runtime
            .liveness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .path
            .as_deref(),
        Some("/healthz")
    );
    assert_eq!(
        runtime.security_context.as_ref().unwrap().read_only_root_filesystem,
        Some(true)
    );
    // Every chunk ConfigMap of the revision is projected into its directory as NNNN.wasm.zst.
    let volumes = pod.volumes.unwrap();
    let projected = volumes
        .iter()
        .find(|v| v.name == "revision-0")
        .unwrap()
        .projected
        .clone()
        .unwrap();
    let source_digest = Harness::status_source_digest(&func);
    let sources = projected.sources.unwrap();
    assert_eq!(sources.len(), 1);
    let cm = sources[0].config_map.as_ref().unwrap();
    assert_eq!(cm.name, configmap_name("hello", &source_digest, 0));
    assert_eq!(cm.items.as_ref().unwrap()[0].key, CHUNK_KEY);
    assert_eq!(cm.items.as_ref().unwrap()[0].path, "0000.wasm.zst");
    assert!(volumes.iter().any(|v| v.name == "cache" && v.empty_dir.is_some()));

    let service = h.api::<Service>().get("hello").await.unwrap();
    let ports = service.spec.as_ref().unwrap().ports.clone().unwrap();
    assert!(
        ports
            .iter()
            .any(|p| p.name.as_deref() == Some("http") && p.port == 9000)
    );
    assert!(
        ports
            .iter()
            .any(|p| p.name.as_deref() == Some("metrics") && p.port == 9090)
    );
    assert_eq!(service.annotations()["prometheus.io/scrape"], "true");
    assert_eq!(service.annotations()["prometheus.io/port"], "9090");

    // The chunks the builder wrote now belong to the Function (deleted with it).
    let chunk = h
        .api::<ConfigMap>()
        .get(&configmap_name("hello", &source_digest, 0))
        .await
        .unwrap();
    assert_eq!(chunk.owner_references()[0].uid, func.uid().unwrap());

    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).phase, Some(Phase::Ready));
    assert_eq!(condition(&func, "Ready").status, "True");
    assert_eq!(condition(&func, "Ready").observed_generation, func.metadata.generation);
    let reasons = h.event_reasons("hello").await;
    assert!(
        reasons.contains(&"Built".to_string()) && reasons.contains(&"Available".to_string()),
        "{reasons:?}"
    );
}

async fn compiled_code_is_mounted_beside_the_module_and_pinned(h: &Harness) {
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    let wasm = wasm("hello");
    // Not code the runtime can load (that takes wasmtime): on a cluster its pods log the
    // fallback and compile the module, and become available all the same.
    let code = h.publish_code("hello", &wasm, b"compiled code for the module").await;
    h.finish_build("hello", &wasm).await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).code_digest, Some(code.to_string()));
    let deployment = h.deployment("hello").await.expect("the Deployment");
    assert_eq!(
        serving_annotation(&deployment, annotations::CODE_DIGEST),
        code.to_string()
    );
    let template = deployment.spec.clone().unwrap().template;
    let served = served_alone(&deployment);
    assert_eq!(served["code"], "/revisions/hello-1", "{served}");
    assert_eq!(served["codeDigest"], code.to_string(), "{served}");
    let source_digest = Harness::status_source_digest(&func);
    let volume = template.spec.unwrap().volumes.unwrap();
    let projected: Vec<(String, String)> = volume
        .iter()
        .find(|v| v.name == "revision-0")
        .and_then(|v| v.projected.as_ref())
        .and_then(|p| p.sources.clone())
        .unwrap()
        .into_iter()
        .map(|source| {
            let cm = source.config_map.unwrap();
            (cm.name, cm.items.unwrap()[0].path.clone())
        })
        .collect();
    assert!(
        projected.contains(&(
            Part::Code.configmap_name("hello", &source_digest, 0),
            Part::Code.chunk_file_name(0)
        )),
        "{projected:?}"
    );
    h.make_available("hello").await;
    assert_eq!(condition(&h.reconciled("hello").await, "Ready").status, "True");

    // Code made from another module than the one found is not served.
    h.update_spec("hello", json!({"source": HELLO_V2})).await;
    h.reconcile("hello").await.unwrap();
    h.publish_code("hello", &wasm, b"code of the old module").await;
    let v2 = h.finish_build("hello", &crate::harness::wasm("v2")).await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).module_digest, Some(v2.to_string()));
    assert_eq!(status(&func).code_digest, None);
    let served = served_alone(&h.deployment("hello").await.unwrap());
    assert!(served["code"].is_null(), "{served}");
}

async fn unchanged_function_writes_nothing(h: &Harness) {
    ready_function(h, "hello", json!({"source": HELLO})).await;
    let before = h.versions("hello").await;
    if let Some(fake) = &h.fake {
        fake.clear_requests();
    }
    h.reconcile("hello").await.unwrap();
    h.reconcile("hello").await.unwrap();
    assert_eq!(h.versions("hello").await, before, "no object changed");
    if let Some(fake) = &h.fake {
        let writes = fake.writes();
        assert!(writes.is_empty(), "an unchanged Function writes nothing: {writes:#?}");
    }
}

async fn source_change_builds_once_and_rolls_out(h: &Harness) {
    let (_, old_module) = ready_function(h, "hello", json!({"source": HELLO})).await;
    let old_deployment = h.deployment("hello").await.unwrap();
    h.update_spec("hello", json!({"source": HELLO_V2})).await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).phase, Some(Phase::Building));
    // While building, the old module keeps serving, untouched.
    let during = h.deployment("hello").await.unwrap();
    assert!(h.same_spec(&old_deployment, &during));
    assert_eq!(status(&func).module_digest, Some(old_module.to_string()));
    h.reconcile("hello").await.unwrap();
    assert_eq!(
        h.jobs("hello").await.len(),
        2,
        "one Job per source, the new one created once"
    );

    let new_module = h.finish_build("hello", &wasm("v2")).await;
    let func = h.reconciled("hello").await;
    let deployment = h.deployment("hello").await.unwrap();
    assert_eq!(
        serving_annotation(&deployment, annotations::MODULE_DIGEST),
        new_module.to_string()
    );
    assert_eq!(status(&func).module_digest, Some(new_module.to_string()));
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).phase, Some(Phase::Ready));
    // Once the new module serves, the old build's Job and ConfigMaps are gone.
    let jobs = h.jobs("hello").await;
    assert_eq!(jobs.len(), 1, "old build Job collected");
    assert_eq!(
        jobs[0].name_any(),
        objects::job_name("hello", &Harness::status_source_digest(&func))
    );
    assert_ne!(old_module, new_module);
}

/// `spec.traffic` naming a kept revision serves it again, without a build; a revision not
/// kept is a `Ready` condition that names the kept ones, and what serves stays; and
/// `latestRevision: true` goes back to the latest build.
async fn traffic_rolls_back_to_a_kept_revision_without_a_build(h: &Harness) {
    let (_, v1) = ready_function(h, "hello", json!({"source": HELLO})).await;
    h.update_spec("hello", json!({"source": HELLO_V2})).await;
    h.reconcile("hello").await.unwrap();
    let v2 = h.finish_build("hello", &wasm("v2")).await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).latest_ready_revision.as_deref(), Some("hello-2"));
    let serving = |d: &Deployment| serving_annotation(d, annotations::MODULE_DIGEST);
    let traffic = |func: &Function| -> Vec<(String, i32)> {
        status(func)
            .traffic
            .iter()
            .map(|t| (t.revision.clone(), t.percent))
            .collect()
    };
    assert_eq!(traffic(&func), [("hello-2".to_string(), 100)]);
    let jobs = h.jobs("hello").await.len();

    h.update_spec("hello", json!({"traffic": [{"revision": "hello-1", "percent": 100}]}))
        .await;
    let func = h.reconciled("hello").await;
    assert_eq!(serving(&h.deployment("hello").await.unwrap()), v1.to_string());
    assert_eq!(h.jobs("hello").await.len(), jobs, "a rollback builds nothing");
    h.make_available("hello").await;
    let func_ready = h.reconciled("hello").await;
    assert_eq!(status(&func_ready).phase, Some(Phase::Ready), "{:?}", func.status);
    assert_eq!(status(&func_ready).module_digest, Some(v1.to_string()));
    assert_eq!(traffic(&func_ready), [("hello-1".to_string(), 100)]);
    // Rolling back does not make hello-1 the latest.
    assert_eq!(status(&func_ready).latest_ready_revision.as_deref(), Some("hello-2"));

    h.update_spec("hello", json!({"traffic": [{"revision": "hello-9", "percent": 100}]}))
        .await;
    let func = h.reconciled("hello").await;
    let ready = condition(&func, "Ready");
    assert_eq!(ready.status, "False");
    assert_eq!(ready.reason, "RevisionNotFound");
    assert!(
        ready.message.contains("hello-9") && ready.message.contains("hello-2, hello-1"),
        "{}",
        ready.message
    );
    assert_eq!(
        serving(&h.deployment("hello").await.unwrap()),
        v1.to_string(),
        "what serves stays"
    );

    h.update_spec("hello", json!({"traffic": [{"latestRevision": true, "percent": 100}]}))
        .await;
    h.reconcile("hello").await.unwrap();
    assert_eq!(serving(&h.deployment("hello").await.unwrap()), v2.to_string());
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(traffic(&func), [("hello-2".to_string(), 100)]);
}

/// `--traffic`'s revisions, shares, tags and module digests, as the pods are given them.
fn split_of(deployment: &Deployment) -> Vec<(String, u64, Option<String>, String)> {
    let targets = routes(deployment);
    if targets.len() < 2 {
        return Vec::new();
    }
    targets
        .iter()
        .map(|t| {
            (
                t["revision"].as_str().unwrap().to_string(),
                t["percent"].as_u64().unwrap(),
                t["tag"].as_str().map(str::to_string),
                t["moduleDigest"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// A split `spec.traffic` puts both revisions in the Function's pods, side by side, with
/// their shares and tag (no build for the kept one); status lists the split; shares that
/// do not add up leave the pods as they are and say so; promoting the latest to 100%
/// serves it alone.
async fn traffic_splits_between_revisions_in_the_pods(h: &Harness) {
    let (_, v1) = ready_function(h, "hello", json!({"source": HELLO})).await;
    let split = json!([
        {"revision": "hello-1", "percent": 90},
        {"latestRevision": true, "percent": 10, "tag": "canary"},
    ]);
    h.update_spec("hello", json!({"source": HELLO_V2, "traffic": split}))
        .await;
    h.reconcile("hello").await.unwrap();
    assert_eq!(
        split_of(&h.deployment("hello").await.unwrap()),
        [],
        "while v2 builds, every share is on hello-1: no split, no restart"
    );
    let v2 = h.finish_build("hello", &wasm("v2")).await;
    h.reconcile("hello").await.unwrap();
    let deployment = h.deployment("hello").await.unwrap();
    let expected = vec![
        ("hello-1".to_string(), 90, None, v1.to_string()),
        ("hello-2".to_string(), 10, Some("canary".to_string()), v2.to_string()),
    ];
    assert_eq!(split_of(&deployment), expected);
    let split_template = deployment.spec.as_ref().unwrap().template.clone();
    let pod = deployment.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let mounts: Vec<&str> = pod.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.mount_path.as_str())
        .collect();
    assert!(
        mounts.contains(&"/revisions/hello-1") && mounts.contains(&"/revisions/hello-2"),
        "{mounts:?}"
    );
    assert_eq!(
        serving_annotation(&deployment, objects::TRAFFIC_ANNOTATION),
        "hello-1 90%, hello-2 10% (canary)"
    );
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    let st = status(&func);
    assert_eq!(st.phase, Some(Phase::Ready), "{:?}", func.status);
    let traffic: Vec<_> = st
        .traffic
        .iter()
        .map(|t| (t.revision.as_str(), t.percent, t.tag.as_deref()))
        .collect();
    assert_eq!(traffic, [("hello-1", 90, None), ("hello-2", 10, Some("canary"))]);
    assert_eq!(st.serving.as_deref(), Some("hello-1 90%, hello-2 10% (canary)"));
    assert_eq!(st.latest_ready_revision.as_deref(), Some("hello-2"));
    let running = h.running_pod("hello", "hello-running").await;

    h.update_spec(
        "hello",
        json!({"traffic": [{"revision": "hello-1", "percent": 50}, {"latestRevision": true, "percent": 40}]}),
    )
    .await;
    let func = h.reconciled("hello").await;
    let ready = condition(&func, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "TrafficInvalid")
    );
    assert!(ready.message.contains("add up to 90"), "{}", ready.message);
    assert_eq!(
        split_of(&h.deployment("hello").await.unwrap()),
        expected,
        "what serves stays"
    );

    h.update_spec("hello", json!({"traffic": [{"latestRevision": true, "percent": 100}]}))
        .await;
    h.reconcile("hello").await.unwrap();
    let deployment = h.deployment("hello").await.unwrap();
    assert_eq!(split_of(&deployment), [], "promoted: one revision");
    assert_eq!(
        serving_annotation(&deployment, annotations::MODULE_DIGEST),
        v2.to_string()
    );
    // The running pod has both revisions mounted: it serves the promoted one now, by its
    // routes annotation, and the pod template stays as it is (nothing rolls), since its
    // pods can serve it.
    let pod = h.api::<Pod>().get(&running).await.unwrap();
    let template = deployment.spec.as_ref().unwrap().template.clone();
    assert_eq!(pod_routes(&pod), routes(&deployment), "switched in place");
    assert_eq!(template, split_template, "a promotion rolls no pod");
    assert_eq!(pod.annotations()[annotations::MODULE_DIGEST], v2.to_string());
    assert!(
        !pod.annotations().contains_key(objects::TRAFFIC_ANNOTATION),
        "no split any more: {:?}",
        pod.annotations()
    );
    // The revision before it stays mounted, for a rollback in place.
    assert!(mount_paths(&template).contains(&"/revisions/hello-1".to_string()));
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).serving.as_deref(), Some("hello-2"));

    // A rollback to it: in place too.
    h.update_spec("hello", json!({"traffic": [{"revision": "hello-1", "percent": 100}]}))
        .await;
    h.reconcile("hello").await.unwrap();
    let routes_now = pod_routes;
    assert_eq!(
        h.deployment("hello").await.unwrap().spec.unwrap().template,
        split_template,
        "a rollback rolls no pod"
    );
    let pod = h.api::<Pod>().get(&running).await.unwrap();
    let served: Vec<_> = routes_now(&pod)
        .iter()
        .map(|t| {
            (
                t["revision"].as_str().unwrap().to_string(),
                t["moduleDigest"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        served,
        [("hello-1".to_string(), v1.to_string())],
        "rolled back in place"
    );
    h.make_available("hello").await;
    h.reconciled("hello").await;

    // A new build's revision is in no running pod's volumes. A pod that runs as the
    // Function's chunk reader reads it through the API (its Role names the new chunks first);
    // one without a token is left to the rollout.
    let tokenless = h
        .running_pod_with("hello", "hello-tokenless", |spec| {
            spec.service_account_name = None;
            spec.automount_service_account_token = Some(false);
        })
        .await;
    h.update_spec(
        "hello",
        json!({"source": "package handlers\n\n// v3\n", "traffic": null}),
    )
    .await;
    h.reconcile("hello").await.unwrap();
    let v3 = h.finish_build("hello", &wasm("v3")).await;
    h.reconcile("hello").await.unwrap();
    let deployment = h.deployment("hello").await.unwrap();
    assert_eq!(
        serving_annotation(&deployment, annotations::MODULE_DIGEST),
        v3.to_string()
    );
    let v3_source = status(&h.function("hello").await).source_digest.unwrap();
    let pod = h.api::<Pod>().get(&running).await.unwrap();
    let route = &routes_now(&pod)[0];
    assert_eq!(
        (route["revision"].as_str(), route["moduleDigest"].as_str()),
        (Some("hello-3"), Some(v3.to_string().as_str())),
        "switched in place to the new build"
    );
    let module = route["module"].as_str().unwrap();
    assert!(
        module.starts_with(&format!("configmaps:hello/{v3_source}/")),
        "read through the API: {module}"
    );
    let role = h
        .api::<k8s_openapi::api::rbac::v1::Role>()
        .get(&objects::chunk_reader_name("hello"))
        .await
        .unwrap();
    let readable = role.rules.unwrap()[0].resource_names.clone().unwrap_or_default();
    let short = &v3_source.trim_start_matches("sha256:")[..10];
    assert!(
        readable.contains(&format!("hello-module-{short}-0")),
        "the chunk reader may get the new chunks: {readable:?}"
    );
    assert!(
        readable
            .iter()
            .all(|name| name.starts_with("hello-module-") || name.starts_with("hello-code-")),
        "and only chunks: {readable:?}"
    );
    let pod = h.api::<Pod>().get(&tokenless).await.unwrap();
    assert_eq!(
        routes_now(&pod)[0]["revision"],
        "hello-1",
        "a pod without the chunk reader's token is not switched to an unmounted revision"
    );
}

fn mount_paths(template: &k8s_openapi::api::core::v1::PodTemplateSpec) -> Vec<String> {
    template.spec.as_ref().unwrap().containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .map(|mount| mount.mount_path.clone())
        .collect()
}

/// Every successful build is a revision on status; the last `revisionHistoryLimit` keep
/// their source and chunk ConfigMaps (so a revert builds nothing), older ones lose them.
async fn revisions_keep_exactly_the_kept_builds(h: &Harness) {
    let spec = |source: &str| json!({"source": source, "revisionHistoryLimit": 2});
    let sources_stored = || async {
        let params = ListParams::default().labels(&format!("{}=hello", labels::FUNCTION));
        let mut sources: Vec<String> = h
            .api::<ConfigMap>()
            .list_metadata(&params)
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(|cm| cm.labels().get(labels::SOURCE_DIGEST).cloned())
            .collect();
        sources.sort();
        sources.dedup();
        sources
    };
    let short = |func: &Function| labels::digest_value(&Harness::status_source_digest(func));
    let names = |func: &Function| -> Vec<String> { status(func).revisions.iter().map(|r| r.name.clone()).collect() };
    let (v1, _) = ready_function(h, "hello", spec(HELLO)).await;
    assert_eq!(names(&v1), ["hello-1"]);
    assert_eq!(status(&v1).latest_ready_revision.as_deref(), Some("hello-1"));
    assert_eq!(
        status(&v1).revisions[0].module_digest,
        status(&v1).module_digest.clone().unwrap()
    );

    let mut stages = Vec::new();
    for (source, tag) in [(HELLO_V2, "v2"), ("package handlers\n\n// v3\n", "v3")] {
        h.update_spec("hello", spec(source)).await;
        h.reconcile("hello").await.unwrap();
        // Built, not yet ready: a revision already, not the latest ready one.
        h.finish_build("hello", &wasm(tag)).await;
        let func_built = h.reconciled("hello").await;
        assert_eq!(names(&func_built)[0], format!("hello-{}", stages.len() + 2));
        assert_ne!(
            status(&func_built).latest_ready_revision.as_deref(),
            Some(names(&func_built)[0].as_str())
        );
        h.make_available("hello").await;
        let func = h.reconciled("hello").await;
        assert_eq!(status(&func).phase, Some(Phase::Ready));
        stages.push(func);
    }
    let (v2, v3) = (&stages[0], &stages[1]);
    assert_eq!(names(v3), ["hello-3", "hello-2"], "cut to revisionHistoryLimit 2");
    assert_eq!(status(v3).latest_ready_revision.as_deref(), Some("hello-3"));
    let mut kept = vec![short(v2), short(v3)];
    kept.sort();
    assert_eq!(
        sources_stored().await,
        kept,
        "the ConfigMaps of exactly the kept revisions"
    );
    assert!(
        !sources_stored().await.contains(&short(&v1)),
        "hello-1's builds are deleted"
    );

    // Back to v2's source: its module is still stored, so nothing is built; a new revision.
    let jobs_before = h.jobs("hello").await.len();
    h.update_spec("hello", spec(HELLO_V2)).await;
    let func = h.reconciled("hello").await;
    assert_eq!(
        h.jobs("hello").await.len(),
        jobs_before,
        "a revert to a kept revision builds nothing"
    );
    assert_eq!(names(&func), ["hello-4", "hello-3"]);
    assert_eq!(
        status(&func).revisions[0].module_digest,
        status(v2).module_digest.clone().unwrap()
    );
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).latest_ready_revision.as_deref(), Some("hello-4"));
    assert_eq!(status(&func).module_digest, status(v2).module_digest);
}

async fn isolation_reaches_the_runtime_without_a_rebuild(h: &Harness) {
    let (_, module) = ready_function(h, "hello", json!({"source": HELLO})).await;
    let args = |deployment: Deployment| first_container_args(deployment.spec.unwrap().template);
    let default_args = args(h.deployment("hello").await.unwrap());
    assert!(
        !default_args.contains(&"--isolation".to_string()),
        "the default is left to the runtime, so an operator upgrade restarts no pod: {default_args:?}"
    );
    h.update_spec("hello", json!({"limits": {"isolation": "shared"}})).await;
    let func = h.reconciled("hello").await;
    let shared_args = args(h.deployment("hello").await.unwrap());
    assert!(has_flag(&shared_args, "--isolation", "shared"), "{shared_args:?}");
    assert_eq!(h.jobs("hello").await.len(), 1, "a runtime setting builds nothing");
    assert_eq!(status(&func).module_digest, Some(module.to_string()));
    h.update_spec("hello", json!({"limits": {"isolation": "request"}}))
        .await;
    h.reconcile("hello").await.unwrap();
    assert_eq!(args(h.deployment("hello").await.unwrap()), default_args);
}

async fn failed_build_keeps_serving_previous_module(h: &Harness) {
    let (_, old_module) = ready_function(h, "hello", json!({"source": HELLO})).await;
    let before = h.deployment("hello").await.unwrap();
    h.update_spec("hello", json!({"source": "package handlers\n\nfunc Handler( {\n"}))
        .await;
    h.reconcile("hello").await.unwrap();
    let long_output = format!(
        "./handler.go:3:15: syntax error: unexpected {{, expected )\n{}",
        "note: more compiler output\n".repeat(400)
    );
    h.fail_build("hello", &long_output).await;
    let func = h.reconciled("hello").await;
    let st = status(&func);
    assert_eq!(st.phase, Some(Phase::Failed));
    assert_eq!(condition(&func, "Built").reason, "BuildFailed");
    let message = st.build_message.expect("buildMessage");
    assert!(message.starts_with("./handler.go:3:15: syntax error"), "{message}");
    assert!(message.len() <= 4096, "cut to 4 KiB, was {}", message.len());
    // The previous module keeps serving: the Deployment was not touched.
    let after = h.deployment("hello").await.unwrap();
    assert!(h.same_spec(&before, &after));
    assert_eq!(
        serving_annotation(&after, annotations::MODULE_DIGEST),
        old_module.to_string()
    );
    assert_eq!(st.module_digest, Some(old_module.to_string()));
    assert_eq!(condition(&func, "Ready").status, "True", "still serving");
    assert!(h.event_reasons("hello").await.contains(&"BuildFailed".to_string()));
    // A failed build is not retried on its own.
    h.reconcile("hello").await.unwrap();
    assert_eq!(h.jobs("hello").await.len(), 2);
}

async fn replicas_zero_scales_to_zero(h: &Harness) {
    let (_, module) = ready_function(h, "hello", json!({"source": HELLO})).await;
    h.update_spec("hello", json!({"replicas": 0})).await;
    let func = h.reconciled("hello").await;
    let deployment = h.deployment("hello").await.unwrap();
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(0));
    assert_eq!(
        serving_annotation(&deployment, annotations::MODULE_DIGEST),
        module.to_string()
    );
    assert_eq!(condition(&func, "Ready").reason, "ScaledToZero");
    assert_eq!(h.jobs("hello").await.len(), 1, "scaling does not rebuild");
}

async fn scaling_a_function_scales_its_deployment(h: &Harness) {
    let (_, module) = ready_function(h, "hello", json!({"source": HELLO})).await;
    h.scale("hello", 3).await;
    let func = h.reconciled("hello").await;
    assert_eq!(func.spec.replicas, 3, "the scale subresource writes spec.replicas");
    let deployment = h.deployment("hello").await.unwrap();
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(3));
    assert_eq!(
        serving_annotation(&deployment, annotations::MODULE_DIGEST),
        module.to_string()
    );
    // What an autoscaler reads to find the pods it measures: exactly the Deployment's.
    let selector = status(&func).selector.expect("status.selector");
    let match_labels = deployment.spec.as_ref().unwrap().selector.match_labels.clone().unwrap();
    let expected: Vec<String> = match_labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    assert_eq!(selector, expected.join(","));
    if h.fake.is_none() {
        let scale = h
            .api::<Function>()
            .get_scale("hello")
            .await
            .expect("get the scale subresource");
        assert_eq!(scale.spec.and_then(|s| s.replicas), Some(3));
        assert_eq!(scale.status.and_then(|s| s.selector), Some(selector));
    }
    // Reconciling again keeps what the autoscaler wrote, and does not rebuild.
    let func = h.reconciled("hello").await;
    assert_eq!(func.spec.replicas, 3);
    assert_eq!(h.deployment("hello").await.unwrap().spec.unwrap().replicas, Some(3));
    assert_eq!(h.jobs("hello").await.len(), 1, "scaling does not rebuild");
}

async fn everything_is_owned_by_the_function(h: &Harness) {
    let (func, _) = ready_function(h, "hello", json!({"source": HELLO})).await;
    let uid = func.uid().unwrap();
    let params = ListParams::default().labels(&format!("{}=hello", labels::FUNCTION));
    let mut owned = Vec::new();
    for o in h.api::<ConfigMap>().list(&params).await.unwrap().items {
        owned.push((format!("configmap/{}", o.name_any()), o.owner_references().to_vec()));
    }
    for o in h.api::<Job>().list(&params).await.unwrap().items {
        owned.push((format!("job/{}", o.name_any()), o.owner_references().to_vec()));
    }
    let d = h.deployment("hello").await.unwrap();
    owned.push(("deployment".into(), d.owner_references().to_vec()));
    let s = h.api::<Service>().get("hello").await.unwrap();
    owned.push(("service".into(), s.owner_references().to_vec()));
    assert!(owned.len() >= 5, "{owned:?}");
    for (what, refs) in owned {
        assert!(
            refs.iter()
                .any(|r| r.uid == uid && r.controller == Some(true) && r.kind == "Function"),
            "{what} is not owned by the Function: {refs:?}"
        );
    }
    h.api::<Function>()
        .delete("hello", &DeleteParams::foreground())
        .await
        .unwrap();
    if h.fake.is_none() {
        // A real cluster's garbage collector removes the owned objects.
        for _ in 0..60 {
            if h.deployment("hello").await.is_none() && h.jobs("hello").await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        panic!("the Deployment and Jobs outlived the Function");
    }
}

async fn bad_functions_are_reported_not_fatal(h: &Harness) {
    // What the CRD refuses cannot be created on a real server; these reach the operator
    // only when the schema is bypassed (an older CRD), and must be reported, not crash it.
    let cases = [
        ("empty", json!({"source": "   \n"}), "source is empty"),
        (
            "main",
            json!({"source": "package main\n\nfunc main() {}\n"}),
            "package handlers",
        ),
        (
            "big",
            json!({"source": format!("package handlers\n//{}", "x".repeat(600 * 1024))}),
            "over the 524288-byte limit",
        ),
        (
            "both",
            json!({"source": HELLO, "module": {"image": "registry.local/hello", "digest": Digest::of(b"m").to_string()}}),
            "exactly one of",
        ),
        (
            "port",
            json!({"source": HELLO, "serverPort": 70000}),
            "serverPort 70000",
        ),
        (
            "cobol",
            json!({"language": "cobol", "source": HELLO}),
            "language is not one of",
        ),
        (
            "a-name-far-too-long-for-its-build-job-name-to-be-a-label",
            json!({"source": HELLO}),
            "at most 46 characters",
        ),
    ];
    for (name, spec, expected) in cases {
        if h.fake.is_none() && name != "empty" && name != "main" {
            continue;
        }
        h.create(name, spec).await;
        let func = h.reconciled(name).await;
        let st = status(&func);
        assert_eq!(st.phase, Some(Phase::Failed), "{name}");
        assert_eq!(condition(&func, "Built").reason, "InvalidSpec", "{name}");
        let message = st.build_message.unwrap();
        assert!(message.contains(expected), "{name}: {message}");
        assert!(h.jobs(name).await.is_empty(), "{name}: nothing is built");
        assert!(
            h.event_reasons(name).await.contains(&"InvalidSpec".to_string()),
            "{name}"
        );
    }
}

async fn renamed_service_replaces_the_old_one(h: &Harness) {
    ready_function(h, "hello", json!({"source": HELLO})).await;
    h.update_spec("hello", json!({"service": "greeter"})).await;
    let func = h.reconciled("hello").await;
    let services: Api<Service> = h.api();
    assert!(services.get_opt("greeter").await.unwrap().is_some());
    assert!(
        services.get_opt("hello").await.unwrap().is_none(),
        "the old Service is removed"
    );
    assert_eq!(
        status(&func).url,
        Some(format!("http://greeter.{}.svc.cluster.local:8080", h.ns))
    );
}

/// Door 3 of docs/security.md: a Function whose `spec.service` names a Service someone
/// else made (or whose name is an existing Deployment's) never takes it over: the object is
/// left as it was, without an owner reference (so deleting the Function cannot collect it),
/// and the Function says why on `Ready` and in an Event.
async fn an_object_the_function_does_not_own_is_never_taken_over(h: &Harness) {
    let services: Api<Service> = h.api();
    let payments: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "payments"},
        "spec": {"selector": {"app": "payments"}, "ports": [{"port": 80, "targetPort": 8443}]},
    }))
    .unwrap();
    services.create(&PostParams::default(), &payments).await.unwrap();
    let untouched = |service: &Service| {
        let spec = service.spec.as_ref().unwrap();
        spec.selector == Some(BTreeMap::from([("app".to_string(), "payments".to_string())]))
            && spec.ports.as_ref().unwrap()[0].port == 80
            && service.owner_references().is_empty()
    };

    h.create("thief", json!({"source": HELLO, "service": "payments"})).await;
    let refused = h
        .reconcile("thief")
        .await
        .expect_err("the Service is not the Function's");
    assert!(
        matches!(&refused, wasmless_operator::Error::NotOwner { kind, name } if kind == "Service" && name == "payments"),
        "{refused}"
    );
    let func = h.function("thief").await;
    let ready = condition(&func, "Ready");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", "NotOwner"));
    assert!(ready.message.contains("Service payments"), "{}", ready.message);
    assert!(h.event_reasons("thief").await.contains(&"NotOwner".to_string()));
    assert!(
        untouched(&services.get("payments").await.unwrap()),
        "the Service is as it was"
    );

    // Named something of its own, the Function is served; `payments` is still not its.
    h.update_spec("thief", json!({"service": "thief"})).await;
    h.reconcile("thief").await.expect("a Service of its own");
    h.finish_build("thief", &wasm("thief")).await;
    h.reconcile("thief").await.expect("built");
    assert!(services.get_opt("thief").await.unwrap().is_some());
    // Renamed to it once built and served: refused all the same, nothing rolled over it.
    h.update_spec("thief", json!({"service": "payments"})).await;
    let refused = h.reconcile("thief").await.expect_err("still not the Function's");
    assert!(
        matches!(&refused, wasmless_operator::Error::NotOwner { .. }),
        "{refused}"
    );
    assert!(
        untouched(&services.get("payments").await.unwrap()),
        "the renamed-to Service stays"
    );

    // A Deployment of the Function's name that someone else made: not rolled, not read.
    let deployments: Api<Deployment> = h.api();
    let ledger: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "ledger"},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": "ledger"}},
            "template": {"metadata": {"labels": {"app": "ledger"}},
                         "spec": {"containers": [{"name": "ledger", "image": "ledger:1"}]}},
        },
    }))
    .unwrap();
    deployments.create(&PostParams::default(), &ledger).await.unwrap();
    h.create("ledger", json!({"source": HELLO})).await;
    let refused = h
        .reconcile("ledger")
        .await
        .expect_err("the Deployment is not the Function's");
    assert!(
        matches!(&refused, wasmless_operator::Error::NotOwner { kind, .. } if kind == "Deployment"),
        "{refused}"
    );
    let live = deployments.get("ledger").await.unwrap();
    assert!(live.owner_references().is_empty());
    let containers = live.spec.unwrap().template.spec.unwrap().containers;
    assert_eq!(
        containers[0].image.as_deref(),
        Some("ledger:1"),
        "its pods are as they were"
    );
}

async fn server_port_of_the_metrics_port_is_refused_on_status(h: &Harness) {
    h.create("clash", json!({"source": HELLO, "serverPort": 9090})).await;
    let func = h.reconciled("clash").await;
    assert_eq!(status(&func).phase, Some(Phase::Failed));
    assert_eq!(condition(&func, "Built").reason, "InvalidSpec");
    let message = status(&func).build_message.unwrap();
    assert!(
        message.contains("serverPort 9090 is the Service's metrics port"),
        "{message}"
    );
    assert!(h.jobs("clash").await.is_empty(), "nothing is built");
    assert!(h.api::<Service>().get_opt("clash").await.unwrap().is_none());
    // The others are reconciled as ever.
    h.create("fine", json!({"source": HELLO, "serverPort": 9091})).await;
    assert_eq!(status(&h.reconciled("fine").await).phase, Some(Phase::Building));
}

async fn multibyte_compiler_output_reaches_an_event(h: &Harness) {
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    // 600 characters, 1200 bytes: over the Event API's 1024-byte limit on a note.
    let output = format!("./handler.go:1:1: {}\n", "é".repeat(600));
    h.fail_build("hello", &output).await;
    let func = h.reconciled("hello").await;
    assert_eq!(condition(&func, "Built").reason, "BuildFailed");
    assert!(
        h.event_reasons("hello").await.contains(&"BuildFailed".to_string()),
        "the Event was refused: {:?}",
        h.event_reasons("hello").await
    );
    // The pods that waited for this first build have nothing to wait for any more.
    let waiting = h.deployment("hello").await.unwrap();
    assert_eq!(
        waiting.spec.as_ref().unwrap().replicas,
        Some(0),
        "no pod waits for a failed build"
    );
}

/// The pods of a new Function start while its first build runs, and the build's reconcile
/// switches the one already running to what it built, through the API (it has no volume of
/// it), while the rollout brings pods that mount it.
async fn a_new_functions_pods_start_during_its_build_and_switch_to_it(h: &Harness) {
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    let waiting = h.running_pod("hello", "hello-waiting").await;
    h.pods_started_not_ready("hello").await;
    let module = h.publish_build("hello", &wasm("hello")).await;
    let func = h.reconciled("hello").await;
    let source = status(&func).source_digest.unwrap();
    let pod = h.api::<Pod>().get(&waiting).await.unwrap();
    let routes = pod_routes(&pod);
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert_eq!(routes[0]["revision"], "hello-1");
    assert_eq!(routes[0]["moduleDigest"], module.to_string());
    assert!(
        routes[0]["module"]
            .as_str()
            .unwrap()
            .starts_with(&format!("configmaps:hello/{source}/")),
        "{routes:?}"
    );
    assert_eq!(pod.annotations()[annotations::MODULE_DIGEST], module.to_string());
    // The chunk reader may now get exactly the chunks it reads.
    let role = h
        .api::<k8s_openapi::api::rbac::v1::Role>()
        .get("hello-chunk-reader")
        .await
        .unwrap();
    let readable = role.rules.unwrap()[0].resource_names.clone().unwrap();
    assert!(
        readable.contains(&format!("hello-module-{}-0", &source["sha256:".len()..][..10])),
        "{readable:?}"
    );
    // Until one of them is ready, the Service sends to them ready or not (kube-proxy has
    // had their addresses since they started), and nothing rolls: a new pod would get
    // requests before it listens.
    // (A stored `false` is left out.)
    let publishes_not_ready = |service: Service| service.spec.unwrap().publish_not_ready_addresses.unwrap_or(false);
    assert!(publishes_not_ready(h.api().get("hello").await.unwrap()));
    let deployment = h.deployment("hello").await.unwrap();
    assert!(waits_for_first_build(&deployment), "its pods wait for the first build");
    // Once one is: to ready pods only, and the template mounts the build, for the pods the
    // rollout makes.
    h.make_available("hello").await;
    h.reconcile("hello").await.unwrap();
    assert!(!publishes_not_ready(h.api().get("hello").await.unwrap()));
    let deployment = h.deployment("hello").await.unwrap();
    assert_eq!(served_alone(&deployment)["module"], "/revisions/hello-1");
}

async fn build_past_its_deadline_says_so(h: &Harness) {
    h.create("slow", json!({"source": HELLO})).await;
    h.reconcile("slow").await.unwrap();
    // FallbackToLogsOnError leaves the log tail as the message of a killed builder.
    let killed = json!({"exitCode": 137, "reason": "Error", "message": "checking the source...\ncompiling Go to WebAssembly..."});
    h.fail_build_with("slow", killed, "DeadlineExceeded").await;
    let func = h.reconciled("slow").await;
    assert_eq!(status(&func).phase, Some(Phase::Failed));
    let built = condition(&func, "Built");
    assert_eq!(built.reason, "DeadlineExceeded");
    assert!(
        built.message.contains("ran longer than its deadline of 900 s"),
        "{}",
        built.message
    );
    assert!(h.event_reasons("slow").await.contains(&"DeadlineExceeded".to_string()));
}

async fn builder_out_of_memory_says_so(h: &Harness) {
    h.create("big", json!({"source": HELLO})).await;
    h.reconcile("big").await.unwrap();
    let killed = json!({"exitCode": 137, "reason": "OOMKilled", "message": "compiling Go to WebAssembly..."});
    h.fail_build_with("big", killed, "BackoffLimitExceeded").await;
    let func = h.reconciled("big").await;
    let built = condition(&func, "Built");
    assert_eq!(built.reason, "OOMKilled");
    assert!(built.message.contains("ran out of memory"), "{}", built.message);
}

async fn chunks_published_after_the_function_is_gone_are_collected(h: &Harness) {
    let func = h.create("doomed", json!({"source": HELLO})).await;
    let func = h.reconciled(&func.name_any()).await;
    let uid = func.uid().unwrap();
    let job = &h.jobs("doomed").await[0];
    let env = job.spec.clone().unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    assert!(
        env.iter()
            .any(|e| e.name == "WASMLESS_FUNCTION_UID" && e.value.as_deref() == Some(uid.as_str())),
        "the builder learns whose chunks it publishes: {env:?}"
    );
    h.api::<Function>()
        .delete("doomed", &DeleteParams::background())
        .await
        .unwrap();
    // The builder, still running, publishes a chunk owned as it owns them (by UID, not
    // the controller), after its Function is gone.
    let chunk: ConfigMap = serde_json::from_value(json!({
        "metadata": {
            "name": configmap_name("doomed", &Harness::status_source_digest(&func), 0),
            "labels": {labels::FUNCTION: "doomed"},
            "ownerReferences": [{"apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "name": "doomed",
                                 "uid": uid, "controller": false, "blockOwnerDeletion": false}],
        },
        "binaryData": {CHUNK_KEY: ""},
    }))
    .unwrap();
    h.api::<ConfigMap>()
        .create(&PostParams::default(), &chunk)
        .await
        .unwrap();
    if h.fake.is_some() {
        return; // no garbage collector here
    }
    let params = ListParams::default().labels(&format!("{}=doomed", labels::FUNCTION));
    for _ in 0..60 {
        if h.api::<ConfigMap>().list(&params).await.unwrap().items.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    panic!(
        "ConfigMaps of the deleted Function were left: {:?}",
        h.api::<ConfigMap>()
            .list(&params)
            .await
            .unwrap()
            .items
            .iter()
            .map(|c| c.name_any())
            .collect::<Vec<_>>()
    );
}

fn secret(name: &str, key: &str, value: &str) -> Secret {
    serde_json::from_value(json!({"metadata": {"name": name}, "stringData": {key: value}})).unwrap()
}

fn template_json(deployment: &Deployment) -> serde_json::Value {
    serde_json::to_value(&deployment.spec.as_ref().unwrap().template).unwrap()
}

async fn secrets_roll_the_pods_and_a_missing_one_is_a_condition(h: &Harness) {
    const VALUE: &str = "s3cret-value-one";
    const ROTATED: &str = "s3cret-value-two";
    let secrets = h.api::<Secret>();
    secrets
        .create(&PostParams::default(), &secret("api", "token", VALUE))
        .await
        .unwrap();
    let env = json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}]);
    let spec = json!({"source": HELLO, "env": env, "envFrom": [{"configMapRef": {"name": "cfg", "optional": true}}]});
    ready_function(h, "hello", spec).await;
    let first = h.deployment("hello").await.unwrap();
    let first_hash = template_annotation(&first, references::CONFIG_HASH_ANNOTATION);
    let runtime = first.spec.as_ref().unwrap().template.spec.as_ref().unwrap().containers[0].clone();
    let token = runtime
        .env
        .unwrap()
        .into_iter()
        .find(|e| e.name == "WASMLESS_HANDLER_ENV_TOKEN")
        .unwrap();
    assert_eq!(token.value_from.unwrap().secret_key_ref.unwrap().name, "api");

    // Unchanged Secrets restart nothing.
    h.reconcile("hello").await.unwrap();
    assert!(h.same_spec(&first, &h.deployment("hello").await.unwrap()));

    // A rotated Secret rolls the pods (which read it when they start).
    secrets
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": ROTATED}})),
        )
        .await
        .unwrap();
    h.reconcile("hello").await.unwrap();
    let rotated = h.deployment("hello").await.unwrap();
    let rotated_hash = template_annotation(&rotated, references::CONFIG_HASH_ANNOTATION);
    assert_ne!(rotated_hash, first_hash);
    h.make_available("hello").await;
    assert_eq!(status(&h.reconciled("hello").await).phase, Some(Phase::Ready));

    // An optional ConfigMap that appears rolls them too: its keys join the environment.
    let cfg: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cfg"}, "data": {"MODE": "fast"}})).unwrap();
    h.api::<ConfigMap>().create(&PostParams::default(), &cfg).await.unwrap();
    h.reconcile("hello").await.unwrap();
    let with_cfg = h.deployment("hello").await.unwrap();
    assert_ne!(
        template_annotation(&with_cfg, references::CONFIG_HASH_ANNOTATION),
        rotated_hash
    );
    h.make_available("hello").await;
    h.reconcile("hello").await.unwrap();

    // A Secret that does not exist: said on status, and the pods keep the template they have.
    let before = h.deployment("hello").await.unwrap();
    let mut env = env.as_array().unwrap().clone();
    env.push(json!({"name": "LATER", "valueFrom": {"secretKeyRef": {"name": "later", "key": "k"}}}));
    h.update_spec("hello", json!({"env": env})).await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).phase, Some(Phase::Pending));
    let ready = condition(&func, "Ready");
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", REASON_REFERENCE_NOT_FOUND)
    );
    assert!(
        ready
            .message
            .contains(&format!("Secret later (for env LATER) not found in namespace {}", h.ns))
            && ready.message.contains("optional: true"),
        "{}",
        ready.message
    );
    assert!(
        h.same_spec(&before, &h.deployment("hello").await.unwrap()),
        "no template that cannot start"
    );
    assert!(
        h.event_reasons("hello")
            .await
            .contains(&REASON_REFERENCE_NOT_FOUND.to_string())
    );
    // The rest of the Deployment still follows the Function.
    h.scale("hello", 2).await;
    h.reconcile("hello").await.unwrap();
    let scaled = h.deployment("hello").await.unwrap();
    assert_eq!(scaled.spec.as_ref().unwrap().replicas, Some(2));
    assert_eq!(
        template_json(&scaled),
        template_json(&before),
        "replicas, not the template"
    );

    // Once it exists, the new configuration rolls out.
    secrets
        .create(&PostParams::default(), &secret("later", "k", "v"))
        .await
        .unwrap();
    h.reconcile("hello").await.unwrap();
    let after = h.deployment("hello").await.unwrap();
    assert_ne!(template_json(&after), template_json(&before));
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).phase, Some(Phase::Ready), "{:?}", func.status);

    // No value ever reaches status or Events, and the operator never asked for one.
    let events: Api<k8s_openapi::api::events::v1::Event> = h.api();
    let written = format!(
        "{} {}",
        serde_json::to_string(&func.status).unwrap(),
        serde_json::to_string(&events.list(&ListParams::default()).await.unwrap().items).unwrap()
    );
    assert!(!written.contains(VALUE) && !written.contains(ROTATED));
    if let Some(fake) = &h.fake {
        let secret_reads: Vec<_> = fake
            .requests()
            .into_iter()
            .filter(|r| r.resource() == "secrets" && !r.is_write())
            .collect();
        assert!(!secret_reads.is_empty());
        assert!(
            secret_reads
                .iter()
                .all(|r| r.accept.contains("as=PartialObjectMetadata")),
            "every read of a Secret is of its metadata: {secret_reads:?}"
        );
    }
}

/// `scale.min: 0`: no pod of its own, the namespace's pool (made on demand, reading
/// ConfigMaps and nothing else) has the Function in its table, and the Service routes there;
/// a Function that reads a Secret keeps a pod of its own, and says why; one that leaves the
/// pool stays routed there until its own pod is available.
async fn scale_to_zero_serves_from_the_namespaces_pool(h: &Harness) {
    let spec = json!({"source": HELLO, "scale": {"min": 0, "max": 3}, "env": [{"name": "GREETING", "value": "hi"}]});
    h.create("hello", spec).await;
    h.reconcile("hello").await.unwrap();
    let module = h.finish_build("hello", &wasm("hello")).await;
    let func = h.reconciled("hello").await;
    let st = status(&func);
    assert_eq!(st.served_by, Some(ServedBy::Pool), "{st:?}");
    let port = st.pool_port.expect("a port in the pool");
    let port_u16 = u16::try_from(port).unwrap();
    assert!(objects::POOL_PORTS.contains(&port_u16), "{port}");
    let deployment = h.deployment("hello").await.expect("the Function's Deployment");
    assert_eq!(deployment.spec.as_ref().unwrap().replicas, Some(0), "no pod of its own");

    // The entry: the pod's arguments, the module and its code read from the API.
    let entry = h
        .api::<ConfigMap>()
        .get(&objects::pool_entry_name("hello"))
        .await
        .expect("the entry");
    assert_eq!(entry.labels()[objects::COMPONENT_LABEL], objects::POOL_ENTRY_COMPONENT);
    let value: serde_json::Value = serde_json::from_str(&entry.data.unwrap()[objects::POOL_ENTRY_KEY]).unwrap();
    assert_eq!(value["port"], port);
    assert_eq!(
        value.get("servedByPods"),
        None,
        "the pool keeps its connections: {value}"
    );
    let args: Vec<String> = serde_json::from_value(value["args"].clone()).unwrap();
    let source_digest = Harness::status_source_digest(&func);
    assert!(
        has_flag(&args, "--module", &format!("configmaps:hello/{source_digest}/1")),
        "{args:?}"
    );
    assert!(has_flag(&args, "--module-digest", &module.to_string()), "{args:?}");
    assert_eq!(
        value["env"],
        json!([{"name": "WASMLESS_HANDLER_ENV_GREETING", "value": "hi"}]),
        "literal env travels in the entry, as the pod's container would have it"
    );

    // The Service: same name and port, the pool's pods on the Function's port there.
    let service = h.api::<Service>().get("hello").await.unwrap();
    let spec = service.spec.unwrap();
    assert_eq!(spec.selector.unwrap(), objects::pool_pod_selector());
    let http = spec
        .ports
        .unwrap()
        .into_iter()
        .find(|p| p.name.as_deref() == Some("http"))
        .unwrap();
    assert_eq!(http.port, 8080);
    assert_eq!(http.target_port, Some(IntOrString::Int(port)));

    // The pool: one per namespace, its identity reads ConfigMaps and nothing else.
    let pool = h.api::<Deployment>().get(objects::POOL_NAME).await.expect("the pool");
    let pod = pool.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(objects::POOL_NAME));
    assert!(has_flag(
        pod.containers[0].args.as_ref().unwrap(),
        "--pool",
        "api:wasmless.io/component=pool-entry"
    ));
    let role = h.api::<Role>().get(objects::POOL_NAME).await.expect("the pool's Role");
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources.as_deref(), Some(&["configmaps".to_string()][..]));
    assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
    if h.fake.is_some() {
        // No pool pod answers here: not Ready until one serves the Function.
        assert_eq!(condition(&func, "Ready").reason, "PoolStarting");
    }

    // A second pooled Function gets another port.
    h.create("other", json!({"source": HELLO, "scale": {"min": 0}})).await;
    h.reconcile("other").await.unwrap();
    h.finish_build("other", &wasm("other")).await;
    let other = h.reconciled("other").await;
    assert_ne!(status(&other).pool_port, Some(port));
    assert!(status(&other).pool_port.is_some());

    // One that reads a Secret is pooled too: its entry names the Secret, never its value,
    // and the pool's Role may get that Secret (and no other).
    const VALUE: &str = "pooled-s3cret-value";
    h.api::<Secret>()
        .create(&PostParams::default(), &secret("creds", "token", VALUE))
        .await
        .unwrap();
    let reads_secret = json!([{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}]);
    h.create(
        "secretive",
        json!({"source": HELLO, "scale": {"min": 0}, "env": reads_secret}),
    )
    .await;
    h.reconcile("secretive").await.unwrap();
    h.finish_build("secretive", &wasm("secretive")).await;
    let secretive = h.reconciled("secretive").await;
    assert_eq!(
        status(&secretive).served_by,
        Some(ServedBy::Pool),
        "{:?}",
        status(&secretive)
    );
    assert_eq!(h.deployment("secretive").await.unwrap().spec.unwrap().replicas, Some(0));
    let entry_value = |entry: ConfigMap| -> serde_json::Value {
        serde_json::from_str(&entry.data.unwrap()[objects::POOL_ENTRY_KEY]).unwrap()
    };
    let entry = h
        .api::<ConfigMap>()
        .get(&objects::pool_entry_name("secretive"))
        .await
        .unwrap();
    let text = serde_json::to_string(&entry).unwrap();
    assert!(!text.contains(VALUE), "the Secret's value is in the entry: {text}");
    let value = entry_value(entry);
    assert_eq!(
        value["env"],
        json!([{"name": "WASMLESS_HANDLER_ENV_TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}}])
    );
    let first_hash = value["configHash"]
        .as_str()
        .expect("the hash of what its env reads")
        .to_string();
    let rules = h.api::<Role>().get(objects::POOL_NAME).await.unwrap().rules.unwrap();
    let secret_rules: Vec<_> = rules
        .iter()
        .filter(|rule| rule.resources.as_deref() == Some(&["secrets".to_string()][..]))
        .collect();
    assert_eq!(secret_rules.len(), 1, "{rules:?}");
    assert_eq!(secret_rules[0].verbs, ["get"]);
    assert_eq!(
        secret_rules[0].resource_names.as_deref(),
        Some(&["creds".to_string()][..])
    );
    // Rotated: the entry changes, so the pool reads the Secret again.
    h.api::<Secret>()
        .patch(
            "creds",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"token": "rotated"}})),
        )
        .await
        .unwrap();
    h.reconcile("secretive").await.unwrap();
    let entry = h
        .api::<ConfigMap>()
        .get(&objects::pool_entry_name("secretive"))
        .await
        .unwrap();
    assert_ne!(entry_value(entry)["configHash"].as_str(), Some(first_hash.as_str()));
    // Gone from the controller's store (deleted): the pool's Role forgets its Secret.
    let remaining = [
        std::sync::Arc::new(h.function("hello").await),
        std::sync::Arc::new(h.function("other").await),
    ];
    let narrowed = wasmless_operator::controller::narrow_pool_roles(&h.ctx, &h.api::<Deployment>(), &remaining)
        .await
        .unwrap();
    assert_eq!(narrowed, std::slice::from_ref(&h.ns));
    let rules = h.api::<Role>().get(objects::POOL_NAME).await.unwrap().rules.unwrap();
    assert_eq!(rules.len(), 1, "only the ConfigMaps rule: {rules:?}");
    let again = wasmless_operator::controller::narrow_pool_roles(&h.ctx, &h.api::<Deployment>(), &remaining)
        .await
        .unwrap();
    assert!(again.is_empty(), "nothing more to narrow: {again:?}");

    // One with a CA bundle (a file its pods mount) is not: a pod of its own, and status says why.
    h.create(
        "trusting",
        json!({"source": HELLO, "scale": {"min": 0}, "outbound": {"allow": ["https://internal.example"],
            "caBundle": {"configMapKeyRef": {"name": "ca", "key": "ca.crt"}}}}),
    )
    .await;
    h.api::<ConfigMap>()
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "ca"}, "data": {"ca.crt": "PEM"}})).unwrap(),
        )
        .await
        .unwrap();
    h.reconcile("trusting").await.unwrap();
    h.finish_build("trusting", &wasm("trusting")).await;
    let trusting = h.reconciled("trusting").await;
    assert_eq!(status(&trusting).served_by, Some(ServedBy::Pods));
    assert_eq!(h.deployment("trusting").await.unwrap().spec.unwrap().replicas, Some(1));
    let ready = condition(&trusting, "Ready");
    assert!(
        ready.message.contains("scale.min 0 is not honoured") && ready.message.contains("caBundle"),
        "{ready:?}"
    );

    // Leaving the pool: routed there until a pod of its own is available.
    h.update_spec("hello", json!({"scale": {"min": 1, "max": 3}})).await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).served_by, Some(ServedBy::Pool));
    assert_eq!(h.deployment("hello").await.unwrap().spec.unwrap().replicas, Some(1));
    h.make_available("hello").await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).served_by, Some(ServedBy::Pods));
    let service = h.api::<Service>().get("hello").await.unwrap();
    assert_eq!(service.spec.unwrap().selector.unwrap()[labels::FUNCTION], "hello");
    let entry = h
        .api::<ConfigMap>()
        .get_opt(&objects::pool_entry_name("hello"))
        .await
        .unwrap()
        .expect("the entry stays while the route settles");
    let value: serde_json::Value = serde_json::from_str(&entry.data.unwrap()[objects::POOL_ENTRY_KEY]).unwrap();
    assert_eq!(
        value["servedByPods"], true,
        "meanwhile the pool closes its connections, which reconnect to the pods: {value}"
    );
}

/// The builder's phases reach an Event even when the `Built` Event went out without them
/// and a reconcile then reads a status older than the one last written: that reconcile sees
/// the `Built` transition again, which the recorder folds into the first Event (its note
/// unchanged), so the phases go out as `BuildPhases`.
async fn build_phases_reach_an_event_whatever_status_a_reconcile_reads(h: &Harness) {
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    let before_built = h.function("hello").await;
    // The chunks are seen before the builder's pod has ended: Built, without phases.
    h.finish_build("hello", &wasm("hello")).await;
    let built = h.reconciled("hello").await;
    assert!(!condition(&built, "Built").message.contains("build phases"));
    let result = json!({"digest": "sha256:00", "cached": true,
        "phases": {"check": 0.01, "compile": 0.0, "snapshot": 0.0, "precompile": 0.0, "publish": 0.5, "total": 0.51},
        "cache": {"module": "hit", "code": "hit"}});
    let job = objects::job_name("hello", &Harness::status_source_digest(&built));
    h.build_pod_ended(
        &job,
        "Succeeded",
        json!({"exitCode": 0, "reason": "Completed", "message": result.to_string()}),
    )
    .await;
    // A reconcile of the object as it was before the first status write.
    wasmless_operator::reconcile(std::sync::Arc::new(before_built), h.ctx.clone())
        .await
        .unwrap();
    let message = condition(&h.function("hello").await, "Built").message.clone();
    assert!(message.contains("code cache hit"), "{message}");
    let events: Api<k8s_openapi::api::events::v1::Event> = h.api();
    let notes: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("hello"))
        .filter_map(|e| Some(format!("{}: {}", e.reason?, e.note?)))
        .collect();
    assert!(
        notes
            .iter()
            .any(|note| note.starts_with("BuildPhases: ") && note.contains("code cache hit")),
        "{notes:#?}"
    );
}

/// A namespace's pool that no Function needs any more (the last pooled one deleted, or
/// gone to pods) is scaled to zero pods after the grace, with an Event; the next pooled
/// Function scales it up again. The Deployment itself stays.
async fn an_idle_pool_scales_to_zero_pods_and_back(h: &Harness) {
    use std::collections::HashMap;
    use std::sync::Arc;
    use wasmless_operator::controller::scale_idle_pools;
    let pool_replicas = |deployment: Option<Deployment>| deployment.and_then(|d| d.spec?.replicas);
    h.create("pooled", json!({"source": HELLO, "scale": {"min": 0}})).await;
    h.reconcile("pooled").await.unwrap();
    h.finish_build("pooled", &wasm("pooled")).await;
    h.reconciled("pooled").await;
    let deployments = h.api::<Deployment>();
    let running = pool_replicas(deployments.get_opt(objects::POOL_NAME).await.unwrap());
    assert_eq!(running, Some(h.ctx.settings.pool_replicas), "the pool runs for pooled");

    let mut idle = HashMap::new();
    let still_pooled = [Arc::new(h.function("pooled").await)];
    let none = scale_idle_pools(&h.ctx, &deployments, &still_pooled, &mut idle, Duration::ZERO)
        .await
        .unwrap();
    assert!(none.is_empty(), "a pool with a pooled Function stays: {none:?}");
    // The Function gone (the controller's store no longer has it): not before the grace.
    let waiting = scale_idle_pools(&h.ctx, &deployments, &[], &mut idle, Duration::from_secs(600))
        .await
        .unwrap();
    assert!(waiting.is_empty(), "within the grace: {waiting:?}");
    assert_eq!(
        pool_replicas(deployments.get_opt(objects::POOL_NAME).await.unwrap()),
        running
    );
    let scaled = scale_idle_pools(&h.ctx, &deployments, &[], &mut idle, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(scaled, std::slice::from_ref(&h.ns));
    let pool = deployments.get_opt(objects::POOL_NAME).await.unwrap();
    assert_eq!(
        pool_replicas(pool.clone()),
        Some(0),
        "scaled to zero pods, the Deployment kept"
    );
    assert!(
        pool.unwrap().spec.unwrap().template.spec.unwrap().containers[0]
            .args
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|arg| arg == "--pool"),
        "the rest of the pool's Deployment is as the operator wrote it"
    );

    // The next pooled Function brings the pods back.
    h.create("next", json!({"source": HELLO_V2, "scale": {"min": 0}})).await;
    h.reconcile("next").await.unwrap();
    h.finish_build("next", &wasm("next")).await;
    h.reconciled("next").await;
    assert_eq!(
        pool_replicas(deployments.get_opt(objects::POOL_NAME).await.unwrap()),
        running
    );
}

/// With a collector (`--otlp-endpoint`), an apply is one trace: its root span from the first
/// reconcile of the generation to the one that finds it Ready, each reconcile a child with
/// its steps, and the build a child with the wait for its pod and the builder's phases at
/// the times the builder reported. The next generation is a new trace; a reconcile after
/// Ready is a trace of its own.
async fn an_apply_is_one_trace_with_its_build_phases(h: &Harness) {
    use wasmless_testkit::otelcol::{Collector, Span, children, one};
    let collector = Collector::start();
    let traces =
        wasmless_telemetry::Traces::start(Some(&collector.endpoint()), "wasmless-operator", "wasmless-operator")
            .unwrap()
            .expect("tracing is on with an endpoint");
    let ctx = h.traced_context(traces.tracer());
    let reconcile = async |name: &str| {
        wasmless_operator::reconcile(std::sync::Arc::new(h.function(name).await), ctx.clone())
            .await
            .unwrap()
    };
    h.create("hello", json!({"source": HELLO})).await;
    reconcile("hello").await;
    // The builder starts now and reports its phases (150 ms in all), as its result line does
    // (in whole milliseconds: a few after the reconcile that created the Job).
    tokio::time::sleep(Duration::from_millis(5)).await;
    let builder_started = std::time::SystemTime::now();
    let started_ms = builder_started
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let result = json!({"digest": "sha256:00", "cached": false,
        "phases": {"check": 0.01, "compile": 0.05, "snapshot": 0.025, "precompile": 0.04, "publish": 0.025, "total": 0.15,
                   "startedUnixMs": started_ms},
        "cache": {"module": "miss", "code": "miss"}});
    tokio::time::sleep(Duration::from_millis(200)).await;
    h.finish_build_reporting("hello", &wasm("hello"), &result).await;
    reconcile("hello").await;
    // Until Ready: on a cluster, the pods that waited for the build are switched to it and
    // ready first, and only then does it roll out; on the in-memory server, at once.
    let mut until_ready = 2;
    for _ in 0..3 {
        h.make_available("hello").await;
        reconcile("hello").await;
        until_ready += 1;
        if status(&h.function("hello").await).phase == Some(Phase::Ready) {
            break;
        }
    }
    assert_eq!(status(&h.function("hello").await).phase, Some(Phase::Ready));
    // After Ready: a resync, in a trace of its own.
    reconcile("hello").await;
    h.update_spec("hello", json!({"source": HELLO_V2})).await;
    reconcile("hello").await;
    traces.shutdown().await;

    let spans = collector.wait_for("both applies and the resync", |spans| {
        spans.iter().filter(|s| s.name == "apply").count() == 1
            && spans.iter().filter(|s| s.name == "reconcile").count() == until_ready + 2
    });
    let apply = one(&spans, "the first apply's root span", |s| s.name == "apply");
    assert_eq!(apply.parent, "", "the apply is the root");
    assert_eq!(apply.resource["service.name"], "wasmless-operator");
    assert_eq!(apply.attributes["faas.name"], "hello");
    assert_eq!(apply.attributes["wasmless.phase"], "Ready");
    let trace: Vec<&Span> = spans.iter().filter(|s| s.trace_id == apply.trace_id).collect();
    let under_apply = children(&spans, apply);
    let reconciles: Vec<&&Span> = under_apply.iter().filter(|s| s.name == "reconcile").collect();
    assert_eq!(
        reconciles.len(),
        until_ready,
        "create, built, (switched,) available: {trace:#?}"
    );
    let first_steps: Vec<&str> = children(&spans, reconciles.iter().min_by_key(|s| s.start_ns).unwrap())
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    for step in ["write source", "build", "serve", "status"] {
        assert!(first_steps.contains(&step), "{step} in {first_steps:?}");
    }
    for span in &trace {
        assert!(
            span.start_ns >= apply.start_ns && span.end_ns <= apply.end_ns + 1_000_000,
            "{span:#?} lies within the apply {apply:#?}"
        );
    }

    let build = one(&spans, "the build span", |s| {
        s.name == "build" && s.parent == apply.span_id
    });
    assert_eq!(build.attributes["wasmless.build.module_cache"], "miss");
    let phases: Vec<&Span> = {
        let mut phases = children(&spans, build);
        phases.sort_by_key(|s| s.start_ns);
        phases
    };
    let names: Vec<&str> = phases.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "start build pod",
            "check",
            "compile",
            "snapshot",
            "precompile",
            "publish"
        ]
    );
    let millis = |span: &Span| (span.end_ns - span.start_ns) as f64 / 1e6;
    for (span, reported) in phases[1..].iter().zip([10.0, 50.0, 25.0, 40.0, 25.0]) {
        assert!(
            (millis(span) - reported).abs() < 1.0,
            "{} took {} ms, reported {reported}",
            span.name,
            millis(span)
        );
    }
    for pair in phases.windows(2) {
        assert!(
            pair[1].start_ns >= pair[0].end_ns,
            "the phases run one after another: {pair:#?}"
        );
    }
    let builder_started_ns = started_ms * 1_000_000;
    assert_eq!(
        phases[1].start_ns, builder_started_ns,
        "placed where the builder said it started"
    );
    assert_eq!(
        phases[0].end_ns, builder_started_ns,
        "the pod's wait ends as the builder starts"
    );
    assert_eq!(build.start_ns, phases[0].start_ns);

    // The resync and the next generation's first reconcile are not in the first trace.
    let others: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "reconcile" && s.trace_id != apply.trace_id)
        .collect();
    assert_eq!(others.len(), 2, "{spans:#?}");
    let resync = others.iter().min_by_key(|s| s.start_ns).unwrap();
    assert_eq!(resync.parent, "", "a reconcile after Ready is a trace of its own");
    let second = others.iter().max_by_key(|s| s.start_ns).unwrap();
    assert_ne!(
        second.parent, "",
        "the next generation's reconcile is under its own apply (still open)"
    );
    drop(collector);
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        /// Against the in-memory API server.
        mod fake_api {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(&super::Harness::fake()).await;
                }
            )*
        }
        /// Against the API server of WASMLESS_TEST_KUBECONFIG.
        mod real_api {
            $(
                #[tokio::test]
                async fn $name() {
                    let h = super::Harness::real(stringify!($name)).await;
                    let run = std::panic::AssertUnwindSafe(super::$name(&h));
                    if let Err(failed) = futures::FutureExt::catch_unwind(run).await {
                        // Kept when the scenario fails, to look at; and printed, for a run
                        // whose cluster is gone by the time anyone looks.
                        println!("{}", h.cluster_state().await);
                        std::panic::resume_unwind(failed);
                    }
                    h.delete_namespace().await;
                }
            )*
        }
    };
}

scenarios!(
    new_function_starts_one_content_addressed_build,
    finished_build_rolls_out_and_becomes_ready,
    compiled_code_is_mounted_beside_the_module_and_pinned,
    isolation_reaches_the_runtime_without_a_rebuild,
    unchanged_function_writes_nothing,
    source_change_builds_once_and_rolls_out,
    revisions_keep_exactly_the_kept_builds,
    traffic_rolls_back_to_a_kept_revision_without_a_build,
    traffic_splits_between_revisions_in_the_pods,
    failed_build_keeps_serving_previous_module,
    replicas_zero_scales_to_zero,
    scaling_a_function_scales_its_deployment,
    everything_is_owned_by_the_function,
    bad_functions_are_reported_not_fatal,
    renamed_service_replaces_the_old_one,
    an_object_the_function_does_not_own_is_never_taken_over,
    server_port_of_the_metrics_port_is_refused_on_status,
    multibyte_compiler_output_reaches_an_event,
    build_past_its_deadline_says_so,
    builder_out_of_memory_says_so,
    chunks_published_after_the_function_is_gone_are_collected,
    secrets_roll_the_pods_and_a_missing_one_is_a_condition,
    scale_to_zero_serves_from_the_namespaces_pool,
    an_idle_pool_scales_to_zero_pods_and_back,
    build_phases_reach_an_event_whatever_status_a_reconcile_reads,
    an_apply_is_one_trace_with_its_build_phases,
    a_new_functions_pods_start_during_its_build_and_switch_to_it,
);
