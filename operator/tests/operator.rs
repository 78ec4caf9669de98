//! The operator's behaviour, scenario by scenario. Each scenario runs against the in-memory
//! API server (`wasmless_testkit::FakeApiServer`), and again (`real_api`) on the cluster that
//! `WASMLESS_TEST_KUBECONFIG` names (`scripts/cluster.sh up` starts one; without it those
//! tests fail, saying so: skip them with `cargo test -- --skip real_api`).
//! The builder is simulated through the API: the tests write the chunk ConfigMaps, and the
//! Job and Pod status, that it would. On the in-memory server the kubelet is simulated too;
//! on a cluster the function's pods really run (`WASMLESS_TEST_RUNTIME_IMAGE`, default
//! `wasmless/runtime:0.1.0`) and the build Jobs' own pods are refused, so that only the
//! simulated build reports.

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::{Api, Client, CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use wasmless_artifact::{CHUNK_KEY, Digest, Part, annotations, compress_and_split, configmap_name, labels};
use wasmless_operator::crd::{Function, Phase};
use wasmless_operator::objects::{self as resources, MANAGER};
use wasmless_operator::{Context, Metrics, Settings, error_policy, reconcile};
use wasmless_testkit::FakeApiServer;

#[path = "operator/golden.rs"]
mod golden;

const HELLO: &str = "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(\"This works!\")) }\n";
const HELLO_V2: &str = "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(\"v2\")) }\n";

struct Harness {
    client: Client,
    fake: Option<FakeApiServer>,
    ctx: Arc<Context>,
    ns: String,
}

fn settings() -> Settings {
    Settings::new("wasmless/runtime:test", "wasmless/builder:test")
}

impl Harness {
    fn fake() -> Self {
        let fake = FakeApiServer::new();
        let client = fake.client();
        Self {
            ctx: Arc::new(Context::new(client.clone(), settings(), Metrics::default(), None)),
            client,
            fake: Some(fake),
            ns: "default".into(),
        }
    }

    /// A harness on the cluster of `WASMLESS_TEST_KUBECONFIG`, in a fresh namespace with the
    /// CRD applied.
    async fn real(test: &str) -> Self {
        let path = std::env::var("WASMLESS_TEST_KUBECONFIG").unwrap_or_else(|_| {
            panic!(
                "{test} runs on a real cluster: start one with `scripts/cluster.sh up` and set \
                 WASMLESS_TEST_KUBECONFIG to the kubeconfig it prints (scripts/test.sh does both), \
                 or skip these with `cargo test -- --skip real_api`"
            )
        });
        // As in the operator's main: the workspace links two rustls providers, and rustls
        // refuses to choose on its own.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("reading WASMLESS_TEST_KUBECONFIG");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("kubeconfig");
        let client = Client::try_from(config).expect("client");
        refuse_build_pods(&client).await;
        let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
            Api::all(client.clone());
        crds.patch(
            "functions.wasmless.io",
            &PatchParams::apply("wasmless-tests").force(),
            &Patch::Apply(Function::crd()),
        )
        .await
        .expect("applying the CRD");
        // The CRD's schema and the admission policy take effect shortly after they are written.
        tokio::time::sleep(Duration::from_secs(2)).await;
        // The process ID must survive the 63-character limit: runs may overlap while an
        // earlier run's namespace is still terminating.
        let prefix: String = format!("wasmless-test-{}", test.replace('_', "-"))
            .chars()
            .take(50)
            .collect();
        let ns = format!("{}-{}", prefix.trim_end_matches('-'), std::process::id());
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {
            "name": ns,
            "labels": {SIMULATED_BUILDS_LABEL: "true"},
        }}))
        .unwrap();
        namespaces
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
        let runtime_image =
            std::env::var("WASMLESS_TEST_RUNTIME_IMAGE").unwrap_or_else(|_| "wasmless/runtime:0.1.0".into());
        let settings = Settings::new(runtime_image, settings().builder_image);
        Self {
            ctx: Arc::new(Context::new(client.clone(), settings, Metrics::default(), None)),
            client,
            fake: None,
            ns,
        }
    }

    async fn delete_namespace(&self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .delete(&self.ns, &DeleteParams::background())
            .await
            .expect("deleting the test namespace");
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    async fn create(&self, name: &str, spec: Value) -> Function {
        let func: Function = serde_json::from_value(json!({
            "apiVersion": "wasmless.io/v1alpha1",
            "kind": "Function",
            "metadata": {"name": name, "namespace": self.ns},
            "spec": spec,
        }))
        .expect("a Function");
        self.api::<Function>()
            .create(&PostParams::default(), &func)
            .await
            .expect("create Function")
    }

    async fn update_spec(&self, name: &str, spec: Value) {
        self.api::<Function>()
            .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec})))
            .await
            .expect("update Function");
    }

    /// `kubectl scale fn/<name> --replicas=<n>`, as an autoscaler writes it: through the
    /// scale subresource on a real API server; the in-memory one has no subresources but
    /// status, so there it is the spec field the subresource maps to.
    async fn scale(&self, name: &str, replicas: i32) {
        if self.fake.is_some() {
            return self.update_spec(name, json!({"replicas": replicas})).await;
        }
        self.api::<Function>()
            .patch_scale(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"replicas": replicas}})),
            )
            .await
            .expect("patch the scale subresource");
    }

    async fn function(&self, name: &str) -> Function {
        self.api::<Function>().get(name).await.expect("get Function")
    }

    async fn reconcile(&self, name: &str) -> Result<Action, wasmless_operator::Error> {
        reconcile(Arc::new(self.function(name).await), self.ctx.clone()).await
    }

    async fn reconciled(&self, name: &str) -> Function {
        self.reconcile(name).await.expect("reconcile");
        self.function(name).await
    }

    fn status_source_digest(func: &Function) -> Digest {
        func.status
            .as_ref()
            .and_then(|s| s.source_digest.as_deref())
            .expect("sourceDigest")
            .parse()
            .unwrap()
    }

    /// Creates one part's chunk ConfigMaps, labelled and annotated as the builder writes
    /// them; `about` is the part's own annotation (the module's size, the code's digest).
    async fn create_chunks(&self, name: &str, part: Part, wasm: &[u8], chunks: &[Vec<u8>], about: (&str, String)) {
        let source_digest = Self::status_source_digest(&self.function(name).await);
        let module_digest = Digest::of(wasm);
        for (index, chunk) in chunks.iter().enumerate() {
            let cm = ConfigMap {
                metadata: kube::api::ObjectMeta {
                    name: Some(part.configmap_name(name, &source_digest, index)),
                    labels: Some(BTreeMap::from([
                        (labels::FUNCTION.to_string(), name.to_string()),
                        (labels::SOURCE_DIGEST.to_string(), labels::digest_value(&source_digest)),
                        (labels::MODULE_DIGEST.to_string(), labels::digest_value(&module_digest)),
                    ])),
                    annotations: Some(BTreeMap::from([
                        (annotations::MODULE_DIGEST.to_string(), module_digest.to_string()),
                        (about.0.to_string(), about.1.clone()),
                        (annotations::CHUNK_COUNT.to_string(), chunks.len().to_string()),
                        (annotations::CHUNK_INDEX.to_string(), index.to_string()),
                    ])),
                    ..Default::default()
                },
                binary_data: Some(BTreeMap::from([(
                    part.configmap_key().to_string(),
                    ByteString(chunk.clone()),
                )])),
                ..Default::default()
            };
            self.api::<ConfigMap>()
                .create(&PostParams::default(), &cm)
                .await
                .expect("chunk");
        }
    }

    /// What the builder does: publish the module's chunks, labelled, then exit 0.
    async fn finish_build(&self, name: &str, wasm: &[u8]) -> Digest {
        let source_digest = Self::status_source_digest(&self.function(name).await);
        let module_digest = Digest::of(wasm);
        let size = (annotations::MODULE_SIZE, wasm.len().to_string());
        self.create_chunks(name, Part::Module, wasm, &compress_and_split(wasm), size)
            .await;
        let job = resources::job_name(name, &source_digest);
        let (started, now) = self.job_times(&job).await;
        self.api::<Job>()
            .patch_status(
                &job,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "startTime": started,
                    "completionTime": now,
                    "succeeded": 1,
                    "conditions": [
                        {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                        {"type": "Complete", "status": "True", "lastTransitionTime": now},
                    ],
                }})),
            )
            .await
            .expect("job status");
        module_digest
    }

    /// What the builder publishes before the module: the compiled code's chunks.
    async fn publish_code(&self, name: &str, wasm: &[u8], code: &[u8]) -> Digest {
        let digest = (annotations::CODE_DIGEST, Digest::of(code).to_string());
        self.create_chunks(name, Part::Code, wasm, &wasmless_artifact::split_chunks(code), digest)
            .await;
        Digest::of(code)
    }

    /// The Job's start time (a real Job controller has set one, which may not change) and now.
    async fn job_times(&self, job: &str) -> (String, String) {
        let seconds = |t: k8s_openapi::jiff::Timestamp| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
        let now = k8s_openapi::jiff::Timestamp::now();
        let started = self
            .api::<Job>()
            .get(job)
            .await
            .expect("the build Job")
            .status
            .and_then(|s| s.start_time)
            .map_or(now, |t| t.0);
        (seconds(started), seconds(now))
    }

    /// What a failed build leaves: the Job failed, its pod terminated with the compiler's output.
    async fn fail_build(&self, name: &str, compiler_output: &str) {
        let terminated = json!({"exitCode": wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD, "reason": "Error", "message": compiler_output});
        self.fail_build_with(name, terminated, "PodFailurePolicy").await;
    }

    /// A failed build whose pod ended as `terminated` says, and whose Job failed for `reason`.
    async fn fail_build_with(&self, name: &str, terminated: Value, reason: &str) {
        let func = self.function(name).await;
        let job = resources::job_name(name, &Self::status_source_digest(&func));
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{job}-x7k2p"), "labels": {"batch.kubernetes.io/job-name": job}},
            // Gated: no scheduler or kubelet touches it; its status is what the test writes.
            "spec": {"restartPolicy": "Never", "schedulingGates": [{"name": "wasmless.io/simulated"}],
                     "containers": [{"name": "builder", "image": "wasmless/builder:test"}]},
        }))
        .unwrap();
        self.api::<Pod>()
            .create(&PostParams::default(), &pod)
            .await
            .expect("pod");
        self.api::<Pod>()
            .patch_status(
                &format!("{job}-x7k2p"),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Failed", "containerStatuses": [{
                    "name": "builder", "image": "wasmless/builder:test", "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }]}})),
            )
            .await
            .expect("pod status");
        let (started, now) = self.job_times(&job).await;
        self.api::<Job>()
            .patch_status(
                &job,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "startTime": started,
                    "failed": 1,
                    "conditions": [
                        {"type": "FailureTarget", "status": "True", "reason": reason, "lastTransitionTime": now},
                        {"type": "Failed", "status": "True", "reason": reason, "message": format!("the Job failed: {reason}"), "lastTransitionTime": now},
                    ],
                }})),
            )
            .await
            .expect("job status");
    }

    /// What the Deployment controller reports once every pod of the current template is
    /// available: written on the in-memory server, waited for on a cluster.
    async fn make_available(&self, name: &str) {
        if self.fake.is_none() {
            return self.wait_until_available(name).await;
        }
        let deployment = self.api::<Deployment>().get(name).await.expect("deployment");
        let replicas = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        self.api::<Deployment>()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {
                    "observedGeneration": deployment.metadata.generation,
                    "replicas": replicas, "updatedReplicas": replicas,
                    "availableReplicas": replicas, "readyReplicas": replicas,
                }})),
            )
            .await
            .expect("deployment status");
    }

    /// Waits until the Deployment's controller reports every pod of its current template
    /// available and no other pod.
    async fn wait_until_available(&self, name: &str) {
        let mut last = None;
        for _ in 0..240 {
            let deployment = self.api::<Deployment>().get(name).await.expect("deployment");
            let want = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
            let status = deployment.status.clone().unwrap_or_default();
            if status.observed_generation >= deployment.metadata.generation
                && status.updated_replicas.unwrap_or(0) == want
                && status.available_replicas.unwrap_or(0) == want
                && status.replicas.unwrap_or(0) == want
            {
                return;
            }
            last = Some(status);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("Deployment {name} was not available within 2 minutes: {last:?}");
    }

    /// The Deployment's spec has not changed (on a cluster its status is the controller's to write).
    fn same_spec(&self, before: &Deployment, after: &Deployment) -> bool {
        if self.fake.is_some() {
            before.resource_version() == after.resource_version()
        } else {
            before.metadata.generation == after.metadata.generation
        }
    }

    async fn jobs(&self, name: &str) -> Vec<Job> {
        self.api::<Job>()
            .list(&ListParams::default().labels(&format!("{}={name}", labels::FUNCTION)))
            .await
            .expect("jobs")
            .items
    }

    async fn deployment(&self, name: &str) -> Option<Deployment> {
        self.api::<Deployment>().get_opt(name).await.expect("deployment")
    }

    /// resourceVersion of the Function and of everything labelled with it: a write changes one.
    async fn versions(&self, name: &str) -> BTreeMap<String, String> {
        let params = ListParams::default().labels(&format!("{}={name}", labels::FUNCTION));
        let mut versions = BTreeMap::new();
        let mut add = |kind: &str, name: String, version: Option<String>| {
            versions.insert(format!("{kind}/{name}"), version.unwrap_or_default());
        };
        let func = self.function(name).await;
        add("function", func.name_any(), func.resource_version());
        for o in self.api::<ConfigMap>().list(&params).await.unwrap().items {
            add("configmap", o.name_any(), o.resource_version());
        }
        for o in self.api::<Job>().list(&params).await.unwrap().items {
            add("job", o.name_any(), o.resource_version());
        }
        for o in self.api::<Deployment>().list(&params).await.unwrap().items {
            add("deployment", o.name_any(), o.resource_version());
        }
        for o in self.api::<Service>().list(&params).await.unwrap().items {
            add("service", o.name_any(), o.resource_version());
        }
        versions
    }

    /// Reasons of the Events recorded about a Function, oldest first.
    async fn event_reasons(&self, name: &str) -> Vec<String> {
        let events: Api<k8s_openapi::api::events::v1::Event> = self.api();
        let mut events: Vec<_> = events
            .list(&ListParams::default())
            .await
            .expect("events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect();
        events.sort_by_key(|e| e.event_time.as_ref().map(|t| t.0));
        events.into_iter().filter_map(|e| e.reason).collect()
    }
}

/// Label of the test namespaces in which build Jobs get no pods of their own.
const SIMULATED_BUILDS_LABEL: &str = "wasmless.io/simulated-builds";

/// On a cluster, the Job controller would start the (fake) builder image for every build
/// Job, and its pods would race the build the test simulates. An admission policy refuses
/// the Job controller's pods in the test namespaces, and only there.
async fn refuse_build_pods(client: &Client) {
    use k8s_openapi::api::admissionregistration::v1::{ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding};
    let name = "wasmless-tests-simulated-builds";
    let policy: ValidatingAdmissionPolicy = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
            }]},
            "validations": [{
                "expression": "request.userInfo.username != 'system:serviceaccount:kube-system:job-controller'",
                "message": "the operator's scenario tests simulate the builds in this namespace",
            }],
        },
    }))
    .unwrap();
    let binding: ValidatingAdmissionPolicyBinding = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {SIMULATED_BUILDS_LABEL: "true"}}},
        },
    }))
    .unwrap();
    let apply = PatchParams::apply("wasmless-tests").force();
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .patch(name, &apply, &Patch::Apply(&policy))
        .await
        .expect("the admission policy");
    Api::<ValidatingAdmissionPolicyBinding>::all(client.clone())
        .patch(name, &apply, &Patch::Apply(&binding))
        .await
        .expect("its binding");
}

fn status(func: &Function) -> wasmless_operator::FunctionStatus {
    func.status.clone().expect("status")
}

fn condition<'a>(func: &'a Function, kind: &str) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    func.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == kind))
        .unwrap_or_else(|| panic!("no {kind} condition"))
}

fn template_annotation(deployment: &Deployment, key: &str) -> String {
    deployment
        .spec
        .as_ref()
        .unwrap()
        .template
        .metadata
        .as_ref()
        .unwrap()
        .annotations
        .as_ref()
        .unwrap()[key]
        .clone()
}

/// The first container's arguments in a pod template.
fn first_container_args(template: k8s_openapi::api::core::v1::PodTemplateSpec) -> Vec<String> {
    template.spec.unwrap().containers[0].args.clone().unwrap()
}

/// Whether `flag` is followed by `value` in `args`.
fn has_flag(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

/// A module the runtime loads (on a cluster its pods must become ready): a WASI command
/// whose `_start` does nothing, with `tag` in a custom section so each tag has its own digest.
fn wasm(tag: &str) -> Vec<u8> {
    let mut bytes = b"\0asm\x01\0\0\0".to_vec();
    bytes.extend([0x01, 0x04, 0x01, 0x60, 0x00, 0x00]); // types: () -> ()
    bytes.extend([0x03, 0x02, 0x01, 0x00]); // functions: one of type 0
    bytes.extend([0x05, 0x03, 0x01, 0x00, 0x01]); // memories: one of one page
    bytes.extend([0x07, 0x13, 0x02]); // exports: two
    bytes.extend([0x06]);
    bytes.extend(b"_start");
    bytes.extend([0x00, 0x00]); // function 0
    bytes.extend([0x06]);
    bytes.extend(b"memory");
    bytes.extend([0x02, 0x00]); // memory 0
    bytes.extend([0x0a, 0x04, 0x01, 0x02, 0x00, 0x0b]); // code: an empty body
    let name = b"wasmless-test";
    let size = 1 + name.len() + tag.len();
    assert!(size < 128, "a one-byte section size");
    bytes.extend([0x00, size as u8, name.len() as u8]);
    bytes.extend(name);
    bytes.extend(tag.as_bytes());
    bytes
}

/// Creates `name`, builds it and makes it available: the starting point of later scenarios.
async fn ready_function(h: &Harness, name: &str, spec: Value) -> (Function, Digest) {
    h.create(name, spec).await;
    h.reconcile(name).await.expect("first reconcile");
    let module = h.finish_build(name, &wasm(name)).await;
    h.reconcile(name).await.expect("reconcile after build");
    h.make_available(name).await;
    let func = h.reconciled(name).await;
    assert_eq!(status(&func).phase, Some(Phase::Ready), "{:?}", func.status);
    (func, module)
}

// ---- scenarios ----

async fn new_function_starts_one_content_addressed_build(h: &Harness) {
    h.create("hello", json!({"source": HELLO, "serverPort": 9000})).await;
    let func = h.reconciled("hello").await;
    let st = status(&func);
    assert_eq!(st.phase, Some(Phase::Building));
    assert_eq!(condition(&func, "Built").reason, "Building");
    let digest: Digest = st.source_digest.unwrap().parse().unwrap();
    assert_eq!(
        digest,
        resources::source_digest(func.spec.language, "wasmless/builder:test", HELLO)
    );

    let jobs = h.jobs("hello").await;
    assert_eq!(jobs.len(), 1, "exactly one build Job");
    let job = &jobs[0];
    assert_eq!(job.name_any(), format!("hello-build-{}", digest.short()));
    let pod = job.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let builder = &pod.containers[0];
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
            "--publish",
            &format!("configmap://{}/hello", h.ns)
        ]
    );
    let env: BTreeMap<_, _> = builder
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();
    assert_eq!(env["WASMLESS_SOURCE_DIGEST"], Some(digest.to_string()));
    // The chunks the builder publishes are owned by the Function from the start, so a build
    // that outlives its Function leaves nothing behind.
    assert_eq!(env["WASMLESS_FUNCTION_UID"], func.uid());
    assert_eq!(pod.service_account_name.as_deref(), Some(resources::BUILDER_ACCOUNT));
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
        .get(&resources::source_configmap_name("hello", &digest))
        .await
        .unwrap();
    assert_eq!(source_cm.data.unwrap()["source"], HELLO);
    assert_eq!(source_cm.immutable, Some(true));
    // The builder may write ConfigMaps in this namespace and nothing else.
    let role = h
        .api::<k8s_openapi::api::rbac::v1::Role>()
        .get(resources::BUILDER_ACCOUNT)
        .await
        .unwrap();
    let rules = role.rules.unwrap();
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0].resources, Some(vec!["configmaps".to_string()]));
    // Nothing to serve yet.
    assert!(h.deployment("hello").await.is_none());
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
    assert_eq!(st.phase, Some(Phase::Pending), "built, pods not yet available");

    let deployment = h.deployment("hello").await.expect("the Deployment");
    assert_eq!(
        template_annotation(&deployment, annotations::MODULE_DIGEST),
        module.to_string()
    );
    let pod = deployment.spec.as_ref().unwrap().template.spec.clone().unwrap();
    assert_eq!(pod.automount_service_account_token, Some(false));
    let runtime = &pod.containers[0];
    let args = runtime.args.clone().unwrap();
    let flag = |name: &str| args[args.iter().position(|a| a == name).unwrap() + 1].clone();
    assert_eq!(flag("--module"), "/module");
    assert_eq!(flag("--module-digest"), module.to_string());
    assert_eq!(flag("--function"), "hello");
    assert_eq!(flag("--env"), "GREETING=hi");
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
        !args.contains(&"--code".to_string()),
        "a build without compiled code (an older builder's) serves the module alone: {args:?}"
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
    // Every chunk ConfigMap is projected into one directory as NNNN.wasm.zst.
    let volumes = pod.volumes.unwrap();
    let projected = volumes
        .iter()
        .find(|v| v.name == "module")
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
        template_annotation(&deployment, annotations::CODE_DIGEST),
        code.to_string()
    );
    let template = deployment.spec.clone().unwrap().template;
    let args = first_container_args(template.clone());
    assert!(has_flag(&args, "--code", "/module"), "{args:?}");
    assert!(has_flag(&args, "--code-digest", &code.to_string()), "{args:?}");
    let source_digest = Harness::status_source_digest(&func);
    let volume = template.spec.unwrap().volumes.unwrap();
    let projected: Vec<(String, String)> = volume
        .iter()
        .find(|v| v.name == "module")
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
    let v2 = h.finish_build("hello", &crate::wasm("v2")).await;
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).module_digest, Some(v2.to_string()));
    assert_eq!(status(&func).code_digest, None);
    let args = first_container_args(h.deployment("hello").await.unwrap().spec.unwrap().template);
    assert!(!args.contains(&"--code".to_string()), "{args:?}");
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
        template_annotation(&deployment, annotations::MODULE_DIGEST),
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
        resources::job_name("hello", &Harness::status_source_digest(&func))
    );
    // Changing back to the first source builds again (its artifacts were collected),
    // under the same deterministic name.
    assert_ne!(old_module, new_module);
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
        template_annotation(&after, annotations::MODULE_DIGEST),
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
        template_annotation(&deployment, annotations::MODULE_DIGEST),
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
        template_annotation(&deployment, annotations::MODULE_DIGEST),
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
                    super::$name(&h).await;
                    // Kept when the scenario fails, to look at.
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
    failed_build_keeps_serving_previous_module,
    replicas_zero_scales_to_zero,
    scaling_a_function_scales_its_deployment,
    everything_is_owned_by_the_function,
    bad_functions_are_reported_not_fatal,
    renamed_service_replaces_the_old_one,
    server_port_of_the_metrics_port_is_refused_on_status,
    multibyte_compiler_output_reaches_an_event,
    build_past_its_deadline_says_so,
    builder_out_of_memory_says_so,
    chunks_published_after_the_function_is_gone_are_collected,
);

// ---- fake-only scenarios: what a real API server cannot be made to do ----

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
    let args = first_container_args(deployment.spec.unwrap().template);
    assert!(has_flag(&args, "--module", "oci://registry.local/fns/pre"), "{args:?}");
    assert!(has_flag(&args, "--module-digest", &digest.to_string()));
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
            &resources::job_name("hello", &digest),
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"failed": null, "succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}})),
        )
        .await
        .unwrap();
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).module_digest, Some(module.to_string()));
    assert_eq!(status(&func).module_ref, Some(format!("oci://{reference}")));
    let deployment = h.deployment("hello").await.unwrap();
    let args = first_container_args(deployment.spec.unwrap().template);
    assert!(has_flag(&args, "--module", &format!("oci://{reference}")), "{args:?}");
    assert!(has_flag(&args, "--code", &format!("oci://{reference}")), "{args:?}");
    assert!(has_flag(&args, "--code-digest", &code.to_string()), "{args:?}");
    // Later reconciles find the module from status, without the Job's pod.
    let pods: Api<Pod> = h.api();
    pods.delete(
        &format!("{}-x7k2p", resources::job_name("hello", &digest)),
        &DeleteParams::default(),
    )
    .await
    .unwrap();
    let func = h.reconciled("hello").await;
    assert_eq!(status(&func).module_digest, Some(module.to_string()));
    assert_eq!(status(&func).code_digest, Some(code.to_string()));
    let args = first_container_args(h.deployment("hello").await.unwrap().spec.unwrap().template);
    assert!(has_flag(&args, "--code-digest", &code.to_string()), "{args:?}");
}

/// The operator's Lease as replica `who` holds it, on the in-memory API server.
fn operator_lease(fake: &FakeApiServer, who: &str, ttl: Duration) -> wasmless_operator::leader::LeaseLock {
    wasmless_operator::leader::LeaseLock::new(fake.client(), "wasmless-system", "wasmless-operator", who, ttl)
}

#[tokio::test]
async fn only_one_replica_holds_the_lease_until_it_expires() {
    let fake = FakeApiServer::new();
    let lease = |who: &str| operator_lease(&fake, who, Duration::from_secs(1));
    let (a, b) = (lease("a"), lease("b"));
    assert!(a.try_acquire_or_renew().await.unwrap(), "a takes the free lease");
    assert!(!b.try_acquire_or_renew().await.unwrap(), "b waits while a holds it");
    assert!(a.try_acquire_or_renew().await.unwrap(), "a renews");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(b.try_acquire_or_renew().await.unwrap(), "b takes the expired lease");
    assert!(!a.try_acquire_or_renew().await.unwrap(), "a has lost it");
    let leases = fake.objects("/leases/");
    assert_eq!(leases[0]["spec"]["holderIdentity"], "b");
    assert_eq!(leases[0]["spec"]["leaseTransitions"], 1);
}

#[tokio::test]
async fn a_hung_renewal_gives_up_leadership_before_the_lease_expires() {
    let fake = FakeApiServer::new();
    let lease = operator_lease(&fake, "a", Duration::from_secs(3));
    assert!(lease.try_acquire_or_renew().await.unwrap());
    let renewed = std::time::Instant::now();
    // The API server stops answering (a half-open connection): renewals never return.
    fake.hang(http::Method::GET, "/leases/", usize::MAX);
    let lost = tokio::time::timeout(Duration::from_secs(10), lease.keep())
        .await
        .expect("keep() returns while the renewal hangs");
    let led_for = renewed.elapsed();
    assert!(
        led_for < Duration::from_secs(3),
        "led {led_for:?} after the last renewal, past the 3 s a standby waits: {lost}"
    );
    assert!(lost.contains("not renewed within"), "{lost}");
}

#[tokio::test]
async fn a_released_lease_is_taken_at_once() {
    let fake = FakeApiServer::new();
    let lease = |who: &str| operator_lease(&fake, who, Duration::from_secs(60));
    let (a, b) = (lease("a"), lease("b"));
    assert!(a.try_acquire_or_renew().await.unwrap());
    assert!(!b.try_acquire_or_renew().await.unwrap(), "held for a minute");
    a.release().await;
    assert!(
        b.try_acquire_or_renew().await.unwrap(),
        "b takes the released lease without waiting"
    );
    assert!(!a.try_acquire_or_renew().await.unwrap());
    // Releasing a lease someone else holds changes nothing.
    a.release().await;
    assert_eq!(fake.objects("/leases/")[0]["spec"]["holderIdentity"], "b");
}

#[tokio::test]
async fn an_api_error_while_acquiring_is_retried() {
    let fake = FakeApiServer::new();
    let lease = operator_lease(&fake, "a", Duration::from_secs(1));
    fake.fail(http::Method::GET, "/leases/", 2);
    tokio::time::timeout(Duration::from_secs(5), lease.acquire())
        .await
        .expect("acquired once the API server answers");
    assert_eq!(fake.objects("/leases/")[0]["spec"]["holderIdentity"], "a");
}

#[tokio::test]
async fn reconciles_and_errors_are_counted() {
    let fake = FakeApiServer::new();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::default().register(&mut registry);
    let ctx = Arc::new(Context::new(fake.client(), settings(), metrics, None));
    let h = Harness {
        ctx,
        client: fake.client(),
        fake: Some(fake.clone()),
        ns: "default".into(),
    };
    h.create("hello", json!({"source": HELLO})).await;
    fake.fail(http::Method::PATCH, "/jobs/", 1);
    let error = h.reconcile("hello").await.unwrap_err();
    error_policy(Arc::new(h.function("hello").await), &error, h.ctx.clone());
    h.reconcile("hello").await.unwrap();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("wasmless_operator_reconciles_total 2"), "{text}");
    assert!(
        text.contains(r#"wasmless_operator_reconcile_errors_total{error="kube"} 1"#),
        "{text}"
    );
    assert!(
        text.contains("wasmless_operator_reconcile_duration_seconds_count 2"),
        "{text}"
    );
}

/// A harness on the in-memory API server whose metrics are in `registry`.
fn counted(registry: &mut prometheus_client::registry::Registry) -> Harness {
    let fake = FakeApiServer::new();
    let metrics = Metrics::default().register(registry);
    Harness {
        ctx: Arc::new(Context::new(fake.client(), settings(), metrics, None)),
        client: fake.client(),
        fake: Some(fake),
        ns: "default".into(),
    }
}

fn exposition(registry: &prometheus_client::registry::Registry) -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text
}

fn builds(function: &str, result: &str, count: u32) -> String {
    format!(
        r#"wasmless_operator_builds_total{{function="{function}",function_namespace="default",result="{result}"}} {count}"#
    )
}

#[tokio::test]
async fn build_outcomes_are_counted_once_by_result() {
    let mut registry = prometheus_client::registry::Registry::default();
    let h = counted(&mut registry);
    h.create("hello", json!({"source": "package handlers\n\nfunc Handler( {\n"}))
        .await;
    h.reconcile("hello").await.unwrap();
    let text = exposition(&registry);
    for result in ["succeeded", "failed", "deadline_exceeded", "oom_killed"] {
        assert!(
            text.contains(&builds("hello", result, 0)),
            "{result} exported at 0 before any build ends: {text}"
        );
    }

    h.fail_build("hello", "./handler.go:3:15: syntax error: unexpected {, expected )")
        .await;
    h.reconcile("hello").await.unwrap();
    // Reconciled again (a watch event, a restart of the watch): the same failure.
    h.reconcile("hello").await.unwrap();
    let text = exposition(&registry);
    assert!(text.contains(&builds("hello", "failed", 1)), "{text}");
    assert!(text.contains(&builds("hello", "succeeded", 0)), "{text}");

    // The source fixed: a second build, which succeeds, counted once too.
    h.update_spec("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    h.finish_build("hello", &wasm("hello")).await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    h.reconcile("hello").await.unwrap();
    let text = exposition(&registry);
    assert!(text.contains(&builds("hello", "succeeded", 1)), "{text}");
    assert!(text.contains(&builds("hello", "failed", 1)), "{text}");

    h.create("slow", json!({"source": HELLO_V2})).await;
    h.reconcile("slow").await.unwrap();
    let killed = json!({"exitCode": 137, "reason": "Error", "message": "compiling Go to WebAssembly..."});
    h.fail_build_with("slow", killed, "DeadlineExceeded").await;
    h.reconcile("slow").await.unwrap();
    let text = exposition(&registry);
    assert!(text.contains(&builds("slow", "deadline_exceeded", 1)), "{text}");
    assert!(text.contains(&builds("slow", "failed", 0)), "{text}");
}

#[tokio::test]
async fn a_step_that_fails_between_does_not_count_the_build_again() {
    let mut registry = prometheus_client::registry::Registry::default();
    let h = counted(&mut registry);
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    h.finish_build("hello", &wasm("hello")).await;
    h.reconcile("hello").await.unwrap();
    // Reading the module ConfigMaps fails once: Built says ReconcileError, then Built again.
    h.fake.as_ref().unwrap().fail(http::Method::GET, "/configmaps", 1);
    let error = h.reconcile("hello").await.unwrap_err();
    error_policy(Arc::new(h.function("hello").await), &error, h.ctx.clone());
    assert_eq!(condition(&h.function("hello").await, "Built").reason, "ReconcileError");
    h.reconcile("hello").await.unwrap();
    assert_eq!(condition(&h.function("hello").await, "Built").reason, "Built");
    let text = exposition(&registry);
    assert!(text.contains(&builds("hello", "succeeded", 1)), "{text}");
}

#[tokio::test]
async fn replicas_are_served_for_every_function_the_controller_knows() {
    use kube::runtime::{reflector, watcher};
    let mut registry = prometheus_client::registry::Registry::default();
    let h = counted(&mut registry);
    let text = exposition(&registry);
    assert!(
        !text.contains("wasmless_function_replicas{"),
        "no series before the controller runs: {text}"
    );

    let (store, mut writer) = reflector::store::<Function>();
    h.ctx.metrics.watch(store);
    ready_function(&h, "hello", json!({"source": HELLO, "replicas": 1})).await;
    h.scale("hello", 3).await;
    // The first reconcile rolls the Deployment out; the second reads its status back.
    h.reconcile("hello").await.unwrap();
    h.reconcile("hello").await.unwrap();
    let hello = h.function("hello").await;
    writer.apply_watcher_event(&watcher::Event::Apply(hello.clone()));
    let text = exposition(&registry);
    let series = |state: &str, value: i32| {
        format!(
            r#"wasmless_function_replicas{{function="hello",function_namespace="default",state="{state}"}} {value}"#
        )
    };
    assert!(text.contains(&series("desired", 3)), "{text}");
    assert!(
        text.contains(&series("ready", 1)),
        "the rollout to 3 has not happened: {text}"
    );
    assert!(text.contains("# TYPE wasmless_function_replicas gauge"), "{text}");

    // A deleted Function's series go with it.
    writer.apply_watcher_event(&watcher::Event::Delete(hello));
    let text = exposition(&registry);
    assert!(
        !text.contains(r#"wasmless_function_replicas{function="hello""#),
        "{text}"
    );
}

/// GET `path` over plain HTTP/1.1; the status code and the body.
async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: operator\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let status = response.split(' ').nth(1).unwrap().parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test]
async fn admin_endpoints_serve_metrics_health_and_readiness() {
    use wasmless_operator::admin::{AdminState, router};
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::default().register(&mut registry);
    let state = AdminState::new(registry);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(axum::serve(listener, router(state.clone())).into_future());

    assert_eq!(http_get(addr, "/healthz").await.0, 200);
    assert_eq!(
        http_get(addr, "/readyz").await.0,
        503,
        "not ready before the controller can run"
    );
    state.set_ready();
    assert_eq!(http_get(addr, "/readyz").await.0, 200);

    let fake = FakeApiServer::new();
    let h = Harness {
        ctx: Arc::new(Context::new(fake.client(), settings(), metrics, None)),
        client: fake.client(),
        fake: Some(fake.clone()),
        ns: "default".into(),
    };
    h.create("hello", json!({"source": HELLO})).await;
    h.reconcile("hello").await.unwrap();
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(body.contains("wasmless_operator_reconciles_total 1"), "{body}");
    assert!(
        body.contains("wasmless_operator_reconcile_duration_seconds_bucket"),
        "{body}"
    );
}

// ---- the CRD ----

#[test]
fn committed_crd_matches_the_rust_types() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../crds/function.yaml");
    let committed = std::fs::read_to_string(path).expect("crds/function.yaml");
    assert!(
        committed == wasmless_operator::crd_yaml(),
        "crds/function.yaml is stale: run `cargo run -p wasmless-operator --bin crdgen`"
    );
}

fn spec_schema() -> Value {
    let crd = serde_json::to_value(Function::crd()).unwrap();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema").unwrap().clone()
}

/// Runs the CRD's CEL rules on a Function the way the API server does on create.
fn cel_errors(spec: Value) -> Vec<String> {
    cel_errors_named("hello", spec)
}

fn cel_errors_named(name: &str, spec: Value) -> Vec<String> {
    let object =
        json!({"apiVersion": "wasmless.io/v1alpha1", "kind": "Function", "metadata": {"name": name}, "spec": spec});
    match kube::core::cel::Validator::new().validate(&spec_schema(), &object, None) {
        Ok(()) => Vec::new(),
        Err(errors) => errors.into_iter().map(|e| e.message).collect(),
    }
}

/// The structural checks of the schema (enum, bounds, lengths) the API server applies before CEL.
fn schema_errors(schema: &Value, value: &Value, path: &str) -> Vec<String> {
    let mut errors = Vec::new();
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        errors.push(format!("{path}: {value} is not one of {options:?}"));
    }
    if let Some(n) = value.as_f64() {
        if schema.get("minimum").and_then(Value::as_f64).is_some_and(|m| n < m) {
            errors.push(format!("{path}: {n} is below the minimum"));
        }
        if schema.get("maximum").and_then(Value::as_f64).is_some_and(|m| n > m) {
            errors.push(format!("{path}: {n} is above the maximum"));
        }
    }
    if let Some(s) = value.as_str() {
        let chars = s.chars().count() as u64;
        if schema
            .get("maxLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| chars > m)
        {
            errors.push(format!("{path}: longer than maxLength"));
        }
        if schema
            .get("minLength")
            .and_then(Value::as_u64)
            .is_some_and(|m| chars < m)
        {
            errors.push(format!("{path}: shorter than minLength"));
        }
    }
    if let (Some(properties), Some(object)) = (schema.get("properties"), value.as_object()) {
        for (key, field) in object {
            if let Some(field_schema) = properties.get(key) {
                errors.extend(schema_errors(field_schema, field, &format!("{path}.{key}")));
            }
        }
    }
    errors
}

fn refused(spec: Value) -> Vec<String> {
    let mut errors = schema_errors(&spec_schema(), &json!({"spec": spec.clone()}), "");
    errors.extend(cel_errors(spec));
    errors
}

#[test]
fn crd_accepts_goless_and_rust_functions() {
    assert_eq!(refused(json!({"source": HELLO})), Vec::<String>::new());
    assert_eq!(
        refused(json!({"function": HELLO, "service": "hello", "serverPort": 9000})),
        Vec::<String>::new()
    );
    assert_eq!(
        refused(json!({"language": "rust", "source": "fn x() {}"})),
        Vec::<String>::new()
    );
    let digest = Digest::of(b"m").to_string();
    assert_eq!(
        refused(json!({"language": "wasm", "module": {"image": "r.local/x", "digest": digest}})),
        Vec::<String>::new()
    );
}

#[test]
fn every_example_function_is_accepted() {
    let examples = std::fs::read_dir(repo_root().join("examples")).unwrap();
    let mut checked = 0;
    for example in examples.flatten() {
        let path = example.path().join("function.yaml");
        let yaml: Value = serde_yaml::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        assert_eq!(yaml["apiVersion"], "wasmless.io/v1alpha1", "{}", path.display());
        assert_eq!(yaml["kind"], "Function", "{}", path.display());
        assert_eq!(
            refused(yaml["spec"].clone()),
            Vec::<String>::new(),
            "{}",
            path.display()
        );
        serde_json::from_value::<wasmless_operator::Function>(yaml.clone())
            .unwrap_or_else(|e| panic!("{} does not parse as a Function: {e}", path.display()));
        checked += 1;
    }
    assert!(checked >= 5, "the examples are there: {checked}");
}

#[test]
fn crd_refuses_bad_functions() {
    let digest = Digest::of(b"m").to_string();
    let cases = [
        (json!({"language": "cobol", "source": HELLO}), "is not one of"),
        (json!({"source": ""}), "shorter than minLength"),
        (json!({"source": "x".repeat(512 * 1024 + 1)}), "source is over 512 KiB"),
        (json!({}), "exactly one of source"),
        (json!({"source": HELLO, "function": HELLO}), "exactly one of source"),
        (
            json!({"language": "wasm", "source": HELLO, "module": {"image": "r/x", "digest": digest}}),
            "exactly one of source",
        ),
        (json!({"source": HELLO, "serverPort": 70000}), "above the maximum"),
        (json!({"source": HELLO, "serverPort": 0}), "below the minimum"),
        (json!({"source": HELLO, "replicas": -1}), "below the minimum"),
        (
            json!({"module": {"image": "r/x", "digest": digest}}),
            "set language: wasm",
        ),
        (json!({"language": "wasm", "source": HELLO}), "takes a prebuilt module"),
        (
            json!({"source": HELLO, "limits": {"isolation": "process"}}),
            "is not one of",
        ),
    ];
    for (spec, expected) in cases {
        let errors = refused(spec.clone());
        assert!(
            errors.iter().any(|e| e.contains(expected)),
            "{spec:.80}: expected {expected:?}, got {errors:?}"
        );
    }
}

#[test]
fn crd_refuses_names_that_cannot_name_a_build_job() {
    let spec = json!({"source": HELLO});
    assert_eq!(cel_errors_named(&"a".repeat(46), spec.clone()), Vec::<String>::new());
    for name in ["a".repeat(47), "9lives".to_string(), "dotted.name".to_string()] {
        let errors = cel_errors_named(&name, spec.clone());
        assert!(
            errors.iter().any(|e| e.contains("at most 46 characters")),
            "{name}: {errors:?}"
        );
    }
}

#[test]
fn crd_has_printer_columns_short_name_and_status() {
    let crd = Function::crd();
    assert_eq!(crd.spec.names.short_names, Some(vec!["fn".to_string()]));
    let version = &crd.spec.versions[0];
    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Language", "Phase", "Ready", "Digest", "URL", "Age"]);
    let subresources = version.subresources.as_ref().unwrap();
    assert!(subresources.status.is_some());
    let scale = subresources
        .scale
        .as_ref()
        .expect("the scale subresource, for kubectl scale and HPAs");
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
}

// ---- install and images ----

fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The objects `kubectl kustomize <dir>` renders, or `None` (and why, on stderr) without
/// kubectl. With `CI` set it panics instead: a skipped RBAC check there would pass unseen.
fn kustomize(dir: &str) -> Option<Vec<Value>> {
    use serde::Deserialize;
    let output = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(repo_root().join(dir))
        .output()
    {
        Ok(output) => output,
        Err(error) if std::env::var_os("CI").is_some() => {
            panic!("kubectl is not installed ({error}) and CI is set: install kubectl (scripts/setup.sh does)")
        }
        Err(error) => {
            eprintln!("skipping: kubectl is not installed ({error}); scripts/setup.sh installs it");
            return None;
        }
    };
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rendered = String::from_utf8(output.stdout).unwrap();
    Some(
        serde_yaml::Deserializer::from_str(&rendered)
            .map(|document| Value::deserialize(document).unwrap())
            .collect(),
    )
}

/// `(resource, verb)` for every verb the rendered Roles and ClusterRoles grant.
fn granted(objects: &[Value]) -> std::collections::BTreeSet<(String, String)> {
    let mut granted = std::collections::BTreeSet::new();
    for object in objects
        .iter()
        .filter(|o| o["kind"] == "ClusterRole" || o["kind"] == "Role")
    {
        for rule in object["rules"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    granted.insert((resource.as_str().unwrap().into(), verb.as_str().unwrap().into()));
                }
            }
        }
    }
    granted
}

/// Everything the operator does to the API, on one in-memory server: the controller's
/// watches and a reconcile through them, a build, a rollout, a repeated Event, a rebuild
/// with repaired builder RBAC, a failed build, the collection of the old builds, a
/// renamed Service, and the Lease taken, renewed and released. `(resource, verb)` of each
/// request the operator sent.
async fn what_the_operator_uses() -> std::collections::BTreeSet<(String, String)> {
    let fake = FakeApiServer::new();
    let tests = fake.as_user("tests");
    let h = Harness {
        ctx: Arc::new(Context::new(fake.client(), settings(), Metrics::default(), None)),
        client: tests.client(),
        fake: Some(tests),
        ns: "default".into(),
    };
    h.create("hello", json!({"source": HELLO})).await;
    // The controller as `main` runs it: lists, watches (answered by silence) and reconciles.
    wasmless_operator::run(
        h.ctx.clone(),
        Some("default"),
        tokio::time::sleep(Duration::from_secs(2)),
    )
    .await;
    assert_eq!(
        status(&h.function("hello").await).phase,
        Some(Phase::Building),
        "reconciled by the controller"
    );
    h.finish_build("hello", &wasm("hello")).await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    h.reconcile("hello").await.unwrap();
    // A rollout and back: the same `Available` Event again, which the recorder patches.
    h.update_spec("hello", json!({"env": [{"name": "A", "value": "1"}]}))
        .await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    assert_eq!(status(&h.reconciled("hello").await).phase, Some(Phase::Ready));
    // Someone edits the builder's RBAC; the next build puts it back.
    for resource in ["serviceaccounts", "roles", "rolebindings"] {
        let group = if resource == "serviceaccounts" {
            "/api/v1"
        } else {
            "/apis/rbac.authorization.k8s.io/v1"
        };
        let request = http::Request::patch(format!(
            "{group}/namespaces/default/{resource}/{}",
            resources::BUILDER_ACCOUNT
        ))
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(&json!({"metadata": {"labels": {resources::MANAGED_BY_LABEL: "someone"}}})).unwrap())
        .unwrap();
        h.client.request::<Value>(request).await.unwrap();
    }
    h.update_spec("hello", json!({"source": HELLO_V2})).await;
    h.reconcile("hello").await.unwrap();
    h.fail_build("hello", "./handler.go:1:1: an error").await;
    h.reconcile("hello").await.unwrap();
    // Back to the first source: built already; once Ready, the failed build is collected.
    h.update_spec("hello", json!({"source": HELLO, "service": "greeter"}))
        .await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    h.reconcile("hello").await.unwrap();
    assert_eq!(h.jobs("hello").await.len(), 1, "the failed build was collected");
    assert!(h.api::<Service>().get_opt("hello").await.unwrap().is_none(), "renamed");

    let lease = operator_lease(&fake, "a", Duration::from_secs(15));
    lease.acquire().await;
    assert!(lease.try_acquire_or_renew().await.unwrap());
    lease.release().await;

    let mut used = std::collections::BTreeSet::new();
    for request in fake.requests().into_iter().filter(|r| r.user.is_none()) {
        for verb in request.verbs() {
            used.insert((request.rbac_resource(), verb.to_string()));
        }
    }
    used
}

#[tokio::test]
async fn rendered_rbac_grants_exactly_the_verbs_the_operator_uses() {
    let Some(rendered) = kustomize("deploy") else { return };
    let granted = granted(&rendered);
    let used = what_the_operator_uses().await;
    let unused: Vec<_> = granted.difference(&used).collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    assert!(
        unused.is_empty() && missing.is_empty(),
        "deploy/rbac.yaml grants what the operator never uses: {unused:?}; and lacks what it uses: {missing:?}"
    );
    // A Role may grant only what its writer holds: the builder's, in each namespace.
    let (_, role, _) = resources::builder_rbac("default");
    for verb in &role.rules.unwrap()[0].verbs {
        assert!(
            granted.contains(&("configmaps".into(), verb.clone())),
            "the operator cannot grant {verb}"
        );
    }
}

#[test]
fn namespaced_install_grants_the_operator_one_namespace_only() {
    let Some(rendered) = kustomize("deploy-namespaced") else {
        return;
    };
    let of_kind = |kind: &str| rendered.iter().filter(|o| o["kind"] == kind).collect::<Vec<_>>();
    assert!(of_kind("ClusterRoleBinding").is_empty(), "no cluster-wide grant");
    let bindings = of_kind("RoleBinding");
    let grant = bindings
        .iter()
        .find(|b| b["roleRef"]["kind"] == "ClusterRole")
        .expect("a RoleBinding of the operator's ClusterRole");
    assert_eq!(grant["metadata"]["namespace"], "functions");
    assert_eq!(grant["roleRef"]["name"], "wasmless-operator");
    assert_eq!(grant["subjects"][0]["name"], "wasmless-operator");
    assert_eq!(grant["subjects"][0]["namespace"], "wasmless-system");
    let deployment = of_kind("Deployment")[0];
    let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "WASMLESS_WATCH_NAMESPACE" && e["value"] == "functions"),
        "the operator watches the namespace it is granted: {env:?}"
    );
    // The same verbs as the cluster-wide install, where they are granted.
    assert_eq!(granted(&rendered), granted(&kustomize("deploy").unwrap()));
}

#[test]
fn kustomize_renders_objects_that_parse_as_their_kinds() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let Some(rendered) = kustomize("deploy") else { return };
    let mut kinds = Vec::new();
    for value in rendered {
        let kind = value["kind"].as_str().unwrap().to_string();
        let namespace = value
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .map(str::to_string);
        macro_rules! parse {
            ($ty:ty) => {
                serde_json::from_value::<$ty>(value.clone()).unwrap_or_else(|e| panic!("{kind}: {e}"))
            };
        }
        match kind.as_str() {
            "Namespace" => assert_eq!(parse!(Namespace).name_any(), "wasmless-system"),
            "CustomResourceDefinition" => {
                assert!(
                    parse!(CustomResourceDefinition).spec == Function::crd().spec,
                    "the CRD installed is the generated one"
                )
            }
            "ServiceAccount" => drop(parse!(k8s_openapi::api::core::v1::ServiceAccount)),
            "ClusterRole" => {
                let role = parse!(ClusterRole);
                for rule in role.rules.unwrap() {
                    assert!(!rule.verbs.contains(&"*".to_string()), "least privilege: no * verbs");
                    assert!(
                        !rule.resources.unwrap_or_default().contains(&"*".to_string()),
                        "no * resources"
                    );
                }
            }
            "ClusterRoleBinding" => drop(parse!(ClusterRoleBinding)),
            "Role" => {
                let role = parse!(Role);
                assert!(
                    role.rules
                        .unwrap()
                        .iter()
                        .all(|r| r.api_groups == Some(vec!["coordination.k8s.io".into()]))
                );
            }
            "RoleBinding" => drop(parse!(RoleBinding)),
            "ValidatingAdmissionPolicy" => {
                let policy = parse!(k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy);
                let conditions = policy.spec.unwrap().match_conditions.unwrap();
                assert!(
                    conditions[0]
                        .expression
                        .contains("system:serviceaccount:wasmless-system:wasmless-operator"),
                    "the policy names the operator's ServiceAccount in its namespace"
                );
            }
            "ValidatingAdmissionPolicyBinding" => drop(parse!(
                k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding
            )),
            "Service" => drop(parse!(Service)),
            "Deployment" => {
                let deployment = parse!(Deployment);
                let spec = deployment.spec.unwrap();
                assert_eq!(spec.replicas, Some(2), "two replicas, one leader");
                let container = &spec.template.spec.unwrap().containers[0];
                assert_eq!(container.image.as_deref(), Some("wasmless/operator:0.1.0"));
                let env: Vec<_> = container.env.clone().unwrap().into_iter().map(|e| e.name).collect();
                for name in [
                    "POD_NAME",
                    "POD_NAMESPACE",
                    "WASMLESS_RUNTIME_IMAGE",
                    "WASMLESS_BUILDER_IMAGE",
                ] {
                    assert!(env.contains(&name.to_string()), "{name} missing");
                }
                assert_eq!(
                    container.security_context.as_ref().unwrap().read_only_root_filesystem,
                    Some(true)
                );
            }
            other => panic!("unexpected kind {other}"),
        }
        // Kustomize does not know the admission policies are cluster-scoped and gives them a
        // namespace, which the API server drops.
        if !matches!(
            kind.as_str(),
            "Namespace"
                | "CustomResourceDefinition"
                | "ClusterRole"
                | "ClusterRoleBinding"
                | "ValidatingAdmissionPolicy"
                | "ValidatingAdmissionPolicyBinding"
        ) {
            assert_eq!(namespace.as_deref(), Some("wasmless-system"), "{kind}");
        }
        kinds.push(kind);
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Namespace",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
}

/// Whether an ELF executable is statically linked: it has no PT_INTERP program header
/// (static-pie included), so it runs in an image with nothing else in it.
fn is_static_elf(path: &std::path::Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else { return false };
    if bytes.len() < 64 || &bytes[..4] != b"\x7fELF" || bytes[4] != 2 {
        return false;
    }
    let u16_at = |at: usize| u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
    let phoff = u64::from_le_bytes(bytes[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    (0..phnum).all(|i| {
        let at = phoff + i * phentsize;
        bytes.get(at..at + 4).map(|t| u32::from_le_bytes(t.try_into().unwrap())) != Some(PT_INTERP)
    })
}

#[test]
fn runtime_image_runs_the_release_binary_as_non_root() {
    // The test binary is target/<profile>/deps/operator-*; the runtime is target/<profile>/,
    // or, built static for Dockerfile.runtime, target/<triple>/release/.
    let exe = std::env::current_exe().unwrap();
    let profile_dir = exe.parent().and_then(|p| p.parent()).unwrap().to_path_buf();
    let target_dir = profile_dir.parent().unwrap();
    let candidates = [
        target_dir.join("x86_64-unknown-linux-musl/release/wasmless-runtime"),
        target_dir.join("x86_64-unknown-linux-gnu/release/wasmless-runtime"),
        profile_dir.join("wasmless-runtime"),
    ];
    let Some(binary) = candidates.iter().find(|p| p.exists()) else {
        eprintln!("skipping: no wasmless-runtime release binary in {candidates:?} (cargo build --release builds one)");
        return;
    };
    if std::process::Command::new("buildah").arg("--version").output().is_err() {
        eprintln!("skipping: buildah is not installed; scripts/setup.sh installs it");
        return;
    }
    let context = std::env::temp_dir().join(format!("wasmless-runtime-image-{}", std::process::id()));
    std::fs::create_dir_all(&context).unwrap();
    let copy = context.join("wasmless-runtime");
    std::fs::copy(binary, &copy).unwrap();
    // Debug line tables make the release binary ~6x larger; the image needs none of them.
    let _ = std::process::Command::new("strip").arg(&copy).status();
    let tag = format!("localhost/wasmless-runtime-test:{}", std::process::id());
    // vfs storage and chroot isolation work without a container engine or user namespaces.
    let buildah = |args: &[&str]| {
        std::process::Command::new("buildah")
            .args(["--storage-driver", "vfs"])
            .args(args)
            .output()
            .unwrap()
    };
    let dockerfile = repo_root().join("Dockerfile.runtime");
    let build = buildah(&[
        "bud",
        "--isolation",
        "chroot",
        "-f",
        dockerfile.to_str().unwrap(),
        "-t",
        &tag,
        context.to_str().unwrap(),
    ]);
    std::fs::remove_dir_all(&context).ok();
    if !build.status.success() {
        let stderr = String::from_utf8_lossy(&build.stderr);
        eprintln!("skipping: buildah cannot build images in this sandbox: {stderr}");
        return;
    }
    let inspect = buildah(&[
        "inspect",
        "--format",
        "{{.OCIv1.Config.User}}|{{.OCIv1.Config.Entrypoint}}",
        &tag,
    ]);
    let inspected = String::from_utf8_lossy(&inspect.stdout).trim().to_string();
    let ran = if is_static_elf(binary) {
        // The image holds the binary and nothing else: a static one runs in it as is.
        let container = String::from_utf8_lossy(&buildah(&["from", &tag]).stdout)
            .trim()
            .to_string();
        let run = buildah(&[
            "run",
            "--isolation",
            "chroot",
            &container,
            "--",
            "/usr/local/bin/wasmless-runtime",
            "--version",
        ]);
        buildah(&["rm", &container]);
        Some(run)
    } else {
        eprintln!(
            "not running the image: {} is dynamically linked (Dockerfile.runtime expects a static build; scripts/build-images.sh adds the C library instead, and the cluster tests run that image)",
            binary.display()
        );
        None
    };
    buildah(&["rmi", &tag]);
    assert_eq!(
        inspected,
        "65532:65532|[/usr/local/bin/wasmless-runtime]",
        "{}",
        String::from_utf8_lossy(&inspect.stderr)
    );
    if let Some(run) = ran {
        assert!(
            run.status.success() && String::from_utf8_lossy(&run.stdout).starts_with("wasmless-runtime "),
            "the runtime did not run in its image: {}",
            String::from_utf8_lossy(&run.stderr)
        );
    }
}
