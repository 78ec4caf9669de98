//! The harness every scenario runs on: the in-memory API server or a real cluster, the
//! builder and the kubelet simulated through the API, and the assertions' helpers.

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
use wasmless_artifact::{Digest, Part, annotations, compress_and_split, labels};
use wasmless_operator::crd::{Function, Phase};
use wasmless_operator::objects::{self};
use wasmless_operator::{Context, Metrics, Settings, reconcile};
use wasmless_testkit::FakeApiServer;

pub(crate) const HELLO: &str = "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(\"This works!\")) }\n";
pub(crate) const HELLO_V2: &str = "package handlers\n\nimport \"net/http\"\n\nfunc Handler(w http.ResponseWriter, r *http.Request) { w.Write([]byte(\"v2\")) }\n";

pub(crate) struct Harness {
    /// The test's own client (the cluster's admin on a real one); the reconciles run with
    /// `ctx`'s, which on a real cluster has the operator's rights and no more.
    pub(crate) client: Client,
    pub(crate) fake: Option<FakeApiServer>,
    pub(crate) ctx: Arc<Context>,
    pub(crate) ns: String,
}

pub(crate) fn settings() -> Settings {
    Settings::new("wasmless/runtime:test", "wasmless/builder:test")
}

impl Harness {
    pub(crate) fn fake() -> Self {
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
    pub(crate) async fn real(test: &str) -> Self {
        let path = std::env::var("WASMLESS_TEST_KUBECONFIG").unwrap_or_else(|_| {
            panic!(
                "{test} runs on a real cluster: start one with `scripts/cluster.sh up` and set \
                 WASMLESS_TEST_KUBECONFIG to the kubeconfig it prints (scripts/test.sh does both), \
                 or skip these with `cargo test -- --skip real_api`"
            )
        });
        // As in the operator's main: rustls needs its provider chosen.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let kubeconfig = kube::config::Kubeconfig::read_from(&path).expect("reading WASMLESS_TEST_KUBECONFIG");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("kubeconfig");
        let client = Client::try_from(config.clone()).expect("client");
        no_operator_installed(&client).await;
        refuse_build_pods(&client).await;
        grant_the_operators_rights(&client).await;
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
        let operator = Client::try_from(as_the_operator(config)).expect("the operator's client");
        Self {
            ctx: Arc::new(Context::new(operator, settings, Metrics::default(), None)),
            client,
            fake: None,
            ns,
        }
    }

    pub(crate) async fn delete_namespace(&self) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .delete(&self.ns, &DeleteParams::background())
            .await
            .expect("deleting the test namespace");
    }

    pub(crate) fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub(crate) async fn create(&self, name: &str, spec: Value) -> Function {
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

    pub(crate) async fn update_spec(&self, name: &str, spec: Value) {
        self.api::<Function>()
            .patch(name, &PatchParams::default(), &Patch::Merge(json!({"spec": spec})))
            .await
            .expect("update Function");
    }

    /// `kubectl scale fn/<name> --replicas=<n>`, as an autoscaler writes it: through the
    /// scale subresource on a real API server; the in-memory one has no subresources but
    /// status, so there it is the spec field the subresource maps to.
    pub(crate) async fn scale(&self, name: &str, replicas: i32) {
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

    pub(crate) async fn function(&self, name: &str) -> Function {
        self.api::<Function>().get(name).await.expect("get Function")
    }

    pub(crate) async fn reconcile(&self, name: &str) -> Result<Action, wasmless_operator::Error> {
        reconcile(Arc::new(self.function(name).await), self.ctx.clone()).await
    }

    pub(crate) async fn reconciled(&self, name: &str) -> Function {
        self.reconcile(name).await.expect("reconcile");
        self.function(name).await
    }

    pub(crate) fn status_source_digest(func: &Function) -> Digest {
        func.status
            .as_ref()
            .and_then(|s| s.source_digest.as_deref())
            .expect("sourceDigest")
            .parse()
            .unwrap()
    }

    /// Creates one part's chunk ConfigMaps, labelled and annotated as the builder writes
    /// them; `about` is the part's own annotation (the module's size, the code's digest).
    pub(crate) async fn create_chunks(
        &self,
        name: &str,
        part: Part,
        wasm: &[u8],
        chunks: &[Vec<u8>],
        about: (&str, String),
    ) {
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
    /// The build Job of `name` ends having published `wasm`, and (on a cluster) the pods
    /// that waited for a first build are switched to it and ready, as they are a second or
    /// so later: the next reconcile rolls the build out.
    pub(crate) async fn finish_build(&self, name: &str, wasm: &[u8]) -> Digest {
        let digest = self.publish_build(name, wasm).await;
        self.settle_first_switch(name).await;
        digest
    }

    /// On a cluster, the pods of a first build wait for it behind a Service that sends to
    /// them ready or not, and the operator rolls nothing out until one of them is switched
    /// to the build and ready: reconciles (which switch the pods that run) until one is.
    async fn settle_first_switch(&self, name: &str) {
        let Some(deployment) = self.deployment(name).await.filter(|_| self.fake.is_none()) else {
            return;
        };
        let waiting = waits_for_first_build(&deployment);
        if !waiting || deployment.spec.as_ref().and_then(|spec| spec.replicas) == Some(0) {
            return;
        }
        for _ in 0..60 {
            // Boxed: a reconcile's future is large, and a scenario's stack is not.
            Box::pin(self.reconcile(name))
                .await
                .expect("reconcile switching the waiting pods");
            let deployment = self.deployment(name).await.expect("deployment");
            if deployment.status.and_then(|status| status.ready_replicas).unwrap_or(0) > 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The build Job of `name` ends having published `wasm`; nothing more.
    pub(crate) async fn publish_build(&self, name: &str, wasm: &[u8]) -> Digest {
        let source_digest = Self::status_source_digest(&self.function(name).await);
        let module_digest = Digest::of(wasm);
        let size = (annotations::MODULE_SIZE, wasm.len().to_string());
        self.create_chunks(name, Part::Module, wasm, &compress_and_split(wasm), size)
            .await;
        let job = objects::job_name(name, &source_digest);
        self.end_job(&job, |started, now| {
            json!({
                "startTime": started,
                "completionTime": now,
                "succeeded": 1,
                "conditions": [
                    {"type": "SuccessCriteriaMet", "status": "True", "lastTransitionTime": now},
                    {"type": "Complete", "status": "True", "lastTransitionTime": now},
                ],
            })
        })
        .await;
        module_digest
    }

    /// What the builder publishes before the module: the compiled code's chunks.
    pub(crate) async fn publish_code(&self, name: &str, wasm: &[u8], code: &[u8]) -> Digest {
        let digest = (annotations::CODE_DIGEST, Digest::of(code).to_string());
        self.create_chunks(name, Part::Code, wasm, &wasmless_artifact::split_chunks(code), digest)
            .await;
        Digest::of(code)
    }

    /// Writes the Job's status as the Job controller ends it: `status` of its start time
    /// and now.
    async fn end_job(&self, job: &str, status: impl FnOnce(&str, &str) -> Value) {
        let (started, now) = self.job_times(job).await;
        self.api::<Job>()
            .patch_status(
                job,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status(&started, &now) })),
            )
            .await
            .expect("job status");
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
    pub(crate) async fn fail_build(&self, name: &str, compiler_output: &str) {
        let terminated = json!({"exitCode": wasmless_artifact::EXIT_SOURCE_DOES_NOT_BUILD, "reason": "Error", "message": compiler_output});
        self.fail_build_with(name, terminated, "PodFailurePolicy").await;
    }

    /// A failed build whose pod ended as `terminated` says, and whose Job failed for `reason`.
    pub(crate) async fn fail_build_with(&self, name: &str, terminated: Value, reason: &str) {
        let func = self.function(name).await;
        let job = objects::job_name(name, &Self::status_source_digest(&func));
        self.build_pod_ended(&job, "Failed", terminated).await;
        self.end_job(&job, |started, now| {
            json!({
                "startTime": started,
                "failed": 1,
                "conditions": [
                    {"type": "FailureTarget", "status": "True", "reason": reason, "lastTransitionTime": now},
                    {"type": "Failed", "status": "True", "reason": reason, "message": format!("the Job failed: {reason}"), "lastTransitionTime": now},
                ],
            })
        })
        .await;
    }

    /// A build whose builder published `wasm` and exited with its result line `result` (the
    /// phases and cache answers it reports) as its termination message; as
    /// [`Self::publish_build`], the waiting pods are left to the caller's reconciles.
    pub(crate) async fn finish_build_reporting(&self, name: &str, wasm: &[u8], result: &Value) -> Digest {
        let job = objects::job_name(name, &Self::status_source_digest(&self.function(name).await));
        let terminated = json!({"exitCode": 0, "reason": "Completed", "message": result.to_string()});
        self.build_pod_ended(&job, "Succeeded", terminated).await;
        self.publish_build(name, wasm).await
    }

    /// The Job's pod, ended in `phase` with its builder container `terminated` so.
    pub(crate) async fn build_pod_ended(&self, job: &str, phase: &str, terminated: Value) {
        let uid = self.api::<Job>().get(job).await.expect("the build Job").uid().unwrap();
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("{job}-x7k2p"), "labels": {"batch.kubernetes.io/job-name": job},
                         // The Job's own pod (the operator reads no other), though not its
                         // controller's: the Job controller leaves it alone.
                         "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": job, "uid": uid,
                                              "controller": false}]},
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
                &Patch::Merge(json!({"status": {"phase": phase, "containerStatuses": [{
                    "name": "builder", "image": "wasmless/builder:test", "imageID": "", "ready": false,
                    "restartCount": 0,
                    "state": {"terminated": terminated},
                }]}})),
            )
            .await
            .expect("pod status");
    }

    /// A context like the harness's, whose applies are traced by `tracer`.
    pub(crate) fn traced_context(&self, tracer: opentelemetry_sdk::trace::SdkTracer) -> Arc<Context> {
        Arc::new(
            Context::new(
                self.ctx.client.clone(),
                self.ctx.settings.clone(),
                Metrics::default(),
                None,
            )
            .with_traces(wasmless_operator::controller::ApplyTraces::new(tracer)),
        )
    }

    /// What the Deployment controller reports once every pod of the current template is
    /// available: written on the in-memory server, waited for on a cluster.
    pub(crate) async fn make_available(&self, name: &str) {
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

    /// What the Deployment controller reports while its pods run, none of them ready yet:
    /// written on the in-memory server, waited for on a cluster.
    pub(crate) async fn pods_started_not_ready(&self, name: &str) {
        if self.fake.is_none() {
            for _ in 0..120 {
                let deployment = self.api::<Deployment>().get(name).await.expect("deployment");
                if deployment.status.and_then(|s| s.replicas).unwrap_or(0) > 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            panic!("Deployment {name} reported no pod within a minute");
        }
        self.api::<Deployment>()
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"replicas": 1, "updatedReplicas": 1, "readyReplicas": 0}})),
            )
            .await
            .expect("deployment status");
    }

    /// A pod of the Function's current pod template that is running (on a cluster, one the
    /// rollout does not own: it stays through the scenario), as the ReplicaSet would make it.
    pub(crate) async fn running_pod(&self, function: &str, name: &str) -> String {
        self.running_pod_with(function, name, |_| {}).await
    }

    /// [`Self::running_pod`] with its spec changed by `edit` first.
    pub(crate) async fn running_pod_with(
        &self,
        function: &str,
        name: &str,
        edit: impl FnOnce(&mut k8s_openapi::api::core::v1::PodSpec),
    ) -> String {
        let mut template = self.deployment(function).await.unwrap().spec.unwrap().template;
        if let Some(spec) = template.spec.as_mut() {
            edit(spec);
        }
        let meta = template.metadata.unwrap();
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: meta.labels,
                annotations: meta.annotations,
                ..Default::default()
            },
            spec: template.spec,
            ..Default::default()
        };
        self.api::<Pod>().create(&PostParams::default(), &pod).await.unwrap();
        name.to_string()
    }

    /// Waits until the Deployment's controller reports every pod of its current template
    /// available and no other pod.
    pub(crate) async fn wait_until_available(&self, name: &str) {
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
    pub(crate) fn same_spec(&self, before: &Deployment, after: &Deployment) -> bool {
        if self.fake.is_some() {
            before.resource_version() == after.resource_version()
        } else {
            before.metadata.generation == after.metadata.generation
        }
    }

    pub(crate) async fn jobs(&self, name: &str) -> Vec<Job> {
        self.api::<Job>()
            .list(&ListParams::default().labels(&format!("{}={name}", labels::FUNCTION)))
            .await
            .expect("jobs")
            .items
    }

    pub(crate) async fn deployment(&self, name: &str) -> Option<Deployment> {
        self.api::<Deployment>().get_opt(name).await.expect("deployment")
    }

    /// resourceVersion of the Function and of everything labelled with it: a write changes one.
    pub(crate) async fn versions(&self, name: &str) -> BTreeMap<String, String> {
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
    pub(crate) async fn event_reasons(&self, name: &str) -> Vec<String> {
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

/// An operator running on the cluster (the e2e installs one) would reconcile the
/// scenarios' Functions beside the test's own reconciles, with its own settings (another
/// builder image, so another source digest): the scenarios would fail far from the cause.
async fn no_operator_installed(client: &Client) {
    let found = Api::<Deployment>::all(client.clone())
        .list_metadata(&ListParams::default().fields("metadata.name=wasmless-operator"))
        .await
        .expect("listing the cluster's Deployments");
    let installed: Vec<String> = found
        .items
        .iter()
        .map(|d| format!("{}/{}", d.namespace().unwrap_or_default(), d.name_any()))
        .collect();
    assert!(
        installed.is_empty(),
        "an operator is installed on the test cluster ({installed:?}) and would reconcile these scenarios' \
         Functions too: run them on a cluster of their own (scripts/test.sh starts one from none), or remove \
         it first (kubectl delete -k deploy/)"
    );
}

/// Label of the test namespaces in which build Jobs get no pods of their own.
pub(crate) const SIMULATED_BUILDS_LABEL: &str = "wasmless.io/simulated-builds";

/// On a cluster, the Job controller would start the (fake) builder image for every build
/// Job, and its pods would race the build the test simulates. An admission policy refuses
/// the Job controller's pods in the test namespaces, and only there.
pub(crate) async fn refuse_build_pods(client: &Client) {
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

pub(crate) fn status(func: &Function) -> wasmless_operator::FunctionStatus {
    func.status.clone().expect("status")
}

pub(crate) fn condition<'a>(
    func: &'a Function,
    kind: &str,
) -> &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    func.status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == kind))
        .unwrap_or_else(|| panic!("no {kind} condition"))
}

pub(crate) fn template_annotation(deployment: &Deployment, key: &str) -> String {
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
pub(crate) fn first_container_args(template: k8s_openapi::api::core::v1::PodTemplateSpec) -> Vec<String> {
    template.spec.unwrap().containers[0].args.clone().unwrap()
}

/// The revisions a Deployment's pods serve, as it records them in its own
/// `wasmless.io/routes` annotation (the routes its `<function>-routes` ConfigMap holds for
/// pods of its template, which the runtime follows as a `--traffic-file`: `revision`,
/// `percent`, `tag`, `module`, `moduleDigest`, `code`, `codeDigest` each).
pub(crate) fn routes(deployment: &Deployment) -> Vec<serde_json::Value> {
    let template = &deployment.spec.as_ref().unwrap().template;
    let args = template.spec.as_ref().unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(
        has_flag(&args, "--traffic-file", "/etc/wasmless/routes/traffic.json")
            && has_flag(&args, "--traffic-file", "/etc/wasmless/function-routes/traffic.json"),
        "the runtime follows its routes annotation and its Function's routes: {args:?}"
    );
    serde_json::from_str(&serving_annotation(
        deployment,
        wasmless_operator::objects::ROUTES_ANNOTATION,
    ))
    .unwrap()
}

/// The revisions a pod serves after it was switched in place: the routes of the routes
/// document in its own `wasmless.io/routes` annotation.
pub(crate) fn pod_routes(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<serde_json::Value> {
    let document = &pod.metadata.annotations.as_ref().unwrap()[wasmless_operator::objects::ROUTES_ANNOTATION];
    serde_json::from_str(&wasmless_operator::objects::routes_of_document(document).unwrap()).unwrap()
}

/// The one revision a Deployment's pods serve.
pub(crate) fn served_alone(deployment: &Deployment) -> serde_json::Value {
    let mut routes = routes(deployment);
    assert_eq!(routes.len(), 1, "one revision serves: {routes:?}");
    assert_eq!(routes[0]["percent"], 100);
    routes.remove(0)
}

/// What a Deployment records of what it serves (the primary revision's module, the routes,
/// a split's summary), on itself rather than its pod template.
pub(crate) fn serving_annotation(deployment: &Deployment, key: &str) -> String {
    deployment.metadata.annotations.as_ref().unwrap()[key].clone()
}

pub(crate) use wasmless_operator::objects::waits_for_first_build;

/// Whether `flag` is followed by `value` in `args`.
pub(crate) fn has_flag(args: &[String], flag: &str, value: &str) -> bool {
    args.windows(2).any(|w| w[0] == flag && w[1] == value)
}

/// A module the runtime loads (on a cluster its pods must become ready): a WASI command
/// whose `_start` does nothing, with `tag` in a custom section so each tag has its own digest.
pub(crate) fn wasm(tag: &str) -> Vec<u8> {
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
pub(crate) async fn ready_function(h: &Harness, name: &str, spec: Value) -> (Function, Digest) {
    h.create(name, spec).await;
    h.reconcile(name).await.expect("first reconcile");
    let module = h.finish_build(name, &wasm(name)).await;
    h.reconcile(name).await.expect("reconcile after build");
    h.make_available(name).await;
    let func = h.reconciled(name).await;
    assert_eq!(status(&func).phase, Some(Phase::Ready), "{:?}", func.status);
    (func, module)
}

/// The workspace root.
pub(crate) fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Who the operator is on a cluster installed from deploy/: its ServiceAccount.
const OPERATOR_USER: &str = "system:serviceaccount:wasmless-system:wasmless-operator";

/// `config`, impersonating the operator's ServiceAccount, so a scenario's reconciles are
/// allowed exactly what deploy/rbac.yaml grants it (and the API server's own checks on
/// RBAC writes, such as binding only a Role that exists, apply to them too).
fn as_the_operator(mut config: kube::Config) -> kube::Config {
    config.auth_info.impersonate = Some(OPERATOR_USER.into());
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        "system:serviceaccounts:wasmless-system".into(),
        "system:authenticated".into(),
    ]);
    config
}

/// Applies the operator's ClusterRole and ClusterRoleBinding of deploy/rbac.yaml, as
/// `kubectl apply -k deploy/` would.
async fn grant_the_operators_rights(client: &Client) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use serde::Deserialize;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/rbac.yaml");
    let text = std::fs::read_to_string(path).expect("reading deploy/rbac.yaml");
    for document in serde_yaml::Deserializer::from_str(&text) {
        let value = Value::deserialize(document).expect("deploy/rbac.yaml parses");
        let name = value["metadata"]["name"].as_str().unwrap_or_default().to_string();
        match value["kind"].as_str() {
            Some("ClusterRole") => apply_cluster_object::<ClusterRole>(client, &name, value).await,
            Some("ClusterRoleBinding") => apply_cluster_object::<ClusterRoleBinding>(client, &name, value).await,
            _ => {}
        }
    }
}

/// Server-side applies `value`, a cluster-scoped object of kind `K`, as the tests' manager.
async fn apply_cluster_object<K>(client: &Client, name: &str, value: Value)
where
    K: kube::Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object: K = serde_json::from_value(value).expect("an object of its kind");
    Api::<K>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("wasmless-tests").force(),
            &Patch::Apply(object),
        )
        .await
        .unwrap_or_else(|e| panic!("applying {name} of deploy/rbac.yaml: {e}"));
}
