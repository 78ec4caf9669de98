//! The install (`deploy/` through kustomize, its RBAC against what the operator really
//! uses) and the images.

use crate::harness::*;
use crate::leader::operator_lease;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::{CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use wasmless_operator::crd::{Function, Phase};
use wasmless_operator::objects::{self};
use wasmless_operator::{Context, Metrics};
use wasmless_testkit::FakeApiServer;

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
    // The new environment reads a Secret (its metadata, for the pod template's config hash).
    let secret: k8s_openapi::api::core::v1::Secret =
        serde_json::from_value(json!({"metadata": {"name": "api"}, "stringData": {"token": "t"}})).unwrap();
    h.api().create(&Default::default(), &secret).await.unwrap();
    let env = json!([{"name": "A", "value": "1"}, {"name": "T", "valueFrom": {"secretKeyRef": {"name": "api", "key": "token"}}}]);
    h.update_spec("hello", json!({"env": env})).await;
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
            objects::BUILDER_ACCOUNT
        ))
        .header("content-type", "application/merge-patch+json")
        .body(serde_json::to_vec(&json!({"metadata": {"labels": {objects::MANAGED_BY_LABEL: "someone"}}})).unwrap())
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
    // A second revision, a pod of it running, and a rollback that switches the pod in place.
    h.update_spec("hello", json!({"source": "package handlers\n\n// v2\n"}))
        .await;
    h.reconcile("hello").await.unwrap();
    h.finish_build("hello", &wasm("v2")).await;
    h.reconcile("hello").await.unwrap();
    h.make_available("hello").await;
    h.reconcile("hello").await.unwrap();
    h.running_pod("hello", "hello-running").await;
    h.update_spec("hello", json!({"traffic": [{"revision": "hello-1", "percent": 100}]}))
        .await;
    h.reconcile("hello").await.unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = h.api().get("hello-running").await.unwrap();
    assert!(
        pod.annotations()[objects::ROUTES_ANNOTATION].contains("\"hello-1\""),
        "switched in place"
    );

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
    let (_, role, _) = objects::builder_rbac("default");
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
            // The operator's writes confined (admission.yaml), and everyone else's of what
            // the pool and the runtime trust (trusted-objects.yaml).
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
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

/// Every module and its compiled code are ConfigMaps labelled with their Function (6 MB
/// for a Goless handler): the controller's watches of ConfigMaps ask for their metadata
/// only, or a few hundred Functions would fill the operator's 256Mi with their code and
/// each restart would relist all of it from the API server.
#[tokio::test]
async fn the_controller_lists_and_watches_configmaps_by_their_metadata_only() {
    let fake = FakeApiServer::new();
    let ctx = Arc::new(Context::new(fake.client(), settings(), Metrics::default(), None));
    wasmless_operator::run(ctx, Some("default"), tokio::time::sleep(Duration::from_millis(500))).await;
    let reads: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|request| request.resource() == "configmaps")
        .filter(|request| request.verbs().iter().any(|verb| *verb == "list" || *verb == "watch"))
        .collect();
    assert!(!reads.is_empty(), "the controller watches ConfigMaps");
    for read in reads {
        assert!(
            read.accept.contains("as=PartialObjectMetadata"),
            "{} {}?{} asks for whole ConfigMaps",
            read.method,
            read.path,
            read.query
        );
    }
}
