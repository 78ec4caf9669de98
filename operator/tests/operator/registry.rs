//! The registry sweep of `storage: oci` against a real registry (Debian's docker-registry on
//! loopback, `wasmless_testkit::Registry`) and the in-memory API server: what it deletes,
//! what it never touches, and what it says when the registry refuses. (The in-memory server
//! lists namespaced only, so the sweeps here are a namespaced operator's; e2e's
//! `oci_storage` sweeps cluster-wide.)

use crate::harness::*;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::collections::BTreeSet;
use std::sync::Arc;
use wasmless_artifact::Digest;
use wasmless_operator::controller::{SweepError, sweep_registry};
use wasmless_operator::registry::Registry;
use wasmless_operator::{Context, Metrics};
use wasmless_testkit::{FakeApiServer, Registry as TestRegistry};

const LAYER: &str = wasmless_artifact::oci::LAYER_MEDIA_TYPE;

/// A harness whose operator stores in `registry` (plain HTTP).
fn harness(registry: &TestRegistry) -> Harness {
    let fake = FakeApiServer::new();
    let client = fake.client();
    let mut settings = settings();
    settings.oci_registry = Some(registry.address.clone());
    settings.oci_plain_http = Some(registry.address.clone());
    Harness {
        ctx: Arc::new(Context::new(client.clone(), settings, Metrics::default(), None)),
        client,
        fake: Some(fake),
        ns: "default".into(),
    }
}

/// `name` as an OCI Function whose status is `phase` with one kept revision, built from
/// `source`.
async fn function_with_revision(h: &Harness, name: &str, source: &Digest, phase: &str) {
    h.create(name, json!({"source": HELLO, "storage": "oci"})).await;
    h.api::<wasmless_operator::Function>()
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {
                "phase": phase,
                "sourceDigest": source.to_string(),
                "revisions": [{
                    "name": format!("{name}-1"),
                    "sourceDigest": source.to_string(),
                    "moduleDigest": Digest::of(b"module").to_string(),
                    "created": "2026-11-27T00:00:00Z",
                }],
            }})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn the_registry_sweep_deletes_only_the_builders_manifests_no_kept_revision_names() {
    let registry = TestRegistry::start_allowing_deletes();
    let h = harness(&registry);
    let kept = Digest::of(b"kept source").short();
    let cut = Digest::of(b"cut source").short();
    let gone = Digest::of(b"gone source").short();
    let busy = Digest::of(b"rolling source").short();
    registry.push_wasm(&format!("default/hello:{}", &kept), b"kept").await;
    registry.push_wasm(&format!("default/hello:{}", &cut), b"cut").await;
    // Another tool's tag, and another tool's image under the builder's form of tag.
    registry.push_wasm("default/hello:latest", b"someone else's").await;
    registry
        .push_with_config(
            &format!("default/image:{gone}"),
            "application/vnd.oci.image.config.v1+json",
            &[(LAYER, b"an image")],
        )
        .await;
    // A Function that no longer exists.
    registry.push_wasm(&format!("default/gone:{}", &gone), b"gone").await;
    // A Function that is not Ready: a pod of a revision just cut may still pull it.
    registry
        .push_wasm(&format!("default/rolling:{}", &cut), b"cut while rolling")
        .await;
    // Not a repository of the builder's form.
    registry.push_wasm(&format!("elsewhere:{}", &cut), b"elsewhere").await;
    function_with_revision(&h, "hello", &Digest::of(b"kept source"), "Ready").await;
    function_with_revision(&h, "rolling", &Digest::of(b"rolling source"), "Pending").await;
    registry
        .push_wasm(&format!("default/rolling:{}", &busy), b"rolling")
        .await;

    let client = Registry::new(Some(&registry.address));
    let mut candidates = BTreeSet::new();
    let deleted = sweep_registry(&h.ctx, &client, Some("default"), &mut candidates)
        .await
        .unwrap();
    assert!(deleted.is_empty(), "a first sweep only marks: {deleted:?}");
    assert_eq!(registry.tags("default/gone").await, std::slice::from_ref(&gone));

    let deleted = sweep_registry(&h.ctx, &client, Some("default"), &mut candidates)
        .await
        .unwrap();
    assert_eq!(deleted.len(), 2, "{deleted:?}");
    let mut hello = vec![kept.clone(), "latest".to_string()];
    hello.sort();
    assert_eq!(
        registry.tags("default/hello").await,
        hello,
        "the cut revision's manifest went"
    );
    assert_eq!(
        registry.tags("default/gone").await,
        Vec::<String>::new(),
        "all of a deleted Function's"
    );
    assert_eq!(
        registry.tags("default/image").await,
        std::slice::from_ref(&gone),
        "not a Wasm artifact: untouched"
    );
    let mut rolling = vec![cut.clone(), busy];
    rolling.sort();
    assert_eq!(
        registry.tags("default/rolling").await,
        rolling,
        "a Function not Ready: untouched"
    );
    assert_eq!(registry.tags("elsewhere").await, std::slice::from_ref(&cut));

    // A namespaced operator sweeps its namespace only.
    registry
        .push_wasm(&format!("other/gone:{}", &gone), b"another namespace's")
        .await;
    for _ in 0..2 {
        sweep_registry(&h.ctx, &client, Some("default"), &mut candidates)
            .await
            .unwrap();
    }
    assert_eq!(registry.tags("other/gone").await, [gone]);
}

#[tokio::test]
async fn a_registry_that_refuses_deletes_is_named_with_the_setting_to_change() {
    let registry = TestRegistry::start();
    let h = harness(&registry);
    let gone = Digest::of(b"gone source").short();
    registry.push_wasm(&format!("default/gone:{}", &gone), b"gone").await;
    let client = Registry::new(Some(&registry.address));
    let mut candidates = BTreeSet::new();
    sweep_registry(&h.ctx, &client, Some("default"), &mut candidates)
        .await
        .unwrap();
    let error = sweep_registry(&h.ctx, &client, Some("default"), &mut candidates)
        .await
        .unwrap_err();
    assert!(matches!(error, SweepError::Registry(_)), "{error}");
    let message = error.to_string();
    assert!(message.contains("storage.delete.enabled"), "{message}");
    assert!(message.contains(&registry.address), "{message}");
    assert_eq!(registry.tags("default/gone").await, [gone], "nothing lost");
}
