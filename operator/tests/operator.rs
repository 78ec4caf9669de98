//! The operator's behaviour, scenario by scenario. Each scenario runs against the in-memory
//! API server (`wasmless_testkit::FakeApiServer`), and again (`real_api`) on the cluster that
//! `WASMLESS_TEST_KUBECONFIG` names (`scripts/cluster.sh up` starts one; without it those
//! tests fail, saying so: skip them with `cargo test -- --skip real_api`).
//! The builder is simulated through the API: the tests write the chunk ConfigMaps, and the
//! Job and Pod status, that it would. On the in-memory server the kubelet is simulated too;
//! on a cluster the function's pods really run (`WASMLESS_TEST_RUNTIME_IMAGE`, default
//! `wasmless/runtime:0.1.0`) and the build Jobs' own pods are refused, so that only the
//! simulated build reports.
//!
//! One test binary; its modules, by concern:

#[path = "operator/harness.rs"]
mod harness;

#[path = "operator/scenarios.rs"]
mod scenarios;

#[path = "operator/cluster_state.rs"]
mod cluster_state;

#[path = "operator/fake_only.rs"]
mod fake_only;

#[path = "operator/golden.rs"]
mod golden;

#[path = "operator/leader.rs"]
mod leader;

#[path = "operator/metrics.rs"]
mod metrics;

#[path = "operator/crd.rs"]
mod crd;

#[path = "operator/flags.rs"]
mod flags;

#[path = "operator/install.rs"]
mod install;

#[path = "operator/registry.rs"]
mod registry;
